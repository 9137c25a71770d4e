"""mBART, Pegasus and mT5 from the committed fixtures: what test_seq2seq.py's shared checks do not cover.

Gradients against torch autograd (tests/fixtures/grads/<name>.npz, made by make_grad_fixtures.py), mBART's
start of writing (decoder_start_token_id absent: bos_token_id; forced_bos_token_id: the first token
written, sampled or greedy) and of training (its shift of the labels), Pegasus's stored sinusoids, mT5's
head without the output rescale, the refusals, and the commands on the mBART fixture (it has a tokenizer).
No torch here: tests/live/test_live_seq2seq_families.py re-checks other knob values live.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

import qkv
from conftest import FIXTURES, TOL_HIDDEN, max_abs
from qkv.cli.app import cli
from qkv.core.positions import sinusoidal_halves
from qkv.train import gradients
from qkv.train.seq2seq_backprop import decoder_inputs

SEQ2SEQ = FIXTURES / "seq2seq"
TEXT = "The cat sat on the mat."


@pytest.mark.parametrize("name", ["marian", "bart", "mbart", "pegasus", "t5", "t5_gated", "mt5", "umt5"])
def test_gradients_equal_autograd(name):
    """Loss within 1e-5, each tensor's gradient within 1e-4 relative error (the key biases, whose true
    gradient is 0, within 1e-7 absolute); the frozen sinusoids have none. T5 and mT5: unscaled scores,
    the relative position bias's table, v1.0's output rescale."""
    ref = np.load(FIXTURES / "grads" / f"{name}.npz")
    loss, grads = gradients(qkv.load(SEQ2SEQ / name), ref["input_ids"], ref["attention_mask"], labels=ref["labels"])
    assert abs(loss - float(ref["loss"])) < 1e-5
    expected = {k[len("grad."):]: ref[k] for k in ref.files if k.startswith("grad.")}
    assert set(grads) == set(expected)
    for key, g in expected.items():
        if key.endswith("k_proj.bias"):
            assert np.abs(grads[key] - g).max() < 1e-7, key
        else:
            err = np.linalg.norm(grads[key] - g) / np.linalg.norm(g)
            assert err < 1e-4, f"{key}: relative error {err:.2e}"


def test_mbart_shift_of_the_labels():
    """mBART's decoder reads first each label row's last real token (its language id), −100 read as pad."""
    labels = np.array([[5, 6, 7, 9], [5, 8, -100, -100]])
    assert decoder_inputs(labels, None, 1, from_labels=True).tolist() == [[9, 5, 6, 7], [8, 5, 8, 1]]
    assert decoder_inputs(labels, 2, 1).tolist() == [[2, 5, 6, 7], [2, 5, 8, 1]]
    assert qkv.load(SEQ2SEQ / "mbart").config.start_from_labels
    assert not qkv.load(SEQ2SEQ / "bart").config.start_from_labels


def test_mbart_starts_from_bos_and_forces_its_first_token():
    """config.json has no decoder_start_token_id (generate starts from bos_token_id) and forced_bos_token_id
    250: the first token written, greedy or sampled, with or without the cache, then the model's own."""
    model = qkv.load(SEQ2SEQ / "mbart")
    assert model.config.decoder_start_token_id == model.config.bos_token_id == 0
    assert model.config.forced_bos_token_id == 250
    ids = np.array([[40, 41, 42, 43]])
    for settings in (dict(temperature=0), dict(temperature=1.0, seed=4), dict(temperature=2.0, top_k=5, seed=1)):
        out = model.generate(ids, 4, stop_at_eos=False, **settings)
        assert out[0, :2].tolist() == [0, 250], settings
    assert model.generate(ids, 4, temperature=0, use_cache=False).tolist() == model.generate(ids, 4, temperature=0).tolist()
    assert model.run(ids[0], max_new_tokens=3).ids[:2].tolist() == [0, 250]      # its own translation
    free = qkv.Seq2SeqModel(model.config.with_(forced_bos_token_id=None), model.weights, model.tokenizer)
    assert free.generate(ids, 1, temperature=0)[0, 1] == model.forward(ids).logits[0, -1].argmax() != 250


def test_pegasus_reads_its_stored_sinusoids_or_computes_them(tmp_path):
    """transformers saves Pegasus's [sin | cos] table (row p for position p): the stored one equals
    positions.sinusoidal_halves, and a file without it computes the same numbers."""
    model = qkv.load(SEQ2SEQ / "pegasus")
    c = model.config
    assert (c.position, c.position_offset, c.norm_place, c.scale_embedding) == ("sinusoidal", 0, "pre", True)
    assert model.weights.encoder.final_norm is not None and model.weights.decoder.final_norm is not None
    assert max_abs(model.weights.encoder.pos_embed, sinusoidal_halves(c.max_positions, c.d_model)) < 1e-6
    shutil.copytree(SEQ2SEQ / "pegasus", tmp_path / "p")
    tensors = load_file(str(tmp_path / "p" / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if "embed_positions" not in k}, str(tmp_path / "p" / "model.safetensors"))
    ids = np.load(SEQ2SEQ / "pegasus" / "reference.npz")["input_ids"]
    assert max_abs(qkv.load(tmp_path / "p").forward(ids).logits, model.forward(ids).logits) < TOL_HIDDEN


def test_mt5_never_rescales_its_output(tmp_path):
    """MT5ForConditionalGeneration has no d_model^-0.5 before W_vocab, tied or not (t5 v1.0 has)."""
    assert not qkv.load(SEQ2SEQ / "mt5").config.scale_decoder_output
    hf = json.loads((SEQ2SEQ / "mt5" / "config.json").read_text()) | {"tie_word_embeddings": True}
    assert not qkv.init(hf, seed=0).config.scale_decoder_output
    del hf["feed_forward_proj"]                                      # mT5's default: gated-gelu
    cfg = qkv.init(hf, seed=0).config
    assert (cfg.family, cfg.gated_ffn, cfg.activation) == ("mt5", True, "gelu_tanh")


@pytest.mark.parametrize("name, edit, message", [
    ("mbart", {"tie_word_embeddings": False}, "tie_word_embeddings=false"),
    ("mbart", {"forced_bos_token_id": "en_XX"}, "forced_bos_token_id"),
    ("mbart", {"forced_bos_token_id": 400}, "forced_bos_token_id=400 is not a token id"),
    ("mt5", {"forced_bos_token_id": -1}, "forced_bos_token_id=-1 is not a token id"),
    ("pegasus", {"decoder_ffn_dim": 96}, "different heads or FFN widths"),
    ("pegasus", {"scale_embedding": 1}, "scale_embedding"),
    ("mt5", {"feed_forward_proj": "gated-gelu-x"}, "feed_forward_proj"),
    ("mt5", {"model_type": "umt5"}, "block.1.layer.0.SelfAttention.relative_attention_bias"),   # one table only
    ("umt5", {"model_type": "mt5"}, "never reads"),            # every layer's table: not an mT5
    ("umt5", {"model_type": "longt5"}, "model_type 'longt5' is not supported"),
])
def test_bad_configs_are_refused(tmp_path, name, edit, message):
    d = tmp_path / name
    shutil.copytree(SEQ2SEQ / name, d)
    (d / "config.json").write_text(json.dumps(json.loads((d / "config.json").read_text()) | edit))
    with pytest.raises(qkv.QkvError, match=message) as e:
        qkv.load(d)
    assert "\n" not in str(e.value)


def test_commands_run_on_the_mbart_fixture(tmp_path):
    """translate (= the API's greedy text), show's terminal view of the cross-attention, patch (the decoder
    view); `show --out`, `heads` and `lens` run on it too (slower: their figures)."""
    d, model = str(SEQ2SEQ / "mbart"), qkv.load(SEQ2SEQ / "mbart")
    runner = CliRunner()
    r = runner.invoke(cli, ["translate", TEXT, "--model", d, "-n", "5"])
    assert r.exit_code == 0 and r.output == model.generate(TEXT, 5, temperature=0) + "\n"
    r = runner.invoke(cli, ["show", TEXT, "--model", d, "--prefix", " the cat"])
    assert r.exit_code == 0 and "cross" in r.output.lower(), r.output
    r = runner.invoke(cli, ["patch", TEXT, "The dog sat on the mat.", "--model", d, "--token", " the", "--other", " a",
                            "--out", str(tmp_path / "patch")])
    assert r.exit_code == 0 and (tmp_path / "patch" / "patch.json").exists(), r.output


@pytest.mark.parametrize("name, embed_norm, bias", [("mbart", True, None), ("pegasus", False, None),
                                                     ("mt5", False, "shared"), ("umt5", False, "per_layer")])
def test_pipeline_page_names_the_knobs(name, embed_norm, bias):
    """The pipeline page's payload builds for each family and says what its boxes are: pre-norm, a final
    norm closing both stacks, the embedding norm, T5's bias shared by a stack or one per layer."""
    from qkv.viz.pipeline_payload import pipeline_payload

    model = qkv.load(SEQ2SEQ / name)
    r = np.load(SEQ2SEQ / name / "reference.npz")
    p = pipeline_payload(model, model.run(r["input_ids"][0], target=r["decoder_input_ids"][0]))
    arch = p["arch"]
    assert (arch["norm_place"], arch["final_norm"], arch["encoder_final_norm"]) == ("pre", True, True)
    assert (arch["embed_norm"], arch["position_bias"]) == (embed_norm, bias)
    assert p["seq2seq"] and set(p["stacks"]) == {"encoder", "decoder"}


def test_forced_bos_token_id_of_t5_configs_too(tmp_path):
    """transformers' generate forces config.json's forced_bos_token_id for any encoder–decoder: mT5 too,
    and a saved model writes it back."""
    d = tmp_path / "mt5"
    shutil.copytree(SEQ2SEQ / "mt5", d)
    (d / "config.json").write_text(json.dumps(json.loads((d / "config.json").read_text()) | {"forced_bos_token_id": 9}))
    model = qkv.load(d)
    assert model.generate(np.array([[5, 6, 7]]), 3, temperature=0)[0, :2].tolist() == [0, 9]
    assert qkv.load(model.save(tmp_path / "saved")).config.forced_bos_token_id == 9

"""The encoders after BERT — RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ModernBERT — against transformers' committed
references (tests/fixtures/make_fixtures.py): the padded batch and every layer are in test_families.py;
here what is theirs: left padding (RoBERTa's positions count the ids, the others' count 0…n−1), one longer
sequence with the masked-LM head's logits, the knobs refused in one line, a save read back, the CLI, and
ModernBERT (its every-layer-global form: RoPE, GeGLU, LayerNorms without bias)."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.positions import positions_from_ids
from conftest import (MODELS, TOL_HIDDEN, check_encoder_saved_reads_back, check_gradients, check_left_padding,
                      check_single_sequence, edited, max_abs, reference, run_main)

ENCODERS = ("roberta", "xlm_roberta", "distilbert", "electra", "electra_discriminator", "modernbert")
MASKED_LM = ("roberta", "xlm_roberta", "distilbert", "electra", "modernbert")


@pytest.mark.parametrize("name", ENCODERS)
def test_left_padding_equals_reference(name):
    check_left_padding(name, logits=name in MASKED_LM)


@pytest.mark.parametrize("name", ENCODERS)
def test_single_sequence_equals_reference(name):
    check_single_sequence(name, logits=name in MASKED_LM)   # the discriminator's head scores tokens, not a vocabulary


@pytest.mark.parametrize("name", ["roberta", "xlm_roberta"])
def test_roberta_left_padding_equals_the_row_alone(name):
    """Positions count the ids that are not pads, so pads before a text do not move it."""
    ref = reference(name)
    model = qkv.load(MODELS / name)
    real = ref["left_attention_mask"][0].astype(bool)
    alone = model.forward(ref["left_input_ids"][:, real])
    padded = model.forward(ref["left_input_ids"], ref["left_attention_mask"])
    assert max_abs(padded.hidden[0, real], alone.hidden[0]) <= TOL_HIDDEN
    assert max_abs(padded.logits[0, real], alone.logits[0]) <= TOL_HIDDEN


def test_positions_from_ids_count_the_ids_that_are_not_pads():
    ids = np.array([[1, 1, 7, 8, 9], [7, 1, 8, 1, 1]])
    np.testing.assert_array_equal(positions_from_ids(ids, 1), [[-1, -1, 0, 1, 2], [0, -1, 1, -1, -1]])
    cfg = qkv.load(MODELS / "roberta").config
    assert (cfg.positions_from_ids, cfg.position_offset, cfg.pad_token_id) == (True, 2, 1)   # rows pad + 1 + k
    assert qkv.load(MODELS / "xlm_roberta").config.position_offset == 4                    # pad 3


def test_electra_projects_narrower_embeddings():
    model = qkv.load(MODELS / "electra")
    assert model.config.embed_dim == 32 and model.weights.tok_embed.shape[1] == 32
    assert model.weights.W_embed.shape == (32, model.config.d_model)
    assert model.weights.W_head.shape == (model.config.d_model, 32) and model.weights.W_vocab.shape[0] == 32


@pytest.mark.parametrize("name, change, message", [
    ("roberta", {"is_decoder": True}, "is_decoder=true"),
    ("roberta", {"add_cross_attention": True}, "add_cross_attention=true"),
    ("xlm_roberta", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ("roberta", {"max_position_embeddings": 2}, "no position after the pad row"),
    ("electra", {"is_decoder": True}, "is_decoder=true"),
    ("distilbert", {"activation": "mish"}, "activation 'mish'"),
    ("distilbert", {"sinusoidal_pos_embds": "yes"}, "true or false"),
    ("electra", {"embedding_size": 0}, "positive integer"),
    ("modernbert", {"layer_types": ["full_attention", "chunked_attention"]}, "full_attention or sliding_attention"),
    ("modernbert", {"layer_types": ["full_attention"]}, "each of the 2 layers"),
    ("modernbert", {"layer_types": None, "global_attn_every_n_layers": 3, "local_attention": 1}, "local_attention=1"),
    ("modernbert", {"mlp_bias": True}, "mlp_bias=true"),
    ("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}, "only the default"),
])
def test_what_cannot_run_is_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(e.value)


def test_a_masked_lm_config_without_its_head_is_refused(tmp_path):
    """architectures says RobertaForMaskedLM: the head's tensors must be there (not run headless)."""
    from safetensors.numpy import load_file, save_file

    d = edited(tmp_path, "roberta", {})
    tensors = {k: v for k, v in load_file(d / "model.safetensors").items() if not k.startswith("lm_head.")}
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(QkvError, match="lm_head"):
        qkv.load(d)


@pytest.mark.parametrize("name", ENCODERS)
def test_save_reads_back_equal(tmp_path, name):
    check_encoder_saved_reads_back(tmp_path, name, logits=name in MASKED_LM)


@pytest.mark.parametrize("name", MASKED_LM)
def test_masked_lm_gradients_equal_autograd(name):
    """grads/<name>.npz (make_grad_fixtures.py): transformers' *ForMaskedLM loss and torch autograd's
    gradient of every parameter it reaches, within 1e-4 relative error — or, for a gradient that is 0
    but for rounding (K's bias: q·b_K is the same for every key of a query), within 1e-6."""
    check_gradients(qkv.load(MODELS / name), name, labels=True, atol=1e-6)


def test_encoder_training_needs_labels_and_a_head():
    from qkv.train import gradients

    with pytest.raises(QkvError, match="labels"):
        gradients(qkv.load(MODELS / "roberta"), [[5, 6, 7]])
    with pytest.raises(QkvError, match="no LM head"):
        gradients(qkv.load(MODELS / "electra_discriminator"), [[5, 6, 7]], labels=[[5, 6, 7]])


def test_next_reads_the_mask_token(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "next", "The cat sat on the <mask>.", "--model", str(MODELS / "roberta"))
    assert code == 0 and "the masked token at position" in out
    model = qkv.load(MODELS / "roberta")
    ids, _ = model.encode("The cat sat on the <mask>.")
    at = int(np.flatnonzero(ids == 4)[0])                                   # <mask> is id 4
    from qkv.writing.nexttoken import masked_token_logits
    z, pos = masked_token_logits(model, ids)
    assert pos == at and max_abs(z, model.forward(ids).logits[0, at]) == 0.0


def test_next_without_a_mask_token_says_where_to_put_it(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "next", "The cat sat.", "--model", str(MODELS / "distilbert"))
    assert code == 2 and "[MASK]" in err


@pytest.mark.parametrize("command", [
    ("show", "The cat sat on the mat."), ("heads", "The cat sat on the mat."),
    ("lens", "The cat sat on the [MASK]."), ("patch", "The cat sat on the mat.", "The dog sat on the mat."),
])
def test_the_cli_runs_on_an_encoder(monkeypatch, capsys, tmp_path, command):
    extra = ("--out", str(tmp_path / "out")) if command[0] == "show" else ()
    code, out, err = run_main(monkeypatch, capsys, *command, "--model", str(MODELS / "electra"), *extra)
    assert code == 0, err
    if command[0] == "lens":
        assert "at the mask token" in out


def test_generate_refuses_an_encoder(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "generate", "The cat", "--model", str(MODELS / "roberta"))
    assert code == 2 and "encoder" in err


def test_the_pipeline_page_reads_the_mask_token():
    from qkv.viz.pipeline_payload import pipeline_payload

    model = qkv.load(MODELS / "roberta")
    trace = model.run("The cat sat on the <mask> today.")
    page = pipeline_payload(model, trace)
    at = int(np.flatnonzero(trace.ids == 4)[0])
    assert page["output"]["position"] == at and page["arch"]["mlm_head"] and page["arch"]["positions_from_ids"]
    assert qkv.load(MODELS / "electra").config.embed_dim == pipeline_payload(
        qkv.load(MODELS / "electra"), qkv.load(MODELS / "electra").run("a cat"))["arch"]["embed_dim"]


@pytest.mark.parametrize("command, message", [
    (("dla", "The cat sat on the <mask>.", "--token", "<s>"), "masked-LM head"),
    (("circuits", "--layer", "0", "--head", "0", "the cat sat"), "masked-LM head before W_vocab"),
])
def test_the_analyses_that_need_a_linear_read_out_refuse_in_one_line(monkeypatch, capsys, command, message):
    code, _, err = run_main(monkeypatch, capsys, *command, "--model", str(MODELS / "modernbert"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1

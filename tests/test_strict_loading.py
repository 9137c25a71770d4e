"""Strict loading (issue 22): every tensor of a checkpoint is read or in its family's IGNORED table,
and config.json's model_type is checked before any other value.

The fixtures are copied into tmp_path and changed there: a tensor added (with the `safetensors`
package), a config.json knob changed. A checkpoint of another family under a supported
model_type (mBART labelled BART: two extra layer norms) must be refused, not run with them dropped.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import qkv
from conftest import FAMILY_FIXTURES, FIXTURES, MODELS, TOL_HIDDEN, max_abs, reference, run_main
from qkv.checkpoints.families import FAMILIES, config_of, weights_from_tensors
from qkv.checkpoints.common import ignorable

SEQ2SEQ = FIXTURES / "seq2seq"
SEQ2SEQ_FIXTURES = sorted(p.name for p in SEQ2SEQ.iterdir() if (p / "config.json").is_file())
ALL = [MODELS / n for n in FAMILY_FIXTURES] + [SEQ2SEQ / n for n in SEQ2SEQ_FIXTURES]


def copy(source, tmp_path):
    dst = tmp_path / source.name
    shutil.copytree(source, dst)
    return dst


def add_tensors(directory, extra: dict[str, np.ndarray], drop=()):
    """The checkpoint in DIRECTORY with the tensors EXTRA added (and the names DROP removed)."""
    tensors = load_file(directory / "model.safetensors")
    for name in drop:
        del tensors[name]
    save_file(tensors | extra, directory / "model.safetensors")


def edit_config(directory, **changes):
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def refusal(source) -> str:
    with pytest.raises(qkv.QkvError) as e:
        qkv.load(source)
    message = str(e.value)
    assert "\n" not in message
    return message


# ── model_type first ─────────────────────────────────────────────────────────────

@pytest.mark.parametrize("fixture, changes", [
    ("qwen2", dict(model_type="rwkv", sliding_window=0)),                 # a value qkv's ranges refuse
    ("bert", dict(model_type="funnel", type_vocab_size=0)),            # a value qkv's ranges refuse
])
def test_an_unsupported_family_is_named_before_its_values(tmp_path, fixture, changes):
    d = copy(MODELS / fixture, tmp_path)
    edit_config(d, **changes)
    message = refusal(d)
    assert message == (f"model_type {changes['model_type']!r} is not supported; "
                       f"qkv runs {', '.join(sorted(FAMILIES))}")
    with pytest.raises(qkv.QkvError, match="is not supported"):
        config_of(json.loads((d / "config.json").read_text()))
    with pytest.raises(qkv.QkvError, match="is not supported"):
        qkv.init(json.loads((d / "config.json").read_text()))


def test_a_supported_family_still_gets_the_value_reason(tmp_path):
    d = copy(MODELS / "mistral", tmp_path)
    edit_config(d, sliding_window=0)
    assert "sliding_window = 0 is not a positive integer" in refusal(d)


@pytest.mark.parametrize("kind", [["gpt2"], {"a": 1}, 7, None])
def test_a_model_type_that_is_not_a_name(kind):
    with pytest.raises(qkv.QkvError, match="model_type .* is not supported"):
        config_of({"model_type": kind, "n_embd": "64"})


# ── every tensor read, or ignored by name ────────────────────────────────────────

@pytest.mark.parametrize("source", ALL, ids=lambda p: p.name)
def test_every_fixture_loads_and_an_extra_tensor_is_refused(tmp_path, source):
    qkv.load(source)                                              # as committed: every tensor read
    d = copy(source, tmp_path)
    add_tensors(d, {"extra.weight": np.ones((3, 4), np.float32)})
    message = refusal(d)
    family = json.loads((d / "config.json").read_text())["model_type"]
    assert message.startswith(f"the checkpoint has 1 tensor that a {family} model never reads ('extra.weight');")
    assert "not its own" in message and "qkv runs" in message


def test_mbart_labelled_bart_is_refused(tmp_path):
    """mBART = BART + a LayerNorm after each stack: read as BART, its logits would be off by ~5."""
    d = copy(SEQ2SEQ / "bart", tmp_path)
    width = json.loads((d / "config.json").read_text())["d_model"]
    add_tensors(d, {f"model.{s}.layer_norm.{k}": (np.ones if k == "weight" else np.zeros)(width, np.float32)
                    for s in ("encoder", "decoder") for k in ("weight", "bias")})
    message = refusal(d)
    assert message.startswith("the checkpoint has 4 tensors that a bart model never reads "
                              "('model.decoder.layer_norm.bias', 'model.decoder.layer_norm.weight', "
                              "'model.encoder.layer_norm.bias' and 1 more); it is probably not a bart checkpoint")


def test_a_config_with_fewer_layers_than_the_checkpoint_is_refused(tmp_path):
    d = copy(MODELS / "gpt2", tmp_path)
    edit_config(d, n_layer=1)                                     # the file holds 2 blocks
    message = refusal(d)
    assert "config.json says 1 layer but the checkpoint holds layers up to 1 ('transformer.h.1.attn.c_attn.bias'" \
        in message and "use the config.json that came with it" in message


def test_a_sharded_checkpoint_is_checked_across_its_shards(tmp_path):
    d = copy(MODELS / "gpt2", tmp_path)
    tensors = load_file(d / "model.safetensors") | {"transformer.h.0.attn.extra": np.zeros(4, np.float32)}
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, d / fname)
    (d / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "('transformer.h.0.attn.extra')" in refusal(d)
    index["weight_map"] = {k: f for k, f in index["weight_map"].items() if k != "transformer.h.0.attn.extra"}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "('transformer.h.0.attn.extra')" in refusal(d)       # a shard's tensor counts, listed or not


def test_a_task_model_prefix_and_its_heads(tmp_path):
    """BertForMaskedLM keeps the encoder under "bert." and its head under "cls.": the head is IGNORED,
    a stray tensor under the prefix is not."""
    d = copy(MODELS / "bert", tmp_path)
    tensors = load_file(d / "model.safetensors")
    width = tensors["embeddings.LayerNorm.weight"].shape[0]
    heads = {"cls.predictions.bias": np.zeros(7, np.float32),
             "cls.predictions.transform.dense.weight": np.zeros((width, width), np.float32),
             "bert.pooler.dense.weight": np.zeros((width, width), np.float32),
             "bert.embeddings.position_ids": np.arange(8, dtype=np.int64)[None]}
    save_file({f"bert.{k}": v for k, v in tensors.items()} | heads, d / "model.safetensors")
    ref = reference("bert")
    out = qkv.load(d).forward(ref["input_ids"], ref["attention_mask"], ref["token_type_ids"])
    valid = ref["attention_mask"].astype(bool)
    assert max_abs(out.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN
    add_tensors(d, {"bert.encoder.layer.0.attention.self.distance_embedding.weight": np.zeros((4, width),
                                                                                          np.float32)})
    assert "('bert.encoder.layer.0.attention.self.distance_embedding.weight')" in refusal(d)


# What older transformers saved and qkv legitimately leaves unread, one case per family.
LEGITIMATE = {
    "bert": lambda t, d: {"embeddings.position_ids": np.arange(16, dtype=np.int64)[None],
                          "classifier.weight": np.zeros((2, d), np.float32)},
    "gpt2": lambda t, d: {f"transformer.h.{i}.attn.{k}": np.zeros((1, 1, 4, 4), np.float32)
                          for i in (0, 1) for k in ("bias", "masked_bias")}
                         | {"lm_head.weight": t["transformer.wte.weight"]},                  # tied: wte's copy
    "llama_gqa": lambda t, d: {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)
                               for i in (0, 1)},
    "marian": lambda t, d: {f"model.{s}.{k}.weight": np.zeros(t["model.shared.weight"].shape, np.float32)
                            for s in ("encoder", "decoder") for k in ("embed_tokens",)}
                           | {"model.encoder.embed_positions.weight": np.zeros((4, d), np.float32)},
    "bart": lambda t, d: {"model.decoder.embed_tokens.weight": t["model.shared.weight"]},
    "t5": lambda t, d: {"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight":
                        np.zeros((32, 2), np.float32), "encoder.embed_tokens.weight": t["shared.weight"]},
}


@pytest.mark.parametrize("name", sorted(LEGITIMATE))
def test_what_older_files_carry_is_ignored(tmp_path, name):
    source = MODELS / name if (MODELS / name).is_dir() else SEQ2SEQ / name
    d = copy(source, tmp_path)
    tensors = load_file(d / "model.safetensors")
    width = next(v.shape[-1] for k, v in tensors.items() if k.endswith(("wte.weight", "shared.weight",
                                                                        "embed_tokens.weight",
                                                                        "word_embeddings.weight")))
    extra = LEGITIMATE[name](tensors, width)
    assert set(extra).isdisjoint(tensors)
    add_tensors(d, extra)
    family = FAMILIES[json.loads((d / "config.json").read_text())["model_type"]]
    assert all(ignorable(n, family.IGNORED) for n in extra)
    model = qkv.load(d)
    if name in ("gpt2", "llama_gqa"):
        assert max_abs(model.forward(reference(name)["single_input_ids"]).logits,
                       reference(name)["single_logits"]) <= TOL_HIDDEN


def test_the_ignore_tables_are_exact_patterns():
    assert all(isinstance(module.IGNORED, dict) for module in FAMILIES.values())     # read_weights needs one
    gpt2, llama = FAMILIES["gpt2"].IGNORED, FAMILIES["llama"].IGNORED
    assert ignorable("h.11.attn.bias", gpt2) and ignorable("transformer.h.0.attn.masked_bias", gpt2)
    assert not ignorable("h.x.attn.bias", gpt2) and not ignorable("h.0.attn.bias.extra", gpt2)
    assert not ignorable("h.0.attn.c_attn.bias", gpt2)
    assert ignorable("model.layers.3.self_attn.rotary_emb.inv_freq", llama)
    assert not ignorable("model.layers.3.self_attn.q_norm.weight", llama)     # Qwen3's: never ignored


@pytest.mark.parametrize("source", ["minilm", "smollm2", "ko-en-tiny"])
def test_the_bundled_models_load(source):
    model = qkv.load(source)
    assert model.config.family in FAMILIES


def test_weights_from_tensors_is_strict_too():
    cfg = qkv.load(MODELS / "llama_gqa").config
    t = FAMILIES[cfg.family].tensors(qkv.init(cfg, seed=1).weights, cfg)
    weights_from_tensors(t, cfg)
    with pytest.raises(qkv.QkvError, match=r"the dict of tensors has 1 tensor that a llama model never reads "
                                           r"\('model.layers.0.mlp.extra'\); leave those out"):
        weights_from_tensors(t | {"model.layers.0.mlp.extra": np.zeros(3, np.float32)}, cfg)


def test_the_cli_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    d = copy(MODELS / "gpt2", tmp_path)
    add_tensors(d, {"transformer.h.0.attn.q_norm.weight": np.ones(4, np.float32)})
    code, out, err = run_main(monkeypatch, capsys, "show", "the cat", "--model", str(d))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("qkv: error: the checkpoint has 1 tensor that a gpt2 model never reads "
                          "('transformer.h.0.attn.q_norm.weight');"), err


# ── GGUF files ───────────────────────────────────────────────────────────────────

@pytest.fixture
def gguf_fixtures(tmp_path, monkeypatch):
    """make_gguf_fixtures (tests/fixtures), with conversions into a private cache."""
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(FIXTURES))
    import make_gguf_fixtures

    return make_gguf_fixtures


def tiny_llama(F, path, edit=None):
    return F.make(path, dict(F.COMMITTED_SPECS["tiny-llama"]), edit=edit)


def test_gguf_tensors_nothing_reads_are_refused(tmp_path, gguf_fixtures):
    F = gguf_fixtures
    vector = (np.ones(16, np.float32), None)

    def extra(meta, tensors):
        tensors |= {"blk.0.attn_q_norm.weight": vector, "blk.1.attn_k_norm.weight": vector}

    message = refusal(tiny_llama(F, tmp_path / "normed.gguf", extra))
    assert message.startswith("the GGUF file has 2 tensors that a llama model of this config never reads "
                              "('blk.0.attn_q_norm.weight', 'blk.1.attn_k_norm.weight'); qkv cannot run it")
    assert not [p for p in (tmp_path / "cache").iterdir()]                 # nothing half-converted stays


def test_gguf_layers_the_metadata_does_not_declare_are_refused(tmp_path, gguf_fixtures):
    F = gguf_fixtures

    def one_layer(meta, tensors):
        meta["llama.block_count"] = (1, meta["llama.block_count"][1])

    message = refusal(tiny_llama(F, tmp_path / "deeper.gguf", one_layer))
    assert "9 tensors that a llama model of this config never reads ('blk.1.attn_k.weight'" in message
    assert "and 6 more)" in message


def test_gguf_rope_inverse_frequencies_are_ignored(tmp_path, gguf_fixtures):
    """Old llama.cpp files store blk.{i}.attn_rot_embd: left unread (IGNORED), the numbers unchanged."""
    F = gguf_fixtures

    def rot(meta, tensors):
        tensors |= {f"blk.{i}.attn_rot_embd.weight": (np.ones(8, np.float32), None) for i in (0, 1)}

    plain = qkv.load(tiny_llama(F, tmp_path / "plain.gguf"))
    model = qkv.load(tiny_llama(F, tmp_path / "rot.gguf", rot))
    ids = [[5, 6, 7, 8]]
    np.testing.assert_array_equal(model.forward(ids).logits, plain.forward(ids).logits)

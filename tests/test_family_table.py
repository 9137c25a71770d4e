"""Families as data (issue 44): each family module's one tensor table (qkv.checkpoints.table) read both ways, and
families found by their module, not listed: a new family with existing knobs is one new file."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv
from conftest import MODELS
from qkv.checkpoints import families, gguf_archs, weights_from_tensors
from qkv.checkpoints.common import ignorable
from qkv.checkpoints.families import FAMILIES, GGUF_ARCHS, MACHINERY, family_of

# A family qkv has never seen, written as a developer would add one: this file alone (its config reader, its
# tensor table, its llama.cpp architecture), with knobs qkv has (pre-norm LayerNorm, learned positions, a fused
# [Q; K; V] Linear with biases, GELU, an untied head).
TOY = '''
"""Toy: a made-up family for tests."""

from qkv.checkpoints.common import HF_ACTIVATIONS, activation, need, reads_back
from qkv.checkpoints.table import LINEAR, Arch, Head, Row, layer_norm, linear, read_table, write_table
from qkv.core.config import ModelConfig

MODEL_TYPES = ("toy_lm",)
IGNORED = {}

ROWS = [
    Row("tok_embed", "tokens.weight", "V d"),
    Row("pos_embed", "positions.weight", "P d"),
    *layer_norm("block.attn_norm", "blocks.{i}.norm1"),
    Row(("block.attn.W_Q", "block.attn.W_K", "block.attn.W_V"), "blocks.{i}.qkv.weight", "d q+kv+kv", LINEAR,
        parts="q kv kv"),
    Row(("block.attn.b_Q", "block.attn.b_K", "block.attn.b_V"), "blocks.{i}.qkv.bias", "q+kv+kv", parts="q kv kv"),
    *linear("block.attn.W_O", "blocks.{i}.out", "q d", "block.attn.b_O"),
    *layer_norm("block.ffn_norm", "blocks.{i}.norm2"),
    *linear("block.ffn.W_in", "blocks.{i}.up", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "blocks.{i}.down", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "norm"),
    Row("W_vocab", "head.weight", "d V", Head(), root=True),
]

GGUF = {"toy": Arch("toy_lm", "ToyForCausalLM", {"attn_qkv": "qkv"}, {"token_embd": "tokens"}, norm="layer")}


def config(hf):
    return ModelConfig(family="toy_lm", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "width"),
                       n_layers=need(hf, "depth"), n_heads=need(hf, "heads"), d_ff=need(hf, "ffn"),
                       max_positions=need(hf, "positions"), causal=True, norm="layer", norm_place="pre",
                       position="learned", activation=activation(hf.get("act", "gelu")),
                       tied_embeddings=False, final_norm=True, lm_head=True)


def hf_config(cfg):
    return reads_back(cfg, {"model_type": "toy_lm", "vocab_size": cfg.vocab_size, "width": cfg.d_model,
                            "depth": cfg.n_layers, "heads": cfg.n_heads, "ffn": cfg.d_ff,
                            "positions": cfg.max_positions, "act": HF_ACTIVATIONS[cfg.activation]}, config)


def weights(store, cfg, dtype):
    return read_table(ROWS, store, cfg, dtype)


def tensors(weights, cfg):
    return write_table(ROWS, weights, cfg, "model.")
'''

TOY_CONFIG = {"model_type": "toy_lm", "vocab_size": 50, "width": 16, "depth": 2, "heads": 2, "ffn": 24,
              "positions": 12}


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy family's one file in a folder of its own, found as qkv finds its families; unregistered after."""
    folder = tmp_path / "toy_families"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "toy_lm.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    before, archs = dict(FAMILIES), dict(GGUF_ARCHS)
    yield families.discover(folder, "toy_families")
    FAMILIES.clear(), FAMILIES.update(before)
    GGUF_ARCHS.clear(), GGUF_ARCHS.update(archs)


def test_a_new_family_is_one_file(toy_family, tmp_path):
    """Discovered from its file: loadable, savable, initialisable, its GGUF architecture known; what is saved
    reads back as the same model, number for number, under the table's names."""
    (module,) = toy_family
    assert family_of("toy_lm") is module and gguf_archs.arch_of("toy").family == "toy_lm"
    model = qkv.init(TOY_CONFIG, seed=3)
    model.save(tmp_path / "saved")
    stored = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert "model.blocks.1.qkv.weight" in stored and "head.weight" in stored
    assert stored["model.blocks.0.qkv.weight"].shape == (48, 16)                      # [Q; K; V] rows, (out, in)
    np.testing.assert_array_equal(stored["model.blocks.0.qkv.weight"][16:32].T, model.weights.blocks[0].attn.W_K)
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["model_type"] == "toy_lm"
    back = qkv.load(tmp_path / "saved")
    ids = np.array([[1, 5, 7, 9, 2]])
    np.testing.assert_array_equal(back.forward(ids).logits, model.forward(ids).logits)
    t = module.tensors(model.weights, model.config)                               # read back: views of the fused one
    attn = weights_from_tensors(t, model.config).blocks[0].attn
    assert all(np.shares_memory(W, t["model.blocks.0.qkv.weight"]) for W in (attn.W_Q, attn.W_K, attn.W_V))


def test_every_family_module_is_registered_by_discovery():
    """No list by hand: every module of the folder that declares MODEL_TYPES is a family, and only those."""
    from pathlib import Path
    import pkgutil

    import qkv.checkpoints as package

    modules = {m.name for m in pkgutil.iter_modules(package.__path__)} - MACHINERY
    assert {m.__name__.rsplit(".", 1)[1] for m in FAMILIES.values()} == modules
    assert all(a.family in FAMILIES for a in GGUF_ARCHS.values())
    assert "from . import" not in Path(families.__file__).read_text()          # no family imported by name


def _tabled():
    """The fixtures of the families whose tensors are a table (ROWS)."""
    names = []
    for path in sorted(MODELS.iterdir()):
        if (path / "config.json").is_file():
            kind = json.loads((path / "config.json").read_text())["model_type"]
            if hasattr(FAMILIES.get(kind), "ROWS"):
                names.append(path.name)
    return names


@pytest.mark.parametrize("name", _tabled())
def test_the_table_writes_back_the_checkpoint_it_read(name):
    """Read by the table, written by the same table: every tensor of the fixture comes back bit for bit under
    its own name (the task model's prefix aside), but those the family IGNOREs. (Gemma's γ, held as 1 + w,
    comes back as (1 + w) − 1: w to float32's rounding of 1 + w.)"""
    model = qkv.load(MODELS / name)
    family = family_of(model.config.family)
    written = family.tensors(model.weights, model.config)
    stored = load_file(str(MODELS / name / "model.safetensors"))

    def bare(n: str) -> str:
        for prefix in ("model.", "transformer.", "gpt_neox.", "roberta.", "electra.", "distilbert.", "vit."):
            if n.startswith(prefix):
                return n[len(prefix):]
        return n

    mine, theirs = {bare(k): v for k, v in written.items()}, {bare(k): v for k, v in stored.items()}
    for key, value in theirs.items():
        if key not in mine:
            assert ignorable(key, family.IGNORED), key
            continue
        assert mine[key].shape == value.shape, key
        plus_one = model.config.family in ("gemma", "gemma2", "gemma3_text") and "norm" in key
        np.testing.assert_allclose(mine[key], value.astype(mine[key].dtype), rtol=0, atol=1e-7 if plus_one else 0,
                                   err_msg=key)
    assert set(mine) <= set(theirs)

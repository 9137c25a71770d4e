"""qkv.core.layout: the weights laid out for speed keep the guide's names and values (decoders).

W_Q, W_K, W_V are views of the columns of W_QKV (W_gate, W_in of W_gate_in), every matrix
is C-contiguous, a tied W_vocab shares memory with the embedding table, and the forward
pass with the fused products equals the one with separate products (float32 rounding:
the sums are the same products in another BLAS kernel; tolerance 1e-5 on hidden states
of size ~1, tighter than the 1e-4 the reference tests allow).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import qkv
from conftest import FAMILY_FIXTURES, MODELS, TOL_HIDDEN, max_abs, reference
from qkv.core.layout import fast_layout, is_fast, side_by_side
from qkv.models.model import Model
from qkv.core.weights import MoEWeights, Weights, ffns_of


def unfused(w: Weights) -> Weights:
    """The same weights without the fused arrays (the plain path: one product per matrix); a routed FFN's
    experts each without theirs."""
    def ffn(f):
        if isinstance(f, MoEWeights):
            return replace(f, experts=[ffn(e) for e in f.experts], shared=None if f.shared is None else ffn(f.shared))
        return replace(f, W_gate_in=None)
    blocks = [replace(b, attn=replace(b.attn, W_QKV=None), ffn=ffn(b.ffn)) for b in w.blocks]
    return replace(w, blocks=blocks)


def test_side_by_side_gives_views_of_one_array():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)).T, rng.standard_normal((4, 5))          # a: a transposed view
    fused, (va, vb) = side_by_side(a, b)
    assert fused.shape == (4, 8) and fused.flags.c_contiguous
    assert np.array_equal(va, a) and np.array_equal(vb, b)
    assert np.shares_memory(va, fused) and np.shares_memory(vb, fused)


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_loaded_weights_are_laid_out_and_keep_their_values(name):
    from qkv.checkpoints import FAMILIES
    from qkv.checkpoints.tensors import TensorStore
    import json

    model = qkv.load(MODELS / name)
    cfg = model.config
    hf = json.loads((MODELS / name / "config.json").read_text())
    plain = FAMILIES[hf["model_type"]].weights(TensorStore(MODELS / name), cfg, np.float32)   # as read
    w = model.weights
    if not cfg.causal:                                       # encoders stay as read (memory-mapped)
        assert not is_fast(w) and w.blocks[0].attn.W_QKV is None
        return
    assert is_fast(w)
    for got, want in zip(w.blocks, plain.blocks):
        a = got.attn
        assert np.shares_memory(a.W_Q, a.W_QKV) and np.shares_memory(a.W_V, a.W_QKV)
        assert np.array_equal(a.W_QKV, np.concatenate([want.attn.W_Q, want.attn.W_K, want.attn.W_V], axis=1))
        for field in ("W_Q", "W_K", "W_V", "W_O"):
            assert np.array_equal(getattr(a, field), getattr(want.attn, field))
        for g, f in zip(ffns_of(got.ffn), ffns_of(want.ffn)):        # a routed FFN: each expert
            if f.W_gate is not None:
                assert np.shares_memory(g.W_gate, g.W_gate_in)
                assert np.array_equal(g.W_gate, f.W_gate) and np.array_equal(g.W_in, f.W_in)
    assert np.array_equal(w.tok_embed, plain.tok_embed)
    if w.W_vocab is not None:
        assert np.array_equal(w.W_vocab, plain.W_vocab) and w.W_vocab.flags.c_contiguous
        assert np.shares_memory(w.W_vocab, w.tok_embed) == np.shares_memory(plain.W_vocab, plain.tok_embed)
    assert w.nbytes() == plain.nbytes()                      # the views are not counted twice
    assert fast_layout(w) is w                               # idempotent


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_fused_products_equal_separate_ones_and_the_reference(name):
    ref = reference(name)
    model = qkv.load(MODELS / name)
    model.weights = fast_layout(model.weights)               # encoders too: the fused path works for every family
    plain = Model.__new__(Model)                             # the same model, not laid out again
    plain.__dict__.update(model.__dict__, weights=unfused(model.weights))
    args = (ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    fast, slow = model.forward(*args, attentions=False), plain.forward(*args, attentions=False)
    valid = ref["attention_mask"].astype(bool)
    assert max_abs(fast.hidden[valid], slow.hidden[valid]) <= 1e-5
    assert max_abs(fast.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN


def test_astype_keeps_the_layout_and_values():
    model = qkv.load(MODELS / "llama_gqa")
    wide = model.astype(np.float64)
    assert is_fast(wide.weights) and wide.weights.blocks[0].attn.W_QKV.dtype == np.float64
    assert np.array_equal(wide.weights.blocks[0].attn.W_K, model.weights.blocks[0].attn.W_K.astype(np.float64))

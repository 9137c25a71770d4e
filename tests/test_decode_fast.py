"""The one-token step's readable fast path (layer.step_block, layer.row_norm) gives the very numbers of the plain
blocks, and generation takes it only where nothing is recorded, hooked or ablated (with QKV_STEP=readable: the
compiled step beside it is tests/test_step_compiled.py's)."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
import qkv.core.layer as qb
from qkv.core.cache import KVCache
from qkv.core.ops import rms_norm
from qkv.core.weights import NormWeights

from conftest import DECODER_FIXTURES, MODELS


@pytest.fixture(scope="module", params=DECODER_FIXTURES)
def decoder(request):
    return qkv.load(str(MODELS / request.param))


def plain_step_block(x, w, ctx, layer):
    """block() with the fast path switched off: the plain boxes, recorder and all."""
    ctx.one_step = False
    try:
        return qb.block(x, w, ctx, layer)
    finally:
        ctx.one_step = True


def step_logits(model, ids, mask, steps: int) -> list[np.ndarray]:
    """The prompt's pass, then `steps` one-token steps feeding back the greedy token: every logits."""
    B, n = ids.shape
    cache = KVCache(model.config, B, n + steps)
    full = np.concatenate([mask, np.ones((B, steps), mask.dtype)], axis=1)
    out = [model.last_logits(ids, full[:, :n], cache=cache)]
    for t in range(steps):
        new = out[-1][:, -1].argmax(-1)[:, None]                          # (B, 1)
        out.append(model.last_logits(new, full[:, :n + t + 1], cache=cache))
    return out


def test_the_fast_step_gives_the_plain_numbers_bit_for_bit(decoder, monkeypatch):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, decoder.config.vocab_size, size=(2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, :3] = 0                                                       # left padding in row 1
    calls = []
    real = qb.step_block
    monkeypatch.setattr(qb, "step_block", lambda *a: calls.append(1) or real(*a))
    fast = step_logits(decoder, ids, mask, 6)
    # every step, every layer took it; phi3's step past original_max_position_embeddings (12) reads the whole
    # sequence again with LongRoPE's long table (tests/test_cache.py): a pass of many rows, the plain blocks
    fast_steps = 5 if decoder.config.family == "phi3" else 6
    assert len(calls) == fast_steps * decoder.config.n_layers
    monkeypatch.setattr(qb, "step_block", plain_step_block)
    plain = step_logits(decoder, ids, mask, 6)
    for a, b in zip(fast, plain):
        assert np.array_equal(a, b)


def test_generation_is_unchanged_and_recording_or_hooks_take_the_plain_path(monkeypatch):
    model = qkv.load(str(MODELS / "llama_gqa"))
    ids = np.arange(3, 9)[None]
    calls = []
    real = qb.step_block
    monkeypatch.setattr(qb, "step_block", lambda *a: calls.append(1) or real(*a))
    fast = model.generate(ids, 5, temperature=0, stop_at_eos=False)
    assert calls
    no_cache = model.generate(ids, 5, temperature=0, stop_at_eos=False, use_cache=False)
    assert np.array_equal(fast, no_cache)
    calls.clear()
    seen = []
    hooked = model.generate(ids, 5, temperature=0, stop_at_eos=False,
                            hooks={"0.heads": lambda z, layer: seen.append(layer) or z})
    assert np.array_equal(hooked, fast) and seen and not calls             # hooks: the plain path
    model.ablate([(0, 1)]).generate(ids, 3, temperature=0, stop_at_eos=False)
    assert not calls                                                       # ablation: the plain path


@pytest.mark.parametrize("scale", [1e-20, 1e-6, 1.0, 3e5, 1e19, 1e25])
def test_row_norm_is_rms_norm_bit_for_bit(scale):
    rng = np.random.default_rng(1)
    cfg = qkv.load(str(MODELS / "llama_gqa")).config
    for d in (1, 7, 64, 576, 1000):
        x = (rng.standard_normal((1, 1, d)) * scale).astype(np.float32)   # (1, 1, d)
        w = NormWeights(rng.standard_normal(d).astype(np.float32), None)
        with np.errstate(over="ignore"):                                  # x² overflows at the largest scales
            fast, plain = qb.row_norm(x, w, cfg), rms_norm(x, w.weight, cfg.norm_eps)
        assert np.array_equal(fast, plain, equal_nan=True)
    many = rng.standard_normal((2, 1, 64)).astype(np.float32)             # more than one row: plain norm
    w = NormWeights(np.ones(64, np.float32), None)
    assert np.array_equal(qb.row_norm(many, w, cfg), rms_norm(many, w.weight, cfg.norm_eps))


def test_q_k_v_of_different_kinds_take_the_fast_step_too(tmp_path, monkeypatch):
    """A file whose W_V is of another kind than W_Q, W_K (llama.cpp's Q4_K_M gives half its layers a Q6_K W_V):
    its Q, K, V stay three products, joined in the step, which every layer still takes — the plain numbers, bit for
    bit."""
    import sys

    import gguf

    from conftest import FIXTURES

    sys.path.insert(0, str(FIXTURES))
    import make_gguf_fixtures as F

    def mixed(meta, tensors):
        data, raw = tensors["blk.0.attn_v.weight"]
        tensors["blk.0.attn_v.weight"] = F.encode(gguf.quants.dequantize(data, raw), "Q8_0")

    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    model = qkv.load(F.make(tmp_path / "mixed.gguf", "llama", "Q4_0", edit=mixed))
    assert model.weights.blocks[0].attn.W_QKV is None
    ids, mask = np.array([[1, 5, 9, 14, 3]]), np.ones((1, 5), np.int64)
    calls = []
    real = qb.step_block
    monkeypatch.setattr(qb, "step_block", lambda *a: calls.append(1) or real(*a))
    fast = step_logits(model, ids, mask, 4)
    assert len(calls) == 4 * model.config.n_layers
    monkeypatch.setattr(qb, "step_block", plain_step_block)
    for a, b in zip(fast, step_logits(model, ids, mask, 4)):
        assert np.array_equal(a, b)

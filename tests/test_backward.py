"""Every box's backward against float64 central finite differences, each box alone, on tiny shapes.

For a box y = f(x, w) and a fixed random R, the scalar L = Σ y ⊙ R has dL/dy = R; the box's backward
given dy = R must equal (L(x + εe) − L(x − εe)) / 2ε for every entry e of every input, to ~1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest

from qkv.core import blocks_backward as back
from qkv.core import ops
from qkv.core.attention import AttentionMask, attention_backward, scaled_dot_product_attention
from qkv.core.blocks import linear
from qkv.core.layer import block
from qkv.core.context import Context
from qkv.core.blocks_backward import Tape
from qkv.core.config import ModelConfig
from qkv.core.positions import apply_rope, apply_rope_backward, rope_cos_sin, rope_inv_freq
from qkv.core.trace import Recorder
from qkv.train import backprop as G
from qkv.core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights

EPS = 1e-6
TOL = 1e-6


def numeric(f, x: np.ndarray, R: np.ndarray) -> np.ndarray:
    """d(Σ f(x) ⊙ R)/dx by central differences, x changed in place and restored."""
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + EPS
        up = np.sum(f() * R)
        flat[i] = keep - EPS
        down = np.sum(f() * R)
        flat[i] = keep
        gf[i] = (up - down) / (2 * EPS)
    return g


def close(analytic: np.ndarray, expected: np.ndarray, tol: float = TOL, zero: bool = False) -> None:
    """Equal to the finite differences; and not vacuously (a gradient that is not ~0, unless `zero`)."""
    err = np.max(np.abs(analytic - expected)) / max(1.0, np.max(np.abs(expected)))
    assert err < tol, f"backward differs from finite differences by {err:.2e}"
    assert zero or np.max(np.abs(expected)) > 1e-3, "the check is vacuous: the gradient is ~0"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_softmax(rng):
    S = rng.normal(size=(2, 3, 5))
    S[0, 1, 2] = -np.inf                                      # a masked key gets no gradient
    R = rng.normal(size=S.shape)
    A = ops.softmax(S)
    dS = ops.softmax_backward(R, A)
    finite = np.where(np.isfinite(S), S, 0.0)
    mask = np.where(np.isfinite(S), 0.0, -np.inf)
    close(np.where(np.isfinite(S), dS, 0), numeric(lambda: ops.softmax(finite + mask), finite, R))
    assert dS[0, 1, 2] == 0


def test_layer_norm(rng):
    x, w, b = rng.normal(size=(2, 3, 6)), rng.normal(size=6), rng.normal(size=6)
    R = rng.normal(size=x.shape)
    dx, dw, db = ops.layer_norm_backward(R, x, w, 1e-5)
    f = lambda: ops.layer_norm(x, w, b, 1e-5)            # noqa: E731
    close(dx, numeric(f, x, R))
    close(dw, numeric(f, w, R))
    close(db, numeric(f, b, R))


def test_rms_norm(rng):
    x, w = rng.normal(size=(2, 3, 6)), rng.normal(size=6)
    R = rng.normal(size=x.shape)
    dx, dw = ops.rms_norm_backward(R, x, w, 1e-6)
    f = lambda: ops.rms_norm(x, w, 1e-6)                 # noqa: E731
    close(dx, numeric(f, x, R))
    close(dw, numeric(f, w, R))


@pytest.mark.parametrize("name", sorted(ops.ACTIVATIONS))
def test_activations(rng, name):
    x = rng.normal(size=(4, 7)) * 2
    x[x == 0] = 0.1                                           # ReLU's kink is not differentiable
    R = rng.normal(size=x.shape)
    close(ops.ACTIVATION_BACKWARDS[name](R, x), numeric(lambda: ops.ACTIVATIONS[name](x), x, R))


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8}])
def test_rope(rng, scaling):
    x = rng.normal(size=(2, 3, 5, 8))
    cos, sin = rope_cos_sin(np.array([[0, 1, 2, 7, 30], [3, 4, 5, 6, 9]]), rope_inv_freq(8, 100.0, scaling, np.float64))
    R = rng.normal(size=x.shape)
    close(apply_rope_backward(R, cos, sin), numeric(lambda: apply_rope(x, cos, sin), x, R))


@pytest.mark.parametrize("H, Hkv", [(4, 4), (4, 2), (4, 1)])
def test_attention_gqa_mqa_masked(rng, H, Hkv):
    B, n, dk = 2, 5, 3
    q, k, v = rng.normal(size=(B, H, n, dk)), rng.normal(size=(B, Hkv, n, dk)), rng.normal(size=(B, Hkv, n, dk))
    key_mask = np.ones((B, n), bool)
    key_mask[1, 3:] = False                                   # a padded row
    bias = AttentionMask(n=n, m=n, causal=True, window=3, key_mask=key_mask).bias(np.float64)
    R = rng.normal(size=(B, H, n, dk))
    _, A, _ = scaled_dot_product_attention(q, k, v, bias)
    dq, dk_, dv = attention_backward(R, q, k, v, A)
    f = lambda: scaled_dot_product_attention(q, k, v, bias)[0]   # noqa: E731
    close(dq, numeric(f, q, R))
    close(dk_, numeric(f, k, R))
    close(dv, numeric(f, v, R))


def test_linear(rng):
    x, W, b = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 5)), rng.normal(size=5)
    R = rng.normal(size=(2, 3, 5))
    dx, dW, db = back.linear(R, x, W, True)
    f = lambda: linear(x, W, b)                           # noqa: E731
    close(dx, numeric(f, x, R))
    close(dW, numeric(f, W, R))
    close(db, numeric(f, b, R))


def _cfg(**knobs) -> ModelConfig:
    base = dict(family="llama", vocab_size=11, d_model=8, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=6,
                max_positions=16, norm="rms", position="rope", activation="silu", gated_ffn=True, norm_eps=1e-6)
    return ModelConfig(**{**base, **knobs})


def _ffn(rng, cfg: ModelConfig) -> FFNWeights:
    d, f = cfg.d_model, cfg.d_ff
    r = lambda *s: rng.normal(size=s) * 0.5              # noqa: E731
    if cfg.gated_ffn:
        return FFNWeights(W_in=r(d, f), W_out=r(f, d), W_gate=r(d, f))
    return FFNWeights(W_in=r(d, f), W_out=r(f, d), b_in=r(f), b_out=r(d))


def _block(rng, cfg: ModelConfig) -> BlockWeights:
    d, hq, hkv = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    r = lambda *s: rng.normal(size=s) * 0.5              # noqa: E731
    bias = cfg.qkv_bias
    attn = AttentionWeights(W_Q=r(d, hq), W_K=r(d, hkv), W_V=r(d, hkv), W_O=r(hq, d),
                            b_Q=r(hq) if bias else None, b_K=r(hkv) if bias else None,
                            b_V=r(hkv) if bias else None, b_O=r(d) if cfg.out_bias else None)
    norm = lambda: NormWeights(1 + r(d), r(d) if cfg.norm == "layer" else None)   # noqa: E731
    return BlockWeights(attn_norm=norm(), attn=attn, ffn_norm=norm(), ffn=_ffn(rng, cfg))


@pytest.mark.parametrize("cfg", [
    _cfg(),                                                                       # Llama: RMSNorm, SwiGLU, GQA
    _cfg(family="gpt2", norm="layer", position="learned", activation="gelu_tanh", gated_ffn=False,
         n_kv_heads=4, norm_eps=1e-5),                                              # GPT-2
    _cfg(family="bert", norm="layer", norm_place="post", position="learned", activation="gelu",
         gated_ffn=False, n_kv_heads=4, causal=False),                              # post-norm (BERT, Marian)
], ids=["llama", "gpt2", "post-norm"])
def test_block(rng, cfg):
    """A whole block (norms, attention, FFN, residuals) against finite differences, every weight: the
    engine's block with a tape, then its backward (blocks_backward.block)."""
    B, n = 2, 4
    w = _block(rng, cfg)
    x = rng.normal(size=(B, n, cfg.d_model))
    pos = np.array([[0, 1, 2, 3], [0, 1, 2, 3]])
    rope = rope_cos_sin(pos, rope_inv_freq(cfg.d_head, 10000.0, None, np.float64)) if cfg.position == "rope" else None
    mask = AttentionMask(n=n, m=n, causal=cfg.causal)
    R = rng.normal(size=x.shape)
    tape = Tape()
    block(x, w, Context(cfg, mask, rope, Recorder(keep=()), tape=tape), 0)
    dx, g, _ = back.block(R, w, tape, 0, cfg)
    assert not tape.records                                   # the backward read every record once
    f = lambda: block(x, w, Context(cfg, mask, rope, Recorder(keep=())), 0)   # noqa: E731
    close(dx, numeric(f, x, R))
    for part in ("attn", "ffn", "attn_norm", "ffn_norm"):
        for name, value in vars(getattr(w, part)).items():
            if isinstance(value, np.ndarray):    # b_K moves every score of a query equally: softmax ignores it
                close(getattr(getattr(g, part), name), numeric(f, value, R), zero=name == "b_K")


def test_next_token_loss(rng):
    logits, ids = rng.normal(size=(2, 5, 7)), rng.integers(0, 7, size=(2, 5))
    counted = np.ones((2, 4), bool)
    counted[1, 2:] = False
    loss, dlogits = G.next_token_loss(logits, ids, counted)

    def f():
        z = logits[:, :-1]
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return -np.sum(np.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0] * counted) / counted.sum()

    assert loss == pytest.approx(f(), rel=1e-12)
    close(dlogits, numeric(lambda: np.array(f()), logits, np.array(1.0)))


def _arrays(tree, name=""):
    """(dotted name, array) of every array in a Weights tree; the fused W_QKV / W_gate_in are
    skipped (views of the named matrices)."""
    from dataclasses import fields, is_dataclass
    if isinstance(tree, np.ndarray):
        yield name, tree
    elif isinstance(tree, list):
        for i, t in enumerate(tree):
            yield from _arrays(t, f"{name}.{i}")
    elif is_dataclass(tree):
        for f in fields(tree):
            if f.name not in ("W_QKV", "W_gate_in"):
                yield from _arrays(getattr(tree, f.name), f"{name}.{f.name}".lstrip("."))


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "qwen2"])
def test_whole_model_float64(name):
    """loss_and_grads of a whole decoder (embeddings, positions, every block, final norm, W_vocab
    tied or not, a padded row) against finite differences of the loss, at random entries of every weight."""
    from pathlib import Path

    import qkv
    model = qkv.load(Path(__file__).parent / "fixtures" / "models" / name).astype(np.float64)
    cfg, w = model.config, model.weights
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 6))
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    loss, g = G.loss_and_grads(w, cfg, ids, mask)
    grads = dict(_arrays(g))
    checked = 0
    for key, value in _arrays(w):
        if key == "W_vocab" and np.shares_memory(value, w.tok_embed):
            continue                                          # tied: the same numbers as tok_embed
        rows = np.unique(ids) if key == "tok_embed" else None     # rows of E that the input uses
        picks = (rng.choice(rows, 3) * value.shape[1] + rng.integers(0, value.shape[1], 3)) if rows is not None \
            else rng.integers(0, value.size, 4)
        for i in picks:
            at = np.unravel_index(i, value.shape)             # index the array itself: W_Q is a view of W_QKV
            keep = value[at]
            value[at] = keep + 1e-6
            up = G.loss_and_grads(w, cfg, ids, mask)[0]
            value[at] = keep - 1e-6
            down = G.loss_and_grads(w, cfg, ids, mask)[0]
            value[at] = keep
            assert grads[key][at] == pytest.approx((up - down) / 2e-6, abs=1e-7), f"{key}{at}"
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("name", ["marian", "bart", "mbart", "pegasus", "t5", "umt5"])
def test_whole_encoder_decoder_float64(name):
    """Encoder–decoder loss_and_grads (both stacks, cross-attention into the encoder's output, the shared
    table) against finite differences of the loss at random entries of every learned weight."""
    from pathlib import Path

    import qkv
    from qkv.train import seq2seq_backprop as S
    model = qkv.load(Path(__file__).parent / "fixtures" / "seq2seq" / name).astype(np.float64)
    cfg, w = model.config, model.weights
    rng = np.random.default_rng(2)
    src = rng.integers(3, cfg.vocab_size, size=(2, 5))
    mask = np.ones_like(src)
    mask[1, 3:] = 0
    labels = rng.integers(3, cfg.vocab_size, size=(2, 4))
    labels[1, 2:] = -100
    tgt_in = S.decoder_inputs(labels, model.start_token, cfg.pad_token_id)
    loss = lambda: S.loss_and_grads(w, cfg, src, mask, tgt_in, labels)[0]   # noqa: E731
    _, g = S.loss_and_grads(w, cfg, src, mask, tgt_in, labels)
    grads, checked = dict(_arrays(g)), 0
    for key, value in _arrays(w):
        if grads.get(key) is None or key.startswith("decoder.tok_embed") or key == "decoder.W_vocab" \
                or key.endswith("b_vocab"):
            continue                              # the shared table is checked once; fixed buffers have no gradient
        used = np.unique(np.concatenate([src.ravel(), tgt_in.ravel()]))
        used = used[used != cfg.pad_token_id]     # transformers' padding_idx: a pad lookup passes no gradient
        picks = (rng.choice(used, 3) * value.shape[1] + rng.integers(0, value.shape[1], 3)) if key.endswith("tok_embed") \
            else rng.integers(0, value.size, 3)
        for i in picks:
            at = np.unravel_index(i, value.shape)
            keep = value[at]
            value[at] = keep + 1e-6
            up = loss()
            value[at] = keep - 1e-6
            down = loss()
            value[at] = keep
            assert grads[key][at] == pytest.approx((up - down) / 2e-6, abs=1e-7), f"{key}{at}"
            checked += 1
    assert checked > 80


def test_fused_qkv_is_found_and_gives_the_same_gradients():
    """GPT-2's c_attn holds [W_Q | W_K | W_V] side by side: the training path multiplies by it once
    (forwards and backwards); the gradients equal those of three separate matrices."""
    from pathlib import Path

    import qkv
    from qkv.checkpoints import FAMILIES, weights_from_tensors
    model = qkv.load(Path(__file__).parent / "fixtures" / "models" / "gpt2")
    cfg = model.config
    params = FAMILIES["gpt2"].tensors(model.weights, cfg)
    fused = weights_from_tensors(params, cfg)                     # W_Q, W_K, W_V: views of c_attn
    assert back.fused_qkv(fused.blocks[0].attn) is params["transformer.h.0.attn.c_attn.weight"]
    from dataclasses import replace
    separate = replace(fused, blocks=[replace(b, attn=replace(b.attn, W_Q=b.attn.W_Q.copy(), W_K=b.attn.W_K.copy(),
                                                              W_V=b.attn.W_V.copy())) for b in fused.blocks])
    assert back.fused_qkv(separate.blocks[0].attn) is None
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))
    loss_f, g_f = G.loss_and_grads(fused, cfg, ids)
    loss_s, g_s = G.loss_and_grads(separate, cfg, ids)
    assert loss_f == pytest.approx(loss_s, abs=1e-6)
    for (key, a), (_, b) in zip(_arrays(g_f), _arrays(g_s)):
        np.testing.assert_allclose(a, b, atol=1e-6, err_msg=key)


def test_add_rows_equals_add_at(rng):
    idx = rng.integers(0, 7, 50)
    rows = rng.normal(size=(50, 3))
    table, expected = np.zeros((9, 3)), np.zeros((9, 3))
    back.add_rows(table, idx, rows)
    np.add.at(expected, idx, rows)
    np.testing.assert_allclose(table, expected, atol=1e-12)
    back.add_rows(table, idx[:0], rows[:0])                          # nothing to add
    np.testing.assert_allclose(table, expected, atol=1e-12)

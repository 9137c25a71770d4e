"""What the pass records so that analyses read it instead of applying the config's knobs again
(qkv.core.trace.INTERMEDIATES and FINAL): each norm's scale, what attention and the FFN read, q and k
before RoPE, the stream after attention and after the block, the FFN's pre-activations.

Each is checked on a pre-norm decoder (llama_gqa: RMSNorm, RoPE, GQA, SwiGLU), a post-norm encoder (bert:
LayerNorm after each box), parallel residuals (gpt_neox: two norms, partial RoPE; phi: one norm read by both
branches, q/k norms) for its shape and its value: where transformers exposes it (the stream between
blocks, `hidden_states`) against the committed reference, within 1e-4 as tests/test_families.py; elsewhere
against its float64 recomputation here, from the trace's other arrays and the weights, within 1e-5 of the
largest value compared (TOL). Sums the pass itself makes (x + out) are compared exactly. Hooks read and replace
each under its name; an analysis reading them (the logit lens) equals the model's logits exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS, reference
from qkv.analysis.lens import lens_of_trace
from qkv.core.ops import ACTIVATIONS
from qkv.runtime.errors import QkvError

TOL = 1e-5                  # float64 recomputation, relative to the largest value compared
REF_TOL = 1e-4              # transformers' hidden_states (float32), max abs
RECORDED = ("attn_norm_scale", "attn_in", "q_pre_rope", "k_pre_rope", "residual_mid", "ffn_norm_scale", "ffn_in",
            "ffn_pre", "residual_out", "final_norm_scale")
LAYOUTS = {"llama_gqa": "pre", "bert": "post", "gpt_neox": "parallel", "phi": "parallel"}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def case(request):
    """(name, model, ids (n,) of a row without padding, the trace keeping everything)."""
    name = request.param
    model = qkv.load(MODELS / name)
    ref = reference(name)
    row = int(np.argmax(ref["attention_mask"].all(axis=1)))             # a row without padding
    ids = ref["input_ids"][row]
    keep = tuple(n for n in ("residual", "q", "k", "neurons", "attn_out", "ffn_out") + RECORDED)
    return name, model, ref, row, model.run(ids, keep=keep)


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def scale64(x, cfg) -> np.ndarray:
    """(n,) √(mean(x²) + eps) or √(var(x) + eps) of each row, float64."""
    x = f64(x)
    xc = x if cfg.norm == "rms" else x - x.mean(-1, keepdims=True)
    return np.sqrt((xc * xc).mean(-1) + cfg.norm_eps)


def norm64(x, w, cfg) -> np.ndarray:
    """Norm(x) in float64, γ (and β) of W."""
    x = f64(x)
    y = (x if cfg.norm == "rms" else x - x.mean(-1, keepdims=True)) / scale64(x, cfg)[..., None] * f64(w.weight)
    return y if cfg.norm == "rms" or w.bias is None else y + f64(w.bias)


def close(ours, theirs, tol: float = TOL) -> None:
    ours, theirs = f64(ours), f64(theirs)
    assert ours.shape == theirs.shape
    assert np.max(np.abs(ours - theirs)) <= tol * max(1.0, np.max(np.abs(theirs)))


def test_each_recorded_value_has_its_shape(case):
    name, model, _, _, t = case
    cfg, n = model.config, len(t.ids)
    d_ff = model.weights.blocks[0].ffn.W_in.shape[1]
    shapes = {"attn_norm_scale": (n,), "attn_in": (n, cfg.d_model), "q_pre_rope": (cfg.n_heads, n, cfg.d_head),
              "k_pre_rope": (cfg.n_kv_heads, n, cfg.d_head), "residual_mid": (n, cfg.d_model),
              "ffn_norm_scale": (n,), "ffn_in": (n, cfg.d_model), "ffn_pre": (n, d_ff), "residual_out": (n, cfg.d_model)}
    shared = name == "phi"                                              # one norm for both branches
    for l in range(cfg.n_layers):
        lt = t.layers[l]
        for what, shape in shapes.items():
            if what == "ffn_norm_scale" and shared:
                assert lt.ffn_norm_scale is None
            else:
                assert getattr(lt, what).shape == shape, (what, l)
        assert (lt.final_norm_scale is not None) == (l == cfg.n_layers - 1 and model.weights.final_norm is not None)
    if model.weights.final_norm is not None:
        assert t.layer(-1).final_norm_scale.shape == (n,)


def test_the_norms_scales_and_what_the_boxes_read(case):
    """attn_norm_scale, attn_in, residual_mid, ffn_norm_scale, ffn_in, residual_out, layer by layer, as each
    layout computes them (the module's docstring)."""
    name, model, _, _, t = case
    cfg, layout = model.config, LAYOUTS[name]
    for l, b in enumerate(model.weights.blocks):
        lt = t.layers[l]
        x, a, f = lt.residual, lt.attn_out, lt.ffn_out
        if layout == "pre":
            close(lt.attn_norm_scale, scale64(x, cfg))
            close(lt.attn_in, norm64(x, b.attn_norm, cfg))
            assert np.array_equal(lt.residual_mid, x + a)
            close(lt.ffn_norm_scale, scale64(lt.residual_mid, cfg))
            close(lt.ffn_in, norm64(lt.residual_mid, b.ffn_norm, cfg))
            assert np.array_equal(lt.residual_out, lt.residual_mid + f)
        elif layout == "post":
            close(lt.attn_norm_scale, scale64(f64(x) + a, cfg))
            assert np.array_equal(lt.attn_in, x)
            close(lt.residual_mid, norm64(f64(x) + a, b.attn_norm, cfg))
            close(lt.ffn_norm_scale, scale64(f64(lt.residual_mid) + f, cfg))
            assert np.array_equal(lt.ffn_in, lt.residual_mid)
            close(lt.residual_out, norm64(f64(lt.residual_mid) + f, b.ffn_norm, cfg))
        else:                                                           # parallel: both read x
            close(lt.attn_norm_scale, scale64(x, cfg))
            close(lt.attn_in, norm64(x, b.attn_norm, cfg))
            assert np.array_equal(lt.residual_mid, x + a)
            if b.ffn_norm is None:                                      # Phi: the attention's norm serves both
                assert np.array_equal(lt.ffn_in, lt.attn_in)
            else:
                close(lt.ffn_norm_scale, scale64(x, cfg))
                close(lt.ffn_in, norm64(x, b.ffn_norm, cfg))
            assert np.array_equal(lt.residual_out, (f + a) + x)
        if l + 1 < cfg.n_layers:
            assert np.array_equal(lt.residual_out, t.layers[l + 1].residual)


def test_the_stream_leaving_each_block_is_transformers_and_the_final_norm_divides_it(case):
    name, model, ref, row, t = case
    cfg, L = model.config, model.config.n_layers
    seen = {}                                                           # the reference's batch, as a hook reads it
    out = model.forward(ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"),
                        hooks={"residual_out": lambda x, layer: seen.__setitem__(layer, x.copy())})
    for l in range(L - 1):                                              # hidden_states[l + 1]: block l's output
        assert np.max(np.abs(seen[l][row] - ref["hidden_states"][l + 1][row])) <= REF_TOL
    assert np.max(np.abs(out.hidden[row] - ref["hidden"][row])) <= REF_TOL
    last = t.layer(-1)
    fn = model.weights.final_norm
    if fn is None:                                                      # BERT: the last block's output is the hidden
        assert np.array_equal(last.residual_out, t.hidden)
        assert t.layers[L - 1].final_norm_scale is None
        with pytest.raises(QkvError, match="final norm"):
            last.final_norm_scale
    else:
        close(last.final_norm_scale, scale64(last.residual_out, cfg))
        close(t.hidden, norm64(last.residual_out, fn, cfg))


def test_q_k_before_rope_and_the_ffn_pre_activations(case):
    name, model, _, _, t = case
    cfg = model.config
    H, Hkv, dk = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    act = ACTIVATIONS[cfg.activation]
    for l, b in enumerate(model.weights.blocks):
        lt, at, ffn = t.layers[l], b.attn, b.ffn
        h = f64(lt.attn_in)                                                          # (n, d_model)
        q = (h @ f64(at.W_Q) + (0 if at.b_Q is None else f64(at.b_Q))).reshape(-1, H, dk).transpose(1, 0, 2)
        k = (h @ f64(at.W_K) + (0 if at.b_K is None else f64(at.b_K))).reshape(-1, Hkv, dk).transpose(1, 0, 2)
        if cfg.qk_norm == "head":                                                    # Phi: over d_k, before RoPE
            q, k = norm64(q, at.q_norm, cfg), norm64(k, at.k_norm, cfg)
        close(lt.q_pre_rope, q)
        close(lt.k_pre_rope, k)
        if cfg.position == "rope":                                                   # RoPE turns pairs: lengths kept
            close(np.linalg.norm(f64(lt.q), axis=-1), np.linalg.norm(q, axis=-1))
            close(np.linalg.norm(f64(lt.k), axis=-1), np.linalg.norm(k, axis=-1))
            assert not np.allclose(lt.q[:, 1:], lt.q_pre_rope[:, 1:])                # ... and did turn them
        else:
            assert np.array_equal(lt.q, lt.q_pre_rope) and np.array_equal(lt.k, lt.k_pre_rope)
        x = f64(lt.ffn_in)
        u = x @ f64(ffn.W_in) + (0 if ffn.b_in is None else f64(ffn.b_in))          # (n, d_ff)
        pre = u if ffn.W_gate is None else x @ f64(ffn.W_gate)
        close(lt.ffn_pre, pre)
        close(lt.neurons, act(f64(lt.ffn_pre)) * (1 if ffn.W_gate is None else u))


def test_the_costly_ones_are_kept_only_when_asked_for():
    model = qkv.load(MODELS / "llama_gqa")
    t = model.run("the cat sat")
    for name in ("q_pre_rope", "k_pre_rope", "ffn_pre"):
        assert not t.layer(0).kept(name)
        with pytest.raises(QkvError, match="only when asked"):
            getattr(t.layer(0), name)
    for name in ("attn_norm_scale", "attn_in", "residual_mid", "ffn_norm_scale", "ffn_in", "residual_out"):
        assert t.layer(0).kept(name)
    assert t.layer(-1).kept("final_norm_scale") and not t.layer(0).kept("final_norm_scale")


# hooks --------------------------------------------------------------------------

def test_a_hooked_norm_scale_is_what_the_norm_divides_by():
    model = qkv.load(MODELS / "llama_gqa")                              # RMSNorm: Norm(x) = x / s · γ
    ids = reference("llama_gqa")["input_ids"][0]
    plain = model.run(ids)
    for key in ("final_norm_scale", "-1.final_norm_scale"):
        doubled = model.run(ids, hooks={key: lambda s, layer: 2 * s})
        close(doubled.hidden, f64(plain.hidden) / 2)
        close(doubled.layer(-1).final_norm_scale, 2 * f64(plain.layer(-1).final_norm_scale))
    ones = model.run(ids, hooks={"0.attn_norm_scale": lambda s, layer: np.ones_like(s)})
    close(ones.layer(0).attn_in, f64(ones.layer(0).residual) * f64(model.weights.blocks[0].attn_norm.weight))
    with pytest.raises(QkvError, match="after the last layer"):
        model.run(ids, hooks={"0.final_norm_scale": lambda s, layer: s})


def test_the_stream_after_attention_is_hooked_except_in_a_parallel_block():
    model = qkv.load(MODELS / "llama_gqa")
    ids = reference("llama_gqa")["input_ids"][0]
    t = model.run(ids, hooks={"0.residual_mid": lambda x, layer: 0})
    assert not t.layer(0).residual_mid.any()
    assert np.array_equal(t.layer(0).residual_out, t.layer(0).ffn_out)   # 0 + FFN(Norm(0))
    neox = qkv.load(MODELS / "gpt_neox")
    with pytest.raises(QkvError, match="parallel"):
        neox.run(reference("gpt_neox")["input_ids"][0], hooks={"residual_mid": lambda x, layer: x})


def test_keys_before_rope_and_pre_activations_are_hooked():
    model = qkv.load(MODELS / "llama_gqa")
    ids = reference("llama_gqa")["input_ids"][0]
    n = len(ids)
    t = model.run(ids, keep=("attentions", "k", "neurons", "ffn_pre"),
                  hooks={"1.k_pre_rope.0": lambda k, layer: 0, "0.ffn_pre": lambda g, layer: 0})
    G = model.config.n_heads // model.config.n_kv_heads
    assert not t.layer(1).k[0].any() and t.layer(1).k[1].any()          # K/V head 0 only: RoPE turns 0 into 0
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]  # every visible key weighs the same
    close(t.layer(1).attentions[:G], np.broadcast_to(uniform, (G, n, n)))
    assert not t.layer(0).ffn_pre.any() and not t.layer(0).neurons.any()   # SiLU(0) ⊙ u = 0
    with pytest.raises(QkvError, match="no single d_ff hidden"):
        qkv.load(MODELS / "mixtral").run("the cat", hooks={"ffn_pre": lambda g, layer: g})


# an analysis reading them ---------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt_neox", "llama_gqa", "opt", "phi"])   # opt: post-norm, project_in/out
def test_the_lens_last_row_is_the_models_logits_exactly(name):
    """The lens reads the last block's output as the pass recorded it (residual_out), so its last row is the
    model's own logits to the bit, whatever the layout (a parallel block sums (f + a) + x)."""
    model = qkv.load(MODELS / name)
    t = model.run(reference(name)["input_ids"][0], keep=("residual", "residual_out"))
    assert np.array_equal(lens_of_trace(model, t)[-1], t.logits)


def test_an_encoder_decoders_cross_attention_step_is_recorded_in_its_own_trace():
    """Marian (post-norm): the cross trace's residual is the decoder's stream after self-attention, its attn_in
    what cross-attention read; the decoder's residual_mid the stream after cross-attention."""
    mt = qkv.load("ko-en-tiny")
    t = mt.run("나는 학교에 간다", "I go to school")
    cfg = mt.config
    for l, b in enumerate(mt.weights.decoder.blocks):
        d, c = t.layers[l], t.cross.layers[l]
        close(c.residual, norm64(f64(d.residual) + d.attn_out, b.attn_norm, cfg))
        close(c.attn_norm_scale, scale64(f64(c.residual) + c.attn_out, cfg))
        assert np.array_equal(c.attn_in, c.residual)
        close(d.residual_mid, norm64(f64(c.residual) + c.attn_out, b.cross_norm, cfg))
        assert np.array_equal(d.ffn_in, d.residual_mid)

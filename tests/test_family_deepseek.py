"""DeepSeek V2 and V3 (issue 47) beyond tests/test_families.py's comparisons with transformers (forward with left and
right padding, every attention weight, the cache step, greedy ids, on tests/fixtures/models/deepseek_{v3, v2,
v3_dense}, made by tests/fixtures/make_fixtures.py): multi-head latent attention written out by hand, the KV cache
holding the latent, each new knob needed for the reference's numbers, the knobs read from config.json, a saved
model reading back equal, the hooks and training it refuses, the lessons' cache bytes, and the refusals.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from rich.console import Console

import qkv
from conftest import (MODELS, TOL_HIDDEN, check_gradients, check_knob_matters, check_saved_reads_back, edited, max_abs,
                      reference, run_main)
from qkv import QkvError
from qkv.core.cache import KVCache
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.lessons import gqa, kvcache
from test_browser import browser, tab  # noqa: F401 (fixtures)

DEEPSEEK = ("deepseek_v3", "deepseek_v2", "deepseek_v3_dense")


def test_the_knobs_as_read():
    v3, v2, dense = (qkv.load(MODELS / n).config for n in DEEPSEEK)
    assert (v3.kv_lora_rank, v3.q_lora_rank, v3.d_head, v3.rotary_dim, v3.d_value) == (16, 24, 16, 8, 12)
    assert v3.rope_deinterleave and not v3.rope_interleaved and v3.qkv_bias and v3.out_bias
    assert v3.rope_scaling["attention_factor"] == pytest.approx((0.08 * np.log(4) + 1) / (0.1 * np.log(4) + 1))
    assert v3.attn_scale == pytest.approx(16 ** -0.5 * (0.1 * np.log(4) + 1) ** 2)      # yarn_apply_mscale
    assert (v3.n_experts, v3.experts_per_token, v3.dense_layers, v3.d_expert, v3.d_shared_expert) == (8, 3, (0,), 16, 32)
    assert (v3.router_score, v3.expert_choice_bias, v3.expert_groups, v3.expert_groups_kept) == ("sigmoid", True, 4, 2)
    assert v3.norm_top_k and v3.routed_scaling == 2.5 and not v3.shared_expert_gate
    assert (v2.kv_lora_rank, v2.q_lora_rank, v2.d_head, v2.rotary_dim, v2.d_value) == (12, 0, 16, 4, 8)
    assert v2.rope_interleaved and not v2.rope_deinterleave and v2.attn_scale is None and not v2.qkv_bias
    assert (v2.router_score, v2.norm_top_k, v2.routed_scaling, v2.expert_groups) == ("softmax", False, 1.5, 1)
    assert (dense.n_experts, dense.q_lora_rank, dense.d_head, dense.d_value) == (0, 0, 12, 16)
    assert not dense.rope_deinterleave and not dense.rope_interleaved and dense.rope_scaling["rope_type"] == "linear"


def test_the_weights_as_read():
    a = qkv.load(MODELS / "deepseek_v3").weights.blocks[0].attn
    assert (a.W_Q.shape, a.W_Q_b.shape, a.W_K.shape, a.W_V.shape, a.W_KV_b.shape, a.W_O.shape) == (
        (48, 24), (24, 64), (48, 8), (48, 16), (16, 4 * (8 + 12)), (48, 48))
    assert a.b_Q.shape == (24,) and a.b_K.shape == (8,) and a.b_V.shape == (16,) and a.b_O.shape == (48,)
    assert a.q_latent_norm.weight.shape == (24,) and a.kv_latent_norm.weight.shape == (16,)
    b = qkv.load(MODELS / "deepseek_v2").weights.blocks[0].attn
    assert b.W_Q.shape == (48, 64) and b.W_Q_b is None and b.q_latent_norm is None and b.b_K is None


def _rope_by_hand(x: np.ndarray, pos: np.ndarray, omega: np.ndarray, how: str) -> np.ndarray:
    """RoPE of x (..., n, d_rot) at positions pos (n,), as transformers writes each form: "complex" (V2: the pairs
    (2i, 2i+1) as complex numbers times e^{i·p·ω}), "halves" (pairs (i, i + d/2)), "interleave" (V3: the pairs
    (2i, 2i+1) turned and written as halves)."""
    angle = pos[:, None] * omega[None]                                          # (n, d_rot/2)
    if how == "complex":
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angle)
        return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)
    a, b = (x[..., 0::2], x[..., 1::2]) if how == "interleave" else np.split(x, 2, axis=-1)
    c, s = np.cos(angle), np.sin(angle)
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


@pytest.mark.parametrize("name, how", [("deepseek_v2", "complex"), ("deepseek_v3_dense", "halves")])
def test_latent_attention_by_hand(name, how):
    """One layer's attention output from its input, head by head in float64, as DeepSeek-V2's paper writes MLA:
    c = RMSNorm(x·W_DKV), [k_C | v] = c·W_UKV, k_R = RoPE(x·W_KR) shared, q = [q_C | RoPE(q_R)], softmax(q·kᵀ/√d_k)·v."""
    model = qkv.load(MODELS / name, dtype=np.float64)
    cfg, layer = model.config, 1
    ids = reference(name)["single_input_ids"][0, :9]
    t = model.run(ids, keep=("attn_in", "attn_out", "attentions")).layer(layer)
    a = model.weights.blocks[layer].attn
    x, n, H = t.attn_in.astype(np.float64), len(ids), cfg.n_heads
    d_rot, d_nope, d_v = cfg.rotary_dim, cfg.d_head - cfg.rotary_dim, cfg.d_value
    rms = lambda v, g: v / np.sqrt(np.mean(v * v, -1, keepdims=True) + 1e-6) * g
    omega = 1.0 / 20000.0 ** (np.arange(0, d_rot, 2) / d_rot) if name == "deepseek_v2" else \
        1.0 / 10000.0 ** (np.arange(0, d_rot, 2) / d_rot) / 2.0                  # linear ×2
    pos = np.arange(n, dtype=np.float64)
    c = rms(x @ a.W_V, a.kv_latent_norm.weight)                                  # (n, r_kv)
    k_R = _rope_by_hand(x @ a.W_K, pos, omega, how)                              # (n, d_rot)
    q = (x @ a.W_Q).reshape(n, H, -1)                                            # (n, H, d_k)
    kv = (c @ a.W_KV_b).reshape(n, H, d_nope + d_v)                              # (n, H, d_nope + d_v)
    out = np.zeros((n, H * d_v))
    for h in range(H):
        qh = np.concatenate([q[:, h, :d_nope], _rope_by_hand(q[:, h, d_nope:], pos, omega, how)], axis=-1)
        kh = np.concatenate([kv[:, h, :d_nope], k_R], axis=-1)                   # (n, d_k)
        s = qh @ kh.T / np.sqrt(cfg.d_head) + np.triu(np.full((n, n), -np.inf), 1)
        A = np.exp(s - s.max(-1, keepdims=True))
        A /= A.sum(-1, keepdims=True)
        assert max_abs(A, t.attentions[h]) < 1e-12
        out[:, h * d_v:(h + 1) * d_v] = A @ kv[:, h, d_nope:]
    assert max_abs(out @ a.W_O, t.attn_out) < 1e-12


def test_the_cache_keeps_the_latent_and_the_rope_key():
    """The cache holds (L, B, 1, m, r_kv) latents and (L, B, 1, m, d_rot) keys: RMSNorm(x·W_V + b_V) of each layer's
    input, and the turned x·W_K + b_K; L·(r_kv + d_rot)·4 bytes a token. A step after the cache equals a full pass."""
    model = qkv.load(MODELS / "deepseek_v3", dtype=np.float64)
    cfg, w = model.config, model.weights
    ids = reference("deepseek_v3")["single_input_ids"][:, :10]
    cache = KVCache(cfg, 1, 12, dtype=np.float64)
    assert cache.k.shape == (3, 1, 1, 12, 16) and cache.v.shape == (3, 1, 1, 12, 8)
    assert KVCache.bytes_per_token(cfg) == 3 * (16 + 8) * 4 == KVCache(cfg, 1, 1).nbytes
    transformer(w, cfg, ids[:, :9], np.ones((1, 9), np.int64), rec=Recorder(keep=()), cache=cache)
    _, step = transformer(w, cfg, ids[:, 9:], np.ones((1, 10), np.int64), rec=Recorder(keep=()), cache=cache)
    full = model.forward(ids, attentions=False).logits[:, -1]
    assert max_abs(step[:, -1], full) < 1e-6                 # RoPE's angles are float32, as transformers computes them
    trace = model.run(ids[0], keep=("attn_in", "k"))
    for i in range(cfg.n_layers):
        a, x = w.blocks[i].attn, trace.layer(i).attn_in.astype(np.float64)
        c = x @ a.W_V + a.b_V
        c = c / np.sqrt(np.mean(c * c, -1, keepdims=True) + 1e-6) * a.kv_latent_norm.weight
        assert max_abs(cache.k[i, 0, 0, :10], c) < 1e-6           # (the earlier layers' float32 RoPE angles)
        assert max_abs(cache.v[i, 0, 0, :10], trace.layer(i).k[2, :, 8:]) < 1e-6   # every head's RoPE part


def test_a_cached_generation_equals_the_reference_and_the_uncached():
    model = qkv.load(MODELS / "deepseek_v3")
    ref = reference("deepseek_v3")
    single = ref["single_input_ids"][0]
    new = ref["greedy_ids"].shape[1] - len(single)
    for use_cache in (True, False):
        np.testing.assert_array_equal(model.generate(single, new, temperature=0, stop_at_eos=False,
                                                     use_cache=use_cache), ref["greedy_ids"])


@pytest.mark.parametrize("name, knobs", [
    ("deepseek_v3", {"rope_deinterleave": False}),                     # V3's pairs (2i, 2i+1) written as halves
    ("deepseek_v3", {"attn_scale": None}),                              # YaRN's mscale² in the score scale
    ("deepseek_v3", {"routed_scaling": 1.0}),                           # the chosen weights × 2.5
    ("deepseek_v2", {"rope_interleaved": False}),                       # V2's pairs (2i, 2i+1) in place
    ("deepseek_v2", {"routed_scaling": 1.0}),
    ("deepseek_v3_dense", {"latent_norm_eps": 1e-2}),                   # the latents' own ε, not rms_norm_eps
])
def test_each_knob_matters(name, knobs):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(name, knobs)


def test_the_router_chooses_within_the_kept_groups():
    model = qkv.load(MODELS / "deepseek_v3")
    cfg = model.config
    t = model.run(reference("deepseek_v3")["single_input_ids"][0]).layer(1)
    n = t.experts.shape[0]
    assert t.router.shape == (n, 8) and t.experts.shape == (n, 3) and ((t.router > 0) & (t.router < 1)).all()
    groups = t.experts // (cfg.n_experts // cfg.expert_groups)                   # (n, k) each chosen expert's group
    assert all(len(set(g)) <= cfg.expert_groups_kept for g in groups)
    s = np.take_along_axis(t.router, t.experts, -1)
    np.testing.assert_allclose(t.expert_weights, 2.5 * s / s.sum(-1, keepdims=True), rtol=1e-5)
    assert model.run([5, 6, 7]).layer(0).experts is None                         # layer 0: dense


def test_v2_group_limited_greedy_ranks_a_group_by_its_best_expert(tmp_path):
    """topk_method group_limited_greedy: the k highest softmax scores among the topk_group groups whose best expert
    is highest (not their two best, V3's way), × routed_scaling_factor, not renormalised; read from config.json."""
    from qkv.core.blocks import route
    path = edited(tmp_path, "deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1})
    model = qkv.load(path)
    cfg, moe = model.config, model.weights.blocks[1].ffn
    assert (cfg.expert_groups, cfg.expert_groups_kept, cfg.expert_group_score) == (2, 1, "max")
    x = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    s, chosen, weights = route(x, moe, cfg)
    best = np.argmax(s.reshape(64, 2, 2).max(-1), axis=-1)                        # (N,) the group of the best expert
    assert (chosen // 2 == best[:, None]).all()                                   # both from its group
    np.testing.assert_allclose(weights, 1.5 * np.take_along_axis(s, chosen, -1), rtol=1e-6)
    top2 = np.argmax(np.sort(s.reshape(64, 2, 2), -1).sum(-1), -1)                # V3's ranking would differ somewhere
    assert (top2 != best).any()
    model.save(tmp_path / "m")                                                    # written back as group_limited_greedy
    assert qkv.load(tmp_path / "m").config == cfg


@pytest.mark.parametrize("name", DEEPSEEK)
def test_a_saved_model_reads_back_equal(tmp_path, name):
    assert check_saved_reads_back(tmp_path, name)["model_type"] == name.removesuffix("_dense")


def test_hooks_on_q_heads_and_attentions_work_and_on_latent_keys_are_refused():
    model = qkv.load(MODELS / "deepseek_v3")
    ids = reference("deepseek_v3")["single_input_ids"][0, :8]
    plain = model.forward(ids[None], attentions=False).logits
    same = model.forward(ids[None], attentions=False, hooks={"q": lambda v, layer: v,
                                                              "attentions": lambda v, layer: v}).logits
    np.testing.assert_array_equal(same, plain)
    zeroed = model.forward(ids[None], attentions=False, hooks={"1.heads.2": lambda z, layer: 0 * z}).logits
    assert max_abs(zeroed, plain) > 1e-4
    with pytest.raises(QkvError, match="latent") as err:
        model.forward(ids[None], hooks={"k_pre_rope": lambda v, layer: v})
    assert "\n" not in str(err.value)
    with pytest.raises(QkvError, match="without a cache"):
        model.generate(ids, 2, temperature=0, hooks={"0.v": lambda v, layer: v})
    kept = model.run(ids, keep=("k_pre_rope", "q_pre_rope", "k", "v")).layer(0)
    assert kept.k_pre_rope.shape == (4, 8, 16) and kept.v.shape == (4, 8, 12)
    np.testing.assert_array_equal(kept.k_pre_rope[..., :8], kept.k[..., :8])    # RoPE leaves the nope part
    assert (kept.k[:, :, 8:] == kept.k[:1, :, 8:]).all()                         # one RoPE key for every head


@pytest.mark.parametrize("name", DEEPSEEK)
def test_gradients_equal_autograd(name):
    """Through the latents and their norms, the shared RoPE key, V's own width, V3's de-interleaved RoPE, the
    experts and the router (sigmoid or softmax; the choice bias, a buffer, gets none): the loss within 1e-5 and
    each tensor's gradient within 1e-4 relative error of torch autograd's (tests/fixtures/grads/)."""
    check_gradients(qkv.load(MODELS / name), name, zero_norm=True)


def test_the_rope_layouts_backward_is_the_forwards_transpose():
    """⟨dy, RoPE(x)⟩ = ⟨RoPE⁻ᵀ(dy), x⟩ for every pair layout MLA takes (latent.latent_rope and its backward)."""
    from qkv.core.latent import latent_rope
    from qkv.core.blocks_backward import latent_rope_backward
    from qkv.core.positions import rope_cos_sin
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((2, 3, 5, 8))
    base = qkv.load(MODELS / "deepseek_v3_dense", dtype=np.float64).config
    for knobs in ({}, {"rope_interleaved": True}, {"rope_deinterleave": True}):
        cfg = base.with_(**knobs)
        rope = rope_cos_sin(np.arange(5)[None], 1.0 / 100.0 ** (np.arange(0, 8, 2) / 8), 1.0, cfg.rope_interleaved)
        assert np.sum(dy * latent_rope(x, rope, cfg)) == pytest.approx(np.sum(latent_rope_backward(dy, rope, cfg) * x))


def test_the_kv_cache_lesson_sets_the_latent_beside_mha_and_mqa():
    model = qkv.load(MODELS / "deepseek_v3")
    lesson = kvcache.build(model, "the cat sat on", new_tokens=3, repeats=1)
    assert [(l.name, l.own, l.bytes_per_token) for l in lesson.layouts] == [
        ("MHA", False, 3 * 4 * (16 + 12) * 4), ("MLA", True, 3 * (16 + 8) * 4), ("MQA", False, 3 * (16 + 12) * 4)]
    assert lesson.diff_cache < 1e-4 and all(s.same for s in lesson.steps)
    for st in lesson.steps[1:]:                 # one token fed: q's latent and q, K/V latent and RoPE key, every
        m = st.m                                # cached latent expanded, Q·Kᵀ and A·V, W_O, the FFN of layer 0
        per_layer = (2 * (48 * 24 + 24 * 64) + 2 * 48 * (16 + 8) + 2 * m * 16 * 4 * (8 + 12) + 2 * 4 * m * (16 + 12)
                     + 2 * 4 * 12 * 48 + 3 * 2 * 48 * 40)
        assert st.flops_cache == 3 * per_layer + 2 * 48 * 400


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_the_lessons_print_mla(monkeypatch, capsys, lang):
    code, out, err = run_main(monkeypatch, capsys, "explain", "kv-cache", "the cat sat on", "--model",
                              str(MODELS / "deepseek_v3"), "--lang", lang)
    assert code == 0, err
    assert "MLA ←" in out and "288" in out and "1,344" in out and ("r_kv = 16" in out)
    assert ("잠재 벡터" in out) if lang == "ko" else "latent" in out


def test_the_gqa_lesson_checks_the_shared_rope_key(minilm):
    lesson = gqa.build(qkv.load(MODELS / "deepseek_v3"), "the cat sat on", pool_model=minilm)
    s = lesson.sharing
    assert s.latent == dict(r_kv=16, d_rot=8, d_nope=8, d_v=12, r_q=24) and s.diff_shared == 0.0
    assert s.kv_of == [0, 1, 2, 3] and s.diff_scores < 1e-4 and lesson.pool_model == minilm.name
    assert [l.bytes_per_token for l in s.layouts] == [3 * 4 * (16 + 12) * 4, 3 * (16 + 8) * 4, 3 * (16 + 12) * 4]
    console = Console(record=True, width=250, highlight=False)
    for part in gqa.render(lesson, "en"):
        console.print(part)
    text = console.export_text()
    assert "multi-head latent attention (MLA)" in text and "MLA ←" in text


@pytest.mark.parametrize("name, change, drop, message", [
    ("deepseek_v3", {"num_key_value_heads": 2}, (), "num_key_value_heads 2"),
    ("deepseek_v2", {"mlp_bias": True}, (), "mlp_bias=true"),
    ("deepseek_v2", {"num_attention_heads": 5, "num_key_value_heads": 5}, (), "not divisible by 5"),
    ("deepseek_v2", {"topk_method": "noaux_tc"}, (), "topk_method 'noaux_tc'"),
    ("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 1}, (), "groups"),
    ("deepseek_v2", {"moe_layer_freq": 2}, (), "moe_layer_freq"),
    ("deepseek_v3", {"scoring_func": "softmax"}, (), "scoring_func"),
    ("deepseek_v3", {"qk_rope_head_dim": 7}, (), "qk_rope_head_dim"),
    ("deepseek_v3", {"kv_lora_rank": 0}, (), "kv_lora_rank"),
    ("deepseek_v3", {"n_group": 3}, (), "groups"),
    ("deepseek_v3", {"num_experts_per_tok": None}, (), "num_experts_per_tok"),
    ("deepseek_v2", {}, ("q_lora_rank",), "q_a_proj"),        # absent: DeepseekV2Config's 1536, a q latent it lacks
])
def test_refused_in_one_line(tmp_path, name, change, drop, message):
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(edited(tmp_path, name, change, drop))
    assert "\n" not in str(err.value)


def test_a_published_v3s_prediction_layer_is_left_unread(tmp_path):
    """DeepSeek-V3's files hold a multi-token-prediction module as layers.61.* (transformers drops that name): it is
    left unread and the logits are the model's; any other extra tensor is still refused."""
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "v3"
    shutil.copytree(MODELS / "deepseek_v3", path)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.61.enorm.weight"] = np.ones(8, np.float32)
    save_file(tensors, path / "model.safetensors")
    ref = reference("deepseek_v3")
    assert max_abs(qkv.load(path).forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN
    tensors["model.layers.60.enorm.weight"] = np.ones(8, np.float32)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(QkvError, match="layers.60.enorm"):
        qkv.load(path)


def test_a_dense_config_runs_with_any_router_knobs(tmp_path):
    """Every layer dense (first_k_dense_replace ≥ layers): the MoE knobs are never read, as transformers builds it."""
    path = edited(tmp_path, "deepseek_v3_dense", {"n_group": 3, "num_experts_per_tok": None, "scoring_func": "sigmoid"})
    ref = reference("deepseek_v3_dense")
    assert max_abs(qkv.load(path).forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN


@pytest.mark.parametrize("args", [
    ["explain", "attention", "the cat sat on"],
    ["explain", "positions", "the cat sat on"],
    ["circuits", "the cat sat on", "--layer", "1", "--head", "0"],
    ["eap", "the cat sat on", "the mat sat on", "--token", " the", "--other", " on"],
])
def test_what_reads_x_times_w_k_is_refused_in_one_line(monkeypatch, capsys, args):
    """The lessons and analyses that recompute K = X·W_K (or a head's W_Q·W_Kᵀ, W_V·W_O) say MLA has none."""
    code, out, err = run_main(monkeypatch, capsys, *args, "--model", str(MODELS / "deepseek_v3"))
    assert code == 2 and "multi-head latent attention" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args", [
    ["show", "the cat sat on"], ["heads", "the cat sat on"], ["rollout", "the cat sat on"],
    ["lens", "the cat sat on"], ["dla", "the cat sat on", "--token", " the"],
    ["patch", "the cat sat on", "the mat sat on", "--token", " the", "--other", " on"],
    ["attribute", "the cat sat on"], ["generate", "the cat sat on", "--max-new-tokens", "3"],
])
def test_the_views_and_analyses_run(monkeypatch, capsys, args):
    code, out, err = run_main(monkeypatch, capsys, *args, "--model", str(MODELS / "deepseek_v3"))
    assert code == 0, err


@pytest.mark.parametrize("d_v", [4, 12])
def test_the_tiled_and_blocked_kernels_take_a_value_width_of_its_own(d_v):
    """MLA's V is d_v wide, not d_k: the tiled kernel, the causal blocks of rows and the plain path agree (float64)."""
    from qkv.core.attention import AttentionMask, causal_attention, scaled_dot_product_attention
    from qkv.core.kernels import tiled_attention
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 4, 70, 8)), rng.standard_normal((2, 4, 70, 8)), rng.standard_normal((2, 4, 70, d_v))
    mask = AttentionMask(70, 70, causal=True)
    plain = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype), scale=0.3)[0]           # (2, 4, 70, d_v)
    assert plain.shape == (2, 4, 70, d_v)
    assert max_abs(tiled_attention(q, k, v, causal=True, block_size=16, scale=0.3), plain) < 1e-12
    assert max_abs(causal_attention(q, k, v, mask, block_size=16, scale=0.3), plain) < 1e-12


def test_the_pipeline_page_opens_every_box_and_names_the_latent(tab, tmp_path):
    """The pipeline page of an MLA model: every box of a dense and of a routed layer opens without an error, and the
    RoPE box says which numbers turn (the last of each head) and what the cache keeps."""
    from test_browser_pipeline import open_page
    from test_browser_pipeline_families import boxes, open_box
    from qkv.viz.pipeline import save_pipeline
    from qkv.viz.pipeline_payload import arch_of

    model = qkv.load(MODELS / "deepseek_v3")
    assert arch_of(model)["latent"] == {"r_kv": 16, "r_q": 24, "d_v": 12}
    open_page(tab, save_pipeline(model, model.run(list(range(3, 12))), tmp_path / "p.html"))
    for layer in range(2):
        tab.page.select_option(".qkv-p-layer", str(layer))
        assert "rope" in boxes(tab)
        for box in boxes(tab):
            text = open_box(tab, box)
            if box == "rope":
                assert "only the last 8 of each head's 16 numbers" in text and "latent of 16 numbers" in text
    assert tab.errors == [] and tab.dialogs == []


def test_attribution_graphs_refuse_latent_attention_in_one_line():
    from qkv.graphs.replacement import check_model
    with pytest.raises(QkvError, match="multi-head latent attention") as err:
        check_model(qkv.load(MODELS / "deepseek_v2"))
    assert "\n" not in str(err.value)

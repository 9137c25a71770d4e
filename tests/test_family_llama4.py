"""Llama 4's text model (issue 47) beyond tests/test_families.py's comparisons with transformers (padding left and
right, every attention weight, the cache step and greedy ids run there on the fixture too): backward against torch
autograd (tests/fixtures/grads/llama4_text.npz), the new maths against its plain forms (the chunked mask in every
attention path, the temperature's formula), each knob needed for the reference's numbers, the knobs read from
config.json and transformers' defaults, a saved model reading back equal, what qkv refuses in one line, and the
commands and views that must run on it.

Fixture: tests/fixtures/models/llama4_text, made by tests/fixtures/make_fixtures.py (layers 0 and 2 chunked in
chunks of 4 with q/k RMS-normalised, layer 1 NoPE with temperature tuning from position 2, layers 1–2 routed).
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.attention import (AttentionMask, attention_output, attention_top, attention_weights, causal_attention,
                                scaled_dot_product_attention, top_of)
from qkv.core.kernels import tiled_attention
from qkv.core.positions import temperature_scales
from conftest import (MODELS, TOL_HIDDEN, check_gradients, check_knob_matters, check_saved_reads_back, edited,
                      max_abs, reference, run_main)
from test_browser import browser, tab  # noqa: F401  (fixtures: the browser test at the end)

NAME = "llama4_text"
TEXT = "The cat sat on the mat and the dog sat on the log"


def test_gradients_equal_autograd():
    """The loss within 1e-5 and each tensor's gradient (the fused experts', the router's, the shared expert's, the
    q/k norms' and the temperature's paths back to W_Q, W_K) within 1e-4 relative error of torch autograd's; the
    NoPE layer's k bias, whose true gradient is 0 (a shift of every score of a row), is round-off both ways."""
    grads = check_gradients(qkv.load(MODELS / NAME), NAME, vanishing=1e-6)
    assert {"model.layers.1.feed_forward.experts.gate_up_proj", "model.layers.2.feed_forward.router.weight",
            "model.layers.1.feed_forward.shared_expert.down_proj.weight",
            "model.layers.0.feed_forward.gate_proj.weight"} <= set(grads)


def test_knobs_read():
    cfg = qkv.load(MODELS / NAME).config
    assert cfg.family == NAME and cfg.rope_interleaved and cfg.no_rope_layers == (1,)
    assert cfg.attention_chunk == 4 and cfg.chunked_layers == (0, 2) and [cfg.chunk(i) for i in range(3)] == [4, None, 4]
    assert cfg.qk_l2_norm and cfg.temperature_floor == 3 and cfg.temperature_scale == 0.5
    assert cfg.n_experts == 4 and cfg.experts_per_token == 2 and cfg.dense_layers == (0,) and cfg.expert_input_scaled
    assert cfg.router_score == "sigmoid" and not cfg.norm_top_k and not cfg.shared_expert_gate
    assert (cfg.d_ff, cfg.d_expert, cfg.d_shared_expert) == (40, 16, 16)
    assert cfg.rope_theta == 2e4 and cfg.rope_scaling["rope_type"] == "llama3" and cfg.qkv_bias and cfg.out_bias
    assert cfg.d_head == 12 and cfg.n_kv_heads == 2 and not cfg.tied_embeddings and cfg.norm_eps == 1e-5


@pytest.mark.parametrize("knobs", [
    {"chunked_layers": ()},                                  # the chunks (every layer then sees all before it)
    {"qk_l2_norm": False},                                   # q, k divided by their RMS on the RoPE layers
    {"temperature_floor": None},                             # the NoPE layer's queries × their position's factor
    {"temperature_scale": 0.1},                              # τ
    {"expert_input_scaled": False},                          # FFN_e(w·x), not w·FFN_e(x)
    {"rope_interleaved": False},                             # the complex form's pairs (2i, 2i+1)
    {"rope_scaling": None},                                  # llama3
])
def test_each_knob_matters(knobs):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(NAME, knobs)


def _chunked_by_hand(n: int, m: int, chunk: int, key_mask: np.ndarray | None) -> np.ndarray:
    """(B, 1, n, m) the chunked causal rule pair by pair: query i (at index m − n + i) sees key j ≤ it, in its chunk
    of CHUNK positions counted from the row's first real key, and never a padding key."""
    B = 1 if key_mask is None else len(key_mask)
    out = np.zeros((B, 1, n, m), bool)
    for b in range(B):
        lead = 0 if key_mask is None else int(np.flatnonzero(key_mask[b])[0])
        for i in range(n):
            at = m - n + i
            for j in range(m):
                real = key_mask is None or key_mask[b, j]
                out[b, 0, i, j] = j <= at and (at - lead) // chunk == (j - lead) // chunk and real
    return out


@pytest.mark.parametrize("n, m, pad", [(11, 11, False), (11, 11, True), (3, 12, True), (1, 13, True)])
def test_the_chunked_mask_is_the_rule(n, m, pad):
    """AttentionMask(chunk=C).allowed() is the rule pair by pair, for a left-padded batch and for the last n of m keys
    (a cached step: m − n positions before it)."""
    key_mask = np.array([[True] * m, [False] * 3 + [True] * (m - 3)]) if pad else None
    mask = AttentionMask(n, m, causal=True, key_mask=key_mask, chunk=4)
    allowed = np.broadcast_to(mask.allowed(), (2 if pad else 1, 1, n, m))
    np.testing.assert_array_equal(allowed, _chunked_by_hand(n, m, 4, key_mask))
    assert np.array_equal(mask.allowed(1, 3), allowed[:, :, 1:3]) if n > 3 else True


def _qkv(seed: int = 0, B: int = 2, H: int = 4, Hkv: int = 2, n: int = 13, m: int = 13, d: int = 6):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, n, d)), rng.standard_normal((B, Hkv, m, d)),
            rng.standard_normal((B, Hkv, m, d)))


@pytest.mark.parametrize("n, m, chunk, pad", [(13, 13, 4, False), (13, 13, 4, True), (13, 13, 5, True),
                                              (5, 13, 3, True)])
def test_every_attention_path_takes_the_chunks(n, m, chunk, pad):
    """The plain path, causal blocks of rows, the tiled kernel (blocks smaller and larger than a chunk), some heads'
    weights and each row's top weights give the same numbers with chunks (float64, 1e-12), and differ from plain
    causal attention; a chunk's first query sees only itself."""
    q, k, v = _qkv(n=n, m=m)
    key_mask = np.array([[True] * m, [False] * 2 + [True] * (m - 2)]) if pad else None
    mask = AttentionMask(n, m, causal=True, key_mask=key_mask, chunk=chunk)
    z, a, _ = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype))
    others = [causal_attention(q, k, v, mask, block_size=4), attention_output(q, k, v, mask)]
    others += [tiled_attention(q, k, v, causal=True, key_mask=key_mask, block_size=b, chunk=chunk) for b in (2, 3, 8)]
    for other in others:
        assert np.abs(other - z).max() <= 1e-12
    full = AttentionMask(n, m, causal=True, key_mask=key_mask)
    assert np.abs(attention_output(q, k, v, full) - z).max() > 1e-3
    some, _ = attention_weights(q, k, mask, [1, 3], block_size=4)
    assert np.abs(some - a[:, [1, 3]]).max() <= 1e-12
    top, want = attention_top(q, k, mask, 3, block_size=4), top_of(a, 3)
    assert np.abs(top.weight - want.weight).max() <= 1e-6 and np.abs(top.rest - want.rest).max() <= 1e-6
    if n == m and not pad:
        assert a[0, :, chunk, chunk] == pytest.approx(1.0) and a[0, :, chunk + 1, chunk + 2:].max() == 0


def test_temperature_is_its_formula():
    """s_p = 1 + τ·log(1 + ⌊(p + 1)/F⌋): 1 at p < F − 1, then log-steps (F 3, τ 0.5), as (B, 1, n, 1)."""
    s = temperature_scales(np.arange(9)[None], 3, 0.5, np.float64)
    assert s.shape == (1, 1, 9, 1)
    want = [1, 1] + [1 + 0.5 * np.log(2)] * 3 + [1 + 0.5 * np.log(3)] * 3 + [1 + 0.5 * np.log(4)]
    np.testing.assert_allclose(s[0, 0, :, 0], want, rtol=1e-15)


def test_the_nope_layers_queries_are_the_scaled_ones():
    """The trace's q of the NoPE layer is its unturned query × the position's factor (what S reads); a RoPE layer's
    q and k have each head's RMS 1 (to the norm's ε)."""
    model = qkv.load(MODELS / NAME)
    trace = model.run(TEXT)
    n = len(trace.tokens)
    plain = model.with_config(temperature_floor=None).run(TEXT).layer(1).q                       # (H, n, d_k)
    s = temperature_scales(np.arange(n), 3, 0.5)[0]                                            # (1, n, 1)
    assert max_abs(trace.layer(1).q, plain * s) <= 1e-6
    for layer in (0, 2):
        for x in (trace.layer(layer).q, trace.layer(layer).k):
            assert np.abs(np.sqrt((x.astype(np.float64) ** 2).mean(-1)) - 1).max() < 1e-3


def test_left_padding_counts_from_the_first_real_token():
    """A left-padded row of 17 tokens (5 pads: the chunks and the temperature's positions would move by 5 if counted
    over the padding) gives the logits of the row alone, and so does each cached step written after it."""
    model = qkv.load(MODELS / NAME)
    ids = reference(NAME)["single_input_ids"][0]
    alone = model.forward(ids[None]).logits[0]
    padded = np.concatenate([[0] * 5, ids])[None]
    mask = np.array([[0] * 5 + [1] * len(ids)])
    assert max_abs(model.forward(padded, mask).logits[0, 5:], alone) <= TOL_HIDDEN
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=8), reference(NAME)["greedy_ids"])


def _config(change: dict, drop: tuple = ()):
    """The fixture's config.json with DROP's keys removed and CHANGE's set, read as qkv reads it (no weights)."""
    import json

    from qkv.checkpoints.families import config_of

    hf = json.loads((MODELS / NAME / "config.json").read_text())
    return config_of({k: v for k, v in hf.items() if k not in drop} | change)


def test_hooks_and_the_cached_steps_keep_the_new_maths(monkeypatch):
    """A hook on the attention weights (the step-by-step path) and one on the NoPE layer's q (read after the
    temperature) change no number; the cached one-token steps (the fast step block: q/k norms, temperature, each
    layer's chunk) write the reference's greedy ids, as the passes without the cache do."""
    ref = reference(NAME)
    model = qkv.load(MODELS / NAME)
    ids = ref["single_input_ids"]
    hooked = model.with_hooks({"0.attentions": lambda a, layer: a, "1.q": lambda q, layer: q}).forward(ids).logits
    assert max_abs(hooked, ref["single_logits"]) <= TOL_HIDDEN
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=8, use_cache=False), ref["greedy_ids"])
    from qkv.core import layer as layer_module
    calls, real = [], layer_module.step_block
    monkeypatch.setattr(layer_module, "step_block", lambda *a: calls.append(1) or real(*a))
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=8), ref["greedy_ids"])
    assert len(calls) == 7 * model.config.n_layers                          # the 7 steps after the prefill: fast


def test_defaults_as_transformers_fills_them():
    """No layer_types, no_rope_layers, moe_layers, attention_chunk_size, floor_scale, rope_parameters: with 3 layers
    no NoPE layer (every 4th has none), every layer chunked in chunks of 8192, every layer routed (step 1), θ 500000
    (Llama4TextConfig's); an explicit null attention_chunk_size: no layer chunked."""
    cfg = _config({}, drop=("layer_types", "no_rope_layers", "moe_layers", "attention_chunk_size", "floor_scale",
                            "rope_parameters", "attn_scale"))
    assert cfg.no_rope_layers == () and cfg.chunked_layers == (0, 1, 2) and cfg.attention_chunk == 8192
    assert cfg.dense_layers == () and cfg.temperature_floor == 8192 and cfg.temperature_scale == 0.1
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling is None
    assert _config({"interleave_moe_layer_step": 2}, drop=("moe_layers",)).dense_layers == (0, 2)   # (i + 1) % 2 = 0
    none = _config({"attention_chunk_size": None}, drop=("layer_types",))
    assert none.chunked_layers == () and none.attention_chunk is None
    nulls = _config({"num_key_value_heads": None, "head_dim": None})           # Llama4TextConfig: H, d_model / H
    assert (nulls.n_kv_heads, nulls.d_head) == (4, 12) and _config({}, drop=("head_dim",)).d_head == 128
    dense, untuned = _config({"moe_layers": []}), _config({"attn_temperature_tuning": False})
    assert dense.n_experts == 0 and dense.d_expert is None and untuned.temperature_floor is None


@pytest.mark.parametrize("change", [{"moe_layers": []}, {"attn_temperature_tuning": False, "use_qk_norm": False},
                                    {"attention_chunk_size": None, "layer_types": None}, {"no_rope_layers": [0, 0, 0]}])
def test_every_variant_writes_a_config_that_reads_back(change):
    """hf_config of the fixture's config with other knob values gives a config.json that reads back as it (no MoE
    layer, no temperature or q/k norms, no chunks, no RoPE anywhere)."""
    from qkv.checkpoints import llama4

    cfg = _config(change)
    assert _config(llama4.hf_config(cfg)) == cfg


def test_a_saved_model_reads_back_equal(tmp_path):
    hf = check_saved_reads_back(tmp_path, NAME)
    assert hf["model_type"] == NAME and hf["layer_types"] == ["chunked_attention", "full_attention", "chunked_attention"]
    assert hf["no_rope_layers"] == [1, 0, 1] and hf["moe_layers"] == [1, 2] and hf["intermediate_size_mlp"] == 40


def test_a_fresh_model_runs_and_trains_a_step():
    """qkv.init of the fixture's config runs, and one gradient step of it lowers its loss."""
    from qkv.train import gradients

    model = qkv.init(qkv.load(MODELS / NAME).config, seed=3)
    ids = np.random.default_rng(0).integers(3, 200, size=(2, 12))
    loss, grads = gradients(model, ids, np.ones_like(ids))
    assert np.isfinite(loss) and any(np.abs(g).max() > 0 for k, g in grads.items() if "experts" in k)


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["sliding_attention", "full_attention", "chunked_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention", "chunked_attention", "full_attention"], "attention_chunk_size": None},
     "no attention_chunk_size"),
    ({"attention_chunk_size": 0}, "attention_chunk_size"),
    ({"no_rope_layers": [1, 2, 1]}, "no_rope_layers"),
    ({"moe_layers": [1, 5]}, "moe_layers"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"floor_scale": 0}, "floor_scale"),
    ({"attn_scale": "0.1"}, "attn_scale"),
    ({"quantization_config": {"quant_method": "fbgemm_fp8"}}, "quantization_config"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}, "partial rotary"),
])
def test_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(edited(tmp_path, NAME, change))
    assert "\n" not in str(err.value)


def _composite(tmp_path, text_weights: bool = True):
    """The fixture as a Llama4ForConditionalGeneration's checkpoint: config.json with it as text_config (and a
    vision_config), its tensors under language_model. beside a vision tower's and a projector's; TEXT_WEIGHTS false:
    the vision tensors alone."""
    import json

    from qkv.checkpoints.tensors import TensorStore, write_safetensors

    folder = tmp_path / "llama4"
    folder.mkdir(parents=True)
    text = json.loads((MODELS / NAME / "config.json").read_text())
    hf = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": text,
          "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 16}, "image_token_index": 300}
    (folder / "config.json").write_text(json.dumps(hf))
    store = TensorStore(MODELS / NAME)
    tensors = {"vision_model.class_embedding": np.zeros(16, np.float32),
               "multi_modal_projector.linear_1.weight": np.zeros((48, 16), np.float32)}
    if text_weights:
        tensors |= {f"language_model.{name}": np.array(store.get(name, store.shape(name))) for name in store.names()}
    with open(folder / "model.safetensors", "wb") as f:
        write_safetensors(f, tensors)
    return folder


def test_a_text_and_image_checkpoint_runs_its_text_model(tmp_path):
    """model_type llama4: its text_config's knobs and its language_model.* tensors give the text fixture's logits to
    the bit (the vision tower and projector left unread); without the language model's tensors, one line."""
    model = qkv.load(_composite(tmp_path))
    assert model.config == qkv.load(MODELS / NAME).config
    ids = reference(NAME)["single_input_ids"]
    np.testing.assert_array_equal(model.forward(ids).logits, qkv.load(MODELS / NAME).forward(ids).logits)
    with pytest.raises(QkvError, match="Llama4ForCausalLM") as err:
        qkv.load(_composite(tmp_path / "vision", text_weights=False))
    assert "\n" not in str(err.value)


# ── the commands and views ────────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("command", [("show", TEXT, "--layer", "0", "--head", "1"), ("heads", TEXT), ("rollout", TEXT),
                                     ("explain", "kv-cache"), ("explain", "flash")])
def test_the_commands_run(monkeypatch, capsys, command):
    code, out, _ = run_main(monkeypatch, capsys, *command, "--model", str(MODELS / NAME))
    assert code == 0 and out


def test_show_prints_the_chunks_zeros():
    """A chunked layer's weights are 0 outside each query's chunk of 4 (what `qkv show` prints and the views draw)."""
    A = qkv.load(MODELS / NAME).run(TEXT).layer(0).attentions                                   # (H, n, n)
    assert A[:, 4, :4].max() == 0 and A[:, 4, 4] == pytest.approx(1.0) and A[:, 7, 4:8].sum(-1) == pytest.approx(1.0)


@pytest.mark.parametrize("topic", ["attention", "positions"])
def test_lessons_that_rebuild_q_before_rope_refuse_in_one_line(monkeypatch, capsys, topic):
    code, _, err = run_main(monkeypatch, capsys, "explain", topic, "--model", str(MODELS / NAME))
    assert code == 2 and "Llama 4" in err and len(err.strip().splitlines()) == 1


def test_explain_sparse_draws_the_chunks(monkeypatch, capsys):
    """`qkv explain sparse` names each layer's own mask, its chunks included, and reproduces the model's Z with it."""
    code, out, _ = run_main(monkeypatch, capsys, "explain", "sparse", "--model", str(MODELS / NAME))
    assert code == 0 and out.count("causal, chunks of 4") == 2


def test_pipeline_page_draws_the_chunked_mask(tab, tmp_path):  # noqa: F811  (test_browser's fixture)
    """In a real browser: the pipeline page's mask box of a chunked layer gives the chunk's formula and the NoPE
    layer's the causal one; every box of every layer opens."""
    from test_browser_pipeline import open_page
    from test_browser_pipeline_families import boxes, open_box
    from qkv.viz.pipeline import save_pipeline

    model = qkv.load(MODELS / NAME)
    open_page(tab, save_pipeline(model, model.run(TEXT), tmp_path / "p.html"))
    for layer in range(model.config.n_layers):
        tab.page.select_option(".qkv-p-layer", str(layer))
        for box in boxes(tab):
            text = open_box(tab, box)
            if box == "mask":
                assert ("chunk of 4" in text) == (layer != 1)
    assert tab.errors == [] and tab.dialogs == []


@pytest.mark.parametrize("split", [False, True])
def test_edge_attribution_is_the_first_order_term_of_edge_patching(split):
    """EAP's gradients through the chunked layers' q/k RMS norms and the NoPE layer's temperature (analysis.edges,
    qkv split: each head's q, k, v a receiver of its own) equal central differences of edge patching (float64,
    tests/test_eap.py's checks on this fixture)."""
    import test_eap

    test_eap.test_every_edge_kept_is_clean_and_none_the_corrupt_run(NAME, split)
    test_eap.test_eap_is_the_first_order_term_of_edge_patching(NAME, split)

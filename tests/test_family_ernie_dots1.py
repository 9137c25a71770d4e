"""Ernie 4.5 (dense and MoE) and dots1 (issue 47) beyond tests/test_families.py's comparisons with transformers
(forward with left and right padding, every attention weight, the KV-cache step, greedy ids, float64): backward
against torch autograd (tests/fixtures/grads/), the router of each written out by hand (softmax or σ scores, a choice
bias that picks experts without weighing them, group-limited choice, the renormalisation's floor, the scale), its
backward against finite differences, each new knob needed for the reference's numbers, the knobs read from
config.json, a saved model reading back equal, the views and analyses run (the pipeline page's router box in a
browser), Ernie's GGUF file, and the knobs qkv refuses in one line.

Fixtures: tests/fixtures/models/{ernie4_5, ernie4_5_moe, dots1}, made by tests/fixtures/make_fixtures.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

import qkv
from conftest import (FIXTURES, MODELS, check_gradients, check_knob_matters, check_router_trace_round_trip,
                     check_saved_reads_back, edited, max_abs, reference, run_main)
from test_browser import browser, tab  # noqa: F401 (fixtures: Chromium, the network blocked)
from qkv import QkvError
from qkv.core.blocks import feed_forward, norm, route, routed_feed_forward
from qkv.core.blocks_backward import Tape
from qkv.core.blocks_backward import routed_feed_forward as routed_backward
from qkv.core.weights import FFNWeights, MoEWeights
from qkv.models.model import Model

NEW = ("ernie4_5", "ernie4_5_moe", "dots1")
ROUTED = ("ernie4_5_moe", "dots1")


@pytest.mark.parametrize("name", NEW)
def test_gradients_equal_autograd(name):
    """The loss within 1e-5 and each tensor's gradient within 1e-4 relative error of torch autograd's (the choice
    bias has none: it only picks experts); an expert no token chose gets zeros, as in torch."""
    grads = check_gradients(qkv.load(MODELS / name), name, zero_norm=True)
    assert not any("correction_bias" in k for k in grads)


def _without_choice_bias(model) -> Model:
    blocks = [replace(b, ffn=replace(b.ffn, b_choice=None)) if isinstance(b.ffn, MoEWeights) else b
              for b in model.weights.blocks]
    return Model(model.config, replace(model.weights, blocks=blocks))


@pytest.mark.parametrize("name, change", [
    ("ernie4_5", {"rope_interleaved": False}),                  # RoPE's pairs (0, 1), (2, 3), …
    ("ernie4_5_moe", "no choice bias"),                          # moe_statics steers the choice
    ("dots1", "no choice bias"),                                 # e_score_correction_bias steers the choice
    ("dots1", {"expert_groups": 1, "expert_groups_kept": 1}),    # 2 of 4 groups
    ("dots1", {"routed_scaling": 1.0}),                          # the weights × 2.5
    ("dots1", {"norm_top_k": False}),                            # σ scores renormalised
    ("dots1", {"router_score": "softmax"}),                      # σ, not softmax
    ("dots1", {"layer_windows": None, "sliding_window": None}),  # layer 2's window
])
def test_each_knob_matters(name, change):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(name, _without_choice_bias if change == "no choice bias" else change)


def test_the_knobs_as_read():
    ernie, moe, dots = (qkv.load(MODELS / n).config for n in NEW)
    assert ernie.rope_interleaved and ernie.qkv_bias and ernie.out_bias and ernie.ffn_bias and ernie.tied_embeddings
    assert (ernie.d_head, ernie.n_experts, ernie.rope_theta, ernie.norm_eps) == (8, 0, 2e4, 1e-5)
    assert moe.rope_interleaved and not moe.ffn_bias and not moe.tied_embeddings and moe.d_head == 16
    assert (moe.n_experts, moe.experts_per_token, moe.dense_layers, moe.d_expert, moe.d_shared_expert) == \
        (4, 2, (0,), 16, 32)
    assert (moe.router_score, moe.norm_top_k, moe.norm_top_k_min, moe.expert_choice_bias, moe.shared_expert_gate) == \
        ("softmax", True, 1e-12, True, False)
    assert (dots.qk_norm, dots.n_experts, dots.experts_per_token, dots.expert_groups, dots.expert_groups_kept) == \
        ("head", 8, 3, 4, 2)
    assert (dots.router_score, dots.routed_scaling, dots.norm_top_k, dots.dense_layers, dots.d_shared_expert) == \
        ("sigmoid", 2.5, True, (0,), 32)
    assert [dots.window(i) for i in range(3)] == [None, None, 5] and not dots.shared_expert_gate
    w = qkv.load(MODELS / "dots1").weights.blocks[1].ffn
    assert w.b_choice.shape == (8,) and w.W_shared_gate is None and w.shared.W_in.shape == (48, 32)
    assert qkv.load(MODELS / "ernie4_5_moe").weights.blocks[2].ffn.b_choice.shape == (4,)


def _by_hand(x: np.ndarray, w: MoEWeights, cfg) -> tuple[list[set], list[dict]]:
    """Each token's chosen experts and their weights, written out token by token from the formulas (not route's)."""
    chosen, weights = [], []
    for row in x:
        logits = row @ w.W_router
        s = 1 / (1 + np.exp(-logits)) if cfg.router_score == "sigmoid" else np.exp(logits) / np.exp(logits).sum()
        r = s + w.b_choice
        E, G = len(r), cfg.expert_groups
        size = E // G
        groups = sorted(range(G), key=lambda g: -sum(sorted(r[g * size:(g + 1) * size])[-2:]))[:cfg.expert_groups_kept]
        allowed = [e for e in range(E) if e // size in groups]
        top = sorted(allowed, key=lambda e: -r[e])[:cfg.experts_per_token]
        total = sum(s[e] for e in top) + (1e-20 if cfg.router_score == "sigmoid" else 0)
        total = max(total, cfg.norm_top_k_min)
        chosen.append(set(top))
        weights.append({e: s[e] / total * cfg.routed_scaling for e in top})
    return chosen, weights


@pytest.mark.parametrize("name", ROUTED)
def test_the_trace_holds_the_routers_choice_as_written_by_hand(name):
    """The router reads the FFN's norm of the stream after attention; its choice ranks the scores plus the bias
    (within the kept groups), its weights are the scores themselves, renormalised and scaled."""
    model = qkv.load(MODELS / name, dtype=np.float64)
    cfg = model.config
    trace = model.run(reference(name)["single_input_ids"][0])
    routed = [i for i in range(cfg.n_layers) if cfg.moe_layer(i)]
    assert routed == [1, 2]
    for i in routed:
        t, b = trace.layer(i), model.weights.blocks[i]
        x = norm(t.residual + t.attn_out, b.ffn_norm, cfg)
        chosen, weights = _by_hand(x, b.ffn, cfg)
        assert [set(e) for e in t.experts.tolist()] == chosen
        got = [dict(zip(e, w)) for e, w in zip(t.experts.tolist(), t.expert_weights.tolist())]
        for g, want in zip(got, weights):
            assert max(abs(g[e] - want[e]) for e in want) < 1e-12
        plain = np.argsort(-t.router, -1)[:, :cfg.experts_per_token]
        assert any(set(p) != c for p, c in zip(plain.tolist(), chosen))      # the bias (and groups) moved a choice


@pytest.mark.parametrize("name", ROUTED)
def test_a_routed_layer_sums_its_experts_and_the_ungated_shared_one(name):
    """MoE(x) = Σ_j w_j·FFN_{e_j}(x) + FFN_shared(x), token by token (float64)."""
    model = qkv.load(MODELS / name, dtype=np.float64)
    cfg, moe = model.config, model.weights.blocks[1].ffn
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model))
    out = routed_feed_forward(x, moe, cfg).reshape(-1, cfg.d_model)
    _, chosen, weights = route(x.reshape(-1, cfg.d_model), moe, cfg)
    for r, row in enumerate(x.reshape(-1, cfg.d_model)):
        want = sum(w * feed_forward(row[None], moe.experts[e], cfg)[0] for e, w in zip(chosen[r], weights[r]))
        want += feed_forward(row[None], moe.shared, cfg)[0]
        np.testing.assert_allclose(out[r], want, atol=1e-12)


def _toy_moe(d: int, E: int, f: int, rng) -> MoEWeights:
    def ffn(width):
        return FFNWeights(W_in=rng.standard_normal((d, width)), W_out=rng.standard_normal((width, d)) / 3,
                          W_gate=rng.standard_normal((d, width)))
    return MoEWeights(W_router=rng.standard_normal((d, E)), experts=[ffn(f) for _ in range(E)],
                      shared=ffn(f), b_choice=rng.standard_normal(E) * 0.3)


@pytest.mark.parametrize("knobs", [
    {},                                                                    # dots1's: σ, 2 of 4 groups, ×2.5
    {"norm_top_k": False, "routed_scaling": 0.7},
    {"router_score": "softmax", "expert_groups": 1, "expert_groups_kept": 1, "routed_scaling": 1.0},
    {"router_score": "softmax", "expert_groups": 1, "expert_groups_kept": 1, "routed_scaling": 1.0,
     "norm_top_k_min": 0.6},                                               # the floor holds D for some rows
])
def test_the_routers_backward_is_the_finite_difference(knobs):
    """dx and dW_router of Σ G ⊙ MoE(x) against central differences (float64, the choice held: no step flips it)."""
    cfg = qkv.load(MODELS / "dots1").config.with_(**knobs)
    rng = np.random.default_rng(5)
    d, N = cfg.d_model, 12
    w = _toy_moe(d, cfg.n_experts, 5, rng)
    x, G = rng.standard_normal((1, N, d)) * 0.3, rng.standard_normal((1, N, d))
    if cfg.norm_top_k_min:
        q = np.take_along_axis(*route(x[0], w, cfg)[:2], -1).sum(-1)
        assert (q < cfg.norm_top_k_min).any() and (q > cfg.norm_top_k_min).any()

    def loss(x_, W_router):
        return float((routed_feed_forward(x_, replace(w, W_router=W_router), cfg) * G).sum())

    tape = Tape()
    routed_feed_forward(x, w, cfg, tape=tape)
    dx, g = routed_backward(G, w, tape.pop(0, "ffn"), cfg)
    assert g.b_choice is None and g.W_shared_gate is None
    h = 1e-6
    for (i, j) in [(0, 1), (5, 7), (N - 1, d - 1)]:
        e = np.zeros_like(x)
        e[0, i, j] = h
        assert abs((loss(x + e, w.W_router) - loss(x - e, w.W_router)) / (2 * h) - dx[0, i, j]) < 1e-6
    for (a, b) in [(0, 0), (3, 5), (d - 1, cfg.n_experts - 1)]:
        e = np.zeros_like(w.W_router)
        e[a, b] = h
        assert abs((loss(x, w.W_router + e) - loss(x, w.W_router - e)) / (2 * h) - g.W_router[a, b]) < 1e-6


@pytest.mark.parametrize("name", NEW)
def test_a_saved_model_reads_back_equal(tmp_path, name):
    assert check_saved_reads_back(tmp_path, name)["model_type"] == name


def test_ernie_moe_layer_patterns_write_back():
    """hf_config finds moe_layer_start_index / end_index / interval for every pattern they can say; another is
    refused."""
    from qkv.checkpoints.ernie4_5 import config, hf_config

    cfg = qkv.load(MODELS / "ernie4_5_moe").config.with_(n_layers=6)
    for dense in [(), (0, 2, 4), (0, 1, 2, 3, 4, 5), (0, 1, 5), (0, 1, 2, 4)]:
        hf = hf_config(cfg.with_(dense_layers=dense))
        assert config(hf).dense_layers == dense
    with pytest.raises(QkvError, match="every interval-th"):
        hf_config(cfg.with_(dense_layers=(1, 2)))


@pytest.mark.parametrize("name", ROUTED)
def test_the_fused_expert_layout_reads_the_same(name, tmp_path):
    """Experts as transformers 5 holds them in memory (experts.gate_up_proj, experts.down_proj) read as the
    per-expert tensors save_pretrained writes; an MTP layer's tensors (Ernie) are left unread."""
    from qkv.checkpoints.tensors import TensorStore, write_safetensors
    src = MODELS / name
    store = TensorStore(src)
    tensors = {n: np.array(store.get(n, store._where[n][1]["shape"])) for n in store.names()}
    E = qkv.load(src).config.n_experts
    for i in (1, 2):
        p = f"model.layers.{i}.mlp.experts"
        tensors[f"{p}.gate_up_proj"] = np.stack([np.concatenate([tensors.pop(f"{p}.{e}.gate_proj.weight"),
                                                                 tensors.pop(f"{p}.{e}.up_proj.weight")])
                                                 for e in range(E)])
        tensors[f"{p}.down_proj"] = np.stack([tensors.pop(f"{p}.{e}.down_proj.weight") for e in range(E)])
    if name == "ernie4_5_moe":
        tensors["model.mtp_linear_proj.0.weight"] = np.zeros((4, 4), np.float32)
    (tmp_path / "m").mkdir()
    shutil.copy(src / "config.json", tmp_path / "m")
    with open(tmp_path / "m" / "model.safetensors", "wb") as f:
        write_safetensors(f, tensors)
    ids = reference(name)["single_input_ids"]
    assert max_abs(qkv.load(src).forward(ids).logits, qkv.load(tmp_path / "m").forward(ids).logits) == 0


def test_defaults_as_transformers_fills_them():
    """What config.json leaves out: Ernie's θ 500000, head_dim 128, moe_* defaults and the attribute_map's aliases;
    dots1's sliding layers from max_window_layers on."""
    from qkv.checkpoints.families import config_of

    hf = json.loads((MODELS / "ernie4_5_moe" / "config.json").read_text())
    left_out = ("rope_parameters", "moe_norm_min", "moe_num_experts", "moe_k", "moe_layer_interval")
    bare = {k: v for k, v in hf.items() if k not in left_out} | {"num_experts": 4, "num_experts_per_tok": 2}
    cfg = config_of(bare)
    assert (cfg.rope_theta, cfg.norm_top_k_min, cfg.n_experts, cfg.experts_per_token) == (5e5, 1e-12, 4, 2)
    cfg = config_of({k: v for k, v in json.loads((MODELS / "ernie4_5" / "config.json").read_text()).items()
                     if k != "head_dim"})
    assert cfg.d_head == 128
    hf = json.loads((MODELS / "dots1" / "config.json").read_text())
    cfg = config_of({k: v for k, v in hf.items() if k != "layer_types"} | {"max_window_layers": 1})
    assert [cfg.window(i) for i in range(3)] == [None, 5, 5]


@pytest.mark.parametrize("name, change, message", [
    ("dots1", {"n_group": 3}, "n_group"),                          # 8 experts in 3 groups
    ("dots1", {"topk_group": 5}, "topk_group"),
    ("dots1", {"n_group": 8, "topk_group": 2}, "groups"),          # groups of one expert
    ("dots1", {"n_routed_experts": None}, "n_routed_experts"),
    ("dots1", {"n_shared_experts": 0}, "n_shared_experts"),
    ("dots1", {"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ("ernie4_5_moe", {"moe_layer_interval": 0}, "moe_layer_interval"),
    ("ernie4_5_moe", {"num_mtp_layers": 2}, "MTP"),
    ("ernie4_5_moe", {"moe_k": 5}, "more than the 4 experts"),
    ("ernie4_5_moe", {"moe_norm_min": -1.0}, "moe_norm_min"),
    ("ernie4_5", {"hidden_act": "tanh"}, "activation 'tanh'"),
    ("ernie4_5", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial rotary"),
])
def test_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(err.value)


def _with_tokenizer(tmp_path, name: str) -> str:
    """The fixture with a word-level tokenizer.json of a few words (the fixtures have none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = tmp_path / name
    shutil.copytree(MODELS / name, out)
    words = "the cat sat on mat dog a".split()
    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<s>": 1, "</s>": 2} | {w: 3 + i for i, w in enumerate(words)},
                                     unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    return str(out)


@pytest.mark.parametrize("name", NEW)
def test_the_views_and_analyses_run(name, monkeypatch, capsys, tmp_path):
    """Every command of a (MoE) decoder's row of the families table runs, and the viewer's router panel holds the
    trace's choice."""
    source = _with_tokenizer(tmp_path, name)
    text = "the cat sat on"
    args = {"patch": [text, "the dog sat on", "--token", "the", "--other", "on"], "dla": [text, "--token", "the"],
            "generate": [text, "--max-new-tokens", "2"]}
    for command in ("heads", "rollout", "lens", "patch", "attribute", "dla", "next", "generate"):
        code, out, err = run_main(monkeypatch, capsys, command, "--model", source, *args.get(command, [text]))
        assert code == 0, f"qkv {command}: {err}"
    code, out, err = run_main(monkeypatch, capsys, "show", text, "--model", source, "--out", str(tmp_path / "show"))
    assert code == 0, err
    from test_viewer import data_of
    router = data_of((tmp_path / "show" / "attention.html").read_text(encoding="utf-8"))["router"]
    model = qkv.load(source)
    if name == "ernie4_5":
        assert router is None
        return
    trace = model.run(text)
    assert router["layers"] == [1, 2] and router["k"] == model.config.experts_per_token
    assert router["experts"] == model.config.n_experts
    assert router["chosen"] == [trace.layer(i).experts.tolist() for i in (1, 2)]
    np.testing.assert_allclose(router["weights"], [trace.layer(i).expert_weights for i in (1, 2)], atol=1e-4)


@pytest.mark.parametrize("name", ROUTED)
def test_the_pipeline_page_names_the_router(name, tmp_path):
    """The pipeline page's payload says which router it draws: σ or softmax scores, the choice bias, the groups,
    the scale, the shared expert ungated; and the page is written."""
    from qkv.viz.pipeline import save_pipeline
    from qkv.viz.pipeline_payload import arch_of

    model = qkv.load(MODELS / name)
    moe = arch_of(model)["moe"]
    cfg = model.config
    assert (moe["score"], moe["choice_bias"], moe["groups"], moe["groups_kept"], moe["scale"], moe["shared_gated"]) == \
        (cfg.router_score, True, cfg.expert_groups, cfg.expert_groups_kept, cfg.routed_scaling, False)
    assert save_pipeline(model, model.run(list(range(3, 12))), tmp_path / "p.html").is_file()


@pytest.mark.parametrize("name", NEW)
def test_atp_is_the_finite_difference_of_the_real_pass(name):
    """Attribution patching's estimates (qkv.analysis.atp) through the interleaved RoPE and the routed FFNs: the
    real pass's derivatives (test_atp.check_gradients)."""
    from test_atp import check_gradients, inputs

    model, clean, corrupted, metric = inputs(name)
    e = check_gradients(model, clean, corrupted, metric, metric)
    assert (e.neurons is None) == (name != "ernie4_5")            # layer 0 is dense, but a routed FFN has no hidden


def test_ernie_gguf_reads_as_its_directory(tmp_path, monkeypatch):
    """llama.cpp's `ernie4_5` file (tests/fixtures/gguf_convert.py: as stored, RoPE on interleaved pairs in both) of a
    bias-free Ernie directory gives back its knobs and its logits bit for bit (the norms' ε rounded to float32, as
    the file holds it); the committed fixture, with use_bias, is refused by the writer (llama.cpp's has no biases).
    (Against transformers: tests/live/test_live_ernie_dots1.py.)"""
    import sys
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    sys.path.insert(0, str(FIXTURES))
    import gguf_convert

    with pytest.raises(ValueError, match="no biases"):
        gguf_convert.convert(MODELS / "ernie4_5", tmp_path / "x.gguf")
    hf = json.loads((MODELS / "ernie4_5" / "config.json").read_text()) | {"use_bias": False, "vocab_size": 300}
    directory = qkv.init(hf, seed=1, initializer_range=0.2).save(tmp_path / "hf")
    ours, read = qkv.load(directory), qkv.load(gguf_convert.convert(directory, tmp_path / "e.gguf"))
    assert read.config == ours.config.with_(norm_eps=float(np.float32(ours.config.norm_eps)))
    ids = np.arange(3, 20)[None]
    np.testing.assert_array_equal(read.forward(ids).logits, ours.forward(ids).logits)


@pytest.mark.parametrize("name", ROUTED)
def test_the_pipeline_pages_router_box_in_a_browser(name, tab, tmp_path):
    """Every box of a routed layer opens; the router box writes this router's formula (σ or softmax, the choice bias,
    the groups, the scale, the ungated shared expert) and lists the engine's choice for the token picked."""
    from test_browser_pipeline import open_page
    from test_browser_pipeline_families import boxes, open_box
    from qkv.viz.pipeline import save_pipeline

    model = qkv.load(MODELS / name)
    cfg, trace = model.config, model.run(list(range(3, 12)))
    open_page(tab, save_pipeline(model, trace, tmp_path / "p.html"))
    page = tab.page
    page.click(".qkv-p-tok >> nth=2")
    for layer in range(cfg.n_layers):
        page.select_option(".qkv-p-layer", str(layer))
        for box in boxes(tab) if layer == 1 else ():                # every box of a routed layer opens
            open_box(tab, box)
        text = open_box(tab, "router")
        assert ("σ(x·W_router)" in text) == (cfg.router_score == "sigmoid") and "ungated" in text
        assert "never weighs them" in text and ("groups" in text) == (cfg.expert_groups > 1)
        assert ("multiplied by 2.5" in text) == (name == "dots1")
        lt = trace.layers[layer]
        if lt.experts is None:
            assert f"Layer {layer} is dense" in text
            continue
        rows = page.eval_on_selector_all(".qkv-p-detail .qkv-p-table tr",
                                         "rs => rs.slice(1).map(r => [...r.children].map(c => c.textContent))")
        assert [int(e) for e, _ in rows] == lt.experts[2].tolist()
        np.testing.assert_allclose([float(w) for _, w in rows], lt.expert_weights[2], atol=1e-4)
    assert tab.errors == [] and tab.dialogs == []


@pytest.mark.parametrize("name", ROUTED)
def test_a_fresh_model_starts_with_no_choice_bias(name):
    """qkv.init as transformers initialises: the choice bias 0 (Ernie's (1, E) moe_statics too), the router drawn."""
    fresh = qkv.init(json.loads((MODELS / name / "config.json").read_text()), seed=3)
    moe = fresh.weights.blocks[1].ffn
    assert not moe.b_choice.any() and moe.W_router.std() > 0.01
    assert fresh.forward([5, 6, 7]).logits.shape == (1, 3, fresh.config.vocab_size)


@pytest.mark.parametrize("name", ROUTED)
def test_trace_saves_and_loads_the_router(name, tmp_path):
    """σ scores, scaled weights (> 1 with dots1's ×2.5) and all: a saved trace reads back the router's record."""
    check_router_trace_round_trip(tmp_path, name)

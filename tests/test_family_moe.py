"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) from the committed fixtures, without torch: the router's choice
in the trace, gradients equal to torch autograd, the one-token step reading only its k experts, the knobs
refused in one line. (Forward, every layer, greedy ids, left padding, float64, the KV cache's fast path and
the layout run on these fixtures in test_families.py, test_generate.py, test_decode_fast.py, test_layout.py.)
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import qkv
from conftest import MODELS, check_gradients, check_router_trace_round_trip, edited, max_abs, reference, run_main
from qkv import QkvError
from qkv.core.blocks import route
from qkv.core.trace import Trace
from qkv.core.weights import FFNWeights, MoEWeights

MOE = ("mixtral", "qwen2_moe", "qwen2_moe_norm", "qwen3_moe", "olmoe")


def test_the_knobs_as_read():
    mixtral, qwen, norm, qwen3, olmoe = (qkv.load(MODELS / n).config for n in MOE)
    assert (qwen3.qk_norm, qwen3.d_head, qwen3.dense_layers, qwen3.out_bias, qwen3.d_shared_expert) == ("head", 16, (0,), True, 0)
    assert (olmoe.qk_norm, olmoe.norm_top_k, olmoe.dense_layers, olmoe.d_expert) == ("all", False, (), None)
    assert (mixtral.n_experts, mixtral.experts_per_token, mixtral.norm_top_k, mixtral.dense_layers) == (4, 2, True, ())
    assert mixtral.sliding_window == 8 and mixtral.d_shared_expert == 0
    assert (qwen.norm_top_k, qwen.dense_layers, qwen.d_expert, qwen.d_shared_expert, qwen.d_ff) == (False, (1,), 16, 32, 40)
    assert (norm.experts_per_token, norm.norm_top_k, norm.dense_layers, norm.qkv_bias) == (3, True, (0,), False)
    w = qkv.load(MODELS / "qwen2_moe").weights
    assert isinstance(w.blocks[0].ffn, MoEWeights) and isinstance(w.blocks[1].ffn, FFNWeights)
    assert w.blocks[0].ffn.shared is not None and w.blocks[0].ffn.W_shared_gate.shape == (48, 1)


@pytest.mark.parametrize("name", MOE)
def test_the_trace_holds_the_routers_choice(name):
    model = qkv.load(MODELS / name)
    cfg = model.config
    ids = reference(name)["single_input_ids"][0]
    trace = model.run(ids)
    for i in range(cfg.n_layers):
        t = trace.layer(i)
        if not cfg.moe_layer(i):
            assert t.router is None and t.experts is None and t.expert_weights is None
            continue
        n, E, k = len(ids), cfg.n_experts, cfg.experts_per_token
        assert t.router.shape == (n, E) and t.experts.shape == (n, k) and t.expert_weights.shape == (n, k)
        np.testing.assert_allclose(t.router.sum(-1), 1, atol=1e-6)
        p_chosen = np.take_along_axis(t.router, t.experts, -1)
        assert (np.diff(p_chosen, axis=-1) <= 0).all()                      # most probable first
        assert (p_chosen.min(-1) >= np.delete(np.sort(t.router, -1), np.s_[E - k:], -1).max(-1)).all()
        want = p_chosen / p_chosen.sum(-1, keepdims=True) if cfg.norm_top_k else p_chosen
        np.testing.assert_allclose(t.expert_weights, want, rtol=1e-6)
        x = model.weights.blocks[i]
        # the router reads the FFN's norm of the stream after attention: what route() gives on it
        h = t.residual + t.attn_out
        from qkv.core.blocks import norm
        p, chosen, weights = route(norm(h, x.ffn_norm, cfg), x.ffn, cfg)
        assert np.array_equal(chosen, t.experts) and max_abs(p, t.router) < 1e-6


def test_route_breaks_ties_towards_the_lower_expert_and_renormalises():
    cfg = qkv.load(MODELS / "mixtral").config
    w = MoEWeights(W_router=np.zeros((48, 4), np.float32), experts=[])
    p, chosen, weights = route(np.ones((3, 48), np.float32), w, cfg)
    assert chosen.tolist() == [[0, 1]] * 3 and np.allclose(p, 0.25) and np.allclose(weights, 0.5)
    _, _, unnormed = route(np.ones((3, 48), np.float32), w, cfg.with_(norm_top_k=False))
    assert np.allclose(unnormed, 0.25)


def test_a_routed_layer_sums_its_chosen_experts_by_hand():
    """MoE(x) = Σ_j w_j·FFN_{e_j}(x) + σ(x·W_s)·FFN_s(x), written out token by token."""
    from qkv.core.blocks import feed_forward, routed_feed_forward
    model = qkv.load(MODELS / "qwen2_moe", dtype=np.float64)
    cfg, moe = model.config, model.weights.blocks[0].ffn
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model))
    out = routed_feed_forward(x, moe, cfg)
    p, chosen, weights = route(x.reshape(-1, cfg.d_model), moe, cfg)
    for r, row in enumerate(x.reshape(-1, cfg.d_model)):
        want = sum(w * feed_forward(row[None], moe.experts[e], cfg)[0] for e, w in zip(chosen[r], weights[r]))
        want += 1 / (1 + np.exp(-(row @ moe.W_shared_gate))) * feed_forward(row[None], moe.shared, cfg)[0]
        np.testing.assert_allclose(out.reshape(-1, cfg.d_model)[r], want, atol=1e-12)


def test_a_one_token_step_reads_only_its_k_experts(monkeypatch):
    """The KV cache's step (step_block) runs the FFN of the k chosen experts and no other."""
    import qkv.core.blocks as blocks
    model = qkv.load(MODELS / "mixtral")
    used: list[int] = []
    experts = {id(e): i for b in model.weights.blocks for i, e in enumerate(b.ffn.experts)}
    plain = blocks.feed_forward

    def counting(x, w, cfg, tape=None, layer=0, rec=None, hooks=None):
        if id(w) in experts:
            used.append(experts[id(w)])
        return plain(x, w, cfg, tape, layer, rec, hooks)
    monkeypatch.setattr(blocks, "feed_forward", counting)
    ids = reference("mixtral")["single_input_ids"][0]
    model.generate(ids, 1, temperature=0)                            # the prefill only
    prefill = list(used)
    used.clear()
    model.generate(ids, 2, temperature=0)                            # the prefill, then one step
    step = used[len(prefill):]
    k, L = model.config.experts_per_token, model.config.n_layers
    assert used[:len(prefill)] == prefill and len(step) == k * L     # k experts a layer, each once
    assert all(len(set(step[l * k:(l + 1) * k])) == k for l in range(L))


@pytest.mark.parametrize("name", MOE)
def test_gradients_equal_autograd(name):
    """Through the chosen experts, the router's softmax (the weights w_j) and the shared expert's gate;
    an expert no token chose gets zeros, as in torch."""
    check_gradients(qkv.load(MODELS / name), name, zero_norm=True)


def test_gradient_steps_lower_the_loss():
    """Training's way: the checkpoint's tensors as one dict, Weights as views of it, updated in place."""
    from qkv.checkpoints import FAMILIES, weights_from_tensors
    from qkv.models.model import Model
    from qkv.train import loss_and_grads
    model = qkv.load(MODELS / "qwen2_moe_norm")
    cfg = model.config
    tensors = FAMILIES[cfg.family].tensors(model.weights, cfg)
    weights = weights_from_tensors(tensors, cfg)
    ids = reference("qwen2_moe_norm")["single_input_ids"]
    losses = []
    for _ in range(3):
        loss, grads = loss_and_grads(weights, cfg, ids)
        losses.append(loss)
        for name, g in FAMILIES[cfg.family].tensors(grads, cfg).items():
            tensors[name] -= 0.5 * g
    assert losses[2] < losses[1] < losses[0]
    assert Model(cfg, weights).forward(ids).logits is not None


@pytest.mark.parametrize("name", MOE)
def test_trace_saves_and_loads_the_router(name, tmp_path):
    check_router_trace_round_trip(tmp_path, name)


def test_a_damaged_router_record_is_refused(tmp_path):
    model = qkv.load(MODELS / "mixtral")
    d = model.run(reference("mixtral")["single_input_ids"][0]).save(tmp_path / "t")
    with np.load(d / "trace.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["experts"] = arrays["experts"] + 7                       # experts beyond E
    np.savez_compressed(d / "trace.npz", **arrays)
    with pytest.raises(QkvError, match="bad router record"):
        Trace.load(d)
    del arrays["experts"]
    np.savez_compressed(d / "trace.npz", **arrays)
    with pytest.raises(QkvError, match="come together"):
        Trace.load(d)


def test_router_names_are_not_hooks():
    model = qkv.load(MODELS / "mixtral")
    for name in ("0.router", "experts", "1.expert_weights"):
        with pytest.raises(QkvError, match="recorded in the trace, not hooked"):
            model.run([5, 6, 7], hooks={name: lambda v, layer: v})


@pytest.mark.parametrize("name, change, message", [
    ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window=true is not supported"),
    ("qwen2_moe", {"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "not every layer"),
    ("qwen2_moe", {"shared_expert_intermediate_size": 0}, "empty shared expert"),
    ("qwen2_moe", {"mlp_only_layers": [7]}, "mlp_only_layers"),
    ("qwen2_moe", {"num_experts_per_tok": 5}, "more than the 4 experts"),
    ("qwen2_moe", {"norm_topk_prob": "yes"}, "true or false"),
    ("mixtral", {"num_local_experts": 0}, "positive integer"),
    ("olmoe", {"clip_qkv": 8.0}, "clip_qkv"),
    ("olmoe", {"head_dim": 8}, "head_dim"),
    ("mixtral", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6, "factor": 2.0}}, "proportional"),
])
def test_what_cannot_run_is_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message):
        qkv.load(edited(tmp_path, name, change)).forward([5, 6, 7])      # RoPE types: at the first pass


def test_mismatched_experts_are_refused(tmp_path):
    """A config.json with another number of experts than the file holds: one line, not a traceback."""
    for E in (3, 5):
        with pytest.raises(QkvError, match="its config disagree"):
            qkv.load(edited(tmp_path / str(E), "mixtral", {"num_local_experts": E}))


def test_decoder_sparse_step_places_the_routed_layers(tmp_path):
    cfg = qkv.load(MODELS / "qwen2_moe_norm").config
    assert [cfg.moe_layer(i) for i in range(cfg.n_layers)] == [False, True]


def test_the_fused_expert_layout_reads_the_same(tmp_path):
    """Experts stored as transformers 5 holds them (experts.gate_up_proj, experts.down_proj) read as the
    per-expert tensors save_pretrained writes."""
    from qkv.checkpoints.tensors import TensorStore, write_safetensors
    src = MODELS / "qwen2_moe"
    store = TensorStore(src)
    tensors = {n: np.array(store.get(n, store._where[n][1]["shape"])) for n in store.names()}
    for i in (0, 2):
        p = f"model.layers.{i}.mlp.experts"
        tensors[f"{p}.gate_up_proj"] = np.stack([np.concatenate([tensors.pop(f"{p}.{e}.gate_proj.weight"),
                                                                 tensors.pop(f"{p}.{e}.up_proj.weight")]) for e in range(4)])
        tensors[f"{p}.down_proj"] = np.stack([tensors.pop(f"{p}.{e}.down_proj.weight") for e in range(4)])
    (tmp_path / "m").mkdir()
    shutil.copy(src / "config.json", tmp_path / "m")
    with open(tmp_path / "m" / "model.safetensors", "wb") as f:
        write_safetensors(f, tensors)
    ids = reference("qwen2_moe")["single_input_ids"]
    a, b = qkv.load(src).forward(ids).logits, qkv.load(tmp_path / "m").forward(ids).logits
    assert max_abs(a, b) == 0


@pytest.mark.parametrize("name", MOE)
def test_save_reads_back_the_same(name, tmp_path):
    model = qkv.load(MODELS / name)
    back = qkv.load(model.save(tmp_path / "m"))
    assert back.config == model.config
    ids = reference(name)["single_input_ids"]
    assert max_abs(back.forward(ids).logits, model.forward(ids).logits) == 0


def test_the_cli_runs_on_a_moe_fixture(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "generate", "The cat sat", "--model", str(MODELS / "qwen2_moe"),
                              "-n", "4", "-t", "0")
    assert code == 0, err
    code, out, err = run_main(monkeypatch, capsys, "show", "The cat sat on the mat", "--model",
                              str(MODELS / "mixtral"), "--out", str(tmp_path / "show"))
    assert code == 0, err
    from test_viewer import data_of
    router = data_of((tmp_path / "show" / "attention.html").read_text(encoding="utf-8"))["router"]
    assert router["layers"] == [0, 1] and router["experts"] == 4 and router["k"] == 2


def test_a_fresh_moe_model_and_the_lessons_run(monkeypatch, capsys):
    hf = json.loads((MODELS / "qwen2_moe" / "config.json").read_text())
    fresh = qkv.init(hf, seed=3)
    assert isinstance(fresh.weights.blocks[0].ffn, MoEWeights) and fresh.forward([5, 6, 7]).logits.shape == (1, 3, 400)
    code, out, err = run_main(monkeypatch, capsys, "explain", "kv-cache", "--model", str(MODELS / "qwen2_moe"))
    assert code == 0, err

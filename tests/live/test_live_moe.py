"""Mixtures of experts against live transformers, on random checkpoints of many shapes: Mixtral (8 or 4
experts, top-1 or top-2, head_dim of its own, a sliding window that cuts, tied or not), Qwen2-MoE
(norm_topk_prob or not, top-1/2/3, a shared expert, dense layers by mlp_only_layers or decoder_sparse_step,
no experts at all, q/k/v biases or none, tied), Qwen3-MoE (q/k norms per head, biases, a window, head_dim
24) and OLMoE (q/k norms over the projections, biases, top-3 of 8).

Each case: a right- and a left-padded batch (hidden states and logits within 1e-4, attention weights
within 1e-5), the router's choice in qkv's trace equal to transformers' router_logits → softmax → topk at
every real token, greedy generation with and without the KV cache token for token, a model qkv saves
read back by transformers with equal logits, and gradients equal to torch autograd (the loss without the
load-balancing term: output_router_logits false).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from live_helpers import (build, check_saved_by_qkv_on, compare, decoder_positions, hf_greedy, max_abs, padded_batch,
                          run_reference, save)
from test_live_grads import autograd
from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

import qkv
from qkv.train import gradients

pytestmark = pytest.mark.live

NEW = 8
COMMON = dict(vocab_size=211, max_position_embeddings=128, initializer_range=0.15, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, attn_implementation="eager", rms_norm_eps=1e-6)


def mixtral(d=48, heads=4, kv=2, layers=2, ff=24, E=4, k=2, window=None, tied=False, head_dim=None, theta=1e6):
    return MixtralConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, num_hidden_layers=layers,
                         intermediate_size=ff, num_local_experts=E, num_experts_per_tok=k, sliding_window=window,
                         tie_word_embeddings=tied, head_dim=head_dim,
                         rope_parameters={"rope_type": "default", "rope_theta": theta}, **COMMON)


def qwen_moe(d=48, heads=4, kv=2, layers=3, ff=40, moe_ff=16, shared=24, E=4, k=2, norm=False, only=(1,), step=1,
             bias=True, tied=False):
    return Qwen2MoeConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, num_hidden_layers=layers,
                          intermediate_size=ff, moe_intermediate_size=moe_ff, shared_expert_intermediate_size=shared,
                          num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm, mlp_only_layers=list(only),
                          decoder_sparse_step=step, qkv_bias=bias, tie_word_embeddings=tied, use_sliding_window=False,
                          **COMMON)


def qwen3_moe(d=48, heads=4, kv=2, layers=2, ff=40, moe_ff=16, E=4, k=2, norm=True, only=(), step=1, bias=False,
              tied=False, head_dim=None, window=None):
    return Qwen3MoeConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, num_hidden_layers=layers,
                          intermediate_size=ff, moe_intermediate_size=moe_ff, num_experts=E, num_experts_per_tok=k,
                          norm_topk_prob=norm, mlp_only_layers=list(only), decoder_sparse_step=step,
                          attention_bias=bias, tie_word_embeddings=tied, head_dim=head_dim or d // heads,
                          use_sliding_window=window is not None, sliding_window=window, **COMMON)


def olmoe(d=48, heads=4, kv=2, layers=2, ff=16, E=4, k=2, norm=False, bias=False, tied=False):
    return OlmoeConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, num_hidden_layers=layers,
                       intermediate_size=ff, num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm,
                       attention_bias=bias, tie_word_embeddings=tied, **COMMON)


CASES = [
    pytest.param(MixtralForCausalLM, mixtral(), id="mixtral-E4-k2"),
    pytest.param(MixtralForCausalLM, mixtral(d=64, heads=8, kv=2, E=8, k=2, ff=32, layers=3, tied=True),
                 id="mixtral-E8-k2-h8-L3-tied"),
    pytest.param(MixtralForCausalLM, mixtral(E=4, k=1, window=5, head_dim=16), id="mixtral-k1-window5-dk16"),
    pytest.param(Qwen2MoeForCausalLM, qwen_moe(), id="qwen2moe-shared-dense1-k2"),
    pytest.param(Qwen2MoeForCausalLM, qwen_moe(norm=True, k=3, only=(), step=2, bias=False, tied=True, layers=2),
                 id="qwen2moe-norm-k3-step2-nobias-tied"),
    pytest.param(Qwen2MoeForCausalLM, qwen_moe(d=64, heads=4, kv=1, E=8, k=2, norm=True, only=(0, 2), layers=3,
                                               moe_ff=8, shared=48), id="qwen2moe-E8-mqa-dense0,2"),
    pytest.param(Qwen2MoeForCausalLM, qwen_moe(E=0, k=2, only=(), layers=2), id="qwen2moe-no-experts"),
    pytest.param(Qwen3MoeForCausalLM, qwen3_moe(), id="qwen3moe-qknorm-norm"),
    pytest.param(Qwen3MoeForCausalLM, qwen3_moe(norm=False, bias=True, only=(1,), layers=3, head_dim=24, tied=True),
                 id="qwen3moe-bias-dense1-dk24-tied"),
    pytest.param(Qwen3MoeForCausalLM, qwen3_moe(window=5, k=1, E=8), id="qwen3moe-window5-k1-E8"),
    pytest.param(OlmoeForCausalLM, olmoe(), id="olmoe-E4-k2"),
    pytest.param(OlmoeForCausalLM, olmoe(norm=True, bias=True, tied=True, E=8, k=3, layers=3), id="olmoe-norm-bias-E8-k3"),
]


def hf_router(model, ids: np.ndarray) -> list[np.ndarray]:
    """transformers' router probabilities per MoE layer, (n, E), on one sequence."""
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_router_logits=True)
    return [torch.softmax(r.float(), -1).numpy() for r in out.router_logits]


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_moe(cls, config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(cls, config, seed=seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side, lengths in (("right", [11, 7, 9]), ("left", [11, 6, 9])):
        ids, mask = padded_batch(config.vocab_size, lengths, seed=11, low=3, side=side)
        ref = run_reference(model, ids, mask, position_ids=decoder_positions(mask))
        compare(ours.forward(ids, mask), ref, mask, label=f"{request.node.callspec.id}-{side}")
    prompt = padded_batch(config.vocab_size, [9], seed=12, low=3)[0]
    trace = ours.run(prompt[0])
    routed = [i for i in range(ours.config.n_layers) if ours.config.moe_layer(i)]
    probs = hf_router(model, prompt) if routed else []
    assert len(probs) == len(routed)
    k = ours.config.experts_per_token
    for layer, p in zip(routed, probs):
        t = trace.layer(layer)
        assert max_abs(t.router, p) < 1e-5
        top = np.argsort(-p, -1, kind="stable")[:, :k]
        assert np.array_equal(np.sort(t.experts, -1), np.sort(top, -1)), layer
    greedy = hf_greedy(model, prompt, NEW)
    np.testing.assert_array_equal(ours.generate(prompt, NEW, temperature=0), greedy)
    np.testing.assert_array_equal(ours.generate(prompt, NEW, temperature=0, use_cache=False), greedy)
    # a model qkv saves, read back by transformers
    check_saved_by_qkv_on(cls, model, ours, prompt, tmp_path / "qkv")
    # gradients: through the chosen experts and the router's weights
    ids, mask = padded_batch(config.vocab_size, [12, 9, 5], seed=13, low=3)
    loss_ref, ref = autograd(model, ids, mask)
    loss, grads = gradients(ours, ids, mask)
    assert abs(loss - loss_ref) < 1e-5, (loss, loss_ref)
    fused = {k: g for k, g in ref.items() if ".experts." in k}
    for key in fused:                                    # transformers holds the experts fused: compare by expert
        base = key.rsplit(".", 1)[0].replace(".mlp.", ".block_sparse_moe." if cls is MixtralForCausalLM else ".mlp.")
        names = ("w1", "w3", "w2") if cls is MixtralForCausalLM else ("gate_proj", "up_proj", "down_proj")
        g = fused[key]
        if key.endswith("gate_up_proj"):
            ours_g = np.stack([np.concatenate([grads[f"{base}.{e}.{names[0]}.weight"], grads[f"{base}.{e}.{names[1]}.weight"]])
                               for e in range(g.shape[0])])
        else:
            ours_g = np.stack([grads[f"{base}.{e}.{names[2]}.weight"] for e in range(g.shape[0])])
        assert np.linalg.norm(ours_g - g) <= 1e-4 * np.linalg.norm(g), key
    for key, g in ref.items():
        if key in fused:
            continue
        name = key.replace(".mlp.gate.", ".block_sparse_moe.gate.") if cls is MixtralForCausalLM else key
        # (top-1 renormalised: the weight is 1 whatever p, so the router's gradient is 0; torch's is rounding, ~1e-9)
        assert np.linalg.norm(grads[name] - g) <= 1e-4 * np.linalg.norm(g) + 1e-7, key

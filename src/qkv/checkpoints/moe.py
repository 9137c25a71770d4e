"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the Llama family's blocks with a routed FFN.

    checkpoint name (relative to the base model)        qkv name
    embed_tokens                                        tok_embed
    layers.{i}.input_layernorm                          attn_norm (RMSNorm)
    layers.{i}.self_attn.q_proj/k_proj/v_proj/o_proj    W_Q / W_K / W_V / W_O (Qwen2-MoE: q/k/v biases, qkv_bias;
                                                        Qwen3-MoE, OLMoE: all four with attention_bias)
    layers.{i}.self_attn.q_norm / k_norm                q_norm / k_norm: RMSNorm of each head's q, k (Qwen3-MoE) or
                                                        of the whole projections (OLMoE, as OLMo 2)
    layers.{i}.post_attention_layernorm                 ffn_norm
  Mixtral (every layer routed):
    layers.{i}.block_sparse_moe.gate                    ffn.W_router (E, d_model) → (d_model, E)
    layers.{i}.block_sparse_moe.experts.{e}.w1/w3/w2    ffn.experts[e].W_gate / W_in / W_out
  Qwen2-MoE (a MoE layer; the dense ones, mlp_only_layers / decoder_sparse_step, are Llama's mlp.*_proj):
    layers.{i}.mlp.gate                                 ffn.W_router
    layers.{i}.mlp.experts.{e}.gate_proj/up_proj/down_proj   ffn.experts[e].W_gate / W_in / W_out
    layers.{i}.mlp.shared_expert.gate_proj/up_proj/down_proj  ffn.shared (shared_expert_intermediate_size wide)
    layers.{i}.mlp.shared_expert_gate                   ffn.W_shared_gate (1, d_model) → (d_model, 1)
  Qwen3-MoE: Qwen2-MoE's names without the shared expert; OLMoE: the same, every layer routed.
    norm                                                final_norm
    lm_head (absent when tied)                          W_vocab
Experts stored fused as transformers 5 holds them in memory (mlp.experts.gate_up_proj (E, 2·d_expert, d_model),
mlp.experts.down_proj (E, d_model, d_expert)) are read too, as views; qkv writes the per-expert names that
save_pretrained writes (transformers 5 merges them on loading).

The router: p = softmax(x·W_router), the num_experts_per_tok highest, their weights renormalised to sum 1
(Mixtral always, Qwen2-MoE with norm_topk_prob). Training knobs: router_aux_loss_coef and
output_router_logits add transformers' load-balancing loss to its training loss; qkv's training has no
such term (it trains on the cross-entropy alone, equal to transformers' loss with output_router_logits
false); router_jitter_noise (Mixtral) acts in transformers' training mode only, which qkv never copies.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import BlockWeights, FFNWeights, MoEWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, attention_linears, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .llama import IGNORED, _rope
from .tensors import TensorStore

ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}
# Where each family keeps a MoE layer's router and experts, and its experts' three matrices (gate, up, down).
MOE = {"mixtral": "block_sparse_moe", "qwen2_moe": "mlp", "qwen3_moe": "mlp", "olmoe": "mlp"}
QWEN = ("gate_proj", "up_proj", "down_proj")
EXPERT = {"mixtral": ("w1", "w3", "w2"), "qwen2_moe": QWEN, "qwen3_moe": QWEN, "olmoe": QWEN}
QK_NORM = {"qwen3_moe": "head", "olmoe": "all"}

__all__ = ["IGNORED", "config", "weights", "hf_config", "tensors"]


def _dense_layers(hf: dict, n_layers: int, n_experts: int) -> tuple[int, ...]:
    """Qwen2-MoE's dense layers: those in mlp_only_layers, and those not at a multiple of decoder_sparse_step
    (layer i is routed when (i + 1) % step == 0), as transformers builds Qwen2MoeDecoderLayer."""
    only = hf.get("mlp_only_layers") or []
    step = hf.get("decoder_sparse_step", 1)
    if not isinstance(only, list) or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_layers
                                         for i in only):
        raise QkvError(f"config.json mlp_only_layers = {only!r:.40} is not a list of layers 0..{n_layers - 1}; "
                       "restore the checkpoint's config.json")
    if n_experts == 0:
        return ()
    return tuple(i for i in range(n_layers) if i in only or (i + 1) % step)


def config(hf: dict) -> ModelConfig:
    family = hf["model_type"]
    d, H, L = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    types = hf.get("layer_types")
    if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
        shown = sorted(set(map(str, types))) if isinstance(types, list) else repr(types)[:40]
        raise QkvError(f"layer_types {shown} is not every layer full_attention; qkv runs models whose every layer "
                       "is full attention (restore the checkpoint's config.json, or use one without sliding layers)")
    d_head = hf.get("head_dim") or d // H
    out_bias = False
    if family == "mixtral":
        E, window = need(hf, "num_local_experts"), hf.get("sliding_window")
        d_ff = d_expert = need(hf, "intermediate_size")
        norm_top_k, shared, dense, bias = True, 0, (), False
    elif family == "olmoe":                                   # every layer routed, q/k norms over the projections
        if hf.get("clip_qkv") is not None:
            raise QkvError(f"olmoe with clip_qkv={hf['clip_qkv']!r} (Q, K, V clamped) is not supported; "
                           "use a checkpoint without it")
        if d_head != d // H:
            raise QkvError(f"olmoe with head_dim {d_head} ≠ hidden_size / heads is not supported; restore config.json")
        E, window, d_ff = hf.get("num_experts", 64), None, need(hf, "intermediate_size")
        d_expert, shared, dense = d_ff, 0, ()
        norm_top_k, bias = bool(hf.get("norm_topk_prob", False)), bool(hf.get("attention_bias", False))
        out_bias = bias
    else:                                                      # Qwen2-MoE, Qwen3-MoE
        qwen3 = family == "qwen3_moe"
        if hf.get("use_sliding_window") and not qwen3:
            raise QkvError(f"{family} with use_sliding_window=true is not supported; use a checkpoint without it")
        E = hf.get("num_local_experts", hf.get("num_experts", 128)) if qwen3 else hf.get("num_experts", 60)
        window = hf.get("sliding_window") if hf.get("use_sliding_window") else None   # (Qwen3-MoE writes num_local_experts)
        d_ff, d_expert = need(hf, "intermediate_size"), need(hf, "moe_intermediate_size")
        shared = 0 if qwen3 else need(hf, "shared_expert_intermediate_size")
        if E and not qwen3 and shared == 0:
            raise QkvError(f"{family} with shared_expert_intermediate_size 0 (an empty shared expert) is not "
                           "supported; use a checkpoint with a shared expert")
        norm_top_k, dense = bool(hf.get("norm_topk_prob", False)), _dense_layers(hf, L, E)
        bias = bool(hf.get("attention_bias", False)) if qwen3 else hf.get("qkv_bias", True)
        out_bias = qwen3 and bias
    k = need(hf, "num_experts_per_tok") if E else 0
    if E and k > E:
        raise QkvError(f"config.json num_experts_per_tok {k} is more than the {E} experts; "
                       "restore the checkpoint's config.json")
    return ModelConfig(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=hf.get("num_key_value_heads") or H, d_head=d_head, d_ff=d_ff,
        max_positions=hf.get("max_position_embeddings", 4096), causal=True, norm="rms", norm_place="pre",
        norm_eps=hf.get("rms_norm_eps", 1e-6), position="rope", rope_theta=theta, rope_scaling=scaling,
        activation=activation(hf.get("hidden_act") or "silu"), gated_ffn=True, qkv_bias=bool(bias), out_bias=out_bias,
        qk_norm=QK_NORM.get(family),
        ffn_bias=False, tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        sliding_window=window, pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,
        n_experts=E, experts_per_token=k, norm_top_k=norm_top_k, d_expert=None if d_expert == d_ff else d_expert,
        d_shared_expert=shared if E else 0, dense_layers=dense,
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, V = cfg.d_model, cfg.vocab_size
    hq, hkv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head

    def rms(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype))

    def gated(p: str, f: int, names=("gate_proj", "up_proj", "down_proj")) -> FFNWeights:
        g, u, o = names
        return FFNWeights(W_gate=linear_T(store, f"{p}.{g}.weight", d, f, dtype),
                          W_in=linear_T(store, f"{p}.{u}.weight", d, f, dtype),
                          W_out=linear_T(store, f"{p}.{o}.weight", f, d, dtype))

    def experts(p: str) -> list[FFNWeights]:
        E, f = cfg.n_experts, cfg.d_expert or cfg.d_ff
        first = f"{p}.experts.0.{EXPERT[cfg.family][0]}.weight"     # save_pretrained's per-expert form first
        if not store.has(first) and store.has(f"{p}.experts.gate_up_proj"):   # transformers 5's fused form, as views
            gate_up = store.get(f"{p}.experts.gate_up_proj", (E, 2 * f, d), dtype)    # (E, 2·f, d) [gate; up]
            down = store.get(f"{p}.experts.down_proj", (E, d, f), dtype)             # (E, d, f)
            return [FFNWeights(W_gate=gate_up[e, :f].T, W_in=gate_up[e, f:].T, W_out=down[e].T) for e in range(E)]
        return [gated(f"{p}.experts.{e}", f, EXPERT[cfg.family]) for e in range(E)]

    def block(i: int) -> BlockWeights:
        a = f"layers.{i}.self_attn"
        attn = attention_linears(store, a, d, hq, hkv, dtype, cfg.qkv_bias, cfg.out_bias)
        if cfg.qk_norm:                                            # each head's (Qwen3-MoE) or all of them (OLMoE)
            wide = cfg.qk_norm == "all"
            attn.q_norm = NormWeights(store.get(f"{a}.q_norm.weight", (hq if wide else cfg.d_head,), dtype))
            attn.k_norm = NormWeights(store.get(f"{a}.k_norm.weight", (hkv if wide else cfg.d_head,), dtype))
        if cfg.moe_layer(i):
            p = f"layers.{i}.{MOE[cfg.family]}"
            ffn = MoEWeights(W_router=linear_T(store, f"{p}.gate.weight", d, cfg.n_experts, dtype), experts=experts(p))
            if cfg.d_shared_expert:
                ffn.shared = gated(f"{p}.shared_expert", cfg.d_shared_expert)
                ffn.W_shared_gate = linear_T(store, f"{p}.shared_expert_gate.weight", d, 1, dtype)
        else:
            ffn = gated(f"layers.{i}.mlp", cfg.d_ff)               # Qwen2-MoE's dense layers: a Llama FFN
        return BlockWeights(attn_norm=rms(f"layers.{i}.input_layernorm"), attn=attn,
                            ffn_norm=rms(f"layers.{i}.post_attention_layernorm"), ffn=ffn)

    tok = store.get("embed_tokens.weight", (V, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else linear_T(store, "lm_head.weight", d, V, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=rms("norm"), W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE ForCausalLM with these knobs."""
    family = cfg.family
    if family not in ARCHITECTURES:
        raise QkvError(f"family {family!r} is not one of {sorted(ARCHITECTURES)}; use its own module")
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    hf = {
        "model_type": family, "architectures": [ARCHITECTURES[family]],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions, "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "rope_parameters": {**rope, "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0,
        "num_experts_per_tok": cfg.experts_per_token or 1, "output_router_logits": False,   # (no experts: unread)
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }
    if cfg.rope_scaling is not None:
        hf["rope_scaling"] = dict(cfg.rope_scaling)
    if family == "mixtral":
        hf |= {"num_local_experts": cfg.n_experts, "sliding_window": cfg.sliding_window, "router_jitter_noise": 0.0}
    elif family == "olmoe":
        hf |= {"num_experts": cfg.n_experts, "norm_topk_prob": cfg.norm_top_k, "attention_bias": cfg.qkv_bias,
               "clip_qkv": None}
    else:
        hf |= {"num_local_experts" if family == "qwen3_moe" else "num_experts": cfg.n_experts,
               "moe_intermediate_size": cfg.d_expert or cfg.d_ff,
               "norm_topk_prob": cfg.norm_top_k, "mlp_only_layers": list(cfg.dense_layers), "decoder_sparse_step": 1,
               "use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window}
        hf |= ({"attention_bias": cfg.qkv_bias} if family == "qwen3_moe" else
               {"qkv_bias": cfg.qkv_bias, "shared_expert_intermediate_size": cfg.d_shared_expert})
    return reads_back(cfg, hf, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under the ForCausalLM model's names as save_pretrained writes them (Linear: (out, in),
    one tensor per expert); new arrays. Tied: no lm_head (W_vocab is embed_tokens)."""

    def gated(p: str, f: FFNWeights, names=("gate_proj", "up_proj", "down_proj")) -> dict:
        g, u, o = names
        return {f"{p}.{g}.weight": f.W_gate.T, f"{p}.{u}.weight": f.W_in.T, f"{p}.{o}.weight": f.W_out.T}

    t = {"model.embed_tokens.weight": weights.tok_embed}                      # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a = f"model.layers.{i}", b.attn
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight, f"{p}.post_attention_layernorm.weight": b.ffn_norm.weight,
            f"{p}.self_attn.q_proj.weight": a.W_Q.T, f"{p}.self_attn.q_proj.bias": a.b_Q,   # (H·d_k, d)
            f"{p}.self_attn.k_proj.weight": a.W_K.T, f"{p}.self_attn.k_proj.bias": a.b_K,   # (Hkv·d_k, d)
            f"{p}.self_attn.v_proj.weight": a.W_V.T, f"{p}.self_attn.v_proj.bias": a.b_V,
            f"{p}.self_attn.o_proj.weight": a.W_O.T, f"{p}.self_attn.o_proj.bias": a.b_O,   # (d, H·d_k)
            f"{p}.self_attn.q_norm.weight": None if a.q_norm is None else a.q_norm.weight,  # (d_k,) or (H·d_k,)
            f"{p}.self_attn.k_norm.weight": None if a.k_norm is None else a.k_norm.weight,
        }
        f = b.ffn
        if isinstance(f, MoEWeights):
            m = f"{p}.{MOE[cfg.family]}"
            t[f"{m}.gate.weight"] = f.W_router.T                                           # (E, d)
            for e, expert in enumerate(f.experts):
                t |= gated(f"{m}.experts.{e}", expert, EXPERT[cfg.family])                 # (d_expert, d) …
            if f.shared is not None:
                t |= gated(f"{m}.shared_expert", f.shared)
                t[f"{m}.shared_expert_gate.weight"] = f.W_shared_gate.T                    # (1, d)
        else:
            t |= gated(f"{p}.mlp", f)                                                       # a dense layer
    t["model.norm.weight"] = weights.final_norm.weight
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                           # (V, d)
    return c_arrays(t)

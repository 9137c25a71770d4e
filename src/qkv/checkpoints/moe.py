"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the Llama family's blocks with a routed FFN.

Its tensors: `ROWS` below, each checkpoint name (relative to the base model) beside ours and how it is stored, read
both ways (loading and saving).
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

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import FFNWeights, MoEWeights
from .common import (HF_ACTIVATIONS, activation, check_shapes, decoder_sizes, model_type_keys, need, reads_back,
                     rope_parameters, special_ids)
from .llama import IGNORED, _rope
from .table import (LLAMA_LAYER, LLAMA_TOP, QK_NORMS, Arch, How, Row, attention, both_ways, gated_ffn, layer_norm,
                    lm_head, out_bias, qkv_bias, dense_layer, routed_layer)
from .table import About

MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"), models="Mixtral, Qwen1.5-MoE / Qwen2-MoE, Qwen3-MoE,"
                                                                        " OLMoE",
          brings="a routed FFN: each token's router (softmax over E experts) picks the top k, whose gated FFNs are "
                 "summed with the router's weights (renormalised: Mixtral, Qwen2-MoE's `norm_topk_prob`); Qwen2-MoE's"
                 " shared expert with its σ gate and dense layers among the routed ones (`mlp_only_layers`, "
                 "`decoder_sparse_step`); Qwen3-MoE's and OLMoE's q/k norms (per head, over the projections); the "
                 "router's choice in the trace and the viewer's Experts tab",
          kind="MoE decoder"),
)

ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}

# Where each family keeps a MoE layer's router and experts, and its experts' three matrices (gate, up, down).
MOE = {"mixtral": "block_sparse_moe", "qwen2_moe": "mlp", "qwen3_moe": "mlp", "olmoe": "mlp",
       "qwen3_next": "mlp"}                                     # (qwen3_next.py reads its MoE layers by Routed)
QWEN = ("gate_proj", "up_proj", "down_proj")
EXPERT = {"mixtral": ("w1", "w3", "w2"), "qwen2_moe": QWEN, "qwen3_moe": QWEN, "olmoe": QWEN, "qwen3_next": QWEN}
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


class Routed(How):
    """A routed layer's FFN under layers.{i}.<MOE>: the router (gate, (E, d)), each expert's gated FFN (one
    tensor per matrix and expert, as save_pretrained writes them; transformers 5's fused gate_up_proj and
    down_proj (E, …) read as views) and Qwen2-MoE's shared expert with its gate: one MoEWeights."""

    def read(self, store, name, shape, dtype, cfg):
        d, E = cfg.d_model, cfg.n_experts
        p = f"{name}.{MOE[cfg.family]}"
        ffn = MoEWeights(W_router=store.get(f"{p}.gate.weight", (E, d), dtype).T,            # (d, E)
                         experts=self._experts(store, p, cfg, dtype))
        if cfg.d_shared_expert:
            ffn.shared = self._gated(store, f"{p}.shared_expert", cfg.d_shared_expert, cfg, dtype)
            ffn.W_shared_gate = store.get(f"{p}.shared_expert_gate.weight", (1, d), dtype).T
        return ffn

    @staticmethod
    def _gated(store, p: str, f: int, cfg: ModelConfig, dtype, names=("gate_proj", "up_proj", "down_proj")):
        g, u, o = names
        d = cfg.d_model
        return FFNWeights(W_gate=store.get(f"{p}.{g}.weight", (f, d), dtype).T,
                          W_in=store.get(f"{p}.{u}.weight", (f, d), dtype).T,
                          W_out=store.get(f"{p}.{o}.weight", (d, f), dtype).T)

    def _experts(self, store, p: str, cfg: ModelConfig, dtype) -> list[FFNWeights]:
        E, f, d = cfg.n_experts, cfg.d_expert or cfg.d_ff, cfg.d_model
        first = f"{p}.experts.0.{EXPERT[cfg.family][0]}.weight"     # save_pretrained's per-expert form first
        if not store.has(first) and store.has(f"{p}.experts.gate_up_proj"):   # transformers 5's fused form, as views
            gate_up = store.get(f"{p}.experts.gate_up_proj", (E, 2 * f, d), dtype)    # (E, 2·f, d) [gate; up]
            down = store.get(f"{p}.experts.down_proj", (E, d, f), dtype)             # (E, d, f)
            return [FFNWeights(W_gate=gate_up[e, :f].T, W_in=gate_up[e, f:].T, W_out=down[e].T) for e in range(E)]
        return [self._gated(store, f"{p}.experts.{e}", f, cfg, dtype, EXPERT[cfg.family]) for e in range(E)]

    def write_all(self, name, value, cfg):
        def gated(p: str, f: FFNWeights, names=("gate_proj", "up_proj", "down_proj")) -> dict:
            g, u, o = names
            return {f"{p}.{g}.weight": f.W_gate.T, f"{p}.{u}.weight": f.W_in.T, f"{p}.{o}.weight": f.W_out.T}

        m = f"{name}.{MOE[cfg.family]}"
        t = {f"{m}.gate.weight": value.W_router.T}                                        # (E, d)
        for e, expert in enumerate(value.experts):
            t |= gated(f"{m}.experts.{e}", expert, EXPERT[cfg.family])                    # (d_expert, d) …
        if value.shared is not None:
            t |= gated(f"{m}.shared_expert", value.shared)
            t[f"{m}.shared_expert_gate.weight"] = value.W_shared_gate.T                   # (1, d)
        return t


def _per_head(cfg: ModelConfig) -> bool:                    # q/k norms over each head's d_k (Qwen3-MoE)
    return cfg.qk_norm == "head"


def _whole(cfg: ModelConfig) -> bool:                       # q/k norms over the whole projection (OLMoE)
    return cfg.qk_norm == "all"


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. Llama's attention and
# norms; a routed layer's FFN is one row (Routed).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    *layer_norm("block.attn.q_norm", "layers.{i}.self_attn.q_norm", "dk", bias=False, when=_per_head),
    *layer_norm("block.attn.k_norm", "layers.{i}.self_attn.k_norm", "dk", bias=False, when=_per_head),
    *layer_norm("block.attn.q_norm", "layers.{i}.self_attn.q_norm", "q", bias=False, when=_whole),
    *layer_norm("block.attn.k_norm", "layers.{i}.self_attn.k_norm", "kv", bias=False, when=_whole),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row("block.ffn", "layers.{i}", "d", Routed(), layers=routed_layer),
    *gated_ffn("layers.{i}.mlp", layers=dense_layer),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE ForCausalLM with these knobs."""
    family = cfg.family
    hf = {
        **model_type_keys(cfg, ARCHITECTURES),
        **decoder_sizes(cfg), "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "rope_parameters": rope_parameters(cfg),
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0,
        "num_experts_per_tok": cfg.experts_per_token or 1, "output_router_logits": False,   # (no experts: unread)
        **special_ids(cfg),
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


# llama.cpp's architectures (gguf_archs reads them by this table): Llama's attention, the router and the
# experts stacked (E, …) in one tensor each.
_ATTENTION = {k: v for k, v in LLAMA_LAYER.items() if not k.startswith("ffn_") or k == "ffn_norm"}
_MOE = {"ffn_gate_inp": "mlp.gate"}
_QWEN_EXPERTS = {"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
                 "ffn_down_exps": "mlp.experts.{e}.down_proj"}
GGUF = {
    # llama.cpp writes Mixtral as 'llama' with <a>.expert_count; gguf.py reads such a file by this table.
    "mixtral": Arch("mixtral", "MixtralForCausalLM", _ATTENTION | {"ffn_gate_inp": "block_sparse_moe.gate"},
                    LLAMA_TOP, permuted=True, keys=("tensor_data_layout",),
                    experts={"ffn_gate_exps": "block_sparse_moe.experts.{e}.w1",
                             "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
                             "ffn_down_exps": "block_sparse_moe.experts.{e}.w2"}),
    "qwen3moe": Arch("qwen3_moe", "Qwen3MoeForCausalLM", _ATTENTION | QK_NORMS | _MOE, LLAMA_TOP,
                     keys=("expert_feed_forward_length",), experts=_QWEN_EXPERTS),
    "qwen2moe": Arch("qwen2_moe", "Qwen2MoeForCausalLM",
                     _ATTENTION | _MOE | {"ffn_gate_inp_shexp": "mlp.shared_expert_gate",
                                          "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
                                          "ffn_up_shexp": "mlp.shared_expert.up_proj",
                                          "ffn_down_shexp": "mlp.shared_expert.down_proj"},
                     LLAMA_TOP, biases="qkv", keys=("expert_feed_forward_length", "expert_shared_feed_forward_length"),
                     experts=_QWEN_EXPERTS),
    "olmoe": Arch("olmoe", "OlmoeForCausalLM", _ATTENTION | QK_NORMS | _MOE, LLAMA_TOP, experts=_QWEN_EXPERTS),
}

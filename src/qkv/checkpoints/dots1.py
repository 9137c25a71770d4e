"""dots1 (rednote-hilab's dots.llm1): Qwen3's attention (q/k norms per head) with DeepSeek-V3's mixture of experts.

    config.json knob        qkv knob                 what it does
    n_routed_experts        n_experts                E experts per MoE layer (required: Dots1Config has no default)
    num_experts_per_tok     experts_per_token        k experts each token goes to
    (always)                router_score "sigmoid"   s = σ(x·W_router), each expert's own score
    (always)                expert_choice_bias       the choice ranks s + e_score_correction_bias; weights stay s
    n_group, topk_group     expert_groups(_kept)     G groups of E/G experts, each ranked by its 2 best; the best
                                                     topk_group groups' experts may be chosen
    norm_topk_prob          norm_top_k               w = s[chosen] / (Σ s[chosen] + 1e-20)
    routed_scaling_factor   routed_scaling           w × this
    n_shared_experts        d_shared_expert          one shared FFN moe_intermediate_size × n_shared_experts wide,
                                                     added ungated (shared_expert_gate false)
    moe_intermediate_size   d_expert                 each expert's width; intermediate_size: the dense layers'
    first_k_dense_replace   dense_layers             layers 0 … k−1 dense (one FFN, intermediate_size wide)
    attention_bias          qkv_bias, out_bias       biases of q/k/v_proj and o_proj
    sliding_window, max_window_layers, layer_types   layer_windows (the layers from max_window_layers on slide,
                                                     when layer_types is absent, as Dots1Config fills it in)
    head_dim                d_head                   (hidden_size / heads when absent)
    output_router_logits, router_aux_loss_coef: Dots1ForCausalLM adds no load-balancing loss; attention_dropout:
    training only. Either changes no number qkv computes.

Its tensors (`ROWS`): Llama's, q/k norms per head, and in a MoE layer (`Routed`):
    layers.{i}.mlp.gate.weight (E, d)                   ffn.W_router (d, E)
    layers.{i}.mlp.gate.e_score_correction_bias (E,)    ffn.b_choice (a buffer: never trained)
    layers.{i}.mlp.experts.{e}.gate_proj/up_proj/down_proj   ffn.experts[e] (transformers 5's fused
                                                        experts.gate_up_proj / down_proj read too, as views)
    layers.{i}.mlp.shared_experts.gate_proj/up_proj/down_proj   ffn.shared
`Routed` serves DeepSeek-V3's naming, which Ernie 4.5's MoE shares (checkpoints/ernie4_5.py).
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..core.weights import FFNWeights, MoEWeights
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, activation, check_shapes, layer_types, layer_windows, need, reads_back,
                     rope_parameters, special_ids)
from .llama import IGNORED, _rope
from .table import (LLAMA_LAYER, LLAMA_TOP, QK_NORMS, About, Arch, How, Row, attention, both_ways, dense_layer,
                    gated_ffn, gguf_positive, layer_norm, lm_head, out_bias, qkv_bias, routed_layer)

MODEL_TYPES = ("dots1",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("dots1",), models="dots.llm1",
          brings="Qwen3's q/k norms per head with DeepSeek-V3's router: σ scores, a choice bias "
                 "(`e_score_correction_bias`) that picks experts without weighing them, group-limited choice "
                 "(`n_group`, `topk_group`), `routed_scaling_factor`, an ungated shared expert, dense first layers "
                 "(`first_k_dense_replace`), sliding layers (`max_window_layers`)",
          kind="MoE decoder"),
)

__all__ = ["IGNORED", "config", "weights", "hf_config", "tensors", "Routed"]


def _count(hf: dict, key: str, least: int) -> int:
    """config.json KEY, a whole number ≥ LEAST (Dots1Config leaves some unset: None), else one error."""
    v = hf.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise QkvError(f"config.json {key} = {v!r:.30} must be a whole number ≥ {least}; restore the checkpoint's "
                       "config.json")
    return v


def config(hf: dict) -> ModelConfig:
    d, H, L = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    E, k = _count(hf, "n_routed_experts", 1), _count(hf, "num_experts_per_tok", 1)
    shared = _count(hf, "n_shared_experts", 1)
    groups, kept = _count(hf, "n_group", 1), _count(hf, "topk_group", 1)
    first = _count(hf, "first_k_dense_replace", 0)
    if k > E or E % groups or (groups > 1 and E // groups < 2) or kept > groups or k > kept * (E // groups):
        raise QkvError(f"config.json's {E} experts (n_routed_experts) in {groups} groups (n_group) of 2 or more, "
                       f"{kept} kept (topk_group) cannot give num_experts_per_tok = {k}; restore the checkpoint's "
                       "config.json")
    window = hf.get("sliding_window", 4096)
    start = hf.get("max_window_layers", 62)
    default = ["sliding_attention" if window is not None and isinstance(start, int) and i >= start
               else "full_attention" for i in range(L)]
    window, windows = layer_windows(hf, window, L, default)
    d_ff, d_expert = need(hf, "intermediate_size"), need(hf, "moe_intermediate_size")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family="dots1", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=hf.get("num_key_value_heads") or H, d_head=hf.get("head_dim") or d // H, d_ff=d_ff,
        max_positions=hf.get("max_position_embeddings", 2048), causal=True, norm="rms", norm_place="pre",
        norm_eps=hf.get("rms_norm_eps", 1e-6), position="rope", rope_theta=theta, rope_scaling=scaling,
        activation=activation(hf.get("hidden_act") or "silu"), gated_ffn=True, qkv_bias=bias, out_bias=bias,
        qk_norm="head", ffn_bias=False, tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True,
        lm_head=True, sliding_window=window, layer_windows=windows, pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,
        n_experts=E, experts_per_token=k, norm_top_k=bool(hf.get("norm_topk_prob", False)),
        d_expert=None if d_expert == d_ff else d_expert, d_shared_expert=d_expert * shared,
        dense_layers=tuple(range(min(first, L))), router_score="sigmoid", expert_choice_bias=True,
        expert_groups=groups, expert_groups_kept=kept, routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        shared_expert_gate=False,
    )


class Routed(How):
    """A routed layer's FFN under layers.{i}.mlp, in DeepSeek-V3's names: the router gate (E, d), its choice bias
    (BIAS under mlp., (E,) or (1, E) as ROWS says), each expert's gated FFN (per-expert tensors as
    save_pretrained writes them; transformers 5's fused experts.gate_up_proj (E, 2·f, d) and down_proj (E, d, f)
    read as views), and the shared experts, ungated (biases where cfg.ffn_bias: Ernie 4.5's use_bias)."""

    def __init__(self, bias: str = "gate.e_score_correction_bias", bias_rows: bool = False):
        self.bias, self.bias_rows = bias, bias_rows

    def read(self, store, name, shape, dtype, cfg):
        d, E, p = cfg.d_model, cfg.n_experts, f"{name}.mlp"
        b = store.get(f"{p}.{self.bias}", (1, E) if self.bias_rows else (E,), dtype)
        shared = (_gated(store, f"{p}.shared_experts", cfg.d_shared_expert, cfg, dtype, cfg.ffn_bias)
                  if cfg.d_shared_expert else None)
        return MoEWeights(W_router=store.get(f"{p}.gate.weight", (E, d), dtype).T,              # (d, E)
                          experts=self._experts(store, p, cfg, dtype), b_choice=b.reshape(E),   # (E,) a view
                          shared=shared)

    @staticmethod
    def _experts(store, p: str, cfg: ModelConfig, dtype) -> list[FFNWeights]:
        E, f, d = cfg.n_experts, cfg.d_expert or cfg.d_ff, cfg.d_model
        if not store.has(f"{p}.experts.0.gate_proj.weight") and store.has(f"{p}.experts.gate_up_proj"):
            gate_up = store.get(f"{p}.experts.gate_up_proj", (E, 2 * f, d), dtype)    # (E, 2·f, d) [gate; up]
            down = store.get(f"{p}.experts.down_proj", (E, d, f), dtype)             # (E, d, f)
            return [FFNWeights(W_gate=gate_up[e, :f].T, W_in=gate_up[e, f:].T, W_out=down[e].T) for e in range(E)]
        return [_gated(store, f"{p}.experts.{e}", f, cfg, dtype) for e in range(E)]

    def write_all(self, name, value, cfg):
        p = f"{name}.mlp"
        E = cfg.n_experts
        t = {f"{p}.gate.weight": value.W_router.T}                                       # (E, d)
        if value.b_choice is not None:                                                   # (a gradient tree: none)
            t[f"{p}.{self.bias}"] = value.b_choice.reshape(1, E) if self.bias_rows else value.b_choice
        for e, expert in enumerate(value.experts):
            t |= _written(f"{p}.experts.{e}", expert)
        return t if value.shared is None else t | _written(f"{p}.shared_experts", value.shared)


def _gated(store, p: str, f: int, cfg: ModelConfig, dtype, bias: bool = False) -> FFNWeights:
    """A gated FFN of width F under P (gate_proj, up_proj, down_proj; their biases when BIAS)."""
    d = cfg.d_model

    def b(proj: str, size: int):
        return store.get(f"{p}.{proj}.bias", (size,), dtype) if bias else None
    return FFNWeights(W_gate=store.get(f"{p}.gate_proj.weight", (f, d), dtype).T, b_gate=b("gate_proj", f),
                      W_in=store.get(f"{p}.up_proj.weight", (f, d), dtype).T, b_in=b("up_proj", f),
                      W_out=store.get(f"{p}.down_proj.weight", (d, f), dtype).T, b_out=b("down_proj", d))


def _written(p: str, f: FFNWeights) -> dict:
    """`_gated`'s tensors back under P, as torch's Linear stores them (out, in); biases where there are any."""
    t = {f"{p}.gate_proj.weight": f.W_gate.T, f"{p}.up_proj.weight": f.W_in.T, f"{p}.down_proj.weight": f.W_out.T}
    for proj, b in (("gate_proj", f.b_gate), ("up_proj", f.b_in), ("down_proj", f.b_out)):
        if b is not None:
            t[f"{p}.{proj}.bias"] = b
    return t


ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    *layer_norm("block.attn.q_norm", "layers.{i}.self_attn.q_norm", "dk", bias=False),
    *layer_norm("block.attn.k_norm", "layers.{i}.self_attn.k_norm", "dk", bias=False),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row("block.ffn", "layers.{i}", "d", Routed(), layers=routed_layer),
    *gated_ffn("layers.{i}.mlp", layers=dense_layer),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Dots1ForCausalLM with these knobs."""
    if cfg.family != "dots1":
        raise QkvError(f"family {cfg.family!r} is not dots1; use its own module")
    f = cfg.d_expert or cfg.d_ff
    windowed = any(cfg.window(i) is not None for i in range(cfg.n_layers))
    if cfg.d_shared_expert % f:
        raise QkvError(f"a dots1 config.json cannot hold a shared expert {cfg.d_shared_expert} wide (a multiple of the "
                       f"experts' {f}); change d_shared_expert")
    hf = {
        "model_type": "dots1", "architectures": ["Dots1ForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_ff, "moe_intermediate_size": f, "max_position_embeddings": cfg.max_positions,
        "rms_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tied_embeddings,
        "attention_bias": cfg.qkv_bias, "attention_dropout": 0.0,
        "n_routed_experts": cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token,
        "n_shared_experts": cfg.d_shared_expert // f, "n_group": cfg.expert_groups,
        "topk_group": cfg.expert_groups_kept,
        "norm_topk_prob": cfg.norm_top_k, "routed_scaling_factor": cfg.routed_scaling,
        "first_k_dense_replace": len(cfg.dense_layers), "output_router_logits": False,
        "layer_types": layer_types(cfg), "sliding_window": cfg.sliding_window if windowed else None,
        "max_window_layers": cfg.n_layers,
        **special_ids(cfg),
    }
    return reads_back(cfg, hf, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """dots1's config.json of a llama.cpp file: its experts (expert_shared_count of the experts' width shared), its
    first leading_dense_block_count layers dense, σ scores (expert_gating_func 2; older files say none: dots1 has
    no other), expert_weights_norm and _scale; no groups, no sliding window, no biases (llama.cpp's dots1 runs
    none of them)."""
    gating = meta.get(f"{a}.expert_gating_func", 2)
    if gating != 2 or dims["moe_step"] != 1:
        raise QkvError(f"the GGUF dots1 model has expert_gating_func {gating!r:.20} and every {dims['moe_step']!r:.10} "
                       "layer routed; dots1 scores experts by σ (2) and routes every layer after its dense ones: the "
                       "file is damaged")
    norm = meta.get(f"{a}.expert_weights_norm", False)
    if not isinstance(norm, bool):
        raise QkvError(f"the GGUF value {a}.expert_weights_norm = {norm!r:.20} is not true or false; the file is "
                       "damaged")
    f, shared = dims["f_expert"], dims["f_shared"]
    if not shared or shared % f:
        raise QkvError(f"the GGUF dots1 shared experts are {shared} wide, not a whole number (≥ 1) of the experts' "
                       f"{f}; the file is damaged")
    return hf | {"n_routed_experts": dims["E"], "num_experts_per_tok": dims["k"], "moe_intermediate_size": f,
                 "n_shared_experts": shared // f, "n_group": 1, "topk_group": 1, "norm_topk_prob": norm,
                 "routed_scaling_factor": gguf_positive(meta, a, "expert_weights_scale", 1.0),
                 "first_k_dense_replace": min(dims["dense_lead"], dims["L"]), "sliding_window": None,
                 "attention_bias": False}


# llama.cpp's architecture (gguf_archs reads it by this table): Qwen3's attention names, DeepSeek-V3's experts
# stacked (E, out, in) per layer, the choice bias exp_probs_b, the shared experts one FFN.
GGUF = {
    "dots1": Arch("dots1", "Dots1ForCausalLM",
                  LLAMA_LAYER | QK_NORMS | {"ffn_gate_inp": "mlp.gate",
                                            "exp_probs_b": "mlp.gate.e_score_correction_bias",
                                            "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
                                            "ffn_up_shexp": "mlp.shared_experts.up_proj",
                                            "ffn_down_shexp": "mlp.shared_experts.down_proj"},
                  LLAMA_TOP, keys=("expert_feed_forward_length", "expert_shared_count", "leading_dense_block_count",
                                   "expert_weights_scale", "expert_weights_norm", "expert_gating_func"),
                  experts={"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
                           "ffn_down_exps": "mlp.experts.{e}.down_proj"}, config=_gguf_config),
}

"""Ernie 4.5 (Baidu), dense and mixture of experts: Llama's blocks and names with RoPE on interleaved pairs.

    config.json knob        qkv knob                 what it does
    (always)                rope_interleaved         RoPE turns the pairs (0, 1), (2, 3), … of each head, pair i by
                                                     θ^(−2i/d_k) (Helium's and GPT-J's layout)
    use_bias                qkv_bias, out_bias,      biases of q/k/v/o_proj and of every gate/up/down_proj (the
                            ffn_bias                 shared experts' too; the routed experts have none) and, in
                                                     the MoE model only, of lm_head (b_vocab)
    head_dim (128), num_key_value_heads (2), rms_norm_eps (1e-5), max_position_embeddings (131072), rope_theta
    (500000), tie_word_embeddings (true), pad/bos/eos ids (0, 1, 2): Ernie's defaults when config.json leaves them out
  ernie4_5_moe, beside those:
    moe_num_experts (64), moe_k (6)        n_experts, experts_per_token (also read as num_experts, num_experts_per_tok)
    (always)                               router_score "softmax", norm_top_k: p = softmax(x·W_router), w = p[chosen]
                                           / max(Σ p[chosen], moe_norm_min)
    moe_norm_min (1e-12)                   norm_top_k_min
    (always)                               expert_choice_bias: the choice ranks p + moe_statics.e_score_correction_bias
    moe_num_shared_experts (2)             d_shared_expert = moe_intermediate_size × this, added ungated; 0: none
    moe_intermediate_size (1536)           d_expert; intermediate_size: the dense layers' width
    moe_layer_start_index (1), moe_layer_end_index (−1: the last layer), moe_layer_interval (1)
                                           dense_layers: layer i routes when start ≤ i ≤ end and (i + 1) % interval
                                           is 0, as Ernie4_5_MoeDecoderLayer builds it; every other layer is dense
    output_router_logits, router_aux_loss_coef: transformers' load-balancing loss in training; qkv trains on the
    cross-entropy alone (transformers' loss with output_router_logits false). num_mtp_layers (num_nextn_predict_layers,
    at most 1): a multi-token prediction layer for speculative decoding, never run for the logits; its mtp* tensors
    are IGNORED.

Its tensors (`ROWS`): Llama's (with the biases above); a MoE layer's FFN is dots1's `Routed` (DeepSeek-V3's names)
with the choice bias at mlp.moe_statics.e_score_correction_bias (1, E), as save_pretrained writes it.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, activation, check_shapes, decoder_sizes, model_type_keys, need, reads_back,
                     rope_parameters, special_ids)
from .dots1 import Routed
from .llama import IGNORED as LLAMA_IGNORED
from .llama import _rope
from .table import (LLAMA_LAYER, LLAMA_TOP, About, Arch, Row, attention, both_ways, ffn_bias, gated_ffn, layer_norm,
                    lm_head, out_bias, qkv_bias, dense_layer, routed_layer)

MODEL_TYPES = ("ernie4_5", "ernie4_5_moe")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("ernie4_5",), models="ERNIE 4.5 (dense)",
          brings="Llama's blocks with RoPE on interleaved pairs; `use_bias` on every projection",
          kind="decoder"),
    About(types=("ernie4_5_moe",), models="ERNIE 4.5 MoE",
          brings="a softmax router with a choice bias (`moe_statics`) that picks experts without weighing them, "
                 "`moe_norm_min`, an ungated shared expert (`moe_num_shared_experts`), routed layers by "
                 "`moe_layer_start_index` / `end_index` / `interval`",
          kind="MoE decoder"),
)

ARCHITECTURES = {"ernie4_5": "Ernie4_5ForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM"}

IGNORED = {**LLAMA_IGNORED,
           "mtp*": "the multi-token prediction layer (num_mtp_layers): speculative decoding only, never run for "
                   "the logits"}

DEFAULTS = {"head_dim": 128, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
            "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}   # Ernie4_5Config's
MOE_DEFAULTS = {"moe_intermediate_size": 1536, "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2,
                "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1, "moe_norm_min": 1e-12,
                "num_key_value_heads": 4}                                              # Ernie4_5_MoeConfig's

ALIASES = {"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok",          # Ernie4_5_MoeConfig's
           "num_mtp_layers": "num_nextn_predict_layers"}                              # attribute_map

__all__ = ["IGNORED", "config", "weights", "hf_config", "tensors"]


def _whole(hf: dict, key: str, least: int) -> int:
    v = hf.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise QkvError(f"config.json {key} = {v!r:.30} must be a whole number ≥ {least}; restore the checkpoint's "
                       "config.json")
    return v


def _dense_layers(hf: dict, L: int) -> tuple[int, ...]:
    """The layers that are not routed: layer i routes when moe_layer_start_index ≤ i ≤ moe_layer_end_index (−1:
    the last) and (i + 1) % moe_layer_interval == 0."""
    start, interval = _whole(hf, "moe_layer_start_index", 0), _whole(hf, "moe_layer_interval", 1)
    end = hf.get("moe_layer_end_index")
    end = L - 1 if end == -1 else end
    if isinstance(end, bool) or not isinstance(end, int):
        raise QkvError(f"config.json moe_layer_end_index = {end!r:.30} must be a layer number (or −1: the last); "
                       "restore the checkpoint's config.json")
    return tuple(i for i in range(L) if not (start <= i <= end and (i + 1) % interval == 0))


def _moe(hf: dict, L: int) -> dict:
    """The MoE knobs of an ernie4_5_moe config.json."""
    E, k = _whole(hf, "moe_num_experts", 1), _whole(hf, "moe_k", 1)
    if k > E:
        raise QkvError(f"config.json moe_k {k} is more than the {E} experts; restore the checkpoint's config.json")
    mtp = hf.get("num_mtp_layers")
    if mtp is not None and (not isinstance(mtp, int) or isinstance(mtp, bool) or not 0 <= mtp <= 1):
        raise QkvError(f"config.json num_mtp_layers = {mtp!r:.30}: Ernie 4.5 has at most one MTP layer; "
                       "restore the checkpoint's config.json")
    floor = hf.get("moe_norm_min")
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor < float("inf"):
        raise QkvError(f"config.json moe_norm_min = {floor!r:.30} must be a number ≥ 0; restore the checkpoint's "
                       "config.json")
    f = need(hf, "moe_intermediate_size")
    return dict(n_experts=E, experts_per_token=k, norm_top_k=True, norm_top_k_min=float(floor),
                d_expert=f, d_shared_expert=f * _whole(hf, "moe_num_shared_experts", 0),
                dense_layers=_dense_layers(hf, L), router_score="softmax", expert_choice_bias=True,
                shared_expert_gate=False)


def config(hf: dict) -> ModelConfig:
    family = hf["model_type"]
    moe = family == "ernie4_5_moe"
    if moe:                                                          # Ernie4_5_MoeConfig's attribute_map
        hf = {ours: hf[alias] for ours, alias in ALIASES.items() if alias in hf and ours not in hf} | hf
    hf = DEFAULTS | (MOE_DEFAULTS if moe else {}) | hf
    if "rope_theta" not in hf and "rope_theta" not in (hf.get("rope_parameters") or {}):
        hf["rope_theta"] = 500000.0                                  # Ernie's default_theta
    d, H, L = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    bias = bool(hf.get("use_bias", False))
    d_ff = need(hf, "intermediate_size")
    knobs = _moe(hf, L) if moe else {}
    if knobs and knobs["d_expert"] == d_ff:
        knobs["d_expert"] = None
    return ModelConfig(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=hf.get("num_key_value_heads") or H, d_head=hf.get("head_dim") or d // H, d_ff=d_ff,
        max_positions=hf["max_position_embeddings"], causal=True, norm="rms", norm_place="pre",
        norm_eps=hf["rms_norm_eps"], position="rope", rope_theta=theta, rope_scaling=scaling, rope_interleaved=True,
        activation=activation(hf.get("hidden_act") or "silu"), gated_ffn=True, qkv_bias=bias, out_bias=bias,
        ffn_bias=bias, tied_embeddings=bool(hf["tie_word_embeddings"]), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=True, **knobs)


def _head_bias(cfg: ModelConfig) -> bool:                   # Ernie4_5_MoeForCausalLM's lm_head has use_bias's bias
    return cfg.family == "ernie4_5_moe" and cfg.ffn_bias


ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row("block.ffn", "layers.{i}", "d", Routed("moe_statics.e_score_correction_bias", bias_rows=True),
        layers=routed_layer),
    *gated_ffn("layers.{i}.mlp", layers=dense_layer),
    *[Row(f"block.ffn.{b}", f"layers.{{i}}.mlp.{proj}.bias", size, when=ffn_bias, layers=dense_layer)  # use_bias
      for b, proj, size in (("b_gate", "gate_proj", "f"), ("b_in", "up_proj", "f"), ("b_out", "down_proj", "d"))],
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
    Row("b_vocab", "lm_head.bias", "V", when=_head_bias, root=True),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an Ernie4_5ForCausalLM / Ernie4_5_MoeForCausalLM with these knobs."""
    family = cfg.family
    hf = {
        **model_type_keys(cfg, ARCHITECTURES),
        **decoder_sizes(cfg), "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "rope_parameters": rope_parameters(cfg),
        "tie_word_embeddings": cfg.tied_embeddings, "use_bias": cfg.ffn_bias,
        **special_ids(cfg),
    }
    if family == "ernie4_5_moe":
        f = cfg.d_expert or cfg.d_ff
        routed = [i for i in range(cfg.n_layers) if cfg.moe_layer(i)] or [cfg.n_layers]   # (none: start past the end)
        start, end = routed[0], routed[-1]
        step = next((s for s in range(1, cfg.n_layers + 1)
                     if [i for i in range(start, end + 1) if (i + 1) % s == 0] == routed), None)
        if cfg.d_shared_expert % f or step is None:
            raise QkvError("an ernie4_5_moe config.json holds the routed layers as every interval-th from one index "
                           "to another, and shared experts as a multiple of the experts' width; change dense_layers "
                           "or d_shared_expert")
        hf |= {"moe_num_experts": cfg.n_experts, "moe_k": cfg.experts_per_token, "moe_intermediate_size": f,
               "moe_num_shared_experts": cfg.d_shared_expert // f, "moe_norm_min": cfg.norm_top_k_min,
               "moe_layer_start_index": start, "moe_layer_end_index": end, "moe_layer_interval": step,
               "output_router_logits": False}
    return reads_back(cfg, hf, config)


def _gguf_moe(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Ernie 4.5 MoE's config.json of a llama.cpp file: its experts, the shared ones as a multiple of their width
    (expert_shared_feed_forward_length, which the converter writes as intermediate_size / num_key_value_heads:
    the shared experts' width in the published models), and its routed layers as llama.cpp runs them — layer i
    when i ≥ leading_dense_block_count and (i + 1) is a multiple of interleave_moe_layer_step, up to the last."""
    f, shared = dims["f_expert"], dims["f_shared"]
    if shared % f:
        raise QkvError(f"the GGUF ernie4_5-moe shared experts are {shared} wide, not a multiple of the experts' {f}; "
                       "the file is damaged")
    return hf | {"moe_num_experts": dims["E"], "moe_k": dims["k"], "moe_intermediate_size": f,
                 "moe_num_shared_experts": shared // f, "moe_layer_start_index": dims["dense_lead"],
                 "moe_layer_end_index": -1, "moe_layer_interval": dims["moe_step"], "use_bias": False}


# llama.cpp's architectures (gguf_archs reads them by these tables): Llama's names, RoPE by interleaved pairs in
# both (no Q/K permutation), no biases; the mixture's experts stacked (E, out, in) per layer, its choice bias
# exp_probs_b (E,) (Hugging Face's moe_statics (1, E)), its shared experts one FFN.
_MOE_LAYER = {"ffn_gate_inp": "mlp.gate", "exp_probs_b": "mlp.moe_statics.e_score_correction_bias",
              "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
              "ffn_down_shexp": "mlp.shared_experts.down_proj"}
_EXPERTS = {"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
            "ffn_down_exps": "mlp.experts.{e}.down_proj"}
GGUF = {"ernie4_5": Arch("ernie4_5", "Ernie4_5ForCausalLM", LLAMA_LAYER, LLAMA_TOP),
        "ernie4_5-moe": Arch("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", LLAMA_LAYER | _MOE_LAYER, LLAMA_TOP,
                             keys=("expert_feed_forward_length", "expert_shared_feed_forward_length",
                                   "expert_shared_count", "interleave_moe_layer_step", "leading_dense_block_count"),
                             experts=_EXPERTS, config=_gguf_moe)}

"""DeepSeek V2 and V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): Llama's norms and SwiGLU, multi-head latent
attention (MLA: K and V of every head from one latent per token; core/latent.py, whose KV cache keeps the latent),
and after the first dense layers a routed FFN (blocks.routed_feed_forward, DeepSeek-V3's router as dots1's).

    config.json knob        qkv knob                 what it does
    kv_lora_rank            kv_lora_rank             r_kv: c = RMSNorm(x·W_V), the latent K and V are made from (and
                                                     what the KV cache keeps); [K_nope | V] of each head = c·W_KV_b
    q_lora_rank (null: none) q_lora_rank             q = RMSNorm(x·W_Q)·W_Q_b through an r_q latent; null: q = x·W_Q
    qk_nope_head_dim        d_head − rotary_dim      each head's q/k numbers RoPE leaves alone (first in the head)
    qk_rope_head_dim        rotary_dim               the numbers RoPE turns (last); k's are one key x·W_K every head shares
    v_head_dim              d_v                      each head's V and Z width (W_O reads H·d_v)
    rope_parameters / rope_theta, rope_scaling       RoPE over qk_rope_head_dim numbers; YaRN with mscale, mscale_all_dim:
                                                     cos, sin × its attention factor, and the score scale
                                                     (qk_nope + qk_rope)^-½ × mscale(factor, mscale_all_dim)² (attn_scale),
                                                     as transformers' yarn_apply_mscale
    (V2, always)            rope_interleaved         RoPE turns pairs (2i, 2i+1) in place (transformers' complex form)
    rope_interleave (V3, true) rope_deinterleave     pairs (2i, 2i+1) written out as halves; false: pairs (i, i + d/2)
    attention_bias          qkv_bias, out_bias       biases of q_a_proj (with q_lora_rank), kv_a_proj_with_mqa, o_proj
    num_key_value_heads     (must equal the heads)   transformers repeats the H expanded K/V heads by H / this: only 1 runs
    first_k_dense_replace   dense_layers             layers 0 … k−1 dense (intermediate_size wide); the others routed
    n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts (one ungated shared FFN,
    moe_intermediate_size × n_shared_experts wide), routed_scaling_factor (the chosen weights × it): as dots1's
      V2: scores softmax(x·W_router), the k highest (topk_method "greedy"), or those within the topk_group best of
          n_group groups, each ranked by its best expert ("group_limited_greedy": expert_group_score "max"); never
          renormalised (its router does not read norm_topk_prob)
      V3: scores σ(x·W_router), chosen by σ + e_score_correction_bias within the topk_group best of n_group groups
          (each ranked by its 2 best), renormalised (+ 1e-20) when norm_topk_prob
    moe_layer_freq, scoring_func, topk_method (V3): not read by transformers 5.25; refused unless they say what it runs
    mlp_bias (V2)           refused when true
    num_nextn_predict_layers / num_mtp_layers (V3): the multi-token-prediction modules for speculative decoding,
    outside the model's forward pass; output_router_logits, attention_dropout, pretraining_tp: change no number.

Its tensors (relative to the base model, "model."; the head "lm_head"), built for the config's sizes (`rows`):
    layers.{i}.self_attn.q_proj | q_a_proj, q_a_layernorm, q_b_proj      attn.W_Q | W_Q (+ b_Q), q_latent_norm, W_Q_b
    layers.{i}.self_attn.kv_a_proj_with_mqa (r_kv + d_rot, d)            attn.W_V (the latent's rows), attn.W_K (the
                                                                          RoPE key's); its bias: b_V, b_K
    layers.{i}.self_attn.kv_a_layernorm, kv_b_proj, o_proj               attn.kv_latent_norm, W_KV_b, W_O (+ b_O)
    layers.{i}.mlp.*                                                     Llama's gated FFN, or dots1.Routed's MoE
llama.cpp's `deepseek2` files (GGUF, both versions): MLA written as one K/V head over the latent (head_count_kv 1,
key_length r_kv + d_rot, value_length r_kv; each head's sizes in key_length_mla, value_length_mla), kv_b_proj split per
head into attn_k_b (H, r_kv, d_nope) and attn_v_b (H, d_v, r_kv) (joined back by gguf_archs; older files: H heads of
the full sizes, attn_kv_b whole), no biases, plain RoPE only (YaRN's keys refused); V3 by its σ gating
(expert_gating_func 2) and choice bias exp_probs_b.
"""

from __future__ import annotations

import math

from ..core.config import ModelConfig
from ..core.positions import check_rope, resolve_rope, rope_kind, yarn_mscale
from ..core.weights import MoEWeights
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, activation, decoder_sizes, model_type_keys, need, reads_back, rope_parameters,
                     special_ids)
from .dots1 import Routed, _gated
from .llama import IGNORED as LLAMA_IGNORED, _rope
from .table import (LINEAR, LLAMA_TOP, About, Arch, Row, dense_layer, gated_ffn, gguf_positive, layer_norm, lm_head,
                    read_table, routed_layer, write_table)

MODEL_TYPES = ("deepseek_v2", "deepseek_v3")

ARCHITECTURES = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=MODEL_TYPES, models="DeepSeek-V2, DeepSeek-V3 (and R1)",
          brings="multi-head latent attention: K, V of every head from one latent per token (`kv_lora_rank`, "
                 "q through its own latent), RoPE on part of each head, YaRN's mscale in the score scale; the KV "
                 "cache keeps the latent; MoE after the first dense layers (V2: softmax top-k, greedy or within the "
                 "groups of best experts; V3: sigmoid scores with a choice bias, groups ranked by their two best)",
          kind="MoE decoder"),
)

__all__ = ["IGNORED", "config", "weights", "hf_config", "tensors"]

# DeepSeek-V3's published checkpoints carry their multi-token-prediction module as a 62nd layer (layers.61.*), which
# transformers drops by that very name (DeepseekV3PreTrainedModel._keys_to_ignore_on_load_unexpected); a model with
# more layers reads its layer 61 as any other (a tensor read is never "ignored").
IGNORED = {**LLAMA_IGNORED,
           "layers.61.*": "DeepSeek-V3's multi-token-prediction layer (num_nextn_predict_layers): speculative "
                          "decoding only, never run for the logits"}

# The config classes' defaults (DeepseekV2Config, DeepseekV3Config), for the knobs a config.json may leave out.
DEFAULTS = {
    "deepseek_v2": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
                    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "first_k_dense_replace": 0, "n_routed_experts": 64, "n_shared_experts": 2,
                    "routed_scaling_factor": 1.0, "topk_method": "greedy", "moe_intermediate_size": 1407},
    "deepseek_v3": {"max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 1,
                    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "first_k_dense_replace": 3, "n_routed_experts": 256, "n_shared_experts": 1,
                    "routed_scaling_factor": 2.5, "moe_intermediate_size": 2048, "n_group": 8, "topk_group": 4,
                    "num_experts_per_tok": 8, "norm_topk_prob": True, "rope_interleave": True},
}
FIX = "restore the checkpoint's config.json"


def _count(hf: dict, key: str, least: int) -> int:
    """config.json KEY, a whole number ≥ LEAST, else one error."""
    v = hf.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise QkvError(f"config.json {key} = {v!r:.30} must be a whole number ≥ {least}; {FIX}")
    return v


def _same_as_run(hf: dict, key: str, runs, family: str) -> None:
    """A knob transformers 5.25 does not read (the original DeepSeek code did): refused unless it says what runs."""
    if key in hf and hf[key] != runs:
        raise QkvError(f"{family} with {key} = {hf[key]!r:.30} is not supported: transformers runs it as {runs!r} "
                       "(it does not read the key); use a checkpoint whose config.json says so")


def score_scale(hf: dict, d_qk: int, scaling: dict | None, max_positions: int) -> float | None:
    """What q·k is multiplied by: d_qk^-½, × mscale(factor, mscale_all_dim)² when the RoPE scaling has a non-zero
    mscale_all_dim (transformers' yarn_apply_mscale); None when that is plain 1/√d_k."""
    if rope_kind(scaling) == "default" or not scaling.get("mscale_all_dim"):
        return None
    m_all, factor = scaling["mscale_all_dim"], (resolve_rope(scaling, max_positions) or {}).get("factor")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (m_all, factor)):
        raise QkvError(f"config.json rope scaling mscale_all_dim = {m_all!r:.20} and factor = {factor!r:.20} must "
                       f"be finite numbers; {FIX}")
    return d_qk ** -0.5 * yarn_mscale(factor, m_all) ** 2


def _moe(hf: dict, family: str, L: int) -> dict:
    """The routed FFN's knobs of ModelConfig (none when every layer is dense: first_k_dense_replace ≥ layers)."""
    first = _count(hf, "first_k_dense_replace", 0)
    dense = tuple(range(min(first, L)))
    _same_as_run(hf, "moe_layer_freq", 1, family)
    if len(dense) == L:
        return {"dense_layers": ()}
    E, k = _count(hf, "n_routed_experts", 1), _count(hf, "num_experts_per_tok", 1)
    shared, d_expert = _count(hf, "n_shared_experts", 1), _count(hf, "moe_intermediate_size", 1)
    knobs = {"n_experts": E, "experts_per_token": k, "d_expert": d_expert, "d_shared_expert": d_expert * shared,
             "dense_layers": dense, "shared_expert_gate": False,
             "routed_scaling": float(hf.get("routed_scaling_factor", 1.0))}
    if family == "deepseek_v2":
        _same_as_run(hf, "scoring_func", "softmax", family)
        method = hf.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise QkvError(f"deepseek_v2 with topk_method {method!r:.30} is not supported (transformers runs 'greedy' "
                           "and 'group_limited_greedy'); " + FIX)
        knobs |= {"norm_top_k": False}                       # V2's router never renormalises
        if method == "greedy":
            return knobs | _groups(E, k, 1, 1)
        return knobs | _groups(E, k, _count(hf, "n_group", 1), _count(hf, "topk_group", 1)) | {"expert_group_score": "max"}
    _same_as_run(hf, "scoring_func", "sigmoid", family)
    _same_as_run(hf, "topk_method", "noaux_tc", family)
    return knobs | _groups(E, k, _count(hf, "n_group", 1), _count(hf, "topk_group", 1)) | {
        "norm_top_k": bool(hf.get("norm_topk_prob", True)), "router_score": "sigmoid", "expert_choice_bias": True}


def _groups(E: int, k: int, groups: int, kept: int) -> dict:
    """expert_groups and expert_groups_kept from n_group and topk_group, once they can give k of the E experts."""
    if k > E or E % groups or (groups > 1 and E // groups < 2) or kept > groups or k > kept * (E // groups):
        raise QkvError(f"config.json's {E} experts (n_routed_experts) in {groups} groups (n_group) of 2 or more, "
                       f"{kept} kept (topk_group) cannot give num_experts_per_tok = {k}; {FIX}")
    return {"expert_groups": groups, "expert_groups_kept": kept}


def config(hf: dict) -> ModelConfig:
    family = hf["model_type"]
    hf = DEFAULTS[family] | hf
    d, H, L = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    if (hf.get("num_key_value_heads") or H) != H:
        raise QkvError(f"{family} with num_key_value_heads {hf['num_key_value_heads']} ≠ num_attention_heads {H} is "
                       "not supported (transformers repeats its expanded heads and cannot run it); " + FIX)
    if family == "deepseek_v2" and d % H:                 # DeepseekV2Config.validate_architecture's own check
        raise QkvError(f"config.json: hidden size {d} is not divisible by {H} attention heads (DeepseekV2Config "
                       "refuses it); " + FIX)
    if family == "deepseek_v2" and hf.get("mlp_bias"):
        raise QkvError("deepseek_v2 with mlp_bias=true is not supported; use a checkpoint without FFN biases")
    r_kv, d_rot = _count(hf, "kv_lora_rank", 1), _count(hf, "qk_rope_head_dim", 2)
    d_nope, d_v = _count(hf, "qk_nope_head_dim", 0), _count(hf, "v_head_dim", 1)
    r_q = 0 if hf.get("q_lora_rank") is None else _count(hf, "q_lora_rank", 1)
    if d_rot % 2:
        raise QkvError(f"config.json qk_rope_head_dim = {d_rot} must be even (RoPE turns pairs); {FIX}")
    theta, scaling = _rope(hf)
    check_rope(theta, scaling)
    max_positions = hf.get("max_position_embeddings")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H, n_kv_heads=H,
        d_head=d_nope + d_rot, d_ff=need(hf, "intermediate_size"), max_positions=max_positions, causal=True,
        norm="rms", norm_place="pre", norm_eps=hf.get("rms_norm_eps"), position="rope", rope_theta=theta,
        rope_scaling=scaling, rotary_dim=d_rot, rope_interleaved=family == "deepseek_v2",
        rope_deinterleave=family == "deepseek_v3" and bool(hf.get("rope_interleave", True)),
        attn_scale=score_scale(hf, d_nope + d_rot, scaling, max_positions),
        kv_lora_rank=r_kv, q_lora_rank=r_q, d_v=d_v,
        activation=activation(hf.get("hidden_act") or "silu"), gated_ffn=True, qkv_bias=bias, out_bias=bias,
        ffn_bias=False, tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=True, **_moe(hf, family, L),
    )


class _Routed(Routed):
    """dots1.Routed's MoE layer (DeepSeek-V3's names); V2's router has no choice bias (its gate.weight only)."""

    def read(self, store, name, shape, dtype, cfg):
        if cfg.expert_choice_bias:
            return super().read(store, name, shape, dtype, cfg)
        d, E, p = cfg.d_model, cfg.n_experts, f"{name}.mlp"
        return MoEWeights(W_router=store.get(f"{p}.gate.weight", (E, d), dtype).T,              # (d, E)
                          experts=self._experts(store, p, cfg, dtype),
                          shared=_gated(store, f"{p}.shared_experts", cfg.d_shared_expert, cfg, dtype))


def _bias(cfg: ModelConfig) -> bool:
    return cfg.qkv_bias


def rows(cfg: ModelConfig) -> list[Row]:
    """The tensor table of CFG's checkpoint: MLA's matrices in the config's own sizes, Llama's norms, SwiGLU."""
    H, r_kv, d_rot, r_q = cfg.n_heads, cfg.kv_lora_rank, cfg.rotary_dim, cfg.q_lora_rank
    d_nope, d_v = cfg.d_head - d_rot, cfg.d_value
    a, ours = "layers.{i}.self_attn", "block.attn"
    if r_q:                                                      # q through its own latent
        q = [Row(f"{ours}.W_Q", f"{a}.q_a_proj.weight", f"d {r_q}", LINEAR),
             Row(f"{ours}.b_Q", f"{a}.q_a_proj.bias", f"{r_q}", when=_bias),
             Row(f"{ours}.q_latent_norm.weight", f"{a}.q_a_layernorm.weight", f"{r_q}"),
             Row(f"{ours}.W_Q_b", f"{a}.q_b_proj.weight", f"{r_q} q", LINEAR)]
    else:
        q = [Row(f"{ours}.W_Q", f"{a}.q_proj.weight", "d q", LINEAR)]
    return [
        Row("tok_embed", "embed_tokens.weight", "V d"),
        *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
        *q,
        Row((f"{ours}.W_V", f"{ours}.W_K"), f"{a}.kv_a_proj_with_mqa.weight", f"d {r_kv}+{d_rot}", LINEAR,
            parts=f"{r_kv} {d_rot}"),
        Row((f"{ours}.b_V", f"{ours}.b_K"), f"{a}.kv_a_proj_with_mqa.bias", f"{r_kv}+{d_rot}", when=_bias,
            parts=f"{r_kv} {d_rot}"),
        Row(f"{ours}.kv_latent_norm.weight", f"{a}.kv_a_layernorm.weight", f"{r_kv}"),
        Row(f"{ours}.W_KV_b", f"{a}.kv_b_proj.weight", f"{r_kv} {H * (d_nope + d_v)}", LINEAR),
        Row(f"{ours}.W_O", f"{a}.o_proj.weight", f"{H * d_v} d", LINEAR),
        Row(f"{ours}.b_O", f"{a}.o_proj.bias", "d", when=_bias),
        *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
        Row("block.ffn", "layers.{i}", "d", _Routed(), layers=routed_layer),
        *gated_ffn("layers.{i}.mlp", layers=dense_layer),
        *layer_norm("final_norm", "norm", bias=False),
        lm_head(),
    ]


def weights(store, cfg: ModelConfig, dtype):
    """The Weights of CFG's checkpoint in STORE, by `rows`."""
    return read_table(rows(cfg), store, cfg, dtype)


def tensors(weights, cfg: ModelConfig) -> dict:
    """Every tensor under transformers' full names, as its file stores them, by `rows`; new arrays."""
    return write_table(rows(cfg), weights, cfg, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a DeepseekV2/V3ForCausalLM with these knobs, once it reads back as CFG."""
    family = cfg.family
    routed = cfg.n_experts > 0
    hf = {
        **model_type_keys(cfg, ARCHITECTURES),
        **decoder_sizes(cfg, head_dim=False), "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "rope_parameters": rope_parameters(cfg),
        "tie_word_embeddings": cfg.tied_embeddings, "attention_bias": cfg.out_bias, "attention_dropout": 0.0,
        "kv_lora_rank": cfg.kv_lora_rank, "q_lora_rank": cfg.q_lora_rank or None,
        "qk_nope_head_dim": cfg.d_head - cfg.rotary_dim, "qk_rope_head_dim": cfg.rotary_dim, "v_head_dim": cfg.d_value,
        "first_k_dense_replace": len(cfg.dense_layers) if routed else cfg.n_layers,
        "n_routed_experts": cfg.n_experts or 1, "num_experts_per_tok": cfg.experts_per_token or 1,
        "moe_intermediate_size": cfg.d_expert or cfg.d_ff,
        "n_shared_experts": max(1, cfg.d_shared_expert // (cfg.d_expert or cfg.d_ff)),
        "routed_scaling_factor": cfg.routed_scaling, "norm_topk_prob": cfg.norm_top_k,
        **special_ids(cfg),
    }
    if family == "deepseek_v2":
        grouped = cfg.expert_groups > 1 and cfg.expert_group_score == "max"
        hf |= {"topk_method": "group_limited_greedy" if grouped else "greedy", "mlp_bias": False,
               "n_group": cfg.expert_groups if grouped else None, "topk_group": cfg.expert_groups_kept if grouped else None}
    else:
        hf |= {"rope_interleave": cfg.rope_deinterleave, "n_group": cfg.expert_groups,
               "topk_group": cfg.expert_groups_kept}
    return reads_back(cfg, hf, config)


def _whole(meta: dict, key: str, least: int, default=None) -> int:
    """The GGUF whole number KEY (DEFAULT when absent), at least LEAST, else one error."""
    v = meta.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise QkvError(f"the GGUF value {key} = {v!r:.30} is missing or not a whole number ≥ {least}; the file is "
                       "damaged")
    return v


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """DeepSeek's config.json of a llama.cpp file, and the shapes of its latent attention's tensors (dims' part_shapes,
    which gguf_archs.expected reads). V3 when the experts are scored by σ (expert_gating_func 2, with the choice bias
    exp_probs_b), else V2 (softmax, llama.cpp's default). Files written before llama.cpp split kv_b_proj (no *_mla
    keys: H K/V heads of the full sizes, attn_kv_b whole) are read too. Refused: a V2 file that renormalises or limits
    the choice to groups (llama.cpp ranks a group by its two best, V2's group_limited_greedy by its best)."""
    H, d, d_qk, d_v, d_rot = dims["H"], dims["d"], dims["d_head"], dims["d_v"], dims["rope_dims"]
    r_kv = _whole(meta, f"{a}.attention.kv_lora_rank", 1)
    r_q = _whole(meta, f"{a}.attention.q_lora_rank", 0, default=0)
    split = f"{a}.attention.key_length_mla" in meta                  # kv_b_proj as attn_k_b, attn_v_b (else whole)
    stored = (meta.get(f"{a}.attention.head_count_kv"), meta.get(f"{a}.attention.key_length"),
              meta.get(f"{a}.attention.value_length"))
    if stored != ((1, r_kv + d_rot, r_kv) if split else (H, d_qk, d_v)):
        raise QkvError(f"the GGUF deepseek2 file stores its attention as {stored[0]!r:.10} K/V heads of key size "
                       f"{stored[1]!r:.10}, value size {stored[2]!r:.10}, which is neither llama.cpp's latent layout "
                       f"(1, {r_kv + d_rot}, {r_kv}) nor its older one ({H}, {d_qk}, {d_v}); the file is damaged")
    gating = meta.get(f"{a}.expert_gating_func", 1)                  # llama.cpp: softmax when the file says none
    groups = _whole(meta, f"{a}.expert_group_count", 1, default=1)
    kept = _whole(meta, f"{a}.expert_group_used_count", 1, default=groups)
    norm = meta.get(f"{a}.expert_weights_norm", False)
    v3 = gating == 2
    if gating not in (1, 2) or not isinstance(norm, bool) or (not v3 and (norm or groups > 1)):
        raise QkvError(f"the GGUF deepseek2 model has expert_gating_func {gating!r:.10}, expert_weights_norm "
                       f"{norm!r:.10} and {groups} expert groups; qkv runs DeepSeek-V3's σ router (2) and V2's softmax "
                       "(1) without renormalising or groups, as llama.cpp runs them")
    q = H * d_qk
    dims["part_shapes"] = {
        "attn_q": None if r_q else (q, d), "attn_q_a": (r_q, d) if r_q else None, "attn_q_a_norm": (r_q,) if r_q
        else None, "attn_q_b": (q, r_q) if r_q else None, "attn_kv_a_mqa": (r_kv + d_rot, d),
        "attn_kv_a_norm": (r_kv,), "attn_output": (d, H * d_v)} | ({} if v3 else {"exp_probs_b": None}) | (
        {"attn_kv_b": None, "attn_k_b": (H, r_kv, d_qk - d_rot), "attn_v_b": (H, d_v, r_kv)} if split else
        {"attn_kv_b": (H * (d_qk - d_rot + d_v), r_kv), "attn_k_b": None, "attn_v_b": None})
    family = "deepseek_v3" if v3 else "deepseek_v2"
    hf = {k: v for k, v in hf.items() if k != "rope_parameters"} | {
        "model_type": family, "architectures": [ARCHITECTURES[family]], "num_key_value_heads": H,
        "rope_parameters": {"rope_type": "default", "rope_theta": dims["theta"]}, "kv_lora_rank": r_kv,
        "q_lora_rank": r_q or None, "qk_nope_head_dim": d_qk - d_rot, "qk_rope_head_dim": d_rot, "v_head_dim": d_v,
        "first_k_dense_replace": dims["dense_lead"], "n_routed_experts": dims["E"], "num_experts_per_tok": dims["k"],
        "moe_intermediate_size": dims["f_expert"], "n_shared_experts": dims["f_shared"] // dims["f_expert"],
        "routed_scaling_factor": gguf_positive(meta, a, "expert_weights_scale", 1.0), "attention_bias": False}
    if v3:
        return hf | {"n_group": groups, "topk_group": kept, "norm_topk_prob": norm, "rope_interleave": True}
    return hf | {"topk_method": "greedy", "mlp_bias": False}


# llama.cpp's architecture (gguf_archs reads it by this table): MLA's tensors (attn_q or q's latent, the latent's
# projection attn_kv_a_mqa, its norm, attn_k_b and attn_v_b: kv_b_proj per head), Llama's norms and FFN, DeepSeek-V3's
# experts stacked (E, out, in), its choice bias exp_probs_b; RoPE on interleaved pairs in both (no permutation).
GGUF = {
    "deepseek2": Arch("deepseek_v2", "DeepseekV2ForCausalLM",
                      {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_q_a": "self_attn.q_a_proj",
                       "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
                       "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
                       "attn_kv_b": "self_attn.kv_b_proj", "attn_k_b": "self_attn.kv_b_proj",
                       "attn_v_b": "self_attn.kv_b_proj", "attn_output": "self_attn.o_proj",
                       "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                       "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate",
                       "exp_probs_b": "mlp.gate.e_score_correction_bias",
                       "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
                       "ffn_down_shexp": "mlp.shared_experts.down_proj"},
                      LLAMA_TOP, partial_rope=True,
                      keys=("attention.kv_lora_rank", "attention.q_lora_rank", "attention.key_length_mla",
                            "attention.value_length_mla", "leading_dense_block_count", "expert_feed_forward_length",
                            "expert_shared_count", "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
                            "expert_group_count", "expert_group_used_count"),
                      experts={"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
                               "ffn_down_exps": "mlp.experts.{e}.down_proj"}, config=_gguf_config),
}

"""Hunyuan dense (Tencent, HunYuanDenseV1): Llama's blocks with q/k RMSNorm per head applied after RoPE has turned
q and k (Qwen3's and OLMo's come before it), and RoPE's "NTK alpha" base.

    config.json knob        qkv knob                     what it does
    (always)                qk_norm "head",              query_layernorm / key_layernorm: each head's q and k
                            qk_norm_after_rope           normalised once RoPE has turned them
    rope_parameters         rope_theta                   {"rope_type": "dynamic", "alpha": α}: a fixed base
      (or rope_scaling)                                  θ·α^(d_k/(d_k − 2)), whatever the length (HunYuan's
                                                         ntk_alpha); "dynamic" without alpha: dynamic NTK as Llama's
    attention_bias          qkv_bias, out_bias           biases of q/k/v_proj and o_proj (one switch)
    head_dim                d_head                       needed: HunYuanDenseV1Attention has no default for it
    rms_norm_eps (1e-5), max_position_embeddings (2048), pad / bos / eos ids (0, 1, 2), untied: HunYuanDenseV1Config's
    defaults; eod_token_id, pretraining_tp, mlp_bias: not read by the model (its MLP has no biases)

Its tensors, relative to HunYuanDenseV1Model ("model."; the head is "lm_head"): ROWS below. llama.cpp's
`hunyuan-dense` files (GGUF): Llama's tensors as stored (no Q/K permutation), query_layernorm / key_layernorm as
attn_q_norm / attn_k_norm, an NTK alpha already folded into rope.freq_base (the converter's), no biases.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import llama
from .common import check_config, reads_back, rope_parameters
from .llama import GAMMA
from .table import (LLAMA_LAYER, LLAMA_TOP, About, Arch, Row, attention, both_ways, gated_ffn, lm_head, out_bias,
                    qkv_bias)

MODEL_TYPES = ("hunyuan_v1_dense",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("hunyuan_v1_dense",), models="Hunyuan dense (HunYuanDenseV1)",
          brings="q/k RMSNorm per head after RoPE (`qk_norm_after_rope`), RoPE's NTK alpha as a fixed base "
                 "θ·α^(d_k/(d_k − 2)), one bias switch for the four projections",
          kind="decoder"),
)

IGNORED = llama.IGNORED

DEFAULTS = {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "pad_token_id": 0, "bos_token_id": 1,
            "eos_token_id": 2, "tie_word_embeddings": False}      # HunYuanDenseV1Config's own
UNREAD = ("attention_bias", "rope_parameters", "rope_scaling", "rope_theta", "eod_token_id", "pretraining_tp",
          "mlp_bias")


def _rope(hf: dict, d_k: int) -> dict:
    """transformers 5's rope_parameters of config.json (or its older rope_theta / rope_scaling), with HunYuan's NTK
    alpha folded into the base: {"rope_type": "dynamic", "alpha": α} turns as the default RoPE of base
    θ·α^(d/(d−2)) (HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters; no per-length update)."""
    params = dict(hf.get("rope_parameters") or {})
    old = hf.get("rope_scaling") or {}
    if old:
        params |= {k: v for k, v in old.items() if k != "type"} | {"rope_type": old.get("rope_type", old.get("type"))}
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    alpha = params.get("alpha")
    if params.get("rope_type", "default") == "dynamic" and alpha:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 or d_k <= 2:
            raise QkvError(f"config.json rope_parameters.alpha = {alpha!r:.30} must be a positive number (and head_dim "
                           "more than 2); restore the checkpoint's config.json")
        return {"rope_type": "default", "rope_theta": float(params["rope_theta"]) * float(alpha) ** (d_k / (d_k - 2))}
    params.pop("alpha", None)
    return params


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    if hf.get("head_dim") is None:
        raise QkvError("config.json lacks head_dim, which HunYuanDenseV1 builds its projections from; use the "
                       "config.json that came with the checkpoint")
    rope = check_config({"rope_parameters": _rope(hf, hf["head_dim"])})["rope_parameters"]
    bias = bool(hf.get("attention_bias", False))
    base = llama.config({k: v for k, v in hf.items() if k not in UNREAD} | {"model_type": "llama",
                                                                         "rope_parameters": rope})
    return base.with_(family="hunyuan_v1_dense", qk_norm="head", qk_norm_after_rope=True, qkv_bias=bias,
                      out_bias=bias)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a HunYuanDenseV1ForCausalLM with these knobs: Llama's, q/k norms after RoPE, one bias
    switch (an NTK alpha is written as the base it gives)."""
    hf = llama.hf_dict(cfg.with_(family="llama", qk_norm=None, qk_norm_after_rope=False))
    for key in ("mlp_bias", "rope_theta", "rope_scaling"):
        hf.pop(key, None)
    hf |= {"model_type": "hunyuan_v1_dense", "architectures": ["HunYuanDenseV1ForCausalLM"],
           "attention_bias": cfg.qkv_bias, "rope_parameters": rope_parameters(cfg)}
    return reads_back(cfg, hf, config)


# The table, read both ways (Llama's, with the q/k norms under their own names).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    Row("block.attn_norm", "layers.{i}.input_layernorm.weight", "d", GAMMA),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    Row("block.attn.q_norm", "layers.{i}.self_attn.query_layernorm.weight", "dk", GAMMA),
    Row("block.attn.k_norm", "layers.{i}.self_attn.key_layernorm.weight", "dk", GAMMA),
    Row("block.ffn_norm", "layers.{i}.post_attention_layernorm.weight", "d", GAMMA),
    *gated_ffn("layers.{i}.mlp"),
    Row("final_norm", "norm.weight", "d", GAMMA),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Hunyuan's config.json of a llama.cpp file: the base as the file gives it (an NTK alpha is already in it), no
    biases (the table reads none)."""
    return hf | {"attention_bias": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "hunyuan-dense": Arch("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM",
                          LLAMA_LAYER | {"attn_q_norm": "self_attn.query_layernorm",
                                         "attn_k_norm": "self_attn.key_layernorm"},
                          LLAMA_TOP, config=_gguf_config),
}

"""Gemma 2 and Gemma 3 (text): the Llama module's tensors (llama.py) with four norms a block and layers of
two kinds.

    checkpoint name (relative to Gemma2Model / Gemma3TextModel)   qkv name
    embed_tokens                                  tok_embed (looked up, then × √d_model, cast to the dtype)
    layers.{i}.input_layernorm                    attn_norm      (RMSNorm·(1 + w), before attention)
    layers.{i}.self_attn.q_proj/k_proj/v_proj     W_Q / W_K / W_V
    layers.{i}.self_attn.q_norm / k_norm          q_norm / k_norm (Gemma 3: each head's, (1 + w), before RoPE)
    layers.{i}.self_attn.o_proj                   W_O
    layers.{i}.post_attention_layernorm           attn_out_norm  (attention's output, before the stream)
    layers.{i}.pre_feedforward_layernorm          ffn_norm       (before the FFN)
    layers.{i}.mlp.gate_proj / up_proj / down_proj   W_gate / W_in / W_out: GeGLU (gelu_pytorch_tanh)
    layers.{i}.post_feedforward_layernorm         ffn_out_norm   (the FFN's output, before the stream)
    norm                                          final_norm
    lm_head (absent when tied)                    W_vocab

Knobs: layer_types (Gemma 2: every other layer sliding, Gemma 3: five of every six, sliding_window_pattern
in older configs) → layer_windows, a sliding layer's query i seeing keys i − sliding_window + 1 … i;
query_pre_attn_scalar → S = Q·Kᵀ·query_pre_attn_scalar^-½ (attn_scale); attn_logit_softcapping → S =
c·tanh(S/c) before the mask (attn_softcap), final_logit_softcapping → logits = c·tanh(logits/c)
(final_softcap); Gemma 3's sliding layers turn by their own RoPE (rope_parameters["sliding_attention"], or
rope_local_base_freq in older configs: local_rope_theta) and the full ones by rope_parameters["full_attention"]
(rope_theta, rope_scaling). A soft-cap that config.json leaves out or writes null is none (transformers
writes both; Gemma 2's class would default an absent one to 50 / 30). Gemma 3's attention never applies
its attn_logit_softcapping (transformers keeps the value unused), so neither does qkv; its final one it applies.
use_bidirectional_attention is refused.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.positions import check_rope
from . import llama
from .common import check_config, reads_back, rope_by_layer_type
from .table import LLAMA_LAYER, LLAMA_TOP, About, Arch, gguf_positive

MODEL_TYPES = ("gemma2", "gemma3_text")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("gemma2",), models="Gemma 2",
          brings="a norm before and after attention and the FFN (sandwich), sliding and full layers alternating "
                 "(`layer_types`), soft-capped scores and logits (c·tanh(x/c): `attn_logit_softcapping`, "
                 "`final_logit_softcapping`), scores scaled by `query_pre_attn_scalar`^-½",
          kind="decoder", refuses=("dla",)),
    About(types=("gemma3_text",), models="Gemma 3 (text, `Gemma3ForCausalLM`)",
          brings="Gemma 2's blocks with q/k RMSNorm·(1 + w) per head, five sliding layers of every six, and a RoPE "
                 "per kind of layer (the sliding ones' own base, the full ones' with scaling)",
          kind="decoder", refuses=("dla",)),
)

IGNORED = llama.IGNORED
weights = llama.weights
tensors = llama.tensors


def _rope(hf: dict) -> tuple[float, dict | None, float, dict | None]:
    """(rope_theta, rope_scaling) of the full layers and of the sliding ones: transformers 5's rope_parameters
    by layer type (Gemma 3), else the older keys (rope_theta, rope_scaling, rope_local_base_freq)."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        kinds = []
        for kind, theta in (("full_attention", 1_000_000.0), ("sliding_attention", 10_000.0)):
            p = params.get(kind) or {}
            if not isinstance(p, dict):
                raise QkvError(f"config.json rope_parameters.{kind} = {p!r:.40} is not an object; "
                               "restore the checkpoint's config.json")
            check_config({"rope_parameters": p}, f"config.json ({kind})")   # its numbers' types
            kinds += [float(p.get("rope_theta", theta)), p if p.get("rope_type", "default") != "default" else None]
        return tuple(kinds)
    theta, scaling = llama._rope(hf)
    return theta, scaling, float(hf.get("rope_local_base_freq", 10_000.0)), None


def config(hf: dict) -> ModelConfig:
    family = hf["model_type"]
    cfg = llama.config(hf)
    scalar = hf.get("query_pre_attn_scalar", 256)
    knobs = dict(attn_scale=float(scalar) ** -0.5, final_softcap=hf.get("final_logit_softcapping"),
                 attn_softcap=hf.get("attn_logit_softcapping") if family == "gemma2" else None)   # Gemma 3: unread
    if family == "gemma3_text":
        theta, scaling, local_theta, local_scaling = _rope(hf)
        for base, kind in ((theta, scaling), (local_theta, local_scaling)):
            check_rope(base, kind)               # a rope_type qkv lacks, θ ≤ 1: refused now, not at the first pass
        knobs |= dict(rope_theta=theta, rope_scaling=scaling, local_rope_theta=local_theta,
                      local_rope_scaling=local_scaling)
    return cfg.with_(**knobs)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Gemma2ForCausalLM / Gemma3ForCausalLM with these knobs."""
    scalar = round(cfg.score_scale ** -2, 6) if cfg.score_scale else cfg.d_head   # S·scalar^-½; None: 1/√d_k
    hf = llama.hf_dict(cfg) | {
        "query_pre_attn_scalar": int(scalar) if scalar == int(scalar) else scalar,   # an int in transformers' class
        "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.final_softcap,
        "hidden_activation": hf_activation(cfg),
    }
    hf.pop("hidden_act")
    if cfg.family == "gemma3_text":
        for key in ("rope_theta", "rope_scaling"):
            hf.pop(key, None)
        hf["rope_parameters"] = rope_by_layer_type(cfg, cfg.local_rope_theta or cfg.rope_theta)
    return reads_back(cfg, hf, config)


def hf_activation(cfg: ModelConfig) -> str:
    """Gemma's name of its activation (hidden_activation)."""
    return {"gelu_tanh": "gelu_pytorch_tanh"}.get(cfg.activation, llama.HF_ACTIVATIONS[cfg.activation])


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Gemma 2's config.json of a llama.cpp file: the soft-caps (llama.cpp's defaults 50 / 30) and the window from
    the metadata, every other layer sliding (llama.cpp's pattern), Q·Kᵀ scaled by 1/√d_k (1/√(d_model / heads)
    with 46 layers, llama.cpp's 27B)."""
    caps = {k: gguf_positive(meta, a, k, default) for k, default in (("attn_logit_softcapping", 50.0),
                                                                      ("final_logit_softcapping", 30.0))}
    window = gguf_positive(meta, a, "attention.sliding_window")
    L = dims["L"]
    return hf | caps | {
        "sliding_window": int(window), "query_pre_attn_scalar": dims["d"] // dims["H"] if L == 46 else dims["d_head"],
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
        "attention_bias": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "gemma2": Arch("gemma2", "Gemma2ForCausalLM",
                   LLAMA_LAYER | {"ffn_norm": "pre_feedforward_layernorm",
                                   "post_attention_norm": "post_attention_layernorm",
                                   "post_ffw_norm": "post_feedforward_layernorm"}, LLAMA_TOP, plus_one=True,
                   keys=("attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"),
                   activation="gelu_pytorch_tanh", config=_gguf_config),
}

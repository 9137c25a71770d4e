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

GGUF (`GGUF` below): llama.cpp's gemma2 and gemma3 files, each read as llama.cpp runs it (`_gguf_config`,
`_gguf3_config`): what its file cannot say (query_pre_attn_scalar, Gemma 2's layer kinds) is llama.cpp's fixed choice.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.positions import check_rope
from . import llama
from .common import check_config, reads_back, rope_by_layer_type
from .table import LLAMA_LAYER, LLAMA_TOP, QK_NORMS, About, Arch, gguf_positive, gguf_rope_kind, gguf_sliding_layers

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


SWA_PERIOD = 6                  # llama.cpp's gemma3 without attention.sliding_window_pattern: 5 sliding layers of 6
SWA_BASE = 10_000.0             # its sliding layers' RoPE base without rope.freq_base_swa


def _gguf3_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Gemma 3's config.json of a llama.cpp gemma3 file (the text model; a multimodal checkpoint's main file is its
    text model), as llama.cpp's loader and graph run it: with a window (attention.sliding_window > 0) each layer's kind
    from attention.sliding_window_pattern (a bool per layer, or a period p: layer i slides unless i % p = p − 1; p = 6
    without the key), the sliding layers turned by plain RoPE at rope.freq_base_swa (10000 without it), the full ones
    at rope.freq_base with the file's scaling (linear only); without a window (or 0) every layer full; Q·Kᵀ scaled by
    1/√d_k (1/√(d_model / heads) with 62 layers, llama.cpp's 27B): query_pre_attn_scalar; the logits soft-capped by
    final_logit_softcapping when the file has it (none, or 0: none); attention never soft-capped."""
    L = dims["L"]
    window = meta.get(f"{a}.attention.sliding_window", 0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise QkvError(f"the GGUF value {a}.attention.sliding_window = {window!r:.20} is not a whole number; the file "
                       "is damaged")
    sliding = gguf_sliding_layers(meta, a, L, SWA_PERIOD) if window else [False] * L
    cap = meta.get(f"{a}.final_logit_softcapping")
    dims["rope_read"] = True                                         # both kinds' RoPE read here, not by gguf.py
    return {k: v for k, v in hf.items() if k != "rope_theta"} | {
        "sliding_window": window or None, "attention_bias": False, "attn_logit_softcapping": None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "query_pre_attn_scalar": dims["d"] // dims["H"] if L == 62 else dims["d_head"],
        "final_logit_softcapping": None if cap in (None, 0) else gguf_positive(meta, a, "final_logit_softcapping"),
        "rope_parameters": {"full_attention": _gguf_full_rope(meta, a, dims["theta"]),
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": gguf_positive(meta, a, "rope.freq_base_swa",
                                                                              SWA_BASE)}}}


def _gguf_full_rope(meta: dict, a: str, theta: float) -> dict:
    """The full layers' rope_parameters of a gemma3 file: plain, or linear (rope.scaling.factor s: positions / s,
    llama.cpp's freq_scale 1/s, which its sliding layers never take); another scaling is refused in one line."""
    kind, factor = gguf_rope_kind(meta, a)
    if kind == "none":
        return {"rope_type": "default", "rope_theta": theta}
    if kind != "linear":
        raise QkvError(f"GGUF RoPE scaling {kind!r:.40} is not supported for Gemma 3; qkv runs plain and 'linear' RoPE "
                       "on its full layers: use a file without it")
    return {"rope_type": "linear", "rope_theta": theta, "factor": gguf_positive(meta, a, "rope.scaling.factor", factor)}


# llama.cpp's architectures (gguf_archs reads them by this table).
GEMMA2_LAYER = LLAMA_LAYER | {"ffn_norm": "pre_feedforward_layernorm",
                              "post_attention_norm": "post_attention_layernorm",
                              "post_ffw_norm": "post_feedforward_layernorm"}
GGUF = {
    "gemma2": Arch("gemma2", "Gemma2ForCausalLM", GEMMA2_LAYER, LLAMA_TOP, plus_one=True,
                   keys=("attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"),
                   activation="gelu_pytorch_tanh", config=_gguf_config),
    "gemma3": Arch("gemma3_text", "Gemma3ForCausalLM", GEMMA2_LAYER | QK_NORMS, LLAMA_TOP, plus_one=True,
                   keys=("final_logit_softcapping", "attention.sliding_window", "attention.sliding_window_pattern",
                         "rope.freq_base_swa"),
                   activation="gelu_pytorch_tanh", config=_gguf3_config),
}

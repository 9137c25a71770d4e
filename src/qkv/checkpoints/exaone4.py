"""EXAONE 4 (LG AI Research): OLMo 2's placement — no norm before attention or the FFN, an RMSNorm after each box
before it joins the stream — with q/k RMSNorm per head (Qwen3's, before RoPE), sliding and full layers, and no RoPE
in the full layers while the model has sliding ones (Exaone4Attention's "global NoPE").

    config.json knob          qkv knob                  what it does
    layer_types               layer_windows             a "sliding_attention" layer sees the last sliding_window keys
    sliding_window_pattern    (layer_types)             without layer_types: layer i is sliding unless (i + 1) is a
                                                        multiple of the pattern (default 4: three sliding, one full)
    sliding_window            sliding_window            the window; null: every layer full, each turned by RoPE
    (a sliding_window)        no_rope_layers            the full layers' q, k are not turned by RoPE
    rope_parameters           rope_theta, rope_scaling  RoPE of the layers that have it
    num_key_value_heads (32), rms_norm_eps (1e-5), max_position_embeddings (2048), bos / eos ids (0, 2), untied:
    Exaone4Config's defaults when config.json leaves them out

A config.json without sliding_window has Exaone4Config's 4096 (null, written: every layer full); a pattern
given as letters ("LLLG"), or 0 (what Exaone4Config writes without a window), is read only through layer_types,
as Exaone4Config reads it (without layer_types it cannot build the model, nor can qkv: refused). attention_bias
and mlp_bias are not read (Exaone4's projections have no biases). Its tensors, relative to Exaone4Model ("model.";
the head is "lm_head"): ROWS below. llama.cpp's `exaone4` files (GGUF): the same tensors as stored (rotate-half RoPE in
both), the window and each layer's kind in the metadata (attention.sliding_window, attention.sliding_window_pattern:
one true per sliding layer), llama3 RoPE (rope_freqs) refused as for every arch.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import llama
from .common import LAYER_TYPES, layer_types, layer_windows, need, reads_back
from .llama import GAMMA
from .table import LLAMA_LAYER, LLAMA_TOP, QK_NORMS, About, Arch, Row, attention, both_ways, gated_ffn, lm_head

MODEL_TYPES = ("exaone4",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("exaone4",), models="EXAONE 4.0",
          brings="OLMo 2's norms after each box with q/k norms per head (before RoPE), sliding and full layers "
                 "(`layer_types`, `sliding_window_pattern`), no RoPE in the full layers while there are sliding ones "
                 "(global NoPE: `no_rope_layers`)",
          kind="decoder", refuses=("dla",)),
)

IGNORED = llama.IGNORED

DEFAULTS = {"num_key_value_heads": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "bos_token_id": 0,
            "eos_token_id": 2, "tie_word_embeddings": False, "sliding_window": 4096}   # Exaone4Config's own
UNREAD = ("layer_types", "sliding_window", "sliding_window_pattern", "attention_bias", "mlp_bias")


def _types(hf: dict, L: int, window: int | None) -> list[str]:
    """Each layer's kind: config.json's layer_types, else Exaone4Config's pattern (needs a window and a number)."""
    if "layer_types" in hf:
        return hf["layer_types"]
    pattern = hf.get("sliding_window_pattern", 4)
    if window is None or isinstance(pattern, str) or pattern == 0:
        raise QkvError("an exaone4 config.json without layer_types needs a sliding_window and a positive whole "
                       f"sliding_window_pattern (got {window!r}, {pattern!r:.20}); restore the checkpoint's "
                       "config.json")
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)]


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    L, window = need(hf, "num_hidden_layers"), hf.get("sliding_window")
    types = _types(hf, L, window)
    window, windows = layer_windows(hf | {"layer_types": types}, window, L, types)
    nope = () if hf.get("sliding_window") is None else tuple(i for i, t in enumerate(types)
                                                               if not LAYER_TYPES[t])   # global NoPE
    base = llama.config({k: v for k, v in hf.items() if k not in UNREAD} | {"model_type": "llama"})
    return base.with_(family="exaone4", qk_norm="head", sliding_window=window, layer_windows=windows,
                      no_rope_layers=nope)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an Exaone4ForCausalLM with these knobs: Llama's, with layer_types and the window."""
    hf = llama.hf_dict(cfg.with_(family="llama", qk_norm=None, sliding_window=None, layer_windows=None,
                                 no_rope_layers=()))
    for key in ("attention_bias", "mlp_bias", "sliding_window"):
        hf.pop(key, None)
    window = cfg.sliding_window if cfg.sliding_window is not None else (4096 if cfg.no_rope_layers else None)
    hf |= {"model_type": "exaone4", "architectures": ["Exaone4ForCausalLM"], "layer_types": layer_types(cfg),
           "sliding_window": window}
    return reads_back(cfg, hf, config)


# The table, read both ways (OLMo 2's placement: no norm before a box, one after each; q/k norms per head).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *attention("layers.{i}.self_attn"),
    Row("block.attn.q_norm", "layers.{i}.self_attn.q_norm.weight", "dk", GAMMA),
    Row("block.attn.k_norm", "layers.{i}.self_attn.k_norm.weight", "dk", GAMMA),
    Row("block.attn_out_norm", "layers.{i}.post_attention_layernorm.weight", "d", GAMMA),
    Row("block.ffn_out_norm", "layers.{i}.post_feedforward_layernorm.weight", "d", GAMMA),
    *gated_ffn("layers.{i}.mlp"),
    Row("final_norm", "norm.weight", "d", GAMMA),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """EXAONE 4's config.json of a llama.cpp file: its window and layer_types from attention.sliding_window and
    attention.sliding_window_pattern (a true per sliding layer); neither: every layer full, each turned by RoPE (a
    window null, not Exaone4Config's 4096). One without the other is refused (llama.cpp would guess the other)."""
    window, pattern = meta.get(f"{a}.attention.sliding_window"), meta.get(f"{a}.attention.sliding_window_pattern")
    if window is None and pattern is None:
        return hf | {"sliding_window": None, "layer_types": ["full_attention"] * dims["L"]}
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0 or not isinstance(pattern, list) \
            or len(pattern) != dims["L"] or not all(isinstance(p, bool) for p in pattern):
        raise QkvError(f"the GGUF exaone4 model has attention.sliding_window {window!r:.20} and "
                       f"attention.sliding_window_pattern {pattern!r:.40}; it needs both: a positive window and one "
                       f"true or false per layer ({dims['L']}); the file is damaged")
    return hf | {"sliding_window": window,
                 "layer_types": ["sliding_attention" if p else "full_attention" for p in pattern]}


# llama.cpp's architecture (gguf_archs reads it by this table): OLMo 2's norm names after each box, q/k norms per
# head, no norm before a box.
GGUF = {
    "exaone4": Arch("exaone4", "Exaone4ForCausalLM",
                    {k: v for k, v in LLAMA_LAYER.items() if k not in ("attn_norm", "ffn_norm")} | QK_NORMS
                    | {"post_attention_norm": "post_attention_layernorm",
                       "post_ffw_norm": "post_feedforward_layernorm"},
                    LLAMA_TOP, keys=("attention.sliding_window", "attention.sliding_window_pattern"),
                    config=_gguf_config),
}

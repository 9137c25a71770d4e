"""OLMo 3 (AI2): OLMo 2's blocks — no norm before attention or the FFN, an RMSNorm after each box before it joins
the stream, q/k RMSNorm over the whole projections — with sliding-window layers.

    config.json knob        qkv knob                  what it does
    layer_types             layer_windows             a "sliding_attention" layer sees the last sliding_window keys
                                                      (default: three sliding layers, then a full one)
    sliding_window          sliding_window            the window (default 4096)
    rope_parameters         rope_theta, rope_scaling  the full layers' RoPE (rope_parameters["full_attention"])
                            local_rope_theta, …       the sliding layers' (rope_parameters["sliding_attention"])

RoPE's bases as Olmo3Config fills them in (default 500000): an older config.json's top-level rope_theta and
rope_scaling go to the full layers only; the sliding layers keep the default base.

llama.cpp writes OLMo 3 as arch olmo2 (its converter registers Olmo3ForCausalLM on Olmo2Model), so llama.cpp's olmo2
(OLMo 2 and 3) is read by this module's GGUF table: a file without attention.sliding_window is OLMo 2 (llama.py's
family), one with it is OLMo 3 (`gguf_config`): the window; the layers' kinds from
attention.sliding_window_pattern (a bool per layer, true: sliding; or a period p: layer i slides unless
i % p = p − 1; p = 4 without the key, llama.cpp's default); the full layers turned as the file's scaling says (plain,
linear, or YaRN: its factor s and original context, llama.cpp's fixed β 32 / 1, the ramp's ends floored and ceiled,
cos and sin × rope.scaling.attn_factor · (1 + 0.1·ln s), transformers' attention_factor); the sliding ones by plain
RoPE (freq_scale 1, no YaRN, attn_factor 1, as olmo2.cpp turns them) at rope.freq_base_swa, the sliding layers' base
the converter writes (rope_parameters["sliding_attention"]), else rope.freq_base. (llama.cpp's loader reads
freq_base_swa, but olmo2.cpp's graph turns the sliding layers at rope.freq_base: the same numbers whenever the two
bases are equal, as in every released OLMo 3, 500000 both.)

Its tensors, relative to Olmo3Model ("model."; the head is "lm_head"): ROWS below.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..core.positions import check_rope, yarn_mscale
from ..runtime.errors import QkvError
from . import llama
from .llama import GAMMA
from .common import check_config, layer_types, layer_windows, need, reads_back, rope_by_layer_type
from .table import (LLAMA_LAYER, LLAMA_TOP, QK_NORMS, About, Arch, Row, attention, both_ways, gated_ffn, gguf_positive,
                    gguf_rope_kind, gguf_sliding_layers, lm_head)

MODEL_TYPES = ("olmo3",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("olmo3",), models="OLMo 3",
          brings="OLMo 2's blocks with sliding and full layers (`layer_types`, default three sliding then one full; "
                 "`sliding_window`) and a RoPE per kind of layer (`rope_parameters` by layer type)",
          kind="decoder", refuses=("dla",)),
)

IGNORED = llama.IGNORED

THETA = 500_000.0                          # Olmo3Config.default_theta
KINDS = ("full_attention", "sliding_attention")


def _rope(hf: dict) -> tuple[float, dict | None, float, dict | None]:
    """(θ, rope_scaling) of the full layers and of the sliding ones, as Olmo3Config reads them: rope_parameters by
    layer type, else the top-level rope_theta / rope_scaling for the full layers and the default for the others."""
    params = hf.get("rope_parameters")
    if params is None:
        scaling = hf.get("rope_scaling")
        params = {"full_attention": {"rope_type": "default", **(scaling or {}),
                                     "rope_theta": hf.get("rope_theta", THETA)}}
    if not isinstance(params, dict) or set(params) - set(KINDS):
        raise QkvError(f"config.json rope_parameters = {params!r:.60} must be given by layer type (full_attention, "
                       "sliding_attention), as Olmo3Config writes it; restore the checkpoint's config.json")
    out: list = []
    for kind in KINDS:
        p = params.get(kind) or {}
        if not isinstance(p, dict):
            raise QkvError(f"config.json rope_parameters.{kind} = {p!r:.40} is not an object; "
                           "restore the checkpoint's config.json")
        check_config({"rope_parameters": p}, f"config.json ({kind})")        # its numbers' types
        theta, scaling = float(p.get("rope_theta", THETA)), (p if p.get("rope_type", "default") != "default" else None)
        check_rope(theta, scaling)              # a rope_type qkv lacks, θ ≤ 1: refused now, not at the first pass
        out += [theta, scaling]
    return tuple(out)


def config(hf: dict) -> ModelConfig:
    L = need(hf, "num_hidden_layers")
    default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(L)]
    window, windows = layer_windows(hf, hf.get("sliding_window", 4096), L, default)
    theta, scaling, local_theta, local_scaling = _rope(hf)
    plain = {k: v for k, v in hf.items() if k not in ("layer_types", "rope_parameters", "rope_scaling", "rope_theta",
                                                      "sliding_window")}
    base = llama.config(plain | {"model_type": "olmo2", "rms_norm_eps": hf.get("rms_norm_eps", 1e-5)})
    return base.with_(family="olmo3", sliding_window=window, layer_windows=windows, rope_theta=theta,
                      rope_scaling=scaling, local_rope_theta=local_theta, local_rope_scaling=local_scaling)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an Olmo3ForCausalLM with these knobs: OLMo 2's, with layer_types, the window and RoPE by
    layer type."""
    hf = llama.hf_dict(cfg.with_(family="olmo2", sliding_window=None, layer_windows=None, local_rope_theta=None,
                                 local_rope_scaling=None))
    for key in ("rope_theta", "rope_scaling"):
        hf.pop(key, None)
    windowed = any(cfg.window(i) is not None for i in range(cfg.n_layers))
    hf |= {"model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], "layer_types": layer_types(cfg),
           "sliding_window": cfg.sliding_window if windowed else 4096,
           "rope_parameters": rope_by_layer_type(cfg, cfg.local_rope_theta or THETA)}
    return reads_back(cfg, hf, config)


SWA_PERIOD = 4                             # llama.cpp's olmo2 without attention.sliding_window_pattern
YARN_BETAS = {"yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}     # llama.cpp's olmo2 reads neither: its defaults


def gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """The config.json of a llama.cpp olmo2 file: OLMo 2's as gguf_archs built it when the file has no
    attention.sliding_window, else OLMo 3's (the module docstring). What llama.cpp would compute otherwise is refused
    in one line: rope.scaling.attn_factor ≠ 1 without YaRN (it scales cos and sin), YaRN's β or yarn_attn_factor other
    than llama.cpp's (it reads neither)."""
    window = meta.get(f"{a}.attention.sliding_window")
    attn_factor = gguf_positive(meta, a, "rope.scaling.attn_factor", 1.0)
    if window is None:
        if attn_factor != 1.0:
            raise QkvError(f"the GGUF {a} model scales RoPE's cos and sin by rope.scaling.attn_factor = "
                           f"{attn_factor:g}, which no Hugging Face OLMo 2 computes; use a file without it")
        return hf
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise QkvError(f"the GGUF {a} model has attention.sliding_window {window!r:.20}; OLMo 3 needs a positive whole "
                       "number; the file is damaged")
    sliding = gguf_sliding_layers(meta, a, dims["L"], SWA_PERIOD)
    dims["rope_read"] = True                                         # both kinds' RoPE read here, not by gguf.py
    local = {"rope_type": "default", "rope_theta": gguf_positive(meta, a, "rope.freq_base_swa", dims["theta"])}
    hf = {k: v for k, v in hf.items() if k != "rope_theta"}
    return hf | {"model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], "sliding_window": window,
                 "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
                 "rope_parameters": {"full_attention": _gguf_full_rope(meta, a, dims["theta"], attn_factor),
                                     "sliding_attention": local}}


def _gguf_full_rope(meta: dict, a: str, theta: float, attn_factor: float) -> dict:
    """The full layers' rope_parameters as llama.cpp's olmo2 graph turns them: plain, linear (rope.scaling.factor),
    or YaRN, whose cos and sin it scales by attn_factor · (1 + 0.1·ln s) (its mscale, which ggml multiplies in)."""
    kind, factor = gguf_rope_kind(meta, a)
    if kind not in ("none", "linear", "yarn"):
        raise QkvError(f"GGUF RoPE scaling {kind!r:.40} is not supported for OLMo 3; qkv runs plain, linear and YaRN")
    if kind != "yarn" and attn_factor != 1.0:
        raise QkvError(f"the GGUF {a} model scales the full layers' cos and sin by rope.scaling.attn_factor = "
                       f"{attn_factor:g} without YaRN, which no Hugging Face OLMo 3 computes; use a file without it")
    if kind == "none":
        return {"rope_type": "default", "rope_theta": theta}
    s = gguf_positive(meta, a, "rope.scaling.factor", factor)
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": s}
    for key, value in YARN_BETAS.items():
        if meta.get(f"{a}.rope.scaling.{key}", value) != value:
            raise QkvError(f"the GGUF value {a}.rope.scaling.{key} = {meta[f'{a}.rope.scaling.{key}']!r:.20} is not "
                           f"llama.cpp's olmo2 {value:g}, which it runs whatever the file says; use a file with "
                           f"{value:g} or without the key")
    scale = attn_factor * yarn_mscale(s)                             # what cos and sin are multiplied by
    declared = meta.get(f"{a}.rope.scaling.yarn_attn_factor", scale)
    if not isinstance(declared, (int, float)) or abs(declared - scale) > 1e-6 * scale:
        raise QkvError(f"the GGUF value {a}.rope.scaling.yarn_attn_factor = {declared!r:.20} is not the "
                       f"{scale:.7g} llama.cpp's olmo2 scales cos and sin by (rope.scaling.attn_factor · "
                       "(1 + 0.1·ln factor)); it reads no other; use a file without it")
    original = gguf_positive(meta, a, "rope.scaling.original_context_length")
    return {"rope_type": "yarn", "rope_theta": theta, "factor": s, "original_max_position_embeddings": int(original),
            "attention_factor": scale, "beta_fast": 32.0, "beta_slow": 1.0}


# The table, read both ways (OLMo 2's: no norm before a box, one after each).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *attention("layers.{i}.self_attn", lambda cfg: cfg.qkv_bias, lambda cfg: cfg.out_bias),
    Row("block.attn.q_norm", "layers.{i}.self_attn.q_norm.weight", "q", GAMMA),
    Row("block.attn.k_norm", "layers.{i}.self_attn.k_norm.weight", "kv", GAMMA),
    Row("block.attn_out_norm", "layers.{i}.post_attention_layernorm.weight", "d", GAMMA),
    Row("block.ffn_out_norm", "layers.{i}.post_feedforward_layernorm.weight", "d", GAMMA),
    *gated_ffn("layers.{i}.mlp"),
    Row("final_norm", "norm.weight", "d", GAMMA),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


# llama.cpp's architecture (gguf_archs reads it by this table): OLMo 2's and OLMo 3's blocks (no norm before a box, one
# after each, q/k norms over the whole projection); with a window, OLMo 3's config (`gguf_config`).
GGUF = {
    "olmo2": Arch("olmo2", "Olmo2ForCausalLM",
                  {k: v for k, v in LLAMA_LAYER.items() if k not in ("attn_norm", "ffn_norm")} | QK_NORMS
                  | {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
                  LLAMA_TOP, also=("olmo3",), config=gguf_config,
                  keys=("attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa",
                        "rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast",
                        "rope.scaling.yarn_beta_slow")),
}

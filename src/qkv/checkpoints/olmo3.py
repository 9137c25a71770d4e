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

Its tensors, relative to Olmo3Model ("model."; the head is "lm_head"): ROWS below.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..core.positions import check_rope
from ..runtime.errors import QkvError
from . import llama
from .llama import GAMMA
from .common import check_config, layer_types, layer_windows, need, reads_back, rope_by_layer_type
from .table import About, Row, attention, both_ways, gated_ffn, lm_head

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

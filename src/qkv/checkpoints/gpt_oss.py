"""gpt-oss (OpenAI's open-weight MoE decoders, GptOssForCausalLM): Llama's pre-norm RMSNorm blocks with

  - attention sinks: each head's learned logit s_h joins the softmax with no value (cfg.attn_sinks,
    AttentionWeights.sinks), A = exp(S) / (Σ exp(S) + exp(s_h)): a head may attend to nothing;
  - q/k/v/o biases (attention_bias), GQA, layers sliding (sliding_window) and full in turn (layer_types), YaRN RoPE;
  - every FFN routed: logits = x·W_router + b_router, the num_experts_per_tok highest, their weights the softmax of
    those logits only (= the full softmax renormalised over them: cfg.norm_top_k), each expert a clamped SwiGLU
    with biases: g = min(x·W_gate + b_gate, c), u = clip(x·W_in + b_in, −c, c), h = g·σ(α·g) ⊙ (u + 1),
    out = h·W_out + b_out (cfg.glu_limit c = swiglu_limit, cfg.glu_alpha α = swiglu_alpha).

Its tensors: `ROWS` below, each checkpoint name (relative to the base model) beside ours and how it is stored, read
both ways (loading and saving):
    layers.{i}.self_attn.sinks                          attn.sinks (H,)
    layers.{i}.mlp.router.weight / .bias                ffn.W_router (E, d) → (d, E), ffn.b_router (E,)
    layers.{i}.mlp.experts.gate_up_proj (E, d, 2·f)     ffn.experts[e].W_gate = [e][:, 0::2], W_in = [e][:, 1::2]
    layers.{i}.mlp.experts.gate_up_proj_bias (E, 2·f)   b_gate = [e, 0::2], b_in = [e, 1::2] (gate, up interleaved)
    layers.{i}.mlp.experts.down_proj (E, f, d), _bias   W_out = [e] (as we multiply), b_out
OpenAI's released checkpoints hold their experts as MXFP4 blocks (…_blocks, …_scales, quantization_config mxfp4):
refused in one line; a dequantised checkpoint (transformers' Mxfp4Config(dequantize=True), then save_pretrained) runs.

Knobs transformers reads that change no number qkv computes: hidden_act (GptOssExperts never reads it: the gate is
always g·σ(α·g)), attention_dropout (training mode only), router_aux_loss_coef and output_router_logits (the
load-balancing loss of transformers' training; qkv trains on the cross-entropy alone, as mixtral's, moe.py),
initializer_range, use_cache.

llama.cpp's `gpt-oss` files (GGUF): the experts as three stacks, gate and up de-interleaved and each (E, out, in)
(ffn_gate_exps, ffn_up_exps, ffn_down_exps, with their biases; MXFP4 blocks read as gguf dequantises them), the sinks as
attn_sinks, the router as ffn_gate_inp; every other layer sliding from layer 0 (llama.cpp's pattern) with the file's
sliding_window; the clamp fixed at llama.cpp's limit 7 and α 1.702; YaRN as llama.cpp turns it (its ramp's ends
floored and ceiled: truncate true).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.config import ModelConfig
from ..core.positions import check_rope
from ..core.weights import FFNWeights, MoEWeights
from ..runtime.errors import QkvError
from .common import (ROTARY_BUFFERS, check_shapes, decoder_sizes, layer_types, layer_windows, reads_back,
                     rope_parameters, special_ids)
from .table import (LLAMA_TOP, About, Arch, How, Row, attention, both_ways, gguf_positive, layer_norm, lm_head,
                    out_bias, qkv_bias)

MODEL_TYPES = ("gpt_oss",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("gpt_oss",), models="gpt-oss (OpenAI)",
          brings="attention sinks (each head's learned logit in the softmax, with no value: rows of A sum to less "
                 "than 1, the sink's share drawn as the views' last column), sliding and full layers in turn "
                 "(`layer_types`), YaRN, q/k/v/o biases, and every FFN routed: a router with a bias, the softmax of "
                 "the top-k logits, clamped SwiGLU experts with biases (`swiglu_limit`, `swiglu_alpha`)",
          kind="MoE decoder"),
)

IGNORED = ROTARY_BUFFERS

# GptOssConfig's defaults, which a config.json without the key gets (transformers 5.25).
DEFAULTS = {"num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
            "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
            "sliding_window": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "attention_bias": True,
            "tie_word_embeddings": False}
DEFAULT_THETA = 150000.0
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def _get(hf: dict, key: str):
    """config.json's KEY, or GptOssConfig's default."""
    return hf.get(key, DEFAULTS[key])


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and the scaling: transformers 5's rope_parameters (or the older rope_theta / rope_scaling), and
    GptOssConfig's YaRN (factor 32 over 4096 positions) when config.json has neither."""
    params = hf.get("rope_parameters")
    if params is None and hf.get("rope_scaling") is None:
        params = DEFAULT_ROPE
    params = params or {}
    theta = hf.get("rope_theta", params.get("rope_theta", DEFAULT_THETA))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if scaling is not None:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise QkvError("gpt_oss with partial rotary embeddings is not supported; use a checkpoint with full RoPE")
    return float(theta), scaling


def _number(hf: dict, key: str, positive: bool) -> float:
    """A float knob of config.json (GptOssConfig's default when absent): finite, and > 0 where POSITIVE."""
    v = _get(hf, key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise QkvError(f"config.json {key} = {v!r:.30} is not a {'positive ' if positive else ''}finite number; "
                       "restore the checkpoint's config.json")
    return float(v)


def config(hf: dict) -> ModelConfig:
    if hf.get("quantization_config") is not None or hf.get("quantization") is not None:
        method = (hf.get("quantization_config") or {}).get("quant_method", "quantised") \
            if isinstance(hf.get("quantization_config"), dict) else "quantised"
        raise QkvError(f"gpt_oss with {method} experts (quantization_config) is not supported; load it in transformers "
                       "with Mxfp4Config(dequantize=True), save_pretrained it, and open that copy")
    d, H, L = _get(hf, "hidden_size"), _get(hf, "num_attention_heads"), _get(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    check_rope(theta, scaling)
    window, windows = layer_windows(hf, _get(hf, "sliding_window"), L,
                                    ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)])
    E = hf.get("num_local_experts", hf.get("num_experts", DEFAULTS["num_local_experts"]))
    k = _get(hf, "num_experts_per_tok")
    if not E or k > E:
        raise QkvError(f"config.json num_experts_per_tok {k} must be from 1 to the {E} experts (num_local_experts); "
                       "restore the checkpoint's config.json")
    bias = _get(hf, "attention_bias")
    return ModelConfig(
        family="gpt_oss", vocab_size=_get(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=_get(hf, "num_key_value_heads"), d_head=hf.get("head_dim") or DEFAULTS["head_dim"],
        d_ff=_get(hf, "intermediate_size"), max_positions=_get(hf, "max_position_embeddings"),
        causal=True, norm="rms", norm_place="pre", norm_eps=_number(hf, "rms_norm_eps", True),
        position="rope", rope_theta=theta, rope_scaling=scaling, sliding_window=window, layer_windows=windows,
        activation="silu", gated_ffn=True, glu_limit=_number(hf, "swiglu_limit", True),
        glu_alpha=_number(hf, "swiglu_alpha", False), attn_sinks=True,
        qkv_bias=bool(bias), out_bias=bool(bias), ffn_bias=True,
        tied_embeddings=bool(_get(hf, "tie_word_embeddings")), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=True,                                      # nn.Embedding's padding_idx
        n_experts=E, experts_per_token=k, norm_top_k=True,
    )


class Experts(How):
    """A layer's routed FFN under layers.{i}.mlp: the router (weight (E, d), bias (E,)) and the E experts stored
    fused, gate and up interleaved along the last axis (gate_up_proj (E, d, 2·f), column 2j gate j, 2j + 1 up j),
    down_proj (E, f, d) as we multiply, each with its bias: one MoEWeights whose experts are views."""

    def read(self, store, name, shape, dtype, cfg):
        d, E, f = cfg.d_model, cfg.n_experts, cfg.d_ff
        p = f"{name}.mlp"
        gate_up = store.get(f"{p}.experts.gate_up_proj", (E, d, 2 * f), dtype)          # (E, d, 2·f)
        gate_up_b = store.get(f"{p}.experts.gate_up_proj_bias", (E, 2 * f), dtype)      # (E, 2·f)
        down = store.get(f"{p}.experts.down_proj", (E, f, d), dtype)                    # (E, f, d)
        down_b = store.get(f"{p}.experts.down_proj_bias", (E, d), dtype)                # (E, d)
        experts = [FFNWeights(W_gate=gate_up[e][:, 0::2], W_in=gate_up[e][:, 1::2], W_out=down[e],
                              b_gate=gate_up_b[e, 0::2], b_in=gate_up_b[e, 1::2], b_out=down_b[e]) for e in range(E)]
        return MoEWeights(W_router=store.get(f"{p}.router.weight", (E, d), dtype).T,     # (d, E)
                          b_router=store.get(f"{p}.router.bias", (E,), dtype), experts=experts)

    def write_all(self, name, value, cfg):
        p = f"{name}.mlp"
        gate_up = np.stack([np.stack([x.W_gate, x.W_in], axis=-1).reshape(x.W_in.shape[0], -1)
                            for x in value.experts])                                    # (E, d, 2·f) interleaved
        gate_up_b = np.stack([np.stack([x.b_gate, x.b_in], axis=-1).reshape(-1) for x in value.experts])   # (E, 2·f)
        return {f"{p}.router.weight": value.W_router.T, f"{p}.router.bias": value.b_router,
                f"{p}.experts.gate_up_proj": gate_up, f"{p}.experts.gate_up_proj_bias": gate_up_b,
                f"{p}.experts.down_proj": np.stack([x.W_out for x in value.experts]),
                f"{p}.experts.down_proj_bias": np.stack([x.b_out for x in value.experts])}


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    Row("block.attn.sinks", "layers.{i}.self_attn.sinks", "H"),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row("block.ffn", "layers.{i}", "d", Experts()),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GptOssForCausalLM with these knobs, once it reads back as CFG."""
    if cfg.family != "gpt_oss":
        raise QkvError(f"family {cfg.family!r} is not gpt_oss; use its own module")
    windowed = any(cfg.window(i) is not None for i in range(cfg.n_layers))
    if windowed and cfg.sliding_window is None:
        raise QkvError("a gpt_oss config.json has one sliding_window for its sliding layers; give sliding_window")
    hf = {
        "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
        **decoder_sizes(cfg), "rms_norm_eps": cfg.norm_eps,
        "hidden_act": "silu", "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tied_embeddings,
        "attention_bias": cfg.qkv_bias, "attention_dropout": 0.0, "layer_types": layer_types(cfg),
        "sliding_window": cfg.sliding_window if windowed else DEFAULTS["sliding_window"],   # unread when no layer
                                                   # slides, but transformers builds the sliding mask whatever
        "num_local_experts": cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token,
        "swiglu_alpha": cfg.glu_alpha, "swiglu_limit": cfg.glu_limit, "output_router_logits": False,
        "router_aux_loss_coef": 0.0,
        **special_ids(cfg),
    }
    return reads_back(cfg, hf, config)


LLAMA_CPP_GLU = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}        # llama.cpp's gpt-oss graph: fixed, not in the file


def _gguf_rope(meta: dict, a: str, theta: float) -> dict:
    """rope_parameters from a gpt-oss file's RoPE keys: none (plain), or YaRN by its factor and original context, beta
    fast / slow 32 / 1 unless the file says, truncated as llama.cpp's corr_dims floor and ceil them."""
    kind = meta.get(f"{a}.rope.scaling.type", "none")
    if kind == "none":
        return {"rope_type": "default", "rope_theta": theta}
    if kind != "yarn":
        raise QkvError(f"GGUF RoPE scaling {kind!r:.40} is not supported for gpt-oss; qkv runs plain RoPE and YaRN")
    return {"rope_type": "yarn", "rope_theta": theta, "factor": gguf_positive(meta, a, "rope.scaling.factor"),
            "original_max_position_embeddings": int(gguf_positive(meta, a, "rope.scaling.original_context_length")),
            "beta_fast": gguf_positive(meta, a, "rope.scaling.yarn_beta_fast", 32.0),
            "beta_slow": gguf_positive(meta, a, "rope.scaling.yarn_beta_slow", 1.0), "truncate": True}


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """gpt-oss's config.json of a llama.cpp file (and its tensors' shapes, dims' part_shapes: the sinks, the experts
    with their biases): its window over every other layer, YaRN (dims' rope_read: read here), llama.cpp's clamp."""
    window = meta.get(f"{a}.attention.sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise QkvError(f"the GGUF gpt-oss model has attention.sliding_window {window!r:.20}; it needs a positive whole "
                       "number (llama.cpp slides every other layer by it); the file is damaged")
    H, d, E, f = dims["H"], dims["d"], dims["E"], dims["f_expert"]
    dims["rope_read"] = True
    dims["part_shapes"] = {"attn_sinks": (H,), "ffn_gate_exps": {"weight": (E, f, d), "bias": (E, f)},
                           "ffn_up_exps": {"weight": (E, f, d), "bias": (E, f)},
                           "ffn_down_exps": {"weight": (E, d, f), "bias": (E, d)}}
    L = dims["L"]
    return hf | LLAMA_CPP_GLU | {
        "rope_parameters": _gguf_rope(meta, a, dims["theta"]), "sliding_window": window,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
        "intermediate_size": f, "num_local_experts": E, "num_experts_per_tok": dims["k"], "attention_bias": True}


# llama.cpp's architecture (gguf_archs reads it by this table; its experts' fused tensors: gguf_archs._gpt_oss_experts).
GGUF = {
    "gpt-oss": Arch("gpt_oss", "GptOssForCausalLM",
                    {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                     "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_sinks": "self_attn.sinks",
                     "post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router"},
                    LLAMA_TOP, biases="all",
                    keys=("attention.sliding_window", "expert_feed_forward_length", "rope.scaling.yarn_beta_fast",
                          "rope.scaling.yarn_beta_slow"),
                    experts={"ffn_gate_exps": "mlp.experts.gate_up_proj", "ffn_up_exps": "mlp.experts.gate_up_proj",
                             "ffn_down_exps": "mlp.experts.down_proj"}, config=_gguf_config),
}

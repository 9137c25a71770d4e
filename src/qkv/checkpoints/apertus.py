"""Apertus (Swiss AI): Llama's pre-norm blocks with q/k RMSNorm per head (before RoPE) and a plain FFN (up_proj,
down_proj, no gate) whose activation is xIELU, with learned scalars of its own in every layer.

    config.json knob        qkv knob                     what it does
    hidden_act ("xielu")    activation "xielu"           FFN(x) = xIELU(x·W_in)·W_out, xIELU's a_p, a_n, β, ε
                                                         read from each layer's mlp.act_fn (FFNWeights.xielu;
                                                         core.ops.xielu);
                                                         another name: that activation, ungated
    (always)                qk_norm "head"               q_norm / k_norm: each head's q and k normalised before RoPE
    rope_parameters         rope_theta, rope_scaling     default (none given): llama3, θ 1.2e7, factor 8 from 8192,
                                                         low / high frequency factors 1 and 4 (ApertusConfig's)
    attention_bias          qkv_bias, out_bias           biases of q/k/v_proj and o_proj (one switch)
    rms_norm_eps (1e-5), max_position_embeddings (65536), pad / bos / eos ids (3, 1, 2), untied: ApertusConfig's
    defaults; mlp_bias: not read (ApertusMLP has no biases)

Its tensors, relative to ApertusModel ("model."; the head is "lm_head"): ROWS below. xIELU's β and ε are buffers of
the checkpoint (read, written back, never trained: their gradient is none, as torch's). llama.cpp's `apertus` files
(GGUF, `GGUF` below): the tensors as stored (rotate-half RoPE in both), xIELU's four numbers of every layer as metadata
arrays (xielu.alpha_p, xielu.alpha_n, xielu.beta, xielu.eps: the checkpoint's raw values, softplus taken by both), a
llama3 RoPE as rope_freqs (read as its table of factors: gguf.rope_freqs); no biases (llama.cpp's apertus has none).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import llama
from .common import activation, reads_back
from .llama import GAMMA
from .table import (LLAMA_LAYER, LLAMA_TOP, QK_NORMS, About, Arch, Row, attention, both_ways, linear, lm_head,
                    out_bias, qkv_bias)

MODEL_TYPES = ("apertus",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("apertus",), models="Apertus",
          brings="a plain FFN of xIELU with learned scalars in every layer (`hidden_act` xielu: a_p, a_n trained, "
                 "β, ε stored), q/k norms per head, llama3 RoPE by default",
          kind="decoder"),
)

IGNORED = llama.IGNORED

DEFAULTS = {"hidden_act": "xielu", "rms_norm_eps": 1e-5, "max_position_embeddings": 65536, "pad_token_id": 3,
            "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}        # ApertusConfig's own
ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0}                             # its rope_parameters' default


def _xielu(cfg: ModelConfig) -> bool:
    return cfg.activation == "xielu"


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    if not any(k in hf for k in ("rope_parameters", "rope_scaling", "rope_theta")):
        hf = hf | {"rope_parameters": ROPE}
    act = "xielu" if hf["hidden_act"] == "xielu" else activation(hf["hidden_act"])
    bias = bool(hf.get("attention_bias", False))
    base = llama.config({k: v for k, v in hf.items() if k not in ("hidden_act", "attention_bias", "mlp_bias")}
                        | {"model_type": "llama"})
    return base.with_(family="apertus", activation=act, gated_ffn=False, ffn_bias=False, qk_norm="head",
                      qkv_bias=bias, out_bias=bias)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an ApertusForCausalLM with these knobs: Llama's, the plain FFN's activation, one bias
    switch."""
    hf = llama.hf_dict(cfg.with_(family="llama", activation="silu", gated_ffn=True, qk_norm=None))
    hf.pop("mlp_bias", None)
    hf |= {"model_type": "apertus", "architectures": ["ApertusForCausalLM"], "attention_bias": cfg.qkv_bias,
           "hidden_act": "xielu" if _xielu(cfg) else llama.HF_ACTIVATIONS[cfg.activation]}
    return reads_back(cfg, hf, config)


# The table, read both ways (Llama's with other norm names, a plain FFN and its activation's scalars).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    Row("block.attn_norm", "layers.{i}.attention_layernorm.weight", "d", GAMMA),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    Row("block.attn.q_norm", "layers.{i}.self_attn.q_norm.weight", "dk", GAMMA),
    Row("block.attn.k_norm", "layers.{i}.self_attn.k_norm.weight", "dk", GAMMA),
    Row("block.ffn_norm", "layers.{i}.feedforward_layernorm.weight", "d", GAMMA),
    *linear("block.ffn.W_in", "layers.{i}.mlp.up_proj", "d f"),
    *linear("block.ffn.W_out", "layers.{i}.mlp.down_proj", "f d"),
    *[Row(f"block.ffn.xielu.{name}", f"layers.{{i}}.mlp.act_fn.{name}", shape, when=_xielu)
      for name, shape in (("alpha_p", "1"), ("alpha_n", "1"), ("beta", ""), ("eps", ""))],
    Row("final_norm", "norm.weight", "d", GAMMA),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


# ── llama.cpp's `apertus` (GGUF) ──────────────────────────────────────────────────────────────────────────────────

XIELU = {"alpha_p": (1,), "alpha_n": (1,), "beta": (), "eps": ()}      # act_fn's numbers and their checkpoint shapes


def _xielu_numbers(meta: dict, name: str, L: int) -> list[float]:
    """The metadata array xielu.NAME: one finite number per layer (a single number: every layer's, as llama.cpp's
    get_key_or_arr reads it), else one error."""
    value = meta.get(f"xielu.{name}")
    values = [value] * L if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(values, list) or len(values) != L or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise QkvError(f"the GGUF apertus model's xielu.{name} = {value!r:.40} is not one finite number for each of "
                       f"its {L} layers (xIELU's {name}, which its converter writes); the file is damaged")
    return [float(v) for v in values]


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Apertus's config.json of a llama.cpp file (Llama's, xIELU, no biases), and xIELU's numbers of every layer
    (the metadata arrays) kept in the sizes for the plans (`_gguf_plan`)."""
    dims["xielu"] = {name: _xielu_numbers(meta, name, dims["L"]) for name in XIELU}
    return hf | {"attention_bias": False}


def _gguf_plan(part: str, name: str, prefix: str, shape: tuple, dims: dict) -> list | None:
    """ffn_norm's plan with xIELU's four numbers of its layer beside it (mlp.act_fn.*, made from the metadata: llama.cpp
    keeps them there, the checkpoint as tensors); every other tensor the common plan."""
    if part != "ffn_norm":
        return None
    i = int(name.split(".")[1])
    numbers = [(f"{prefix}mlp.act_fn.{key}", size, lambda w, v=dims["xielu"][key][i], size=size:
                np.full(size, v, dtype=np.float32)) for key, size in XIELU.items()]
    return [(f"{prefix}{GGUF['apertus'].layer[part]}.weight", shape, lambda w: w), *numbers]


# llama.cpp's architecture (gguf_archs reads it by this table): Llama's names, the norms Apertus's, q/k norms per
# head, an FFN of up and down only; rope_freqs its llama3 RoPE.
GGUF = {
    "apertus": Arch("apertus", "ApertusForCausalLM",
                    {k: v for k, v in LLAMA_LAYER.items() if k != "ffn_gate"} | QK_NORMS
                    | {"attn_norm": "attention_layernorm", "ffn_norm": "feedforward_layernorm"},
                    LLAMA_TOP | {"rope_freqs": "rope_parameters"}, activation="xielu", config=_gguf_config,
                    plan=_gguf_plan),
}

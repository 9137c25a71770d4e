"""Falcon-H1 (TII, FalconH1ForCausalLM: Falcon-H1-0.5B … 34B): in every layer attention and a Mamba-2 mixer side by
side on one norm's output, then a SwiGLU FFN, with µP multipliers on almost every product (core/mamba2.py's
`parallel_layer`).

    config.json knob            qkv knob                    what it does
    mamba_n_heads (128),        mamba.n_heads, head_dim     the Mamba-2 heads and their width ("auto": E / heads)
      mamba_d_head ("auto")
    mamba_d_ssm (1024)          mamba.d_inner               E, the mixer's channels (null: mamba_expand · hidden_size)
    mamba_n_groups (1)          mamba.n_groups              groups of B and C; the output norm's groups
    mamba_d_state (256)         mamba.d_state               N, the scan's state
    mamba_d_conv (4)            mamba.conv_kernel           the conv's taps over [x | B | C]
    mamba_conv_bias (true)      mamba.conv_bias
    mamba_proj_bias (false)     mamba.bias                  in_proj's bias
    projectors_bias (false)     mamba.out_bias              out_proj's bias
    mamba_rms_norm (false),     mamba.norm                  the output: y ⊙ SiLU(z) (false), GroupRMSNorm(y) ⊙ SiLU(z)
      mamba_norm_before_gate                                (norm before the gate), GroupRMSNorm(y ⊙ SiLU(z)) (after)
      (true)
    mamba_chunk_size (256)      mamba.chunk_size            transformers' chunks of the scan: the same numbers
    time_step_limit             mamba.dt_min, dt_max        Δ clamped to [low, high] ((0, ∞): no clamp)
    ssm_in_multiplier           mamba.in_scale              the mixer reads h × m
    ssm_multipliers (5)         mamba.mup                   in_proj's [z | x | B | C | δ] × m each (its µP vector)
    ssm_out_multiplier          mamba.beside.ssm_out        the mixer's output × m
    attention_in_multiplier     mamba.beside.attn_in        attention reads h × m
    attention_out_multiplier    mamba.beside.attn_out       attention's output × m
    key_multiplier              attn_scale                  K × m, so S = Q·Kᵀ·m/√d_k (the scores' one factor)
    mlp_multipliers (2)         ffn_gate_scale,             act((x·W_gate)·m₀) ⊙ (x·W_in), its output × m₁
                                mamba.beside.ffn_out
    embedding_multiplier        embedding_multiplier        X = E[ids]·m
    lm_head_multiplier          logit_scale                 logits = H·W_vocab·m
    attention_bias, mlp_bias    qkv_bias, out_bias, ffn_bias   the attention's and the FFN's biases
    rope_parameters             rope_theta, rope_scaling    RoPE in the attention (always)
    num_key_value_heads, head_dim (hidden / heads), hidden_act (the FFN's and the conv's), rms_norm_eps (every
    RMSNorm's, the mixer's too), max_position_embeddings, tie_word_embeddings, pad / bos / eos ids: as Llama's.
    initializer_range: a fresh model's; attention_dropout: training's; use_cache, num_logits_to_keep: how
    transformers writes.

The trace holds each layer's softmax attention (its "attentions", "heads": the attention box's); the mixer beside it
adds to attn_out (the sum of both boxes), and the attention its heads imply is `core.mamba2.implied_attention` of its
parts (checked against the scan in tests/test_family_falcon_h1.py), not a trace entry: a layer has one "attentions".
Its tensors, relative to FalconH1Model ("model."; the head "lm_head"): `ROWS` below, and each layer's mixer under
layers.{i}.mamba.* (checkpoints/mamba2.py's `mixer_weights`), read and written beside the table. llama.cpp's
`falcon-h1` files (GGUF, `GGUF` below) hold the µP multipliers folded into the weights (the converter multiplies each
product's matrix by its multiplier, in_proj's rows by the five of ssm_multipliers): read as the same model with every
multiplier 1, which computes the same numbers (each multiplier scales a product of a matrix without a bias); its gated
norm after the gate (llama.cpp's), present or not as the file says; no biases but the conv's.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

from ..core.config import ModelConfig
from ..core.mamba2 import Beside, Mamba2, Mamba2BlockWeights
from ..core.weights import Weights
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, need, reads_back, special_ids
from .granitemoehybrid import _flag, _positive, _whole
from .llama import _rope
from .mamba import _dense
from .mamba2 import INFINITY, _limit, gguf_mixer, mixer_tensors, mixer_weights
from .table import (About, Arch, Row, attention, ffn_bias, gated_ffn, layer_norm, lm_head, out_bias, qkv_bias,
                    read_table, write_table)

MODEL_TYPES = ("falcon_h1",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("falcon_h1",), models="Falcon-H1 (tiiuae/Falcon-H1-0.5B … 34B)",
          brings="attention and a Mamba-2 mixer side by side in every layer, then a SwiGLU FFN, with µP multipliers on "
                 "the embeddings, attention's input, keys and output, the mixer's input, its five projections and "
                 "output, the FFN's gate and output, the logits; the trace holds the softmax weights, the cache K, V "
                 "beside the conv and scan states",
          kind="decoder", refuses=("attribute", "dla", "gradients")),
)

IGNORED: dict[str, str] = {}          # every tensor of a FalconH1ForCausalLM checkpoint is read
DEFAULTS = {"intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "max_position_embeddings": 8192, "tie_word_embeddings": False, "mamba_d_ssm": 1024, "mamba_n_heads": 128,
            "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
            "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
            "mamba_norm_before_gate": True, "mamba_rms_norm": False, "projectors_bias": False,
            "lm_head_multiplier": 1.0, "embedding_multiplier": 1.0, "mlp_multipliers": [1.0, 1.0],
            "key_multiplier": 1.0, "attention_out_multiplier": 1.0, "attention_in_multiplier": 1.0,
            "ssm_multipliers": [1.0] * 5, "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0,
            "attention_bias": False, "mlp_bias": False}                       # FalconH1Config's own


def _multipliers(hf: dict, key: str, count: int) -> tuple[float, ...]:
    """config.json's KEY, a list of COUNT positive numbers (mlp_multipliers, ssm_multipliers), else one error."""
    value = hf[key]
    if not (isinstance(value, list) and len(value) == count and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in value)):
        raise QkvError(f"config.json {key} = {value!r:.40} is not a list of {count} positive numbers; restore the "
                       "checkpoint's config.json")
    return tuple(float(v) for v in value)


def _mamba(hf: dict, d: int) -> Mamba2:
    """The mixers' sizes and multipliers (FalconH1Mixer's), and the layer's (`Beside`)."""
    E = _whole(hf, "mamba_d_ssm") if hf["mamba_d_ssm"] is not None else _whole(hf, "mamba_expand") * d
    H = _whole(hf, "mamba_n_heads")
    P = E // H if hf["mamba_d_head"] == "auto" else _whole(hf, "mamba_d_head")
    if H * P != E:
        raise QkvError(f"config.json mamba_n_heads {H} · mamba_d_head {hf['mamba_d_head']} must be the mixer's {E} "
                       "channels (mamba_d_ssm, or mamba_expand · hidden_size), as transformers requires; restore the "
                       "checkpoint's config.json")
    low, high = _limit(hf)
    norm = ("then_gate" if _flag(hf, "mamba_norm_before_gate") else "gated") if _flag(hf, "mamba_rms_norm") else "none"
    gate, down = _multipliers(hf, "mlp_multipliers", 2)
    beside = Beside(attn_in=_positive(hf, "attention_in_multiplier"), attn_out=_positive(hf, "attention_out_multiplier"),
                    ssm_out=_positive(hf, "ssm_out_multiplier"), ffn_out=down)
    return Mamba2(n_heads=H, head_dim=P, d_state=_whole(hf, "mamba_d_state"), n_groups=_whole(hf, "mamba_n_groups"),
                  conv_kernel=_whole(hf, "mamba_d_conv"), conv_bias=_flag(hf, "mamba_conv_bias"),
                  bias=_flag(hf, "mamba_proj_bias"), out_bias=_flag(hf, "projectors_bias"), dt_min=low, dt_max=high,
                  chunk_size=_whole(hf, "mamba_chunk_size"), in_scale=_positive(hf, "ssm_in_multiplier"),
                  mup=_multipliers(hf, "ssm_multipliers", 5), norm=norm, beside=beside)


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | {k: v for k, v in hf.items() if v is not None or k == "mamba_d_ssm"}
    d, H, L = need(hf, "hidden_size"), _whole(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    d_head = hf.get("head_dim") or d // H
    theta, scaling = _rope(hf)
    return ModelConfig(
        family="falcon_h1", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=hf["num_key_value_heads"] or H, d_head=d_head, d_ff=_whole(hf, "intermediate_size"),
        max_positions=_whole(hf, "max_position_embeddings"), causal=True, norm="rms", norm_place="pre",
        norm_eps=hf["rms_norm_eps"], position="rope", rope_theta=theta, rope_scaling=scaling,
        activation=activation(hf["hidden_act"]), gated_ffn=True, qkv_bias=_flag(hf, "attention_bias"),
        out_bias=hf["attention_bias"], ffn_bias=_flag(hf, "mlp_bias"),
        tied_embeddings=_flag(hf, "tie_word_embeddings"), final_norm=True, lm_head=True,
        pad_token_id=hf["pad_token_id"], bos_token_id=hf["bos_token_id"], eos_token_id=hf["eos_token_id"],
        pad_embedding_frozen=hf["pad_token_id"] is not None,                  # nn.Embedding's padding_idx
        embedding_multiplier=_positive(hf, "embedding_multiplier"), logit_scale=_positive(hf, "lm_head_multiplier"),
        attn_scale=_positive(hf, "key_multiplier") / math.sqrt(d_head),
        ffn_gate_scale=_multipliers(hf, "mlp_multipliers", 2)[0], layer_kinds=("attention",) * L,
        mamba=_mamba(hf, d))


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a FalconH1ForCausalLM with these knobs (refused: what its config cannot say)."""
    m = cfg.mamba
    if not isinstance(m, Mamba2) or m.beside is None or cfg.position != "rope":
        raise QkvError("a falcon_h1 config.json holds attention and a Mamba-2 mixer side by side in every layer, with "
                       "RoPE; change the knobs or the family")
    b = m.beside
    hf = {"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
          "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head, "intermediate_size": cfg.d_ff,
          "max_position_embeddings": cfg.max_positions, "hidden_act": HF_ACTIVATIONS[cfg.activation],
          "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tied_embeddings, "attention_bias": cfg.qkv_bias,
          "mlp_bias": cfg.ffn_bias, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                                                        **(cfg.rope_scaling or {})},
          "mamba_d_ssm": m.d_inner, "mamba_n_heads": m.n_heads, "mamba_d_head": m.head_dim,
          "mamba_n_groups": m.n_groups, "mamba_d_state": m.d_state, "mamba_d_conv": m.conv_kernel,
          "mamba_chunk_size": m.chunk_size, "mamba_conv_bias": m.conv_bias, "mamba_proj_bias": m.bias,
          "projectors_bias": m.bias if m.out_bias is None else m.out_bias, "mamba_rms_norm": m.norm != "none",
          "mamba_norm_before_gate": m.norm != "gated", "time_step_limit": [m.dt_min, INFINITY if m.dt_max == math.inf
                                                                          else m.dt_max],
          "ssm_in_multiplier": m.in_scale, "ssm_multipliers": list(m.mup), "ssm_out_multiplier": b.ssm_out,
          "attention_in_multiplier": b.attn_in, "attention_out_multiplier": b.attn_out,
          "key_multiplier": cfg.attn_scale * math.sqrt(cfg.d_head), "mlp_multipliers": [cfg.ffn_gate_scale, b.ffn_out],
          "embedding_multiplier": cfg.embedding_multiplier, "lm_head_multiplier": cfg.logit_scale, **special_ids(cfg)}
    return reads_back(cfg, hf, config)


# The table, read both ways: Llama's norms under Falcon-H1's names, attention and the SwiGLU FFN in every layer. Each
# layer's mixer: checkpoints/mamba2.py's, beside it.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias=qkv_bias, out_bias=out_bias),
    *layer_norm("block.ffn_norm", "layers.{i}.pre_ff_layernorm", bias=False),
    *gated_ffn("layers.{i}.feed_forward"),
    *[Row(f"block.ffn.{b}", f"layers.{{i}}.feed_forward.{proj}.bias", size, when=ffn_bias)       # mlp_bias
      for b, proj, size in (("b_gate", "gate_proj", "f"), ("b_in", "up_proj", "f"), ("b_out", "down_proj", "d"))],
    *layer_norm("final_norm", "final_layernorm", bias=False),
    lm_head(),
]


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of a FalconH1ForCausalLM checkpoint: the table's (ROWS), each block a Mamba2BlockWeights holding
    its mixer (checkpoints/mamba2.py's `mixer_weights`)."""
    w = read_table(ROWS, store, cfg, dtype)

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return _dense(store.get(name, shape, dtype), dtype)

    w.blocks = [Mamba2BlockWeights(**{f.name: getattr(b, f.name) for f in fields(b)},
                                   mixer=mixer_weights(get, f"layers.{i}.mamba.", cfg.mamba, cfg.d_model))
                for i, b in enumerate(w.blocks)]
    return w


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under FalconH1ForCausalLM's names, as its file stores them; new arrays."""
    t = write_table(ROWS, weights, cfg, "model.")
    for i, b in enumerate(weights.blocks):
        t |= c_arrays(mixer_tensors(b.mixer, f"model.layers.{i}.mamba."))
    return t


# ── llama.cpp's `falcon-h1` (GGUF) ────────────────────────────────────────────────────────────────────────────────

def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Falcon-H1's config.json of a llama.cpp file: attention and the Mamba-2 mixer in every layer, the mixer as
    mamba2's file has it (heads as ssm.time_step_rank, groups as ssm.group_count), RoPE by rope.freq_base; the µP
    multipliers all 1 (the file's weights hold them, folded: the same numbers); the gated norm after the gate, as
    llama.cpp's mixer computes it (whether there is one, `_gguf_norm`). Refused: Mamba heads that do not divide the
    mixer's channels."""
    d, E, N, k, H = dims["d"], dims["d_inner"], dims["d_state"], dims["d_conv"], dims["dt_rank"]
    G = gguf_mixer(meta, a, dims)
    return {"hidden_size": d, "num_hidden_layers": dims["L"], "num_attention_heads": dims["H"],
            "num_key_value_heads": dims["Hkv"], "head_dim": dims["d_head"], "intermediate_size": dims["f"],
            "max_position_embeddings": dims["n_ctx"], "rms_norm_eps": dims["eps"], "hidden_act": "silu",
            "rope_parameters": {"rope_type": "default", "rope_theta": dims["theta"]},
            "mamba_d_ssm": E, "mamba_n_heads": H, "mamba_d_head": E // H, "mamba_n_groups": G, "mamba_d_state": N,
            "mamba_d_conv": k, "mamba_conv_bias": True, "mamba_proj_bias": False, "projectors_bias": False,
            "mamba_norm_before_gate": False, "time_step_limit": [0.0, INFINITY], "attention_bias": False,
            "mlp_bias": False}


def _gguf_norm(hf: dict, dims: dict, chosen: dict) -> None:
    """Whether the mixers hold the gated norm (mamba_rms_norm): as the file's ssm_norm tensors say."""
    hf["mamba_rms_norm"] = chosen["ssm_norm"]
    if not chosen["ssm_norm"]:
        dims["part_shapes"]["ssm_norm"] = None


# llama.cpp's architecture (gguf_archs reads it by this table; the mixer's changed tensors: gguf_archs._ssm2).
GGUF = {
    "falcon-h1": Arch("falcon_h1", "FalconH1ForCausalLM",
                      {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                       "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ssm_in": "mamba.in_proj",
                       "ssm_conv1d": "mamba.conv1d", "ssm_dt": "mamba.dt_bias", "ssm_a": "mamba.A_log",
                       "ssm_d": "mamba.D", "ssm_norm": "mamba.norm", "ssm_out": "mamba.out_proj",
                       "ffn_norm": "pre_ff_layernorm", "ffn_gate": "feed_forward.gate_proj",
                       "ffn_up": "feed_forward.up_proj", "ffn_down": "feed_forward.down_proj"},
                      {"token_embd": "embed_tokens", "output_norm": "final_layernorm", "output": "lm_head"},
                      keys=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                            "ssm.group_count"),
                      config=_gguf_config, by_tensors=_gguf_norm),
}

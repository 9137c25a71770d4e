"""Mamba (state-spaces, Gu & Dao 2023): blocks of a selective state-space scan instead of attention, no FFN, no
positions (core/mamba.py runs the stack and shows each layer as the attention it implies).

    config.json knob        qkv knob                    what it does
    state_size (16)         mamba.d_state               N, the scan's state per channel
    expand (2)              mamba.d_inner               E = int(expand · hidden_size) channels
    conv_kernel (4)         mamba.conv_kernel           k, the causal depthwise conv's taps
    time_step_rank ("auto") mamba.dt_rank               R, Δ's rank (auto: ⌈hidden_size / 16⌉)
    use_conv_bias (true)    mamba.conv_bias             the conv's bias
    use_bias (false)        mamba.bias                  in_proj's and out_proj's biases
    hidden_act ("silu")     activation                  the conv's activation (the gate is SiLU whatever it says)
    layer_norm_epsilon      norm_eps                    every RMSNorm's ε (1e-5)
    tie_word_embeddings     tied_embeddings             lm_head = the embeddings (true by default)
    residual_in_fp32 (true)                             the residual in float32: qkv computes in float32 or
                                                        float64, so it always is (true and false read alike)
    time_step_scale, time_step_min, time_step_max, time_step_init_scheme, time_step_floor, initializer_range,
    rescale_prenorm_residual: how transformers initialises a fresh model (a checkpoint's numbers are read as they
    are); use_mambapy, use_associative_scan, use_cache: which algorithm computes the same scan.

The model's "heads" (n_heads 1 on loading) are groups of the E channels the views show as one attention each
(model.with_config(n_heads=G, d_head=E // G) shows G groups).

Its tensors, under MambaForCausalLM's names (backbone., an older checkpoint's backbone.embedding.weight too):
`weights` / `tensors` below. llama.cpp's `mamba` files (GGUF): the sizes as ssm.* keys, A stored as −exp(A_log)
(ssm_a, read back as log(−A)), the conv's weight squeezed to (E, k), the conv's and Δ's biases always, no in_proj /
out_proj biases, no head when tied.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.config import ModelConfig
from ..core.mamba import Mamba, MambaBlockWeights, MixerWeights
from ..core.weights import NormWeights, Weights
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, c_arrays, need, reads_back, special_ids
from .table import About, Arch

MODEL_TYPES = ("mamba",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("mamba",), models="Mamba (state-spaces/mamba-130m … 2.8b)",
          brings="selective state-space blocks (a causal conv, then the scan hₜ = exp(Δₜ·A)·hₜ₋₁ + Δₜ·xₜ·Bₜ, "
                 "yₜ = Cₜ·hₜ + D·xₜ, gated by SiLU(z)) instead of attention, no FFN, no positions; each layer shown "
                 "as the attention it implies (Ali et al. 2024), the cache its conv and scan states",
          kind="decoder", refuses=("attribute", "dla", "gradients")),
)

IGNORED: dict[str, str] = {}          # every tensor of a MambaForCausalLM checkpoint is read
MAX_POSITIONS = 1 << 20                # a scan has no longest input; the views' n × n tables bound it in practice
EMBEDDINGS = ("backbone.embeddings.weight", "backbone.embedding.weight")   # transformers' name, the original's


def _positive(hf: dict, key: str, default: int) -> int:
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise QkvError(f"config.json {key} = {value!r:.30} is not a positive integer; restore the checkpoint's "
                       "config.json")
    return value


def _flag(hf: dict, key: str, default: bool) -> bool:
    value = hf.get(key, default)
    if not isinstance(value, bool):
        raise QkvError(f"config.json {key} = {value!r:.30} is not true or false; restore the checkpoint's config.json")
    return value


def config(hf: dict) -> ModelConfig:
    d = need(hf, "hidden_size")
    rank = hf.get("time_step_rank", "auto")
    rank = math.ceil(d / 16) if rank == "auto" else _positive(hf, "time_step_rank", 1)
    E = int(_positive(hf, "expand", 2) * d)
    _flag(hf, "residual_in_fp32", True)                     # honoured whatever it says (module docstring)
    ssm = Mamba(d_state=_positive(hf, "state_size", 16), d_inner=E, conv_kernel=_positive(hf, "conv_kernel", 4),
                dt_rank=rank, conv_bias=_flag(hf, "use_conv_bias", True), bias=_flag(hf, "use_bias", False))
    return ModelConfig(family="mamba", vocab_size=need(hf, "vocab_size"), d_model=d,
                       n_layers=need(hf, "num_hidden_layers"), n_heads=1, d_head=E, d_ff=0,
                       max_positions=MAX_POSITIONS, causal=True, norm="rms", norm_place="pre",
                       norm_eps=hf.get("layer_norm_epsilon", 1e-5), activation=activation(hf.get("hidden_act", "silu")),
                       qkv_bias=False, out_bias=False, ffn_bias=False,
                       tied_embeddings=hf.get("tie_word_embeddings", True), final_norm=True, lm_head=True,
                       pad_token_id=hf.get("pad_token_id", 0), bos_token_id=hf.get("bos_token_id", 0),
                       eos_token_id=hf.get("eos_token_id", 0), mamba=ssm)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a MambaForCausalLM with these knobs (refused: channels that are no whole multiple of
    hidden_size, a grouping of channels other than one head)."""
    m = cfg.mamba
    if m is None or m.d_inner % cfg.d_model:
        raise QkvError("a mamba config.json holds a Mamba stack whose channels are expand · hidden_size; change the "
                       "knobs or the family")
    hf = {"model_type": "mamba", "architectures": ["MambaForCausalLM"], "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "state_size": m.d_state,
          "expand": m.d_inner // cfg.d_model, "conv_kernel": m.conv_kernel, "time_step_rank": m.dt_rank,
          "use_bias": m.bias, "use_conv_bias": m.conv_bias, "hidden_act": HF_ACTIVATIONS[cfg.activation],
          "layer_norm_epsilon": cfg.norm_eps, "residual_in_fp32": True, "tie_word_embeddings": cfg.tied_embeddings,
          **special_ids(cfg)}
    return reads_back(cfg, hf, config)


def _dense(value, dtype) -> np.ndarray:
    """A tensor as an array: a 16-bit matrix a store holds as its bytes (qkv.load(..., dtype="bfloat16")) is
    widened, as the scan's elementwise products need."""
    return value if isinstance(value, np.ndarray) else np.asarray(value, dtype=dtype)


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of a MambaForCausalLM checkpoint: each block's norm and mixer (core.mamba.MixerWeights), the
    embeddings, the final norm and the head (the embeddings' transpose when tied)."""
    m, d, V = cfg.mamba, cfg.d_model, cfg.vocab_size
    E, N, R, k = m.d_inner, m.d_state, m.dt_rank, m.conv_kernel

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return _dense(store.get(name, shape, dtype), dtype)

    table = next((name for name in EMBEDDINGS if store.has(name)), EMBEDDINGS[0])
    tok = get(table, (V, d))
    blocks = []
    for i in range(cfg.n_layers):
        p = f"backbone.layers.{i}.mixer."
        mixer = MixerWeights(
            W_in=get(p + "in_proj.weight", (2 * E, d)).T, conv=get(p + "conv1d.weight", (E, 1, k)).reshape(E, k),
            W_x=get(p + "x_proj.weight", (R + 2 * N, E)).T, W_dt=get(p + "dt_proj.weight", (E, R)).T,
            b_dt=get(p + "dt_proj.bias", (E,)), A_log=get(p + "A_log", (E, N)), D=get(p + "D", (E,)),
            W_out=get(p + "out_proj.weight", (d, E)).T,
            b_in=get(p + "in_proj.bias", (2 * E,)) if m.bias else None,
            b_conv=get(p + "conv1d.bias", (E,)) if m.conv_bias else None,
            b_out=get(p + "out_proj.bias", (d,)) if m.bias else None)
        blocks.append(MambaBlockWeights(attn_norm=NormWeights(get(f"backbone.layers.{i}.norm.weight", (d,))),
                                        attn=None, ffn_norm=None, ffn=None, mixer=mixer))
    if cfg.tied_embeddings:
        if store.has("lm_head.weight"):
            get("lm_head.weight", (V, d))                   # saved beside a tied table: transformers ties it again
        head = tok.T
    else:
        head = get("lm_head.weight", (V, d)).T
    return Weights(tok_embed=tok, blocks=blocks, final_norm=NormWeights(get("backbone.norm_f.weight", (d,))),
                   W_vocab=head)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under MambaForCausalLM's names, as its file stores them; new arrays."""
    t = {EMBEDDINGS[0]: weights.tok_embed, "backbone.norm_f.weight": weights.final_norm.weight}
    for i, b in enumerate(weights.blocks):
        w, p = b.mixer, f"backbone.layers.{i}.mixer."
        t |= {f"backbone.layers.{i}.norm.weight": b.attn_norm.weight, p + "in_proj.weight": w.W_in.T,
              p + "in_proj.bias": w.b_in, p + "conv1d.weight": w.conv[:, None, :], p + "conv1d.bias": w.b_conv,
              p + "x_proj.weight": w.W_x.T, p + "dt_proj.weight": w.W_dt.T, p + "dt_proj.bias": w.b_dt,
              p + "A_log": w.A_log, p + "D": w.D, p + "out_proj.weight": w.W_out.T, p + "out_proj.bias": w.b_out}
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T
    return c_arrays(t)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Mamba's config.json of a llama.cpp file (its own: none of the attention keys the common config wrote), and its
    mixer's shapes (dims' part_shapes). Refused: ssm.dt_b_c_rms (Falcon-Mamba's norms of Δ, B, C: another model)."""
    if meta.get(f"{a}.ssm.dt_b_c_rms", False) is not False:
        raise QkvError("the GGUF mamba model normalises Δ, B and C (ssm.dt_b_c_rms: Falcon-Mamba), which a "
                       "MambaForCausalLM does not; qkv runs plain Mamba files")
    d, E, N, k, R = dims["d"], dims["d_inner"], dims["d_state"], dims["d_conv"], dims["dt_rank"]
    if E % d:
        raise QkvError(f"the GGUF mamba model has {E} channels for d_model {d}; a MambaForCausalLM has a whole "
                       "multiple (expand); the file is damaged")
    dims["part_shapes"] = {"ssm_in": (2 * E, d), "ssm_conv1d": {"weight": (E, k), "bias": (E,)},
                           "ssm_x": (R + 2 * N, E), "ssm_dt": {"weight": (E, R), "bias": (E,)}, "ssm_a": {"": (E, N)},
                           "ssm_d": {"": (E,)}, "ssm_out": (d, E)}
    return {"hidden_size": d, "num_hidden_layers": dims["L"], "state_size": N,
            "expand": E // d, "conv_kernel": k, "time_step_rank": R, "use_bias": False, "use_conv_bias": True,
            "hidden_act": "silu", "layer_norm_epsilon": dims["eps"], "residual_in_fp32": True}


# llama.cpp's architecture (gguf_archs reads it by this table; its mixer's changed tensors: gguf_archs._ssm).
GGUF = {
    "mamba": Arch("mamba", "MambaForCausalLM",
                  {"attn_norm": "norm", "ssm_in": "mixer.in_proj", "ssm_conv1d": "mixer.conv1d",
                   "ssm_x": "mixer.x_proj", "ssm_dt": "mixer.dt_proj", "ssm_a": "mixer.A_log", "ssm_d": "mixer.D",
                   "ssm_out": "mixer.out_proj"},
                  {"token_embd": "backbone.embeddings", "output_norm": "backbone.norm_f", "output": "lm_head"},
                  layers="backbone.layers",
                  keys=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.dt_b_c_rms"),
                  config=_gguf_config),
}

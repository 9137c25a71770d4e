"""Mamba-2 (state-spaces, Dao & Gu 2024; Mamba-Codestral): blocks of a multi-head SSD scan instead of attention, no
FFN, no positions (core/mamba2.py runs the stack and shows each head as the attention it implies, exactly).

    config.json knob        qkv knob                    what it does
    num_heads, head_dim     mamba.n_heads, head_dim     H heads of P channels (n_heads, d_head): E = H·P =
                                                        int(expand · hidden_size), refused otherwise
    state_size (128)        mamba.d_state               N, the scan's state per channel
    n_groups (8)            mamba.n_groups              G groups of B and C, each read by H/G heads; the gated
                                                        norm's groups
    conv_kernel (4)         mamba.conv_kernel           k, the causal depthwise conv's taps over [x | B | C]
    use_conv_bias (true)    mamba.conv_bias             the conv's bias
    use_bias (false)        mamba.bias                  in_proj's and out_proj's biases
    time_step_limit         mamba.dt_min, dt_max        Δ clamped to [low, high] ((0, ∞) by default: no clamp; qkv
                                                        clamps in every pass, transformers' one-token step does not)
    chunk_size (256)        mamba.chunk_size            transformers' chunks of the scan: the same numbers (kept)
    hidden_act ("silu")     activation                  the conv's activation (the gate is SiLU whatever it says)
    layer_norm_epsilon      norm_eps                    every RMSNorm's ε, the gated norm's too (1e-5)
    tie_word_embeddings     tied_embeddings             lm_head = the embeddings (false by default)
    residual_in_fp32 (true)                             the residual in float32: qkv computes in float32 or
                                                        float64, so it always is (true and false read alike)
    time_step_rank: read by Mamba2Config and by nothing of the model (Mamba-2 has no dt_proj); time_step_min,
    time_step_max, time_step_floor, initializer_range, rescale_prenorm_residual: how transformers initialises a fresh
    model (a checkpoint's numbers are read as they are); use_cache: how transformers writes.

Its tensors, under Mamba2ForCausalLM's names (backbone., an original checkpoint's backbone.embedding.weight too):
`weights` / `tensors` below. llama.cpp's `mamba2` files (GGUF): the sizes as ssm.* keys (the heads as time_step_rank,
the groups as group_count), A stored as −exp(A_log) and D, each (H, 1), dt_bias as ssm_dt.bias, the gated norm's
weight by group (G, E / G), the conv squeezed (gguf_archs._ssm2 undoes each); no in_proj / out_proj biases, no clamp
of Δ, no chunk size (transformers' 256: the same numbers).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.config import ModelConfig
from ..core.mamba2 import Mamba2, Mamba2BlockWeights, Mixer2Weights
from ..core.weights import NormWeights, Weights
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, c_arrays, need, reads_back, special_ids
from .mamba import EMBEDDINGS, MAX_POSITIONS, _dense, _flag, _positive
from .table import About, Arch, gguf_positive

MODEL_TYPES = ("mamba2",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("mamba2",), models="Mamba-2 (state-spaces/mamba2-130m … 2.7b, Mamba-Codestral)",
          brings="multi-head SSD blocks (a causal conv over [x | B | C], the scan hₜ = exp(Δₜ·A_h)·hₜ₋₁ + Δₜ·xₜ·Bₜ "
                 "with one decay per head, groups of B and C, a gated GroupRMSNorm) instead of attention, no FFN, no "
                 "positions; each head shown as the attention it implies, exactly (C·B·exp(A·ΣΔ)·Δ), the cache its "
                 "conv and scan states",
          kind="decoder", refuses=("attribute", "dla", "gradients")),
)

IGNORED: dict[str, str] = {}          # every tensor of a Mamba2ForCausalLM checkpoint is read


INFINITY = {"__float__": "Infinity"}    # how transformers' config.json writes ∞ (JSON has no number for it)


def _number(v):
    """A config.json number: ∞ as transformers writes it (INFINITY) → math.inf; anything else as it is."""
    return math.inf if v == INFINITY else v


def _limit(hf: dict) -> tuple[float, float]:
    """time_step_limit as (low, high): two numbers 0 ≤ low ≤ high (high may be ∞), else one error."""
    value = hf.get("time_step_limit", (0.0, math.inf))
    value = [_number(v) for v in value] if isinstance(value, (list, tuple)) else value
    ok = (isinstance(value, list) and len(value) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) for v in value)
          and 0 <= value[0] <= value[1])
    if not ok:
        raise QkvError(f"config.json time_step_limit = {value!r:.40} is not two numbers 0 ≤ low ≤ high; restore the "
                       "checkpoint's config.json")
    return float(value[0]), float(value[1])


def config(hf: dict) -> ModelConfig:
    d = need(hf, "hidden_size")
    H, P = _positive(hf, "num_heads", 128), _positive(hf, "head_dim", 64)
    expand = hf.get("expand", 2)
    if isinstance(expand, bool) or not isinstance(expand, (int, float)) or int(expand * d) != H * P:
        raise QkvError(f"config.json says expand {expand!r:.20} · hidden_size {d} channels but num_heads · head_dim = "
                       f"{H} · {P}: transformers cannot build it either; restore the checkpoint's config.json")
    _flag(hf, "residual_in_fp32", True)                     # honoured whatever it says (module docstring)
    low, high = _limit(hf)
    ssm = Mamba2(n_heads=H, head_dim=P, d_state=_positive(hf, "state_size", 128), n_groups=_positive(hf, "n_groups", 8),
                 conv_kernel=_positive(hf, "conv_kernel", 4), conv_bias=_flag(hf, "use_conv_bias", True),
                 bias=_flag(hf, "use_bias", False), dt_min=low, dt_max=high,
                 chunk_size=_positive(hf, "chunk_size", 256))
    return ModelConfig(family="mamba2", vocab_size=need(hf, "vocab_size"), d_model=d,
                       n_layers=need(hf, "num_hidden_layers"), n_heads=H, d_head=P, d_ff=0,
                       max_positions=MAX_POSITIONS, causal=True, norm="rms", norm_place="pre",
                       norm_eps=hf.get("layer_norm_epsilon", 1e-5), activation=activation(hf.get("hidden_act", "silu")),
                       qkv_bias=False, out_bias=False, ffn_bias=False,
                       tied_embeddings=hf.get("tie_word_embeddings", False), final_norm=True, lm_head=True,
                       pad_token_id=hf.get("pad_token_id", 1), bos_token_id=hf.get("bos_token_id", 0),
                       eos_token_id=hf.get("eos_token_id", 2), mamba=ssm)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Mamba2ForCausalLM with these knobs (refused: channels that are no whole multiple of
    hidden_size)."""
    m = cfg.mamba
    if not isinstance(m, Mamba2) or m.d_inner % cfg.d_model:
        raise QkvError("a mamba2 config.json holds a Mamba-2 stack whose channels are expand · hidden_size; change the "
                       "knobs or the family")
    hf = {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_heads": m.n_heads,
          "head_dim": m.head_dim, "state_size": m.d_state, "n_groups": m.n_groups, "expand": m.d_inner // cfg.d_model,
          "conv_kernel": m.conv_kernel, "use_bias": m.bias, "use_conv_bias": m.conv_bias,
          "time_step_limit": [m.dt_min, INFINITY if m.dt_max == math.inf else m.dt_max], "chunk_size": m.chunk_size,
          "hidden_act": HF_ACTIVATIONS[cfg.activation], "layer_norm_epsilon": cfg.norm_eps, "residual_in_fp32": True,
          "tie_word_embeddings": cfg.tied_embeddings, **special_ids(cfg)}
    return reads_back(cfg, hf, config)


def mixer_weights(get, p: str, m: Mamba2, d: int) -> Mixer2Weights:
    """One Mamba2Mixer's tensors under prefix P (…mixer.), read by GET(name, shape): also Granite's and Falcon-H1's."""
    E, H, C, k = m.d_inner, m.n_heads, m.conv_dim, m.conv_kernel
    return Mixer2Weights(
        W_in=get(p + "in_proj.weight", (E + C + H, d)).T, conv=get(p + "conv1d.weight", (C, 1, k)).reshape(C, k),
        b_dt=get(p + "dt_bias", (H,)), A_log=get(p + "A_log", (H,)), D=get(p + "D", (H,)),
        norm=get(p + "norm.weight", (E,)) if m.norm != "none" else None, W_out=get(p + "out_proj.weight", (d, E)).T,
        b_in=get(p + "in_proj.bias", (E + C + H,)) if m.bias else None,
        b_conv=get(p + "conv1d.bias", (C,)) if m.conv_bias else None,
        b_out=get(p + "out_proj.bias", (d,)) if (m.bias if m.out_bias is None else m.out_bias) else None)


def mixer_tensors(w: Mixer2Weights, p: str) -> dict[str, np.ndarray | None]:
    """One mixer's tensors under prefix P, as transformers names and shapes them (None: a bias it has not)."""
    return {p + "in_proj.weight": w.W_in.T, p + "in_proj.bias": w.b_in, p + "conv1d.weight": w.conv[:, None, :],
            p + "conv1d.bias": w.b_conv, p + "dt_bias": w.b_dt, p + "A_log": w.A_log, p + "D": w.D,
            p + "norm.weight": w.norm, p + "out_proj.weight": w.W_out.T, p + "out_proj.bias": w.b_out}


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of a Mamba2ForCausalLM checkpoint: each block's norm and mixer (core.mamba2.Mixer2Weights), the
    embeddings, the final norm and the head (the embeddings' transpose when tied)."""
    m, d, V = cfg.mamba, cfg.d_model, cfg.vocab_size

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return _dense(store.get(name, shape, dtype), dtype)

    table = next((name for name in EMBEDDINGS if store.has(name)), EMBEDDINGS[0])
    tok = get(table, (V, d))
    blocks = [Mamba2BlockWeights(attn_norm=NormWeights(get(f"backbone.layers.{i}.norm.weight", (d,))), attn=None,
                                 ffn_norm=None, ffn=None, mixer=mixer_weights(get, f"backbone.layers.{i}.mixer.", m, d))
              for i in range(cfg.n_layers)]
    if cfg.tied_embeddings:
        if store.has("lm_head.weight"):
            get("lm_head.weight", (V, d))                   # saved beside a tied table: transformers ties it again
        head = tok.T
    else:
        head = get("lm_head.weight", (V, d)).T
    return Weights(tok_embed=tok, blocks=blocks, final_norm=NormWeights(get("backbone.norm_f.weight", (d,))),
                   W_vocab=head)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under Mamba2ForCausalLM's names, as its file stores them; new arrays."""
    t = {EMBEDDINGS[0]: weights.tok_embed, "backbone.norm_f.weight": weights.final_norm.weight}
    for i, b in enumerate(weights.blocks):
        t |= {f"backbone.layers.{i}.norm.weight": b.attn_norm.weight}
        t |= mixer_tensors(b.mixer, f"backbone.layers.{i}.mixer.")
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T
    return c_arrays(t)


# ── llama.cpp's `mamba2` (GGUF) ───────────────────────────────────────────────────────────────────────────────────

def gguf_groups(meta: dict, a: str, dims: dict) -> int:
    """ssm.group_count (G), which must divide the heads (time_step_rank: llama.cpp writes the heads there) and the
    channels, else one error."""
    G, H, E = gguf_positive(meta, a, "ssm.group_count", 1), dims["dt_rank"], dims["d_inner"]
    if G != int(G) or H % int(G) or E % H:
        raise QkvError(f"the GGUF {a} model has {E} channels in {H} heads and {G:g} groups of B and C; the heads must "
                       "divide the channels and the groups the heads; the file is damaged")
    return int(G)


def gguf_mixer(meta: dict, a: str, dims: dict) -> int:
    """A llama.cpp file's Mamba-2 mixer: its groups (`gguf_groups`), and its tensors' shapes (dims' part_shapes, as
    the file holds them: A and D (H, 1), the norm by group (G, E / G), the conv squeezed). Also Granite's."""
    d, E, N, k, H = dims["d"], dims["d_inner"], dims["d_state"], dims["d_conv"], dims["dt_rank"]
    G = gguf_groups(meta, a, dims)
    C = E + 2 * G * N                                                # the conv's channels: [x | B | C]
    dims["part_shapes"] = {"ssm_in": (E + C + H, d), "ssm_conv1d": {"weight": (C, k), "bias": (C,)},
                           "ssm_dt": {"bias": (H,)}, "ssm_a": {"": (H, 1)}, "ssm_d": {"": (H, 1)},
                           "ssm_norm": (G, E // G), "ssm_out": (d, E)}
    return G


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Mamba-2's config.json of a llama.cpp file (its own keys: no attention), and its mixer's shapes (dims'
    part_shapes). H heads is ssm.time_step_rank (llama.cpp's), P = E / H; Δ is not clamped (llama.cpp's scan does
    not), the chunks transformers' default (the same numbers)."""
    d, E, N, k, H = dims["d"], dims["d_inner"], dims["d_state"], dims["d_conv"], dims["dt_rank"]
    G = gguf_mixer(meta, a, dims)
    return {"hidden_size": d, "num_hidden_layers": dims["L"], "num_heads": H, "head_dim": E // H, "state_size": N,
            "n_groups": G, "expand": E // d if E % d == 0 else E / d, "conv_kernel": k, "use_bias": False,
            "use_conv_bias": True, "time_step_limit": [0.0, INFINITY], "hidden_act": "silu",
            "layer_norm_epsilon": dims["eps"], "residual_in_fp32": True}


# llama.cpp's architecture (gguf_archs reads it by this table; its mixer's changed tensors: gguf_archs._ssm2).
GGUF = {
    "mamba2": Arch("mamba2", "Mamba2ForCausalLM",
                   {"attn_norm": "norm", "ssm_in": "mixer.in_proj", "ssm_conv1d": "mixer.conv1d",
                    "ssm_dt": "mixer.dt_bias", "ssm_a": "mixer.A_log", "ssm_d": "mixer.D", "ssm_norm": "mixer.norm",
                    "ssm_out": "mixer.out_proj"},
                   {"token_embd": "backbone.embeddings", "output_norm": "backbone.norm_f", "output": "lm_head"},
                   layers="backbone.layers",
                   keys=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                         "ssm.group_count"),
                   config=_gguf_config),
}

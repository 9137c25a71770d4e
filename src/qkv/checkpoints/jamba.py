"""Jamba (AI21 Labs): Mamba layers and attention layers in one stack, each followed by a SwiGLU FFN or a routed one,
no positions anywhere (the Mamba layers' scan orders the tokens; the attention layers are GQA without RoPE).

    config.json knob            qkv knob                    what it does
    attn_layer_period (8),      layer_kinds                 layer i is attention when i % period == offset, else a
      attn_layer_offset (4)                                 Mamba layer (core/mamba.py's mixer, its FFN after it)
    expert_layer_period (2),    dense_layers                layer i's FFN is routed when i % period == offset (and
      expert_layer_offset (1)                               num_experts > 1), else one SwiGLU FFN
    num_experts (16)            n_experts                   E experts of intermediate_size; 1: every FFN dense
    num_experts_per_tok (2)     experts_per_token           the k highest of softmax(x·W_router), summed with those
                                norm_top_k = false          probabilities as they are (not renormalised)
    mamba_d_state (16)          mamba.d_state               N, the scan's state per channel
    mamba_expand (2)            mamba.d_inner               E = mamba_expand · hidden_size channels
    mamba_d_conv (4)            mamba.conv_kernel           k, the causal depthwise conv's taps
    mamba_dt_rank ("auto")      mamba.dt_rank               R, Δ's rank (auto: ⌈hidden_size / 16⌉)
    mamba_conv_bias (true)      mamba.conv_bias             the conv's bias
    mamba_proj_bias (false)     mamba.bias                  in_proj's and out_proj's biases
    (always)                    mamba.inner_norms           δ, B, C each RMSNormed before Δ's projection and the scan
    hidden_act ("silu")         activation                  the FFNs' and the conv's activation (the gate: SiLU)
    rms_norm_eps (1e-6)         norm_eps                    every RMSNorm's ε, the mixer's three too
    head_dim (hidden / heads)   d_head                      each attention head's width (scores × head_dim^-½)
    num_key_value_heads (8)     n_kv_heads                  GQA
    tie_word_embeddings (false) tied_embeddings
    router_aux_loss_coef, output_router_logits: transformers' load-balancing loss in training (qkv's training is
    refused here: the scan has no backward); initializer_range: a fresh model's; attention_dropout: training's;
    use_mamba_kernels, use_mambapy, use_associative_scan, use_cache: which algorithm computes the same numbers;
    max_position_embeddings: read as the longest input (nothing depends on a position).

Each Mamba layer is shown as the attention its scan implies (Ali et al. 2024; core/mamba.py), its n_heads "heads"
groups of E / n_heads channels, so that one trace holds the attention layers' softmax weights and the Mamba layers'
implied ones. Its tensors, relative to JambaModel ("model."; the head "lm_head"): `ROWS` below for the embeddings, the
norms, attention and the FFNs (a routed one under feed_forward.router / experts.{e}), and each Mamba layer's mixer
under layers.{i}.mamba.* (`MIXER`), read and written beside the table. llama.cpp's `jamba` files (GGUF, `GGUF` below):
the attention layers by attention.head_count_kv (one count a layer, 0 for a Mamba layer), the routed ones by the
routers the file holds, the mixer as Mamba's file has it (A = −exp(A_log), the conv squeezed); no in_proj / out_proj
biases, always the conv's bias.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

from ..core.config import ModelConfig
from ..core.mamba import Mamba, MambaBlockWeights, MixerWeights
from ..core.weights import FFNWeights, MoEWeights, NormWeights, Weights
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, need, reads_back, special_ids
from .mamba import _dense
from .table import (LINEAR, About, Arch, How, Row, dense_layer, gated_ffn, layer_norm, lm_head, read_table,
                    routed_layer, write_table)

MODEL_TYPES = ("jamba",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("jamba",), models="Jamba (ai21labs/Jamba-v0.1, Jamba 1.5 / 1.6 / 1.7 Mini and Large)",
          brings="Mamba layers (the selective scan with RMSNorms on Δ's input, B and C) among GQA attention layers "
                 "without positions (`attn_layer_period` / `offset`), every layer followed by a SwiGLU FFN or a "
                 "routed one (`expert_layer_period` / `offset`: top-k of a softmax, not renormalised); one trace holds "
                 "the attention layers' weights and the attention each Mamba layer implies (Ali et al. 2024), the "
                 "cache K, V beside the conv and scan states",
          kind="MoE decoder", refuses=("attribute", "dla", "gradients")),
)

IGNORED: dict[str, str] = {}          # every tensor of a JambaForCausalLM checkpoint is read
DEFAULTS = {"num_key_value_heads": 8, "rms_norm_eps": 1e-6, "num_experts": 16, "num_experts_per_tok": 2,
            "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4,
            "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto",
            "mamba_conv_bias": True, "mamba_proj_bias": False, "max_position_embeddings": 262144,
            "hidden_act": "silu", "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1,
            "eos_token_id": 2}                                      # JambaConfig's own


def _whole(hf: dict, key: str, least: int = 1) -> int:
    """config.json's KEY, a whole number ≥ LEAST, else one error."""
    value = hf[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise QkvError(f"config.json {key} = {value!r:.30} is not a whole number ≥ {least}; restore the checkpoint's "
                       "config.json")
    return value


def _flag(hf: dict, key: str) -> bool:
    """config.json's KEY, true or false, else one error."""
    if not isinstance(hf[key], bool):
        raise QkvError(f"config.json {key} = {hf[key]!r:.30} is not true or false; restore the checkpoint's "
                       "config.json")
    return hf[key]


def _every(hf: dict, what: str, L: int) -> list[bool]:
    """Which of the L layers are WHAT ("attn", "expert"): i % <what>_layer_period == <what>_layer_offset, the offset
    below the period (as JambaConfig validates them)."""
    period, offset = _whole(hf, f"{what}_layer_period"), _whole(hf, f"{what}_layer_offset", 0)
    if offset >= period:
        raise QkvError(f"config.json {what}_layer_offset {offset} must be below {what}_layer_period {period}; restore "
                       "the checkpoint's config.json")
    return [i % period == offset for i in range(L)]


def _mamba(hf: dict, d: int) -> Mamba:
    """The Mamba layers' sizes (JambaMambaMixer's), with Jamba's RMSNorms on δ, B and C."""
    rank = hf["mamba_dt_rank"]
    rank = math.ceil(d / 16) if rank == "auto" else _whole(hf, "mamba_dt_rank")
    return Mamba(d_state=_whole(hf, "mamba_d_state"), d_inner=_whole(hf, "mamba_expand") * d,
                 conv_kernel=_whole(hf, "mamba_d_conv"), dt_rank=rank, conv_bias=_flag(hf, "mamba_conv_bias"),
                 bias=_flag(hf, "mamba_proj_bias"), inner_norms=True)


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    d, H, L = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    kinds = tuple("attention" if a else "mamba" for a in _every(hf, "attn", L))
    routed = _every(hf, "expert", L)
    E = _whole(hf, "num_experts")
    k = _whole(hf, "num_experts_per_tok") if E > 1 else 0
    if k > E:
        raise QkvError(f"config.json num_experts_per_tok {k} is more than the {E} experts; restore the checkpoint's "
                       "config.json")
    return ModelConfig(
        family="jamba", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=hf["num_key_value_heads"] or H, d_head=hf.get("head_dim") or d // H,
        d_ff=need(hf, "intermediate_size"),
        max_positions=hf["max_position_embeddings"], causal=True, norm="rms", norm_place="pre",
        norm_eps=hf["rms_norm_eps"], activation=activation(hf["hidden_act"]), gated_ffn=True, qkv_bias=False,
        out_bias=False, ffn_bias=False, tied_embeddings=_flag(hf, "tie_word_embeddings"), final_norm=True,
        lm_head=True, pad_token_id=hf["pad_token_id"], bos_token_id=hf["bos_token_id"],
        eos_token_id=hf["eos_token_id"], pad_embedding_frozen=True,                  # nn.Embedding's padding_idx
        n_experts=E if E > 1 else 0, experts_per_token=k, norm_top_k=False,
        dense_layers=tuple(i for i in range(L) if not routed[i]) if E > 1 else (),
        layer_kinds=kinds, mamba=_mamba(hf, d))


def _period(marked: list[bool], what: str) -> dict:
    """{<what>_layer_period, <what>_layer_offset}: the smallest period whose offset marks exactly the MARKED layers
    (none marked: an offset past the last layer); a pattern no period makes is refused."""
    L = len(marked)
    for period in range(1, L + 2):
        for offset in range(period):
            if all((i % period == offset) == m for i, m in enumerate(marked)):
                return {f"{what}_layer_period": period, f"{what}_layer_offset": offset}
    shown = [i for i, m in enumerate(marked) if m]
    raise QkvError(f"a jamba config.json marks its {what} layers by a period and an offset, and layers {shown} are no "
                   "such pattern; change the knobs or the family")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a JambaForCausalLM with these knobs (refused: what a Jamba config cannot say)."""
    m = cfg.mamba
    if cfg.layer_kinds is None or not isinstance(m, Mamba) or m.d_inner % cfg.d_model:
        raise QkvError("a jamba config.json holds Mamba and attention layers whose Mamba channels are mamba_expand · "
                       "hidden_size; change the knobs or the family")
    hf = {"model_type": "jamba", "architectures": ["JambaForCausalLM"], "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
          "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head, "intermediate_size": cfg.d_ff,
          "max_position_embeddings": cfg.max_positions, "hidden_act": HF_ACTIVATIONS[cfg.activation],
          "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tied_embeddings,
          "num_experts": cfg.n_experts or 1, "num_experts_per_tok": cfg.experts_per_token or 2,
          **_period([k == "attention" for k in cfg.layer_kinds], "attn"),
          **(_period([cfg.moe_layer(i) for i in range(cfg.n_layers)], "expert") if cfg.n_experts else {}),
          "mamba_d_state": m.d_state, "mamba_d_conv": m.conv_kernel, "mamba_expand": m.d_inner // cfg.d_model,
          "mamba_dt_rank": m.dt_rank, "mamba_conv_bias": m.conv_bias, "mamba_proj_bias": m.bias,
          "output_router_logits": False, **special_ids(cfg)}
    return reads_back(cfg, hf, config)


def _attention_layer(cfg: ModelConfig, i: int) -> bool:
    return cfg.layer_kind(i) == "attention"


class Routed(How):
    """A routed layer's FFN under layers.{i}.feed_forward: the router (router.weight (E, d)) and each expert's gated
    FFN (experts.{e}.gate_proj / up_proj / down_proj, as save_pretrained writes them; transformers 5's fused
    experts.gate_up_proj (E, 2·f, d) and experts.down_proj (E, d, f) read as views): one MoEWeights."""

    def read(self, store, name, shape, dtype, cfg):
        d, E, f = cfg.d_model, cfg.n_experts, cfg.d_ff
        if not store.has(f"{name}.experts.0.gate_proj.weight") and store.has(f"{name}.experts.gate_up_proj"):
            gate_up = store.get(f"{name}.experts.gate_up_proj", (E, 2 * f, d), dtype)   # (E, 2·f, d) [gate; up]
            down = store.get(f"{name}.experts.down_proj", (E, d, f), dtype)            # (E, d, f)
            experts = [FFNWeights(W_gate=gate_up[e, :f].T, W_in=gate_up[e, f:].T, W_out=down[e].T) for e in range(E)]
        else:
            experts = [FFNWeights(**{ours: LINEAR.read(store, f"{name}.experts.{e}.{hf}.weight", s, dtype, cfg)
                                     for ours, hf, s in (("W_gate", "gate_proj", (d, f)), ("W_in", "up_proj", (d, f)),
                                                         ("W_out", "down_proj", (f, d)))})
                       for e in range(E)]
        return MoEWeights(W_router=LINEAR.read(store, f"{name}.router.weight", (d, E), dtype, cfg), experts=experts)

    def write_all(self, name, value, cfg):
        t = {f"{name}.router.weight": value.W_router.T}                                  # (E, d)
        for e, x in enumerate(value.experts):
            t |= {f"{name}.experts.{e}.gate_proj.weight": x.W_gate.T, f"{name}.experts.{e}.up_proj.weight": x.W_in.T,
                  f"{name}.experts.{e}.down_proj.weight": x.W_out.T}
        return t


# The table, read both ways: Llama's norms under Jamba's names, attention on the attention layers only, each FFN dense
# or routed. The Mamba layers' mixers: MIXER, beside it.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *(Row(f"block.attn.{W}", f"layers.{{i}}.self_attn.{hf}.weight", shape, LINEAR, layers=_attention_layer)
      for W, hf, shape in (("W_Q", "q_proj", "d q"), ("W_K", "k_proj", "d kv"), ("W_V", "v_proj", "d kv"),
                           ("W_O", "o_proj", "q d"))),
    *layer_norm("block.ffn_norm", "layers.{i}.pre_ff_layernorm", bias=False),
    Row("block.ffn", "layers.{i}.feed_forward", "d", Routed(), layers=routed_layer),
    *gated_ffn("layers.{i}.feed_forward", layers=dense_layer),
    *layer_norm("final_norm", "final_layernorm", bias=False),
    lm_head(),
]

# A Mamba layer's mixer (JambaMambaMixer) under layers.{i}.mamba: our field ← its name, its stored shape (R, N, E, k:
# the Mamba sizes; d: d_model), and whether it is a torch Linear (stored (out, in): ours its transpose).
MIXER = (("W_in", "in_proj.weight", "2E d", True), ("conv", "conv1d.weight", "E 1 k", False),
         ("W_x", "x_proj.weight", "R+2N E", True), ("W_dt", "dt_proj.weight", "E R", True),
         ("b_dt", "dt_proj.bias", "E", False), ("A_log", "A_log", "E N", False), ("D", "D", "E", False),
         ("W_out", "out_proj.weight", "d E", True), ("b_in", "in_proj.bias", "2E", False),
         ("b_conv", "conv1d.bias", "E", False), ("b_out", "out_proj.bias", "d", False),
         ("dt_norm", "dt_layernorm.weight", "R", False), ("b_norm", "b_layernorm.weight", "N", False),
         ("c_norm", "c_layernorm.weight", "N", False))


def _mixer_shape(spec: str, cfg: ModelConfig) -> tuple[int, ...]:
    m = cfg.mamba
    sizes = {"E": m.d_inner, "2E": 2 * m.d_inner, "d": cfg.d_model, "R": m.dt_rank, "N": m.d_state,
             "k": m.conv_kernel, "1": 1, "R+2N": m.dt_rank + 2 * m.d_state}
    return tuple(sizes[s] for s in spec.split())


def _held(field: str, cfg: ModelConfig) -> bool:
    """Whether a mixer of CFG holds FIELD (the biases by their knobs)."""
    m = cfg.mamba
    return {"b_in": m.bias, "b_out": m.bias, "b_conv": m.conv_bias}.get(field, True)


def read_mixer(store, i: int, cfg: ModelConfig, dtype) -> MixerWeights:
    """Layer I's mixer from STORE (MIXER's names), as core.mamba.MixerWeights; its norms as NormWeights."""
    parts = {}
    for ours, hf, spec, is_linear in MIXER:
        if not _held(ours, cfg):
            continue
        shape = _mixer_shape(spec, cfg)
        value = _dense(store.get(f"layers.{i}.mamba.{hf}", shape, dtype), dtype)
        value = value.T if is_linear else value.reshape(shape[0], -1) if ours == "conv" else value
        parts[ours] = NormWeights(value) if ours.endswith("norm") else value
    return MixerWeights(**parts)


def mixer_tensors(w: MixerWeights, i: int, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Layer I's mixer W under MIXER's full names, as its file stores them."""
    t = {}
    for ours, hf, spec, is_linear in MIXER:
        value = getattr(w, ours)
        if value is None:
            continue
        value = value.weight if isinstance(value, NormWeights) else value
        t[f"model.layers.{i}.mamba.{hf}"] = value.T if is_linear else value.reshape(_mixer_shape(spec, cfg))
    return t


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of a JambaForCausalLM checkpoint: the table's (ROWS), each Mamba layer's block a
    MambaBlockWeights holding its mixer (read_mixer)."""
    w = read_table(ROWS, store, cfg, dtype)
    for i, b in enumerate(w.blocks):
        if cfg.layer_kind(i) == "mamba":
            w.blocks[i] = MambaBlockWeights(**{f.name: getattr(b, f.name) for f in fields(b)},
                                            mixer=read_mixer(store, i, cfg, dtype))
    return w


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under JambaForCausalLM's names, as its file stores them; new arrays."""
    t = write_table(ROWS, weights, cfg, "model.")
    for i, b in enumerate(weights.blocks):
        if getattr(b, "mixer", None) is not None:
            t |= c_arrays(mixer_tensors(b.mixer, i, cfg))
    return t


# ── llama.cpp's `jamba` (GGUF) ────────────────────────────────────────────────────────────────────────────────────

def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Jamba's config.json of a llama.cpp file (its own keys: no RoPE anywhere), and its mixers' shapes (dims'
    part_shapes): the attention layers from attention.head_count_kv (one count a layer, 0 for a Mamba layer: dims'
    kinds), their period and offset; the routed layers are read from the tensors (`_gguf_routed`). Refused: Mamba
    channels no whole multiple of d_model, layers no period marks."""
    d, E, N, k, R = dims["d"], dims["d_inner"], dims["d_state"], dims["d_conv"], dims["dt_rank"]
    if E % d:
        raise QkvError(f"the GGUF jamba model has {E} Mamba channels for d_model {d}; a JambaForCausalLM has a whole "
                       "multiple (mamba_expand); the file is damaged")
    dims["part_shapes"] = {"ssm_in": (2 * E, d), "ssm_conv1d": {"weight": (E, k), "bias": (E,)},
                           "ssm_x": (R + 2 * N, E), "ssm_dt": {"weight": (E, R), "bias": (E,)}, "ssm_a": {"": (E, N)},
                           "ssm_d": {"": (E,)}, "ssm_out": (d, E), "ssm_dt_norm": (R,), "ssm_b_norm": (N,),
                           "ssm_c_norm": (N,)}
    return {"hidden_size": d, "num_hidden_layers": dims["L"], "num_attention_heads": dims["H"],
            "num_key_value_heads": dims["Hkv"], "head_dim": dims["d_head"], "intermediate_size": dims["f"],
            "max_position_embeddings": dims["n_ctx"], "rms_norm_eps": dims["eps"], "hidden_act": "silu",
            "num_experts": dims["E"], "num_experts_per_tok": dims["k"],
            **_period([kind == "attention" for kind in dims["kinds"]], "attn"),
            "mamba_d_state": N, "mamba_d_conv": k, "mamba_expand": E // d, "mamba_dt_rank": R,
            "mamba_conv_bias": True, "mamba_proj_bias": False}


def _gguf_routed(hf: dict, dims: dict, chosen: dict) -> None:
    """The routed layers of a llama.cpp jamba file: those holding a router (ffn_gate_inp), as llama.cpp's loader
    decides, written as expert_layer_period / offset (none routed: one expert, every FFN dense)."""
    routed = [i in chosen["routed"] for i in range(dims["L"])]
    dims["routed"] = chosen["routed"]
    try:
        hf |= _period(routed, "expert")
    except QkvError:
        raise QkvError(f"the GGUF jamba model routes layers {sorted(chosen['routed'])} (those holding ffn_gate_inp), "
                       "which no expert_layer_period and offset mark, so a JambaForCausalLM cannot hold it; use a "
                       "file converted from a Jamba checkpoint") from None
    if not any(routed):
        hf["num_experts"] = 1


# llama.cpp's architecture (gguf_archs reads it by this table): a Mamba layer's mixer as Mamba's (A = −exp(A_log),
# the conv squeezed: gguf_archs._ssm) with Jamba's three norms; experts stacked; no output when tied.
GGUF = {
    "jamba": Arch("jamba", "JambaForCausalLM",
                  {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                   "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ssm_in": "mamba.in_proj",
                   "ssm_conv1d": "mamba.conv1d", "ssm_x": "mamba.x_proj", "ssm_dt": "mamba.dt_proj",
                   "ssm_dt_norm": "mamba.dt_layernorm", "ssm_a": "mamba.A_log", "ssm_b_norm": "mamba.b_layernorm",
                   "ssm_c_norm": "mamba.c_layernorm", "ssm_d": "mamba.D", "ssm_out": "mamba.out_proj",
                   "ffn_norm": "pre_ff_layernorm", "ffn_gate_inp": "feed_forward.router",
                   "ffn_gate": "feed_forward.gate_proj", "ffn_up": "feed_forward.up_proj",
                   "ffn_down": "feed_forward.down_proj"},
                  {"token_embd": "embed_tokens", "output_norm": "final_layernorm", "output": "lm_head"},
                  keys=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank"),
                  experts={"ffn_gate_exps": "feed_forward.experts.{e}.gate_proj",
                           "ffn_up_exps": "feed_forward.experts.{e}.up_proj",
                           "ffn_down_exps": "feed_forward.experts.{e}.down_proj"},
                  config=_gguf_config, by_tensors=_gguf_routed),
}

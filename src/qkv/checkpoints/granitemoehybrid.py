"""Granite 4 hybrids (IBM, GraniteMoeHybridForCausalLM: granite-4.0-h-micro / tiny / small): Mamba-2 layers and
attention layers in one stack, each followed by a routed FFN and a shared one, with Granite's four multipliers.

    config.json knob            qkv knob                    what it does
    layer_types (or             layer_kinds                 each layer "mamba" / "linear_attention" (a Mamba-2 mixer,
      layers_block_type)                                    core/mamba2.py) or "attention" / "full_attention"
    mamba_n_heads (128),        mamba.n_heads, head_dim     the Mamba-2 heads and their width ("auto": mamba_expand ·
      mamba_d_head ("auto")                                 hidden_size / mamba_n_heads)
    mamba_n_groups (1)          mamba.n_groups              groups of B and C; the gated norm's groups
    mamba_d_state (256)         mamba.d_state               N, the scan's state
    mamba_d_conv (4)            mamba.conv_kernel           the conv's taps over [x | B | C]
    mamba_expand (2)                                        E = mamba_expand · hidden_size = heads · head width
    mamba_conv_bias (true),     mamba.conv_bias, bias       the conv's bias; in_proj's and out_proj's
      mamba_proj_bias (false)
    mamba_chunk_size (256)      mamba.chunk_size            transformers' chunks of the scan: the same numbers
    time_step_limit             mamba.dt_min, dt_max        Δ clamped to [low, high] ((0, ∞): no clamp)
    num_local_experts (8)       n_experts                   E experts of intermediate_size; 0: the shared FFN alone
    num_experts_per_tok (2)     experts_per_token           the k highest router logits, weighed by their softmax
                                norm_top_k = true           (= softmax over all, renormalised over the k)
    shared_intermediate_size    d_shared_expert             the shared FFN every token takes, added ungated
      (1024)                    (d_ff with no experts)
    position_embedding_type     position                    "rope": RoPE in the attention layers (rope_parameters);
      (null)                                                null or "nope": no positions anywhere (others refused)
    embedding_multiplier        embedding_multiplier        X = E[ids]·m
    residual_multiplier         residual_multiplier         x + Box(Norm(x))·m, for each mixer and each FFN
    attention_multiplier        attn_scale                  S = Q·Kᵀ·m (in place of 1/√d_k)
    logits_scaling              logit_scale = 1 / s         logits = H·W_vocab / s
    attention_bias (false)      qkv_bias, out_bias          q/k/v/o_proj's biases
    num_key_value_heads, head_dim (hidden / heads), hidden_act (the FFNs' and the conv's), rms_norm_eps (every
    RMSNorm's, the gated norm's too), max_position_embeddings, tie_word_embeddings, pad / bos / eos ids: as Llama's.
    initializer_range: a fresh model's; attention_dropout: training's; router_aux_loss_coef, output_router_logits:
    transformers' load-balancing loss in training (qkv's training is refused here: the scan has no backward);
    use_cache: how transformers writes.

Each Mamba-2 layer is shown as the attention its heads imply (core/mamba2.py), the attention layers' H heads each a
group of mamba_n_heads / H Mamba heads (refused when H does not divide them), so that one trace holds both kinds.
Its tensors, relative to GraniteMoeHybridModel ("model."; the head "lm_head"): `ROWS` below for the embeddings, the
norms, attention and the FFNs (layers.{i}.block_sparse_moe.router.layer / input_linear (E, 2·f, d) / output_linear
(E, d, f), layers.{i}.shared_mlp.input_linear (2·s, d) / output_linear (d, s): [gate; up] fused), and each Mamba-2
layer's mixer under layers.{i}.mamba.* (checkpoints/mamba2.py's `mixer_weights`), read and written beside the table.
llama.cpp's `granitehybrid` files (GGUF, `GGUF` below): the layers' kinds by attention.head_count_kv (one count a layer,
0 for a Mamba-2 layer), Q and K rows interleaved per head (Llama's), input_linear's [gate; up] split in two, the mixer
as mamba2's file has it, Granite's multipliers as its keys; no positions, biases only the conv's.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

from ..core.config import ModelConfig
from ..core.mamba2 import Mamba2, Mamba2BlockWeights
from ..core.weights import FFNWeights, MoEWeights, Weights
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, need, reads_back, special_ids
from .granite import _gguf_config as granite_multipliers
from .llama import _rope
from .mamba import _dense
from .mamba2 import INFINITY, _limit, gguf_mixer, mixer_tensors, mixer_weights
from .table import (LINEAR, About, Arch, How, Row, dense_layer, layer_norm, lm_head, read_table, routed_layer,
                    write_table)

MODEL_TYPES = ("granitemoehybrid",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("granitemoehybrid",), models="Granite 4.0 H (ibm-granite/granite-4.0-h-micro, -tiny, -small)",
          brings="Mamba-2 layers among GQA attention layers (`layer_types`; RoPE or no positions), every layer "
                 "followed by a routed FFN (softmax over the top-k logits) plus a shared one, Granite's four multipliers; one "
                 "trace holds the attention layers' weights and the attention each Mamba-2 head implies, the cache K, "
                 "V beside the conv and scan states",
          kind="MoE decoder", refuses=("attribute", "dla", "gradients")),
)

IGNORED: dict[str, str] = {}          # every tensor of a GraniteMoeHybridForCausalLM checkpoint is read
KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}
DEFAULTS = {"intermediate_size": 11008, "num_attention_heads": 32, "hidden_act": "silu",
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
            "tie_word_embeddings": False, "attention_bias": False, "embedding_multiplier": 1.0, "logits_scaling": 1.0,
            "residual_multiplier": 1.0, "attention_multiplier": 1.0, "num_local_experts": 8,
            "num_experts_per_tok": 2, "shared_intermediate_size": 1024, "mamba_n_heads": 128, "mamba_n_groups": 1,
            "mamba_d_state": 256, "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2,
            "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False}   # GraniteMoeHybridConfig's


def _whole(hf: dict, key: str, least: int = 1) -> int:
    """config.json's KEY, a whole number ≥ LEAST, else one error."""
    value = hf[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise QkvError(f"config.json {key} = {value!r:.30} is not a whole number ≥ {least}; restore the checkpoint's "
                       "config.json")
    return value


def _flag(hf: dict, key: str) -> bool:
    if not isinstance(hf[key], bool):
        raise QkvError(f"config.json {key} = {hf[key]!r:.30} is not true or false; restore the checkpoint's "
                       "config.json")
    return hf[key]


def _positive(hf: dict, key: str) -> float:
    value = hf[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise QkvError(f"config.json {key} = {value!r:.30} is not a positive number; restore the checkpoint's "
                       "config.json")
    return float(value)


def _kinds(hf: dict, L: int) -> tuple[str, ...]:
    """Each layer's kind from layer_types (or its older name layers_block_type; absent: every layer Mamba-2, as
    GraniteMoeHybridConfig fills it in)."""
    types = hf.get("layer_types", hf.get("layers_block_type"))
    types = ["mamba"] * L if types is None else types
    if not isinstance(types, list) or len(types) != L or any(not isinstance(t, str) or t not in KINDS for t in types):
        raise QkvError(f"config.json layer_types = {types!r:.60} must give each of the {L} layers one of "
                       f"{', '.join(KINDS)}; restore the checkpoint's config.json")
    return tuple(KINDS[t] for t in types)


def _mamba(hf: dict, d: int) -> Mamba2:
    """The Mamba-2 layers' sizes (GraniteMoeHybridMambaLayer's)."""
    E, H = _whole(hf, "mamba_expand") * d, _whole(hf, "mamba_n_heads")
    P = E // H if hf["mamba_d_head"] == "auto" else _whole(hf, "mamba_d_head")
    if H * P != E:
        raise QkvError(f"config.json mamba_n_heads {H} · mamba_d_head {hf['mamba_d_head']} must be mamba_expand · "
                       f"hidden_size = {E}, as transformers requires; restore the checkpoint's config.json")
    low, high = _limit(hf)
    return Mamba2(n_heads=H, head_dim=P, d_state=_whole(hf, "mamba_d_state"), n_groups=_whole(hf, "mamba_n_groups"),
                  conv_kernel=_whole(hf, "mamba_d_conv"), conv_bias=_flag(hf, "mamba_conv_bias"),
                  bias=_flag(hf, "mamba_proj_bias"), dt_min=low, dt_max=high, chunk_size=_whole(hf, "mamba_chunk_size"))


def _positions(hf: dict) -> dict:
    """The attention layers' positions: RoPE (position_embedding_type "rope"), or none (null, or "nope" as Granite
    4.0's configs say it)."""
    kind = hf.get("position_embedding_type")
    if kind not in (None, "nope", "rope"):
        raise QkvError(f"config.json position_embedding_type = {kind!r:.30} is not \"rope\", \"nope\" or null (no "
                       "positions), what transformers' Granite hybrids know; restore the checkpoint's config.json")
    if kind != "rope":
        return {}
    theta, scaling = _rope(hf)
    return {"position": "rope", "rope_theta": theta, "rope_scaling": scaling}


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | {k: v for k, v in hf.items() if v is not None or k == "position_embedding_type"}
    d, H, L = need(hf, "hidden_size"), _whole(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    Hkv = hf.get("num_key_value_heads") or H
    check_shapes(hf, d, H)
    E = _whole(hf, "num_local_experts", 0)
    k = _whole(hf, "num_experts_per_tok") if E else 0
    if k > E:
        raise QkvError(f"config.json num_experts_per_tok {k} is more than the {E} experts; restore the checkpoint's "
                       "config.json")
    shared = _whole(hf, "shared_intermediate_size")
    return ModelConfig(
        family="granitemoehybrid", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H, n_kv_heads=Hkv,
        d_head=hf.get("head_dim") or d // H, d_ff=_whole(hf, "intermediate_size") if E else shared,
        max_positions=_whole(hf, "max_position_embeddings"), causal=True, norm="rms", norm_place="pre",
        norm_eps=hf["rms_norm_eps"], activation=activation(hf["hidden_act"]), gated_ffn=True,
        qkv_bias=_flag(hf, "attention_bias"), out_bias=hf["attention_bias"], ffn_bias=False,
        tied_embeddings=_flag(hf, "tie_word_embeddings"), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf["bos_token_id"], eos_token_id=hf["eos_token_id"],
        pad_embedding_frozen=hf.get("pad_token_id") is not None,               # nn.Embedding's padding_idx
        embedding_multiplier=_positive(hf, "embedding_multiplier"),
        residual_multiplier=_positive(hf, "residual_multiplier"), attn_scale=_positive(hf, "attention_multiplier"),
        logit_scale=1.0 / _positive(hf, "logits_scaling"), n_experts=E, experts_per_token=k, norm_top_k=True,
        d_shared_expert=shared if E else 0, shared_expert_gate=False, layer_kinds=_kinds(hf, L), mamba=_mamba(hf, d),
        **_positions(hf))


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GraniteMoeHybridForCausalLM with these knobs (refused: what its config cannot say)."""
    m = cfg.mamba
    if cfg.layer_kinds is None or not isinstance(m, Mamba2) or m.d_inner % cfg.d_model:
        raise QkvError("a granitemoehybrid config.json holds Mamba-2 and attention layers whose Mamba channels are "
                       "mamba_expand · hidden_size; change the knobs or the family")
    hf = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"],
          "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
          "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head,
          "intermediate_size": cfg.d_ff, "shared_intermediate_size": cfg.d_shared_expert or cfg.d_ff,
          "num_local_experts": cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token or 2,
          "max_position_embeddings": cfg.max_positions, "hidden_act": HF_ACTIVATIONS[cfg.activation],
          "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tied_embeddings, "attention_bias": cfg.qkv_bias,
          "embedding_multiplier": cfg.embedding_multiplier, "residual_multiplier": cfg.residual_multiplier,
          "attention_multiplier": cfg.attn_scale, "logits_scaling": 1.0 / cfg.logit_scale,
          "layer_types": ["mamba" if k == "mamba" else "attention" for k in cfg.layer_kinds],
          "mamba_n_heads": m.n_heads, "mamba_d_head": m.head_dim, "mamba_n_groups": m.n_groups,
          "mamba_d_state": m.d_state, "mamba_d_conv": m.conv_kernel, "mamba_expand": m.d_inner // cfg.d_model,
          "mamba_chunk_size": m.chunk_size, "mamba_conv_bias": m.conv_bias, "mamba_proj_bias": m.bias,
          "time_step_limit": [m.dt_min, INFINITY if m.dt_max == math.inf else m.dt_max],
          "position_embedding_type": "rope" if cfg.position == "rope" else None, "output_router_logits": False,
          **special_ids(cfg)}
    if cfg.position == "rope":
        hf["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
    return reads_back(cfg, hf, config)


def _attention_layer(cfg: ModelConfig, i: int) -> bool:
    return cfg.layer_kind(i) == "attention"


def _bias(cfg: ModelConfig) -> bool:
    return cfg.qkv_bias


def _fused_ffn(store, name: str, f: int, d: int, dtype) -> FFNWeights:
    """A gated FFN whose gate and up are one Linear (input_linear (2·f, d): [gate; up]) and whose down is
    output_linear (d, f), under NAME: views."""
    gate_up = store.get(f"{name}.input_linear.weight", (2 * f, d), dtype)        # (2·f, d)
    return FFNWeights(W_gate=gate_up[:f].T, W_in=gate_up[f:].T,
                      W_out=store.get(f"{name}.output_linear.weight", (d, f), dtype).T)


def _fused_tensors(w: FFNWeights, name: str) -> dict[str, np.ndarray]:
    return {f"{name}.input_linear.weight": np.concatenate([w.W_gate.T, w.W_in.T]),
            f"{name}.output_linear.weight": w.W_out.T}


class Routed(How):
    """A layer's FFN under layers.{i}: the router (block_sparse_moe.router.layer.weight (E, d)), the experts stored
    fused (block_sparse_moe.input_linear (E, 2·f, d) [gate; up], output_linear (E, d, f)) and the shared FFN
    (shared_mlp, `_fused_ffn`): one MoEWeights, its shared expert ungated."""

    def read(self, store, name, shape, dtype, cfg):
        d, E, f = cfg.d_model, cfg.n_experts, cfg.d_ff
        gate_up = store.get(f"{name}.block_sparse_moe.input_linear.weight", (E, 2 * f, d), dtype)   # (E, 2·f, d)
        down = store.get(f"{name}.block_sparse_moe.output_linear.weight", (E, d, f), dtype)         # (E, d, f)
        experts = [FFNWeights(W_gate=gate_up[e, :f].T, W_in=gate_up[e, f:].T, W_out=down[e].T) for e in range(E)]
        router = LINEAR.read(store, f"{name}.block_sparse_moe.router.layer.weight", (d, E), dtype, cfg)   # (d, E)
        return MoEWeights(W_router=router, experts=experts,
                          shared=_fused_ffn(store, f"{name}.shared_mlp", cfg.d_shared_expert, d, dtype))

    def write_all(self, name, value, cfg):
        moe = f"{name}.block_sparse_moe"
        return {f"{moe}.router.layer.weight": value.W_router.T,
                f"{moe}.input_linear.weight": np.stack([np.concatenate([x.W_gate.T, x.W_in.T]) for x in value.experts]),
                f"{moe}.output_linear.weight": np.stack([x.W_out.T for x in value.experts]),
                **_fused_tensors(value.shared, f"{name}.shared_mlp")}


class Shared(How):
    """A layer's FFN without experts (num_local_experts 0): the shared FFN alone (shared_mlp, `_fused_ffn`)."""

    def read(self, store, name, shape, dtype, cfg):
        return _fused_ffn(store, f"{name}.shared_mlp", cfg.d_ff, cfg.d_model, dtype)

    def write_all(self, name, value, cfg):
        return _fused_tensors(value, f"{name}.shared_mlp")


# The table, read both ways: Llama's norms and attention (on the attention layers only), each layer's FFN routed with
# its shared one, or the shared one alone. The Mamba-2 layers' mixers: checkpoints/mamba2.py's, beside it.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *(Row(f"block.attn.{W}", f"layers.{{i}}.self_attn.{hf}.weight", shape, LINEAR, layers=_attention_layer)
      for W, hf, shape in (("W_Q", "q_proj", "d q"), ("W_K", "k_proj", "d kv"), ("W_V", "v_proj", "d kv"),
                           ("W_O", "o_proj", "q d"))),
    *(Row(f"block.attn.{b}", f"layers.{{i}}.self_attn.{hf}.bias", size, when=_bias, layers=_attention_layer)
      for b, hf, size in (("b_Q", "q_proj", "q"), ("b_K", "k_proj", "kv"), ("b_V", "v_proj", "kv"),
                          ("b_O", "o_proj", "d"))),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row("block.ffn", "layers.{i}", "d", Routed(), layers=routed_layer),
    Row("block.ffn", "layers.{i}", "d", Shared(), layers=dense_layer),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of a GraniteMoeHybridForCausalLM checkpoint: the table's (ROWS), each Mamba-2 layer's block a
    Mamba2BlockWeights holding its mixer (checkpoints/mamba2.py's `mixer_weights`)."""
    w = read_table(ROWS, store, cfg, dtype)

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return _dense(store.get(name, shape, dtype), dtype)

    for i, b in enumerate(w.blocks):
        if cfg.layer_kind(i) == "mamba":
            w.blocks[i] = Mamba2BlockWeights(**{f.name: getattr(b, f.name) for f in fields(b)},
                                             mixer=mixer_weights(get, f"layers.{i}.mamba.", cfg.mamba, cfg.d_model))
    return w


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under GraniteMoeHybridForCausalLM's names, as its file stores them; new arrays."""
    t = write_table(ROWS, weights, cfg, "model.")
    for i, b in enumerate(weights.blocks):
        if getattr(b, "mixer", None) is not None:
            t |= c_arrays(mixer_tensors(b.mixer, f"model.layers.{i}.mamba."))
    return t


# ── llama.cpp's `granitehybrid` (GGUF) ────────────────────────────────────────────────────────────────────────────

def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Granite 4 hybrid's config.json of a llama.cpp file: the layers' kinds from attention.head_count_kv (one count a
    layer, 0 for a Mamba-2 layer: dims' kinds), the Mamba-2 mixer as mamba2's file has it (heads as
    ssm.time_step_rank, groups as ssm.group_count), Granite's four multipliers (granite's reading), every layer routed
    with its shared FFN (expert_shared_feed_forward_length), no positions. Refused: RoPE (rope.scaling.finetuned,
    which llama.cpp sets for Bamba's RoPE only), Mamba channels no whole multiple of d_model."""
    if meta.get(f"{a}.rope.scaling.finetuned", False) is not False:
        raise QkvError(f"the GGUF {a} model turns its attention layers by RoPE ({a}.rope.scaling.finetuned: Bamba's), "
                       "which a GraniteMoeHybridForCausalLM file from llama.cpp never does; qkv runs Granite 4 hybrid "
                       "files without positions")
    d, E, N, k, H = dims["d"], dims["d_inner"], dims["d_state"], dims["d_conv"], dims["dt_rank"]
    if E % d:
        raise QkvError(f"the GGUF {a} model has {E} Mamba channels for d_model {d}; a GraniteMoeHybridForCausalLM has "
                       "a whole multiple (mamba_expand); the file is damaged")
    G = gguf_mixer(meta, a, dims)
    multipliers = granite_multipliers(meta, a, dims, {"rope_theta": None})
    return {"hidden_size": d, "num_hidden_layers": dims["L"], "num_attention_heads": dims["H"],
            "num_key_value_heads": dims["Hkv"], "head_dim": dims["d_head"], "intermediate_size": dims["f_expert"],
            "shared_intermediate_size": dims["f_shared"], "num_local_experts": dims["E"],
            "num_experts_per_tok": dims["k"], "max_position_embeddings": dims["n_ctx"], "rms_norm_eps": dims["eps"],
            "hidden_act": "silu", "attention_bias": False, "position_embedding_type": None,
            "layer_types": ["mamba" if kind == "mamba" else "attention" for kind in dims["kinds"]],
            "mamba_n_heads": H, "mamba_d_head": E // H, "mamba_n_groups": G, "mamba_d_state": N, "mamba_d_conv": k,
            "mamba_expand": E // d, "mamba_conv_bias": True, "mamba_proj_bias": False,
            "time_step_limit": [0.0, INFINITY],
            **{key: multipliers[key] for key in ("attention_multiplier", "embedding_multiplier", "residual_multiplier",
                                                 "logits_scaling")}}


# llama.cpp's architecture (gguf_archs reads it by this table): attention as Granite's (Q, K rows interleaved per
# head), the Mamba-2 mixer as mamba2's (gguf_archs._ssm2), the fused FFNs split into gate and up (gguf_archs._gate_up
# joins them back).
GGUF = {
    "granitehybrid": Arch(
        "granitemoehybrid", "GraniteMoeHybridForCausalLM",
        {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ssm_in": "mamba.in_proj",
         "ssm_conv1d": "mamba.conv1d", "ssm_dt": "mamba.dt_bias", "ssm_a": "mamba.A_log", "ssm_d": "mamba.D",
         "ssm_norm": "mamba.norm", "ssm_out": "mamba.out_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_gate_inp": "block_sparse_moe.router.layer", "ffn_gate_shexp": "shared_mlp.input_linear",
         "ffn_up_shexp": "shared_mlp.input_linear", "ffn_down_shexp": "shared_mlp.output_linear",
         "ffn_gate": "shared_mlp.input_linear", "ffn_up": "shared_mlp.input_linear",
         "ffn_down": "shared_mlp.output_linear"},
        {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}, permuted=True,
        keys=("attention.scale", "embedding_scale", "residual_scale", "logit_scale",
              "expert_shared_feed_forward_length", "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
              "ssm.time_step_rank", "ssm.group_count"),
        experts={"ffn_gate_exps": "block_sparse_moe.input_linear", "ffn_up_exps": "block_sparse_moe.input_linear",
                 "ffn_down_exps": "block_sparse_moe.output_linear"},
        config=_gguf_config),
}

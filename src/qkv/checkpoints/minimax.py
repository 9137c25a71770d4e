"""MiniMax (MiniMax-Text-01, MiniMax-M1): lightning attention — a causal linear attention with a per-head decay,
core/lightning.py — in most layers, GQA softmax attention with RoPE in the others, every FFN Mixtral's routed
experts, and each box's residual step scaled, on the normalised stream (x' = α·Norm(x) + β·Box(Norm(x))).

    config.json knob            qkv knob                        what it does
    layer_types                 lightning.linear_layers         "linear_attention" layers are lightning attention,
                                                                "full_attention" ones softmax (default: full, linear,
                                                                full, … as MiniMaxConfig fills them in)
    block_size (256)            lightning.block_size            the tokens of one block of the blocked sum
    full_attn_alpha_factor,     lightning.full_alpha, …         α (on Norm(x)) and β (on the box's output) of each
    full_attn_beta_factor,                                      kind of layer's attention step, and of the FFN's
    linear_attn_alpha_factor,                                   (mlp_*): 1 each by default
    linear_attn_beta_factor,
    mlp_alpha_factor,
    mlp_beta_factor
    hidden_act ("silu")         activation                      the experts' and lightning's q, k, v activation
    sliding_window (null)       sliding_window                  the softmax layers' window
    num_local_experts (8), num_experts_per_tok (2)              Mixtral's router: softmax, top k, renormalised
    rope_parameters             rope_theta, rope_scaling        the softmax layers' RoPE (θ 1e6 by default)
    num_key_value_heads (8), head_dim (hidden_size / heads), rms_norm_eps (1e-5), max_position_embeddings (131072),
    bos / eos ids (1, 2), untied: MiniMaxConfig's defaults when config.json leaves them out

RoPE turns every number of each head: transformers' MiniMaxRotaryEmbedding makes its table over the whole head_dim
whatever partial_rotary_factor (or an original config's rotary_dim) says, and so does qkv (those keys are not read).
Not read, as transformers' forward does not: attention_dropout, router_jitter_noise (training mode only),
router_aux_loss_coef and output_router_logits (its load-balancing loss: qkv does not train MiniMax), use_cache.

Its tensors, relative to MiniMaxModel ("model."; the head is "lm_head"): ROWS below for the embeddings, norms,
softmax layers and experts; a lightning layer's under layers.{i}.self_attn: qkv_proj (3·H·d_k, d) — each head's q,
k, v rows in turn, read into W_Q, W_K, W_V — output_gate, norm, out_proj. Its buffers slope_rate, query_decay,
key_decay, diagonal_decay are what transformers derives from the head count, the layer and block_size
(get_slope_rate, decay_factors): qkv computes them the same way (lightning.slopes) and does not write them (a
MiniMaxForCausalLM loading qkv's file makes them itself, as for a fresh model).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.lightning import Lightning, LightningBlockWeights, LightningWeights, slopes
from ..core.positions import check_rope
from ..core.weights import NormWeights, Weights
from ..runtime.errors import QkvError
from . import llama, moe
from .common import (HF_ACTIVATIONS, activation, c_arrays, check_shapes, decoder_sizes, need, reads_back,
                     rope_parameters, special_ids)
from .table import About, Row, attention, layer_norm, lm_head, read_table, write_table

MODEL_TYPES = ("minimax",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("minimax",), models="MiniMax-Text-01, MiniMax-M1",
          brings="lightning attention (a causal linear attention: each head's oₜ = Σ (qₜ·kₛ)·λ^(t−s)·vₛ with a fixed "
                 "decay λ, summed in blocks with a d_k × d_k state, then RMSNorm and a σ gate) among softmax layers "
                 "(`layer_types`), each layer shown as the attention matrix it implies; residual steps α·Norm(x) + "
                 "β·Box (`*_alpha_factor`, `*_beta_factor`); Mixtral's experts; the cache holds the lightning state",
          kind="MoE decoder", refuses=("attribute", "dla", "gradients")),
)

KINDS = ("full_attention", "linear_attention")
BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
IGNORED = llama.IGNORED | {f"layers.{{i}}.self_attn.{b}": "lightning's decays, which qkv computes from the heads, "
                           "the layer and block_size as transformers does (get_slope_rate, decay_factors)"
                           for b in BUFFERS}

DEFAULTS = {"num_key_value_heads": 8, "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
            "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "num_local_experts": 8,
            "num_experts_per_tok": 2, "block_size": 256, "intermediate_size": 14336}      # MiniMaxConfig's own
THETA = 1_000_000.0                                  # MiniMaxConfig.default_theta
FACTORS = {"full_alpha": "full_attn_alpha_factor", "full_beta": "full_attn_beta_factor",
           "linear_alpha": "linear_attn_alpha_factor", "linear_beta": "linear_attn_beta_factor",
           "ffn_alpha": "mlp_alpha_factor", "ffn_beta": "mlp_beta_factor"}


def _types(hf: dict, L: int) -> list[str]:
    """Each layer's kind: config.json's layer_types, else MiniMaxConfig's pattern (full where i is even)."""
    types = hf.get("layer_types")
    if types is None:
        return ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(L)]
    if not isinstance(types, list) or len(types) != L or any(t not in KINDS for t in types):
        shown = sorted(set(map(str, types))) if isinstance(types, list) else repr(types)[:40]
        raise QkvError(f"config.json layer_types {shown} must give each of the {L} layers full_attention or "
                       "linear_attention; restore the checkpoint's config.json")
    return types


def _factor(hf: dict, key: str) -> float:
    value = hf.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise QkvError(f"config.json {key} = {value!r:.30} is not a finite number; restore the checkpoint's "
                       "config.json")
    return float(value)


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    d, H, L = need(hf, "hidden_size"), need(hf, "num_attention_heads"), need(hf, "num_hidden_layers")
    check_shapes(hf, d, H)
    params = {k: v for k, v in (hf.get("rope_parameters") or {}).items() if k != "partial_rotary_factor"}
    theta, scaling = llama._rope({k: v for k, v in hf.items() if k != "partial_rotary_factor"}   # (unread: module
                                 | {"rope_parameters": params,                                   # docstring)
                                    "rope_theta": hf.get("rope_theta", params.get("rope_theta", THETA))})
    check_rope(theta, scaling)
    types = _types(hf, L)
    block = hf["block_size"]
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise QkvError(f"config.json block_size = {block!r:.30} is not a positive whole number; restore the "
                       "checkpoint's config.json")
    lightning = Lightning(linear_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
                          block_size=block, **{ours: _factor(hf, key) for ours, key in FACTORS.items()})
    E, k = need(hf, "num_local_experts"), need(hf, "num_experts_per_tok")
    if k > E:
        raise QkvError(f"config.json num_experts_per_tok {k} is more than the {E} experts; restore the checkpoint's "
                       "config.json")
    return ModelConfig(
        family="minimax", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        n_kv_heads=hf.get("num_key_value_heads") or H, d_head=hf.get("head_dim") or d // H,
        d_ff=need(hf, "intermediate_size"), max_positions=hf["max_position_embeddings"], causal=True, norm="rms",
        norm_place="pre", norm_eps=hf["rms_norm_eps"], position="rope", rope_theta=theta, rope_scaling=scaling,
        activation=activation(hf["hidden_act"]), gated_ffn=True, qkv_bias=False, out_bias=False, ffn_bias=False,
        tied_embeddings=bool(hf["tie_word_embeddings"]), final_norm=True, lm_head=True,
        sliding_window=hf.get("sliding_window"), pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,
        n_experts=E, experts_per_token=k, norm_top_k=True, lightning=lightning)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a MiniMaxForCausalLM with these knobs."""
    m = cfg.lightning
    if m is None:
        raise QkvError("a minimax config.json holds a MiniMax stack (its lightning layers); change the family")
    hf = {"model_type": "minimax", "architectures": ["MiniMaxForCausalLM"], **decoder_sizes(cfg),
          "rms_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
          "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tied_embeddings,
          "sliding_window": cfg.sliding_window, "num_local_experts": cfg.n_experts,
          "num_experts_per_tok": cfg.experts_per_token, "block_size": m.block_size,
          "layer_types": [KINDS[m.linear(i)] for i in range(cfg.n_layers)],
          **{key: getattr(m, ours) for ours, key in FACTORS.items()}, **special_ids(cfg)}
    return reads_back(cfg, hf, config)


class Routed(moe.Routed):
    """A layer's experts under Mixtral's names (block_sparse_moe.gate, experts.{e}.w1 / w3 / w2), as MiniMax
    stores them."""

    def read(self, store, name, shape, dtype, cfg):
        return super().read(store, name, shape, dtype, cfg.with_(family="mixtral", lightning=None))

    def write_all(self, name, value, cfg):
        return super().write_all(name, value, cfg.with_(family="mixtral", lightning=None))


def _softmax_layer(cfg: ModelConfig, i: int) -> bool:
    return not cfg.lightning.linear(i)


# The table of everything but the lightning boxes, read both ways.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *[Row(r.ours, r.hf, r.shape, r.how, layers=_softmax_layer) for r in attention("layers.{i}.self_attn")],
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row("block.ffn", "layers.{i}", "d", Routed()),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]


def _lightning(store, i: int, cfg: ModelConfig, dtype) -> LightningWeights:
    """Layer I's lightning box from its tensors: qkv_proj's rows head by head [q; k; v] split into W_Q, W_K, W_V."""
    d, H, dk = cfg.d_model, cfg.n_heads, cfg.d_head
    p = f"layers.{i}.self_attn."                                       # (the store finds it under "model.")
    qkv = np.asarray(store.get(p + "qkv_proj.weight", (3 * H * dk, d), dtype)).reshape(H, 3, dk, d)
    W_Q, W_K, W_V = (np.ascontiguousarray(qkv[:, j].reshape(H * dk, d).T) for j in range(3))   # (d, H·d_k) each
    return LightningWeights(W_Q=W_Q, W_K=W_K, W_V=W_V,
                            W_gate=store.get(p + "output_gate.weight", (H * dk, d), dtype).T,
                            out_norm=NormWeights(store.get(p + "norm.weight", (H * dk,), dtype)),
                            W_O=store.get(p + "out_proj.weight", (d, H * dk), dtype).T,
                            slopes=slopes(H, i, cfg.n_layers))


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of a MiniMaxForCausalLM checkpoint: the table's, each lightning layer's block then made a
    LightningBlockWeights with its box."""
    w = read_table(ROWS, store, cfg, dtype)
    for i in cfg.lightning.linear_layers:
        b = w.blocks[i]
        w.blocks[i] = LightningBlockWeights(attn_norm=b.attn_norm, attn=None, ffn_norm=b.ffn_norm, ffn=b.ffn,
                                            lightning=_lightning(store, i, cfg, dtype))
    return w


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under MiniMaxForCausalLM's names, as its file stores them; new arrays."""
    t = write_table(ROWS, weights, cfg, "model.")
    H, dk = cfg.n_heads, cfg.d_head
    for i in cfg.lightning.linear_layers:
        w, p = weights.blocks[i].lightning, f"model.layers.{i}.self_attn."
        qkv = np.stack([W.T.reshape(H, dk, -1) for W in (w.W_Q, w.W_K, w.W_V)], axis=1)   # (H, 3, d_k, d)
        t |= {p + "qkv_proj.weight": qkv.reshape(3 * H * dk, -1), p + "output_gate.weight": w.W_gate.T,
              p + "norm.weight": w.out_norm.weight, p + "out_proj.weight": w.W_O.T}
    return c_arrays(t)

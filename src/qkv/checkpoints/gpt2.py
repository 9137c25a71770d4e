"""GPT-2: pre-norm, learned positions, tanh GELU, W_vocab tied to the embeddings.

    checkpoint name (relative to GPT2Model)   qkv name
    wte / wpe                                 tok_embed / pos_embed
    h.{i}.ln_1                                attn_norm (before attention)
    h.{i}.attn.c_attn   [W_Q | W_K | W_V]     split in three column blocks (views)
    h.{i}.attn.c_proj                         W_O
    h.{i}.ln_2                                ffn_norm
    h.{i}.mlp.c_fc / mlp.c_proj               W_in / W_out
    ln_f                                      final_norm
    lm_head (only if untied)                  W_vocab
GPT-2's Conv1D stores weights (in, out), already the way we multiply: no transpose.
`config` / `weights` read a checkpoint by this table; `hf_config` / `tensors` write one, under
GPT2LMHeadModel's names ("transformer." + the name above; the head is "lm_head").
An attention-only model (d_ff = 0) keeps c_fc (d, 0), c_proj (0, d) and its bias b_out.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, columns, conv1d, linear_T, need, reads_back
from .tensors import TensorStore

# Tensors a GPT-2 checkpoint may hold that qkv never reads ({i}: a layer), relative to GPT2Model.
IGNORED = {
    "h.{i}.attn.bias": "the causal mask, a buffer older transformers saved",
    "h.{i}.attn.masked_bias": "the mask's fill value, likewise",
    "lm_head.weight": "a stored copy of wte when tie_word_embeddings (transformers ties it to wte too)",
}


def config(hf: dict) -> ModelConfig:
    for knob in ("scale_attn_by_inverse_layer_idx",):
        if hf.get(knob):
            raise QkvError(f"GPT-2 option {knob}=true is not supported; use a standard GPT-2 checkpoint")
    if hf.get("scale_attn_weights") is False:
        raise QkvError("GPT-2 option scale_attn_weights=false is not supported; use a standard GPT-2 checkpoint")
    d = need(hf, "n_embd")
    check_shapes(hf, d, need(hf, "n_head"))
    return ModelConfig(
        family="gpt2", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "n_layer"),
        n_heads=need(hf, "n_head"), d_ff=hf.get("n_inner", 4 * d), max_positions=need(hf, "n_positions"),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="learned", activation=activation(hf.get("activation_function", "gelu_new")),
        tied_embeddings=hf.get("tie_word_embeddings", True), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=False,                          # wte: a plain nn.Embedding, the pad row learns
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def block(i: int) -> BlockWeights:
        p = f"h.{i}"
        qkv = conv1d(store, f"{p}.attn.c_attn.weight", d, 3 * d, dtype)   # (d, 3d) = [W_Q | W_K | W_V]
        qkv_b = store.get(f"{p}.attn.c_attn.bias", (3 * d,), dtype)
        attn = AttentionWeights(
            W_Q=columns(qkv, 0, d), W_K=columns(qkv, d, 2 * d), W_V=columns(qkv, 2 * d, 3 * d),
            b_Q=qkv_b[:d], b_K=qkv_b[d:2 * d], b_V=qkv_b[2 * d:],
            W_O=conv1d(store, f"{p}.attn.c_proj.weight", d, d, dtype),
            b_O=store.get(f"{p}.attn.c_proj.bias", (d,), dtype),
        )
        ffn = FFNWeights(
            W_in=conv1d(store, f"{p}.mlp.c_fc.weight", d, f, dtype), b_in=store.get(f"{p}.mlp.c_fc.bias", (f,), dtype),
            W_out=conv1d(store, f"{p}.mlp.c_proj.weight", f, d, dtype), b_out=store.get(f"{p}.mlp.c_proj.bias", (d,), dtype),
        )
        return BlockWeights(attn_norm=norm(f"{p}.ln_1"), attn=attn, ffn_norm=norm(f"{p}.ln_2"), ffn=ffn)

    tok = store.get("wte.weight", (cfg.vocab_size, d), dtype)
    if cfg.tied_embeddings or not store.has("lm_head.weight"):
        W_vocab = tok.T                                                 # tied: W_vocab = Eᵀ
    else:
        W_vocab = linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(
        tok_embed=tok, pos_embed=store.get("wpe.weight", (cfg.max_positions, d), dtype),
        blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("ln_f"), W_vocab=W_vocab,
    )


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPT2LMHeadModel with these knobs (no dropout: qkv trains without it)."""
    return reads_back(cfg, {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff, "n_positions": cfg.max_positions, "layer_norm_epsilon": cfg.norm_eps,
        "activation_function": HF_ACTIVATIONS[cfg.activation], "tie_word_embeddings": cfg.tied_embeddings,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "summary_first_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under GPT2LMHeadModel's name, as its file stores it (Conv1D: (in, out)); new arrays.
    Tied: no lm_head (W_vocab is wte)."""
    t = {"transformer.wte.weight": weights.tok_embed,                              # (V, d)
         "transformer.wpe.weight": weights.pos_embed}                              # (P, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"transformer.h.{i}", b.attn, b.ffn
        t |= {
            f"{p}.ln_1.weight": b.attn_norm.weight, f"{p}.ln_1.bias": b.attn_norm.bias,
            f"{p}.attn.c_attn.weight": np.concatenate([a.W_Q, a.W_K, a.W_V], axis=1),   # (d, 3d)
            f"{p}.attn.c_attn.bias": np.concatenate([a.b_Q, a.b_K, a.b_V]),            # (3d,)
            f"{p}.attn.c_proj.weight": a.W_O, f"{p}.attn.c_proj.bias": a.b_O,          # (d, d), (d,)
            f"{p}.ln_2.weight": b.ffn_norm.weight, f"{p}.ln_2.bias": b.ffn_norm.bias,
            f"{p}.mlp.c_fc.weight": f.W_in, f"{p}.mlp.c_fc.bias": f.b_in,              # (d, d_ff), (d_ff,)
            f"{p}.mlp.c_proj.weight": f.W_out, f"{p}.mlp.c_proj.bias": f.b_out,        # (d_ff, d), (d,)
        }
    t |= {"transformer.ln_f.weight": weights.final_norm.weight, "transformer.ln_f.bias": weights.final_norm.bias}
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                    # (V, d)
    return c_arrays(t)

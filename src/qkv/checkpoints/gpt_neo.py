"""GPT-Neo: GPT-2's layout with separate Q, K, V (no biases), unscaled scores and local / global layers.

    checkpoint name (relative to GPTNeoModel)     qkv name
    wte / wpe                                     tok_embed / pos_embed
    h.{i}.ln_1                                    attn_norm (LayerNorm, before attention)
    h.{i}.attn.attention.q_proj / k_proj / v_proj W_Q / W_K / W_V (no biases)
    h.{i}.attn.attention.out_proj                 W_O, b_O
    h.{i}.ln_2                                    ffn_norm
    h.{i}.mlp.c_fc / c_proj                       W_in / W_out (torch Linear: stored (out, in))
    ln_f                                          final_norm
    lm_head (tied to wte)                         W_vocab

Knobs: attention_types, e.g. [[["global", "local"], 12]], expanded to one kind per layer (attention_layers):
a "local" layer's query i sees keys i − window_size + 1 … i (layer_windows), a "global" one every earlier key;
S = Q·Kᵀ with no 1/√d_k (attn_scale 1); activation_function (gelu_new); intermediate_size (None: 4·d_model).
Dropouts are training's: qkv runs the model as transformers does in eval.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

# Tensors a GPT-Neo checkpoint may hold that qkv never reads ({i}: a layer), relative to GPTNeoModel.
IGNORED = {
    "h.{i}.attn.attention.bias": "the causal (or local) mask, a buffer older transformers saved",
    "h.{i}.attn.attention.masked_bias": "the mask's fill value, likewise",
    "lm_head.weight": "a stored copy of wte when tie_word_embeddings",
}


def _attention_layers(hf: dict, L: int) -> list[str]:
    """attention_types [[kinds, repeat], …] expanded as transformers does: kinds repeated, one per layer."""
    types = hf.get("attention_types", [[["global", "local"], 12]])
    try:
        layers = [kind for kinds, repeat in types for _ in range(repeat) for kind in kinds]
    except (TypeError, ValueError):
        layers = None
    if layers is None or len(layers) != L or any(k not in ("global", "local") for k in layers):
        raise QkvError(f"config.json attention_types {str(types)[:60]} must expand to 'global' or 'local' for each "
                       f"of the {L} layers; restore the checkpoint's config.json")
    return layers


def config(hf: dict) -> ModelConfig:
    d, H, L = need(hf, "hidden_size"), need(hf, "num_heads"), need(hf, "num_layers")
    check_shapes(hf, d, H)
    window = hf.get("window_size", 256)
    windows = tuple(window if kind == "local" else None for kind in _attention_layers(hf, L))
    return ModelConfig(
        family="gpt_neo", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L, n_heads=H,
        d_ff=hf.get("intermediate_size") or 4 * d, max_positions=hf.get("max_position_embeddings", 2048),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="learned", activation=activation(hf.get("activation_function", "gelu_new")),
        qkv_bias=False, out_bias=True, ffn_bias=True, attn_scale=1.0,
        sliding_window=window if len(set(windows)) == 1 and windows[0] else None,
        layer_windows=None if len(set(windows)) == 1 else windows,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=False,                          # wte: a plain nn.Embedding, the pad row learns
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def block(i: int) -> BlockWeights:
        p = f"h.{i}"
        a = f"{p}.attn.attention"
        attn = AttentionWeights(
            W_Q=linear_T(store, f"{a}.q_proj.weight", d, d, dtype), W_K=linear_T(store, f"{a}.k_proj.weight", d, d, dtype),
            W_V=linear_T(store, f"{a}.v_proj.weight", d, d, dtype), W_O=linear_T(store, f"{a}.out_proj.weight", d, d, dtype),
            b_O=store.get(f"{a}.out_proj.bias", (d,), dtype),
        )
        ffn = FFNWeights(
            W_in=linear_T(store, f"{p}.mlp.c_fc.weight", d, f, dtype), b_in=store.get(f"{p}.mlp.c_fc.bias", (f,), dtype),
            W_out=linear_T(store, f"{p}.mlp.c_proj.weight", f, d, dtype), b_out=store.get(f"{p}.mlp.c_proj.bias", (d,), dtype),
        )
        return BlockWeights(attn_norm=norm(f"{p}.ln_1"), attn=attn, ffn_norm=norm(f"{p}.ln_2"), ffn=ffn)

    tok = store.get("wte.weight", (cfg.vocab_size, d), dtype)
    if cfg.tied_embeddings or not store.has("lm_head.weight"):
        W_vocab = tok.T                                                 # tied: W_vocab = Eᵀ
    else:
        W_vocab = linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, pos_embed=store.get("wpe.weight", (cfg.max_positions, d), dtype),
                   blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("ln_f"), W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPTNeoForCausalLM with these knobs: each layer's kind as attention_types of one
    layer each (no dropout: qkv trains without it)."""
    windows = {cfg.window(i) for i in range(cfg.n_layers)} - {None}
    if len(windows) > 1:
        raise QkvError(f"GPT-Neo has one window_size for its local layers, not {sorted(windows)}; "
                       "give every windowed layer the same window")
    kinds = [["local" if cfg.window(i) else "global"] for i in range(cfg.n_layers)]
    return reads_back(cfg, {
        "model_type": "gpt_neo", "architectures": ["GPTNeoForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_layers": cfg.n_layers, "num_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
        "attention_types": [[k, 1] for k in kinds], "window_size": windows.pop() if windows else 256,
        "layer_norm_epsilon": cfg.norm_eps, "activation_function": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0, "embed_dropout": 0.0,
        "resid_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under GPTNeoForCausalLM's names, as its file stores it (Linear: (out, in)); new arrays.
    Tied: no lm_head (W_vocab is wte)."""
    t = {"transformer.wte.weight": weights.tok_embed, "transformer.wpe.weight": weights.pos_embed}   # (V, d), (P, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"transformer.h.{i}", b.attn, b.ffn
        t |= {
            f"{p}.ln_1.weight": b.attn_norm.weight, f"{p}.ln_1.bias": b.attn_norm.bias,
            f"{p}.attn.attention.q_proj.weight": a.W_Q.T, f"{p}.attn.attention.k_proj.weight": a.W_K.T,
            f"{p}.attn.attention.v_proj.weight": a.W_V.T,                               # (d, d) each
            f"{p}.attn.attention.out_proj.weight": a.W_O.T, f"{p}.attn.attention.out_proj.bias": a.b_O,
            f"{p}.ln_2.weight": b.ffn_norm.weight, f"{p}.ln_2.bias": b.ffn_norm.bias,
            f"{p}.mlp.c_fc.weight": f.W_in.T, f"{p}.mlp.c_fc.bias": f.b_in,             # (d_ff, d), (d_ff,)
            f"{p}.mlp.c_proj.weight": f.W_out.T, f"{p}.mlp.c_proj.bias": f.b_out,       # (d, d_ff), (d,)
        }
    t |= {"transformer.ln_f.weight": weights.final_norm.weight, "transformer.ln_f.bias": weights.final_norm.bias}
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                    # (V, d)
    return c_arrays(t)

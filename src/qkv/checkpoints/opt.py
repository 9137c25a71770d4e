"""OPT (Meta's OPT-125m … 66b, OPT-350m's post-LN layout): learned positions from row 2, LayerNorm, ReLU FFN.

    checkpoint name (relative to OPTModel)              qkv name
    decoder.embed_tokens                                tok_embed (V, d_embed)
    decoder.project_in (when d_embed ≠ d_model)         embed_in: X = E[ids]·embed_in + P[p + 2]
    decoder.embed_positions                             pos_embed, read from row p + 2 (position_offset)
    decoder.layers.{i}.self_attn_layer_norm             attn_norm (before attention, or after its residual step)
    decoder.layers.{i}.self_attn.q_proj/k_proj/v_proj   W_Q / W_K / W_V (enable_bias: with biases)
    decoder.layers.{i}.self_attn.out_proj               W_O
    decoder.layers.{i}.final_layer_norm                 ffn_norm (each layer's own, despite the name)
    decoder.layers.{i}.fc1 / fc2                        W_in / W_out: act(x·W_in + b_in)·W_out + b_out
    decoder.final_layer_norm (pre-LN only)              final_norm
    decoder.project_out (when d_embed ≠ d_model)        unembed_in: logits = (Norm(x)·unembed_in)·W_vocab
    lm_head (beside OPTModel; absent when tied)         W_vocab (d_embed, V)

Knobs: do_layer_norm_before (true: pre-LN, x + Box(Norm(x)), then a final norm; false, OPT-350m: post-LN,
Norm(x + Box(x)) after each box, and no final norm); _remove_final_layer_norm (pre-LN without the final
norm); word_embed_proj_dim ≠ hidden_size (OPT-350m: a 512-wide table projected to the 1024-wide stream before
the positions are added, and back before the tied head: `d_embed`, embed_in / unembed_in); enable_bias (every
linear map's bias); layer_norm_elementwise_affine false (LayerNorms without γ, β: `norm_affine`);
activation_function. dropout, attention_dropout and layerdrop are training's: qkv runs the model in eval.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

OFFSET = 2                     # OPTLearnedPositionalEmbedding: position p reads row p + 2

# Tensors an OPT checkpoint may hold that qkv never reads, relative to OPTModel.
IGNORED = {
    "lm_head.weight": "a stored copy of embed_tokens when tie_word_embeddings",
}


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes({k: v for k, v in hf.items() if k not in ("head_dim", "num_key_value_heads")}, d, H)
    pre = bool(hf.get("do_layer_norm_before", True))
    width = hf.get("word_embed_proj_dim", d)
    bias = bool(hf.get("enable_bias", True))
    return ModelConfig(
        family="opt", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "ffn_dim"), max_positions=hf.get("max_position_embeddings", 2048), causal=True,
        norm="layer", norm_place="pre" if pre else "post", norm_eps=1e-5, position="learned",
        position_offset=OFFSET, activation=activation(hf.get("activation_function", "relu")), gated_ffn=False,
        d_embed=None if width == d else width, norm_affine=bool(hf.get("layer_norm_elementwise_affine", True)),
        qkv_bias=bias, out_bias=bias, ffn_bias=bias, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        final_norm=pre and not hf.get("_remove_final_layer_norm", False), lm_head=True,
        pad_token_id=hf.get("pad_token_id", 1), bos_token_id=hf.get("bos_token_id", 2),
        eos_token_id=hf.get("eos_token_id", 2), pad_embedding_frozen=True,
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, e = cfg.d_model, cfg.d_ff, cfg.d_embed or cfg.d_model

    def norm(name: str) -> NormWeights:
        if not cfg.norm_affine:                                     # γ = 1, no β: nothing stored
            return NormWeights(np.ones(d, dtype))
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def linear(name: str, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray | None]:
        b = store.get(f"{name}.bias", (n_out,), dtype) if cfg.qkv_bias else None
        return linear_T(store, f"{name}.weight", n_in, n_out, dtype), b

    def block(i: int) -> BlockWeights:
        p = f"decoder.layers.{i}"
        (W_Q, b_Q), (W_K, b_K), (W_V, b_V), (W_O, b_O) = (linear(f"{p}.self_attn.{x}_proj", d, d)
                                                          for x in ("q", "k", "v", "out"))
        (W_in, b_in), (W_out, b_out) = linear(f"{p}.fc1", d, f), linear(f"{p}.fc2", f, d)
        return BlockWeights(attn_norm=norm(f"{p}.self_attn_layer_norm"),
                            attn=AttentionWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=b_O),
                            ffn_norm=norm(f"{p}.final_layer_norm"),
                            ffn=FFNWeights(W_in=W_in, W_out=W_out, b_in=b_in, b_out=b_out))

    tok = store.get("decoder.embed_tokens.weight", (cfg.vocab_size, e), dtype)          # (V, d_embed)
    W_vocab = tok.T if cfg.tied_embeddings else linear_T(store, "lm_head.weight", e, cfg.vocab_size, dtype)
    projected = cfg.d_embed is not None
    return Weights(
        tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)],
        pos_embed=store.get("decoder.embed_positions.weight", (cfg.max_positions + OFFSET, d), dtype),
        final_norm=norm("decoder.final_layer_norm") if cfg.final_norm else None, W_vocab=W_vocab,
        embed_in=linear_T(store, "decoder.project_in.weight", e, d, dtype) if projected else None,
        unembed_in=linear_T(store, "decoder.project_out.weight", d, e, dtype) if projected else None,
    )


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an OPTForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "opt", "architectures": ["OPTForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "ffn_dim": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
        "do_layer_norm_before": cfg.norm_place == "pre",
        "_remove_final_layer_norm": cfg.norm_place == "pre" and not cfg.final_norm,
        "word_embed_proj_dim": cfg.d_embed or cfg.d_model, "enable_bias": cfg.qkv_bias,
        "layer_norm_elementwise_affine": cfg.norm_affine, "activation_function": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "dropout": 0.0, "attention_dropout": 0.0, "layerdrop": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under OPTForCausalLM's names, as its file stores it (Linear: (out, in)); new arrays. Tied: no
    lm_head; LayerNorms without γ, β (norm_affine False): none of theirs."""
    def norm(name: str, w: NormWeights | None) -> dict:
        return {} if w is None or not cfg.norm_affine else {f"{name}.weight": w.weight, f"{name}.bias": w.bias}

    p0 = "model.decoder"
    t = {f"{p0}.embed_tokens.weight": weights.tok_embed, f"{p0}.embed_positions.weight": weights.pos_embed,
         f"{p0}.project_in.weight": None if weights.embed_in is None else weights.embed_in.T,        # (d, d_embed)
         f"{p0}.project_out.weight": None if weights.unembed_in is None else weights.unembed_in.T}   # (d_embed, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"{p0}.layers.{i}", b.attn, b.ffn
        t |= norm(f"{p}.self_attn_layer_norm", b.attn_norm) | norm(f"{p}.final_layer_norm", b.ffn_norm)
        for x, W, bias in (("q", a.W_Q, a.b_Q), ("k", a.W_K, a.b_K), ("v", a.W_V, a.b_V), ("out", a.W_O, a.b_O)):
            t |= {f"{p}.self_attn.{x}_proj.weight": W.T, f"{p}.self_attn.{x}_proj.bias": bias}
        t |= {f"{p}.fc1.weight": f.W_in.T, f"{p}.fc1.bias": f.b_in, f"{p}.fc2.weight": f.W_out.T, f"{p}.fc2.bias": f.b_out}
    t |= norm(f"{p0}.final_layer_norm", weights.final_norm)
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                # (V, d_embed)
    return c_arrays(t)

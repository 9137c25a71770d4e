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
"""

from __future__ import annotations

from ..config import ModelConfig
from ..errors import QkvError
from ..weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import activation, check_shapes, linear_T, need
from .tensors import TensorStore


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
        n_heads=need(hf, "n_head"), d_ff=hf.get("n_inner") or 4 * d, max_positions=need(hf, "n_positions"),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="learned", activation=activation(hf.get("activation_function", "gelu_new")),
        tied_embeddings=hf.get("tie_word_embeddings", True), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def block(i: int) -> BlockWeights:
        p = f"h.{i}"
        qkv = store.get(f"{p}.attn.c_attn.weight", (d, 3 * d), dtype)   # (d, 3d) = [W_Q | W_K | W_V]
        qkv_b = store.get(f"{p}.attn.c_attn.bias", (3 * d,), dtype)
        attn = AttentionWeights(
            W_Q=qkv[:, :d], W_K=qkv[:, d:2 * d], W_V=qkv[:, 2 * d:],
            b_Q=qkv_b[:d], b_K=qkv_b[d:2 * d], b_V=qkv_b[2 * d:],
            W_O=store.get(f"{p}.attn.c_proj.weight", (d, d), dtype),
            b_O=store.get(f"{p}.attn.c_proj.bias", (d,), dtype),
        )
        ffn = FFNWeights(
            W_in=store.get(f"{p}.mlp.c_fc.weight", (d, f), dtype), b_in=store.get(f"{p}.mlp.c_fc.bias", (f,), dtype),
            W_out=store.get(f"{p}.mlp.c_proj.weight", (f, d), dtype), b_out=store.get(f"{p}.mlp.c_proj.bias", (d,), dtype),
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

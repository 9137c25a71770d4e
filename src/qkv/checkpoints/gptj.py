"""GPT-J: one LayerNorm read by both parallel branches, interleaved partial RoPE, an LM head with a bias.

    checkpoint name (relative to GPTJModel)     qkv name
    wte                                         tok_embed
    h.{i}.ln_1                                  attn_norm (LayerNorm, read by attention and the FFN)
    h.{i}.attn.q_proj / k_proj / v_proj         W_Q / W_K / W_V (no biases)
    h.{i}.attn.out_proj                         W_O (no bias)
    h.{i}.mlp.fc_in / fc_out                    W_in / W_out (with biases)
    ln_f                                        final_norm
    lm_head (weight and bias, beside GPTJModel) W_vocab, b_vocab

A block: x + Attn(Norm(x)) + FFN(Norm(x)) (`parallel_residual`, one norm: ffn_norm None). RoPE turns the
first rotary_dim numbers of each head (`rotary_dim`) by pairs (0, 1), (2, 3), … (`rope_interleaved`:
GPT-J's rotate_every_two, its sin/cos repeated in place), with base 10000. Dropouts are training's.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

# Tensors a GPT-J checkpoint may hold that qkv never reads ({i}: a layer), relative to GPTJModel.
IGNORED = {
    "h.{i}.attn.bias": "the causal mask, a buffer older transformers saved",
    "h.{i}.attn.masked_bias": "the mask's fill value, likewise",
    "h.{i}.attn.embed_positions": "the sin/cos table, a buffer older transformers saved (qkv computes it)",
}


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "n_embd"), need(hf, "n_head")
    check_shapes(hf, d, H)
    rotary = hf.get("rotary_dim")
    if rotary is None and H > 1:           # transformers builds d_model/2 angles for each d_model/H-wide head
        raise QkvError(f"GPT-J with rotary_dim null turns all {d} numbers of the model as one head, which "
                       f"transformers cannot apply to {H} heads either; give rotary_dim ≤ {d // H}")
    if rotary is not None and rotary > d // H:
        raise QkvError(f"GPT-J rotary_dim {rotary} is wider than a head ({d // H}); give rotary_dim ≤ {d // H}")
    return ModelConfig(
        family="gptj", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "n_layer"), n_heads=H,
        d_ff=4 * d if hf.get("n_inner") is None else hf["n_inner"], max_positions=hf.get("n_positions", 2048), causal=True,
        norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="rope", rope_theta=10000.0, rotary_dim=None if rotary in (None, d // H) else rotary,
        rope_interleaved=True, parallel_residual=True,
        activation=activation(hf.get("activation_function", "gelu_new")), gated_ffn=False,
        qkv_bias=False, out_bias=False, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def block(i: int) -> BlockWeights:
        a, m = f"h.{i}.attn", f"h.{i}.mlp"
        attn = AttentionWeights(W_Q=linear_T(store, f"{a}.q_proj.weight", d, d, dtype),
                                W_K=linear_T(store, f"{a}.k_proj.weight", d, d, dtype),
                                W_V=linear_T(store, f"{a}.v_proj.weight", d, d, dtype),
                                W_O=linear_T(store, f"{a}.out_proj.weight", d, d, dtype))
        ffn = FFNWeights(W_in=linear_T(store, f"{m}.fc_in.weight", d, f, dtype), b_in=store.get(f"{m}.fc_in.bias", (f,), dtype),
                         W_out=linear_T(store, f"{m}.fc_out.weight", f, d, dtype), b_out=store.get(f"{m}.fc_out.bias", (d,), dtype))
        return BlockWeights(attn_norm=norm(f"h.{i}.ln_1"), attn=attn, ffn_norm=None, ffn=ffn)

    tok = store.get("wte.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else \
        linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("ln_f"),
                   W_vocab=W_vocab, b_vocab=store.get("lm_head.bias", (cfg.vocab_size,), dtype))


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPTJForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "gptj", "architectures": ["GPTJForCausalLM"],
        "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff, "n_positions": cfg.max_positions, "rotary_dim": cfg.rotary_dim or cfg.d_head,
        "layer_norm_epsilon": cfg.norm_eps, "activation_function": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under GPTJForCausalLM's names, as its file stores it (Linear: (out, in)); new arrays.
    Tied: no lm_head.weight (it is wte), the head's bias still stored."""
    t = {"transformer.wte.weight": weights.tok_embed}                          # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"transformer.h.{i}", b.attn, b.ffn
        t |= {
            f"{p}.ln_1.weight": b.attn_norm.weight, f"{p}.ln_1.bias": b.attn_norm.bias,
            f"{p}.attn.q_proj.weight": a.W_Q.T, f"{p}.attn.k_proj.weight": a.W_K.T,
            f"{p}.attn.v_proj.weight": a.W_V.T, f"{p}.attn.out_proj.weight": a.W_O.T,
            f"{p}.mlp.fc_in.weight": f.W_in.T, f"{p}.mlp.fc_in.bias": f.b_in,
            f"{p}.mlp.fc_out.weight": f.W_out.T, f"{p}.mlp.fc_out.bias": f.b_out,
        }
    t |= {"transformer.ln_f.weight": weights.final_norm.weight, "transformer.ln_f.bias": weights.final_norm.bias,
          "lm_head.bias": weights.b_vocab}
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                # (V, d)
    return c_arrays(t)

"""StableLM (StableLM-2, StableLM-3B-4E1T, StableCode): pre-norm LayerNorm, partial RoPE, SwiGLU, GQA, optional
q/k LayerNorms of each head's own and a parallel residual.

Its tensors: `ROWS` below, each checkpoint name (relative to StableLmModel) beside ours and how it is stored, read
both ways (loading and saving).

Knobs: RoPE over the first d_head·partial_rotary_factor numbers of each head (default 0.25, `rotary_dim`);
use_parallel_residual: x + Attn(Norm(x)) + FFN(Norm(x)), one norm read by both (`parallel_residual`, as Phi);
qk_layernorm: each head's q and k normalised over d_k by a LayerNorm of that head's own (qk_norm "head",
weights (H, d_k)). hidden_dropout and attention_dropout are training's.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import NormWeights
from .common import (HF_ACTIVATIONS, activation, check_shapes, longrope_scaling, need, partial_rope, reads_back,
                     rope_parameters, decoder_sizes, special_ids, ROTARY_BUFFERS)
from .table import (LLAMA_LAYER, LLAMA_TOP, Arch, How, Row, attention, both_ways, gated_ffn, gguf_parallel, layer_norm,
                    lm_head, qk_norm, qkv_bias)
from .table import About

MODEL_TYPES = ("stablelm",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("stablelm",), models="StableLM-2, StableLM-3B",
          brings="LayerNorm, partial RoPE, SwiGLU, q/k/v biases, a LayerNorm of its own for each head's q and k "
                 "(`qk_layernorm`: weights (H, d_k)), parallel residual with one norm",
          kind="decoder"),
)

# Tensors a StableLM checkpoint may hold that qkv never reads ({i}: a layer), relative to StableLmModel.
IGNORED = ROTARY_BUFFERS


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes({k: v for k, v in hf.items() if k != "head_dim"}, d, H)   # StableLmAttention: d_k = d_model / H
    theta, scaling, rotary = partial_rope(hf, d // H, default_factor=0.25)
    return ModelConfig(
        family="stablelm", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 4096), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("layer_norm_eps", 1e-5), position="rope", rope_theta=theta,
        rope_scaling=longrope_scaling(hf, scaling, rotary or d // H),
        rotary_dim=rotary, parallel_residual=bool(hf.get("use_parallel_residual", False)),
        qk_norm="head" if hf.get("qk_layernorm", False) else None, activation=activation(hf.get("hidden_act", "silu")),
        gated_ffn=True, qkv_bias=bool(hf.get("use_qkv_bias", False)), out_bias=False, ffn_bias=False,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=True,
    )


class PerHead(How):
    """StableLM's q/k LayerNorms, one per head without β (norms.{h}.weight, (d_k,) each), as one NormWeights
    (heads, d_k)."""

    def read(self, store, name, shape, dtype, cfg):
        return NormWeights(np.stack([store.get(f"{name}.norms.{h}.weight", shape[1:], dtype)
                                     for h in range(shape[0])]))

    def write_all(self, name, value, cfg):
        return {f"{name}.norms.{h}.weight": g for h, g in enumerate(value.weight)}        # (d_k,) each


def sequential(cfg: ModelConfig) -> bool:
    return not cfg.parallel_residual


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. A parallel block has
# no norm before the FFN (attention's serves both).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm"),
    *attention("layers.{i}.self_attn", qkv_bias),
    Row("block.attn.q_norm", "layers.{i}.self_attn.q_layernorm", "H dk", PerHead(), qk_norm),
    Row("block.attn.k_norm", "layers.{i}.self_attn.k_layernorm", "Hkv dk", PerHead(), qk_norm),
    *gated_ffn("layers.{i}.mlp"),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", when=sequential),
    *layer_norm("final_norm", "norm"),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a StableLmForCausalLM with these knobs (transformers 5's rope_parameters)."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    return reads_back(cfg, {
        "model_type": "stablelm", "architectures": ["StableLmForCausalLM"],
        **decoder_sizes(cfg, head_dim=False), "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_qkv_bias": cfg.qkv_bias, "qk_layernorm": cfg.qk_norm == "head",
        "use_parallel_residual": cfg.parallel_residual,
        "rope_parameters": rope_parameters(cfg, partial_rotary_factor=factor),
        "partial_rotary_factor": factor, "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
        **special_ids(cfg),
    }, config)


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "stablelm": Arch("stablelm", "StableLmForCausalLM",
                     LLAMA_LAYER | {"attn_q_norm": "self_attn.q_layernorm", "attn_k_norm": "self_attn.k_layernorm"},
                     LLAMA_TOP, norm="layer", biases="optional", norm_biases=True, partial_rope=True,
                     keys=("use_parallel_residual",), config=gguf_parallel),
}

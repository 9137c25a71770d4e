"""BLOOM: ALiBi instead of position embeddings, a LayerNorm right after the embeddings, tanh GELU.

Its tensors: `ROWS` below, each checkpoint name (relative to BloomModel) beside ours and how it is stored, read
both ways (loading and saving).

Attention: S = Q·Kᵀ/√d_k + m_h·p_j (position "alibi"; BLOOM's baddbmm with beta 1: the bias unscaled),
p_j key j's position over real tokens. Knobs read and why some are not: apply_residual_connection_post_layernorm
(residual taken after the norm) is refused in one line; pretraining_tp / slow_but_exact only split W_O and
W_out into slices whose products are summed (the same product: qkv computes it whole); the dropouts are
training's (qkv runs the model in eval).
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import check_shapes, need, reads_back, special_ids
from .table import BY_GROUP, About, Arch, Row, both_ways, fused_qkv, layer_norm, linear, lm_head

MODEL_TYPES = ("bloom",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("bloom",), models="BLOOM, BLOOMZ",
          brings="ALiBi: no position embedding, S = Q·Kᵀ/√d_k + m_h·p_j (each head's slope times the key's position "
                 "over real tokens), a LayerNorm right after the embeddings, per-head fused Q/K/V, tanh GELU",
          kind="decoder"),
)

# Tensors a BLOOM checkpoint may hold that qkv never reads, relative to BloomModel.
IGNORED = {
    "lm_head.weight": "a stored copy of word_embeddings when tie_word_embeddings (transformers ties it too)",
}


def config(hf: dict) -> ModelConfig:
    if hf.get("apply_residual_connection_post_layernorm"):
        raise QkvError("bloom with apply_residual_connection_post_layernorm=true (the residual taken after the "
                       "norm) is not supported; use a checkpoint with it false, as every released BLOOM")
    d = hf.get("hidden_size", hf.get("n_embed"))
    if d is None:
        need(hf, "hidden_size")
    H = need(hf, "n_head") if "n_head" in hf else need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    return ModelConfig(
        family="bloom", vocab_size=need(hf, "vocab_size"), d_model=d,
        n_layers=hf["n_layer"] if "n_layer" in hf else need(hf, "num_hidden_layers"), n_heads=H, d_ff=4 * d,
        max_positions=hf.get("max_position_embeddings", 2048),    # ALiBi has no table; a bound for qkv's checks
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="alibi", activation="gelu_tanh", gated_ffn=False, qkv_bias=True, out_bias=True, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), embed_norm=True, final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. query_key_value's
# rows go head by head (q, k, v of each).
ROWS = [
    Row("tok_embed", "word_embeddings.weight", "V d"),
    *layer_norm("embed_norm", "word_embeddings_layernorm"),
    *layer_norm("block.attn_norm", "h.{i}.input_layernorm"),
    *fused_qkv("h.{i}.self_attention.query_key_value", BY_GROUP, True),
    *linear("block.attn.W_O", "h.{i}.self_attention.dense", "q d", "block.attn.b_O"),
    *layer_norm("block.ffn_norm", "h.{i}.post_attention_layernorm"),
    *linear("block.ffn.W_in", "h.{i}.mlp.dense_h_to_4h", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "h.{i}.mlp.dense_4h_to_h", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "ln_f"),
    lm_head(prefer_stored=False),
]
weights, tensors = both_ways(ROWS, "transformer.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a BloomForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "bloom", "architectures": ["BloomForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
        "layer_norm_epsilon": cfg.norm_eps, "apply_residual_connection_post_layernorm": False,
        "tie_word_embeddings": cfg.tied_embeddings, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "pretraining_tp": 1, "slow_but_exact": False, "max_position_embeddings": cfg.max_positions,
        **special_ids(cfg),
    }, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """BLOOM's config.json of a llama.cpp file: ALiBi, no RoPE keys."""
    d, H, Hkv, dk = dims["d"], dims["H"], dims["Hkv"], dims["d_head"]
    if Hkv != H or dk * H != d or dims["f"] != 4 * d:
        raise QkvError(f"the GGUF bloom model has {H} heads of {dk}, {Hkv} K/V heads and d_ff {dims['f']} in "
                       f"d_model {d}; BLOOM has d_model / heads per head, none grouped, d_ff = 4·d_model; the "
                       "file is damaged")
    return {"hidden_size": d, "n_head": H, "n_layer": dims["L"], "layer_norm_epsilon": dims["eps"],
            "max_position_embeddings": dims["n_ctx"], "tie_word_embeddings": False,
            "apply_residual_connection_post_layernorm": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "bloom": Arch("bloom", "BloomForCausalLM",
                  {"attn_norm": "input_layernorm", "attn_qkv": "self_attention.query_key_value",
                   "attn_output": "self_attention.dense", "ffn_norm": "post_attention_layernorm",
                   "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"},
                  {"token_embd": "word_embeddings", "token_embd_norm": "word_embeddings_layernorm",
                   "output_norm": "ln_f", "output": "lm_head"},
                  norm="layer", biases="all", norm_biases=True, layers="h", config=_gguf_config),
}

"""Cohere (Command-R): one bias-free LayerNorm read by both parallel branches, interleaved RoPE, SwiGLU,
optional q/k LayerNorms with weights per head, a tied head and logits × logit_scale.

Its tensors: `ROWS` below, each checkpoint name (relative to CohereModel) beside ours and how it is stored, read
both ways (loading and saving).

A block: x + Attn(Norm(x)) + FFN(Norm(x)) (`parallel_residual`, ffn_norm None); RoPE over all of each head
by pairs (0, 1), (2, 3), … (`rope_interleaved`); logits = H·W_vocab·logit_scale (`logit_scale`).
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, activation, check_shapes, decoder_sizes, need, reads_back, rope_parameters,
                     special_ids, ROTARY_BUFFERS)
from .table import (LLAMA_LAYER, QK_NORMS, Arch, Row, attention, both_ways, gated_ffn, gguf_positive, layer_norm,
                    lm_head, qk_norm, qkv_bias)
from .table import About

MODEL_TYPES = ("cohere",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("cohere",), models="Command-R (Cohere)",
          brings="one bias-free LayerNorm for parallel branches, interleaved RoPE, SwiGLU, q/k LayerNorm with weights"
                 " per head (`use_qk_norm`), logits × `logit_scale`, tied head",
          kind="decoder"),
)

# Tensors a Cohere checkpoint may hold that qkv never reads ({i}: a layer), relative to CohereModel.
IGNORED = ROTARY_BUFFERS


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and rope_scaling, from transformers 5's rope_parameters or the older keys."""
    params = hf.get("rope_parameters") or {}
    if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise QkvError("Cohere with partial_rotary_factor ≠ 1 is not what transformers' CohereForCausalLM runs "
                       "(it turns all of each head); restore the checkpoint's config.json")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return float(theta), scaling


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family="cohere", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_head=hf.get("head_dim") or d // H,
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 8192), causal=True,
        norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_eps", 1e-5),
        position="rope", rope_theta=theta, rope_scaling=scaling, rope_interleaved=True, parallel_residual=True,
        qk_norm="head" if hf.get("use_qk_norm", False) else None,
        activation=activation(hf.get("hidden_act", "silu")), gated_ffn=True,
        qkv_bias=bias, out_bias=bias, ffn_bias=False, logit_scale=float(hf.get("logit_scale", 0.0625)),
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=True,                                          # nn.Embedding's padding_idx
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. LayerNorms without β;
# one before both boxes (the block is parallel); use_qk_norm: γ per head (H, d_k), head h normalised by its row.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *attention("layers.{i}.self_attn", qkv_bias, qkv_bias),
    *layer_norm("block.attn.q_norm", "layers.{i}.self_attn.q_norm", "H dk", bias=False, when=qk_norm),
    *layer_norm("block.attn.k_norm", "layers.{i}.self_attn.k_norm", "Hkv dk", bias=False, when=qk_norm),
    *gated_ffn("layers.{i}.mlp"),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a CohereForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "cohere", "architectures": ["CohereForCausalLM"],
        **decoder_sizes(cfg), "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_qk_norm": cfg.qk_norm == "head",
        "rope_parameters": rope_parameters(cfg), "attention_bias": cfg.qkv_bias,
        "logit_scale": cfg.logit_scale, "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0,
        **special_ids(cfg),
    }, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Command-R's config.json of a llama.cpp file: its logit_scale (which llama.cpp requires), no biases."""
    return hf | {"logit_scale": gguf_positive(meta, a, "logit_scale"), "attention_bias": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "command-r": Arch("cohere", "CohereForCausalLM",
                      {k: v for k, v in LLAMA_LAYER.items() if k != "ffn_norm"} | QK_NORMS,
                      {"token_embd": "embed_tokens", "output_norm": "norm"}, norm="layer", keys=("logit_scale",),
                      config=_gguf_config),
}

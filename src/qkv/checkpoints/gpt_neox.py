"""GPT-NeoX (Pythia): pre-norm LayerNorm, partial RoPE, a parallel residual, one fused Q/K/V per head.

Its tensors: `ROWS` below, each checkpoint name (relative to GPTNeoXModel) beside ours and how it is stored, read
both ways (loading and saving).

Knobs: RoPE turns the first d_head·partial_rotary_factor numbers of each head (rotary_pct in older
configs; Pythia: 0.25, `rotary_dim`); use_parallel_residual (Pythia: true) computes
x + Attn(Norm₁(x)) + FFN(Norm₂(x)), both branches reading the block's input (`parallel_residual`).
Dropouts are training's: qkv runs the model as transformers does in eval.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, activation, check_shapes, need, partial_rope, reads_back,
                     rope_parameters, special_ids)
from .table import (BY_GROUP, Arch, Row, both_ways, fused_qkv, gguf_parallel, layer_norm, linear, lm_head, out_bias,
                    qkv_bias)
from .table import About

MODEL_TYPES = ("gpt_neox",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("gpt_neox",), models="Pythia, GPT-NeoX",
          brings="a parallel residual (x + Attn(Norm₁ x) + FFN(Norm₂ x), or sequential), RoPE on part of each head "
                 "(`partial_rotary_factor` / `rotary_pct`), per-head fused Q/K/V",
          kind="decoder"),
)

# Tensors a GPT-NeoX checkpoint may hold that qkv never reads ({i}: a layer), relative to GPTNeoXModel.
IGNORED = {
    "layers.{i}.attention.bias": "the causal mask, a buffer older transformers saved",
    "layers.{i}.attention.masked_bias": "the mask's fill value, likewise",
    "layers.{i}.attention.rotary_emb.inv_freq": "RoPE's frequencies, a buffer older transformers saved "
                                                "(qkv computes them from the rotary base)",
    "rotary_emb.inv_freq": "the same, kept once for the model",
    "embed_out.weight": "a stored copy of embed_in when tie_word_embeddings",
}


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling, rotary = partial_rope(hf, d // H)
    bias = bool(hf.get("attention_bias", True))
    return ModelConfig(
        family="gpt_neox", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 2048),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_eps", 1e-5),
        position="rope", rope_theta=theta, rope_scaling=scaling, rotary_dim=rotary,
        parallel_residual=bool(hf.get("use_parallel_residual", True)),
        activation=activation(hf.get("hidden_act", "gelu")), gated_ffn=False,
        qkv_bias=bias, out_bias=bias, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one.
ROWS = [
    Row("tok_embed", "embed_in.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm"),
    *fused_qkv("layers.{i}.attention.query_key_value", BY_GROUP, qkv_bias),
    *linear("block.attn.W_O", "layers.{i}.attention.dense", "q d", "block.attn.b_O", out_bias),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm"),
    *linear("block.ffn.W_in", "layers.{i}.mlp.dense_h_to_4h", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "layers.{i}.mlp.dense_4h_to_h", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "final_layer_norm"),
    lm_head("embed_out.weight", prefer_stored=False),
]
weights, tensors = both_ways(ROWS, "gpt_neox.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPTNeoXForCausalLM with these knobs (transformers 5's rope_parameters, and
    the older rotary_pct / rotary_emb_base)."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    return reads_back(cfg, {
        "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_parallel_residual": cfg.parallel_residual,
        "rope_parameters": rope_parameters(cfg, partial_rotary_factor=factor),
        "rotary_pct": factor, "rotary_emb_base": cfg.rope_theta, "attention_bias": cfg.qkv_bias,
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0, "hidden_dropout": 0.0,
        **special_ids(cfg),
    }, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """GPT-NeoX's config.json of a llama.cpp file: parallel or not as the file says, no grouped K/V, and its own
    RoPE keys (rotary_emb_base, rotary_pct)."""
    hf = gguf_parallel(meta, a, dims, hf)
    if dims["Hkv"] != dims["H"]:
        raise QkvError(f"the GGUF gptneox model has {dims['Hkv']} K/V heads for {dims['H']} heads; GPT-NeoX has none "
                       "grouped; the file is damaged")
    hf |= {"rotary_emb_base": dims["theta"], "rotary_pct": hf["rope_parameters"]["partial_rotary_factor"]}
    hf.pop("num_key_value_heads")
    return hf


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "gptneox": Arch("gpt_neox", "GPTNeoXForCausalLM",
                    {"attn_norm": "input_layernorm", "attn_qkv": "attention.query_key_value",
                     "attn_output": "attention.dense", "ffn_norm": "post_attention_layernorm",
                     "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"},
                    {"token_embd": "embed_in", "output_norm": "final_layer_norm", "output": "embed_out"},
                    norm="layer", biases="optional", norm_biases=True, partial_rope=True,
                    keys=("use_parallel_residual",), activation="gelu", config=_gguf_config),
}

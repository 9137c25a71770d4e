"""Phi (Phi-1, Phi-1.5, Phi-2): one LayerNorm read by a parallel attention and FFN, partial RoPE.

Its tensors: `ROWS` below, each checkpoint name (relative to PhiModel) beside ours and how it is stored, read
both ways (loading and saving).

A block: x + Attn(Norm(x)) + FFN(Norm(x)) (`parallel_residual`, one norm); RoPE turns the first
d_head·partial_rotary_factor numbers of each head (Phi-2: 0.4, `rotary_dim`). Dropouts are training's.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from .common import (HF_ACTIVATIONS, ROTARY_BUFFERS, activation, check_shapes, need, partial_rope, reads_back,
                     rope_parameters, decoder_sizes, special_ids)
from .table import About, Arch, Row, attention, both_ways, layer_norm, linear, lm_head, qk_norm

MODEL_TYPES = ("phi",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("phi",), models="Phi-1, Phi-1.5, Phi-2",
          brings="one LayerNorm read by a parallel attention and FFN, partial RoPE, q/k LayerNorm (`qk_layernorm`), "
                 "an LM head with a bias",
          kind="decoder"),
)

# Tensors a Phi checkpoint may hold that qkv never reads ({i}: a layer), relative to PhiModel.
IGNORED = ROTARY_BUFFERS


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling, rotary = partial_rope(hf, d // H, default_factor=0.5)
    return ModelConfig(
        family="phi", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 2048), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("layer_norm_eps", 1e-5), position="rope", rope_theta=theta, rope_scaling=scaling,
        rotary_dim=rotary, parallel_residual=True, shared_norm=True,
        qk_norm="head" if hf.get("qk_layernorm", False) else None, activation=activation(hf.get("hidden_act", "gelu_new")),
        gated_ffn=False, qkv_bias=True, out_bias=True, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. One norm before
# both boxes (the block is parallel); qk_layernorm: a LayerNorm over d_k, shared by the heads.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm"),
    *attention("layers.{i}.self_attn", True, True, out="dense"),
    *layer_norm("block.attn.q_norm", "layers.{i}.self_attn.q_layernorm", "dk", when=qk_norm),
    *layer_norm("block.attn.k_norm", "layers.{i}.self_attn.k_layernorm", "dk", when=qk_norm),
    *linear("block.ffn.W_in", "layers.{i}.mlp.fc1", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "layers.{i}.mlp.fc2", "f d", "block.ffn.b_out"),
    *layer_norm("final_norm", "final_layernorm"),
    lm_head(),
    Row("b_vocab", "lm_head.bias", "V", root=True),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a PhiForCausalLM with these knobs."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    return reads_back(cfg, {
        "model_type": "phi", "architectures": ["PhiForCausalLM"],
        **decoder_sizes(cfg, head_dim=False), "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "qk_layernorm": cfg.qk_norm == "head",
        "rope_parameters": rope_parameters(cfg, partial_rotary_factor=factor),
        "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
        **special_ids(cfg),
    }, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Phi-2's config.json of a llama.cpp file: no q/k LayerNorms (llama.cpp's phi2 has none)."""
    return hf | {"qk_layernorm": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "phi2": Arch("phi", "PhiForCausalLM",
                 {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                  "attn_v": "self_attn.v_proj", "attn_qkv": "self_attn.qkv",     # attn_qkv: split (hf_tensors)
                  "attn_output": "self_attn.dense", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"},
                 {"token_embd": "embed_tokens", "output_norm": "final_layernorm", "output": "lm_head"},
                 norm="layer", biases="all", norm_biases=True, partial_rope=True,
                 activation="gelu_new", config=_gguf_config),
}

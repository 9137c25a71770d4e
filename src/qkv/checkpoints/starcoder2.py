"""StarCoder2: pre-norm LayerNorm with biases, RoPE, GQA, a plain (not gated) GELU FFN, a sliding window.

Its tensors: `ROWS` below, each checkpoint name (relative to Starcoder2Model) beside ours and how it is
stored, read both ways (loading and saving).

Knobs: norm_epsilon (every LayerNorm's), use_bias (all six linear maps), hidden_act (gelu_pytorch_tanh),
sliding_window (every layer: each query sees its last `sliding_window` keys), tie_word_embeddings.
residual_dropout, embedding_dropout and attention_dropout are training's: qkv runs the model in eval.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, activation, check_shapes, longrope_scaling, need, partial_rope, reads_back,
                     rope_parameters, decoder_sizes, special_ids, ROTARY_BUFFERS)
from .table import LLAMA_LAYER, LLAMA_TOP, About, Arch, Row, attention, both_ways, layer_norm, linear, lm_head, qkv_bias

MODEL_TYPES = ("starcoder2",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("starcoder2",), models="StarCoder2",
          brings="LayerNorm with biases, a plain gelu-tanh FFN (`c_fc`, `c_proj`), biases on every linear map "
                 "(`use_bias`), GQA, a sliding window on every layer",
          kind="decoder"),
)

# Tensors a StarCoder2 checkpoint may hold that qkv never reads ({i}: a layer), relative to Starcoder2Model.
IGNORED = ROTARY_BUFFERS


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    d_head = hf.get("head_dim") or d // H
    theta, scaling, rotary = partial_rope(hf, d_head)
    if rotary is not None:          # Starcoder2Attention turns all of q, k with cos, sin of the narrower width
        raise QkvError("starcoder2 with partial_rotary_factor < 1 does not run in transformers either; "
                       "restore the checkpoint's config.json")
    bias = bool(hf.get("use_bias", True))
    return ModelConfig(
        family="starcoder2", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_head=d_head, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 4096), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("norm_epsilon", 1e-5), position="rope", rope_theta=theta,
        rope_scaling=longrope_scaling(hf, scaling, rotary or d_head),
        activation=activation(hf.get("hidden_act", "gelu_pytorch_tanh")), gated_ffn=False,
        qkv_bias=bias, out_bias=bias, ffn_bias=bias, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        final_norm=True, lm_head=True, sliding_window=hf.get("sliding_window"), pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one (use_bias: every
# linear map's bias, or none).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm"),
    *attention("layers.{i}.self_attn", qkv_bias, qkv_bias),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm"),
    *linear("block.ffn.W_in", "layers.{i}.mlp.c_fc", "d f", "block.ffn.b_in", qkv_bias),
    *linear("block.ffn.W_out", "layers.{i}.mlp.c_proj", "f d", "block.ffn.b_out", qkv_bias),
    *layer_norm("final_norm", "norm"),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Starcoder2ForCausalLM with these knobs (transformers 5's rope_parameters)."""
    hf = {
        "model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"],
        **decoder_sizes(cfg, head_dim=False), "norm_epsilon": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_bias": cfg.qkv_bias, "sliding_window": cfg.sliding_window,
        "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tied_embeddings,
        "residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0,
        **special_ids(cfg),
    }
    if cfg.d_head != cfg.d_model // cfg.n_heads:
        hf["head_dim"] = cfg.d_head
    return reads_back(cfg, hf, config)


def _no_window(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """StarCoder2's config.json of a llama.cpp file: no sliding window (llama.cpp attends to every earlier token)."""
    return hf | {"sliding_window": None}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "starcoder2": Arch("starcoder2", "Starcoder2ForCausalLM",
                       {k: v for k, v in LLAMA_LAYER.items() if k not in ("ffn_gate", "ffn_up", "ffn_down")}
                       | {"ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}, LLAMA_TOP,
                       norm="layer", biases="optional", norm_biases=True,
                       activation="gelu_pytorch_tanh", eps_key="norm_epsilon", config=_no_window),
}

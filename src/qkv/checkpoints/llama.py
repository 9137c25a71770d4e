"""The Llama family (Llama, Mistral, Qwen2): pre-norm RMSNorm, RoPE, SwiGLU, GQA/MQA.

    checkpoint name (relative to LlamaModel)   qkv name
    embed_tokens                               tok_embed
    layers.{i}.input_layernorm                 attn_norm (RMSNorm, before attention)
    layers.{i}.self_attn.q_proj/k_proj/v_proj  W_Q / W_K / W_V (Qwen2: with biases)
    layers.{i}.self_attn.o_proj                W_O
    layers.{i}.post_attention_layernorm        ffn_norm
    layers.{i}.mlp.gate_proj / up_proj         W_gate / W_in: SiLU(x·W_gate) ⊙ x·W_in
    layers.{i}.mlp.down_proj                   W_out
    norm                                       final_norm
    lm_head (absent when tied)                 W_vocab
"""

from __future__ import annotations

from ..config import ModelConfig
from ..errors import QkvError
from ..weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import activation, check_shapes, linear_T, need
from .tensors import TensorStore


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and rope_scaling, from the old keys or transformers 5's `rope_parameters`."""
    params = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise QkvError("partial rotary embeddings are not supported; use a checkpoint with full RoPE")
    return float(theta), scaling


def config(hf: dict) -> ModelConfig:
    family = hf["model_type"]
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    window = None
    if family == "mistral":
        window = hf.get("sliding_window")
    elif family == "qwen2" and hf.get("use_sliding_window"):
        raise QkvError("Qwen2 with use_sliding_window=true is not supported; use a checkpoint without it")
    if hf.get("mlp_bias"):
        raise QkvError("Llama checkpoints with mlp_bias=true are not supported; use one without FFN biases")
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_head=hf.get("head_dim") or d // H,
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 2048),
        causal=True, norm="rms", norm_place="pre", norm_eps=hf.get("rms_norm_eps", 1e-6),
        position="rope", rope_theta=theta, rope_scaling=scaling,
        activation=activation(hf.get("hidden_act", "silu")), gated_ffn=True,
        qkv_bias=attention_bias or family == "qwen2", out_bias=attention_bias, ffn_bias=False,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        sliding_window=window, pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff
    hq, hkv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head

    def rms(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype))

    def bias(name: str, size: int, present: bool):
        return store.get(name, (size,), dtype) if present else None

    def block(i: int) -> BlockWeights:
        p = f"layers.{i}"
        a = f"{p}.self_attn"
        attn = AttentionWeights(
            W_Q=linear_T(store, f"{a}.q_proj.weight", d, hq, dtype),
            W_K=linear_T(store, f"{a}.k_proj.weight", d, hkv, dtype),
            W_V=linear_T(store, f"{a}.v_proj.weight", d, hkv, dtype),
            W_O=linear_T(store, f"{a}.o_proj.weight", hq, d, dtype),
            b_Q=bias(f"{a}.q_proj.bias", hq, cfg.qkv_bias), b_K=bias(f"{a}.k_proj.bias", hkv, cfg.qkv_bias),
            b_V=bias(f"{a}.v_proj.bias", hkv, cfg.qkv_bias), b_O=bias(f"{a}.o_proj.bias", d, cfg.out_bias),
        )
        m = f"{p}.mlp"
        ffn = FFNWeights(
            W_gate=linear_T(store, f"{m}.gate_proj.weight", d, f, dtype),
            W_in=linear_T(store, f"{m}.up_proj.weight", d, f, dtype),
            W_out=linear_T(store, f"{m}.down_proj.weight", f, d, dtype),
        )
        return BlockWeights(attn_norm=rms(f"{p}.input_layernorm"), attn=attn,
                            ffn_norm=rms(f"{p}.post_attention_layernorm"), ffn=ffn)

    tok = store.get("embed_tokens.weight", (cfg.vocab_size, d), dtype)
    if cfg.tied_embeddings and not store.has("lm_head.weight"):
        W_vocab = tok.T
    else:
        W_vocab = linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=rms("norm"),
                   W_vocab=W_vocab)

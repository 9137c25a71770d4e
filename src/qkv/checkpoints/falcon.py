"""Falcon: a fused Q/K/V in three layouts, parallel attention and FFN, RoPE or ALiBi, biases or none.

Its tensors: `ROWS` below, each checkpoint name (relative to FalconModel) beside ours and how it is stored, read
both ways (loading and saving).

A block: x + Attn(Norm₁ x) + FFN(Norm₂ x) (new architecture, num_ln_in_parallel_attn 2), x + Attn(N x) + FFN(N x)
(one norm: Falcon-7B's parallel_attn, or num_ln_in_parallel_attn 1), or sequential (parallel_attn false).
Positions: RoPE (rope_parameters / rope_theta), or with alibi S = (Q·Kᵀ + m_h·p_j)/√d_k, m_h·p_j in bfloat16
as Falcon computes it (alibi_scaled, alibi_bfloat16). The three layouts are one rule: the new architecture's
rows with Hkv = 1 are multi_query's, with Hkv = H the per-head ones; `tensors` writes them so, and `hf_config`
a parallel model as the new architecture. Dropouts are training's.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, rope_parameters, special_ids
from .table import BY_GROUP, About, Arch, Row, both_ways, fused_qkv, layer_norm, linear, lm_head, qkv_bias

MODEL_TYPES = ("falcon",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("falcon",), models="Falcon-7B/40B, Falcon-RW",
          brings="one fused Q/K/V in every layout (multi-query, per head, or the new architecture's grouped K/V), "
                 "attention and FFN in parallel with one or two LayerNorms (or sequential), RoPE or ALiBi scaled with"
                 " the scores, `bias` on every linear or none",
          kind="decoder"),
)

# Tensors a Falcon checkpoint may hold that qkv never reads, relative to FalconModel.
IGNORED = {
    "lm_head.weight": "a stored copy of word_embeddings when tie_word_embeddings (transformers ties it too)",
    "h.{i}.self_attention.rotary_emb.inv_freq": "RoPE's frequencies, a buffer older transformers saved",
}


def _layout(hf: dict, H: int) -> tuple[bool, int, bool, bool]:
    """(new architecture, K/V heads, parallel, one shared norm) of a Falcon config.json, or one error naming a
    combination transformers' FalconDecoderLayer cannot run."""
    new = bool(hf.get("new_decoder_architecture", False))
    parallel = bool(hf.get("parallel_attn", True))
    kv = hf.get("num_kv_heads") or H
    n_ln = hf.get("num_ln_in_parallel_attn")
    if n_ln not in (None, 1, 2):
        raise QkvError(f"falcon num_ln_in_parallel_attn = {n_ln} is not 1 or 2; restore the checkpoint's config.json")
    if new:
        if not parallel:
            raise QkvError("falcon with new_decoder_architecture=true and parallel_attn=false cannot run (transformers' "
                           "layer lacks its norms); use parallel_attn=true")
        if H % kv:
            raise QkvError(f"falcon num_kv_heads {kv} does not divide num_attention_heads {H}; "
                           "restore the checkpoint's config.json")
        return True, kv, True, n_ln == 1
    if n_ln == 2:
        raise QkvError("falcon num_ln_in_parallel_attn=2 needs new_decoder_architecture=true (transformers' layer "
                       "reads input_layernorm otherwise); use 1 or the new architecture")
    if hf.get("multi_query", True):
        return False, 1, parallel, parallel
    if kv != H:
        raise QkvError(f"falcon num_kv_heads {kv} ≠ num_attention_heads {H} needs new_decoder_architecture=true "
                       "(or multi_query=true for one K/V head); restore the checkpoint's config.json")
    return False, H, parallel, parallel


def config(hf: dict) -> ModelConfig:
    d = hf.get("hidden_size", hf.get("n_embed"))
    if d is None:
        need(hf, "hidden_size")
    H = hf["n_head"] if "n_head" in hf else need(hf, "num_attention_heads")
    check_shapes({}, d, H)
    _, kv, parallel, shared = _layout(hf, H)
    alibi = bool(hf.get("alibi", False))
    params = hf.get("rope_parameters") or {}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    bias = bool(hf.get("bias", False))
    return ModelConfig(
        family="falcon", vocab_size=need(hf, "vocab_size"), d_model=d,
        n_layers=hf["n_layer"] if "n_layer" in hf else need(hf, "num_hidden_layers"), n_heads=H, n_kv_heads=kv,
        d_ff=hf.get("ffn_hidden_size") or 4 * d, max_positions=hf.get("max_position_embeddings", 2048),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="alibi" if alibi else "rope", rope_theta=float(theta), rope_scaling=None if alibi else scaling,
        alibi_scaled=alibi, alibi_bfloat16=alibi, parallel_residual=parallel, shared_norm=shared,
        activation=activation(hf.get("activation", "gelu")), gated_ffn=False,
        qkv_bias=bias, out_bias=bias, ffn_bias=bias,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def _sequential(cfg: ModelConfig) -> bool:             # a norm before each box
    return not cfg.parallel_residual


def _one_norm(cfg: ModelConfig) -> bool:               # parallel, one norm read by both boxes (Falcon-7B)
    return cfg.parallel_residual and cfg.shared_norm


def _two_norms(cfg: ModelConfig) -> bool:              # parallel, a norm each (Falcon-40B's ln_attn, ln_mlp)
    return cfg.parallel_residual and not cfg.shared_norm


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. query_key_value's rows go
# by K/V group (its query heads, its k, its v); `bias`: every linear map's bias, or none.
ROWS = [
    Row("tok_embed", "word_embeddings.weight", "V d"),
    *layer_norm("block.attn_norm", "h.{i}.input_layernorm", when=lambda cfg: not _two_norms(cfg)),
    *layer_norm("block.ffn_norm", "h.{i}.post_attention_layernorm", when=_sequential),
    *layer_norm("block.attn_norm", "h.{i}.ln_attn", when=_two_norms),
    *layer_norm("block.ffn_norm", "h.{i}.ln_mlp", when=_two_norms),
    *fused_qkv("h.{i}.self_attention.query_key_value", BY_GROUP, qkv_bias),
    *linear("block.attn.W_O", "h.{i}.self_attention.dense", "q d", "block.attn.b_O", qkv_bias),
    *linear("block.ffn.W_in", "h.{i}.mlp.dense_h_to_4h", "d f", "block.ffn.b_in", qkv_bias),
    *linear("block.ffn.W_out", "h.{i}.mlp.dense_4h_to_h", "f d", "block.ffn.b_out", qkv_bias),
    *layer_norm("final_norm", "ln_f"),
    lm_head(prefer_stored=False),
]
weights, tensors = both_ways(ROWS, "transformer.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a FalconForCausalLM with these knobs: a parallel block as the new architecture
    (num_kv_heads, num_ln_in_parallel_attn 1 or 2), a sequential one as multi_query (one K/V head) or not."""
    if cfg.position not in ("rope", "alibi"):
        raise QkvError(f"a falcon config.json cannot hold position={cfg.position!r}; use rope or alibi")
    hf = {
        "model_type": "falcon", "architectures": ["FalconForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_kv_heads": cfg.n_kv_heads, "ffn_hidden_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "layer_norm_epsilon": cfg.norm_eps,
        "activation": HF_ACTIVATIONS[cfg.activation], "alibi": cfg.position == "alibi",
        "rope_parameters": rope_parameters(cfg), "bias": cfg.qkv_bias,
        "new_decoder_architecture": cfg.parallel_residual, "parallel_attn": cfg.parallel_residual,
        "multi_query": cfg.n_kv_heads == 1, "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
        **special_ids(cfg),
    }
    if cfg.parallel_residual:
        hf["num_ln_in_parallel_attn"] = 1 if cfg.shared_norm else 2
    return reads_back(cfg, hf, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Falcon's config.json of a llama.cpp file (the norms' layout comes from the tensors: gguf.py)."""
    d, H, Hkv, dk = dims["d"], dims["H"], dims["Hkv"], dims["d_head"]
    if dk * H != d or dims["f"] != 4 * d:
        raise QkvError(f"the GGUF falcon model has {H} heads of {dk} and d_ff {dims['f']} in d_model {d}; "
                       "Falcon has d_model / heads per head and d_ff = 4·d_model; the file is damaged")
    return {"hidden_size": d, "num_attention_heads": H, "num_kv_heads": Hkv, "num_hidden_layers": dims["L"],
            "layer_norm_epsilon": dims["eps"], "ffn_hidden_size": dims["f"], "activation": "gelu",
            "parallel_attn": True, "alibi": False, "bias": False, "max_position_embeddings": dims["n_ctx"],
            "rope_theta": dims["theta"], "rope_parameters": {"rope_type": "default", "rope_theta": dims["theta"]},
            "tie_word_embeddings": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "falcon": Arch("falcon", "FalconForCausalLM",
                   {"attn_norm": "input_layernorm", "attn_norm_2": "ln_attn",    # two norms: ln_mlp (hf_tensors)
                    "attn_qkv": "self_attention.query_key_value", "attn_output": "self_attention.dense",
                    "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"},
                   {"token_embd": "word_embeddings", "output_norm": "ln_f", "output": "lm_head"},
                   norm="layer", norm_biases=True, layers="h", keys=("tensor_data_layout",), config=_gguf_config),
}

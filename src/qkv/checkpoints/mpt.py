"""MPT: ALiBi with its own slopes, LayerNorms without β, no biases anywhere, erf GELU, tied head.

Its tensors: `ROWS` below, each checkpoint name (relative to MptModel) beside ours and how it is stored, read
both ways (loading and saving).

Attention: S = Q·Kᵀ·softmax_scale + m_h·p_j (position "alibi"); softmax_scale None is 1/√d_k. MPT writes its
slopes as 2^(-8·(i+1)/P') over P' = 2^⌈log₂H⌉ heads, the odd-numbered first, then the even, the first H kept:
the same series as BLOOM's (alibi_slopes), which is what qkv computes; its bias m_h·(j − m + 1) differs from
m_h·p_j by a constant per row, which softmax does not see. transformers' MptModel reads few knobs: clip_qkv
(clamping Q, K, V) is refused in one line; what it never reads — expansion_ratio (its FFN is 4·d_model),
no_bias (no biases), attn_type, qk_ln, prefix_lm, alibi_bias_max, learned_pos_emb, logit_scale — qkv does
not read either, so both run the same model. Dropouts are training's.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import need, reads_back, special_ids
from .table import LINEAR, About, Arch, Row, both_ways, fused_qkv, layer_norm, lm_head

MODEL_TYPES = ("mpt",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("mpt",), models="MPT-7B",
          brings="ALiBi (its slopes written another way, the same series), LayerNorms without β, no biases, "
                 "`softmax_scale`, fused `Wqkv`",
          kind="decoder"),
)

# Tensors an MPT checkpoint may hold that qkv never reads, relative to MptModel.
IGNORED = {
    "lm_head.weight": "a stored copy of wte when tie_word_embeddings (transformers ties it too)",
}


def config(hf: dict) -> ModelConfig:
    attn = hf.get("attn_config") or {}
    if attn.get("clip_qkv"):
        raise QkvError(f"mpt with attn_config.clip_qkv = {attn['clip_qkv']!r} (Q, K, V clamped) is not supported; "
                       "use a checkpoint without it")
    scale = attn.get("softmax_scale")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0):
        raise QkvError(f"config.json attn_config.softmax_scale = {scale!r} is not a positive number; "
                       "restore the checkpoint's config.json")
    d, H = need(hf, "d_model"), need(hf, "n_heads")
    if d % H:
        raise QkvError(f"config.json: d_model {d} is not divisible by {H} heads; restore the checkpoint's config.json")
    return ModelConfig(
        family="mpt", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "n_layers"), n_heads=H,
        d_ff=4 * d, max_positions=hf.get("max_seq_len", 2048), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), position="alibi",
        attn_scale=None if scale is None else float(scale), activation="gelu", gated_ffn=False,
        qkv_bias=False, out_bias=False, ffn_bias=False, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. LayerNorms without β;
# Wqkv's rows are [Q; K; V] (each part a view).
ROWS = [
    Row("tok_embed", "wte.weight", "V d"),
    *layer_norm("block.attn_norm", "blocks.{i}.norm_1", bias=False),
    *fused_qkv("blocks.{i}.attn.Wqkv"),
    Row("block.attn.W_O", "blocks.{i}.attn.out_proj.weight", "q d", LINEAR),
    *layer_norm("block.ffn_norm", "blocks.{i}.norm_2", bias=False),
    Row("block.ffn.W_in", "blocks.{i}.ffn.up_proj.weight", "d f", LINEAR),
    Row("block.ffn.W_out", "blocks.{i}.ffn.down_proj.weight", "f d", LINEAR),
    *layer_norm("final_norm", "norm_f", bias=False),
    lm_head(prefer_stored=False),
]
weights, tensors = both_ways(ROWS, "transformer.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an MptForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "mpt", "architectures": ["MptForCausalLM"],
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "expansion_ratio": 4, "max_seq_len": cfg.max_positions, "layer_norm_epsilon": cfg.norm_eps,
        "attn_config": {"softmax_scale": cfg.attn_scale, "clip_qkv": None, "alibi": True,
                        "alibi_bias_max": 8, "attn_pdrop": 0},
        "no_bias": True, "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "emb_pdrop": 0.0,
        **special_ids(cfg),
    }, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """MPT's config.json of a llama.cpp file: ALiBi, no RoPE keys."""
    d, H, Hkv, dk = dims["d"], dims["H"], dims["Hkv"], dims["d_head"]
    bias_max = meta.get("mpt.attention.max_alibi_bias", 8.0)
    if Hkv != H or dk * H != d or dims["f"] != 4 * d or bias_max != 8:
        raise QkvError(f"the GGUF mpt model has {H} heads of {dk}, {Hkv} K/V heads, d_ff {dims['f']} in d_model "
                       f"{d} and ALiBi's maximum bias {bias_max!r:.10}; qkv runs MPT with d_model / heads per "
                       "head, none grouped, d_ff = 4·d_model and ALiBi's bias 8")
    return {"d_model": d, "n_heads": H, "n_layers": dims["L"], "expansion_ratio": 4, "max_seq_len": dims["n_ctx"],
            "layer_norm_epsilon": dims["eps"], "no_bias": True, "tie_word_embeddings": False,
            "attn_config": {"alibi": True, "alibi_bias_max": 8, "clip_qkv": None, "qk_ln": False,
                            "softmax_scale": None}}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "mpt": Arch("mpt", "MptForCausalLM",
                {"attn_norm": "norm_1", "attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "ffn_norm": "norm_2",
                 "ffn_up": "ffn.up_proj", "ffn_down": "ffn.down_proj"},
                {"token_embd": "wte", "output_norm": "norm_f", "output": "lm_head"},
                norm="layer", layers="blocks", keys=("attention.max_alibi_bias",), config=_gguf_config),
}

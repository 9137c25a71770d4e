"""ModernBERT (global layers): a pre-norm encoder with RoPE, GeGLU, LayerNorms without bias, a masked-LM head.

Its tensors: `ROWS` below, each checkpoint name (relative to ModernBertModel) beside ours and how it is stored, read
both ways (loading and saving).
Positions are 0…n−1 whatever the mask, as transformers numbers them. ModernBERT's local layers
(layer_types "sliding_attention", from global_attn_every_n_layers > 1) attend within a window that reaches
both ways — key j is seen from query i when |i − j| ≤ local_attention // 2, the engine's window
w = local_attention // 2 + 1 (|i − j| < w) — with RoPE of their own base (local_rope_theta); the global
layers see everything, with rope_theta. `hf_config` /
`tensors` write a ModernBertModel or ModernBertForMaskedLM.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, special_ids
from .roberta import masked_lm
from .table import LINEAR, About, Head, Row, both_ways

MODEL_TYPES = ("modernbert",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("modernbert",), models="ModernBERT",
          brings="a pre-norm encoder: RoPE, GeGLU from one fused `Wi`, LayerNorms without bias, the embeddings' own "
                 "norm, no norm before layer 0's attention, a final norm, a masked-LM head; global and local layers "
                 "(`layer_types`, `global_attn_every_n_layers`): a local layer's window reaches both ways, |i − j| ≤ "
                 "`local_attention` / 2, with its own RoPE base (`local_rope_theta`)",
          kind="masked-LM encoder"),
)

IGNORED = {
    "classifier.*": "a sequence or token classification head",
    "head.*": "a classification model's pooling head (ModernBertForSequenceClassification), unread without an LM head",
}


def layer_types(hf: dict) -> list:
    """Each layer's kind: config.json's layer_types, else from global_attn_every_n_layers (default 3)."""
    L = need(hf, "num_hidden_layers")
    kinds = hf.get("layer_types")
    if kinds is None:
        every = hf.get("global_attn_every_n_layers", 3)
        kinds = ["sliding_attention" if i % every else "full_attention" for i in range(L)]
    return kinds


def rope_theta(hf: dict) -> float:
    """The global layers' RoPE base: rope_parameters.full_attention.rope_theta, else global_rope_theta (160000)."""
    params = (hf.get("rope_parameters") or {}).get("full_attention") or {}
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
        raise QkvError(f"ModernBERT rope_parameters.full_attention {params!r:.60} is not supported; only the "
                       "default RoPE is")
    return float(params.get("rope_theta", hf.get("global_rope_theta", 160000.0)))


def local_rope_theta(hf: dict) -> float:
    """The local layers' RoPE base: rope_parameters.sliding_attention.rope_theta, else local_rope_theta (10000)."""
    params = (hf.get("rope_parameters") or {}).get("sliding_attention") or {}
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
        raise QkvError(f"ModernBERT rope_parameters.sliding_attention {params!r:.60} is not supported; only the "
                       "default RoPE is")
    return float(params.get("rope_theta", hf.get("local_rope_theta", 10000.0)))


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    kinds = layer_types(hf)
    L = need(hf, "num_hidden_layers")
    if not isinstance(kinds, list) or len(kinds) != L or any(k not in ("full_attention", "sliding_attention")
                                                             for k in kinds):
        raise QkvError(f"ModernBERT layer_types {str(kinds)[:60]} must name each of the {L} layers full_attention or "
                       "sliding_attention; restore the checkpoint's config.json")
    local = hf.get("local_attention", 128)
    if isinstance(local, bool) or not isinstance(local, int) or local < 2:
        raise QkvError(f"ModernBERT local_attention={local!r:.20} must be a whole number ≥ 2; fix the model's config")
    windows = tuple(local // 2 + 1 if k == "sliding_attention" else None for k in kinds)   # |i − j| ≤ local // 2
    if hf.get("mlp_bias", False):
        raise QkvError("ModernBERT mlp_bias=true is not supported: the GeGLU's activated half would need a bias of "
                       "its own; use a checkpoint without it")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family="modernbert", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 8192),
        causal=False, norm="layer", norm_place="pre", norm_eps=hf.get("norm_eps", 1e-5), position="rope",
        rope_theta=rope_theta(hf), activation=activation(hf.get("hidden_activation", "gelu")), gated_ffn=True,
        qkv_bias=bias, out_bias=bias, ffn_bias=False, embed_norm=True, final_norm=True,
        layer_windows=windows if any(windows) else None,
        local_rope_theta=local_rope_theta(hf) if any(windows) else None,
        lm_head=masked_lm(hf), head_activation=activation(hf.get("classifier_activation", "gelu")),
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=hf.get("pad_token_id", 50283), pad_embedding_frozen=True,
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


def _norm(ours: str, hf: str, **kw) -> list[Row]:
    """A LayerNorm at HF: γ, and β when the checkpoint has one (norm_bias)."""
    return [Row(f"{ours}.weight", f"{hf}.weight", "d", **kw),
            Row(f"{ours}.bias", f"{hf}.bias", "d", optional=True, **kw)]


def _linear(W: str, hf: str, shape: str, b: str, **kw) -> list[Row]:
    """A Linear at HF, its bias when the checkpoint has one (attention_bias, mlp_bias)."""
    return [Row(W, f"{hf}.weight", shape, LINEAR, **kw), Row(b, f"{hf}.bias", shape.split()[-1], optional=True, **kw)]


HEAD = ("decoder.weight", "decoder.bias")      # a checkpoint that holds either has the masked-LM head

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. Wqkv's rows are [Q; K; V] and
# Wi's [in; gate] (each part a view); the first layer has no norm before attention (the embeddings' norm serves).
# With the head, the encoder's names are under "model." and the head's beside it.
ROWS = [
    Row("tok_embed", "embeddings.tok_embeddings.weight", "V d"),
    *_norm("embed_norm", "embeddings.norm"),
    *_norm("block.attn_norm", "layers.{i}.attn_norm", layers=lambda cfg, i: i > 0),
    Row(("block.attn.W_Q", "block.attn.W_K", "block.attn.W_V"), "layers.{i}.attn.Wqkv.weight", "d q+kv+kv", LINEAR,
        parts="q kv kv"),
    Row(("block.attn.b_Q", "block.attn.b_K", "block.attn.b_V"), "layers.{i}.attn.Wqkv.bias", "q+kv+kv",
        parts="q kv kv", optional=True),
    *_linear("block.attn.W_O", "layers.{i}.attn.Wo", "q d", "block.attn.b_O"),
    *_norm("block.ffn_norm", "layers.{i}.mlp_norm"),
    Row(("block.ffn.W_gate", "block.ffn.W_in"), "layers.{i}.mlp.Wi.weight", "d f+f", LINEAR, parts="f f"),
    Row("block.ffn.W_out", "layers.{i}.mlp.Wo.weight", "f d", LINEAR),
    *_norm("final_norm", "final_norm"),
    *_linear("W_head", "head.dense", "d d", "b_head", when=masked_lm_head, root=True, also=HEAD),
    *_norm("head_norm", "head.norm", when=masked_lm_head, root=True, also=HEAD),
    Row("W_vocab", "decoder.weight", "d V", Head(), masked_lm_head, root=True, also=HEAD),
    Row("b_vocab", "decoder.bias", "V", when=masked_lm_head, root=True, also=HEAD, optional=True),
]
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a ModernBertModel (or ModernBertForMaskedLM): its layers' kinds, the local window
    and both RoPE bases."""
    windows = [cfg.window(i) for i in range(cfg.n_layers)]
    local = next((w for w in windows if w is not None), None)
    return reads_back(cfg, {
        "model_type": "modernbert", "architectures": ["ModernBertForMaskedLM" if cfg.lm_head else "ModernBertModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
        "norm_eps": cfg.norm_eps, "hidden_activation": HF_ACTIVATIONS[cfg.activation],
        "classifier_activation": HF_ACTIVATIONS[cfg.head_activation], "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
        "local_attention": 128 if local is None else 2 * (local - 1),
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": cfg.local_rope_theta or 10000.0}},
        "attention_bias": cfg.qkv_bias, "mlp_bias": False, "tie_word_embeddings": cfg.tied_embeddings,
        **special_ids(cfg),
        "attention_dropout": 0.0, "embedding_dropout": 0.0, "mlp_dropout": 0.0,
    }, config)

"""OPT (Meta's OPT-125m … 66b, OPT-350m's post-LN layout): learned positions from row 2, LayerNorm, ReLU FFN.

Its tensors: `ROWS` below, each checkpoint name (relative to OPTModel) beside ours and how it is stored, read
both ways (loading and saving).

Knobs: do_layer_norm_before (true: pre-LN, x + Box(Norm(x)), then a final norm; false, OPT-350m: post-LN,
Norm(x + Box(x)) after each box, and no final norm); _remove_final_layer_norm (pre-LN without the final
norm); word_embed_proj_dim ≠ hidden_size (OPT-350m: a 512-wide table projected to the 1024-wide stream before
the positions are added, and back before the tied head: `d_embed`, embed_in / unembed_in); enable_bias (every
linear map's bias); layer_norm_elementwise_affine false (LayerNorms without γ, β: `norm_affine`);
activation_function. dropout, attention_dropout and layerdrop are training's: qkv runs the model in eval.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, special_ids
from .table import LINEAR, About, How, Row, attention, both_ways, linear, lm_head, qkv_bias

MODEL_TYPES = ("opt",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("opt",), models="OPT-125m … 66b, OPT-350m",
          brings="learned positions read from row p + 2, ReLU, pre-LN or post-LN without a final norm "
                 "(`do_layer_norm_before`), an embedding narrower than the stream mapped in and out "
                 "(`word_embed_proj_dim`: project_in / project_out), `enable_bias`, LayerNorms without γ, β",
          kind="decoder", refuses=("dla",), when="post-LN (OPT-350m)"),
)

OFFSET = 2                     # OPTLearnedPositionalEmbedding: position p reads row p + 2

# Tensors an OPT checkpoint may hold that qkv never reads, relative to OPTModel.
IGNORED = {
    "lm_head.weight": "a stored copy of embed_tokens when tie_word_embeddings",
}


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes({k: v for k, v in hf.items() if k not in ("head_dim", "num_key_value_heads")}, d, H)
    pre = bool(hf.get("do_layer_norm_before", True))
    width = hf.get("word_embed_proj_dim", d)
    bias = bool(hf.get("enable_bias", True))
    return ModelConfig(
        family="opt", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "ffn_dim"), max_positions=hf.get("max_position_embeddings", 2048), causal=True,
        norm="layer", norm_place="pre" if pre else "post", norm_eps=1e-5, position="learned",
        position_offset=OFFSET, activation=activation(hf.get("activation_function", "relu")), gated_ffn=False,
        d_embed=None if width == d else width, norm_affine=bool(hf.get("layer_norm_elementwise_affine", True)),
        qkv_bias=bias, out_bias=bias, ffn_bias=bias, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        final_norm=pre and not hf.get("_remove_final_layer_norm", False), lm_head=True,
        pad_token_id=hf.get("pad_token_id", 1), bos_token_id=hf.get("bos_token_id", 2),
        eos_token_id=hf.get("eos_token_id", 2), pad_embedding_frozen=True,
    )


class Affine(How):
    """A LayerNorm's γ, stored only when norm_affine (else γ = 1, none stored, none written)."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, shape, dtype) if cfg.norm_affine else np.ones(shape, dtype)

    def write(self, value, cfg):
        return value if cfg.norm_affine else None


def affine(cfg: ModelConfig) -> bool:
    return cfg.norm_affine


def final(cfg: ModelConfig) -> bool:
    return cfg.final_norm


def projected(cfg: ModelConfig) -> bool:
    return cfg.d_embed is not None


def _norm(ours: str, hf: str, when=None) -> list[Row]:
    """A LayerNorm: γ (1 when not norm_affine) and β (only when norm_affine)."""
    return [Row(f"{ours}.weight", f"{hf}.weight", "d", Affine(), when),
            Row(f"{ours}.bias", f"{hf}.bias", "d", when=affine if when is None else lambda c: affine(c) and when(c))]


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one (enable_bias: every
# linear map's bias, or none).
ROWS = [
    Row("tok_embed", "decoder.embed_tokens.weight", "V e"),                         # (V, d_embed)
    Row("pos_embed", "decoder.embed_positions.weight", f"P+{OFFSET} d"),
    Row("embed_in", "decoder.project_in.weight", "e d", LINEAR, projected),
    Row("unembed_in", "decoder.project_out.weight", "d e", LINEAR, projected),
    *_norm("block.attn_norm", "decoder.layers.{i}.self_attn_layer_norm"),
    *attention("decoder.layers.{i}.self_attn", qkv_bias, qkv_bias, out="out_proj"),
    *_norm("block.ffn_norm", "decoder.layers.{i}.final_layer_norm"),
    *linear("block.ffn.W_in", "decoder.layers.{i}.fc1", "d f", "block.ffn.b_in", qkv_bias),
    *linear("block.ffn.W_out", "decoder.layers.{i}.fc2", "f d", "block.ffn.b_out", qkv_bias),
    *_norm("final_norm", "decoder.final_layer_norm", final),
    lm_head("lm_head.weight", "e V", prefer_stored=False),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an OPTForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "opt", "architectures": ["OPTForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "ffn_dim": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
        "do_layer_norm_before": cfg.norm_place == "pre",
        "_remove_final_layer_norm": cfg.norm_place == "pre" and not cfg.final_norm,
        "word_embed_proj_dim": cfg.d_embed or cfg.d_model, "enable_bias": cfg.qkv_bias,
        "layer_norm_elementwise_affine": cfg.norm_affine, "activation_function": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "dropout": 0.0, "attention_dropout": 0.0, "layerdrop": 0.0,
        **special_ids(cfg),
    }, config)

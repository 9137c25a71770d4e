"""nomic-bert (nomic-embed-text): BERT's post-norm encoder with RoPE instead of a position table and a SwiGLU FFN.

Its tensors: `ROWS` below, each checkpoint name (relative to NomicBertModel) beside ours and how it is stored, read
both ways (loading and saving). The names are the nomic-embed checkpoints' own, which transformers 5 reads and
writes back (its conversion mapping renames them in memory: q/k/v_proj, up/gate/down_proj, post_*_layernorm):
    embeddings.word_embeddings / token_type_embeddings   tok_embed / type_embed (no position table)
    emb_ln                                             embed_norm
    encoder.layers.{i}.attn.Wqkv                       [W_Q; W_K; W_V] rows, no biases; q, k turned by RoPE
                                                       (halves of each head, base rope_theta, 1000 by default)
    encoder.layers.{i}.attn.out_proj                   W_O, no bias
    encoder.layers.{i}.norm1                           attn_norm (after attention's residual: post-norm)
    encoder.layers.{i}.mlp.fc12 / fc11 / fc2           W_gate / W_in / W_out: act(x·W_gate) ⊙ x·W_in, no biases
    encoder.layers.{i}.norm2                           ffn_norm
    cls.predictions.transform.dense / layer_norm, cls.predictions.decoder (+ bias)   NomicBertForMaskedLM's head
                                                       (act = hidden_act), beside "nomic_bert."
Positions are 0…n−1 whatever the mask, as transformers numbers them; a size config.json leaves out is
NomicBertConfig's default (as transformers reads nomic-embed-text-v1.5's config.json, whose n_embd … it ignores). rope_parameters' scalings are read as for
Llama; a partial_rotary_factor is refused (NomicBertRotaryEmbedding turns whole heads). `hf_config` / `tensors`
write a NomicBertModel or NomicBertForMaskedLM. llama.cpp's `nomic-bert` files (GGUF): the encoder as stored (Wqkv's
rows [Q; K; V] in both, RoPE on halves), no masked-LM head (an embedding model: its hidden states), the token types
(tokenizer.ggml.token_type_count), attention.causal false, the WordPiece vocabulary in phantom-space form
(gguf_tokenizer).
"""

from __future__ import annotations

from dataclasses import replace

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, rope_parameters, special_ids
from .roberta import masked_lm
from .table import About, Arch, Head, How, Row, both_ways, fused_qkv, gated_ffn, layer_norm, linear

MODEL_TYPES = ("nomic_bert",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("nomic_bert",), models="nomic-bert (nomic-embed-text)",
          brings="BERT's post-norm blocks with RoPE on q, k (no position table, base 1000 by default), a SwiGLU FFN "
                 "and no biases in attention or FFN; token types; a masked-LM head",
          kind="masked-LM encoder"),
)

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "embeddings.token_type_ids": "a buffer of zeros older transformers saved",
    "rotary_emb.*": "RoPE's speeds, a buffer (computed)",
    "pooler.*": "the pooler (a dense layer on [CLS]), not part of the encoder",
    "cls.predictions.bias": "cls.predictions.decoder.bias's copy (tied to it), in files that hold both",
    "classifier.*": "a sequence or token classification head",
}
THETA = 1000.0                         # NomicBertConfig.default_theta
DEFAULTS = {"vocab_size": 30528, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072}  # NomicBertConfig's own (the nomic-embed files' config.json names them otherwise)


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and rope_scaling, from the old keys or transformers 5's `rope_parameters`."""
    params = hf.get("rope_parameters") or {}
    if hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise QkvError("nomic_bert with partial_rotary_factor ≠ 1 is not supported: NomicBertRotaryEmbedding turns "
                       "whole heads; use a checkpoint without it")
    theta = hf.get("rope_theta", params.get("rope_theta", THETA))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return float(theta), scaling


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    act = activation(hf.get("hidden_act", "silu"))
    pad = hf.get("pad_token_id", 0)
    return ModelConfig(
        family="nomic_bert", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_head=hf.get("head_dim") or d // H, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 2048), causal=False, norm="layer", norm_place="post",
        norm_eps=hf.get("layer_norm_eps", 1e-12), position="rope", rope_theta=theta, rope_scaling=scaling,
        activation=act, gated_ffn=True, qkv_bias=False, out_bias=False, ffn_bias=False,
        type_vocab_size=hf.get("type_vocab_size", 2), embed_norm=True, final_norm=False,
        lm_head=masked_lm(hf), head_activation=act, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=pad, pad_embedding_frozen=pad is not None,           # nn.Embedding's padding_idx
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


class DecoderBias(How):
    """b_vocab: cls.predictions.decoder.bias, or (files that hold only the tied copy) cls.predictions.bias; written
    as cls.predictions.bias when tied (the head's own bias, which decoder.bias is), as the decoder's when untied."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name if store.has(name) else "cls.predictions.bias", shape, dtype)

    def write_all(self, name, value, cfg):
        return {"cls.predictions.bias" if cfg.tied_embeddings else name: value}


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


HEAD = "cls.predictions.transform.dense.weight"     # a checkpoint that holds it has the masked-LM head

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. BERT's embeddings without
# positions, the blocks (no biases), then the masked-LM head (beside the encoder, "nomic_bert.").
ROWS = [
    Row("tok_embed", "embeddings.word_embeddings.weight", "V d"),
    Row("type_embed", "embeddings.token_type_embeddings.weight", "T d"),
    *layer_norm("embed_norm", "emb_ln"),
    *fused_qkv("encoder.layers.{i}.attn.Wqkv"),
    *linear("block.attn.W_O", "encoder.layers.{i}.attn.out_proj", "q d"),
    *layer_norm("block.attn_norm", "encoder.layers.{i}.norm1"),
    *gated_ffn("encoder.layers.{i}.mlp", gate="fc12", up="fc11", down="fc2"),
    *layer_norm("block.ffn_norm", "encoder.layers.{i}.norm2"),
    *[replace(r, root=True, also=HEAD) for r in (
        *linear("W_head", "cls.predictions.transform.dense", "d d", "b_head", when=masked_lm_head),
        *layer_norm("head_norm", "cls.predictions.transform.layer_norm", when=masked_lm_head),
        Row("W_vocab", "cls.predictions.decoder.weight", "d V", Head(), masked_lm_head),
        Row("b_vocab", "cls.predictions.decoder.bias", "V", DecoderBias(), masked_lm_head))],
]
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "nomic_bert.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a NomicBertModel (or NomicBertForMaskedLM) with these knobs (no dropout)."""
    return reads_back(cfg, {
        "model_type": "nomic_bert", "architectures": ["NomicBertForMaskedLM" if cfg.lm_head else "NomicBertModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "head_dim": cfg.d_head, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "rope_parameters": rope_parameters(cfg), "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        **special_ids(cfg),
    }, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """nomic-bert's config.json of a llama.cpp file: a NomicBertModel (no head), its token types, SwiGLU (SiLU).
    pooling_type is read and dropped (how llama.cpp pools the hidden states into one embedding, after the model: qkv
    gives the hidden states); causal attention is refused."""
    if meta.get(f"{a}.attention.causal", False) is not False:
        raise QkvError(f"the GGUF nomic-bert model has attention.causal {meta[f'{a}.attention.causal']!r:.10}; "
                       "nomic-bert attends both ways (false); the file is damaged")
    T = meta.get("tokenizer.ggml.token_type_count", 2)
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise QkvError(f"the GGUF value tokenizer.ggml.token_type_count = {T!r:.20} is not a whole number ≥ 1; the "
                       "file is damaged")
    dims["T"] = T
    return {k: v for k, v in hf.items() if k not in ("num_key_value_heads", "rope_theta", "intermediate_size")} | {
        "architectures": ["NomicBertModel"], "intermediate_size": dims["f"], "type_vocab_size": T,
        "head_dim": dims["d_head"], "rope_parameters": {"rope_type": "default", "rope_theta": dims["theta"]}}


# llama.cpp's architecture (gguf_archs reads it by this table): BERT's names for nomic's blocks.
GGUF = {
    "nomic-bert": Arch("nomic_bert", "NomicBertModel",
                       {"attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "attn_output_norm": "norm1",
                        "ffn_up": "mlp.fc11", "ffn_gate": "mlp.fc12", "ffn_down": "mlp.fc2",
                        "layer_output_norm": "norm2"},
                       {"token_embd": "embeddings.word_embeddings", "token_types": "embeddings.token_type_embeddings",
                        "token_embd_norm": "emb_ln"},
                       norm="layer", norm_biases=True, layers="encoder.layers",
                       keys=("attention.causal", "pooling_type"), config=_gguf_config),
}

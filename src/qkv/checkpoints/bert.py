"""BERT (and MiniLM, a small BERT): post-norm, learned positions, token types, erf GELU.

Its tensors: `ROWS` below, each checkpoint name (relative to BertModel) beside ours and how it is stored, read
both ways (loading and saving).
The pooler and any task head are not part of the encoder: IGNORED lists them, with the buffers
older files carry; any other tensor the table does not read makes the checkpoint refused.
torch's Linear stores W (out, in): we read its transpose, a view. `config` / `weights` read a
checkpoint by this table; `hf_config` / `tensors` write one, a BertModel without a pooler.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back
from .table import About, How, Row, both_ways, linear

MODEL_TYPES = ("bert",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("bert",), models="BERT, all-MiniLM",
          brings="post-norm, learned positions, token types, erf GELU, pooler",
          kind="encoder"),
)

# Tensors a BERT checkpoint may hold that qkv never reads ({i}: a layer, *: anything), relative to BertModel.
IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "pooler.*": "the pooler (a dense layer on [CLS]), not part of the encoder",
    "cls.*": "BertForMaskedLM / BertForPreTraining's heads",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "BertForQuestionAnswering's head",
}


def config(hf: dict) -> ModelConfig:
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise QkvError(f"BERT position_embedding_type {hf['position_embedding_type']!r} is not supported; "
                       "only 'absolute' is")
    check_shapes(hf, need(hf, "hidden_size"), need(hf, "num_attention_heads"))
    return ModelConfig(
        family="bert", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "hidden_size"),
        n_layers=need(hf, "num_hidden_layers"), n_heads=need(hf, "num_attention_heads"),
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 512),
        causal=False, norm="layer", norm_place="post", norm_eps=hf.get("layer_norm_eps", 1e-12),
        position="learned", activation=activation(hf.get("hidden_act", "gelu")),
        type_vocab_size=hf.get("type_vocab_size", 2), embed_norm=True, final_norm=False, lm_head=False,
        pad_token_id=hf.get("pad_token_id"), pad_embedding_frozen=True,          # nn.Embedding's padding_idx
    )


class TFNames(How):
    """A LayerNorm's γ or β, which checkpoints converted from TensorFlow call "gamma", "beta" (when the norm
    has no .weight); written as .weight, .bias."""

    def read(self, store, name, shape, dtype, cfg):
        base, kind = name.rsplit(".", 1)
        if not store.has(f"{base}.weight"):
            name = f"{base}.{'gamma' if kind == 'weight' else 'beta'}"
        return store.get(name, shape, dtype)


TF_NAMES = TFNames()


def layer_norm(ours: str, hf: str, size: str = "d", when=None, root: bool = False, also: str | None = None
               ) -> list[Row]:
    """A LayerNorm at HF (γ and β, under TensorFlow's names too) as NormWeights OURS."""
    return [Row(f"{ours}.weight", f"{hf}.weight", size, TF_NAMES, when, root=root, also=also),
            Row(f"{ours}.bias", f"{hf}.bias", size, TF_NAMES, when, root=root, also=also)]


# The blocks under BERT's names (encoder.layer.{i}.…), which RoBERTa and ELECTRA share: post-norm, each norm
# after its box's residual.
BLOCK_ROWS = [
    *linear("block.attn.W_Q", "encoder.layer.{i}.attention.self.query", "d q", "block.attn.b_Q"),
    *linear("block.attn.W_K", "encoder.layer.{i}.attention.self.key", "d kv", "block.attn.b_K"),
    *linear("block.attn.W_V", "encoder.layer.{i}.attention.self.value", "d kv", "block.attn.b_V"),
    *linear("block.attn.W_O", "encoder.layer.{i}.attention.output.dense", "q d", "block.attn.b_O"),
    *layer_norm("block.attn_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    *linear("block.ffn.W_in", "encoder.layer.{i}.intermediate.dense", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "encoder.layer.{i}.output.dense", "f d", "block.ffn.b_out"),
    *layer_norm("block.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
]

# The embeddings: tokens, positions (RoBERTa's after its offset rows), token types, then a LayerNorm. E: their
# width (ELECTRA's may be narrower than d_model).
EMBEDDING_ROWS = [
    Row("tok_embed", "embeddings.word_embeddings.weight", "V E"),
    Row("pos_embed", "embeddings.position_embeddings.weight", "P+o E"),
    Row("type_embed", "embeddings.token_type_embeddings.weight", "T E"),
    *layer_norm("embed_norm", "embeddings.LayerNorm", "E"),
]

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one (a BertModel, no pooler).
ROWS = EMBEDDING_ROWS + BLOCK_ROWS
weights, tensors = both_ways(ROWS, "")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a BertModel with these knobs (no dropout: qkv trains without it)."""
    return reads_back(cfg, {
        "model_type": "bert", "architectures": ["BertModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "position_embedding_type": "absolute", "is_decoder": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": cfg.pad_token_id,
    }, config)

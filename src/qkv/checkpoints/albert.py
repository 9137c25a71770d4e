"""ALBERT: BERT's post-norm blocks whose weights the layers share, after factorised embeddings (E wide, projected).

Its tensors, each checkpoint name (relative to AlbertModel) beside ours and how it is stored, read both ways
(loading and saving):
    embeddings.word_embeddings / position_embeddings / token_type_embeddings
                                                       tok_embed / pos_embed / type_embed (E wide)
    embeddings.LayerNorm                               embed_norm (E)
    encoder.embedding_hidden_mapping_in                W_embed, b_embed: E → d_model, after the norm (as ELECTRA's)
    encoder.albert_layer_groups.{g}.albert_layers.{k}.   a stored layer, `LAYER_ROWS`:
        attention.query / key / value / dense          W_Q / W_K / W_V / W_O (+ b)
        attention.LayerNorm                            attn_norm (post-norm)
        ffn / ffn_output                               W_in / W_out (+ b)
        full_layer_layer_norm                          ffn_norm
    predictions.dense / LayerNorm / decoder (+ bias)   AlbertForMaskedLM's head: d → E, act, norm, W_vocab (E, V)
num_hidden_groups G groups hold inner_group_num layers each; the L passes run group int(p / (L / G)), its layers
in turn (AlbertTransformer), so qkv's model has n_layers = L·inner_group_num blocks, block j reading stored layer
cfg.stored_layer(j): the blocks of one stored layer hold the same arrays (nothing copied: an in-place change of one
moves them all, one tensor; each block is a tree of its own, so replacing a block's array changes that block only),
and training sums their gradients into the one tensor (qkv.core.backward.shared_gradients). Writing, each stored
layer is written once, from the first block that reads it. `hf_config` / `tensors` write an AlbertModel or AlbertForMaskedLM.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

from ..core.config import ModelConfig
from ..core.weights import BlockWeights, Weights
from ..runtime.errors import QkvError
from . import bert
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, need, reads_back, special_ids
from .table import About, Head, How, Row, layer_norm, linear, read_table, write_table

MODEL_TYPES = ("albert",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("albert",), models="ALBERT",
          brings="BERT's post-norm blocks sharing their weights (`num_hidden_groups` groups of `inner_group_num` "
                 "layers, one set of arrays read by every block of a group: gradients summed), factorised "
                 "embeddings E wide projected to d_model (`embedding_hidden_mapping_in`); a masked-LM head back to E",
          kind="masked-LM encoder"),
)

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "embeddings.token_type_ids": "a buffer of zeros older transformers saved",
    "pooler.*": "the pooler (a dense layer on [CLS]), not part of the encoder",
    "predictions.bias": "predictions.decoder.bias's copy (tied to it), in files that hold both",
    "sop_classifier.*": "AlbertForPreTraining's sentence-order head",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "AlbertForQuestionAnswering's head",
}
HEADS = ("ForMaskedLM", "ForPreTraining")      # the architectures whose masked-LM head is read


def _count(hf: dict, key: str) -> int:
    """config.json's KEY (1 when absent), which must be a whole number ≥ 1."""
    v = hf.get(key, 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise QkvError(f"config.json {key} = {v!r:.20} is not a positive integer; restore the checkpoint's config.json")
    return v


def config(hf: dict) -> ModelConfig:
    d, L = need(hf, "hidden_size"), need(hf, "num_hidden_layers")
    check_shapes(hf, d, need(hf, "num_attention_heads"))
    groups, depth = _count(hf, "num_hidden_groups"), _count(hf, "inner_group_num")
    if groups > L:
        raise QkvError(f"albert num_hidden_groups {groups} is more than num_hidden_layers {L}: the groups past "
                       f"the {L} passes would never run; restore the checkpoint's config.json")
    act = activation(hf.get("hidden_act", "gelu_new"))
    pad = hf.get("pad_token_id", 0)
    return ModelConfig(
        family="albert", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=L * depth,
        n_heads=need(hf, "num_attention_heads"), d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 512), causal=False, norm="layer", norm_place="post",
        norm_eps=hf.get("layer_norm_eps", 1e-12), position="learned", activation=act,
        type_vocab_size=hf.get("type_vocab_size", 2), embed_norm=True, final_norm=False,
        embed_dim=hf.get("embedding_size", 128), shared_groups=groups, group_depth=depth,
        lm_head=any(str(a).endswith(HEADS) for a in hf.get("architectures") or []),
        head_activation=act,                                 # AlbertMLMHead: ACT2FN[hidden_act]
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=pad, pad_embedding_frozen=pad is not None,   # nn.Embedding's padding_idx
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


class DecoderBias(How):
    """b_vocab: predictions.decoder.bias, or (files that hold only the tied copy) predictions.bias; written as
    predictions.bias when tied (the head's own bias, which decoder.bias is), as the decoder's when untied."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name if store.has(name) else "predictions.bias", shape, dtype)

    def write_all(self, name, value, cfg):
        return {"predictions.bias" if cfg.tied_embeddings else name: value}


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


HEAD = "predictions.dense.weight"        # a checkpoint that holds it has the masked-LM head, whatever config.json says

# The rows outside the layers: BERT's embeddings (E wide), their projection to d_model, the masked-LM head (beside
# the encoder, "albert.").
TOP_ROWS = [
    *bert.EMBEDDING_ROWS,
    *linear("W_embed", "encoder.embedding_hidden_mapping_in", "E d", "b_embed"),
    *[replace(r, root=True, also=HEAD) for r in (
        *linear("W_head", "predictions.dense", "d E", "b_head", when=masked_lm_head),
        *layer_norm("head_norm", "predictions.LayerNorm", "E", when=masked_lm_head),
        Row("W_vocab", "predictions.decoder.weight", "E V", Head(), masked_lm_head),
        Row("b_vocab", "predictions.decoder.bias", "V", DecoderBias(), masked_lm_head))],
]

LAYER = "encoder.albert_layer_groups.{g}.albert_layers.{k}"      # stored layer k of group g
LAYER_ROWS = [
    *linear("block.attn.W_Q", f"{LAYER}.attention.query", "d q", "block.attn.b_Q"),
    *linear("block.attn.W_K", f"{LAYER}.attention.key", "d kv", "block.attn.b_K"),
    *linear("block.attn.W_V", f"{LAYER}.attention.value", "d kv", "block.attn.b_V"),
    *linear("block.attn.W_O", f"{LAYER}.attention.dense", "q d", "block.attn.b_O"),
    *layer_norm("block.attn_norm", f"{LAYER}.attention.LayerNorm"),
    *linear("block.ffn.W_in", f"{LAYER}.ffn", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", f"{LAYER}.ffn_output", "f d", "block.ffn.b_out"),
    *layer_norm("block.ffn_norm", f"{LAYER}.full_layer_layer_norm"),
]
ROWS = TOP_ROWS + LAYER_ROWS          # the family's table (a stored layer's names under {g}, {k}: `layer_rows`)


def layer_rows(stored: int, cfg: ModelConfig) -> list[Row]:
    """LAYER_ROWS of stored layer STORED (= g·inner_group_num + k): its group's and place's names."""
    g, k = divmod(stored, cfg.group_depth)
    return [replace(r, hf=r.hf.replace("{g}", str(g)).replace("{k}", str(k))) for r in LAYER_ROWS]


def _shared(tree):
    """A new tree of the weights dataclasses holding the very same arrays (a block of its own, no array copied)."""
    if isinstance(tree, list):
        return [_shared(x) for x in tree]
    if is_dataclass(tree):
        return type(tree)(**{f.name: _shared(getattr(tree, f.name)) for f in fields(tree)})
    return tree


def weights(store, cfg: ModelConfig, dtype) -> Weights:
    """The Weights of CFG from STORE: the embeddings and head, each stored layer once, then every block a view of
    the stored layer it reads."""
    w = read_table(TOP_ROWS, store, cfg, dtype, n_layers=0)
    stored = [read_table(layer_rows(u, cfg), store, cfg, dtype, n_layers=1).blocks[0]
              for u in range(cfg.shared_groups * cfg.group_depth)]
    w.blocks = [_shared(stored[cfg.stored_layer(j)]) for j in range(cfg.n_layers)]
    return w


def tensors(weights: Weights, cfg: ModelConfig) -> dict:
    """Every tensor under transformers' full names, as its file stores it ("albert." before the encoder's with a
    head): each stored layer once, from the first block that reads it (a gradient tree: their sum,
    core.backward.shared_gradients); new arrays."""
    prefix = "" if weights.W_head is None else "albert."
    t = write_table(TOP_ROWS, replace(weights, blocks=[]), cfg, prefix)
    first: dict[int, BlockWeights] = {}
    for j, b in enumerate(weights.blocks):
        first.setdefault(cfg.stored_layer(j), b)
    for u, b in sorted(first.items()):
        t |= write_table(layer_rows(u, cfg), replace(weights, blocks=[b]), cfg, prefix)
    return c_arrays(t)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an AlbertModel (or AlbertForMaskedLM) with these knobs (no dropout)."""
    return reads_back(cfg, {
        "model_type": "albert", "architectures": ["AlbertForMaskedLM" if cfg.lm_head else "AlbertModel"],
        "vocab_size": cfg.vocab_size, "embedding_size": cfg.embed_dim, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers // cfg.group_depth, "num_hidden_groups": cfg.shared_groups,
        "inner_group_num": cfg.group_depth, "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        **special_ids(cfg),
    }, config)

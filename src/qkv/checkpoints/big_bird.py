"""BigBird: BERT's encoder whose attention on long inputs is block-sparse: a window of blocks, global and random ones.

Its tensors: `ROWS` below, each checkpoint name (relative to BigBirdModel) beside ours and how it is stored, read
both ways (loading and saving): BERT's table (query/key/value biases as use_bias says), then BigBirdForMaskedLM's
head (cls.predictions: dense, act, LayerNorm, the tied decoder + its bias).

attention_type "original_full" is BERT's attention. "block_sparse" is what transformers'
BigBirdBlockSparseAttention computes, exactly (core/sparse_layers.py: bigbird_copies, sparse_mask): on an input of
n > (5 + 2r)·b tokens (b block_size, r num_random_blocks; shorter inputs run full attention, as BigBirdModel
switches) the first and last blocks of b
queries see every key, the others their block and its two neighbours, the first and last key blocks, and r random
blocks. The random blocks: in eval mode (a loaded model is) transformers draws none — its `_bigbird_block_rand_mask`
returns zeros — so each of the r is block 0, whose keys then enter those rows' softmax 1 + r times: qkv counts them
so (softmax(S + log c)), and records as the layer's attentions the weights each key really got (A·V = Z; the
matrix transformers returns writes one copy's share). Randomness in training mode is not qkv's: training reads the
same eval-mode mask. A pass that keeps no weight, or only each row's largest (keep=("attention_top",), what `qkv show
--out` keeps past 1024 tokens), computes each block of queries from its own key blocks only (core/sparse_layers.py:
sparse_layer_attention), as transformers' block-sparse kernel, never n × n: 4096 tokens on a tiny model (b = 64,
r = 3) peak at 9 MiB of NumPy arrays instead of 451 (41 MiB instead of 459 with each row's 64 largest; tracemalloc).
BigBird has no global projections: `--global-tokens` is refused in one line. Positions 0…n−1 whatever the mask, as BERT; rescale_embeddings multiplies E[ids] by √d_model.
A decoder (is_decoder, add_cross_attention: BigBirdForCausalLM) is refused. `hf_config` / `tensors` write a
BigBirdModel or BigBirdForMaskedLM.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import bert
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back
from .roberta import masked_lm, refuse_decoder
from .table import About, Head, How, Row, both_ways, linear

MODEL_TYPES = ("big_bird",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("big_bird",), models="BigBird",
          brings="BERT's encoder with block-sparse attention past (5 + 2r)·b tokens (`attention_type` block_sparse, "
                 "`block_size` b, `num_random_blocks` r): global first/last blocks, a window of 3 blocks, the r "
                 "random blocks transformers reads in eval mode (block 0, counted 1 + r times); the mask drawn "
                 "(`qkv explain sparse`), `rescale_embeddings`, a masked-LM head",
          kind="masked-LM encoder"),
)

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "embeddings.token_type_ids": "a buffer of zeros older transformers saved",
    "pooler.*": "the pooler (a dense layer on [CLS]), not part of the encoder",
    "cls.seq_relationship.*": "BigBirdForPreTraining's next-sentence head",
    "cls.predictions.bias": "the head's own bias, which an untied model's logits do not read (its decoder's bias)",
    "classifier.*": "a sequence or token classification head",
    "qa_classifier.*": "BigBirdForQuestionAnswering's head",
}


def attention(hf: dict) -> tuple[int, int] | None:
    """(block_size, num_random_blocks) of block_sparse attention, None for original_full."""
    kind = hf.get("attention_type", "block_sparse")
    if kind == "original_full":
        return None
    if kind != "block_sparse":
        raise QkvError(f"BigBird attention_type {kind!r:.40} is not supported; it is 'original_full' or 'block_sparse'")
    b, r = hf.get("block_size", 64), hf.get("num_random_blocks", 3)
    if any(isinstance(x, bool) or not isinstance(x, int) for x in (b, r)) or b < 1 or r < 1:
        raise QkvError(f"BigBird block_size={b!r:.20} and num_random_blocks={r!r:.20} must be whole numbers ≥ 1 (with "
                       "no random block transformers' block-sparse kernel does not run); fix the model's config, or "
                       "give attention_type original_full")
    return b, r


def config(hf: dict) -> ModelConfig:
    refuse_decoder(hf, "big_bird")
    check_shapes(hf, need(hf, "hidden_size"), need(hf, "num_attention_heads"))
    act = activation(hf.get("hidden_act", "gelu_new"))
    return ModelConfig(
        family="big_bird", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "hidden_size"),
        n_layers=need(hf, "num_hidden_layers"), n_heads=need(hf, "num_attention_heads"),
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 4096),
        causal=False, norm="layer", norm_place="post", norm_eps=hf.get("layer_norm_eps", 1e-12),
        position="learned", activation=act, type_vocab_size=hf.get("type_vocab_size", 2),
        qkv_bias=bool(hf.get("use_bias", True)), scale_embedding=bool(hf.get("rescale_embeddings", False)),
        embed_norm=True, final_norm=False, lm_head=masked_lm(hf), head_activation=act,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), block_sparse=attention(hf),
        pad_token_id=hf.get("pad_token_id", 0), pad_embedding_frozen=True, bos_token_id=hf.get("bos_token_id", 1),
        eos_token_id=hf.get("eos_token_id", 2),
    )


class VocabBias(How):
    """b_vocab: cls.predictions.decoder.bias, which the logits add (tied to cls.predictions.bias when the embeddings
    are: files then hold only that one); written as cls.predictions.bias when tied, as the decoder's when not (the
    head's own bias, which no forward reads then, is not written)."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name if store.has(name) else "cls.predictions.bias", shape, dtype)

    def write_all(self, name, value, cfg):
        return {"cls.predictions.bias" if cfg.tied_embeddings else name: value}


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


HEAD = "cls.predictions.transform.dense.weight"   # a checkpoint that holds it has the masked-LM head

# The table, read both ways: BERT's embeddings and blocks (Q, K, V biases as use_bias says), then
# BigBirdForMaskedLM's head beside the encoder ("bert.").
def qkv_bias(cfg: ModelConfig) -> bool:
    return cfg.qkv_bias


QKV_BIASES = ("block.attn.b_Q", "block.attn.b_K", "block.attn.b_V")
ROWS = [replace(r, when=qkv_bias) if r.ours in QKV_BIASES else r for r in bert.ROWS]
ROWS += [
    *linear("W_head", "cls.predictions.transform.dense", "d d", "b_head", when=masked_lm_head),
    *bert.layer_norm("head_norm", "cls.predictions.transform.LayerNorm", when=masked_lm_head),
    Row("W_vocab", "cls.predictions.decoder.weight", "d V", Head(prefer_stored=False), masked_lm_head),
    Row("b_vocab", "cls.predictions.decoder.bias", "V", VocabBias(), masked_lm_head),
]
ROWS = [replace(r, root=True, also=HEAD) if r.hf.startswith("cls.") else r for r in ROWS]
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "bert.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a BigBirdModel (or BigBirdForMaskedLM) with these knobs (no dropout)."""
    b, r = cfg.block_sparse or (64, 3)
    return reads_back(cfg, {
        "model_type": "big_bird", "architectures": ["BigBirdForMaskedLM" if cfg.lm_head else "BigBirdModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_bias": cfg.qkv_bias,
        "rescale_embeddings": cfg.scale_embedding, "tie_word_embeddings": cfg.tied_embeddings,
        "attention_type": "original_full" if cfg.block_sparse is None else "block_sparse",
        "block_size": b, "num_random_blocks": r, "is_decoder": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)

"""ESM-2 (model_type "esm"): a protein language model — a pre-norm encoder over amino acids with RoPE, erf GELU,
a final LayerNorm (`emb_layer_norm_after`), RoBERTa's masked-LM head, and a contact head.

Its tensors: `ROWS` below, each checkpoint name (relative to EsmModel) beside ours and how it is stored, read both
ways (loading and saving). EsmForMaskedLM keeps the encoder under "esm." and its head (lm_head.dense, GELU,
lm_head.layer_norm, W_vocab tied to the embeddings, lm_head.bias) beside it.
What transformers' EsmModel does, knob by knob:
- positions 0…n−1 whatever the mask (position_embedding_type "rotary", RoPE of `rope_theta` over all of each head,
  pairs (i, i + d_k/2)); "absolute" (ESM-1b, ESM-1v: learned positions counted over the ids) is refused;
- q·d_k^-½ before RoPE, which is S = Q·Kᵀ/√d_k after it (RoPE is linear);
- `token_dropout` (ESM-2's checkpoints): E[ids]·(1 − 0.15·0.8)/(1 − r), the rows of `mask_token_id` zeroed, r their
  share of the row's real tokens (ModelConfig.mask_dropout_id, blocks.mask_dropout);
- `emb_layer_norm_before` (a LayerNorm on the embeddings) honoured; `hidden_act` is not read (ESM's own erf GELU);
- the RoPE speeds a file keeps (rotary_embeddings.inv_freq, which transformers uses as they are) checked equal to
  rope_theta's, which the engine computes (`check_speeds`: 16-bit ones refused in one line);
- is_decoder, add_cross_attention, is_folding_model (ESMFold), a rope_parameters other than the default: refused;
- the contact head (contact_head.regression: a logistic regression over every layer's heads' symmetrised,
  APC-corrected maps) is held as Weights.W_contact, b_contact and computed by qkv.analysis.contacts.
The tokenizer: EsmTokenizer's vocab.txt (one token a line: every amino acid one letter, <cls> <pad> <eos> <unk>
<mask>) as a tokenizer.json of the `tokenizers` library that splits as EsmTokenizer does (`tokenizer_json`), read
when the checkpoint has no tokenizer.json (`tokenizer`). `hf_config` / `tensors` write an EsmModel or
EsmForMaskedLM.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..inputs.tokenizer import Tokenizer
from ..runtime.errors import QkvError
from . import bert
from .common import check_shapes, need, reads_back
from .roberta import masked_lm
from .table import About, Head, How, Row, both_ways, linear
from .tensors import TensorDict

MODEL_TYPES = ("esm",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("esm",), models="ESM-2 (protein language models)",
          brings="a pre-norm encoder over amino acids (its vocab.txt read as a tokenizer): RoPE, erf GELU, a final "
                 "LayerNorm, a masked-LM head, `token_dropout`'s rescaling by the share of `<mask>`, and the contact "
                 "head (every head's attention symmetrised, APC-corrected, a logistic regression: `qkv explain "
                 "proteins`)",
          kind="masked-LM encoder"),
)

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer",
    "rotary_embeddings.inv_freq": "RoPE's speeds, a buffer qkv computes from rope_theta",
    "encoder.layer.*.attention.self.rotary_embeddings.inv_freq": "RoPE's speeds as files keep them per layer",
    "pooler.*": "the pooler (a dense layer on <cls>), not part of the encoder",
    "classifier.*": "a sequence or token classification head",
}

MASK_RATIO_TRAIN = 0.15 * 0.8          # the share of masked tokens in all ESM training runs (transformers' constant)
EOS_ID = 2                             # the contact head's eos_idx (EsmContactPredictionHead's default)


def _refuse(hf: dict) -> None:
    """The ESM knobs qkv does not run, each refused in one line."""
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "rotary":
        raise QkvError(f"ESM position_embedding_type {kind!r:.30} is not supported (ESM-1b and ESM-1v's learned "
                       "positions); qkv runs ESM-2, whose config says 'rotary'")
    for knob in ("is_decoder", "add_cross_attention", "is_folding_model"):
        if hf.get(knob):
            raise QkvError(f"ESM {knob}=true is not supported; qkv runs ESM-2 as the bidirectional encoder "
                           "(EsmModel, EsmForMaskedLM), not ESMFold or a decoder")
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
        raise QkvError(f"ESM rope_parameters {params!r:.60} is not supported; only the default RoPE is")


def config(hf: dict) -> ModelConfig:
    _refuse(hf)
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    dropout = bool(hf.get("token_dropout", False))
    mask = hf.get("mask_token_id")
    if dropout and (isinstance(mask, bool) or not isinstance(mask, int)):
        raise QkvError("ESM token_dropout=true needs mask_token_id (the <mask> id whose share rescales the "
                       "embeddings); restore the checkpoint's config.json")
    theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    return ModelConfig(
        family="esm", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 1026),
        causal=False, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_eps", 1e-12), position="rope",
        rope_theta=float(theta), activation="gelu", embed_norm=bool(hf.get("emb_layer_norm_before")),
        final_norm=True, lm_head=masked_lm(hf), head_activation="gelu",
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        embedding_multiplier=1 - MASK_RATIO_TRAIN if dropout else 1.0, mask_dropout_id=mask if dropout else None,
        pad_token_id=hf.get("pad_token_id", 1), pad_embedding_frozen=True,
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id", 2),
    )


class Contact(How):
    """W_contact (L·H,): contact_head.regression.weight, a Linear (1, L·H) to one logit; its row, a view."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, (1, cfg.n_layers * cfg.n_heads), dtype)[0]

    def write(self, value, cfg):
        return value[None]


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


HEAD = ("lm_head.dense.weight", "lm_head.decoder.weight")   # a checkpoint holding either has the masked-LM head

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. Pre-norm blocks under BERT's
# names (each box's LayerNorm before it), the final norm, the contact head; the masked-LM head beside "esm.".
ROWS = [
    Row("tok_embed", "embeddings.word_embeddings.weight", "V d"),
    *bert.layer_norm("embed_norm", "embeddings.layer_norm", when=lambda cfg: cfg.embed_norm),
    *bert.layer_norm("block.attn_norm", "encoder.layer.{i}.attention.LayerNorm"),
    *linear("block.attn.W_Q", "encoder.layer.{i}.attention.self.query", "d q", "block.attn.b_Q"),
    *linear("block.attn.W_K", "encoder.layer.{i}.attention.self.key", "d kv", "block.attn.b_K"),
    *linear("block.attn.W_V", "encoder.layer.{i}.attention.self.value", "d kv", "block.attn.b_V"),
    *linear("block.attn.W_O", "encoder.layer.{i}.attention.output.dense", "q d", "block.attn.b_O"),
    *bert.layer_norm("block.ffn_norm", "encoder.layer.{i}.LayerNorm"),
    *linear("block.ffn.W_in", "encoder.layer.{i}.intermediate.dense", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "encoder.layer.{i}.output.dense", "f d", "block.ffn.b_out"),
    *bert.layer_norm("final_norm", "encoder.emb_layer_norm_after"),
    Row("W_contact", "contact_head.regression.weight", "1", Contact()),
    Row("b_contact", "contact_head.regression.bias", "1"),
    *linear("W_head", "lm_head.dense", "d d", "b_head", when=masked_lm_head),
    *bert.layer_norm("head_norm", "lm_head.layer_norm", when=masked_lm_head),
    Row("W_vocab", "lm_head.decoder.weight", "d V", Head(), masked_lm_head),
    Row("b_vocab", "lm_head.bias", "V", when=masked_lm_head),
]
ROWS = [replace(r, root=True, also=HEAD) if r.hf.startswith("lm_head.") else r for r in ROWS]
table_weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "esm.")


def weights(store, cfg: ModelConfig, dtype):
    """The table's Weights (`table_weights`), once the RoPE speeds the checkpoint keeps (rotary_embeddings.inv_freq,
    which transformers reads as they are) are rope_theta's, which the engine computes: a file whose speeds were
    kept in 16 bits would turn q and k otherwise, so it is refused in one line."""
    check_speeds(store, cfg)
    return table_weights(store, cfg, dtype)


def check_speeds(store, cfg: ModelConfig) -> None:
    """Every stored inv_freq (d_k/2,) equal to 1/θ^(2i/d_k) within float32's rounding, else one QkvError."""
    d = cfg.d_head
    want = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))     # (d_k/2,) as torch makes it
    for name in (n for n in store.names() if n.endswith("rotary_embeddings.inv_freq")):
        kept = np.asarray(store.tensors[name] if isinstance(store, TensorDict) else store.get(name, (d // 2,)),
                          np.float64)                                                   # (d_k/2,)
        if np.abs(kept / want - 1).max() > 1e-6:
            raise QkvError(f"the checkpoint's RoPE speeds {name!r} are not rope_theta={cfg.rope_theta:g}'s (kept in 16 "
                           "bits?), which qkv computes; save the model in float32 or fix rope_theta in config.json")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an EsmModel (or EsmForMaskedLM) with these knobs (no dropout)."""
    return reads_back(cfg, {
        "model_type": "esm", "architectures": ["EsmForMaskedLM" if cfg.lm_head else "EsmModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "layer_norm_eps": cfg.norm_eps,
        "position_embedding_type": "rotary", "rope_theta": cfg.rope_theta, "hidden_act": "gelu",
        "emb_layer_norm_before": cfg.embed_norm, "token_dropout": cfg.mask_dropout_id is not None,
        "mask_token_id": cfg.mask_dropout_id, "tie_word_embeddings": cfg.tied_embeddings, "is_decoder": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


# ── the tokenizer of amino acids ──────────────────────────────────────────────

def tokenizer_json(vocab: list[str]) -> str:
    """EsmTokenizer of VOCAB (vocab.txt's lines) as a tokenizer.json: every token of more than one character
    (<cls>, <pad>, <eos>, <unk>, <mask>, <null_1>) special and split off first; the text split at whitespace, then
    each one-letter token (an amino acid, ".", "-") a piece of its own, the runs of other characters one <unk> each
    (as EsmTokenizer's trie leaves them); `<cls> … <eos>` around a sequence."""
    if len(set(vocab)) != len(vocab) or not all(vocab) or "<unk>" not in vocab:
        raise QkvError("vocab.txt must hold distinct tokens, one a line, <unk> among them; use the checkpoint's own")
    letters = "".join(re.escape(t) for t in vocab if len(t) == 1)
    specials = [t for t in vocab if len(t) > 1]
    ids = {t: i for i, t in enumerate(vocab)}
    around = [t for t in ("<cls>", "<eos>") if t in ids]
    single = " ".join(["<cls>"] * ("<cls>" in ids) + ["$A"] + ["<eos>"] * ("<eos>" in ids))
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t in specials],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"},
            {"type": "Split", "pattern": {"Regex": f"[{letters}]"}, "behavior": "Isolated", "invert": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": t, "type_id": 0}} if t != "$A" else
                                      {"Sequence": {"id": "A", "type_id": 0}} for t in single.split()],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in around}},
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": ids, "unk_token": "<unk>"},
    }, ensure_ascii=False)


def tokenizer(directory: Path) -> Tokenizer | None:
    """The tokenizer of an ESM checkpoint without a tokenizer.json: its vocab.txt read as EsmTokenizer reads it
    (`tokenizer_json`), padded with <pad>; None without a vocab.txt."""
    path = Path(directory) / "vocab.txt"
    if not path.is_file():
        return None
    vocab = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return Tokenizer.from_json(tokenizer_json(vocab), special_tokens={"pad_token": "<pad>", "mask_token": "<mask>"})

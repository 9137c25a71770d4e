"""The guide's translation example (docs/guide.md#self-cross), learned: a small Marian-style model on the Korean→English grammar.

`qkv train --task translate-ko-en` trains it; the model qkv ships as `ko-en-tiny` is its result
(the command in its README reproduces it bit for bit). What it records every K steps, on held-out
sentences the model never saw:

    exact       the share translated exactly (greedy, word for word equal to the grammar's English)
    alignment   the share of English words whose strongest Korean word — the last decoder layer's
                cross-attention, averaged over its heads, in the row that wrote the word — is the
                word the grammar aligns it with ("I" → "나는")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import ko_en
from .seq2seq_backprop import decoder_inputs, loss_and_grads

EVAL_SENTENCES = 200          # held-out sentences each record translates (all of them at the end)


def pad_rows(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists → (ids (B, n) right-padded with 0, mask (B, n))."""
    n = max(len(r) for r in rows)
    ids = np.zeros((len(rows), n), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


def marian_config(vocab_size: int, d_model: int, layers: int, heads: int, max_positions: int = 32) -> ModelConfig:
    """A small MarianMT: post-norm, sinusoidal positions, E·√d_model, shared table tied to W_vocab, ReLU FFN."""
    return ModelConfig(
        family="marian", vocab_size=vocab_size, d_model=d_model, n_layers=layers, n_decoder_layers=layers,
        n_heads=heads, d_ff=4 * d_model, max_positions=max_positions, causal=True, norm="layer", norm_place="post",
        norm_eps=1e-5, position="sinusoidal", activation="relu", scale_embedding=True, final_norm=False,
        lm_head=True, tied_embeddings=True, encoder_decoder=True, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, pad_embedding_frozen=True)


class TranslateTask:
    """Korean sentences of the grammar → English; records exact-match and alignment on held-out sentences."""

    name = "translate-ko-en"

    def __init__(self, s, tokenizer_file: Path):
        from tokenizers import Tokenizer as HFTokenizer

        from ..runtime.io import write_text
        from ..inputs.tokenizer import Tokenizer

        self.s = s
        self.train, self.held_out = ko_en.split_pairs(s.seed)
        if not tokenizer_file.is_file():
            write_text(tokenizer_file, ko_en.word_tokenizer(self.train + self.held_out).to_str())
        self.hf_tokenizer = HFTokenizer.from_file(str(tokenizer_file))
        self.tokenizer = Tokenizer(tokenizer_file, special_tokens={"eos_token": "</s>", "pad_token": "<pad>",
                                                                   "unk_token": "<unk>"})
        self.config = marian_config(self.hf_tokenizer.get_vocab_size(), s.d_model, s.layers, s.heads)
        if s.d_model % s.heads:
            raise QkvError(f"--d-model {s.d_model} is not a multiple of --heads {s.heads}; choose sizes that divide")

    def describe(self) -> str:
        return (f"{len(self.train):,} Korean→English sentence pairs of the ko-en grammar "
                f"({len(self.held_out):,} more held out), {self.config.vocab_size} words in the vocabulary")

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return pad_rows([e.ids for e in self.hf_tokenizer.encode_batch(texts)])

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source ids, source mask, labels with −100 on padding) of STEP: a function of (seed, step) alone."""
        rng = np.random.default_rng([self.s.seed, step])
        pairs = [self.train[i] for i in rng.integers(0, len(self.train), self.s.batch)]
        src, mask = self.encode([p.ko for p in pairs])
        labels, lmask = self.encode([p.en for p in pairs])
        return src, mask, np.where(lmask == 1, labels, -100)

    def loss_and_grads(self, weights, batch):
        src, mask, labels = batch
        cfg = self.config
        return loss_and_grads(weights, cfg, src, mask, decoder_inputs(labels, cfg.decoder_start_token_id, 0), labels)

    def tokens(self, batch) -> int:
        return int((batch[2] != -100).sum() + batch[1].sum())

    def record(self, model, pairs=None) -> dict:
        """Exact-match translation and cross-attention alignment on held-out sentences."""
        pairs = self.held_out[:EVAL_SENTENCES] if pairs is None else pairs
        src, mask = self.encode([p.ko for p in pairs])
        out = model.generate(src, max_new_tokens=24, attention_mask=mask)
        exact = np.mean([self.decode(row) == p.en for row, p in zip(out, pairs)])
        return {"exact": round(float(exact), 4), "alignment": round(alignment(model, self, pairs), 4),
                "sample": f"{pairs[0].ko} → {self.decode(out[0])}"}

    def decode(self, row) -> str:
        """Generated ids (start token first) → the English text, up to </s>."""
        row = list(row[1:])
        row = row[:row.index(1)] if 1 in row else row
        return self.hf_tokenizer.decode(row)


def alignment(model, task: TranslateTask, pairs: list) -> float:
    """The share of English words whose strongest Korean word in the last decoder layer's cross-attention
    (mean over heads, the row that wrote the word, </s> left out) is the grammar's aligned word."""
    src, mask = task.encode([p.ko for p in pairs])
    labels, lmask = task.encode([p.en for p in pairs])
    tgt_in = decoder_inputs(np.where(lmask == 1, labels, -100), model.config.decoder_start_token_id, 0)
    cross = model.forward(src, mask, decoder_input_ids=tgt_in).cross_attentions[-1].mean(axis=1)   # (B, n_tgt, n_src)
    hits = [int(np.argmax(cross[i, t, :len(p.ko.split())])) == a
            for i, p in enumerate(pairs) for t, a in enumerate(p.align)]
    return float(np.mean(hits))

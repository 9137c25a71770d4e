"""What a model trains on: repeated random tokens (the induction task) and windows of a text.

    induction:  ids = [BOS] s₁ … s_half s₁ … s_half     s random, from default_rng([seed, step])
    text:       file ─UTF-8─▶ text ─tokenizer ("char" | "bpe")─▶ ids ─┬─ train_ids  (first 1 − val_fraction)
                                                                     └─ val_ids    (the rest)
                batch(seed, step, B, n) = B windows of n consecutive ids, starts from default_rng([seed, step])

Every batch depends only on (seed, step), never on what was drawn before: a run resumed at step
k draws exactly the batches the uninterrupted run would have drawn, so resuming bit for bit
needs no saved data state.

The loss is transformers' labels=input_ids convention (`qkv.train.gradients`): inside a window of
n ids, position t predicts id t+1, so a window of n ids gives n − 1 predictions.

Tokenizers are built with the `tokenizers` library, so the result is an ordinary tokenizer.json
(`TextCorpus.tokenizer.to_str()`, `TextCorpus.qkv_tokenizer()`):
    "char"  WordLevel over every character of the text, plus [UNK] and <|endoftext|>; the
            pre-tokenizer splits every character (spaces and newlines too: Split on [\\s\\S], since
            Oniguruma's "." does not match "\\n"), the Fuse decoder joins them back, so
            decode(encode(text)) is the text exactly. Korean: one syllable, one token.
    "bpe"   byte-level BPE (GPT-2's ByteLevel pre-tokenizer and decoder) trained on the text with
            BpeTrainer; the 256 bytes are always in the vocabulary, so any text encodes, exactly.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import open_regular
from ..inputs.tokenizer import Tokenizer, check_text

EOT = "<|endoftext|>"           # the end-of-text token of both kinds
UNK = "[UNK]"                   # "char": a character the text never had
KINDS = ("char", "bpe")
BPE_VOCAB = 512                 # the default vocabulary of "bpe"
MIN_VOCAB = {"char": 3, "bpe": 257}     # char: [UNK], EOT and one character; bpe: 256 bytes + EOT
MAX_VOCAB = 65536


def _count(name: str, value, low: int, fix: str) -> int:
    """A whole-number setting ≥ LOW, or a QkvError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise QkvError(f"{name} must be a whole number ≥ {low}, got {value!r}; {fix}")
    return int(value)


def _rng(seed: int, step: int) -> np.random.Generator:
    """The generator of one batch: a function of (seed, step) alone."""
    return np.random.default_rng([_count("seed", seed, 0, "give a seed ≥ 0"),
                                  _count("step", step, 0, "give the optimizer step ≥ 0")])


# ── the induction task ──────────────────────────────────────────────────────────

def induction_batch(seed: int, step: int, batch: int, half: int, vocab: int, bos: int | None = 0) -> np.ndarray:
    """(B, n) int64 ids: B random sequences of `half` tokens, each followed by itself, after BOS.

        row = [bos] s₁ … s_half s₁ … s_half        n = 2·half (+1 with bos)

    The tokens s are uniform over 0..vocab−1 without bos (so BOS marks only the start), drawn
    from default_rng([seed, step]): a batch depends on (seed, step) alone. In the second half
    every next token is the one that followed the current token's earlier copy: what an
    induction head predicts.
    """
    B = _count("batch", batch, 1, "give a batch size ≥ 1")
    half = _count("half", half, 1, "give the length of the random sequence, e.g. 32")
    V = _count("vocab", vocab, 2 if bos is None else 3, "give a vocabulary with at least two ordinary tokens")
    if bos is not None and not 0 <= _count("bos", bos, 0, "give a token id or None") < V:
        raise QkvError(f"bos must be a token id in 0..{V - 1}, got {bos}; give a smaller id or None")
    rng = _rng(seed, step)
    if bos is None:
        s = rng.integers(0, V, size=(B, half), dtype=np.int64)                    # (B, half)
        return np.concatenate([s, s], axis=1)                                     # (B, 2·half)
    s = rng.integers(0, V - 1, size=(B, half), dtype=np.int64)                    # (B, half), V−1 ids
    s += s >= bos                                                                 # skip bos's id
    start = np.full((B, 1), bos, dtype=np.int64)                                  # (B, 1)
    return np.concatenate([start, s, s], axis=1)                                  # (B, 1 + 2·half)


def repeated_half_targets(n: int, half: int, bos: int | None = 0) -> np.ndarray:
    """(n,) bool: the positions t whose NEXT token (t+1) is in the repeated half of `induction_batch`
    rows: the loss "on the repeated half" is the mean loss over these positions.

    With o = 1 for a BOS (bos not None, the same value given to induction_batch) and 0 without:
    True for t = o+half−1 … o+2·half−2 (half positions). The first of them predicts s₁ again,
    which nothing before it announces (a guess, ln V at best); the other half−1 are predictable
    by induction (copy what followed the earlier copy of the current token).
    """
    o = 0 if bos is None else 1
    half = _count("half", half, 1, "give the length of the random sequence")
    if n != o + 2 * half:
        raise QkvError(f"a row of induction_batch with half={half} {'and' if o else 'and no'} BOS has "
                       f"{o + 2 * half} tokens, not {n}; give the row's length")
    mask = np.zeros(n, dtype=bool)                                                # (n,)
    mask[o + half - 1: o + 2 * half - 1] = True
    return mask


# ── tokenizers ──────────────────────────────────────────────────────────────────

def char_tokenizer(text: str, vocab_size: int | None = None):
    """A `tokenizers.Tokenizer` with one token per character: [UNK] = 0, <|endoftext|> = 1, then the
    characters in code-point order.

    vocab_size None keeps every character of TEXT (decode(encode(text)) == text); an int keeps the
    vocab_size − 2 most frequent (ties: lower code point first), the others encode as [UNK].
    """
    from tokenizers import Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    counts = Counter(text)
    chars = sorted(counts)
    if vocab_size is not None:
        keep = sorted(chars, key=lambda c: (-counts[c], c))[: vocab_size - 2]
        chars = sorted(keep)
    vocab = {UNK: 0, EOT: 1}
    for c in chars:
        vocab.setdefault(c, len(vocab))                 # a text holding "[UNK]" holds its characters only
    tok = HFTokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")     # every character, "\n" too
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOT])
    return tok


def bpe_tokenizer(text: str, vocab_size: int = BPE_VOCAB):
    """A byte-level BPE `tokenizers.Tokenizer` (GPT-2's ByteLevel pre-tokenizer and decoder) trained on
    TEXT with BpeTrainer up to vocab_size tokens: <|endoftext|> = 0, the 256 byte symbols, then merges."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tok


def build_tokenizer(kind: str, text: str, vocab_size: int | None = None):
    """A "char" or "bpe" tokenizer for TEXT; vocab_size None: every character (char), 512 (bpe)."""
    if kind not in KINDS:
        raise QkvError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(KINDS)}")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer))
                                   or not MIN_VOCAB[kind] <= vocab_size <= MAX_VOCAB):
        raise QkvError(f"vocab_size for {kind} must be a whole number in {MIN_VOCAB[kind]}..{MAX_VOCAB}, "
                       f"got {vocab_size!r}; give e.g. {BPE_VOCAB}")
    if kind == "char":
        return char_tokenizer(text, None if vocab_size is None else int(vocab_size))
    return bpe_tokenizer(text, BPE_VOCAB if vocab_size is None else int(vocab_size))


# ── text corpora ────────────────────────────────────────────────────────────────

def read_text(path: str | Path) -> str:
    """A UTF-8 file's text (a leading byte-order mark dropped), or a QkvError saying what is wrong."""
    path = Path(path)
    fix = "give a UTF-8 text file"
    if not path.exists():
        raise QkvError(f"no such file: {path}; {fix}")
    if path.is_dir():
        raise QkvError(f"{path} is a directory; {fix}")
    try:
        with open_regular(path) as f:                     # a FIFO or a device would hang or never end
            data = f.read()
    except OSError as e:
        raise QkvError(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise QkvError(f"{path} is not UTF-8 (byte 0x{data[e.start]:02x} at byte offset {e.start}); "
                       "convert it to UTF-8, e.g. iconv -t UTF-8") from None
    return text.removeprefix("\ufeff")


class TextCorpus:
    """A text as token ids for training: the tokenizer, train_ids and val_ids (int64, (N,)), and
    random windows of them (`batch`).

    The tokenizer is built on the whole text (so the validation part has no unknown characters);
    the ids of the whole text are then cut in two: the first 1 − val_fraction for training, the
    rest for validation.
    """

    def __init__(self, text: str, tokenizer, val_fraction: float = 0.1, source: str = "the text"):
        """TEXT encoded with TOKENIZER (a `tokenizers.Tokenizer`, e.g. read back from a run's
        tokenizer.json on resume); see `from_text` / `from_file` to build one."""
        text = check_text(text)
        if not text.strip():
            raise QkvError(f"{source} is {'empty' if not text else 'only whitespace'}; give a file with some text")
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) \
                or not 0 <= val_fraction < 1:
            raise QkvError(f"val_fraction must be in [0, 1), got {val_fraction!r}; give e.g. 0.1")
        self.source = source
        self.tokenizer = tokenizer
        self.eot_id: int = tokenizer.token_to_id(EOT)                       # None if not ours
        ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)   # (N,)
        n_val = int(len(ids) * val_fraction)
        self.train_ids = ids[: len(ids) - n_val]                            # (N − N_val,)
        self.val_ids = ids[len(ids) - n_val:]                               # (N_val,)

    @classmethod
    def from_text(cls, text: str, tokenizer: str = "char", vocab_size: int | None = None,
                  val_fraction: float = 0.1, source: str = "the text") -> "TextCorpus":
        """TEXT with a new tokenizer of kind "char" or "bpe" (see `build_tokenizer`)."""
        text = check_text(text)
        if not text.strip():
            raise QkvError(f"{source} is {'empty' if not text else 'only whitespace'}; give a file with some text")
        return cls(text, build_tokenizer(tokenizer, text, vocab_size), val_fraction, source)

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: str = "char", vocab_size: int | None = None,
                  val_fraction: float = 0.1) -> "TextCorpus":
        """A UTF-8 file (Korean and any other script) with a new "char" or "bpe" tokenizer."""
        if tokenizer not in KINDS:                                          # before reading a large file
            raise QkvError(f"unknown tokenizer kind {tokenizer!r}; use one of {', '.join(KINDS)}")
        return cls.from_text(read_text(path), tokenizer, vocab_size, val_fraction, source=str(path))

    @property
    def vocab_size(self) -> int:
        """V: the number of ids the tokenizer can give (the model's vocab_size at least)."""
        return self.tokenizer.get_vocab_size()

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def qkv_tokenizer(self) -> Tokenizer:
        """The tokenizer as qkv's `Tokenizer` (eos_token = <|endoftext|>), e.g. for `Model(..., tokenizer)`."""
        specials = {"eos_token": EOT} | ({"unk_token": UNK} if self.tokenizer.token_to_id(UNK) is not None else {})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "tokenizer.json"
            self.tokenizer.save(str(path))
            return Tokenizer(path, special_tokens=specials)

    def batch(self, seed: int, step: int, batch: int, n: int, split: str = "train") -> np.ndarray:
        """(B, n) int64: B windows of n consecutive ids of the split, starts uniform over every
        window, drawn from default_rng([seed, step]) (a function of (seed, step) alone)."""
        if split not in ("train", "val"):
            raise QkvError(f"unknown split {split!r}; use train or val")
        B = _count("batch", batch, 1, "give a batch size ≥ 1")
        n = _count("n", n, 2, "give a window of at least 2 tokens")
        ids = self.train_ids if split == "train" else self.val_ids
        if len(ids) < n:
            raise QkvError(f"{self.source}'s {split} split has {len(ids)} tokens, too few for one window of "
                           f"n={n} tokens (needs {n}); use a longer text or a smaller n"
                           + (" or a larger val_fraction" if split == "val" else ""))
        starts = _rng(seed, step).integers(0, len(ids) - n + 1, size=B)           # (B,)
        return ids[starts[:, None] + np.arange(n)]                                 # (B, n)

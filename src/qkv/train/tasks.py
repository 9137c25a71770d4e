"""What `qkv train` can learn: a run's settings, and the two tasks — each a model config, the batch
of every step, and what it records every K steps.

    induction  a small attention-only model (d_ff = 0) on random tokens repeated twice, [BOS] r₁ … r_h
               r₁ … r_h. The first half cannot be predicted; the second can, by looking one past the
               earlier copy of the current token: an induction head (Olsson et al. 2022). Records the
               loss on each half and every head's induction score. Llama-style by default: with RoPE
               a previous-token head is one rotation away and induction heads form in ~700 steps
               (~20 s here); with GPT-2's learned absolute positions the model leans on positions and
               none had formed after 3000 steps (measured, 3 runs with different --seed; --arch gpt2 still trains it).
    text       a small GPT-2- or Llama-style language model on any UTF-8 text (char or BPE tokens).
               Records the loss on held-out text and a sample of what the model writes.

A batch depends only on (seed, step) (`qkv.train.data`), so a resumed run sees the same batches
as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from ..analysis.detectors import induction_pattern, pattern_score
from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..runtime.io import open_regular
from ..runtime.tuning import physical_memory

ARCHS = ("gpt2", "llama", "marian", "vit", "whisper")   # marian: translate-ko-en only; vit: digits; whisper: speech
TOKENIZERS = ("char", "bpe")
EVAL_SEED = 10_007            # added to the run's seed: the held-out batches never equal a training batch
EVAL_BATCH = 64               # repeated sequences the induction records average over


@dataclass(frozen=True)
class Settings:
    """Every knob of a run. Saved in DIR/run.json and in every checkpoint; a resumed run must agree."""

    task: str = "induction"
    seed: int = 0
    steps: int = 1000
    batch: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4           # where the cosine schedule ends
    warmup: int = 100              # steps of linear warm-up
    weight_decay: float = 0.01     # AdamW's decoupled decay (not on biases, norms)
    clip: float = 1.0              # largest global gradient norm
    every: int = 25                # records (and text samples) every K steps
    checkpoint_every: int = 200
    layers: int = 2
    heads: int = 4
    d_model: int = 64
    vocab: int = 64                # induction: random token ids 1..vocab-1 (0 = BOS)
    half: int = 32                 # induction: random tokens before they repeat, at most
    min_half: int = 16             # induction: … at least (drawn each step)
    text: str | None = None        # text: the file, and its SHA-256 (the file must not change)
    text_sha256: str | None = None
    tokenizer: str = "char"
    vocab_size: int = 512          # text, BPE: the vocabulary to learn
    arch: str = "gpt2"
    context: int = 128             # text: tokens per training sequence

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Settings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def check(self) -> "Settings":
        """One QkvError naming the first out-of-range setting and the fix."""
        if self.task not in KINDS:
            raise QkvError(f"unknown task {self.task!r}; give --task induction, translate-ko-en, digits or speech, "
                           "or --text FILE to learn a text")
        positive = ("steps", "batch", "every", "checkpoint_every", "layers", "heads", "d_model")
        for name in positive + (("half", "min_half", "vocab") if self.task == "induction" else ("context",)):
            if getattr(self, name) <= 0:
                raise QkvError(f"--{_flag(name)} {getattr(self, name)} must be positive")
        for name in ("lr", "clip"):
            if not getattr(self, name) > 0:
                raise QkvError(f"--{_flag(name)} {getattr(self, name)} must be a positive number")
        for name in ("min_lr", "weight_decay", "warmup"):
            if not getattr(self, name) >= 0:
                raise QkvError(f"--{_flag(name)} {getattr(self, name)} must be 0 or more")
        if self.warmup > self.steps:
            raise QkvError(f"--warmup {self.warmup} is longer than the run (--steps {self.steps}); give a shorter one")
        if self.min_lr > self.lr:
            raise QkvError(f"--min-lr {self.min_lr} is above --lr {self.lr}; give a smaller --min-lr")
        if self.d_model % self.heads:
            raise QkvError(f"--d-model {self.d_model} is not a multiple of --heads {self.heads}; "
                           f"e.g. --d-model {self.heads * max(1, round(self.d_model / self.heads))}")
        if self.task == "induction" and self.vocab < 3:
            raise QkvError(f"--vocab {self.vocab} leaves too few random tokens; give at least 3")
        if self.task == "induction" and self.min_half > self.half:
            raise QkvError(f"--min-half {self.min_half} is more than --half {self.half}; give min-half ≤ half")
        if self.arch not in ARCHS:
            raise QkvError(f"unknown --arch {self.arch!r}; choose gpt2 or llama")
        own = {"translate-ko-en": "marian", "digits": "vit", "speech": "whisper"}
        if own.get(self.task, self.arch if self.arch in ("gpt2", "llama") else "gpt2") != self.arch:
            raise QkvError(f"--arch {self.arch} does not fit --task {self.task}: translate-ko-en trains a marian "
                           "model, digits a vit, speech a whisper, the others gpt2 or llama")
        if self.task == "text":
            if self.tokenizer not in TOKENIZERS:
                raise QkvError(f"unknown --tokenizer {self.tokenizer!r}; choose {' or '.join(TOKENIZERS)}")
            if self.context < 2:
                raise QkvError(f"--context {self.context} is too short: a token needs a next one; give 2 or more")
            if self.tokenizer == "bpe" and self.vocab_size < 257:
                raise QkvError(f"--vocab-size {self.vocab_size} is too small for byte-level BPE (256 bytes and "
                               "<|endoftext|>); give 257 or more, e.g. 512")
        self._check_size()
        return self

    def _check_size(self) -> None:
        """Refuse, before allocating, a model whose float32 weights, gradients and AdamW's two moments (16 bytes
        a parameter; the embedding and W_vocab 2·V·d, a block about 12·d²) need more than half the memory."""
        V = self.vocab if self.task == "induction" else \
            self.vocab_size if self.task == "text" and self.tokenizer == "bpe" else 0
        need = 16 * (2 * V * self.d_model + self.layers * 12 * self.d_model ** 2)
        bound = physical_memory() // 2
        if need > bound:
            raise QkvError(f"a model of --d-model {self.d_model} and --layers {self.layers}"
                           + (f" with a vocabulary of {V:,}" if V else "") + f" needs about {need / 2**30:,.1f} GiB "
                           f"to train (weights, gradients and AdamW's moments), more than half this machine's memory "
                           f"({bound / 2**30:.1f} GiB); give a smaller " + ("--vocab, " if V else "") +
                           "--d-model or --layers")


def _flag(name: str) -> str:
    return name.replace("_", "-")


# Defaults that differ by task (the rest: Settings' own).
DEFAULTS = {
    "induction": dict(steps=2000, batch=32, lr=1e-3, min_lr=1e-4, warmup=100, weight_decay=0.01, every=50,
                      checkpoint_every=250, layers=2, heads=4, d_model=64, arch="llama"),
    "text": dict(steps=1000, batch=16, lr=1e-3, min_lr=1e-4, warmup=100, weight_decay=0.1, every=200,
                 checkpoint_every=200, layers=4, heads=4, d_model=128, arch="gpt2"),
    "translate-ko-en": dict(steps=800, batch=64, lr=3e-3, min_lr=3e-4, warmup=100, weight_decay=0.01, every=100,
                            checkpoint_every=200, layers=2, heads=4, d_model=64, arch="marian"),
    "digits": dict(steps=3000, batch=64, lr=3e-3, min_lr=1e-4, warmup=100, weight_decay=0.05, every=250,
                   checkpoint_every=500, layers=3, heads=4, d_model=64, arch="vit"),
    "speech": dict(steps=3000, batch=32, lr=3e-3, min_lr=1e-4, warmup=150, weight_decay=0.01, every=300,
                   checkpoint_every=300, layers=2, heads=4, d_model=64, arch="whisper"),
}


def settings_for(task: str, given: dict) -> Settings:
    """The task's defaults, overridden by the options the user GIVEN (name → value), checked."""
    if task not in KINDS:
        raise QkvError(f"unknown task {task!r}; give --task induction, translate-ko-en, digits or speech, "
                       "or --text FILE to learn a text")
    s = replace(Settings(task=task, **DEFAULTS[task]), **given)
    if "warmup" not in given:                                   # a short run warms up for a tenth of it
        s = replace(s, warmup=min(s.warmup, s.steps // 10))
    return s.check()


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes: a resumed text run must read the text it began with."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_config(arch: str, V: int, s: Settings, n: int, d_ff: int | None = None, **ids) -> ModelConfig:
    """The knobs of a small model: GPT-2 (pre-LayerNorm, learned positions, tanh GELU, tied W_vocab) or
    Llama (pre-RMSNorm, RoPE, SwiGLU, no biases, tied, the pad row torch's padding_idx); d_ff 0 = attention-only
    (no FFN)."""
    if arch == "gpt2":
        return ModelConfig(family="gpt2", vocab_size=V, d_model=s.d_model, n_layers=s.layers, n_heads=s.heads,
                           d_ff=4 * s.d_model if d_ff is None else d_ff, max_positions=n, norm="layer",
                           norm_eps=1e-5, position="learned", activation="gelu_tanh", tied_embeddings=True, **ids)
    if d_ff is None:
        d_ff = 32 * max(1, round(8 * s.d_model / 3 / 32))                    # SwiGLU's ⅔·4·d, rounded to 32
    return ModelConfig(family="llama", vocab_size=V, d_model=s.d_model, n_layers=s.layers, n_heads=s.heads,
                       d_ff=d_ff, max_positions=n, norm="rms", norm_eps=1e-5, position="rope", activation="silu",
                       gated_ffn=True, qkv_bias=False, out_bias=False, ffn_bias=False, tied_embeddings=True,
                       pad_embedding_frozen=True, **ids)


def token_losses(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """−log softmax(logits)[next token] at every position but the last: (B, n, V), (B, n) → (B, n−1)."""
    z = logits[:, :-1].astype(np.float64)                                   # (B, n−1, V)
    z -= z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))               # (B, n−1, V)
    return -np.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]   # (B, n−1)


class DecoderTask:
    """What a task gives the loop (`loop.Run`), for a decoder: a batch of each step, its loss and
    gradients, and how many tokens it holds. A task also has `config`, `tokenizer` (or None),
    `describe()`, `record(model) -> dict` and `viewer_ids()`; an encoder–decoder task (translate)
    gives the same methods over its own batches."""

    def batch(self, step: int) -> np.ndarray:
        """The ids (B, n) of STEP: a function of (seed, step) alone."""
        raise NotImplementedError

    def loss_and_grads(self, weights, ids: np.ndarray):
        """The mean next-token cross-entropy of every position, and its gradients (a Weights tree)."""
        from .backprop import loss_and_grads

        return loss_and_grads(weights, self.config, ids)

    def tokens(self, ids: np.ndarray) -> int:
        return int(ids.size)


# ── induction ────────────────────────────────────────────────────────────────────

class InductionTask(DecoderTask):
    """Random tokens repeated twice; records the loss on each half and every head's induction score.

    The length of the random part, h, is drawn anew each step from min_half..half: with one fixed
    h, a head that looks a fixed h − 1 positions back would predict the second half from the
    positions alone, and no induction head would be needed (nor form)."""

    name = "induction"
    tokenizer = None

    def __init__(self, s: Settings, tokenizer_file: Path | None = None):
        from .data import induction_batch

        self.s = s
        self.n = 1 + 2 * s.half                                             # the longest row: [BOS] + 2·h
        self.config = model_config(s.arch, s.vocab, s, self.n, d_ff=0, bos_token_id=0, eos_token_id=0)
        self._batch = induction_batch
        halves = sorted({s.min_half, (s.min_half + s.half) // 2, s.half})  # held out: short, middle, long
        self.eval_ids = [induction_batch(s.seed + EVAL_SEED, k, EVAL_BATCH // len(halves), h, s.vocab)
                         for k, h in enumerate(halves)]                     # each (E, 1 + 2·h)

    def describe(self) -> str:
        s = self.s
        return (f"[BOS] + random tokens (of {s.vocab - 1}) repeated twice, {s.min_half}–{s.half} before they repeat")

    def half_at(self, step: int) -> int:
        """h of STEP's batch: a function of (seed, step) alone, as the batch is."""
        s = self.s
        return int(np.random.default_rng([s.seed, step, 1]).integers(s.min_half, s.half + 1))

    def batch(self, step: int) -> np.ndarray:
        """The ids (B, 1 + 2·h) of STEP; the loss counts every next token (the first half's too)."""
        s = self.s
        return self._batch(s.seed, step, s.batch, self.half_at(step), s.vocab)

    def record(self, model) -> dict:
        """Loss on the repeated and the first half, and each head's induction score (L × H), on
        held-out sequences. The score is the detector's Σ(A⊙P)/ΣA (`analysis.detectors`) over the
        queries of the repeated half, where the pattern P is defined: a perfect induction head
        scores 1. (Over every row, as `qkv heads` scores, the first half would cap it near 0.5.)"""
        first, repeated, scores = [], [], []
        for ids in self.eval_ids:
            h = (ids.shape[1] - 1) // 2
            out = model.forward(ids, attentions=True)
            loss = token_losses(out.logits, ids)                            # (E, n−1): position t predicts t+1
            # predicting tokens 1..h (the first half) and h+2..2h (the second but its first, which
            # follows [BOS] the first time and cannot be foreseen)
            first.append(loss[:, :h].mean())
            repeated.append(loss[:, h + 1:].mean())
            rows = slice(h + 1, 2 * h + 1)                                  # queries of the repeated half
            att = out.attentions[:, :, :, rows]                             # (L, E, H, h, n)
            scores += [pattern_score(att[:, b], induction_pattern(ids[b])[rows]) for b in range(len(ids))]
        scores = np.mean(scores, axis=0)                                    # (L, H)
        return {"loss_repeated": float(np.mean(repeated)), "loss_first": float(np.mean(first)),
                "induction": np.round(scores, 4).tolist(), "induction_best": float(scores.max())}

    def viewer_ids(self) -> np.ndarray:
        """One held-out repeated sequence (n,), for the viewer before and after."""
        return self.eval_ids[0][0]


# ── text ─────────────────────────────────────────────────────────────────────────

class TextTask(DecoderTask):
    """A language model on a UTF-8 text; records the held-out loss and a sample."""

    name = "text"
    VAL_BATCHES = 4

    def __init__(self, s: Settings, tokenizer_file: Path):
        """TOKENIZER_FILE: the run's tokenizer.json, made from the text on the first start and read
        again on a resume, so that the ids never change."""
        from tokenizers import Tokenizer as HFTokenizer

        from ..runtime.io import write_text
        from .data import TextCorpus, read_text

        self.s = s
        if tokenizer_file.is_file():
            self.corpus = TextCorpus(read_text(s.text), HFTokenizer.from_file(str(tokenizer_file)), source=s.text)
        else:
            self.corpus = TextCorpus.from_file(s.text, tokenizer=s.tokenizer,
                                               vocab_size=s.vocab_size if s.tokenizer == "bpe" else None)
            write_text(tokenizer_file, self.corpus.tokenizer.to_str())
        for split, ids in (("training", self.corpus.train_ids), ("held-out", self.corpus.val_ids)):
            if len(ids) < s.context:
                raise QkvError(f"{s.text} gives {len(ids):,} {split} tokens (the last 10% are held out), fewer "
                               f"than one --context window of {s.context}; give a longer text or a smaller --context")
        self.tokenizer = self.corpus.qkv_tokenizer()
        self.config = model_config(s.arch, self.tokenizer.vocab_size, s, s.context)

    def describe(self) -> str:
        c = self.corpus
        return (f"{self.s.text}: {len(c.train_ids):,} training and {len(c.val_ids):,} held-out tokens "
                f"({self.s.tokenizer}, {self.tokenizer.vocab_size} in the vocabulary)")

    def batch(self, step: int) -> np.ndarray:
        s = self.s
        return self.corpus.batch(s.seed, step, s.batch, s.context, "train")          # (B, context)

    def record(self, model) -> dict:
        """The mean loss on held-out text (the same batches every time) and a sample."""
        s = self.s
        losses = [token_losses(model.forward(ids, attentions=False).logits, ids).mean()
                  for ids in (self.corpus.batch(s.seed + EVAL_SEED, k, s.batch, s.context, "val")
                              for k in range(self.VAL_BATCHES))]
        return {"val_loss": float(np.mean(losses)), "sample": self.sample(model)}

    def sample(self, model, tokens: int = 80) -> str:
        """What the model writes after the first few tokens of the held-out text (temperature 0.8,
        a fixed seed: the samples of successive records differ only by what the model learned)."""
        ids = self.prompt_ids()
        new = min(tokens, self.s.context - len(ids))
        out = model.generate(ids[None], max_new_tokens=new, temperature=0.8, seed=self.s.seed, stop_at_eos=False)
        return self.tokenizer.decode(out[0], skip_special_tokens=True)

    def prompt_ids(self) -> np.ndarray:
        """The first few held-out tokens (n,): where samples start."""
        return np.asarray(self.corpus.val_ids[:min(8, self.s.context // 2)], np.int64)

    def viewer_ids(self) -> np.ndarray:
        return np.asarray(self.corpus.val_ids[:min(48, self.s.context)], np.int64)


def _translate(s: Settings, tokenizer_file: Path):
    from .translate import TranslateTask  # the guide's Korean→English example (ko-en-tiny)
    return TranslateTask(s, tokenizer_file)


def _digits(s: Settings, tokenizer_file: Path):
    from .digits import DigitsTask  # a Vision Transformer on handwritten digits (digits-vit)
    return DigitsTask(s)


def _speech(s: Settings, tokenizer_file: Path):
    from .speech import SpeechTask  # a tiny Whisper on digits spoken by espeak-ng (speech-tiny)
    return SpeechTask(s, tokenizer_file)


KINDS = {"induction": InductionTask, "text": TextTask,       # --task NAME → its class
         "translate-ko-en": _translate, "digits": _digits, "speech": _speech}


def make_task(s: Settings, out: Path):
    """The task of settings S for a run in directory OUT (its tokenizer, if any: OUT/tokenizer.json)."""
    return KINDS[s.task](s, out / "tokenizer.json")


def read_json(path: Path) -> dict | None:
    """A JSON object from PATH (read as every JSON file is: runtime.io_json), or None if it is missing or not a
    sound one (a run's settings file, whose absence or damage means a new run)."""
    from ..runtime.io_json import read_json as read_checked

    try:
        return read_checked(path)
    except QkvError:
        return None

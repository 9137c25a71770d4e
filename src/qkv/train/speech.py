"""Spoken digits read by a tiny Whisper: the task `qkv train --task speech` learns. Its result, DIR/model, is a Whisper
checkpoint transformers loads (WhisperForConditionalGeneration, WhisperProcessor), read by `qkv transcribe FILE
--model DIR/model [--words]`.

The data: utterances of one to four digits ("three one four") spoken by espeak-ng in many voices, speeds and
pitches (qkv.train.speech_data); the held-out utterances are spoken by voices never learned from. The model: a
Whisper of 3-second windows (300 log-mel frames of 80 mels, 150 encoder positions of 20 ms), d_model 64, 2 + 2
pre-norm layers, a vocabulary of the ten words in Whisper's format (byte-level BPE, one token a word, then
<|endoftext|>, <|startoftranscript|>, the task tokens, <|notimestamps|> and the timestamps <|0.00|> … <|3.00|>).
It is English-only, like tiny.en: the prompt is <|startoftranscript|> <|notimestamps|>, then the words, then
<|endoftext|>.

What it records every K steps, on held-out utterances: `accuracy` (the share written exactly, greedy),
`word_accuracy` (the share of words right, position by position) and `val_loss`.

Measured (the defaults, 2,200 steps, ~29 min of steps on a shared 2-core machine): new utterances of the voices
learned from are written right 99.5 % of the time (199 of 200; words 99.8 %); new utterances of the held-out
voices 78 % (234 of 300; words 88 %): New York's "two" written "three", West Midlands' "five" written "four",
and words left out or added.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..core.stack import decoder_pass, encoder_pass, memory_of
from ..inputs.audio import HOP, SAMPLE_RATE, log_mel
from ..runtime.errors import QkvError
from . import speech_data
from .speech_backprop import loss_and_grads
from .speech_data import WORDS, Bank, Speaker, placed, speak_bank

SECONDS = 3                          # one window: WhisperFeatureExtractor(chunk_length=3)
WINDOW = SECONDS * SAMPLE_RATE       # 48,000 samples
FRAMES = WINDOW // HOP               # 300 log-mel frames
MELS = 80
TRAIN_UTTERANCES = 6000              # spoken once, then drawn from with new shifts, gains and noise
HELD_OUT_UTTERANCES = 300
EVAL_UTTERANCES = 300                # held-out utterances each record reads
MAX_TARGET = 16                      # decoder positions: prompt (2) + 4 words + <|endoftext|> fit, with room
BANK_FILE = "speech-data.npz"        # the spoken utterances, kept in the run's folder (a resume never speaks again)
SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
            "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")
TIMESTAMPS = tuple(f"<|{i * 0.02:.2f}|>" for i in range(SECONDS * 50 + 1))      # <|0.00|> … <|3.00|>
EXAMPLES = 4                         # held-out utterances written as WAV files beside the model
ALIGNMENT_UTTERANCES = 100           # held-out utterances the alignment heads are chosen on


# ── the tokenizer: Whisper's format, one token a word ────────────────────────────

def word_merges() -> tuple[list[str], list[tuple[str, str]]]:
    """(byte-level symbols, merges) that spell each word with a leading space ("Ġthree") as one token: the
    merges join each word's letters left to right (Ġ + t, Ġt + h, …), shared prefixes once."""
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        piece = "Ġ"
        for ch in word:
            if (piece, ch) not in merges:
                merges.append((piece, ch))
            piece += ch
    symbols = sorted({"Ġ", *"".join(WORDS)})
    return symbols, merges


def whisper_tokenizer():
    """A `tokenizers.Tokenizer` in Whisper's format (what transformers' WhisperTokenizer reads from tokenizer.json):
    byte-level BPE over the ten words, then the special tokens (SPECIALS) and the timestamps, each one token; a
    text is encoded as <|startoftranscript|> <|notimestamps|> … <|endoftext|>, as tiny.en's."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    symbols, merges = word_merges()
    vocab = {s: i for i, s in enumerate(symbols)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in SPECIALS])
    tok.add_tokens([AddedToken(t, normalized=False) for t in TIMESTAMPS])
    ids = {t: tok.token_to_id(t) for t in ("<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>")}
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftranscript|> <|notimestamps|> $A <|endoftext|>",
        special_tokens=list(ids.items()))
    return tok


def whisper_config(vocab_size: int, special: dict[str, int], d_model: int, layers: int, heads: int) -> dict:
    """config.json of the speech model: a WhisperForConditionalGeneration of 3-second windows (150 encoder
    positions), tied head, GELU, FFN 4·d_model; start <|startoftranscript|>, end and padding <|endoftext|>."""
    eot = special["<|endoftext|>"]
    return {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], "vocab_size": vocab_size,
            "num_mel_bins": MELS, "d_model": d_model, "encoder_layers": layers, "decoder_layers": layers,
            "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": 4 * d_model,
            "decoder_ffn_dim": 4 * d_model, "max_source_positions": FRAMES // 2, "max_target_positions": MAX_TARGET,
            "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
            "pad_token_id": eot, "bos_token_id": eot, "eos_token_id": eot,
            "decoder_start_token_id": special["<|startoftranscript|>"]}


def generation_config(special: dict[str, int], alignment_heads: list[list[int]]) -> dict:
    """generation_config.json: English-only (no language or task tokens in the prompt), greedy, no timestamps by
    default; ALIGNMENT_HEADS the (decoder layer, head) pairs word timestamps read."""
    eot = special["<|endoftext|>"]
    return {"decoder_start_token_id": special["<|startoftranscript|>"], "bos_token_id": eot, "eos_token_id": eot,
            "pad_token_id": eot, "no_timestamps_token_id": special["<|notimestamps|>"], "is_multilingual": False,
            "max_length": MAX_TARGET, "max_initial_timestamp_index": 50, "return_timestamps": False,
            "suppress_tokens": [], "begin_suppress_tokens": [eot], "alignment_heads": alignment_heads}


def preprocessor_config() -> dict:
    """preprocessor_config.json: WhisperFeatureExtractor of 3-second windows (what WhisperProcessor reads)."""
    return {"feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
            "feature_size": MELS, "sampling_rate": SAMPLE_RATE, "hop_length": HOP, "chunk_length": SECONDS,
            "n_fft": 400, "n_samples": WINDOW, "nb_max_frames": FRAMES, "padding_side": "right",
            "padding_value": 0.0, "return_attention_mask": False}


def tokenizer_config() -> dict:
    """tokenizer_config.json: transformers' WhisperTokenizer over tokenizer.json, its special tokens."""
    return {"tokenizer_class": "WhisperTokenizer", "model_max_length": MAX_TARGET, "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
            "processor_class": "WhisperProcessor", "predict_timestamps": False}


# ── the task ─────────────────────────────────────────────────────────────────────

class SpeechTask:
    """What the training loop (`loop.Run`) reads: the config, each step's batch, its loss and gradients, the
    records (held-out utterances written right), and the files beside the model (`finish`). SPEAK: how an
    utterance becomes sound (espeak-ng; tests give synthetic sound made in NumPy)."""

    name = "speech"

    def __init__(self, s, tokenizer_file: Path, speak: Speaker | None = None):
        from ..inputs.tokenizer import Tokenizer
        from ..runtime.io import write_text
        from ..checkpoints.families import config_of

        self.s = s
        if s.d_model % s.heads:
            raise QkvError(f"--d-model {s.d_model} is not a multiple of --heads {s.heads}; choose sizes that divide")
        if not tokenizer_file.is_file():
            write_text(tokenizer_file, whisper_tokenizer().to_str())
        self.tokenizer = Tokenizer(tokenizer_file, special_tokens={"eos_token": "<|endoftext|>",
                                                                   "pad_token": "<|endoftext|>"})
        self.special = {t: int(self.tokenizer._tok.token_to_id(t)) for t in SPECIALS}
        self.word_ids = np.array([self.tokenizer._tok.token_to_id("Ġ" + w) for w in WORDS], np.int64)   # (10,)
        self.hf = whisper_config(self.tokenizer.vocab_size, self.special, s.d_model, s.layers, s.heads)
        self.config: ModelConfig = config_of(self.hf, where="the speech model's config")
        self.train, self.held_out = self._banks(tokenizer_file.parent, speak or speech_data.espeak)

    def _banks(self, folder: Path, speak: Speaker) -> tuple[Bank, Bank]:
        """The training and held-out utterances: spoken now, or read from FOLDER/BANK_FILE (a resumed run's)."""
        from ..runtime.io import write_atomic

        path = folder / BANK_FILE
        if path.is_file():
            with np.load(path, allow_pickle=False) as z:
                kept = {k: z[k] for k in z.files}
            return (speak_bank(TRAIN_UTTERANCES, False, WINDOW, arrays={k[6:]: v for k, v in kept.items()
                                                                        if k.startswith("train/")}),
                    speak_bank(HELD_OUT_UTTERANCES, True, WINDOW, arrays={k[9:]: v for k, v in kept.items()
                                                                          if k.startswith("held_out/")}))
        train = speak_bank(TRAIN_UTTERANCES, False, WINDOW, speak)
        held_out = speak_bank(HELD_OUT_UTTERANCES, True, WINDOW, speak)
        arrays = {f"train/{k}": v for k, v in train.to_arrays().items()}
        arrays |= {f"held_out/{k}": v for k, v in held_out.to_arrays().items()}
        write_atomic(path, lambda f: np.savez(f, **arrays))
        return train, held_out

    def initial(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fresh model's tensors with the encoder's position table Whisper's sinusoids (`sinusoids`), as
        transformers' WhisperEncoder starts (a random table of σ 0.02 tells the frames' times apart too weakly).
        Learned from there (transformers keeps it fixed)."""
        name = "model.encoder.embed_positions.weight"
        table = tensors[name]
        return tensors | {name: sinusoids(*table.shape).astype(table.dtype)}

    def describe(self) -> str:
        return (f"{len(self.train):,} utterances of 1–{speech_data.MAX_WORDS} digits spoken by espeak-ng "
                f"({len(speech_data.ACCENTS)} accents × {len(speech_data.VARIANTS)} voices), {len(self.held_out):,} "
                f"more by {len(speech_data.HELD_OUT_ACCENTS) * len(speech_data.HELD_OUT_VARIANTS)} voices held out; "
                f"{SECONDS} s windows of {FRAMES} log-mel frames")

    # batches ----------------------------------------------------------------

    def frames(self, bank: Bank, pick, rng: np.random.Generator | None) -> np.ndarray:
        """Log-mel frames (B, 300, 80) of the utterances PICK of BANK, each placed in its window (`placed`)."""
        return np.stack([log_mel(placed(bank.sound(i), WINDOW, rng), MELS, WINDOW).T for i in pick])

    def targets(self, bank: Bank, pick) -> tuple[np.ndarray, np.ndarray]:
        """(decoder input, labels) (B, n): <|startoftranscript|> <|notimestamps|> words → <|notimestamps|> words
        <|endoftext|>, labels −100 on the padding."""
        sot, nots, eot = (self.special[t] for t in ("<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>"))
        rows = [[sot, nots, *self.word_ids[list(bank.utterances[i].words)], eot] for i in pick]
        n = max(len(r) for r in rows) - 1
        tgt_in = np.full((len(rows), n), eot, np.int64)                    # (B, n)
        labels = np.full((len(rows), n), -100, np.int64)                   # (B, n)
        for b, r in enumerate(rows):
            tgt_in[b, :len(r) - 1] = r[:-1]
            labels[b, :len(r) - 1] = r[1:]
        return tgt_in, labels

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(frames (B, 300, 80), decoder input, labels) of STEP: a function of (seed, step) alone."""
        rng = np.random.default_rng([self.s.seed, step])
        pick = rng.integers(0, len(self.train), self.s.batch)
        frames = self.frames(self.train, pick, rng).astype(np.float32)
        return (frames, *self.targets(self.train, pick))

    def loss_and_grads(self, weights, batch):
        return loss_and_grads(weights, self.config, *batch)

    def tokens(self, batch) -> int:
        return int(batch[0].shape[0] * batch[0].shape[1] // 2 + (batch[2] != -100).sum())

    # records ----------------------------------------------------------------

    def record(self, model) -> dict:
        """Held-out utterances (voices never learned from): the share written exactly, the share of words right,
        and the mean loss."""
        pick = np.arange(min(EVAL_UTTERANCES, len(self.held_out)))
        frames = self.frames(self.held_out, pick, None).astype(model.weights.tok_embed.dtype)
        written = greedy(model.weights, self.config, frames, self.prompt, self.special["<|endoftext|>"])
        exact, words = score(written, [self.word_ids[list(self.held_out.utterances[i].words)] for i in pick])
        tgt_in, labels = self.targets(self.held_out, pick)
        loss = val_loss(model.weights, self.config, frames, tgt_in, labels)
        said = self.tokenizer.decode(written[0], skip_special_tokens=True).strip()
        return {"accuracy": round(exact, 4), "word_accuracy": round(words, 4), "val_loss": round(loss, 4),
                "sample": f"{self.held_out.utterances[0].text!r} ({self.held_out.utterances[0].voice}) → {said!r}"}

    @property
    def prompt(self) -> list[int]:
        return [self.special["<|startoftranscript|>"], self.special["<|notimestamps|>"]]

    # the files beside the model ---------------------------------------------------

    def finish(self, out: Path) -> list[Path]:
        """OUT/model's Whisper files (generation_config.json with the alignment heads `aligned_heads` picks,
        tokenizer_config.json, preprocessor_config.json) and OUT/examples/: the first held-out utterances as 16-bit
        WAV files."""
        from ..runtime.io import real_directory, write_text

        from ..models.loading import load

        model = out / "model"
        pick = np.arange(min(ALIGNMENT_UTTERANCES, len(self.held_out)))
        tgt_in, _ = self.targets(self.held_out, pick)
        voiced = [voiced_span(self.held_out.sound(i)) for i in pick]
        counts = [len(self.held_out.utterances[i].words) for i in pick]
        heads = aligned_heads(load(model), self.frames(self.held_out, pick, None), tgt_in, counts, voiced)
        written = [write_text(model / "generation_config.json",
                              json.dumps(generation_config(self.special, heads), indent=2) + "\n"),
                   write_text(model / "tokenizer_config.json", json.dumps(tokenizer_config(), indent=2) + "\n"),
                   write_text(model / "preprocessor_config.json", json.dumps(preprocessor_config(), indent=2) + "\n")]
        folder = real_directory(out / "examples")
        for i in range(EXAMPLES):
            u = self.held_out.utterances[i]
            written.append(write_wav(folder / f"{u.text.replace(' ', '-')}.wav", self.held_out.sound(i)))
        return written


def sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's encoder positions (LENGTH, CHANNELS): [sin(p·ω_k) | cos(p·ω_k)], ω_k = 10000^(−k/(C/2 − 1)),
    k < C/2 (transformers' whisper `sinusoids`)."""
    half = channels // 2
    inv = np.exp(-np.log(10000) / (half - 1) * np.arange(half))               # (C/2,)
    angle = np.arange(length)[:, None] * inv[None, :]                         # (LENGTH, C/2)
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)             # (LENGTH, C)


def voiced_span(sound: np.ndarray) -> tuple[int, int]:
    """(first, last) encoder position (20 ms each) of SOUND (n,) within 30 dB of its loudest: where speech is."""
    step = 2 * HOP                                                            # 320 samples: one encoder position
    energy = np.log10(np.maximum(np.add.reduceat(sound.astype(np.float64) ** 2, np.arange(0, len(sound), step)),
                                 1e-10))                                      # (⌈n / 320⌉,)
    loud = np.flatnonzero(energy > energy.max() - 3)
    return int(loud[0]), int(loud[-1])


def aligned_heads(model, frames: np.ndarray, tgt_in: np.ndarray, counts: list[int], voiced: list[tuple[int, int]],
                  share: float = 0.9) -> list[list[int]]:
    """The decoder's cross-attention heads that follow the words in time, as generation_config.json's
    alignment_heads (what word timestamps read): for each head, the share of utterances (FRAMES (B, 300, 80),
    their transcripts read as TGT_IN, COUNTS words each) in which the row writing each word looks most at a
    later position than the row before and inside the speech (VOICED, ± 2 positions); the heads within SHARE
    of the best one's score, [layer, head] pairs."""
    out = model.forward(frames.transpose(0, 2, 1), decoder_input_ids=tgt_in)
    look = out.cross_attentions.argmax(axis=-1)                               # (L_dec, B, H, n): where each row looks
    L, B, H, _ = look.shape
    scores = np.zeros((L, H))
    for b, (k, (first, last)) in enumerate(zip(counts, voiced)):
        at = look[:, b, :, 1:1 + k]                                           # (L, H, k): the rows writing words
        inside = ((at >= first - 2) & (at <= last + 2)).all(axis=-1)          # (L, H)
        rising = (np.diff(at, axis=-1) > 0).all(axis=-1)                      # (L, H)
        scores += inside & rising
    scores /= B
    best = scores.max()
    return [[int(layer), int(head)] for layer, head in zip(*np.nonzero(scores >= share * best))]


def write_wav(path: Path, samples: np.ndarray) -> Path:
    """SAMPLES (n,) at 16 kHz as a 16-bit mono WAV file, atomically."""
    import soundfile

    from ..runtime.io import write_atomic

    return write_atomic(path, lambda f: soundfile.write(f, np.clip(samples, -1, 1), SAMPLE_RATE, subtype="PCM_16",
                                                        format="WAV"))


# ── reading held-out speech ─────────────────────────────────────────────────────

def greedy(weights, cfg: ModelConfig, frames: np.ndarray, prompt: list[int], eot: int, most: int = 8
           ) -> list[list[int]]:
    """What the model writes after PROMPT for each of FRAMES (B, 300, 80), greedily (argmax), up to <|endoftext|>
    or MOST tokens: the written ids of each row, the end token left out."""
    ids = np.zeros(frames.shape[:2], np.int64)[:, ::2]                        # (B, S): the frames are the tokens
    mask = np.ones_like(ids)
    memory = memory_of(weights, cfg, encoder_pass(weights, cfg, ids, mask, tokens=frames))
    out = np.tile(np.asarray(prompt, np.int64), (len(frames), 1))             # (B, n)
    done = np.zeros(len(frames), bool)
    for _ in range(most):
        _, logits = decoder_pass(weights, cfg, out, None, memory, mask, logits="last")   # (B, 1, V)
        nxt = np.where(done, eot, logits[:, -1].argmax(axis=-1))             # (B,)
        out = np.concatenate([out, nxt[:, None]], axis=1)
        done |= nxt == eot
        if done.all():
            break
    rows = []
    for row in out[:, len(prompt):].tolist():
        rows.append(row[:row.index(eot)] if eot in row else row)
    return rows


def score(written: list[list[int]], said: list[np.ndarray]) -> tuple[float, float]:
    """(share of rows written exactly, share of words right): a word is right when the same position of the row
    holds it; words written past the utterance's count as wrong by making the row longer (÷ the longer length)."""
    exact = np.mean([list(w) == list(s) for w, s in zip(written, said)])
    right = sum(sum(a == b for a, b in zip(w, s)) for w, s in zip(written, said))
    total = sum(max(len(w), len(s)) for w, s in zip(written, said))
    return float(exact), float(right / max(total, 1))


def val_loss(weights, cfg: ModelConfig, frames: np.ndarray, tgt_in: np.ndarray, labels: np.ndarray) -> float:
    """Mean cross-entropy of LABELS (−100: not counted) under teacher forcing."""
    ids = np.zeros(frames.shape[:2], np.int64)[:, ::2]                        # (B, S)
    mask = np.ones_like(ids)
    memory = memory_of(weights, cfg, encoder_pass(weights, cfg, ids, mask, tokens=frames))
    _, logits = decoder_pass(weights, cfg, tgt_in, None, memory, mask)       # (B, n, V)
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))                 # (B, n, V)
    counted = labels != -100
    picked = np.take_along_axis(logp, np.where(counted, labels, 0)[..., None], axis=-1)[..., 0]   # (B, n)
    return float(-(picked * counted).sum() / counted.sum())

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

Measured (the defaults, 3,000 steps, 16 min of steps on a shared 2-core machine: `digits-whisper`): new utterances
of 9 held-out voices written right 90.0 % of the time (270 of 300; words 95.1 %); before the 61 voices and the masks
(24 voices, 2,200 steps) 78 %. Its alignment heads put word ends 177 ms from espeak-ng's on average (`aligned_heads`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..core.stack import decoder_pass, encoder_pass, memory_of
from ..inputs.audio import HOP, SAMPLE_RATE, log_mel
from ..runtime.errors import QkvError
from ..writing.timestamps import cut_positions
from . import speech_data
from .speech_backprop import loss_and_grads
from .speech_data import WORDS, Bank, Speaker, placed, speak_bank

SECONDS = 3                          # one window: WhisperFeatureExtractor(chunk_length=3)
WINDOW = SECONDS * SAMPLE_RATE       # 48,000 samples
FRAMES = WINDOW // HOP               # 300 log-mel frames
MELS = 80
TRAIN_UTTERANCES = 10000             # spoken once, then drawn from with new shifts, gains, noise and masks
HELD_OUT_UTTERANCES = 300
EVAL_UTTERANCES = 300                # held-out utterances each record reads
MAX_TARGET = 16                      # decoder positions: prompt (2) + 4 words + <|endoftext|> fit, with room
TIMING_FILE = "alignment.json"       # the alignment heads chosen and how far their word ends land from espeak-ng's
BANK_FILE = "speech-data.npz"        # the spoken utterances, kept in the run's folder (a resume never speaks again)
SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
            "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")
TIMESTAMPS = tuple(f"<|{i * 0.02:.2f}|>" for i in range(SECONDS * 50 + 1))      # <|0.00|> … <|3.00|>
MASKS = 2                            # SpecAugment: bands of mel bins and spans of frames hidden in each batch's sound
MEL_MASK, TIME_MASK = 8, 20          # … each at most this wide (of 80 bins, of 300 frames)
EXAMPLES = 4                         # held-out utterances written as WAV files beside the model
EXAMPLES_FILE = "examples.json"      # … what each says, by which voice, and where its words start and end
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
        """Log-mel frames (B, 300, 80) of the utterances PICK of BANK, each placed in its window (`placed`) and, with
        RNG, masked (`masked`)."""
        out = [log_mel(placed(bank.sound(i), WINDOW, rng), MELS, WINDOW).T for i in pick]      # (300, 80) each
        return np.stack(out if rng is None else [masked(f, rng) for f in out])

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
        tokenizer_config.json, preprocessor_config.json), OUT/alignment.json (those heads, their word-end error and
        the upper half's), and OUT/examples/: the first held-out utterances as 16-bit WAV files, with examples.json
        (what each says, its voice, its word boundaries in seconds)."""
        from ..runtime.io import real_directory, write_text

        from ..models.loading import load

        model = out / "model"
        pick = np.arange(min(ALIGNMENT_UTTERANCES, len(self.held_out)))
        tgt_in, _ = self.targets(self.held_out, pick)
        counts = [len(self.held_out.utterances[i].words) for i in pick]
        ends = [word_ends(self.held_out, i) for i in pick]
        positions = [cut_positions(FRAMES // 2, -(-len(self.held_out.sound(i)) // HOP)) for i in pick]  # as transcribe
        frames = self.frames(self.held_out, pick, None).transpose(0, 2, 1)            # (B, 80, 300)
        cross = load(model).forward(frames, decoder_input_ids=tgt_in).cross_attentions  # (L, B, H, n, S)
        heads, error = aligned_heads(cross, counts, ends, positions)
        L, H = cross.shape[0], cross.shape[2]
        upper = timing_error(cross, [(l, h) for l in range(L // 2, L) for h in range(H)], counts, ends, positions)
        timing = {"alignment_heads": heads, "word_end_error_ms": round(1000 * error, 1),
                  "upper_half_error_ms": round(1000 * upper, 1), "utterances": len(pick)}
        written = [write_text(model / "generation_config.json",
                              json.dumps(generation_config(self.special, heads), indent=2) + "\n"),
                   write_text(model / "tokenizer_config.json", json.dumps(tokenizer_config(), indent=2) + "\n"),
                   write_text(model / "preprocessor_config.json", json.dumps(preprocessor_config(), indent=2) + "\n"),
                   write_text(out / TIMING_FILE, json.dumps(timing, indent=2) + "\n")]
        folder = real_directory(out / "examples")
        said = []
        for i in range(EXAMPLES):
            u = self.held_out.utterances[i]
            name = f"{u.text.replace(' ', '-')}.wav"
            written.append(write_wav(folder / name, self.held_out.sound(i)))
            said.append({"file": name, "text": u.text, "voice": u.voice, "speed": u.speed, "pitch": u.pitch,
                         "word_bounds_s": [round(float(b) / SAMPLE_RATE, 4) for b in self.held_out.word_bounds(i)]})
        written.append(write_text(folder / EXAMPLES_FILE, json.dumps(said, indent=2) + "\n"))
        return written


def masked(frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """FRAMES (300, 80) with MASKS bands of 0–MEL_MASK mel bins and MASKS spans of 0–TIME_MASK frames set to their
    mean (SpecAugment, Park et al. 2019: a model that cannot count on any one band or moment hears more voices)."""
    out = frames.copy()
    fill = out.mean()
    for axis, most in ((1, MEL_MASK), (0, TIME_MASK)):
        for _ in range(MASKS):
            width = int(rng.integers(0, most + 1))
            at = int(rng.integers(0, out.shape[axis] - width + 1))
            (out[:, at:at + width] if axis else out[at:at + width]).fill(fill)
    return out


def sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's encoder positions (LENGTH, CHANNELS): [sin(p·ω_k) | cos(p·ω_k)], ω_k = 10000^(−k/(C/2 − 1)),
    k < C/2 (transformers' whisper `sinusoids`)."""
    half = channels // 2
    inv = np.exp(-np.log(10000) / (half - 1) * np.arange(half))               # (C/2,)
    angle = np.arange(length)[:, None] * inv[None, :]                         # (LENGTH, C/2)
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)             # (LENGTH, C)


def word_ends(bank: Bank, i: int) -> np.ndarray:
    """Where each word of utterance I of BANK ends, in seconds from its start (k,): the next word's start, the last
    word's the end of the speech (espeak-ng's word events: `Spoken.bounds`)."""
    return bank.word_bounds(i)[1:] / SAMPLE_RATE


def timing_error(cross: np.ndarray, heads: list[tuple[int, int]], counts: list[int], ends: list[np.ndarray],
                 positions: list[int]) -> float:
    """The mean distance in seconds between where each word ends and where word timestamps (qkv.writing.timestamps:
    transformers' DTW over HEADS' cross-attention) put its end, over utterances of two words or more. CROSS
    (L_dec, B, H, n, S): teacher-forced rows of <|startoftranscript|> <|notimestamps|> w_0 … w_{k−1}; the row
    reading w_j gives w_j's time, where it first looks on the path (its end: the row is writing w_{j+1}); w_0's is
    0 whatever the heads (the path starts at frame 0), so w_1 … w_{k−1} are measured. POSITIONS: the encoder
    positions of each utterance's sound (the DTW's cut)."""
    from ..writing.timestamps import alignment_matrix, dtw, jump_times

    errors = []
    for b, (k, end, S) in enumerate(zip(counts, ends, positions)):
        if k < 2:                                                             # one row: no DTW (its std is 0)
            continue
        attention = np.stack([cross[l, b, h, 2:2 + k, :S] for l, h in heads])    # (heads, k, S)
        jumps = jump_times(dtw(-alignment_matrix(attention).astype(np.float64)))  # (k,)
        errors.append(np.abs(jumps[1:] - end[1:]))
    return float(np.concatenate(errors).mean()) if errors else float("nan")


def aligned_heads(cross: np.ndarray, counts: list[int], ends: list[np.ndarray], positions: list[int]
                  ) -> tuple[list[list[int]], float]:
    """The decoder's cross-attention heads whose word timestamps land nearest where the words end (measured against
    espeak-ng's own word boundaries: `timing_error`), as generation_config.json's alignment_heads: the heads ranked
    one by one, then the best few together (the first t of the ranking, t chosen by the same error) → ([layer,
    head] pairs, their error in seconds). CROSS (L_dec, B, H, n, S): the utterances' teacher-forced cross-attention;
    COUNTS their words, ENDS the words' ends, POSITIONS the encoder positions their sound spans."""
    L, _, H = cross.shape[:3]
    ranked = sorted((timing_error(cross, [(l, h)], counts, ends, positions), l, h) for l in range(L) for h in range(H))
    prefixes = [[(l, h) for _, l, h in ranked[:t]] for t in range(1, len(ranked) + 1)]
    errors = [timing_error(cross, heads, counts, ends, positions) for heads in prefixes]
    best = min(range(len(prefixes)), key=lambda t: (errors[t], -t))   # a tie: more heads (their mean is steadier)
    return [[int(l), int(h)] for l, h in prefixes[best]], errors[best]


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

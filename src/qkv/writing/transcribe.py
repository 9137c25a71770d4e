"""Whisper writes (guide: audio, attention beyond text): greedy decoding under Whisper's rules, as transformers'
generate(num_beams=1).

    log-mel (mels, T) ─window of 2·S frames at `seek`─▶ encoder once ─▶ each decoder layer's cross K, V
    prompt:   <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]           (`prompt_of`)
              the language, when not given, detected from the first window: the decoder reads the start token,
              every non-language logit is −inf, argmax (its softmax over the languages is printed)
    step:     the newest token through the decoder (KV cache) → logits (V,) → the rules (`apply_rules`):
                begin_suppress_tokens −inf at the first written position
                suppress_tokens −inf always
                timestamps (WhisperTimeStampLogitsProcessor): <|notimestamps|> never; timestamps in pairs (after a
                lone one, no text; after a pair, no timestamp); never below the last one; the first token a
                timestamp ≤ max_initial_timestamp_index; a timestamp forced when their total probability beats
                every text token's
              → argmax → until the end token or max_length (max_new_tokens after the prompt)
    segments: the written tokens cut at each pair of timestamps (`segments_of`); after a window that stopped
              mid-segment, `seek` moves to its last timestamp, else past the window; windows run until `seek`
              reaches T. A sound of at most 2·S frames (30 s) is one window (short-form), longer ones are written
              window by window (long-form; timestamps on, as transformers requires).

What transformers' Whisper generate does beyond greedy decoding (beams, sampling and the temperature fallback,
compression-ratio / log-prob / no-speech thresholds, conditioning on the previous window's text, prompt_ids) is
refused in one line when the checkpoint's generation_config.json asks for it. The result keeps, for every window,
its prompt and written tokens, so `Transcription.trace(w)` gives the cross-attention of each written token over
the frames (the encoder–decoder's Trace) — what word timestamps are built on (`Transcription.words`,
qkv.writing.timestamps).
The model comes in as an argument: this module never imports qkv.models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..core.stack import encoder_pass
from ..runtime.errors import QkvError
from .whisper_rules import (TASKS, WhisperRules, apply_rules, finish_prompt, language_id, prompt_of, read_rules,
                            timestamp_rules)

__all__ = ["Segment", "Transcription", "Window", "WhisperRules", "apply_rules", "read_rules", "segments_of",
           "timestamp_rules", "transcribe"]

TIME_PRECISION = 0.02            # seconds per timestamp token (one encoder position)
FRAME_SECONDS = 0.01             # seconds per log-mel frame (hop 160 at 16 kHz)
INPUT_STRIDE = 2                 # log-mel frames per encoder position (the second convolution's stride)


# ── one window ───────────────────────────────────────────────────────────────────

def encode_window(model, window: np.ndarray) -> tuple[list, np.ndarray]:
    """One window of log-mel features (mels, 2·S) through the encoder → (each decoder layer's cross K, V, the
    source mask (1, S))."""
    frames = model.check_features(window)                                                # (1, 2·S, mels)
    ids, mask = model._source(frames)                                                    # (1, S)
    encoded = encoder_pass(model.weights, model.config, ids, mask, model.stacks(), tokens=frames)   # (1, S, d)
    return model.memory(encoded), mask


def first_logits(model, memory, mask, start: int) -> np.ndarray:
    """The logits (V,) after the start token alone: what language detection reads."""
    return model.decoder_logits(np.array([[start]]), memory, mask, np.ones((1, 1), np.int64))[0, -1]


def greedy(model, memory, mask, prompt: list[int], max_length: int, rules: WhisperRules, timestamps: bool
           ) -> list[int]:
    """The tokens written after PROMPT (the end token included when written): argmax under the rules, one token at
    a time through the decoder's KV cache, until the end token or MAX_LENGTH tokens in all."""
    ids = list(prompt)
    cache = model.new_cache(1, max(max_length, len(ids) + 1))
    new = list(prompt)
    while len(ids) < max_length:
        logits = model.decoder_logits(np.array([new]), memory, mask, np.ones((1, len(ids)), np.int64),
                                      cache=cache)[0, -1]                                 # (V,)
        token = int(np.argmax(apply_rules(logits, ids, len(prompt), rules, timestamps)))
        ids.append(token)
        new = [token]
        if token == rules.eos:
            break
    return ids[len(prompt):]


@dataclass
class Segment:
    """A stretch of the transcript between two timestamps (or one whole window without them)."""

    start: float                  # seconds from the start of the sound
    end: float
    ids: list[int]                # its tokens, timestamps included
    text: str = ""


def trim(written: list[int], rules: WhisperRules) -> list[int]:
    """A window's written tokens as transformers keeps them: trailing padding dropped (every pad token counted,
    one kept when pad is the end token), then the end token."""
    seq = list(written)
    if seq and seq[-1] == rules.pad:
        n = seq.count(rules.pad) - (1 if rules.pad == rules.eos else 0)
        seq = seq[:len(seq) - n] if n > 0 else seq
    if seq and seq[-1] == rules.eos:
        seq = seq[:-1]
    return seq


def segments_of(seq: list[int], begin: int, offset: float, window_frames: int) -> tuple[list[Segment], int]:
    """A window's tokens SEQ cut into segments at each pair of timestamps (transformers' _retrieve_segment), and
    how many log-mel frames `seek` moves: past the window when it ended on a lone timestamp or had no pair, else
    to its last complete segment's end. OFFSET: the window's start in seconds; WINDOW_FRAMES: its frames."""
    stamp = [t >= begin for t in seq]
    single_ending = stamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(stamp) - 1) if stamp[i] and stamp[i + 1]]
    if cuts:
        if single_ending:
            cuts.append(len(seq))
        else:
            cuts[-1] += 1
        out, last = [], 0
        for i, cut in enumerate(cuts):
            part = seq[last:cut]
            end_at = -1 if i < len(cuts) - 1 or single_ending else -2
            out.append(Segment(offset + (part[0] - begin) * TIME_PRECISION,
                               offset + (part[end_at] - begin) * TIME_PRECISION, part))
            last = cut
        moved = window_frames if single_ending else (seq[last - 2] - begin) * INPUT_STRIDE
        return out, moved
    positions = [i for i, s in enumerate(stamp) if s]
    end = int(window_frames * FRAME_SECONDS / TIME_PRECISION) * TIME_PRECISION         # whole positions, as there
    if positions and seq[positions[-1]] != begin:
        end = (seq[positions[-1]] - begin) * TIME_PRECISION
    return [Segment(offset, offset + end, seq)], window_frames


# ── the whole sound ─────────────────────────────────────────────────────────────

@dataclass
class Window:
    """One pass of the decoder over 2·S frames starting at frame `seek`."""

    seek: int
    prompt: list[int]
    written: list[int]            # as written: the end token included when it came
    kept: int = 0                 # how many of `written` its segments kept (a prefix: the end token and any
                                  # unfinished segment left out)


@dataclass
class Transcription:
    """What `transcribe` returns."""

    ids: np.ndarray               # (n,) the transcript's tokens: equal to transformers' generate (batch of one)
    text: str | None              # the tokens as text (timestamps and special tokens left out); None: no tokenizer
    language: str | None          # "<|ko|>": given or detected; None when the checkpoint has no languages
    language_probs: dict[str, float] | None     # detected: the softmax over the language tokens, likeliest first
    task: str | None
    segments: list[Segment]
    windows: list[Window]
    features: np.ndarray = field(repr=False)    # (mels, T) what was read
    model: Any = field(repr=False, default=None)
    frames: int | None = None     # the sound's own log-mel frames (a sound file read): word timestamps cut each
                                  # window's attention there, as transformers does given the attention_mask

    @cached_property
    def alignments(self) -> list:
        """Each window's Alignment (qkv.writing.timestamps.align): its alignment heads' cross-attention over the
        frames, the DTW path and each token's time. Computed once."""
        from .timestamps import align

        return [align(self, w) for w in range(len(self.windows))]

    @property
    def words(self) -> list:
        """Each word heard, Word(word, start, end, tokens): seconds from the start of the sound, by dynamic time
        warping over the alignment heads' cross-attention, as transformers' return_token_timestamps and its
        pipeline's return_timestamps="word" (qkv.writing.timestamps)."""
        from .timestamps import words_of

        return words_of(self, self.alignments)

    @property
    def token_timestamps(self) -> np.ndarray:
        """The time of each token of `ids` (n,), seconds from its window's start: transformers' generate(…,
        return_token_timestamps=True)["token_timestamps"]."""
        from .timestamps import token_timestamps

        return token_timestamps(self, alignments=self.alignments)

    def trace(self, window: int = 0, keep: tuple[str, ...] = ("attentions",)):
        """The Trace of window WINDOW: its frames and the decoder's prompt + written tokens (the final end token
        left out, so the last row wrote it), with `.cross` (L_dec, H, n_tgt, S): each token over the frames."""
        w = self.windows[window]
        target = w.prompt + w.written
        if w.written and w.written[-1] == rules_of(self.model).eos:
            target = target[:-1]
        return self.model.run(window_frames(self.features, w.seek, 2 * self.model.config.source_positions),
                              np.array(target, np.int64), keep=keep)


def rules_of(model) -> WhisperRules:
    rules = getattr(model, "rules", None)
    if rules is None:
        raise QkvError(f"{model.name} has no generation rules (generation_config.json); load it with qkv.load")
    return rules


def window_frames(features: np.ndarray, seek: int, frames: int) -> np.ndarray:
    """FRAMES log-mel frames from SEEK (mels, frames), zero-padded past the end (as generate's _get_input_segment)."""
    part = features[:, seek:seek + frames]
    if part.shape[1] < frames:
        part = np.pad(part, ((0, 0), (0, frames - part.shape[1])))
    return part


def check_request(model, rules: WhisperRules, features, language: str | None, task: str | None,
                  timestamps: bool | None, max_new_tokens: int | None) -> tuple[np.ndarray, bool]:
    """The features (mels, T) and whether timestamps are on, or one QkvError naming what cannot be done."""
    if rules.refused:
        raise QkvError(f"{model.name}'s generation_config.json asks for {rules.refused[0]}; qkv's transcribe "
                       "decodes greedily, as generate(num_beams=1) without it: remove that key")
    x = np.asarray(features)
    mels = model.config.audio_mels
    if x.ndim == 3 and len(x) == 1:
        x = x[0]
    if x.ndim != 2 or x.shape[0] != mels or x.shape[1] == 0 or not np.issubdtype(x.dtype, np.floating):
        raise QkvError(f"features must be log-mel floats of shape ({mels}, frames), got {x.dtype} {x.shape}; give "
                       "a sound file, or qkv.inputs.audio.log_mel(samples, n_mels)")
    if not np.isfinite(x).all():
        raise QkvError("the features hold inf or NaN; give finite log-mel values")
    if rules.multilingual is False and (language is not None or task is not None):
        raise QkvError(f"{model.name} is English-only: give no language or task")
    if task is not None and (task not in TASKS or task not in rules.task_to_id):
        raise QkvError(f"task {task!r} is not one {model.name} knows; give one of "
                       f"{', '.join(t for t in TASKS if t in rules.task_to_id) or 'none (no task_to_id)'}")
    if language is not None and not rules.lang_to_id:
        raise QkvError(f"{model.name}'s generation config has no lang_to_id; give no language")
    long_form = x.shape[1] > 2 * model.config.source_positions
    on = rules.timestamps if timestamps is None else bool(timestamps)
    if long_form and timestamps is False:
        raise QkvError(f"the sound is longer than one {2 * model.config.source_positions}-frame window (30 s): "
                       "Whisper writes it window by window with timestamps; leave timestamps on")
    on = on or long_form
    if on and (rules.no_timestamps is None or (rules.eos or rules.bos) is None):
        raise QkvError(f"{model.name}'s generation config has no no_timestamps_token_id (or no end token), so it "
                       "cannot write timestamps; transcribe without them")
    if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens
                                       or max_new_tokens < 1):
        raise QkvError(f"max_new_tokens must be a whole number ≥ 1, got {max_new_tokens}")
    return np.ascontiguousarray(x, dtype=model.dtype), on


def transcribe(model, features, *, language: str | None = None, task: str | None = None,
               timestamps: bool | None = None, max_new_tokens: int | None = None) -> Transcription:
    """Log-mel FEATURES (mels, T) → Transcription, as transformers' WhisperForConditionalGeneration.generate(
    features, num_beams=1, language=, task=, return_timestamps=, max_new_tokens=) writes it (see the module
    docstring). T ≤ 2·S: one window; longer: window by window (timestamps on)."""
    rules = rules_of(model)
    language = rules.language if language is None else language                # the config's, as transformers
    task = rules.task if task is None else task
    x, stamps = check_request(model, rules, features, language, task, timestamps, max_new_tokens)
    S2, limit = 2 * model.config.source_positions, model.config.max_positions
    given = None if language is None else language_id(rules, language)
    tokens = prompt_of(rules, given, task)
    probs, first = None, None
    if given is None and rules.lang_to_id and (len(tokens) <= 1 or tokens[1] is None):
        first = encode_window(model, window_frames(x, 0, S2))
        given, probs = detect_language(model, rules, *first)
    prompt = finish_prompt(rules, tokens, given, language is not None, task, stamps)
    max_length = rules.max_length
    if max_new_tokens is None:
        max_new_tokens = rules.max_new_tokens
    if max_new_tokens is not None and max_new_tokens + len(prompt) > limit:
        raise QkvError(f"{max_new_tokens} new tokens after a prompt of {len(prompt)} pass {model.name}'s {limit} "
                       f"target positions; give max_new_tokens of at most {limit - len(prompt)}")
    seek, T, windows, segments = 0, x.shape[1], [], []
    begin = rules.timestamp_begin if rules.timestamp_begin is not None else model.config.vocab_size + 1
    while seek < T:
        frames = min(T - seek, S2)
        memory, mask = first if (first is not None and seek == 0) else encode_window(model, window_frames(x, seek, S2))
        if max_new_tokens is None:                     # transformers raises max_length by the prompt, every window
            max_length = min(max_length + min(limit // 2 - 1, len(prompt)), limit)
            length = max_length
        else:
            length = len(prompt) + max_new_tokens
        written = greedy(model, memory, mask, prompt, length, rules, stamps)
        parts, moved = segments_of(trim(written, rules), begin, seek * FRAME_SECONDS, frames)
        windows.append(Window(seek, prompt, written, sum(len(p.ids) for p in parts)))
        segments += parts
        if moved <= 0:
            break                                      # no progress: transformers would read this window again
        seek += moved
    ids = np.array([t for s in segments for t in s.ids], dtype=np.int64)                 # (n,)
    text = None
    if model.tokenizer is not None:
        for s in segments:
            s.text = model.tokenizer.decode([t for t in s.ids if t < begin], skip_special_tokens=True)
        text = model.tokenizer.decode([t for t in ids if t < begin], skip_special_tokens=True)
    name = next((k for k, v in rules.lang_to_id.items() if v == prompt[1]), None) if len(prompt) > 1 else None
    return Transcription(ids, text, name, probs, task, segments, windows, x, model)


def detect_language(model, rules: WhisperRules, memory, mask) -> tuple[int, dict[str, float]]:
    """The language token the decoder likes best after the start token (every other logit −inf, as transformers'
    detect_language), and the softmax over the language tokens, likeliest first."""
    logits = first_logits(model, memory, mask, rules.decoder_start).astype(np.float64)  # (V,)
    names = list(rules.lang_to_id)
    z = logits[[rules.lang_to_id[n] for n in names]]                                     # (languages,)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    masked = np.full_like(logits, -np.inf)
    ids = list(rules.lang_to_id.values())
    masked[ids] = logits[ids]
    return int(np.argmax(masked)), {names[i]: float(p[i]) for i in order}

"""Whisper as qkv holds it: the encoder–decoder of every translation model, whose encoder reads sound.

    log-mel features (mels, 2·S) ─two GELU convolutions (the second of stride 2)─▶ (S, d_model) + sinusoids
      └─▶ L_enc pre-norm blocks ─▶ LayerNorm ─▶ M                      one row per 20 ms of sound
    text tokens ─embed + learned positions─▶ L_dec blocks (self-attention, cross-attention to M, FFN)
      ─▶ LayerNorm ─▶ logits

The passes are the encoder–decoder's (qkv.models.seq2seq): the features go in as the encoder's `tokens`
(blocks.embed runs the convolutions), so hooks, ablation, recording and the cross-attention of every text token
over the frames are the translation models' own. Writing is Whisper's own (qkv.writing.transcribe: its prompt of
language and task tokens, language detection, suppressed tokens, timestamps, window by window): `transcribe` and
`generate`, equal to transformers' generate(num_beams=1); `run` without a target reads the model's own transcript.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..core.hooks import HookFn
from .seq2seq import SEQ2SEQ_KEEP, Seq2SeqModel, Seq2SeqOutput
from ..core.stack import encoder_pass
from ..core.trace import Trace
from ..writing.transcribe import Transcription, WhisperRules, read_rules, transcribe

FRAME_SECONDS = 0.02          # one encoder position: two 10 ms frames (WhisperFeatureExtractor's hop, 160 at 16 kHz)


def frame_labels(n: int) -> list[str]:
    """The encoder's positions as a reader sees them: the start of the 20 ms each covers."""
    return [f"{i * FRAME_SECONDS:.2f}s" for i in range(n)]


class AudioModel(Seq2SeqModel):
    """A loaded Whisper: reads log-mel features (B, mels, 2·S) and a target, as transformers' forward does, and
    writes a transcript (`transcribe`) under the rules of its generation_config.json."""

    directory: Path | None = None        # the checkpoint's folder (qkv.load sets it): its generation_config.json
    _rules: WhisperRules | None = None

    @property
    def rules(self) -> WhisperRules:
        """How this checkpoint writes (read once from its generation_config.json, else its config.json)."""
        if self._rules is None:
            if self.directory is None:
                raise QkvError(f"{self.name} was not read from a folder, so it has no generation_config.json; load "
                               "it with qkv.load(FOLDER)")
            from ..runtime.io_json import read_json

            hf = read_json(self.directory / "config.json", what="config.json")
            self._rules = read_rules(self.directory, self.config, hf)
        return self._rules

    @property
    def median_filter_width(self) -> int:
        """config.json's median_filter_width (default 7): the median filter word timestamps smooth the alignment
        heads' attention with (qkv.writing.timestamps). Odd and ≥ 1, else one QkvError."""
        if self.directory is None:
            return 7
        from ..runtime.io_json import read_json

        width = read_json(self.directory / "config.json", what="config.json").get("median_filter_width", 7)
        if isinstance(width, bool) or not isinstance(width, int) or width < 1 or width % 2 != 1:
            raise QkvError(f"config.json: median_filter_width must be an odd whole number ≥ 1, got {width!r}; set "
                           "it to 7 (Whisper's)")
        return width

    @property
    def window_samples(self) -> int:
        """The samples a sound is padded to before its log-mel features are made: preprocessor_config.json's
        n_samples (WhisperFeatureExtractor's chunk_length · 16,000: 3 s for `qkv train --task speech`'s models),
        30 s without one. Whole and ≥ 1, else one QkvError."""
        from ..inputs.audio import WINDOW_SAMPLES

        path = None if self.directory is None else Path(self.directory) / "preprocessor_config.json"
        if path is None or not path.is_file():
            return WINDOW_SAMPLES
        from ..runtime.io_json import read_json

        n = read_json(path, what="preprocessor_config.json").get("n_samples", WINDOW_SAMPLES)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise QkvError(f"preprocessor_config.json: n_samples must be a whole number ≥ 1, got {n!r}; set it to "
                           "chunk_length × 16000 (480000 for Whisper's 30 s)")
        return n

    def __repr__(self) -> str:
        c = self.config
        return (f"AudioModel({self.name!r}: {c.family}, {c.audio_mels} mels × {2 * c.source_positions} frames, "
                f"L_enc={c.n_layers}, L_dec={c.n_decoder_layers}, H={c.n_heads}, d_model={c.d_model}, V={c.vocab_size})")

    def astype(self, dtype) -> "AudioModel":
        other = AudioModel(self.config, self.weights.astype(dtype), self.tokenizer, self.name, self.source)
        other.directory, other._rules = self.directory, self._rules
        return other

    def check_features(self, input_features) -> np.ndarray:
        """Log-mel features (B, mels, frames) or (mels, frames): finite floats, exactly 2·S frames (Whisper pads or
        cuts every input to 30 s, as its feature extractor does) → (B, frames, mels), time first."""
        x = np.asarray(input_features)
        x = x[None] if x.ndim == 2 else x
        c = self.config
        want = (c.audio_mels, 2 * c.source_positions)
        if x.ndim != 3 or x.shape[1:] != want or not np.issubdtype(x.dtype, np.floating) or x.shape[0] == 0:
            raise QkvError(f"input_features must be log-mel floats of shape (B, {want[0]}, {want[1]}), got {x.dtype} "
                           f"{x.shape}; pad or cut them to {want[1]} frames, as WhisperFeatureExtractor does")
        if not np.isfinite(x).all():
            raise QkvError("input_features hold inf or NaN; give finite log-mel values")
        return np.ascontiguousarray(x.transpose(0, 2, 1), dtype=self.dtype)          # (B, frames, mels)

    def _source(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The encoder's ids (unused: the frames are its tokens) and mask (every position real), (B, S)."""
        ids = np.zeros((len(frames), self.config.source_positions), np.int64)
        return ids, np.ones_like(ids)

    def forward(self, input_features, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None, *,
                attentions: bool = True, ablate: Iterable | None = None, how: str = "zero",
                hooks: Mapping[str, HookFn] | None = None) -> Seq2SeqOutput:
        """input_features (B, mels, 2·S) and decoder ids (B, n_tgt) → Seq2SeqOutput, as transformers'
        WhisperForConditionalGeneration with decoder_input_ids; cross_attentions (L_dec, B, H, n_tgt, S)."""
        if attention_mask is not None:
            raise QkvError("Whisper reads every frame of its 30 s window: give input_features without a mask")
        frames = self.check_features(input_features)
        ids, mask = self._source(frames)
        dec, dec_mask = self.check_decoder_ids(decoder_input_ids, decoder_attention_mask, len(ids))
        self.check_length(dec.shape[1])
        stacks = self.stacks(hooks, ablate, how, keep=("attentions",) if attentions else ())
        encoded = encoder_pass(self.weights, self.config, ids, mask, stacks, tokens=frames)
        return self._output(stacks, encoded, dec, dec_mask, mask, attentions)

    def run(self, input_features, target: str | Sequence[int] | None = None, *, keep: Iterable[str] = SEQ2SEQ_KEEP,
            max_new_tokens: int | None = None, ablate: Iterable | None = None, how: str = "zero",
            hooks: Mapping[str, HookFn] | None = None) -> Trace:
        """One sound (its log-mel features (mels, 2·S)) and its transcript through the model, as
        Seq2SeqModel.run: the decoder's Trace with `.encoder` (the frames, labelled by time: "0.00s", "0.02s",
        …) and `.cross` (each text token over the frames). target: the decoder's ids (starting with
        decoder_start_token_id) or, with a tokenizer, the text after it; None: the model's own transcript (its
        prompt and what it writes, less the end token: the last row writes it); max_new_tokens: its bound."""
        if target is None:
            frames = self.check_features(input_features)
            if len(frames) != 1:
                raise QkvError(f"run reads one sound; got a batch of {len(frames)}: use forward for batches")
            written = self.transcribe(frames[0].T, max_new_tokens=max_new_tokens)
            return written.trace(0, keep=tuple(keep))
        frames = self.check_features(input_features)
        if len(frames) != 1:
            raise QkvError(f"run reads one sound; got a batch of {len(frames)}: use forward for batches")
        dec = self._target(target)
        self.check_length(len(dec))
        return self._trace(self._source(frames)[0][0], frame_labels(self.config.source_positions), None, dec,
                           target if isinstance(target, str) else None, self.stacks(hooks, ablate, how, keep=keep),
                           frames)

    def encoder_output(self, ids, mask):
        raise QkvError(f"{self.name} reads sound: give its log-mel features to run or forward")

    def transcribe(self, source, *, language: str | None = None, task: str | None = None,
                   timestamps: bool | None = None, max_new_tokens: int | None = None) -> Transcription:
        """A sound file's path, or its log-mel features (mels, frames), → Transcription (ids, text, language and
        its probabilities when detected, segments with times, each window's tokens; `.trace(w)`: the cross-
        attention of every written token over the frames). language: a code ("ko") or token ("<|ko|>"), None:
        detected; task: "transcribe" or "translate"; timestamps: write timestamp tokens (None: the generation
        config's; always on past 30 s). Equal to transformers' generate(features, num_beams=1, language=, task=,
        return_timestamps=, max_new_tokens=) (qkv.writing.transcribe). `.words`: each word's span of sound
        (qkv.writing.timestamps); from a sound file, the alignment is cut where the sound ends, as transformers'
        pipeline (its attention_mask) cuts it."""
        frames = None
        if isinstance(source, (str, Path)):
            from ..inputs.audio import HOP, sound_features

            source, sound = sound_features(source, self.config.audio_mels, self.window_samples)
            frames = -(-len(sound.samples) // HOP)            # WhisperFeatureExtractor's attention_mask.sum()
        result = transcribe(self, source, language=language, task=task, timestamps=timestamps,
                            max_new_tokens=max_new_tokens)
        result.frames = frames
        return result

    def generate(self, input_features, *more, language: str | None = None, task: str | None = None,
                 timestamps: bool | None = None, max_new_tokens: int | None = None, **settings) -> np.ndarray:
        """Log-mel features (B, mels, frames) or (mels, frames) → the written ids (B, n), each row as transformers'
        WhisperForConditionalGeneration.generate(num_beams=1) writes it (prompt and end token left out), rows
        padded on the right with pad_token_id. Whisper writes greedily under its own rules: the text models'
        arguments (a count of new tokens given by position, sampling settings) are refused in one line."""
        if more or settings:
            raise QkvError(f"{self.name} is Whisper: it writes greedily from sound; call generate(features, "
                           "language=, task=, timestamps=, max_new_tokens=) or transcribe(FILE)")
        x = np.asarray(input_features)
        if x.ndim not in (2, 3) or len(x) == 0:
            raise QkvError(f"input_features must be log-mel features (B, mels, frames) or (mels, frames), got {x.shape}")
        rows = [self.transcribe(f, language=language, task=task, timestamps=timestamps,
                                max_new_tokens=max_new_tokens).ids for f in (x[None] if x.ndim == 2 else x)]
        pad = self.rules.pad if self.rules.pad is not None else 0
        out = np.full((len(rows), max(len(r) for r in rows)), pad, np.int64)              # (B, n)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out

    def stream(self, *args, **kwargs):
        raise QkvError(f"{self.name} writes a transcript window by window: use transcribe (or qkv transcribe FILE)")

    bound = stream

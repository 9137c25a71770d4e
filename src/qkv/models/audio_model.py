"""Whisper as qkv holds it: the encoder–decoder of every translation model, whose encoder reads sound.

    log-mel features (mels, 2·S) ─two GELU convolutions (the second of stride 2)─▶ (S, d_model) + sinusoids
      └─▶ L_enc pre-norm blocks ─▶ LayerNorm ─▶ M                      one row per 20 ms of sound
    text tokens ─embed + learned positions─▶ L_dec blocks (self-attention, cross-attention to M, FFN)
      ─▶ LayerNorm ─▶ logits

The passes are the encoder–decoder's (qkv.models.seq2seq): the features go in as the encoder's `tokens`
(blocks.embed runs the convolutions), so hooks, ablation, recording and the cross-attention of every text token
over the frames are the translation models' own. The target is given (its ids, or text with a tokenizer): Whisper's
writing (its prompt of language and task tokens, suppressed tokens, timestamps) is not in qkv.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..core.hooks import HookFn
from .seq2seq import SEQ2SEQ_KEEP, Seq2SeqModel, Seq2SeqOutput
from ..core.stack import encoder_pass
from ..core.trace import Trace

FRAME_SECONDS = 0.02          # one encoder position: two 10 ms frames (WhisperFeatureExtractor's hop, 160 at 16 kHz)


def frame_labels(n: int) -> list[str]:
    """The encoder's positions as a reader sees them: the start of the 20 ms each covers."""
    return [f"{i * FRAME_SECONDS:.2f}s" for i in range(n)]


class AudioModel(Seq2SeqModel):
    """A loaded Whisper: reads log-mel features (B, mels, 2·S) and a target, as transformers' forward does."""

    def __repr__(self) -> str:
        c = self.config
        return (f"AudioModel({self.name!r}: {c.family}, {c.audio_mels} mels × {2 * c.source_positions} frames, "
                f"L_enc={c.n_layers}, L_dec={c.n_decoder_layers}, H={c.n_heads}, d_model={c.d_model}, V={c.vocab_size})")

    def astype(self, dtype) -> "AudioModel":
        return AudioModel(self.config, self.weights.astype(dtype), self.tokenizer, self.name)

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
        decoder_start_token_id) or, with a tokenizer, the text after it."""
        if target is None:
            raise QkvError("give the transcript (target ids, or text): Whisper's own writing is not in qkv")
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

    def generate(self, *args, **kwargs):
        raise QkvError(f"Whisper's writing (its language and task prompt, suppressed tokens, timestamps) is not in "
                       f"qkv; give the transcript to {self.name}'s run or forward")

    stream = bound = generate

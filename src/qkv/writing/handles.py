"""What code outside the model handles reads of a model, as Protocols: the decoding loops, chat and
saving take any object of these shapes (a Model, a Seq2SeqModel, the decoder of one bound to a source),
so they never import the handles that import them (tests/test_imports.py: no cycle, not even in types).

    Handle          config, weights, tokenizer, name, dtype: every loaded model
    Writer          + check_ids, encode, last_logits, run (and step, for a recorded generation):
                    what writing.generate drives (a decoder)
    SourceWriter    + start_token, bound: what writing.seq2seq_generate drives (an encoder–decoder)
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..core.cache import KVCache
from ..core.config import ModelConfig
from ..inputs.tokenizer import Tokenizer
from ..core.trace import Recorder, Trace


class Handle(Protocol):
    """A loaded model: its knobs, its parameters (Weights or Seq2SeqWeights), its tokenizer and name."""

    config: ModelConfig
    weights: Any
    tokenizer: Tokenizer | None
    name: str

    @property
    def dtype(self) -> np.dtype: ...


class Writer(Handle, Protocol):
    """A decoder as the decoding loop drives it."""

    def check_ids(self, input_ids, attention_mask=None) -> tuple[np.ndarray, np.ndarray]: ...

    def encode(self, text: str) -> tuple[np.ndarray, list[str]]: ...

    def last_logits(self, ids: np.ndarray, attention_mask: np.ndarray, *, rec: Recorder | None = None,
                    cache: KVCache | None = None) -> np.ndarray: ...

    def step(self, ids: np.ndarray, attention_mask: np.ndarray, *, rec: Recorder | None = None,
             cache: KVCache | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def run(self, text, **options: Any) -> Trace: ...


class SourceWriter(Handle, Protocol):
    """An encoder–decoder as its writing loop drives it: the source read once (`bound`), then a decoder."""

    start_token: int

    def check_ids(self, input_ids, attention_mask=None) -> tuple[np.ndarray, np.ndarray]: ...

    def encode(self, text: str) -> tuple[np.ndarray, list[str]]: ...

    def bound(self, ids: np.ndarray, mask: np.ndarray) -> Writer: ...

    def run(self, text, target=None, **options: Any) -> Trace: ...

    def without_end(self, dec: np.ndarray) -> np.ndarray: ...

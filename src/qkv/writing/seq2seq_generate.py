"""Writing a target from a source (guide: temperature, kv-cache): the encoder once, then the decoder a token at a time.

    encode:   the source through the encoder once → M; each decoder layer's cross K = M·W_K, V = M·W_V
    start:    the decoder reads decoder_start_token_id
    step:     the newest target token alone → self-attention over the KV cache, cross-attention
              over the source's K, V → logits[last] → sample → append → repeat

`decode` starts the decoders' own loop (generate.decode) on the decoder with its source read;
`Seq2SeqModel.generate` and `.stream` wrap it for text and ids. Sampling, stop ids and stop strings work as for decoders (qkv.writing.sampling, qkv.writing.generate).
The model comes in as an argument: this module never imports qkv.models.seq2seq (which imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

from ..runtime.errors import QkvError
from .generate import Step, TextStream, split_stop, stop_ids
from .generate import decode as steps
from .sampling import Sampling

if TYPE_CHECKING:
    from .handles import SourceWriter


def check_can_generate(model: SourceWriter, max_new_tokens: int) -> None:
    """A whole number of new tokens that, after the start token, fits the decoder's positions."""
    if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise QkvError(f"max_new_tokens must be a whole number ≥ 1, got {max_new_tokens}")
    limit = model.config.max_positions
    if 1 + max_new_tokens > limit:
        raise QkvError(f"{max_new_tokens} new tokens would pass {model.name}'s {limit} target positions; "
                       f"lower max_new_tokens to at most {limit - 1}")


def decode(model: SourceWriter, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int,
           sampling: Sampling | None = None, *, stop_tokens: list[int] | None = None,
           use_cache: bool = True, keep_attentions: bool = False) -> Iterator[Step]:
    """Yield one Step per new target token until max_new_tokens or every row has stopped.

    ids, mask (B, n_src): checked source ids. The decoders' own loop (generate.decode) writes, its
    prompt the start token, its model the decoder with this source read (`Seq2SeqModel.bound`: the
    encoder and the cross-attention's K, V run once, the source does not change while the target
    grows). use_cache=False re-runs the decoder over the whole target each step (same numbers).
    """
    check_can_generate(model, max_new_tokens)
    start = np.full((len(ids), 1), model.start_token, dtype=np.int64)   # (B, 1) decoder_start_token_id
    yield from steps(model.bound(ids, mask), start, np.ones_like(start), max_new_tokens, sampling,
                     stop_tokens=stop_tokens, use_cache=use_cache, keep_attentions=keep_attentions)


def stream_ids(model: SourceWriter, input_ids, max_new_tokens: int, sampling: Sampling | None = None, *,
               attention_mask=None, stop=None, use_cache: bool = True) -> Iterator[np.ndarray]:
    """Yield the new target token of every row, (B,), step by step."""
    ids, mask = model.check_ids(input_ids, attention_mask)
    stop_tokens, stop_strings = split_stop(stop)
    if stop_strings:
        raise QkvError("stop strings need a text source; with token ids give stop token ids")
    for step in decode(model, ids, mask, max_new_tokens, sampling, stop_tokens=stop_tokens, use_cache=use_cache):
        yield step.ids


class TargetStream(TextStream):
    """The target of a source (text or ids), as text, piece by piece, as soon as each piece is final
    (generate.TextStream with this module's `decode`: the same attributes, the same holding back).

    Iterate it for the pieces; afterwards `prompt_ids` holds the source, `new_ids` the target's
    tokens (without the start token). A piece is held back while it could still begin a stop
    string or ends inside a multi-byte character; stop tokens (EOS) end the text unshown.
    """

    def __init__(self, model: SourceWriter, source: str | np.ndarray, max_new_tokens: int,
                 sampling: Sampling | None = None, *, stop=None, use_cache: bool = True):
        if model.tokenizer is None:
            raise QkvError(f"{model.name} has no tokenizer.json, so the target cannot be written as text; "
                           "add the checkpoint's tokenizer.json or pass token ids")
        self.model, self.source, self.max_new_tokens = model, source, max_new_tokens
        self.sampling, self.use_cache = Sampling.of(sampling), use_cache
        self.prompt_ids = model.encode(source)[0] if isinstance(source, str) else model.check_ids(source)[0][0]
        self.stop_tokens, self.stop_strings = split_stop(stop)
        check_can_generate(model, max_new_tokens)               # fail now, not mid-stream
        self.new_ids: list[int] = []
        self.recording = None                                   # its trace is a pass over source and target

    decoding = staticmethod(decode)                  # the encoder–decoder's loop

    def trace(self, keep: tuple[str, ...] = ("attentions",)):
        """The Trace of the source and the written target (after iterating): what every target
        token read in the source (`.cross`), in the target (the trace) and the source itself (`.encoder`)."""
        target = np.array([self.model.start_token, *self.new_ids], dtype=np.int64)           # (1 + new,)
        result = self.model.run(self.prompt_ids, target=target, keep=keep)
        result.text = self.model.tokenizer.decode(self.new_ids, skip_special_tokens=True)
        if isinstance(self.source, str):
            result.encoder.text = self.source
        return result


def generate(model: SourceWriter, source, max_new_tokens: int, sampling: Sampling | None = None, *,
             attention_mask=None, stop=None, use_cache: bool = True, trace: bool = False):
    """Text in → the target text; ids (B, n_src) in → decoder ids (B, 1 + new), starting with
    decoder_start_token_id as transformers' generate (rows that stopped early are padded).
    trace=True: the Trace of source and target instead (see Seq2SeqModel.run)."""
    if isinstance(source, str):
        stream = TargetStream(model, source, max_new_tokens, sampling, stop=stop, use_cache=use_cache)
        text = "".join(stream)
        return stream.trace() if trace else text
    ids, mask = model.check_ids(source, attention_mask)
    steps = list(stream_ids(model, ids, max_new_tokens, sampling, attention_mask=mask, stop=stop, use_cache=use_cache))
    out = np.concatenate([np.full((len(ids), 1), model.start_token, np.int64), np.stack(steps, axis=1)], axis=1)
    if not trace:
        return out                                              # (B, 1 + new)
    if len(out) != 1:
        raise QkvError("trace=True follows one sequence; give a batch of one")
    return model.run(ids[0], target=model.without_end(out[0]), keep=("attentions",))


def translation_trace(model: SourceWriter, text: str, target: np.ndarray | None = None):
    """The Trace of the source TEXT and a target: TARGET's ids (teacher forcing), or else the model's greedy
    translation. The decoder reads the start token and the target without its final EOS, so row t
    wrote target token t + 1 and the last row's choice is the target's end (`viz.seq2seq.written`)."""
    ids, _ = model.encode(text)                                               # (n_src,)
    forced = target is not None
    if not forced:
        new = min(64, model.config.max_positions - 1)
        target = model.generate(ids[None], new, temperature=0)[0, 1:]         # (≤ new,) after the start token
    target = list(np.asarray(target).tolist())
    ends = set(stop_ids(model, True, []).tolist())
    if target and target[-1] in ends:
        target.pop()                                                          # the end is written by the last row
    trace = model.run(ids, target=np.array([model.start_token, *target], dtype=np.int64), keep=("attentions",))
    trace.text = model.tokenizer.decode(target, skip_special_tokens=True)
    trace.encoder.text = text
    if forced:
        trace.prompt_length = None                                            # given, not generated
    return trace

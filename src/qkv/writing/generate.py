"""Writing text (guide: temperature, kv-cache): one token at a time, each step reading the past from a KV cache.

    prefill:  the prompt through the model once → cache K, V of every prompt position
    step:     the newest token alone → logits[last] → sample → append → repeat

`decode` is the loop; `Model.generate` and `Model.stream` wrap it for text and ids. The
model comes in as an argument: this module never imports qkv.models.model (which imports it).
A `Recording` keeps what the loop's passes computed, so that the generation's trace (what every
token attended to, the logits it was chosen from) needs no second pass over the text (`--trace`).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

from ..core.blocks import logits_of
from ..core.cache import KVCache
from ..runtime.errors import QkvError
from ..inputs.tokenizer import check_text
from .sampling import Sampling
from ..runtime.threads import StepThreads, blas_at_most, cores, decode_threads
from ..runtime.tuning import choices, pinned
from ..core.trace import LayerTrace, Recorder, Trace, made_by, spelled

if TYPE_CHECKING:
    from .handles import Writer


@dataclass
class Step:
    """One generated token for every row of the batch."""

    ids: np.ndarray                    # (B,) the new tokens
    done: np.ndarray                   # (B,) rows that have stopped (their ids are padding from now on)
    attentions: np.ndarray | None      # (L, B, H, m) what the last fed token attended to (m = keys so far)


def check_can_generate(model: Writer, prompt_length: int, max_new_tokens: int) -> None:
    """Encoders cannot write; the prompt and what we add must fit the model's context."""
    cfg = model.config
    if not cfg.causal or model.weights.W_vocab is None:
        raise QkvError(f"{model.name} is an encoder ({cfg.family}): it reads the whole text at once and cannot "
                       "generate; use a decoder: --model smollm2 (shipped with qkv), a .gguf file, or a GPT-2, "
                       "Llama, Mistral or Qwen2 directory")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise QkvError(f"max_new_tokens must be a whole number ≥ 1, got {max_new_tokens}")
    if prompt_length + max_new_tokens > cfg.context:
        raise QkvError(f"the prompt has {prompt_length} tokens and {max_new_tokens} new ones would pass "
                       f"{model.name}'s context of {cfg.context}; shorten the prompt or lower max_new_tokens")


def stop_ids(model: Writer, stop_at_eos: bool, stop_tokens: list[int]) -> np.ndarray:
    """The ids that end a row: the model's EOS (unless stop_at_eos is False) and stop_tokens. An eos, bos or
    pad id the vocabulary lacks (GPT-2's default 50256 in a tiny checkpoint) is said once on stderr: a row then
    never ends on it, as in transformers."""
    eos = model.config.eos_token_id if stop_at_eos else None
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    absent = model.config.absent_special_ids()
    if absent:
        never = bool(eos) and all(not 0 <= e < model.config.vocab_size for e in eos)   # no eos can end a row
        _say_absent(model.name, model.config.vocab_size, tuple(sorted(absent.items())), never)
    return np.array(sorted(set(eos) | set(stop_tokens)), dtype=np.int64)


@functools.lru_cache(maxsize=None)
def _say_absent(name: str, vocab_size: int, absent: tuple[tuple[str, int], ...], never: bool) -> None:
    """One line on stderr, once per model: its config's special ids ABSENT from its vocabulary; NEVER: no eos
    of the config can end a row."""
    ids = ", ".join(f"{key} {i}" for key, i in absent)
    end = " (writing stops only at the length asked or a stop token)" if never else ""
    print(f"qkv: note: {name}'s config names {ids}, outside its {vocab_size}-token vocabulary: ignored{end}",
          file=sys.stderr)


def fill_id(cfg, stops: np.ndarray) -> int:
    """The id a finished row is filled with while the others write: pad_token_id, else the first stop id, else
    0, whichever first is a token of the vocabulary (a filled row is fed to the model: its id must be a row
    of the embedding table)."""
    for i in (cfg.pad_token_id, *stops.tolist()):
        if i is not None and 0 <= i < cfg.vocab_size:
            return int(i)
    return 0


def step_threads() -> StepThreads:
    """The BLAS threads of one generation's one-token steps: pinned by QKV_DECODE_THREADS=N (or
    QKV_THREADS=decode:N), else timed while generating (threads.StepThreads) between 1 and the
    count measured fastest on this machine (qkv.runtime.tuning; at least 2 where there are 2 cores, so a
    measurement made while the machine was busy does not keep an idle machine on one thread)."""
    pin = decode_threads() or pinned().get("decode")
    if pin:
        return StepThreads(pinned=pin)
    return StepThreads(most=max(choices().decode, min(2, cores())))


class Recording:
    """What the passes of one generation (a batch of one) computed that its trace shows, kept as they ran:
    each fed token's attention rows in every layer, its final hidden state and the logits it was chosen
    from. `trace` then needs no second pass over the text; it feeds only the tokens no step has read yet
    (the last one written), through the generation's own KV cache.

    The passes record beside their arithmetic (Recorder(beside=True); a one-token step keeps the weights
    it computes anyway), so a recorded generation writes exactly what an unrecorded one writes.
    """

    def __init__(self):
        self.cache: KVCache | None = None
        self.ids: list[int] = []                         # (fed,) every token the passes read
        self.attentions: list[np.ndarray] = []           # per pass: (L, H, n, m) its n rows, m keys so far
        self.hidden: list[np.ndarray] = []               # per pass: (n, d_model)
        self.logits: np.ndarray | None = None            # (positions, V): row t once a pass ended at t
        self.ends: list[int] = []                        # the rows of `logits` the passes wrote

    def start(self, cache: KVCache, vocab: int) -> None:
        """The generation's cache, and room for a logit row per position it can hold (rows are written, so
        touched, only as passes end: the trace's logits are these rows, not a copy)."""
        self.cache = cache
        self.logits = np.empty((cache.max_len, vocab), dtype=cache.k.dtype)

    def recorder(self) -> Recorder:
        return Recorder(keep=("attentions",), beside=True)

    def add(self, ids: np.ndarray, rec: Recorder, hidden: np.ndarray, logits: np.ndarray) -> None:
        """One pass over ids (n,): what REC kept, hidden (1, n, d_model), logits (1, 1, V). A pass that read the
        cache's past again, hidden (1, past + n, d_model) (its RoPE table changed with the length: LongRoPE past
        its original length), replaces what the passes before it kept: their rows were turned by the old table."""
        if hidden.shape[1] > len(ids):                   # every token so far, read again in this pass
            ids = self.ids + [int(i) for i in ids]
            self.ids, self.attentions, self.hidden, self.ends = [], [], [], []
        self.ids += [int(i) for i in ids]
        self.attentions.append(np.stack([rec.store[i]["attentions"][0] for i in sorted(rec.store)]))
        self.hidden.append(hidden[0])
        self.logits[len(self.ids) - 1] = logits[0, -1]
        self.ends.append(len(self.ids) - 1)

    def trace(self, model: Writer, ids: np.ndarray, prompt_length: int) -> Trace:
        """The Trace of ids (N,), prompt + what was written, equal to `generation_trace`'s (within float
        rounding): the tokens no pass has read are fed first (one pass), rows past N are dropped."""
        N = len(ids)
        if self.ids[:N] != [int(i) for i in ids[:len(self.ids)]]:
            raise QkvError("this recording is of another text; record the generation whose trace you ask for")
        if len(self.ids) < N:
            new = np.asarray(ids[len(self.ids):], dtype=np.int64)[None]               # (1, N - fed)
            rec = self.recorder()
            hidden, logits = model.step(new, np.ones((1, N), np.int64), rec=rec, cache=self.cache)
            self.add(new[0], rec, hidden, logits)
        cfg, L = model.config, model.config.n_layers
        hidden = np.concatenate(self.hidden)[:N]                                      # (N, d_model)
        att = np.zeros((L, cfg.n_heads, N, N), dtype=hidden.dtype)                  # (L, H, N, N)
        row = 0
        for a, h in zip(self.attentions, self.hidden):                               # pass by pass: rows
            n, r = len(h), min(len(h), N - row)                                       # row..row+n-1, keys
            if r <= 0:                                                                # 0..row+n-1
                break
            att[:, :, row:row + r, :row + r] = a[:, :, :r, :row + r]                  # later keys: 0 (causal)
            row += n
        logits = self.logits[:N]                                                      # (N, V)
        missing = sorted(set(range(N)) - set(self.ends))                              # rows a pass did not end at
        if missing:                                                                   # (the prompt's): read out
            logits[missing] = logits_of(hidden[missing][None], model.weights, cfg)[0]   # as the model reads its last
        return Trace(tokens=spelled(model.tokenizer, ids), ids=np.asarray(ids, dtype=np.int64), hidden=hidden,
                     logits=logits, layers={i: LayerTrace(layer=i, attentions=att[i]) for i in range(L)},
                     prompt_length=prompt_length, causal=cfg.causal, **made_by(model))


def decode(model: Writer, ids: np.ndarray, attention_mask: np.ndarray, max_new_tokens: int,
           sampling: Sampling | None = None, *, stop_tokens: list[int] | None = None, use_cache: bool = True,
           keep_attentions: bool = False, record: Recording | None = None, **settings) -> Iterator[Step]:
    """Yield one Step per new token until max_new_tokens or every row has stopped.

    sampling, or its fields by name in settings (temperature=0, seed=3, …): qkv.writing.sampling.Sampling.

    use_cache=False recomputes the whole sequence each step (the slow baseline the
    cache exists to avoid; same numbers). keep_attentions also returns, per step, what
    the token fed at that step attended to (the prompt's last token at step 0).
    record: a Recording that keeps what every pass computed for the generation's trace (a batch of one,
    with the cache; the numbers written are the same).
    """
    sampling = Sampling.of(sampling, **settings)
    B, n = ids.shape
    check_can_generate(model, n, max_new_tokens)
    cfg = model.config
    rng = sampling.rng()
    stops = stop_ids(model, sampling.stop_at_eos, stop_tokens or [])
    pad = fill_id(cfg, stops)
    cache = KVCache(cfg, B, n + max_new_tokens, dtype=model.dtype) if use_cache else None
    if record is not None:
        if B != 1 or cache is None:
            raise QkvError("a recording follows one sequence through its KV cache; give a batch of one, use_cache=True")
        record.start(cache, model.weights.W_vocab.shape[1])
    seq = ids
    masks = np.ones((B, n + max_new_tokens), dtype=attention_mask.dtype)    # (B, n + new): made once,
    masks[:, :n] = attention_mask                                           # step t reads its first n + t
    new = ids                                            # what the next forward pass reads
    done = np.zeros(B, dtype=bool)
    threads = step_threads()                             # BLAS threads of one-token steps, by timing them
    prefill = choices().prefill                          # BLAS threads of the prompt's pass (qkv.runtime.tuning)
    # One-token steps keep their BLAS thread count from step to step (threads.StepThreads: set
    # again only when the choice changes); what BLAS had comes back when the generation ends.
    with threads:
        for t in range(max_new_tokens):
            rec = record.recorder() if record is not None else Recorder(keep=("attentions",) if keep_attentions else ())
            mask = masks[:, :n + t]                                               # (B, n + t) a view
            if use_cache:
                def step(new=new, mask=mask, rec=rec):
                    if record is None:
                        return model.last_logits(new, mask, rec=rec, cache=cache)
                    hidden, logits = model.step(new, mask, rec=rec, cache=cache)
                    record.add(new[0], rec, hidden, logits)                       # a whole pass, or nothing
                    return logits
                # A one-token step is matrix × vector products, bound by memory: 1 or 2 BLAS threads,
                # whichever streams faster on this machine now (threads.StepThreads). The prompt: the
                # count measured fastest for many rows (qkv.runtime.tuning).
                if new.shape[1] == 1:
                    logits = threads.run(step)
                else:
                    with blas_at_most(prefill):
                        logits = step()
            else:
                with blas_at_most(prefill):
                    logits = model.last_logits(seq, mask, rec=rec)
            next_ids = sampling.pick(logits[:, -1], rng)                          # (B,)
            next_ids = np.where(done, pad, next_ids)
            atts = None
            if keep_attentions:
                atts = np.stack([rec.store[i]["attentions"][:, :, -1] for i in range(cfg.n_layers)])  # (L, B, H, m)
            done = done | np.isin(next_ids, stops)
            yield Step(ids=next_ids, done=done.copy(), attentions=atts)
            if done.all():
                return
            new = next_ids[:, None]
            if not use_cache:
                seq = np.concatenate([seq, new], axis=1)


def split_stop(stop) -> tuple[list[int], list[str]]:
    """stop: a token id, a string, or a list of both → (stop ids, stop strings)."""
    if stop is None:
        return [], []
    items = list(stop) if isinstance(stop, (list, tuple)) else [stop]
    ids = [int(s) for s in items if isinstance(s, (int, np.integer))]
    strs = [s for s in items if isinstance(s, str)]
    if len(ids) + len(strs) != len(items) or any(s == "" for s in strs):
        raise QkvError(f"stop must be token ids or non-empty strings, got {stop!r}")
    for s in strs:                                          # as the prompt: a stop the text could never hold
        check_text(s, "a stop string")
    return ids, strs


def _held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters might begin a stop string (not safe to show yet)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return hold


def _one_row(model: Writer, ids) -> np.ndarray:
    """A prompt already in token ids (e.g. a rendered chat template): (n,) or (1, n) → (n,)."""
    ids, _ = model.check_ids(ids)
    if len(ids) != 1:
        raise QkvError(f"a text stream follows one sequence; give ids of shape (n,), got {len(ids)} rows")
    return ids[0]


def text_pieces(tokenizer, steps: Iterable, ends: set[int], stop_strings: list[str], new_ids: list[int]
                ) -> Iterator[str]:
    """The text of one row's generated tokens, piece by piece as it becomes safe to show.

    steps: the Steps of a decoding loop (one row); the loop ends at a token of `ends` (not shown)
    or where a stop string appears (the text stops before it). Each token is appended to new_ids.
    A piece is held back while it could still turn into a stop string, or ends in half a UTF-8
    character; what is left is shown when the loop ends.
    """
    shown = ""
    for step in steps:
        token = int(step.ids[0])
        if token in ends:
            break
        new_ids.append(token)
        text = tokenizer.decode(new_ids, skip_special_tokens=True)
        cut = min((text.find(s) for s in stop_strings if s in text), default=-1)
        if cut >= 0:
            if cut > len(shown):
                yield text[len(shown):cut]
            return
        safe = len(text) - _held_back(text, stop_strings)
        if text.endswith("\ufffd"):                      # an unfinished UTF-8 character
            safe = min(safe, len(text) - 1)
        if safe > len(shown):
            yield text[len(shown):safe]
            shown = text[:safe]
    text = tokenizer.decode(new_ids, skip_special_tokens=True)
    if len(text) > len(shown):
        yield text[len(shown):]


class TextStream:
    """The continuation of a prompt (text, or token ids), as text, piece by piece, as soon as
    each piece is final.

    Iterate it for the pieces; afterwards `prompt_ids` and `new_ids` hold the tokens.
    A piece is held back while it could still be the start of a stop string, or while
    it ends inside a multi-byte character. Stop tokens (EOS) end the text unshown.
    record=True keeps what the passes compute (a Recording), so that `trace()` costs about one
    step instead of a pass over the whole text. seq2seq_generate.TargetStream is this with an
    encoder–decoder's `decode` and its own start (and its own trace).
    """

    decoding = staticmethod(decode)                  # the loop the pieces come from

    def __init__(self, model: Writer, prompt: str | np.ndarray, max_new_tokens: int,
                 sampling: Sampling | None = None, *, stop=None, use_cache: bool = True, record: bool = False,
                 **settings):
        """sampling, or its fields by name in settings (temperature=0, …): see qkv.writing.sampling.Sampling."""
        self.model, self.max_new_tokens = model, max_new_tokens
        self.sampling, self.use_cache = Sampling.of(sampling, **settings), use_cache
        self.prompt_ids = model.encode(prompt)[0] if isinstance(prompt, str) else _one_row(model, prompt)
        self.stop_tokens, self.stop_strings = split_stop(stop)
        check_can_generate(model, len(self.prompt_ids), max_new_tokens)   # fail now, not mid-stream
        self.new_ids: list[int] = []
        self.recording = Recording() if record and use_cache else None

    def __iter__(self) -> Iterator[str]:
        model, ids = self.model, self.prompt_ids
        ends = set(stop_ids(model, self.sampling.stop_at_eos, self.stop_tokens).tolist())
        more = {} if self.recording is None else {"record": self.recording}
        steps = self.decoding(model, ids[None], np.ones((1, len(ids)), np.int64), self.max_new_tokens,
                              self.sampling, stop_tokens=self.stop_tokens, use_cache=self.use_cache, **more)
        yield from text_pieces(model.tokenizer, steps, ends, self.stop_strings, self.new_ids)

    def trace(self, keep: tuple[str, ...] = ("attentions",)):
        """A Trace of prompt + continuation (after iterating): what every generated token
        attended to (and the other intermediates of `keep`), and the logits it was chosen from;
        `prompt_length` marks where the generated part begins. A recorded stream gives its
        attentions from the Recording; other intermediates take a pass over the text."""
        ids = np.concatenate([self.prompt_ids, np.asarray(self.new_ids, dtype=np.int64)])
        if self.recording is not None and self.recording.ids and set(keep) <= {"attentions"}:
            return self.recording.trace(self.model, ids, len(self.prompt_ids))
        return generation_trace(self.model, self.prompt_ids, ids[len(self.prompt_ids):], keep)


def generation_trace(model: Writer, prompt_ids: np.ndarray, new_ids: np.ndarray,
                     keep: tuple[str, ...] = ("attentions",)):
    """A Trace of prompt (n,) + generated (new,) ids: their attention (and the rest of `keep`),
    recomputed in one pass (equal to what each token attended to while generating); `prompt_length` = n."""
    result = model.run(np.concatenate([prompt_ids, new_ids]), keep=keep)    # (n + new,)
    result.prompt_length = len(prompt_ids)
    return result


def stream_ids(model: Writer, input_ids, max_new_tokens: int, sampling: Sampling | None = None, *,
               attention_mask=None, stop=None, use_cache: bool = True, **settings) -> Iterator[np.ndarray]:
    """Yield the new token of every row, (B,), step by step."""
    sampling = Sampling.of(sampling, **settings)
    ids, mask = model.check_ids(input_ids, attention_mask)
    stop_tokens, stop_strings = split_stop(stop)
    if stop_strings:
        raise QkvError("stop strings need a text prompt; with token ids give stop token ids")
    for step in decode(model, ids, mask, max_new_tokens, sampling, stop_tokens=stop_tokens, use_cache=use_cache):
        yield step.ids


def generate(model: Writer, prompt, max_new_tokens: int, sampling: Sampling | None = None, *, attention_mask=None,
             stop=None, use_cache: bool = True, trace: bool = False, **settings):
    """Text in → the continuation as text; ids (B, n) in → ids (B, n + new), like transformers.

    trace=True returns instead a Trace of the whole sequence (prompt + generated), whose
    attentions show what every generated token attended to; `trace.prompt_length` marks
    where the generated part begins. sampling, or its fields by name: see decode.
    """
    sampling = Sampling.of(sampling, **settings)
    if isinstance(prompt, str):
        stream = TextStream(model, prompt, max_new_tokens, sampling, stop=stop, use_cache=use_cache, record=trace)
        text = "".join(stream)
        if not trace:
            return text
        result = stream.trace()
        result.text = prompt + text
        return result
    ids, mask = model.check_ids(prompt, attention_mask)
    steps = list(stream_ids(model, ids, max_new_tokens, sampling, attention_mask=mask, stop=stop,
                            use_cache=use_cache))
    out = np.concatenate([ids, np.stack(steps, axis=1)], axis=1) if steps else ids
    if not trace:
        return out
    if len(out) != 1:
        raise QkvError("trace=True follows one sequence; give a batch of one")
    return generation_trace(model, ids[0], out[0, ids.shape[1]:])


def stream(model: Writer, prompt, max_new_tokens: int, sampling: Sampling | None = None, *, stop=None,
           attention_mask=None, use_cache: bool = True, text_stream=TextStream, id_stream=stream_ids):
    """Model.stream and Seq2SeqModel.stream: text pieces for a text prompt (TEXT_STREAM), (B,) ids for ids
    (ID_STREAM); an encoder–decoder passes its own two (seq2seq_generate.TargetStream, stream_ids)."""
    if isinstance(prompt, str):
        return iter(text_stream(model, prompt, max_new_tokens, sampling, stop=stop, use_cache=use_cache))
    return id_stream(model, prompt, max_new_tokens, sampling, attention_mask=attention_mask, stop=stop,
                     use_cache=use_cache)

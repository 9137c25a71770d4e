"""Whisper's rules of writing, read from its generation_config.json: the prompt and what each step may write.

    WhisperRules      what generation_config.json (or, without one, config.json) says: start, end and pad tokens,
                      max_length, lang_to_id, task_to_id, no_timestamps_token_id, suppress_tokens,
                      begin_suppress_tokens, forced_decoder_ids, max_initial_timestamp_index, alignment_heads
    prompt_of, finish_prompt      <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>], as transformers'
                      _retrieve_init_tokens makes it
    apply_rules       the logits of one step under transformers' processors, in their order:
                      SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor,
                      WhisperTimeStampLogitsProcessor (`timestamp_rules`)

qkv.writing.transcribe decodes with them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io_json import Fields, read_json

TASKS = ("transcribe", "translate")
GREEDY_ONLY = {                  # generation_config.json keys transformers reads that would change the ids: (default)
    "num_beams": 1, "do_sample": False, "condition_on_prev_tokens": False, "logprob_threshold": None,
    "compression_ratio_threshold": None, "no_speech_threshold": None, "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": None, "bad_words_ids": None,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "exponential_decay_length_penalty": None,
    "sequence_bias": None, "renormalize_logits": False}


@dataclass(frozen=True)
class WhisperRules:
    """What a Whisper checkpoint's generation_config.json (or, without one, its config.json) says about writing."""

    decoder_start: int
    eos: int | None
    pad: int | None
    bos: int | None = None
    max_length: int = 20                                   # GenerationConfig's default
    max_new_tokens: int | None = None
    lang_to_id: dict[str, int] = field(default_factory=dict)          # "<|ko|>" → id
    task_to_id: dict[str, int] = field(default_factory=dict)          # "transcribe" → id
    no_timestamps: int | None = None                       # <|notimestamps|>; timestamps are the ids after it
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    forced: tuple[tuple[int, int | None], ...] = ()        # forced_decoder_ids: (position, id)
    max_initial_timestamp: int | None = None
    multilingual: bool | None = None
    timestamps: bool = False                               # return_timestamps
    alignment_heads: tuple[tuple[int, int], ...] = ()      # (decoder layer, head): for word timestamps
    language: str | None = None                            # the config's own language and task: the defaults
    task: str | None = None
    refused: tuple[str, ...] = ()                          # keys asking for more than greedy decoding

    @property
    def timestamp_begin(self) -> int | None:
        return None if self.no_timestamps is None else self.no_timestamps + 1


def _ids(f: Fields, key: str, vocab: int) -> tuple[int, ...]:
    """Token ids ≥ 0; those past the vocabulary are dropped (transformers' processors match no logit with them,
    as in a config.json of a smaller test model that kept openai's lists)."""
    values = f.array(key, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise QkvError(f"{f.source}: {key} must be token ids (whole numbers ≥ 0); {f.fix}")
    return tuple(v for v in values if v < vocab)


def _id_map(f: Fields, key: str, vocab: int) -> dict[str, int]:
    sub = f.object(key, {})
    out = {k: sub.integer(k, 0, vocab - 1) for k in sub.data}
    return out


def read_rules(directory: str | Path, config, hf: dict | None = None) -> WhisperRules:
    """DIRECTORY's generation_config.json as WhisperRules; without one, the keys of its config.json (HF) that
    transformers' GenerationConfig.from_model_config takes (no languages, tasks or timestamps then)."""
    path = Path(directory) / "generation_config.json"
    fix = "give the checkpoint's own generation_config.json"
    data = read_json(path, what="generation_config.json", fix=fix) if path.is_file() else dict(hf or {})
    f = Fields(data, "generation_config.json" if path.is_file() else "config.json", fix)
    V = config.vocab_size
    eos = f.data.get("eos_token_id", config.eos_token_id)
    eos = eos[0] if isinstance(eos, list) and len(eos) == 1 else eos
    if eos is not None and not (isinstance(eos, int) and 0 <= eos < V):
        raise QkvError(f"{f.source}: eos_token_id must be one token id from 0 to {V - 1}; {fix}")
    forced = []
    for i, pair in enumerate(f.array("forced_decoder_ids", [], max_len=8)):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)
                and (pair[1] is None or isinstance(pair[1], int) and 0 <= pair[1] < V)):
            raise QkvError(f"{f.source}: forced_decoder_ids[{i}] must be [position, token id or null]; {fix}")
        forced.append((pair[0], pair[1]))
    heads = f.array("alignment_heads", [], max_len=4096)
    if not all(isinstance(h, list) and len(h) == 2 and all(isinstance(x, int) for x in h) for h in heads):
        raise QkvError(f"{f.source}: alignment_heads must be [decoder layer, head] pairs; {fix}")
    refused = tuple(f"{k}={json.dumps(f.data[k])}" for k, default in GREEDY_ONLY.items()
                    if f.data.get(k) is not None and f.data[k] != default)
    start = f.integer("decoder_start_token_id", 0, V - 1, config.decoder_start_token_id)
    if start is None:
        raise QkvError(f"{f.source} has no decoder_start_token_id (<|startoftranscript|>); {fix}")
    return WhisperRules(
        decoder_start=start, eos=eos, pad=f.integer("pad_token_id", 0, V - 1, config.pad_token_id),
        bos=f.integer("bos_token_id", 0, V - 1, config.bos_token_id),
        max_length=f.integer("max_length", 1, 1 << 20, 20), max_new_tokens=f.integer("max_new_tokens", 1, 1 << 20, None),
        lang_to_id=_id_map(f, "lang_to_id", V), task_to_id=_id_map(f, "task_to_id", V),
        no_timestamps=f.integer("no_timestamps_token_id", 0, V - 1, None),
        suppress=_ids(f, "suppress_tokens", V), begin_suppress=_ids(f, "begin_suppress_tokens", V),
        forced=tuple(forced), max_initial_timestamp=f.integer("max_initial_timestamp_index", 0, V, None),
        multilingual=f.boolean("is_multilingual", None), timestamps=f.boolean("return_timestamps", False),
        alignment_heads=tuple((a, b) for a, b in heads), refused=refused,
        language=f.text("language", None, max_len=64), task=f.text("task", None, choices=TASKS))


# ── the prompt ───────────────────────────────────────────────────────────────────

def language_id(rules: WhisperRules, language: str) -> int:
    """"ko", "KO" or "<|ko|>" → its token id in lang_to_id; anything else one QkvError listing what there is."""
    key = language.lower()
    key = key if key.startswith("<|") else f"<|{key}|>"
    if key not in rules.lang_to_id:
        known = ", ".join(k.strip("<|>") for k in rules.lang_to_id) or "none"
        raise QkvError(f"language {language!r} is not one this checkpoint writes; give a language code "
                       f"({known})")
    return rules.lang_to_id[key]


def prompt_of(rules: WhisperRules, language: int | None, task: str | None) -> list[int | None]:
    """The start of the start-of-transcript prompt, as transformers' _retrieve_init_tokens makes it: the start
    token, then, when neither LANGUAGE (a given language's id) nor TASK is given, forced_decoder_ids' tokens (None
    in the language's place: detect it). `finish_prompt` adds the rest."""
    tokens: list[int | None] = [rules.decoder_start]
    forced = list(rules.forced)
    if task is None and language is None and forced and forced[0][0] == 1:    # given ones override them
        while forced and forced[0][0] == len(tokens):
            tokens.append(forced.pop(0)[1])
        if forced:
            raise QkvError("forced_decoder_ids do not follow Whisper's prompt (positions 1, 2, … in order); fix the "
                           "checkpoint's generation_config.json")
    return tokens


def finish_prompt(rules: WhisperRules, tokens: list, language: int | None, given_language: bool, task: str | None,
                  timestamps: bool) -> list[int]:
    """The prompt once the language is known: TOKENS (prompt_of's) with LANGUAGE (its id, given or detected) in
    place 1; the task (TASK's id replacing any task token, or "transcribe" when a language was given and no task
    token is there); <|notimestamps|> last unless TIMESTAMPS."""
    if language is not None:
        if len(tokens) > 1:
            tokens[1] = language
        else:
            tokens.append(language)
    if task is not None:
        task_id = rules.task_to_id[task]
        if any(t in rules.task_to_id.values() for t in tokens):
            tokens = [task_id if t in rules.task_to_id.values() else t for t in tokens]
        else:
            tokens.append(task_id)
    elif given_language and rules.task_to_id and not any(t in rules.task_to_id.values() for t in tokens):
        tokens.append(rules.task_to_id["transcribe"])
    if not timestamps and rules.no_timestamps is not None and tokens[-1] != rules.no_timestamps:
        tokens.append(rules.no_timestamps)
    elif timestamps and tokens[-1] == rules.no_timestamps:
        tokens = tokens[:-1]
    return [t for t in tokens if t is not None]


# ── the rules of each step ───────────────────────────────────────────────────────

def apply_rules(logits: np.ndarray, ids: list[int], begin: int, rules: WhisperRules, timestamps: bool) -> np.ndarray:
    """The logits (V,) of the next token after IDS (prompt + written; the prompt is IDS[:BEGIN]) under Whisper's
    rules, in transformers' order: begin_suppress_tokens (first written position only), suppress_tokens, then the
    timestamp rules (WhisperTimeStampLogitsProcessor) when TIMESTAMPS. Returns a new float64 array."""
    s = np.asarray(logits, dtype=np.float64).copy()                                      # (V,)
    if len(ids) == begin and rules.begin_suppress:
        s[list(rules.begin_suppress)] = -np.inf
    if rules.suppress:
        s[list(rules.suppress)] = -np.inf
    if timestamps:
        s = timestamp_rules(s, ids[begin:], len(ids) == begin, rules)
    return s


def timestamp_rules(s: np.ndarray, written: list[int], first: bool, rules: WhisperRules) -> np.ndarray:
    """WhisperTimeStampLogitsProcessor on the scores S (V,) after WRITTEN (the tokens after the prompt)."""
    begin = rules.timestamp_begin
    eos = rules.eos or rules.bos                              # transformers' `eos_token_id or bos_token_id`
    s[rules.no_timestamps] = -np.inf                          # <|notimestamps|> belongs to the prompt only
    last = len(written) >= 1 and written[-1] >= begin
    penultimate = len(written) < 2 or written[-2] >= begin
    if last:
        if penultimate:
            s[begin:] = -np.inf                               # after a pair: text (or the end)
        else:
            s[:eos] = -np.inf                                 # after a lone timestamp: another timestamp or the end
    stamps = [t for t in written if t >= begin]
    lowest = begin
    if stamps:
        lowest = stamps[-1] if last and not penultimate else stamps[-1] + 1   # never go back in time
    s[begin:lowest] = -np.inf
    if first:
        s[:begin] = -np.inf                                   # the first token is a timestamp …
        if rules.max_initial_timestamp is not None:
            s[begin + rules.max_initial_timestamp + 1:] = -np.inf     # … near the start of the window
    with np.errstate(divide="ignore", invalid="ignore"):
        top = np.max(s)
        logp = s - top - np.log(np.sum(np.exp(s - top)))      # log-softmax (V,)
        stamp_logp = np.logaddexp.reduce(logp[begin:])
        text_logp = np.max(logp[:begin])
    if stamp_logp > text_logp:
        s[:begin] = -np.inf                                   # the timestamps together are likelier: write one
    return s

"""Where each word was heard (guide: audio, attention beyond text): token and word timestamps from the
cross-attention of Whisper's alignment heads by dynamic time warping, as transformers' generate(return_token_timestamps=True) computes them
(WhisperGenerationMixin._extract_token_timestamps, transformers 5.25).

    one window of a Transcription: prompt (n_p tokens) + written w_0 … w_{m-1}
    A      the alignment heads' cross-attention (heads, m−1, S): the rows that READ w_0 … w_{m−2} (generate keeps
           no row for the last token written, and drops the prompt's rows); from a sound file, only the frames
           before its end (transformers given the attention_mask: the pipeline's return_timestamps="word")
           heads: generation_config's `alignment_heads`, else every head of the upper half of the decoder layers
           (openai's default; transformers itself then refuses)
    Â      (A − mean over tokens) / std over tokens, per head and frame            (heads, m−1, S)
           → median filter of width 7 (config.json's median_filter_width) along time, reflected at the ends
           → the mean of the heads                                                  (m−1, S)
    DTW    the monotone path from (0, 0) to (m−2, S−1) of least total −Â (`dtw`: transformers' own loop, its
           float32 costs and its tie-breaking: diagonal, then up, else left)
    times  w_k (k < m−1): the first frame of the path on row k, × 0.02 s; w_{m−1} repeats w_{m−2}'s; the prompt 0.
           Seconds from the window's start (what generate returns, window by window); `absolute` adds its offset.
    words  each segment's text tokens grouped as transformers' pipeline (return_timestamps="word") groups them
           (tokenization_whisper._combine_tokens_into_words): a token starting with a space, a punctuation token,
           or the first, opens a word (zh, ja, th, lo, my, yue: every whole unicode character does); leading
           punctuation joins the next word, trailing the previous. A token spans from the time of the token before
           it (0 for the first) to its own; a word from its first token's start to its last token's end (the
           pipeline's rounding to 0.01 s).

The model comes in through the Transcription (qkv.writing.transcribe, which this module does not import:
Transcription.words and .alignments call it); nor does it import qkv.models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..runtime.errors import QkvError

TIME_PRECISION = 0.02            # seconds per encoder position, as in qkv.writing.transcribe
FRAME_SECONDS = 0.01             # seconds per log-mel frame
INPUT_STRIDE = 2                 # log-mel frames per encoder position

MEDIAN_WIDTH = 7                  # WhisperConfig's median_filter_width default
PREPEND = "\"'“¡¿([{-"            # punctuation that joins the word after it
APPEND = "\"'.。,，!！?？:：”)]}、"   # … and the word before it
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
UNSPACED = {"zh", "ja", "th", "lo", "my", "yue"}      # languages whose words are split at each character


class Word(NamedTuple):
    """One word heard: its text (with its leading space, as transformers keeps it), its span in seconds from the
    start of the sound, and its token ids."""

    word: str
    start: float
    end: float
    tokens: list[int]


@dataclass
class Alignment:
    """One window's alignment of written tokens and frames."""

    window: int
    heads: tuple[tuple[int, int], ...]        # (decoder layer, head) read
    attention: np.ndarray                     # (heads, m−1, S) their cross-attention, the rows reading w_0 … w_{m−2}
    matrix: np.ndarray                        # (m−1, S) normalised, median-filtered, mean of the heads
    path: tuple[np.ndarray, np.ndarray]       # DTW's (token rows, frames), from (0, 0) to (m−2, S−1)
    times: np.ndarray                         # (n_p + m,) seconds from the window's start: prompt, then w_0 … w_{m−1}


# ── the maths ───────────────────────────────────────────────────────────────────

def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """The median of each WIDTH values along the last axis, the ends reflected (transformers' _median_filter);
    X unchanged when its last axis is at most width // 2 long. WIDTH odd."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")       # (…, S + 2·half)
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)         # (…, S, width)
    return np.sort(windows, axis=-1)[..., half]                                        # (…, S)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotone path of least total COST (n, S) from (0, 0) to (n−1, S−1), steps right, down or diagonal →
    (rows, columns) along it. transformers' _dynamic_time_warping exactly: accumulated costs in float32, and at
    each cell the diagonal when strictly least, else up when strictly least, else left. Its plain form:

        for j in 1..S: for i in 1..n:  D[i, j] = cost[i−1, j−1] + min(D[i−1, j−1], D[i−1, j], D[i, j−1])

    computed here one anti-diagonal (i + j constant) at a time: each cell reads only the two before."""
    n, S = cost.shape
    D = np.full((n + 1, S + 1), np.inf, dtype=np.float32)                              # (n+1, S+1)
    step = np.full((n + 1, S + 1), -1, dtype=np.int8)                                  # 0 diagonal, 1 up, 2 left
    D[0, 0] = 0
    for d in range(2, n + S + 1):
        i = np.arange(max(1, d - S), min(n, d - 1) + 1)                                # rows on this diagonal
        j = d - i
        c0, c1, c2 = D[i - 1, j - 1], D[i - 1, j], D[i, j - 1]                         # (k,) each
        diagonal = (c0 < c1) & (c0 < c2)
        up = ~diagonal & (c1 < c0) & (c1 < c2)
        t = np.where(diagonal, 0, np.where(up, 1, 2)).astype(np.int8)                  # (k,)
        D[i, j] = cost[i - 1, j - 1] + np.choose(t, [c0, c1, c2]).astype(np.float64)
        step[i, j] = t
    step[0, :], step[:, 0] = 2, 1
    rows, cols = [], []
    i, j = n, S
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        t = step[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    return np.array(rows[::-1]), np.array(cols[::-1])


def alignment_matrix(attention: np.ndarray, width: int = MEDIAN_WIDTH) -> np.ndarray:
    """The alignment heads' cross-attention (heads, rows, S) → (rows, S): each head standardised over the tokens
    (population std), median-filtered along time, then the mean of the heads. One row gives NaN (std 0), as there."""
    a = np.asarray(attention, dtype=np.float32)                                        # (heads, rows, S)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (a - a.mean(axis=1, keepdims=True)) / a.std(axis=1, keepdims=True)         # (heads, rows, S)
    return median_filter(z, width).mean(axis=0)                                        # (rows, S)


def jump_times(path: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Each row's first frame on a DTW PATH (rows, frames), in seconds (rows,)."""
    rows, frames = path
    jumps = np.diff(rows, prepend=-1).astype(bool)                                     # the path enters a new row
    return (frames[jumps] * TIME_PRECISION).astype(np.float32)                         # (rows,)


# ── one transcription ───────────────────────────────────────────────────────────

def alignment_heads(model, heads=None) -> tuple[tuple[int, int], ...]:
    """The (decoder layer, head) pairs word timestamps read: HEADS when given, else the generation config's
    alignment_heads, else every head of the upper half of the decoder layers (openai's whisper default). One
    QkvError for a pair the model does not have."""
    L, H = model.config.n_decoder_layers, model.config.n_heads
    if heads is not None:
        heads = tuple((int(l), int(h)) for l, h in heads)
    else:
        heads = tuple(model.rules.alignment_heads) or tuple((l, h) for l in range(L // 2, L) for h in range(H))
    if not heads:
        raise QkvError("no alignment heads to read; give at least one (decoder layer, head) pair")
    bad = [p for p in heads if not (0 <= p[0] < L and 0 <= p[1] < H)]
    if bad:
        raise QkvError(f"alignment_heads names layer {bad[0][0]}, head {bad[0][1]}, but {model.name} has {L} decoder "
                       f"layers of {H} heads; fix alignment_heads in its generation_config.json")
    return heads


def align(result, window: int = 0, heads=None, width: int | None = None, frames: int | None = None) -> Alignment:
    """Window WINDOW of RESULT (a Transcription) aligned: its alignment heads' cross-attention, the DTW path and each
    token's time (see the module docstring). heads: (layer, head) pairs (default `alignment_heads`); width: the
    median filter's (default the checkpoint's median_filter_width); frames: the sound's own log-mel frames (default
    RESULT.frames: known when a sound file was read): the window's attention is cut at (frames − seek) // 2
    positions (`cut_positions`), as transformers cuts it given the attention_mask (num_frames); None: the whole
    window, as generate without one."""
    model = result.model
    heads = alignment_heads(model, heads)
    width = getattr(model, "median_filter_width", MEDIAN_WIDTH) if width is None else width
    if int(width) != width or width < 1 or width % 2 != 1:
        raise QkvError(f"the median filter's width must be an odd whole number, got {width}; give 7 (Whisper's)")
    w = result.windows[window]
    n_p, m = len(w.prompt), len(w.written)
    cross = result.trace(window).cross.attentions                                      # (L_dec, H, n_tgt, S)
    frames = getattr(result, "frames", None) if frames is None else frames
    S = cross.shape[-1]
    if frames is not None:
        S = cut_positions(S, int(frames) - w.seek)
    attention = np.stack([cross[l, h, n_p:n_p + m - 1, :S] for l, h in heads])         # (heads, m−1, S)
    times = np.zeros(n_p + m, dtype=np.float32)                                        # (n_p + m,)
    if m <= 1:
        empty = np.zeros((0, attention.shape[-1]), np.float32)
        return Alignment(window, heads, attention, empty, (np.zeros(0, int), np.zeros(0, int)), times)
    matrix = alignment_matrix(attention, int(width))                                   # (m−1, S)
    path = dtw(-matrix.astype(np.float64))
    jumps = jump_times(path)                                                           # (m−1,)
    times[n_p:n_p + m - 1] = jumps
    times[-1] = jumps[-1]
    return Alignment(window, heads, attention, matrix, path, times)


def cut_positions(S: int, frames: int) -> int:
    """How many of a window's S positions the DTW reads when FRAMES log-mel frames of sound are left from its start:
    transformers' weights[..., :frames // 2], a Python slice applied twice (once to the batch, once to each row of
    it), so a window past the sound's end (FRAMES < 0) loses 2·|frames // 2| positions from the right. At least 1."""
    cut = frames // INPUT_STRIDE
    for _ in range(2):
        S = len(range(S)[:cut]) if cut < 0 else min(S, cut)
    return max(S, 1)


def _begin(result) -> int:
    rules = result.model.rules
    return rules.timestamp_begin if rules.timestamp_begin is not None else result.model.config.vocab_size + 1


def _kept(result, window: int) -> int:
    """How many of window WINDOW's written tokens its segments kept (a prefix), as transcribe cut them."""
    return result.windows[window].kept


def token_timestamps(result, *, absolute: bool = False,
                     alignments: list[Alignment] | None = None) -> np.ndarray:
    """The time of each token of RESULT.ids (n,), in seconds: from its window's start, as transformers'
    generate(return_token_timestamps=True)["token_timestamps"] gives them (window by window past 30 s), or, with
    ABSOLUTE, from the start of the sound (its segments' "token_timestamps")."""
    alignments = alignments or [align(result, w) for w in range(len(result.windows))]
    parts = []
    for a, w in zip(alignments, result.windows):
        n_p = len(w.prompt)
        t = a.times[n_p:n_p + _kept(result, a.window)].astype(np.float64)              # (kept,)
        parts.append(t + w.seek * FRAME_SECONDS if absolute else t)
    return np.concatenate(parts) if parts else np.zeros(0)


def split_words(tokenizer, tokens: list[int], language: str | None = None,
                ) -> tuple[list[str], list[list[int]]]:
    """TOKENS (text tokens) grouped into words as transformers' _combine_tokens_into_words groups them → (words,
    each word's token indices). LANGUAGE: a code ("ja") or token ("<|ja|>"); zh, ja, th, lo, my and yue split at
    every whole character, the others at spaces and punctuation."""
    words, indices = _split_on_unicode(tokenizer, tokens)
    code = (language or "").strip("<|>").lower()
    if code not in UNSPACED:
        words, indices = _join_unspaced(words, indices)
    return _merge_punctuation(words, indices)


def _split_on_unicode(tokenizer, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
    """Runs of tokens that decode to whole characters (no U+FFFD from a character cut between tokens)."""
    full = tokenizer.decode(tokens)
    words, indices, current, offset = [], [], [], 0
    for k in range(len(tokens)):
        current.append(k)
        text = tokenizer.decode([tokens[i] for i in current])
        bad = text.find("\ufffd")
        if bad < 0 or offset + bad >= len(full) or full[offset + bad] == "\ufffd":
            words.append(text)
            indices.append(current)
            current, offset = [], offset + len(text)
    return words, indices


def _join_unspaced(pieces: list[str], indices: list[list[int]]) -> tuple[list[str], list[list[int]]]:
    """A piece starting with a space, a punctuation mark, or the first, opens a word; the others join the last."""
    words, out = [], []
    for piece, idx in zip(pieces, indices):
        if piece.startswith(" ") or piece.strip() in PUNCTUATION or not words:
            words.append(piece)
            out.append(list(idx))
        else:
            words[-1] += piece
            out[-1] += idx
    return words, out


def _merge_punctuation(words: list[str], indices: list[list[int]]) -> tuple[list[str], list[list[int]]]:
    """Leading punctuation (PREPEND, after a space) joins the word after it; trailing (APPEND) the word before."""
    words, indices = list(words), [list(i) for i in indices]
    j = len(words) - 1
    for i in range(len(words) - 2, -1, -1):
        if words[i].startswith(" ") and words[i].strip() in PREPEND:
            words[j], indices[j] = words[i] + words[j], indices[i] + indices[j]
            words[i], indices[i] = "", []
        else:
            j = i
    i = 0
    for j in range(1, len(words)):
        if not words[i].endswith(" ") and words[j] in APPEND:
            words[i], indices[i] = words[i] + words[j], indices[i] + indices[j]
            words[j], indices[j] = "", []
        else:
            i = j
    keep = [k for k, w in enumerate(words) if w]
    return [words[k] for k in keep], [indices[k] for k in keep]


def _word_groups(result) -> list[tuple[str, list[int]]]:
    """RESULT's words, each (text, its tokens' positions in result.ids), grouped segment by segment."""
    tokenizer = result.model.tokenizer
    if tokenizer is None:
        raise QkvError(f"{result.model.name} has no tokenizer.json, so its tokens cannot be read as words; add the "
                       "checkpoint's tokenizer.json")
    rules = result.model.rules
    text_end = rules.eos if rules.eos is not None else _begin(result)                  # Whisper's specials follow
    ids = result.ids.tolist()
    out, at = [], 0
    for segment in result.segments:
        span = range(at, at + len(segment.ids))
        at += len(segment.ids)
        text = [k for k in span if ids[k] < text_end]                                   # positions in ids
        pieces, groups = split_words(tokenizer, [ids[k] for k in text], result.language)
        out += [(piece, [text[g] for g in group]) for piece, group in zip(pieces, groups)]
    return out


def words_of(result, alignments: list[Alignment] | None = None) -> list[Word]:
    """RESULT's words, each with its span in seconds from the start of the sound and its tokens (see the module
    docstring). Needs the checkpoint's tokenizer."""
    groups = _word_groups(result)
    times = token_timestamps(result, absolute=True, alignments=alignments)             # (n,)
    ids = result.ids.tolist()
    return [Word(text, round(float(times[p[0] - 1]) if p[0] > 0 else 0.0, 2), round(float(times[p[-1]]), 2),
                 [ids[k] for k in p]) for text, p in groups]


def word_attention(result, alignments: list[Alignment] | None = None) -> np.ndarray:
    """Each word's alignment-head attention over the whole sound (words, ⌈T / 2⌉ encoder positions, 20 ms each):
    the mean, over the alignment heads and the word's tokens, of the cross-attention rows the DTW read (the rows
    that READ each token; the window's last token, which has none, takes the row before), placed at its window's
    start. Rows in the order of `words_of`."""
    alignments = alignments or result.alignments
    where = []                                                                          # per id: (window, k)
    for a, w in zip(alignments, result.windows):
        where += [(a.window, k) for k in range(_kept(result, a.window))]
    T = -(-result.features.shape[1] // INPUT_STRIDE)
    groups = _word_groups(result)
    out = np.zeros((len(groups), T), dtype=np.float64)                                  # (words, T/2)
    for i, (_, positions) in enumerate(groups):
        for p in positions:
            window, k = where[p]
            a = alignments[window].attention                                           # (heads, m−1, S)
            if a.shape[1] == 0:
                continue
            row = a[:, min(k, a.shape[1] - 1)].mean(axis=0)                            # (S,)
            start = result.windows[window].seek // INPUT_STRIDE
            part = row[:max(0, min(len(row), T - start))]
            out[i, start:start + len(part)] += part / len(positions)
    return out

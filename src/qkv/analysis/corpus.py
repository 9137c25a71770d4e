"""A corpus on disk, read as a stream of texts, and texts cut into windows the model can take.

    file ─open_corpus (one pass: UTF-8? binary? how many texts? sha256)─▶ Corpus
         ─texts(start)─▶ (index, line, text), one at a time: never all in memory

Split: "line" (one text per line) or "paragraph" (texts separated by blank lines; the
lines of a paragraph are joined with newlines). Lines of only whitespace are never texts.

Bounded: the file is read PIECE (64 KiB) at a time, and no text is longer than PIECE characters. A longer
line is cut into texts of its own (after a space or tab in the second half of each piece, else between two
characters), a longer paragraph between its lines; so a 150 MB line costs the memory of a short one, where
tokenising it whole would take ~190 bytes a character (10 MB: 1.9 GB). Lines up to PIECE bytes read as before.
"""

from __future__ import annotations

import errno
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import open_regular

SPLITS = ("line", "paragraph")
PIECE = 1 << 16            # bytes read at a time, and characters a text at most (a longer line is cut)


@dataclass(frozen=True)
class Corpus:
    """A checked text file: where it is, how it splits, how many texts, and its content hash."""

    path: Path
    split: str
    count: int
    sha256: str

    def texts(self, start: int = 0) -> Iterator[tuple[int, int, str]]:
        """(index, first line number, text) for every text from index `start` on, streaming."""
        for index, (line, text) in enumerate(_split(_lines(self.path), self.split)):
            if index >= start:
                yield index, line, text


def open_corpus(path: str | Path, split: str = "line") -> Corpus:
    """Read the file once — check it is UTF-8 text, count its texts, hash it — or raise QkvError."""
    if split not in SPLITS:
        raise QkvError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    path = Path(path)
    digest = hashlib.sha256()
    count = sum(1 for _ in _split(_lines(path, digest), split))
    if count == 0:
        raise QkvError(f"{path} holds no text (it is empty or only blank lines); give one text per line")
    return Corpus(path=path, split=split, count=count, sha256=digest.hexdigest())


def _lines(path: Path, digest=None) -> Iterator[tuple[int, str, bool]]:
    """(line number from 1, piece, whether the piece ends its line) of a UTF-8 text file, read PIECE bytes at a
    time at most: a line longer than that comes in pieces (`_cut`), so a 150 MB line costs what a short one does.
    A clear QkvError for a file that cannot be read or is binary (a line that is not UTF-8 fails alone, when its
    text is encoded)."""
    try:
        f = open_regular(path)                                 # a FIFO or a device would hang or never end
    except OSError as e:
        if e.errno == errno.EISDIR:
            raise QkvError(f"{path} is a directory; give a text file with one text per line") from None
        raise QkvError(f"cannot read {path}: {e.strerror}; give a readable text file") from None
    with f:
        head = f.peek(8192)[:8192] if hasattr(f, "peek") else b""
        if b"\x00" in head:                                    # what `file` and git call binary
            raise QkvError(f"{path} looks binary (it holds NUL bytes); give a UTF-8 text file")
        number, carry, first = 1, b"", True                    # number: the line being read
        while True:
            try:
                new = f.readline(PIECE - len(carry))           # bounded: never a whole long line
            except OSError as e:
                raise QkvError(f"cannot read {path}: {e.strerror}; give a readable text file") from None
            if digest is not None:
                digest.update(new)
            if b"\x00" in new:
                raise QkvError(f"{path} looks binary (a NUL byte on line {number}); give a UTF-8 text file")
            raw, carry = carry + new, b""
            if not raw:
                return
            ends = raw.endswith(b"\n") or len(raw) < PIECE        # a short read without a newline: the file's end
            if not ends:
                raw, carry = _cut(raw)
            # A line that is not UTF-8 keeps its bad bytes as lone surrogates: encoding it fails
            # with a clear message, so the run reports that one text and skips it.
            piece = raw.decode("utf-8", errors="surrogateescape")
            if first:
                piece, first = piece.removeprefix("\ufeff"), False   # a byte-order mark is not text
            yield number, piece.rstrip("\r\n") if ends else piece, ends
            number += ends


def _cut(raw: bytes) -> tuple[bytes, bytes]:
    """A full read of PIECE bytes in the middle of a line → (this piece, the bytes carried to the next): cut after
    its last ASCII whitespace when that is in its second half, else before its last character (never inside a
    UTF-8 sequence)."""
    at = max(raw.rfind(c) for c in (b" ", b"\t", b"\r", b"\x0b", b"\x0c"))
    if at >= len(raw) // 2:
        return raw[:at + 1], raw[at + 1:]
    for k in range(len(raw) - 1, max(len(raw) - 5, 0), -1):     # the last character's first byte
        if not 0x80 <= raw[k] < 0xC0:
            return raw[:k], raw[k:]
    return raw, b""                                            # not UTF-8 there: cut anywhere


def _split(pieces: Iterator[tuple[int, str, bool]], split: str) -> Iterator[tuple[int, str]]:
    """(first line number, text): one per non-blank line, or one per blank-line-separated paragraph; a text
    longer than PIECE characters is cut into texts of at most that many (a long line where `_lines` cut it, a
    long paragraph between its lines)."""
    if split == "line":
        for number, piece, _ in pieces:
            if piece.strip():
                yield number, piece.strip()
        return
    start, para, size, fresh = 0, [], 0, True                  # fresh: the piece begins a line
    for number, piece, ends in pieces:
        text = piece.strip()
        if not text:
            if fresh and ends and para:                        # a blank line: the paragraph ends
                yield start, "".join(para)
                para, size = [], 0
            fresh = ends
            continue
        if para and size + 1 + len(text) > PIECE:              # a text stays at most PIECE characters
            yield start, "".join(para)
            para, size = [], 0
        if not para:
            start, joint = number, ""
        else:
            joint = "\n" if fresh else " "                     # between lines, or within a long line's pieces
        para.append(joint + text)
        size += len(joint) + len(text)
        fresh = ends
    if para:
        yield start, "".join(para)


# ── windows ───────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Template:
    """The special tokens a tokenizer puts around every text: [CLS] … [SEP] for BERT, none for GPT-2."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    tokens: tuple[str, ...]        # how those tokens are spelled, prefix then suffix


def template_of(tokenizer) -> Template:
    """Find the template by encoding an empty text and a one-word text."""
    empty_ids, empty_tokens = tokenizer.encode("")
    probe, _ = tokenizer.encode("a")
    empty, probe = [int(i) for i in empty_ids], [int(i) for i in probe]
    k = 0
    while k < len(empty) and k < len(probe) and empty[k] == probe[k]:
        k += 1
    prefix, suffix = empty[:k], empty[k:]
    if suffix and probe[len(probe) - len(suffix):] != suffix:
        prefix, suffix = empty, []
    return Template(prefix=tuple(prefix), suffix=tuple(suffix), tokens=tuple(empty_tokens))


def windows(ids: np.ndarray, window: int, template: Template) -> list[np.ndarray]:
    """Cut a text's ids (n,) into pieces of at most `window` tokens, each inside the template.

    A text that fits is one window, exactly as the tokenizer encoded it. A longer one is
    cut into consecutive, non-overlapping runs of its own tokens, each wrapped in the
    template's special tokens again ([CLS] run [SEP]), so every window looks like a text.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) <= window:
        return [ids]
    pre, suf = list(template.prefix), list(template.suffix)
    wrapped = ids[:len(pre)].tolist() == pre and (not suf or ids[len(ids) - len(suf):].tolist() == suf)
    if not wrapped:
        pre, suf = [], []
    body = ids[len(pre):len(ids) - len(suf)]                       # the text's own tokens
    step = window - len(pre) - len(suf)
    if step < 1:
        raise QkvError(f"a window of {window} tokens leaves no room between the {len(pre) + len(suf)} special "
                       "tokens; give a larger --window")
    return [np.concatenate([pre, body[k:k + step], suf]).astype(np.int64) for k in range(0, len(body), step)]

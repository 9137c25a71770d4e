"""A corpus on disk, read as a stream of texts, and texts cut into windows the model can take.

    file ─open_corpus (one pass: UTF-8? binary? how many texts? sha256)─▶ Corpus
         ─texts(start)─▶ (index, line, text), one at a time: never all in memory

Split: "line" (one text per line) or "paragraph" (texts separated by blank lines; the
lines of a paragraph are joined with newlines). Lines of only whitespace are never texts.
"""

from __future__ import annotations

import errno
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..engine.errors import QkvError
from ..engine.io import open_regular

SPLITS = ("line", "paragraph")


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


def _lines(path: Path, digest=None) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of a UTF-8 text file; a clear QkvError for a file that cannot be read
    or is binary (a line that is not UTF-8 fails alone, when its text is encoded)."""
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
        number = 0
        while True:
            try:
                raw = f.readline()
            except OSError as e:
                raise QkvError(f"cannot read {path}: {e.strerror}; give a readable text file") from None
            if not raw:
                return
            number += 1
            if digest is not None:
                digest.update(raw)
            if b"\x00" in raw:
                raise QkvError(f"{path} looks binary (a NUL byte on line {number}); give a UTF-8 text file")
            # A line that is not UTF-8 keeps its bad bytes as lone surrogates: encoding it fails
            # with a clear message, so the run reports that one text and skips it.
            line = raw.decode("utf-8", errors="surrogateescape")
            if number == 1:
                line = line.removeprefix("\ufeff")             # a byte-order mark is not text
            yield number, line.rstrip("\r\n")


def _split(lines: Iterator[tuple[int, str]], split: str) -> Iterator[tuple[int, str]]:
    """(first line number, text): one per non-blank line, or one per blank-line-separated paragraph."""
    if split == "line":
        for number, line in lines:
            if line.strip():
                yield number, line.strip()
        return
    start, para = 0, []
    for number, line in lines:
        if line.strip():
            if not para:
                start = number
            para.append(line.strip())
        elif para:
            yield start, "\n".join(para)
            para = []
    if para:
        yield start, "\n".join(para)


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

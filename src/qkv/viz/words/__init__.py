"""The words qkv's pages show, one module per language: `en` (English) and `ko` (Korean, the same keys).

Each module holds one table per page ({key: `str.format` template}): EXPLAIN (`qkv explain`), PIPELINE (the
pipeline page's own), FFN, FLASH, GQA, KVCACHE, POSITIONS, SPARSE, VIT (the other lessons), VIEWER (the
viewer's panel titles, English only). A page reads its words by language:

    TEXTS = texts("ffn")            # {"en": {...}, "ko": {...}}
    TEXTS["ko"]["title"].format(model=..., layer=..., L=..., token=...)

The lessons come after viz in the folders' order, so their words can live here beside the viewer's and the
pipeline page's: a translator opens one file per language.
"""

from __future__ import annotations

from . import en, ko

LANGUAGES = {"en": en.PAGES, "ko": ko.PAGES}          # language → {page: table}


def texts(page: str) -> dict[str, dict[str, str]]:
    """{language: the page's table} for every language that has PAGE (`en` has them all)."""
    if page not in en.PAGES:
        raise KeyError(f"no words for page {page!r}; the pages are {sorted(en.PAGES)}")
    return {lang: pages[page] for lang, pages in LANGUAGES.items() if page in pages}

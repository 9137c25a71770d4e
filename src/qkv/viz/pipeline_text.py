"""The pipeline page's words, in English and Korean: `qkv explain`'s own sentences where they fit.

The keys of SHARED_KEYS are taken from the walkthrough's sentences (`viz.words`, EXPLAIN), so the page
and `qkv explain` say the same thing in the same words; the "p_" keys are the page's own (`viz.words`,
PIPELINE). Each entry is a `str.format`-style template that pipeline.js fills in ({name}, {name:.3f}).
"""

from __future__ import annotations

import re

from .words import texts

SHARED_KEYS = ("s_tokens", "tokens", "tokens_bpe", "x_embed_rope", "s_qkv", "s_gqa", "s_s", "s_scale", "mask",
               "s_softmax", "looks_most", "s_z", "z_seed", "s_out", "library", "first_values", "col_key")

STEP = re.compile(r"^[⓪①-⑳][a-z]? ")       # the walkthrough's step numbers: the page numbers its own boxes


def _page(text: str) -> str:
    """A walkthrough sentence as the page says it: without the step number it opens with."""
    return STEP.sub("", text)


_EXPLAIN, _OWN = texts("explain"), texts("pipeline")
TEXTS = {lang: {**{key: _page(_EXPLAIN[lang][key]) for key in SHARED_KEYS}, **_OWN[lang]} for lang in ("en", "ko")}
EN, KO = TEXTS["en"], TEXTS["ko"]

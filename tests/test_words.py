"""The words qkv's pages show, one module per language (`viz.words`: en, ko): every Korean table has the English
one's keys and fields, every page reads its words from there, and every viewer panel's title is among them."""

from __future__ import annotations

import string

import pytest

from qkv.viz import panels, words
from qkv.viz.words import en, ko, texts


def fields(template: str) -> set[str]:
    """The {fields} a `str.format` template fills in (a language puts them in its own order)."""
    return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}


@pytest.mark.parametrize("page", sorted(ko.PAGES))
def test_each_korean_table_has_the_english_keys_and_fields(page):
    assert ko.PAGES[page].keys() == en.PAGES[page].keys()                  # the same keys
    for key, template in en.PAGES[page].items():
        assert fields(ko.PAGES[page][key]) == fields(template), (page, key)


def test_every_page_speaks_english_and_the_lessons_korean_too():
    assert set(ko.PAGES) <= set(en.PAGES)
    assert set(en.PAGES) - set(ko.PAGES) == {"viewer"}                     # the viewer is in English only
    assert texts("ffn") == {"en": en.FFN, "ko": ko.FFN} and texts("viewer") == {"en": en.VIEWER}
    with pytest.raises(KeyError, match="no words for page 'nowhere'"):
        texts("nowhere")


def test_the_pages_read_their_words_from_here():
    from qkv.lessons import attention_render, ffn, flash, gqa, kvcache, patching, positions, sparse, vit
    from qkv.viz.pipeline_text import SHARED_KEYS, TEXTS as PIPELINE

    lessons = {"explain": attention_render, "ffn": ffn, "flash": flash, "gqa": gqa, "kvcache": kvcache,
               "positions": positions, "sparse": sparse, "vit": vit, "patching": patching}
    for page, module in lessons.items():
        assert module.TEXTS == texts(page), page
    for lang in words.LANGUAGES:
        assert PIPELINE[lang].keys() == set(SHARED_KEYS) | words.LANGUAGES[lang]["pipeline"].keys()


def test_every_panels_title_is_a_word_of_the_viewer():
    assert [p.title for p in panels.PANELS if p.title not in en.VIEWER] == []
    assert [p.shipped()["title"] for p in panels.PANELS] == [en.VIEWER[p.title] for p in panels.PANELS]

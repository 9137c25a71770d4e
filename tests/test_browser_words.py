"""The Whisper words page (qkv.viz.audio_words.words_page) in a real browser (Debian's Chromium, Playwright, the
network blocked; fixtures as in test_browser.py): the embedded sound loads, a click on a word moves the audio to
the start of that word's span, and a hostile word stays text."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from test_browser import assert_offline, browser, tab  # noqa: F401  (fixtures)
from qkv.writing.timestamps import Word
from qkv.viz.audio_words import words_page

WORDS = [Word(" one", 0.10, 0.40, [1]), Word(" <script>alert(1)</script>", 0.50, 0.90, [2]),
         Word(" three", 1.20, 1.60, [3])]


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 4), "white").save(out, format="PNG")
    return out.getvalue()


def test_a_click_plays_its_words_span_and_words_stay_text(tab, tmp_path):
    t = np.arange(2 * 16_000) / 16_000
    path = tmp_path / "words.html"
    path.write_text(words_page(png(), WORDS, 0.2 * np.sin(2 * np.pi * 440 * t)), encoding="utf-8")
    tab.page.goto(path.as_uri())
    tab.page.wait_for_function("document.getElementById('qkv-sound').readyState >= 1")   # its metadata read
    duration = tab.page.evaluate("document.getElementById('qkv-sound').duration")
    assert abs(duration - 2.0) < 0.01
    buttons = tab.page.locator("button.qkv-word")
    assert buttons.count() == 3 and buttons.nth(1).inner_text() == "<script>alert(1)</script>"
    assert tab.page.evaluate("document.querySelectorAll('script:not([src])').length") == 1   # the page's own only
    buttons.nth(2).click()
    tab.page.wait_for_function("document.getElementById('qkv-sound').currentTime >= 1.19")   # sought to its start
    buttons.nth(0).click()                                          # and back: each word seeks to its own span
    tab.page.wait_for_function("document.getElementById('qkv-sound').currentTime < 0.5")
    assert_offline(tab)

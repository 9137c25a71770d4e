"""Korean wherever qkv runs: the bundled NanumGothic backs matplotlib's fonts, and every page embeds a
subset of it holding exactly the Hangul glyphs it shows (tests/test_browser_hangul.py: Chromium draws them)."""

from __future__ import annotations

import base64
import io
import re
import warnings

from fontTools.ttLib import TTFont

from qkv.viz import hangul
from qkv.viz.drawing import fonts, new_figure, styled
from qkv.viz.html import page


def subset_points(document: str) -> set[int]:
    """The code points of the page's embedded Hangul face."""
    found = re.search(r'font-family: "qkv Hangul"; src: url\(data:font/woff;base64,([A-Za-z0-9+/=]+)\)', document)
    assert found, "the page embeds no Hangul face"
    return set(TTFont(io.BytesIO(base64.b64decode(found.group(1)))).getBestCmap())


def test_the_font_is_found_without_importing_its_package():
    import sys

    assert hangul.font_path() is not None and hangul.font_path().name == "NanumGothic.ttf"
    assert "koreanize_matplotlib" not in sys.modules            # importing it would change matplotlib's settings


def test_figures_draw_korean_without_a_missing_glyph():
    assert "NanumGothic" in fonts()

    @styled
    def draw():
        fig = new_figure(3, 1)
        fig.suptitle("나는 학교에 간다 · 한국어")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.savefig(io.BytesIO(), format="png")
        return [str(w.message) for w in caught]

    assert not [m for m in draw() if "missing" in m]


def test_a_page_embeds_exactly_the_hangul_it_shows():
    body = "<p>나는 학교에 간다</p>"
    script = 'const words = {"ko": "\\ud55c\\uad6d\\uc5b4"};'         # JSON's escapes of 한국어 count too
    document = page("qkv", body, [script])
    assert subset_points(document) == {ord(c) for c in "나는학교에간다한국어"}
    assert "font-src data:" in document
    assert "@font-face" not in page("qkv", "<p>The cat sat on the mat</p>", ["const x = 1;"])   # none needed


def test_a_pages_subset_is_kept_and_a_planted_file_is_never_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    first = page("qkv", "<p>나는 학교에 간다</p>", [])
    [kept] = list((tmp_path / "fonts").iterdir())
    assert kept.read_bytes().startswith(b"wOFF")

    def made(points):
        made.calls += 1
        return real(points)
    made.calls, real = 0, hangul._woff
    monkeypatch.setattr(hangul, "_woff", made)
    assert page("qkv", "<p>나는 학교에 간다</p>", []) == first and made.calls == 0     # read back, not made
    kept.write_bytes(b"<script>alert(1)</script>")                                      # not a WOFF
    assert subset_points(page("qkv", "<p>나는 학교에 간다</p>", [])) == {ord(c) for c in "나는학교에간다"}
    assert made.calls == 1 and kept.read_bytes().startswith(b"wOFF")                   # made again, kept again
    elsewhere = tmp_path / "planted.woff"
    elsewhere.write_bytes(b"wOFF" + b"\0" * 64)
    kept.unlink()
    kept.symlink_to(elsewhere)                                                          # a link: never read
    assert subset_points(page("qkv", "<p>나는 학교에 간다</p>", [])) == {ord(c) for c in "나는학교에간다"}
    assert made.calls == 2 and not kept.is_symlink() and elsewhere.read_bytes() == b"wOFF" + b"\0" * 64
    kept.unlink()
    (tmp_path / "fonts").rmdir()
    (tmp_path / "fonts").symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # a linked folder
    (tmp_path / "elsewhere").mkdir()
    assert subset_points(page("qkv", "<p>나는 학교에 간다</p>", [])) == {ord(c) for c in "나는학교에간다"}
    assert made.calls == 3 and list((tmp_path / "elsewhere").iterdir()) == []              # nothing written there
    (tmp_path / "fonts").unlink()
    (tmp_path / "elsewhere").rmdir()
    (tmp_path / "fonts").mkdir()
    monkeypatch.setenv("QKV_CACHE", "off")
    assert subset_points(page("qkv", "<p>한국어</p>", [])) == {ord(c) for c in "한국어"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fonts", "planted.woff"]

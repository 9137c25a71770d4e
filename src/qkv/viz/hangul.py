"""Korean glyphs wherever qkv runs, with no font installed on the machine.

qkv's figures and pages show Korean (the 한국어 words of every page, Korean tokens, ko-en-tiny's
sources), but a fresh machine may have no font with Hangul: matplotlib (its DejaVu Sans) and the
browser then draw empty boxes. The font comes with qkv's dependencies instead: NanumGothic (SIL Open
Font Licence 1.1), the TrueType file that the koreanize-matplotlib package ships. That package is never
imported (importing it changes matplotlib's global settings); only its file is read.

    register_matplotlib()    NanumGothic added to matplotlib's fonts once (figures.fonts falls back to it)
    face_css(text)           an @font-face of just the glyphs TEXT needs, embedded as data (a page's own)
    full_face()              the WOFF of every Hangul syllable and jamo (the web app serves it once)

Pages name FAMILY last but one in their font stacks (before the generic family), so a machine's own
fonts still win for every glyph they have.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import io
import re
from pathlib import Path

FAMILY = "qkv Hangul"                    # the @font-face name the CSS and canvas stacks use
MATPLOTLIB_NAME = "NanumGothic"          # the family name matplotlib reads from the file
FIRST = 0x1100                           # below: Latin, Greek, … (the browser's and DejaVu's own)
HANGUL = [(0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7A3), (0x3000, 0x303F), (0xFF01, 0xFF5E)]
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")   # what JSON with ensure_ascii makes of non-ASCII text
_WIDE = re.compile("[\u1100-\U0010ffff]")      # a character from FIRST on (found in C, not a Python loop)


@functools.lru_cache(maxsize=1)
def font_path() -> Path | None:
    """NanumGothic.ttf inside the installed koreanize-matplotlib package (found without importing it),
    or None if the package is missing (then figures and pages use the machine's fonts only)."""
    spec = importlib.util.find_spec("koreanize_matplotlib")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "fonts" / "NanumGothic.ttf"
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=1)
def register_matplotlib() -> str | None:
    """Add NanumGothic to matplotlib's font list (once); its family name, or None without the file."""
    path = font_path()
    if path is None:
        return None
    from matplotlib import font_manager

    font_manager.fontManager.addfont(str(path))
    return MATPLOTLIB_NAME


@functools.lru_cache(maxsize=1)
def _cmap() -> frozenset[int]:
    from fontTools.ttLib import TTFont

    return frozenset(TTFont(str(font_path()), lazy=True).getBestCmap())


def needed(text: str) -> frozenset[int]:
    """The code points of TEXT (its raw characters and its JSON \\uXXXX escapes) beyond Latin and Greek
    that the font has."""
    if font_path() is None:
        return frozenset()
    points = {ord(c) for c in set(_WIDE.findall(text))}          # a page is megabytes: scan it in C
    points.update(int(h, 16) for h in set(_ESCAPE.findall(text)))
    return frozenset(p for p in points if p >= FIRST) & _cmap()


@functools.lru_cache(maxsize=64)
def _woff(points: frozenset[int]) -> bytes:
    """A WOFF font holding only the glyphs of POINTS (and .notdef), its names (the licence) kept."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    options = subset.Options()
    options.flavor = "woff"                          # zlib-compressed; WOFF2 would need brotli
    options.name_IDs = ["*"]                         # copyright and licence travel with the glyphs
    options.notdef_outline = True
    options.hinting = False                          # outlines only: a third of the bytes, drawn alike on screens
    options.layout_features = []                     # Hangul needs no substitutions
    options.drop_tables += ["TSI0", "TSI1", "TSI2", "TSI3", "TSI5"]   # the hinting tool's sources, not glyphs
    font = TTFont(str(font_path()), lazy=True)      # tables read as the subsetter needs them
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(points))
    subsetter.subset(font)
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()


def face_css(text: str) -> str:
    """An @font-face rule for FAMILY with the glyphs TEXT needs, as a data: URL ("" when it needs none)."""
    points = needed(text)
    if not points:
        return ""
    data = base64.b64encode(_woff(points)).decode("ascii")
    return (f'@font-face {{ font-family: "{FAMILY}"; src: url(data:font/woff;base64,{data}) format("woff"); '
            "font-weight: 100 900; }\n")              # one face for every weight: bold text too


@functools.lru_cache(maxsize=1)
def full_face() -> bytes | None:
    """The WOFF of every Hangul syllable, jamo and CJK punctuation the font has (about 2.5 MB; the web app
    serves it at hangul.woff, since chat replies may hold any of them), or None without the file."""
    if font_path() is None:
        return None
    points = frozenset(p for lo, hi in HANGUL for p in range(lo, hi + 1)) & _cmap()
    return _woff(points)

"""Korean glyphs wherever qkv runs, with no font installed on the machine.

qkv's figures and pages show Korean (the 한국어 words of every page, Korean tokens, ko-en-tiny's
sources), but a fresh machine may have no font with Hangul: matplotlib (its DejaVu Sans) and the
browser then draw empty boxes. The font comes with qkv's dependencies instead: NanumGothic (SIL Open
Font Licence 1.1), the TrueType file that the koreanize-matplotlib package ships. That package is never
imported (importing it changes matplotlib's global settings); only its file is read.

    register_matplotlib()    NanumGothic added to matplotlib's fonts once (drawing.fonts falls back to it)
    face_css(text)           an @font-face of just the glyphs TEXT needs, embedded as data (a page's own)
    full_face()              the WOFF of every Hangul syllable and jamo (the web app serves it once)

Making a subset reads the font's tables (about half a second), so each subset is kept in the qkv cache
directory (runtime.io.cache_dir: fonts/, by the font file and the code points asked for): the next page
that shows the same characters (every English page shows the same few Korean words) embeds it at once.

Pages name FAMILY last but one in their font stacks (before the generic family), so a machine's own
fonts still win for every glyph they have.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import io
import re
from pathlib import Path

from ..runtime.io import cache_dir, write_atomic

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


def _wide(text: str) -> frozenset[int]:
    """The code points of TEXT (its raw characters and its JSON \\uXXXX escapes) from FIRST on."""
    points = {ord(c) for c in set(_WIDE.findall(text))}          # a page is megabytes: scan it in C
    points.update(int(h, 16) for h in set(_ESCAPE.findall(text)))
    return frozenset(p for p in points if p >= FIRST)


def needed(text: str) -> frozenset[int]:
    """The code points of TEXT (its raw characters and its JSON \\uXXXX escapes) beyond Latin and Greek
    that the font has."""
    if font_path() is None:
        return frozenset()
    return _wide(text) & _cmap()


MAX_FACE = 8 << 20                       # a kept subset larger than this is not one qkv wrote


def _kept_face(wide: frozenset[int]) -> bytes:
    """The WOFF of the glyphs of WIDE the font has (b"" if none), from the cache directory when a page
    asked for the same code points before, else made and kept there (atomically; a cache that cannot
    be written is skipped; a fonts folder that is a link is neither read nor written). A kept file is used
    only if it is a regular file (no link) that reads as a WOFF, or is empty (nothing needed)."""
    if not wide:
        return b""
    folder = cache_dir()
    font = font_path()
    stat = font.stat()
    key = hashlib.sha256(f"{font.name} {stat.st_size} {stat.st_mtime_ns} {sorted(wide)}".encode()).hexdigest()
    path = None if folder is None or (folder / "fonts").is_symlink() else folder / "fonts" / f"{key[:32]}.woff"
    if path is not None:
        try:
            if not path.is_symlink() and path.is_file() and path.stat().st_size <= MAX_FACE:
                data = path.read_bytes()
                if data == b"" or data.startswith(b"wOFF"):
                    return data
        except OSError:
            pass
    points = wide & _cmap()
    data = _woff(points) if points else b""
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, lambda f: f.write(data))
        except OSError:
            pass                                         # no cache: the next page makes its subset again
    return data


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
    font.flavor = options.flavor                     # (TTFont.save writes plain TrueType otherwise)
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()


def face_css(text: str) -> str:
    """An @font-face rule for FAMILY with the glyphs TEXT needs, as a data: URL ("" when it needs none)."""
    if font_path() is None:
        return ""
    woff = _kept_face(_wide(text))
    if not woff:
        return ""
    data = base64.b64encode(woff).decode("ascii")
    return (f'@font-face {{ font-family: "{FAMILY}"; src: url(data:font/woff;base64,{data}) format("woff"); '
            "font-weight: 100 900; }\n")              # one face for every weight: bold text too


@functools.lru_cache(maxsize=1)
def full_face() -> bytes | None:
    """The WOFF of every Hangul syllable, jamo and CJK punctuation the font has (about 0.4 MB; the web app
    serves it at hangul.woff, since chat replies may hold any of them), or None without the file."""
    if font_path() is None:
        return None
    return _kept_face(frozenset(p for lo, hi in HANGUL for p in range(lo, hi + 1)))

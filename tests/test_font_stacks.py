"""Every font stack that can show user text names qkv's embedded Hangul face, so Korean never shows as empty
boxes on a machine without a Korean font (the face is embedded in each page, or served by `qkv serve`).

The scan reads every stylesheet, script and Python module of the package for a font declaration (CSS `font:` /
`font-family:`, a canvas's `ctx.font = '…'`): each names a generic family, and "qkv Hangul" before it."""

import re
from pathlib import Path

import qkv
from qkv.viz.hangul import FAMILY

ROOT = Path(qkv.__file__).parent
DECLARATION = re.compile(r"""font(?:-family)?\s*[:=]\s*([^;{}\n]*?(?:sans-serif|serif|monospace|system-ui)[^;{}\n]*)""")
GENERIC = re.compile(r"(?:^|[\s,])(sans-serif|serif|monospace)\b")


def stacks():
    for path in sorted([*ROOT.rglob("*.css"), *ROOT.rglob("*.js"), *ROOT.rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        for m in DECLARATION.finditer(text):
            if "matplotlib" in text[max(0, m.start() - 200):m.start()] or "rcParams" in m.group(0):
                continue                                    # figures: matplotlib's own fallback list
            yield path.relative_to(ROOT), text[:m.start()].count("\n") + 1, m.group(1)


def test_every_font_stack_can_draw_hangul():
    found = list(stacks())
    assert len(found) >= 9, found                            # the scan finds the pages' stacks
    missing = [(str(p), line, stack) for p, line, stack in found
               if GENERIC.search(stack) and FAMILY not in stack.replace('\\"', '"')]
    assert not missing, missing


def test_figures_draw_every_character_of_korean_japanese_and_emoji_tokens():
    """A heatmap of a byte-level model's Korean, Japanese and emoji tokens draws without a missing glyph:
    the characters as themselves (NanumGothic), pieces as their bytes, an emoji as its code point."""
    import io
    import warnings

    from qkv.viz import figures

    model = qkv.load("smollm2")
    trace = model.run("서울은 東京 🙂", keep=("attentions",))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*missing from font")
        fig = figures.head_heatmap(trace, 0, 0)
        fig.savefig(io.BytesIO(), format="png")
    shown = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "⟨U+1F642⟩" in "".join(shown) and any("서" in s for s in shown)

"""docs/guide.md and docs/guide.ko.md: both exist, share their anchors, and every pointer to them resolves."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE, GUIDE_KO = ROOT / "docs" / "guide.md", ROOT / "docs" / "guide.ko.md"
SECTIONS = ["tokens", "embeddings", "positions", "qkv", "scores", "scaling", "mask", "softmax", "weighted-sum",
            "heads", "block", "logits", "temperature", "kv-cache", "flash", "gqa", "sparse", "linear", "self-cross",
            "families", "head-roles", "limits", "vit", "audio", "proteins"]
ANCHOR = re.compile(r'<a id="([a-z-]+)"></a>')


def anchors(path: Path) -> list[str]:
    return ANCHOR.findall(path.read_text(encoding="utf-8"))


def korean_headings() -> list[str]:
    return re.findall(r"^## \d+\. (.+)$", GUIDE_KO.read_text(encoding="utf-8"), re.M)


def tracked(*paths: str) -> list[Path]:
    """The files git tracks under `paths` (untracked scratch files do not count)."""
    out = subprocess.run(["git", "ls-files", "-z", *paths], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def texts(*paths: str) -> dict[Path, str]:
    found = {}
    for path in tracked(*paths):
        try:
            found[path] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):   # binary files (images, weights); deleted in the tree
            continue
    return found


def test_both_guides_have_every_section_in_order():
    assert anchors(GUIDE) == SECTIONS
    assert anchors(GUIDE_KO) == SECTIONS
    for path in (GUIDE, GUIDE_KO):
        text = path.read_text(encoding="utf-8")
        for name in SECTIONS:                          # each anchor right before its heading
            assert re.search(rf'<a id="{name}"></a>\n## ', text), (path.name, name)


def test_each_guide_links_the_other_and_its_own_anchors_resolve():
    for path, other in ((GUIDE, "guide.ko.md"), (GUIDE_KO, "guide.md")):
        text = path.read_text(encoding="utf-8")
        assert f"]({other})" in text
        for name in re.findall(r"\]\(#([a-z-]+)\)", text):
            assert name in SECTIONS, (path.name, name)


@pytest.fixture(scope="module")
def sources() -> dict[Path, str]:
    return texts("README.md", "src", "docs")


def test_every_pointer_to_the_guide_resolves(sources):
    headings = korean_headings()
    seen = 0
    for path, text in sources.items():
        for name in re.findall(r"guide(?:\.ko)?\.md#([A-Za-z0-9_-]+)", text):
            assert name in SECTIONS, (path, name)
            seen += 1
        for name in re.findall(r"\bguide: ([a-z-]+)", text):
            assert name in SECTIONS, (path, name)
            seen += 1
        for name in re.findall(r"가이드: ([^),.]+)", text):   # Korean pointers name a heading of guide.ko.md
            assert any(h.startswith(name) for h in headings), (path, name)
            seen += 1
    assert seen > 50                                   # the pointers are there, and the patterns find them


def test_no_user_visible_text_mentions_the_internal_notes(sources):
    word = re.compile("seeds|시드", re.I)
    found = [f"{path.relative_to(ROOT)}:{n}" for path, text in sources.items()
             for n, line in enumerate(text.splitlines(), 1) if word.search(line)]
    assert not found, found

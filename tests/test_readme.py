"""The README a newcomer copies from: every ```python block runs as written, every `qkv.x.y` it names exists
(and takes the arguments the README gives it), and it opens with a contents list whose links all resolve.

The blocks of one section (a `##` or `###` heading) run in order in one namespace, in a fresh folder that
holds the repository's `docs/` (the README's commands run from a checkout: the corpus `docs/heads-corpus.txt`);
so each section's first block defines what it uses, and what a block writes lands in that folder.
A block that cannot run here says why in an HTML comment right before it, `<!-- readme-test: skip: WHY -->`,
and SKIPPED below counts them, so a new one is a conscious change.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import qkv

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SKIP = re.compile(r"<!--\s*readme-test:\s*skip:\s*(.+?)\s*-->")
SKIPPED = 0                                           # every block runs (digits-whisper ships for the Whisper one)


@dataclass(frozen=True)
class Block:
    """One ```python block: the heading it sits under, its first line's number, its code, why it is skipped."""

    section: str
    line: int
    code: str
    skip: str | None


def blocks(text: str) -> list[Block]:
    """Every ```python block of a Markdown text, in order."""
    found, section, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("## ", "### ")):
            section = line.lstrip("#").strip()
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if line.strip() == "```python":
                before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
                why = SKIP.search(before)
                found.append(Block(section, i + 2, "\n".join(lines[i + 1:end]) + "\n", why and why.group(1)))
            i = end
        i += 1
    return found


BLOCKS = blocks(README.read_text(encoding="utf-8"))
SECTIONS = list(dict.fromkeys(b.section for b in BLOCKS))


def run_section(section: str, folder: Path, monkeypatch) -> None:
    """Run one section's blocks in order in one namespace, inside FOLDER (holding the repository's docs/)."""
    (folder / "docs").symlink_to(REPO / "docs")
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "__readme__"}
    for block in (b for b in BLOCKS if b.section == section and not b.skip):
        exec(compile(block.code, f"README.md:{block.line}", "exec"), namespace)


@pytest.mark.parametrize("section", SECTIONS)
def test_each_sections_python_runs_as_written(section, tmp_path, monkeypatch):
    run_section(section, tmp_path, monkeypatch)


def test_the_blocks_are_found_and_few_are_skipped():
    assert len(BLOCKS) >= 16 and len(SECTIONS) >= 10
    assert sum(1 for b in BLOCKS if b.skip) == SKIPPED, [(b.line, b.skip) for b in BLOCKS if b.skip]


# ----------------------------------------------------------------------------------------------------------
# The names the prose gives: `qkv.analysis.patch(model, clean, corrupted, …)` must be there and take that.

NOT_PYTHON = {"qkv.json"}                              # a file of an SAE's folder, not a module
DOTTED = re.compile(r"(?<![\w./-])qkv(?:\.[A-Za-z_]\w*)+")
# Names the prose gives right after a dotted one ("`qkv.viz.figures.head_heatmap(…)`, `layer_grid(…)`").
FOLLOWING = {"qkv.viz.figures": ("layer_grid", "model_overview", "save_figures"),
             "qkv.analysis": ("qk_positions", "copying_scores"),
             "qkv.features.pages": ("text_features",),
             "qkv.analysis.sections": ("lens_payload", "rollout_payload", "patch_payload")}


def resolve(name: str):
    """The object a dotted name reaches after `import qkv`, as a user would write it."""
    obj = qkv
    for part in name.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def call_text(text: str, start: int) -> str | None:
    """The `(…)` right after position START, parentheses balanced (it may run over lines), or None."""
    if start >= len(text) or text[start] != "(":
        return None
    depth = 0
    for i in range(start, min(len(text), start + 400)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    return None


def check_call(fn, args: str) -> str | None:
    """None if FN accepts the arguments written in ARGS (positional count and keyword names), else why not."""
    try:
        call = ast.parse("f" + args.replace("\n", " "), mode="eval").body
    except SyntaxError:
        return None                                    # prose, not Python ("layer=, site=, ..."): name only
    if not isinstance(call, ast.Call) or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    more = [a for a in call.args if isinstance(a, ast.Constant) and a.value is Ellipsis]
    positional = [None] * (len(call.args) - len(more))  # `patch(...)`, `f(a, ...)`: "and more", not an argument
    keywords = {k.arg: None for k in call.keywords if k.arg}
    signature = inspect.signature(fn)
    try:
        (signature.bind_partial if more else signature.bind)(*positional, **keywords)
    except TypeError as e:
        return str(e)
    return None


def prose_names(text: str) -> list[tuple[str, str | None]]:
    """Every dotted `qkv.…` name the README gives, with the call written after it (if any)."""
    return [(m.group(0), call_text(text, m.end())) for m in DOTTED.finditer(text) if m.group(0) not in NOT_PYTHON]


UNRESOLVED = """
import json, sys
import qkv
missing = []
for name in json.loads(sys.argv[1]):
    obj = qkv
    try:
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
    except AttributeError as e:
        missing.append(f"{name}: {e}")
print(json.dumps(missing))
"""


def unresolved(names: list[str]) -> list[str]:
    """The names a fresh `import qkv` does not reach as attributes (in a new interpreter: nothing imported yet)."""
    done = subprocess.run([sys.executable, "-c", UNRESOLVED, json.dumps(names)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


def test_every_name_the_readme_gives_exists_and_takes_its_arguments():
    text = README.read_text(encoding="utf-8")
    names = prose_names(text)
    assert len(names) > 40
    wrong = unresolved(sorted({name for name, _ in names} | {f"{m}.{s}" for m, f in FOLLOWING.items() for s in f}))
    for name, args in names:
        if args is not None and not any(w.startswith(name + ":") for w in wrong):
            obj = resolve(name)
            if not callable(obj):
                wrong.append(f"{name}{args}: not callable")
            elif (why := check_call(obj, args)):
                wrong.append(f"{name}{args}: {why}")
    for module, following in FOLLOWING.items():
        for short in following:
            assert short in text, short
    assert not wrong, "\n".join(wrong)


# ----------------------------------------------------------------------------------------------------------
# The top: title, first paragraph, Contents (every `##` heading, by GitHub's anchor), Getting started.

def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (not - or _), spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str, level: str = "#{1,6}") -> list[str]:
    """The headings of a Markdown text at LEVEL (a regex of #'s), outside fenced code (a `# comment` is none)."""
    found, fenced = [], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(f"({level}) (.+)", line)):
            found.append(m.group(2))
    return found


def test_the_contents_list_every_section_and_resolve():
    text = README.read_text(encoding="utf-8")
    sections = headings(text, "##")
    assert sections[:2] == ["Contents", "Getting started"], sections[:2]
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"^- \[.*\]\(#([^)]+)\)$", contents, re.M)          # "  - […]": a ### below its ##
    anchors = [github_anchor(h) for h in sections[1:]]
    assert links == anchors, (links, anchors)


def test_getting_started_fits_one_screen():
    text = README.read_text(encoding="utf-8")
    start = text.split("## Getting started", 1)[1].split("\n## ", 1)[0]
    assert len(start.strip().splitlines()) <= 45
    assert "make demo" in start and "make test" in start


def test_every_relative_link_of_the_readme_resolves():
    text = README.read_text(encoding="utf-8")
    anchors = {github_anchor(h) for h in headings(text)}
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if not path and anchor not in anchors:
            missing.append(target)
        elif path and not (REPO / path).exists():
            missing.append(target)
    assert not missing, missing

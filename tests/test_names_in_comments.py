"""Every file or module a comment or docstring names exists: code moves, and the words about it must follow.

Read from the comments and docstrings of src/qkv (Python, and the comments of its .js and .css files) and of
tests/: paths (`viz/html.py`, `tests/test_io.py`), bare file names (`html.py`, `viewer.js`) and dotted names
of qkv's (`qkv.core.ops`, `writing.sampling.Sampling`, `qkv.load`). A path is looked up beside the file, in
src/qkv/, src/ and the project's root (a bare name anywhere in the project); a dotted name must be a module of
qkv or a name one defines (read from its source, not imported). Other projects' files are in OUTSIDE.

Run as a script to list what it finds: python tests/test_names_in_comments.py
"""

from __future__ import annotations

import ast
import io
import os
import re
import sys
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "qkv"
SUFFIXES = ("py", "js", "css")
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:" + "|".join(SUFFIXES) + r"))(?![\w/])")
DOTTED = re.compile(r"(?<![\w./-])((?:qkv\.)?[a-z_]+(?:\.[A-Za-z_]\w*)+)")
FORMER = ("engine",)                               # folders qkv no longer has: a name in one is stale
OUTSIDE = {"convert_hf_to_gguf.py"}                # other projects' files: llama.cpp's GGUF converter
NOT_MODULES = {"cli.add_command"}                  # the click group `cli` (cli/app.py) registering a command
FILE_KINDS = {"html", "json", "png", "svg", "npy", "txt", "md", "csv", "gguf", "safetensors", "woff"}   # features.html


def folders() -> set[str]:
    """qkv's sub-packages: a dotted name starting with one (`core.ops`, `viz.payload`) is a name of qkv's."""
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of PATH (a .py file), or of every comment of a .js/.css."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        found = [(m.group(0), text.count("\n", 0, m.start()) + 1)
                 for m in re.finditer(r"/\*.*?\*/|(?<![:\\'\"])//[^\n]*", text, re.S)]
        return [(line, c) for c, line in found]
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                found.append((node.body[0].lineno, doc))
    return found


@cache
def basenames() -> frozenset[str]:
    """The names of every file of the project (for a bare file name)."""
    found = set()
    for folder, subs, files in os.walk(ROOT):
        subs[:] = [s for s in subs if not s.startswith(".") and s != "__pycache__"]     # not .venv, .git
        found.update(files)
    return frozenset(found)


def path_exists(name: str, where: Path) -> bool:
    """Whether NAME (a path or a bare file name) is a file of the project, seen from the file at WHERE."""
    if "/" not in name:
        return name in basenames() or name in OUTSIDE
    first = name.split("/")[0]
    if first in FORMER:
        return False
    bases = [where.parent, where.parent.parent, PACKAGE, SRC, ROOT, ROOT / "tests"]
    return any((base / name).exists() for base in bases)


@cache
def module_exists(dotted: str) -> bool:
    """Whether DOTTED (`qkv.core.ops`, or `core.ops`: starting with one of qkv's folders) is a module of qkv or
    a name in one."""
    parts = dotted.split(".")
    if parts[0] != "qkv":
        parts = ["qkv", *parts]
    if parts[1] in FORMER:
        return False
    for cut in range(len(parts), 0, -1):                      # the longest prefix that is a module file
        base = SRC.joinpath(*parts[:cut])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            break
    else:
        return False
    if cut == len(parts):
        return True
    file = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    return defines(ast.parse(file.read_text(encoding="utf-8")), parts[cut:])


def defines(node: ast.AST, attrs: list[str]) -> bool:
    """Whether the module or class NODE defines ATTRS[0] (a def, class, assignment or import), and so on down a
    class's names; a name imported from elsewhere is taken as it is (read without importing: code moves)."""
    for child in getattr(node, "body", []):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == attrs[0]:
            return len(attrs) == 1 or isinstance(child, ast.ClassDef) and defines(child, attrs[1:])
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            if attrs[0] in {(a.asname or a.name).split(".")[0] for a in child.names}:
                return True
        targets = child.targets if isinstance(child, ast.Assign) else [getattr(child, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == attrs[0] for t in targets):
            return len(attrs) == 1
        if isinstance(child, (ast.If, ast.Try)) and defines(child, attrs):
            return True
    return False


def names(text: str) -> tuple[list[str], list[str]]:
    """The paths and the dotted names of qkv's (`qkv.…`, or starting with one of its folders) TEXT mentions."""
    paths = [m.group(1) for m in PATH.finditer(text)]
    ours = folders() | set(FORMER)
    dotted = []
    for m in DOTTED.finditer(text):
        name = m.group(1).rstrip(".")
        parts = name.split(".")
        if PATH.fullmatch(name) or not (parts[0] == "qkv" or parts[0] in ours) or name in NOT_MODULES:
            continue
        if parts[-1] in FILE_KINDS or all(len(p) == 1 for p in parts[1:]):    # features.html; a pattern: qkv.x.y
            continue
        dotted.append(name)
    return paths, dotted


def missing() -> list[str]:
    """`file:line: name` for every name a comment or docstring gives that names nothing in the project."""
    files = [p for suffix in SUFFIXES for p in sorted(PACKAGE.rglob(f"*.{suffix}"))]
    files += sorted((ROOT / "tests").rglob("*.py"))
    out = []
    for path in files:
        if "__pycache__" in path.parts:
            continue
        for line, text in comments(path):
            paths, dotted = names(text)
            where = path.relative_to(ROOT)
            out += [f"{where}:{line}: {name}" for name in paths if not path_exists(name, path)]
            out += [f"{where}:{line}: {name}" for name in dotted if not module_exists(name)]
    return sorted(set(out))


def test_every_file_and_module_a_comment_names_exists():
    stale = missing()
    assert not stale, f"{len(stale)} comments name files or modules that do not exist:\n" + "\n".join(stale)


def test_the_check_finds_a_stale_name():
    """The check itself: an old folder, a moved file, a missing module and attribute are caught; real ones pass."""
    here = PACKAGE / "web" / "app.py"
    assert not path_exists("engine/io.py", here) and not path_exists("checkpoints/fresh.py", here)
    assert not path_exists("cli.py", here) and path_exists("models/fresh.py", here)
    assert path_exists("server.py", here) and path_exists("viz/assets/viewer.js", here)
    assert not module_exists("qkv.engine.io") and not module_exists("engine.io_json")
    assert not module_exists("qkv.core.no_such_module") and not module_exists("qkv.writing.sampling.NoSuchName")
    assert module_exists("qkv.runtime.io_json") and module_exists("writing.sampling.Sampling")
    assert module_exists("qkv.load")
    assert names("see `engine/model.py` and qkv.engine.trace") == (["engine/model.py"], ["qkv.engine.trace"])


if __name__ == "__main__":
    found = missing()
    print("\n".join(found))
    print(f"{len(found)} names of missing files or modules", file=sys.stderr)

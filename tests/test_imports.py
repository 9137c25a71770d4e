"""Imports flow one way, and no two modules import each other (README, "How it is built").

An AST walk over src/qkv: every `import` and `from … import`, at the top of a module or inside a
function (a lazy import is still a dependency), resolved to the qkv module it loads. Imports under
`if TYPE_CHECKING:` count too, for the layers and for cycles: a type the two sides share is a small
Protocol below both (qkv.writing.handles), never an import of the module that imports you.

A module's layer is its folder's, one folder per layer, in this order:

    runtime      errors, atomic files and bounded JSON, threads, this machine's tuning, stored weights, kernels
    core         the maths of a pass: ops, positions, masks, attention, blocks and backward, the stack runner,
                 config, weights, cache, hooks, trace, token labels
    inputs       what a model reads: tokenizer, chat templates, images
    writing      decoding loops, sampling, chat, the next-token distribution
    checkpoints  file formats and families as data (HF and GGUF tables), the bundled models' files
    models       the handles a user holds (Model, Seq2SeqModel, ImageModel, AudioModel), load and init;
                 qkv itself (the package) sits here
    viz          figures, the viewer, the pipeline page
    analysis     head statistics, interpretability methods
    lessons      qkv explain [TOPIC]
    train        gradients, optimiser, data, the training loop
    features     activations at scale, sparse autoencoders
    bench        timings against the reference
    web          the local web app
    cli          every command; qkv.__main__

A module may import its own layer and the layers above it in this list, never one below: no exceptions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = ("runtime", "core", "inputs", "writing", "checkpoints", "models", "viz", "analysis", "lessons", "train",
          "features", "graphs", "bench", "web", "cli")
FOLDERS = {name: name for name in LAYERS}
ROOT = {"qkv": "models", "qkv.__main__": "cli"}


def layer_of(module: str) -> str | None:
    """The layer of a qkv module by its folder, or None if no rule places it (a new folder: add it above)."""
    if module in ROOT:
        return ROOT[module]
    parts = module.split(".")
    return FOLDERS.get(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in FOLDERS) else None


def test_the_root_holds_only_the_package():
    """Every module sits in a layer's folder: the root is `import qkv` and `python -m qkv` alone."""
    loose = sorted(m for m in MODULE_FILES if m.count(".") == 1 and m not in ROOT and m.split(".")[1] not in FOLDERS)
    assert not loose, f"move these modules into a layer's folder: {loose}"


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of src/qkv: dotted name → (file, is a package's __init__)."""
    found = {}
    for path in sorted((SRC / "qkv").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULE_FILES = modules()


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imported(module: str, package: bool, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The qkv modules an import statement loads (`from . import x` loads x, not the package)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - (0 if package else 1)]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULE_FILES else base for alias in node.names]
    found = set()
    for name in names:
        while name and name not in MODULE_FILES:            # qkv.viz.html.save_viewer → qkv.viz.html
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def imports(module: str) -> tuple[set[str], set[str]]:
    """(modules imported when this one runs, modules imported only for type checking)."""
    path, package = MODULE_FILES[module]
    run, typing_only = set(), set()

    def walk(node: ast.AST, typing: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (typing_only if typing else run).update(_imported(module, package, child))
            walk(child, typing or _type_checking(child))

    walk(ast.parse(path.read_text(), str(path)), False)
    return run, typing_only - run


GRAPH = {m: imports(m) for m in MODULE_FILES}


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULE_FILES if layer_of(m) is None)
    assert not unplaced, f"place these modules in a layer of tests/test_imports.py (and README's map): {unplaced}"


def test_imports_flow_one_way():
    wrong = []
    for module, (run, typing_only) in GRAPH.items():
        own = LAYERS.index(layer_of(module) or "cli")
        for target in sorted(run | typing_only):
            if LAYERS.index(layer_of(target) or "runtime") > own:
                wrong.append(f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})")
    assert not wrong, "imports run back up (" + " → ".join(LAYERS) + "):\n" + "\n".join(wrong)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    graph = {m: run | typing_only for m, (run, typing_only) in GRAPH.items()}
    found = cycles(graph)
    detail = [", ".join(f"{a} → {sorted(graph[a] & set(c))}" for a in c) for c in found]
    assert not found, "modules that import each other (lazily and for types count too):\n" + "\n".join(detail)


@pytest.mark.parametrize("source, expected", [
    ("from .viz.html import save_viewer", {"qkv.viz.html"}),
    ("from .runtime import errors", {"qkv.runtime.errors"}),
    ("import qkv.core.trace", {"qkv.core.trace"}),
    ("def f():\n    from .checkpoints import load", {"qkv.checkpoints"}),
])
def test_the_walk_sees_imports(source, expected, monkeypatch, tmp_path):
    """The walk itself: relative, absolute and lazy imports all resolve to the module they load."""
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    monkeypatch.setitem(MODULE_FILES, "qkv.probe", (probe, False))
    assert imports("qkv.probe")[0] == expected


def test_cycles_finds_a_lazy_loop():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_every_kind_of_model_is_named_by_the_package():
    """qkv.load returns a Model, Seq2SeqModel, ImageModel or AudioModel: each is importable from qkv itself."""
    import qkv

    assert isinstance(qkv.load("digits-vit"), qkv.ImageModel) and isinstance(qkv.load("ko-en-tiny"), qkv.Seq2SeqModel)
    assert {"Model", "Seq2SeqModel", "ImageModel", "AudioModel"} <= set(qkv.__all__)
    assert qkv.AudioModel.__module__ == "qkv.models.audio_model"

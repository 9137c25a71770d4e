"""What llama.cpp declares for a GGUF architecture (gguf.constants), the check that qkv's table of it and a file
written for it name nothing else, and a directory's file with keys or tensors edited: shared by the GGUF tests of the
newer architectures."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import gguf
import pytest
from gguf import GGUFValueType as V
from safetensors.numpy import load_file

from conftest import FIXTURES, TOL_ATTENTION, TOL_HIDDEN, max_abs, run_main
import qkv
from qkv.checkpoints.gguf_archs import ARCHS
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
import make_gguf_fixtures as F  # noqa: E402


def llama_cpp(arch: str) -> tuple[set[str], set[str]]:
    """gguf.constants' tensor names of ARCH (blk.{bid}.… as blk.{i}.…, no suffix) and every metadata key it declares
    ({arch} filled in)."""
    kind = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    tensors = {gguf.TENSOR_NAMES[t].replace("{bid}", "{i}") for t in gguf.MODEL_TENSORS[kind]}
    keys = {v.replace("{arch}", arch) for cls in vars(gguf.Keys).values() if isinstance(cls, type)
            for k, v in vars(cls).items() if isinstance(v, str) and not k.startswith("_")}
    return tensors, keys


def check_table(arch: str) -> tuple[set[str], set[str]]:
    """qkv's table of ARCH: every tensor part (blk.{i}.<part>, the stacked experts, the top tensors) and every metadata
    key it reads is one gguf.constants declares for the arch. Returns llama_cpp(ARCH)."""
    table, (tensors, keys) = ARCHS[arch], llama_cpp(arch)
    parts = {f"blk.{{i}}.{p}" for p in (*table.layer, *(table.experts or ()))} | set(table.top)
    assert parts <= tensors, sorted(parts - tensors)
    assert {f"{arch}.{k}" for k in table.keys} <= keys, sorted({f"{arch}.{k}" for k in table.keys} - keys)
    return tensors, keys


def check_names(arch: str, path) -> None:
    """check_table(ARCH), and the file at PATH names only what gguf.constants declares for the arch: every tensor and
    every metadata key (its own and xielu.*) outside GGUF.*, general.* and tokenizer.*."""
    tensors, keys = check_table(arch)
    reader = gguf.GGUFReader(path)
    names = {t.name.removesuffix(".weight").removesuffix(".bias") for t in reader.tensors}
    layered = {".".join(["blk", "{i}", *n.split(".")[2:]]) if n.startswith("blk.") else n for n in names}
    assert layered <= tensors, sorted(layered - tensors)
    meta = {f.name for f in reader.fields.values() if not f.name.startswith(("GGUF.", "general.", "tokenizer."))}
    assert meta <= keys, sorted(meta - keys)


def edited_file(tmp_path: Path, directory: Path, arch: str, meta: dict, tensors: dict | None = None,
                more: Callable[[dict, dict], dict] = lambda hf, weights: {}) -> Path:
    """DIRECTORY's ARCH file as the test writer lays it out (plus MORE(hf, weights)'s metadata), with metadata keys
    set (None: removed) and tensors set (None: removed); a new name in TMP_PATH each call."""
    hf = json.loads((directory / "config.json").read_text())
    weights = load_file(directory / "model.safetensors")
    m = {"general.architecture": (arch, V.STRING)} | C.metadata(hf, arch) | C.vocabulary(directory, hf) \
        | more(hf, weights)
    m = {k: v for k, v in (m | meta).items() if v is not None}
    t = {k: v for k, v in (C.tensors(hf, weights, arch) | (tensors or {})).items() if v is not None}
    return F.write(tmp_path / f"x{len(list(tmp_path.glob('x*.gguf')))}.gguf", m, {k: (w, None) for k, w in t.items()})


def assert_refused_in_one_line(path, fragment: str, monkeypatch, capsys) -> None:
    """qkv.load(PATH) refuses with one QkvError line holding FRAGMENT, and the CLI prints that one line, exit 2."""
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
    code, _, err = run_main(monkeypatch, capsys, "show", "the cat", "--model", str(path))
    assert code == 2 and err.startswith("qkv: error: ") and err.count("\n") == 1, err


def forward_equals_reference(model, ref) -> None:
    """MODEL's padded batch equals transformers' REF (a fixture's reference): logits and hidden within TOL_HIDDEN,
    attention weights on every real token within TOL_ATTENTION."""
    out = model.forward(ref["input_ids"], ref["attention_mask"])
    valid = ref["attention_mask"].astype(bool)
    assert max_abs(out.logits[valid], ref["logits"][valid]) <= TOL_HIDDEN
    assert max_abs(out.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN
    for b in range(len(valid)):
        assert max_abs(out.attentions[:, b][:, :, valid[b]], ref["attentions"][:, b][:, :, valid[b]]) <= TOL_ATTENTION


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class FakeReader:
    """What the tokenizer builders read of a GGUFReader, from plain arrays: fields[key].contents()."""

    def __init__(self, fields: dict):
        self.fields = {k: _Field(v) for k, v in fields.items()}

"""The stored-weight kernels kept on disk (runtime.kernel_cache): whatever the cache holds — entries compiled
by another process, by two at once, damaged or truncated files, no folder at all — every process computes the
right numbers and exits 0 (issue 42: Q4_0 → Q4_1 → Q4_1 was exit 0, 0, SIGSEGV).

Each run is a fresh interpreter (`CHILD`): a cache only matters between processes. Every child gets a private
QKV_CACHE (and NUMBA_CACHE_DIR, where numba's own cache would go)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import qkv

# A child: imports, says "ready", then for each line it reads on stdin computes the next group of kinds (groups
# are separated by "--" in its arguments) and prints one JSON line: each kind's relative error against the
# gguf package's dequantisation, one row of x (the parallel kernel) and 20 (dequantising), and the cache's
# counts over every numba dispatcher of the kernels (loaded from disk, compiled) and where each keeps them.
CHILD = r"""
import json, sys
import gguf, numpy as np
from numba.core.registry import CPUDispatcher
from qkv.runtime import stored
from qkv.runtime.stored import StoredMatrix

kernels = stored._kernels()
dispatchers = [f for f in vars(kernels).values() if isinstance(f, CPUDispatcher)]

def error(kind):
    rng = np.random.default_rng(0)
    k = getattr(gguf.GGMLQuantizationType, kind)
    raw = np.ascontiguousarray(gguf.quants.quantize(rng.standard_normal((96, 512)).astype(np.float32), k))
    raw = raw.view(np.uint8).reshape(96, -1)
    T = gguf.quants.dequantize(raw, k).astype(np.float32).reshape(96, 512)
    W = StoredMatrix(kind, raw, 512)
    worst = 0.0
    for rows in (1, 20):
        x = rng.standard_normal((rows, 512)).astype(np.float32)
        want = x @ T.T
        worst = max(worst, float(np.abs(x @ W - want).max() / np.abs(want).max()))
    return worst

groups = " ".join(sys.argv[1:]).split("--")
print("ready", flush=True)
for group in groups:
    if not sys.stdin.readline():
        break
    errors = {kind: error(kind) for kind in group.split()}
    stats = [d.stats for d in dispatchers]
    print(json.dumps({"errors": errors,
                      "loaded": sum(sum(s.cache_hits.values()) for s in stats),
                      "compiled": sum(sum(s.cache_misses.values()) for s in stats),
                      "paths": sorted({str(s.cache_path) for s in stats})}), flush=True)
"""

TOL = 1e-5                      # relative, as tests/test_stored.py
PACKAGE = Path(qkv.__file__).resolve().parent


def environment(cache: Path | str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QKV_", "NUMBA_"))}
    return dict(env, QKV_CACHE=str(cache), NUMBA_CACHE_DIR=str(Path(cache).with_name("numba")))


class Child:
    """A CHILD process computing GROUPS (lists of kinds): one group after each `go()`, its `result()` read."""

    def __init__(self, groups: list[list[str]], env: dict, log: Path):
        args = " -- ".join(" ".join(g) for g in groups).split()
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    def ready(self) -> None:
        line = self.proc.stdout.readline()
        assert line == "ready\n", self.failure(line)

    def go(self) -> None:
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise AssertionError(self.failure("")) from None

    def result(self) -> dict:
        line = self.proc.stdout.readline()
        try:
            return json.loads(line)
        except ValueError:
            raise AssertionError(self.failure(line)) from None

    def finish(self) -> None:
        self.proc.stdin.close()
        code = self.proc.wait()
        self.proc.stdout.close()
        assert code == 0, self.failure("")

    def failure(self, line: str) -> str:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        code = self.proc.wait()
        signal = " (SIGSEGV)" if code == -11 else ""
        return f"exit {code}{signal} after {line!r}; stderr:\n{self.log.read_text()[-3000:]}"


def run(groups: list[list[str]], cache: Path, log: Path) -> list[dict]:
    """One child, alone, through every group: its results."""
    child = Child(groups, environment(cache), log)
    child.ready()
    out = []
    for _ in groups:
        child.go()
        out.append(child.result())
    child.finish()
    return out


def right(result: dict) -> None:
    assert result["errors"] and all(e <= TOL for e in result["errors"].values()), result


def test_a_kind_that_shares_code_with_one_already_kept_runs_from_the_cache(tmp_path):
    """Q4_0, then Q4_1 (its code shared with Q4_0's, already on disk), then Q4_1 again, read from the disk."""
    cache = tmp_path / "cache"
    for n, kind in enumerate(["Q4_0", "Q4_1", "Q4_1"]):
        (result,) = run([[kind]], cache, tmp_path / f"{n}.log")
        right(result)
    assert result["loaded"] >= 1 and result["compiled"] == 0               # the last run compiled nothing


def test_two_processes_starting_together_on_an_empty_cache(tmp_path):
    """Two processes start at once on an empty cache, each compiling a kind; then (together again) each the kind
    that shares its code with the other's first, already on disk. All right; then each of these, first in a fresh
    process, is read from the disk and right."""
    cache = tmp_path / "cache"
    env = environment(cache)
    a = Child([["Q4_0"], ["Q5_1"]], env, tmp_path / "a.log")
    b = Child([["Q5_0"], ["Q4_1"]], env, tmp_path / "b.log")
    try:
        for child in (a, b):
            child.ready()
        for _ in range(2):
            for child in (a, b):                    # both go, then both answer: they compile at the same time
                child.go()
            for child in (a, b):
                right(child.result())
        for child in (a, b):
            child.finish()
    finally:
        for child in (a, b):
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
    for kind in ("Q4_1", "Q5_1"):
        (result,) = run([[kind]], cache, tmp_path / f"{kind}.log")
        right(result)
        assert result["loaded"] >= 1 and result["compiled"] == 0


def damage(path: Path, how: int) -> None:
    """Cut PATH to half, flip a byte in its middle, empty it, or put other bytes at its start."""
    data = bytearray(path.read_bytes())
    if how == 0:
        data = data[:len(data) // 2]
    elif how == 1:
        data[len(data) // 2] ^= 0x40
    elif how == 2:
        data = bytearray()
    else:
        data[:64] = os.urandom(64)
    path.write_bytes(bytes(data))


def test_damaged_or_truncated_cache_files_are_compiled_again(tmp_path):
    """Every file of a full cache damaged (each in two of four ways, over two runs): each run is right, exits 0,
    and writes the kernels again, so that the next one reads them all."""
    cache, kinds = tmp_path / "cache", ["Q4_1"]
    right(run([kinds], cache, tmp_path / "first.log")[0])
    for turn in range(2):
        files = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".log")   # numba's too
        assert files
        for n, path in enumerate(files):
            damage(path, (n + 2 * turn) % 4)
        right(run([kinds], cache, tmp_path / f"damaged{turn}.log")[0])
    (last,) = run([kinds], cache, tmp_path / "last.log")
    right(last)
    assert last["loaded"] >= 2 and last["compiled"] == 0                  # the product's kernel and dequantising


@pytest.mark.parametrize("where", ["unwritable", "off"])
def test_nothing_is_written_into_the_package_and_no_folder_is_no_cache(tmp_path, where):
    """A cache folder that cannot be made (QKV_CACHE under a file), or QKV_CACHE=off: the kernels are compiled and
    right (an unwritable folder warns once), and no dispatcher keeps anything inside the installed package."""
    blocker = tmp_path / "a file"
    blocker.write_text("")
    cache = blocker / "cache" if where == "unwritable" else "off"
    env = environment(cache)
    env.pop("NUMBA_CACHE_DIR")                                  # numba's own cache would go into the package
    child = Child([["Q4_1"]], env, tmp_path / "child.log")
    child.ready()
    child.go()
    result = child.result()
    child.finish()
    right(result)
    assert not any(p.startswith(str(PACKAGE)) for p in result["paths"]), result["paths"]
    log = (tmp_path / "child.log").read_text()
    if where == "unwritable":
        assert log.count("Warning: qkv: cannot keep compiled kernels") == 1, log
    assert result["compiled"] >= 1 and result["loaded"] == 0


# A child of llama.cpp's arithmetic: for each kind in its arguments, whether the compiled product (kept on disk or
# compiled here) is its definition's, bit for bit (one JSON line).
LLAMA_CHILD = r"""
import json, sys
import gguf, numpy as np
from qkv.runtime import llama_kernels
from qkv.runtime.llama_arith import llama_matvec
from qkv.runtime.stored import StoredMatrix

same = {}
for kind in sys.argv[1:]:
    rng = np.random.default_rng(0)
    raw = gguf.quants.quantize(rng.standard_normal((40, 256)).astype(np.float32), getattr(gguf.GGMLQuantizationType, kind))
    W = StoredMatrix(kind, np.ascontiguousarray(raw).view(np.uint8).reshape(40, -1), 256)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    y = np.empty((3, 40), np.float32)
    llama_kernels.MATVEC[kind](x, *W.bits, y)
    same[kind] = bool(np.array_equal(y.view(np.uint32), llama_matvec(W, x).view(np.uint32)))
print(json.dumps(same))
"""


def test_kernels_kept_by_two_processes_run_their_own_code_in_a_third(tmp_path):
    """llama.cpp arithmetic's Q4_0 and Q4_1 products, each compiled and kept by a process of its own, read back
    together by a third: each runs its own rows. Their row kernels come from one factory, and numba names a
    function by its name and an id that restarts in every process; under one name the third process ran Q4_0's
    rows for Q4_1 (a wrong product, silently) until each kind's were named apart (kernel_cache.named)."""
    env = environment(tmp_path / "cache")
    for kinds in (["Q4_0"], ["Q4_1"], ["Q4_0", "Q4_1"]):
        done = subprocess.run([sys.executable, "-c", LLAMA_CHILD, *kinds], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout) == {kind: True for kind in kinds}, (kinds, done.stdout)

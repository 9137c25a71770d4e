"""Memory of stored weights (issue 49): nothing dequantised or copied whole on the way from the file to a reply.

Structural checks, not resident-memory thresholds (those are `qkv bench memory`'s): a stored model, after
loading and writing, holds no float32 array the size of one of its matrices, nor a copy of its float16 scales
(the kernels widen them from the blocks); the embedding lookup
dequantises only the rows asked; a tied head multiplies the blocks; the numbers stay those of the exactly
dequantised float32 path.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import qkv
from qkv.runtime import stored
from qkv.runtime.stored import StoredMatrix, StoredTable
from conftest import FIXTURES
from test_stored import quantised


def _walk(obj, seen: set[int] | None = None):
    """Every array and stored matrix reachable from OBJ through dataclasses, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (int, float, str, bool)):
        return
    seen.add(id(obj))
    if isinstance(obj, (np.ndarray, StoredMatrix, StoredTable)):
        yield obj
        return
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else None
    if items is None and hasattr(obj, "__dataclass_fields__"):
        items = [getattr(obj, name) for name in obj.__dataclass_fields__]
    for x in items or ():
        yield from _walk(x, seen)


@pytest.fixture
def no_whole_dequantisation(monkeypatch):
    """Dequantising a stored matrix whole (W as an array) fails the test; the rows' and tiles' paths stay."""
    def whole(self, *a, **k):
        raise AssertionError(f"{self!r} was dequantised whole")

    monkeypatch.setattr(StoredMatrix, "dequantized", whole)
    monkeypatch.setattr(StoredMatrix, "_dense", whole)
    monkeypatch.setattr(StoredTable, "_dense", whole)


def _tiny_gguf(tmp_path, qtype: str = "Q8_0"):
    sys.path.insert(0, str(FIXTURES))
    import make_gguf_fixtures as F

    return F.make(tmp_path / f"{qtype}.gguf", "llama", qtype)          # tied embeddings


def _assert_holds_no_float32_matrix(model) -> None:
    """No float32 array as large as the smallest stored matrix anywhere in the model's weights."""
    things = list(_walk(model.weights))
    matrices = [t for t in things if isinstance(t, StoredMatrix)]
    assert matrices, "the model holds no stored matrix"
    smallest = min(m.d_in * m.d_out for m in matrices)
    big = [a.shape for a in things if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size >= smallest]
    assert not big, f"float arrays the size of a stored matrix: {big}"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "BF16"])
def test_a_stored_model_writes_without_a_whole_float_copy_of_any_matrix(tmp_path, qtype, no_whole_dequantisation):
    model = qkv.load(_tiny_gguf(tmp_path, qtype))
    W = model.weights
    assert isinstance(W.W_vocab, StoredMatrix) and isinstance(W.tok_embed, StoredTable)
    assert W.tok_embed.matrix is W.W_vocab                       # tied: one set of blocks, two uses
    out = model.generate([3, 17, 5, 40, 2, 9], 8, temperature=0, stop_at_eos=False)
    assert out.shape == (1, 14)
    _assert_holds_no_float32_matrix(model)


def test_smollm2_stored_loads_and_replies_without_a_whole_dequantisation(no_whole_dequantisation):
    model = qkv.load("smollm2")
    assert model.weights.tok_embed.matrix is model.weights.W_vocab and model.weights.W_vocab.kind == "Q8_0"
    assert model.generate(np.arange(1, 17)[None], 4, stop_at_eos=False).shape == (1, 20)
    _assert_holds_no_float32_matrix(model)


# parts that are not views of the blocks: a K-quant's 6-bit scales unpacked to bytes, Q5's fifth bits to uint32
UNPACKED = {"Q4_K": 2, "Q5_K": 2, "Q5_0": 1, "Q5_1": 1}


@pytest.mark.parametrize("kind", [k for k in stored.KINDS if k not in stored.HALVES])
def test_the_float16_scales_stay_in_the_blocks(kind):
    """No float32 copy of the scales: every float16 part (d, m, dmin) is a view of the rows' bytes, the kernels'
    `bits` uint16 views of the same bytes; only the parts named above are arrays of their own."""
    raw, T = quantised(kind)
    W = StoredMatrix(kind, raw, 512)
    halves = [p for p in W.parts if p.dtype == np.float16]
    assert all(np.shares_memory(p, raw) for p in halves)
    assert len(halves) == (2 if kind in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else 1)      # d (and m, dmin)
    assert not any(p.dtype == np.float32 for p in W.parts)
    assert all(np.shares_memory(b, raw) for b in W.bits if b.dtype == np.uint16)
    assert sum(not np.shares_memory(p, raw) for p in W.parts) == UNPACKED.get(kind, 0)
    for part in (W.rows(slice(10, 40)), W.rows(np.arange(96)[::-1])):          # a view of rows; rows re-ordered
        assert all(np.shares_memory(b, part.raw) for b in part.bits if b.dtype == np.uint16)
    x = np.random.default_rng(5).standard_normal((3, 512)).astype(np.float32)
    assert np.abs(x @ W - x @ T.T).max() <= 1e-5 * np.abs(x @ T.T).max()


def test_smollm2_holds_no_copy_of_a_scale():
    """The SmolLM2 file's Q4_1 and Q8_0 matrices, once loaded and laid out (Q, K, V and gate, up joined): every
    part of every stored matrix is a view of its blocks (the file's map, or the joined copy of them)."""
    model = qkv.load("smollm2")
    matrices = [t for t in _walk(model.weights) if isinstance(t, StoredMatrix)]
    assert {m.kind for m in matrices} == {"Q4_1", "Q8_0"}
    assert all(np.shares_memory(p, m.raw) for m in matrices for p in m.parts)


def test_the_widenings_of_a_float16_scale_are_numpys():
    """stored_kernels' ways of widening a scale's bits — moving the bits (an x86 without F16C) and, where the
    machine has one, its own conversion — give NumPy's float16 → float32 for every finite float16, zeros and
    subnormals included."""
    from numba import njit
    from qkv.runtime.stored_kernels import _converts_halves, _cvt_f16, _move_f16

    def widened(f):
        @njit
        def run(h, out):
            for i in range(h.shape[0]):
                out[i] = f(h[i])
        out = np.empty(h.shape, np.float32)
        run(h, out)
        return out.view(np.uint32)

    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    h = h[(h & 0x7C00) != 0x7C00]                                       # (63488,) every finite float16
    want = h.view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(widened(_move_f16), want)
    if _converts_halves():
        assert np.array_equal(widened(_cvt_f16), want)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1"])
def test_subnormal_and_zero_scales_multiply_exactly(kind):
    """Rows whose float16 scales d are ±zero, subnormal or the largest float16 multiply (one row of x: the kernel;
    many: the tiles) as the gguf package's dequantisation of the same bytes, each output within float32 rounding
    of its own Σ|x|·|w|."""
    import gguf

    raw, _ = quantised(kind)
    raw = raw.copy()
    size = stored.KINDS[kind][1]
    scales = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x0200, 0x7BFF, 0x0400, 0xFBFF], np.uint16)   # (8,)
    d = raw.reshape(raw.shape[0], -1, size)[:, :, 0:2].view("<u2")[..., 0]     # (96, 16) each block's d, its bits
    d[:] = scales[np.arange(d.shape[0]) % len(scales), None]                    # row o: scales[o % 8]
    T = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).astype(np.float32)   # (96, 512)
    W = StoredMatrix(kind, raw, 512)
    x = np.random.default_rng(6).standard_normal((12, 512)).astype(np.float32)
    want = x.astype(np.float64) @ T.T.astype(np.float64)                        # (12, 96)
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(T.T).astype(np.float64))
    for rows in (x[:1], x):
        assert np.all(np.abs(rows @ W - want[:len(rows)]) <= bound[:len(rows)])
    assert np.array_equal(W.dequantized_rows(), T)


def test_the_embedding_lookup_dequantises_only_the_rows_asked(monkeypatch):
    raw, T = quantised("Q8_0", rows=96, cols=512)
    table = StoredMatrix("Q8_0", raw, 512).T                       # (V 96, d 512), as a tied embedding
    asked = []
    real = StoredMatrix.dequantized_rows

    def counted(self, o0=0, o1=None, out=None):
        asked.append((self.d_out if o1 is None else o1) - o0)
        return real(self, o0, o1, out)

    monkeypatch.setattr(StoredMatrix, "dequantized_rows", counted)
    ids = np.array([[3, 95, 3], [0, 7, 60]])                          # (B, n), a repeat and both ends
    got = table[ids]                                                  # (B, n, d)
    assert got.shape == (2, 3, 512) and np.array_equal(got, T[ids])  # exactly the dequantised rows
    assert asked == [ids.size]                                        # those rows, once, not the 96


def test_rows_in_a_new_order_copy_the_bytes_once():
    """A permutation of rows (the converters' Q/K order) copies the rows' bytes once; its integer parts are
    views of that copy, not second copies."""
    for kind in ("Q4_1", "Q8_0", "Q6_K"):
        raw, T = quantised(kind)
        order = np.arange(96)[::-1]
        part = StoredMatrix(kind, raw, 512).rows(order)
        ints = [p for p in part.parts if p.dtype.kind in "iu" and p.dtype.itemsize == 1 and p.ndim == 3]
        assert ints and all(np.shares_memory(p, part.raw) for p in ints)
        assert np.array_equal(part.dequantized(), T[order].T)


def test_the_tied_head_multiplies_the_blocks_as_the_dequantised_table():
    """x @ W_vocab on one row and on many (a prompt's) equals the product with the exactly dequantised W."""
    raw, T = quantised("Q8_0", rows=96, cols=512)
    W = StoredMatrix("Q8_0", raw, 512)
    x = np.random.default_rng(2).standard_normal((20, 512)).astype(np.float32)
    want = x @ T.T
    for rows in (x[:1], x):
        got = rows @ W
        assert np.abs(got - want[:len(rows)]).max() <= 1e-5 * np.abs(want).max()


def test_a_sixteen_bit_matrix_is_checked_a_tile_at_a_time(monkeypatch):
    """The NaN/infinity check of 16-bit floats reads every row through small tiles: a bad value in the last
    tile is still found, and a clean matrix passes."""
    monkeypatch.setattr(stored, "TILE_VALUES", 3 * 300)              # 3 rows a tile
    F = np.random.default_rng(4).standard_normal((10, 300)).astype(np.float32)
    raw = stored.half_bytes(F, "BF16")
    widened = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)          # bfloat16 → float32, exactly
    assert np.array_equal(StoredMatrix("BF16", raw, 300).dequantized_rows(), widened)
    bad = raw.copy()
    bad[9, 598:600] = np.frombuffer(np.uint16(0x7FC0).tobytes(), np.uint8)         # a NaN in the last row
    with pytest.raises(qkv.QkvError, match="NaN or infinite values"):
        StoredMatrix("BF16", bad, 300)


def test_the_memory_benchmark_reads_the_reply_above_the_runtime():
    from qkv.bench import memory

    MB = 1_000_000
    stored_row = {"who": "qkv", "how": "stored", "seconds": 1.0, "base": 50 * MB, "peak": 170 * MB,
                  "held": 150 * MB, "reply_peak": 250 * MB, "reply_held": 240 * MB, "kinds": ["Q4_1"]}
    result = {"rows": [stored_row, {**stored_row, "how": "float32"}], "runtime": {"kinds": ["Q4_1"],
              "bytes": 60 * MB, "peak": 60 * MB}, "file_bytes": 100 * MB, "source": "x", "gguf": True,
              "machine": {"cpu": "a CPU", "cores": 2}}
    text = memory.markdown(result)
    # above the runtime: the peak is the load's 120 MB or the reply's 200 − 60 = 140; held 190 − 60 = 130
    assert "| above the runtime (libraries and kernels) | 140 | 1.40× | 130 | 1.30× |" in text
    assert "| above the libraries | 200 | 2.00× | 190 | 1.90× |" in text
    assert "Target (issue 49): ≤ 1.5× the file above the runtime, at peak and after the first reply (here 1.40×: met)" in text
    assert "Target: a stored load holds ≤ 1.5× the file (here 1.00×: met)" in text


def test_the_memory_benchmark_children_never_measure_the_tuning_again(monkeypatch):
    """Each child runs pinned (QKV_THREADS) to this process's tuning choices, so none measures them itself (100 MB
    of matrices that would count in the model's peak)."""
    import subprocess

    from qkv.bench import memory
    from qkv.runtime import tuning

    seen = []

    def run(args, env=None, **kw):
        seen.append(env)
        return subprocess.CompletedProcess(args, 0, stdout='{"peak": 1}\n', stderr="")

    monkeypatch.setattr(memory.subprocess, "run", run)
    assert memory._child("import qkv", "None") == {"peak": 1}
    want = tuning.choices().numbers()                                    # this process's (measured or cached)
    monkeypatch.setenv(tuning.ENV, seen[0][tuning.ENV])
    assert tuning.pinned() == want                                       # every choice pinned, to the same number

"""llama.cpp's arithmetic compiled (runtime.llama_kernels): bit for bit its definition,
runtime.llama_arith.llama_matvec, for every kind with a product there and any number of rows; and a StoredMatrix
multiplying with it (its `arith`)."""

from __future__ import annotations

import sys

import gguf
import numpy as np
import pytest

from qkv.runtime import llama_kernels, llama_simd, stored
from qkv.runtime.errors import QkvError
from qkv.runtime.llama_arith import PRODUCTS, PRODUCTS_K, llama_matvec
from qkv.runtime.stored import StoredMatrix
from conftest import FIXTURES

sys.path.insert(0, str(FIXTURES))
from make_gguf_fixtures import random_blocks   # noqa: E402  (gguf.quants cannot quantise K-quants)

D_IN, D_OUT = 160, 37                      # 5 blocks of 32; an odd count of output rows (two chunks of threads)
D_IN_K = 512                               # the K-quants: 2 super-blocks of 256
PACKED = 40                                # rows of a Q4_0 / Q4_K llama.cpp repacks (a multiple of 8; two chunks)


def d_in(kind: str) -> int:
    return D_IN_K if kind in PRODUCTS_K else D_IN


def matrix(kind: str, seed: int = 0, d_out: int = D_OUT) -> StoredMatrix:
    """A random W of KIND and D_OUT rows whose row 1 starts with a block of zeros (scale 0; a K-quant: random
    super-blocks with sane scales, the first of row 1 with d = 0)."""
    if kind in PRODUCTS_K:
        raw = random_blocks((d_out, D_IN_K), kind, seed)                           # (d_out, 2 super-blocks' bytes)
        at = 208 if kind == "Q6_K" else 0                                          # its float16 d
        raw[1, at:at + 2] = 0
        return StoredMatrix(kind, raw, D_IN_K)
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((d_out, D_IN)).astype(np.float32)
    t[1, :32] = 0
    raw = gguf.quants.quantize(t, getattr(gguf.GGMLQuantizationType, kind))
    return StoredMatrix(kind, np.ascontiguousarray(raw).view(np.uint8).reshape(d_out, -1), D_IN)


def activations(rows: int, seed: int, width: int = D_IN) -> np.ndarray:
    """Random rows with a block of zeros (row 0; of WIDTH 512, its second super-block too) and a block of ties (the
    last row: amax 127, so x·127/amax = x — Q8_K: iscale −1 — and halves round to even)."""
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32) * 3
    x[0, 32:64] = 0
    if width == D_IN_K:
        x[0, 256:] = 0
    x[-1, 64:96] = np.arange(32, dtype=np.float32) - 15.5                       # −15.5 … 15.5: every one a tie
    x[-1, 64] = 127
    return x


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    same = a.shape == b.shape and a.dtype == b.dtype == np.float32
    return same and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("kind", PRODUCTS)
@pytest.mark.parametrize("rows", [1, 2, 3, 9, 40])
def test_the_kernel_is_the_definition_bit_for_bit(kind, rows):
    w = matrix(kind, seed=rows)
    x = activations(rows, seed=rows + 1, width=d_in(kind))
    want = llama_matvec(w, x)                                                    # (R, d_out)
    got = np.empty((rows, D_OUT), np.float32)
    llama_kernels.MATVEC[kind](x, *w.bits, got)
    assert same_bits(got, want)
    assert not np.array_equal(want, x @ w.dequantized())                      # and it is not the exact product


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K"])
@pytest.mark.parametrize("rows", [1, 2, 4, 9, "tile"])
def test_a_repacked_kernel_is_the_definition_bit_for_bit(kind, rows):
    """A Q4_0 or Q4_K T whose rows are a multiple of 8 (llama_arith.repacked): each row's block summed whole, eight
    rows of T (decoding) or of x (a prompt) at a time for Q4_0, a Q4_K prompt's whole fours of rows a multiply-add a
    pair of sub-blocks ("tile": a tile of rows and part of one) — the definition's numbers, which are not the 8-lane
    order's (the same T less a row)."""
    width = d_in(kind)
    rows = llama_kernels.X_TILE // width + 11 if rows == "tile" else rows
    w = matrix(kind, seed=rows, d_out=PACKED)
    x = activations(rows, seed=rows + 1, width=width)
    want = llama_matvec(w, x)                                                    # (R, 40)
    got = np.empty((rows, PACKED), np.float32)
    llama_kernels.MATVEC[kind](x, *w.bits, got)
    assert same_bits(got, want)
    lanes = llama_matvec(StoredMatrix(kind, np.ascontiguousarray(w.raw[:PACKED - 1]), width), x)
    assert not np.array_equal(lanes, want[:, :PACKED - 1])


def test_float16_rounding_is_numpys():
    """d and s are rounded to float16 in the kernel by frexp/ldexp: ties to even, subnormals, overflow as NumPy's."""
    tiny, step = 2.0 ** -14, 2.0 ** -24
    values = [0.0, -0.0, 1 / 127, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, -(1.0 + 2 ** -11), 65504.0, 65519.99, 65520.0,
              1e9, tiny, tiny - step / 2, 3.5 * step, 2.5 * step, step / 2, step / 2 * 1.0001, 1e-30, -7e-6]
    for v in np.array(values, np.float32):
        with np.errstate(over="ignore"):                                         # 65520 and 1e9: infinity
            half = v.astype(np.float16).astype(np.float32)
        assert np.array_equal(np.float32(llama_kernels._fp16(v)).view(np.uint32), half.view(np.uint32)), v


def test_both_float16_roundings_are_numpys():
    """_fp16 by the CPU's conversion (F16C) and by frexp/ldexp: NumPy's astype(float16) on every scale of float32,
    float16's subnormals, its overflow and ties."""
    rng = np.random.default_rng(0)
    scales = [np.float32(2.0 ** e) for e in range(-30, 20, 3)]
    v = np.concatenate([rng.standard_normal(20000).astype(np.float32) * s for s in scales])
    ties = (np.arange(1, 2048, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0 ** -24)   # halfway, subnormal
    v = np.concatenate([v, ties, -ties, np.array([0, -0.0, 65504, 65519.99, 65520, np.inf], np.float32)])
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).astype(np.float32).view(np.uint32)
    for rounding in (llama_kernels._fp16, llama_kernels._fp16_by_frexp):
        got = np.array([rounding(a) for a in v[::97]] + [rounding(a) for a in v[-4100:]], np.float32)
        assert np.array_equal(got.view(np.uint32), np.concatenate([want[::97], want[-4100:]]))


@pytest.mark.parametrize("kind", PRODUCTS)
def test_a_stored_matrix_multiplies_with_its_arithmetic(kind, monkeypatch):
    w = matrix(kind)
    x = activations(6, seed=7, width=d_in(kind)).reshape(2, 3, d_in(kind))      # (B, n, d_in)
    exact = x @ w
    w.arith = "llama.cpp"
    want = llama_matvec(w, x)                                                    # (2, 3, d_out)
    assert same_bits(x @ w, want)
    part = w.rows(slice(3, 20))                                                  # views and copies of rows keep it
    assert part.arith == w.rows(np.arange(5)).arith == "llama.cpp"
    assert same_bits(x @ part, want[..., 3:20])
    monkeypatch.setattr(stored, "numba", None)                                   # without numba: the definition
    assert same_bits(x @ w, want)
    monkeypatch.undo()
    w.arith = "exact"
    assert same_bits(x @ w, exact)


def test_a_kind_without_a_product_is_refused():
    rng = np.random.default_rng(0)
    w = StoredMatrix("F16", rng.standard_normal((4, 64)).astype("<f2").view(np.uint8), 64)
    w.arith = "llama.cpp"
    with pytest.raises(QkvError, match="F16"):
        np.ones((1, 64), np.float32) @ w


def _ways() -> list[str]:
    """The ways of multiplying bytes (llama_simd.MULTIPLY) this CPU can run: each compiled and run here."""
    have = set(llama_simd._features().split(","))
    ways = ["generic"]
    if "+avx2" in have:
        ways.append("avx2")
    if "+avxvnni" in have or {"+avx512vnni", "+avx512vl"} <= have:
        ways.append("vnni")
    return ways


@pytest.mark.parametrize("how", _ways())
def test_each_way_of_multiplying_bytes_gives_the_lanes(how):
    """dot, udot and sdot, as vpdpbusd, vpmaddubsw + vpmaddwd or plain LLVM vectors: lane k the exact Σ of products
    4k..4k+3, at the extremes of the weights' and activations' ranges too (w = −128, x = ±127, int8 scales ±127)."""
    from numba import njit

    dot, udot, sdot = llama_simd._dot(how), llama_simd._udot(how), llama_simd._sdot(how)

    @njit
    def lanes(w, u, x, s, out):
        for i in range(w.shape[0]):
            llama_simd.lstore(dot(llama_simd.bytes32(w[i]), llama_simd.bytes32(x[i])), out[i, 0])
            llama_simd.lstore(udot(llama_simd.bytes32(u[i]), llama_simd.bytes32(x[i])), out[i, 1])
            lane = sdot(llama_simd.bytes32(u[i]), llama_simd.bytes32(x[i]), np.int32(s[i, 0]), np.int32(s[i, 1]))
            llama_simd.lstore(lane, out[i, 2])

    rng = np.random.default_rng(0)
    n = 64
    w = rng.integers(-128, 128, (n, 32)).astype(np.int8)
    x = rng.integers(-127, 128, (n, 32)).astype(np.int8)
    u = rng.integers(0, 64, (n, 32)).astype(np.int8)                           # the K-quants' weights: 0..63
    s = rng.integers(-127, 128, (n, 2)).astype(np.int8)
    w[0], x[0], u[0], s[0] = -128, 127, 63, 127                                # the largest sums
    w[1], x[1], s[1] = -128, -127, -127
    w[2, ::2] = 0                                                               # the sign trick's zeros
    out = np.empty((n, 3, 8), np.int32)
    lanes(w, u, x, s, out)
    four = lambda a: (a.astype(np.int64) * x).reshape(n, 8, 4).sum(-1)       # noqa: E731  (n, 8)
    scale = np.repeat(s.astype(np.int64), 4, axis=1)                            # (n, 8): s0 in lanes 0–3, s1 in 4–7
    assert np.array_equal(out[:, 0], four(w))
    assert np.array_equal(out[:, 1], four(u))
    assert np.array_equal(out[:, 2], four(u) * scale)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K"])
def test_a_prompt_longer_than_a_tile_of_rows(kind):
    """More rows of x than a tile holds (llama_kernels.X_TILE bytes of them): each tile against every row of T."""
    w = matrix(kind, seed=3)
    rows = llama_kernels.X_TILE // d_in(kind) + 11                             # a whole tile and part of one
    x = activations(rows, seed=4, width=d_in(kind))
    got = np.empty((rows, D_OUT), np.float32)
    llama_kernels.MATVEC[kind](x, *w.bits, got)
    assert same_bits(got, llama_matvec(w, x))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q4_K", "Q6_K"])
def test_accumulators_far_from_the_next_block_round_as_the_definition(kind):
    """Blocks much larger or much smaller than what the accumulators hold (10⁵ against 1), where a sum rounded
    twice (through float64) would differ from the fused multiply-add's one rounding: the machine's vfmadd231ps
    and the definition's `_fma32` give the same bits."""
    w = matrix(kind, seed=5)
    width = d_in(kind)
    per = 256 if kind in PRODUCTS_K else 32
    x = activations(4, seed=6, width=width)
    x[0, :per] *= 1e-5                                                           # tiny first block, then normal
    x[1, per:] *= 1e-5                                                           # normal first block, then tiny
    x[2].reshape(-1, per)[::2] *= 1e-5                                           # tiny and normal in turn
    got = np.empty((4, D_OUT), np.float32)
    llama_kernels.MATVEC[kind](x, *w.bits, got)
    assert same_bits(got, llama_matvec(w, x))


_AVX2_CHECK = r"""
import sys
import numpy as np
sys.path[:0] = sys.argv[1:3]
from qkv.runtime import llama_kernels, llama_simd
from qkv.runtime.llama_arith import PRODUCTS, llama_matvec
import test_llama_kernels as t
assert llama_simd.MULTIPLY == "avx2", llama_simd.MULTIPLY
cases = [(kind, t.D_OUT) for kind in PRODUCTS] + [("Q4_0", t.PACKED), ("Q4_K", t.PACKED)]
part, parts = map(int, sys.argv[3:5])                     # this child's share of the cases
for kind, d_out in cases[part::parts]:
    for rows in (1, 9):                                   # 9: a Q4_K's two fours and one more
        w, x = t.matrix(kind, seed=rows, d_out=d_out), t.activations(rows, seed=rows + 1, width=t.d_in(kind))
        got = np.empty((rows, d_out), np.float32)
        llama_kernels.MATVEC[kind](x, *w.bits, got)
        assert t.same_bits(got, llama_matvec(w, x)), (kind, rows)
print("ok", *[f"{kind}/{d_out}" for kind, d_out in cases[part::parts]])
"""


def test_the_avx2_kernels_are_the_definition_too(tmp_path):
    """On a CPU with AVX-512 VNNI the kernels multiply bytes with vpdpbusd; an AVX2-only CPU (most x86 machines
    qkv meets) takes vpmaddubsw + vpmaddwd. A child process told its CPU has AVX2 but no AVX-512 (numba's
    NUMBA_CPU_FEATURES) compiles that path whole, and every kind is still the definition bit for bit."""
    import os
    import subprocess
    from pathlib import Path

    have = llama_simd._features().split(",")
    if "+avx2" not in have:
        pytest.fail("this test needs an x86 CPU with AVX2 (every machine qkv's CI runs on has it)")
    features = ",".join(f for f in have if not f.startswith(("+avx512", "+avxvnni", "+amx")))
    env = dict(os.environ, NUMBA_CPU_FEATURES=features, QKV_CACHE=str(tmp_path / "cache"))
    tests = Path(__file__).parent
    children = [subprocess.Popen([sys.executable, "-c", _AVX2_CHECK, str(tests), str(FIXTURES), str(part), "2"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for part in (0, 1)]                                       # each compiles half the kinds, side by side
    checked = []
    for child in children:
        out, err = child.communicate(timeout=1800)
        assert child.returncode == 0 and out.startswith("ok "), err[-2000:]
        checked += out.split()[1:]
    assert sorted(checked) == sorted([f"{kind}/{D_OUT}" for kind in PRODUCTS] + [f"Q4_0/{PACKED}", f"Q4_K/{PACKED}"])

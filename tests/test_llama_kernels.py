"""llama.cpp's arithmetic compiled (runtime.llama_kernels): bit for bit its definition,
runtime.llama_arith.llama_matvec, for every kind with a product there and any number of rows; and a StoredMatrix
multiplying with it (its `arith`)."""

from __future__ import annotations

import sys

import gguf
import numpy as np
import pytest

from qkv.runtime import llama_kernels, stored
from qkv.runtime.errors import QkvError
from qkv.runtime.llama_arith import PRODUCTS, PRODUCTS_K, llama_matvec
from qkv.runtime.stored import StoredMatrix
from conftest import FIXTURES

sys.path.insert(0, str(FIXTURES))
from make_gguf_fixtures import random_blocks   # noqa: E402  (gguf.quants cannot quantise K-quants)

D_IN, D_OUT = 160, 37                      # 5 blocks of 32; an odd count of output rows (two chunks of threads)
D_IN_K = 512                               # the K-quants: 2 super-blocks of 256


def d_in(kind: str) -> int:
    return D_IN_K if kind in PRODUCTS_K else D_IN


def matrix(kind: str, seed: int = 0) -> StoredMatrix:
    """A random W of KIND whose row 1 starts with a block of zeros (scale 0; a K-quant: random super-blocks with sane
    scales, the first of row 1 with d = 0)."""
    if kind in PRODUCTS_K:
        raw = random_blocks((D_OUT, D_IN_K), kind, seed)                           # (d_out, 2 super-blocks' bytes)
        at = 208 if kind == "Q6_K" else 0                                          # its float16 d
        raw[1, at:at + 2] = 0
        return StoredMatrix(kind, raw, D_IN_K)
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((D_OUT, D_IN)).astype(np.float32)
    t[1, :32] = 0
    raw = gguf.quants.quantize(t, getattr(gguf.GGMLQuantizationType, kind))
    return StoredMatrix(kind, np.ascontiguousarray(raw).view(np.uint8).reshape(D_OUT, -1), D_IN)


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


def test_float16_rounding_is_numpys():
    """d and s are rounded to float16 in the kernel by frexp/ldexp: ties to even, subnormals, overflow as NumPy's."""
    tiny, step = 2.0 ** -14, 2.0 ** -24
    values = [0.0, -0.0, 1 / 127, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, -(1.0 + 2 ** -11), 65504.0, 65519.99, 65520.0,
              1e9, tiny, tiny - step / 2, 3.5 * step, 2.5 * step, step / 2, step / 2 * 1.0001, 1e-30, -7e-6]
    for v in np.array(values, np.float32):
        with np.errstate(over="ignore"):                                         # 65520 and 1e9: infinity
            half = v.astype(np.float16).astype(np.float32)
        assert np.array_equal(np.float32(llama_kernels._fp16(v)).view(np.uint32), half.view(np.uint32)), v


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

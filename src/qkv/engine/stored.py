"""Weight matrices kept as a GGUF file stores them: quantisation blocks, read in place, never dequantised whole.

A GGUF weight is T (d_out, d_in): each row a run of blocks along d_in, each block 32 numbers as small
integers q with a scale d (and a minimum m), in ggml's layouts:

    Q8_0   d (f16), q int8 [32]                     w = d · q                          8.5 bits a weight
    Q4_0   d, 16 bytes of nibbles                   w = d · (q − 8)                    4.5
    Q4_1   d, m, 16 bytes of nibbles                w = d · q + m                      5
    Q5_0   d, 32 high bits, 16 bytes of nibbles     w = d · (q − 16), q = nibble | hbit·16   5.5
    Q5_1   d, m, 32 high bits, nibbles              w = d · q + m                      6
    (a block's first 16 numbers are the low nibbles of its 16 bytes, the last 16 the high ones)

`StoredMatrix` is W = Tᵀ (d_in, d_out), as the engine's weights are: `x @ W` for x (..., d_in) works as
with an array, and its numbers are the product with the exactly dequantised float32 W, accumulated in
float32 (activations are never quantised; within ~1e-6 relative of the dequantise-then-multiply path,
`tests/test_stored.py` checks it against the `gguf` package's own dequantisation):

    one row or a few (decoding)   numba kernels stream the blocks once, over two chunks of output rows:
                                  y[o] = Σ_b d[o,b]·Σ_j x_j·q_j (+ m[o,b]·Σ_j x_j), the products of a
                                  block summed in SIMD lanes (SmolLM2 Q4_1: ~10 G weights/s here)
    many rows (a prompt)          a tile of T's rows dequantised into a reused float32 buffer, then BLAS

The blocks stay views into the file's memory map (the quantised bytes are never copied); the scales and
minimums are unpacked once to float32 (4 bytes each per 32 weights). Without numba (a dependency of
qkv's; a machine without it still runs) the products dequantise tiles with the `gguf` package and are correct, and slower. The
kernels are in `stored_kernels` (numba itself takes half a second to import: only a stored model does).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np

from .errors import QkvError

BLOCK = 32
# kind: (bytes per block, has a minimum m, has 32 high bits)
KINDS = {"Q8_0": (34, False, False), "Q4_0": (18, False, False), "Q4_1": (20, True, False),
         "Q5_0": (22, False, True), "Q5_1": (24, True, True)}
FEW_ROWS = 8                    # up to this many rows of x: the streaming kernel; more: tiles and BLAS
TILE_VALUES = 1 << 20           # dequantised numbers per tile of the many-row path (4 MiB of float32)

numba = importlib.util.find_spec("numba")     # the kernels' compiler (stored_kernels), imported on first use


def _kernels():
    from . import stored_kernels

    return stored_kernels


class _ReadAsArray(np.lib.mixins.NDArrayOperatorsMixin):
    """What reads a stored matrix outside the engine's products (analysis, views, saving, astype) reads its
    dequantised float32 array: ufuncs and operators, indexing, W @ y, reshape, astype. Correct, and as slow as making
    the array; the products the engine runs never take this way."""

    def _dense(self) -> np.ndarray:
        raise NotImplementedError

    def __array__(self, dtype=None, copy=None):
        w = self._dense()
        return w if dtype is None else w.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        if (ufunc is np.matmul and method == "__call__" and len(inputs) == 2 and inputs[1] is self and not kw
                and isinstance(self, StoredMatrix)):
            return self.__rmatmul__(inputs[0])                     # x @ W: the stored product
        dense = tuple(np.asarray(i) if isinstance(i, _ReadAsArray) else i for i in inputs)
        if "out" in kw:
            kw["out"] = tuple(np.asarray(o) if isinstance(o, _ReadAsArray) else o for o in kw["out"])
        return getattr(ufunc, method)(*dense, **kw)

    def __matmul__(self, other):
        return self._dense() @ other

    def __getitem__(self, index):
        return self._dense()[index]

    def __len__(self) -> int:
        return self.shape[0]

    def astype(self, dtype, copy: bool = True) -> np.ndarray:
        return self._dense().astype(dtype)

    def copy(self) -> np.ndarray:
        return self._dense()

    def reshape(self, *shape) -> np.ndarray:
        return self._dense().reshape(*shape)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    ndim = 2


class StoredMatrix(_ReadAsArray):
    """W (d_in, d_out) = Tᵀ of a GGUF block-quantised tensor T (d_out, d_in), kept as its blocks.

    raw: (d_out, blocks · bytes) uint8, the file's rows (a view into its memory map). `x @ W` multiplies;
    `rows(index)` selects rows of T (output columns of W: a split or a permutation, as the converters make);
    `dequantized()` is the float32 W, for code that reads weights as numbers (analysis; slow, whole)."""

    def __init__(self, kind: str, raw: np.ndarray, d_in: int):
        if kind not in KINDS:
            raise QkvError(f"GGUF type {kind} is not kept stored; qkv keeps {', '.join(KINDS)}")
        size, has_min, has_high = KINDS[kind]
        if d_in % BLOCK or raw.ndim != 2 or raw.shape[1] != d_in // BLOCK * size:
            raise QkvError(f"a {kind} tensor of {d_in} columns needs rows of {d_in // BLOCK * size} bytes, "
                           f"got {raw.shape}; the file is damaged")
        self.kind, self.raw, self.d_in, self.d_out = kind, raw, d_in, raw.shape[0]
        blocks = raw.reshape(self.d_out, d_in // BLOCK, size)              # (out, nb, bytes) a view
        self.scale = blocks[:, :, 0:2].copy().view("<f2")[..., 0].astype(np.float32)   # (out, nb)
        at = 2
        self.min = None
        if has_min:
            self.min = blocks[:, :, 2:4].copy().view("<f2")[..., 0].astype(np.float32)
            at = 4
        self.high = None
        if has_high:
            self.high = blocks[:, :, at:at + 4].copy().view("<u4")[..., 0]                 # (out, nb) bits
            at += 4
        self.q = blocks[:, :, at:]                                          # (out, nb, 16 or 32) a view
        if kind == "Q8_0":
            self.q = self.q.view(np.int8)
        if not (np.isfinite(self.scale).all() and (self.min is None or np.isfinite(self.min).all())):
            raise QkvError(f"a {kind} tensor holds NaN or infinite scales; the file is damaged")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.d_in, self.d_out)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)                 # what its products are

    @property
    def nbytes(self) -> int:
        """The bytes a product reads: the blocks, and the unpacked float32 scales."""
        return self.q.size * self.q.itemsize + sum(a.nbytes for a in (self.scale, self.min, self.high) if a is not None)

    def rows(self, index) -> "StoredMatrix":
        """The rows INDEX of T (a slice, or an array of row numbers) as a StoredMatrix of their own."""
        return StoredMatrix(self.kind, self.raw[index], self.d_in)

    @staticmethod
    def joined(parts: list["StoredMatrix"]) -> "StoredMatrix":
        """Matrices of one kind and d_in side by side (W = [W_1 | W_2 | ...]): their rows of T stacked."""
        kinds = {(p.kind, p.d_in) for p in parts}
        if len(kinds) != 1:
            raise QkvError(f"cannot join stored matrices of different kinds or widths: {sorted(kinds)}")
        return StoredMatrix(parts[0].kind, np.concatenate([p.raw for p in parts]), parts[0].d_in)

    # the numbers ------------------------------------------------------------------

    def dequantized_rows(self, o0: int = 0, o1: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """T[o0:o1] as float32 (o1 - o0, d_in): rows of the dequantised tensor (a table's embeddings)."""
        o1 = self.d_out if o1 is None else o1
        out = np.empty((o1 - o0, self.d_in), np.float32) if out is None else out[:o1 - o0]
        if numba is None:
            _gguf_dequantize(self, o0, o1, out)
        else:
            _kernels().DEQUANT[self.kind](*self._parts(o0, o1), out)
        return out

    def dequantized(self) -> np.ndarray:
        """W (d_in, d_out) float32, whole."""
        return np.ascontiguousarray(self.dequantized_rows().T)

    def _dense(self) -> np.ndarray:
        return self.dequantized()

    @property
    def T(self) -> "StoredTable":
        """T itself (d_out, d_in): a table whose rows are read dequantised (an embedding table)."""
        return StoredTable(self)

    def take(self, ids: np.ndarray) -> np.ndarray:
        """Rows IDS of T, dequantised: (len(ids), d_in) — a GGUF embedding table's rows for these tokens."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return self.rows(ids).dequantized_rows()

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        """x (..., d_in) @ W → (..., d_out) float32."""
        x = np.asarray(x)
        if x.shape[-1] != self.d_in:
            raise ValueError(f"matmul: x has {x.shape[-1]} columns, W has {self.d_in} rows")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, self.d_in), dtype=np.float32)    # (R, d_in)
        R = x2.shape[0]
        if R <= FEW_ROWS and numba is not None:
            y = np.empty((R, self.d_out), np.float32)
            sums = x2.reshape(R, -1, BLOCK).sum(axis=-1)                          # (R, nb) Σ x of each block
            _kernels().MATVEC[self.kind](x2, sums, *self._parts(0, self.d_out), y)
        else:
            y = np.empty((R, self.d_out), np.float32)
            step = max(1, TILE_VALUES // self.d_in)
            tile = np.empty((min(step, self.d_out), self.d_in), np.float32)
            for o0 in range(0, self.d_out, step):
                o1 = min(self.d_out, o0 + step)
                y[:, o0:o1] = x2 @ self.dequantized_rows(o0, o1, tile).T     # (a strided out= skips BLAS)
        return y.reshape(*lead, self.d_out)

    def _parts(self, o0: int, o1: int) -> tuple:
        q = self.q[o0:o1]
        scale = self.scale[o0:o1]
        extra = {"Q8_0": (), "Q4_0": (), "Q4_1": (self.min[o0:o1] if self.min is not None else None,),
                 "Q5_0": (self.high[o0:o1] if self.high is not None else None,),
                 "Q5_1": (self.min[o0:o1] if self.min is not None else None,
                          self.high[o0:o1] if self.high is not None else None)}[self.kind]
        return (q, scale, *extra)

    def __repr__(self) -> str:
        return f"StoredMatrix({self.kind}, W {self.d_in} × {self.d_out})"


class StoredTable(_ReadAsArray):
    """T (d_out, d_in) of a StoredMatrix: `table[ids]` is those rows dequantised (ids of any shape → (..., d_in)),
    `.T` the StoredMatrix again (a tied LM head and embedding table share one set of blocks)."""

    def __init__(self, matrix: StoredMatrix):
        self.matrix = matrix

    shape = property(lambda self: (self.matrix.d_out, self.matrix.d_in))
    dtype = property(lambda self: np.dtype(np.float32))
    T = property(lambda self: self.matrix)
    nbytes = property(lambda self: self.matrix.nbytes)

    def __getitem__(self, index):
        """Rows by token ids (an integer array: only those rows dequantised), anything else as an array's."""
        ids = np.asarray(index) if not isinstance(index, (slice, tuple)) else None
        if ids is not None and ids.dtype.kind in "iu" and (ids.size == 0 or (0 <= ids.min() and ids.max() < self.shape[0])):
            return self.matrix.take(ids).reshape(*ids.shape, self.matrix.d_in)
        return self._dense()[index]

    def _dense(self) -> np.ndarray:
        return self.matrix.dequantized_rows()


def _gguf_dequantize(m: StoredMatrix, o0: int, o1: int, out: np.ndarray) -> None:
    """The gguf package's dequantisation of rows o0..o1 (the path without numba)."""
    import gguf

    kind = getattr(gguf.GGMLQuantizationType, m.kind)
    out[:] = gguf.quants.dequantize(np.ascontiguousarray(m.raw[o0:o1]), kind).reshape(o1 - o0, m.d_in)


def bits_per_weight(kind: str) -> float:
    """What a weight of KIND costs in the file: its block's bits over 32 weights."""
    return KINDS[kind][0] * 8 / BLOCK


def stored_bytes(kind: str, d_out: int, d_in: int) -> int:
    return d_out * math.ceil(d_in / BLOCK) * KINDS[kind][0]

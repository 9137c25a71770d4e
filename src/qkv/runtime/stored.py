"""Weight matrices kept as a file stores them: GGUF quantisation blocks or 16-bit floats, read in place.

A GGUF weight is T (d_out, d_in): each row a run of blocks along d_in, each block small integers q with
scales, in ggml's layouts (a block of 32 weights, or a K-quant's super-block of 256 in sub-blocks):

    Q8_0   d (f16), q int8 [32]                               w = d · q                        8.5 bits a weight
    Q4_0   d, 16 bytes of nibbles                             w = d · (q − 8)                  4.5
    Q4_1   d, m, 16 bytes of nibbles                          w = d · q + m                    5
    Q5_0   d, 32 high bits, 16 bytes of nibbles               w = d · (q − 16)                 5.5
    Q5_1   d, m, 32 high bits, nibbles                        w = d · q + m                    6
    Q4_K   d, dmin, 8 × 6-bit (scale, min), 128 B nibbles     w = d·scale·q − dmin·min         4.5
    Q5_K   the same and 32 bytes of fifth bits                                                 5.5
    Q6_K   128 B low nibbles, 64 B 2-bit highs, 16 int8 scales, d    w = d·scale·(q − 32)      6.5625
    F16, BF16   each weight its own 16-bit float (bfloat16: a float32's top half)             16

`StoredMatrix` is W = Tᵀ (d_in, d_out), as the engine's weights are: `x @ W` for x (..., d_in) works as
with an array, and its numbers are the product with the exactly dequantised float32 W, accumulated in
float32 (activations are never quantised; within ~1e-6 relative of the dequantise-then-multiply path,
`tests/test_stored.py` checks every kind against the `gguf` package's own dequantisation):

    one row or a few (decoding)   numba kernels stream the blocks once, over two chunks of output rows:
                                  y[o] = Σ_b d[o,b]·Σ_j x_j·q_j (+ m[o,b]·Σ_j x_j), the products of a
                                  block summed in SIMD lanes (SmolLM2 Q4_1: ~10 G weights/s here)
    many rows (a prompt)          a tile of T's rows dequantised into a reused float32 buffer, then BLAS

That is the `exact` arithmetic (the default). With `arith = "llama.cpp"` (qkv.load(…, arith="llama.cpp")) a
product quantises x to 8 bits a block and multiplies integers as llama.cpp does (runtime.llama_arith, the
definition; runtime.llama_kernels, compiled and bit-equal to it), for Q4_0, Q5_0, Q8_0, Q4_1, Q5_1, Q4_K, Q5_K and Q6_K.

The blocks stay views into the file's memory map (the quantised bytes are never copied), their float16
scales too: `parts` reads them as float16 numbers, `bits` as their uint16 bits, which the kernels widen to
float32 exactly as they read a block (float32 copies took 4 bytes a block: +40 % of a Q4_1 file). Copied:
a K-quant's packed 6-bit scales, as bytes (16 a block of 256), and Q5's fifth bits, as whole uint32s. Without
numba (a dependency of qkv's; a machine without it still runs) the products dequantise tiles with the
`gguf` package and are correct, and slower. The kernels are in `stored_kernels` (numba itself takes half
a second to import: only a stored model does).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np

from .errors import QkvError

# kind: (weights a block holds, bytes it takes)
KINDS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
         "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "F16": (1, 2), "BF16": (1, 2)}
HALVES = ("F16", "BF16")        # 16-bit floats: a weight's own two bytes (bfloat16: a float32's top half)
FEW_ROWS = 8                    # up to this many rows of x: the streaming kernel; more: tiles and BLAS
TILE_VALUES = 1 << 20           # dequantised numbers per tile of the many-row path (4 MiB of float32)
ARITHS = ("exact", "llama.cpp")  # what `x @ W` computes (StoredMatrix.arith)

numba = importlib.util.find_spec("numba")     # the kernels' compiler (stored_kernels), imported on first use


_compiled = None
_llama = None


def _kernels():
    """runtime.stored_kernels, imported once (an import statement costs microseconds each product)."""
    global _compiled
    if _compiled is None:
        from . import stored_kernels

        _compiled = stored_kernels
    return _compiled


def _llama_kernels():
    """runtime.llama_kernels (llama.cpp's arithmetic compiled), imported once."""
    global _llama
    if _llama is None:
        from . import llama_kernels

        _llama = llama_kernels
    return _llama


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

    def copy(self, order: str = "C") -> np.ndarray:
        return np.array(self._dense(), order=order)

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
    `dequantized()` is the float32 W, for code that reads weights as numbers (analysis; slow, whole).
    arith: what `x @ W` computes — "exact" (the dequantised float32 product) or "llama.cpp" (x quantised to 8 bits
    a block and multiplied as llama.cpp does: runtime.llama_arith, compiled in llama_kernels); qkv.load sets it."""

    arith = "exact"

    def __init__(self, kind: str, raw: np.ndarray, d_in: int):
        if kind not in KINDS:
            raise QkvError(f"GGUF type {kind} is not kept stored; qkv keeps {', '.join(KINDS)}")
        per, size = KINDS[kind]
        if d_in % per or raw.ndim != 2 or raw.shape[1] != d_in // per * size:
            need = f"rows of {d_in // per * size} bytes" if d_in % per == 0 else f"a multiple of {per} columns"
            raise QkvError(f"a {kind} tensor of {d_in} columns needs {need}, got {raw.shape}; the file is damaged")
        self.kind, self.raw, self.d_in, self.d_out = kind, raw, d_in, raw.shape[0]
        self.parts = _unpack(kind, raw.reshape(self.d_out, d_in // per, size))    # each (d_out, blocks, ...)
        self.bits = _bits(self.parts)
        if not all(np.isfinite(p).all() for p in self.parts if p.dtype.kind == "f"):
            raise QkvError(f"a {kind} tensor holds NaN or infinite scales; the file is damaged")
        if kind in HALVES and _any_not_finite(kind, self.parts[0]):
            raise QkvError(f"a {kind} tensor holds NaN or infinite values; the file is damaged")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.d_in, self.d_out)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)                 # what its products are

    @property
    def nbytes(self) -> int:
        """The bytes a product reads: the blocks' (a K-quant's unpacked 6-bit scales and Q5's fifth bits as copied)."""
        return sum(p.size * p.itemsize for p in self.parts)

    def rows(self, index) -> "StoredMatrix":
        """The rows INDEX of T (a slice: views of these blocks; an array of row numbers: a copy of those
        rows) as a StoredMatrix of their own."""
        if not isinstance(index, slice):                 # the rows' bytes copied once, their parts views of them
            index = np.asarray(index, dtype=np.int64)     # (indexing each part would copy the integers twice)
            part = StoredMatrix(self.kind, self.raw[index], self.d_in)
            part.arith = self.arith
            return part
        part = StoredMatrix.__new__(StoredMatrix)
        part.kind, part.raw, part.d_in, part.arith = self.kind, self.raw[index], self.d_in, self.arith
        part.d_out = part.raw.shape[0]
        part.parts = tuple(p[index] for p in self.parts)
        part.bits = _bits(part.parts)
        return part

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
        if self.kind in HALVES and numba is None:
            _halves_to_float32(self.kind, self.parts[0][o0:o1], out)
        elif numba is None:
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
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous):
            x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape[-1] != self.d_in:
            raise ValueError(f"matmul: x has {x.shape[-1]} columns, W has {self.d_in} rows")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in)                                             # (R, d_in)
        R = x2.shape[0]
        y = np.empty((R, self.d_out), np.float32)
        if self.arith == "llama.cpp":                                              # any R: x quantised once
            if numba is not None and self.kind in _llama_kernels().MATVEC:
                _llama_kernels().MATVEC[self.kind](x2, *self.bits, y)
            else:                                                                  # the definition (refuses
                from .llama_arith import llama_matvec                              # kinds without a product)

                y[:] = llama_matvec(self, x2)
        elif R <= FEW_ROWS and numba is not None:
            _kernels().MATVEC[self.kind](x2, *self.bits, y)
        else:
            step = max(1, TILE_VALUES // self.d_in)
            tile = np.empty((min(step, self.d_out), self.d_in), np.float32)
            for o0 in range(0, self.d_out, step):
                o1 = min(self.d_out, o0 + step)
                y[:, o0:o1] = x2 @ self.dequantized_rows(o0, o1, tile).T     # (a strided out= skips BLAS)
        return y.reshape(*lead, self.d_out)

    def _parts(self, o0: int, o1: int) -> tuple:
        return tuple(p[o0:o1] for p in self.bits)

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
    """What a weight of KIND costs in the file: its block's bits over its weights."""
    per, size = KINDS[kind]
    return size * 8 / per


def stored_bytes(kind: str, d_out: int, d_in: int) -> int:
    per, size = KINDS[kind]
    return d_out * math.ceil(d_in / per) * size


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte AT of every block (d_out, blocks, bytes): (d_out, blocks) float16, a view of the blocks."""
    return blocks[:, :, at:at + 2].view("<f2")[..., 0]


def _bits(parts: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """PARTS as the kernels take them: float16 scales as their uint16 bits (views; numba has no float16)."""
    return tuple(p.view(np.uint16) if p.dtype == np.float16 else p for p in parts)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit minimums → two (d_out, blocks, 8) uint8:
    bytes 0–3 hold scales 0–3 (low 6 bits) and the top 2 bits of scales 4–7, 4–7 the same for the
    minimums, 8–11 the low 4 bits of scales 4–7 (low nibble) and of minimums 4–7 (high nibble)."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scale = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    low = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return np.ascontiguousarray(scale), np.ascontiguousarray(low)


_EXPONENT = {"F16": np.uint16(0x7C00), "BF16": np.uint16(0x7F80)}    # all ones: infinity or NaN


def _any_not_finite(kind: str, bits: np.ndarray) -> bool:
    """Whether 16-bit floats (their bits, uint16 (rows, d_in)) hold a NaN or infinity: checked a tile of rows at
    a time, so the check's temporaries stay a few MB (whole, they took 3 bytes a weight: 1.5× the matrix)."""
    every = _EXPONENT[kind]
    step = max(1, TILE_VALUES // max(1, bits.shape[1]))
    return any(bool((bits[r:r + step] & every == every).any()) for r in range(0, bits.shape[0], step))


def _halves_to_float32(kind: str, bits: np.ndarray, out: np.ndarray) -> None:
    """16-bit floats (their bits, uint16 (rows, d_in)) → float32 into OUT, exactly."""
    if kind == "F16":
        out[:] = bits.view(np.float16)
    else:
        np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)


def half_bytes(w: np.ndarray, kind: str) -> np.ndarray:
    """A float matrix T (d_out, d_in) as KIND's bytes (d_out, 2·d_in) uint8: float16 as NumPy rounds, bfloat16
    rounded to nearest even (as torch rounds), for a float32 checkpoint asked to be held in 16 bits."""
    if kind == "F16":
        return np.ascontiguousarray(w, dtype="<f2").view(np.uint8)
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return rounded.astype("<u2").view(np.uint8)


def _unpack(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """A kind's blocks (d_out, blocks, bytes) → the arrays its kernels take, in their order: the integer
    bytes and the float16 scales (d, m, dmin) stay views of the file; packed 6-bit scales become bytes.

        Q8_0  q int8 [32], d                    Q4_K  q [128], d, dmin, scales, mins   (8 sub-blocks of 32:
        Q4_0  q [16], d                               w = d·scale·q − dmin·min)
        Q4_1  q [16], d, m                      Q5_K  q [128], high bits [32], d, dmin, scales, mins
        Q5_0  q [16], d, high bits uint32       Q6_K  low nibbles [128], high pairs [64], scales int8 [16], d
        Q5_1  q [16], d, m, high bits                 (16 sub-blocks of 16: w = d·scale·(q − 32))
    """
    if kind in HALVES:
        return (blocks.reshape(blocks.shape[0], -1).view("<u2"),)     # (d_out, d_in) the bits, a view
    if kind == "Q8_0":
        return blocks[:, :, 2:].view(np.int8), _f16(blocks, 0)
    if kind == "Q4_0":
        return blocks[:, :, 2:], _f16(blocks, 0)
    if kind == "Q4_1":
        return blocks[:, :, 4:], _f16(blocks, 0), _f16(blocks, 2)
    if kind == "Q5_0":
        return blocks[:, :, 6:], _f16(blocks, 0), blocks[:, :, 2:6].copy().view("<u4")[..., 0]
    if kind == "Q5_1":
        return blocks[:, :, 8:], _f16(blocks, 0), _f16(blocks, 2), blocks[:, :, 4:8].copy().view("<u4")[..., 0]
    if kind == "Q4_K":
        return (blocks[:, :, 16:], _f16(blocks, 0), _f16(blocks, 2), *_k_scales(blocks[:, :, 4:16]))
    if kind == "Q5_K":
        return (blocks[:, :, 48:], blocks[:, :, 16:48], _f16(blocks, 0), _f16(blocks, 2),
                *_k_scales(blocks[:, :, 4:16]))
    return blocks[:, :, :128], blocks[:, :, 128:192], blocks[:, :, 192:208].view(np.int8), _f16(blocks, 208)

"""A GGUF file's tensors read in place (a stored load, GGUF's default): its quantised matrices as the
file's own blocks (runtime.stored), everything else dequantised to float32 when it is read.

`GGUFTensors(directory)` is a tensor store (the interface of tensors.TensorStore) over the GGUF file a
described directory stands for (gguf_cache.described: config.json and the tokenizer, no model.safetensors).
A matrix the file holds as one of runtime.stored.KINDS is answered as a `StoredTable` (its (out, in) rows
as blocks, views of the file's memory map; `.T` the StoredMatrix W the loaders take). The converter's
row changes (`gguf_archs.hf_tensors`: Q/K un-permuted, fused rows split) are applied to the rows'
numbers, never to the values. Norms, biases and float matrices are dequantised as they are read, so
nothing is ever converted whole and no float32 copy of the model is written.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.stored import KINDS, StoredMatrix, StoredTable, half_bytes
from .gguf import _dequantised, _vocab_size, parse, source_of
from .tensors import ByName, check_finite

HALF_MAX = float(np.finfo(np.float16).max)       # 65504: a float32 matrix held as float16 must fit


class GGUFTensors(ByName):
    def __init__(self, directory: Path):
        path = source_of(directory)
        if path is None:
            raise QkvError('dtype="stored" keeps a GGUF file\'s blocks; give a .gguf file (or "smollm2")')
        p = parse(path, vocab_size=_vocab_size(directory))
        self.data = p.reader.data                  # the file's memory map (the reader's metadata is let go)
        self._where: dict[str, tuple] = {}         # hf name → (GGUF tensor, its shape, hf shape, fn)
        self._table = self._where
        self._stored: dict[str, StoredMatrix] = {}
        self.read: set[str] = set()
        for t, shape, plan in p.plans:
            matrix = None
            if t.tensor_type.name in KINDS and len(shape) == 2:
                d_out, d_in = shape
                matrix = StoredMatrix(t.tensor_type.name, np.asarray(t.data).view(np.uint8).reshape(d_out, -1), d_in)
            for hf, hf_shape, fn in plan:
                self._where[hf] = (t, shape, hf_shape, fn)
                rows = self._rows(matrix, shape, hf_shape, fn)
                if rows is not None:
                    self._stored[hf] = rows
            if matrix is not None:
                self._drop_pages(t.data)        # its scales are read: the file is never resident whole at once
        self._last: tuple[object, np.ndarray] | None = None    # the last tensor dequantised (a fused one's parts)

    @staticmethod
    def _rows(matrix: StoredMatrix | None, shape, hf_shape, fn) -> StoredMatrix | None:
        """The plan's tensor as rows of MATRIX (a StoredMatrix of those rows), or None when it is not rows
        of the file (a transposed Conv1D, a vector) or MATRIX is None."""
        if matrix is None or len(hf_shape) != 2 or hf_shape[1] != shape[1] or hf_shape[0] > shape[0]:
            return None                                              # (more rows than the file's: joined with another)
        with np.errstate(all="ignore"):                              # (a plan of values, not rows: refused below)
            rows = fn(np.arange(shape[0], dtype=np.float64)[:, None])  # the plan on a column of row numbers
        if rows.shape != (hf_shape[0], 1):
            return None
        if not np.isfinite(rows).all() or np.any(rows != np.round(rows)) or np.any((rows < 0) | (rows >= shape[0])):
            return None                                              # not rows but values changed (Mamba's log(−A))
        order = rows[:, 0].astype(np.int64)
        if np.array_equal(order, np.arange(shape[0])):
            return matrix
        if len(order) and np.array_equal(order, np.arange(order[0], order[0] + len(order))):
            return matrix.rows(slice(int(order[0]), int(order[0]) + len(order)))     # a view: no copy
        return matrix.rows(order)

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32):
        """Tensor NAME checked against the shape the config implies: a StoredTable for a quantised matrix,
        else its float32 values as DTYPE."""
        full = self.find(name)
        if full is None:
            raise QkvError(f"the GGUF file has no tensor for {name!r}; it does not match its architecture")
        t, t_shape, hf_shape, fn = self._where[full]
        if tuple(hf_shape) != tuple(shape):
            raise QkvError(f"tensor {full} has shape {tuple(hf_shape)} but the config implies {tuple(shape)}")
        self.read.add(full)
        if full in self._stored:
            return StoredTable(self._stored[full])
        if self._last is None or self._last[0] is not t:
            self._last = (t, _dequantised(t, t_shape))
        value = fn(self._last[1])
        arr = np.ascontiguousarray(value, dtype=dtype).reshape(np.shape(value))     # (a 0-d value stays 0-d)
        check_finite(full, arr)
        return arr

    def _drop_pages(self, data: np.ndarray) -> None:
        """Drop the pages of DATA (a view of the file's memory map) from this process (MADV_DONTNEED: clean
        pages of a file, read again from it when a product needs them)."""
        mm = getattr(self.data, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED") or not data.size:
            return
        page = mmap.PAGESIZE
        into = self.data.offset % mmap.ALLOCATIONGRANULARITY            # where np.memmap's array begins in its map
        start = data.ctypes.data - self.data.ctypes.data + into          # DATA's first byte in the map
        first = start // page * page                 # (a page it shares with the tensor before is dropped too:
        end = (start + data.nbytes) // page * page   #  read again if needed; the one it shares with the next stays)
        if end > first:
            mm.madvise(mmap.MADV_DONTNEED, first, end - first)

    def release(self) -> None:
        """Drop the file's pages from this process (MADV_DONTNEED; clean file pages, mapped again when a
        product reads them): after a load has read every tensor, the blocks count once."""
        self._last = None
        mm = getattr(self.data, "_mmap", None)
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)


class HalfTensors:
    """A tensor store whose matrices (2-D tensors) are held in 16 bits: `qkv.load(..., dtype="bfloat16")`,
    "float16", or "stored" for a safetensors checkpoint (kept as the file has them: 16-bit matrices as
    their bytes, float32 ones as they are). A matrix the file holds in the asked kind is its own bytes,
    mapped (TensorStore.get_stored); any other is rounded into that kind once (runtime.stored.half_bytes).
    Vectors (norms, biases) stay float32."""

    def __init__(self, store, kind: str | None):
        self.store, self.kind = store, kind              # kind: "BF16", "F16", or None (what the file has)

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32):
        if len(shape) == 2 and hasattr(self.store, "get_stored"):
            table = self.store.get_stored(name, shape)
            if table is not None and hasattr(self.store, "release"):
                self.store.release()                     # its check read every page: they need not stay
            if table is not None and self.kind in (None, table.matrix.kind):
                return table
        arr = self.store.get(name, shape, dtype)
        if self.kind is None or len(shape) != 2 or not isinstance(arr, np.ndarray):
            return arr
        if self.kind == "F16" and arr.size and float(np.abs(arr).max()) > HALF_MAX:
            raise QkvError(f"tensor {name} holds values beyond float16's range (|x| up to "
                           f"{float(np.abs(arr).max()):.3g}, float16 stops at {HALF_MAX:g}); hold the weights as "
                           "bfloat16 or float32 (qkv --weights bfloat16)")
        return StoredTable(StoredMatrix(self.kind, half_bytes(arr, self.kind), shape[1]))

    def __getattr__(self, name):
        return getattr(self.store, name)

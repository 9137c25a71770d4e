"""`qkv.load(gguf, dtype="stored")`: a converted GGUF directory's tensors, its quantised matrices answered as
the file's own blocks (engine.stored) instead of their float32 copies.

`StoredTensors(store, directory)` wraps the directory's TensorStore: `get` of a matrix the GGUF file holds
as Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 gives a `StoredTable` (its (out, in) rows as blocks; `.T` the StoredMatrix W
the loaders take), everything else the float32 tensor of the conversion. The converter's row changes
(`gguf_archs.hf_tensors`: Q/K unpermuted, fused rows split) are applied to the rows' numbers, never to
the values. Only the float32 tensors (norms, biases, F32/F16 matrices) are read from the conversion; the
conversion is still written whole (its matrices' pages are never touched: a later step drops them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..engine.errors import QkvError
from ..engine.stored import KINDS, StoredMatrix, StoredTable
from . import gguf_archs
from .gguf import hf_config, mixtral_view
from .gguf_reader import metadata, open_reader


class StoredTensors:
    def __init__(self, store, directory: Path):
        source = directory / "qkv_source.json"
        if not source.is_file():
            raise QkvError('dtype="stored" keeps a GGUF file\'s blocks; give a .gguf file (or "smollm2")')
        path = Path(json.loads(source.read_text())["gguf"])
        reader = open_reader(path)
        meta = mixtral_view(metadata(reader))
        _, dims = hf_config(meta)
        a = meta["general.architecture"]
        self.store, self.stored = store, {}
        for t in reader.tensors:
            kind = t.tensor_type.name
            if kind not in KINDS or len(t.shape) != 2:
                continue
            d_in, d_out = int(t.shape[0]), int(t.shape[1])
            matrix = StoredMatrix(kind, np.asarray(t.data).reshape(d_out, -1), d_in)
            try:
                plan = gguf_archs.hf_tensors(a, t.name, (d_out, d_in), dims)
            except KeyError:
                continue
            for hf, shape, fn in plan:
                rows = fn(np.arange(d_out, dtype=np.float64)[:, None])   # the plan on a column of row numbers
                if rows.shape != (shape[0], 1) or tuple(shape) != (shape[0], d_in):
                    continue                                 # transposed (Conv1D): not rows of the file
                order = rows[:, 0].astype(np.int64)
                full = store.find(hf)
                if full is not None:
                    self.stored[full] = matrix if np.array_equal(order, np.arange(d_out)) else matrix.rows(order)

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32):
        full = self.store.find(name)
        if full in self.stored:
            m = self.stored[full]
            if (m.d_out, m.d_in) != tuple(shape):
                raise QkvError(f"tensor {full} has shape {(m.d_out, m.d_in)} but config.json implies {tuple(shape)}")
            self.store.read.add(full)
            return StoredTable(m)
        return self.store.get(name, shape, dtype)

    def __getattr__(self, name):
        return getattr(self.store, name)

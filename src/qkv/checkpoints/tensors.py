"""Reading safetensors files: memory-mapped, zero-copy for float32, never pickle.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw bytes. We map the file and view each
tensor in place; sharded checkpoints list their files in model.safetensors.index.json.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from ..errors import QkvError

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}

# Where a task model keeps its base model's tensors (BertForMaskedLM: "bert.", Llama: "model.").
_PREFIXES = ("", "model.", "bert.", "transformer.")


def _read_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise QkvError(f"{path} is not a safetensors file (too short); re-download or re-save the checkpoint")
        (size,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(size))
            ok = isinstance(header, dict) and all(
                isinstance(v, dict) and {"dtype", "shape", "data_offsets"} <= v.keys()
                for k, v in header.items() if k != "__metadata__")
        except (ValueError, MemoryError, OverflowError):
            ok = False
        if not ok:
            raise QkvError(f"{path} is not a safetensors file (bad header); re-download or re-save it")
    return header, 8 + size


class TensorStore:
    """All tensors of a checkpoint directory, by name, as NumPy views of mapped files."""

    def __init__(self, directory: Path):
        single = directory / "model.safetensors"
        index = directory / "model.safetensors.index.json"
        if single.is_file():
            files = [single]
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({directory / f for f in weight_map.values()})
        else:
            found = sorted(p.name for p in directory.glob("*.safetensors"))
            if len(found) == 1:
                files = [directory / found[0]]
            elif list(directory.glob("*.bin")) or list(directory.glob("*.pt")):
                raise QkvError(f"{directory} has only pickle weights (.bin/.pt), which qkv never loads; "
                               "save the model with safe_serialization=True to get model.safetensors")
            else:
                raise QkvError(f"{directory} has no model.safetensors; give a checkpoint directory in "
                               "Hugging Face layout (config.json + model.safetensors)")
        self._where: dict[str, tuple[mmap.mmap, dict, int]] = {}
        self._maps = []
        for path in files:
            if not path.is_file():
                raise QkvError(f"shard {path.name} named in the index is missing; download all shards")
            header, start = _read_header(path)
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps.append(mm)
            for name, info in header.items():
                if name != "__metadata__":
                    self._where[name] = (mm, info, start)

    def release(self) -> None:
        """Drop the mapped files' pages from this process (MADV_DONTNEED; clean file pages, so a
        later read maps them again): after copying tensors out, they need not count twice."""
        for mm in self._maps:
            if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)

    def find(self, name: str) -> str | None:
        """The stored name of tensor `name`, trying the usual base-model prefixes."""
        for p in _PREFIXES:
            if p + name in self._where:
                return p + name
        return None

    def has(self, name: str) -> bool:
        return self.find(name) is not None

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """Tensor `name` as `dtype`, checked against the shape the config implies."""
        stored = self.find(name)
        if stored is None:
            raise QkvError(f"the checkpoint has no tensor {name!r}; it does not match its config.json "
                           "(wrong family or a partial download)")
        mm, info, start = self._where[stored]
        kind = info["dtype"]
        if kind not in _DTYPES:
            raise QkvError(f"tensor {stored} has dtype {kind}, which qkv cannot read; save the model in float32/16")
        got = tuple(info["shape"])
        if got != tuple(shape):
            raise QkvError(f"tensor {stored} has shape {got} but config.json implies {tuple(shape)}; "
                           "the checkpoint and its config disagree")
        begin, end = info["data_offsets"]
        if start + end > len(mm):
            raise QkvError(f"tensor {stored} is truncated (the file ends early); re-download the checkpoint")
        raw = np.frombuffer(mm, dtype=_DTYPES[kind], count=int(np.prod(got, dtype=np.int64)), offset=start + begin)
        if end - begin != raw.nbytes:
            raise QkvError(f"tensor {stored} is truncated; re-download the checkpoint")
        if kind == "BF16":                                # bfloat16 = the top half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        arr = raw.reshape(got)
        return arr if arr.dtype == dtype else arr.astype(dtype)

"""Reading and writing safetensors files: memory-mapped, zero-copy for float32, never pickle.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw bytes. We map the file and view each
tensor in place; sharded checkpoints list their files in model.safetensors.index.json.

    TensorStore(directory)    the tensors of a checkpoint directory, by name (mapped files)
    TensorDict(tensors)       the same interface over a dict of arrays in memory (views, no copies)
    write_safetensors(f, …)   a dict of arrays → one safetensors file

Both stores remember which tensors were read (`names()` and `read`), so the loader can refuse a
checkpoint holding tensors nothing read (families.read_weights).
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path
from typing import IO

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io_json import read_json

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}

# Where a task model keeps its base model's tensors (BertForMaskedLM: "bert.", Llama: "model.").
PREFIXES = ("", "model.", "bert.", "transformer.", "gpt_neox.", "roberta.", "distilbert.", "electra.", "vit.",
            "albert.", "mpnet.", "deberta.", "nomic_bert.", "longformer.", "esm.")


_FLOATS = ("F64", "F32", "F16", "BF16")
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items() if k != "BF16"}           # numpy dtype → safetensors name
_ITEMSIZE = {"BF16": 2, **{k: np.dtype(v).itemsize for k, v in _DTYPES.items() if k != "BF16"}}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_entries(path: Path, header: dict, data_size: int) -> None:
    """Every tensor entry: a known dtype, a shape of non-negative ints, two ordered offsets inside
    the data that hold exactly the shape's bytes, no two tensors sharing bytes, and the tensors covering
    the data from its first byte to its last without a gap: the format requires it (the safetensors library
    refuses a hole or trailing bytes: "invalid offset", "file not fully covered"), so no bytes hide
    between or after the tensors."""
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        kind, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(kind, str) or kind not in _DTYPES:
            raise QkvError(f"{path.name}: tensor {name!r} has dtype {kind!r}, which qkv cannot read; "
                           "save the model in float32/16")
        if not (isinstance(shape, list) and all(_is_int(n) and n >= 0 for n in shape)):
            raise QkvError(f"{path.name}: tensor {name!r} has a bad shape {shape!r:.40}; re-download or re-save it")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size):
            raise QkvError(f"{path.name}: tensor {name!r} has bad data_offsets {offsets!r:.40} "
                           f"(the data holds {data_size} bytes); re-download or re-save it")
        if offsets[1] - offsets[0] != math.prod(shape) * _ITEMSIZE[kind]:
            raise QkvError(f"{path.name}: tensor {name!r} has {offsets[1] - offsets[0]} bytes but its shape "
                           f"{tuple(shape)} needs {math.prod(shape) * _ITEMSIZE[kind]}; re-download or re-save it")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise QkvError(f"{path.name}: tensors {a!r} and {b!r} overlap in the file; re-download or re-save it")
    covered = 0                                      # the data's bytes the tensors so far cover, from the start
    for begin, end, name in spans:
        if begin != covered:
            raise QkvError(f"{path.name}: tensor {name!r} starts at byte {begin} of the data, not {covered} "
                           "(the bytes between are no tensor's); re-download or re-save it")
        covered = end
    if covered != data_size:
        raise QkvError(f"{path.name}: the data holds {data_size} bytes but its tensors cover {covered} (the rest "
                       "is no tensor's); re-download or re-save it")


def _read_header(path: Path) -> tuple[dict, int]:
    total = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise QkvError(f"{path} is not a safetensors file (too short); re-download or re-save the checkpoint")
        (size,) = struct.unpack("<Q", raw)
        ok = size <= total - 8
        if ok:
            try:
                header = json.loads(f.read(size))
                ok = isinstance(header, dict) and all(
                    isinstance(v, dict) and {"dtype", "shape", "data_offsets"} <= v.keys()
                    for k, v in header.items() if k != "__metadata__")
            except (ValueError, MemoryError, OverflowError, RecursionError):
                ok = False
        if not ok:
            raise QkvError(f"{path} is not a safetensors file (bad header); re-download or re-save it")
    _check_entries(path, header, total - 8 - size)
    return header, 8 + size


def _read_index(index: Path) -> list[str]:
    """The shard file names of a sharded checkpoint's model.safetensors.index.json."""
    try:                                          # bounded and checked (size, UTF-8, an object, depth): io_json
        weight_map = read_json(index, what="it", fix="").get("weight_map")
    except QkvError as e:
        raise QkvError(f"{index.name} is not a safetensors index ({str(e).split('; ')[0]}); re-download the "
                       "checkpoint") from None
    if not (isinstance(weight_map, dict) and weight_map
            and all(isinstance(f, str) and f and Path(f).name == f for f in weight_map.values())):
        raise QkvError(f"{index.name} is not a safetensors index (it needs a weight_map from tensor names "
                       "to shard files in the same directory); re-download the checkpoint")
    return sorted(set(weight_map.values()))


class ByName:
    """What every tensor store answers from its table of tensors by name (`_table`): the names, and a name
    found under the usual base-model prefixes."""

    _table: dict

    def names(self) -> list[str]:
        """The stored name of every tensor."""
        return list(self._table)

    def find(self, name: str) -> str | None:
        """The stored name of tensor `name`, trying the usual base-model prefixes."""
        return _find(self._table, name)

    def has(self, name: str) -> bool:
        return self.find(name) is not None


class TensorStore(ByName):
    """All tensors of a checkpoint directory, by name, as NumPy views of mapped files."""

    def __init__(self, directory: Path):
        """DIRECTORY: a checkpoint directory, or one .safetensors file (an SAE's sae_weights.safetensors)."""
        single = directory / "model.safetensors"
        index = directory / "model.safetensors.index.json"
        if directory.suffix == ".safetensors" and directory.is_file():
            files = [directory]
        elif single.is_file():
            files = [single]
        elif index.is_file():
            files = [directory / f for f in _read_index(index)]
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
        self._table = self._where
        self._maps = []
        self.read: set[str] = set()                     # stored names `get` has handed out
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

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The shape tensor NAME has in the file (its header), None if there is no such tensor."""
        stored = self.find(name)
        return None if stored is None else tuple(self._where[stored][1]["shape"])

    def release(self) -> None:
        """Drop the mapped files' pages from this process (MADV_DONTNEED; clean file pages, so a
        later read maps them again): after copying tensors out, they need not count twice."""
        for mm in self._maps:
            if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """Tensor `name` as `dtype`, checked against the shape the config implies."""
        stored = self.find(name)
        if stored is None:
            raise QkvError(f"the checkpoint has no tensor {name!r}; it does not match its config.json "
                           "(wrong family or a partial download)")
        mm, info, start = self._where[stored]
        kind = info["dtype"]
        if kind not in _FLOATS:
            raise QkvError(f"tensor {stored} has dtype {kind}, but weights must be floats; "
                           "save the model in float32/16")
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
        if arr.dtype != dtype:
            with np.errstate(over="ignore", invalid="ignore"):      # said below, in one line, if it overflowed
                cast = arr.astype(dtype)
            if not np.isfinite(cast).all() and np.isfinite(arr).all():
                raise QkvError(f"tensor {stored} holds values beyond {np.dtype(dtype).name}'s range (|x| up to "
                               f"{float(np.abs(arr).max()):.3g}); the checkpoint is corrupt (re-save the model after "
                               "fixing its weights)")
            arr = cast
        check_finite(stored, arr)
        self.read.add(stored)
        return arr


    def get_stored(self, name: str, shape: tuple[int, ...]):
        """Matrix NAME as the file stores it, when that is 16-bit floats: a StoredTable over its bytes (a view
        of the mapped file, nothing converted); None for anything else (then `get` reads it)."""
        stored = self.find(name)
        if stored is None or len(shape) != 2:
            return None
        mm, info, start = self._where[stored]
        if info["dtype"] not in ("F16", "BF16") or tuple(info["shape"]) != tuple(shape):
            return None
        from ..runtime.stored import StoredMatrix, StoredTable

        begin, end = info["data_offsets"]
        if start + end > len(mm):
            raise QkvError(f"tensor {stored} is truncated (the file ends early); re-download the checkpoint")
        raw = np.frombuffer(mm, dtype=np.uint8, count=end - begin, offset=start + begin).reshape(shape[0], -1)
        self.read.add(stored)
        return StoredTable(StoredMatrix(info["dtype"], raw, shape[1]))


def _find(names, name: str) -> str | None:
    """The stored name of tensor `name` among NAMES, trying the usual base-model prefixes."""
    for p in PREFIXES:
        if p + name in names:
            return p + name
    return None


class TensorDict(ByName):
    """A TensorStore over a dict of arrays in memory: `get` hands out the dict's own arrays (no copy),
    so weights built from it are views of the dict (an in-place update of one shows in the other)."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = self._table = tensors
        self.read: set[str] = set()

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """Tensor `name` itself, checked against the shape the config implies and the dtype asked for."""
        stored = self.find(name)
        if stored is None:
            raise QkvError(f"no tensor {name!r}; the tensors do not match the config (wrong family or names)")
        arr = self.tensors[stored]
        if arr.shape != tuple(shape):
            raise QkvError(f"tensor {stored} has shape {arr.shape} but the config implies {tuple(shape)}; "
                           "the tensors and the config disagree")
        if arr.dtype != dtype:
            raise QkvError(f"tensor {stored} is {arr.dtype}, not {np.dtype(dtype)}; give every tensor one float type")
        self.read.add(stored)
        return arr


def write_safetensors(f: IO[bytes], tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """TENSORS (name → array; float, int or bool) as a safetensors file into F, in name order.

    The header is padded with spaces to a multiple of 8 bytes, as the `safetensors` library
    writes it, so every tensor starts 8-byte aligned; values are written little-endian, C order.
    """
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    arrays, offset = [], 0
    for name in sorted(tensors):
        arr = np.asarray(tensors[name])
        kind = _NAMES.get(arr.dtype.newbyteorder("="))                  # the type, whatever its byte order
        if kind is None:
            raise QkvError(f"tensor {name} has dtype {arr.dtype}, which safetensors cannot hold; use float32")
        arr = np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C")   # C order; a 0-d tensor stays 0-d
        header[name] = {"dtype": kind, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        arrays.append(arr)
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for arr in arrays:
        f.write(arr.reshape(-1).view(np.uint8))                       # the bytes, no copy


def check_finite(name: str, arr: np.ndarray) -> None:
    """Refuse a tensor holding NaN or ±Inf, by name. One float64 sum per tensor: it cannot overflow
    on float32 values and carries any NaN/Inf through, so finite tensors cost one pass and no copy."""
    total = np.add.reduce(arr, axis=None, dtype=np.float64)
    if not np.isfinite(total) and not np.isfinite(arr).all():
        raise QkvError(f"tensor {name} holds NaN or infinite values; the checkpoint is corrupt "
                       "(re-download it, or re-save the model after fixing its weights)")

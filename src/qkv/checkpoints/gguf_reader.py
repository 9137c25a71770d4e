"""Reading a GGUF file with ggml-org's `gguf` package, safely: one clear error for anything
that is not an intact GGUF file, whatever its header declares.

gguf.GGUFReader's failure modes, audited (gguf 0.19): a wrong magic or version, an unknown
value or tensor type, a duplicate key or tensor name, a bad `general.alignment`, a tensor
whose bytes do not fill its shape raise ValueError or KeyError; an empty file cannot be
mapped (ValueError), a directory cannot be opened (IsADirectoryError). But reading past
the end of the file does not fail — its `_get` returns a short (often empty) array — so a
truncated header fails later with an IndexError, and an array whose header declares 2⁶²
one-byte items loops forever. The reader here is the package's with its primitive read
checked (see `_reader_class`); `open_reader` turns every exception of it into one QkvError.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError


def _reader_class():
    """gguf.GGUFReader with a checked, faster primitive read (the format is still the package's).

    The package reads every value through `_get`, which slices the file's np.memmap: past
    the end it returns a short array instead of failing, and np.memmap's slicing costs
    ~5 µs a call (2 s for SmolLM2's 49152 token strings and 48900 merges). Here `_get`
    slices a plain ndarray view of the same map (4× faster, the same dtypes: a test checks
    both readers agree) and raises when the bytes are not there; arrays and counts are
    checked against the bytes left before any loop over them starts.
    """
    import gguf

    min_size = {t: np.dtype(d).itemsize for t, d in gguf.GGUFReader.gguf_scalar_to_np.items()}
    min_size |= {gguf.GGUFValueType.STRING: 8, gguf.GGUFValueType.ARRAY: 12}
    itemsize: dict = {}
    array = int(gguf.GGUFValueType.ARRAY)              # a plain int: Enum attribute lookups are slow
    native = "<" if sys.byteorder == "little" else ">"

    class Reader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            size = itemsize.get(dtype) or itemsize.setdefault(dtype, np.dtype(dtype).itemsize)
            end = offset + size * count
            if offset < 0 or count < 0 or end > len(plain):
                raise ValueError(f"it ends before byte {end} (it has {len(plain)} bytes)")
            arr = plain[offset:end].view(dtype)
            order = self.byte_order if override_order is None else override_order
            return arr if order in ("I", native) else arr.view(arr.dtype.newbyteorder(order))

        def _left(self, offset: int) -> int:
            return len(self.data) - offset

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type == array:
                item_type, count = int(self._get(orig_offs, np.uint32)[0]), int(self._get(orig_offs + 4, np.uint64)[0])
                if count * min_size.get(item_type, 1) > self._left(orig_offs + 12):
                    raise ValueError(f"an array declares {count} items, more than the file holds")
            return super()._get_field_parts(orig_offs, raw_type)

        def _build_fields(self, offs, count):
            if int(count) * 13 > self._left(offs):         # key length 8, ≥ 1 byte of key, type 4
                raise ValueError(f"it declares {int(count)} metadata keys, more than the file holds")
            return super()._build_fields(offs, count)

        def _build_tensor_info(self, offs, count):
            if int(count) * 24 > self._left(offs):         # name length 8, dims 4, type 4, offset 8
                raise ValueError(f"it declares {int(count)} tensors, more than the file holds")
            return super()._build_tensor_info(offs, count)

    return Reader


def check_file(path: Path) -> None:
    """One clear error unless `path` is a regular file (a directory, a pipe, nothing)."""
    if path.is_dir():
        raise QkvError(f"{path} is a directory, not a GGUF file; give the .gguf file itself")
    if not path.exists():
        raise QkvError(f"no such file {path}; give the path of a .gguf file")
    if not path.is_file():
        raise QkvError(f"{path} is not a regular file; give the path of a .gguf file")


def open_reader(path: Path):
    """The gguf package's reader, or one clear error for a file that is not (intact) GGUF."""
    path = Path(path)
    check_file(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise QkvError(f"cannot read {path}: {e.strerror}; give a readable .gguf file") from None
    if magic != b"GGUF":
        what = "is empty" if not magic else "does not start with 'GGUF'"
        raise QkvError(f"{path} is not a GGUF file (it {what}); give a llama.cpp .gguf model")
    try:
        with np.errstate(all="ignore"):                 # a tensor offset near 2⁶⁴ overflows a uint64 sum: said below
            reader = _reader_class()(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, MemoryError, struct.error, OSError) as e:
        why = " ".join(str(e).split())[:160]
        raise QkvError(f"{path} is a damaged or truncated GGUF file ({why}); re-download it") from None
    if reader.byte_order != "I":       # gguf.quants would read its tensors in this machine's byte order
        raise QkvError(f"{path} is a GGUF file for big-endian machines, which qkv does not read; use the "
                       "ordinary (little-endian) file")
    check_layout(reader, path)
    return reader


def check_layout(reader, path: Path) -> None:
    """Every tensor's bytes where the format puts them: at an offset (counted from the data section's start) that
    is a multiple of general.alignment, inside the data section, no two tensors sharing a byte. The package
    checks none of it: an offset pointing into another tensor (or, wrapped past 2⁶⁴, into the header) would load
    and run on bytes that are not that tensor's."""
    start, alignment = int(reader.data_offset), int(reader.alignment)
    spans = []                                          # (first byte, end, name), counted from the data section
    for t in reader.tensors:
        offset = int(t.field.parts[-1][0])                  # as the file declares it (the package's sum may wrap)
        end = offset + int(t.data.nbytes)
        if offset % alignment:
            raise QkvError(f"{path} is a damaged GGUF file (tensor {t.name!r} at offset {offset} is not aligned "
                           f"to {alignment} bytes, as its header says); re-download it")
        if start + end > len(reader.data):
            raise QkvError(f"{path} is a damaged GGUF file (tensor {t.name!r} at offset {offset} ends past the "
                           f"end of the file); re-download it")
        spans.append((offset, end, t.name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise QkvError(f"{path} is a damaged GGUF file (tensors {a!r} and {b!r} overlap: {b!r} starts at byte "
                           f"{begin} of the data, inside {a!r}); re-download it")


def metadata(reader) -> dict:
    """Every scalar, string and short-array metadata value (the tokenizer's long arrays are
    left to gguf_tokenizer)."""
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type", "scores")):
            continue
        try:
            meta[key] = field.contents()
        except (ValueError, IndexError, TypeError):
            continue                              # unreadable: a required key then reports itself missing
    return meta


def field_list(reader, key: str) -> list | None:
    """The GGUF array KEY as a list (None when the file has none); one line when it cannot be read."""
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return list(field.contents())
    except (ValueError, IndexError, TypeError, UnicodeDecodeError):
        raise QkvError(f"the GGUF field {key} cannot be read; the file is damaged") from None

"""llama.cpp's control-vector file: steering directions, one per layer, in a GGUF file (written and read with
ggml-org's `gguf` package), so that a vector qkv makes steers llama.cpp (`llama-cli --control-vector FILE` or
`--control-vector-scaled FILE SCALE`) and a vector made for llama.cpp steers qkv.

The format, as llama.cpp reads and writes it (common/common.cpp `common_control_vector_load_one`, the loader;
src/llama-adapter.cpp `llama_adapter_cvec::apply`; tools/cvector-generator `export_gguf`, the writer):

    general.architecture        string  "controlvector"
    controlvector.model_hint    string  the architecture the vectors were made on ("llama", …); llama.cpp reads
                                        no metadata at all, so this is a note to people
    controlvector.layer_count   int32   how many direction tensors the file holds
    direction.N                 F32, one dimension of n_embd (d_model) numbers, N ≥ 1

llama.cpp adds `strength · direction.N` to the stream leaving its block N (0-based blocks: the loader puts
direction.N at row N − 1 of its buffer, the applier reads block il's vector from row il − 1, and each model's
graph adds it right after the FFN's residual add, the tensor it names "l_out"). qkv's blocks are 0-based too,
so the mapping is one to one:

    direction.N   ↔   qkv's hook point "N.residual_out"  (= "(N+1).residual", the stream entering block N + 1)

Block 0's output cannot be steered (llama.cpp refuses direction.0), nor can the embeddings: N runs over
1..L−1 of an L-layer model. Several files, or several tensors of one layer, add up (as llama.cpp sums them).

    write_control_vector("happy.gguf", {12: v}, model_hint="llama")     # v (d_model,)
    read_control_vector("happy.gguf").directions                        # {12: v as float32}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import temporary_file

ARCH = "controlvector"                                  # general.architecture
HINT = "controlvector.model_hint"
COUNT = "controlvector.layer_count"
TENSOR = "direction.{}"                                 # direction.N: added to the stream leaving block N
_NAME = re.compile(r"direction\.(\d+)")


@dataclass
class ControlVector:
    """What a control-vector file holds: {N: direction (d_model,) float32}, N ≥ 1 being the block whose output it
    is added to (qkv's "N.residual_out")."""
    directions: dict[int, np.ndarray]
    model_hint: str
    path: str = ""

    @property
    def width(self) -> int:
        return len(next(iter(self.directions.values())))

    def check_fits(self, n_layers: int, d_model: int, name: str) -> None:
        """One error unless every direction is d_model wide and its layer is one of the model's 1..L-1."""
        if self.width != d_model:
            hint = f" (made on {self.model_hint})" if self.model_hint else ""
            raise QkvError(f"the control vector {self.path} is {self.width} wide{hint} and {name}'s stream is "
                           f"{d_model} wide; give a vector made on this model")
        bad = [n for n in self.directions if not 1 <= n < n_layers]
        if bad:
            raise QkvError(f"the control vector {self.path} has a direction for layer {bad[0]} and {name}'s blocks "
                           f"are 0..{n_layers - 1} (llama.cpp steers blocks 1..{n_layers - 1}); give a vector made "
                           "on this model")


def check_directions(directions: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """{N: float32 (d,)} with N ≥ 1, every vector one-dimensional, finite, of one width; or one error."""
    if not directions:
        raise QkvError("no direction to write; give at least one layer's vector")
    out, width = {}, None
    for n, v in sorted(directions.items()):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise QkvError(f"a control vector's layer is a block N ≥ 1 (llama.cpp cannot steer block 0's output "
                           f"or the embeddings), got {n!r}; choose a layer from 1 on")
        v = np.asarray(v, dtype=np.float64)                                     # (d,)
        if v.ndim != 1 or not len(v):
            raise QkvError(f"the direction of layer {n} has shape {v.shape}; give one vector (d_model,)")
        if width is not None and len(v) != width:
            raise QkvError(f"the directions are of different widths ({width} and {len(v)}); give one model's")
        top = float(np.abs(v).max())
        if not top < float(np.finfo(np.float32).max):
            raise QkvError(f"the direction of layer {n} reaches {top:.3g}, beyond float32; give a smaller vector")
        width = len(v)
        out[int(n)] = v.astype(np.float32)                                      # (d,)
    return out


def write_control_vector(path: str | os.PathLike, directions: Mapping[int, np.ndarray], model_hint: str = "") -> Path:
    """DIRECTIONS ({N: (d_model,)}, N ≥ 1) as a llama.cpp control-vector GGUF at PATH, atomically (a temporary file
    beside PATH renamed onto it; a link at PATH is replaced, never followed). The numbers are stored as float32,
    exactly as given (no normalising: the file's vector times the scale is what is added)."""
    import gguf

    vectors = check_directions(directions)
    path = Path(path)
    if path.is_dir():
        raise QkvError(f"{path} is a directory; give the control vector's file name, e.g. {path / 'vector.gguf'}")
    if not path.parent.is_dir():
        raise QkvError(f"cannot write {path}: no directory {path.parent}; create it or choose another path")
    fd, tmp = temporary_file(path)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, ARCH)                                     # general.architecture
        writer.add_string(HINT, str(model_hint))
        writer.add_int32(COUNT, len(vectors))                                   # as llama.cpp's writer: int32
        for n, v in vectors.items():
            writer.add_tensor(TENSOR.format(n), v)                              # F32, (d_model,)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise QkvError(f"cannot write {path}: {e.strerror or e}; choose a writable path") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_control_vector(path: str | os.PathLike) -> ControlVector:
    """The control vector in PATH (llama.cpp's layout, module doc), checked as llama.cpp checks it: every tensor
    named direction.N with N ≥ 1, F32, one-dimensional, all of one width; tensors of one layer are summed."""
    import gguf

    from .gguf_reader import metadata, open_reader

    path = Path(path)
    reader = open_reader(path)
    meta = metadata(reader)
    arch = meta.get("general.architecture")
    if arch != ARCH:
        raise QkvError(f"{path} is a GGUF file of architecture {arch!r}, not a control vector ({ARCH!r}); give a "
                       "file `qkv steer make` or llama.cpp's cvector-generator wrote")
    directions: dict[int, np.ndarray] = {}
    for t in reader.tensors:
        match = _NAME.fullmatch(t.name)
        if match is None or int(match.group(1)) < 1:
            raise QkvError(f"{path}: tensor {t.name!r} is not direction.N with N ≥ 1 (llama.cpp refuses it); give "
                           "a llama.cpp control vector")
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise QkvError(f"{path}: {t.name} is {t.tensor_type.name}, not F32 (llama.cpp refuses it); give a "
                           "llama.cpp control vector")
        if len(t.shape) != 1:
            raise QkvError(f"{path}: {t.name} has {len(t.shape)} dimensions, not 1 (llama.cpp refuses it); give a "
                           "llama.cpp control vector")
        v = np.array(t.data, dtype=np.float32).reshape(-1)                       # (d_model,)
        n = int(match.group(1))
        directions[n] = directions[n] + v if n in directions else v
    if not directions:
        raise QkvError(f"{path} holds no direction tensor; give a control vector with at least one layer")
    if len({len(v) for v in directions.values()}) > 1:
        raise QkvError(f"{path}: its directions are of different widths; give a llama.cpp control vector")
    if not all(np.isfinite(v).all() for v in directions.values()):
        raise QkvError(f"{path}: a direction holds NaN or infinity; give a finite control vector")
    hint = meta.get(HINT, "")
    return ControlVector(dict(sorted(directions.items())), hint if isinstance(hint, str) else "", str(path))

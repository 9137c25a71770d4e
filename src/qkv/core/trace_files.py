"""A trace on disk: DIRECTORY/trace.npz (its arrays) and trace.json (its tokens and what made them), the files
`Trace.save` writes and `Trace.load` reads (qkv.core.trace says which of a trace's fields they keep).

Written both files or neither (runtime.io.FileBatch); read trusting nothing: the sizes in trace.npz's zip directory
and array headers before anything expands (a zip bomb is refused), trace.json's keys and types, the arrays' shapes,
and that attention weights are weights.
"""

from __future__ import annotations

import errno
import io
import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import FileBatch, open_regular

# ── writing ───────────────────────────────────────────────────────────────────────


def attention_arrays(A: np.ndarray, self_attention: bool) -> dict:
    """(L, H, n, n_k) weights as trace.npz holds them: a causal self-attention's as "attentions_lower", its lower
    triangles (half the bytes), any other as "attentions"."""
    if self_attention and _above_diagonal_empty(A):
        return {"attentions_lower": _Lower(A)}
    return {"attentions": A}


def weight_rows(A: np.ndarray | None) -> str:
    """trace.json's "rows": "softmax" when every row of the weights sums to 1 (or 0), "edited" when hooks changed
    them (Trace.load then checks only that they are finite and ≥ 0)."""
    return "softmax" if A is None or _softmax_rows(A) else "edited"


def write_trace(out: Path, arrays: dict, meta: dict) -> Path:
    """ARRAYS to OUT/trace.npz and META to OUT/trace.json, both or neither; a directory that cannot be written is
    one QkvError."""
    try:
        with FileBatch(out) as files:                       # both files or neither
            files.write("trace.npz", lambda f: _write_npz(f, arrays))
            files.write("trace.json", lambda f: f.write(json.dumps(meta, ensure_ascii=False).encode()))
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror}; choose a writable directory") from None
    return out


class _Lower:
    """A causal self-attention's weights (L, H, n, n) saved as their lower triangles, (L, H, n(n+1)/2) row by
    row (Trace.load unpacks them): half the bytes, gathered a layer at a time (no temporary of the whole)."""

    def __init__(self, A: np.ndarray):
        self.A = A
        self.rows, self.cols = np.tril_indices(A.shape[-1])
        self.shape, self.dtype = A.shape[:2] + (len(self.rows),), A.dtype

    def layers(self):
        for layer in self.A:                                             # (H, n, n) → (H, n(n+1)/2)
            yield layer[:, self.rows, self.cols]


def _above_diagonal_empty(A: np.ndarray) -> bool:
    """Whether every weight above the diagonal is 0 (a causal self-attention, unless a hook changed it)."""
    if A.shape[-1] != A.shape[-2]:
        return False
    rows, cols = np.triu_indices(A.shape[-1], 1)
    return not any(layer[:, rows, cols].any() for layer in A)


def _write_npz(f, arrays: dict) -> None:
    """ARRAYS as np.savez writes them (a stored zip of .npy files, which np.load and Trace.load read); a
    _Lower is written a layer at a time. Stored, not deflated: weights barely compress (the causal zeros
    are not written at all), and deflating takes half a second per 30 MB."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, value in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as member:
                if isinstance(value, _Lower):
                    np.lib.format.write_array_header_2_0(member, {
                        "descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": False,
                        "shape": value.shape})
                    for part in value.layers():
                        member.write(np.ascontiguousarray(part).tobytes())
                else:
                    np.lib.format.write_array(member, np.asarray(value), allow_pickle=False)


# ── reading: nothing is trusted ─────────────────────────────────────────────────────

TRACE_MIN_BOUND = 64 << 20        # a trace.npz may always expand to 64 MiB ...
TRACE_RATIO = 100                 # ... and beyond that to at most 100× its size on disk (attention
                                  # weights compress 2-5×; a zip bomb of zeros, ~1000×)
TRACE_JSON_MAX = 64 << 20         # trace.json: tokens and a text (8,192 tokens take well under 1 MiB)
MAX_LAYER = 10_000                # layer numbers a trace may name (the largest models have ~100)
ROW_SUM = 1e-2                    # a row of attention sums to 1 (0 when every key is masked), float16 included


@dataclass
class Saved:
    """What a saved trace holds, checked: trace.json's fields, and its arrays."""

    meta: dict                               # tokens, model, family, causal, spelling, text, ... (trace.json)
    ids: np.ndarray                          # (n,) token ids
    attentions: np.ndarray                   # (L, H, n, n_k) the kept layers' weights, lower triangles unpacked
    layers: list[int]                        # (L,) the layer each row of `attentions` is
    routed: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]   # MoE layers: (router, experts, expert_weights)
    image: np.ndarray | None                 # image models: (H, W, C) uint8


def read_trace(d: Path) -> Saved:
    """The trace saved in directory D, checked before use; a file that is not one is one QkvError."""
    try:
        meta = json.loads(_regular_file(d / "trace.json", TRACE_JSON_MAX).decode("utf-8"))
        npz = io.BytesIO(_regular_file(d / "trace.npz", None))
        arrays = _read_npz(npz, ("ids", "layers"), ("attentions", "attentions_lower", "router_layers", "router",
                                                     "experts", "expert_weights", "image"))
    except (OSError, ValueError, KeyError, RecursionError, zipfile.BadZipFile) as e:
        raise QkvError(f"{d} does not hold a qkv trace ({_short(e)}); give a directory written by --trace") from None
    meta = _check_meta(d, meta)
    ids, att, layers = _check_arrays(d, meta, *arrays[:4])
    routed = _check_router(d, len(ids), layers, *arrays[4:-1])
    image = _check_image(d, meta, arrays[-1])
    return Saved(meta, ids, att, layers, routed, image)


def _short(e: Exception) -> str:
    """E's message on one line of at most 80 characters, for the error that names the file."""
    text = str(e).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def _regular_file(path: Path, limit: int | None) -> bytes:
    """PATH's bytes if it is a regular file of at most LIMIT bytes (`io.open_regular`: a FIFO or a device
    such as /dev/zero is refused before it is read)."""
    try:
        with open_regular(path, limit) as f:
            return f.read()
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EISDIR, errno.EFBIG):
            raise ValueError(f"{path.name}: {e.strerror}") from None
        raise


def _read_npz(data: io.BytesIO, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[np.ndarray | None]:
    """The named arrays of an .npz's bytes (then the OPTIONAL ones, None where absent), after checking the zip
    directory's uncompressed sizes against a bound and each .npy header's shape against its member's
    size: nothing large is allocated first."""
    size = len(data.getbuffer())
    bound = max(TRACE_MIN_BOUND, TRACE_RATIO * size)
    with zipfile.ZipFile(data) as z:
        members = {info.filename: info for info in z.infolist()}
        total = sum(info.file_size for info in members.values())
        if total > bound:
            raise ValueError(f"trace.npz would expand to {total / 2**20:.0f} MiB from "
                             f"{size / 2**20:.1f} MiB on disk, more than a trace can hold")
        out = []
        for name in names + optional:
            info = members.get(name + ".npy")
            if info is None and name in optional:
                out.append(None)
                continue
            if info is None:
                raise KeyError(f"trace.npz has no {name!r}")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(f))
            if dtype.hasobject or math.prod(shape) * dtype.itemsize > info.file_size:
                raise ValueError(f"{name} in trace.npz claims shape {shape} of {dtype}, more than it holds")
            with z.open(info) as f:
                out.append(np.lib.format.read_array(f, allow_pickle=False))
        return out


def _check_meta(d: Path, meta) -> dict:
    """trace.json: an object with a list of string tokens; the optional keys of the right types."""
    def bad(what: str) -> QkvError:
        return QkvError(f"{d}/trace.json is not a qkv trace ({what}); give a directory written by --trace")

    if not isinstance(meta, dict):
        raise bad("not a JSON object")
    for key in ("tokens", "source_tokens"):
        v = meta.get(key)
        if (key == "tokens" or v is not None) and not (isinstance(v, list) and all(isinstance(t, str) for t in v)):
            raise bad(f"{key!r} must be a list of strings")
    for key in ("model", "family", "spelling", "text"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise bad(f"{key!r} must be a string")
    if meta.get("causal") is not None and not isinstance(meta["causal"], bool):
        raise bad("'causal' must be true, false or null")
    if meta.get("rows") not in (None, "softmax", "edited", "sinks"):
        raise bad("'rows' must be \"softmax\", \"edited\" or \"sinks\"")
    p = meta.get("prompt_length")
    if p is not None and not (isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= len(meta["tokens"])):
        raise bad("'prompt_length' must be a token count")
    return meta


def _check_image(d: Path, meta: dict, image) -> np.ndarray | None:
    """An image model's trace: the image (H, W, C) uint8 and a grid of (rows, columns) whose patches are the
    tokens after [CLS]; None for a text trace (neither saved)."""
    grid = meta.get("grid")
    if image is None and grid is None:
        return None
    if image is None or not (isinstance(grid, list) and len(grid) == 2
                             and all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid)
                             and 1 + grid[0] * grid[1] == len(meta["tokens"])):
        raise QkvError(f"{d} is not a qkv trace of an image (its image, its grid and its {len(meta['tokens'])} "
                       "tokens disagree); give a directory written by qkv show")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3) \
            or image.shape[0] < grid[0] or image.shape[1] < grid[1]:
        raise QkvError(f"{d}/trace.npz's image is {image.dtype} {image.shape}, not (H, W, 1 or 3) uint8 pixels "
                       "holding its grid; give a directory written by qkv show")
    names = meta.get("label_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(x, str) for x in names)):
        raise QkvError(f"{d}/trace.json's label_names must be a list of strings; give a directory written by qkv show")
    return image


def _check_arrays(d: Path, meta: dict, ids, layers, att, lower) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """ids (n,) integers, layers (L,) distinct integers, attentions (L, H, n, n_k) floats, or of a causal
    self-attention their lower triangles (L, H, n(n+1)/2), row by row (unpacked here)."""
    n = len(meta["tokens"])
    n_k = n if meta.get("source_tokens") is None else len(meta["source_tokens"])

    def bad(what: str) -> QkvError:
        return QkvError(f"{d}/trace.npz does not match trace.json ({what}); give a directory written by --trace")

    if ids.shape != (n,) or ids.dtype.kind not in "iu":
        raise bad(f"ids have shape {ids.shape} of {ids.dtype}, expected ({n},) integers for {n} tokens")
    if ids.size and not 0 <= ids.min() <= ids.max() < 2**31:
        raise bad(f"ids must be token ids (0 or more), not {ids.min()}")
    if layers.ndim != 1 or layers.dtype.kind not in "iu" or len(set(layers.tolist())) != len(layers) \
            or (layers.size and not 0 <= layers.min() <= layers.max() < MAX_LAYER):
        raise bad(f"layers must be distinct layer numbers from 0 to {MAX_LAYER - 1}")
    if (att is None) == (lower is None):
        raise bad("it must hold attentions or attentions_lower, one of them")
    if lower is not None:
        if lower.ndim != 3 or lower.shape[0] != len(layers) or lower.shape[2] != n * (n + 1) // 2 \
                or n_k != n or lower.dtype.kind != "f":
            raise bad(f"attentions_lower have shape {lower.shape} of {lower.dtype}, expected "
                      f"({len(layers)}, H, {n * (n + 1) // 2}) floats: {n} rows of a causal self-attention")
        att = np.zeros(lower.shape[:2] + (n, n), dtype=lower.dtype)
        rows, cols = np.tril_indices(n)
        att[..., rows, cols] = lower
    if att.ndim != 4 or att.shape[0] != len(layers) or att.shape[2:] != (n, n_k) or att.dtype.kind != "f":
        raise bad(f"attentions have shape {att.shape} of {att.dtype}, expected ({len(layers)}, H, {n}, {n_k}) floats")
    check_weights(att, lambda what: bad(f"attentions {what}"), rows=meta.get("rows") not in ("edited", "sinks"))
    return ids, att, layers.tolist()


def _softmax_rows(att: np.ndarray) -> bool:
    """Whether every row of ATT sums to 1 (or 0: every key masked), to within ROW_SUM."""
    sums = att.sum(axis=-1, dtype=np.float64)
    return not sums.size or float(np.minimum(np.abs(sums - 1), np.abs(sums)).max()) <= ROW_SUM


def check_weights(att: np.ndarray, bad, rows: bool = True) -> None:
    """Attention weights as a pass leaves them: finite and ≥ 0; with ROWS (a trace whose trace.json does not say
    its weights were edited by hooks: "rows": "edited") also at most 1, each row summing to 1 (0: every key
    masked) to within ROW_SUM. Else bad(what is wrong) is raised."""
    if not np.isfinite(att).all():
        raise bad("hold NaN or inf")
    if att.size and att.min() < 0:
        raise bad(f"must be weights ≥ 0, not {float(att.min()):.3g}")
    if not rows:
        return
    if att.size and att.max() > 1 + ROW_SUM:
        raise bad(f"must be weights in [0, 1], not up to {float(att.max()):.3g}")
    sums = att.sum(axis=-1, dtype=np.float64)
    off = np.minimum(np.abs(sums - 1), np.abs(sums))
    if off.size and off.max() > ROW_SUM:
        raise bad(f"rows must each sum to 1 (softmax), not {float(sums.flat[int(np.argmax(off))]):.3g}")


def _check_router(d: Path, n: int, layers: list[int], routed, router, experts, weights
                  ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The MoE layers' router arrays, if any: router_layers (Lm,) among the layers, router (Lm, n, E) floats,
    experts (Lm, n, k) integers in 0..E-1, expert_weights (Lm, n, k) floats; all four or none."""
    def bad(what: str) -> QkvError:
        return QkvError(f"{d}/trace.npz has a bad router record ({what}); give a directory written by --trace")

    given = [a is not None for a in (routed, router, experts, weights)]
    if not any(given):
        return {}
    if not all(given):
        raise bad("router_layers, router, experts and expert_weights come together")
    if routed.ndim != 1 or routed.dtype.kind not in "iu" or not set(routed.tolist()) <= set(layers) \
            or len(set(routed.tolist())) != len(routed):
        raise bad("router_layers must be distinct layers of the trace")
    Lm = len(routed)
    if router.ndim != 3 or router.shape[:2] != (Lm, n) or router.dtype.kind != "f":
        raise bad(f"router has shape {router.shape} of {router.dtype}, expected ({Lm}, {n}, E) floats")
    k_shape = (Lm, n, experts.shape[-1] if experts.ndim == 3 else -1)
    if experts.shape != k_shape or experts.dtype.kind not in "iu" or not 1 <= k_shape[2] <= router.shape[2] \
            or (experts.size and not 0 <= experts.min() <= experts.max() < router.shape[2]):
        raise bad(f"experts have shape {experts.shape} of {experts.dtype}, expected ({Lm}, {n}, k) expert numbers")
    if weights.shape != experts.shape or weights.dtype.kind != "f":
        raise bad(f"expert_weights have shape {weights.shape}, expected {experts.shape} floats")
    if not (np.isfinite(router).all() and np.isfinite(weights).all()) or (weights.size and weights.min() < 0):
        raise bad("router and expert_weights must be finite, the weights ≥ 0")
    return {int(i): (router[j], experts[j], weights[j]) for j, i in enumerate(routed)}

"""How every page carries an array (the viewer, the pipeline page, `qkv serve`'s answers): one
JSON object, decoded in the browser by assets/wire.js (`QKV_WIRE.decode`) and here by `decode`.

    {"dtype": "u8" | "u16" | "i32" | "f16" | "f32",   the stored numbers, little-endian
     "shape": [int],                                  row-major (C order)
     "scale": int,                                    only on quantised arrays (absent: none)
     "data": str}                                     base64(zlib(the bytes)), zlib level LEVEL

A quantised array holds values in [0, 1] as q = round(clip(x, 0, 1) · scale) (NaN → 0), so
value = q / scale to within 0.5 / scale: u8 with scale 255 (attention weights, rollout: ±0.002),
u16 with scale 65535 (probabilities: ±7.6e-6). Without a scale the numbers are the values
themselves: integers (ranks, token ids, codes) or floats (f16 ≈ 3 digits, f32 exact).
The browser inflates the data with its built-in DecompressionStream("deflate").
"""

from __future__ import annotations

import base64
import zlib
from typing import Mapping

import numpy as np

from ..runtime.errors import QkvError

DTYPES = {"u8": "<u1", "u16": "<u2", "i32": "<i4", "f16": "<f2", "f32": "<f4"}
BYTE_SCALE = 255                 # a value in [0, 1] as one byte (attention, rollout, the router): ±0.5/255 ≈ 0.002
# zlib's level: on SmolLM2's attention of 178 tokens (8.6 MB of bytes) level 4 takes 0.06 s for 1.07 MB,
# level 6 0.17 s for 0.98 MB, level 1 0.04 s for 1.24 MB (a page read from disk: a tenth more bytes go unnoticed,
# a tenth of a second after every generation does not).
LEVEL = 4
CHUNK = 1 << 18                  # values quantised at a time (1 MiB of float32: in cache)


def encode(x, dtype: str, scale: int | None = None) -> dict:
    """The array X as {"dtype", "shape"[, "scale"], "data"} (module doc). With SCALE, X's values are
    quantised (clipped to [0, 1], NaN → 0, rounded half up); without, cast to DTYPE as they are."""
    if dtype not in DTYPES:
        raise QkvError(f"unknown array dtype {dtype!r}; choose from {list(DTYPES)}")
    if scale is None:
        q = np.ascontiguousarray(x, dtype=DTYPES[dtype])
    else:
        # q = floor(clip(x, 0, 1) · scale + 0.5), CHUNK values at a time into q itself (a page's largest
        # array, its attention, is tens of MB: no temporary of its size); float32 is exact enough for one
        # byte, float64 otherwise
        x = np.asarray(x)
        q = np.empty(x.shape, dtype=DTYPES[dtype])
        flat, out = x.reshape(-1), q.reshape(-1)
        work = np.float32 if q.itemsize == 1 else np.float64
        for i in range(0, flat.size, CHUNK):
            t = np.multiply(flat[i:i + CHUNK], scale, dtype=work)
            np.fmax(t, 0.0, out=t)                                   # NaN → 0 too (fmax drops NaN)
            np.fmin(t, scale, out=t)
            t += 0.5
            out[i:i + CHUNK] = t                                     # truncated: floor of a value ≥ 0
    out = {"dtype": dtype, "shape": list(q.shape)}
    if scale is not None:
        out["scale"] = int(scale)
    out["data"] = base64.b64encode(zlib.compress(q.tobytes(), LEVEL)).decode("ascii")
    return out


def decode(encoded: Mapping) -> np.ndarray:
    """The inverse of `encode`: q / scale (float64) for a quantised array; otherwise the values,
    integers as int64 and floats in their own dtype (float16, float32)."""
    dtype = encoded.get("dtype")
    if dtype not in DTYPES:
        raise QkvError(f"unknown array dtype {dtype!r}; expected one of {list(DTYPES)}")
    raw = zlib.decompress(base64.b64decode(encoded["data"]))
    q = np.frombuffer(raw, dtype=DTYPES[dtype]).reshape(encoded["shape"])
    if encoded.get("scale"):
        return q / encoded["scale"]
    return q.astype(np.int64) if q.dtype.kind in "iu" else q.astype(q.dtype.newbyteorder("="))

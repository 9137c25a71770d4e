"""Gemma Scope's files: one SAE or transcoder per params.npz (Gemma Scope 1) or params.safetensors (Gemma Scope 2).

    params.npz          W_enc (d_in, d_sae), b_enc (d_sae,), W_dec (d_sae, d_out), b_dec (d_out,), threshold (d_sae,)
    params.safetensors  the same, named w_enc, b_enc, w_dec, b_dec, threshold (Gemma Scope 2; an optional
                        affine_skip_connection (d_in, d_out) for its skip transcoders)

Gemma Scope's JumpReLU SAE (its tutorial's JumpReLUSAE), rows as vectors as in qkv:

    pre = x·W_enc + b_enc            (b_dec is NOT subtracted from the input)
    z   = ReLU(pre) ⊙ [pre > θ]
    x̂  = z·W_dec + b_dec            (+ x·affine_skip_connection for a skip transcoder)

So the arrays are qkv's own, name for name, no transpose; apply_b_dec_to_input is false; θ is read as max(θ, 0),
which makes qkv's pre ⊙ [pre > θ] the same function (`saelens.clamp_threshold`).

The file does not say where it reads: Gemma Scope keeps that in the repository's and folders' names
("gemma-scope-2b-pt-res/layer_12/width_16k/average_l0_82/params.npz"). The caller gives layer and site (qkv's:
resid entering block `layer`, attn_out, ffn_out; transcoder=True for ffn_in → ffn_out), or they are read from the
path: "layer_N" is the layer; a folder naming "transcoder" makes it a transcoder at N, "mlp" an ffn_out SAE at N,
"res"/"resid_post" a residual SAE on what leaves block N (qkv's resid at N+1, TransformerLens's
blocks.N.hook_resid_post, as SAELens lists Gemma Scope's). Attention SAEs ("att") read the heads' concatenated
outputs before W_O (hook_z), a point qkv's dictionaries do not read: refused in one line.

Reading trusts nothing: np.load with allow_pickle=False (an object array is refused, never unpickled), exactly the
arrays above with the shapes W_enc implies, floats, finite.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np

from ..checkpoints.tensors import TensorStore, write_safetensors
from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from .sae import MAX_D_IN, MAX_LATENTS, SAE, SAEConfig
from .saelens import clamp_threshold, read_weights

NPZ, SAFETENSORS = "params.npz", "params.safetensors"
FIX = "give Gemma Scope's params.npz (W_enc, W_dec, b_enc, b_dec, threshold) or params.safetensors"
NAMES = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")
LOWER = {"w_enc": "W_enc", "w_dec": "W_dec", "affine_skip_connection": "W_skip"}     # Gemma Scope 2's names


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz, no pickle, each a float32 copy; one line for anything else."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise QkvError(f"{path} is one array (.npy), not an .npz of named arrays; {FIX}")
        with loaded as npz:
            names = list(npz.files)
            extra = sorted(set(names) - set(NAMES))
            if extra:
                raise QkvError(f"{path} holds {', '.join(extra[:3])} besides {', '.join(NAMES)}; {FIX}")
            out = {}
            for name in names:
                arr = npz[name]
                if arr.dtype.kind != "f":
                    raise QkvError(f"{path}: {name} is {arr.dtype}, but weights must be floats; {FIX}")
                out[name] = np.array(arr, dtype=np.float32)
            return out
    except ValueError as e:                              # an object array: np.load refuses to unpickle it
        if "pickle" in str(e):
            raise QkvError(f"{path} holds a pickled (object) array, which qkv never loads; {FIX}") from None
        raise QkvError(f"{path} is not a readable .npz ({e}); {FIX}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise QkvError(f"{path} is not a readable .npz ({e}); {FIX}") from None


def _safetensors_arrays(path: Path) -> dict[str, np.ndarray]:
    """Gemma Scope 2's params.safetensors under qkv's names (W_skip = affine_skip_connection, no transpose)."""
    store = TensorStore(path)
    shapes = {LOWER.get(n, n): store.shape(n) for n in store.names()}
    if "W_enc" not in shapes or len(shapes["W_enc"]) != 2:
        raise QkvError(f"{path} has no 2-D w_enc; {FIX}")
    d, n = shapes["W_enc"]
    b_dec = shapes.get("b_dec") or (d,)
    o = b_dec[0] if len(b_dec) == 1 else d                                   # read_weights checks it below
    want = {"W_enc": (d, n), "b_enc": (n,), "W_dec": (n, o), "b_dec": (o,), "threshold": (n,)}
    optional = {"W_skip": (d, o)}
    back = {v: k for k, v in LOWER.items()}
    params = read_weights(path, {back.get(k, k): s for k, s in want.items()},
                          {back.get(k, k): s for k, s in optional.items()}, FIX, "w_enc's shape")
    return {LOWER.get(k, k): v for k, v in params.items()}


def _check_shapes(arrays: dict[str, np.ndarray], path: Path) -> tuple[int, int, int]:
    """(d_in, d_sae, d_out) from W_enc and W_dec, every array's shape checked against them."""
    for name in NAMES:
        if name not in arrays:
            raise QkvError(f"{path} has no {name}; {FIX}")
    if arrays["W_enc"].ndim != 2 or arrays["W_dec"].ndim != 2:
        raise QkvError(f"{path}: W_enc and W_dec must be matrices; {FIX}")
    d, n = arrays["W_enc"].shape
    o = arrays["W_dec"].shape[1]
    if not (1 <= d <= MAX_D_IN and 1 <= n <= MAX_LATENTS and 1 <= o <= MAX_D_IN):
        raise QkvError(f"{path}: W_enc is {arrays['W_enc'].shape}, out of range; {FIX}")
    want = {"b_enc": (n,), "W_dec": (n, o), "b_dec": (o,), "threshold": (n,), "W_skip": (d, o)}
    for name, shape in want.items():
        if name in arrays and arrays[name].shape != shape:
            raise QkvError(f"{path}: {name} has shape {arrays[name].shape}, but W_enc {(d, n)} implies {shape}; {FIX}")
    for name, arr in arrays.items():
        if not np.isfinite(arr).all():
            raise QkvError(f"{path}: {name} holds NaN or infinite values; the file is corrupt ({FIX})")
    return d, n, o


def where_from_path(path: Path) -> tuple[int | None, str | None, bool]:
    """(layer, site, transcoder) as Gemma Scope's folder names say them (module docstring); None if silent."""
    text = "/".join(path.parts[-5:]).lower()            # repository/layer_N/width/l0/params.npz at most
    m = re.findall(r"layer_(\d{1,6})", text)
    layer = int(m[-1]) if m else None
    if "transcoder" in text:
        return layer, "ffn_in", True
    if re.search(r"(^|[-_/])att(n)?([-_/]|$)", text):
        return layer, "hook_z", False
    if re.search(r"(^|[-_/])(res|resid_post)([-_/]|$)", text):
        return (None if layer is None else layer + 1), "resid", False
    if re.search(r"(^|[-_/])mlp(_out)?([-_/]|$)", text):
        return layer, "ffn_out", False
    return layer, None, False


def load_gemma_scope(path: str | Path, *, layer: int | None = None, site: str | None = None,
                     transcoder: bool | None = None, model: str | None = None) -> SAE:
    """The JumpReLU SAE or transcoder in PATH (params.npz / params.safetensors, or a folder holding one).

    LAYER and SITE (qkv's) or TRANSCODER (ffn_in → ffn_out at LAYER) say where it reads; what is not given is read
    from the path's folder names (`where_from_path`). A transcoder is also recognised by W_dec's width."""
    path = Path(path)
    if path.is_dir():
        found = [p for p in (path / NPZ, path / SAFETENSORS) if p.is_file()]
        if not found:
            raise QkvError(f"{path} has no {NPZ} or {SAFETENSORS}; {FIX}")
        path = found[0]
    if not path.is_file():
        raise QkvError(f"{path} is not a file; {FIX}")
    arrays = _safetensors_arrays(path) if path.suffix == ".safetensors" else _npz_arrays(path)
    d, n, o = _check_shapes(arrays, path)
    if layer is None or (site is None and transcoder is None):
        guess_layer, guess_site, guess_tc = where_from_path(path)
        layer = guess_layer if layer is None else layer
        if site is None and transcoder is None:
            site, transcoder = guess_site, guess_tc
    if site == "hook_z":
        raise QkvError(f"{path} is an attention SAE (Gemma Scope's att SAEs read the heads' outputs before W_O, "
                       "hook_z), a point qkv's dictionaries do not read; give a res, mlp or transcoder file")
    transcoder = bool(transcoder) or o != d or "W_skip" in arrays or site == "ffn_in"
    site = "ffn_in" if transcoder and site is None else site
    clamp_threshold(arrays)
    cfg = SAEConfig(d_in=d, d_sae=n, apply_b_dec_to_input=False, model=model, layer=layer, site=site,
                    architecture="jumprelu", d_out=o if transcoder else None, site_out="ffn_out" if transcoder else None)
    return SAE(cfg, {k: np.ascontiguousarray(v) for k, v in arrays.items()})


def save_gemma_scope(sae: SAE, directory: str | Path) -> Path:
    """DIRECTORY/params.npz in Gemma Scope 1's layout (a JumpReLU SAE or transcoder without W_skip, whose b_dec is
    not subtracted from its input: what that layout can hold; anything else is one line)."""
    cfg = sae.config
    if cfg.architecture != "jumprelu" or cfg.apply_b_dec_to_input or "W_skip" in sae.params:
        raise QkvError(f"Gemma Scope's params.npz holds JumpReLU dictionaries without a skip whose b_dec is not "
                       f"subtracted from the input; this is a {cfg.architecture} one: save it in SAELens's layout")
    arrays = {name: np.ascontiguousarray(sae.params[name], dtype=np.float32) for name in NAMES}

    def write(f):
        np.savez(f, **arrays)

    with FileBatch(directory) as batch:
        batch.write(NPZ, write)
    return Path(directory) / NPZ


def save_gemma_scope_2(sae: SAE, directory: str | Path) -> Path:
    """DIRECTORY/params.safetensors in Gemma Scope 2's names (w_enc, w_dec, affine_skip_connection for W_skip)."""
    cfg = sae.config
    if cfg.architecture != "jumprelu" or cfg.apply_b_dec_to_input:
        raise QkvError(f"Gemma Scope's files hold JumpReLU dictionaries whose b_dec is not subtracted from the "
                       f"input; this is a {cfg.architecture} one: save it in SAELens's layout")
    back = {v: k for k, v in LOWER.items()}
    tensors = {back.get(k, k): np.ascontiguousarray(v, dtype=np.float32) for k, v in sae.params.items()}
    with FileBatch(directory) as batch:
        batch.write(SAFETENSORS, lambda f: write_safetensors(f, tensors))
    return Path(directory) / SAFETENSORS

"""Activations at scale: one site of one layer, a row for every token of a corpus, in shards on disk.
This module is the store (its layout, reading it, writing an array as one); qkv.features.collect makes one
from a corpus (`qkv activations`).

Sites (all (n, d_model) a token, d = d_model):
    resid     the residual stream entering block LAYER (qkv's "residual"; LAYER 0: the embeddings);
              made by running blocks 0..LAYER-1. The stream after the last block is not offered (it is the
              final norm's input, not a block's).
    attn_out  Concat(heads)·W_O of block LAYER, what attention adds to the stream; blocks 0..LAYER run
    ffn_out   the FFN's output of block LAYER (a MoE layer's routed sum too); blocks 0..LAYER run

The store (DIR):
    meta.json          model, layer, site, d, dtype, shard_tokens, tokens written, the shards (file, tokens,
                       where the corpus was read to after it), the corpus (name, sha256, texts), the settings,
                       qkv's version; rewritten atomically after each shard
    acts-00000.npy …   (T_i, d) float16 or float32 each, T_i = shard_tokens but the last; written under a
                       temporary name (its space reserved first, its rows written with pwrite, never through a
                       memory map: a full disk is an error, not SIGBUS) and renamed: a shard is there whole or not

Reading (what SAE training codes against):
    acts = open_activations(DIR)        .model .layer .site .d .tokens .dtype .shards
    acts.batches(batch_size, seed=0, start=0, epochs=1)   float32 (batch_size, d) arrays: each epoch one pass,
        shard order shuffled, rows shuffled within each shard (one shard in memory at a time), the epoch's last
        partial batch dropped; deterministic given the seed; start= batches skipped without reading them
    acts.sample(n, seed=0)              (n, d) float32 rows drawn without replacement, in store order
    write_activations(DIR, array, model=, layer=, site=, ...)   an array as a store (tests, Python users)
Only the shards meta.json lists are read: a store still being made reads as far as it is.

Trusted nothing (a store may come from elsewhere, or be damaged): meta.json is read by runtime.io_json (bounded,
every field checked for type and range), a shard's file is a plain name inside the store (no path, no link out of
it), opened as a regular file (a FIFO would hang), its .npy header checked against meta.json (dtype, shape, the
data's length; never a pickle), and rows that are not finite stop the read naming the shard. Each fault is one
QkvError; `open_activations` checks every shard's header before a row is read.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import open_regular, real_directory, write_atomic, write_text
from ..runtime.io_json import Fields, read_json

if TYPE_CHECKING:
    from ..models.model import Model

SITES = ("resid", "attn_out", "ffn_out")
RECORDED = {"resid": "residual", "attn_out": "attn_out", "ffn_out": "ffn_out",     # qkv's intermediate names
            "ffn_in": "ffn_in", "resid_mid": "residual_mid"}                        # (a transcoder's inputs)
DTYPES = ("float16", "float32")
SHARD_TOKENS = 65536
CONTEXT = 128             # tokens a window (SAELens's usual context for small models)
BATCH_TOKENS = 2048       # padded tokens a forward pass (as qkv neurons: a stored model dequantises once a pass)
FORMAT = "qkv-activations/1"
META = "meta.json"
FLOAT16_MAX = float(np.finfo(np.float16).max)
REMAKE = "remake the store (qkv activations with a new --out)"
PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,250}")       # a shard's file: a name in the store, not a path


def shard_name(k: int) -> str:
    return f"acts-{k:05d}.npy"


# ── reading ──────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Activations:
    """A store on disk (see the module): its meta (as `check_meta` returns it) and its complete shards."""

    path: Path
    meta: dict

    model = property(lambda self: self.meta["model"])
    layer = property(lambda self: int(self.meta["layer"]))
    site = property(lambda self: self.meta["site"])
    d = property(lambda self: int(self.meta["d"]))
    dtype = property(lambda self: self.meta["dtype"])
    tokens = property(lambda self: int(self.meta["tokens"]))

    @property
    def shards(self) -> list[tuple[Path, int]]:
        """(file, rows) of every complete shard, in order."""
        return [(self.path / s["file"], int(s["tokens"])) for s in self.meta["shards"]]

    def shard(self, k: int) -> np.ndarray:
        """Shard K memory-mapped, (T_k, d) in the stored dtype: the one reader of a shard's file. Its name must
        stay in the store, the file be regular, its header say meta.json's dtype and (T_k, d), its data be that
        long; else one QkvError naming the shard."""
        path, rows = self.shards[k]
        where = f"shard {k} of the store at {self.path} ({path.name})"
        real, store = os.path.realpath(path), os.path.realpath(self.path)
        if os.path.dirname(real) != store:
            raise QkvError(f"{where} is a link out of the store; {REMAKE}")
        try:
            with open_regular(real) as f:
                return _mapped(f, where, np.dtype(self.dtype), (rows, self.d))
        except FileNotFoundError:
            raise QkvError(f"{where} is missing; {REMAKE}") from None
        except OSError as e:
            raise QkvError(f"{where} cannot be read ({e.strerror or e}); {REMAKE}") from None

    def rows(self, k: int, index: np.ndarray | None = None) -> np.ndarray:
        """Rows INDEX (None: all, read in order) of shard K as float32 (len(index), d), or one QkvError if any is
        not finite (NaN, inf): what `batches` and `sample` read, so a damaged shard is named, never trained on."""
        a = self.shard(k)                                                          # (T_k, d) memory-mapped
        out = np.asarray(a if index is None else a[index], dtype=np.float32)       # (len(index), d)
        if not np.isfinite(out).all():
            raise QkvError(f"shard {k} of the store at {self.path} ({self.shards[k][0].name}) holds non-finite "
                           f"values (NaN or inf); {REMAKE}")
        return out

    def batches(self, batch_size: int, seed: int = 0, start: int = 0, epochs: int = 1) -> Iterator[np.ndarray]:
        """float32 (batch_size, d) arrays: EPOCHS passes over the store (one pass by default, never forever),
        each pass its shards in a shuffled order and each shard's rows shuffled (by rng(seed, epoch, shard)),
        batches running on across shards; each pass's last partial batch dropped; START batches skipped
        (counted over the passes) without reading their rows."""
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise QkvError(f"batch_size={batch_size!r} must be an integer ≥ 1")
        per_epoch = self.tokens // batch_size
        if per_epoch == 0:
            raise QkvError(f"the store holds {self.tokens} rows, fewer than one batch of {batch_size}; "
                           "give a smaller batch size or store more tokens")
        if start < 0 or epochs < 0:
            raise QkvError(f"start={start} and epochs={epochs} must be ≥ 0")
        sizes = [rows for _, rows in self.shards]
        for epoch in range(start // per_epoch, epochs):
            skip = (start - epoch * per_epoch) * batch_size if epoch == start // per_epoch else 0
            yield from self._epoch(epoch, seed, batch_size, per_epoch * batch_size, skip, sizes)

    def _epoch(self, epoch: int, seed: int, B: int, used: int, skip: int, sizes: list[int]) -> Iterator[np.ndarray]:
        """One pass's batches: rows SKIP..USED-1 of the shuffled order, B at a time."""
        order = np.random.default_rng([seed, epoch]).permutation(len(sizes))           # the shards' order
        at, carry = 0, None                        # at: rows of the shuffled order passed so far
        for k in order:
            rows = sizes[k]
            lo, hi = max(skip - at, 0), min(used - at, rows)                           # this shard's part
            at += rows
            if lo >= hi:
                continue
            perm = np.random.default_rng([seed, epoch, int(k)]).permutation(rows)[lo:hi]
            block = self.rows(int(k))[perm]                                            # (hi - lo, d)
            if carry is not None:
                block = np.concatenate([carry, block])
            full = len(block) // B * B
            for i in range(0, full, B):
                yield block[i:i + B]
            carry = block[full:] if full < len(block) else None

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """(n, d) float32: n distinct rows drawn at random (rng(seed)), in store order."""
        if not isinstance(n, (int, np.integer)) or not 0 < n <= self.tokens:
            raise QkvError(f"a sample of {n!r} rows: give 1..{self.tokens} (the rows in the store)")
        rows = np.sort(np.random.default_rng(seed).choice(self.tokens, size=n, replace=False))
        out = np.empty((n, self.d), np.float32)
        starts = np.cumsum([0] + [r for _, r in self.shards])                          # each shard's first row
        for k in range(len(self.shards)):
            lo, hi = np.searchsorted(rows, [starts[k], starts[k + 1]])                 # the sample's rows in shard k
            if hi > lo:
                out[lo:hi] = self.rows(k, rows[lo:hi] - starts[k])
        return out


def _mapped(f, where: str, dtype: np.dtype, shape: tuple[int, int]) -> np.ndarray:
    """The .npy in F (open, at its start) memory-mapped read-only, after its header is checked: DTYPE, C order,
    SHAPE, and the file exactly as long as the header and the data. Never unpickled (a header naming an object
    dtype is refused like any other)."""
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        found, fortran, kind = read(f)
    except (ValueError, TypeError, SyntaxError, EOFError) as e:
        raise QkvError(f"{where} is not a .npy array ({str(e).splitlines()[0][:80]}); {REMAKE}") from None
    if kind != dtype or fortran or found != shape:
        said = f"{kind}{'' if not fortran else ' (Fortran order)'} {tuple(found)}"
        raise QkvError(f"{where} holds {said}, but meta.json says {dtype} {shape}; {REMAKE}")
    offset, size = f.tell(), os.fstat(f.fileno()).st_size
    if size != offset + shape[0] * shape[1] * dtype.itemsize:
        raise QkvError(f"{where} has {size:,} bytes, not the {offset + shape[0] * shape[1] * dtype.itemsize:,} its "
                       f"header says (it is cut short or has bytes after its data); {REMAKE}")
    return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)


def read_meta(path: str | Path) -> dict | None:
    """DIR/meta.json checked (`check_meta`), None when there is none; one QkvError for one that is damaged or not
    a store's (read by runtime.io_json: a FIFO, a huge or deeply nested file is refused like a malformed one)."""
    file = Path(path) / META
    if not os.path.lexists(file):
        return None
    return check_meta(read_json(file, what=str(file), fix=f"it is not a readable activation store's; {REMAKE}, "
                                "or give another directory"), str(file))


def check_meta(data: dict, name: str) -> dict:
    """A store's meta.json (DATA, read from NAME) with every field the readers use checked, as a new dict: the
    same keys, each of the type and range the writer gives it; the shards plain names whose rows add up."""
    m = Fields(data, name, fix=REMAKE)
    if m.text("format", default="") != FORMAT:
        raise QkvError(f"{name} is not an activation store's ({FORMAT}); give another directory")
    shard_tokens = m.integer("shard_tokens", 1, 1 << 40)
    meta = {"format": FORMAT, "model": m.text("model"), "layer": m.integer("layer", 0, 1 << 20),
            "site": m.text("site", choices=SITES), "d": m.integer("d", 1, 1 << 24),
            "dtype": m.text("dtype", choices=DTYPES), "shard_tokens": shard_tokens,
            "tokens": m.integer("tokens", 0, 1 << 50), "done": m.boolean("done", False), "shards": [],
            "corpus": None, "settings": {}, "qkv": m.text("qkv", "")}
    for i, item in enumerate(m.array("shards", max_len=1 << 24)):
        s = m.sub(f"shards[{i}]", item)
        file = s.text("file", max_len=255)
        if not PLAIN.fullmatch(file) or file in (".", ".."):
            raise QkvError(f"{name}: shards[{i}].file {file[:60]!r} is not a plain file name inside the store; "
                           f"{REMAKE}")
        entry = {"file": file, "tokens": s.integer("tokens", 1, shard_tokens)}
        if item.get("read") is not None:
            r = s.object("read")
            entry["read"] = {k: r.integer(k, 0, 1 << 50) for k in ("text", "window", "row", "skipped")}
        meta["shards"].append(entry)
    held = sum(e["tokens"] for e in meta["shards"])
    if held != meta["tokens"]:
        raise QkvError(f"{name} says tokens {meta['tokens']}, but its shards hold {held}; {REMAKE}")
    if data.get("corpus") is not None:
        c = m.object("corpus")
        meta["corpus"] = {"name": c.text("name", ""), "sha256": c.text("sha256", None, max_len=64),
                          "texts": c.integer("texts", 0, 1 << 50, None), "split": c.text("split", None)}
    if data.get("settings") is not None:
        g = m.object("settings")
        found = {"source": g.text("source", None), "tokens": g.integer("tokens", 1, 1 << 50, None),
                 "context": g.integer("context", 1, 1 << 30, None), "skip_first": g.boolean("skip_first", None),
                 "split": g.text("split", None), "from": g.text("from", None)}
        meta["settings"] = {k: v for k, v in found.items() if v is not None}
    return meta


def open_activations(path: str | Path) -> Activations:
    """The store at PATH (see the module), every shard's header checked, or one error saying what is wrong."""
    path = Path(path)
    meta = read_meta(path)
    if meta is None:
        raise QkvError(f"{path} holds no activation store (no {META}); make one with qkv activations --out {path}")
    if not meta["shards"]:
        raise QkvError(f"the store at {path} has no complete shard yet; let qkv activations run longer")
    acts = Activations(path, meta)
    for k in range(len(meta["shards"])):
        acts.shard(k)                                  # a missing, foreign or damaged shard: said before any work
    return acts


# ── writing ──────────────────────────────────────────────────────────────────────

Put = Callable[[int, np.ndarray], None]            # put(row, block): BLOCK (k, d) into rows row..row+k-1


def write_shard(path: Path, rows: int, d: int, dtype: str, fill: Callable[[Put], None]) -> None:
    """A (ROWS, d) .npy at PATH: fill(put) calls put(row, block) for blocks in any order, written atomically
    (runtime.io.write_atomic: a temporary file beside PATH, renamed onto PATH once filled, removed on any error).
    No memory map: the file's space is reserved first (posix_fallocate) and the rows written with pwrite, so a
    full disk is an OSError here, one QkvError, never SIGBUS."""
    kind = np.dtype(dtype)
    size = rows * d * kind.itemsize                                                    # the data's bytes
    header = {"descr": np.lib.format.dtype_to_descr(kind), "fortran_order": False, "shape": (rows, d)}

    def write(f) -> None:
        np.lib.format.write_array_header_1_0(f, header)
        f.flush()
        offset = f.tell()
        _reserve(f.fileno(), offset + size)

        def put(row: int, block: np.ndarray) -> None:
            data = np.ascontiguousarray(block, dtype=kind)                           # (k, d)
            if data.ndim != 2 or data.shape[1] != d or not 0 <= row <= rows - len(data):
                raise ValueError(f"rows {row}..{row + len(data)} of shape {data.shape} do not fit ({rows}, {d})")
            _pwrite_all(f.fileno(), memoryview(data).cast("B"), offset + row * d * kind.itemsize)

        fill(put)

    try:
        write_atomic(path, write)
    except OSError as e:
        raise _unwritable(path, e, size) from None


def _unwritable(path: Path, e: OSError, size: int) -> QkvError:
    """The one line for a shard that could not be written: a full disk says so, and that the store continues."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return QkvError(f"the disk holding {path.parent} is full (writing {path.name}, {size / 2**20:,.1f} MB); free "
                        "some space or give another --out, then rerun the same command to continue")
    return QkvError(f"cannot write {path}: {e.strerror or e}; choose a writable --out")


def _reserve(fd: int, size: int) -> None:
    """The file's SIZE bytes allocated now (a full disk fails here, before any row is made); a file system that
    cannot preallocate just has the file extended, and a full disk shows at the first write instead."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            raise
        os.ftruncate(fd, size)
    except AttributeError:                             # no posix_fallocate (macOS)
        os.ftruncate(fd, size)


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    """All of DATA at byte AT of FD (pwrite may write less than asked)."""
    while len(data):
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


def save_meta(path: Path, meta: dict) -> None:
    """meta.json rewritten atomically; a full disk is one QkvError (the store stays as it was)."""
    try:
        write_text(path / META, json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    except OSError as e:
        raise QkvError(f"cannot write {path / META}: {e.strerror or e}; free some space or give another --out, "
                       "then rerun the same command to continue") from None


def new_meta(model: str, layer: int, site: str, d: int, dtype: str, shard_tokens: int, corpus: dict | None,
             settings: dict) -> dict:
    from .. import __version__

    return {"format": FORMAT, "model": model, "layer": int(layer), "site": site, "d": int(d), "dtype": dtype,
            "shard_tokens": int(shard_tokens), "tokens": 0, "done": False, "shards": [], "corpus": corpus,
            "settings": settings, "qkv": __version__}


def write_activations(path: str | Path, array: np.ndarray, *, model: str, layer: int, site: str,
                      dtype: str = "float32", shard_tokens: int = SHARD_TOKENS) -> Activations:
    """ARRAY (T, d) as a store at PATH (a new or empty directory), in shards of SHARD_TOKENS rows."""
    check_settings(site, dtype, shard_tokens)
    a = np.asarray(array)
    if a.ndim != 2 or len(a) == 0:
        raise QkvError(f"write_activations takes a (T, d) array with T ≥ 1, not shape {a.shape}")
    path = Path(path)
    if path.exists() and not path.is_symlink() and any(path.iterdir()):
        raise QkvError(f"{path} is not empty; give a new directory")
    try:
        real_directory(path)
    except OSError as e:
        raise QkvError(f"cannot write to {path}: {e.strerror}; choose a writable directory") from None
    check_range(a, dtype)
    meta = new_meta(model, layer, site, a.shape[1], dtype, shard_tokens, None, {"from": "write_activations"})
    for k, lo in enumerate(range(0, len(a), shard_tokens)):
        part = a[lo:lo + shard_tokens]
        write_shard(path / shard_name(k), len(part), a.shape[1], dtype, lambda put: put(0, part))
        meta["shards"].append({"file": shard_name(k), "tokens": len(part)})
        meta["tokens"] += len(part)
    meta["done"] = True
    save_meta(path, meta)
    return Activations(path, meta)


def check_settings(site: str, dtype: str, shard_tokens: int) -> None:
    if site not in SITES:
        raise QkvError(f"unknown site {site!r}; choose one of {', '.join(SITES)}")
    if dtype not in DTYPES:
        raise QkvError(f"unknown dtype {dtype!r}; choose float16 or float32")
    if not isinstance(shard_tokens, (int, np.integer)) or shard_tokens < 1:
        raise QkvError(f"shard_tokens={shard_tokens!r} must be an integer ≥ 1")


def check_range(a: np.ndarray, dtype: str) -> None:
    """float16 holds |x| ≤ 65504: a larger value would be stored as inf."""
    if dtype == "float16" and a.size and float(np.abs(a).max()) > FLOAT16_MAX:
        raise QkvError(f"an activation of {float(np.abs(a).max()):.4g} does not fit float16 (at most {FLOAT16_MAX:g}); "
                       "store float32 (--dtype float32), or drop each window's first token (--skip-first)")


# ── the rows of a site ─────────────────────────────────────────────────────────────

def site_rows(model: "Model", layer: int, site: str, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """ids (B, n) right-padded to LENGTHS → the site's (B, n, d) in float32, running blocks 0..LAYER-1 (resid)
    or 0..LAYER (attn_out, ffn_out) only; past the last block only the last position's logits are made."""
    from ..core.stack import transformer
    from ..core.trace import Recorder

    mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)      # (B, n)
    if site == "resid":
        x, _ = transformer(model.weights, model.config, ids, mask, stop=layer)          # (B, n, d) entering LAYER
        return x
    rec = Recorder(layers=[layer], keep=(RECORDED[site],))
    transformer(model.weights, model.config, ids, mask, rec=rec, stop=layer + 1, logits="last")
    return rec.store[layer][RECORDED[site]]                                            # (B, n, d)


def stored_files(out: str | Path) -> list[Path]:
    """The store's files (meta.json and the shards), for sizes and clean-up."""
    out = Path(out)
    return [p for p in [out / META, *sorted(out.glob("acts-[0-9][0-9][0-9][0-9][0-9].npy"))] if p.is_file()]

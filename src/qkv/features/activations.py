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
                       temporary name and renamed: a shard is there whole or not at all

Reading (what SAE training codes against):
    acts = open_activations(DIR)        .model .layer .site .d .tokens .dtype .shards
    acts.batches(batch_size, seed=0, start=0, epochs=1)   float32 (batch_size, d) arrays: each epoch one pass,
        shard order shuffled, rows shuffled within each shard (one shard in memory at a time), the epoch's last
        partial batch dropped; deterministic given the seed; start= batches skipped without reading them
    acts.sample(n, seed=0)              (n, d) float32 rows drawn without replacement, in store order
    write_activations(DIR, array, model=, layer=, site=, ...)   an array as a store (tests, Python users)
Only the shards meta.json lists are read: a store still being made reads as far as it is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ..engine.errors import QkvError
from ..engine.io import real_directory, write_text

if TYPE_CHECKING:
    from ..engine.model import Model

SITES = ("resid", "attn_out", "ffn_out")
RECORDED = {"resid": "residual", "attn_out": "attn_out", "ffn_out": "ffn_out"}     # qkv's intermediate names
DTYPES = ("float16", "float32")
SHARD_TOKENS = 65536
CONTEXT = 128             # tokens a window (SAELens's usual context for small models)
BATCH_TOKENS = 2048       # padded tokens a forward pass (as qkv neurons: a stored model dequantises once a pass)
FORMAT = "qkv-activations/1"
META = "meta.json"
FLOAT16_MAX = float(np.finfo(np.float16).max)


def shard_name(k: int) -> str:
    return f"acts-{k:05d}.npy"


# ── reading ──────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Activations:
    """A store on disk (see the module): its meta and its complete shards, memory-mapped when read."""

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
        """Shard K memory-mapped, (T_k, d) in the stored dtype."""
        path, rows = self.shards[k]
        a = np.load(path, mmap_mode="r")
        if a.shape != (rows, self.d):
            raise QkvError(f"{path} holds {a.shape}, but {META} says ({rows}, {self.d}); the store is damaged: "
                           "remake it (delete the shard and rerun the command to redo it)")
        return a

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
            block = np.asarray(self.shard(int(k)), dtype=np.float32)[perm]             # (hi - lo, d)
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
                out[lo:hi] = self.shard(k)[rows[lo:hi] - starts[k]]
        return out


def read_meta(path: str | Path) -> dict | None:
    """DIR/meta.json as a dict, None when there is none; a clear error for one that is not a store's."""
    file = Path(path) / META
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QkvError(f"cannot read {file}: {e}; it is not an activation store's (give another --out)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise QkvError(f"{file} is not an activation store's ({FORMAT}); give another directory")
    return meta


def open_activations(path: str | Path) -> Activations:
    """The store at PATH (see the module), or one error saying what is missing."""
    path = Path(path)
    meta = read_meta(path)
    if meta is None:
        raise QkvError(f"{path} holds no activation store (no {META}); make one with qkv activations --out {path}")
    if not meta["shards"]:
        raise QkvError(f"the store at {path} has no complete shard yet; let qkv activations run longer")
    return Activations(path, meta)


# ── writing ──────────────────────────────────────────────────────────────────────

def write_shard(path: Path, rows: int, d: int, dtype: str, fill: Callable[[np.ndarray], None]) -> None:
    """fill(a) writes a memory-mapped (ROWS, d) array of a temporary file beside PATH; renamed onto PATH after."""
    from ..engine.io import temporary_file

    fd, tmp = temporary_file(path)
    os.close(fd)
    try:
        a = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(rows, d))
        fill(a)
        a.flush()
        del a
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_meta(path: Path, meta: dict) -> None:
    write_text(path / META, json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


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
        write_shard(path / shard_name(k), len(part), a.shape[1], dtype, lambda m: m.__setitem__(slice(None), part))
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
    from ..engine.model import transformer
    from ..engine.trace import Recorder

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

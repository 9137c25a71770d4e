"""Compiled numba kernels kept on disk: a process loads a kind's kernel in ~0.5 s instead of compiling it in ~2 s.

The stored-weight kernels (`stored_kernels`) do not use numba's own cache (`njit(cache=True)`), which
broke them (issue 42):
    - it writes into the installed package's __pycache__ (a read-only install: no cache at all);
    - an entry compiled while a parallel function it calls was loaded from that cache is saved without
      numba's start of its thread pool (a library read back from the cache has lost its `reload_init`;
      numba issue 8578): a later process whose first call is that entry crashes (SIGSEGV). Q4_0 then
      Q4_1 did it (their parallel loop was shared), and so could two processes compiling at once;
    - a damaged or truncated file is a traceback or a crash: nothing checks what is read back;
    - a change to simd.py (another file than the kernels') left the old kernels in use.

Here each entry (a function Python calls) is kept whole, and nothing else:

    folder          cache_dir()/kernels/<hash of numba, llvmlite, Python and the kernels' source files>:
                    any change to them is a new folder, so stale code is never loaded
    a file an entry <function>-<hash of its argument types and the CPU>.nbk, written whole (io.write_atomic)
                    by the process that compiled it; processes compiling at once write equal files and
                    the last rename wins, and no file is shared by two entries (no index to rewrite)
    checked         MAGIC, sha256 of the rest, then the pickled (key, compiled entry): a file that is
                    damaged, truncated, not a regular file or saved for another key is a miss, compiled
                    again and written again
    self-contained  an entry's callees are compiled into it, never read from the cache, and a parallel
                    loop sits only in an entry: what an entry needs at load (its thread pool) it carries

QKV_CACHE=off keeps nothing (each process compiles); a folder that cannot be written is one warning, and
each process compiles.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import warnings
from pathlib import Path

import llvmlite
import numba

try:                            # numba's internals this cache plugs into (checked on numba 0.60–0.68)
    from numba.core import sigutils
    from numba.core.caching import NullCache
    from numba.core.compiler import CompileResult
    from numba.core.serialize import dumps
except ImportError:             # another numba: no disk cache (each process compiles), never a broken import
    NullCache = None

from .io import cache_dir, open_regular, real_directory, write_atomic

MAGIC = b"qkv numba kernel 1\n"
LIMIT = 64 << 20                # bytes a kernel's file may have (one has 30-100 KB)
_warned = False


def named(fn, name: str):
    """FN (a Python function numba will compile) named NAME. A function compiled apart (not inlined) is linked into
    each kept entry under its name and numba's id, and the ids restart in every process: two entries kept by two
    processes, read back into a third, must not hold two bodies of one name, or one entry runs the other's code
    (measured: a Q4_1 product computed with Q4_0's rows). So every closure a factory makes for several kinds is
    named after its kind."""
    fn.__name__ = fn.__qualname__ = name
    return fn


def keep(entries: list, sources: list[Path]) -> None:
    """Give each numba dispatcher of ENTRIES a `DiskCache` for what SOURCES (the .py files they are compiled
    from) compile to; nothing when the sources cannot be read (a frozen or zipped install)."""
    if NullCache is None:
        return
    h = hashlib.sha256()
    for part in (numba.__version__, llvmlite.__version__, sys.version, sys.platform):
        h.update(part.encode() + b"\0")
    try:
        for src in sources:
            h.update(Path(src).read_bytes())
    except OSError:
        return
    for entry in entries:
        if hasattr(entry, "py_func"):                    # a dispatcher (NUMBA_DISABLE_JIT: plain functions)
            entry._cache = DiskCache(entry.py_func.__name__, h.hexdigest()[:16])    # what njit(cache=True) sets


class DiskCache(NullCache or object):
    """numba's cache interface (a dispatcher calls load_overload before compiling, save_overload after) over
    one checked file an entry and signature (see the module's docstring)."""

    def __init__(self, name: str, version: str):
        self.name, self.version = name, version

    @property
    def where(self) -> Path | None:
        """cache_dir()/kernels/VERSION, as QKV_CACHE says now; None when it is off."""
        root = cache_dir()
        return None if root is None else root / "kernels" / self.version

    @property
    def cache_path(self) -> str | None:
        return None if self.where is None else str(self.where)

    def _path(self, key: tuple) -> Path | None:
        where = self.where
        return None if where is None else where / f"{self.name}-{hashlib.sha256(repr(key).encode()).hexdigest()[:20]}.nbk"

    def load_overload(self, sig, target_context):
        """The compiled entry for argument types SIG, or None (not kept, or its file is not sound)."""
        target_context.refresh()
        key = _key(sig, target_context.codegen())
        path = self._path(key)
        payload = None if path is None else read(path, key)
        return None if payload is None else CompileResult._rebuild(target_context, *payload)

    def save_overload(self, sig, cres) -> None:
        """Keep CRES, compiled for SIG (unless numba cannot: lifted loops, addresses of this process)."""
        if any(not lifted.can_cache for lifted in cres.lifted) or cres.library.has_dynamic_globals:
            return
        key = _key(sig, cres.codegen)
        path = self._path(key)
        if path is None:
            return
        body = dumps((key, cres._reduce()))
        blob = MAGIC + hashlib.sha256(body).digest() + body
        try:
            real_directory(path.parent)
            write_atomic(path, lambda f: f.write(blob))
        except OSError as e:
            _warn_once(f"qkv: cannot keep compiled kernels in {path.parent} ({e.strerror or e}); each run compiles "
                       "them again (~2 s a kind); set QKV_CACHE to a writable folder")


def _key(sig, codegen) -> tuple:
    """What an entry's file is kept under: its argument types, and the CPU (name and features) it was built for."""
    args, _ = sigutils.normalize_signature(sig)
    return tuple(str(t) for t in args), tuple(str(m) for m in codegen.magic_tuple())


def read(path: Path, key: tuple) -> tuple | None:
    """What `save_overload` wrote at PATH for KEY, or None when PATH is missing, a link or not a regular file,
    damaged or truncated (its hash), or kept for another key."""
    try:
        if path.is_symlink():
            return None
        with open_regular(path, LIMIT) as f:
            blob = f.read()
    except OSError:
        return None
    start = len(MAGIC) + 32
    if blob[:len(MAGIC)] != MAGIC or hashlib.sha256(blob[start:]).digest() != blob[len(MAGIC):start]:
        return None
    try:
        saved, payload = pickle.loads(blob[start:])
    except Exception:                      # a sound hash over a stream pickle cannot read: written by another numba
        return None
    return payload if saved == key else None


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, stacklevel=2)

"""qkv's cache of converted GGUF files: each file's Hugging Face directory (gguf.py's `describe`, and its
`write_tensors` for a float32 or float64 load), kept once in qkv's cache directory (runtime.io.cache_dir).

An entry is named by the file's stem and a hash of its place, size, modification time and
CONVERTER_VERSION, so a changed file or converter makes a new one (the older conversions of that file are
removed). Entries are written atomically and never onto a link; a link or a stray file where an entry
would go is refused in one line; an entry whose qkv_source.json or config.json is not what qkv wrote (cut
short by a full disk, edited by hand) is a cache miss, set aside and written again. `QKV_CACHE=off`
writes in a temporary directory instead (`is_temporary`: the loader deletes it once loaded).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..runtime.errors import QkvError
from ..runtime.io import cache_dir, write_directory
from .gguf import CONVERTER_VERSION, _source_json, _vocab_size, describe, source_of, write_tensors
from .gguf_reader import check_file


def cache_root() -> Path | None:
    """Where converted GGUF files live: qkv's cache directory (runtime.io.cache_dir: $QKV_CACHE, else
    $XDG_CACHE_HOME/qkv or ~/.cache/qkv); None when QKV_CACHE is 'off'."""
    return cache_dir()


_TEMPORARY = "qkv-gguf-"


def is_temporary(directory: Path) -> bool:
    """Whether `directory` is a conversion made with QKV_CACHE=off (to delete once loaded)."""
    return directory.name.startswith(_TEMPORARY) and directory.parent == Path(tempfile.gettempdir())


def _key(path: Path) -> str:
    """A cache key that changes when the file (its place, size or modification time) or the converter does."""
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}"
    return f"{path.stem[:60]}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def _writing(step, path: Path, out: Path) -> None:
    """step(path, out) (describe or write_tensors), with a full disk or an unwritable place reported in one line."""
    try:
        step(path, out)
    except OSError as e:
        raise QkvError(f"cannot write the converted GGUF model to {out.parent}: {e.strerror}; free some space "
                       "or set QKV_CACHE to a writable directory") from None


def _drop_stale(root: Path, final: Path, source: Path) -> None:
    """Remove older conversions of the same file (it changed, or the converter did)."""
    for entry in root.glob(f"{_glob_escape(final.name.rsplit('-', 1)[0])}-*"):
        if entry == final or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            if _source_json(entry).get("gguf") == str(source.resolve()):
                shutil.rmtree(entry, ignore_errors=True)
        except QkvError:
            continue


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in text)


def described(path: str | os.PathLike) -> Path:
    """The Hugging Face directory of a GGUF file without its tensors (config.json, the tokenizer): from
    the cache, or written now (atomically: into a private temporary directory, then renamed into place:
    runtime.io.write_directory). A stored load reads the tensors from the GGUF file itself."""
    path = Path(path)
    check_file(path)
    root = cache_root()
    if root is None:
        out = Path(tempfile.mkdtemp(prefix=_TEMPORARY))
        try:
            _writing(describe, path, out)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        return out
    final = root / _key(path)
    if final.is_symlink() or (os.path.lexists(final) and not (final / "qkv_source.json").is_file()):
        raise QkvError(f"{final} is in qkv's GGUF cache but was not written by qkv (a link or a stray file); "
                       "remove it, or set QKV_CACHE to another directory")
    if final.is_dir():
        damage = _damage(final, path)
        if damage is None:
            return final
        _set_aside(final, damage)
    try:
        root.mkdir(parents=True, exist_ok=True)
        placed = write_directory(final, lambda tmp: _writing(describe, path, tmp))    # never onto a link
    except OSError as e:
        raise QkvError(f"cannot write the GGUF cache {root}: {e.strerror}; set QKV_CACHE to a writable "
                       "directory, or QKV_CACHE=off") from None
    if placed:
        _drop_stale(root, final, path)
    elif final.is_symlink() or not (final / "qkv_source.json").is_file():
        raise QkvError(f"cannot write the GGUF cache {root}: {final.name} appeared there, not written by qkv; "
                       "remove it, or set QKV_CACHE to another directory")
    # else another process described the same file first: use its copy
    return final


def _damage(entry: Path, path: Path) -> str | None:
    """What is wrong with cache ENTRY of GGUF file PATH (a qkv_source.json or config.json that is not the JSON
    `describe` wrote: cut short by a full disk, edited by hand), or None when both read as they should."""
    try:
        if _source_json(entry).get("gguf") != str(path.resolve()):
            return "its qkv_source.json names another file"
        _vocab_size(entry)
    except QkvError as e:
        return str(e).split("; ")[0]
    return None


def _set_aside(entry: Path, damage: str) -> None:
    """Cache ENTRY is damaged (DAMAGE says how): a cache miss. Said once on stderr; the entry is renamed away
    (a reader of it keeps its open files) and removed, and the caller describes the GGUF file again."""
    print(f"qkv: the GGUF cache entry {entry} is damaged ({damage}); converting the file again", file=sys.stderr)
    aside = entry.with_name(f".{entry.name}.damaged-{os.getpid()}")
    try:
        os.rename(entry, aside)
    except FileNotFoundError:                         # another process set it aside first
        return
    except OSError as e:
        raise QkvError(f"cannot replace the damaged {entry}: {e.strerror}; remove it, or set QKV_CACHE to another "
                       "directory") from None
    shutil.rmtree(aside, ignore_errors=True)


def converted(path: str | os.PathLike) -> Path:
    """The Hugging Face directory of a GGUF file with its tensors dequantised to float32 (model.safetensors,
    what a float32 or float64 load maps): `described`, and `with_tensors`."""
    return with_tensors(described(path))


def with_tensors(out: Path) -> Path:
    """A described directory OUT with model.safetensors in it, written the first time (atomically)."""
    tensors = out / "model.safetensors"
    if tensors.is_symlink() or (os.path.lexists(tensors) and not tensors.is_file()):
        raise QkvError(f"{tensors} in qkv's GGUF cache is not a file qkv wrote (a link or a folder); remove it, "
                       "or set QKV_CACHE to another directory")
    if not tensors.is_file():
        _writing(write_tensors, source_of(out), out)
    return out

"""Writing files safely: the whole file or none of it, and never through a planted link.

    write_atomic(path, write)   write(f) into a new temporary file beside PATH, then rename it onto PATH
    write_text(path, text)      the same for a string (UTF-8)
    real_directory(path, subs)  PATH as a folder qkv may write in: made if missing, refused if it (or a
                                sub-folder SUBS the command will use) is a link
    FileBatch(directory)        several files in one directory, all renamed into place together or none
    write_directory(path, write)  write(tmp) fills a new temporary directory beside PATH, renamed to PATH
    remove_leftovers(directory) the temporary files of writers that died mid-write (kill -9), removed
    cache_dir()                 where qkv keeps what it measured or made once per machine (None: nowhere)

How: the temporary file is made by `tempfile.mkstemp` in the target's own directory (the rename must
stay on one file system to be atomic). mkstemp picks an unpredictable name and creates it with
O_CREAT | O_EXCL, so a link planted at that name makes it fail instead of being followed; and
`os.replace` renames onto the target name itself, replacing a link there rather than writing where
it points. A reader sees the old file or the new one, never half of one; on any error the temporary
file is removed and the target is unchanged.

Mode: every file is written 0o644 narrowed by the umask (FILE_MODE & ~umask), so the usual umask 022
gives rw-r--r--, a private umask 077 gives rw-------, and no file is ever group- or world-writable.
(mkstemp alone would give 0o600 whatever the umask; `open()` would give 0o666 & ~umask.)

Writes are not fsynced unless asked (`fsync=True`): after a crash of the machine a file may be empty,
but never half-written by a crash of qkv. Errors are OSError; callers turn them into a QkvError that
says what they were writing.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable

FILE_MODE = 0o644


def umask() -> int:
    """The process's umask, read without changing it where Linux reports it (threads may be writing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)                  # elsewhere: set and restore (the only portable way)
    os.umask(mask)
    return mask


def open_regular(path: str | os.PathLike, limit: int | None = None) -> IO[bytes]:
    """PATH open for binary reading if it is a regular file (after links) of at most LIMIT bytes; else OSError
    naming what it is. A FIFO is refused without waiting for a writer (opened non-blocking, then fstat), a device
    (/dev/zero, /dev/urandom) before a byte is read: input that would hang or never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd)
        if not stat.S_ISREG(mode.st_mode):
            if stat.S_ISDIR(mode.st_mode):
                raise OSError(errno.EISDIR, "it is a directory, not a regular file", os.fspath(path))
            kind = "a FIFO" if stat.S_ISFIFO(mode.st_mode) else "a device or socket"
            raise OSError(errno.EINVAL, f"it is {kind}, not a regular file", os.fspath(path))
        if limit is not None and mode.st_size > limit:
            raise OSError(errno.EFBIG, f"it has {mode.st_size:,} bytes, more than {limit:,}", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def refuse_link(path: str | os.PathLike) -> None:
    """OSError(ELOOP) when PATH is a symbolic link (even a dangling one): qkv writes into folders it was given,
    never into wherever a link planted at one points (an --out at /etc, a run's checkpoints linked elsewhere)."""
    if os.path.islink(path):
        raise OSError(errno.ELOOP, f"{os.fspath(path)} is a link, and qkv does not write through links", os.fspath(path))


def real_directory(path: str | os.PathLike, subs: tuple[str, ...] = ()) -> Path:
    """PATH as a directory to write in, made (with its parents) if missing. Refused (OSError) before anything
    is written when PATH, or PATH/SUB for a sub-folder SUB the command will create or use, is a link or a
    file; checked again after making PATH (a link planted between the check and mkdir)."""
    path = Path(path)
    refuse_link(path)
    path.mkdir(parents=True, exist_ok=True)
    refuse_link(path)
    for sub in subs:
        refuse_link(path / sub)
        if (path / sub).exists() and not (path / sub).is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{path / sub} is a file where qkv writes a folder", str(path / sub))
    return path


LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")    # .NAME.PID.RANDOM.tmp (`temporary_file`)


def remove_leftovers(directory: str | os.PathLike, name: str | None = None) -> None:
    """Remove the temporary files (of NAME, or of any file) in DIRECTORY whose writer has died: a process killed
    mid-write (kill -9, a crash) leaves its .NAME.PID.*.tmp behind; the next write there cleans it. A file
    whose PID still runs is another writer's, and stays (as do links and anything not named so)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        m = LEFTOVER.match(entry.name)
        if not m or (name is not None and m["name"] != name) or not entry.is_file(follow_symlinks=False):
            continue
        try:
            os.kill(int(m["pid"]), 0)                   # alive (or another user's: PermissionError)
        except ProcessLookupError:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
        except (PermissionError, OverflowError, ValueError):
            pass


def temporary_file(path: str | os.PathLike) -> tuple[int, Path]:
    """(fd, name) of a new, empty temporary file beside PATH, mode FILE_MODE & ~umask, to be renamed onto PATH;
    named .NAME.PID.RANDOM.tmp, so that a later write can tell a dead writer's leftover (`remove_leftovers`)."""
    path = Path(path)
    remove_leftovers(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE & ~umask())
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, Path(tmp)


def write_atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], object], *, fsync: bool = False) -> Path:
    """write(f) into a temporary file beside PATH (f open for binary writing), then rename it onto PATH.

    PATH is replaced whole or not at all; a link at PATH is replaced, never followed.
    """
    path = Path(path)
    fd, tmp = temporary_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str, *, fsync: bool = False) -> Path:
    """TEXT as UTF-8 into PATH, atomically (see `write_atomic`)."""
    data = text.encode("utf-8", errors="replace")          # a lone surrogate from a token becomes '?'
    return write_atomic(path, lambda f: f.write(data), fsync=fsync)


class FileBatch:
    """Files written into one directory together: all of them, or none.

        with FileBatch(out) as batch:
            batch.write("a.png", lambda f: fig.savefig(f, format="png"))
            batch.write_text("b.html", page)
        batch.paths                     # [out/a.png, out/b.html], renamed into place at the end

    Each file goes to its own temporary file beside its final name as it is written; when the
    block ends without an error they are all renamed into place, else all removed, and a
    directory the batch created (and left empty) is removed too. (Only a rename failing
    midway, e.g. the directory removed under it, could leave some files renamed.)
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = False):
        self.directory = Path(directory)
        self.fsync = fsync
        self.paths: list[Path] = []                               # final names, in the order written
        self._pending: list[tuple[Path, Path]] = []               # (temporary file, final name)
        self._created = False

    def __enter__(self) -> "FileBatch":
        self._created = not os.path.lexists(self.directory)
        real_directory(self.directory)
        return self

    def write(self, name: str, write: Callable[[IO[bytes]], object]) -> Path:
        """write(f) into a temporary file for DIRECTORY/NAME; renamed there when the batch ends well."""
        final = self.directory / name
        fd, tmp = temporary_file(final)
        self._pending.append((tmp, final))
        with os.fdopen(fd, "wb") as f:
            write(f)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        return final

    def write_text(self, name: str, text: str) -> Path:
        """TEXT as UTF-8 into DIRECTORY/NAME, with the batch."""
        data = text.encode("utf-8", errors="replace")
        return self.write(name, lambda f: f.write(data))

    def __exit__(self, kind, error, tb) -> None:
        if kind is None:
            try:
                for tmp, final in self._pending:
                    os.replace(tmp, final)
                    self.paths.append(final)
                return
            except BaseException:
                self._discard()
                raise
        self._discard()

    def _discard(self) -> None:
        for tmp, _ in self._pending:
            tmp.unlink(missing_ok=True)
        if self._created and self.directory.is_dir() and not any(self.directory.iterdir()):
            self.directory.rmdir()


def write_directory(path: str | os.PathLike, write: Callable[[Path], object]) -> bool:
    """write(tmp) fills a new, private temporary directory beside PATH (tmp is its path), then it
    is renamed to PATH: a reader sees no PATH or the whole directory, never a part of it.

    A directory with files at PATH is never replaced (an empty one is): if another writer finished
    first, its PATH is kept, the new directory removed, and False returned; True when the new
    directory is now PATH. A link or a file at PATH is never followed nor replaced (rename fails on
    it: OSError). The directory is mkdtemp's: an
    unpredictable name, mode 0o700. On any error it is removed (`shutil.rmtree`, which does not
    follow links inside it) and PATH is unchanged.
    """
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    placed = False
    try:
        write(tmp)
        try:
            os.rename(tmp, path)                         # onto a directory only if it is empty
            placed = True
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY) or path.is_symlink():
                raise
    finally:
        if not placed:
            shutil.rmtree(tmp, ignore_errors=True)
    return placed


def cache_dir() -> Path | None:
    """$QKV_CACHE, else $XDG_CACHE_HOME/qkv or ~/.cache/qkv: the tuning choices (runtime.tuning), converted
    GGUF files (checkpoints.gguf_cache) and the pages' font subsets (viz.hangul). None when QKV_CACHE is off (off, 0, no or empty): keep nothing."""
    env = os.environ.get("QKV_CACHE")
    if env is not None and env.lower() in ("off", "0", "no", ""):
        return None
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "qkv"

"""qkv.runtime.io: whole files (and directories) or none, never through a link, one mode."""

from __future__ import annotations

import os

import pytest

from qkv.runtime.io import FILE_MODE, FileBatch, real_directory, umask, write_atomic, write_directory, write_text


@pytest.fixture
def mask():
    """Run a test under umask 022, then restore the caller's."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_write_replaces_the_file_whole(tmp_path, mask):
    path = tmp_path / "a.txt"
    path.write_text("old")
    assert write_text(path, "new ☃") == path
    assert path.read_text(encoding="utf-8") == "new ☃" and not leftovers(tmp_path)


def test_a_failing_write_leaves_the_old_file_and_no_temporary(tmp_path, mask):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def broken(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(path, broken)
    assert path.read_bytes() == b"old" and not leftovers(tmp_path)


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path, mask):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "out.html"
    link.symlink_to(victim)
    write_text(link, "page")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "page"


def test_a_link_planted_at_a_predictable_temporary_name_is_never_written(tmp_path, mask):
    """The old totals.write_atomic wrote through `.NAME.PID.tmp`: a link planted there redirected it."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / f".ckpt.npz.{os.getpid()}.tmp").symlink_to(victim)
    (tmp_path / ".ckpt.npz.tmp").symlink_to(victim)
    write_atomic(tmp_path / "ckpt.npz", lambda f: f.write(b"data"))
    assert victim.read_text() == "precious" and (tmp_path / "ckpt.npz").read_bytes() == b"data"


@pytest.mark.parametrize("process_mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o644)])
def test_one_mode_narrowed_by_the_umask(tmp_path, process_mask, mode):
    old = os.umask(process_mask)
    try:
        assert umask() == process_mask
        write_text(tmp_path / "a", "x")
        with FileBatch(tmp_path / "d") as files:
            files.write_text("b", "y")
    finally:
        os.umask(old)
    assert FILE_MODE == 0o644
    assert (tmp_path / "a").stat().st_mode & 0o777 == mode
    assert (tmp_path / "d" / "b").stat().st_mode & 0o777 == mode


def test_a_batch_renames_all_files_at_the_end(tmp_path, mask):
    out = tmp_path / "out"
    with FileBatch(out) as files:
        files.write_text("a.html", "page")
        files.write("b.png", lambda f: f.write(b"\x89PNG"))
        assert not (out / "a.html").exists()                     # nothing in place before the end
    assert files.paths == [out / "a.html", out / "b.png"]
    assert (out / "a.html").read_text() == "page" and not leftovers(out)


def test_a_failing_batch_leaves_nothing(tmp_path, mask):
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    (existing / "a.html").write_text("old")
    for out in (fresh, existing):
        with pytest.raises(RuntimeError):
            with FileBatch(out) as files:
                files.write_text("a.html", "new")
                raise RuntimeError("the second figure failed")
    assert not fresh.exists()                                     # the directory it made is gone
    assert sorted(p.name for p in existing.iterdir()) == ["a.html", "notes.txt"]
    assert (existing / "a.html").read_text() == "old"


# ── write_directory ──────────────────────────────────────────────────────────────

def test_a_directory_appears_whole(tmp_path):
    out = tmp_path / "conv"

    def fill(tmp):
        assert tmp.parent == tmp_path and tmp.name.startswith(".") and not out.exists()   # nothing in place yet
        (tmp / "a.json").write_text("{}")
        (tmp / "b.bin").write_bytes(b"x" * 10)

    assert write_directory(out, fill) is True
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.bin"] and not leftovers(tmp_path)
    assert out.stat().st_mode & 0o777 == 0o700                    # private, as mkdtemp makes it


def test_a_failing_directory_write_leaves_nothing(tmp_path):
    def broken(tmp):
        (tmp / "half").write_text("x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_directory(tmp_path / "conv", broken)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_written_first_by_another_is_kept(tmp_path):
    out = tmp_path / "conv"
    out.mkdir()
    (out / "theirs").write_text("first")
    assert write_directory(out, lambda tmp: (tmp / "mine").write_text("second")) is False
    assert sorted(p.name for p in out.iterdir()) == ["theirs"] and not leftovers(tmp_path)


def test_a_link_at_the_directory_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("x")
    link = tmp_path / "conv"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        write_directory(link, lambda tmp: (tmp / "mine").write_text("y"))
    assert link.is_symlink() and sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert not leftovers(tmp_path)


def test_a_dead_writers_temporary_files_are_removed_by_the_next_write(tmp_path):
    """kill -9 mid-write leaves .NAME.PID.*.tmp: the next write of NAME removes it when PID no longer runs,
    and leaves a running writer's (and other names') alone."""
    dead = tmp_path / ".page.html.4194999.abcd1234.tmp"                  # past Linux's largest pid: not running
    alive = tmp_path / f".page.html.{os.getpid()}.efgh5678.tmp"
    other = tmp_path / ".other.html.4194999.ijkl9012.tmp"
    for p in (dead, alive, other):
        p.write_text("half")
    write_text(tmp_path / "page.html", "whole")
    assert not dead.exists() and alive.exists() and other.exists()
    with FileBatch(tmp_path) as batch:
        batch.write_text("other.html", "whole")
    assert not other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "other.html", "page.html"])


def test_real_directory_refuses_links_at_the_folder_and_its_sub_folders(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="is a link"):
        real_directory(tmp_path / "link")
    (tmp_path / "run" / "checkpoints").parent.mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="checkpoints is a link"):
        real_directory(tmp_path / "run", ("checkpoints", "model"))
    assert real_directory(tmp_path / "new" / "deep", ("model",)).is_dir()
    with pytest.raises(OSError, match="is a link"):
        with FileBatch(tmp_path / "link") as batch:
            batch.write_text("a.txt", "x")
    assert list((tmp_path / "elsewhere").iterdir()) == []

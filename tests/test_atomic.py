import pytest

from rfsgen import OutputExistsError, UsageError
from rfsgen.atomic import atomic_path


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            open(tmp, "wb").write(b"partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            open(tmp, "wb").write(b"partial")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with atomic_path(target) as tmp:
        open(tmp, "wb").write(b"done")
    assert target.read_bytes() == b"done"
    with pytest.raises(OutputExistsError, match=r"already exists; pass overwrite=True to replace it$"):
        with atomic_path(target):
            pass


# ----------------------------------------------------------------------------- in-memory inputs


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    import os

    from rfsgen.atomic import _host, remove_stale_temporaries

    host = _host()
    stale = tmp_path / f".out.h5.rfsgen-{host}-{_dead_pid()}-ab12cd.part"
    alive = tmp_path / f".out.h5.rfsgen-{host}-{os.getpid()}-ef34gh.part"
    other_host = tmp_path / f".out.h5.rfsgen-otherhost-{_dead_pid()}-ij56kl.part"
    foreign = tmp_path / ".out.h5.abc.part"  # not rfsgen's: never touched
    for p in (stale, alive, other_host, foreign):
        p.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == [stale.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, other_host, foreign))
    stale.write_bytes(b"x")
    with atomic_path(tmp_path / "new.bin") as tmp:  # any run into the directory sweeps first
        assert not stale.exists()
        open(tmp, "wb").write(b"ok")


def test_no_clobber_is_atomic(tmp_path):
    """Another writer finishing first (the path appears while this run works) is never
    silently replaced."""
    target = tmp_path / "out.bin"
    with pytest.raises(OutputExistsError, match="was created by another process while this one ran"):
        with atomic_path(target) as tmp:
            open(tmp, "wb").write(b"mine")
            target.write_bytes(b"theirs")  # the concurrent run wins the race
    assert target.read_bytes() == b"theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    with atomic_path(target, overwrite=True) as tmp:
        open(tmp, "wb").write(b"mine")
    assert target.read_bytes() == b"mine"


def test_a_pipe_or_device_is_never_replaced_by_the_output(tmp_path):
    """The finished file is moved over the output path: over a FIFO or a device node
    (``-o /dev/null --overwrite``) that would replace the node itself, so it is refused,
    before the run and again at the move, and the node stays; a symbolic link to one is
    replaced as a link (the node it names is untouched)."""
    import os
    import stat

    from rfsgen import OutputError

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="pipe: is a pipe, not a regular file; .* give a file name"):
            with atomic_path(fifo, overwrite=overwrite) as tmp:
                open(tmp, "wb").write(b"x")
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
    late = tmp_path / "late"
    with pytest.raises(OutputError, match="is a pipe"):
        with atomic_path(late, overwrite=True) as tmp:
            open(tmp, "wb").write(b"x")
            os.mkfifo(late)  # appears while the run computes
    assert stat.S_ISFIFO(os.lstat(late).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["late", "pipe"]
    link = tmp_path / "link"
    link.symlink_to(fifo)
    with atomic_path(link, overwrite=True) as tmp:
        open(tmp, "wb").write(b"done")
    assert link.read_bytes() == b"done" and not link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_output_may_not_be_an_input(tmp_path):
    src = tmp_path / "in.npy"
    src.write_bytes(b"x")
    for out in (src, tmp_path / "." / "in.npy"):
        with pytest.raises(UsageError, match="is also an input of this command"):
            with atomic_path(out, overwrite=True, inputs=[str(src)]):
                pass
    (tmp_path / "in.h5").write_bytes(b"y")
    with pytest.raises(UsageError, match="is also an input"):  # container specs name the file
        with atomic_path(tmp_path / "in.h5", overwrite=True, inputs=[f"{tmp_path / 'in.h5'}:/x"]):
            pass
    assert src.read_bytes() == b"x"


def test_safe_file_records_write_errors_instead_of_raising(tmp_path, monkeypatch):
    import errno

    from rfsgen.atomic import SafeFile

    with SafeFile(tmp_path / "f") as f:
        assert f.write(b"abc") == 3
        f.check()

        def full(data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(f._f, "write", full)
        assert f.write(b"defg") == 4  # HDF5 is told it worked...
        with pytest.raises(OSError, match="No space left"):  # ...rfsgen is not
            f.check()


def test_safe_file_records_seek_errors_too(tmp_path, monkeypatch):
    """HDF5 seeks before it writes: an offset past the file system's size limit is
    recorded for check(), never raised inside HDF5 (where h5py turns it into a SystemError)."""
    import errno

    from rfsgen.atomic import SafeFile

    with SafeFile(tmp_path / "f") as f:
        def too_far(pos, whence=0):
            raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(f._f, "seek", too_far)
        assert f.seek(2**50) == 2**50
        with pytest.raises(OSError, match="Invalid argument"):
            f.check()


def test_safe_file_does_not_truncate_an_empty_file_but_empties_a_full_one(tmp_path):
    """The temporary output (empty, made by mkstemp) is opened without truncating it: on
    ext4 a truncation to size 0 makes the close start writeback of the whole file. A
    truncation updates the file's mtime, which shows whether one happened. A file that
    holds bytes is still emptied first."""
    import os

    from rfsgen.atomic import SafeFile

    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.write_bytes(b"")
    full.write_bytes(b"old bytes")
    for p in (empty, full):
        os.utime(p, (1000, 1000))
    with SafeFile(empty) as f:
        assert f.tell() == 0
    assert empty.stat().st_mtime == 1000
    with SafeFile(full) as f:
        f.write(b"new")
    assert full.read_bytes() == b"new"
    with SafeFile(tmp_path / "created") as f:  # a path that does not exist yet
        f.write(b"x")
    assert (tmp_path / "created").read_bytes() == b"x"


def test_write_stdout_finishes_a_short_write(capfd, monkeypatch):
    """Issue 42 item 7: rfsgen.atomic.write_stdout writes what a short write left
    (a raw stdout under PYTHONUNBUFFERED=1 drops it), text written before first."""
    import os
    import sys

    import rfsgen.atomic as atomic

    real, sizes = os.write, []

    def short(fd, data):  # a pipe that takes 7 bytes at a time
        sizes.append(len(data))
        return real(fd, bytes(data[:7]))

    sys.stdout.write("before ")
    monkeypatch.setattr(atomic.os, "write", short)
    atomic.write_stdout(b"0123456789" * 10)
    atomic.write_stdout("and text\n")
    monkeypatch.undo()
    assert capfd.readouterr().out == "before " + "0123456789" * 10 + "and text\n"
    assert len(sizes) == 15 + 2 and sizes[0] == 100


def test_write_stdout_failures(monkeypatch):
    """A closed pipe stays BrokenPipeError (the CLI's exit 141); another failure is one
    OutputError naming standard output."""
    import errno
    import os

    import rfsgen.atomic as atomic
    from rfsgen.errors import OutputError

    def fails(code):
        def write(fd, data):
            raise OSError(code, os.strerror(code))
        return write

    class Stdout:  # a real descriptor, whose writes fail as set below
        encoding = "utf-8"

        def fileno(self):
            return 1

        def flush(self):
            pass

    monkeypatch.setattr("sys.stdout", Stdout())
    monkeypatch.setattr(atomic.os, "write", fails(errno.EPIPE))
    with pytest.raises(BrokenPipeError):
        atomic.write_stdout(b"x")
    monkeypatch.setattr(atomic.os, "write", fails(errno.ENOSPC))
    with pytest.raises(OutputError, match=r"^standard output: cannot write \(No space left on device\); "):
        atomic.write_stdout("x")

"""Atomic output files: written beside the target under a temporary name and renamed
only when complete, so that a failed or interrupted run never leaves a file that
looks complete; full disks are reported, never left to crash HDF5."""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ._signals import UNSAFE_CODE, commit, deferred
from .errors import OutputError, OutputExistsError, UsageError
from .specs import _split_spec

#: rfsgen's temporary files: ``.NAME.rfsgen-HOST-PID-RANDOM.part`` beside the output.
TEMP_PATTERN = re.compile(r"^\.(?P<name>.+)\.rfsgen-(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-[a-z0-9_]+\.part$")


def _host() -> str:
    import socket

    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname().split(".")[0] or "host")[:40]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone else's live process (or unknowable): leave its file alone
    return True


def remove_stale_temporaries(directory) -> list[str]:
    """Remove rfsgen's own temporary files in ``directory`` left by runs that were
    killed (``kill -9``, a node crash): only names matching :data:`TEMP_PATTERN`,
    written on this host by a process that no longer exists.  Files of other hosts
    (a shared file system) and of live processes are never touched.  Returns the
    names removed."""
    host = _host()
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = TEMP_PATTERN.match(name)
        if not m or m.group("host") != host or _alive(int(m.group("pid"))):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError, TypeError):
        return False


def check_output(path, overwrite: bool = False, inputs=()) -> Path:
    """Refuse, before any work, an output :func:`atomic_path` would refuse (``-``, one of
    ``inputs``, a directory, an existing file without ``overwrite``, a missing directory);
    return its directory.  A command that computes before writing (``rfsgen sample``) calls
    it first, so a bad ``-o`` costs nothing and comes alone on stderr."""
    path = Path(path)
    if str(path) == "-":
        raise UsageError("-o -: this output is HDF5, which cannot be written to standard output; give a file name")
    for src in inputs:
        if src is not None and str(src) != "-" and _same_file(path, _split_spec(str(src))[0]):
            raise UsageError(f"{path}: is also an input of this command ({src}); write the output elsewhere")
    if path.is_dir():
        raise OutputError(f"{path}: is a directory; give a file name")
    _refuse_special(path)
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path}: already exists; pass overwrite=True to replace it",
                                cli=f"{path}: already exists; pass --overwrite to replace it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise OutputError(f"{path}: directory {parent} does not exist; create it first")
    return parent


def _refuse_special(path: Path) -> None:
    """Refuse an output path that is a device, pipe or socket: the finished file is moved
    over the path, which would replace the node itself (``-o /dev/null --overwrite`` run as
    root would leave every other program a regular file for /dev/null).  A symbolic link
    is replaced as a link, as ``mv`` does, never followed."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # nothing there (yet): the move creates a regular file
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
        kind = "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise OutputError(f"{path}: is {kind}, not a regular file; rfsgen writes a new file and moves it into "
                          "place, which would replace it; give a file name")


def _replace(tmp, path) -> None:
    _refuse_special(Path(path))  # (again at the move: the path may have changed meanwhile)
    os.replace(tmp, path)


@contextmanager
def atomic_path(path, overwrite: bool = False, inputs=()):
    """Yield a temporary path beside ``path``; move it to ``path`` on success.

    On any exception (including KeyboardInterrupt and SIGTERM) the temporary file
    is removed, so a failed run never leaves a file that looks complete.  Without
    ``overwrite`` the move is a hard link, which fails if ``path`` appeared in the
    meantime (another run finished first): no-clobber is atomic.  ``inputs`` are
    the files the run reads; ``path`` may not be one of them, even with
    ``overwrite``.  Stale temporary files of killed runs in the same directory are
    removed first (see :func:`remove_stale_temporaries`).
    """
    path = Path(path)
    parent = check_output(path, overwrite, inputs)
    remove_stale_temporaries(parent)
    tmp = None
    try:
        # Signals held while the temporary file is created and named: one raised between
        # the two would leave a file that nothing removes.
        with deferred():
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.rfsgen-{_host()}-{os.getpid()}-", suffix=".part",
                                           dir=parent)
            except OSError as e:
                raise OutputError(f"{path}: cannot write in {parent} ({e.strerror})") from None
            _temporaries.add(tmp)
            os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        yield tmp
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        # The commit point: the last signal check and the move run with signals held;
        # a signal received before it (even one swallowed on its way) prevents the move,
        # one during or after it is reported with the output kept (see _signals.commit).
        commit(path, (lambda: _replace(tmp, path)) if overwrite else (lambda: _move_no_clobber(tmp, path)))
        _temporaries.discard(tmp)
    except FileExistsError:
        _remove(tmp)
        what = f"{path}: was created by another process while this one ran; nothing was replaced"
        raise OutputExistsError(f"{what} (pass overwrite=True to replace it)",
                                cli=f"{what} (pass --overwrite to replace it)") from None
    except OSError as e:
        _remove(tmp)
        raise _write_error(path, e) from None
    except BaseException:
        _remove(tmp)
        raise


def _write_error(path, e: OSError) -> OutputError:
    import errno

    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(f"{path}: no space left on device; free space or write elsewhere")
    return OutputError(f"{path}: cannot write ({e.strerror or e})")


def _move_no_clobber(tmp, path):
    """Move ``tmp`` to ``path`` unless ``path`` exists (FileExistsError), atomically."""
    import errno

    try:
        os.link(tmp, path)  # fails with EEXIST if path exists: the atomic check
    except OSError as e:
        if e.errno == errno.EEXIST:
            raise FileExistsError(str(path)) from None
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
        # No hard links on this file system: rename, with a (racy) existence check.
        if os.path.lexists(path):
            raise FileExistsError(str(path)) from None
        os.rename(tmp, path)
        return
    os.unlink(tmp)


def _remove(p):
    if p is None:
        return
    _temporaries.discard(p)
    try:
        os.unlink(p)
    except OSError:
        pass


#: This process's temporary files that were neither moved into place nor removed yet.
_temporaries: set[str] = set()


def remove_own_temporaries() -> None:
    """Remove this process's temporary files that are still there: the CLI's last step.
    A signal can land inside the machinery of a ``with`` statement (contextlib's own
    ``__enter__``/``__exit__``) where :func:`atomic_path` gets no chance to clean up."""
    for p in list(_temporaries):
        _remove(p)


class SafeFile:
    """A binary file for h5py's ``fileobj`` driver that never reports a failed write
    to HDF5.

    When a write fails inside HDF5 (a full disk, a quota, a file-size limit), h5py
    later crashes with a segmentation fault while releasing its objects.  This file
    records the first :class:`OSError` instead and discards every later write, so
    HDF5 carries on normally; :meth:`check` raises the recorded error at a point
    where rfsgen can fail cleanly (the temporary output is then removed).
    """

    def __init__(self, path):
        self.path = str(path)
        # Not O_TRUNC ("w+b") on the empty temporary file: on ext4 a truncation to size 0
        # marks the file so that its close starts writeback of everything written
        # (auto_da_alloc, for programs that rewrite files in place), which cost a 1.6 GB
        # output 0.4-0.8 s at close, and sent the Dask workers' shards to the disk
        # although the merge frees them unwritten (rfsgen.merge._Spent).
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            if os.fstat(fd).st_size:
                os.ftruncate(fd, 0)
            self._f = open(fd, "r+b", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        if self.error is None:
            try:
                while view.nbytes:
                    k = self._f.write(view)
                    if not k:
                        raise OSError(28, "No space left on device")
                    view = view[k:]
            except OSError as e:
                self.error = e
        return n

    def readinto(self, buf) -> int:
        return self._f.readinto(buf)

    def read(self, n=-1) -> bytes:
        return self._f.read(n)

    def seek(self, pos, whence=0) -> int:
        try:
            return self._f.seek(pos, whence)
        except OSError as e:  # an offset past the file-size limit: reported by check(), as a failed write
            self.error = self.error or e
            return pos

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size=None) -> int:
        try:
            return self._f.truncate(size)
        except OSError as e:
            self.error = self.error or e
            return self._f.tell() if size is None else size

    def flush(self) -> None:
        pass  # unbuffered

    def fileno(self) -> int:
        return self._f.fileno()

    def check(self) -> None:
        """Raise the first write error, if there was one."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# HDF5 calls these from C: a signal's exception must wait until HDF5 has returned.
UNSAFE_CODE.update(getattr(SafeFile, name).__code__ for name in ("write", "readinto", "read", "seek", "tell", "truncate"))


def write_stdout(data) -> None:
    """Write ``data`` (bytes, or text in stdout's encoding) to standard output, whole or
    not at all without a word: every write is checked.  A short write (a pipe whose
    reader left mid-write; ``PYTHONUNBUFFERED=1`` makes stdout's writes raw, and Python
    drops what a raw write did not take) is followed by another, which raises
    ``BrokenPipeError`` once the reader is gone (the CLI exits 141, as ``| head``
    expects); any other failure (ENOSPC on ``/dev/full``, EIO) is an
    :class:`~rfsgen.errors.OutputError`.  Text written through ``sys.stdout`` before
    goes first.  A stdout that is not a file (a test's capture) is written as usual."""
    import io
    import sys

    stream = sys.stdout
    if isinstance(data, str):
        data = data.encode(getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict")
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        fd = None
    try:
        stream.flush()
        if fd is None:
            target = getattr(stream, "buffer", None)
            if target is None:
                stream.write(data.decode(getattr(stream, "encoding", None) or "utf-8"))
            else:
                target.write(data)
            stream.flush()
            return
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view):]  # a short write: the rest, or EPIPE
    except BrokenPipeError:
        raise
    except OSError as e:
        raise stdout_failed(e) from None


def stdout_failed(e: OSError) -> OutputError:
    """The error for a write to standard output that failed with ``e`` (not EPIPE)."""
    return OutputError(f"standard output: cannot write ({e.strerror or e}); what was written is incomplete; "
                       "check where standard output goes (a full disk, a closed device)")

"""Dask adapter: the transform and the exact kernel as lazy ``dask.array`` graphs.

Needs the optional extra ``dask`` (``pip install 'rfsgen[dask]'``); the rest of rfsgen
never imports dask.  The feature set (or skeleton) enters each graph once, as one
task that every block refers to by key, so it travels to each worker once, not
with every task::

    import dask.array as da
    import rfsgen, rfsgen.dask

    fs = rfsgen.load_features("features.h5")
    X = da.from_zarr("rows.zarr")                        # (n, width), any row chunks
    Z = rfsgen.dask.transform(fs, X, layout="csr")       # blocks are scipy.sparse CSR
    K = rfsgen.dask.kernel(fs.skeleton, X[:1000])       # exact, float64, blocked

Every block is computed by the same code as :func:`rfsgen.transform`, so the result
is identical, value for value and byte for byte, to the in-memory transform of the
whole array, whatever the chunking.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading

import dask
import dask.array as da
import numpy as np

from .errors import InputError, UsageError, count
from .features import FeatureSet
from .skeleton import Skeleton

_TRANSFORMERS: dict = {}
_LOCK = threading.Lock()


def _transformer(fs: FeatureSet, dtype: str):
    """One :class:`~rfsgen.transform.Transformer` per feature set and dtype in each
    worker process (building one plans the columns; blocks reuse it)."""
    from .output import DTYPES
    from .transform import Transformer

    key = (id(fs), dtype)
    with _LOCK:
        entry = _TRANSFORMERS.get(key)
        if entry is None or entry[0] is not fs:
            entry = (fs, Transformer(fs, DTYPES[dtype]))
            _TRANSFORMERS[key] = entry
            if len(_TRANSFORMERS) > 8:  # a few feature sets at a time; forget the oldest
                _TRANSFORMERS.pop(next(iter(_TRANSFORMERS)))
        return entry[1]


def transform_block(x: np.ndarray, fs: FeatureSet, layout: str, dtype: str, row0: int = 0, source: str = "<dask>"):
    """Features of one block of rows ``x`` (float ``(m, width)``): an ndarray, or a
    ``scipy.sparse.csr_matrix`` for ``layout="csr"`` (exact zeros dropped)."""
    import scipy.sparse as sp

    from .output import _sparse_parts

    x = np.asarray(x)
    vals = _transformer(fs, dtype).chunk(x, row0, source)
    if layout == "dense":
        return vals
    data, indices, counts = _sparse_parts(vals)
    indptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_matrix((data.copy(), indices.copy(), indptr), shape=vals.shape)


def transform_block_counted(x: np.ndarray, fs: FeatureSet, dtype: str, row0: int = 0, source: str = "<dask>"):
    """Dense features of one block of rows and how many of its values an EOF feature
    set clipped to its box (:mod:`rfsgen.eof`): ``(ndarray (m, D), int)``."""
    x = np.asarray(x)
    tr = _transformer(fs, dtype)
    return tr.chunk(x, row0, source), tr.clipped_in(x)


def _block_with_offset(x, fs, layout, dtype, block_info=None):
    row0 = block_info[0]["array-location"][0][0] if block_info else 0
    return transform_block(x, fs, layout, dtype, row0)


def transform(fs: FeatureSet, X, *, layout: str = "dense", dtype: str = "float32", chunk_rows: int | None = None):
    """Lazy features of ``X``: a ``dask.array`` of shape ``(n, D)``.

    ``X`` is a ``dask.array`` ``(n, width)`` (any row chunking; columns are put in one
    chunk) or a path, opened lazily as one (row chunks of ``chunk_rows``).  Blocks are
    float ``dtype`` ndarrays, or ``scipy.sparse.csr_matrix`` for ``layout="csr"`` (``"auto"``:
    the layout :func:`rfsgen.output.auto_layout` picks for ``fs``).
    """
    import scipy.sparse as sp

    from .output import DTYPES, _check_options, resolve_layout

    _check_options(layout, dtype, "none")
    layout = resolve_layout(layout, fs)  # "auto": the feature set's (rfsgen.output.auto_layout)
    if isinstance(X, (str, os.PathLike)):
        X = from_path(X, chunk_rows)
    if not isinstance(X, da.Array):
        raise InputError(f"<{type(X).__name__}>: rfsgen.dask.transform takes a dask.array or a path; "
                         "for arrays in memory use rfsgen.transform")
    if X.ndim != 2:
        raise InputError(f"<dask.array>: rows must be 2-D (n, width), got shape {X.shape}")
    width = fs.skeleton.width
    if X.shape[1] != width:
        raise InputError(f"<dask.array>: rows have {count(int(X.shape[1]), 'value')} but skeleton "
                         f"'{fs.skeleton.path}' expects width {width}; pass matching rows")
    if X.dtype.kind not in "iuf":
        raise InputError(f"<dask.array>: has dtype {X.dtype}, not numbers; convert it")
    if X.numblocks[1] != 1:
        X = X.rechunk({1: -1})
    out_dtype = np.dtype(DTYPES[dtype])
    meta = sp.csr_matrix((0, 0), dtype=out_dtype) if layout == "csr" else np.empty((0, 0), dtype=out_dtype)
    # One task holds the feature set; every block task refers to it by key.
    fs_task = dask.delayed(fs, pure=True, traverse=False)
    return da.map_blocks(_block_with_offset, X, fs_task, layout, dtype, dtype=out_dtype, meta=meta,
                         chunks=(X.chunks[0], (fs.columns,)), name=f"rfsgen-transform-{dask.base.tokenize(X, fs)}")


def _read_rows(spec, a: int, b: int) -> np.ndarray:
    from .inputs import open_input

    with open_input(spec) as src:
        parts = [block for _, block in src.chunks(b - a, a, b)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def from_path(spec, chunk_rows: int | None = None):
    """A file of rows (any format :func:`rfsgen.open_input` reads, except streams) as a
    lazy ``dask.array``: each block opens the file and reads its rows."""
    from .inputs import open_input

    spec = os.fspath(spec)
    with open_input(spec) as src:
        n, width = src.n_rows, src.width
        if n is None:
            raise UsageError(f"{spec}: a stream has no known length; Dask needs a file")
        head = next(src.chunks(1), (0, np.zeros((0, width))))[1]
    chunk_rows = chunk_rows or max(1, min(n, (64 << 20) // max(1, 8 * width)))
    blocks = [da.from_delayed(dask.delayed(_read_rows, pure=True)(spec, a, min(n, a + chunk_rows)),
                              shape=(min(n, a + chunk_rows) - a, width), dtype=head.dtype)
              for a in range(0, n, chunk_rows)]
    if not blocks:
        return da.zeros((0, width), dtype=head.dtype, chunks=(1, width))
    return da.concatenate(blocks, axis=0)


def _kernel_block(skeleton: Skeleton, x, y=None) -> np.ndarray:
    from .kernel import kernel

    return kernel(skeleton, np.asarray(x), None if y is None else np.asarray(y))


def kernel(skeleton: Skeleton, X, Y=None):
    """The exact kernel ``k_S(X_i, Y_j)`` as a blocked float64 ``dask.array``.

    ``X`` and ``Y`` are dask arrays (or paths); blocks follow their row chunks.  With
    ``Y`` omitted the result is exactly symmetric: block (j, i) is the transpose of
    block (i, j) and diagonal blocks are symmetrised, as :func:`rfsgen.kernel` does.
    """
    X = from_path(X) if isinstance(X, (str, os.PathLike)) else X
    Y = from_path(Y) if isinstance(Y, (str, os.PathLike)) else Y
    for A in (X,) if Y is None else (X, Y):
        if not isinstance(A, da.Array) or A.ndim != 2:
            raise InputError("rfsgen.dask.kernel takes 2-D dask arrays (or paths) of rows")
    if not skeleton.bound:
        skeleton = skeleton.bind(X.shape[1])
    X = X.rechunk({1: -1})
    xs = X.to_delayed()[:, 0]
    sk = dask.delayed(skeleton, pure=True, traverse=False)
    rx = X.chunks[0]
    if Y is None:
        grid = [[None] * len(xs) for _ in xs]
        for i in range(len(xs)):
            for j in range(i, len(xs)):
                block = dask.delayed(_kernel_block, pure=True)(sk, xs[i], None if i == j else xs[j])
                grid[i][j] = da.from_delayed(block, shape=(rx[i], rx[j]), dtype=np.float64)
                if j != i:
                    grid[j][i] = grid[i][j].T
        return da.block(grid) if grid else da.zeros((0, 0), chunks=1)
    Y = Y.rechunk({1: -1})
    ys = Y.to_delayed()[:, 0]
    ry = Y.chunks[0]
    return da.block([[da.from_delayed(dask.delayed(_kernel_block, pure=True)(sk, xs[i], ys[j]),
                                      shape=(rx[i], ry[j]), dtype=np.float64) for j in range(len(ys))]
                     for i in range(len(xs))])


# ----------------------------------------------------------------------------- a cluster behind the CLI
#: Chunks submitted to the cluster and not yet written, at most (bounds memory: each
#: is one chunk of input rows and one of output values).
IN_FLIGHT = 4


class ClusterTransformer:
    """Computes chunks on a ``distributed`` cluster for
    :func:`rfsgen.transform.transform_file` (``engine=``), which writes them locally in
    row order.  The feature set is scattered to every worker once; at most
    :data:`IN_FLIGHT` chunks are on the cluster at a time."""

    remote = True  # chunks arrive as arrays: the writer must not ask for them in memory maps of the output

    def __init__(self, client, address: str, fs: FeatureSet, dtype):
        from .output import DTYPES

        self.client = client
        self.address = address
        self.columns = fs.columns
        self.dtype = np.dtype(dtype)
        self.dtype_name = next(k for k, v in DTYPES.items() if np.dtype(v) == self.dtype)
        self.fs_future = self._guard(lambda: client.scatter(fs, broadcast=True, hash=False), "sending the feature set")
        # EOF: the values clipped to the box, summed over the chunks as they arrive (the
        # writer records them as the output's clipped_values)
        self.clipped = 0 if fs.eof is not None else None

    def _guard(self, fn, what):
        from distributed.scheduler import KilledWorker

        from .errors import RfsgenError

        try:
            return fn()
        except RfsgenError:
            raise
        except KilledWorker as e:
            raise RfsgenError(f"a Dask worker died while {what} (scheduler {self.address}): {e}; nothing was "
                              "written; check the workers' memory and logs, then run again") from None
        except (OSError, TimeoutError) as e:
            raise RfsgenError(f"lost the Dask scheduler at {self.address} while {what} ({type(e).__name__}: {e}); "
                              "nothing was written") from None

    def chunks(self, src, chunk_rows, start=0, stop=None, buffers=1):
        from collections import deque

        pending = deque()
        try:
            for row0, block in src.chunks(chunk_rows, start, stop):
                if self.clipped is None:
                    fut = self._guard(lambda: self.client.submit(transform_block, block, self.fs_future, "dense",
                                                                 self.dtype_name, row0, src.name, pure=False),
                                      f"sending rows {row0}:{row0 + block.shape[0]}")
                else:
                    fut = self._guard(lambda: self.client.submit(transform_block_counted, block, self.fs_future,
                                                                 self.dtype_name, row0, src.name, pure=False),
                                      f"sending rows {row0}:{row0 + block.shape[0]}")
                pending.append((row0, block.shape[0], fut))
                if len(pending) >= IN_FLIGHT:
                    yield self._collect(*pending.popleft())
            while pending:
                yield self._collect(*pending.popleft())
        finally:
            for _, _, fut in pending:
                fut.cancel()

    def _collect(self, row0, m, fut):
        vals = self._guard(fut.result, f"transforming rows {row0}:{row0 + m}")
        if self.clipped is not None:
            vals, clipped = vals
            self.clipped += int(clipped)
        return row0, np.ascontiguousarray(vals, dtype=self.dtype)


#: Schemes of scheduler addresses a Client in another process can reach ("inproc://"
#: works only inside one process).
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
_ADDRESS = re.compile(r"(?:(?P<scheme>[a-z]+)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")
#: Seconds to wait for a Client to close before giving up on the scheduler.
CLOSE_TIMEOUT = 5.0


def check_address(address: str) -> str:
    """``address`` if it is a scheduler address (``[SCHEME://]HOST:PORT``, SCHEME one of
    :data:`SCHEMES`, PORT 1..65535); a one-line :class:`~rfsgen.errors.UsageError`
    otherwise, before anything connects."""
    text = str(address).strip()
    m = _ADDRESS.fullmatch(text)
    given = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", text)
    scheme = given.group(1).lower() if given else "tcp"
    if m is None or scheme not in SCHEMES or not 1 <= int(m.group("port")) <= 65535:
        why = ("'inproc://' addresses work only inside one process" if scheme == "inproc"
               else f"unknown scheme '{scheme}://' (one of {', '.join(SCHEMES)})" if scheme not in SCHEMES
               else "the port must be 1..65535" if m else "not HOST:PORT")
        raise UsageError(f"--dask-scheduler {address!r}: not a Dask scheduler address ({why}); write "
                         "tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786 (or set DASK_SCHEDULER_ADDRESS)")
    return text


def _client_class():
    from distributed import Client

    class _Client(Client):
        """A Client that, when it fails to start, is closed at once: never later, from the
        garbage collector, with a 20-second timeout and a traceback printed on the way out."""

        def __init__(self, *args, **kwargs):
            try:
                super().__init__(*args, **kwargs)
            except BaseException:
                _forget(self)
                raise

    return _Client


def _forget(client) -> None:
    """Mark ``client`` closed (so that its ``__del__`` does nothing) and stop its loop thread."""
    client.status = "closed"
    runner = getattr(client, "_loop_runner", None)
    if runner is not None:
        with contextlib.suppress(Exception):
            runner.stop()


def close(client) -> None:
    """Close ``client`` now, waiting at most :data:`CLOSE_TIMEOUT` seconds for the scheduler
    (which may be gone); whatever happens, nothing is left for the garbage collector."""
    try:
        client.close(timeout=CLOSE_TIMEOUT)
    except Exception:  # the scheduler is unreachable: nothing left to release there
        pass
    finally:
        _forget(client)


def connect(address: str, timeout: float = 10.0):
    """A ``distributed.Client`` for ``address`` (``tcp://HOST:PORT``), or a one-line
    :class:`~rfsgen.errors.UsageError` for a malformed address, or
    :class:`~rfsgen.errors.RfsgenError` if the scheduler cannot be reached.  Close it
    with :func:`close` (or use it in a ``with`` block)."""
    from .errors import RfsgenError

    address = check_address(address)
    try:
        return _client_class()(address, timeout=timeout, set_as_default=False)
    except Exception as e:
        detail = " ".join(str(e).split())[:200]
        raise RfsgenError(f"cannot reach the Dask scheduler at {address} ({type(e).__name__}: {detail}); check the "
                          "address and that the scheduler is running, or run without --dask-scheduler (and "
                          "DASK_SCHEDULER_ADDRESS)") from None


#: Loggers of the client side of the Dask stack, whose records are routed through
#: :func:`routed_messages`.  A scheduler or workers started in the same process (a
#: LocalCluster) keep their own logging: they are the user's, not this command's.
LOGGERS = ("distributed.client", "distributed.core", "distributed.comm", "distributed.batched", "distributed.utils",
           "distributed.utils_comm", "distributed.protocol", "distributed.sizeof", "tornado")


@contextlib.contextmanager
def routed_messages(quiet: bool = False):
    """Inside the block, warnings and log records of Dask's libraries (e.g. distributed's
    "Sending large graph") are one line each on stderr, ``rfsgen: warning: dask: ...``,
    without tracebacks; with ``quiet`` they are dropped.  Everything is restored after."""
    import logging
    import sys
    import warnings

    import distributed  # noqa: F401  (its import configures its loggers: route them after that)

    class OneLine(logging.Handler):
        def emit(self, record):
            text = record.getMessage().strip()
            if not text and record.exc_info and record.exc_info[1] is not None:  # log_errors logs "" + traceback
                e = record.exc_info[1]
                text = f"{type(e).__name__}: {e}".rstrip(": ")
            if text and not quiet:
                _warn_line(text)

    saved = []
    handler = OneLine(logging.WARNING)
    for name in LOGGERS:
        log = logging.getLogger(name)
        saved.append((log, log.handlers[:], log.propagate, log.level))
        log.handlers[:] = [handler]
        log.propagate = False
        if log.level == logging.NOTSET or log.level < logging.WARNING:
            log.setLevel(logging.WARNING)

    def show(message, category, filename, lineno, file=None, line=None):
        if not quiet:
            _warn_line(str(message))

    def _warn_line(text):
        first = " ".join(str(text).split("\n", 1)[0].split())[:300]
        print(f"rfsgen: warning: dask: {first}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            if quiet:
                warnings.simplefilter("ignore")
            yield
    finally:
        for log, handlers, propagate, level in saved:
            log.handlers[:] = handlers
            log.propagate = propagate
            log.setLevel(level)


#: Seconds :func:`shutdown` waits for the workers to leave before it closes the scheduler.
SHUTDOWN_TIMEOUT = 20.0


def shutdown(address: str | None = None, timeout: float = SHUTDOWN_TIMEOUT) -> int:
    """Stop the Dask cluster at ``address`` (default: ``$DASK_SCHEDULER_ADDRESS``) in the
    order that leaves nothing behind: the workers first, retired and closed by the
    scheduler (each one's nanny too), then the scheduler.  Returns the number of workers
    stopped.

    Killing a scheduler and its workers at once (``kill $(jobs -p)`` at the end of a shell
    script) leaves CommClosedError tracebacks in the workers' logs (their last messages to
    a scheduler that is gone) and a worker process alive for up to 10-20 s while its
    nanny gives up on it.  Stopping the workers through the scheduler first does neither::

        trap 'python -c "import rfsgen.dask; rfsgen.dask.shutdown()"; kill $(jobs -p) 2>/dev/null; wait' EXIT

    (the ``kill`` then ends the ``dask worker`` commands, whose workers are gone, at once;
    ``wait`` returns when they have).  One-line :class:`~rfsgen.errors.UsageError` /
    :class:`~rfsgen.errors.RfsgenError` for a bad or unreachable address."""
    import time

    from .errors import RfsgenError

    if address is None:
        address = os.environ.get("DASK_SCHEDULER_ADDRESS", "")
        if not address.strip():
            raise UsageError("rfsgen.dask.shutdown: no scheduler address: pass one (tcp://HOST:PORT) or set "
                             "DASK_SCHEDULER_ADDRESS")
    address = check_address(address)
    with routed_messages(quiet=True):  # the workers leaving is not news
        client = connect(address)
        try:
            workers = list(client.scheduler_info(n_workers=-1)["workers"])
            if workers:
                client.retire_workers(workers, close_workers=True, remove=True)
            deadline = time.monotonic() + timeout
            while client.scheduler_info(n_workers=-1)["workers"]:
                if time.monotonic() > deadline:
                    raise RfsgenError(f"Dask workers at {address} did not stop within {timeout:g} s; stop them "
                                      "with SIGTERM (kill), then the scheduler")
                time.sleep(0.05)
            client.shutdown()
            return len(workers)
        except RfsgenError:
            raise
        except (OSError, TimeoutError) as e:
            raise RfsgenError(f"lost the Dask scheduler at {address} while stopping it ({type(e).__name__}: "
                              f"{e}); it may be stopped already") from None
        finally:
            close(client)


def transform_file(features, input, output, *, scheduler: str, quiet: bool = False, **options) -> dict:
    """:func:`rfsgen.transform.transform_file` with the chunks computed on the Dask
    cluster at ``scheduler``; the output file is the same as a local run's.  Dask's own
    warnings and log records become one line each on stderr (none with ``quiet``); the
    Client is closed before this returns or raises."""
    from .transform import transform_file as local

    scheduler = check_address(scheduler)
    with routed_messages(quiet):
        client = connect(scheduler)
        try:
            def engine(fs, dtype):
                return ClusterTransformer(client, scheduler, fs, dtype)

            return local(features, input, output, engine=engine, **options)
        finally:
            close(client)

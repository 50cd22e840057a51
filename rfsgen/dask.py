"""Dask adapter: the transform and the exact kernel as lazy ``dask.array`` graphs.

Needs dask and distributed (``pip install dask distributed``, or the extra ``dask`` from a
clone: ``pip install -e '.[dask]'``); the rest of rfsgen
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
from .kinds import of as kind_of
from .skeleton import Skeleton

#: The environment variable that sends ``rfsgen transform`` to a Dask cluster (as
#: ``--dask-scheduler`` does).  Dask's own DASK_SCHEDULER_ADDRESS is not read: it is set for
#: other programs, and a command must not leave the machine unless asked.
SCHEDULER_VARIABLE = "RFSGEN_SCHEDULER"

_TRANSFORMERS: dict = {}
_LOCK = threading.Lock()


def _transformer(fs: FeatureSet, dtype: str, device: str = "cpu"):
    """One :class:`~rfsgen.transform.Transformer` per feature set, dtype and device in
    each worker process (building one plans the columns; blocks reuse it).  ``device``
    (cpu, cuda or auto) is resolved here, on the worker: ``cuda`` where this worker has
    no GPU is its :class:`~rfsgen.errors.DeviceError`."""
    from .output import DTYPES
    from .transform import Transformer, resolve_device

    key = (id(fs), dtype, device)
    with _LOCK:
        entry = _TRANSFORMERS.get(key)
        if entry is None or entry[0] is not fs:
            entry = (fs, Transformer(fs, DTYPES[dtype], resolve_device(device)[0]))
            _TRANSFORMERS[key] = entry
            if len(_TRANSFORMERS) > 8:  # a few feature sets at a time; forget the oldest
                _TRANSFORMERS.pop(next(iter(_TRANSFORMERS)))
        return entry[1]


def transform_block(x: np.ndarray, fs: FeatureSet, layout: str, dtype: str, row0: int = 0, source: str = "<dask>",
                    device: str = "cpu"):
    """Features of one block of rows ``x`` (float ``(m, width)``): an ndarray, or a
    ``scipy.sparse.csr_matrix`` for ``layout="csr"`` (exact zeros dropped); computed on
    ``device`` as this worker resolves it (the same values on either)."""
    import scipy.sparse as sp

    from .output import _sparse_parts

    x = np.asarray(x)
    vals = _transformer(fs, dtype, device).chunk(x, row0, source)
    if layout == "dense":
        return vals
    data, indices, counts = _sparse_parts(vals)
    indptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_matrix((data.copy(), indices.copy(), indptr), shape=vals.shape)


def transform_block_counted(x: np.ndarray, fs: FeatureSet, dtype: str, row0: int = 0, source: str = "<dask>",
                            device: str = "cpu"):
    """Dense features of one block of rows and how many of its values an EOF feature
    set clipped to its box (:mod:`rfsgen.eof`): ``(ndarray (m, D), int)``."""
    x = np.asarray(x)
    tr = _transformer(fs, dtype, device)
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
    from . import budget
    from .inputs import open_input

    spec = os.fspath(spec)
    with open_input(spec) as src:
        n, width = src.n_rows, src.width
        if n is None:
            raise UsageError(f"{spec}: a stream has no known length; Dask needs a file")
        head = next(src.chunks(1), (0, np.zeros((0, width))))[1]
    chunk_rows = chunk_rows or max(1, min(n, (64 << 20) // max(1, 8 * width)))
    n_blocks = -(-n // chunk_rows)  # each a task of the graph, made here: a crafted file may declare 2^62 rows
    budget.check(4096.0 * n_blocks, f"{spec}: a graph of {n_blocks} blocks of {chunk_rows} rows",
                 "read fewer rows, or larger blocks (chunk_rows)")
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
    row order.  The feature set is scattered to every worker once (again where a killed
    worker took the only copies: :class:`_Scattered`); at most :data:`IN_FLIGHT` chunks
    are on the cluster at a time, and a chunk whose task the scheduler cancelled is sent
    again (:func:`_shard_result`)."""

    remote = True  # chunks arrive as arrays: the writer must not ask for them in memory maps of the output

    def __init__(self, client, address: str, fs: FeatureSet, dtype, device: str = "cpu"):
        from .output import DTYPES

        self.device = device  # resolved by each worker
        self.client = client
        self.address = address
        self.columns = fs.columns
        self.dtype = np.dtype(dtype)
        self.dtype_name = next(k for k, v in DTYPES.items() if np.dtype(v) == self.dtype)
        self.shared = _Scattered(client, address, fs)
        # EOF: the values clipped to the box, summed over the chunks as they arrive (the
        # writer records them as the output's clipped_values)
        self.clipped = 0 if kind_of(fs).counts_clipped else None

    def chunks(self, src, chunk_rows, start=0, stop=None, buffers=1):
        from collections import deque

        pending = deque()
        try:
            for row0, block in src.chunks(chunk_rows, start, stop):
                pending.append([row0, block, src.name, self._submit(row0, block, src.name)])
                if len(pending) >= IN_FLIGHT:
                    yield self._collect(*pending.popleft())
            while pending:
                yield self._collect(*pending.popleft())
        finally:
            for *_, fut in pending:
                fut.cancel()

    def _submit(self, row0, block, name):
        """The task of the chunk ``block`` (rows from ``row0`` of the input ``name``)."""
        fs_future = self.shared.copy_for(row0)
        if self.clipped is None:
            return _guarded(self.address, lambda: self.client.submit(
                transform_block, block, fs_future, "dense", self.dtype_name, row0, name, self.device, pure=False),
                f"sending rows {row0}:{row0 + block.shape[0]}")
        return _guarded(self.address, lambda: self.client.submit(
            transform_block_counted, block, fs_future, self.dtype_name, row0, name, self.device, pure=False),
            f"sending rows {row0}:{row0 + block.shape[0]}")

    def _collect(self, row0, block, name, fut):
        what = f"transforming rows {row0}:{row0 + block.shape[0]}"
        vals = _shard_result(self.address, [fut], 0, lambda: self._submit(row0, block, name), what)
        self.shared.done(row0)
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
                         "tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786 (or set RFSGEN_SCHEDULER)")
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
                          "RFSGEN_SCHEDULER)") from None


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
    """Stop the Dask cluster at ``address`` (default: ``$RFSGEN_SCHEDULER``) in the
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
        address = os.environ.get(SCHEDULER_VARIABLE, "")
        if not address.strip():
            raise UsageError("rfsgen.dask.shutdown: no scheduler address: pass one (tcp://HOST:PORT) or set "
                             f"{SCHEDULER_VARIABLE}")
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


def transform_file(features, input, output, *, scheduler: str, quiet: bool = False, shard_dir=None,
                   gather: bool = False, **options) -> dict:
    """:func:`rfsgen.transform.transform_file` with the rows computed on the Dask
    cluster at ``scheduler``; the output file is the same as a local run's, byte for
    byte.  Dask's own warnings and log records become one line each on stderr (none
    with ``quiet``); the Client is closed before this returns or raises.

    By default the workers write their row ranges straight to shard files in a
    directory they share with this process (:func:`transform_sharded`: ``shard_dir``,
    or beside ``output``), which are then merged here; when the workers cannot see
    that directory (and ``shard_dir`` was not given), when the input is a stream, for
    ``obsm=``, or with ``gather=True``, the chunks travel to this process and are
    written here (:class:`ClusterTransformer`)."""
    from .transform import transform_file as local

    scheduler = check_address(scheduler)
    with routed_messages(quiet):
        client = connect(scheduler)
        try:
            if not gather and options.get("obsm") is None and str(input) != "-":
                info = transform_sharded(client, scheduler, features, input, output, shard_dir=shard_dir,
                                         quiet=quiet, **options)
                if info is not None:
                    return info

            def engine(fs, dtype, device="cpu"):
                return ClusterTransformer(client, scheduler, fs, dtype, device)

            return local(features, input, output, engine=engine, **options)
        finally:
            close(client)


# ----------------------------------------------------------------------------- workers writing shards
#: A run's shard directory: ``.NAME.rfsgen-HOST-PID-RANDOM.shards`` (NAME the output's
#: name), created in the shard directory and removed when the run ends, whatever happens.
SHARDS_PATTERN = re.compile(r"^\.(?P<name>.+)\.rfsgen-(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-[a-z0-9_]+\.shards$")
#: Row ranges per worker thread (a killed worker's ranges are computed again elsewhere;
#: more ranges balance better, each costs a shard file).
RANGES_PER_THREAD = 2
#: At most this many chunks of rows in one range (a long input is cut finer).
MAX_RANGE_CHUNKS = 64


def _remove_stale_shard_dirs(directory) -> None:
    """Shard directories of runs on this host whose process no longer exists (killed)."""
    import shutil

    from .atomic import _alive, _host

    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = SHARDS_PATTERN.match(name)
        if m and m.group("host") == _host() and not _alive(int(m.group("pid"))):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _probe(directory: str, token: str, paths: list) -> str | None:
    """On a worker: None when it sees the probe file holding ``token`` in ``directory``
    and every one of ``paths``; else why not."""
    try:
        with open(os.path.join(directory, "probe"), encoding="ascii") as fh:
            if fh.read() != token:
                return f"{directory} is another directory there"
    except OSError as e:
        return f"cannot read {directory} ({e.strerror})"
    for p in paths:
        if not os.access(p, os.R_OK):
            return f"cannot read {p}"
    return None


@contextlib.contextmanager
def _task_threads():
    """Numba and the writer on one thread inside a task: a worker's parallelism is its
    ``--nthreads`` (each runs one range at a time), as Dask declares it."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)  # thread-local: this worker thread only
    try:
        yield
    finally:
        numba.set_num_threads(before)


def write_shard(fs: FeatureSet, spec: str, path: str, start: int, stop: int, provenance: dict, layout: str,
                dtype: str, compression: str, chunk_rows: int | None, layer: str | None = None,
                device: str = "cpu") -> int:
    """On a worker: rows ``start:stop`` of the input ``spec`` (an absolute path) through
    ``fs`` into the shard ``path`` (written atomically, replacing a shard of an earlier
    attempt), with ``provenance`` as the client gave it (so the merged file is the local
    run's), computed on ``device`` as this worker resolves it.  Returns the number of rows."""
    from .errors import OutputError
    from .inputs import open_input
    from .output import DTYPES, write_output
    from .transform import Transformer, resolve_device

    try:
        with _task_threads(), open_input(spec, layer=layer) as src:
            tr = Transformer(fs, DTYPES[dtype], resolve_device(device)[0])
            info = write_output(path, tr, src, start, stop, layout=layout, dtype=dtype, compression=compression,
                                chunk_rows=chunk_rows, overwrite=True, inputs=[], progress=None,
                                provenance=provenance)
    except OSError as e:  # not the scheduler's: this worker's file system
        import socket

        raise OutputError(f"{path}: a Dask worker on {socket.gethostname()} cannot write it ({e.strerror or e}); "
                          "check the shard directory there") from None
    return int(info["rows"])


def write_rows(fs: FeatureSet, spec: str, path: str, offset: int, row_bytes: int, start: int, a: int, b: int,
               dtype: str, chunk_rows: int | None, layer: str | None = None, device: str = "cpu") -> tuple:
    """On a worker: rows ``a:b`` of the input ``spec`` (an absolute path) through ``fs``
    written in place into the dense uncompressed output that the client is writing at
    ``path`` (its data area from byte ``offset``, rows of ``row_bytes`` from row
    ``start``: :func:`rfsgen.output.fill_rows`), computed on ``device`` as this worker
    resolves it.  Returns the rows' data checksum digests and the transformer's count of
    clipped values (EOF; None for kinds that clip nothing)."""
    from .errors import OutputError
    from .inputs import open_input
    from .output import DTYPES, fill_rows
    from .transform import Transformer, resolve_device

    try:
        with _task_threads(), open_input(spec, layer=layer) as src:
            tr = Transformer(fs, DTYPES[dtype], resolve_device(device)[0])
            digests = fill_rows(path, offset, row_bytes, tr, src, start, a, b, chunk_rows)
            return digests, getattr(tr, "clipped", None)
    except OSError as e:  # not the scheduler's: this worker's file system
        import socket

        raise OutputError(f"{path}: a Dask worker on {socket.gethostname()} cannot write its rows {a}:{b} there "
                          f"({e.strerror or e}); check that every worker shares the output's directory, or give "
                          "--shard-dir") from None


#: Seconds to wait for a worker to be running again (a nanny restarting the one that died)
#: before the feature set is sent again.
WORKER_WAIT = 60.0


class _Scattered:
    """The feature set on the cluster, for the tasks of one run: broadcast to the running
    workers once, and sent again when a task that used the current copy is submitted
    again.  A task is submitted again only after the scheduler cancelled it, and a worker
    killed under load can take the only copies with it (a worker still starting during
    the broadcast got none); a task submitted on a lost copy is cancelled at once ("lost
    dependencies"), so a retry on the old copy cannot succeed.

    ``client`` is a connected ``distributed.Client``, ``address`` its scheduler's (for
    messages), ``fs`` the :class:`~rfsgen.featureset.FeatureSet`."""

    def __init__(self, client, address: str, fs: FeatureSet):
        self.client, self.address, self.fs = client, address, fs
        self.future = self._send()
        self.used = {}  # task index -> the copy its last attempt was given

    def _send(self):
        return _guarded(self.address, lambda: self.client.scatter(self.fs, broadcast=True, hash=False),
                        "sending the feature set")

    def copy_for(self, i: int):
        """The copy (a ``distributed.Future``) for task ``i``'s next attempt: the current one,
        unless ``i``'s last attempt was given it, in which case a fresh one, sent once
        whichever cancelled task asks first."""
        if self.used.get(i) is self.future:
            _guarded(self.address, self._a_worker, "waiting for a Dask worker")
            self.future = self._send()
        self.used[i] = self.future
        return self.future

    def done(self, i: int) -> None:
        """Task ``i`` has its result: forget which copy it used (a long gathered run sends
        one task a chunk)."""
        self.used.pop(i, None)

    def _a_worker(self):
        from .errors import RfsgenError

        try:
            self.client.wait_for_workers(1, timeout=WORKER_WAIT)
        except TimeoutError:  # (the scheduler answered: not a lost scheduler)
            raise RfsgenError(f"no Dask worker of the scheduler at {self.address} was running {WORKER_WAIT:g} s "
                              "after one died; nothing was written; check the workers, then run again") from None


class _InPlace:
    """:func:`rfsgen.output.write_output`'s engine for a dense uncompressed output that the
    workers write in place (:func:`write_rows`): the client places ``X`` in the temporary
    output, each range's task writes its rows there, and the record's checksum is the sum
    of the ranges' (:meth:`known_digests`).  The file is the local run's, byte for byte:
    the same HDF5 calls in the same order, only the data area is filled by other processes."""

    remote = True

    def __init__(self, client, address, fs, shared, spec, ranges, dtype, chunk_rows, layer, device):
        from .output import DTYPES

        self.client, self.address, self.shared, self.spec = client, address, shared, spec
        self.ranges, self.dtype_name, self.chunk_rows, self.layer, self.device = ranges, dtype, chunk_rows, layer, device
        self.columns = fs.columns
        self.dtype = np.dtype(DTYPES[dtype])
        self.what = "the transform"
        self.digests = []
        #: values clipped to the box (EOF), summed over the ranges as a local run counts them;
        #: None for kinds that clip nothing (write_output records it where it is not None)
        self.clipped = None

    def fill_placed(self, path, offset, row_bytes, start, stop, progress) -> int:
        import secrets

        def submit(i):
            a, b = self.ranges[i]
            fs_future = self.shared.copy_for(i)
            return _guarded(self.address, lambda: self.client.submit(
                write_rows, fs_future, self.spec, path, offset, row_bytes, start, a, b, self.dtype_name,
                self.chunk_rows, self.layer, self.device, pure=False,
                key=f"rfsgen-rows-{a}-{b}-{secrets.token_hex(4)}"), f"sending rows {a}:{b}")

        for digests, clipped in _in_order(self.address, self.ranges, submit, progress):
            self.digests.append(digests)
            if clipped is not None:
                self.clipped = (self.clipped or 0) + int(clipped)
        return stop - start

    def known_digests(self) -> dict:
        from .output import DataChecksum, add_digests

        return add_digests(DataChecksum("dense", self.dtype, self.columns).hexdigests(), *self.digests)


def row_ranges(start: int, stop: int, threads: int, chunk_rows: int) -> list:
    """``start:stop`` cut into nearly equal contiguous ranges: :data:`RANGES_PER_THREAD`
    per worker thread, each at least a chunk and at most :data:`MAX_RANGE_CHUNKS` chunks
    of rows (when the input is long enough)."""
    n = stop - start
    if n <= 0:
        return [(start, stop)]
    k = max(RANGES_PER_THREAD * max(threads, 1), -(-n // (MAX_RANGE_CHUNKS * chunk_rows)))
    k = max(1, min(k, -(-n // chunk_rows)))
    cuts = [start + n * i // k for i in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def transform_sharded(client, address: str, features, input, output, *, shard_dir=None, quiet: bool = False,
                      layout="auto", dtype="float32", compression="none", chunk_rows=None, rows=None, shard=None,
                      overwrite=False, progress=None, layer=None, device="cpu", **_ignored) -> dict | None:
    """The transform of :func:`transform_file` with the workers writing shards.

    The rows are cut into ranges (:func:`row_ranges`); each worker writes its ranges
    (:func:`write_shard`) into a run directory inside ``shard_dir`` (default: the
    output's directory), which every worker and this process must share (a probe file
    is checked on each worker first), and :func:`rfsgen.merge.merge_streamed` verifies
    and merges each into ``output`` as soon as the shards before it are merged (dense
    uncompressed shards, copied at disk speed, once all are there); the run directory is
    removed on success and on failure alike: a
    failed run leaves no shard and no output.  A worker killed mid-run has its ranges
    written again by another (the shards are deterministic).  Returns the summary
    dict, or None (nothing done) when the workers cannot see the default directory
    (the caller then sends the chunks through this process); a ``shard_dir`` that some
    worker cannot see is a :class:`~rfsgen.errors.UsageError`."""
    from . import __version__
    from .atomic import atomic_path
    from .features import load
    from .inputs import _split_spec, check_width, open_input, parse_rows, resolve_rows, shard_rows
    from .output import DTYPES, _check_options, check_space, file_sha256, resolve_layout
    from .transform import _bound_by, _remote_device, _swapped

    _check_options(layout, dtype, compression)
    _remote_device(device)
    if chunk_rows is not None and chunk_rows < 1:
        raise UsageError(f"--chunk-rows must be at least 1, got {chunk_rows}")
    if rows is not None and shard is not None:
        raise UsageError("give --rows or --shard, not both")
    parse_rows(rows)
    from .errors import FeatureFileError

    try:
        fs = load(features)
    except FeatureFileError as e:
        raise _swapped(features, input) or e from None
    layout = resolve_layout(layout, fs)
    path, key = _split_spec(os.fspath(input))
    spec = os.path.abspath(path) + (f":{key}" if key is not None else "")
    with open_input(input, layer=layer) as src:
        check_width(src, fs.skeleton.width, fs.skeleton.path, fs.skeleton.shape,
                    **_bound_by(fs, f"feature file '{features}'", src))
        if src.n_rows is None or getattr(src, "declared_only", False):
            return None  # a stream: its rows can only travel through this process
        start, stop = shard_rows(shard, src.n_rows, src.name) if shard is not None else \
            resolve_rows(rows, src.n_rows, src.name)
        # the merged output must fit where it goes: checked before a range is handed out
        check_space(output, stop - start, fs.columns, layout, np.dtype(DTYPES[dtype]).itemsize, compression)
        provenance = {"rfsgen_version": __version__, "features_file": str(features),
                      "features_sha256": file_sha256(features), "input": src.name}
    chosen = shard_dir is not None
    base = os.path.abspath(shard_dir) if chosen else os.path.dirname(os.path.abspath(output))
    if chosen and not os.path.isdir(base):
        raise UsageError(f"--shard-dir {shard_dir}: not a directory; create it (on a file system every Dask worker "
                         "shares) or leave --shard-dir out")
    try:
        with atomic_path(output, overwrite, inputs=[features, input]) as final:
            info, n_ranges = _run_shards(client, address, fs, spec, path, features, os.path.basename(output),
                                         final, base, shard_dir, quiet,
                                         start, stop, provenance, layout, dtype, compression, chunk_rows, layer,
                                         progress, device)
    except _Blind:
        return None
    info.pop("shards", None)
    info.pop("virtual", None)
    info.update(output=str(output), ranges=n_ranges, device=_remote_device(device)[1])
    return info


class _Blind(Exception):
    """Some worker cannot see the default shard directory: send the rows through the client."""


def _run_shards(client, address, fs, spec, path, features, name, final, base, shard_dir, quiet, start, stop,
                provenance, layout, dtype, compression, chunk_rows, layer, progress, device="cpu"):
    """The body of :func:`transform_sharded`, inside its ``atomic_path`` (``final``)."""
    import secrets
    import shutil
    import sys

    from .atomic import _host
    from .errors import OutputError, RfsgenError
    from .merge import merge_streamed
    from .output import default_chunk_rows

    chosen = shard_dir is not None
    _remove_stale_shard_dirs(base)
    try:
        run_dir = os.path.join(base, f".{name}.rfsgen-{_host()}-{os.getpid()}-"
                                     f"{secrets.token_hex(4)}.shards")
        os.mkdir(run_dir)
    except OSError as e:
        raise OutputError(f"{base}: cannot create the shard directory there ({e.strerror}); give a writable "
                          "--shard-dir") from None
    try:
        token = secrets.token_hex(16)
        with open(os.path.join(run_dir, "probe"), "w", encoding="ascii") as fh:
            fh.write(token)
        seen = _guarded(address, lambda: client.run(_probe, run_dir, token,
                                                    [os.path.abspath(features), os.path.abspath(path)]),
                        "asking the workers for the shard directory")
        blind = {w: why for w, why in seen.items() if why is not None}
        if not seen or blind:
            who = "no Dask worker is connected yet" if not blind else "Dask worker {} {}".format(*next(iter(
                blind.items())))
            if chosen:
                raise UsageError(f"--shard-dir {shard_dir}: {who}; give a directory every worker shares, or "
                                 "--dask-gather to send the rows through this process")
            if not quiet:
                print(f"rfsgen: warning: dask: {who}: the rows travel through this process (give --shard-dir a "
                      "directory every worker shares)", file=sys.stderr)
            raise _Blind  # out of atomic_path, which then leaves no output
        threads = sum(w.get("nthreads", 1) for w in client.scheduler_info(n_workers=-1)["workers"].values())
        chunk = default_chunk_rows(fs.columns, chunk_rows=chunk_rows)
        ranges = row_ranges(start, stop, threads, chunk)
        width = len(str(len(ranges)))
        paths = [os.path.join(run_dir, f"part-{i:0{width}d}.h5") for i in range(len(ranges))]
        shared = _Scattered(client, address, fs)
        if progress is not None and hasattr(progress, "phase"):
            progress.phase("transform", stop - start)

        def submit(i):
            (a, b), p = ranges[i], paths[i]
            fs_future = shared.copy_for(i)
            return _guarded(address, lambda: client.submit(
                write_shard, fs_future, spec, p, a, b, provenance, layout, dtype, compression, chunk_rows, layer,
                device, pure=False, key=f"rfsgen-shard-{a}-{b}-{secrets.token_hex(4)}"), f"sending rows {a}:{b}")

        if layout == "dense" and compression == "none" and not chosen and stop > start:
            # The workers see the output's directory (the probe): they write their rows
            # straight into the output, with no shard to copy.
            from .inputs import open_input
            from .output import write_output

            engine = _InPlace(client, address, fs, shared, spec, ranges, dtype, chunk_rows, layer, device)
            with open_input(spec, layer=layer) as src:
                info = write_output(final, engine, src, start, stop, layout=layout, dtype=dtype,
                                    compression=compression, chunk_rows=chunk_rows, overwrite=True, inputs=[],
                                    progress=progress, provenance=provenance)
            return info, len(ranges)
        # Each shard is merged as soon as the rows before it are: the merge of the first
        # ranges overlaps the workers' writing of the later ones.  The run directory goes
        # whatever happens: its shards are consumed as they are copied.
        futures = [submit(i) for i in range(len(ranges))]

        def arrive(i):
            a, b = ranges[i]
            _shard_result(address, futures, i, lambda: submit(i), f"transforming rows {a}:{b}")

        try:
            info = merge_streamed(ranges, paths, arrive, final, overwrite=True, progress=progress, chunk_rows=chunk,
                                  consume=True)
        finally:
            for f in futures:  # (a failed run: the tasks still running)
                f.cancel()
    except RfsgenError:
        raise
    except OSError as e:
        raise OutputError(f"{run_dir}: {e.strerror or e}; check the shard directory") from None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return info, len(ranges)


#: Times a range whose task the scheduler cancelled is submitted again.
RESUBMITS = 2


def _in_order(address, ranges, submit, progress) -> list:
    """Every range's task, ``submit(i)`` for range ``i`` of ``ranges`` (``(a, b)`` rows),
    sent at once, then waited for in order (:func:`_shard_result`: a cancelled task is
    sent again by the same ``submit(i)``), each range's rows counted on ``progress`` as
    it ends (the bar counts whole ranges).  The tasks still running are cancelled on the way out, whether the
    run succeeds or fails.  Returns the tasks' results, in range order."""
    futures = [submit(i) for i in range(len(ranges))]
    results = []
    try:
        for i, (a, b) in enumerate(ranges):
            results.append(_shard_result(address, futures, i, lambda i=i: submit(i), f"transforming rows {a}:{b}"))
            if progress:
                progress(b - a)
    finally:
        for f in futures:
            f.cancel()
    return results


def _shard_result(address, futures, i, resubmit, what):
    """Wait for ``futures[i]``.  When a worker dies mid-task, the scheduler sometimes
    forgets the task instead of running it elsewhere (``FutureCancelledError: ...
    already forgotten``, seen under load): the range is deterministic, so it is
    submitted again (``resubmit()``, at most :data:`RESUBMITS` times) before that is an
    error."""
    from concurrent.futures import CancelledError

    from .errors import RfsgenError

    for attempt in range(RESUBMITS + 1):
        try:
            return _guarded(address, futures[i].result, what)
        except CancelledError as e:
            if attempt == RESUBMITS:
                raise RfsgenError(f"the Dask scheduler at {address} cancelled the task {what} {RESUBMITS + 1} times "
                                  f"({type(e).__name__}: {e}); nothing was written; check the workers and the "
                                  "scheduler's logs, then run again") from None
            futures[i] = resubmit()


def _guarded(address, fn, what):
    """``fn()``, with a dead worker or a lost scheduler as a one-line error."""
    from distributed.scheduler import KilledWorker

    from .errors import RfsgenError

    try:
        return fn()
    except RfsgenError:
        raise
    except KilledWorker as e:
        raise RfsgenError(f"a Dask worker died while {what} (scheduler {address}): {e}; nothing was written; check "
                          "the workers' memory and logs, then run again") from None
    except (OSError, TimeoutError) as e:
        raise RfsgenError(f"lost the Dask scheduler at {address} while {what} ({type(e).__name__}: {e}); nothing "
                          "was written") from None

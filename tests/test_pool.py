"""The compiled loops' worker pool (rfsgen._compiled.run_parts) and the gaussian and
laplace groups' rows gathered straight into float32 (rfsgen.bases.gathered_phases):
the same bytes as before, whatever the threads."""

import hashlib
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import skeleton_path
from rfsgen import _compiled, load_skeleton, sample, transform
from rfsgen._threads import using
from rfsgen.errors import DataError
from rfsgen.paths import Transformer
from rfsgen.recurrence import prepare_inputs

ROOT = Path(__file__).resolve().parents[1]


def _digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def conv():
    fs = sample(load_skeleton(skeleton_path("mnist-conv")), 256, seed=4)
    x = np.random.default_rng(5).standard_normal((61, 784))
    return fs, x


def test_run_parts_same_bytes_however_the_rows_are_cut():
    x = np.random.default_rng(0).standard_normal((97, 40))
    cols = np.arange(40, dtype=np.int64)[::-1].copy()
    want = x[:, cols]
    for parts in (1, 2, 3, 4, 7):
        cuts = [97 * i // parts for i in range(parts)] + [97]
        out = np.full_like(x, np.nan)
        _compiled.run_parts(_compiled._gather_columns, cuts, x, cols, out)
        assert np.array_equal(out, want)


def test_the_pool_is_made_once_and_reused():
    x = np.random.default_rng(1).standard_normal((64, 8))
    cols = np.arange(8, dtype=np.int64)
    out = np.empty_like(x)
    _compiled.run_parts(_compiled._gather_columns, [0, 20, 40, 64], x, cols, out)
    pool = _compiled._the_pool()
    workers = list(pool.workers)
    assert len(workers) >= 2 and all(t.is_alive() for t in workers)
    for _ in range(20):
        _compiled.run_parts(_compiled._gather_columns, [0, 20, 40, 64], x, cols, out)
    assert _compiled._the_pool() is pool and pool.workers[:len(workers)] == workers
    assert np.array_equal(out, x)


def test_the_workers_keep_no_array_of_a_finished_call():
    """A worker waiting for the next call holds nothing of the last one: an output mapped
    from a file (the Dask workers' in place, a local run's) is unmapped, and a deleted
    file's space freed, once its caller lets it go."""
    import gc
    import weakref

    class Tracked(np.ndarray):
        pass

    started = threading.Barrier(3)

    def kernel(out, a, b):
        if a == 0:  # the caller's own part waits until both workers hold one
            started.wait(timeout=20)
        elif a in (10, 20):
            started.wait(timeout=20)
        out[a:b] = 1

    out = np.zeros(30).view(Tracked)
    gone = weakref.ref(out)
    _compiled._the_pool().grow(2)
    _compiled.run_parts(kernel, [0, 10, 20, 30], out)
    assert out.sum() == 30
    del out
    gc.collect()
    assert gone() is None, "a pool worker still holds the finished call's arguments"


def test_an_error_in_a_part_reaches_the_caller():
    def kernel(out, a, b):
        if a:
            raise ValueError(f"part {a}")
        out[a:b] = 1

    out = np.zeros(10)
    with pytest.raises(ValueError, match="part"):
        _compiled.run_parts(kernel, [0, 5, 10], out)
    assert out[:5].sum() == 5
    _compiled.run_parts(kernel, [0, 10], out)  # the pool still works


def test_transform_same_bytes_with_one_two_and_three_threads(conv):
    fs, x = conv
    want = _digest(transform(fs, x, layout="dense"))
    for n in range(1, _compiled.threads() + 1):
        with using(n):
            assert _digest(transform(fs, x, layout="dense")) == want
    # three threads even on a smaller machine: numba takes NUMBA_NUM_THREADS as given
    code = ("import hashlib, numpy as np\n"
            "from rfsgen import load_skeleton, sample, transform\n"
            "from rfsgen._threads import using\n"
            f"fs = sample(load_skeleton({str(skeleton_path('mnist-conv'))!r}), 256, seed=4)\n"
            "x = np.random.default_rng(5).standard_normal((61, 784))\n"
            "for n in (1, 2, 3):\n"
            "    with using(n):\n"
            "        print(hashlib.sha256(np.ascontiguousarray(transform(fs, x, layout='dense')).tobytes()).hexdigest())\n")
    env = dict(os.environ, NUMBA_NUM_THREADS="3", PYTHONPATH=str(ROOT))
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [want] * 3


def test_transforms_from_several_python_threads_at_once(conv):
    fs, x = conv
    fs2 = sample(load_skeleton(skeleton_path("cifar-patches")), 128, seed=6)
    x2 = np.random.default_rng(7).standard_normal((45, 1728)).astype(np.float32)
    want = [_digest(transform(fs, x, layout="dense")), _digest(transform(fs2, x2, layout="dense"))]
    got, errors = {}, []

    def run(i):
        try:
            for k in range(3):
                got[i, k] = _digest(transform(fs, x, layout="dense") if i % 2 == 0 else transform(fs2, x2, layout="dense"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors
    assert all(got[i, k] == want[i % 2] for i in range(4) for k in range(3))


def _child(args):
    fs, x = args
    pool_before = _compiled._pool
    y = transform(fs, x, layout="dense")
    pool = _compiled._the_pool()
    return _digest(y), pool.pid == os.getpid(), pool_before is None, all(t.is_alive() for t in pool.workers)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_pool_made_before_fork_is_not_used_in_the_child(conv):
    fs, x = conv
    want = _digest(transform(fs, x, layout="dense"))  # the parent's pool exists now
    assert _compiled._pool is not None and _compiled._pool.pid == os.getpid()
    with multiprocessing.get_context("fork").Pool(1) as p:
        digest, own, fresh, alive = p.apply(_child, ((fs, x),))
    assert digest == want and own and fresh and alive
    # guarded by pid as well as by the fork hook
    saved = _compiled._pool
    try:
        stale = _compiled._Pool()
        stale.pid = -1
        _compiled._pool = stale
        assert _digest(transform(fs, x, layout="dense")) == want
        assert _compiled._pool is not stale
    finally:
        _compiled._pool = saved


# ---------------------------------------------------------------- rows gathered into float32

def _old_source(tr, x):
    """Transformer.source through the float64 gather and its float32 copy (as before)."""
    direct = tr._direct
    tr._direct = frozenset()
    try:
        return tr.source(x).copy()
    finally:
        tr._direct = direct


@pytest.mark.parametrize("name", ["mnist-conv", "cifar-patches"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gathered_float32_rows_give_the_old_bytes(name, dtype):
    fs = sample(load_skeleton(skeleton_path(name)), 300, seed=8)
    tr = Transformer(fs, np.float32)
    assert tr._direct
    width = fs.skeleton.width
    x = np.random.default_rng(9).standard_normal((37, width))
    x[3] *= 1e30  # angles beyond float32: recomputed with scaling
    x[5] = 0.0
    x[6] = 1e-40  # subnormal in float32
    x = x.astype(dtype)
    if dtype == np.float64:
        x[4, :7] = 3.5e38  # rounds to inf in float32
    new = tr.source(x)
    assert _digest(new) == _digest(_old_source(tr, x))
    new_scratch = tr.source(x[:20], scratch=True)
    assert _digest(new_scratch) == _digest(new[:20])


def test_gathered_float32_rows_of_csr_inputs():
    text = ("rfsgen: 1\ninput: {shape: [6, 6, 1]}\nnodes:\n"
            "  - {name: p, base: gaussian, scale: 0.5, per: patch, patch: {size: 3, stride: 1}}\n"
            "  - {name: out, activation: relu, dense: true}\n")
    from rfsgen import parse_skeleton

    fs = sample(parse_skeleton(text, "p.yaml"), 64, seed=2)
    x = sp.random(23, 36, density=0.5, format="csr", random_state=3)
    dense = transform(fs, x.toarray(), layout="dense")
    assert _digest(transform(fs, x, layout="dense")) == _digest(dense)
    tr = Transformer(fs, np.float32)
    assert _digest(tr.source(x.toarray())) == _digest(_old_source(tr, x.toarray()))


def test_gathered_rows_refuse_nan_with_the_same_message(conv):
    fs, x = conv
    x = x.copy()
    x[11, 300] = np.nan
    with pytest.raises(DataError) as old:
        prepare_inputs(fs.skeleton, x, 0, "<array>")
    with pytest.raises(DataError) as new:
        transform(fs, x, layout="dense")
    assert str(new.value) == str(old.value)
    assert "row 11" in str(new.value)

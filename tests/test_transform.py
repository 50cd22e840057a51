import io
import math
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

from conftest import ROOT, load_shipped, SKELETONS, SMALL_SKELETONS, rows_for, skeleton_path, without_variance_warning
from reference import column_value
from rfsgen import DataError, kernel, load_skeleton, parse_skeleton
from rfsgen.cli import main
from rfsgen.features import load, save
from rfsgen.sampler import sample
from rfsgen.transform import transform

ALL = [(p.stem, lambda p=p: load_shipped(p)) for p in sorted(SKELETONS.glob("*.yaml"))] + [
    (k, lambda k=k, v=v: parse_skeleton(v, k)) for k, v in SMALL_SKELETONS.items()
]
FINITE = {"categorical": 60, "binary": 24, "sphere-coordinate": 20, "categorical-poly": 300}


@pytest.mark.parametrize("name, make", ALL, ids=[a[0] for a in ALL])
def test_transform_matches_reference_evaluator(name, make, cifar_rows):
    s = make()
    x = cifar_rows[:5] if s.width == 1728 else rows_for(s, 5, seed=1)
    fs = sample(s, FINITE.get(name, 400), seed=3)
    got = transform(fs, x, layout="dense", dtype="float64")
    ref = np.zeros_like(got)
    tol = np.full_like(got, 1e-6)
    for j in range(fs.columns):
        terms = fs.terms_of(j)
        omegas = {}
        for t, (node, code, power) in enumerate(terms):
            n = fs.walk_skeleton.nodes[node]
            if n.base.continuous:
                omegas[code] = fs.omega_of(fs.ptr[j] + t)
                # output definition 3: float32 fma angles, each within (w + 2) 2^-24 sum |x w|
                # (docs/performance.md); a factor of modulus 1 moves the value by at most that
                sw = abs(n.base.param("scale")) * np.abs(omegas[code])
                tol[:, j] += (2.0 * math.sqrt(abs(fs.weight[j])) * abs(power) * (len(n.columns) + 2) * 2.0 ** -24
                              * (np.abs(x[:, np.array(n.columns)]) @ sw))
        for i in range(x.shape[0]):
            ref[i, j] = column_value(fs.walk_skeleton, x[i], terms, omegas, int(fs.kind[j]), fs.weight[j])
    assert np.all(np.abs(got - ref) <= tol), np.max(np.abs(got - ref) - tol)
    # float32 output is exactly the float64 result rounded (the loop computes in float64)
    np.testing.assert_array_equal(transform(fs, x, layout="dense"), got.astype(np.float32))


@pytest.mark.parametrize("name, scheme", [("cifar-deep", "rfs"), ("shallow-gaussian", "rr")])
def test_output_does_not_depend_on_threads_or_tiles(cifar_rows, name, scheme):
    import numba

    fs = sample(load_skeleton(SKELETONS / f"{name}.yaml"), 3000, seed=5, scheme=scheme)
    x = np.concatenate([cifar_rows] * 3)[:61]  # not a multiple of the tile
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = transform(fs, x, layout="dense", dtype="float64")
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = transform(fs, x, layout="dense", dtype="float64")
    finally:
        numba.set_num_threads(before)
    assert one.tobytes() == many.tobytes()
    # each row alone gives the same bytes as the row inside a chunk
    single = np.concatenate([transform(fs, x[i:i + 1], layout="dense", dtype="float64") for i in (0, 9, 60)])
    assert single.tobytes() == one[[0, 9, 60]].tobytes()


@pytest.mark.parametrize("name, make", ALL, ids=[a[0] for a in ALL])
def test_output_does_not_depend_on_how_rows_are_split_over_threads(name, make, cifar_rows, monkeypatch):
    """Every compiled row loop (gather, normalisation, angles, cis, products, log domain)
    runs on Python threads over parts of the rows; with 7 threads and no minimum part
    size, 61 rows are cut at odd places, and the bytes are those of one thread."""
    from rfsgen import _compiled

    s = make()
    x = np.concatenate([cifar_rows] * 3)[:61] if s.width == 1728 else rows_for(s, 61, seed=4)
    fs = sample(s, FINITE.get(name, 700), seed=2)
    monkeypatch.setattr(_compiled, "threads", lambda: 1)
    one = transform(fs, x, layout="dense", dtype="float64")
    calls = []
    real, parts = _compiled.on_rows, _compiled.run_parts

    def counted(kernel, m, *args, **kw):
        calls.append(kernel)
        return real(kernel, m, *args, **kw)

    def counted_parts(kernel, cuts, *args):
        calls.append(kernel)
        return parts(kernel, cuts, *args)

    monkeypatch.setattr(_compiled, "threads", lambda: 7)
    monkeypatch.setattr(_compiled, "_rows_for", lambda values_per_row: 1)
    monkeypatch.setattr(_compiled, "on_rows", counted)
    monkeypatch.setattr(_compiled, "run_parts", counted_parts)
    many = transform(fs, x, layout="dense", dtype="float64")
    from rfsgen import _sincos32
    from rfsgen.paths import Transformer

    # plain random Fourier features write their columns straight from the angles; a single
    # gaussian or laplace group runs its angles and products in one pass
    tr = Transformer(fs, np.float64)
    loop = _sincos32._phases_out_part if tr.fused else _sincos32._phase_columns if tr.phase_products else _compiled._columns
    assert loop in calls
    assert one.tobytes() == many.tobytes()


def test_transforms_on_several_threads_at_once_give_the_same_bytes(tmp_path):
    """Dask's threaded workers (and any user's thread pool) call the transform from many
    threads at once, each of which splits its rows over threads again: every result is
    the one computed alone.  Under numba's workqueue threading layer (where neither TBB
    nor OpenMP is installed) the loops' former ``parallel=True`` aborted the process."""
    code = """
import sys, numpy as np
from concurrent.futures import ThreadPoolExecutor
import rfsgen
sys.path.insert(0, sys.argv[1])
import cifar
jobs = []
for name, scheme in (("cifar-deep", "rfs"), ("shallow-gaussian", "rr")):
    fs = rfsgen.sample(rfsgen.load_skeleton(sys.argv[2] + "/" + name + ".yaml"), 1500, seed=8, scheme=scheme)
    jobs += [(fs, np.concatenate([cifar.rows(64)] * 4)[i:i + 200]) for i in range(0, 56, 8)]
run = lambda job: rfsgen.transform(job[0], job[1], layout="dense", dtype="float64").tobytes()
alone = [run(job) for job in jobs]
with ThreadPoolExecutor(6) as pool:
    together = list(pool.map(run, jobs * 2))
print("same" if together == alone * 2 else "different")
"""
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "data"), str(SKELETONS)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "same", res.stdout + res.stderr[-2000:]


def test_file_transform_imports_neither_scipy_special_nor_sparse(files, tmp_path):
    """A file-to-file transform never needs an activation's series (built lazily) nor
    scipy.sparse, so it does not pay for importing them (0.13-0.2 s of a warm run)."""
    code = (
        "import sys; from rfsgen.transform import transform_file; "
        "transform_file(sys.argv[1], sys.argv[2], sys.argv[3]); "
        "print(sorted(m for m in ('scipy.special', 'scipy.sparse') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code, str(files / "f.h5"), str(files / "rows.npy"),
                          str(tmp_path / "out.h5")], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


def _numpy_columns(tr, x, dtype):
    """The compiled loop's arithmetic written with numpy ufuncs, one IEEE operation per
    call: factor values, powers by repeated squaring, products left to right."""
    src = tr.source(x)
    re = tr.cr * src[:, tr.ir]
    im = np.where(tr.ii >= 0, tr.ci * src[:, np.maximum(tr.ii, 0)], 0.0)
    fr, fi = [re], [im]
    for a, p in zip(tr.xatom, tr.xpow):
        ar, ai = re[:, a], (im[:, a] if p > 0 else -1.0 * im[:, a])
        rr, ri, e = np.ones(len(x)), np.zeros(len(x)), abs(int(p))
        while e:
            if e & 1:
                rr, ri = rr * ar - ri * ai, rr * ai + ri * ar
            e >>= 1
            if e:
                ar, ai = ar * ar - ai * ai, 2.0 * ar * ai
        fr.append(rr[:, None])
        fi.append(ri[:, None])
    fr, fi = np.hstack(fr), np.hstack(fi)
    out = np.empty((len(x), tr.columns), dtype=dtype)
    for j in range(tr.columns):
        p = tr.pos[j]
        f = tr.fidx[tr.fptr[p]:tr.fptr[p + 1]]
        pr, pi = (np.ones(len(x)), np.zeros(len(x))) if f.size == 0 else (fr[:, f[0]], fi[:, f[0]])
        for k in f[1:]:
            pr, pi = pr * fr[:, k] - pi * fi[:, k], pr * fi[:, k] + pi * fr[:, k]
        out[:, j] = tr.sc[p] * (pi if tr.imag[p] else pr)
    return out


@pytest.mark.parametrize("name, make", ALL, ids=[a[0] for a in ALL])
def test_compiled_loop_is_bit_exact(name, make, cifar_rows):
    """The vectorised loop (8-row tiles, 8 x 8 transposes, a partial last tile and a
    column count that is not a multiple of 8) gives exactly the bytes of the same
    arithmetic done one numpy operation at a time, in float64 and float32."""
    s = make()
    x = np.concatenate([cifar_rows] * 2)[:61] if s.width == 1728 else rows_for(s, 61, seed=2)
    fs = sample(s, min(FINITE.get(name, 397), 397), seed=7)
    from rfsgen.transform import Transformer

    for dtype in (np.float64, np.float32):
        tr = Transformer(fs, dtype)
        assert tr.chunk(x).tobytes() == _numpy_columns(tr, x, dtype).tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cifar-deep", "shallow-gaussian"])
def test_end_to_end_unbiased_on_real_cifar(name, cifar_rows):
    """Psi(X) Psi(X)^T averaged over 30 seeds matches the exact kernel within 4 standard errors entrywise."""
    s = load_skeleton(skeleton_path(name))
    x = cifar_rows[:16]
    exact = kernel(s, x)
    grams = []
    for seed in range(30):
        psi = transform(sample(s, 1000, seed=100 + seed), x, layout="dense", dtype="float64")
        grams.append(psi @ psi.T)
    grams = np.array(grams)
    mean = grams.mean(0)
    se = grams.std(0, ddof=1) / math.sqrt(len(grams))
    off = ~np.eye(16, dtype=bool)
    assert np.all(np.abs(mean - exact)[off] <= 4 * se[off] + 1e-12)
    np.testing.assert_allclose(np.diag(mean), 1.0, atol=4 * se.diagonal().max() + 1e-9)


@pytest.mark.slow
def test_error_falls_like_one_over_sqrt_d(cifar_rows):
    """RMS error of the Gram matrix at D = 4096 vs D = 1024 (6 seeds): at least as fast as 1/sqrt(D).

    Plain Monte Carlo would give a ratio of 0.5.  With deduplication the number of
    draws q grows faster than D (q/D rises with D), so the error falls faster:
    measured 0.31 on these rows.  Tolerance: ratio in [0.2, 0.6].
    """
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    x = cifar_rows[:32]
    exact = kernel(s, x)

    def rms(D):
        errs = []
        for seed in range(6):
            psi = transform(sample(s, D, seed=seed), x, layout="dense", dtype="float64")
            errs.append(np.sqrt(np.mean((psi @ psi.T - exact) ** 2)))
        return np.mean(errs)

    ratio = rms(4096) / rms(1024)
    assert 0.2 <= ratio <= 0.6, ratio


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("t")
    s = load_skeleton(skeleton_path("cifar-deep"))
    save(sample(s, 700, seed=5), d / "f.h5")
    import cifar

    np.save(d / "rows.npy", cifar.rows(40).astype(np.float32))
    return d


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def read_csr(path):
    with h5py.File(path, "r") as f:
        g = f["X"]
        assert g.attrs["encoding-type"] == "csr_matrix" and g.attrs["encoding-version"] == "0.1.0"
        return sp.csr_matrix((g["data"][()], g["indices"][()], g["indptr"][()]), shape=tuple(g.attrs["shape"]))


def test_cli_csr_matches_memory_and_is_chunk_invariant(files):
    outs = []
    for i, chunk in enumerate((40, 7, 1)):
        out = files / f"o{i}.h5"
        res = run(["transform", files / "f.h5", files / "rows.npy", "-o", out, "--chunk-rows", chunk, "--layout", "csr"])
        assert res.exit_code == 0, res.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]
    mem = transform(load(files / "f.h5"), np.load(files / "rows.npy"), layout="csr")
    got = read_csr(files / "o0.h5")
    assert (got != mem).nnz == 0 and got.dtype == np.float32
    with h5py.File(files / "o0.h5", "r") as f:
        assert f.attrs["rows_start"] == 0 and f.attrs["rows_stop"] == 40
        assert len(f.attrs["features_sha256"]) == 64 and f.attrs["input"].endswith("rows.npy")
    pytest.importorskip("anndata")  # a test extra
    with h5py.File(files / "o0.h5", "r") as f:
        from anndata.io import read_elem

        assert (read_elem(f["X"]) != mem).nnz == 0


def test_cli_dense_is_chunk_invariant_and_matches_memory(files):
    outs = []
    for i, chunk in enumerate((40, 7, 1)):
        out = files / f"d{i}.h5"
        res = run(["transform", files / "f.h5", files / "rows.npy", "-o", out, "--chunk-rows", chunk, "--layout", "dense"])
        assert res.exit_code == 0, res.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]
    with h5py.File(files / "d0.h5", "r") as f:
        X = f["X"][()]
    np.testing.assert_array_equal(X, transform(load(files / "f.h5"), np.load(files / "rows.npy"), layout="dense"))


@pytest.mark.parametrize("layout", ["dense", "dense-pwrite", "csr"])
def test_full_disk_fails_cleanly(files, tmp_path, monkeypatch, layout):
    import errno
    import os

    import h5py._hl.dataset as h5ds

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    # dense reserves its data area with posix_fallocate (or, without it, writes with
    # os.pwrite in a writer thread); csr appends through h5py
    if layout == "dense-pwrite":
        monkeypatch.delattr(os, "posix_fallocate", raising=False)
    else:
        monkeypatch.setattr(os, "posix_fallocate", full)
    monkeypatch.setattr(os, "pwrite", full)
    monkeypatch.setattr(h5ds.Dataset, "__setitem__", full)
    out = tmp_path / "o.h5"
    res = run(["transform", files / "f.h5", files / "rows.npy", "-o", out, "--layout", layout.split("-")[0],
               "--chunk-rows", 8])
    assert res.exit_code == 1
    assert "no space left on device" in res.stderr and str(out) in res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["missing", "refused"])
def test_dense_without_fallocate_writes_the_same_bytes(files, tmp_path, monkeypatch, how):
    import errno
    import os

    args = [files / "f.h5", files / "rows.npy", "--layout", "dense", "--chunk-rows", 7]
    assert run(["transform", *args, "-o", tmp_path / "mapped.h5"]).exit_code == 0
    if how == "missing":
        monkeypatch.delattr(os, "posix_fallocate", raising=False)
    else:  # a file system that does not support it

        def refuse(*a):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")

        monkeypatch.setattr(os, "posix_fallocate", refuse)
    assert run(["transform", *args, "-o", tmp_path / "written.h5"]).exit_code == 0
    assert (tmp_path / "mapped.h5").read_bytes() == (tmp_path / "written.h5").read_bytes()


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_interrupt_mid_transform_leaves_nothing(files, tmp_path, monkeypatch, layout):
    from rfsgen.paths import Transformer  # the compositional paths' transformer (rfsgen.transform.Transformer makes it)

    real = Transformer.chunk
    calls = []

    def chunk(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:  # Ctrl-C while the third chunk is computed into its map / buffer
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(Transformer, "chunk", chunk)
    out = tmp_path / "o.h5"
    res = run(["transform", files / "f.h5", files / "rows.npy", "-o", out, "--layout", layout, "--chunk-rows", 8])
    assert res.exit_code == 130 and "interrupted" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_in_memory_csr_is_the_dense_result_without_zeros(cifar_rows):
    fs = sample(load_skeleton(skeleton_path("cifar-deep")), 500, seed=2)
    x = np.concatenate([cifar_rows] * 2)[:100]
    x[3, 0::3] = 0.0  # a zero channel in every pixel makes some features exactly zero
    dense = transform(fs, x, layout="dense")
    ref = sp.csr_matrix(dense)
    assert ref.nnz < dense.size
    for chunk in (7, 100):
        got = transform(fs, x, layout="csr", chunk_rows=chunk)
        assert got.shape == dense.shape and got.dtype == np.float32 and got.indices.dtype == np.int32
        for a in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(got, a), getattr(ref, a))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csr_pieces_drop_exact_zeros(dtype):
    from rfsgen.transform import _sparse_parts

    rng = np.random.default_rng(4)
    vals = rng.standard_normal((37, 53)).astype(dtype)
    vals[rng.random(vals.shape) < 0.3] = 0.0
    vals[5] = 0.0  # an empty row
    vals[:, 0] = -0.0  # negative zeros are zeros too
    data, indices, counts = _sparse_parts(vals)
    ref = sp.csr_matrix(vals)
    assert data.dtype == dtype and indices.dtype == np.int32
    np.testing.assert_array_equal(data, ref.data)
    np.testing.assert_array_equal(indices, ref.indices)
    np.testing.assert_array_equal(np.concatenate([[0], np.cumsum(counts)]), ref.indptr)
    full = np.ones((3, 4), dtype=dtype)  # no zeros: views of the values, no copy
    data, indices, counts = _sparse_parts(full)
    assert np.shares_memory(data, full) and counts.tolist() == [4, 4, 4] and indices.tolist() == list(range(4)) * 3


def test_npy_rows_are_read_without_the_memory_map(files, tmp_path):
    from rfsgen.inputs import open_input

    x = np.load(files / "rows.npy")
    with open_input(str(files / "rows.npy")) as src:
        got = np.concatenate([b for _, b in src.chunks(7, 3, 31)])
    np.testing.assert_array_equal(got, x[3:31].astype(np.float64))
    # a truncated file is reported, not read as garbage
    cut = tmp_path / "cut.npy"
    cut.write_bytes((files / "rows.npy").read_bytes()[:-5000])
    res = run(["transform", files / "f.h5", cut, "-o", tmp_path / "o.h5"])
    assert res.exit_code != 0 and "cut.npy" in res.stderr
    assert not (tmp_path / "o.h5").exists()


def test_dense_layout_rows_slice_and_stdin(files):
    res = run(["transform", files / "f.h5", files / "rows.npy", "-o", files / "d.h5", "--layout", "dense",
               "--rows", "5:12", "--dtype", "float64"])
    assert res.exit_code == 0, res.stderr
    full = transform(load(files / "f.h5"), np.load(files / "rows.npy"), layout="dense", dtype="float64")
    with h5py.File(files / "d.h5", "r") as f:
        np.testing.assert_array_equal(f["X"][()], full[5:12])
    buf = io.BytesIO()
    np.save(buf, np.load(files / "rows.npy"))
    res = CliRunner().invoke(main, ["transform", str(files / "f.h5"), "-", "-o", str(files / "s.h5"), "--layout", "csr"],
                           input=buf.getvalue())
    assert res.exit_code == 0, res.stderr
    same = transform(load(files / "f.h5"), np.load(files / "rows.npy"), layout="csr")  # float32, in memory
    assert (read_csr(files / "s.h5") != same).nnz == 0


@pytest.mark.parametrize("case", ["width", "nan", "csv", "dataset", "foreign", "exists", "unwritable", "missing-features"])
def test_bad_inputs_fail_cleanly(files, tmp_path, case):
    out = tmp_path / "out.h5"
    feats, rows = files / "f.h5", files / "rows.npy"
    if case == "width":
        np.save(tmp_path / "w.npy", np.ones((3, 10)))
        rows, code, msg = tmp_path / "w.npy", 2, "rows have 10 values but skeleton"
    elif case == "nan":
        x = np.load(files / "rows.npy")
        x[3, 5] = np.nan
        np.save(tmp_path / "n.npy", x)
        rows, code, msg = tmp_path / "n.npy", 1, "row 3, column 5: value is nan"
    elif case == "csv":
        (tmp_path / "c.csv").write_text(",".join(["1"] * 1728) + "\n" + ",".join(["1"] * 1727 + ["abc"]) + "\n")
        rows, code, msg = tmp_path / "c.csv", 1, "c.csv:2: column 1727: 'abc' is not a number"
    elif case == "dataset":
        with h5py.File(tmp_path / "in.h5", "w") as f:
            f["a"] = np.ones((2, 1728))
        rows, code, msg = f"{tmp_path}/in.h5:/b", 2, "has no dataset or CSR group '/b' (available: /a)"
    elif case == "foreign":
        with h5py.File(tmp_path / "foreign.h5", "w") as f:
            f["a"] = 1
        feats, code, msg = tmp_path / "foreign.h5", 2, "not an rfsgen feature file"
    elif case == "missing-features":
        feats, code, msg = tmp_path / "nope.h5", 2, "no such feature file"
    elif case == "exists":
        out.write_bytes(b"keep me")
        code, msg = 2, "already exists; pass --overwrite"
    else:
        out, code, msg = tmp_path / "no" / "such" / "dir" / "o.h5", 1, "does not exist; create it first"
    res = run(["transform", feats, rows, "-o", out])
    assert res.exit_code == code, res.stderr
    assert msg in res.stderr and res.stderr.count("\n") == 1
    leftovers = [p.name for p in tmp_path.iterdir() if p.suffix in (".h5", ".part") and p.name.startswith((".out", "out"))]
    if case == "exists":
        assert out.read_bytes() == b"keep me"
    else:
        assert leftovers == []


PEAK = r"""
import resource, sys
import numpy as np
from rfsgen.transform import transform_file
transform_file(sys.argv[1], sys.argv[2], sys.argv[3], chunk_rows=2000, layout=sys.argv[4])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["csr", "dense"])  # dense: memory-mapped windows must be released
def test_peak_memory_does_not_grow_with_rows(tmp_path, layout):
    s = load_skeleton(skeleton_path("tabular-circle"))
    save(sample(s, 256, seed=1), tmp_path / "f.h5")
    x = np.random.default_rng(0).standard_normal((200_000, 8)).astype(np.float32)
    np.save(tmp_path / "big.npy", x)
    np.save(tmp_path / "small.npy", x[:20_000])
    peaks = []
    for name in ("small", "big"):
        res = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "f.h5"), str(tmp_path / f"{name}.npy"),
                              str(tmp_path / f"{name}.out.h5"), layout], capture_output=True, text=True, check=True)
        peaks.append(int(res.stdout.strip()))
    # 200k rows x 256 float32 columns is 205 MB of output; peak RSS must not follow it.
    assert peaks[1] < peaks[0] * 1.15 + 20_000, peaks  # ru_maxrss is in KiB


STEP_OVER_COORDINATE = """
rfsgen: 1
input: {width: 2}
nodes:
  - {name: s, base: sphere, scheme: coordinate}
  - {name: out, activation: step, inputs: [s]}
"""


def _decimal_value(fs, j, x):
    """Column j of a real-valued sphere 'coordinate' feature set on unit-normalised row x,
    in decimal arithmetic (no overflow or underflow): sqrt(w) prod (sqrt(d) x_c)^p."""
    from decimal import Decimal, getcontext

    ctx = getcontext()
    ctx.prec, ctx.Emax, ctx.Emin = 40, 10**15, -10**15
    d = fs.skeleton.width
    val = Decimal(fs.weight[j]).sqrt()
    for _, code, power in fs.terms_of(j):
        val *= (Decimal(d).sqrt() * Decimal(float(x[code]))) ** power
    return float(val)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_are_checked_finite_on_every_thread(dtype):
    """The rows' finiteness is tested by a compiled read on the row parts (all_finite), and
    the first bad value in row order is still the one named, whichever part holds it."""
    from rfsgen import _compiled
    from rfsgen.errors import DataError
    from rfsgen.recurrence import checked_rows

    skel = parse_skeleton("rfsgen: 1\ninput: {width: 9}\nnodes:\n  - {name: x, base: gaussian}\noutput: x\n", "f.yaml")
    x = np.random.default_rng(0).standard_normal((50, 9)).astype(dtype)
    for parts in (1, 4):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_compiled, "threads", lambda: parts)
            mp.setattr(_compiled, "_rows_for", lambda n: 1)
            assert _compiled.all_finite(x)
            assert checked_rows(skel, x, 0, "t") is x
            for (r, c), v in (((0, 0), np.nan), ((49, 8), np.inf), ((20, 4), -np.inf)):
                y = x.copy()
                y[r, c] = v
                assert not _compiled.all_finite(y)
                with pytest.raises(DataError, match=rf"t: row {r + 7}, column {c}: value is {v}"):
                    checked_rows(skel, y, 7, "t")
            y = x.copy()
            y[45, 1], y[12, 6] = np.nan, np.inf  # two parts hold one each: row 12 is named
            with pytest.raises(DataError, match="row 12, column 6: value is inf"):
                checked_rows(skel, y, 0, "t")
    assert checked_rows(skel, x[::2], 0, "t").flags.c_contiguous
    assert _compiled.all_finite(x[:0])
    with pytest.raises(ValueError, match="all_finite: x must be C-ordered"):
        _compiled.all_finite(x[:, ::2])


def test_high_powers_never_give_nan():
    """The issue's reproducer: step over a sphere 'coordinate' node draws powers in the
    millions; (sqrt(2) x_j)^p overflowed while another factor underflowed, and 0 * inf
    was written as NaN.  Those columns are now computed in the log domain: every value
    is finite and equals a decimal-arithmetic reference (underflow gives 0).  (The
    estimator itself has infinite variance here, so a mean over seeds proves nothing.)"""
    from rfsgen.transform import Transformer

    s = parse_skeleton(STEP_OVER_COORDINATE)
    x = np.array([[0.6, 0.8], [1.0, 1.0], [1.0, 0.0], [0.3, -0.2]])
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    for seed in range(4):
        fs = sample(s, 512, seed=seed)
        assert (fs.kind == 0).all()
        tr = Transformer(fs, np.float64)
        assert tr.huge.size > 0  # the log-domain path is exercised
        z = transform(fs, x, layout="dense", dtype="float64")
        assert np.isfinite(z).all()
        for j in list(tr.huge[:25]) + list(range(0, 512, 41)):
            ref = [_decimal_value(fs, j, u) for u in unit]
            np.testing.assert_allclose(z[:, j], ref, rtol=1e-8, atol=1e-300)


STEP_OVER_SPHERES = """
rfsgen: 1
input: {width: 6}
nodes:
  - {name: p, base: sphere, scheme: pair, columns: [0, 1, 2, 3]}
  - {name: c, base: sphere, scheme: coordinate, columns: [4, 5]}
  - {name: out, activation: step, inputs: [p, c]}
"""


def _log_domain_reference(tr, fs, src, j):
    """Column ``j`` the way the log domain defines it, one row and one term at a time:
    hypot, log and atan2 per term (C library), sums from log(scale) and 0.0 in the
    terms' order, rfsgen's sin/cos, exp; a zero factor gives 0.0."""
    from rfsgen._sincos import sincos

    out = np.empty(src.shape[0])
    for r in range(src.shape[0]):
        lg, ph, zero = math.log(float(fs.scale[j])), 0.0, False
        for q in range(int(fs.ptr[j]), int(fs.ptr[j + 1])):
            k = int(tr.term_atom[q])
            zr = tr.cr[k] * src[r, tr.ir[k]]
            zi = tr.ci[k] * src[r, tr.ii[k]] if tr.ii[k] >= 0 else 0.0
            a = math.hypot(zr, zi)
            if a == 0.0:
                zero = True
                break
            lg += float(fs.power[q]) * math.log(a)
            ph += float(fs.power[q]) * math.atan2(zi, zr)
        sp_, cp = sincos(ph)
        out[r] = 0.0 if zero else (-1.0 if fs.kind[j] == 2 else 1.0) * math.exp(lg) * (sp_ if fs.kind[j] == 2 else cp)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_log_domain_columns_have_the_bits_of_their_definition(seed):
    """The log-domain loop shares each atom's log|z| and arg z between terms and sums
    over blocks of rows in vector lanes; every value still has the bits of the per-term,
    per-row definition (real and complex atoms, zero factors, rows in a partial block),
    and those columns are left out of the product loop (no factor raised to their
    powers)."""
    from rfsgen.transform import Transformer

    s = parse_skeleton(STEP_OVER_SPHERES)
    with pytest.warns(Warning):  # step over spheres: the VarianceWarning, said where features are made
        fs = sample(s, 256, seed=seed)
    x = rows_for(s, 45, seed=seed)
    x[::7, 4] = 0.0  # coordinate factors that are exactly zero
    x[::5, 0:2] = 0.0  # and pair factors
    tr = Transformer(fs, np.float64)
    assert tr.huge.size and (tr.ii[tr.huge_uatom] >= 0).any() and (tr.ii[tr.huge_uatom] < 0).any()
    assert (np.diff(tr.fptr)[tr.pos[tr.huge]] == 0).all()  # no factors in the product loop
    assert tr.fidx.size == fs.node.size - tr.huge_power.size
    z = tr.chunk(x)
    src = tr.source(x)
    for j in tr.huge:
        assert z[:, j].tobytes() == _log_domain_reference(tr, fs, src, j).tobytes(), j


def test_log_domain_path_agrees_with_the_product_loop(cifar_rows):
    """Forcing every column through the log-domain path gives the product loop's values
    to 1e-11 relative (different arithmetic, the same numbers)."""
    from rfsgen.transform import Transformer

    for name, d in (("cifar-deep", 300), ("sphere-coordinate", 20), ("circle-step", 300)):
        s = load_skeleton(skeleton_path(name)) if name == "cifar-deep" else parse_skeleton(SMALL_SKELETONS[name])
        x = cifar_rows[:9] if s.width == 1728 else rows_for(s, 9, seed=3)
        fs = sample(s, d, seed=1)
        tr = Transformer(fs, np.float64)
        want = tr.chunk(x)
        tr.log_domain(fs, np.arange(fs.columns), tr.term_atom, fs.power.astype(np.int64), fs.kind == 2)
        got = tr.chunk(x)
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-14, err_msg=name)


def test_values_too_large_for_float32_are_an_error():
    """A value beyond float32's range is reported with its row and column, never written
    as inf; in float64 the same column is computed (sqrt(2)^300 = 2^150)."""
    from rfsgen.features import FeatureSet
    from rfsgen.transform import Transformer

    s = parse_skeleton(STEP_OVER_COORDINATE)
    one = np.ones(1, np.int64)
    fs = FeatureSet(skeleton=s, scheme="rfs", seed=0, draws=1, count=one, kind=np.zeros(1, np.uint8),
                    ptr=np.array([0, 1]), node=np.zeros(1, np.int64), code=np.zeros(1, np.int64),
                    power=np.array([300]), omega=np.zeros(0))
    x = np.array([[0.5, 0.5], [1.0, 0.0]])
    with pytest.raises(DataError, match=r"row 1, column 0: the feature's value is too large for float32"):
        Transformer(fs, np.float32).chunk(x)
    np.testing.assert_allclose(Transformer(fs, np.float64).chunk(x)[:, 0], [1.0, 2.0**150], rtol=1e-12)


JOINT = {
    "coordinate": "rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: s, base: sphere, scheme: coordinate}\n"
                  "  - {name: out, activation: step, inputs: [s]}\n",
    "pair": "rfsgen: 1\ninput: {width: 6}\nnodes:\n  - {name: s, base: sphere, scheme: pair}\n"
            "  - {name: out, activation: step, inputs: [s]}\n",
    "two-nodes": "rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: s, base: sphere, scheme: coordinate, per: group, "
                 "group: 4}\n  - {name: g, base: gaussian, columns: '0:3'}\n  - {name: out, activation: step, "
                 "inputs: [s, g]}\n",
}


@pytest.mark.filterwarnings("ignore::rfsgen.VarianceWarning")
@pytest.mark.parametrize("name", list(JOINT))
def test_the_overflow_checks_joint_bound_holds(name):
    """The columns checked for inf after each chunk are those whose joint bound (the
    factors from one unit vector bounded together, Transformer._joint_bound) exceeds the
    dtype's range: no value of any row goes above that bound, rows built to reach a
    column's bound reach it (coordinate factors: the bound is the maximum), and step
    over a coordinate node, whose per-factor bound exceeded float32 for many columns,
    checks none."""
    from rfsgen.transform import Transformer

    s = parse_skeleton(JOINT[name], f"{name}.yaml")
    fs = sample(s, 400, seed=2)
    tr = Transformer(fs, np.float64)
    bound = tr._joint_bound(fs, tr.term_atom, fs.power.astype(np.int64), np.arange(fs.columns))
    assert np.isfinite(bound).all()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, s.width)) * rng.choice([1.0, 1e-3, 1e3], (300, 1))
    x[:40] = np.where(rng.random((40, s.width)) < 0.6, 0.0, x[:40])  # mass on few coordinates
    x[:40, ::4] += 1e-9  # (no zero vector)
    if name == "coordinate":  # for some columns, the coordinates in the proportions of the maximum
        ptr = fs.ptr.astype(np.int64)
        reach = [c for c in range(fs.columns) if ptr[c + 1] - ptr[c] > 1][:30]
        rows = np.zeros((len(reach), s.width))
        for i, c in enumerate(reach):
            t = np.arange(ptr[c], ptr[c + 1])
            rows[i, tr.ir[tr.term_atom[t]]] = np.sqrt(fs.power[t].astype(np.float64))
        x = np.vstack([x, rows])
    with np.errstate(divide="ignore"):
        got = np.log(np.abs(tr.chunk(x)))
    assert (got <= bound + 1e-9).all()
    if name == "coordinate":
        np.testing.assert_allclose(got[300 + np.arange(len(reach)), reach], bound[reach], atol=1e-9)
        per_factor = Transformer(fs, np.float32)
        assert per_factor.checked.size == 0
        wide = sample(parse_skeleton(JOINT[name].replace("width: 8", "width: 64"), "w.yaml"), 2048, seed=1)
        assert Transformer(wide, np.float32).checked.size == 0  # 429 columns were checked before


@pytest.mark.parametrize("args", [
    ["sample", "{skel}", "-n", "20000", "-o", "{out}/o.h5"],
    ["transform", "{feats}", "{rows}", "-o", "{out}/o.h5", "--layout", "csr"],
    ["transform", "{feats}", "{rows}", "-o", "{out}/o.h5", "--layout", "dense"],
    ["transform", "{feats}", "{rows}", "-o", "{out}/o.h5", "--layout", "dense", "--compression", "gzip"],
    ["kernel", "{skel}", "{rows}", "-o", "{out}/K.npy"],
], ids=["sample", "csr", "dense", "dense-gzip", "kernel"])
def test_a_real_write_failure_inside_hdf5_is_one_line(files, tmp_path, args):
    """The disk fills up while HDF5 itself is writing (imitated with a file-size limit,
    which fails writes with EFBIG where a full disk gives ENOSPC): this used to end in
    a segmentation fault and pages of HDF5 errors; now one line, exit 1, nothing left."""
    import resource
    import signal

    rows = np.concatenate([np.load(files / "rows.npy")] * 4)
    # Above the least size rfsgen checks first (a dense matrix: its values), below the whole file
    size = rows.shape[0] * load(files / "f.h5").columns * 4 + 256 if args[-1] == "dense" else 30_000

    def limit():  # (rfsgen itself ignores SIGXFSZ: the write fails with EFBIG, not the process)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    out = tmp_path / "out"
    out.mkdir()
    np.save(tmp_path / "rows.npy", rows)
    cmd = [a.format(skel=skeleton_path("cifar-deep"), feats=files / "f.h5", rows=tmp_path / "rows.npy", out=out)
           for a in args]
    res = subprocess.run([sys.executable, "-m", "rfsgen", *cmd], capture_output=True, text=True, preexec_fn=limit)
    assert res.returncode == 1, res.stderr[-3000:]
    lines = without_variance_warning(res.stderr.splitlines(), expected=args[0] == "sample")  # cifar-deep's, on sampling
    assert len(lines) == 1 and "cannot write (File too large)" in lines[0], res.stderr[-3000:]
    assert list(out.iterdir()) == []


def test_sphere_rows_of_any_magnitude_give_the_features_of_the_unscaled_rows(cifar_rows):
    """Normalisation scales by a power of two before squaring: rows times 2^+-900 give
    the very same bytes, rows times 1e+-300 (not exact in binary) the same values to
    rounding; 1e-200 rows are not mistaken for zero vectors."""
    for name in ("cifar-deep", "shallow-gaussian"):
        fs = sample(load_skeleton(skeleton_path(name)), 500, seed=3)
        x = cifar_rows[:5]
        want = transform(fs, x, layout="dense", dtype="float64")
        for f in (2.0**-900, 2.0**900):
            assert transform(fs, x * f, layout="dense", dtype="float64").tobytes() == want.tobytes()
        for f in (1e-300, 1e-200, 1e200, 1e300):
            np.testing.assert_allclose(transform(fs, x * f, layout="dense", dtype="float64"), want, rtol=1e-12,
                                       atol=1e-14)


def test_shards_cover_every_row_once_with_the_unsharded_values(files, tmp_path):
    """--shard K/N (a job array's task id and count): N nearly equal contiguous ranges
    that cover the rows exactly once, each holding exactly the unsharded values."""
    rows = np.load(files / "rows.npy")
    whole = transform(load(files / "f.h5"), rows, layout="dense")
    parts, ranges = [], []
    for k in range(7):
        out = tmp_path / f"s{k}.h5"
        res = run(["transform", files / "f.h5", files / "rows.npy", "-o", out, "--layout", "dense", "--shard", f"{k}/7"])
        assert res.exit_code == 0, res.stderr
        with h5py.File(out) as f:
            parts.append(f["X"][()])
            ranges.append((int(f.attrs["rows_start"]), int(f.attrs["rows_stop"])))
    assert ranges[0][0] == 0 and ranges[-1][1] == len(rows)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1
    assert np.concatenate(parts).tobytes() == whole.tobytes()


@pytest.mark.parametrize("args, message", [
    (["--shard", "7/7"], "K must be 0 to N - 1"),
    (["--shard", "a/b"], "must look like K/N"),
    (["--shard", "0/0"], "K must be 0 to N - 1"),
    (["--shard", "0/2", "--rows", "0:5"], "give --rows or --shard, not both"),
])
def test_bad_shards_are_usage_errors(files, tmp_path, args, message):
    res = run(["transform", files / "f.h5", files / "rows.npy", "-o", tmp_path / "o.h5", *args])
    assert res.exit_code == 2 and message in res.stderr and res.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_shard_of_a_stream_is_refused(files, tmp_path):
    row = ",".join(["0.5"] * 1728) + "\n"
    res = run(["transform", files / "f.h5", "-", "-o", tmp_path / "o.h5", "--shard", "0/2"], input=row)
    assert res.exit_code == 2 and "--shard needs an input of known length" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["npz", "h5ad"])
def test_peak_memory_of_sparse_inputs_does_not_grow_with_rows(tmp_path, fmt):
    """Sparse inputs are read a chunk of rows at a time: 200k x 1000 rows at 2% density
    would be 1.6 GB dense; peak RSS must not follow the rows."""
    import scipy.sparse as sp

    s = parse_skeleton("rfsgen: 1\ninput: {width: auto}\nnodes:\n"
                       "  - {name: s, base: sphere, scheme: coordinate, zero: uniform}\n"
                       "  - {name: out, activation: {name: polynomial, degree: 2, c: 0.5}, inputs: [s]}\n")
    save(sample(s.bind(1000), 64, seed=1), tmp_path / "f.h5")
    big = sp.random(200_000, 1000, density=0.02, format="csr", dtype=np.float32, rng=np.random.default_rng(0))
    peaks = []
    for name, m in (("small", big[:20_000]), ("big", big)):
        path = tmp_path / f"{name}.{fmt}"
        if fmt == "npz":
            sp.save_npz(path, m)
        else:
            with h5py.File(path, "w") as f:
                g = f.create_group("X")
                g.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": m.shape})
                for k in ("data", "indices", "indptr"):
                    g.create_dataset(k, data=getattr(m, k))
        res = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "f.h5"), str(path),
                              str(tmp_path / f"{name}.out.h5"), "csr"], capture_output=True, text=True, check=True)
        peaks.append(int(res.stdout.strip()))
    del big
    assert peaks[1] < peaks[0] * 1.15 + 30_000, peaks  # KiB; 200k rows hold 48 MB of nonzeros, 1.6 GB dense


CACHED_RUN = r"""
import numpy as np, rfsgen
s = rfsgen.parse_skeleton("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: c, base: circle, per: column}\n"
                          "  - {name: o, activation: relu, inputs: [c]}\n")
rfsgen.transform(rfsgen.sample(s, 50, seed=1), np.ones((4, 3)))
print("ok", rfsgen.__file__)
"""


@pytest.mark.slow
def test_read_only_install_caches_compiled_code_per_user(tmp_path):
    """A shared, read-only install: numba cannot cache next to the package, so the
    compiled code goes to the user's cache directory (XDG_CACHE_HOME/numba) and the next
    run loads it instead of compiling again."""
    import os
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="rfsgen-ro-", dir="/tmp")
    try:
        site, cache = os.path.join(base, "site"), os.path.join(base, "cache")
        shutil.copytree(ROOT / "rfsgen", os.path.join(site, "rfsgen"), ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(cache)
        for d, dirs, files in os.walk(site):
            for f in files:
                os.chmod(os.path.join(d, f), 0o444)
            os.chmod(d, 0o555)
        os.chmod(base, 0o755)
        os.chmod(cache, 0o777)
        env = dict(os.environ, PYTHONPATH=site, XDG_CACHE_HOME=cache, HOME=cache, NUMBA_DEBUG_CACHE="1")
        env.pop("NUMBA_CACHE_DIR", None)
        if os.geteuid() == 0:  # root ignores permissions: make the package directories immutable instead
            for d, _, _ in os.walk(site):
                if subprocess.run(["chattr", "+i", d], capture_output=True).returncode:
                    pytest.skip("running as root without chattr: cannot make a directory read-only for root")
        runs = [subprocess.run([sys.executable, "-c", CACHED_RUN], env=env, cwd=base, capture_output=True, text=True,
                               timeout=600) for _ in range(2)]
        for r in runs:
            assert r.returncode == 0 and f"ok {site}" in r.stdout, r.stderr[-2000:]
        user_cache = os.path.join(cache, "numba")
        assert f"index saved to '{user_cache}" in runs[0].stdout or f"index saved to {user_cache}" in runs[0].stdout, \
            runs[0].stdout[-2000:]
        assert "data loaded from" in runs[1].stdout and user_cache in runs[1].stdout
        assert "index saved to" not in runs[1].stdout, runs[1].stdout[-2000:]  # nothing compiled the second time
        assert not any(p.endswith((".nbi", ".nbc")) for _, _, fs in os.walk(site) for p in fs)
    finally:
        for d, dirs, files in os.walk(base):
            subprocess.run(["chattr", "-i", d], capture_output=True)
            os.chmod(d, 0o755)
        shutil.rmtree(base, ignore_errors=True)


# ----------------------------------------------------------------------------- extreme finite rows (issue 23, item 10)
import crafted  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import SKELETONS, load_shipped, rows_for  # noqa: E402
from rfsgen import DataError as _DataError  # noqa: E402
from rfsgen import kernel as _kernel  # noqa: E402
from rfsgen import parse_skeleton as _parse  # noqa: E402
from rfsgen import sample as _sample  # noqa: E402
from rfsgen import transform as _transform  # noqa: E402

_SHIPPED = sorted(p.stem for p in SKELETONS.glob("*.yaml"))
_FS: dict = {}


def _shipped(name):
    """(skeleton bound to 6 columns if 'width: auto', 64 sampled features), cached."""
    if name not in _FS:
        skel = load_shipped(SKELETONS / f"{name}.yaml")
        _FS[name] = (skel, _sample(skel, 64, seed=3))
    return _FS[name]


def _features_or_error(fs, x):
    """Dense float64 features, or None after checking the DataError is one line naming a row."""
    try:
        z = _transform(fs, x, layout="dense", dtype="float64")
    except _DataError as e:
        assert "\n" not in str(e) and "row " in str(e), str(e)
        return None
    assert np.isfinite(z).all()
    return z


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(_SHIPPED), exponent=st.integers(-1074, 1020), seed=st.integers(0, 3),
       extremes=st.lists(st.tuples(st.integers(0, 10**6), crafted.extreme_values()), max_size=4))
def test_extreme_finite_rows_give_finite_features_or_a_data_error(name, exponent, seed, extremes):
    """Rows scaled by any power of two, with entries set to finite extremes, through every
    shipped skeleton: finite features and a finite kernel, equal to the unscaled rows'
    where the scaling is exact and the kernel is scale-free, or a one-line DataError."""
    skel, fs = _shipped(name)
    base = rows_for(skel, 2, seed=seed)
    scalable = all(b.name == "sphere" for b, _, _ in skel.input_groups)
    x = np.ldexp(base, exponent) if scalable else base.copy()
    for col, v in extremes:
        x[col % 2, (col // 2) % skel.width] = v
    z = _features_or_error(fs, x)
    try:
        k = _kernel(skel, x)
    except _DataError as e:
        assert "\n" not in str(e) and "row " in str(e)
        k = None
    if k is not None:
        assert np.isfinite(k).all()
        if not extremes or scalable:
            np.testing.assert_allclose(np.diag(k), 1.0, rtol=1e-9)
    exact = scalable and not extremes and np.array_equal(np.ldexp(x, -exponent), base)
    if exact:  # a power-of-two scaling that lost no bit: sphere nodes see the same unit vectors
        assert z is not None
        np.testing.assert_array_equal(z, _transform(fs, base, layout="dense", dtype="float64"))
        np.testing.assert_allclose(k, _kernel(skel, base), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["shallow-gaussian", "cifar-deep"])
def test_subnormal_rows_give_the_features_of_the_rows_unscaled(name, cifar_rows):
    """Issue 23 item 10: rows scaled by 2^-1040 gave 1020 of 1024 features NaN."""
    skel = load_shipped(SKELETONS / f"{name}.yaml")
    fs = _sample(skel, 1024, seed=2)
    x = cifar_rows[:3]
    tiny = np.ldexp(x, -1040)  # subnormal: some low bits are lost
    z, zt = (_transform(fs, r, layout="dense", dtype="float64") for r in (x, tiny))
    assert np.isfinite(zt).all()
    np.testing.assert_allclose(zt, _transform(fs, np.ldexp(tiny, 1040), layout="dense", dtype="float64"), rtol=0, atol=0)
    np.testing.assert_allclose(zt, z, atol=1e-6)
    np.testing.assert_allclose(_kernel(skel, tiny), _kernel(skel, x), atol=1e-9)


def _one(base, width=3, extra=""):
    return _parse(f"rfsgen: 1\ninput: {{width: {width}}}\nnodes:\n - {{name: a, base: {base}{extra}}}\n"
                  " - {name: o, activation: relu, inputs: [a]}\noutput: o\n")


@pytest.mark.parametrize("base", ["gaussian", "laplace"])
def test_rows_near_the_largest_float(base):
    """Issue 23 item 10: entries of +-1.7e308 gave NaN.  The kernel is finite and right
    (far rows: 0, a row with itself: 1); features whose angle overflows are a DataError
    naming the row and the node."""
    skel = _one(base)
    x = np.array([[1.7e308, -1.7e308, 1.0], [1.0, 2.0, 3.0]])
    k = _kernel(skel, x)
    far = _kernel(skel, np.array([[1e6, 0, 0], [-1e6, 0, 0]]))  # base kernel 0 for far rows, then relu's dual
    np.testing.assert_array_equal(k, far)
    with pytest.raises(_DataError, match=r"row 0, node 'a': a feature's angle") as e:
        _transform(_sample(skel, 256, seed=1), x, layout="dense")
    assert "\n" not in str(e.value)
    small = _one(base, extra=", scale: 1.0e-308")  # scale * |x - y| is ordinary: the kernel sees it
    k = _kernel(small, np.array([[1.7e308, 0, 0], [-1.7e308, 0, 0]]))
    assert 0 < k[0, 1] < 1 and np.isfinite(k).all()


def test_partial_sums_that_overflow_are_recomputed_not_refused():
    """theta = 1.7e308 - 1.7e308 + ... is finite though a partial sum overflows: the
    features are finite and equal those of the exactly halved row's angle."""
    skel = _one("gaussian", width=2)
    fs = _sample(skel, 64, seed=5)
    x = np.array([[1.5e308, -1.5e308]])
    z = _features_or_error(fs, x)
    if z is not None:
        assert np.isfinite(z).all()


def test_huge_scale_times_large_values_is_a_data_error_in_every_api():
    """Issue 23 item 10: scale 1e300 with |x| >= 1e100 gave NaN."""
    circle = _parse("rfsgen: 1\ninput: {width: 8}\nnodes:\n - {name: a, base: circle, scale: 1.0e+300, per: column}\n"
                    " - {name: o, activation: relu, inputs: [a]}\noutput: o\n")
    x = np.ones((2, 8))
    x[1, 3] = 1e100
    for call in (lambda: _kernel(circle, x), lambda: _transform(_sample(circle, 32, seed=1), x)):
        with pytest.raises(_DataError, match=r"row 1, node 'a\[3\]': the angle scale \* value") as e:
            call()
        assert "\n" not in str(e.value)
    gauss = _one("gaussian", extra=", scale: 1.0e+300")
    with pytest.raises(_DataError, match=r"row 0, node 'a'"):
        _transform(_sample(gauss, 64, seed=1), np.array([[1e100, 0, 0], [1.0, 0, 0]]))


def test_extreme_rows_and_crafted_inputs_through_the_cli_and_sklearn(tmp_path):
    from rfsgen.cli import main
    from rfsgen.sklearn import SkeletonFeatures

    skel = SKELETONS / "tabular-circle.yaml"
    x = rows_for(load_shipped(skel), 4)
    x[2, 5] = 1.7e308  # scale 0.5: a finite angle
    np.save(tmp_path / "x.npy", x)
    runner = CliRunner()
    res = runner.invoke(main, ["kernel", str(skel), str(tmp_path / "x.npy"), "-o", str(tmp_path / "k.npy")])
    assert res.exit_code == 0, res.output
    assert np.isfinite(np.load(tmp_path / "k.npy")).all()
    big = crafted.h5_dense(tmp_path, (10**12, 8))  # issue 23 item 9: an .h5 given to kernel declaring 1e12 rows
    res = runner.invoke(main, ["kernel", str(skel), big, "-o", str(tmp_path / "k2.npy")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "declares shape (1000000000000, 8)" in res.output
    res = runner.invoke(main, ["kernel", str(skel), "-", "-o", str(tmp_path / "k3.npy")],
                        input=crafted.npy_bytes((10**12, 8)), env={"RFSGEN_MAX_MEMORY": "1G"})
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "memory budget" in res.output, res.output
    assert not (tmp_path / "k2.npy").exists() and not (tmp_path / "k3.npy").exists()
    circle = _parse("rfsgen: 1\ninput: {width: 8}\nnodes:\n - {name: a, base: circle, scale: 1.0e+300, per: column}\n"
                    " - {name: o, activation: relu, inputs: [a]}\noutput: o\n")
    x[2, 5] = 1e100
    with pytest.raises(_DataError, match="row 2"):
        SkeletonFeatures(circle, n_components=32, random_state=0).fit(x[:2]).transform(x)


def test_nul_row_names_and_crafted_inputs_through_transform_cli(tmp_path):
    """Issue 23 item 9: obs names holding NUL gave a ValueError traceback; a crafted COO
    archive declaring (1e9, 8) a traceback."""
    from rfsgen import save_features
    from rfsgen.cli import main

    skel = _one("gaussian")
    save_features(_sample(skel, 16, seed=1), tmp_path / "f.h5")
    spec = crafted.h5ad_names(tmp_path, [b"a", b"b\x00c"])
    res = CliRunner().invoke(main, ["transform", str(tmp_path / "f.h5"), spec, "-o", str(tmp_path / "o.h5ad")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "row 1: the row name" in res.output, res.output
    assert not (tmp_path / "o.h5ad").exists()
    eight = _one("gaussian", width=8)
    save_features(_sample(eight, 16, seed=1), tmp_path / "f8.h5")
    # A COO archive declaring 10^9 rows is read through its coordinates, with nothing per
    # declared row (issue 37): its last rows transform under a small budget ...
    coo = crafted.sparse_npz(tmp_path, "coo", (10**9, 8))
    res = CliRunner().invoke(main, ["transform", str(tmp_path / "f8.h5"), coo, "-o", str(tmp_path / "o2.h5"),
                                    "--rows", f"{10**9 - 10}:{10**9}", "--layout", "dense"],
                             env={"RFSGEN_MAX_MEMORY": "256M"})
    assert res.exit_code == 0, res.output
    with h5py.File(tmp_path / "o2.h5", "r") as f:
        assert f["X"].shape == (10, 16)
    # ... and all of them, an output no disk holds, is refused before a byte is written
    # (it once wrote 64 GB before the disk filled).
    huge = crafted.sparse_npz(tmp_path, "coo", (10**15, 8))
    res = CliRunner().invoke(main, ["transform", str(tmp_path / "f8.h5"), huge, "-o", str(tmp_path / "o3.h5")],
                             env={"RFSGEN_MAX_MEMORY": "256M"})
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "needs at least" in res.output \
        and "filesystem has" in res.output and "--rows START:STOP" in res.output, res.output
    assert not (tmp_path / "o3.h5").exists() and not list(tmp_path.glob(".o3.h5*"))


def test_an_output_projected_past_the_room_is_refused_after_its_first_rows(tmp_path, monkeypatch):
    """10^8 declared, empty rows pass the least-size check (8 bytes a row of row
    pointers fit) but their features do not: the size of the rows written so far,
    projected to all of them, is checked after each chunk, so the run stops in its first
    chunks with one line, not when the disk is full.  (Compressed, 10^8 equal rows do
    fit, and are written: the projection of a compressed output is its file's size.)"""
    layout, compression = "csr", "none"
    import rfsgen.output as output_module
    from rfsgen import save_features
    from rfsgen.cli import main

    eight = _one("gaussian", width=8)
    save_features(_sample(eight, 16, seed=1), tmp_path / "f8.h5")
    coo = crafted.sparse_npz(tmp_path, "coo", (10**8, 8))
    monkeypatch.setattr(output_module, "room_for", lambda output: (1 << 30, "its filesystem has 1.0 GiB free"))
    res = CliRunner().invoke(main, ["transform", str(tmp_path / "f8.h5"), coo, "-o", str(tmp_path / "o.h5"),
                                    "--layout", layout, "--compression", compression, "-q"])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert re.search(r"o\.h5: its first [\d,]+ rows took .*, so 100,000,000 rows need about [\d.]+ GiB but its "
                     r"filesystem has 1\.0 GiB free; .*--rows START:STOP", res.output), res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crafted-coo.npz", "f8.h5"]
    # An output that fits is written whole: the same rows, fewer of them
    res = CliRunner().invoke(main, ["transform", str(tmp_path / "f8.h5"), coo, "-o", str(tmp_path / "o.h5"),
                                    "--layout", layout, "--compression", compression, "-q", "--rows", ":200000"])
    assert res.exit_code == 0, res.output


def test_the_file_size_limit_is_the_room_and_passing_it_is_one_line(tmp_path):
    """Under ``ulimit -f`` (SIGXFSZ at its default, which kills a process that writes past
    it): the limit is the room the output is checked against, and a write past it
    anyway fails with EFBIG (rfsgen ignores the signal), one line, nothing left."""
    import resource

    from rfsgen import save_features

    eight = _one("gaussian", width=8)
    save_features(_sample(eight, 16, seed=1), tmp_path / "f8.h5")
    coo = crafted.sparse_npz(tmp_path, "coo", (10**8, 8))
    out = tmp_path / "out"
    out.mkdir()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "rfsgen", "transform", str(tmp_path / "f8.h5"), coo, "-o",
                               str(out / "o.h5"), "-q", *extra], capture_output=True, text=True, preexec_fn=limit)

    res = run("--layout", "csr")
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr[-3000:]
    assert "rows need about" in res.stderr and "the process's file-size limit (ulimit -f) is 1.0 GiB" in res.stderr
    res = run("--layout", "dense")
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr[-3000:]
    assert "needs at least 6.0 GiB (100,000,000 rows x 16 dense columns)" in res.stderr, res.stderr
    assert list(out.iterdir()) == []


def test_issue_python_api_names_the_overwrite_keyword(tmp_path, cifar_rows):
    """The Python error named the CLI flag --overwrite (issue 27); the CLI still does."""
    from rfsgen import OutputExistsError, transform_file
    from rfsgen.features import save

    save(sample(load_skeleton(skeleton_path("cifar-deep")), 20, seed=1), tmp_path / "f.h5")
    np.save(tmp_path / "rows.npy", cifar_rows[:3])
    (tmp_path / "o.h5").write_bytes(b"keep")
    with pytest.raises(OutputExistsError) as info:
        transform_file(tmp_path / "f.h5", tmp_path / "rows.npy", tmp_path / "o.h5")
    assert str(info.value) == f"{tmp_path / 'o.h5'}: already exists; pass overwrite=True to replace it"
    assert (tmp_path / "o.h5").read_bytes() == b"keep"


def test_issue_swapped_arguments_in_python(tmp_path, cifar_rows):
    from rfsgen import FeatureFileError, transform_file
    from rfsgen.features import save

    save(sample(load_skeleton(skeleton_path("cifar-deep")), 20, seed=1), tmp_path / "f.h5")
    np.save(tmp_path / "rows.npy", cifar_rows[:3])
    with pytest.raises(FeatureFileError, match="the arguments look swapped"):
        transform_file(tmp_path / "rows.npy", tmp_path / "f.h5", tmp_path / "o.h5")
    assert not (tmp_path / "o.h5").exists()


def test_width_auto_feature_set_in_memory_names_where_its_width_came_from():
    fs = sample(load_skeleton(skeleton_path("tabular-auto")).bind(4), 16, seed=0)
    with pytest.raises(Exception, match=r"^<array>: rows have 3 values but the width 4 comes from the feature set, "
                                        r"not from skeleton .*tabular-auto.yaml' \(it says 'width: auto'\)"):
        transform(fs, np.ones((2, 3)))


def test_rows_that_float32_would_flush_to_zero_are_an_error(tmp_path):
    """A brownian node over 200 columns has features near 1e-70: float32 wrote an all-zero
    matrix, exit 0 (issue 37, item 3, for compositional paths). Now a one-line error naming
    the row; float64 keeps them; rows that are zero in float64 too (on the domain's lower
    face) are no error."""
    skel = parse_skeleton("rfsgen: 1\ninput: {width: 200}\nnodes:\n"
                          "  - {name: b, base: brownian, domain: [0, 1], columns: '0:200'}\n"
                          "  - {name: out, activation: identity, inputs: [b]}\n", "b.yaml")
    fs = sample(skel, 32, seed=1)
    x = np.random.default_rng(0).uniform(0.2, 0.8, (5, 200))
    wide = transform(fs, x, layout="dense", dtype="float64")
    assert np.all(np.abs(wide).max(axis=1) > 0) and np.abs(wide).max() < np.finfo(np.float32).tiny
    with pytest.raises(DataError, match=r"row 0: its largest feature is .* below float32's smallest normal"):
        transform(fs, x, layout="dense")
    save(fs, tmp_path / "f.h5")
    np.save(tmp_path / "x.npy", x)
    res = CliRunner().invoke(main, ["transform", str(tmp_path / "f.h5"), str(tmp_path / "x.npy"), "-o",
                                    str(tmp_path / "o.h5")])
    assert res.exit_code == 1 and "--dtype float64" in res.output and res.output.count("\n") == 1, res.output
    assert not (tmp_path / "o.h5").exists()
    edge = np.vstack([x[:2], np.zeros((2, 200))])  # on the domain's lower face: zero in float64 too
    with pytest.raises(DataError, match=r"row 0: "):
        transform(fs, edge, layout="dense")
    z = transform(fs, edge[2:], layout="dense")
    assert z.shape == (2, fs.columns) and not z.any()

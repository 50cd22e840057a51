"""Data-dependent selection (rfsgen.select, `rfsgen select`, DESIGN 9): EERF against a
brute-force scoring, LKRF against a generic convex solver, streaming invariance, the selected
file as an ordinary feature file, bad inputs as one line."""

import json
import re
import subprocess
import sys
from pathlib import Path

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rfsgen
from conftest import ROOT, rows_for, skeleton_path
from rfsgen import DataError, FeatureFileError, InputError, UsageError
from rfsgen.cli import main
from rfsgen.features import load, save
from rfsgen.select import (_unit, chi2_divergence, encode_labels, lkrf_weights, pool_statistics, read_labels, scores,
                           select, subset)

GAUSS = """rfsgen: 1
input: {width: 5}
nodes:
  - {name: x, base: gaussian, scale: 0.5}
"""


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def gauss():
    """A single gaussian node, 300 rows whose class depends on x0 and x1, a pool of 120 columns."""
    skel = rfsgen.parse_skeleton(GAUSS, "gauss.yaml")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 5))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 0] > 1)
    return skel, x, y, rfsgen.sample(skel, 120, seed=1)


@pytest.fixture(scope="module")
def deep(cifar_rows):
    """cifar-deep (compositional): a pool of 200 columns, 64 real CIFAR rows, 3 classes."""
    fs = rfsgen.sample(rfsgen.load_skeleton(skeleton_path("cifar-deep")), 200, seed=2)
    y = np.arange(64) % 3
    return cifar_rows, y, fs


def brute_force(fs, x, y, task="classification"):
    """EERF's score as DESIGN 9 writes it: sum_c (mean_i Y_ic z_m(x_i))^2, Y centred one-hot."""
    z = rfsgen.transform(_unit(fs), x, layout="dense", dtype="float64")
    if task == "classification":
        Y = (y[:, None] == np.unique(y)[None, :]).astype(float)
    else:
        Y = y[:, None].astype(float)
    Y = Y - Y.mean(axis=0)
    return ((Y.T @ z / len(y)) ** 2).sum(axis=0), z


# ----------------------------------------------------------------------------- EERF
@pytest.mark.parametrize("which", ["gauss", "deep"])
def test_eerf_is_the_brute_force_top_d(which, gauss, deep):
    if which == "gauss":
        _, x, y, fs = gauss
    else:
        x, y, fs = deep
    v, z = brute_force(fs, x, y)
    codes = encode_labels(y)[2]
    got = scores(pool_statistics(fs, x, "classification", codes, np.unique(y).size), "eerf")
    np.testing.assert_allclose(got, v, rtol=1e-9, atol=1e-15)
    D = 30
    sel = select(fs, x, y, D, method="eerf")
    want = np.sort(np.argsort(-v, kind="stable")[:D])
    # The kept columns are the top D (a tie at the boundary within rounding may swap one).
    kept = _kept_columns(fs, sel)
    assert len(set(kept) ^ set(want)) <= 2 and np.sort(v)[::-1][D - 1] <= v[kept].min() + 1e-12
    # Same values: the kept columns of the pool, at weight count / (sum of kept counts).
    zs = rfsgen.transform(sel, x, layout="dense", dtype="float64")
    np.testing.assert_allclose(zs, z[:, kept] * np.sqrt(fs.count[kept] / fs.count[kept].sum()), rtol=1e-10, atol=1e-12)
    assert sel.draws == fs.count[kept].sum() and sel.column_weight is None
    rec = sel.stats["selection"]
    assert rec["method"] == "eerf" and rec["pool_columns"] == fs.columns and rec["columns"] == D


def _kept_columns(pool, sel):
    """Which pool columns ``sel`` holds (its record; the tests check their values too)."""
    kept = np.array(sel.stats["selection"]["kept"], dtype=np.int64)
    assert kept.size == sel.columns and np.all(np.diff(kept) > 0) and kept.max() < pool.columns
    return kept


def test_regression_labels_score_against_the_centred_label(gauss):
    _, x, _, fs = gauss
    y = x[:, 0] * 0.7 + np.sin(x[:, 2])
    v, _ = brute_force(fs, x, y, "regression")
    st_ = pool_statistics(fs, x, "regression", y, 1)
    np.testing.assert_allclose(scores(st_, "eerf"), v, rtol=1e-9, atol=1e-15)
    sel = select(fs, x, y, 10, method="corr")
    assert sel.stats["selection"]["task"] == "regression"
    # corr for regression is the squared correlation of z_m with y.
    z = rfsgen.transform(_unit(fs), x, layout="dense", dtype="float64")
    r2 = np.array([np.corrcoef(z[:, j], y)[0, 1] ** 2 for j in range(fs.columns)])
    np.testing.assert_allclose(scores(st_, "corr"), r2, rtol=1e-8, atol=1e-12)


def test_corr_is_the_correlation_ratio(gauss):
    _, x, y, fs = gauss
    z = rfsgen.transform(_unit(fs), x, layout="dense", dtype="float64")
    eta2 = np.array([sum((y == c).mean() * (z[y == c, j].mean() - z[:, j].mean()) ** 2 for c in np.unique(y))
                     / z[:, j].var() for j in range(fs.columns)])
    got = scores(pool_statistics(fs, x, "classification", y, 3), "corr")
    np.testing.assert_allclose(got, eta2, rtol=1e-8, atol=1e-12)
    assert got.max() <= 1.0 and got.min() >= 0.0


# ----------------------------------------------------------------------------- LKRF
def _scipy_lkrf(v, p, rho):
    from scipy.optimize import minimize

    cons = [{"type": "eq", "fun": lambda q: q.sum() - 1.0, "jac": lambda q: np.ones_like(q)},
            {"type": "ineq", "fun": lambda q: rho - (np.sum(q * q / p) - 1.0), "jac": lambda q: -2 * q / p}]
    res = minimize(lambda q: -q @ v, p.copy(), jac=lambda q: -v, bounds=[(0, 1)] * v.size, constraints=cons,
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000})
    return res.x


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(2, 12), seed=st.integers(0, 2**31), rho=st.sampled_from([0.0, 0.01, 0.3, 1.0, 3.0, 9.0, 50.0]),
       uniform=st.booleans())
def test_lkrf_weights_match_a_generic_convex_solver(n, seed, rho, uniform):
    rng = np.random.default_rng(seed)
    v = rng.exponential(size=n) ** 2
    p = np.full(n, 1.0 / n) if uniform else rng.dirichlet(np.ones(n))
    q = lkrf_weights(v, p, rho)
    assert q.min() >= 0 and abs(q.sum() - 1) < 1e-12
    div = chi2_divergence(q, p)
    assert div <= rho + 1e-9 * max(1.0, rho)  # the divergence bound
    ref = _scipy_lkrf(v, p, rho)
    assert q @ v >= ref @ v - 1e-7 * max(1.0, abs(ref @ v))  # at least as good as the generic solver
    np.testing.assert_allclose(q, ref, atol=2e-4)  # and the same maximiser (strictly concave problem)
    vertex = (v == v.max()) * p / p[v == v.max()].sum()
    if chi2_divergence(vertex, p) > rho:
        assert abs(div - rho) <= 1e-9 * max(1.0, rho)  # the bound is active


def test_lkrf_selected_file_carries_float_weights(gauss, tmp_path):
    _, x, y, fs = gauss
    sel = select(fs, x, y, 12, method="lkrf", rho=3.0)
    rec = sel.stats["selection"]
    assert rec["rho"] == 3.0 and rec["divergence"] <= 3.0 + 1e-9
    v = scores(pool_statistics(fs, x, "classification", encode_labels(y)[2], 3), "eerf")
    q = lkrf_weights(v, fs.weight, 3.0)
    kept = _kept_columns(fs, sel)
    np.testing.assert_allclose(sel.column_weight, q[kept] / q[kept].sum(), rtol=1e-12)
    assert set(kept) == set(np.argsort(-q, kind="stable")[:12])
    save(sel, tmp_path / "l.h5")
    back = load(tmp_path / "l.h5")
    assert np.array_equal(back.column_weight, sel.column_weight)
    # The inner product of the kept features estimates sum_m q_m z_m(x) z_m(x') over the kept columns.
    z = rfsgen.transform(_unit(fs), x[:5], layout="dense", dtype="float64")[:, kept]
    zs = rfsgen.transform(back, x[:5], layout="dense", dtype="float64")
    np.testing.assert_allclose(zs @ zs.T, (z * sel.column_weight) @ z.T, rtol=1e-10)
    assert rfsgen.select(fs, x, y, 12, method="lkrf").stats["selection"]["rho"] == fs.columns / 12 - 1


# ----------------------------------------------------------------------------- streaming and reproducibility
def test_one_chunk_or_many_give_the_same_bits(deep, tmp_path):
    x, y, fs = deep
    x = np.concatenate([x] * 9)  # 576 rows: several blocks of 256
    y = np.arange(576) % 3
    files = []
    for k, chunk in enumerate([None, 1, 256, 300, 10**6]):
        sel = select(fs, x, y, 40, method="lkrf", chunk_rows=chunk)
        files.append(tmp_path / f"{k}.h5")
        sel.tool_version = sel.command = "x"
        save(sel, files[-1])
    assert all(f.read_bytes() == files[0].read_bytes() for f in files)
    a = pool_statistics(fs, x, "classification", y, 3, chunk_rows=256)
    b = pool_statistics(fs, x, "classification", y, 3, chunk_rows=512)
    assert a.by_class.tobytes() == b.by_class.tobytes() and a.squares.tobytes() == b.squares.tobytes()


def test_streamed_from_a_file_with_a_label_column(gauss, tmp_path):
    _, x, y, fs = gauss
    np.save(tmp_path / "xy.npy", np.column_stack([x[:, :2], y, x[:, 2:]]))
    a = select(fs, x, y, 10, method="corr")
    b = select(fs, tmp_path / "xy.npy", None, 10, method="corr", label_column=2)
    assert _kept_columns(fs, a).tolist() == _kept_columns(fs, b).tolist()


def test_a_skeleton_pool_is_reproducible_from_the_seed(gauss, tmp_path):
    skel, x, y, _ = gauss
    paths = []
    for k, seed in enumerate([5, 5, 6]):
        sel = select(skel, x, y, 8, method="eerf", seed=seed, pool_factor=10)
        assert sel.stats["selection"]["pool_columns"] == 80 and sel.seed == seed
        paths.append(tmp_path / f"{k}.h5")
        save(sel, paths[-1])
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()


# ----------------------------------------------------------------------------- the selected file is ordinary
def test_selected_file_transforms_shards_merges_and_runs_under_dask(deep, tmp_path):
    x, y, fs = deep
    sel = select(fs, x, y, 48, method="lkrf")
    save(sel, tmp_path / "sel.h5")
    np.save(tmp_path / "x.npy", x)
    want = rfsgen.transform(sel, x, layout="dense")
    for k in range(2):
        assert run(["transform", tmp_path / "sel.h5", tmp_path / "x.npy", "-o", tmp_path / f"p{k}.h5",
                    "--shard", f"{k}/2", "--layout", "dense", "-q"]).exit_code == 0
    assert run(["merge", tmp_path / "p0.h5", tmp_path / "p1.h5", "-o", tmp_path / "m.h5", "-q"]).exit_code == 0
    import h5py

    with h5py.File(tmp_path / "m.h5", "r") as f:
        assert f["X"][()].tobytes() == want.tobytes()
    da = pytest.importorskip("dask.array")
    import rfsgen.dask as rd

    got = rd.transform(load(tmp_path / "sel.h5"), da.from_array(x, chunks=(20, x.shape[1]))).compute(scheduler="sync")
    assert got.tobytes() == want.tobytes()


def test_mnist_conv_pool_and_an_eof_pool(tmp_path):
    skel = rfsgen.load_skeleton(skeleton_path("mnist-conv"))
    x = rows_for(skel, 40, seed=1)
    y = np.arange(40) % 2
    sel = select(skel, x, y, 6, method="corr", pool_factor=5, seed=3)
    assert sel.columns == 6 and np.isfinite(rfsgen.transform(sel, x, layout="dense")).all()
    eof_skel = rfsgen.parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: x, base: laplace, scale: 1.0, "
                                     "domain: [-3, 3]}\n", "lap.yaml")
    from rfsgen import eof

    pool = eof.sample(eof_skel, columns=40, seed=0)
    xe = np.random.default_rng(0).uniform(-2, 2, (50, 2))
    ye = (xe[:, 0] > 0).astype(int)
    sel = select(pool, xe, ye, 10, method="eerf")
    save(sel, tmp_path / "e.h5")
    z_pool = rfsgen.transform(pool, xe, layout="dense", dtype="float64")
    z = rfsgen.transform(load(tmp_path / "e.h5"), xe, layout="dense", dtype="float64")
    v, _ = brute_force(pool, xe, ye)
    np.testing.assert_allclose(z, z_pool[:, np.sort(np.argsort(-v, kind="stable")[:10])], rtol=1e-12)
    # LKRF over an EOF pool: float weights of mean 1 (an unweighted EOF column counts 1), and
    # each kept column is sqrt(weight) times the pool's column, through save/load.
    lk = select(pool, xe, ye, 10, method="lkrf")
    w = lk.column_weight
    assert w is not None and w.shape == (10,) and abs(w.mean() - 1.0) < 1e-12 and (w >= 0).all()
    save(lk, tmp_path / "l.h5")
    back = load(tmp_path / "l.h5")
    np.testing.assert_array_equal(back.column_weight, w)
    kept = lk.stats["selection"]["kept"]
    z = rfsgen.transform(back, xe, layout="dense", dtype="float64")
    np.testing.assert_allclose(z, z_pool[:, kept] * np.sqrt(w), rtol=1e-12, atol=0)
    # a weighted EOF pool is scored by its features, not its weights (LKRF takes them as its prior p)
    again = select(lk, xe, ye, 5, method="eerf")
    direct = select(dataclasses.replace(lk, column_weight=None), xe, ye, 5, method="eerf")
    assert again.stats["selection"]["kept"] == direct.stats["selection"]["kept"]


def test_subset_renumbers_continuous_omegas(gauss):
    _, x, _, fs = gauss
    keep = np.array([3, 7, 50, 119])
    sub = subset(fs, keep)
    z = rfsgen.transform(_unit(fs), x[:4], layout="dense", dtype="float64")
    zs = rfsgen.transform(_unit(sub), x[:4], layout="dense", dtype="float64")
    assert np.array_equal(zs, z[:, keep]) and sub.omega.size == 4 * 5


# ----------------------------------------------------------------------------- bad inputs
@pytest.fixture(scope="module")
def files(tmp_path_factory, gauss):
    skel, x, y, fs = gauss
    d = tmp_path_factory.mktemp("sel")
    (d / "gauss.yaml").write_text(GAUSS)
    save(fs, d / "pool.h5")
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", y)
    np.save(d / "wide.npy", np.column_stack([x, x[:, 0]]))
    return d


def _one_line_error(res, code, *parts):
    assert res.exit_code == code, res.output
    line = res.output.strip()
    assert "\n" not in line and line.startswith("rfsgen: error: ") and "Traceback" not in line, res.output
    for p in parts:
        assert p in line, line


@pytest.mark.parametrize("labels, code, parts", [
    (lambda y: y[:-1], 2, ["299 labels for 300 rows"]),
    (lambda y: np.concatenate([y, y]), 2, ["600 labels for 300 rows"]),
    (lambda y: np.where(np.arange(y.size) == 7, np.nan, y.astype(float)), 1, ["label 7 is nan"]),
    (lambda y: np.zeros_like(y), 1, ["every label is class 0", "at least two classes"]),
    (lambda y: np.full(y.size, "cat"), 1, ["every label is class 'cat'"]),
    (lambda y: y.reshape(-1, 2), 2, ["shape (150, 2)"]),
])
def test_bad_labels_are_one_line(files, tmp_path, labels, code, parts):
    y = np.load(files / "y.npy")
    np.save(tmp_path / "bad.npy", labels(y))
    _one_line_error(run(["select", files / "pool.h5", files / "x.npy", tmp_path / "bad.npy", "-n", 5, "-o",
                         tmp_path / "o.h5"]), code, *parts)
    assert not (tmp_path / "o.h5").exists()


def test_bad_pools_rows_and_sizes_are_one_line(files, tmp_path):
    base = [files / "x.npy", files / "y.npy"]
    out = ["-o", tmp_path / "o.h5"]
    _one_line_error(run(["select", files / "pool.h5", *base, "-n", 121, *out]), 2,
                    "the pool has 120 columns, fewer than the 121 to keep", "1210 columns")
    _one_line_error(run(["select", files / "x.npy", *base, "-n", 5, *out]), 2, "not a feature file", "-n 50")
    _one_line_error(run(["select", files / "y.npy", files / "pool.h5", files / "y.npy", "-n", 5, *out]), 2,
                    "not a feature file")
    _one_line_error(run(["select", files / "pool.h5", files / "wide.npy", files / "y.npy", "-n", 5, *out]), 2,
                    "rows have 6 values", "width 5")
    _one_line_error(run(["select", files / "pool.h5", *base, "-n", 5, "--rho", 2, *out]), 2, "lkrf")
    _one_line_error(run(["select", files / "pool.h5", *base, "-n", 0, *out]), 2, "positive")
    _one_line_error(run(["select", files / "pool.h5", files / "x.npy", "-n", 5, *out]), 2, "labels")
    _one_line_error(run(["select", files / "pool.h5", *base, "-n", 5, "--method", "lkrf", "--rho", -1, *out]), 2,
                    "rho")
    _one_line_error(run(["select", files / "pool.h5", files / "x.npy", tmp_path / "none.npy", "-n", 5, *out]), 2,
                    "no such labels file")
    _one_line_error(run(["select", files / "pool.h5", files / "x.npy", "-n", 5, "--label-column", 9, *out]), 2,
                    "--label-column 9")
    (tmp_path / "o.h5").write_bytes(b"x")
    _one_line_error(run(["select", files / "pool.h5", *base, "-n", 5, *out]), 2, "already exists", "--overwrite")


@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(0, 600), nan_at=st.one_of(st.none(), st.integers(0, 599)), classes=st.integers(1, 4),
       strings=st.booleans())
def test_generated_labels_select_or_fail_in_one_line(files, tmp_path_factory, n, nan_at, classes, strings):
    d = tmp_path_factory.mktemp("gen")
    y = np.arange(n) % classes
    if strings:
        y = np.array([f"c{v}" for v in y], dtype=str)
        (d / "y.txt").write_text("".join(f"{v}\n" for v in y))
        if nan_at is not None and nan_at < n:  # a missing label: an empty line is skipped, so one label short
            lines = (d / "y.txt").read_text().splitlines()
            lines[nan_at] = ""
            (d / "y.txt").write_text("\n".join(lines) + "\n")
        labels = d / "y.txt"
    else:
        y = y.astype(float)
        if nan_at is not None and nan_at < n:
            y[nan_at] = np.nan
        np.save(d / "y.npy", y)
        labels = d / "y.npy"
    res = run(["select", files / "pool.h5", files / "x.npy", labels, "-n", 4, "-o", d / "o.h5", "-q"])
    missing = nan_at is not None and nan_at < n
    ok = n == 300 and classes >= 2 and not missing
    if ok:
        assert res.exit_code == 0, res.output
        assert load(d / "o.h5").columns == 4
    else:
        assert res.exit_code in (1, 2)
        _one_line_error(res, res.exit_code)
        assert not (d / "o.h5").exists()


def test_label_files_csv_strings_and_h5(tmp_path):
    (tmp_path / "a.csv").write_text("label\n1\n2\n2\n")
    assert read_labels(tmp_path / "a.csv").tolist() == [1, 2, 2]
    (tmp_path / "b.txt").write_text("cat\ndog\n\ncat\n")
    assert read_labels(tmp_path / "b.txt").tolist() == ["cat", "dog", "cat"]
    import h5py

    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["y"] = np.array([b"a", b"b"])
        f["g/z"] = np.array([1.5, 2.5])
    with pytest.raises(InputError, match="2 1-D datasets"):
        read_labels(tmp_path / "c.h5")
    assert read_labels(f"{tmp_path}/c.h5:/y").tolist() == ["a", "b"]
    assert read_labels(f"{tmp_path}/c.h5:g/z").tolist() == [1.5, 2.5]
    assert encode_labels(np.array([0.5, 1.5]))[0] == "regression"
    assert encode_labels(np.array([0.0, 1.0]))[0] == "classification"
    with pytest.raises(DataError, match="label 1 is inf"):
        encode_labels(np.array([0.0, np.inf]))
    (tmp_path / "d.csv").write_text("1,2\n")
    with pytest.raises(InputError, match="--label-column"):
        read_labels(tmp_path / "d.csv")


def test_cli_select_and_inspect(files, tmp_path):
    res = run(["select", files / "pool.h5", files / "x.npy", files / "y.npy", "-n", 7, "--method", "lkrf", "-o",
               tmp_path / "l.h5"])
    assert res.exit_code == 0 and "kept 7 of 120 columns" in res.output
    info = json.loads(run(["inspect", "--json", tmp_path / "l.h5"]).output)
    assert info["columns"] == 7 and info["column_weights"] == "float"
    assert run(["inspect", tmp_path / "l.h5"]).output.count("float column weights") == 1
    res = run(["select", files / "gauss.yaml", files / "x.npy", files / "y.npy", "-n", 7, "--method", "corr",
               "--pool-factor", 3, "--seed", 4, "-o", tmp_path / "c.h5", "-q"])
    assert res.exit_code == 0 and res.output == ""
    sel = load(tmp_path / "c.h5").stats["selection"]
    assert sel["pool_columns"] == 21 and sel["pool_factor"] == 3 and sel["labels_file"].endswith("y.npy")


# ----------------------------------------------------------------------------- docs/selection.md runs
DOC = ROOT / "docs" / "selection.md"


def test_the_selection_page_runs_in_sequence(tmp_path, cifar_rows):
    """docs/selection.md's blocks, in order, in a stand-in for the repository root after
    ``make demo`` (tests/test_readme.py's): the page's first block activates and copies the
    demo's rows, as every docs page's does."""
    from test_readme import _post_demo

    blocks = re.findall(r"^```(\w+)\n(.*?)^```", DOC.read_text(), re.S | re.M)
    runnable = [(lang, body) for lang, body in blocks if lang in ("sh", "python")]
    assert len(runnable) >= 3
    _post_demo(tmp_path)
    env = dict(__import__("os").environ, PATH=f"{Path(sys.executable).parent}:{__import__('os').environ['PATH']}")
    for lang, body in runnable:
        cmd = [sys.executable, "-c", body] if lang == "python" else ["bash", "-euo", "pipefail", "-c", body]
        res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"{body}\n--- stderr:\n{res.stderr[-3000:]}"


# ----------------------------------------------------------------------------- scikit-learn
def test_skeleton_features_select_uses_y(gauss):
    pytest.importorskip("sklearn")
    from sklearn.base import clone

    from rfsgen.sklearn import SkeletonFeatures

    skel, x, y, _ = gauss
    est = SkeletonFeatures(GAUSS, n_components=9, random_state=4, select="lkrf", pool_factor=5, dtype="float64")
    z = est.fit_transform(x, y)
    pool = rfsgen.sample(skel, 45, seed=4)
    want = select(pool, x, y, 9, method="lkrf")
    assert z.shape == (300, 9) and np.array_equal(est.features_.column_weight, want.column_weight)
    assert np.array_equal(z, rfsgen.transform(want, x, layout="dense", dtype="float64"))
    assert np.array_equal(clone(est).fit(x, y).transform(x), z)
    with pytest.raises(ValueError, match="needs y"):
        clone(est).fit(x)
    with pytest.raises(ValueError, match="select must be"):
        SkeletonFeatures(GAUSS, select="best").fit(x, y)
    assert SkeletonFeatures(GAUSS, select="corr").__sklearn_tags__().target_tags.required
    assert not SkeletonFeatures(GAUSS).__sklearn_tags__().target_tags.required


# ----------------------------------------------------------------------------- issue 37, item 8
def test_issue_labels_with_a_byte_order_mark(files, tmp_path):
    """Class names in a UTF-8 file with a BOM gave 3 classes ('\\ufeffa' apart from 'a')."""
    y = np.load(files / "y.npy") % 2
    names = np.where(y == 0, "a", "b")
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + "".join(f"{v}\n" for v in names).encode())
    (tmp_path / "plain.txt").write_text("".join(f"{v}\n" for v in names))
    got = read_labels(tmp_path / "bom.txt")
    assert got.tolist() == names.tolist()
    res = run(["select", files / "pool.h5", files / "x.npy", tmp_path / "bom.txt", "-n", 4, "-o", tmp_path / "a.h5"])
    assert res.exit_code == 0, res.output
    assert load(tmp_path / "a.h5").stats["selection"]["classes"] == 2
    assert run(["select", files / "pool.h5", files / "x.npy", tmp_path / "plain.txt", "-n", 4, "-o",
                tmp_path / "b.h5"]).exit_code == 0
    assert load(tmp_path / "a.h5").stats["selection"]["kept"] == load(tmp_path / "b.h5").stats["selection"]["kept"]
    (tmp_path / "bomnum.csv").write_bytes(b"\xef\xbb\xbf1\n2\n")  # a BOM before a number: still a number
    assert read_labels(tmp_path / "bomnum.csv").tolist() == [1, 2]


def test_issue_integer_labels_are_read_exactly(files, tmp_path):
    """9007199254740992 and 9007199254740993 were one class (read through float)."""
    y = np.load(files / "y.npy") % 2
    big = np.where(y == 0, 9007199254740992, 9007199254740993)
    (tmp_path / "big.txt").write_text("".join(f"{v}\n" for v in big))
    got = read_labels(tmp_path / "big.txt")
    assert got.dtype == np.int64 and got.tolist() == big.tolist()
    res = run(["select", files / "pool.h5", files / "x.npy", tmp_path / "big.txt", "-n", 4, "-o", tmp_path / "a.h5"])
    assert res.exit_code == 0, res.output
    assert load(tmp_path / "a.h5").stats["selection"]["classes"] == 2
    # past 64 bits (fuzz labels-s38-49: 2^64 and 2^64 + 1 were refused): still exact, two classes
    huge = np.array([2**64 if v == 0 else 2**64 + 1 for v in y], dtype=object)
    (tmp_path / "huge.txt").write_text("".join(f"{v}\n" for v in huge))
    got = read_labels(tmp_path / "huge.txt")
    assert got.tolist() == huge.tolist() and encode_labels(got)[1].tolist() == [2**64, 2**64 + 1]
    res = run(["select", files / "pool.h5", files / "x.npy", tmp_path / "huge.txt", "-n", 4, "-o", tmp_path / "h.h5"])
    assert res.exit_code == 0, res.output
    assert load(tmp_path / "h.h5").stats["selection"]["classes"] == 2
    (tmp_path / "one.txt").write_text(f"{2**70}\n{2**70}\n")
    with pytest.raises(DataError, match=f"every label is class {2**70}: selection needs at least two classes"):
        encode_labels(read_labels(tmp_path / "one.txt"))
    (tmp_path / "far.txt").write_text(f"{2**70}\n1\n")  # regression reads them as floats
    assert encode_labels(read_labels(tmp_path / "far.txt"), "regression")[2].tolist() == [2.0**70, 1.0]
    # the same labels as a column of the rows, which are read as floats: refused, not merged
    np.save(tmp_path / "wide.npy", np.column_stack([np.load(files / "x.npy"), big.astype(np.float64)]))
    res = run(["select", files / "pool.h5", tmp_path / "wide.npy", "--label-column", 5, "-n", 4, "-o",
               tmp_path / "c.h5"])
    _one_line_error(res, 2, "row 0: the label 9007199254740992 in column 5 is too large to be read exactly")
    assert not (tmp_path / "c.h5").exists()


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=30), bom=st.booleans(),
       header=st.booleans(), crlf=st.booleans())
def test_generated_integer_label_files_read_exactly(tmp_path_factory, values, bom, header, crlf):
    d = tmp_path_factory.mktemp("ints")
    end = "\r\n" if crlf else "\n"
    text = ("label" + end if header else "") + "".join(f"{v}{end}" for v in values)
    (d / "y.txt").write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    got = read_labels(d / "y.txt")
    assert got.dtype == np.int64 and got.tolist() == values
    if len(set(values)) >= 2:
        task, classes, codes = encode_labels(got)
        assert task == "classification" and classes.size == len(set(values))


@pytest.mark.parametrize("rho", [5e-324, 1e-310, 1e-300, 1e-200])
def test_issue_lkrf_tiny_rho_is_finite_without_warnings(files, tmp_path, rho):
    """--rho 5e-324 recorded divergence NaN with a RuntimeWarning (var / rho overflowed):
    the closed form in a form that cannot overflow; q is the pool's weights to rounding."""
    import warnings

    out = tmp_path / "l.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = run(["select", files / "pool.h5", files / "x.npy", files / "y.npy", "-n", 6, "--method", "lkrf",
                   "--rho", repr(rho), "-o", out])
    assert res.exit_code == 0, res.output
    rec = load(out).stats["selection"]
    assert np.isfinite(rec["divergence"]) and abs(rec["divergence"]) < 1e-12
    assert np.all(np.isfinite(load(out).column_weight))


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(2, 30), seed=st.integers(0, 2**31), exponent=st.integers(-323, 2))
def test_generated_lkrf_weights_finite_for_any_rho(n, seed, exponent):
    import warnings

    rng = np.random.default_rng(seed)
    v = rng.exponential(size=n) ** 2 * 10.0 ** rng.integers(-30, 30)
    p = rng.dirichlet(np.ones(n))
    rho = 10.0 ** exponent if exponent > -323 else 5e-324
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = lkrf_weights(v, p, rho)
        div = chi2_divergence(q, p)
    assert np.all(np.isfinite(q)) and q.min() >= 0 and abs(q.sum() - 1) < 1e-12
    assert np.isfinite(div) and div <= rho + 1e-9 * max(1.0, rho)


@pytest.mark.parametrize("kind", ["self", "loop", "dangling", "external"])
def test_issue_h5_labels_behind_bad_links_are_one_line(files, tmp_path, kind):
    """y.h5:/y a soft link to itself gave 'RuntimeError: Special link traversal failed'."""
    import h5py

    p = tmp_path / "y.h5"
    with h5py.File(p, "w") as f:
        if kind == "self":
            f["y"] = h5py.SoftLink("/y")
        elif kind == "loop":
            f["y"] = h5py.SoftLink("/z")
            f["z"] = h5py.SoftLink("/y")
        elif kind == "dangling":
            f["y"] = h5py.SoftLink("/nowhere")
        else:
            f["y"] = h5py.ExternalLink("missing.h5", "/y")
    res = run(["select", files / "pool.h5", files / "x.npy", f"{p}:/y", "-n", 4, "-o", tmp_path / "o.h5"])
    want = {"self": "soft links nest", "loop": "soft links nest", "dangling": "no dataset '/y'",
            "external": "external link"}[kind]
    _one_line_error(res, 2, "y.h5", want)
    assert not (tmp_path / "o.h5").exists()


def test_class_names_counted_at_the_longest_width(tmp_path):
    """numpy stores every name at the longest one's width: 20,000 short names and one of
    200,000 characters would take 16 GB; refused before the array is made."""
    from rfsgen import budget
    from rfsgen.errors import LimitError

    (tmp_path / "y.txt").write_text("a\n" * 20_000 + "b" * 200_000 + "\n")
    with budget.limited("64M"), pytest.raises(LimitError, match=r"20001 class names of up to 200000 characters"):
        read_labels(tmp_path / "y.txt")
    (tmp_path / "y.txt").write_text("a\n" * 20_000 + "bb\n")
    with budget.limited("64M"):
        assert read_labels(tmp_path / "y.txt").size == 20_001


# ----------------------------------------------------------------------------- greedy
def _forward_selection(z, Y, k, ridge):
    """Forward selection written out: standardise, and at each step project every other
    column off the kept ones (least squares) and keep the best damped residual score."""
    zs = (z - z.mean(axis=0)) / z.std(axis=0)
    Y = Y - Y.mean(axis=0)
    n = len(zs)
    chosen = []
    for _ in range(k):
        best = None
        for m in range(zs.shape[1]):
            if m in chosen:
                continue
            col = zs[:, m]
            if chosen:
                q = zs[:, chosen]
                col = col - q @ np.linalg.lstsq(q, col, rcond=None)[0]
            s = np.sum((Y.T @ col) ** 2) / (col @ col + ridge * n)
            if best is None or s > best[0] * (1 + 1e-9):
                best = (s, m)
        chosen.append(best[1])
    return chosen


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_greedy_is_forward_selection_written_out(gauss, task):
    from rfsgen.select import GREEDY_RIDGE

    _, x, y, fs = gauss
    if task == "regression":
        y = x[:, 0] * 0.7 + np.sin(x[:, 2])
    z = rfsgen.transform(_unit(fs), x, layout="dense", dtype="float64")
    Y = (y[:, None] == np.unique(y)[None, :]).astype(float) if task == "classification" else y[:, None]
    want = _forward_selection(z, Y, 15, GREEDY_RIDGE)
    sel = select(fs, x, y, 15, method="greedy", task=task)
    rec = sel.stats["selection"]
    assert rec["order"] == want and rec["kept"] == sorted(want) and rec["ridge"] == GREEDY_RIDGE
    assert _kept_columns(fs, sel).tolist() == sorted(want)
    assert sel.column_weight is None and np.array_equal(sel.count, fs.count[sorted(want)])


def test_greedy_skips_a_redundant_column(gauss):
    """Columns 0 and 1 are the same feature z_a, column 2 is z_b; the label is z_a + 0.6 z_b.
    Alone, each copy of z_a explains the label better than z_b (r^2 0.74 against 0.26), so
    corr keeps both copies; after one copy is kept the other adds nothing (its residual is 0) and
    greedy keeps z_b."""
    _, x, _, fs = gauss
    z = rfsgen.transform(_unit(fs), x, layout="dense", dtype="float64")
    r = np.corrcoef(z.T)
    a, b = divmod(int(np.argmin(np.abs(r) + np.eye(fs.columns))), fs.columns)  # two nearly uncorrelated columns
    pool = subset(fs, np.array([a, a, b]))
    za, zb = (z[:, j] - z[:, j].mean() for j in (a, b))
    y = za / za.std() + 0.6 * zb / zb.std()
    assert _kept_columns(pool, select(pool, x, y, 2, method="corr", task="regression")).tolist() == [0, 1]
    g = select(pool, x, y, 2, method="greedy", task="regression")
    assert g.stats["selection"]["order"] == [0, 2]
    # A third column when only two are independent: the span is exhausted, the rest by corr.
    assert select(pool, x, y, 3, method="greedy", task="regression").stats["selection"]["order"] == [0, 2, 1]


def test_greedy_same_bytes_whatever_the_chunks_and_threads(deep, tmp_path):
    x, y, fs = deep
    x = np.concatenate([x] * 9)  # 576 rows: several blocks of 256
    y = np.arange(576) % 3
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    save(fs, tmp_path / "pool.h5")
    from rfsgen._threads import most

    files = []
    two = min(2, most())  # 1 where NUMBA_NUM_THREADS=1
    for k, (chunk, threads) in enumerate([(None, 1), (1, two), (300, 1), (10**6, two)]):
        files.append(tmp_path / f"{k}.h5")
        res = run(["select", tmp_path / "pool.h5", tmp_path / "x.npy", tmp_path / "y.npy", "-n", 40, "--method",
                   "greedy", "--threads", threads, "-o", files[-1], "-q"] + (["--chunk-rows", chunk] if chunk else []))
        assert res.exit_code == 0, res.output
    assert all(f.read_bytes() == files[0].read_bytes() for f in files)
    a = select(fs, x, y, 40, method="greedy", chunk_rows=256)
    b = select(fs, x, y, 40, method="greedy", chunk_rows=512)
    a.tool_version = b.tool_version = a.command = b.command = "x"
    save(a, tmp_path / "a.h5")
    save(b, tmp_path / "b.h5")
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()


def test_greedy_gram_over_the_budget_is_one_line(gauss, tmp_path):
    from rfsgen import budget
    from rfsgen.errors import LimitError

    skel, x, y, _ = gauss
    pool = rfsgen.sample(skel, 3000, seed=1)  # the Gram: 3000^2 float64, twice = 144 MB
    with budget.limited("100M"), pytest.raises(LimitError, match=r"greedy selection's Gram matrix of a pool of 3000 "
                                                                   r"columns"):
        select(pool, x, y, 10, method="greedy")
    with budget.limited("100M"):  # the other methods fit
        assert select(pool, x, y, 10, method="corr").columns == 10
    # Room for the Gram matrix and a block but not a default chunk beside it: the chunk shrinks, same columns
    want = select(pool, x, y, 10, method="greedy").stats["selection"]["order"]
    with budget.limited("200M"):
        assert select(pool, x, y, 10, method="greedy").stats["selection"]["order"] == want
        with pytest.raises(LimitError, match=r"a chunk of 512 rows .* beside the Gram matrix"):
            select(pool, x, y, 10, method="greedy", chunk_rows=10**6)
    save(pool, tmp_path / "pool.h5")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    res = run(["select", tmp_path / "pool.h5", tmp_path / "x.npy", tmp_path / "y.npy", "-n", 10, "--method", "greedy",
               "--max-memory", "100M", "-o", tmp_path / "o.h5", "-q"])
    assert res.exit_code != 0
    line = res.output.strip()
    assert "\n" not in line and line.startswith("rfsgen: error: ") and "Gram matrix" in line, res.output
    assert not (tmp_path / "o.h5").exists()

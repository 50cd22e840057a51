"""Entropic optimal features (rfsgen.eof, DESIGN 9): the features against an oracle kernel
computed from the definitions with numpy.linalg, their support and sparsity, sampling,
the feature file, the transform and the CLI."""

import math

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from rfsgen import eof, parse_skeleton
from rfsgen.budget import limited
from rfsgen.cli import main
from rfsgen.errors import DataError, FeatureFileError, LimitError, UsageError
from rfsgen.features import load, save
from rfsgen.transform import transform


# ---------------------------------------------------------------------- the oracle (DESIGN 9)
def k1_direct(kernel, s, u, v):
    """The 1-D kernel from its definition: brownian min - uv; laplace pinned on B = {0, 1}
    by e(u, v) - e(u, B) E(B, B)^-1 e(B, v) through numpy.linalg."""
    u, v = np.asarray(u, float), np.asarray(v, float)
    if kernel == "brownian":
        return np.minimum.outer(u, v) - np.multiply.outer(u, v)

    def e(a, b):
        return np.exp(-s * np.abs(np.subtract.outer(a, b)))

    b = np.array([0.0, 1.0])
    return e(u, v) - e(u, b) @ np.linalg.solve(e(b, b), e(b, v))


def nystrom(kernel, s, level, u, v):
    """k1_l(u, v) = k1(u, G_l) K1(G_l, G_l)^-1 k1(G_l, v) on G_l = {i / 2^l : 0 < i < 2^l}; k1_0 = 0."""
    if level == 0:
        return np.zeros((len(u), len(v)))
    g = np.arange(1, 2**level) / 2**level
    return k1_direct(kernel, s, u, g) @ np.linalg.solve(k1_direct(kernel, s, g, g), k1_direct(kernel, s, g, v))


def oracle(kernel, s, levels, u, v):
    """sum over level vectors l of prod_j (k1_{l_j} - k1_{l_j - 1})(u_j, v_j)."""
    d = u.shape[1]
    top = int(levels.max())
    ny = [[nystrom(kernel, s[j], lv, u[:, j], v[:, j]) for lv in range(top + 1)] for j in range(d)]
    out = np.zeros((u.shape[0], v.shape[0]))
    for lv in levels:
        p = np.ones_like(out)
        for j in range(d):
            p *= ny[j][lv[j]] - ny[j][lv[j] - 1]
        out += p
    return out


def skeleton(kernel, d, domain=None, scale=1.3):
    dom = f", domain: {domain}" if domain is not None else ""
    sc = f", scale: {scale}" if kernel == "laplace" else ""
    return parse_skeleton(f"rfsgen: 1\ninput: {{width: {d + 1}}}\nnodes:\n"
                          f"  - {{name: x, base: {kernel}{sc}{dom}, columns: '1:{d + 1}'}}\n", f"{kernel}.yaml")


def box_rows(rng, d, lo, hi, m=9):
    """Rows in the box [lo, hi] (column 0 ignored by the node): random points, the faces,
    and points on cell edges of several levels."""
    u = rng.random((m, d))
    u[0] = 0.0  # a face
    u[1] = 1.0  # the other face
    u[2, 0] = 0.5  # a level-1 point: edge of level-2 cells
    u[3] = 0.25
    u[4, -1] = 0.375
    x = np.concatenate([rng.standard_normal((m, 1)), lo + u * (hi - lo)], axis=1)
    return x, u


def eof_set(kernel, d, level, full=False, domain=(-2.0, 3.0), scale=1.3):
    """An EOF feature set on the box ``domain`` with every feature of the sparse (or full) grid."""
    skel = skeleton(kernel, d, f"[{domain[0]}, {domain[1]}]", scale)
    fs = eof.sample(skel, level=level)
    if full:
        lev = eof.level_vectors(level, d, full=True)
        t, cells = eof.enumerate_features(lev)
        fs = eof.sample(skel, level=1)  # rebuilt below with the full grid's columns
        D = t.size
        fs.count, fs.draws = np.ones(D, np.int64), D
        fs.kind, fs.ptr = np.zeros(D, np.uint8), np.zeros(D + 1, np.int64)
        fs.eof = eof.Columns(dict(fs.eof.meta), lev[t], 2 * cells + 1)
    return fs


@pytest.mark.parametrize("kernel", eof.KERNELS)
@pytest.mark.parametrize("d, level", [(1, 5), (2, 4), (3, 3), (4, 3)])
@pytest.mark.parametrize("full", [False, True])
def test_gram_equals_the_oracle_kernel(kernel, d, level, full):
    """sum_a phi_a(x) phi_a(x') of the transform equals the oracle to 1e-12, faces and cell edges included."""
    if full and d == 4:
        level = 2
    fs = eof_set(kernel, d, level, full)
    rng = np.random.default_rng(d * 10 + level)
    lo, hi = -2.0, 3.0
    x, u = box_rows(rng, d, lo, hi)
    phi = transform(fs, x, layout="dense", dtype="float64")
    levels = np.unique(fs.eof.level, axis=0)
    s = np.full(d, 1.3 * (hi - lo))
    np.testing.assert_allclose(phi @ phi.T, oracle(kernel, s, levels, u, u), atol=1e-12, rtol=0)
    assert not phi[:2].any()  # rows on the faces: all zero
    if full:  # the full grid is the tensor Nystrom interpolant on G_level
        ny = np.ones((u.shape[0], u.shape[0]))
        for j in range(d):
            ny *= nystrom(kernel, s[j], level, u[:, j], u[:, j])
        np.testing.assert_allclose(phi @ phi.T, ny, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kernel", eof.KERNELS)
def test_converges_to_the_limit_kernel(kernel):
    """The level-n kernel's distance to the (pinned laplace or brownian) limit shrinks with n."""
    d = 2
    rng = np.random.default_rng(5)
    x, u = box_rows(rng, d, -2.0, 3.0, 12)
    s = np.full(d, 1.3 * 5.0)
    exact = eof.limit_kernel(kernel, s, u, u)
    np.testing.assert_allclose(exact, np.prod([k1_direct(kernel, s[j], u[:, j], u[:, j]) for j in range(d)], axis=0),
                               atol=1e-14)
    errs = []
    for n in (2, 4, 6, 8, 10):
        phi = transform(eof_set(kernel, d, n), x, layout="dense", dtype="float64")
        errs.append(np.abs(phi @ phi.T - exact).max())
    assert all(b < 0.6 * a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.05 * np.abs(exact).max()


@pytest.mark.parametrize("kernel", eof.KERNELS)
def test_support_and_one_nonzero_per_level_vector(kernel):
    d = 3
    fs = eof_set(kernel, d, 4)
    rng = np.random.default_rng(2)
    x, u = box_rows(rng, d, -2.0, 3.0, 200)
    phi = transform(fs, x, layout="dense", dtype="float64")
    lev, idx = fs.eof.level, fs.eof.index
    a = (idx - 1) / 2.0**lev  # support [a, b] per coordinate
    b = (idx + 1) / 2.0**lev
    inside = np.all((u[:, None, :] >= a[None]) & (u[:, None, :] <= b[None]), axis=2)
    assert not phi[~inside].any()
    levels, t = np.unique(lev, axis=0, return_inverse=True)
    per = np.zeros((u.shape[0], levels.shape[0]), int)
    for r in range(u.shape[0]):
        np.add.at(per[r], t.ravel()[phi[r] != 0], 1)
    assert per.max() == 1 and per[2:].sum() > 0
    assert (np.count_nonzero(phi, axis=1) <= levels.shape[0]).all()


def test_grid_sizes_match_the_seed():
    """561 level vectors and 2,177 features at d = 32, level 3 (the seed's Table 2)."""
    assert eof.grid_counts(3, 32) == (561, 2177)
    for n, d in [(1, 1), (4, 1), (3, 2), (3, 4), (2, 5)]:
        lev = eof.level_vectors(n, d)
        assert lev.shape == (eof.grid_counts(n, d)[0], d)
        assert int(np.sum(2 ** (lev.sum(axis=1) - d))) == eof.grid_counts(n, d)[1]
        assert (lev.sum(axis=1) <= n + d - 1).all() and (lev >= 1).all()
        assert np.unique(lev, axis=0).shape[0] == lev.shape[0]


def test_budget_d_takes_the_smallest_level_and_a_seeded_subset():
    skel = skeleton("brownian", 3)
    fs = eof.sample(skel, columns=20, seed=4)
    assert fs.columns == 20 and fs.eof.meta["level"] == eof.smallest_level(3, 20) == 3
    full = eof.sample(skel, level=3)
    key = {tuple(a) + tuple(b) for a, b in zip(full.eof.level.tolist(), full.eof.index.tolist())}
    assert {tuple(a) + tuple(b) for a, b in zip(fs.eof.level.tolist(), fs.eof.index.tolist())} <= key
    again = eof.sample(skel, columns=20, seed=4)
    assert np.array_equal(again.eof.index, fs.eof.index)
    assert not np.array_equal(eof.sample(skel, columns=20, seed=5).eof.index, fs.eof.index)
    assert eof.sample(skel, columns=eof.grid_counts(3, 3)[1]).columns == eof.grid_counts(3, 3)[1]


# ---------------------------------------------------------------------- files and transform
def test_file_round_trip_and_transform_bytes(tmp_path):
    fs = eof.sample(skeleton("laplace", 3, "[-2, [3, 4, 5]]"), columns=40, seed=1)
    p = tmp_path / "e.h5"
    save(fs, p)
    back = load(p)
    assert back.scheme == "eof" and back.eof.meta == fs.eof.meta
    assert np.array_equal(back.eof.level, fs.eof.level) and np.array_equal(back.eof.index, fs.eof.index)
    with h5py.File(p) as f:
        assert f.attrs["format_version"] == eof.FORMAT_VERSION
    x = box_rows(np.random.default_rng(0), 3, -2.0, 3.0, 50)[0]
    a = transform(back, x, layout="csr", chunk_rows=7)
    b = transform(fs, x, layout="csr", chunk_rows=50)
    assert (a != b).nnz == 0 and a.dtype == np.float32
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)


def forged(tmp_path, mutate):
    fs = eof.sample(skeleton("brownian", 2), level=3)
    mutate(fs.eof)
    p = tmp_path / "forged.h5"
    save(fs, p)
    return p


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c.index.__setitem__((0, 0), 2), "even"),
    (lambda c: c.index.__setitem__((0, 0), 1 << 20), "beyond its level"),
    (lambda c: c.level.__setitem__((0, 0), 7), "outside 1..3"),
    (lambda c: c.level.__setitem__((0, slice(None)), 3), "outside the sparse grid"),
    (lambda c: c.index.__setitem__(1, c.index[0]) or c.level.__setitem__(1, c.level[0]), "appears twice"),
    (lambda c: c.meta.__setitem__("level", 99), "outside 1.."),
    (lambda c: c.meta.__setitem__("lo", [0.0, 2.0]), "lo < hi"),
    (lambda c: c.meta.__setitem__("kernel", "laplace"), "another node or kernel"),
])
def test_forged_eof_datasets_are_refused(tmp_path, mutate, message):
    with pytest.raises(FeatureFileError, match=message):
        load(forged(tmp_path, mutate))


def test_forged_shapes_are_refused_before_reading(tmp_path):
    """A dataset of the wrong shape is refused from its metadata, before its values are read
    (here the file's checksum refuses it first; the dataset check is exercised directly)."""
    p = forged(tmp_path, lambda c: None)
    with h5py.File(p) as f:
        assert eof.read("forged.h5", f, 17)["eof_index"].shape == (17, 2)
    with h5py.File(p, "a") as f:
        del f["eof_index"]
        f.create_dataset("eof_index", data=np.ones((3, 2), np.uint8))
    with pytest.raises(FeatureFileError, match="checksum"):
        load(p)
    with h5py.File(p) as f:
        with pytest.raises(FeatureFileError, match=r"dataset 'eof_index' has shape \(3, 2\)"):
            eof.read("forged.h5", f, 17)


def test_rows_outside_the_box_are_clipped_and_counted():
    fs = eof.sample(skeleton("brownian", 2, "[0, 1]"), level=3)
    from rfsgen.transform import Transformer

    tr = Transformer(fs, np.float64)
    x = np.array([[0.0, 0.5, 0.5], [0.0, -3.0, 0.5], [0.0, 0.5, 7.0]])
    vals = tr.chunk(x)
    assert tr.clipped == 2
    assert not vals[1:].any()  # clipped onto a face: zero
    with pytest.raises(DataError, match="row 1, column 2: value is nan"):
        tr.chunk(np.array([[0.0, 0.5, 0.5], [0.0, 0.5, np.nan]]))
    # Infinity is not clipped, and a column the skeleton does not use is checked too, as in
    # every other transform (found by the fuzzer: a NaN in column 0 went through).
    with pytest.raises(DataError, match="row 0, column 1: value is inf"):
        tr.chunk(np.array([[0.0, np.inf, 0.5]]))
    with pytest.raises(DataError, match="row 1, column 0: value is nan"):
        tr.chunk(np.array([[0.0, 0.5, 0.5], [np.nan, 0.5, 0.5]]))


@settings(max_examples=25, derandomize=True, deadline=None)
@given(st.floats(-1e6, 1e6), st.floats(1e-3, 1e6), st.sampled_from(eof.KERNELS), st.integers(1, 3),
       st.floats(0.01, 50))
def test_any_box_and_scale_agrees_with_the_oracle(lo, width, kernel, d, scale):
    hi = lo + width
    if not hi > lo:
        return
    skel = skeleton(kernel, d, f"[{lo!r}, {hi!r}]", scale)
    fs = eof.sample(skel, level=3)
    rng = np.random.default_rng(0)
    u = rng.random((5, d))
    u[0, 0] = 0.5
    x = np.concatenate([np.zeros((5, 1)), lo + u * (hi - lo)], axis=1)
    u = np.clip((x[:, 1:] - lo) / (hi - lo), 0, 1)
    phi = transform(fs, x, layout="dense", dtype="float64")
    levels = np.unique(fs.eof.level, axis=0)
    s = np.full(d, scale * (hi - lo))
    np.testing.assert_allclose(phi @ phi.T, oracle(kernel, s, levels, u, u), atol=1e-11, rtol=0)


# ---------------------------------------------------------------------- bad inputs
def test_bad_skeletons_domains_and_levels():
    relu = parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: g, base: gaussian}\n"
                          "  - {name: out, activation: relu, inputs: [g]}\n", "relu.yaml")
    with pytest.raises(UsageError, match=r"relu.yaml: --scheme eof needs .* its output is node 'out', an internal node"):
        eof.sample(relu, level=2)
    g = parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: g, base: gaussian}\n", "g.yaml")
    with pytest.raises(UsageError, match="output node 'g' has base gaussian"):
        eof.sample(g, level=2)
    with pytest.raises(UsageError, match="node 'x' states no 'domain:'"):
        eof.sample(skeleton("laplace", 2), level=2)
    with pytest.raises(UsageError, match="-n D or --level N"):
        eof.sample(skeleton("brownian", 2))
    with pytest.raises(LimitError, match="EOF level 60 is beyond"):
        eof.sample(skeleton("brownian", 1), level=60)
    with limited(1 << 20), pytest.raises(LimitError, match=r"the EOF grid of level 6 in 32 dimensions"):
        eof.sample(skeleton("brownian", 32), level=6)  # about 10^7 features: refused before any allocation
    from rfsgen.skeleton import SkeletonError

    with pytest.raises(SkeletonError, match="lo < hi"):
        skeleton("brownian", 2, "[1, 1]")


def test_domain_from_rows_measures_widens_and_refuses_constant_columns(tmp_path):
    spec = eof.spec_of(skeleton("laplace", 2))
    x = np.array([[9.0, 0.0, 10.0], [9.0, 4.0, 20.0], [9.0, 2.0, 15.0]])
    np.save(tmp_path / "x.npy", x)
    lo, hi = eof.measure_domain(spec, str(tmp_path / "x.npy"), 0.25)
    np.testing.assert_allclose(lo, [-1.0, 7.5])
    np.testing.assert_allclose(hi, [5.0, 22.5])
    x[:, 2] = 3.0
    np.save(tmp_path / "c.npy", x)
    with pytest.raises(DataError, match=r"column 2 is constant \(3\) on every row"):
        eof.measure_domain(spec, str(tmp_path / "c.npy"))
    with pytest.raises(UsageError, match="--margin must be"):
        eof.measure_domain(spec, str(tmp_path / "x.npy"), -1.0)
    x[1, 1] = np.nan  # the row named is the file's, not the chunk's
    np.save(tmp_path / "n.npy", np.vstack([np.zeros((20000, 3)), x]))
    with pytest.raises(DataError, match=r"row 20001, column 1: value nan is not finite"):
        eof.measure_domain(spec, str(tmp_path / "n.npy"))


def test_domain_from_a_coo_matrix_declaring_2_62_rows_is_measured_from_its_stored_values(tmp_path):
    """No row is streamed (2^62 / 16384 chunks would never end): the box is the stored
    values' range, with 0 for the rows that store nothing; a NaN among them is named."""
    import scipy.sparse as sp

    spec = eof.spec_of(skeleton("laplace", 2))
    m = sp.coo_matrix(([7.0, 4.0, -2.0, 5.0, 1.0], ([2**62 - 1, 3, 3, 9, 9], [0, 1, 2, 2, 2])), shape=(2**62, 3))
    sp.save_npz(tmp_path / "m.npz", m)
    lo, hi = eof.measure_domain(spec, str(tmp_path / "m.npz"), 0.0)
    np.testing.assert_array_equal(lo, [0.0, -2.0])  # column 2 at row 9: 5 + 1 (duplicates add up)
    np.testing.assert_array_equal(hi, [4.0, 6.0])
    m.data[3] = np.inf
    sp.save_npz(tmp_path / "m.npz", m)
    with pytest.raises(DataError, match=r"m.npz: row 9, column 2: value is inf; "):
        eof.measure_domain(spec, str(tmp_path / "m.npz"))


# ---------------------------------------------------------------------- CLI
def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def test_cli_sample_inspect_transform(tmp_path):
    (tmp_path / "l.yaml").write_text("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: x, base: laplace, scale: 0.5}\n")
    x = np.random.default_rng(0).uniform(-2, 2, (60, 3))
    np.save(tmp_path / "x.npy", x)
    res = run(["sample", tmp_path / "l.yaml", "--scheme", "eof", "--level", 3, "--domain-from", tmp_path / "x.npy",
               "-o", tmp_path / "e.h5", "-q"])
    assert res.exit_code == 0, res.output
    res = run(["inspect", tmp_path / "e.h5"])
    assert "level 3: 10 level vectors, 31 features in the grid, 31 kept" in res.output
    assert "at most 10 per row" in res.output and "margin" not in res.output.split("domain")[0]
    assert "widened by 0.05" in res.output
    outs = []
    for chunk in (7, 60):
        res = run(["transform", tmp_path / "e.h5", tmp_path / "x.npy", "-o", tmp_path / f"t{chunk}.h5", "-q",
                   "--chunk-rows", chunk])
        assert res.exit_code == 0 and res.stderr == ""
        with h5py.File(tmp_path / f"t{chunk}.h5") as f:
            outs.append([f["X"][k][()].tobytes() for k in ("data", "indices", "indptr")])
            assert f.attrs["clipped_values"] == 0
    assert outs[0] == outs[1]
    x[3, 1] = 100.0
    np.save(tmp_path / "y.npy", x)
    res = run(["transform", tmp_path / "e.h5", tmp_path / "y.npy", "-o", tmp_path / "y.h5", "-q"])
    assert res.exit_code == 0 and "1 values outside the feature file's domain were clipped" in res.stderr


@pytest.mark.parametrize("args, code, message", [
    (["--scheme", "eof"], 2, "--scheme eof needs -n D"),
    (["--level", "3"], 2, "--level is for --scheme eof"),
    (["--scheme", "eof", "--level", "3", "-n", "5"], 2, "give -n or --level, not both"),
    (["--scheme", "eof", "--level", "3", "--margin", "0.1"], 2, "--margin widens a domain"),
    (["--scheme", "eof", "--level", "2", "--domain-from", "c.npy"], 1, "column 1 is constant"),
    (["--scheme", "eof", "--level", "0", "--domain-from", "x.npy"], 2, "--level must be an integer >= 1"),
])
def test_cli_eof_errors_are_one_line(tmp_path, monkeypatch, args, code, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "l.yaml").write_text("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: x, base: laplace}\n")
    np.save(tmp_path / "x.npy", np.arange(6.0).reshape(3, 2))
    np.save(tmp_path / "c.npy", np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]))
    res = run(["sample", "l.yaml", "-o", "e.h5", "-q"] + args)
    assert res.exit_code == code
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("rfsgen: error: ") and message in res.stderr


def test_brownian_skeleton_transform_matches_its_kernel_on_average():
    """The brownian base inside a compositional skeleton: the RFS Gram of many columns is
    close to the exact kernel (a smoke check of the whole pipeline)."""
    from conftest import SMALL_SKELETONS, rows_for
    from rfsgen import kernel
    from rfsgen.sampler import sample

    s = parse_skeleton(SMALL_SKELETONS["brownian"], "brownian")
    x = rows_for(s, 6, seed=2)
    exact = kernel(s, x)
    est = [(lambda p: p @ p.T)(transform(sample(s, 3000, seed), x, layout="dense", dtype="float64"))
           for seed in range(8)]
    mean, se = np.mean(est, 0), np.std(est, 0, ddof=1) / math.sqrt(len(est))
    assert np.all(np.abs(mean - exact) <= 5 * se + 1e-3)


def test_cli_kernel_eof_is_the_limit_kernel(tmp_path):
    (tmp_path / "l.yaml").write_text("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: x, base: laplace, scale: 0.7}\n")
    x = np.random.default_rng(1).uniform(-1, 3, (20, 2))
    np.save(tmp_path / "x.npy", x)
    res = run(["kernel", tmp_path / "l.yaml", tmp_path / "x.npy", "--eof", "--domain-from", tmp_path / "x.npy",
               "--margin", 0.1, "-o", tmp_path / "k.npy"])
    assert res.exit_code == 0 and "laplace kernel pinned on the box's faces" in res.stderr
    lo, hi = x.min(0) - 0.1 * np.ptp(x, 0), x.max(0) + 0.1 * np.ptp(x, 0)
    u = (x - lo) / (hi - lo)
    s = 0.7 * (hi - lo)
    want = k1_direct("laplace", s[0], u[:, 0], u[:, 0]) * k1_direct("laplace", s[1], u[:, 1], u[:, 1])
    np.testing.assert_allclose(np.load(tmp_path / "k.npy"), want, atol=1e-13)
    res = run(["kernel", tmp_path / "l.yaml", tmp_path / "x.npy", "--eof", "-o", tmp_path / "k2.npy"])
    assert res.exit_code == 2 and "states no 'domain:'" in res.stderr
    res = run(["kernel", tmp_path / "l.yaml", tmp_path / "x.npy", "--margin", 0.1, "-o", tmp_path / "k3.npy"])
    assert res.exit_code == 2 and "are for --eof" in res.stderr


def test_approx_eof_reports_errors_and_grid_truncation():
    from rfsgen.approx import approx, format_table

    skel = skeleton("brownian", 2, "[-1, 2]")
    x = np.random.default_rng(3).uniform(-1, 2, (30, 3))
    recs = approx(skel, x, [17, 500], trials=2, rows=20, schemes=("eof",))
    assert [r["level"] for r in recs] == [3, 7]
    # the whole grid of level 3 is the 17 features: its error is its truncation
    assert recs[0]["mae"] == pytest.approx(recs[0]["truncation_mae"])
    assert recs[1]["truncation_mae"] < recs[0]["truncation_mae"]
    assert "the whole sparse grid of each level" in format_table(recs)


def test_shards_merge_to_the_unsharded_file(tmp_path):
    (tmp_path / "b.yaml").write_text("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: x, base: brownian, domain: [-1, 1]}\n")
    x = np.random.default_rng(2).uniform(-1.2, 1.2, (40, 3))
    np.save(tmp_path / "x.npy", x)
    assert run(["sample", tmp_path / "b.yaml", "--scheme", "eof", "-n", 50, "-o", tmp_path / "e.h5", "-q"]).exit_code == 0
    res = run(["transform", tmp_path / "e.h5", tmp_path / "x.npy", "-o", tmp_path / "all.h5", "-q"])
    assert res.exit_code == 0 and "values outside the feature file's domain were clipped" in res.stderr
    for k in (0, 1, 2):
        assert run(["transform", tmp_path / "e.h5", tmp_path / "x.npy", "-o", tmp_path / f"s{k}.h5", "-q",
                    "--shard", f"{k}/3"]).exit_code == 0
    assert run(["merge", tmp_path / "s0.h5", tmp_path / "s1.h5", tmp_path / "s2.h5", "-o", tmp_path / "m.h5",
                "-q"]).exit_code == 0
    with h5py.File(tmp_path / "all.h5") as a, h5py.File(tmp_path / "m.h5") as m:
        for k in ("data", "indices", "indptr"):
            assert a["X"][k][()].tobytes() == m["X"][k][()].tobytes()
        assert a.attrs["clipped_values"] == m.attrs["clipped_values"] == int(np.sum(np.abs(x) > 1))


@settings(max_examples=30, derandomize=True, deadline=None)
@given(st.one_of(
    st.tuples(st.floats(-10, 10), st.floats(-10, 10)).filter(lambda p: not p[0] < p[1]).map(list),
    st.lists(st.floats(allow_nan=True), min_size=0, max_size=3).filter(lambda v: len(v) != 2),
    st.tuples(st.just(0.0), st.sampled_from([float("nan"), float("inf"), "a", True, None])).map(list),
))
def test_bad_domains_are_one_line_skeleton_errors(domain):
    """Generated bad domains (empty or reversed boxes, wrong lengths, non-numbers) are refused
    by the skeleton parser with one line naming the file, line and node."""
    from rfsgen.skeleton import SkeletonError

    text = f"rfsgen: 1\ninput: {{width: 2}}\nnodes:\n  - {{name: x, base: brownian, domain: {domain!r}}}\n"
    text = text.replace("nan", ".nan").replace("inf", ".inf").replace("None", "null").replace("True", "true")
    with pytest.raises(SkeletonError) as e:
        parse_skeleton(text, "d.yaml")
    assert str(e.value).startswith("d.yaml:4: ") and "\n" not in str(e.value)


def test_cli_level_beyond_the_limit_is_a_one_line_limit_error(tmp_path):
    (tmp_path / "b.yaml").write_text("rfsgen: 1\ninput: {width: 40}\nnodes:\n  - {name: x, base: brownian}\n")
    res = run(["sample", tmp_path / "b.yaml", "--scheme", "eof", "--level", 60, "-o", tmp_path / "e.h5"])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1 and "beyond the deepest level 50" in res.stderr
    res = run(["sample", tmp_path / "b.yaml", "--scheme", "eof", "--level", 6, "-o", tmp_path / "e.h5"],
              env={"RFSGEN_MAX_MEMORY": "1M"})
    assert res.exit_code == 1 and res.stderr.count("\n") == 1
    assert "the EOF grid of level 6 in 40 dimensions (36,822,017 features" in res.stderr
    assert not (tmp_path / "e.h5").exists()


def test_inspect_json_of_an_eof_file(tmp_path):
    import json

    fs = eof.sample(skeleton("brownian", 3), columns=30, seed=2)
    save(fs, tmp_path / "e.h5")
    info = json.loads(run(["inspect", "--json", tmp_path / "e.h5"]).output)
    assert info["features"] == 30 and info["constant_weight"] == 0.0 and info["scheme"] == "eof"
    e = info["eof"]
    assert e["level"] == 3 and e["level_vectors"] == 10 and e["grid_features"] == 31
    assert e["max_nonzeros_per_row"] == 10 and 9 < e["expected_nonzeros_per_row"] < 10


def test_sklearn_estimator_with_eof():
    from rfsgen.sklearn import SkeletonFeatures

    x = np.random.default_rng(4).normal(size=(40, 3))
    est = SkeletonFeatures("rfsgen: 1\ninput: {width: auto}\nnodes:\n  - {name: x, base: laplace, scale: 0.5}\n",
                         n_components=25, random_state=3, scheme="eof", sparse_output=True)
    z = est.fit_transform(x)
    assert z.shape == (40, 25) and est.features_.eof.meta["domain_source"] == "the input rows"
    lo, hi = x.min(0) - 0.05 * np.ptp(x, 0), x.max(0) + 0.05 * np.ptp(x, 0)
    np.testing.assert_allclose(est.features_.eof.lo, lo)
    np.testing.assert_allclose(est.features_.eof.hi, hi)
    assert (z != est.transform(x)).nnz == 0


def test_eof_datasets_stored_outside_the_file_are_refused(tmp_path):
    """The EOF vectors pass the checks of every feature-file dataset: no external storage."""
    p = forged(tmp_path, lambda c: None)
    with h5py.File(p, "a") as f:
        shape = f["eof_level"].shape
        del f["eof_level"]
        (tmp_path / "raw.bin").write_bytes(b"\0" * (8 * shape[0] * shape[1]))
        f.create_dataset("eof_level", shape=shape, dtype=np.uint64, external=[(str(tmp_path / "raw.bin"), 0, 8 * shape[0] * shape[1])])
    with h5py.File(p) as f:
        with pytest.raises(FeatureFileError, match="external storage"):
            eof.read("forged.h5", f, shape[0])


@pytest.mark.parametrize("n, d", [(1, 1), (1, 4), (2, 3), (4, 1), (4, 4), (5, 3), (3, 7)])
def test_level_vectors_and_subset_cells_are_the_brute_force_enumeration(n, d):
    """The compiled odometer lists I_n's level vectors in lexicographic order, and
    features_at gives the same (level vector, cells) as enumerating every feature."""
    import itertools

    want = [v for v in itertools.product(range(1, n + 1), repeat=d) if sum(v) - d <= n - 1]
    got = eof.level_vectors(n, d)
    assert got.tolist() == [list(v) for v in want]
    assert got.shape[0] == eof.grid_counts(n, d)[0]
    t_all, cells_all = eof.enumerate_features(got)
    assert t_all.size == eof.grid_counts(n, d)[1]
    pick = np.sort(np.random.default_rng(n * 10 + d).choice(t_all.size, min(t_all.size, 50), replace=False))
    t, cells = eof.features_at(got, pick)
    np.testing.assert_array_equal(t, t_all[pick])
    np.testing.assert_array_equal(cells, cells_all[pick])

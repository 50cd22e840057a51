"""Transform outputs are AnnData files (rfsgen/h5ad.py), checked with real anndata."""

import warnings

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

import rfsgen
from rfsgen.cli import main

anndata = pytest.importorskip("anndata")  # a test extra

# Factors of the sphere 'coordinate' scheme are the row's coordinates: exactly zero
# on zero entries, so the features of sparse rows are sparse too.
COORDINATE = """
rfsgen: 1
input: {width: auto}
nodes:
  - {name: s, base: sphere, scheme: coordinate, zero: uniform}
  - {name: out, activation: {name: polynomial, degree: 3, c: 0.2}, inputs: [s]}
"""


def run(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _read_h5ad(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return anndata.read_h5ad(path, **kw)


@pytest.fixture
def rows(tmp_path):
    x = np.random.default_rng(0).standard_normal((30, 12))
    x[np.abs(x) < 1.0] = 0.0  # about two thirds zeros
    np.save(tmp_path / "x.npy", x)
    sp.save_npz(tmp_path / "x.npz", sp.csr_matrix(x))
    a = anndata.AnnData(sp.csr_matrix(x))
    a.obs_names = [f"cell{i}" for i in range(30)]
    a.layers["counts"] = sp.csr_matrix(np.abs(x))
    a.write_h5ad(tmp_path / "x.h5ad")
    (tmp_path / "s.yaml").write_text(COORDINATE)
    assert run(["sample", tmp_path / "s.yaml", "--width", 12, "-n", 200, "-o", tmp_path / "f.h5", "-q"]).exit_code == 0
    return x


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_outputs_open_with_anndata_in_memory_and_backed(tmp_path, rows, layout):
    out = tmp_path / f"o-{layout}.h5ad"
    res = run(["transform", tmp_path / "f.h5", tmp_path / "x.npy", "-o", out, "--layout", layout, "--rows", "5:25"])
    assert res.exit_code == 0, res.output
    a = _read_h5ad(out)
    want = rfsgen.transform(rfsgen.load_features(tmp_path / "f.h5"), rows[5:25], layout="dense")
    got = a.X.toarray() if sp.issparse(a.X) else a.X
    assert a.shape == (20, 200) and np.array_equal(got, want)  # CSR drops exact zeros, -0.0 among them
    assert list(a.obs_names[:2]) == ["5", "6"] and list(a.var_names[-1:]) == ["199"]  # absolute row numbers
    b = _read_h5ad(out, backed="r")
    assert b.shape == (20, 200)
    part = b.X[3:7]
    assert np.array_equal(part.toarray() if sp.issparse(part) else np.asarray(part), want[3:7])
    b.file.close()
    with h5py.File(out, "r") as f:  # provenance stays at the root
        assert f.attrs["rows_start"] == 5 and len(f.attrs["features_sha256"]) == 64
        assert f.attrs["encoding-type"] == "anndata"


def test_h5ad_input_names_rows_and_sparse_rows_give_sparse_features(tmp_path, rows):
    outs = {}
    for name in ("x.npy", "x.npz", "x.h5ad"):
        out = tmp_path / f"o-{name}.h5"
        assert run(["transform", tmp_path / "f.h5", tmp_path / name, "-o", out, "--chunk-rows", 7]).exit_code == 0
        with h5py.File(out, "r") as f:
            outs[name] = {k: f["X"][k][()].tobytes() for k in ("data", "indices", "indptr")}
    assert outs["x.npy"] == outs["x.npz"] == outs["x.h5ad"]  # sparse input: the same bytes as dense
    a = _read_h5ad(tmp_path / "o-x.h5ad.h5")
    assert list(a.obs_names[:3]) == ["cell0", "cell1", "cell2"]
    density = a.X.nnz / (a.shape[0] * a.shape[1])
    assert density < 0.5, density  # exact zeros are dropped from CSR
    dense = rfsgen.transform(rfsgen.load_features(tmp_path / "f.h5"), rows, layout="dense")
    assert np.array_equal(a.X.toarray(), dense) and (dense == 0).mean() > 0.5
    res = run(["transform", tmp_path / "f.h5", f"{tmp_path}/x.h5ad:/layers/counts", "-o", tmp_path / "c.h5ad",
               "--rows", "10:12"])
    assert res.exit_code == 0
    c = _read_h5ad(tmp_path / "c.h5ad")
    assert list(c.obs_names) == ["cell10", "cell11"]
    np.testing.assert_array_equal(c.X.toarray(), rfsgen.transform(rfsgen.load_features(tmp_path / "f.h5"),
                                                                  np.abs(rows[10:12]), layout="dense"))


def test_in_memory_sparse_rows_give_sparse_features(rows, tmp_path):
    fs = rfsgen.load_features(tmp_path / "f.h5")
    z = rfsgen.transform(fs, sp.csc_matrix(rows))
    assert z.nnz < 0.5 * z.shape[0] * z.shape[1]
    assert np.array_equal(z.toarray(), rfsgen.transform(fs, rows, layout="dense"))
    dense_of_sparse = rfsgen.transform(fs, sp.csc_matrix(rows), layout="dense")
    assert dense_of_sparse.tobytes() == rfsgen.transform(fs, rows, layout="dense").tobytes()
    k = rfsgen.kernel(rfsgen.parse_skeleton(COORDINATE), sp.csr_matrix(rows))
    assert np.array_equal(k, rfsgen.kernel(rfsgen.parse_skeleton(COORDINATE), rows))

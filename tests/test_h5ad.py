"""Transform outputs are AnnData files (rfsgen/h5ad.py), checked with real anndata."""

import warnings

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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
    assert list(a.obs_names[:2]) == ["5", "6"] and list(a.var_names[-1:]) == ["skeletonfeatures199"]  # absolute row numbers
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


def test_provenance_is_in_uns_and_shards_with_it_merge_to_the_unsharded_file(tmp_path, rows):
    assert run(["transform", tmp_path / "f.h5", tmp_path / "x.h5ad", "-o", tmp_path / "all.h5ad", "-q"]).exit_code == 0
    a = _read_h5ad(tmp_path / "all.h5ad")
    prov = a.uns["rfsgen"]
    with h5py.File(tmp_path / "all.h5ad", "r") as f:
        for key in ("rfsgen_version", "features_file", "features_sha256", "input", "rows_start", "rows_stop",
                    "columns", "layout"):
            v = f.attrs[key]
            assert prov[key] == (v.item() if isinstance(v, np.generic) else v), key
    assert (prov["rows_start"], prov["rows_stop"], prov["columns"], prov["layout"]) == (0, 30, 200, "csr")
    for k in range(3):
        assert run(["transform", tmp_path / "f.h5", tmp_path / "x.h5ad", "-o", tmp_path / f"s{k}.h5ad",
                    "--shard", f"{k}/3", "-q"]).exit_code == 0
    assert _read_h5ad(tmp_path / "s1.h5ad").uns["rfsgen"]["rows_start"] == 10
    res = run(["merge", *(tmp_path / f"s{k}.h5ad" for k in (2, 0, 1)), "-o", tmp_path / "m.h5ad", "-q"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "m.h5ad").read_bytes() == (tmp_path / "all.h5ad").read_bytes()
    assert _read_h5ad(tmp_path / "m.h5ad").uns["rfsgen"]["rows_stop"] == 30


@pytest.mark.parametrize("how", ["value", "extra", "missing", "type"])
def test_a_shard_with_edited_provenance_in_uns_is_refused(tmp_path, rows, how):
    for k in range(2):
        assert run(["transform", tmp_path / "f.h5", tmp_path / "x.npy", "-o", tmp_path / f"s{k}.h5",
                    "--shard", f"{k}/2", "-q"]).exit_code == 0
    with h5py.File(tmp_path / "s1.h5", "r+") as f:
        g = f["uns/rfsgen"]
        if how == "value":
            del g["input"]
            g["input"] = "elsewhere.npy"
            g["input"].attrs["encoding-type"], g["input"].attrs["encoding-version"] = "string", "0.2.0"
        elif how == "extra":
            g["note"] = 1
        elif how == "missing":
            del g["rows_stop"]
        else:
            del g["rows_start"]
            g["rows_start"] = 15.0
    res = run(["merge", tmp_path / "s0.h5", tmp_path / "s1.h5", "-o", tmp_path / "m.h5"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "s1.h5: 'uns/rfsgen" in res.output and "re-create it with 'rfsgen transform'" in res.output
    assert not (tmp_path / "m.h5").exists()


def test_rfsgen_transform_takes_anndata_objects_their_layers_and_backed_x(tmp_path, rows):
    fs = rfsgen.load_features(tmp_path / "f.h5")
    want = rfsgen.transform(fs, rows, layout="dense")
    a = _read_h5ad(tmp_path / "x.h5ad")
    assert np.array_equal(rfsgen.transform(fs, a).toarray(), want)
    assert np.array_equal(rfsgen.transform(fs, a, layer="counts", layout="dense"),
                          rfsgen.transform(fs, np.abs(rows), layout="dense"))
    assert np.array_equal(rfsgen.transform(fs, tmp_path / "x.h5ad", layer="counts", layout="dense"),
                          rfsgen.transform(fs, np.abs(rows), layout="dense"))
    b = _read_h5ad(tmp_path / "x.h5ad", backed="r")  # X: anndata's backed CSR dataset
    assert np.array_equal(rfsgen.transform(fs, b, layout="dense"), want)
    b.file.close()
    d = anndata.AnnData(rows)
    d.write_h5ad(tmp_path / "d.h5ad")
    bd = _read_h5ad(tmp_path / "d.h5ad", backed="r")  # X: an h5py dataset
    assert rfsgen.transform(fs, bd, layout="dense").tobytes() == want.tobytes()
    bd.file.close()


@pytest.mark.parametrize("layer, obj, kind, text", [
    ("nope", "adata", rfsgen.InputError, "<AnnData>: has no layer 'nope' (layers: 'counts')"),
    ("counts", "array", rfsgen.UsageError, "layer='counts' is for AnnData inputs"),
    ("counts", "npy", rfsgen.UsageError, "layer='counts' is for AnnData inputs (or an .h5ad path"),
    (None, "nox", rfsgen.InputError, "<AnnData>: has no X"),
])
def test_layer_mistakes_are_one_line_errors(tmp_path, rows, layer, obj, kind, text):
    fs = rfsgen.load_features(tmp_path / "f.h5")
    x = {"adata": lambda: _read_h5ad(tmp_path / "x.h5ad"), "array": lambda: rows,
         "npy": lambda: tmp_path / "x.npy", "nox": lambda: anndata.AnnData(obs={"a": np.arange(3)})}[obj]()
    with pytest.raises(kind) as e:
        rfsgen.transform(fs, x, layer=layer)
    assert text in str(e.value) and "\n" not in str(e.value)


def test_skeleton_features_takes_anndata_and_a_layer(tmp_path, rows):
    from rfsgen.sklearn import SkeletonFeatures

    a = _read_h5ad(tmp_path / "x.h5ad")
    est = SkeletonFeatures(COORDINATE, n_components=64, random_state=0)
    z = est.fit_transform(a)
    assert np.array_equal(z, SkeletonFeatures(COORDINATE, n_components=64, random_state=0).fit_transform(rows))
    b = _read_h5ad(tmp_path / "x.h5ad", backed="r")
    assert np.array_equal(est.transform(b), z)
    b.file.close()
    on_counts = SkeletonFeatures(COORDINATE, n_components=64, random_state=0, layer="counts").fit(a)
    assert np.array_equal(on_counts.transform(a), est.transform(np.abs(rows)))
    with pytest.raises(ValueError, match="has no layer 'raw'"):
        SkeletonFeatures(COORDINATE, n_components=64, layer="raw").fit(a)
    with pytest.raises(ValueError, match="layer='counts' is for AnnData inputs"):
        on_counts.transform(rows)


def _annotated(tmp_path, n=40, width=12):
    """An .h5ad with obs columns of every kind rfsgen carries, and a feature file for it."""
    import pandas as pd

    x = sp.random(n, width, density=0.3, format="csr", rng=np.random.default_rng(1))
    a = anndata.AnnData(x)
    a.obs_names = [f"c{i}" for i in range(n)]
    a.obs["cell_type"] = pd.Categorical(np.array(["T", "B", "NK"])[np.arange(n) % 3])
    a.obs["batch"] = np.arange(n) // 10
    a.obs["score"] = np.linspace(0, 1, n)
    a.obs["count"] = pd.array([None if i % 7 == 0 else i for i in range(n)], dtype="Int64")
    a.obs["flag"] = np.arange(n) % 2 == 0
    a.obs["label"] = [f"l{i}" for i in range(n)]
    a.obs["grade"] = pd.Categorical(np.arange(n) % 4, ordered=True)
    a.write_h5ad(tmp_path / "a.h5ad")
    (tmp_path / "s.yaml").write_text(COORDINATE)
    assert run(["sample", tmp_path / "s.yaml", "--width", width, "-n", 50, "-o", tmp_path / "fa.h5", "-q"]).exit_code == 0
    return a


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_obs_columns_are_carried_through_rows_shards_and_merge(tmp_path, layout):
    a = _annotated(tmp_path)
    f, x = tmp_path / "fa.h5", tmp_path / "a.h5ad"
    assert run(["transform", f, x, "-o", tmp_path / "all.h5ad", "--layout", layout, "-q"]).exit_code == 0
    out = _read_h5ad(tmp_path / "all.h5ad")
    assert out.obs.equals(a.obs) and list(out.obs.columns) == list(a.obs.columns)
    assert run(["transform", f, x, "-o", tmp_path / "r.h5ad", "--rows", "13:29", "--layout", layout]).exit_code == 0
    assert _read_h5ad(tmp_path / "r.h5ad").obs.equals(a.obs.iloc[13:29])
    for k in range(3):
        assert run(["transform", f, x, "-o", tmp_path / f"s{k}.h5ad", "--shard", f"{k}/3", "--layout", layout,
                    "-q"]).exit_code == 0
    shard = _read_h5ad(tmp_path / "s1.h5ad")
    assert shard.obs.equals(a.obs.iloc[13:26]) and list(shard.obs["cell_type"].cat.categories) == ["B", "NK", "T"]
    res = run(["merge", *(tmp_path / f"s{k}.h5ad" for k in (1, 2, 0)), "-o", tmp_path / "m.h5ad", "-q"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "m.h5ad").read_bytes() == (tmp_path / "all.h5ad").read_bytes()
    if layout == "dense":
        res = run(["merge", *(tmp_path / f"s{k}.h5ad" for k in range(3)), "-o", tmp_path / "v.h5ad", "--virtual"])
        assert res.exit_code == 0, res.output
        assert _read_h5ad(tmp_path / "v.h5ad").obs.equals(a.obs)


@pytest.mark.parametrize("how", ["value", "string", "category", "mask", "dropped", "order"])
def test_a_shard_with_edited_obs_columns_is_refused(tmp_path, how):
    _annotated(tmp_path)
    for k in range(2):
        assert run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / f"s{k}.h5ad",
                    "--shard", f"{k}/2", "-q"]).exit_code == 0
    with h5py.File(tmp_path / "s1.h5ad", "r+") as f:
        obs = f["obs"]
        if how == "value":
            obs["batch"][3] = 99
        elif how == "string":
            obs["label"][0] = "changed"
        elif how == "category":
            obs["cell_type/categories"][0] = "X"
        elif how == "mask":
            obs["count/mask"][1] = not obs["count/mask"][1]
        elif how == "dropped":
            del obs["score"]
        else:
            obs.attrs["column-order"] = np.array(list(obs.attrs["column-order"])[::-1], dtype=object)
    res = run(["merge", tmp_path / "s0.h5ad", tmp_path / "s1.h5ad", "-o", tmp_path / "m.h5ad"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "s1.h5ad" in res.output and not (tmp_path / "m.h5ad").exists()
    want = {"value": "do not match the checksum", "string": "do not match the checksum",
            "category": "different obs columns", "mask": "do not match the checksum",
            "dropped": "has no 'obs/score'",
            "order": "different obs columns"}[how]
    assert want in res.output, res.output


def test_shards_of_inputs_with_different_obs_columns_do_not_merge(tmp_path):
    a = _annotated(tmp_path)
    assert run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / "s0.h5ad", "--rows", "0:20",
                "-q"]).exit_code == 0
    del a.obs["batch"]
    a.write_h5ad(tmp_path / "a.h5ad")
    assert run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / "s1.h5ad", "--rows", "20:40",
                "-q"]).exit_code == 0
    res = run(["merge", tmp_path / "s0.h5ad", tmp_path / "s1.h5ad", "-o", tmp_path / "m.h5ad"])
    assert res.exit_code == 2 and "have different obs columns" in res.output


def test_an_obs_column_rfsgen_cannot_carry_is_a_one_line_error(tmp_path):
    _annotated(tmp_path)
    with h5py.File(tmp_path / "a.h5ad", "r+") as f:
        f["obs"].create_group("nested").attrs["encoding-type"] = "dataframe"
        f["obs"].attrs["column-order"] = np.array(list(f["obs"].attrs["column-order"]) + ["nested"], dtype=object)
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / "o.h5ad"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert "a.h5ad:/obs/nested: the obs column 'nested' is encoded as 'dataframe'" in res.output
    assert "del adata.obs" in res.output and not (tmp_path / "o.h5ad").exists()


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_obsm_writes_the_features_into_a_copy_of_the_input(tmp_path, layout):
    a = _annotated(tmp_path)
    a.layers["counts"] = a.X.copy() * 2
    a.write_h5ad(tmp_path / "a.h5ad")
    before = (tmp_path / "a.h5ad").read_bytes()
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / "o.h5ad", "--obsm", "X_rfsgen",
               "--layout", layout])
    assert res.exit_code == 0 and "(obsm['X_rfsgen'])" in res.output, res.output
    assert (tmp_path / "a.h5ad").read_bytes() == before  # the input is not touched
    o = _read_h5ad(tmp_path / "o.h5ad")
    assert o.obs.equals(a.obs) and list(o.var_names) == list(a.var_names) and (o.X != a.X).nnz == 0
    assert (o.layers["counts"] != a.layers["counts"]).nnz == 0
    want = rfsgen.transform(rfsgen.load_features(tmp_path / "fa.h5"), a.X, layout="dense")
    got = o.obsm["X_rfsgen"]
    assert np.array_equal(got.toarray() if sp.issparse(got) else got, want)
    prov = o.uns["rfsgen"]["X_rfsgen"]
    assert (prov["rows_stop"], prov["columns"], prov["layout"]) == (40, 50, layout)
    # A second feature set goes beside the first; a taken key is refused before any work.
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "o.h5ad", "-o", tmp_path / "o2.h5ad", "--obsm", "X_two"])
    assert res.exit_code == 0 and set(_read_h5ad(tmp_path / "o2.h5ad").obsm) == {"X_rfsgen", "X_two"}
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "o.h5ad", "-o", tmp_path / "o3.h5ad", "--obsm", "X_rfsgen"])
    assert res.exit_code == 2 and "already holds 'obsm/X_rfsgen'; choose another --obsm KEY" in res.output
    assert not (tmp_path / "o3.h5ad").exists()


@pytest.mark.parametrize("args, text", [
    (["--rows", "0:5"], "it cannot take --rows or --shard"),
    (["--shard", "0/2"], "it cannot take --rows or --shard"),
    (["--obsm", "a/b"], "give a name without '/'"),
])
def test_obsm_mistakes_are_one_line_errors(tmp_path, args, text):
    _annotated(tmp_path)
    opts = args if "--obsm" in args else ["--obsm", "X_r", *args]
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / "o.h5ad", *opts])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and text in res.output, res.output
    np.save(tmp_path / "x.npy", np.ones((3, 12)))
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "x.npy", "-o", tmp_path / "o.h5ad", "--obsm", "X_r"])
    assert res.exit_code == 2 and "the input must be an .h5ad file" in res.output



# Issue 37 item 6: --obsm onto AnnData files of another shape.  Each shape is a change
# made with h5py to an anndata-written file; the writer must refuse it in one line naming
# the node, leave no output and no temporary file, and not touch the input.
def _reshape(path, node, kind, elsewhere=None):
    """Make ``node`` of the .h5ad ``path`` of ``kind`` (deleting what was there)."""
    with h5py.File(path, "r+") as f:
        parent, _, name = node.rpartition("/")
        g = f[parent] if parent else f
        if g.get(name, getlink=True) is not None:
            del g[name]
        if kind == "dataset":
            g.create_dataset(name, data=np.arange(3))
        elif kind == "soft-self":
            g[name] = h5py.SoftLink("/" + node)
        elif kind == "dangling":
            g[name] = h5py.SoftLink("/nothing/here")
        elif kind.startswith("soft:"):
            g[name] = h5py.SoftLink(kind[5:])
        elif kind == "external-missing":
            g[name] = h5py.ExternalLink("missing.h5", "/g")
        elif kind == "external":
            g[name] = h5py.ExternalLink(str(elsewhere), "/g")
        elif kind.startswith("hard:"):
            g[name] = f[kind[5:]]
        elif kind.startswith("encoded:"):
            g.create_group(name).attrs["encoding-type"] = kind[8:]
        else:
            raise AssertionError(kind)


def _obsm_refused(tmp_path, res, node, text):
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "Traceback" not in res.output and f"a.h5ad:/{node}: " in res.output and text in res.output, res.output
    assert not (tmp_path / "o.h5ad").exists() and not [p for p in tmp_path.iterdir() if ".part" in p.name]


@pytest.mark.parametrize("node, kind, text", [
    ("obsm", "dataset", "is a dataset; expected a dict group"),
    ("obsm", "soft:/X", "is a soft link (to '/X'); expected a dict group"),
    ("obsm", "external-missing", "is an external link (to missing.h5:/g); expected a dict group"),
    ("uns", "dataset", "is a dataset; expected a dict group"),
    ("uns/rfsgen", "dangling", "is a soft link (to '/nothing/here'); expected a dict group"),
    ("obsm", "soft-self", "is a soft link (to '/obsm'); expected a dict group"),
    ("uns/rfsgen", "soft-self", "is a soft link (to '/uns/rfsgen')"),
    ("obsm", "hard:uns", "also linked elsewhere in the file (2 links)"),
    ("obsm", "encoded:csr_matrix", "is a group encoded as 'csr_matrix'; expected a dict group"),
    ("obs", "dataset", "is a dataset; expected a dataframe group"),
    ("obs/_index", "dangling", "is a soft link (to '/nothing/here'); expected the dataset of row names"),
    ("obs/_index", "dataset", "the row names (obs index) are a dataset of shape (3,); expected one name for each"),
])
def test_obsm_onto_a_file_of_another_shape_is_a_one_line_error(tmp_path, node, kind, text):
    _annotated(tmp_path)
    if node == "uns/rfsgen":
        with h5py.File(tmp_path / "a.h5ad", "r+") as f:
            f["uns"].create_group("rfsgen")
    _reshape(tmp_path / "a.h5ad", node, kind)
    before = (tmp_path / "a.h5ad").read_bytes()
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / "o.h5ad", "--obsm", "X_rf"])
    _obsm_refused(tmp_path, res, node, text)
    assert (tmp_path / "a.h5ad").read_bytes() == before


def test_obsm_never_writes_into_the_input_or_through_a_link_to_another_file(tmp_path):
    import os

    _annotated(tmp_path)
    # In place (the input as -o, by its name or a hard link to it): refused, the input as it was.
    before = (tmp_path / "a.h5ad").read_bytes()
    os.link(tmp_path / "a.h5ad", tmp_path / "same.h5ad")
    for out in ("a.h5ad", "same.h5ad"):
        res = run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / out, "--obsm", "X_rf",
                   "--overwrite"])
        assert res.exit_code == 2 and "is also an input of this command" in res.output, res.output
        assert (tmp_path / "a.h5ad").read_bytes() == before
    os.unlink(tmp_path / "same.h5ad")
    # obsm an external link to a group of another file: that file is not written.
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_group("g").attrs["encoding-type"] = "dict"
    other = (tmp_path / "other.h5").read_bytes()
    _reshape(tmp_path / "a.h5ad", "obsm", "external", elsewhere=tmp_path / "other.h5")
    before = (tmp_path / "a.h5ad").read_bytes()
    res = run(["transform", tmp_path / "fa.h5", tmp_path / "a.h5ad", "-o", tmp_path / "o.h5ad", "--obsm", "X_rf"])
    _obsm_refused(tmp_path, res, "obsm", "is an external link (to ")
    assert (tmp_path / "other.h5").read_bytes() == other and (tmp_path / "a.h5ad").read_bytes() == before

_OBSM_NODES = ["obsm", "uns", "uns/rfsgen", "obsm/X_rf", "uns/rfsgen/X_rf", "obs", "obs/_index"]
_OBSM_KINDS = ["dataset", "soft-self", "dangling", "soft:/X", "soft:/var", "soft:/uns", "external-missing",
               "external", "hard:var", "hard:X", "encoded:dataframe"]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(changes=st.lists(st.tuples(st.sampled_from(_OBSM_NODES), st.sampled_from(_OBSM_KINDS)), min_size=1,
                        max_size=2, unique_by=lambda t: t[0]))
def test_obsm_refuses_every_node_of_another_kind_or_writes_a_valid_anndata(tmp_path_factory, changes):
    """Generated: one or two nodes on the writer's path made of another kind.  Either a
    one-line error naming a node on that path (nothing written, the input and any file it
    links to untouched), or an output anndata reads whose obsm holds the features."""
    import shutil

    base = tmp_path_factory.getbasetemp() / "obsm-base"
    if not base.exists():
        base.mkdir()
        _annotated(base)
        with h5py.File(base / "a.h5ad", "r+") as f:
            f["uns"].create_group("rfsgen").attrs["encoding-type"] = "dict"
        with h5py.File(base / "other.h5", "w") as f:
            f.create_group("g")
    d = tmp_path_factory.mktemp("obsm")
    for name in ("a.h5ad", "fa.h5", "other.h5"):
        shutil.copy(base / name, d / name)
    for node, kind in sorted(changes, key=lambda c: c[0].count("/")):
        with h5py.File(d / "a.h5ad", "r") as f:
            parent = node.rpartition("/")[0]
            if parent and not isinstance(f.get(parent), h5py.Group):
                continue  # its parent was changed first
        _reshape(d / "a.h5ad", node, kind, elsewhere=d / "other.h5")
    before, other = (d / "a.h5ad").read_bytes(), (d / "other.h5").read_bytes()
    res = run(["transform", d / "fa.h5", d / "a.h5ad", "-o", d / "o.h5ad", "--obsm", "X_rf"])
    assert "Traceback" not in res.output and (d / "a.h5ad").read_bytes() == before
    assert (d / "other.h5").read_bytes() == other and not [p for p in d.iterdir() if ".part" in p.name]
    if res.exit_code == 0:
        o = _read_h5ad(d / "o.h5ad")
        assert o.obsm["X_rf"].shape == (40, 50) and o.n_obs == 40
        return
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert any(f"a.h5ad:/{n}" in res.output or f"'{n}'" in res.output for n, _ in changes) or (
        "a.h5ad:/X" in res.output or "'/X'" in res.output), res.output
    assert not (d / "o.h5ad").exists()

def test_inspect_states_the_density_of_a_coordinate_feature_file(tmp_path, rows):
    res = run(["inspect", tmp_path / "f.h5"])
    line = next(t for t in res.output.splitlines() if t.startswith("density"))
    assert "columns almost surely non-zero; the others vanish where their sphere 'coordinate'" in line
    assert line.endswith("--layout auto writes csr")
    assert run(["transform", tmp_path / "f.h5", tmp_path / "x.h5ad", "-o", tmp_path / "o.h5ad"]).exit_code == 0
    with h5py.File(tmp_path / "o.h5ad", "r") as f:
        assert f.attrs["layout"] == "csr"


@pytest.fixture(scope="module")
def annotated_shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("annotated")
    _annotated(d)
    for k in range(2):
        assert run(["transform", d / "fa.h5", d / "a.h5ad", "-o", d / f"s{k}.h5ad", "--shard", f"{k}/2",
                    "-q"]).exit_code == 0
    return d


_PARTS = ["cell_type/codes", "cell_type/categories", "batch", "score", "count/values", "count/mask", "flag", "label",
          "grade/codes"]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(part=st.sampled_from(_PARTS), shard=st.integers(0, 1), pos=st.integers(0, 19), data=st.data())
def test_any_edited_obs_value_in_a_shard_is_found(annotated_shards, tmp_path_factory, part, shard, pos, data):
    import shutil

    d = tmp_path_factory.mktemp("edit")
    for k in range(2):
        shutil.copy(annotated_shards / f"s{k}.h5ad", d / f"s{k}.h5ad")
    with h5py.File(d / f"s{shard}.h5ad", "r+") as f:
        ds = f["obs"][part]
        i = pos % ds.shape[0]
        old = ds[i]
        if h5py.check_string_dtype(ds.dtype) is not None:
            new = old.decode() + data.draw(st.text("xyzé", min_size=1, max_size=3), label="suffix")
        elif ds.dtype.kind == "b":
            new = not old
        else:
            new = old + data.draw(st.sampled_from([1, -1, 2]), label="delta")
        ds[i] = new
    res = run(["merge", d / "s0.h5ad", d / "s1.h5ad", "-o", d / "m.h5ad"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert f"s{shard}.h5ad" in res.output and not (d / "m.h5ad").exists()

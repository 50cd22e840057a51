"""rfsgen.sklearn.SkeletonFeatures against real scikit-learn (a test extra)."""

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import skeleton_path

sklearn = pytest.importorskip("sklearn")  # installed by the test extra; skipped only outside it

import rfsgen  # noqa: E402
from rfsgen.errors import SkeletonError  # noqa: E402
from rfsgen.sklearn import SkeletonFeatures  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

AUTO = skeleton_path("tabular-auto")

# No check is expected to fail: the list of exceptions is empty on purpose.  One check,
# check_array_api_input, is skipped by scikit-learn itself unless SCIPY_ARRAY_API=1 is
# set before scipy is imported and array-api-compat is installed; rfsgen computes in
# numpy and converts other arrays, as the check allows.
EXPECTED_FAILED = {}


@parametrize_with_checks(
    [
        SkeletonFeatures(n_components=64, random_state=0),  # the default skeleton (width: auto)
        SkeletonFeatures(AUTO, n_components=64, random_state=0),
        SkeletonFeatures(AUTO, n_components=32, random_state=1, dtype="float64", sparse_output=True),
    ],
    expected_failed_checks=lambda est: EXPECTED_FAILED,
)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Can't check dok sparse matrix for nan or inf"
        check(estimator)


def _rows(n=50, width=7, seed=0):
    return np.random.default_rng(seed).standard_normal((n, width))


def test_transform_equals_library_transform_and_sample():
    x = _rows()
    est = SkeletonFeatures(AUTO, n_components=300, random_state=5).fit(x)
    fs = rfsgen.sample(rfsgen.load_skeleton(AUTO).bind(7), 300, seed=5)
    assert est.features_.draws == fs.draws and np.array_equal(est.features_.code, fs.code)
    z = est.transform(x)
    assert z.dtype == np.float32 and z.shape == (50, 300)
    assert z.tobytes() == rfsgen.transform(fs, x, layout="dense").tobytes()
    assert est.n_features_in_ == 7 and est.skeleton_.width == 7
    names = est.get_feature_names_out()
    assert list(names[:2]) == ["skeletonfeatures0", "skeletonfeatures1"] and len(names) == 300


def test_skeleton_given_as_text_path_or_object():
    x = _rows(width=3)
    text = open(AUTO).read()
    outs = [SkeletonFeatures(s, n_components=40, random_state=2).fit_transform(x)
            for s in (AUTO, text, rfsgen.load_skeleton(AUTO))]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()
    with pytest.raises(ValueError, match="path, a shipped skeleton's name, YAML text or rfsgen.Skeleton"):
        SkeletonFeatures(3).fit(x)


def test_fixed_width_skeleton_and_wrong_width():
    x = _rows(width=8)
    est = SkeletonFeatures(skeleton_path("tabular-circle"), n_components=50, random_state=0).fit(x)
    assert est.transform(x).shape == (50, 50)
    with pytest.raises(ValueError, match=r"X has 5 feature\(s\).*expects width 8"):
        SkeletonFeatures(skeleton_path("tabular-circle"), n_components=50).fit(x[:, :5])
    with pytest.raises(ValueError, match="X has 5 features, but SkeletonFeatures is expecting 8"):
        est.transform(x[:, :5])


def test_sparse_and_dataframe_inputs_and_pandas_output():
    pd = pytest.importorskip("pandas")
    x = _rows(width=6)
    x[np.abs(x) < 0.8] = 0.0
    est = SkeletonFeatures(AUTO, n_components=100, random_state=3).fit(x)
    dense = est.transform(x)
    for fmt in ("csr", "csc", "coo", "lil"):
        assert est.transform(sp.random(1, 1).asformat(fmt).__class__(x)).tobytes() == dense.tobytes(), fmt
        assert est.transform(sp.csr_array(x).asformat(fmt)).tobytes() == dense.tobytes(), fmt
    df = pd.DataFrame(x, columns=[f"c{i}" for i in range(6)])
    est.set_output(transform="pandas")
    out = est.fit(df).transform(df)
    assert isinstance(out, pd.DataFrame) and list(out.columns[:1]) == ["skeletonfeatures0"]
    assert out.to_numpy().tobytes() == dense.tobytes()
    assert list(est.feature_names_in_) == list(df.columns)


def test_sparse_output_matches_dense():
    x = _rows(width=4)
    a = SkeletonFeatures(AUTO, n_components=64, random_state=1).fit_transform(x)
    b = SkeletonFeatures(AUTO, n_components=64, random_state=1, sparse_output=True).fit_transform(x)
    assert sp.issparse(b) and b.format == "csr" and np.array_equal(b.toarray(), a)


def test_bad_values_are_value_errors_naming_the_row():
    x = _rows(width=4)
    est = SkeletonFeatures(n_components=32, random_state=0)
    z = x.copy()
    z[3] = 0.0
    est.fit(z)  # the default skeleton maps an all-zero row to the uniform direction
    text = open(AUTO).read().replace("base: circle, scale: $scale", "base: categorical, categories: 3")
    with pytest.raises(ValueError, match="row 0"):
        SkeletonFeatures(text, n_components=8, random_state=0).fit(x)
    with pytest.raises(ValueError, match="dtype must be one of"):
        SkeletonFeatures(dtype="float16").fit(x)
    with pytest.raises(ValueError, match="n_components must be a positive integer"):
        SkeletonFeatures(n_components=0).fit(x)


def test_clone_params_pipeline_gridsearch_and_joblib(tmp_path):
    import joblib
    from sklearn.base import clone
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    x = rng.standard_normal((120, 5))
    y = (np.sin(2 * x[:, 0]) + x[:, 1] ** 2 > 0.6).astype(int)
    est = SkeletonFeatures(AUTO, n_components=128, random_state=0)
    c = clone(est)
    assert c.get_params() == est.get_params() and not hasattr(c, "features_")
    c.set_params(n_components=64, scheme="rfs")
    assert c.n_components == 64
    pipe = Pipeline([("scale", StandardScaler()), ("rf", est), ("lr", LogisticRegression(max_iter=500))])
    # n_jobs=2 runs the fits in worker processes (loky), so the estimator and the
    # skeleton travel by pickle; then the best pipeline is refitted here.
    grid = GridSearchCV(pipe, {"rf__n_components": [64, 256]}, cv=2, n_jobs=2).fit(x, y)
    assert grid.best_score_ > 0.6
    p = tmp_path / "model.joblib"
    joblib.dump(grid.best_estimator_, p)
    again = joblib.load(p)
    assert np.array_equal(again.predict_proba(x), grid.best_estimator_.predict_proba(x))
    fitted = grid.best_estimator_.named_steps["rf"]
    back = pickle.loads(pickle.dumps(fitted))
    assert back.transform(x).tobytes() == fitted.transform(x).tobytes()


def test_unbound_skeleton_refuses_sampling_and_structures_that_need_a_width(tmp_path):
    skel = rfsgen.load_skeleton(AUTO)
    assert not skel.bound and skel.describe()["width"] == "auto"
    with pytest.raises(SkeletonError, match="width: auto.*bind it first"):
        rfsgen.sample(skel, 10)
    assert skel.bind(3).width == 3 and len(skel.bind(3).input_nodes) == 3
    base = "rfsgen: 1\ninput: {width: auto}\nnodes:\n"
    bad = {
        '  - {name: x, base: circle, per: column, columns: "0:3"}\n  - {name: o, activation: relu, inputs: [x]}\n':
            r"picks columns .*needs a fixed width",
        "  - {name: x, base: sphere, per: pixel}\n  - {name: o, activation: relu, dense: true}\n":
            r"'per: pixel'.*needs an image shape",
        '  - {name: x, base: circle, per: column}\n  - {name: o, activation: relu, inputs: ["x[0]"]}\n':
            r"refers to 'x\[0\]'.*cannot index",
    }
    for body, msg in bad.items():
        with pytest.raises(SkeletonError, match=msg):
            rfsgen.parse_skeleton(base + body, "t.yaml")
    grouped = rfsgen.parse_skeleton(base + "  - {name: x, base: sphere, per: group, group: 3}\n"
                                          "  - {name: o, activation: relu, dense: true}\n", "g.yaml")
    assert grouped.bind(9).describe()["input_nodes"] == 3
    with pytest.raises(SkeletonError, match="10 columns do not split into groups of 3"):
        grouped.bind(10)


def test_width_auto_feature_file_round_trip(tmp_path):
    from rfsgen.features import load, save

    fs = rfsgen.sample(rfsgen.load_skeleton(AUTO).bind(4), 50, seed=2)
    save(fs, tmp_path / "f.h5")
    again = load(tmp_path / "f.h5")
    assert again.skeleton.auto and again.skeleton.width == 4
    x = _rows(width=4)
    assert rfsgen.transform(again, x, layout="dense").tobytes() == rfsgen.transform(fs, x, layout="dense").tobytes()
    # The kernel binds a width-auto skeleton to the rows it is given.
    k = rfsgen.kernel(rfsgen.load_skeleton(AUTO), x)
    assert k.shape == (50, 50) and np.allclose(np.diag(k), 1.0)


def test_the_core_imports_no_optional_extra():
    """The adapters sit above the core: using the core loads neither scikit-learn,
    anndata, pandas nor dask."""
    import subprocess
    import sys

    code = """
import sys, numpy as np, scipy.sparse as sp
import rfsgen, rfsgen.cli, rfsgen.approx, rfsgen.h5ad, rfsgen.inputs, rfsgen.atomic, rfsgen.output, rfsgen.kernel, rfsgen.schemes
s = rfsgen.load_skeleton(sys.argv[1])
x = np.random.default_rng(0).standard_normal((5, 3))
rfsgen.transform(rfsgen.sample(s.bind(3), 16, seed=0), sp.csr_matrix(x))
rfsgen.kernel(s, x)
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'anndata', 'pandas', 'dask', 'distributed'))
print(bad)
"""
    res = subprocess.run([sys.executable, "-c", code, AUTO], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stdout


def test_issue_skeleton_features_take_a_shipped_skeletons_name(tmp_path, monkeypatch):
    """`SkeletonFeatures("cifar-patches")`: the name, not a repository path (issue 27)."""
    from rfsgen.sklearn import resolve_skeleton

    monkeypatch.chdir(tmp_path)
    s = resolve_skeleton("cifar-patches")
    assert s.shape == (24, 24, 3) and s.path == "cifar-patches"
    x = _rows(width=3)
    by_name = SkeletonFeatures("tabular-auto", n_components=40, random_state=2).fit_transform(x)
    by_path = SkeletonFeatures(AUTO, n_components=40, random_state=2).fit_transform(x)
    assert by_name.tobytes() == by_path.tobytes()
    with pytest.raises(SkeletonError, match=r"^tabular-autoo: no such skeleton file or shipped skeleton; .* "
                                            r"categorical-poly, cifar-deep, .*tabular-auto"):
        SkeletonFeatures("tabular-autoo").fit(x)


def test_the_module_example_uses_a_shipped_name():
    import rfsgen.sklearn as mod

    assert 'SkeletonFeatures("tabular-auto"' in mod.__doc__ and "skeletons/" not in mod.__doc__

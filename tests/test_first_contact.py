"""A newcomer's first contact (issue 42): bare ``rfsgen``, defaults that work, plain RFF by
name (``rbf``, ``laplace``), short reprs, no cluster unless asked, text delimiters,
install hints that work, ``--threads``, and the smaller rough edges."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rfsgen
from rfsgen._compiled import threads as _threads
from rfsgen.cli import main


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def _one_line_error(res, code):
    assert res.exit_code == code, (res.exit_code, res.stderr)
    assert res.stderr.startswith("rfsgen: error: ") and res.stderr.count("\n") == 1, res.stderr
    return res.stderr


# ----------------------------------------------------------------------------- 1. bare rfsgen
def test_bare_rfsgen_shows_usage_and_the_commands_as_click_does():
    res = CliRunner().invoke(main, [], prog_name="rfsgen")
    assert res.exit_code == 2
    assert res.stderr.startswith("Usage: rfsgen [OPTIONS] COMMAND [ARGS]...\n"), res.stderr
    assert "\nCommands:\n" in res.stderr and "  transform " in res.stderr and "\\n" not in res.stderr
    assert "rfsgen: error" not in res.stderr and res.stdout == ""


# ----------------------------------------------------------------------------- 3. rbf and laplace
def test_rbf_is_rbfsamplers_kernel_exactly():
    from sklearn.metrics.pairwise import laplacian_kernel, rbf_kernel

    x = np.random.default_rng(0).standard_normal((30, 5))
    for gamma in (0.1, 1.0, 2.5):
        skel = rfsgen.load_skeleton("rbf", params={"gamma": gamma})
        np.testing.assert_allclose(rfsgen.kernel(skel, x), rbf_kernel(x, gamma=gamma), rtol=1e-13, atol=1e-300)
    skel = rfsgen.load_skeleton("laplace", params={"scale": 0.3})
    np.testing.assert_allclose(rfsgen.kernel(skel, x), laplacian_kernel(x, gamma=0.3), rtol=1e-13, atol=1e-300)
    assert rfsgen.load_skeleton("rbf").params == (("gamma", 1.0),)  # RBFSampler's default


def test_rbf_features_estimate_the_kernel_and_the_one_liners_work(tmp_path):
    from sklearn.metrics.pairwise import rbf_kernel

    x = np.random.default_rng(1).standard_normal((40, 50))
    res = run(["sample", "rbf", "--width", 50, "--set", "gamma=0.01", "-n", 2048, "--seed", 3, "-o",
               tmp_path / "f.h5"])
    assert res.exit_code == 0, res.stderr
    fs = rfsgen.load_features(tmp_path / "f.h5")
    z = rfsgen.transform(fs, x, dtype="float64")
    assert isinstance(z, np.ndarray)  # dense: every column of a gaussian node is non-zero
    err = np.abs(z @ z.T - rbf_kernel(x, gamma=0.01))
    assert err.max() < 0.15 and err.mean() < 0.03, (err.max(), err.mean())
    from rfsgen.sklearn import SkeletonFeatures

    est = SkeletonFeatures("rbf", params={"gamma": 0.01}, n_components=2048, random_state=3).fit(x)
    assert est.transform(x).tobytes() == rfsgen.transform(fs, x).tobytes()


def test_gamma_and_scale_together_are_refused():
    text = "rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: x, base: gaussian, scale: 1.0, gamma: 0.5}\n"
    with pytest.raises(rfsgen.SkeletonError, match="give 'scale' or 'gamma', not both"):
        rfsgen.parse_skeleton(text, "g.yaml")
    same = rfsgen.parse_skeleton(text.replace("scale: 1.0, ", ""), "g.yaml")
    assert same.nodes[0].base.param("scale") == 1.0  # gamma 0.5 is scale 1


# ----------------------------------------------------------------------------- 2. defaults that work
def test_the_default_skeletonfeatures_learns_circles():
    from sklearn.datasets import make_circles
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from rfsgen.sklearn import SkeletonFeatures

    x, y = make_circles(n_samples=1000, noise=0.05, factor=0.5, random_state=0)
    xtr, xte, ytr, yte = train_test_split(x, y, random_state=0)
    model = make_pipeline(StandardScaler(), SkeletonFeatures(random_state=0), LogisticRegression(max_iter=1000))
    assert model.fit(xtr, ytr).score(xte, yte) >= 0.95
    est = model[1]
    assert est.skeleton_.path == "rbf" and est.skeleton_.params == (("gamma", 0.5),)  # 1 / n_features
    # Row normalisation is a choice: it maps both circles onto one, and the classes are lost.
    unit = make_pipeline(StandardScaler(), SkeletonFeatures(random_state=0, normalize=True),
                         LogisticRegression(max_iter=1000))
    assert unit.fit(xtr, ytr).score(xte, yte) < 0.7


def test_normalize_scales_rows_to_unit_length_first():
    from sklearn.preprocessing import normalize

    from rfsgen.sklearn import SkeletonFeatures

    x = np.random.default_rng(2).standard_normal((20, 4)) * 3
    est = SkeletonFeatures(n_components=64, random_state=1, normalize=True).fit(x)
    assert est.transform(x).tobytes() == rfsgen.transform(est.features_, normalize(x)).tobytes()
    np.testing.assert_allclose(est.transform(x * 7), est.transform(x), atol=1e-5)  # the rows' scale is gone
    with pytest.raises(ValueError, match="normalize must be True or False"):
        SkeletonFeatures(normalize="yes").fit(x)


def test_in_memory_transform_follows_the_commands_layout_choice(tmp_path):
    from rfsgen.output import auto_layout

    x = np.random.default_rng(3).standard_normal((6, 4))
    dense_fs = rfsgen.sample(rfsgen.load_skeleton("rbf").bind(4), 32, seed=0)
    sphere = rfsgen.parse_skeleton("rfsgen: 1\ninput: {width: 4}\nnodes:\n  - {name: x, base: sphere, scheme: "
                                   "coordinate}\n  - {name: out, activation: {name: polynomial, degree: 3}, inputs: [x]}"
                                   "\n", "p.yaml")
    sparse_fs = rfsgen.sample(sphere, 16, seed=0)
    assert (auto_layout(dense_fs), auto_layout(sparse_fs)) == ("dense", "csr")
    assert isinstance(rfsgen.transform(dense_fs, x), np.ndarray)
    assert rfsgen.transform(sparse_fs, x).format == "csr"
    assert rfsgen.transform(dense_fs, x, layout="csr").format == "csr"
    for fs, name in ((dense_fs, "d"), (sparse_fs, "s")):  # the command writes the same layout
        rfsgen.save_features(fs, tmp_path / f"{name}.h5")
        np.save(tmp_path / "x.npy", x)
        assert run(["transform", tmp_path / f"{name}.h5", tmp_path / "x.npy", "-o", tmp_path / f"{name}-out.h5",
                    "-q"]).exit_code == 0
        import h5py

        with h5py.File(tmp_path / f"{name}-out.h5") as f:
            assert isinstance(f["X"], h5py.Dataset) == (auto_layout(fs) == "dense")


# ----------------------------------------------------------------------------- 4. reprs
def test_reprs_are_one_short_line():
    skel = rfsgen.load_skeleton("cifar-deep")
    fs = rfsgen.sample(skel, 64, seed=1)
    for obj, parts in ((skel, ["'cifar-deep'", "width=1728", "nodes=646"]),
                       (fs, ["D=64", "scheme='rfs'", "seed=1", "'cifar-deep'"]),
                       (rfsgen.load_skeleton("tabular-auto"), ["width=auto", "scale=0.5"])):
        text = repr(obj)
        assert len(text) < 200 and "\n" not in text, text
        assert all(p in text for p in parts), text
    text = (Path(rfsgen.__file__).parent.parent / "skeletons" / "rbf.yaml").read_text()
    long = rfsgen.parse_skeleton(text, "/very/long/" * 10 + "x.yaml", params={"gamma": 0.125})
    assert len(repr(long)) < 200 and "gamma=0.125" in repr(long)


# ----------------------------------------------------------------------------- 5. no cluster unless asked
@pytest.fixture
def small(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save("x.npy", np.random.default_rng(0).standard_normal((9, 3)))
    assert run(["sample", "rbf", "--width", 3, "-n", 40, "-o", "f.h5", "-q"]).exit_code == 0
    return tmp_path


def test_dask_scheduler_address_alone_computes_here_and_says_so(small, monkeypatch):
    monkeypatch.delenv("RFSGEN_SCHEDULER", raising=False)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9")  # stale: nothing listens there
    res = run(["transform", "f.h5", "x.npy", "-o", "o.h5", "--threads", 1])
    assert res.exit_code == 0, res.stderr
    assert res.stderr.startswith("wrote 9 rows x 40 columns") and "computed here on 1 thread" in res.stderr
    assert "DASK_SCHEDULER_ADDRESS is not used" in res.stderr
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS")
    res = run(["transform", "f.h5", "x.npy", "-o", "p.h5"])
    assert res.exit_code == 0 and res.stderr.rstrip().endswith("computed here on "
                                                               f"{_threads()} thread"
                                                               + ("s" if _threads() > 1 else ""))


def test_rfsgen_scheduler_asks_for_the_cluster(small, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setenv("RFSGEN_SCHEDULER", "nowhere")  # asked for: used, and refused as an address
    msg = _one_line_error(run(["transform", "f.h5", "x.npy", "-o", "o.h5"]), 2)
    assert "not a Dask scheduler address" in msg and "RFSGEN_SCHEDULER" in msg
    assert not os.path.exists("o.h5")


# ----------------------------------------------------------------------------- 6. text delimiters and headers
@pytest.mark.parametrize("suffix", [".txt", ".csv", ".tsv"])
@pytest.mark.parametrize("sep, name", [(",", "comma"), ("\t", "tab"), ("  ", "whitespace")])
@pytest.mark.parametrize("header", [False, True])
def test_text_inputs_detect_delimiter_and_header_alike(tmp_path, suffix, sep, name, header):
    x = np.random.default_rng(4).standard_normal((5, 3))
    lines = ([sep.join(["a", "b", "c"])] if header else []) + [sep.join(f"{v:.17g}" for v in r) for r in x]
    p = tmp_path / f"rows{suffix}"  # the suffix is not trusted: a .csv may hold tabs, a .txt commas
    p.write_text("\n".join(lines) + "\n")
    from rfsgen.inputs import open_input

    with open_input(str(p)) as src:
        assert src.width == 3 and src.detected == f"{name}-separated, {'a' if header else 'no'} header line"
        assert np.array_equal(src.read(), x)


def test_text_errors_name_what_was_detected(tmp_path):
    (tmp_path / "c.txt").write_text("1.0,2.0,3.0\n4.0,5.0,6.0\n")
    res = run(["sample", "rbf", "--width", 2, "-n", 8, "-o", tmp_path / "f.h5", "-q"])
    assert res.exit_code == 0
    msg = _one_line_error(run(["transform", tmp_path / "f.h5", tmp_path / "c.txt", "-o", tmp_path / "o.h5"]), 2)
    assert "c.txt (read as comma-separated, no header line): rows have 3 values" in msg
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n3,x\n")
    with pytest.raises(rfsgen.DataError, match=r"bad.csv:3: column 1: 'x' is not a number \(read as "
                                               r"comma-separated, a header line\)"):
        rfsgen.transform(rfsgen.load_features(tmp_path / "f.h5"), str(tmp_path / "bad.csv"))


# ----------------------------------------------------------------------------- 8. install hints
def _without(module: str, code: str):
    """Run ``code`` in a child Python where importing ``module`` fails (sys.modules[...] = None)."""
    prog = f"import sys\nsys.modules[{module!r}] = None\n{code}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(rfsgen.__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=300)


def test_rfsgen_sklearn_without_scikit_learn_says_what_to_install():
    r = _without("sklearn", "from rfsgen.sklearn import SkeletonFeatures")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: rfsgen.sklearn needs scikit-learn"), r.stderr
    assert "pip install scikit-learn" in last and "pip install -e '.[sklearn]'" in last
    assert "rfsgen[" not in r.stderr


def test_plot_without_matplotlib_names_the_package(tmp_path):
    r = _without("matplotlib", "from rfsgen.approx import check_plotting\ncheck_plotting()")
    last = r.stderr.strip().splitlines()[-1]
    assert "pip install matplotlib (or, in a clone of rfsgen: pip install -e '.[plot]')" in last, r.stderr
    assert "rfsgen[" not in r.stderr


def test_no_hint_names_a_package_index_entry_that_does_not_exist():
    root = Path(rfsgen.__file__).parent
    for path in list(root.rglob("*.py")):
        assert "install 'rfsgen[" not in path.read_text(), path


# ----------------------------------------------------------------------------- 9. threads
def test_threads_give_the_same_bytes_and_are_checked(small):
    import numba

    top = numba.config.NUMBA_NUM_THREADS
    outs = []
    for n in sorted({1, min(2, top)}):  # the same names in a folder per run: outputs record their inputs' paths
        os.mkdir(f"t{n}")
        os.chdir(f"t{n}")
        try:
            assert run(["sample", "tabular-auto", "--width", 3, "-n", 300, "--seed", 2, "-o", "f.h5", "-q",
                        "--threads", n]).exit_code == 0
            assert run(["transform", "f.h5", "../x.npy", "-o", "o.h5", "-q", "--threads", n,
                        "--chunk-rows", 4]).exit_code == 0
            assert run(["kernel", "tabular-auto", "../x.npy", "-o", "k.npy", "-q", "--threads", n]).exit_code == 0
            outs.append([open(k, "rb").read() for k in ("f.h5", "o.h5", "k.npy")])
        finally:
            os.chdir("..")
    assert len(outs) == 2 and outs[0] == outs[1]
    assert numba.get_num_threads() == top  # set for the command only
    for bad in (0, top + 1):
        msg = _one_line_error(run(["transform", "f.h5", "x.npy", "-o", "z.h5", "--threads", bad]), 2)
        assert f"Invalid value for '--threads': {bad}; give 1 to {top}" in msg
    for cmd in ("sample", "select", "transform", "merge", "kernel", "approx"):
        assert "--threads N" in run([cmd, "--help"]).output, cmd


def test_library_threads_check():
    from rfsgen._threads import check, using

    assert check(1) == 1
    with pytest.raises(rfsgen.UsageError, match="threads is 0; give 1 to"):
        check(0)
    with pytest.raises(rfsgen.UsageError, match="whole number"):
        check(1.5)
    with using(1) as n:
        assert n == 1 and _threads() == 1


# ----------------------------------------------------------------------------- 10. smaller
def test_kernel_says_what_it_wrote(small):
    res = run(["kernel", "rbf", "x.npy", "-o", "K.npy"])
    assert res.exit_code == 0 and res.stderr == "wrote the 9 x 9 kernel matrix (float64 .npy) to K.npy\n"
    assert run(["kernel", "rbf", "x.npy", "-o", "K2.npy", "-q"]).stderr == ""


def test_progress_counts_are_whole_numbers(monkeypatch, capsys):
    from rfsgen.cli import _Progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with _Progress(400, "rows", False, "transform") as bar:
        bar(35)
        bar.bar.refresh()
    err = capsys.readouterr().err
    assert "35/400" in err and "35.0" not in err, err

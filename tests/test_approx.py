import json
import math
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DATA, ROOT, skeleton_path
from rfsgen import UsageError, kernel, load_skeleton
from rfsgen.approx import measures, parse_budgets
from rfsgen.cli import main
from rfsgen.sampler import sample
from rfsgen.schemes import apply_scheme, rr_nodes
from rfsgen.transform import transform


def test_measures_by_hand():
    exact = np.array([[1.0, 0.5], [0.5, 1.0]])
    est = np.array([[1.1, 0.3], [0.3, 1.0]])
    m = measures(exact, est)
    # errors: 0.1, -0.2, -0.2, 0 -> mean |e| = 0.125, RMS = sqrt(0.09/4) = 0.15, max 0.2
    assert m["mae"] == pytest.approx(0.125)
    assert m["rmse"] == pytest.approx(0.15)
    assert m["max_abs"] == pytest.approx(0.2)
    # Pearson of (1, .5, .5, 1) and (1.1, .3, .3, 1): by hand
    a, b = np.array([1.1, 0.3, 0.3, 1.0]), np.array([1, 0.5, 0.5, 1])
    r = ((a - a.mean()) * (b - b.mean())).sum() / math.sqrt(((a - a.mean()) ** 2).sum() * ((b - b.mean()) ** 2).sum())
    assert m["corr"] == pytest.approx(r)


def test_budget_parsing():
    assert parse_budgets("2^8..2^10") == [256, 512, 1024]
    assert parse_budgets("100,300") == [100, 300]
    with pytest.raises(UsageError):
        parse_budgets("lots")


def test_rr_rewrite_keeps_the_kernel(cifar_rows):
    for name, n_targets in (("shallow-gaussian", 1), ("cifar-deep", 100)):
        s = load_skeleton(skeleton_path(name))
        assert len(rr_nodes(s)) == n_targets
        for scheme in ("rr", "orf"):
            np.testing.assert_allclose(kernel(apply_scheme(s, scheme), cifar_rows[:6]), kernel(s, cifar_rows[:6]), atol=1e-13)
    with pytest.raises(UsageError, match="scheme 'rr' applies to no node"):
        apply_scheme(load_skeleton(skeleton_path("tabular-circle")), "rr")


def test_rr_on_shallow_is_rahimi_recht():
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    fs = sample(s, 300, seed=1, scheme="rr")
    assert fs.draws == 300 and np.all(fs.count == 1) and np.all(np.diff(fs.ptr) == 1)
    orf = sample(s, 300, seed=1, scheme="orf")
    assert orf.draws == 300 and np.array_equal(orf.kind, np.tile([1, 2], 150))  # [cos, sin] per frequency
    assert fs.omega.size == 300 * 1728  # one N(0, I) frequency over the whole normalized row per column
    assert np.all(fs.kind > 0)


@pytest.mark.slow
def test_rr_and_orf_unbiased_and_orf_has_lower_variance(cifar_rows):
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    x = cifar_rows[:12]
    exact = kernel(s, x)
    off = ~np.eye(12, dtype=bool)
    spread = {}
    for scheme in ("rr", "orf"):
        g = np.array([(lambda p: p @ p.T)(transform(sample(s, 512, seed=k, scheme=scheme), x, layout="dense", dtype="float64"))
                      for k in range(40)])
        mean, se = g.mean(0), g.std(0, ddof=1) / math.sqrt(len(g))
        assert np.all(np.abs(mean - exact)[off] <= 4 * se[off] + 1e-12), scheme
        spread[scheme] = np.mean((g - exact) ** 2)
    assert spread["orf"] < spread["rr"], spread


def test_approx_cli_json(tmp_path, cifar_rows):
    np.save(tmp_path / "rows.npy", cifar_rows[:20])
    res = CliRunner().invoke(main, ["approx", skeleton_path("shallow-gaussian"), str(tmp_path / "rows.npy"), "-n", "64,128",
                                    "--trials", "2", "--subset", "10", "--scheme", "rfs", "--scheme", "rr", "--json", "-q"])
    assert res.exit_code == 0, res.stderr
    recs = json.loads(res.stdout)
    assert len(recs) == 4
    for r in recs:
        for k in ("scheme", "features", "trials", "rows", "mae", "rmse", "max_abs", "corr", "draws",
                  "mae_std", "rmse_std", "max_abs_std", "corr_std"):
            assert k in r
        assert r["trials"] == 2 and r["rows"] == 10 and 0 < r["mae"] <= r["rmse"] <= r["max_abs"]
    res = CliRunner().invoke(main, ["approx", skeleton_path("shallow-gaussian"), str(tmp_path / "rows.npy"), "-n", "64",
                                    "--subset", "50"])
    assert res.exit_code == 2 and "--subset 50 is more than the 20 rows" in res.stderr


def test_reproduction_runs_on_a_small_configuration(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "reproduce"))
    import figure3

    rc = figure3.main(["--data", str(DATA / "cifar10_test_0-63.npy"), "--out", str(tmp_path), "--trials", "2",
                       "--rows", "32", "--budgets", "256,512", "--no-plot"])
    assert rc == 0
    out = json.loads((tmp_path / "figure3.json").read_text())
    assert {r["scheme"] for r in out["shallow-gaussian"]} == {"rfs", "strat", "exact", "rr", "orf"}
    assert {r["scheme"] for r in out["cifar-deep"]} == {"rfs", "strat", "exact", "rr"}
    assert figure3.main(["--data", str(tmp_path / "missing.npy"), "--out", str(tmp_path)]) == 2


def test_approx_plot_without_matplotlib_fails_before_computing(tmp_path, cifar_rows, monkeypatch):
    import sys

    import rfsgen.approx

    np.save(tmp_path / "rows.npy", cifar_rows[:20])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    monkeypatch.setattr(rfsgen.approx, "approx", lambda *a, **k: pytest.fail("computed before checking --plot"))
    res = CliRunner().invoke(main, ["approx", skeleton_path("shallow-gaussian"), str(tmp_path / "rows.npy"), "-n", "64",
                                    "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 2 and "--plot needs matplotlib" in res.stderr


def test_approx_rows_is_a_range_like_everywhere(tmp_path, cifar_rows):
    np.save(tmp_path / "rows.npy", cifar_rows[:20])
    args = ["approx", skeleton_path("shallow-gaussian"), str(tmp_path / "rows.npy"), "-n", "64", "--trials", "1",
            "--subset", "5", "--json", "-q"]
    res = CliRunner().invoke(main, args + ["--rows", "10:20"])
    assert res.exit_code == 0, res.stderr
    res = CliRunner().invoke(main, args + ["--rows", "10:30"])
    assert res.exit_code == 2 and "has 20 rows" in res.stderr


def test_orf_blocks_hold_whole_orthogonal_sets():
    """The sampler's blocks hold d frequencies per orthogonal set (cos and sin each): the
    first d frequencies of an orf sample are mutually orthogonal."""
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    fs = sample(s, 2 * 1728, seed=3, scheme="orf")
    d = 1728
    om = fs.omega.reshape(-1, d)[::2][:d]  # one row per frequency ([cos, sin] share it)
    assert om.shape == (d, d)
    u = om / np.linalg.norm(om, axis=1, keepdims=True)
    g = u @ u.T
    assert np.abs(g - np.eye(d)).max() < 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("name, D, rows", [("shallow-gaussian", 1024, 12), ("cifar-deep", 1024, 12)])
def test_strat_is_unbiased_with_lower_error_than_rfs(name, D, rows, cifar_rows):
    """Over 40 seeds: strat's mean estimate is within 4 standard errors of the exact
    kernel, and its mean squared error is below 0.8 x rfs's (measured: about 0.3-0.5 x on
    shallow-gaussian, 0.6-0.7 x on cifar-deep at D = 1024)."""
    s = load_skeleton(skeleton_path(name))
    x = cifar_rows[:rows]
    exact = kernel(s, x)
    off = ~np.eye(rows, dtype=bool)
    err = {}
    for scheme in ("rfs", "strat"):
        g = np.array([(lambda p: p @ p.T)(transform(sample(s, D, seed=k, scheme=scheme), x, layout="dense",
                                                    dtype="float64")) for k in range(40)])
        if scheme == "strat":
            mean, se = g.mean(0), g.std(0, ddof=1) / math.sqrt(len(g))
            assert np.all(np.abs(mean - exact)[off] <= 4 * se[off] + 1e-12)
        err[scheme] = np.mean((g - exact)[:, off] ** 2)
    assert err["strat"] < 0.8 * err["rfs"], err


# ----------------------------------------------------------------------------- --plot paths (issue 23, item 11)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_RECORDS = [{"scheme": "rfs", "features": 64, "draws": 70.0, "dedup_ratio": 1.1, "trials": 1, "rows": 5,
             **{k: 0.1 for k in ("mae", "rmse", "max_abs", "corr")},
             **{k + "_std": 0.01 for k in ("mae", "rmse", "max_abs", "corr")}}]


@pytest.fixture
def no_compute(monkeypatch):
    """approx() replaced by canned records; ``calls`` counts how often it ran."""
    import rfsgen.approx

    calls = []
    monkeypatch.setattr(rfsgen.approx, "approx", lambda *a, **k: calls.append(1) or _RECORDS)
    return calls


def _approx_args(tmp_path, cifar_rows, plot, *extra):
    rows = tmp_path / "rows.npy"
    if not rows.exists():
        np.save(rows, cifar_rows[:8])
    return ["approx", skeleton_path("shallow-gaussian"), str(rows), "-n", "64", "--trials", "1", "--subset", "5",
            "-q", "--plot", str(plot), *extra]


@pytest.mark.parametrize("name, overwrite, code, message", [
    ("fig.xyz", False, 2, r"'\.xyz' is not an image format matplotlib writes; end the name with one of .*\.png"),
    ("fig", False, 2, "the file name has no extension"),
    ("fig.pgf", False, 2, "'.pgf' is not an image format"),
    ("{skeleton}", True, 2, "is also an input of this command"),
    ("{rows}", True, 2, "is also an input of this command"),
    ("{old}", False, 2, "already exists; pass --overwrite"),
    ("missing/fig.png", False, 1, "directory .*missing does not exist"),
    ("{dir}", True, 1, "is a directory; give a file name"),
])
def test_issue_plot_paths_are_checked_before_computing(tmp_path, cifar_rows, no_compute, name, overwrite, code,
                                                       message):
    """`--plot fig.xyz` used to fail with a traceback after the whole computation, and
    `--plot` naming the skeleton with --overwrite with another: now one line, before."""
    import shutil

    skel = tmp_path / "s.yaml"
    shutil.copy(skeleton_path("shallow-gaussian"), skel)
    (tmp_path / "adir").mkdir()
    (tmp_path / "old.png").write_bytes(b"old")
    plot = name.format(skeleton=skel, rows=tmp_path / "rows.npy", dir=tmp_path / "adir", old=tmp_path / "old.png")
    plot = plot if plot.startswith("/") else str(tmp_path / plot)
    args = _approx_args(tmp_path, cifar_rows, plot, *(["--overwrite"] if overwrite else []))
    args[1] = str(skel)
    before = skel.read_bytes()
    res = CliRunner().invoke(main, args)
    assert res.exit_code == code and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("rfsgen: error: ")
    import re

    assert re.search(message, res.stderr), res.stderr
    assert no_compute == [] and skel.read_bytes() == before and (tmp_path / "old.png").read_bytes() == b"old"
    assert not list(tmp_path.glob(".*.part"))


@settings(max_examples=15, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(ext=st.sampled_from(["png", "PNG", "pdf", "svg", "jpg", "xyz", "", "h5", "png.bak", "pgf", "eps"]),
       stem=st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=8),
       where=st.sampled_from(["new", "exists", "exists+overwrite", "missing-dir"]))
def test_generated_plot_paths_fail_before_computing_or_write_the_figure(tmp_path_factory, cifar_rows, monkeypatch,
                                                                         ext, stem, where):
    import rfsgen.approx

    calls = []
    monkeypatch.setattr(rfsgen.approx, "approx", lambda *a, **k: calls.append(1) or _RECORDS)
    d = tmp_path_factory.mktemp("plot")
    name = stem + ("." + ext if ext else "")
    plot = d / ("missing" if where == "missing-dir" else ".") / name
    if where.startswith("exists"):
        plot.write_bytes(b"old")
    res = CliRunner().invoke(main, _approx_args(d, cifar_rows, plot, *(["--overwrite"] if "overwrite" in where else [])))
    fine = ext.lower() in ("png", "pdf", "svg", "jpg", "eps") and where in ("new", "exists+overwrite")
    if fine:
        assert res.exit_code == 0 and calls == [1] and plot.stat().st_size > 100, res.stderr
    else:
        assert res.exit_code in (1, 2) and calls == [] and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not plot.exists() or plot.read_bytes() == b"old"
    assert not list(d.glob(".*.part"))


def test_budgets_repeated_n_is_a_sweep():
    """-n 1024 -n 4096 once kept only the last -n: now every -n, in order, each once."""
    assert parse_budgets(("1024", "4096")) == [1024, 4096]
    assert parse_budgets(("64,128", "2^7..2^8", "32")) == [64, 128, 256, 32]
    with pytest.raises(UsageError, match="-n 'x' must be a list"):
        parse_budgets(("64", "x"))


def test_approx_cli_repeated_n_gives_one_row_per_budget(tmp_path, cifar_rows):
    np.save(tmp_path / "rows.npy", cifar_rows[:12])
    res = CliRunner().invoke(main, ["approx", skeleton_path("shallow-gaussian"), str(tmp_path / "rows.npy"), "-n", "16",
                                    "-n", "32", "--trials", "1", "--subset", "6", "--json", "-q"])
    assert res.exit_code == 0, res.stderr
    assert [r["features"] for r in json.loads(res.stdout)] == [16, 32]

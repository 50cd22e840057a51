"""tests/reproduce/eof.py (the seed 002's experiment) on tiny data, so that it cannot rot:
it runs, writes the error table, Table 2, the JSON and the figure, and skips LKRF / EERF
with a note where rfsgen has no ``select``."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import rfsgen

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(ROOT / "tests" / "reproduce"))
    try:
        import importlib

        yield importlib.import_module("eof")
    finally:
        sys.path.remove(str(ROOT / "tests" / "reproduce"))


def test_eof_experiment_runs_on_tiny_data(tmp_path, script, capsys):
    pytest.importorskip("matplotlib")
    rc = script.main(["--datasets", "synthetic-energy,synthetic-grid", "--runs", "2", "--budgets", "8,12",
                      "--max-train", "80", "--max-test", "40", "--out", str(tmp_path), "--data", str(tmp_path / "none")])
    assert rc == 0
    printed = capsys.readouterr().out
    table = (tmp_path / "eof-table2.md").read_text()
    assert "| synthetic-energy | regression | 8 |" in table and "| synthetic-grid | classification | 12 |" in table
    assert "nnz(Z) train" in table and "training time (s)" in table
    png = (tmp_path / "eof-figure3.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out = json.loads((tmp_path / "eof.json").read_text())
    methods = {r["method"] for r in out["summary"]}
    want = {"RKS", "ORF", "LKRF", "EERF", "EOF"} | ({"EOF-free"} if script.has_free_boundary() else set())
    assert methods == want, methods
    assert {r["protocol"] for r in out["summary"]} == {"rule", "rule-k", "tuned"}
    assert "### Side by side" in table and "RKS tuned" in table and "tuned EOF <= tuned RKS" in table
    for r in out["summary"]:
        assert r["runs"] == 2 and 0 <= r["error_mean"] < 1, r
        # EOF's matrix is sparse (at most one feature per level vector and row); the others are dense
        assert (r["nnz"] < 80 * r["columns"]) if r["method"].startswith("EOF") else (r["nnz"] == 80 * r["columns"])
    # Tuned: each run records the candidate the validation split chose, from the stated grid
    for r in out["runs_detail"]:
        if r["protocol"] == "tuned" and r["method"] in ("RKS", "ORF"):
            assert r["chosen"] in {f"x{m:g}" for m in script.MULTIPLIERS}, r
        if r["protocol"] == "tuned" and r["method"].startswith("EOF"):
            assert r["chosen"] in {f"x{m:g}, margin {g:g}" for m in script.EOF_MULTIPLIERS for g in script.MARGINS}
        if r["protocol"] == "tuned" and r["method"] in ("LKRF", "EERF"):  # over the pool at tuned RKS's scale
            rks = next(q for q in out["runs_detail"] if q["protocol"] == "tuned" and q["method"] == "RKS"
                       and q["D"] == r["D"] and q["seed"] == r["seed"] and q["dataset"] == r["dataset"])
            assert r["chosen"] == rks["chosen"], (r, rks)


def test_tuning_picks_the_scale_with_the_least_validation_error(script):
    """learn_tuned chooses the candidate (and ridge) on the validation split: given a
    feature matrix that carries the target and one of noise, it picks the first."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 5))
    y = x @ rng.standard_normal(5)
    good, bad = x, rng.standard_normal((300, 5))
    err, _, label = script.learn_tuned([("noise", bad[:200], bad[200:]), ("signal", good[:200], good[200:])],
                                       y[:200], y[200:], "regression", 0)
    assert label == "signal" and err < 0.01 * np.std(y)
    assert script.nn_distance(np.arange(10.0)[:, None], "euclidean", k=3) == pytest.approx(2.2)  # (3 at both ends, 2 inside)


def test_eof_experiment_says_how_to_get_missing_fashion_mnist(tmp_path, script, capsys):
    assert script.main(["--datasets", "fashion-mnist-32", "--data", str(tmp_path), "--out", str(tmp_path),
                        "--no-plot"]) == 2
    out = capsys.readouterr()
    assert "skipping fashion-mnist-32" in out.out and "zalandoresearch/fashion-mnist" in out.out
    assert "no data set to run" in out.err


def test_eof_experiment_calls_select_in_its_documented_form(tmp_path, script, monkeypatch):
    """LKRF and EERF call ``rfsgen.select(pool, X, y, D, method=..., seed=s)`` with a pool of
    10 D laplace columns and the training rows (here a stand-in select that ignores the pool)."""
    calls = []

    def select(pool, x, y, D, *, method, seed):
        calls.append((pool.columns, x.shape, y.shape, D, method, seed))
        return rfsgen.sample(pool.skeleton, D, seed=seed)

    monkeypatch.setattr(rfsgen, "select", select, raising=False)
    assert script.main(["--datasets", "synthetic-energy", "--runs", "1", "--budgets", "6", "--max-train", "50",
                        "--max-test", "20", "--out", str(tmp_path), "--no-plot", "--protocols", "rule"]) == 0
    assert sorted(calls) == [(60, (50, 8), (50,), 6, "eerf", 0), (60, (50, 8), (50,), 6, "lkrf", 0)]
    rows = json.loads((tmp_path / "eof.json").read_text())["summary"]
    assert {r["method"]: r["pool"] for r in rows if r["method"] != "EOF-free"} == {
        "RKS": None, "ORF": None, "LKRF": 60, "EERF": 60, "EOF": None}

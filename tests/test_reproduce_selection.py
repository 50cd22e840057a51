"""tests/reproduce/selection_redundancy.py (the redundancy-aware selection experiment in
docs/selection.md) on tiny stand-in data, so that it cannot rot: every method runs, the JSON
is written, and ``--check`` confirms that ``rfsgen.select(method="greedy")`` keeps the
script's columns."""

import gzip
import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(ROOT / "tests" / "reproduce"))
    try:
        yield importlib.import_module("selection_redundancy")
    finally:
        sys.path.remove(str(ROOT / "tests" / "reproduce"))


def _idx(path: Path, a: np.ndarray):
    head = bytes([0, 0, 8, a.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in a.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + a.astype(np.uint8).tobytes())


def test_selection_experiment_runs_on_tiny_data(tmp_path, script, capsys):
    rng = np.random.default_rng(0)
    d = tmp_path / "fashion-mnist"
    d.mkdir()
    for name, n in (("train", 80), ("t10k", 40)):
        y = np.arange(n) % 10
        x = rng.integers(0, 60, (n, 28, 28)) + 15 * y[:, None, None]  # classes differ in brightness
        _idx(d / f"{name}-images-idx3-ubyte.gz", x)
        _idx(d / f"{name}-labels-idx1-ubyte.gz", y)
    out = tmp_path / "out.json"
    script.main(["--data", str(tmp_path), "--D", "8", "--train", "80", "--test", "40", "--seeds", "0,1",
                 "--methods", "plain,random,corr,greedy,pivoted-cholesky,leverage,leverage-top", "--check",
                 "--out", str(out)])
    printed = capsys.readouterr().out
    assert "check: rfsgen.select(method='greedy') keeps the same columns: True" in printed
    res = json.loads(out.read_text())["results"]
    assert [r["seed"] for r in res] == [0, 1] and all(r["pool"] == 80 for r in res)
    want = {"plain", "random", "corr", "greedy lam=0.001", "greedy lam=0.1", "pivoted-cholesky", "leverage top",
            "leverage sample"}
    for r in res:
        assert set(r["accuracy"]) == want and all(0 <= v <= 1 for v in r["accuracy"].values())
    assert "greedy lam=0.1" in printed and "diff vs plain" in printed


def test_greedy_of_the_script_is_forward_selection(script):
    """Two copies of one column and a second, independent one: after a copy the other adds
    nothing, so the second pick is the independent column."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 200))
    zs = np.column_stack([a, a, b])
    zs = (zs - zs.mean(axis=0)) / zs.std(axis=0)
    y = zs[:, [0]] + 0.6 * zs[:, [2]]
    y -= y.mean()
    assert script.greedy(zs.T @ zs, zs.T @ y, 2, 0.1 * 200).tolist() == [0, 2]

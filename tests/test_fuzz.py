"""The fuzz suite in ``make test``: the regression corpus and a bounded random budget.

Both run ``tests/fuzz/run.py`` (real CLI processes under a memory cap and a time limit; see
tests/fuzz/harness.py for the oracle) once per module and check each case's verdict.
``make fuzz`` runs the long budget.

* ``test_regression[NAME]``: every case in tests/fuzz/regressions/ (the issue's examples and every
  failure the fuzzer ever found, minimised) must pass.  Those still failing today are listed in
  ``KNOWN`` with the issue item that fixes them and are strict xfails: when a fix lands its cases
  XPASS, which fails the test run until their ``KNOWN`` lines are deleted.
* ``test_bounded_budget``: a fixed-seed random budget must find nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FUZZ = HERE / "fuzz"
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # tests.fuzz is imported from the repository root
    sys.path.insert(0, str(ROOT))

from tests.fuzz import harness  # noqa: E402
REGRESSIONS = sorted((FUZZ / "regressions").glob("*.json"))

#: Seconds a case may run before the harness calls it a hang: only a hang detector, so generous
#: (cases take a second or two alone, several times that on a loaded 2-core machine); no test
#: fails because a machine is slow (issue 37, item 11).
HANG = "120"
#: The bounded budget: cheap kinds, fixed seed, forked runs (no interpreter start-up per case).
BUDGET = ["--cases", "60", "--seed", "2026", "--kinds", "skeletons,rows,features,shards", "--time-limit", HANG]

#: The bounded budget of issue 37's surfaces (expressions, labels, domains, EOF, --obsm, the
#: memory budget, exact counts): two cases a kind on average, every kind at least once (seed 2034).
BUDGET_37 = ["--cases", "14", "--seed", "2034", "--kinds", "expressions,labels,domains,eof,obsm,budget,exact",
             "--time-limit", HANG]

#: Regression cases that fail against today's code, by the issue item whose fix makes them pass
#: (strict xfails: when a fix lands the case XPASSes, which fails the run until its line is
#: deleted).  Empty: every case of issue 23 and every failure found since passes.  A signal
#: case whose signal lands inside the interpreter's own start-up, before rfsgen's first
#: line, is judged "startup" (docs/reliability.md, Signals) and accepted.
KNOWN: dict[str, str] = {}


def _marks(name):
    if name in KNOWN:
        return [pytest.mark.xfail(strict=True, reason=KNOWN[name])]
    return []


def _run(args, out: Path, cache: Path) -> dict:
    cmd = [sys.executable, str(FUZZ / "run.py"), *args, "--out", str(out), "--cache", str(cache), "--mode", "fork",
           "--no-minimise", "--jobs", "2"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    results_file = out / "results.json"
    assert results_file.exists(), f"fuzz runner failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
    summary = (out / "summary.md").read_text()
    return {"by_id": {r["id"]: r for r in json.loads(results_file.read_text())}, "summary": summary}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-cache")


@pytest.fixture(scope="module")
def regressions(tmp_path_factory, cache):
    # HANG: the slowest legitimate refusal (a sampler projecting that -n cannot be reached)
    # takes about 6 s alone and more beside the rest of the suite on two cores.
    return _run(["--replay", str(FUZZ / "regressions"), "--time-limit", HANG], tmp_path_factory.mktemp("fuzz-reg"),
                cache)


@pytest.fixture(scope="module")
def budget(tmp_path_factory, cache):
    return _run(BUDGET, tmp_path_factory.mktemp("fuzz-budget"), cache)


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=_marks(p.stem)) for p in REGRESSIONS])
def test_regression(path, regressions):
    r = regressions["by_id"][path.stem]
    # startup: a signal inside the interpreter's own start-up, before rfsgen's first line (docs/reliability.md, Signals)
    assert r["class"] in ("passed", "startup"), \
        f"{r['class']}: {r['detail']} (replay: python tests/fuzz/run.py --replay {path})"


def test_every_known_failure_is_in_the_corpus():
    names = {p.stem for p in REGRESSIONS}
    assert set(KNOWN) <= names


def _no_failures(budget, args):
    failures = [r for r in budget["by_id"].values() if r["class"] != "passed"]
    shown = "\n".join(f"  {r['id']}: {r['class']}: {r['detail'][:160]}" for r in failures[:20])
    assert not failures, f"\n{budget['summary']}\nfirst failures (replay with tests/fuzz/run.py --only ID " \
                         f"{' '.join(args[:6])}):\n{shown}"


def test_bounded_budget(budget):
    _no_failures(budget, BUDGET)


@pytest.fixture(scope="module")
def budget_37(tmp_path_factory, cache):
    return _run(BUDGET_37, tmp_path_factory.mktemp("fuzz-budget-37"), cache)


def test_bounded_budget_issue_37(budget_37):
    _no_failures(budget_37, BUDGET_37)


# ----------------------------------------------------------------------------- the oracle itself
def _case(**kw):
    c = {"kind": "rows", "id": "t", "files": {}, "ops": [], "argv": ["kernel"], "output": "K.npy", "check": {}}
    c.update(kw)
    return c


def _res(rc=0, stderr="", **kw):
    r = {"rc": rc, "stderr": stderr, "elapsed": 0.1, "timed_out": False, "signal_sent": False, "sent_at": None,
         "maxrss": 100 << 20, "stdout_bytes": 0}
    r.update(kw)
    return r


@pytest.fixture
def cfg(tmp_path):
    return harness.Config(tmp_path, time_limit=5, memory_limit=3 << 30)


def test_oracle_accepts_one_error_line(tmp_path, cfg):
    assert harness.judge(_case(), tmp_path, _res(2, "rfsgen: error: x.npy: bad; fix it\n"), cfg)[0] == "passed"


@pytest.mark.parametrize("stderr,rc,cls", [
    ("Traceback (most recent call last):\n  File x\nValueError: month must be in 1..12\n", 1, "traceback"),
    ("rfsgen: error: a\nrfsgen: error: b\n", 1, "bad_exit"),
    ("error: a\n", 2, "bad_exit"),
    ("numpy._core._exceptions._ArrayMemoryError: Unable to allocate 8 TiB\n", 1, "over_memory"),
    ("", -9, "over_memory"),
    ("", -11, "crash"),
])
def test_oracle_classifies_failures(tmp_path, cfg, stderr, rc, cls):
    assert harness.judge(_case(), tmp_path, _res(rc, stderr), cfg)[0] == cls


def test_oracle_hang_leftover_and_must_fail(tmp_path, cfg):
    assert harness.judge(_case(), tmp_path, _res(timed_out=True), cfg)[0] == "hang"
    (tmp_path / ".K.npy.rfsgen-h-1-x.part").write_bytes(b"")
    assert harness.judge(_case(), tmp_path, _res(1, "rfsgen: error: x\n"), cfg)[0] == "bad_exit"
    (tmp_path / ".K.npy.rfsgen-h-1-x.part").unlink()
    case = _case(check={"must_fail": "NaN rows"})
    assert harness.judge(case, tmp_path, _res(0), cfg)[0] == "wrong_result"


def test_oracle_kernel_values(tmp_path, cfg):
    import numpy as np

    case = _case(check={"type": "kernel", "shape": [2, 2], "square": True})
    np.save(tmp_path / "K.npy", np.array([[1.0, 0.5], [0.5, 1.0]]))
    assert harness.judge(case, tmp_path, _res(0), cfg)[0] == "passed"
    np.save(tmp_path / "K.npy", np.array([[1.0, np.nan], [np.nan, 1.0]]))
    assert harness.judge(case, tmp_path, _res(0), cfg)[0] == "wrong_result"
    np.save(tmp_path / "K.npy", np.array([[0.9, 0.5], [0.5, 1.0]]))
    assert harness.judge(case, tmp_path, _res(0), cfg)[0] == "wrong_result"


def test_oracle_signals(tmp_path, cfg):
    import time

    case = _case(signal={"sig": "SIGTERM", "delay": 0.1})
    sent = dict(signal_sent=True, sent_at=time.time())
    assert harness.judge(case, tmp_path, _res(0, **sent), cfg)[0] == "lost_signal"
    assert harness.judge(case, tmp_path, _res(143, "rfsgen: error: terminated by SIGTERM; no output was written\n",
                                              **sent), cfg)[0] == "passed"
    assert harness.judge(case, tmp_path, _res(143, "", **sent), cfg)[0] == "bad_exit"


def test_oracle_tells_a_signal_in_pythons_start_up_from_one_in_rfsgen(tmp_path, cfg):
    """A KeyboardInterrupt traceback with no frame of rfsgen's is the interpreter's start-up
    (the documented gap); one through rfsgen's code is a traceback, a failure."""
    import time

    case = _case(signal={"sig": "SIGINT", "delay": 0.05})
    sent = dict(signal_sent=True, sent_at=time.time())
    site = ('Traceback (most recent call last):\n  File "<frozen site>", line 616, in <module>\n'
            '  File "/v/lib/python3.11/site-packages/__editable___rfsgen_0_1_0_finder.py", line 7, in <module>\n'
            'KeyboardInterrupt\n')
    ours = ('Traceback (most recent call last):\n  File "/work/x/rfsgen/cli/__init__.py", line 9, in main\n'
            'KeyboardInterrupt\n')
    assert harness.judge(case, tmp_path, _res(1, site, **sent), cfg)[0] == "startup"
    assert harness.judge(case, tmp_path, _res(1, ours, **sent), cfg)[0] == "traceback"
    assert harness.judge(_case(), tmp_path, _res(1, site), cfg)[0] == "traceback"  # no signal sent: a bug


def test_forging_never_reads_a_bomb_whole(tmp_path):
    """A case that declares a huge dataset and then rewrites it (seed 38, case 1026 took
    the builder to 16 GB and the machine's OOM killer) cannot be built: it is skipped
    with a reason, before any memory is spent."""
    import h5py
    import numpy as np

    from tests.fuzz import forge

    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("eof_index", data=np.arange(6, dtype=np.uint8))
    forge.apply({"op": "dataset", "file": "f.h5", "name": "eof_index", "how": "bomb", "shape": [10**6, 1000]},
                tmp_path)
    with pytest.raises(ValueError, match="'eof_index' declares 1000000000 bytes: too large"):
        forge.apply({"op": "dataset", "file": "f.h5", "name": "eof_index", "how": "values", "values": [2**62],
                     "dtype": "<u8", "index": "all"}, tmp_path)


def test_forging_over_an_external_fifo_does_not_block(tmp_path):
    """features-s47-1208 (external storage in a FIFO, then a virtual dataset made of it)
    blocked the case builder on the FIFO until the runner gave up: a later operation now
    takes zeros of the dataset's shape where its external storage is not a regular file."""
    import h5py
    import numpy as np

    from tests.fuzz import forge

    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("term_code", data=np.arange(6, dtype=np.int64))
    forge.apply({"op": "mkfifo", "file": "fifo"}, tmp_path)
    forge.apply({"op": "dataset", "file": "f.h5", "name": "term_code", "how": "external", "target": "fifo"}, tmp_path)
    forge.apply({"op": "dataset", "file": "f.h5", "name": "term_code", "how": "virtual"}, tmp_path)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f["term_code"].is_virtual and f["term_code"].shape == (6,)


def test_forging_writes_uint64_values_past_int64(tmp_path):
    """features-s41-182 was skipped ('OverflowError: Python int too large to convert to C
    long'): entries went through int64 on their way to a '<u8' dataset, so 2^63 could not
    be written.  It is written as the op's dtype says, and the old entries of a uint64
    dataset above 2^63 stay as they were."""
    import h5py
    import numpy as np

    from tests.fuzz import forge

    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("eof_index", data=np.array([[1, 3], [5, 2**64 - 1], [7, 9]], dtype=np.uint64))
    forge.apply({"op": "dataset", "file": "f.h5", "name": "eof_index", "how": "values", "values": [2**63],
                 "dtype": "<u8", "index": [87, 50]}, tmp_path)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        got = f["eof_index"][()]
    assert got.dtype == np.uint64
    assert got.tolist() == [[2**63, 2**63], [5, 2**64 - 1], [2**63, 2**63]]  # rows 87 % 3 = 0 and 50 % 3 = 2


def test_issue_37_budget_reaches_every_new_kind():
    from collections import Counter

    from tests.fuzz import run

    kinds = BUDGET_37[BUDGET_37.index("--kinds") + 1].split(",")
    got = Counter(run.make_case(int(BUDGET_37[3]), i, kinds)["kind"] for i in range(int(BUDGET_37[1])))
    assert set(got) == set(kinds), got


def test_oracle_refusing_a_valid_count_is_wrong(tmp_path, cfg):
    case = _case(check={"type": "sample", "columns": 4, "must_succeed": "-n 4 of 4 features"})
    assert harness.judge(case, tmp_path, _res(1, "rfsgen: error: has only 2 distinct features\n"), cfg)[0] == \
        "wrong_result"
    assert harness.judge(_case(), tmp_path, _res(1, "rfsgen: error: has only 2 distinct features\n"), cfg)[0] == \
        "passed"


def test_oracle_holds_a_case_to_its_own_budget(tmp_path, cfg):
    case = _case(budget="64M")
    assert harness.judge(case, tmp_path, _res(1, "rfsgen: error: x\n", maxrss=1300 << 20), cfg)[0] == "over_memory"
    assert harness.judge(case, tmp_path, _res(1, "rfsgen: error: x\n", maxrss=250 << 20), cfg)[0] == "passed"
    assert harness.judge(_case(), tmp_path, _res(1, "rfsgen: error: x\n", maxrss=1300 << 20), cfg)[0] == "passed"


def test_oracle_finds_non_finite_recorded_values(tmp_path):
    import h5py
    import numpy as np

    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.attrs["stats"] = '{"selection": {"rho": 5e-324, "divergence": NaN}}'
        f.create_dataset("column_weight", data=np.ones(3))
    assert harness.nonfinite_recorded(tmp_path / "f.h5") == "stats.selection.divergence = nan"
    with h5py.File(tmp_path / "f.h5", "a") as f:
        f.attrs["stats"] = '{"selection": {"rho": 5e-324}}'
    assert harness.nonfinite_recorded(tmp_path / "f.h5") is None
    with h5py.File(tmp_path / "f.h5", "a") as f:
        f["column_weight"][1] = np.inf
    assert harness.nonfinite_recorded(tmp_path / "f.h5") == "column_weight = inf"


def test_oracle_brownian_kernel_and_zero_rows_in_a_box():
    import numpy as np

    box = {"lo": [-1e308], "hi": [1e308]}
    x = np.array([[0.0], [5e307]])
    k = harness.brownian_kernel(x, x, box["lo"], box["hi"])
    assert np.allclose(k, [[0.25, 0.25 * 0.5], [0.125, 0.75 * 0.25]])
    z = np.zeros((2, 8))
    assert "all-zero" in harness._zero_rows_in_box(z, x, box, whole_grid=True)
    z[1, 3] = 1e-40
    assert "1 of 2 rows" in harness._zero_rows_in_box(z, x, box, whole_grid=True)
    assert harness._zero_rows_in_box(z, x, box, whole_grid=False) is None


def test_oracle_eof_limit_kernels_by_hand():
    import numpy as np

    lo, hi = [0.0, -1.0], [1.0, 3.0]  # unit coordinates u = x for column 0, (x + 1) / 4 for column 1
    x = np.array([[0.25, 0.0], [0.75, 2.0], [0.5, 7.0]])  # the last row's column 1 lies outside (clipped to u = 1)
    free_b = harness.eof_kernel(x, x, lo, hi, "brownian", "free", None)
    assert free_b[0, 0] == 1.25 * 1.25 and free_b[0, 1] == 1.0 and free_b[1, 2] == 1.0 * 1.25
    free_l = harness.eof_kernel(x, x, lo, hi, "laplace", "free", 0.7)
    assert np.isclose(free_l[0, 1], np.exp(-0.7 * (0.5 + 2.0)), rtol=1e-15, atol=0)
    assert np.isclose(free_l[1, 2], np.exp(-0.7 * (0.25 + 1.0)), rtol=1e-15, atol=0)  # clipped to x = 3
    pinned_l = harness.eof_kernel(x, x, lo, hi, "laplace", "pinned", 0.7)
    assert np.allclose(pinned_l[:, 2], 0.0, atol=1e-16) and np.allclose(pinned_l[2], 0.0, atol=1e-16)  # on a face

    def one(u, v, s):  # the closed form (Brownian-bridge-like) of the pinned laplace kernel on [0, 1]
        a, b = min(u, v), max(u, v)
        return np.exp(-s * (b - a)) * -np.expm1(-2 * s * a) * -np.expm1(-2 * s * (1 - b)) / -np.expm1(-2 * s)

    assert np.isclose(pinned_l[0, 1], one(0.25, 0.75, 0.7) * one(0.25, 0.75, 2.8), rtol=1e-12)


def test_generators_draw_the_free_boundary_and_greedy_selection():
    import numpy as np

    from tests.fuzz import gen_eof, gen_labels

    texts, methods = [], []
    for i in range(300):
        case = gen_eof.generate(np.random.default_rng([7, i]), f"eof-{i}")
        texts += [str(f.get("text", "")) + str(f.get("skeleton", "")) + str(f.get("fixture", ""))
                  for f in case["files"].values()]
        case = gen_labels.generate(np.random.default_rng([7, i]), f"labels-{i}")
        methods.append(case["argv"][case["argv"].index("--method") + 1])
    assert any("free" in t for t in texts) and any("pinned" not in t and "free" not in t and t for t in texts)
    assert "greedy" in methods


def test_exact_counts_of_binary_inputs():
    from tests.fuzz.gen_exact import distinct_features

    assert distinct_features(3, [0.5, 0.5]) == 4  # issue 37.9: 1, x1, x2, x3
    assert distinct_features(3, [0, 1]) == 3
    assert distinct_features(3, [0, 0, 1]) == 4  # 1 (x_i x_i) and the 3 pairs
    assert distinct_features(2, [1, 1, 1, 1]) == 4

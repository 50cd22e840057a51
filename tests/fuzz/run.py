"""Run rfsgen's fuzz suite: generated cases through the real CLI, judged by the oracle.

    python tests/fuzz/run.py --cases 1000 --seed 1 --out fuzz-output
    python tests/fuzz/run.py --replay tests/fuzz/regressions --out fuzz-output

Case ``i`` of seed ``S`` is generated from ``numpy.random.default_rng([S, i])`` whatever the
number of processes, so ``--only ID`` or ``--replay FILE`` reproduces one exactly.  Every failure
is saved as a case file (JSON: the command, its files or their generator parameters, the damage
done, the expected result) under OUT/failures/; the first of each distinct failure is minimised
(fewer rows, nodes or operations while it still fails the same way) into OUT/minimised/.  At the
end a table gives, per kind: cases, passed, tracebacks, hangs, over memory, lost signals, wrong
results, bad exits (a message not one line, a leftover output or temporary file) and crashes.
Exit status: 0 when every case passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz import fixtures, harness  # noqa: E402

#: the surfaces of issue 37 (expressions, labels, domains, EOF seeds and rows, --obsm targets,
#: the memory budget and process limits, exact counts) come after the original five
KINDS = ("skeletons", "rows", "features", "shards", "signals", "expressions", "labels", "domains", "eof", "obsm",
         "budget", "exact")
#: relative frequency of each kind in a mixed run (signal and budget cases are the slowest)
WEIGHTS = {"skeletons": 4, "rows": 3, "features": 2, "shards": 2, "signals": 1, "expressions": 2, "labels": 2,
           "domains": 2, "eof": 2, "obsm": 2, "budget": 1, "exact": 1}


def generator(kind):
    import importlib

    return importlib.import_module(f"tests.fuzz.gen_{kind}")


def make_case(seed: int, i: int, kinds) -> dict:
    import numpy as np

    rng = np.random.default_rng([seed, i])
    pool = [k for k in kinds for _ in range(WEIGHTS[k])]
    kind = pool[int(rng.integers(len(pool)))]
    return generator(kind).generate(rng, f"{kind}-s{seed}-{i}")


_CFG = None


def _init(cfg_dict):
    global _CFG
    import signal

    signal.signal(signal.SIGTERM, harness.stop_current)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process stops the pool
    _CFG = harness.Config(**cfg_dict["args"])
    _CFG.max_memory_option = cfg_dict["max_memory_option"]
    if _CFG.mode == "fork":  # import what the CLI needs once, so that each forked run starts at once
        import h5py  # noqa: F401
        import numba  # noqa: F401
        import scipy.sparse  # noqa: F401

        import rfsgen.cli  # noqa: F401
        from rfsgen import _compiled, features, kernel, merge, sampler, transform  # noqa: F401


def _work(case):
    try:
        return case, harness.run_case(case, _CFG)
    except Exception as e:  # a harness bug must not stop the run; it is reported as such
        import traceback

        return case, {"id": case["id"], "kind": case["kind"], "class": "skipped",
                      "detail": f"harness error: {type(e).__name__}: {e}", "tb": traceback.format_exc()}


def minimise(case, result, pool, rounds=6):
    """Shrink ``case`` while it fails with the same class; returns the smallest found."""
    gen = generator(case["kind"])
    if not hasattr(gen, "shrink"):
        return case, result
    for _ in range(rounds):
        cands = list(gen.shrink(case))[:8]
        if not cands:
            break
        for j, c in enumerate(cands):
            c["id"] = f"{case['id'].split('~')[0]}~min"
        found = None
        for c, r in pool.imap(_work, cands):
            if found is None and r["class"] == result["class"]:
                found = (c, r)
        if not found:
            break
        case, result = found
    return case, result


def table(results, kinds) -> str:
    cols = ["cases"] + [harness.HEADERS[c] for c in harness.CLASSES]
    counts = {k: Counter() for k in kinds}
    for r in results:
        counts[r["kind"]][r["class"]] += 1
    rows = [["kind"] + cols]
    total = Counter()
    for k in kinds:
        c = counts[k]
        n = sum(c.values())
        if not n:
            continue
        total.update(c)
        rows.append([k, str(n)] + [str(c[x]) for x in harness.CLASSES])
    rows.append(["total", str(sum(total.values()))] + [str(total[x]) for x in harness.CLASSES])
    skipped = sum(1 for r in results if r["class"] == "skipped")
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    if skipped:
        lines.append(f"({skipped} cases could not be built and were skipped)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100, help="number of generated cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--memory-limit", default="3G", help="address-space cap per run (RLIMIT_AS), e.g. 3G")
    ap.add_argument("--budget", default=None, help="rfsgen's --max-memory / RFSGEN_MAX_MEMORY (default: half the cap)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
    ap.add_argument("--jobs", type=int, default=2, help="parallel runs")
    ap.add_argument("--mode", choices=("spawn", "fork"), default="spawn",
                    help="spawn: exec 'python -m rfsgen' per case; fork: fork a process with rfsgen imported (faster)")
    ap.add_argument("--out", default="fuzz-output", help="directory for failures, the summary and the fixture cache")
    ap.add_argument("--cache", default=None, help="fixture cache (default OUT/cache)")
    ap.add_argument("--replay", nargs="*", default=None, help="case files or directories to run instead of generating")
    ap.add_argument("--only", default=None, help="run only the generated case with this id (e.g. rows-s1-17)")
    ap.add_argument("--no-minimise", action="store_true")
    ap.add_argument("--minimise-time", type=float, default=300.0, help="seconds spent minimising, in all")
    ap.add_argument("--keep", action="store_true", help="keep each case's directory (under the system temp dir)")
    a = ap.parse_args(argv)

    from rfsgen.budget import parse_size

    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"unknown kind(s) {bad}; choose from {KINDS}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(a.cache) if a.cache else out / "cache"
    cap = parse_size(a.memory_limit, "--memory-limit")
    args = dict(cache=str(cache), time_limit=a.time_limit, memory_limit=cap,
                budget=parse_size(a.budget, "--budget") if a.budget else None, mode=a.mode, keep=a.keep)
    cfg = harness.Config(**args)
    cfg.detect()

    if a.replay is not None:
        cases = []
        for src in a.replay:
            p = Path(src)
            for f in sorted(p.glob("*.json")) if p.is_dir() else [p]:
                rec = json.loads(f.read_text())
                cases.append(dict(rec.get("case", rec), id=f.stem))
        kinds = [k for k in KINDS if any(c["kind"] == k for c in cases)]
    else:
        cases = [make_case(a.seed, i, kinds) for i in range(a.cases)]
        if a.only:
            cases = [c for c in cases if c["id"] == a.only]
    need = set()
    for c in cases:
        need |= harness.fixtures_of(c)
    t0 = time.monotonic()
    fixtures.ensure(cache, need)
    print(f"fuzz: {len(cases)} cases ({', '.join(kinds)}), seed {a.seed}, {a.jobs} jobs, mode {a.mode}, "
          f"cap {cap >> 20} MiB, budget {cfg.budget >> 20} MiB "
          f"(RFSGEN_MAX_MEMORY{', --max-memory for ' + '/'.join(cfg.max_memory_option) if cfg.max_memory_option else ''}), "
          f"{a.time_limit:.0f} s per case; fixtures ready in {time.monotonic() - t0:.0f} s", flush=True)

    import signal

    def _stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)  # stopping the runner stops the pool (and each worker its run)
    ctx = mp.get_context("spawn")
    results, failures = [], []
    first_of = {}
    t0 = time.monotonic()
    pool = ctx.Pool(a.jobs, initializer=_init,
                    initargs=({"args": args, "max_memory_option": cfg.max_memory_option},))
    try:
        log = open(out / "results.jsonl", "w")  # as it goes: a stopped run keeps its verdicts
        it = pool.imap_unordered(_work, cases, chunksize=1)
        for n in range(1, len(cases) + 1):
            try:  # a worker that died takes its case with it: never wait for ever
                case, r = it.next(timeout=a.time_limit * 4 + 120)
            except mp.TimeoutError:
                seen = {x["id"] for x in results}
                lost = [c["id"] for c in cases if c["id"] not in seen][:a.jobs * 2]
                pool.terminate()
                print(f"error: no verdict for {a.time_limit * 4 + 120:.0f} s after {len(results)} cases: a worker died "
                      f"(out of memory while building a case?); the first without a verdict: {', '.join(lost)}; "
                      f"replay one with --only ID", file=sys.stderr, flush=True)
                return 2
            results.append(r)
            log.write(json.dumps(r, default=str) + "\n")
            log.flush()
            if r["class"] not in ("passed", "skipped", "startup"):  # startup: the documented gap (docs/reliability.md)
                failures.append((case, r))
                harness.save_case(case, r, out / "failures" / case["kind"])
                sig = harness.signature(r)
                if sig not in first_of:
                    first_of[sig] = (case, r)
                    print(f"  NEW {r['class']:<12} {case['id']:<22} {r['detail'][:150]}", flush=True)
            if n % 100 == 0:
                print(f"  {n}/{len(cases)} cases, {len(failures)} failures, {time.monotonic() - t0:.0f} s", flush=True)
        log.close()
        if not a.no_minimise:
            deadline = time.monotonic() + a.minimise_time
            for sig, (case, r) in list(first_of.items()):
                # hangs cost the whole time limit per try, and signals depend on timing: not minimised
                if r["class"] in ("hang", "lost_signal") or case.get("signal") or time.monotonic() > deadline:
                    harness.save_case(case, r, out / "minimised")
                    continue
                small, sr = minimise(case, r, pool)
                harness.save_case(small, sr, out / "minimised")
                first_of[sig] = (small, sr)
    except BaseException:
        pool.terminate()  # workers kill the run they hold (harness.stop_current)
        raise
    pool.close()  # a normal end: workers leave when the queue is empty (no signals involved)
    pool.join()
    elapsed = time.monotonic() - t0
    tab = table(results, kinds)
    distinct = Counter(harness.signature(r) for _, r in failures)
    lines = [f"# rfsgen fuzz: {len(results)} cases in {elapsed:.0f} s (seed {a.seed}, mode {a.mode})", "", tab, "",
             f"## {len(distinct)} distinct failures (count, kind|class|detail, a reproducer)"]
    for sig, cnt in distinct.most_common():
        case, r = first_of[sig]
        lines.append(f"- {cnt} x {sig}  ->  {case['id']}: rfsgen {' '.join(case['argv'])[:120]}")
    report = "\n".join(lines)
    (out / "summary.md").write_text(report + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=0, default=str))
    print(report)
    return 0 if all(r["class"] in ("passed", "startup") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

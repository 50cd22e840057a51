"""Run one fuzz case through the real command line and judge it.

A case (a JSON-able dict):

``kind``      skeletons | rows | features | shards | signals
``id``        a name (``rows-7-123``)
``files``     ``{relpath: spec}``: ``{"text": s}``, ``{"b64": s}``, ``{"fixture": name}``,
              ``{"skeleton": name}`` (a fixture skeleton's text), ``{"rows": params}`` (see
              :func:`tests.fuzz.gen_rows.write_rows`)
``ops``       damage applied after the files exist (:func:`tests.fuzz.forge.apply`)
``argv``      the arguments after ``rfsgen``; ``stdin``: a file to feed on standard input
``output``    the file a success writes (checked absent after a failure)
``check``     what a success must look like: ``{"type": "sample"|"transform"|"kernel"|"merge"|
              "skeleton"|"inspect", ...}``; ``{"must_fail": true}`` when no success is correct
``signal``    ``{"sig": "SIGTERM", "delay": seconds}``: delivered once while the run is alive
``budget``    this case's ``--max-memory`` / ``RFSGEN_MAX_MEMORY`` (e.g. ``"64M"``) instead of the run's;
              the peak-RSS check holds the run to it
``memory_limit``  this case's ``RLIMIT_AS`` (e.g. ``"2G"``) instead of the run's cap: a process
              limit below ``--max-memory``, which rfsgen must take as its ceiling

The oracle: exit 0 with finite, correct output; or a non-zero exit with exactly one stderr line
starting ``rfsgen: error:``, no output file and no ``.*.rfsgen-*.part`` file left; never a
traceback, a time-out, the memory cap, a crash, or (with a signal) an exit 0 after the signal.

Runs are real processes: ``spawn`` execs ``python -m rfsgen`` (start-up included), ``fork`` forks a
process that has already imported rfsgen and calls the same entry point (no interpreter start-up:
~10x faster; used for bounded budgets).  Both set ``RLIMIT_AS`` and ``RFSGEN_MAX_MEMORY``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from . import fixtures, forge

CLASSES = ("passed", "startup", "traceback", "hang", "over_memory", "lost_signal", "wrong_result", "bad_exit", "crash")
HEADERS = {"passed": "passed", "startup": "signals in Python's start-up", "traceback": "tracebacks", "hang": "hangs", "over_memory": "over memory",
           "lost_signal": "lost signals", "wrong_result": "wrong results", "bad_exit": "bad exits", "crash": "crashes"}
#: What a command reaches with inputs of no size (interpreter, numba's loops, HDF5): the
#: peak-RSS check allows this much above the case's budget (measured: 62-264 MiB forked).
RSS_OVERHEAD = 256 << 20
#: Every run's ``RLIMIT_FSIZE`` (``ulimit -f``): far above any correct case's output.
FILE_SIZE_LIMIT = 4 << 30
MEMORY_MARKS = ("MemoryError", "Unable to allocate", "std::bad_alloc", "Cannot allocate memory", "out of memory")


class Config:
    def __init__(self, cache, time_limit=30.0, memory_limit=3 << 30, budget=None, mode="spawn", keep=False):
        self.cache = Path(cache)
        self.time_limit = float(time_limit)
        self.memory_limit = int(memory_limit)
        # rfsgen's own budget, below the hard cap: the cap also holds the interpreter, numba and HDF5
        self.budget = int(budget or max(256 << 20, self.memory_limit // 2))
        self.mode = mode
        self.keep = keep
        self.max_memory_option = None  # detected: whether the CLI has --max-memory

    def detect(self) -> None:
        """Which commands take ``--max-memory`` (the option may not exist yet, or not everywhere)."""
        env = dict(os.environ, PYTHONPATH=_pythonpath())
        procs = {cmd: subprocess.Popen([sys.executable, "-m", "rfsgen", cmd, "--help"], stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True, env=env)
                 for cmd in ("sample", "transform", "kernel", "approx", "merge", "inspect", "skeleton", "select")}
        self.max_memory_option = [cmd for cmd, p in procs.items() if "--max-memory" in p.communicate(timeout=120)[0]]


def _pythonpath() -> str:
    return str(fixtures.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")


def fixtures_of(case) -> set:
    out = set()
    for spec in case["files"].values():
        if "fixture" in spec:
            out.add(spec["fixture"])
    ref = case.get("check", {}).get("reference")
    if ref and ref.get("fixture"):
        out.add(ref["fixture"])
    if case.get("check", {}).get("reference_fixture"):
        out.add(case["check"]["reference_fixture"])
    for f in case.get("check", {}).get("needs", []):
        out.add(f)
    return out


def materialize(case, d: Path, cfg: Config) -> None:
    from . import gen_rows

    for rel, spec in case["files"].items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if "text" in spec:
            p.write_bytes(spec["text"].encode("utf-8", "surrogateescape"))
        elif "b64" in spec:
            p.write_bytes(base64.b64decode(spec["b64"]))
        elif "fixture" in spec:
            shutil.copyfile(fixtures.path_of(cfg.cache, spec["fixture"]), p)
        elif "skeleton" in spec:
            p.write_text(fixtures.skeleton_text(spec["skeleton"]))
        elif "rows" in spec:
            gen_rows.write_rows(spec["rows"], p)
        elif "labels" in spec:
            from . import gen_labels

            gen_labels.write_labels(spec["labels"], p)
        elif "h5ad" in spec:
            from . import gen_obsm

            gen_obsm.write_h5ad(spec["h5ad"], p)
        else:
            raise ValueError(f"bad file spec {spec}")
    # a truncated file cannot be opened to be damaged further: truncation comes last
    for op in sorted(case.get("ops", []), key=lambda op: op["op"] == "truncate"):
        forge.apply(op, d)


def budget_of(case, cfg: Config) -> int:
    """The memory budget the case's run is given (and held to): its own, else the run's."""
    from rfsgen.budget import parse_size

    return parse_size(str(case["budget"]), "budget") if case.get("budget") else cfg.budget


def cap_of(case, cfg: Config) -> int:
    """The case's ``RLIMIT_AS``: its own, else the run's cap."""
    from rfsgen.budget import parse_size

    return parse_size(str(case["memory_limit"]), "memory_limit") if case.get("memory_limit") else cfg.memory_limit


def _argv(case, cfg: Config) -> list:
    argv = list(case["argv"])
    if cfg.max_memory_option and argv and argv[0] in cfg.max_memory_option:
        argv[1:1] = ["--max-memory", str(budget_of(case, cfg))]
    return argv


def _limits(cfg: Config, cap=None):
    import resource

    def pre():
        import signal

        os.setsid()
        # The pool's workers ignore SIGINT (the runner stops them), and the runner may itself
        # run under nohup (SIGHUP ignored) or as a background job; a command started from a
        # shell or a scheduler has them at their defaults, and an ignored signal is inherited
        # across exec (rfsgen rightly keeps a signal ignored that was ignored when it started).
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        limit = cfg.memory_limit if cap is None else cap
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # No case may fill the disk it runs on: rfsgen takes this limit as its room
        # (rfsgen.output.room_for) and must report passing it in one line.
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    return pre


def _state(pid) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _fork_child(argv, d: Path, stdin, stdout, stderr, cfg: Config, budget: int, cap: int) -> int:
    """Fork a process that runs rfsgen's entry point with ``argv`` (rfsgen already imported here)."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)
        _limits(cfg, cap)()
        os.chdir(d)
        fd = os.open(stdin, os.O_RDONLY) if stdin else os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.environ["RFSGEN_MAX_MEMORY"] = str(budget)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        sys.argv = ["rfsgen", *argv]
        code = 0
        try:
            from rfsgen._entry import main

            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code)
    except BaseException:
        os._exit(99)


#: The process group of the run in progress in this process (killed if the runner is stopped).
CURRENT = None


def stop_current(*_):
    """SIGTERM handler of a fuzz worker: kill the run in progress, then exit."""
    if CURRENT:
        try:
            os.killpg(CURRENT, signal.SIGKILL)
        except OSError:
            pass
    os._exit(1)


def execute(case, d: Path, cfg: Config) -> dict:
    """Run the case's command in ``d``; returns rc, stderr, timings, signal delivery."""
    argv = _argv(case, cfg)
    out_path, err_path = d / ".fuzz-stdout", d / ".fuzz-stderr"
    stdin = str(d / case["stdin"]) if case.get("stdin") else None
    budget, cap = budget_of(case, cfg), cap_of(case, cfg)
    t0 = time.monotonic()
    # signal cases always exec the interpreter: a signal during start-up is part of what they test
    if cfg.mode == "fork" and not case.get("signal"):
        pid = _fork_child(argv, d, stdin, str(out_path), str(err_path), cfg, budget, cap)
    else:
        env = dict(os.environ, PYTHONPATH=_pythonpath(), RFSGEN_MAX_MEMORY=str(budget))
        with open(out_path, "wb") as o, open(err_path, "wb") as e, \
                open(stdin if stdin else os.devnull, "rb") as i:
            proc = subprocess.Popen([sys.executable, "-m", "rfsgen", *argv], cwd=d, stdin=i, stdout=o, stderr=e,
                                    env=env, preexec_fn=_limits(cfg, cap))
        pid = proc.pid
        proc.returncode = 0  # we reap it ourselves (os.wait4, for its peak memory); keep Popen from trying
    global CURRENT
    CURRENT = pid
    sig = case.get("signal")
    sent_at, sent = None, False
    timed_out = False
    status, usage = None, None
    while True:
        r, st, ru = os.wait4(pid, os.WNOHANG)
        if r:
            status, usage = st, ru
            break
        now = time.monotonic() - t0
        if sig and not sent and now >= sig["delay"]:
            if _state(pid) != "Z":
                os.kill(pid, getattr(signal, sig["sig"]))
                sent, sent_at = True, time.time()
        if now > cfg.time_limit:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.005 if now < 2 else 0.02)
    if os.WIFEXITED(status):
        rc = os.WEXITSTATUS(status)
    else:
        rc = -os.WTERMSIG(status)
    try:  # children the run left behind (none expected)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    CURRENT = None
    err = err_path.read_bytes().decode("utf-8", "replace")
    return {"rc": rc, "stderr": err, "elapsed": round(time.monotonic() - t0, 3), "timed_out": timed_out,
            "signal_sent": sent, "sent_at": sent_at, "maxrss": usage.ru_maxrss * 1024 if usage else 0,
            "stdout_bytes": out_path.stat().st_size}


def _leftovers(d: Path) -> list:
    return [str(p.relative_to(d)) for p in d.rglob(".*.rfsgen-*.part")]


def judge(case, d: Path, res: dict, cfg: Config) -> tuple:
    """(class, detail) for a finished run."""
    err, rc = res["stderr"], res["rc"]
    # Warnings (one line each, e.g. a skeleton's VarianceWarning) may precede the one error line.
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("rfsgen: warning: ")]
    if res["timed_out"]:
        return "hang", f"no exit after {cfg.time_limit:.0f} s"
    if any(m in err for m in MEMORY_MARKS) or rc == -signal.SIGKILL:
        return "over_memory", _last(err) or f"killed (rc {rc})"
    budget = min(budget_of(case, cfg), cap_of(case, cfg))
    if res["maxrss"] > budget + RSS_OVERHEAD:
        return "over_memory", f"peak RSS {res['maxrss'] >> 20} MiB over the budget {budget >> 20} MiB " \
                              f"(+ {RSS_OVERHEAD >> 20} MiB for the interpreter and compiled loops)"
    sig = case.get("signal")
    if sig and res["signal_sent"] and "Traceback (most recent call last)" in err and _before_the_hold(err):
        # No frame of rfsgen's: the signal landed in the interpreter's own start-up (site,
        # .pth files, runpy finding the package), before rfsgen's first line (docs/reliability.md, Signals).
        return "startup", f"{sig['sig']} at {sig['delay']:.3f} s, in Python's start-up: {_exception(err)}"
    if "Traceback (most recent call last)" in err or "Exception ignored" in err:
        return "traceback", _exception(err)
    out = d / case["output"] if case.get("output") else None
    left = _leftovers(d)
    if sig and res["signal_sent"]:
        signum = getattr(signal, sig["sig"])
        if rc == 0:
            if out is not None and out.exists() and os.stat(out).st_ctime < res["sent_at"] - 0.05:
                return "passed", "signal after the output was complete"
            return "lost_signal", f"exit 0 after {sig['sig']} at {sig['delay']:.3f} s"
        if rc in (128 + signum, -signum):
            if out is not None and out.exists():
                if os.stat(out).st_ctime < res["sent_at"] - 0.05:
                    return "passed", f"exit {rc}: the signal came after the output was complete"
                return "lost_signal", f"exit {rc} but the output {case['output']} is in place"
            if left:
                return "bad_exit", f"temporary file left: {left[0]}"
            if rc == 128 + signum and (len(lines) != 1 or not lines[0].startswith("rfsgen: ")):
                return "bad_exit", f"exit {rc} with stderr {_short(err)!r}"
            return "passed", f"exit {rc}"
        # the signal arrived but the run ended otherwise: acceptable only as an ordinary clean error
    if rc < 0:
        return "crash", f"killed by {signal.Signals(-rc).name}"
    if rc != 0:
        if len(lines) != 1 or not lines[0].startswith("rfsgen: error:"):
            return "bad_exit", f"exit {rc} with stderr {_short(err)!r}"
        if out is not None and out.exists() and not case.get("output_preexists"):
            return "bad_exit", f"exit {rc} but {case['output']} exists"
        if left:
            return "bad_exit", f"temporary file left: {left[0]}"
        if case.get("check", {}).get("must_succeed"):  # a clean refusal of what is valid is a silent wrong
            return "wrong_result", f"refused {case['check']['must_succeed']}: {lines[0][:140]}"
        return "passed", lines[0][:160]
    # exit 0
    if left:
        return "bad_exit", f"exit 0 with a temporary file left: {left[0]}"
    check = case.get("check", {})
    if check.get("must_fail"):
        return "wrong_result", f"exit 0 but must fail: {check['must_fail']}"
    if check.get("must_fail_unless_unchanged"):
        same = _same_as_unforged(case, d, cfg)
        if same is not True:
            return "wrong_result", f"exit 0 but must fail: {check['must_fail_unless_unchanged']} ({same})"
        return "passed", "exit 0: the flipped bit is in bytes no reader uses (the unforged file's output)"
    try:
        problem = check_output(case, d, res, cfg)
    except Exception as e:  # the output could not be read: that is a wrong result, not a harness error
        problem = f"output unreadable: {type(e).__name__}: {_short(str(e))}"
    if problem:
        return "wrong_result", problem
    return "passed", "exit 0"


def _before_the_hold(err: str) -> bool:
    """Whether a traceback's frames of rfsgen, if any, are only the package's first lines
    (module level of ``rfsgen/__init__.py`` and ``rfsgen/__main__.py``, or the hold
    itself): a SIGINT that Python took before the signals were held surfaces at the next
    line Python runs, which may be one of those (docs/reliability.md, Signals)."""
    frames = re.findall(r'File "([^"]*)", line \d+, in (\S+)', err)
    ours = [(path, fn) for path, fn in frames if re.search(r"[/\\]rfsgen[/\\]", path)]
    return all(os.path.basename(path) in ("__init__.py", "__main__.py")
               and fn in ("<module>", "_hold_signals_for_the_cli") for path, fn in ours)


def _same_as_unforged(case, d: Path, cfg: Config):
    """True when the case's command, run on its files before any forgery (the fixtures
    themselves), gives the same output (X for a transform, stdout for inspect); else what
    differs (one line)."""
    with tempfile.TemporaryDirectory(prefix="rfsgen-fuzz-ref-") as t:
        t = Path(t)
        for name, spec in case["files"].items():
            src = fixtures.path_of(cfg.cache, spec["fixture"]) if "fixture" in spec else d / name
            shutil.copyfile(src, t / name)
        env = dict(os.environ, PYTHONPATH=_pythonpath(), RFSGEN_MAX_MEMORY=str(cfg.budget))
        proc = subprocess.run([sys.executable, "-m", "rfsgen", *_argv(case, cfg)], cwd=t, env=env,
                              capture_output=True, timeout=max(60.0, 3 * cfg.time_limit))
        if proc.returncode != 0:
            return f"the unforged file fails too: {_short(proc.stderr.decode(errors='replace'))}"
        if case.get("output"):
            a, b = _finite_h5_x(d / case["output"])[0], _finite_h5_x(t / case["output"])[0]
            return True if a.shape == b.shape and np.array_equal(a, b) else "X differs from the unforged file's"
        same = (d / ".fuzz-stdout").read_bytes() == proc.stdout  # (the same file name in both)
        return True if same else "inspect prints other values than for the unforged file"


def _short(s, n=200):
    s = " | ".join(s.strip().splitlines()[-3:])
    return s if len(s) <= n else s[:n] + "..."


def _last(err):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def _exception(err: str) -> str:
    """The exception line of a traceback (its type and message), as the failure's signature."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Warning|Interrupt|Exit|Terminated)\b", ln) or \
                re.match(r"^[\w.]+: ", ln) and not ln.startswith("rfsgen:"):
            return ln[:200]
    return lines[-1][:200] if lines else "traceback"


# ----------------------------------------------------------------------------- output checks
def _finite_h5_x(path):
    """X of a transform/merge output as a dense float64 array (h5py alone; CSR or dense)."""
    return _read_x(path, "X")


def _read_x(path, name):
    """Matrix ``name`` of an HDF5 file (a dataset or an anndata CSR group), dense float64."""
    import h5py
    import scipy.sparse as sp

    with h5py.File(path, "r") as f:
        x = f[name]
        if isinstance(x, h5py.Group):
            shape = tuple(int(v) for v in x.attrs["shape"])
            m = sp.csr_matrix((x["data"][()], x["indices"][()], x["indptr"][()]), shape=shape)
            return m.toarray().astype(np.float64), str(x["data"].dtype)
        return x[()].astype(np.float64), str(x.dtype)


def check_output(case, d: Path, res: dict, cfg: Config):
    """None when the exit-0 output is right, else what is wrong (one line)."""
    check = case.get("check", {})
    t = check.get("type")
    out = d / case["output"] if case.get("output") else None
    if t in ("sample", "transform", "kernel", "merge", "transform_any", "kernel_any") and \
            (out is None or not out.exists()):
        return f"exit 0 but no output {case.get('output')}"
    if t == "sample":
        return _in_child(_check_sample, str(out), check)
    if t == "transform":
        x, dtype = _finite_h5_x(out)
        if x.shape != (check["rows"], check["columns"]):
            return f"X has shape {x.shape}, expected {(check['rows'], check['columns'])}"
        if not np.isfinite(x).all():
            bad = np.argwhere(~np.isfinite(x))
            return f"{len(bad)} non-finite values in X, first at row {bad[0][0]} column {bad[0][1]}"
        ref = check.get("reference")
        if ref:
            want = _in_child(_reference_transform, cfg, ref, str(d))
            if isinstance(want, str):
                return want
            tol = 2e-3 if dtype == "float32" else 1e-8
            diff = np.abs(x - want).max() if want.size else 0.0
            if diff > tol * max(1.0, np.abs(want).max()):
                return f"X differs from the scale-invariant reference by {diff:.3g}"
        if check.get("box"):
            return _zero_rows_in_box(x, _probe_rows(check), check["box"],
                                     _in_child(_whole_grid, str(d / check["features"])) is True)
        return None
    if t == "kernel":
        k = np.load(out, allow_pickle=False)
        if k.shape != tuple(check["shape"]):
            return f"K has shape {k.shape}, expected {tuple(check['shape'])}"
        if not np.isfinite(k).all():
            bad = np.argwhere(~np.isfinite(k))
            return f"{len(bad)} non-finite kernel values, first at {tuple(bad[0])}"
        bound = check.get("bound", 1.0)  # sup |k|: 1 for a normalised kernel (free brownian: 1.5^d)
        if np.abs(k).max(initial=0) > bound * (1 + 1e-6):
            return f"|K| reaches {np.abs(k).max():.6g} > {bound:g}, the kernel's largest value"
        if check.get("square") and k.size and np.abs(np.diag(k) - 1).max() > 1e-6:
            i = int(np.argmax(np.abs(np.diag(k) - 1)))
            return f"K[{i}, {i}] = {k[i, i]!r}, expected 1"
        ref = check.get("reference")
        if ref:
            want = _in_child(_reference_kernel, cfg, ref, str(d))
            if isinstance(want, str):
                return want
            diff = np.abs(k - want).max() if want.size else 0.0
            if diff > 1e-6:
                return f"K differs from the scale-invariant reference by {diff:.3g}"
        if check.get("box"):
            return _kernel_in_box(k, check)
        return None
    if t == "merge":
        x, dtype = _finite_h5_x(out)
        want, wdtype = _finite_h5_x(fixtures.path_of(cfg.cache, check["reference_fixture"]))
        import h5py

        with h5py.File(out, "r") as f:  # merging a contiguous subset of the shards is right: compare that range
            a, b = int(f.attrs["rows_start"]), int(f.attrs["rows_stop"])
        if not 0 <= a <= b <= want.shape[0]:
            return f"merged output says rows {a}:{b}, the input has {want.shape[0]}"
        want = want[a:b]
        if x.shape != want.shape:
            return f"merged X has shape {x.shape}, the whole transform {want.shape}"
        if dtype != wdtype:
            return f"merged X is {dtype}, the whole transform {wdtype}"
        if not np.isfinite(x).all():
            return "merged X has non-finite values"
        if not np.array_equal(x, want):
            rows = np.unique(np.argwhere(x != want)[:, 0])
            return f"merged X differs from the whole transform in {len(rows)} rows (first {rows[0]})"
        return None
    if t == "transform_any":
        x, _ = _finite_h5_x(out)
        return None if np.isfinite(x).all() else "non-finite values in X"
    if t == "kernel_any":
        k = np.load(out, allow_pickle=False)
        return None if np.isfinite(k).all() else "non-finite kernel values"
    if t == "obsm":
        return _check_obsm(out, check, cfg)
    if t in ("skeleton", "inspect"):
        return None
    return None


def _check_sample(path, check):
    from rfsgen import features

    fs = features.load(path)
    # orf ends on whole (cos, sin) pairs, so -n or -n + 1 columns: a half that repeats an
    # earlier column makes the count odd (docs/commands.md, rfsgen sample)
    want = (check["columns"], check["columns"] + 1) if fs.scheme == "orf" else (check["columns"],)
    if check.get("columns") is not None and fs.columns not in want:
        return f"sample wrote {fs.columns} columns, asked {check['columns']}"
    for name in ("omega",):
        v = getattr(fs, name, None)
        if isinstance(v, np.ndarray) and v.size and not np.isfinite(v).all():
            return f"sample wrote non-finite {name}"
    if check.get("classes"):
        got = (fs.stats or {}).get("selection", {}).get("classes")
        if got != check["classes"]:
            return f"the selection records {got} classes, the labels have {check['classes']}"
    bad = nonfinite_recorded(path)
    if bad:
        return f"the feature file records {bad}"
    if fs.eof is not None:
        with np.errstate(all="ignore"):
            width = fs.eof.hi - fs.eof.lo
        if not np.isfinite(width).all() or (width <= 0).any():
            return f"the feature file records an EOF box of width {width.tolist()[:4]}"
    if check.get("then_transform"):
        return _then_transform(path, check)
    return None


def _floats(v, where):
    """(where, value) of every non-finite float in a JSON-like value."""
    if isinstance(v, float) and not np.isfinite(v):
        yield where, v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _floats(x, f"{where}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _floats(x, f"{where}[{i}]")


def nonfinite_recorded(path) -> str | None:
    """The first non-finite value a feature file records, in a float dataset or an
    attribute (JSON ones parsed: ``NaN`` and ``Infinity`` are what json.dumps writes for
    them), as ``'name = value'``; None when every recorded value is finite."""
    import json

    import h5py

    found = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f" and obj.size <= (1 << 24):
            v = obj[()]
            if not np.isfinite(v).all():
                found.append(f"{name} = {v[~np.isfinite(v)].ravel()[0]}")

    with h5py.File(path, "r") as f:
        f.visititems(visit)
        for key, v in f.attrs.items():
            if isinstance(v, (bytes, np.bytes_)):
                v = bytes(v).decode("utf-8", "replace")
            if isinstance(v, str) and v[:1] in "[{":
                try:
                    v = json.loads(v)
                except ValueError:
                    continue
            elif isinstance(v, np.ndarray) and v.dtype.kind == "f":
                v = v.tolist()
            elif isinstance(v, np.floating):
                v = float(v)
            found += [f"{w} = {x}" for w, x in _floats(v, key)]
    return found[0] if found else None


def _probe_rows(check) -> np.ndarray:
    """The rows a check computes its reference from (``check["probe_rows"]``: rows parameters)."""
    from . import gen_rows

    return gen_rows.make_array(check["probe_rows"])


def _in_node(x, box) -> np.ndarray:
    """The columns of the rows that the box's node reads (``box["columns"]``: [start, stop])."""
    a, b = box.get("columns", [0, None])
    return np.asarray(x, dtype=np.float64)[:, a:b]


def _unit(x, lo, hi):
    """u = (x - lo) / (hi - lo) with every operand halved first (no overflow for finite bounds)."""
    with np.errstate(all="ignore"):
        return (np.asarray(x, dtype=np.float64) / 2 - np.asarray(lo) / 2) / (np.asarray(hi) / 2 - np.asarray(lo) / 2)


def _inside(x, box, edge=0.01) -> np.ndarray:
    """Rows whose every value lies well inside the box (u in [edge, 1 - edge]): there both
    EOF kernels (brownian and pinned laplace) are positive, so their features cannot all be 0."""
    u = _unit(_in_node(x, box), box["lo"], box["hi"])
    with np.errstate(invalid="ignore"):
        return ((u >= edge) & (u <= 1 - edge)).all(axis=1)


def _whole_grid(path) -> bool:
    """Whether a feature file is an EOF file holding its whole grid (then every row inside
    the box has a non-zero feature: the level-1 hat is positive on the whole box)."""
    from rfsgen import features

    fs = features.load(path)
    return fs.eof is not None and fs.columns == int(fs.eof.meta["grid_features"])


def _zero_rows_in_box(z, x, box, whole_grid: bool):
    """A silent wrong result: features that are all zero (or not finite) for rows inside
    the box, where the kernel is positive.  With the whole EOF grid every such row has a
    non-zero feature; with a sample of features, at least one of the rows has."""
    z = np.asarray(z, dtype=np.float64)
    if not np.isfinite(z).all():
        return f"{int((~np.isfinite(z)).sum())} non-finite features from finite rows"
    ins = _inside(x, box)
    if not ins.any():
        return None
    zero = ~(z[ins] != 0).any(axis=1)
    if whole_grid and zero.any():
        return f"{int(zero.sum())} of {int(ins.sum())} rows inside the box have all-zero features (whole EOF grid)"
    if zero.all() and z.shape[1] >= 8:
        return f"all {int(ins.sum())} rows inside the box have all-zero features, where the kernel is positive"
    return None


def brownian_kernel(x, y, lo, hi) -> np.ndarray:
    """prod_j (min(u_j, v_j) - u_j v_j), u clipped to the box (as EOF clips): the reference
    for ``kernel`` of a brownian node, computed without rfsgen."""
    u = np.clip(_unit(x, lo, hi), 0, 1)
    v = np.clip(_unit(y, lo, hi), 0, 1)
    k = np.ones((u.shape[0], v.shape[0]))
    for j in range(u.shape[1]):
        a, b = u[:, j][:, None], v[:, j][None, :]
        k *= np.minimum(a, b) - a * b
    return k


def eof_kernel(x, y, lo, hi, kernel: str, boundary: str, scale) -> np.ndarray:
    """The kernel ``kernel --eof`` converges to, rows clipped to the box (as EOF clips),
    computed without rfsgen: brownian pinned (the Brownian bridge, :func:`brownian_kernel`)
    or free (1 + [same side of 1/2] min(|u - 1/2|, |v - 1/2|) per coordinate); laplace free
    (exp(-scale |x - y|_1) on the box) or pinned (the laplace kernel less its interpolation
    from the two faces: k(u, v) - [k(u, 0), k(u, 1)] G^-1 [k(0, v), k(1, v)]^T, G the faces' Gram)."""
    if kernel == "brownian" and boundary == "pinned":
        return brownian_kernel(x, y, lo, hi)
    u = np.clip(_unit(x, lo, hi), 0, 1)
    v = np.clip(_unit(y, lo, hi), 0, 1)
    width = np.asarray(hi, dtype=np.float64) - np.asarray(lo, dtype=np.float64)
    k = np.ones((u.shape[0], v.shape[0]))
    for j in range(u.shape[1]):
        a, b = u[:, j][:, None], v[:, j][None, :]
        if kernel == "brownian":
            k *= 1.0 + np.where((a - 0.5) * (b - 0.5) > 0, np.minimum(np.abs(a - 0.5), np.abs(b - 0.5)), 0.0)
            continue
        s = scale * width[j]
        one = np.exp(-s * np.abs(a - b))
        if boundary == "pinned":
            e = np.exp(-s)
            ga, gb = (np.exp(-s * a), np.exp(-s * (1 - a))), (np.exp(-s * b), np.exp(-s * (1 - b)))
            g_inv = np.array([[1.0, -e], [-e, 1.0]]) / (1.0 - e * e)
            one = one - sum(g_inv[p, q] * ga[p] * gb[q] for p in range(2) for q in range(2))
        k *= one
    return k


def _kernel_in_box(k, check):
    box, x = check["box"], _probe_rows(check)
    ins = _inside(x, box)
    limit = ("brownian", "pinned", None) if check.get("brownian") else check.get("limit")
    if limit:
        xn = _in_node(x, box)
        want = eof_kernel(xn, xn, box["lo"], box["hi"], *limit)
        diff = np.abs(k - want)
        if (diff > 1e-9 + 1e-6 * np.abs(want)).any():
            i, j = np.unravel_index(int(np.argmax(diff)), diff.shape)
            return f"K[{i}, {j}] = {k[i, j]!r}, the {' '.join(limit[1::-1])} kernel is {want[i, j]!r}"
    bad = np.flatnonzero(ins & ~(np.diag(k) > 0))
    if bad.size:
        return f"K[{bad[0]}, {bad[0]}] = {k[bad[0], bad[0]]!r} for a row inside the box, where the kernel is positive"
    return None


def _then_transform(path, check):
    """Transform rows through a feature file that sample wrote (the library, in a child):
    a file that transform refuses, or whose features are silently wrong, is sample's bug."""
    spec = check["then_transform"]

    def run():
        from rfsgen import features, transform

        fs = features.load(path)
        x = _probe_rows(check)
        try:
            z = transform(fs, x, layout="dense", dtype=spec.get("dtype", "float32"))
        except Exception as e:
            return f"transform of the sampled file fails: {type(e).__name__}: {_short(str(e))}"
        return np.asarray(z, dtype=np.float64), x, fs.eof is not None and fs.columns == int(
            fs.eof.meta["grid_features"])

    got = _in_child(run)
    if isinstance(got, str):
        return got
    z, x, whole = got
    if check.get("box"):
        return _zero_rows_in_box(z, x, check["box"], whole)
    return None if np.isfinite(z).all() else "non-finite features from finite rows through the sampled file"


def _check_obsm(out, check, cfg):
    """--obsm: the copy holds the input's X unchanged and obsm[KEY] = the rows' features."""
    import h5py

    key = check["key"]
    with h5py.File(out, "r") as f:
        if "obsm" not in f or not isinstance(f["obsm"], h5py.Group) or key not in f["obsm"]:
            return f"no obsm/{key} in the output"
    z, _ = _read_x(out, f"obsm/{key}")
    if z.shape != (check["rows"], check["columns"]):
        return f"obsm/{key} has shape {z.shape}, expected {(check['rows'], check['columns'])}"
    if not np.isfinite(z).all():
        return f"non-finite values in obsm/{key}"
    x_out, _ = _read_x(out, "X")
    x_in = _probe_rows(check)
    if x_out.shape != x_in.shape or not np.array_equal(x_out, x_in):
        return "the output's X differs from the input's"
    return None


def _reference_rows(rows: dict) -> np.ndarray:
    """The unscaled rows of the scale-invariance oracle: the scaled rows as the case stored
    them, scaled back by 2^-k (exact: the scaling may have rounded subnormals, this does not)."""
    from . import gen_rows

    if "scale" not in rows:
        return gen_rows.make_array(rows)
    return np.ldexp(gen_rows.make_array(dict(rows, mode="scaled")), -int(rows["scale"]))


def _reference_transform(cfg, ref, d):
    """Features of the unscaled rows (the scale-invariance oracle), dense float64."""
    from rfsgen import features, transform

    fs = features.load(str(fixtures.path_of(cfg.cache, ref["fixture"])))
    x = _reference_rows(ref["rows"])
    return np.asarray(transform(fs, x, layout="dense", dtype="float64"), dtype=np.float64)


def _reference_kernel(cfg, ref, d):
    from rfsgen import kernel, parse_skeleton

    skel = parse_skeleton(fixtures.skeleton_text(ref["skeleton"]), "ref.yaml")
    x = _reference_rows(ref["rows"])
    return kernel(skel, x)


def _in_child(fn, *args):
    """Run ``fn(*args)`` in a forked process (compiled code never runs in the forking process)."""
    import pickle

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
            val = fn(*args)
        except BaseException as e:
            val = f"reference failed: {type(e).__name__}: {_short(str(e))}"
        data = pickle.dumps(val)
        with os.fdopen(w, "wb") as fh:
            fh.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if data:
        return pickle.loads(data)
    how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status) else \
        f"exit {os.WEXITSTATUS(status)}"
    return f"reference process died ({how})"


# ----------------------------------------------------------------------------- one case
def run_case(case, cfg: Config, workdir=None) -> dict:
    d = Path(tempfile.mkdtemp(prefix=f"fz-{case['kind']}-", dir=workdir))
    try:
        try:
            materialize(case, d, cfg)
        except Exception as e:
            return {"id": case["id"], "kind": case["kind"], "class": "skipped",
                    "detail": f"could not build the case: {type(e).__name__}: {_short(str(e))}"}
        pre = set(p.name for p in d.iterdir())
        case = dict(case, output_preexists=bool(case.get("output")) and case["output"] in pre)
        res = execute(case, d, cfg)
        cls, detail = judge(case, d, res, cfg)
        return {"id": case["id"], "kind": case["kind"], "class": cls, "detail": detail, "rc": res["rc"],
                "elapsed": res["elapsed"], "stderr": res["stderr"][-2000:], "maxrss_mib": res["maxrss"] >> 20}
    finally:
        if not cfg.keep:
            shutil.rmtree(d, ignore_errors=True)


def signature(result) -> str:
    """What makes two failures the same bug for the summary: kind, class and the message's shape."""
    detail = re.sub(r"0x[0-9a-f]+", "0x?", result.get("detail", ""))
    detail = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", detail)
    detail = re.sub(r"'[^']*'", "'?'", detail)
    return f"{result['kind']}|{result['class']}|{detail[:120]}"


def save_case(case, result, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / f"{case['id']}.json"
    rec = {"case": case, "result": {k: v for k, v in result.items() if k != "stderr"},
           "stderr_tail": result.get("stderr", "")[-1500:]}
    p.write_text(json.dumps(rec, indent=1, default=str))
    return p

"""rfsgen benchmarks against scikit-learn's RBFSampler (``make bench``).

Prints a table and writes ``bench-output/bench.json``.  Not collected by the test
suite.  Measures, on the machine it runs on:

* sampling: ``rfsgen sample`` cifar-deep at D = 1e5 and 1e6 end to end through the CLI,
  on one thread and on every core, with the in-process sampling and write times and
  peak RSS;
* start-up: the first ``rfsgen transform`` of 64 rows with an empty numba cache, warm
  runs, ``rfsgen --help``;
* gaussian atoms: mnist-conv.yaml at D = 4096 on 1e4 Fashion-MNIST rows in memory,
  against RBFSampler at the same D;
* rks (issue 26): plain random Fourier features against RBFSampler at equal D, in
  memory, alternately: a single gaussian node at d = 784 and 3072 (D = 4096, 16384),
  a single laplace node at d = 32 (D = 2048, 1e5 rows), a gaussian node on CSR rows
  (d = 1e4, 1% stored, D = 2048; RBFSampler on the same CSR matrix), mnist-conv and
  cifar-patches (D = 4096), with the profile of rfsgen's time (angles and cos/sin,
  products into columns; or the one pass of a single gaussian or laplace group);
* sparse rows: CSR rows (d = 1e4, 1% stored, D = 2048, 2e4 rows) through one gaussian node,
  read as CSR by the angle loop, against the same rows densified per chunk and against
  RBFSampler on the same CSR matrix, alternately (ratio peer / rfsgen);
* heavy-tailed columns (issue 26): ``step`` against ``relu`` over the same sphere
  ``coordinate`` node at equal D (2048, 1e4 rows, d = 64 and 784), alternately, with
  the product loop's and the log-domain loop's shares;
* peak memory (issue 26): the in-memory transform of every shipped skeleton (features
  sampled beforehand, in another process) against RBFSampler fit + transform on the
  same rows at equal D (4096, 1e4 rows), each in a process of its own;
* thread scaling: the in-memory transform at D = 1e4 on 1e4 rows, for both shipped
  skeletons, on 1 thread and on 2, 4, ... up to every core (``numba.set_num_threads``),
  whole and its computation alone (into an output already in memory);
* in-memory transform at D = 1e4 on 1e4 rows of 24x24x3 float32, for both shipped
  skeletons, against ``RBFSampler(n_components=1e4)`` fit + transform on the same rows,
  run alternately (A B A B ...), medians and ratios;
* end to end through the CLI (``rfsgen sample`` + ``rfsgen transform``, dense and csr)
  on 5e4 rows against ``peer_rbf.py`` (RBFSampler + h5py), alternately;
* storage: feature-file bytes against RBFSampler's fitted weights;
* exact kernel: 128 x 128 rows of cifar-deep;
* the floor: numpy cos over an output-sized float32 array plus writing its bytes to HDF5;
* transform peak RSS at 1e4 and 1e5 rows (same chunk size);
* dask (issue 26): ``rfsgen.dask.transform_file`` on a LocalCluster of 2 worker processes
  x 1 thread on 127.0.0.1 (the workers writing shards that are merged here, and
  ``gather``: the chunks sent here), against a local run on 2 threads, cifar-deep dense
  and csr, alternately; the copy merge of 4 dense uncompressed shards (bytes copied,
  and through h5py) in GB/s of output, beside copying one file of that size
  (``shutil.copyfile``) on the same disk;
* checks: the cost of the outputs' integrity record (docs/integrity.md): cifar-deep
  transform to a file and merge of two shards, dense and csr, with the data checksums
  on and off (``DataChecksum`` made a no-op), alternately; min, median and paired
  overheads, in one process and then each run in a process of its own
  (``--check-processes`` rounds).

Data: real CIFAR-10 rows from ``../shared/data/cifar10/cifar10_exact_subset.npz``
(5000 images, tiled to the sizes above, preprocessed like the paper: HWC, center crop
24x24, per-image standardization).  Without that file the 64 test rows shipped in
``tests/data`` are tiled instead (timings do not depend on the pixel values); to use
the full set, download ``cifar-10-python.tar.gz`` from
https://www.cs.toronto.edu/~kriz/cifar.html and pass ``--data`` a ``.npy`` of its
channel-planar uint8 rows.

    python tests/bench/bench.py [--quick] [--only sample,memory,e2e,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))

import cifar  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10" / "cifar10_exact_subset.npz"
SKELETONS = {name: ROOT / "skeletons" / f"{name}.yaml" for name in ("cifar-deep", "shallow-gaussian")}
PY = sys.executable
RFSGEN = [PY, "-m", "rfsgen"]
SECTIONS = ("sample", "startup", "gaussian", "rks", "sparse", "heavy", "threads", "memory", "peak", "e2e", "storage", "kernel", "floor",
            "rss", "fixed_order", "eof", "checks", "dask", "gpu")


# ----------------------------------------------------------------------------- helpers
def load_rows(data: str | None, n: int) -> tuple[np.ndarray, str]:
    """``n`` preprocessed float32 rows (n, 1728) and a note on where they came from."""
    if data:
        raw = np.load(data)
        note = f"{raw.shape[0]} rows of {data}"
    elif DEFAULT_DATA.exists():
        z = np.load(DEFAULT_DATA)
        raw = np.concatenate([z["test_data"], z["train_data"]])
        note = f"{raw.shape[0]} CIFAR-10 images from {DEFAULT_DATA.relative_to(ROOT.parent)}"
    else:
        raw = np.load(ROOT / "tests" / "data" / "cifar10_test_0-63.npy")
        note = (f"only the 64 CIFAR-10 rows in tests/data ({DEFAULT_DATA} is missing; see this script's "
                "docstring for how to get more)")
        print(f"bench: {note}", file=sys.stderr)
    x = cifar.preprocess(raw.astype(np.uint8)).astype(np.float32)
    reps = -(-n // x.shape[0])
    return np.tile(x, (reps, 1))[:n], note + (f", tiled to {n}" if reps > 1 else "")


# A small launcher process: on Linux a child's peak RSS starts from its parent's at
# fork time, so children forked straight from this (large) process would all report
# at least its size.  The launcher is small, forks the real command and reports its rusage.
_LAUNCHER = (
    "import os,subprocess,sys; p=subprocess.Popen(sys.argv[1:]); _,st,ru=os.wait4(p.pid,0); "
    "sys.stderr.write('\\nRSS_KIB=%d\\n' % ru.ru_maxrss); sys.exit(os.waitstatus_to_exitcode(st))"
)


def run_rss(argv, env=None) -> tuple[float, float, str]:
    """Run a command; (wall seconds, its peak RSS in MiB, its stdout)."""
    t = time.perf_counter()
    p = subprocess.run([PY, "-c", _LAUNCHER] + [str(a) for a in argv], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"bench: {' '.join(map(str, argv))} failed:\n{p.stderr}")
    rss = int(p.stderr.rsplit("RSS_KIB=", 1)[1]) / 1024
    return seconds, rss, p.stdout


def alternate(fns: dict, repeats: int) -> dict:
    """Run each callable in turn, ``repeats`` rounds (A B A B ...); all timings per name."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


def med(v):
    return statistics.median(v)


def paired_overhead(on, off, resamples: int = 2000):
    """The median of the run-by-run ratios ``on[i] / off[i] - 1`` (each pair run side
    by side, so that a slow spell of a shared machine slows both) and its 95% bootstrap
    interval (fixed seed), as ``(median, (low, high))``."""
    r = np.asarray(on) / np.asarray(off) - 1
    rng = np.random.default_rng(0)
    boot = np.median(r[rng.integers(0, r.size, (resamples, r.size))], axis=1)
    return float(np.median(r)), (float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975)))


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import h5py
    import scipy
    import sklearn

    return {
        "cpu": model or platform.processor(), "cores": os.cpu_count(), "memory_gib": round(mem, 1),
        "python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
        "h5py": h5py.__version__, "sklearn": sklearn.__version__, "platform": platform.platform(),
    }


# ----------------------------------------------------------------------------- sections
def _threads_env(threads):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    if threads:
        env["NUMBA_NUM_THREADS"] = str(threads)
    return env


def bench_sample(args, tmp, res):
    """``rfsgen sample`` end to end through the CLI (start-up, sampling, the file write),
    on one thread and on every core, plus the in-process sampling time and the write."""
    out = []
    for d in args.sample_sizes:
        for threads in (1, None):
            env = _threads_env(threads)
            code = (
                "import json,time,os; from rfsgen import load_skeleton, sample, save_features; "
                f"s=load_skeleton({str(SKELETONS['cifar-deep'])!r}); t=time.perf_counter(); "
                f"fs=sample(s,{d},seed=1); t1=time.perf_counter(); "
                f"save_features(fs, {str(tmp / 'inproc.h5')!r}, overwrite=True); t2=time.perf_counter(); "
                "print(json.dumps({'seconds':t1-t,'write_s':t2-t1,'draws':fs.draws}))"
            )
            p = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, check=True)
            r = json.loads(p.stdout)
            cli = []
            for _ in range(args.sample_repeats):
                t = time.perf_counter()
                _, rss, _ = run_rss(RFSGEN + ["sample", SKELETONS["cifar-deep"], "-n", d, "--seed", 1, "-o",
                                              tmp / "s.h5", "--overwrite", "-q"], env=env)
                cli.append(time.perf_counter() - t)
            r.update(columns=d, threads=threads or os.cpu_count(), cli_s=med(cli), cli_runs=cli, rss_mib=rss,
                     columns_per_s=d / r["seconds"], file_bytes=(tmp / "s.h5").stat().st_size)
            out.append(r)
            print(f"  sample cifar-deep D={d:>8}, {r['threads']:>2} thread(s): CLI {r['cli_s']:.2f} s "
                  f"(runs {', '.join(f'{v:.2f}' for v in cli)}), in process {r['seconds']:.2f} s + write "
                  f"{r['write_s']:.2f} s, q={r['draws']}, peak RSS {r['rss_mib']:.0f} MiB", flush=True)
    res["sample"] = out


def bench_startup(args, tmp, res):
    """First-run cost: ``rfsgen transform`` of 64 rows with an empty numba cache, then warm;
    ``rfsgen --help``."""
    rows = tmp / "rows64.npy"
    x, _ = load_rows(args.data, 64)
    np.save(rows, x)
    feats = tmp / "f4096.h5"
    subprocess.run(RFSGEN + ["sample", SKELETONS["cifar-deep"], "-n", "4096", "--seed", "1", "-o", feats, "-q"],
                   check=True)
    out = {}
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp / "empty-numba-cache"))
    argv = RFSGEN + ["transform", feats, rows, "-o", tmp / "t.h5", "--overwrite", "-q"]
    out["cold_transform_s"], _, _ = run_rss(argv, env=env)
    warm = [run_rss(argv, env=env)[0] for _ in range(3)]
    out["warm_transform_s"], out["warm_runs"] = med(warm), warm
    helps = [run_rss(RFSGEN + ["--help"])[0] for _ in range(3)]
    out["help_s"], out["help_runs"] = med(helps), helps
    # The floor of any warm run: a fresh Python calling one trivial numba function loaded from
    # numba's cache (numba's import, its CPU target's start-up and its BLAS check's scipy.linalg).
    (tmp / "numba_floor.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1.0\n")
    floor_argv = [PY, "-c", "import numba_floor; numba_floor.f(1.0)"]
    floor_env = dict(env, PYTHONPATH=str(tmp))
    run_rss(floor_argv, env=floor_env)  # compiles into the cache
    floors = [run_rss(floor_argv, env=floor_env)[0] for _ in range(3)]
    out["numba_floor_s"], out["numba_floor_runs"] = med(floors), floors
    res["startup"] = out
    print(f"  start-up: first transform of 64 rows (empty numba cache) {out['cold_transform_s']:.2f} s, warm "
          f"{out['warm_transform_s']:.2f} s ({', '.join(f'{v:.2f}' for v in warm)}), --help {out['help_s']:.2f} s; "
          f"the floor, one cached numba function in a fresh Python: {out['numba_floor_s']:.2f} s "
          f"({', '.join(f'{v:.2f}' for v in floors)}), warm transform ÷ floor = "
          f"{out['warm_transform_s'] / out['numba_floor_s']:.2f}", flush=True)


def bench_gaussian(args, tmp, res):
    """Gaussian atoms: mnist-conv.yaml at D = 4096 on 1e4 Fashion-MNIST rows (standardised
    pixels) in memory, against RBFSampler at the same D, alternately."""
    from sklearn.kernel_approximation import RBFSampler

    from rfsgen import load_skeleton, sample, transform

    sys.path.insert(0, str(ROOT / "tests" / "learn"))
    import learn

    data = ROOT.parent / "shared" / "data"
    try:
        xtr = learn.load_fashion(data, args.gaussian_rows)[0]
        note = "Fashion-MNIST training rows"
    except SystemExit:
        xtr = np.load(ROOT / "tests" / "data" / "fashion_mnist_test_0-31.npy").reshape(-1, 784).astype(np.float32)
        note = "the 32 Fashion-MNIST rows in tests/data, tiled"
    reps = -(-args.gaussian_rows // xtr.shape[0])
    x = np.ascontiguousarray(np.tile(xtr, (reps, 1))[:args.gaussian_rows], dtype=np.float32)
    fs = sample(load_skeleton(ROOT / "skeletons" / "mnist-conv.yaml"), args.gaussian_columns, seed=1)
    transform(fs, x[:64], layout="dense")

    def ours():
        transform(fs, x, layout="dense")

    def peer():
        RBFSampler(n_components=args.gaussian_columns, gamma=1.0 / x.shape[1], random_state=0).fit(x).transform(x)

    times = alternate({"rfsgen": ours, "rbfsampler": peer}, args.repeats)
    r = {"rows": x.shape[0], "columns": args.gaussian_columns, "data": note, "runs": times,
         "rfsgen_s": med(times["rfsgen"]), "rbfsampler_s": med(times["rbfsampler"]),
         "gaussian_atoms": int(fs.omega.size // 25)}
    r["speedup"] = r["rbfsampler_s"] / r["rfsgen_s"]
    res["gaussian"] = r
    print(f"  mnist-conv D={r['columns']} on {r['rows']} rows ({r['gaussian_atoms']} gaussian atoms): rfsgen "
          f"{r['rfsgen_s']:.3f} s ({', '.join(f'{v:.2f}' for v in times['rfsgen'])}), RBFSampler "
          f"{r['rbfsampler_s']:.3f} s, peer/rfsgen = {r['speedup']:.2f}x", flush=True)


def _rks_cases(args):
    """(name, skeleton text or path, input rows, D, RBFSampler gamma, scheme) of the rks section.
    The gaussian nodes also run with ``--scheme orf`` at the first D: its [cos, sin] pairs
    share one angle per frequency (half of RBFSampler's multiply-adds at the same D)."""
    rng = np.random.default_rng(0)
    n = args.rks_rows

    def node(d, base, scale):
        return f"rfsgen: 1\ninput: {{width: {d}}}\nnodes:\n  - {{name: x, base: {base}, scale: {scale}}}\noutput: x\n"

    cases = []
    for d in (784, 3072):
        x = rng.standard_normal((n, d)).astype(np.float32)
        for D in args.rks_columns:
            cases.append((f"gaussian d={d} D={D}", node(d, "gaussian", 1 / np.sqrt(d)), x, D, 0.5 / d, "rfs"))
        D = args.rks_columns[0]
        cases.append((f"gaussian d={d} D={D} --scheme orf", node(d, "gaussian", 1 / np.sqrt(d)), x, D, 0.5 / d, "orf"))
    x = rng.random((args.rks_laplace_rows, 32)).astype(np.float32)
    cases.append(("laplace d=32 D=2048", node(32, "laplace", 1.0), x, 2048, 0.5, "rfs"))
    import scipy.sparse as sp

    xs = sp.random(args.rks_sparse_rows, 10_000, density=0.01, format="csr", dtype=np.float32, random_state=1)
    cases.append(("gaussian CSR d=1e4 1% D=2048", node(10_000, "gaussian", 0.1), xs, 2048, 0.005, "rfs"))
    mn = rng.standard_normal((n, 784)).astype(np.float32)
    cases.append(("mnist-conv D=4096", ROOT / "skeletons" / "mnist-conv.yaml", mn, 4096, 1 / 784, "rfs"))
    cf = load_rows(args.data, n)[0]
    cases.append(("cifar-patches D=4096", ROOT / "skeletons" / "cifar-patches.yaml", cf, 4096, 1 / 1728, "rfs"))
    return cases


def bench_rks(args, tmp, res):
    """Plain random Fourier features (issue 26's goals) against RBFSampler at equal D,
    alternately, with where rfsgen's time goes (one extra run split into its steps)."""
    from sklearn.kernel_approximation import RBFSampler

    from rfsgen import load_skeleton, parse_skeleton, sample, transform
    from rfsgen._compiled import columns as product_columns
    from rfsgen.transform import Transformer

    out = []
    for name, skel, x, D, gamma, scheme in _rks_cases(args):
        sk = load_skeleton(skel) if isinstance(skel, Path) else parse_skeleton(skel, "rks.yaml")
        fs = sample(sk, D, seed=1, scheme=scheme)
        transform(fs, x[:64], layout="dense")  # compile / load the cache

        def ours():
            transform(fs, x, layout="dense")

        def peer():
            RBFSampler(n_components=D, gamma=gamma, random_state=0).fit(x).transform(x)

        times = alternate({"rfsgen": ours, "rbfsampler": peer}, args.repeats)
        tr = Transformer(fs, np.float32)
        dense = x.toarray() if hasattr(x, "toarray") else x
        if tr.phase_products:  # one pass (rfsgen._sincos32.phase_columns): no split to profile
            o = np.empty((dense.shape[0], tr.columns), np.float32)
            t0 = time.perf_counter()
            tr.chunk(dense, out=o)
            profile = {"angles, cos/sin and products in one pass": time.perf_counter() - t0}
        else:
            t0 = time.perf_counter()
            src = tr.source(dense)
            t1 = time.perf_counter()
            o = np.empty((dense.shape[0], tr.columns), np.float32)
            product_columns(src, tr.ir, tr.cr, tr.ii, tr.ci, tr.xatom, tr.xpow, tr.fidx, tr.fptr, tr.sc, tr.imag,
                            tr.pos, o, tr.real)
            t2 = time.perf_counter()
            profile = {"rows, angles and cos/sin": t1 - t0, "products into columns": t2 - t1}
        r = {"case": name, "rows": int(x.shape[0]), "columns": D, "atoms": int(tr.ir.size), "runs": times,
             "rfsgen_s": min(times["rfsgen"]), "rbfsampler_s": min(times["rbfsampler"]),
             "rfsgen_range_s": [min(times["rfsgen"]), max(times["rfsgen"])],
             "rbfsampler_range_s": [min(times["rbfsampler"]), max(times["rbfsampler"])],
             "profile_s": profile}
        r["speedup"] = r["rbfsampler_s"] / r["rfsgen_s"]
        out.append(r)
        print(f"  {name}, {r['rows']} rows ({r['atoms']} atoms): rfsgen {r['rfsgen_s']:.3f} s "
              f"({', '.join(f'{v:.2f}' for v in times['rfsgen'])}), RBFSampler {r['rbfsampler_s']:.3f} s "
              f"({', '.join(f'{v:.2f}' for v in times['rbfsampler'])}), peer/rfsgen = {r['speedup']:.2f}x; profile: "
              + ", ".join(f"{k} {v:.2f} s" for k, v in r["profile_s"].items()), flush=True)
    res["rks"] = out


def bench_sparse(args, tmp, res):
    """CSR rows (d = 1e4, 1% stored, ``args.sparse_rows`` rows, float32) through one gaussian
    node at D = 2048, in memory, alternately: rfsgen reading the CSR rows as they are (the
    angle loop sums the stored values only), rfsgen with each chunk densified first (the
    path before: ``rfsgen.inputs.chunks_for`` made to give dense chunks), and RBFSampler fit
    + transform on the same CSR matrix; the same bytes both ways (checked)."""
    import scipy.sparse as sp
    from sklearn.kernel_approximation import RBFSampler

    import rfsgen.inputs as inputs
    from rfsgen import parse_skeleton, sample, transform

    d, D = 10_000, 2048
    xs = sp.random(args.sparse_rows, d, density=0.01, format="csr", dtype=np.float32, random_state=1)
    sk = parse_skeleton(f"rfsgen: 1\ninput: {{width: {d}}}\nnodes:\n  - {{name: x, base: gaussian, scale: 0.1}}\n"
                        "output: x\n", "sparse.yaml")
    fs = sample(sk, D, seed=1)
    real = inputs.chunks_for

    def densified(src, tr, chunk_rows, start=0, stop=None):
        return src.chunks(chunk_rows, start, stop)

    def dense_chunks():
        inputs.chunks_for = densified
        try:
            return transform(fs, xs, layout="dense")
        finally:
            inputs.chunks_for = real

    a, b = transform(fs, xs[:500], layout="dense"), None  # compile / load the cache
    inputs.chunks_for = densified
    try:
        b = transform(fs, xs[:500], layout="dense")
    finally:
        inputs.chunks_for = real
    assert a.tobytes() == b.tobytes(), "the CSR path's bytes differ from the densified path's"
    times = alternate({"rfsgen": lambda: transform(fs, xs, layout="dense"), "rfsgen_densified": dense_chunks,
                       "rbfsampler": lambda: RBFSampler(n_components=D, gamma=0.005, random_state=0).fit(xs)
                       .transform(xs)}, args.repeats)
    r = {"rows": args.sparse_rows, "width": d, "density": 0.01, "columns": D, "runs": times}
    for k, v in times.items():
        r[f"{k}_s"], r[f"{k}_range_s"] = min(v), [min(v), max(v)]
    r["speedup"] = r["rbfsampler_s"] / r["rfsgen_s"]
    r["speedup_densified"] = r["rbfsampler_s"] / r["rfsgen_densified_s"]
    res["sparse"] = r
    print(f"  CSR rows d=1e4 1% D={D}, {r['rows']} rows: rfsgen {r['rfsgen_s']:.3f} s "
          f"({', '.join(f'{v:.2f}' for v in times['rfsgen'])}), densified per chunk {r['rfsgen_densified_s']:.3f} s "
          f"({', '.join(f'{v:.2f}' for v in times['rfsgen_densified'])}), RBFSampler {r['rbfsampler_s']:.3f} s "
          f"({', '.join(f'{v:.2f}' for v in times['rbfsampler'])}); peer/rfsgen = {r['speedup']:.2f}x "
          f"(densified: {r['speedup_densified']:.2f}x)", flush=True)


def _sphere_activation(d, act):
    return (f"rfsgen: 1\ninput: {{width: {d}}}\nnodes:\n  - {{name: x, base: sphere, scheme: coordinate}}\n"
            f"  - {{name: y, activation: {act}, inputs: [x]}}\noutput: y\n")


def bench_heavy(args, tmp, res):
    """``step`` over a sphere node (a heavy-tailed degree law: powers in the millions,
    columns computed in the log domain) against ``relu`` over the same node, equal D,
    in memory, alternately; then one more run of each split into the product loop and
    the log-domain loop."""
    import warnings

    from rfsgen import parse_skeleton, sample, transform
    from rfsgen._compiled import columns as product_columns, log_domain_columns
    from rfsgen.transform import Transformer

    out = []
    rng = np.random.default_rng(0)
    for d, rows in ((d, rows) for rows in args.heavy_rows for d in args.heavy_widths):
        x = rng.standard_normal((rows, d)).astype(np.float32)
        fss, trs = {}, {}
        for act in ("relu", "step"):
            with warnings.catch_warnings():  # step over coordinate: the infinite-variance warning
                warnings.simplefilter("ignore")
                fss[act] = sample(parse_skeleton(_sphere_activation(d, act), "heavy.yaml"), args.heavy_columns, seed=1)
            transform(fss[act], x[:64], layout="dense")  # compile / load the cache
            trs[act] = Transformer(fss[act], np.float32)
        times = alternate({a: (lambda fs=fs: transform(fs, x, layout="dense")) for a, fs in fss.items()}, args.repeats)
        prof = {}
        for act, tr in trs.items():
            src = tr.source(x)
            o = np.zeros((x.shape[0], tr.columns), np.float32)
            t0 = time.perf_counter()
            product_columns(src, tr.ir, tr.cr, tr.ii, tr.ci, tr.xatom, tr.xpow, tr.fidx, tr.fptr, tr.sc, tr.imag,
                            tr.pos, o, tr.real)
            t1 = time.perf_counter()
            if tr.huge.size:
                log_domain_columns(src, tr.ir, tr.cr, tr.ii, tr.ci, tr.huge_uatom, tr.huge, tr.huge_ptr, tr.huge_local,
                                   tr.huge_power, tr.huge_log_sc, tr.huge_sign, tr.huge_imag, o, tr.huge_odd,
                                   tr.huge_easy)
            t2 = time.perf_counter()
            prof[act] = {"products_s": t1 - t0, "log_domain_s": t2 - t1, "log_domain_columns": int(tr.huge.size),
                         "log_domain_terms": int(tr.huge_power.size), "product_factors": int(tr.fidx.size)}
        r = {"d": d, "rows": int(x.shape[0]), "columns": args.heavy_columns, "runs": times,
             "relu_s": min(times["relu"]), "step_s": min(times["step"]), "profile": prof}
        r["ratio"] = r["step_s"] / r["relu_s"]
        out.append(r)
        print(f"  step vs relu over sphere d={d}, D={args.heavy_columns}, {r['rows']} rows: step {r['step_s']:.3f} s, "
              f"relu {r['relu_s']:.3f} s, step/relu = {r['ratio']:.2f}x; step: products {prof['step']['products_s']:.3f} s "
              f"({prof['step']['product_factors']} factors), log domain {prof['step']['log_domain_s']:.3f} s "
              f"({prof['step']['log_domain_columns']} columns, {prof['step']['log_domain_terms']} terms)", flush=True)
    res["heavy"] = out


_PEAK = """
import sys, warnings
import numpy as np
warnings.simplefilter("ignore")
who, feats, rows, D = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
x = np.load(rows)
if who == "rfsgen":
    from rfsgen import load_features, transform
    transform(load_features(feats), x, layout="dense")
else:
    from sklearn.kernel_approximation import RBFSampler
    RBFSampler(n_components=D, gamma=1.0 / x.shape[1], random_state=0).fit(x).transform(x)
"""


def bench_peak(args, tmp, res):
    """Peak RSS of the in-memory transform of every shipped skeleton against RBFSampler
    fit + transform at equal D on the same float32 rows, each in a fresh process (the
    features sampled beforehand in another: the transform's peak, not sampling's)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import load_shipped, rows_for

    from rfsgen import SamplerError, sample, save_features

    out = []
    for path in sorted((ROOT / "skeletons").glob("*.yaml")):
        s = load_shipped(str(path))
        feats = tmp / f"peak-{path.stem}.h5"
        n = args.peak_columns
        while True:  # a skeleton with fewer distinct features (categorical-poly): (nearly) all of them
            try:
                fs = sample(s, n, seed=1)
                break
            except SamplerError as e:
                most = re.search(r"at most ([0-9,]+)", str(e))
                cap = int(most.group(1).replace(",", "")) if most else n
                n = cap if cap < n else max(1, n * 19 // 20)
        save_features(fs, feats, overwrite=True)
        for m in args.peak_rows:  # the fixed part (numba's compiler and code) weighs less at more rows
            rows = tmp / f"peak-{path.stem}-{m}.npy"
            np.save(rows, rows_for(s, m, seed=0).astype(np.float32))
            r = {"skeleton": path.stem, "rows": m, "columns": fs.columns}
            for who in ("rfsgen", "rbfsampler"):
                r[f"{who}_s"], r[f"{who}_rss_mib"], _ = run_rss([PY, "-c", _PEAK, who, feats, rows, fs.columns])
            r["ratio"] = r["rfsgen_rss_mib"] / r["rbfsampler_rss_mib"]
            out.append(r)
            print(f"  peak RSS {path.stem:>18}, {m} rows, D = {fs.columns}: rfsgen "
                  f"{r['rfsgen_rss_mib']:.0f} MiB, RBFSampler {r['rbfsampler_rss_mib']:.0f} MiB "
                  f"(rfsgen/RBFSampler = {r['ratio']:.2f})", flush=True)
            rows.unlink()
        feats.unlink()
    res["peak"] = out


def bench_threads(args, tmp, res):
    """The in-memory transform on 1, 2, 4, ... threads up to every core, alternately: the
    whole ``transform`` call, and the computation alone (``Transformer.chunk`` into an
    output already faulted in)."""
    import numba

    from rfsgen import load_skeleton, sample, transform
    from rfsgen.transform import Transformer

    x, _ = load_rows(args.data, args.rows)
    counts = sorted({min(2 ** k, numba.config.NUMBA_NUM_THREADS) for k in range(8)})
    out = []
    for name, path in SKELETONS.items():
        fs = sample(load_skeleton(path), args.columns, seed=1)
        tr = Transformer(fs, np.float32)
        buf = np.zeros((x.shape[0], tr.columns), dtype=np.float32)
        tr.chunk(x[:256], out=buf[:256])  # warm up imports and caches

        def on(threads, fn):
            def run():
                numba.set_num_threads(threads)
                try:
                    fn()
                finally:
                    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
            return run

        fns = {}
        for t in counts:
            fns[("transform", t)] = on(t, lambda: transform(fs, x, layout="dense"))
            fns[("compute", t)] = on(t, lambda: tr.chunk(x, out=buf))
        times = alternate(fns, args.repeats)
        r = {"skeleton": name, "rows": x.shape[0], "columns": args.columns}
        for what in ("transform", "compute"):
            r[what] = {str(t): med(times[(what, t)]) for t in counts}
            r[what + "_runs"] = {str(t): times[(what, t)] for t in counts}
            r[what + "_speedup"] = {t: r[what]["1"] / v for t, v in r[what].items()}
        out.append(r)
        for what in ("transform", "compute"):
            print(f"  threads {name:>16}, {x.shape[0]} rows, D = {args.columns}, {what:>9}: "
                  + ", ".join(f"{t}: {v:.3f} s ({r[what + '_speedup'][t]:.2f}x)" for t, v in r[what].items()),
                  flush=True)
    res["threads"] = out


def bench_memory(args, tmp, res):
    from sklearn.kernel_approximation import RBFSampler

    from rfsgen import load_skeleton, sample, transform

    x, _ = load_rows(args.data, args.rows)
    out = []
    for name, path in SKELETONS.items():
        fs = sample(load_skeleton(path), args.columns, seed=1)
        transform(fs, x[:256], layout="dense")  # warm up imports and caches

        def ours():
            transform(fs, x, layout="dense")

        def peer():
            RBFSampler(n_components=args.columns, gamma=1.0 / (8 * x.shape[1]), random_state=0).fit(x).transform(x)

        times = alternate({"rfsgen": ours, "rbfsampler": peer}, args.repeats)
        r = {
            "skeleton": name, "rows": x.shape[0], "columns": args.columns,
            "rfsgen_s": med(times["rfsgen"]), "rbfsampler_s": med(times["rbfsampler"]), "runs": times,
        }
        r["rows_per_s"] = x.shape[0] / r["rfsgen_s"]
        r["speedup"] = r["rbfsampler_s"] / r["rfsgen_s"]
        out.append(r)
        print(f"  in-memory {name:>16}: rfsgen {r['rfsgen_s']:.3f} s ({r['rows_per_s']:,.0f} rows/s), "
              f"RBFSampler {r['rbfsampler_s']:.3f} s, peer/rfsgen = {r['speedup']:.2f}x", flush=True)
    res["memory"] = out


def bench_e2e(args, tmp, res):
    x, _ = load_rows(args.data, args.e2e_rows)
    rows = tmp / "rows.npy"
    np.save(rows, x)
    del x
    feats = tmp / "f.h5"
    skel = SKELETONS["cifar-deep"]

    def rfsgen_job(layout):
        def job():
            s1, r1, _ = run_rss(RFSGEN + ["sample", skel, "-n", args.columns, "--seed", 1, "-o", feats, "--overwrite"])
            s2, r2, _ = run_rss(RFSGEN + ["transform", feats, rows, "-o", tmp / f"out-{layout}.h5", "--layout",
                                          layout, "--quiet", "--overwrite"])
            os.unlink(tmp / f"out-{layout}.h5")
            return {"sample_s": s1, "transform_s": s2, "seconds": s1 + s2, "rss_mib": max(r1, r2)}
        return job

    def peer_job():
        s, r, stdout = run_rss([PY, ROOT / "tests" / "bench" / "peer_rbf.py", rows, tmp / "peer.h5", "-n", args.columns,
                                "--gamma", 1.0 / (8 * 1728)])
        os.unlink(tmp / "peer.h5")
        return {"seconds": s, "rss_mib": r, "phases": json.loads(stdout)}

    jobs = {"rfsgen_dense": rfsgen_job("dense"), "rfsgen_csr": rfsgen_job("csr"), "rbfsampler_h5py": peer_job}
    runs = {k: [] for k in jobs}
    for _ in range(args.e2e_repeats):
        for k, fn in jobs.items():
            runs[k].append(fn())
    startup, _, _ = run_rss(RFSGEN + ["--version"])
    out = {"rows": args.e2e_rows, "columns": args.columns, "runs": runs, "rfsgen_startup_s": startup}
    for k, v in runs.items():
        out[f"{k}_s"] = med([r["seconds"] for r in v])
        out[f"{k}_rss_mib"] = max(r["rss_mib"] for r in v)
    out["speedup_dense"] = out["rbfsampler_h5py_s"] / out["rfsgen_dense_s"]
    out["speedup_csr"] = out["rbfsampler_h5py_s"] / out["rfsgen_csr_s"]
    phases = runs["rbfsampler_h5py"][-1]["phases"]
    print(f"  end to end {args.e2e_rows} rows: rfsgen dense {out['rfsgen_dense_s']:.2f} s "
          f"(sample {med([r['sample_s'] for r in runs['rfsgen_dense']]):.2f} s, "
          f"RSS {out['rfsgen_dense_rss_mib']:.0f} MiB), csr {out['rfsgen_csr_s']:.2f} s, "
          f"RBFSampler+h5py {out['rbfsampler_h5py_s']:.2f} s (fit+transform {phases['fit_transform']:.2f} s, "
          f"write {phases['write']:.2f} s, RSS {out['rbfsampler_h5py_rss_mib']:.0f} MiB); "
          f"peer/rfsgen dense {out['speedup_dense']:.2f}x, csr {out['speedup_csr']:.2f}x; "
          f"rfsgen start-up {startup:.2f} s", flush=True)
    res["e2e"] = out


def bench_storage(args, tmp, res):
    from sklearn.kernel_approximation import RBFSampler

    from rfsgen import load_skeleton, sample
    from rfsgen.features import save

    out = []
    x = np.zeros((2, 1728), np.float32)
    peer = RBFSampler(n_components=args.columns, random_state=0).fit(x)
    peer_bytes = peer.random_weights_.nbytes + peer.random_offset_.nbytes
    for name, path in SKELETONS.items():
        fs = sample(load_skeleton(path), args.columns, seed=1)
        p = tmp / f"{name}.h5"
        save(fs, p, overwrite=True)
        size = p.stat().st_size
        out.append({"skeleton": name, "columns": args.columns, "feature_file_bytes": size,
                    "rbfsampler_weight_bytes": peer_bytes, "ratio": peer_bytes / size})
        print(f"  storage {name:>16}: feature file {size:,} B, RBFSampler weights (float32) {peer_bytes:,} B, "
              f"{peer_bytes / size:,.0f}x smaller", flush=True)
    res["storage"] = out


def bench_kernel(args, tmp, res):
    from rfsgen import kernel, load_skeleton

    x, _ = load_rows(args.data, 128)
    skel = load_skeleton(SKELETONS["cifar-deep"])
    times = alternate({"kernel": lambda: kernel(skel, x.astype(np.float64))}, 3)["kernel"]
    res["kernel"] = {"rows": 128, "seconds": med(times), "runs": times}
    print(f"  exact kernel cifar-deep 128x128: {med(times):.2f} s", flush=True)


def bench_floor(args, tmp, res):
    import h5py

    a = np.random.default_rng(0).standard_normal((args.rows, args.columns), dtype=np.float32)

    def cos():
        np.cos(a, out=a)

    def write():
        with h5py.File(tmp / "floor.h5", "w") as f:
            f.create_dataset("X", data=a)

    t = alternate({"cos": cos, "write": write}, args.repeats)
    os.unlink(tmp / "floor.h5")
    r = {"rows": args.rows, "columns": args.columns, "cos_s": med(t["cos"]), "write_s": med(t["write"])}
    r["floor_s"] = r["cos_s"] + r["write_s"]
    mem = {m["skeleton"]: m["rfsgen_s"] for m in res.get("memory", [])}
    r["memory_over_cos"] = {k: v / r["cos_s"] for k, v in mem.items()}
    r["memory_over_floor"] = {k: v / r["floor_s"] for k, v in mem.items()}
    res["floor"] = r
    print(f"  floor {args.rows}x{args.columns} float32: cos {r['cos_s']:.3f} s + HDF5 write {r['write_s']:.3f} s"
          + "".join(f"; {k} in-memory / floor = {v:.2f}x" for k, v in r["memory_over_floor"].items()), flush=True)


def bench_rss(args, tmp, res):
    feats = tmp / "rss-features.h5"
    run_rss(RFSGEN + ["sample", SKELETONS["cifar-deep"], "-n", args.rss_columns, "--seed", 1, "-o", feats,
                      "--overwrite"])
    base, _ = load_rows(args.data, 10_000)
    out = []
    for n in args.rss_rows:
        rows = tmp / f"rss-{n}.npy"
        np.save(rows, np.tile(base, (-(-n // base.shape[0]), 1))[:n])
        s, rss, _ = run_rss(RFSGEN + ["transform", feats, rows, "-o", tmp / "rss-out.h5", "--layout", "csr",
                                      "--chunk-rows", 1024, "--quiet", "--overwrite"])
        os.unlink(tmp / "rss-out.h5")
        os.unlink(rows)
        out.append({"rows": n, "columns": args.rss_columns, "seconds": s, "rss_mib": rss})
        print(f"  transform RSS {n:>7} rows x {args.rss_columns} columns (csr, chunk 1024): {rss:.0f} MiB, "
              f"{s:.1f} s", flush=True)
    res["rss"] = out


def bench_fixed_order(args, tmp, res):
    """What byte-reproducibility across CPUs costs: the fixed-order compiled loops that
    replaced BLAS/LAPACK, timed against the calls they replaced on the same data."""
    import numba

    from rfsgen._compiled import orthonormal_rows
    from rfsgen.bases import phases_of

    rng = np.random.default_rng(0)
    m, w, a = (args.rows // 5, 1728, 2048) if not args.quick else (200, 1728, 256)
    xp = rng.standard_normal((m, 1, w))
    om = rng.standard_normal((a, w)) * 0.01
    node = np.zeros(a, dtype=np.int64)
    phases_of(xp[:8], node, om)  # compile / load the cache

    def fixed():
        phases_of(xp, node, om)

    def blas():
        theta = xp[:, 0] @ om.T
        np.cos(theta), np.sin(theta)

    times = alternate({"fixed": fixed, "blas": blas}, args.repeats)
    d = 1728 if not args.quick else 256
    g = rng.standard_normal((d, d))
    orthonormal_rows(g[:4].copy())

    def gram_schmidt():
        orthonormal_rows(np.ascontiguousarray(g.T))

    def lapack():
        np.linalg.qr(g)

    qr = alternate({"gram_schmidt": gram_schmidt, "lapack": lapack}, max(2, args.repeats // 2))
    r = {"rows": m, "width": w, "atoms": a, "threads": numba.get_num_threads(),
         "angles_fixed_s": med(times["fixed"]), "angles_blas_s": med(times["blas"]),
         "orf_block": d, "orf_gram_schmidt_s": med(qr["gram_schmidt"]), "orf_lapack_s": med(qr["lapack"])}
    r["angles_cost"] = r["angles_fixed_s"] / r["angles_blas_s"]
    r["orf_cost"] = r["orf_gram_schmidt_s"] / r["orf_lapack_s"]
    res["fixed_order"] = r
    print(f"  fixed-order angles {m} rows x {a} gaussian atoms of width {w}: {r['angles_fixed_s']:.3f} s vs BLAS + "
          f"numpy cos/sin {r['angles_blas_s']:.3f} s ({r['angles_cost']:.2f}x); ORF block {d}x{d}: Gram-Schmidt "
          f"{r['orf_gram_schmidt_s']:.2f} s vs LAPACK QR {r['orf_lapack_s']:.2f} s ({r['orf_cost']:.1f}x)", flush=True)


# ----------------------------------------------------------------------------- main
def bench_eof(args, tmp, res):
    """EOF (issue 24's goals): d = 32, D = 2048 (a uniform subset of level 3's 2,177
    features), rows uniform in the unit cube; in memory and to a CSR file, against
    RBFSampler-style RKS for the Laplace kernel (Cauchy frequencies; numpy: x @ W + b,
    cos, float32, the same steps RBFSampler takes) and rfsgen's own single laplace node at
    equal D; then sampling an EOF file of 10^6 columns."""
    from rfsgen import parse_skeleton, sample, transform
    from rfsgen import eof as _eof
    from rfsgen.features import save
    from rfsgen.transform import transform_file

    d, D, n = 32, args.eof_columns, args.eof_rows
    skel = parse_skeleton(f"rfsgen: 1\ninput: {{width: {d}}}\nnodes:\n"
                          f"  - {{name: x, base: laplace, scale: 1.0, domain: [0, 1]}}\noutput: x\n", "eof.yaml")
    x = np.random.default_rng(0).random((n, d)).astype(np.float32)
    fs_eof = _eof.sample(skel, columns=D, seed=1)
    fs_lap = sample(skel, D, seed=1)
    save(fs_eof, tmp / "eof.h5")
    save(fs_lap, tmp / "lap.h5")
    np.save(tmp / "x.npy", x)
    rng = np.random.default_rng(0)
    W = rng.standard_cauchy((d, D)).astype(np.float32)
    b = rng.uniform(0, 2 * np.pi, D).astype(np.float32)
    transform(fs_eof, x[:64], layout="csr")
    transform(fs_lap, x[:64], layout="dense")

    def rks():
        z = x @ W
        z += b
        np.cos(z, out=z)
        z *= np.float32(np.sqrt(2.0 / D))

    def eof_file():
        transform_file(tmp / "eof.h5", tmp / "x.npy", tmp / "eof-out.h5", layout="csr", overwrite=True)

    def lap_file():
        transform_file(tmp / "lap.h5", tmp / "x.npy", tmp / "lap-out.h5", layout="dense", overwrite=True)

    # In memory first, then the files: a file's write-back still running during the next
    # round's RKS made RKS about twice as slow when they alternated, flattering EOF.
    times = alternate({"eof": lambda: transform(fs_eof, x, layout="csr"), "rks": rks,
                       "laplace": lambda: transform(fs_lap, x, layout="dense")}, args.repeats)
    times.update(alternate({"eof_file": eof_file, "laplace_file": lap_file}, args.repeats))
    nnz = transform(fs_eof, x[:1000], layout="csr").nnz / 1000
    t = time.perf_counter()
    big = _eof.sample(parse_skeleton(skel.source, "eof.yaml"), columns=10**6, seed=1)
    sample_s = time.perf_counter() - t
    r = {"d": d, "columns": D, "rows": n, "runs": times, "nonzeros_per_row": nnz,
         "level_vectors": fs_eof.eof.meta["level_vectors"], "grid_features": fs_eof.eof.meta["grid_features"],
         "sample_1e6_s": sample_s, "sample_1e6_level": big.eof.meta["level"]}
    for k in times:
        r[k + "_s"] = med(times[k])
    res["eof"] = r
    print(f"  EOF d={d} D={D} {n} rows (level {fs_eof.eof.meta['level']}, {r['level_vectors']} level vectors, "
          f"{nnz:.0f} non-zeros a row): in memory {r['eof_s']:.3f} s, RKS {r['rks_s']:.3f} s "
          f"({r['rks_s'] / r['eof_s']:.2f}x), rfsgen laplace {r['laplace_s']:.3f} s ({r['laplace_s'] / r['eof_s']:.2f}x); "
          f"to a file {r['eof_file_s']:.3f} s (csr) vs laplace {r['laplace_file_s']:.3f} s (dense); "
          f"sampling 10^6 EOF columns {sample_s:.2f} s", flush=True)


#: The methods of rfsgen.output.DataChecksum that hash (switched off, or timed, by
#: :func:`bench_checks`).  ``csr_parts`` also makes the CSR pieces of a chunk, which the
#: transform does with the checks off too: off, it makes them without hashing; timed,
#: its share includes making them.
_HASHES = ("dense", "csr", "csr_parts")


def _no_check(self, *a):
    return None


def _parts_unchecked(self, vals, row0, full_indices=None):
    from rfsgen.output import _sparse_parts

    return _sparse_parts(vals, full_indices)


#: The checks switched off: no hash; a CSR transform's pieces made without one.
_UNCHECKED = {"dense": _no_check, "csr": _no_check, "csr_parts": _parts_unchecked}


def _patch_checks(output, methods):
    """Set DataChecksum's hashing methods from ``methods`` (a dict by name, e.g.
    :data:`_UNCHECKED`; None: no change).  Returns the ones it had."""
    was = {k: getattr(output.DataChecksum, k) for k in _HASHES}
    for k, f in (methods or {}).items():
        setattr(output.DataChecksum, k, f)
    return was


def _checks_op(what: str, layout: str, on: bool, tmp: Path):
    """The operation of one case of :func:`bench_checks`: the transform to a file, or the
    merge of the two shards written with the checks ``on`` or off."""
    from rfsgen.merge import merge_files
    from rfsgen.transform import transform_file

    tag = "on" if on else "off"
    if what == "transform":
        return lambda: transform_file(tmp / "checks-f.h5", tmp / "checks-x.npy", tmp / f"checks-o-{layout}-{tag}.h5",
                                      layout=layout, overwrite=True)
    return lambda: merge_files([tmp / f"checks-s{i}-{layout}-{on}.h5" for i in range(2)],
                               tmp / f"checks-m-{layout}-{tag}.h5", overwrite=True)


def _checks_case(name: str, tmp: Path, runs: int = 3) -> dict:
    """One case of :func:`bench_checks` (``transform-csr-on``, ``merge-dense-off``, ..)
    run in this process: once to warm up, then ``runs`` times.  Returns the wall and CPU
    seconds of those runs."""
    from rfsgen import output

    what, layout, mode = name.split("-")
    if mode == "off":
        _patch_checks(output, _UNCHECKED)
    run = _checks_op(what, layout, mode == "on", tmp)
    wall, cpu = [], []
    for k in range(runs + 1):
        c, w = time.process_time(), time.perf_counter()
        run()
        if k:
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
    return {"wall": wall, "cpu": cpu}


def _checks_processes(tmp: Path, rounds: int) -> dict:
    """Each case of :func:`bench_checks` in processes of its own, on and off alternately
    (which goes first alternates too), ``rounds`` times: what one process's memory
    layout, huge pages and thread placement do to a case lasts for that process, and in
    one process one case was seen 15-40% slower throughout; a process per run spreads
    that over both sides.  Returns per case the medians of each process's runs."""
    import subprocess

    cases = [f"{w}-{lay}" for lay in ("dense", "csr") for w in ("transform", "merge")]
    out = {f"{c}-{m}": {"wall": [], "cpu": []} for c in cases for m in ("on", "off")}
    for r in range(rounds):
        for c in cases:
            for m in (("on", "off") if r % 2 == 0 else ("off", "on")):
                got = subprocess.run([sys.executable, __file__, "--checks-case", f"{c}-{m}", str(tmp)],
                                     capture_output=True, text=True, check=True).stdout
                one = json.loads(got.strip().splitlines()[-1])
                out[f"{c}-{m}"]["wall"].append(med(one["wall"]))
                out[f"{c}-{m}"]["cpu"].append(med(one["cpu"]))
    return out


def bench_checks(args, tmp, res):
    """Transform (cifar-deep, D = ``args.check_columns``, ``args.check_rows`` rows, to a
    file) and merge of two shards, dense and csr, with the record's data checksums on
    and off (:class:`rfsgen.output.DataChecksum`'s hashing methods switched off,
    :data:`_UNCHECKED`:
    shards written without them carry zero sums, which their merge "verifies"; off, a
    merge also skips the values' checks that run in the same pass: finite values, and
    a CSR shard's canonical columns and no stored zeros), each
    pair run alternately ``args.check_repeats`` times.  Wall time, and the process's CPU
    time (all threads): on a shared, loaded machine the CPU time's difference is the
    steadier measure of the checks' work."""
    import contextlib
    import threading

    from rfsgen import load_skeleton, output, sample
    from rfsgen.features import save
    from rfsgen.transform import transform_file

    n = args.check_rows
    x, _ = load_rows(args.data, n)
    np.save(tmp / "checks-x.npy", x)
    del x
    save(sample(load_skeleton(SKELETONS["cifar-deep"]), args.check_columns, seed=1), tmp / "checks-f.h5",
         overwrite=True)
    orig = _patch_checks(output, None)

    @contextlib.contextmanager
    def checks(on):
        if not on:
            _patch_checks(output, _UNCHECKED)
        try:
            yield
        finally:
            _patch_checks(output, orig)

    def transform(layout, on):
        op = _checks_op("transform", layout, on, tmp)

        def run():
            with checks(on):
                op()
        return run

    def merge(layout, on):
        parts = [tmp / f"checks-s{i}-{layout}-{on}.h5" for i in range(2)]
        with checks(on):
            for p, (a, b) in zip(parts, [(0, n // 2), (n // 2, n)]):
                transform_file(tmp / "checks-f.h5", tmp / "checks-x.npy", p, layout=layout, overwrite=True,
                               rows=f"{a}:{b}")

        op = _checks_op("merge", layout, on, tmp)

        def run():
            with checks(on):
                op()
        return run

    fns = {}
    for layout in ("dense", "csr"):
        for on in (True, False):
            fns[f"transform-{layout}-{'on' if on else 'off'}"] = transform(layout, on)
        for on in (True, False):
            fns[f"merge-{layout}-{'on' if on else 'off'}"] = merge(layout, on)
    for fn in fns.values():  # compile and warm up
        fn()
    t = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(args.check_repeats):  # alternately, as alternate() does, with CPU time too
        for name, fn in fns.items():
            c, w = time.process_time(), time.perf_counter()
            fn()
            t[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    out = {"rows": n, "columns": args.check_columns, "repeats": args.check_repeats, "runs": t, "cpu_runs": cpu}
    # The direct measure: the checksum calls' own CPU time (each made on its calling
    # thread, so that thread_time sees all of it) over the operation's, in runs of their own.
    share = {}
    lock = threading.Lock()
    for name, fn in fns.items():
        if name.endswith("-on"):
            spent = [0.0]

            def timed(orig):
                def call(self, *a):
                    self.threads = False
                    c0 = time.thread_time()
                    try:
                        return orig(self, *a)
                    finally:
                        with lock:
                            spent[0] += time.thread_time() - c0
                return call

            shares = []
            for _ in range(3):
                spent[0] = 0.0
                _patch_checks(output, {k: timed(f) for k, f in orig.items()})
                try:
                    c = time.process_time()
                    fn()  # checks(True) leaves the patch in place, and restores the originals after
                    total = time.process_time() - c
                finally:
                    _patch_checks(output, orig)
                shares.append(spent[0] / max(total, 1e-9))
            share[name[:-3]] = shares
    out["hash_cpu_share"] = share
    for what in ("transform", "merge"):
        for layout in ("dense", "csr"):
            r = {}
            for unit, v in (("", t), ("cpu_", cpu)):
                on, off = v[f"{what}-{layout}-on"], v[f"{what}-{layout}-off"]
                r.update({f"{unit}on_min_s": min(on), f"{unit}off_min_s": min(off), f"{unit}on_median_s": med(on),
                          f"{unit}off_median_s": med(off)})
                r[f"{unit}overhead_min"] = min(on) / min(off) - 1
                r[f"{unit}overhead_median"] = med(on) / med(off) - 1
                r[f"{unit}overhead_paired"], r[f"{unit}overhead_paired_ci"] = paired_overhead(on, off)
            sh = share[f"{what}-{layout}"]
            r["hash_cpu_share_min"], r["hash_cpu_share_max"] = min(sh), max(sh)
            out[f"{what}_{layout}"] = r
            print(f"  checks {what} {layout} {n} x {args.check_columns}: on {r['on_min_s']:.3f} s, off "
                  f"{r['off_min_s']:.3f} s (min); overhead wall {100 * r['overhead_min']:+.1f}% (min), "
                  f"{100 * r['overhead_median']:+.1f}% (median), {100 * r['overhead_paired']:+.1f}% (paired median, "
                  f"95% CI {100 * r['overhead_paired_ci'][0]:+.1f}..{100 * r['overhead_paired_ci'][1]:+.1f}%), "
                  f"CPU {100 * r['cpu_overhead_min']:+.1f}% (min), {100 * r['cpu_overhead_median']:+.1f}% (median), "
                  f"{100 * r['cpu_overhead_paired']:+.1f}% (paired median, 95% CI "
                  f"{100 * r['cpu_overhead_paired_ci'][0]:+.1f}..{100 * r['cpu_overhead_paired_ci'][1]:+.1f}%); "
                  f"the checksum's own CPU "
                  f"{100 * r['hash_cpu_share_min']:.1f}-{100 * r['hash_cpu_share_max']:.1f}% of the operation's",
                  flush=True)
    if args.check_processes:
        proc = _checks_processes(tmp, args.check_processes)
        out["processes"] = {"rounds": args.check_processes, "runs": proc}
        for what in ("transform", "merge"):
            for layout in ("dense", "csr"):
                on, off = proc[f"{what}-{layout}-on"], proc[f"{what}-{layout}-off"]
                r = {"on_median_s": med(on["wall"]), "off_median_s": med(off["wall"])}
                r["overhead_paired"], r["overhead_paired_ci"] = paired_overhead(on["wall"], off["wall"])
                r["cpu_overhead_paired"], r["cpu_overhead_paired_ci"] = paired_overhead(on["cpu"], off["cpu"])
                out[f"{what}_{layout}"]["processes"] = r
                print(f"  checks {what} {layout}, a process per run ({args.check_processes} rounds): on "
                      f"{r['on_median_s']:.3f} s, off {r['off_median_s']:.3f} s (medians); overhead wall "
                      f"{100 * r['overhead_paired']:+.1f}% (paired median, 95% CI "
                      f"{100 * r['overhead_paired_ci'][0]:+.1f}..{100 * r['overhead_paired_ci'][1]:+.1f}%), CPU "
                      f"{100 * r['cpu_overhead_paired']:+.1f}% (95% CI {100 * r['cpu_overhead_paired_ci'][0]:+.1f}.."
                      f"{100 * r['cpu_overhead_paired_ci'][1]:+.1f}%)", flush=True)
    for f in tmp.glob("checks-*"):
        f.unlink()
    res["checks"] = out


def bench_gpu(args, tmp, res):
    """``--device cuda`` against the CPU in memory, where numba's CUDA target finds a GPU
    (skipped with a message otherwise, and under the simulator): plain RFF (rbf.yaml, 784
    columns -> 4096 features) and mnist-conv at D = 4096 on ``args.gaussian_rows`` rows of
    standard normal values, alternately; the bytes of both devices compared first.  Only the
    gaussian/laplace atoms run on the GPU (rfsgen/_cuda.py), the rest on the CPU."""
    from numba.core import config

    from rfsgen import load_skeleton, sample, transform
    from rfsgen._cuda import available
    from rfsgen.skeleton import parse_skeleton

    if config.ENABLE_CUDASIM or not available():
        res["gpu"] = {"skipped": "no GPU: numba's CUDA target finds none here"}
        print("  gpu: skipped (numba's CUDA target finds no GPU here)", flush=True)
        return
    from numba import cuda

    x = np.random.default_rng(0).standard_normal((args.gaussian_rows, 784)).astype(np.float32)
    name = cuda.get_current_device().name
    out = {"device": name.decode() if isinstance(name, bytes) else str(name)}
    for name, skel in (("rbf", parse_skeleton((ROOT / "skeletons" / "rbf.yaml").read_text(), "rbf.yaml",
                                                   width=784)),
                       ("mnist-conv", load_skeleton(ROOT / "skeletons" / "mnist-conv.yaml"))):
        fs = sample(skel, 4096, seed=1)
        same = transform(fs, x[:256], layout="dense").tobytes() == \
            transform(fs, x[:256], layout="dense", device="cuda").tobytes()
        times = alternate({"cpu": lambda: transform(fs, x, layout="dense"),
                           "cuda": lambda: transform(fs, x, layout="dense", device="cuda")}, args.repeats)
        out[name] = {"rows": x.shape[0], "columns": 4096, "same_bytes": same, "runs": times,
                     "cpu_s": med(times["cpu"]), "cuda_s": med(times["cuda"])}
        print(f"  gpu {name}: {x.shape[0]} rows -> 4096, cpu {out[name]['cpu_s']:.3f} s, cuda "
              f"{out[name]['cuda_s']:.3f} s ({out['device']}), same bytes: {same}", flush=True)
    res["gpu"] = out


def bench_dask(args, tmp, res):
    """Local (2 threads) vs Dask (LocalCluster, 2 worker processes x 1 thread): the
    workers writing shards (merged here) and ``gather`` (chunks sent here), cifar-deep
    at D = ``args.dask_columns`` on ``args.dask_rows`` rows to a file, dense and csr,
    alternately ``args.dask_repeats`` times after a warm-up; then the copy merge of
    4 dense uncompressed shards, raw (``rfsgen.merge._RawDense``) and through h5py, and
    ``shutil.copyfile`` of the merged file, in GB/s of output."""
    import shutil

    import distributed
    import numba

    import rfsgen.dask as rd
    import rfsgen.merge as rm
    from rfsgen import load_skeleton, sample
    from rfsgen.features import save
    from rfsgen.transform import transform_file

    n, D = args.dask_rows, args.dask_columns
    x, _ = load_rows(args.data, n)
    xs, fs = tmp / "dask-x.npy", tmp / "dask-f.h5"
    np.save(xs, x)
    del x
    save(sample(load_skeleton(SKELETONS["cifar-deep"]), D, seed=1), fs, overwrite=True)
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    out = {"rows": n, "columns": D, "repeats": args.dask_repeats}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        address = cluster.scheduler_address

        def job(mode, layout):
            target = tmp / f"dask-{mode}-{layout}.h5"

            def run():
                if mode == "local":
                    transform_file(fs, xs, target, layout=layout, overwrite=True)
                else:
                    rd.transform_file(fs, xs, target, scheduler=address, quiet=True, gather=mode == "gather",
                                      layout=layout, overwrite=True)
            return run

        fns = {f"{mode}-{layout}": job(mode, layout) for layout in ("dense", "csr")
               for mode in ("local", "shards", "gather")}
        for fn in fns.values():  # warm-up: compiles (and loads) on the workers too
            fn()
        for layout in ("dense", "csr"):
            want = (tmp / f"dask-local-{layout}.h5").read_bytes()
            for mode in ("shards", "gather"):
                assert (tmp / f"dask-{mode}-{layout}.h5").read_bytes() == want, (mode, layout)
        times = alternate(fns, args.dask_repeats)
    out["runs"] = times
    for layout in ("dense", "csr"):
        local = times[f"local-{layout}"]
        for mode in ("shards", "gather"):
            t = times[f"{mode}-{layout}"]
            out[f"{mode}_{layout}"] = {"min_s": min(t), "median_s": med(t), "local_min_s": min(local),
                                       "local_median_s": med(local), "over_local_min": min(t) / min(local) - 1,
                                       "over_local_median": med(t) / med(local) - 1}
        print(f"  dask {layout} {n} x {D}: local {min(local):.2f}-{max(local):.2f} s, "
              + ", ".join(f"{mode} {min(times[f'{mode}-{layout}']):.2f}-{max(times[f'{mode}-{layout}']):.2f} s "
                          f"({100 * out[f'{mode}_{layout}']['over_local_median']:+.0f}% median)"
                          for mode in ("shards", "gather")), flush=True)
    # The copy merge of dense uncompressed shards.
    parts = [tmp / f"dask-part-{k}.h5" for k in range(4)]
    for k, p in enumerate(parts):
        transform_file(fs, xs, p, layout="dense", overwrite=True, shard=f"{k}/4")
    merged = tmp / "dask-merged.h5"
    applies = rm._RawDense.applies

    def merge(raw):
        def run():
            rm._RawDense.applies = applies if raw else staticmethod(lambda order: False)
            try:
                rm.merge_files(parts, merged, overwrite=True)
            finally:
                rm._RawDense.applies = applies
        return run

    def copy():
        shutil.copyfile(tmp / "dask-local-dense.h5", tmp / "dask-copy.h5")

    mt = alternate({"raw": merge(True), "h5py": merge(False), "copyfile": copy}, args.dask_repeats)
    nbytes = n * D * 4
    out["merge"] = {"bytes": nbytes, "runs": mt, **{f"{k}_gbps": [nbytes / t / 1e9 for t in v] for k, v in mt.items()}}
    print(f"  copy merge of 4 dense shards, {nbytes / 1e9:.2f} GB: "
          + ", ".join(f"{k} {min(out['merge'][k + '_gbps']):.2f}-{max(out['merge'][k + '_gbps']):.2f} GB/s"
                      for k in ("raw", "h5py", "copyfile")), flush=True)
    for f in tmp.glob("dask-*"):
        f.unlink()
    res["dask"] = out


def table(res) -> str:
    lines = ["| measure | rfsgen | peer or floor | peer ÷ rfsgen (floor: rfsgen ÷ floor) |", "|---|---|---|---|"]
    for r in res.get("sample", []):
        lines.append(f"| `rfsgen sample` cifar-deep, D = {r['columns']:.0e}, {r['threads']} thread(s) | "
                     f"{r['cli_s']:.2f} s end to end (sampling {r['seconds']:.2f} s, write {r['write_s']:.2f} s), "
                     f"{r['rss_mib']:.0f} MiB | | |")
    if "startup" in res:
        u = res["startup"]
        lines.append(f"| first `rfsgen transform` of 64 rows, empty numba cache | {u['cold_transform_s']:.2f} s | | |")
        lines.append(f"| warm `rfsgen transform` of 64 rows / `rfsgen --help` | {u['warm_transform_s']:.2f} s / "
                     f"{u['help_s']:.2f} s | one cached numba function, fresh Python {u['numba_floor_s']:.2f} s | "
                     f"{u['warm_transform_s'] / u['numba_floor_s']:.2f}x the floor |")
    if "gaussian" in res:
        g = res["gaussian"]
        lines.append(f"| in-memory mnist-conv, {g['rows']} rows, D = {g['columns']} | {g['rfsgen_s']:.3f} s | "
                     f"RBFSampler {g['rbfsampler_s']:.3f} s | {g['speedup']:.2f} |")
    for r in res.get("rks", []):
        lines.append(f"| in-memory {r['case']}, {r['rows']} rows | {r['rfsgen_s']:.3f} s | RBFSampler "
                     f"{r['rbfsampler_s']:.3f} s | {r['speedup']:.2f} |")
    if "sparse" in res:
        r = res["sparse"]
        lines.append(f"| in-memory CSR rows d=1e4 1% D={r['columns']}, {r['rows']} rows | {r['rfsgen_s']:.3f} s "
                     f"(densified per chunk {r['rfsgen_densified_s']:.3f} s) | RBFSampler {r['rbfsampler_s']:.3f} s | "
                     f"{r['speedup']:.2f} |")
    for r in res.get("heavy", []):
        lines.append(f"| in-memory step over sphere d = {r['d']}, {r['rows']} rows, D = {r['columns']} | "
                     f"{r['step_s']:.3f} s | relu, same node {r['relu_s']:.3f} s | {1 / r['ratio']:.2f} |")
    for r in res.get("peak", []):
        lines.append(f"| peak RSS, in-memory transform {r['skeleton']}, {r['rows']} rows, D = {r['columns']} | "
                     f"{r['rfsgen_rss_mib']:.0f} MiB | RBFSampler {r['rbfsampler_rss_mib']:.0f} MiB | "
                     f"{1 / r['ratio']:.2f} |")
    for r in res.get("threads", []):
        for what in ("transform", "compute"):
            lines.append(f"| in-memory {what} {r['skeleton']}, {r['rows']} rows, D = {r['columns']}, by threads | "
                         + ", ".join(f"{t}: {v:.3f} s ({r[what + '_speedup'][t]:.2f}x)" for t, v in r[what].items())
                         + " | | |")
    for r in res.get("memory", []):
        lines.append(f"| in-memory transform {r['skeleton']}, {r['rows']} rows, D = {r['columns']} | "
                     f"{r['rfsgen_s']:.3f} s ({r['rows_per_s']:,.0f} rows/s) | RBFSampler {r['rbfsampler_s']:.3f} s | "
                     f"{r['speedup']:.2f} |")
    if "e2e" in res:
        e = res["e2e"]
        for lay in ("dense", "csr"):
            lines.append(f"| CLI sample + transform {lay}, {e['rows']} rows, D = {e['columns']} | "
                         f"{e[f'rfsgen_{lay}_s']:.2f} s, {e[f'rfsgen_{lay}_rss_mib']:.0f} MiB | RBFSampler + h5py "
                         f"{e['rbfsampler_h5py_s']:.2f} s, {e['rbfsampler_h5py_rss_mib']:.0f} MiB | "
                         f"{e[f'speedup_{lay}']:.2f} |")
    for r in res.get("storage", []):
        lines.append(f"| feature file {r['skeleton']}, D = {r['columns']} | {r['feature_file_bytes']:,} B | "
                     f"RBFSampler weights {r['rbfsampler_weight_bytes']:,} B | {r['ratio']:,.0f}x smaller |")
    if "kernel" in res:
        lines.append(f"| exact kernel cifar-deep, 128 x 128 | {res['kernel']['seconds']:.2f} s | | |")
    if "floor" in res:
        f = res["floor"]
        for k, v in f["memory_over_floor"].items():
            lines.append(f"| in-memory {k} vs floor (cos {f['cos_s']:.3f} s + write {f['write_s']:.3f} s) | | "
                         f"{f['floor_s']:.3f} s | {v:.2f}x the floor |")
    if "fixed_order" in res:
        f = res["fixed_order"]
        lines.append(f"| gaussian-atom angles, {f['rows']} rows x {f['atoms']} atoms x {f['width']} (fixed order) | "
                     f"{f['angles_fixed_s']:.3f} s | BLAS + numpy cos/sin {f['angles_blas_s']:.3f} s | "
                     f"{1 / f['angles_cost']:.2f} |")
        lines.append(f"| ORF orthogonal block {f['orf_block']} x {f['orf_block']} (fixed-order Gram-Schmidt) | "
                     f"{f['orf_gram_schmidt_s']:.2f} s | LAPACK QR {f['orf_lapack_s']:.2f} s | {1 / f['orf_cost']:.2f} |")
    if "eof" in res:
        e = res["eof"]
        lines.append(f"| EOF transform in memory, d = {e['d']}, D = {e['columns']}, {e['rows']} rows "
                     f"({e['nonzeros_per_row']:.0f} non-zeros a row) | {e['eof_s']:.3f} s | RKS (numpy, Cauchy) "
                     f"{e['rks_s']:.3f} s; rfsgen laplace {e['laplace_s']:.3f} s | {e['rks_s'] / e['eof_s']:.2f}; "
                     f"{e['laplace_s'] / e['eof_s']:.2f} |")
        lines.append(f"| EOF transform to a CSR file, same | {e['eof_file_s']:.3f} s | rfsgen laplace, dense file "
                     f"{e['laplace_file_s']:.3f} s | {e['laplace_file_s'] / e['eof_file_s']:.2f} |")
        lines.append(f"| EOF sample, 10^6 columns (level {e['sample_1e6_level']}) | {e['sample_1e6_s']:.2f} s | | |")
    for r in res.get("rss", []):
        lines.append(f"| transform peak RSS, {r['rows']} rows, D = {r['columns']} | {r['rss_mib']:.0f} MiB | | |")
    if "checks" in res:
        c = res["checks"]
        lines.append(f"| integrity checks (data checksums on vs off), cifar-deep, {c['rows']} rows, D = {c['columns']} | "
                     + ", ".join(f"{w} {lay} {100 * c[f'{w}_{lay}']['overhead_min']:+.1f}% (median "
                                 f"{100 * c[f'{w}_{lay}']['overhead_median']:+.1f}%; paired "
                                 f"{100 * c[f'{w}_{lay}']['overhead_paired']:+.1f}%, 95% CI "
                                 f"{100 * c[f'{w}_{lay}']['overhead_paired_ci'][0]:+.1f}.."
                                 f"{100 * c[f'{w}_{lay}']['overhead_paired_ci'][1]:+.1f}%; CPU paired "
                                 f"{100 * c[f'{w}_{lay}']['cpu_overhead_paired']:+.1f}%"
                                 f"; checksum's own CPU {100 * c[f'{w}_{lay}']['hash_cpu_share_max']:.1f}% at most)"
                                 for w in ("transform", "merge") for lay in ("dense", "csr")) + " | | |")
        if "processes" in c:
            lines.append(f"| integrity checks, a process per run, {c['processes']['rounds']} rounds | "
                         + ", ".join(f"{w} {lay} {100 * c[f'{w}_{lay}']['processes']['overhead_paired']:+.1f}% (95% CI "
                                     f"{100 * c[f'{w}_{lay}']['processes']['overhead_paired_ci'][0]:+.1f}.."
                                     f"{100 * c[f'{w}_{lay}']['processes']['overhead_paired_ci'][1]:+.1f}%)"
                                     for w in ("transform", "merge") for lay in ("dense", "csr")) + " | | |")
    if "dask" in res:
        d = res["dask"]
        for lay in ("dense", "csr"):
            for mode in ("shards", "gather"):
                r = d[f"{mode}_{lay}"]
                lines.append(f"| Dask 2 workers x 1 thread ({mode}), cifar-deep {lay}, {d['rows']} rows, "
                             f"D = {d['columns']} | {r['median_s']:.2f} s (min {r['min_s']:.2f}) | local 2 threads "
                             f"{r['local_median_s']:.2f} s (min {r['local_min_s']:.2f}) | "
                             f"{r['local_median_s'] / r['median_s']:.2f} ({100 * r['over_local_median']:+.0f}%) |")
        m = d["merge"]
        lines.append(f"| copy merge of 4 dense shards, {m['bytes'] / 1e9:.2f} GB | raw "
                     f"{min(m['raw_gbps']):.2f}-{max(m['raw_gbps']):.2f} GB/s, h5py {min(m['h5py_gbps']):.2f}-"
                     f"{max(m['h5py_gbps']):.2f} GB/s | copyfile (disk) {min(m['copyfile_gbps']):.2f}-"
                     f"{max(m['copyfile_gbps']):.2f} GB/s | |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--checks-case"]:  # one case of the checks section, in a process of its own
        print(json.dumps(_checks_case(argv[1], Path(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench-output"))
    ap.add_argument("--data", default=None, help=".npy of channel-planar uint8 CIFAR rows (default: shared data)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--quick", action="store_true", help="small sizes, to check the script itself")
    ap.add_argument("--rks-rows", dest="rks_rows_given", type=int, default=None, help="rows of the rks section's cases (laplace: 10x)")
    ap.add_argument("--check-repeats", dest="check_repeats_given", type=int, default=None,
                    help="alternate runs of each case of the checks section (default 7)")
    ap.add_argument("--check-processes", dest="check_processes_given", type=int, default=None,
                    help="rounds of the checks section's cases each in a process of its own (default 6; 0: none)")
    ap.add_argument("--check-rows", dest="check_rows_given", type=int, default=None,
                    help="rows of the checks section (default 10000; the end-to-end rows are 50000)")
    ap.add_argument("--dask-rows", dest="dask_rows_given", type=int, default=None, help="rows of the dask section")
    ap.add_argument("--dask-columns", dest="dask_columns_given", type=int, default=None, help="D of the dask section")
    args = ap.parse_args(argv)
    args.columns, args.rows, args.repeats = 10_000, 10_000, 5
    args.sample_sizes, args.e2e_rows, args.e2e_repeats = (10**5, 10**6), 50_000, 2
    args.sample_repeats, args.gaussian_rows, args.gaussian_columns = 3, 10_000, 4096
    args.rss_rows, args.rss_columns = (10_000, 100_000), 10_000
    args.eof_rows, args.eof_columns = 100_000, 2048
    args.rks_rows, args.rks_laplace_rows, args.rks_sparse_rows, args.rks_columns = 10_000, 100_000, 10_000, (4096, 16384)
    args.check_rows, args.check_columns, args.check_repeats, args.check_processes = 10_000, 10_000, 7, 6
    args.dask_rows, args.dask_columns, args.dask_repeats = 20_000, 10_000, 3
    # 10^5 rows: the speed issue's case (per-call set-up weighs in at 10^4)
    args.heavy_widths, args.heavy_rows, args.heavy_columns = (64, 784), (10_000, 100_000), 2048
    args.sparse_rows = 20_000
    args.peak_rows, args.peak_columns = (10_000, 40_000), 4096
    if args.quick:
        args.heavy_rows, args.heavy_columns = (1000,), 512
        args.sparse_rows = 1000
        args.peak_rows, args.peak_columns = (1000,), 512
        args.rks_rows, args.rks_laplace_rows, args.rks_sparse_rows, args.rks_columns = 300, 3000, 300, (4096,)
        args.columns, args.rows, args.repeats = 1000, 1000, 2
        args.sample_sizes, args.e2e_rows, args.e2e_repeats = (10**4,), 2000, 1
        args.sample_repeats, args.gaussian_rows, args.gaussian_columns = 1, 500, 256
        args.rss_rows, args.rss_columns = (1000, 4000), 500
        args.eof_rows, args.eof_columns = 2000, 256
        args.check_rows, args.check_columns, args.check_repeats, args.check_processes = 1000, 1000, 2, 1
        args.dask_rows, args.dask_columns, args.dask_repeats = 2000, 1000, 2
    if args.check_repeats_given:
        args.check_repeats = args.check_repeats_given
    if args.check_rows_given:
        args.check_rows = args.check_rows_given
    if args.check_processes_given is not None:
        args.check_processes = args.check_processes_given
    if args.dask_rows_given:
        args.dask_rows = args.dask_rows_given
    if args.dask_columns_given:
        args.dask_columns = args.dask_columns_given
    if args.rks_rows_given:
        n = args.rks_rows_given
        args.rks_rows, args.rks_laplace_rows, args.rks_sparse_rows = n, 10 * n, n
    only = [s for s in args.only.split(",") if s]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    _, data_note = load_rows(args.data, 1)
    res = {"date": datetime.date.today().isoformat(), "machine": machine(), "data": data_note,
           "command": "make bench" if not argv and len(sys.argv) == 1 else " ".join(sys.argv)}
    print(f"rfsgen bench on {res['machine']['cpu']} ({res['machine']['cores']} cores, "
          f"{res['machine']['memory_gib']} GiB), {res['date']}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rfsgen-bench-") as tmp:
        for name in SECTIONS:
            if name in only:
                globals()[f"bench_{name}"](args, Path(tmp), res)
    (out / "bench.json").write_text(json.dumps(res, indent=1))
    print("\n" + table(res))
    print(f"\nwrote {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

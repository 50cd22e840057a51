"""Scale-out measurements: one local transform, shards + merge, and a Dask cluster.

    python tests/bench/scale_out.py [--rows 200000] [--columns 10000] [--out DIR] [--work DIR]

On ``--rows`` CIFAR rows (tiled from ``../shared/data``, see bench.py), cifar-deep,
``--columns`` D, dense float32 output:

* one local ``rfsgen transform`` (all cores);
* 4 shards (``--shard K/4``) run two at a time, then ``rfsgen merge`` (a copy) and
  ``rfsgen merge --virtual``;
* ``rfsgen transform --dask-scheduler`` with a local ``dask scheduler`` and 2 ``dask
  worker`` processes of ``cores / 2`` threads each (the same cores as the local run).

Prints wall seconds and peak RSS of each (the workers' peaks too), checks that the
outputs are identical, and writes JSON.  Needs about 4x the output size on disk in
``--work`` (8 GB per copy at the default size).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import PY, ROOT, load_rows, machine, run_rss  # noqa: E402

from rfsgen.transform import file_sha256  # noqa: E402

RFSGEN = [PY, "-m", "rfsgen"]


def x_digest(path) -> str:
    import h5py

    h = hashlib.sha256()
    with h5py.File(path, "r") as f:
        x = f["X"]
        for a in range(0, x.shape[0], 4096):
            h.update(np.ascontiguousarray(x[a:a + 4096]).tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--columns", type=int, default=10_000)
    ap.add_argument("--data", default=None)
    ap.add_argument("--work", type=Path, default=None, help="Scratch directory (default: a temporary one).")
    ap.add_argument("--out", type=Path, default=Path("bench-output"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rfsgen-scale-", dir=args.work))
    cores = os.cpu_count() or 2
    res = {"machine": machine(), "rows": args.rows, "columns": args.columns}
    x, note = load_rows(args.data, args.rows)
    np.save(work / "rows.npy", x)
    del x
    res["data"] = note
    feats = work / "f.h5"
    subprocess.run(RFSGEN + ["sample", str(ROOT / "skeletons" / "cifar-deep.yaml"), "-n", str(args.columns),
                             "--seed", "1", "-o", str(feats), "-q"], check=True)
    t, rss, _ = run_rss(RFSGEN + ["transform", feats, work / "rows.npy", "-o", work / "local.h5", "--layout", "dense",
                                  "-q"])
    res["local"] = {"seconds": t, "rss_mib": rss}
    print(f"local transform           {t:7.1f} s   peak RSS {rss:6.0f} MiB", flush=True)
    want = file_sha256(work / "local.h5")

    # 4 shards, two at a time, each with half the cores.
    env = dict(os.environ, NUMBA_NUM_THREADS=str(max(1, cores // 2)))
    t0 = time.perf_counter()
    shard_rss = []
    for pair in ((0, 1), (2, 3)):
        procs = [subprocess.Popen([PY, "-c", "import os,subprocess,sys; p=subprocess.Popen(sys.argv[1:]); "
                                   "_,st,ru=os.wait4(p.pid,0); print(ru.ru_maxrss)"] + [str(a) for a in RFSGEN] +
                                  ["transform", str(feats), str(work / "rows.npy"), "-o", str(work / f"part-{k}.h5"),
                                   "--layout", "dense", "--shard", f"{k}/4", "-q"], env=env, stdout=subprocess.PIPE,
                                  text=True) for k in pair]
        for p in procs:
            out, _ = p.communicate()
            shard_rss.append(int(out.strip()) / 1024)
    t_shards = time.perf_counter() - t0
    parts = [work / f"part-{k}.h5" for k in range(4)]
    t_merge, rss_merge, _ = run_rss(RFSGEN + ["merge", *parts, "-o", work / "merged.h5", "-q"])
    t_virtual, rss_virtual, _ = run_rss(RFSGEN + ["merge", *parts, "-o", work / "virtual.h5", "--virtual", "-q"])
    res["shards"] = {"seconds": t_shards, "rss_mib": max(shard_rss), "merge_seconds": t_merge,
                     "merge_rss_mib": rss_merge, "virtual_seconds": t_virtual, "virtual_rss_mib": rss_virtual,
                     "merged_identical": file_sha256(work / "merged.h5") == want}
    res["shards"]["virtual_X_identical"] = x_digest(work / "virtual.h5") == x_digest(work / "local.h5")
    print(f"4 shards, 2 at a time     {t_shards:7.1f} s   peak RSS {max(shard_rss):6.0f} MiB per shard", flush=True)
    print(f"merge (copy)              {t_merge:7.1f} s   peak RSS {rss_merge:6.0f} MiB   identical bytes: "
          f"{res['shards']['merged_identical']}", flush=True)
    print(f"merge --virtual           {t_virtual:7.1f} s   peak RSS {rss_virtual:6.0f} MiB   identical X: "
          f"{res['shards']['virtual_X_identical']}", flush=True)
    for p in parts + [work / "merged.h5"]:
        p.unlink()

    # A Dask scheduler and 2 workers on the same cores.
    dask_cli = str(Path(PY).parent / "dask")
    sched = work / "scheduler.json"
    procs = [subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(sched)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)]
    try:
        while not sched.exists() or not sched.read_text().strip():
            time.sleep(0.1)
        address = json.loads(sched.read_text())["address"]
        for k in range(2):
            procs.append(subprocess.Popen([dask_cli, "worker", address, "--nthreads", str(max(1, cores // 2)),
                                           "--no-dashboard", "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        from distributed import Client

        with Client(address) as client:
            client.wait_for_workers(2)
            client.run(lambda: __import__("rfsgen.dask") and None)  # imported, as on a long-running cluster
            t, rss, _ = run_rss(RFSGEN + ["transform", feats, work / "rows.npy", "-o", work / "dask.h5", "--layout",
                                          "dense", "-q", "--dask-scheduler", address])
            import resource

            worker_rss = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        res["dask"] = {"seconds": t, "rss_mib": rss, "worker_rss_mib": sorted(worker_rss.values()),
                       "identical": file_sha256(work / "dask.h5") == want}
        print(f"--dask-scheduler, 2 wkrs  {t:7.1f} s   peak RSS {rss:6.0f} MiB here, workers "
              f"{', '.join(f'{v:.0f}' for v in sorted(worker_rss.values()))} MiB   identical bytes: "
              f"{res['dask']['identical']}   overhead {t / res['local']['seconds'] - 1:+.0%}", flush=True)
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait()
        for name in ("rows.npy", "local.h5", "virtual.h5", "dask.h5", "f.h5"):
            (work / name).unlink(missing_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale_out.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

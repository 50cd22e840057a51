"""Selection that accounts for redundancy between columns, on mnist-conv (Fashion-MNIST).

Not run by ``make test``.  Same setup as ``tests/learn/selection.py`` (the table in
docs/selection.md): the first ``--train`` training and ``--test`` test rows of
Fashion-MNIST (``../shared/data``), pixels standardised on the training rows;
``skeletons/mnist-conv.yaml``; a pool of ``--pool-factor`` x D columns (seed s); features
standardised on the training rows; multinomial logistic regression (scikit-learn, lbfgs,
C = 1, 300 iterations); test accuracy per method and seed.

Methods (Zs: the pool's standardised training features, n x N0; Y: the centred one-hot
classes; G = Zs^T Zs):

* ``plain``: ``rfsgen.sample`` of D columns with the same seed (the baseline).
* ``random``: a random D of the pool's columns (a pool-vs-plain sanity check).
* ``corr``: rfsgen's ``corr`` (top D by the correlation ratio), for reference.
* ``greedy lam=g``: forward selection (orthogonal least squares, multi-output) by pivoted
  Cholesky on G: at each step the column m maximising ||Y^T z_m'||^2 / (||z_m'||^2 + g n),
  z_m' its part orthogonal to the columns already kept (the label residual's correlation
  with the column after projecting out the chosen ones); g > 0 damps columns that are
  nearly in the span already.
* ``pivoted-cholesky``: the same without labels (the column of largest residual norm):
  diversity alone.
* ``leverage top`` / ``leverage sample``: ridge leverage scores of the pool's columns,
  l_m = z_m^T (Zs Zs^T + lam n I)^-1 z_m (Bach 2017's optimal sampling density, on the
  pool), lam = ``--lev-lam``; the top D, or D sampled without replacement in proportion.

    NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python tests/reproduce/selection_redundancy.py --D 1024 --seeds 0,1,2 [--out FILE]

The runs behind the tables in docs/selection.md are in
``tests/reproduce/selection_redundancy-results.json``.  About 2 minutes per seed at D = 1024
on one core (the pool's transform, G of 10,240^2, and seven logistic regressions); memory about 2.5 GB.  D = 4096 (pool 40,960)
was run with ``--methods plain,corr,greedy --lams 0.1 --gram-dtype float32`` (G in 6.7 GB,
11 GB in all, 8-13 minutes a seed on a shared 2-core machine).  ``--data`` defaults to
``shared/data`` beside the repository (``--data /path/to/shared/data`` from a worktree).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "learn"))

from selection import DEFAULT_DATA, accuracy, fashion, stats_of  # noqa: E402


def greedy(G: np.ndarray, B: np.ndarray, k: int, ridge: float, use_labels: bool = True) -> np.ndarray:
    """Forward selection by pivoted Cholesky on the Gram ``G`` (N0 x N0) with label
    correlations ``B = Zs^T Y`` (N0 x C): ``k`` column numbers, in the order picked."""
    N0 = G.shape[0]
    d = np.diag(G).copy()
    B = B.copy()
    L = np.zeros((k, N0), dtype=G.dtype)
    picked = np.zeros(N0, bool)
    tiny = 1e-9 * float(d.max())
    out = []
    for j in range(k):
        if use_labels:
            s = np.einsum("mc,mc->m", B, B) / (d + ridge)
        else:
            s = d.copy()
        s[picked | (d <= tiny)] = -np.inf
        p = int(np.argmax(s))
        out.append(p)
        picked[p] = True
        r = np.sqrt(d[p])
        col = (G[:, p] - L[:j, p] @ L[:j]) / r
        L[j] = col
        d -= col * col
        B -= np.outer(col, B[p] / r)
    return np.asarray(out)


def main(argv=None):
    import rfsgen
    from rfsgen.select import _top, _unit, scores

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--D", type=int, default=1024)
    ap.add_argument("--train", type=int, default=5000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--pool-factor", type=int, default=10)
    ap.add_argument("--lams", default="0.001,0.1", help="greedy's damping g (times n)")
    ap.add_argument("--lev-lam", type=float, default=1e-4)
    ap.add_argument("--methods", default="plain,random,corr,greedy,leverage",
                    help="of plain,random,corr,greedy,pivoted-cholesky,leverage,leverage-top")
    ap.add_argument("--C", type=float, default=1.0)
    ap.add_argument("--skeleton", default=str(ROOT / "skeletons" / "mnist-conv.yaml"))
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--gram-dtype", default="float64", help="float32 halves G's memory (D = 4096: 6.7 GB)")
    ap.add_argument("--check", action="store_true",
                    help="verify on the first seed that rfsgen.select(method='greedy') keeps greedy lam=0.1's columns")
    ap.add_argument("--out", type=Path, default=Path("learn-output") / "selection-redundancy.json")
    a = ap.parse_args(argv)
    methods = set(a.methods.split(","))

    xtr, ytr, xte, yte = fashion(a.data, a.train, a.test)
    skel = rfsgen.load_skeleton(a.skeleton)
    D = a.D
    results = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        t0 = time.time()
        acc, secs = {}, {}
        if "plain" in methods:
            plain = rfsgen.sample(skel, D, seed)
            acc["plain"] = accuracy(rfsgen.transform(plain, xtr, layout="dense"), ytr,
                                    rfsgen.transform(plain, xte, layout="dense"), yte, a.C)
        pool = rfsgen.sample(skel, a.pool_factor * D, seed)
        unit = _unit(pool)
        ztr = rfsgen.transform(unit, xtr, layout="dense", dtype="float64")
        zte = rfsgen.transform(unit, xte, layout="dense", dtype="float64")
        st = stats_of(ztr, ytr, 10)
        n, N0 = ztr.shape
        mu, sd = ztr.mean(axis=0), ztr.std(axis=0)
        live = sd > 1e-12 * max(1.0, float(sd.max()))
        sd[~live] = 1.0
        picks = {}
        rng = np.random.default_rng(seed)
        if "random" in methods:
            picks["random"] = np.sort(rng.choice(N0, D, replace=False))
        if "corr" in methods:
            picks["corr"] = np.sort(_top(scores(st, "corr"), D))
        zs = (ztr - mu) / sd
        zs[:, ~live] = 0.0
        if "greedy" in methods or "pivoted-cholesky" in methods:
            t = time.time()
            zg = zs.astype(a.gram_dtype, copy=False)
            G = zg.T @ zg
            del zg
            Y = np.zeros((n, 10))
            Y[np.arange(n), ytr] = 1.0
            Y -= Y.mean(axis=0)
            B = zs.T @ Y
            secs["gram"] = round(time.time() - t, 1)
            if "greedy" in methods:
                for g in [float(s) for s in a.lams.split(",")]:
                    t = time.time()
                    picks[f"greedy lam={g:g}"] = np.sort(greedy(G, B, D, g * n))
                    secs[f"greedy lam={g:g}"] = round(time.time() - t, 1)
            if "pivoted-cholesky" in methods:
                picks["pivoted-cholesky"] = np.sort(greedy(G, B, D, 0.0, use_labels=False))
            del G
        if "leverage" in methods:
            t = time.time()
            K = zs @ zs.T
            K[np.diag_indices(n)] += a.lev_lam * n * N0  # K's scale: trace ~ n N0
            c = np.linalg.cholesky(K)
            del K
            import scipy.linalg

            w = scipy.linalg.solve_triangular(c, zs, lower=True)
            lev = np.einsum("ij,ij->j", w, w)
            del w, c
            secs["leverage"] = round(time.time() - t, 1)
            if "leverage-top" in methods:
                picks["leverage top"] = np.sort(_top(lev, D))
            p = lev / lev.sum()
            picks["leverage sample"] = np.sort(rng.choice(N0, D, replace=False, p=p))
        del zs
        if a.check and not results:
            from rfsgen.select import GREEDY_RIDGE

            fs = rfsgen.select(pool, xtr, ytr, D, method="greedy")
            same = fs.stats["selection"]["kept"] == picks[f"greedy lam={GREEDY_RIDGE:g}"].tolist()
            print(f"check: rfsgen.select(method='greedy') keeps the same columns: {same}", flush=True)
            assert same
        for name, keep in picks.items():
            t = time.time()
            acc[name] = accuracy(ztr[:, keep], ytr, zte[:, keep], yte, a.C)
            secs.setdefault(name, 0.0)
            secs[name] = round(secs[name] + time.time() - t, 1)
        rec = {"D": D, "seed": seed, "pool": N0, "accuracy": acc, "seconds": secs,
               "total_seconds": round(time.time() - t0, 1)}
        results.append(rec)
        print(json.dumps(rec), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "machine": machine,
                                 "results": results}, indent=1))
    names = list(results[0]["accuracy"])
    se = lambda p: (p * (1 - p) / a.test) ** 0.5  # noqa: E731
    print(f"{'method':<22}" + "".join(f"  seed {r['seed']:<5}" for r in results) + "   mean    diff vs plain (se)")
    for nm in names:
        v = np.array([r["accuracy"][nm] for r in results])
        line = f"{nm:<22}" + "".join(f"  {x:>10.4f}" for x in v) + f"  {v.mean():.4f}"
        if "plain" in results[0]["accuracy"]:
            dlt = v - np.array([r["accuracy"]["plain"] for r in results])
            line += f"  {dlt.mean():+.4f} ({dlt.std(ddof=1) / len(dlt) ** 0.5 if len(dlt) > 1 else se(v.mean()):.4f})"
        print(line)


if __name__ == "__main__":
    main()

"""Selection benchmark (issue 25, goal "selection that helps compositional features").

Fashion-MNIST (``../shared/data``), the first ``--train`` training rows and ``--test`` test
rows, pixels standardised on the training rows (mnist-conv's stated preprocessing).  For each
D: a pool of ``--pool-factor`` x D columns of ``skeletons/mnist-conv.yaml`` (seed s); each
selection method keeps D of them (:mod:`rfsgen.select`); "plain" is ``rfsgen.sample`` of D
columns with the same seed.  Features are standardised on the training rows and a
multinomial logistic regression (scikit-learn, lbfgs, C = ``--C``) is fitted; test accuracy
is reported per method and seed.

The pool's training features are computed once per (D, seed) and every method's scores come
from :func:`rfsgen.select.scores` / :func:`rfsgen.select.lkrf_weights` on statistics of those
features (the statistics :func:`rfsgen.select.pool_statistics` streams; ``--check`` verifies
on the first D that ``rfsgen.select`` keeps the same columns).  Columns a method weights 0
(LKRF's q = 0) are zero features, as in the selected file.

    python tests/learn/selection.py [--D 1024] [--train 5000] [--test 2000] [--seeds 0] [--rhos 9,99,999]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
DEFAULT_DATA = ROOT.parent / "shared" / "data"


def fashion(data: Path, n_train: int, n_test: int):
    from learn import _idx

    d = data / "fashion-mnist"
    xtr = _idx(d / "train-images-idx3-ubyte.gz")[:n_train].reshape(n_train, -1).astype(np.float64)
    ytr = _idx(d / "train-labels-idx1-ubyte.gz")[:n_train].astype(np.int64)
    xte = _idx(d / "t10k-images-idx3-ubyte.gz")[:n_test].reshape(n_test, -1).astype(np.float64)
    yte = _idx(d / "t10k-labels-idx1-ubyte.gz")[:n_test].astype(np.int64)
    mu, sd = xtr.mean(axis=0), xtr.std(axis=0)
    sd[sd == 0] = 1.0
    return (xtr - mu) / sd, ytr, (xte - mu) / sd, yte


def accuracy(ztr, ytr, zte, yte, C):
    from sklearn.linear_model import LogisticRegression

    mu, sd = ztr.mean(axis=0), ztr.std(axis=0)
    sd[sd == 0] = 1.0
    clf = LogisticRegression(C=C, max_iter=300)
    clf.fit((ztr - mu) / sd, ytr)
    return float(clf.score((zte - mu) / sd, yte))


def stats_of(z: np.ndarray, y: np.ndarray, n_classes: int):
    from rfsgen.select import Stats

    onehot = np.zeros((y.size, n_classes))
    onehot[np.arange(y.size), y] = 1.0
    return Stats(rows=y.size, by_class=onehot.T @ z, total=z.sum(axis=0), squares=np.einsum("ij,ij->j", z, z),
                 class_rows=np.bincount(y, minlength=n_classes))


def main(argv=None):
    import dataclasses

    import rfsgen
    from rfsgen.select import _top, _unit, chi2_divergence, lkrf_weights, scores

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--D", default="1024")
    ap.add_argument("--train", type=int, default=5000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--pool-factor", type=int, default=10)
    ap.add_argument("--rhos", default="9,99,999", help="LKRF's rho values besides the default N0/D - 1")
    ap.add_argument("--C", type=float, default=1.0)
    ap.add_argument("--skeleton", default=str(ROOT / "skeletons" / "mnist-conv.yaml"))
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--check", action="store_true", help="verify rfsgen.select keeps the same columns (slow)")
    ap.add_argument("--out", type=Path, default=Path("learn-output") / "selection.json")
    a = ap.parse_args(argv)

    xtr, ytr, xte, yte = fashion(a.data, a.train, a.test)
    skel = rfsgen.load_skeleton(a.skeleton)
    results = []
    for D in [int(s) for s in a.D.split(",")]:
        for seed in [int(s) for s in a.seeds.split(",")]:
            t0 = time.time()
            plain = rfsgen.sample(skel, D, seed)
            acc = {"plain": accuracy(rfsgen.transform(plain, xtr, layout="dense"), ytr,
                                     rfsgen.transform(plain, xte, layout="dense"), yte, a.C)}
            pool = rfsgen.sample(skel, a.pool_factor * D, seed)
            unit = _unit(pool)  # z_m: each column at weight 1
            ztr = rfsgen.transform(unit, xtr, layout="dense", dtype="float64")
            zte = rfsgen.transform(unit, xte, layout="dense", dtype="float64")
            st = stats_of(ztr, ytr, 10)
            t_pool = time.time() - t0
            picks = {}
            for method in ("eerf", "corr", "eerf-norm"):
                picks[method] = (np.sort(_top(scores(st, method), D)), None)
            # Variants explored for the goal (not library methods): corr among the columns of
            # below-median variance, and a random D of them (to tell selection from the filter).
            n = float(st.rows)
            var = st.squares / n - (st.total / n) ** 2
            low = (var < np.median(var)) & (var > 1e-12)
            picks["corr, low-variance half"] = (np.sort(_top(np.where(low, scores(st, "corr"), -1.0), D)), None)
            rng = np.random.default_rng(seed)
            picks["random, low-variance half"] = (np.sort(rng.choice(np.flatnonzero(low), D, replace=False)), None)
            v = scores(st, "eerf")
            p = pool.weight / pool.weight.sum()
            rhos = [a.pool_factor - 1.0] + [float(r) for r in a.rhos.split(",") if r and r != "none"]
            lk = {}
            for rho in dict.fromkeys(rhos):
                q = lkrf_weights(v, p, rho)
                keep = np.sort(_top(q, D))
                picks[f"lkrf rho={rho:g}"] = (keep, q[keep] / q[keep].sum())
                lk[f"lkrf rho={rho:g}"] = {"divergence": chi2_divergence(q, p), "positive": int((q > 0).sum())}
            for name, (keep, w) in picks.items():
                a_tr, a_te = ztr[:, keep], zte[:, keep]
                if w is not None:  # zero-weight columns are zero features in the selected file
                    a_tr, a_te = a_tr * (w > 0), a_te * (w > 0)
                acc[name] = accuracy(a_tr, ytr, a_te, yte, a.C)
            if a.check and not results:
                for method in ("eerf", "corr"):
                    fs = rfsgen.select(pool, xtr, ytr, D, method=method)
                    sel = fs.stats["selection"]
                    assert fs.columns == D and sel["pool_columns"] == pool.columns
                    z1 = rfsgen.transform(dataclasses.replace(fs, column_weight=np.ones(D)), xtr[:50], layout="dense",
                                          dtype="float64")
                    assert np.array_equal(z1, ztr[:50, picks[method][0]]), method
            rec = {"D": D, "seed": seed, "pool": pool.columns, "accuracy": acc, "lkrf": lk,
                   "seconds": round(time.time() - t0, 1), "pool_seconds": round(t_pool, 1)}
            results.append(rec)
            print(json.dumps(rec), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"python": platform.python_version(), "machine": platform.machine(), "cpus": __import__("os").cpu_count()}
    a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "machine": machine,
                                 "results": results}, indent=1))
    names = list(results[0]["accuracy"])
    print(f"{'method':<20}" + "".join(f"  D={r['D']} s={r['seed']}" for r in results))
    for n in names:
        print(f"{n:<20}" + "".join(f"  {r['accuracy'][n]:>11.4f}" for r in results))


if __name__ == "__main__":
    main()

"""The scikit-learn estimator on Fashion-MNIST, and sparse rows through a coordinate
skeleton (the measurements of the scikit-learn issue).  Not part of ``make test``.

    python tests/learn/estimator.py [--train 10000] [--D 4096] [--out DIR]

Reads ``../shared/data/fashion-mnist/*.gz`` (the official Fashion-MNIST files;
download them from https://github.com/zalandoresearch/fashion-mnist, ``data/fashion``,
into that directory, or pass ``--data DIR`` holding ``fashion-mnist/``).  Runs, in one process on the same rows:

* ``Pipeline(StandardScaler(), SkeletonFeatures(mnist-conv.yaml, D), LogisticRegression)``,
* ``Pipeline(StandardScaler(), RBFSampler(gamma, D), LogisticRegression)``,
* ``Pipeline(StandardScaler(), LogisticRegression)`` on raw pixels,

with the first ``--train`` training rows and the 10,000 test rows: test accuracy, feature
seconds (fit + transform of train and test) and training seconds.  Then the test rows as
CSR (about half the pixels are 0) through a sphere ``coordinate`` polynomial skeleton:
output density and seconds, sparse input against the same rows dense.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learn import DEFAULT_DATA, cpu, fashion_raw  # noqa: E402

COORDINATE = """
rfsgen: 1
input: {width: auto}
nodes:
  - {name: s, base: sphere, scheme: coordinate, zero: uniform}
  - {name: out, activation: {name: polynomial, degree: 2, c: 0.5}, inputs: [s]}
"""


def timed(f, *a):
    t = time.perf_counter()
    out = f(*a)
    return out, time.perf_counter() - t


def main():
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    import rfsgen
    from rfsgen.sklearn import SkeletonFeatures

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--train", type=int, default=10_000)
    ap.add_argument("--D", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("learn-output"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=ConvergenceWarning)  # max_iter=300 for every model alike
    xtr, ytr, xte, yte = fashion_raw(args.data, args.train)
    xtr, xte = xtr.astype(np.float32), xte.astype(np.float32)
    print(f"Fashion-MNIST: {len(xtr)} train, {len(xte)} test rows; D = {args.D}; {cpu()}, {os.cpu_count()} cores")
    scaler = StandardScaler().fit(xtr)
    str_, ste = scaler.transform(xtr).astype(np.float32), scaler.transform(xte).astype(np.float32)
    gamma = 1.0 / (str_.shape[1] * str_.var())  # scikit-learn's gamma="scale"
    makers = {
        "rfsgen mnist-conv": lambda: SkeletonFeatures(str(ROOT / "skeletons" / "mnist-conv.yaml"), n_components=args.D,
                                                      random_state=args.seed),
        f"RBFSampler gamma={gamma:.2e}": lambda: RBFSampler(gamma=gamma, n_components=args.D, random_state=args.seed),
        "raw pixels": None,
    }
    rows = []
    for name, make in makers.items():
        if make is None:
            ftr, fte, t_feat = str_, ste, 0.0
        else:
            t = time.perf_counter()
            est = make().fit(str_)
            ftr, fte = est.transform(str_), est.transform(ste)
            t_feat = time.perf_counter() - t
        # Features scaled too: logistic regression's regularisation is scale-sensitive.
        fscale = StandardScaler().fit(ftr)
        clf = LogisticRegression(max_iter=300)
        _, t_train = timed(clf.fit, fscale.transform(ftr), ytr)
        acc = clf.score(fscale.transform(fte), yte)
        rows.append({"model": name, "accuracy": acc, "feature_s": t_feat, "train_s": t_train})
        print(f"{name:28s} accuracy {acc:.4f}   features {t_feat:6.2f} s   training {t_train:6.1f} s", flush=True)

    import scipy.sparse as sp

    xs = sp.csr_matrix(xte)
    fs = rfsgen.sample(rfsgen.parse_skeleton(COORDINATE).bind(xte.shape[1]), args.D, seed=args.seed)
    out = {}
    for name, x in (("dense", xte), ("csr", xs)):
        times = []
        for _ in range(3):
            z, t = timed(rfsgen.transform, fs, x)
            times.append(t)
        out[name] = (z, min(times), max(times))
    same = all((out["dense"][0] != out["csr"][0]).nnz == 0 for _ in [0])
    z = out["csr"][0]
    sparse = {"input_density": xs.nnz / np.prod(xs.shape), "output_density": z.nnz / np.prod(z.shape),
              "dense_s": out["dense"][1:], "csr_s": out["csr"][1:], "identical": bool(same)}
    print(f"coordinate polynomial, D = {args.D}, 10,000 test rows: input density {sparse['input_density']:.3f}, "
          f"output density {sparse['output_density']:.3f}; transform dense input {out['dense'][1]:.2f}-"
          f"{out['dense'][2]:.2f} s, CSR input {out['csr'][1]:.2f}-{out['csr'][2]:.2f} s; identical: {same}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "estimator.json").write_text(json.dumps({"cpu": cpu(), "cores": os.cpu_count(), "train": len(xtr),
                                                         "D": args.D, "models": rows, "sparse": sparse}, indent=1))


if __name__ == "__main__":
    main()

"""Tuned ``tabular-auto`` against tuned ``RBFSampler`` on scikit-learn's digits (a benchmark,
not a test: ``python tests/bench/digits.py``; about a minute on 2 cores per method).

Both models are the same pipeline but for the feature map, as a user would write it::

    StandardScaler() -> feature map (D = 4096, random_state=0) -> LogisticRegression

and each tunes its kernel parameters by ``GridSearchCV`` (3-fold, accuracy) on the
training rows: ``SkeletonFeatures("tabular-auto")``'s ``params__scale`` and ``params__beta``
(the skeleton's parameters, ``--set scale=... --set beta=...`` on the command line),
``RBFSampler``'s ``gamma``.  Digits' 1,797 rows are split 75/25 (stratified, ``random_state=0``); the test
accuracy of the refitted best model is reported, with a plain linear model on the
standardised pixels for reference.  Prints a table; ``--json PATH`` writes it too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCALES = [0.5, 0.7, 1.0, 1.4]
BETAS = [1.0, 2.0, 4.0]
GAMMAS = [0.002, 0.005, 0.01, 0.02, 0.05]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--D", type=int, default=4096, help="feature columns (default 4096)")
    ap.add_argument("--scales", default=",".join(map(str, SCALES)))
    ap.add_argument("--betas", default=",".join(map(str, BETAS)))
    ap.add_argument("--gammas", default=",".join(map(str, GAMMAS)))
    ap.add_argument("--models", default="rfsgen,rbf", help="which of rfsgen, rbf to run (default both)")
    ap.add_argument("--jobs", type=int, default=1, help="GridSearchCV n_jobs")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    from sklearn.datasets import load_digits
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from rfsgen.sklearn import SkeletonFeatures

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)

    def linear():
        return LogisticRegression(max_iter=2000)

    models = {
        "rfsgen tabular-auto": (SkeletonFeatures("tabular-auto", n_components=args.D, random_state=0),
                                {"features__params__scale": [float(v) for v in args.scales.split(",")],
                                 "features__params__beta": [float(v) for v in args.betas.split(",")]}),
        "RBFSampler": (RBFSampler(n_components=args.D, random_state=0),
                       {"features__gamma": [float(v) for v in args.gammas.split(",")]}),
    }
    wanted = {"rfsgen": "rfsgen tabular-auto", "rbf": "RBFSampler"}
    models = {wanted[m]: models[wanted[m]] for m in args.models.split(",")}
    rows = []
    for name, (features, grid) in models.items():
        t0 = time.perf_counter()
        pipe = Pipeline([("scale", StandardScaler()), ("features", features), ("linear", linear())])
        search = GridSearchCV(pipe, grid, cv=3, n_jobs=args.jobs).fit(xtr, ytr)
        short = {k.split("__")[-1]: v for k, v in search.best_params_.items()}
        rows.append({"model": name, "best": short,
                     "cv_accuracy": float(search.best_score_), "test_accuracy": float(search.score(xte, yte)),
                     "grid": {", ".join(f"{k.split('__')[-1]}={v:g}" for k, v in p.items()): float(s)
                              for p, s in zip(search.cv_results_["params"], search.cv_results_["mean_test_score"])},
                     "seconds": time.perf_counter() - t0})
    t0 = time.perf_counter()
    plain = Pipeline([("scale", StandardScaler()), ("linear", linear())]).fit(xtr, ytr)
    rows.append({"model": "linear on pixels", "best": {}, "cv_accuracy": None,
                 "test_accuracy": float(plain.score(xte, yte)), "grid": {}, "seconds": time.perf_counter() - t0})

    print(f"digits: {len(xtr)} training rows, {len(xte)} test rows, D = {args.D}, LogisticRegression(max_iter=2000)")
    print(f"{'model':<22} {'best parameters':<22} {'cv acc':>7} {'test acc':>9} {'seconds':>8}")
    for r in rows:
        best = ", ".join(f"{k}={v:g}" for k, v in r["best"].items()) or "-"
        cv = "-" if r["cv_accuracy"] is None else f"{r['cv_accuracy']:.4f}"
        print(f"{r['model']:<22} {best:<22} {cv:>7} {r['test_accuracy']:>9.4f} {r['seconds']:>8.1f}")
        if r["grid"]:
            print("    cv accuracy by value: " + ", ".join(f"{k}: {v:.4f}" for k, v in r["grid"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"D": args.D, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

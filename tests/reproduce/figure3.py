"""Reproduce the paper's Figure 3 on real CIFAR-10: RFS against Rahimi-Recht (and ORF).

Run by ``make reproduce``; the test suite runs it on a tiny configuration.

Data: official CIFAR-10 test images from the workplace's
``shared/data/cifar10/cifar10_exact_subset.npz`` (key ``test_data``), or any
``.npy``/``.npz:key`` of channel-planar uint8 rows (N, 3072) given with --data.
Without that file: download ``cifar-10-python.tar.gz`` from
https://www.cs.toronto.edu/~kriz/cifar.html, unpickle ``test_batch`` and save its
``data`` array with ``numpy.save``, then pass ``--data that.npy``.

Preprocessing (as the golden values): transpose to H,W,C, center-crop 24x24,
standardize each image to mean 0 and std 1.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))

import cifar  # noqa: E402

from rfsgen import load_skeleton, open_input  # noqa: E402
from rfsgen.approx import approx, format_table, parse_budgets, plot  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10" / "cifar10_exact_subset.npz"
EXPERIMENTS = [("shallow-gaussian", ("rfs", "strat", "exact", "rr", "orf")), ("cifar-deep", ("rfs", "strat", "exact", "rr"))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=f"{DEFAULT_DATA}:test_data")
    ap.add_argument("--out", default=str(ROOT / "reproduce-output"))
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--budgets", default="2^8..2^15")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    path = args.data.split(".npz:")[0] + (".npz" if ".npz:" in args.data else "")
    if not Path(path).exists():
        print(f"figure3: CIFAR-10 rows not found at {path}; see this script's docstring for how to get them "
              "and pass --data FILE", file=sys.stderr)
        return 2
    with open_input(args.data) as src:
        raw = src.read()
    x = cifar.preprocess(raw.astype(np.uint8))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budgets = parse_budgets(args.budgets)
    everything = {}
    for name, schemes in EXPERIMENTS:
        skel = load_skeleton(ROOT / "skeletons" / f"{name}.yaml")
        recs = approx(skel, x, budgets, trials=args.trials, rows=args.rows, seed=args.seed, schemes=schemes)
        everything[name] = recs
        print(f"\n{name} ({args.trials} trials of {args.rows} images)\n{format_table(recs)}", flush=True)
        if not args.no_plot:
            plot(recs, out / f"figure3-{name}.png", title=f"{name}: {args.trials} trials x {args.rows} CIFAR-10 test images")
    (out / "figure3.json").write_text(json.dumps(everything, indent=1))
    print(f"\nwrote {out / 'figure3.json'}" + ("" if args.no_plot else " and figure3-*.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The paper's Figure 4 at full scale: pixel co-occurrence in sampled features.

    python tests/reproduce/figure4.py [--features 500000] [--out reproduce-output]

For 24x24x3 images (sphere pixel nodes, as cifar-deep.yaml): a flat kernel (one relu node
over every pixel) and kernels with one, two and three relu conv layers (4x4, 3x3, 3x3
windows, stride 2, then a dense relu).  For each, ``--features`` sampled features, and for 4 pixels
the correlation of their occurrence with every other pixel's across features
(:func:`rfsgen.cooccurrence`), drawn as a grid: one row per kernel, one column per pixel.
Writes ``figure4.png`` and ``figure4.json`` (mean correlation by tier of shared windows).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import rfsgen
from rfsgen.cooccurrence import cooccurrence, default_pixels

HEAD = "rfsgen: 1\ninput: {shape: [24, 24, 3]}\nnodes:\n  - {name: pixels, base: sphere, scheme: pair, per: pixel}\n"
# Window sizes that tile each layer exactly (24 -> 11 -> 5 -> 2 nodes a side, stride 2).
CONV = "  - {name: conv%d, activation: relu, conv: {size: %d, stride: 2}}\n"
SIZES = (4, 3, 3)
KERNELS = {
    "flat": HEAD + "  - {name: out, activation: relu, dense: true}\n",
    **{f"{k} conv layer{'s' if k > 1 else ''}": HEAD + "".join(CONV % (i + 1, SIZES[i]) for i in range(k))
       + "  - {name: out, activation: relu, dense: true}\n" for k in (1, 2, 3)},
}


def main():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("reproduce-output"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pixels = default_pixels((24, 24))
    fig, axes = plt.subplots(len(KERNELS), len(pixels), figsize=(2.6 * len(pixels), 2.6 * len(KERNELS)))
    summary = {}
    for row, (name, text) in enumerate(KERNELS.items()):
        fs = rfsgen.sample(rfsgen.parse_skeleton(text, name), args.features, seed=args.seed)
        c = cooccurrence(fs)
        off = c[~np.eye(c.shape[0], dtype=bool)]
        summary[name] = {"features": fs.columns, "mean": float(np.nanmean(off)), "std": float(np.nanstd(off))}
        print(f"{name:15s} {fs.columns} features: off-diagonal correlation mean {summary[name]['mean']:+.4f}, "
              f"std {summary[name]['std']:.4f}", flush=True)
        for col, (r, q) in enumerate(pixels):
            m = c[r * 24 + q].reshape(24, 24).copy()
            m[r, q] = np.nan
            ax = axes[row, col]
            ax.imshow(m, cmap="viridis")
            ax.plot([q], [r], "r+", markersize=7)
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(name)
            if row == 0:
                ax.set_title(f"pixel ({r}, {q})", fontsize=9)
    fig.suptitle(f"Pixel co-occurrence across {args.features} sampled features (cf. the paper's Figure 4)")
    fig.tight_layout()
    fig.savefig(args.out / "figure4.png", dpi=100)
    (args.out / "figure4.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out / 'figure4.png'}")


if __name__ == "__main__":
    main()

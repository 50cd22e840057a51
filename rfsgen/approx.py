"""Kernel-approximation reports: the paper's Figure 3 measures for any skeleton and data.

For each trial, M rows are drawn at random; for each scheme and budget D a
fresh feature map is sampled and applied, and the estimated Gram matrix
``Psi Psi^T`` is compared with the exact kernel over all M x M entries:
mean absolute error, RMS error, max absolute error and Pearson correlation.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import budget
from .errors import OutputError, UsageError, install_hint
from .kinds import ALL, for_scheme
from .sampler import sample_scheme
from .skeleton import Skeleton
from .transform import transform

MEASURES = ("mae", "rmse", "max_abs", "corr")


def measures(exact: np.ndarray, approx: np.ndarray) -> dict:
    """Figure 3's measures between two equal-shape matrices, over all entries."""
    err = np.asarray(approx, dtype=np.float64) - np.asarray(exact, dtype=np.float64)
    a, e = np.ravel(approx).astype(np.float64), np.ravel(exact).astype(np.float64)
    corr = float(np.corrcoef(a, e)[0, 1]) if a.std() > 0 and e.std() > 0 else float("nan")
    return {
        "mae": float(np.abs(err).mean()),
        "rmse": float(np.sqrt(np.mean(err * err))),
        "max_abs": float(np.abs(err).max()),
        "corr": corr,
    }


def approx(
    skeleton: Skeleton,
    x: np.ndarray,
    budgets,
    *,
    trials: int = 10,
    rows: int = 128,
    seed: int = 0,
    schemes=("rfs",),
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """Run the approximation experiment; one record per (scheme, budget).

    ``x`` is float ``(n, width)``; ``rows`` rows are drawn per trial without
    replacement.  Records have keys scheme, features, trials, rows, mae, rmse,
    max_abs, corr, draws (means over trials), their ``*_std`` and dedup_ratio.
    """
    x = np.asarray(x, dtype=np.float64)
    if not skeleton.bound and x.ndim == 2:
        skeleton = skeleton.bind(x.shape[1])
    if rows > x.shape[0]:
        raise UsageError(f"--subset {rows} is more than the {x.shape[0]} rows of the input; lower --subset")
    if rows < 2:
        raise UsageError("--subset must be at least 2")
    if trials < 1:
        raise UsageError("--trials must be at least 1")
    budgets = [int(d) for d in budgets]
    # Each map: the rows x D float64 features (the transform's output and its working
    # copy), beside the exact and estimated rows x rows matrices and their difference.
    budget.check(8.0 * rows * (2 * max(budgets) + 4 * rows),
                 f"approx of skeleton '{skeleton.path}': the {rows} x {max(budgets)} feature matrix and the {rows} x "
                 f"{rows} kernel matrices", "use a smaller --subset or smaller budgets -n")
    results = {(s, d): [] for s in schemes for d in budgets}
    # Each scheme's map is compared with the kernel its column kind estimates (EOF: the kernel
    # it converges to, on the box fitted to the rows), computed once per trial and kind.
    used = [k for k in ALL if any(for_scheme(s) is k for s in schemes)]
    fitted = {k: k.fit(skeleton, lambda: x) for k in used}
    caches = {k: {} for k in used}
    for t in range(trials):
        pick = np.sort(np.random.default_rng([seed, t]).choice(x.shape[0], rows, replace=False))
        xt = x[pick]
        targets = {k: k.kernel(skeleton, xt, options=fitted[k]) for k in used}
        for si, scheme in enumerate(schemes):
            kind = for_scheme(scheme)

            def errors(fs, kind=kind):  # the measures of fs's map against its kind's kernel
                psi = transform(fs, xt, layout="dense", dtype="float64")
                scale = kind.unscale(fs)
                if scale != 1.0:
                    psi *= scale
                return measures(targets[kind], psi @ psi.T)

            for bi, d in enumerate(budgets):
                rng_seed = int(np.random.default_rng([seed, t, si, bi]).integers(2**62))
                fs = sample_scheme(skeleton, d, rng_seed, scheme=scheme, options=fitted[kind])
                rec = errors(fs)
                rec["draws"] = fs.draws
                rec.update(kind.approx_extra(skeleton, fs, fitted[kind], caches[kind], errors))
                results[scheme, d].append(rec)
                if progress:
                    progress(1)
    out = []
    for (scheme, d), recs in results.items():
        kind = for_scheme(scheme)
        row = {"scheme": scheme, "features": d, "trials": trials, "rows": rows}
        for key in MEASURES + ("draws",) + kind.approx_keys:
            vals = np.array([r[key] for r in recs], dtype=np.float64)
            row[key] = float(vals.mean())
            if key not in ("draws",) + kind.approx_counts:
                row[f"{key}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        row["dedup_ratio"] = row["draws"] / d
        out.append(row)
    return out


def format_table(records: list[dict]) -> str:
    """A readable table of approx records (EOF rows followed by their grid's truncation)."""
    head = f"{'scheme':<7}{'D':>8}{'draws q':>12}{'q/D':>8}  {'MAE':>17}  {'RMSE':>17}  {'max |err|':>17}  {'corr':>17}"
    lines = [head, "-" * len(head)]
    for r in records:
        cells = "  ".join(f"{r[k]:.5f} ± {r[k + '_std']:.5f}" for k in MEASURES)
        lines.append(f"{r['scheme']:<7}{r['features']:>8}{r['draws']:>12.0f}{r['dedup_ratio']:>8.2f}  {cells}")
    for kind in ALL:  # each kind's own lines (EOF: its grids' truncation)
        lines += kind.approx_lines([r for r in records if for_scheme(r["scheme"]) is kind])
    return "\n".join(lines)


def check_plotting() -> None:
    """Raise :class:`UsageError` now, before any computing, if ``--plot`` cannot work."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, which is not installed: {install_hint('plot')}") from None


#: Formats matplotlib may need more than itself for (pgf runs LaTeX): not offered.
_UNOFFERED_FORMATS = ("pgf",)


def plot_format(path) -> str:
    """The image format of ``--plot PATH`` from its extension (``'png'``, ``'pdf'``, ...);
    a one-line :class:`UsageError` now, before any computing, for an extension matplotlib
    cannot write or none at all."""
    from pathlib import Path

    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(k for k in FigureCanvasBase.get_supported_filetypes() if k not in _UNOFFERED_FORMATS)
    ext = Path(str(path)).suffix.lower().lstrip(".")
    if ext not in formats:
        what = f"'.{ext}' is not an image format matplotlib writes" if ext else "the file name has no extension"
        raise UsageError(f"--plot {path}: {what}; end the name with one of " + ", ".join("." + k for k in formats))
    return ext


def plot(records: list[dict], path, title: str = "", format: str | None = None) -> None:
    """Figure 3 style: the four measures against D (log2), one line per scheme, written
    to ``path`` in ``format`` (default: from ``path``'s extension)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, which is not installed: {install_hint('plot')}") from None
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for scheme in dict.fromkeys(r["scheme"] for r in records):
        rs = sorted((r for r in records if r["scheme"] == scheme), key=lambda r: r["features"])
        d = [r["features"] for r in rs]
        for ax, key in zip(axes, MEASURES):
            ax.errorbar(d, [r[key] for r in rs], yerr=[r[key + "_std"] for r in rs], marker="o", ms=3,
                        capsize=2, label=scheme)
    for ax, key in zip(axes, ("mean abs error", "RMS error", "max abs error", "correlation")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("features D")
        ax.set_title(key)
        if key != "correlation":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, format=format)
    except OSError as e:
        raise OutputError(f"{path}: cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(fig)


def parse_budgets(spec) -> list[int]:
    """``'256,1024'`` or ``'2^8..2^15'`` (powers of two) -> list of ints; a list or tuple of
    such specs (``-n`` given several times) -> their budgets in order, each once."""
    if isinstance(spec, (list, tuple)):
        out = []
        for one in spec:
            out += [d for d in parse_budgets(one) if d not in out]
        if not out:
            raise UsageError("-n: give at least one budget")
        return out
    spec = spec.strip()
    try:
        if ".." in spec:
            a, b = spec.split("..")
            lo, hi = (int(v.split("^")[1]) if "^" in v else int(math.log2(int(v))) for v in (a, b))
            return [2**k for k in range(lo, hi + 1)]
        out = [int(v) for v in spec.split(",") if v.strip()]
    except (ValueError, IndexError):
        raise UsageError(f"-n '{spec}' must be a list like 256,1024,4096 or a range like 2^8..2^15") from None
    if not out or min(out) < 1:
        raise UsageError(f"-n '{spec}': budgets must be positive integers")
    return out

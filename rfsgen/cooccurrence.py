"""Which input pixels appear together in sampled features (the paper's Figure 4).

A feature uses a pixel when one of its terms is an input node that reads the pixel.
Across the D columns of a feature set, each pixel's occurrence is a 0/1 variable;
:func:`cooccurrence` is the matrix of their Pearson correlations.  A flat kernel (one
node over every pixel) draws pixels independently of where they are, so its
correlations are uniform; convolutional skeletons draw pixels from shared windows, so
nearby pixels co-occur more, with one level per layer of windows two pixels share.
"""

from __future__ import annotations

import numpy as np

from .features import FeatureSet
from .skeleton import InputNode


def _pixels(fs: FeatureSet):
    """``(P, (H, W) or None, per-node pixel lists)``: pixels are image positions when the
    skeleton has a shape (all channels of a position count as one), else columns."""
    skel = fs.walk_skeleton
    channels = skel.shape[2] if skel.shape else 1
    per_node = []
    for n in skel.nodes:
        per_node.append(np.unique(np.asarray(n.columns, dtype=np.int64) // channels) if isinstance(n, InputNode)
                        else np.zeros(0, dtype=np.int64))
    P = skel.width // channels
    return P, (tuple(skel.shape[:2]) if skel.shape else None), per_node


def occurrence(fs: FeatureSet):
    """``scipy.sparse.csr_matrix`` bool ``(D, P)``: column j uses pixel p."""
    import scipy.sparse as sp

    P, _, per_node = _pixels(fs)
    lengths = np.array([p.size for p in per_node], dtype=np.int64)
    term_col = np.repeat(np.arange(fs.columns, dtype=np.int64), np.diff(fs.ptr))
    counts = lengths[fs.node]
    rows = np.repeat(term_col, counts)
    flat = np.concatenate(per_node) if per_node else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    # the pixels of each term's node, one after another
    offsets = np.repeat(starts[fs.node] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    cols = flat[np.arange(int(counts.sum())) + offsets] if counts.sum() else np.zeros(0, np.int64)
    o = sp.csr_matrix((np.ones(rows.size, dtype=np.int64), (rows, cols)), shape=(fs.columns, P))
    o.sum_duplicates()
    o.data[:] = 1
    return o.astype(bool)


def cooccurrence(fs: FeatureSet) -> np.ndarray:
    """float64 ``(P, P)``: the correlation, across the feature set's columns, of pixel
    p's occurrence with pixel q's (P = H * W for image skeletons, else the width).
    NaN for a pixel used by every column or by none (no variation)."""
    o = occurrence(fs).astype(np.float64)
    D = float(fs.columns)
    n = np.asarray(o.sum(axis=0)).ravel()
    both = (o.T @ o).toarray()
    cov = D * both - np.outer(n, n)
    var = D * n - n * n
    with np.errstate(invalid="ignore", divide="ignore"):
        return cov / np.sqrt(np.outer(var, var))


def default_pixels(shape) -> list:
    """Four pixels to show: near a corner, an edge, off-centre and the centre."""
    h, w = shape
    return [(h // 6, w // 6), (h // 6, w // 2), (h // 2, w // 3), (h // 2, w // 2)]


def plot_cooccurrence(fs: FeatureSet, path, pixels=None, title: str | None = None) -> None:
    """A PNG with one map per chosen pixel: its correlation with every other pixel
    (needs matplotlib, the ``plot`` extra, and an image skeleton)."""
    from .errors import UsageError, install_hint

    _, shape, _ = _pixels(fs)
    if shape is None:
        raise UsageError("co-occurrence maps need an image skeleton ('input: {shape: [H, W, C]}')")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"plotting needs matplotlib, which is not installed: {install_hint('plot')}") from None
    c = cooccurrence(fs)
    pixels = pixels or default_pixels(shape)
    fig, axes = plt.subplots(1, len(pixels), figsize=(3 * len(pixels), 3.2))
    for ax, (r, q) in zip(np.atleast_1d(axes), pixels):
        m = c[r * shape[1] + q].reshape(shape).copy()
        m[r, q] = np.nan  # its own correlation (1) would swamp the scale
        ax.imshow(m, cmap="viridis")
        ax.plot([q], [r], "r+", markersize=8)
        ax.set_title(f"pixel ({r}, {q})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title or f"co-occurrence, {fs.columns} features", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)

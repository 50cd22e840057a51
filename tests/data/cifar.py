"""Real CIFAR-10 rows shipped with the tests, and the paper's preprocessing.

``cifar10_test_0-63.npy`` holds official CIFAR-10 test images 0-63 (uint8,
channel-planar R,G,B 32x32 rows) copied from shared/data/cifar10/cifar10_exact_subset.npz.
Run as a script to write preprocessed demo rows: ``python tests/data/cifar.py OUT.npy``.
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def preprocess(raw: np.ndarray) -> np.ndarray:
    """Channel-planar uint8 rows (n, 3072) -> float64 (n, 1728): HWC, center crop 24x24, per-image standardization."""
    x = raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)[:, 4:28, 4:28, :]
    x = x.reshape(x.shape[0], -1).astype(np.float64)
    return (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True)


def rows(n: int = 64) -> np.ndarray:
    """The first ``n`` (<= 64) preprocessed CIFAR-10 test rows."""
    return preprocess(np.load(HERE / "cifar10_test_0-63.npy")[:n])


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "rows.npy"
    np.save(out, rows(64).astype(np.float32))
    print(f"wrote 64 preprocessed CIFAR-10 test rows (24x24x3, float32) to {out}")

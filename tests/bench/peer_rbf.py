"""The peer job, done the way a user without rfsgen would: scikit-learn's RBFSampler
fit + transform on float32 rows, the whole result written to HDF5 with h5py.

    python tests/bench/peer_rbf.py ROWS.npy OUT.h5 [-n 10000] [--gamma G] [--seed 0]

Prints one JSON line with the time spent in each phase (seconds).
"""

import argparse
import json
import time

t_start = time.perf_counter()

import h5py  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.kernel_approximation import RBFSampler  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows")
    ap.add_argument("out")
    ap.add_argument("-n", type=int, default=10_000)
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    x = np.load(a.rows).astype(np.float32, copy=False)
    t1 = time.perf_counter()
    z = RBFSampler(n_components=a.n, gamma=a.gamma, random_state=a.seed).fit(x).transform(x)
    t2 = time.perf_counter()
    with h5py.File(a.out, "w") as f:
        f.create_dataset("X", data=z)
    t3 = time.perf_counter()
    print(json.dumps({"import": t0 - t_start, "read": t1 - t0, "fit_transform": t2 - t1, "write": t3 - t2}))


if __name__ == "__main__":
    main()

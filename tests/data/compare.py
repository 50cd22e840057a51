"""Compare the random-feature Gram matrix in a transform output with an exact kernel (used by make demo).

Usage: python tests/data/compare.py OUTPUT.h5 K.npy
"""

import sys

import h5py
import numpy as np
import scipy.sparse as sp

with h5py.File(sys.argv[1], "r") as f:
    g = f["X"]  # dense or CSR (transform --layout auto picks dense for the demo's features)
    if isinstance(g, h5py.Dataset):
        psi = sp.csr_matrix(g[()])
    else:
        psi = sp.csr_matrix((g["data"][()], g["indices"][()], g["indptr"][()]), shape=tuple(g.attrs["shape"]))
exact = np.load(sys.argv[2])
approx = (psi @ psi.T).toarray().astype(np.float64)
err = approx - exact
iu = np.triu_indices_from(exact, 1)
print(f"features {psi.shape[0]} rows x {psi.shape[1]} columns, {psi.nnz} stored values")
print(f"kernel approximation over {len(iu[0])} pairs: mean |err| {np.abs(err[iu]).mean():.4f}, "
      f"RMS {np.sqrt((err[iu] ** 2).mean()):.4f}, max |err| {np.abs(err[iu]).max():.4f}, "
      f"corr {np.corrcoef(approx[iu], exact[iu])[0, 1]:.4f}")

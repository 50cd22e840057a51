"""Print, as JSON, SHA-256 hashes of output definition 3's angles (rfsgen._sincos32 through
rfsgen.bases.phases_of: dense tiles, runs of terms, several nodes, sparse rows) and of a
whole transform of gaussian and laplace nodes (dense rows, CSR rows read as CSR, columns
straight from the angles, angles and products in one pass), and
whether the compiled angle loops use hardware FMA instructions or call the C library's fmaf.  tests/test_reproducible.py runs
it with the default CPU and with NUMBA_CPU_NAME=generic (no FMA), each with an empty
numba cache, and compares.  Run: python tests/tools/fma_bytes.py
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import SMALL_SKELETONS, rows_for  # noqa: E402

from rfsgen import parse_skeleton, sample  # noqa: E402
from rfsgen import _sincos32  # noqa: E402
from rfsgen.bases import phases_of  # noqa: E402
from rfsgen.transform import transform  # noqa: E402


def _against_two_passes(name, fs, x) -> dict:
    """The hashes of ``fs``'s transform of ``x`` in float32 and float64, each checked against
    the bytes of the angle loop followed by the product loop (rfsgen.paths.FUSED off)."""
    import rfsgen.paths as paths

    h = {}
    for dtype in ("float32", "float64"):
        got = transform(fs, x, layout="dense", dtype=dtype).tobytes()
        paths.FUSED = False
        try:
            assert got == transform(fs, x, layout="dense", dtype=dtype).tobytes(), f"{name}: columns differ"
        finally:
            paths.FUSED = True
        h[f"transform {name} {dtype}"] = hashlib.sha256(got).hexdigest()
    return h


def main() -> dict:
    h = {}
    rng = np.random.default_rng(5)
    for m, g, a, w in ((13, 3, 70, 37), (14, 1, 40, 600), (9, 2, 33, 1)):
        xp = rng.standard_normal((m, g, w)) * 10.0 ** rng.integers(-3, 4, (m, g, 1))
        om = rng.standard_normal((a, w)) * 10.0 ** rng.integers(-2, 3, (a, 1))
        node = rng.integers(0, g, a)
        for sparse in (False, True) if g == 1 else (False,):
            if sparse:
                xp[rng.random(xp.shape) < 0.95] = 0.0
            re, im = phases_of(xp, node, om, sparse=sparse)
            h[f"phases {m}x{g}x{a}x{w} sparse={sparse}"] = hashlib.sha256(re.tobytes() + im.tobytes()).hexdigest()
    skel = parse_skeleton(SMALL_SKELETONS["gauss-laplace"], "gauss-laplace")
    fs = sample(skel, 500, seed=2)
    x = rows_for(skel, 37, seed=1)
    h["transform gauss-laplace float32"] = hashlib.sha256(transform(fs, x, layout="dense").tobytes()).hexdigest()
    # CSR rows read as CSR (rfsgen._sincos32.phases_csr): the bytes of the same rows dense
    import scipy.sparse as sp

    xc = x.copy()
    xc[rng.random(xc.shape) < 0.6] = 0.0
    csr = transform(fs, sp.csr_matrix(xc), layout="dense").tobytes()
    assert csr == transform(fs, xc, layout="dense").tobytes(), "CSR rows differ from the same rows dense"
    h["transform gauss-laplace CSR rows float32"] = hashlib.sha256(csr).hexdigest()
    # one gaussian node (plain random Fourier features): the columns written straight from
    # the angles (rfsgen._sincos32.phases_out), against the product loop's bytes
    rbf = parse_skeleton("rfsgen: 1\ninput: {width: 300}\nnodes:\n  - {name: x, base: gaussian, scale: 0.2}\n", "rbf")
    fs = sample(rbf, 200, seed=4)
    x = rng.standard_normal((29, 300))
    x[3] *= 1e5  # angles beyond the fast range
    h.update(_against_two_passes("rbf", fs, x))
    # patches of one gaussian group under activations: the angles and the products in one
    # pass (rfsgen._sincos32.phase_columns), against the two passes' bytes
    conv = parse_skeleton("rfsgen: 1\ninput: {shape: [8, 8, 1]}\nnodes:\n"
                          "  - {name: p, base: gaussian, scale: 0.4, per: patch, patch: {size: 3, stride: 1}}\n"
                          "  - {name: b, activation: {name: exp, beta: 1.0}, conv: {size: 2, stride: 2}}\n"
                          "  - {name: out, activation: relu, dense: true}\n", "conv")
    fs = sample(conv, 300, seed=6)
    x = rng.standard_normal((21, 64))
    x[5] *= 1e6  # angles beyond the fast range
    h.update(_against_two_passes("conv", fs, x))
    asm = "\n".join("\n".join(f.inspect_asm().values())
                    for f in (_sincos32._phases, _sincos32._phases_sparse, _sincos32._phases_csr,
                              _sincos32._phases_out, _sincos32._phase_columns))
    return {"hashes": h, "vfmadd": "vfmadd" in asm, "calls fmaf": "fmaf" in asm}


if __name__ == "__main__":
    print(json.dumps(main(), sort_keys=True))

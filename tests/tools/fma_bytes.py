"""Print, as JSON, SHA-256 hashes of output definition 3's angles (rfsgen._sincos32 through
rfsgen.bases.phases_of: dense tiles, runs of terms, several nodes, sparse rows) and of a
whole transform of gaussian and laplace nodes, and whether the compiled angle loop uses
hardware FMA instructions or calls the C library's fmaf.  tests/test_reproducible.py runs
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
    asm = "\n".join(_sincos32._phases.inspect_asm().values()) + "\n".join(_sincos32._phases_sparse.inspect_asm().values())
    return {"hashes": h, "vfmadd": "vfmadd" in asm, "calls fmaf": "fmaf" in asm}


if __name__ == "__main__":
    print(json.dumps(main(), sort_keys=True))

"""Signal cases: SIGINT, SIGTERM or SIGHUP at a random moment of a valid run of sample,
transform, merge or kernel, the first second (interpreter start-up, imports, compilation) most
of all.  The oracle: exit 128 + signal (or death by the signal) with one line, no output and no
temporary file; never an exit 0 after the signal arrived, never a hang.
"""

from __future__ import annotations

import numpy as np

SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"]


def generate(rng: np.random.Generator, cid: str) -> dict:
    cmd = str(rng.choice(["sample", "transform", "merge", "kernel"]))
    r = rng.random()
    delay = float(rng.uniform(0, 0.25) if r < 0.3 else rng.uniform(0, 1.2) if r < 0.7 else rng.uniform(1.2, 5))
    sig = {"sig": str(rng.choice(SIGNALS)), "delay": round(delay, 4)}
    if cmd == "sample":
        files = {"s.yaml": {"skeleton": "cifar-deep"}}
        argv = ["sample", "s.yaml", "-n", str(int(rng.choice([512, 2048, 8192]))), "--seed",
                str(int(rng.integers(100))), "-o", "f.h5", "-q"]
        out, check = "f.h5", {"type": "sample", "columns": int(argv[3])}
    elif cmd == "transform":
        files = {"f.h5": {"fixture": "feat:cifar-deep-1k"}, "rows.npy": {"fixture": "rows:cifar1000"}}
        argv = ["transform", "f.h5", "rows.npy", "-o", "out.h5", "-q", "--layout",
                str(rng.choice(["dense", "csr"]))]
        out, check = "out.h5", {"type": "transform", "rows": 1000, "columns": 1024}
    elif cmd == "merge":
        files = {f"sh{k}.h5": {"fixture": f"shard:big-dense-float32-{k}"} for k in range(3)}
        argv = ["merge", "sh0.h5", "sh1.h5", "sh2.h5", "-o", "out.h5", "-q"]
        out, check = "out.h5", {"type": "merge", "reference_fixture": "full:big-dense-float32"}
    else:
        files = {"s.yaml": {"skeleton": "cifar-deep"}, "rows.npy": {"fixture": "rows:cifar200"}}
        argv = ["kernel", "s.yaml", "rows.npy", "-o", "K.npy", "-q"]
        out, check = "K.npy", {"type": "kernel", "shape": [200, 200], "square": True}
    return {"kind": "signals", "id": cid, "files": files, "ops": [], "argv": argv, "output": out, "check": check,
            "signal": sig}

"""``--device cuda`` (rfsgen._cuda, issue 41): the GPU's gaussian and laplace atoms give the
CPU's bytes, checked in numba's CUDA simulator; ``--device cuda`` without a GPU fails
cleanly; ``auto`` says which device it took.

numba reads NUMBA_ENABLE_CUDASIM when numba.cuda is first imported, so every run that needs
the simulator (or needs it off) is a subprocess with its own environment."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import SMALL_SKELETONS
from rfsgen._cuda import fma32_exact
from test_sincos32 import _exact, _triples, fma_reference

ROOT = Path(__file__).resolve().parents[1]

SKELETONS = {
    # a gaussian and a laplace node (two groups), a product under tanh
    "gauss-laplace": SMALL_SKELETONS["gauss-laplace"],
    # two gaussian nodes in one group (atoms of node 1 read columns w.. of the float32 rows)
    "gauss-group": """
rfsgen: 1
input: {width: 6}
nodes:
  - {name: g, base: gaussian, scale: 2.5, per: group, group: 3}
  - {name: out, activation: {name: exp, beta: 1.5}, inputs: [g]}
""",
}


def _env(sim: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, even on a machine with one
    return env


def _python(code: str, sim: bool, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(sim), cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def _rfsgen(args, sim: bool, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rfsgen", *map(str, args)], env=_env(sim), cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_fma32_exact_is_one_rounding():
    # the simulator's fma (rfsgen._cuda.fma32_exact) against exact rational arithmetic
    a, b, c = _triples()
    a, b, c = a[::5], b[::5], c[::5]  # a sixth of them, the traps among them (Python is slow)
    got = np.array([fma32_exact(*t) for t in zip(a, b, c)], dtype=np.float32)
    exact = np.array([_exact(*t) for t in zip(a, b, c)], dtype=np.float32)
    assert got.tobytes() == exact.tobytes() == fma_reference(a, b, c).tobytes()


def test_simulator_bytes_equal_cpu(tmp_path):
    """Library (dense and CSR, float32 and float64) and CLI (whole output files): the
    simulator's --device cuda bytes are the CPU's, including a row whose angles go beyond
    the fast range (redone on the CPU) and a row of zeros; and the simulator's own cuda.fma
    is not a fused multiply-add (why rfsgen._cuda gives it an exact one)."""
    (tmp_path / "sk.json").write_text(json.dumps(SKELETONS))
    res = _python("""
        import json, subprocess, sys
        import numpy as np
        from numba import cuda
        from rfsgen import save_features
        from rfsgen.sampler import sample
        from rfsgen.skeleton import parse_skeleton
        from rfsgen.transform import transform
        from test_sincos32 import _triples, fma_reference
        from rfsgen import _cuda

        resident = []  # the resident path declines the chunk with angles beyond the fast range
        whole = _cuda.columns_resident
        _cuda.columns_resident = lambda *a: resident.append(whole(*a)) or resident[-1]
        rng = np.random.default_rng(0)
        x = rng.standard_normal((5, 6)).astype(np.float32)
        x[0, :3] = 0.0
        x[1] *= np.float32(1e6)  # angles beyond FAST_LIMIT: the CPU's Payne-Hanek
        x[3] = 0.0
        np.save("rows.npy", x)
        for name, text in json.load(open("sk.json")).items():
            fs = sample(parse_skeleton(text), 24, 1)
            save_features(fs, name + ".h5")
            for layout in ("dense", "csr"):
                for dtype in ("float32", "float64"):
                    a = transform(fs, x, layout=layout, dtype=dtype)
                    b = transform(fs, x, layout=layout, dtype=dtype, device="cuda")
                    if layout == "csr":
                        assert (a.indptr.tobytes(), a.indices.tobytes()) == (b.indptr.tobytes(), b.indices.tobytes())
                        a, b = a.data, b.data
                    assert a.tobytes() == b.tobytes(), (name, layout, dtype)
                    print("same", name, layout, dtype)
        print("declined", resident.count(False))

        @cuda.jit
        def sim_fma(a, b, c, out):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = cuda.fma(a[i], b[i], c[i])

        a, b, c = (v[500:560] for v in _triples())
        out = np.empty_like(a)
        sim_fma[1, 64](a, b, c, out)
        print("simulator fma is fused:", out.tobytes() == fma_reference(a, b, c).tobytes())
    """, sim=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("same ") == 2 * 2 * 2
    assert int(res.stdout.split("declined ")[1].split()[0]) >= 2 * 2 * 2, res.stdout
    assert "simulator fma is fused: False" in res.stdout
    for name in ["gauss-laplace"]:  # the CLI once (each run starts numba: seconds)
        for layout in ("dense", "csr"):
            outs = {}
            for device in ("cpu", "cuda"):
                out = tmp_path / f"{name}-{layout}-{device}.h5"
                r = _rfsgen(["transform", f"{name}.h5", "rows.npy", "-o", out, "--layout", layout, "--device", device,
                             "-q"], sim=True, cwd=tmp_path)
                assert r.returncode == 0, r.stderr
                outs[device] = out.read_bytes()
            assert "device: cuda (numba's CUDA simulator)" in r.stderr
            assert outs["cpu"] == outs["cuda"], (name, layout)


def test_simulator_products_equal_cpu_for_every_node_kind(tmp_path):
    """The products into columns (factors, powers, activations' weights) on the GPU: every
    small skeleton (brownian, binary, categorical, circle under step, gaussian and laplace,
    sphere, a deep relu net) and the shipped cifar-deep and mnist-conv give the CPU's bytes,
    dense and CSR, float32 and float64.  The same run with the GPU's product order reversed
    differs, so the comparison sees the order."""
    shipped = {name: (ROOT / "skeletons" / f"{name}.yaml").read_text() for name in ("cifar-deep", "mnist-conv")}
    (tmp_path / "sk.json").write_text(json.dumps({**SMALL_SKELETONS, **shipped}))
    res = _python("""
        import json
        import numpy as np
        from rfsgen import _cuda
        from rfsgen.sampler import sample
        from rfsgen.skeleton import parse_skeleton
        from rfsgen.transform import transform

        resident = []  # what the chunks' resident path (atoms kept on the GPU) returned
        whole = _cuda.columns_resident
        _cuda.columns_resident = lambda *a: resident.append(whole(*a)) or resident[-1]
        rng = np.random.default_rng(0)
        sk = json.load(open("sk.json"))
        for name, text in sk.items():
            skel = parse_skeleton(text)
            if not skel.bound:
                skel = skel.bind(6)
            x = rng.uniform(-0.9, 0.9, (4, skel.width))
            if name.startswith("categorical"):
                x = rng.integers(0, 4, x.shape).astype(float)
            elif name.startswith("binary"):
                x = rng.choice([-1.0, 1.0], x.shape)
            fs = sample(skel, 24, 1)
            for layout in ("dense", "csr"):
                for dtype in ("float32", "float64"):
                    a = transform(fs, x, layout=layout, dtype=dtype)
                    b = transform(fs, x, layout=layout, dtype=dtype, device="cuda")
                    if layout == "csr":
                        a, b = a.toarray(), b.toarray()
                    assert a.tobytes() == b.tobytes(), (name, layout, dtype)
                    print("same", name, layout, dtype)
        print("resident", resident.count(True), resident.count(False))
        # the order is seen: the GPU's products reversed (right to left) give other bits
        src = rng.uniform(-1, 1, (64, 6))
        ir, ii = np.arange(6), np.full(6, -1)
        cr, ci = rng.uniform(0.5, 2, 6), np.zeros(6)
        none = np.zeros(0, np.int64)
        fidx = np.arange(6)
        plan = lambda f: _cuda.ColumnsPlan(ir, cr, ii, ci, none, none, f, np.array([0, 6]), np.array([1.0]),
                                           np.array([False]), np.array([0]))
        fwd, rev = np.empty((64, 1)), np.empty((64, 1))
        _cuda.columns(src, plan(fidx), fwd)
        _cuda.columns(src, plan(fidx[::-1].copy()), rev)
        want = np.ones((64, 1))
        for k in range(6):
            want[:, 0] = want[:, 0] * (cr[k] * src[:, k]) if k else cr[k] * src[:, k]
        print("forward exact:", fwd.tobytes() == want.tobytes(), "reversed differs:", fwd.tobytes() != rev.tobytes())
    """, sim=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("same ") == 4 * (len(SMALL_SKELETONS) + 2), res.stdout
    assert "forward exact: True reversed differs: True" in res.stdout
    used, declined = map(int, res.stdout.split("resident ")[1].split()[:2])
    assert used >= 2 * (len(SMALL_SKELETONS) + 2) and declined == 0, res.stdout  # every dense chunk kept its atoms


def test_simulator_buffers_are_per_thread_and_reused_across_chunks(tmp_path):
    """The GPU's buffers and stream live per thread and are reused from chunk to chunk:
    chunks of 3 rows (the last one shorter), and four threads transforming one feature set
    at once, with rows whose angles leave the fast range in some chunks only, give the CPU's
    bytes."""
    (tmp_path / "sk.json").write_text(json.dumps({"mnist-conv": (ROOT / "skeletons" / "mnist-conv.yaml").read_text(),
                                                  "gauss-laplace": SMALL_SKELETONS["gauss-laplace"]}))
    res = _python("""
        import json
        import threading
        from concurrent.futures import ThreadPoolExecutor
        import numpy as np
        from rfsgen import _cuda
        from rfsgen.sampler import sample
        from rfsgen.skeleton import parse_skeleton
        from rfsgen.transform import transform

        for name, text in json.load(open("sk.json")).items():
            fs = sample(parse_skeleton(text), 16, 2)
            xs = []
            for seed in range(4):
                x = np.random.default_rng(seed).uniform(0, 1, (7, fs.skeleton.width)).astype(np.float32)
                if seed % 2:
                    x[seed] *= np.float32(1e7)  # beyond the fast range in this chunk only
                xs.append(x)
            want = [transform(fs, x, layout="dense", chunk_rows=3).tobytes() for x in xs]

            meet = threading.Barrier(len(xs))  # four threads at once, so each has its own

            def run(x):
                meet.wait(timeout=60)
                return transform(fs, x, layout="dense", chunk_rows=3, device="cuda").tobytes()

            with ThreadPoolExecutor(4) as pool:
                print(name, "same" if list(pool.map(run, xs)) == want else "DIFFER")
        # one plan's (or transformer's) staging: each thread its own stream and buffers, kept
        st = _cuda._Staging()
        mine = (st.stream, st.on_device("x", (2, 3), np.float32))
        assert (st.stream, st.on_device("x", (2, 3), np.float32)) == mine
        other = []
        t = threading.Thread(target=lambda: other.append((st.stream, st.on_device("x", (2, 3), np.float32))))
        t.start()
        t.join()
        assert other[0][0] is not mine[0] and other[0][1] is not mine[1]
    """, sim=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["mnist-conv", "same", "gauss-laplace", "same"], res.stdout


def test_simulator_chunk_parts_run_on_their_own_threads_with_the_cpu_bytes(tmp_path):
    """A GPU chunk is cut into row parts run from different threads (each on its own stream,
    so one part's copies overlap another's kernels): the CPU's bytes, including chunks where
    one part has an angle beyond the fast range and the whole chunk takes the host's path."""
    (tmp_path / "sk.json").write_text(json.dumps({"mnist-conv": (ROOT / "skeletons" / "mnist-conv.yaml").read_text(),
                                                  "gauss-laplace": SMALL_SKELETONS["gauss-laplace"]}))
    res = _python("""
        import json
        import threading
        import numpy as np
        from rfsgen import _cuda, paths
        from rfsgen.sampler import sample
        from rfsgen.skeleton import parse_skeleton
        from rfsgen.transform import transform

        paths.GPU_PART_ROWS = 3
        calls = []  # (thread, rows, kept on the GPU) of each part
        whole = _cuda.columns_resident

        def spy(host, jobs, plan, out):
            kept = whole(host, jobs, plan, out)
            calls.append((threading.get_ident(), out.shape[0], kept))
            return kept

        _cuda.columns_resident = spy
        for name, text in json.load(open("sk.json")).items():
            fs = sample(parse_skeleton(text), 16, 2)
            x = np.random.default_rng(5).uniform(0, 1, (17, fs.skeleton.width)).astype(np.float32)
            x[12] *= np.float32(1e7)  # beyond the fast range: the second part of the second chunk
            for dtype in ("float32", "float64"):
                want = transform(fs, x, layout="dense", dtype=dtype, chunk_rows=8).tobytes()
                del calls[:]
                got = transform(fs, x, layout="dense", dtype=dtype, chunk_rows=8, device="cuda").tobytes()
                threads = {t for t, _, _ in calls}
                print(name, dtype, "same" if got == want else "DIFFER", "threads", len(threads),
                      "rows", sorted(r for _, r, _ in calls), "declined", sum(not k for _, _, k in calls))
    """, sim=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 4, res.stdout
    for line in lines:
        # chunks of 8, 8 and 1 rows: the two 8-row chunks in parts of 4 (one declined), the last row
        # whole.  Which thread takes a part is the pool's choice (rfsgen._compiled.run_parts: the
        # caller takes the second part too when no worker is free), so only its range is checked.
        words = line.split()
        assert words[2] == "same" and words[4] in ("1", "2"), line
        assert words[5:] == ["rows", "[1,", "4,", "4,", "4,", "4]", "declined", "1"], line


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    from rfsgen import save_features
    from rfsgen.sampler import sample
    from rfsgen.skeleton import parse_skeleton

    d = tmp_path_factory.mktemp("gpu")
    save_features(sample(parse_skeleton(SKELETONS["gauss-laplace"]), 16, 1), d / "f.h5")
    np.save(d / "rows.npy", np.random.default_rng(1).standard_normal((4, 6)))
    return d


def test_device_cuda_without_a_gpu_is_one_line_and_writes_nothing(features):
    r = _rfsgen(["transform", "f.h5", "rows.npy", "-o", "none.h5", "--device", "cuda"], sim=False, cwd=features)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "--device cuda" in r.stderr and "no GPU" in r.stderr, r.stderr
    assert not (features / "none.h5").exists()
    assert not list(features.glob("*none*"))


def test_device_auto_takes_the_cpu_here_and_says_so(features):
    r = _rfsgen(["transform", "f.h5", "rows.npy", "-o", "auto.h5", "--device", "auto"], sim=False, cwd=features)
    assert r.returncode == 0, r.stderr
    assert "device: cpu (--device auto: no GPU found)" in r.stderr
    r2 = _rfsgen(["transform", "f.h5", "rows.npy", "-o", "cpu.h5", "-q"], sim=False, cwd=features)
    assert r2.returncode == 0 and r2.stderr == ""
    assert (features / "auto.h5").read_bytes() == (features / "cpu.h5").read_bytes()
    # auto never takes the simulator (a test device): --device cuda does
    r3 = _rfsgen(["transform", "f.h5", "rows.npy", "-o", "auto-sim.h5", "--device", "auto", "-q"], sim=True,
                 cwd=features)
    assert r3.returncode == 0 and "device: cpu (--device auto: no GPU found)" in r3.stderr


def test_cpu_device_never_imports_numba_cuda(features):
    r = _python("""
        import sys
        import numpy as np
        from rfsgen import load_features
        from rfsgen.transform import transform
        transform(load_features("f.h5"), np.load("rows.npy"))
        print("numba.cuda" in sys.modules)
    """, sim=False, cwd=features)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_library_device_errors(features):
    from rfsgen.errors import DeviceError
    from rfsgen.transform import resolve_device

    assert resolve_device("cpu") == ("cpu", "cpu")
    with pytest.raises(DeviceError, match="one of cpu, cuda, auto"):
        resolve_device("tpu")


def test_gpu_host_buffers_count_in_the_memory_budget():
    # rfsgen._cuda's page-locked copies (float32 rows, atoms, source values, output) are
    # counted in each chunk row's bytes, so --max-memory sizes chunks with them
    from rfsgen.paths import Transformer
    from rfsgen.sampler import sample
    from rfsgen.skeleton import parse_skeleton

    fs = sample(parse_skeleton(SKELETONS["gauss-laplace"]), 16, 1)
    cpu, gpu = Transformer(fs, np.float32), Transformer(fs, np.float32, "cuda")
    extra = 4 * fs.skeleton.width + 16 * cpu.source_width + 4 * fs.columns
    assert gpu.row_bytes == cpu.row_bytes + extra

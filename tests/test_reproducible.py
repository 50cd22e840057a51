"""The same bytes on every machine: outputs do not depend on the CPU, BLAS kernel,
thread count, chunk size or sharding.

Two kinds of check, neither of which passes merely because it ran on one CPU:

* the compiled loops are compared bit for bit with a fixed-order reference written
  one IEEE operation at a time (numpy elementwise operations, a float32 fused
  multiply-add built from exact float64 steps, and rfsgen's own cos/sin,
  :mod:`rfsgen._sincos` and :mod:`rfsgen._sincos32`, themselves checked against
  high-precision references in tests/test_sincos.py and tests/test_sincos32.py),
  which defines the result independently of any machine;
* whole jobs (every scheme and base kind, float32/float64, csr/dense) are run in
  subprocesses that imitate other CPUs: numba compiling for another target
  (``NUMBA_CPU_NAME``), OpenBLAS using another kernel (``OPENBLAS_CORETYPE``) and
  numpy's SIMD dispatch limited to older instruction sets
  (``NPY_DISABLE_CPU_FEATURES``); their file hashes must all agree.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, SKELETONS
from rfsgen import load_skeleton, sample, save_features
from rfsgen._compiled import orthonormal_rows
from rfsgen.transform import transform, transform_file

HASHES = ROOT / "tests" / "tools" / "repro_hashes.py"


@pytest.mark.parametrize("m, a, w", [(13, 21, 37), (3, 150, 37), (17, 70, 37), (14, 40, 600), (5, 9, 1)])
def test_phases_follow_the_fixed_order_reference(m, a, w):
    """Row tiles, atom blocks, runs of terms (w > 256 is summed in parts, continued
    exactly) and several nodes (unsorted) change nothing: every angle is the
    left-to-right float32 fused multiply-add sum from 0.0 of the values and frequencies
    rounded to float32 (output definition 3), then rfsgen's own float32-accurate cos
    and sin (tests/test_sincos32.py checks the fma reference against exact rationals
    and cos/sin against a high-precision reference)."""
    from rfsgen._sincos32 import sincos
    from rfsgen.bases import phases_of
    from test_sincos32 import fma_reference

    rng = np.random.default_rng(m)
    xp = rng.standard_normal((m, 3, w)) * 3
    node = rng.integers(0, 3, a)
    om = rng.standard_normal((a, w))
    re, im = phases_of(xp, node, om)
    acc = np.zeros((m, a), np.float32)
    x32, om32 = xp.astype(np.float32), om.astype(np.float32)
    for c in range(w):  # left to right from 0.0, one fused multiply-add per step
        acc = fma_reference(x32[:, node, c], om32[:, c], acc)
    assert re.tobytes() == np.array([[sincos(v)[1] for v in row] for row in acc]).tobytes()
    assert im.tobytes() == np.array([[sincos(v)[0] for v in row] for row in acc]).tobytes()


@settings(max_examples=25, derandomize=True, deadline=None)
@given(m=st.integers(1, 20), a=st.integers(1, 40), w=st.integers(1, 600), density=st.floats(0.0, 0.3),
       seed=st.integers(0, 2**32 - 1))
def test_sums_over_nonzero_values_give_the_dense_bits(m, a, w, density, seed):
    """Sparse rows: leaving out the zero terms (signed zeros among them) changes no bit,
    and the automatic choice (dense or sparse by the share of nonzeros) gives the same."""
    from rfsgen.bases import phases_of

    rng = np.random.default_rng(seed)
    xp = rng.standard_normal((m, 1, w)) * 10.0 ** rng.integers(-5, 5, (m, 1, w))
    xp[rng.random((m, 1, w)) >= density] = 0.0
    xp[rng.random((m, 1, w)) < 0.05] = -0.0
    om = rng.standard_normal((a, w)) * 10.0 ** rng.integers(-3, 3, (a, 1))
    node = np.zeros(a, np.int64)
    dense = phases_of(xp, node, om, sparse=False)
    for how in (True, None):
        got = phases_of(xp, node, om, sparse=how)
        assert got[0].tobytes() == dense[0].tobytes() and got[1].tobytes() == dense[1].tobytes()


def test_a_csr_row_gives_the_bits_of_the_dense_row():
    import scipy.sparse as sp

    from rfsgen import parse_skeleton

    skel = parse_skeleton("rfsgen: 1\ninput: {width: 3000}\nnodes:\n  - {name: x, base: gaussian, scale: 0.1}\n"
                          "output: x\n", "g.yaml")
    fs = sample(skel, 300, seed=3)
    x = sp.random(40, 3000, density=0.01, format="csr", dtype=np.float32, random_state=2)
    dense = transform(fs, x.toarray(), layout="dense", dtype="float64")
    assert transform(fs, x, layout="dense", dtype="float64").tobytes() == dense.tobytes()
    half = x.toarray()
    half[:, :1500] = 1.0  # dense rows: the every-value path
    both = transform(fs, np.concatenate([x.toarray(), half]), layout="dense", dtype="float64", chunk_rows=40)
    assert both[:40].tobytes() == dense.tobytes()


def _dot8(a, b):
    s = np.zeros(8)
    n8 = a.size - a.size % 8
    for e in range(0, n8, 8):
        s = s + a[e:e + 8] * b[e:e + 8]
    for e in range(n8, a.size):
        s[0] = s[0] + a[e] * b[e]
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


def test_orthonormal_rows_follow_the_fixed_order_reference():
    g = np.random.default_rng(1).standard_normal((9, 29))
    got = g.copy()
    orthonormal_rows(got)
    ref = g.copy()
    for i in range(9):
        for _ in range(2):
            for j in range(i):
                ref[i] = ref[i] - _dot8(ref[j], ref[i]) * ref[j]
        ref[i] = ref[i] / math.sqrt(_dot8(ref[i], ref[i]))
    assert got.tobytes() == ref.tobytes()
    np.testing.assert_allclose(got @ got.T, np.eye(9), atol=1e-14)
    # the same rows as LAPACK's QR up to rounding (the Q with a positive R diagonal)
    q, r = np.linalg.qr(g.T)
    np.testing.assert_allclose(got, (q * np.sign(np.diag(r))).T, atol=1e-13)


@pytest.mark.parametrize("scheme", ["rr", "orf"])
def test_rows_alone_shards_and_chunks_give_the_same_values(cifar_rows, scheme):
    """The issue's reproducer: rr in float64 differed for a row alone (BLAS GEMV vs GEMM)."""
    fs = sample(load_skeleton(SKELETONS / "shallow-gaussian.yaml"), 800, seed=5, scheme=scheme)
    x = cifar_rows[:61]
    whole = transform(fs, x, layout="dense", dtype="float64")
    alone = np.concatenate([transform(fs, x[i:i + 1], layout="dense", dtype="float64") for i in range(0, 61, 6)])
    assert alone.tobytes() == whole[0:61:6].tobytes()
    for chunk in (1, 7, 64):
        assert transform(fs, x, layout="dense", dtype="float64", chunk_rows=chunk).tobytes() == whole.tobytes()


def test_output_files_do_not_depend_on_chunk_rows_or_sharding(tmp_path, cifar_rows):
    """CSR blocks of 2^20 values are crossed several times, so the order in which
    data and index blocks are placed in the file matters (it used to follow the
    chunk size); the files must be identical with cmp, and shards must hold
    exactly the unsharded values."""
    fs = sample(load_skeleton(SKELETONS / "cifar-deep.yaml"), 3000, seed=2)
    feats = tmp_path / "f.h5"
    save_features(fs, feats)
    x = np.concatenate([cifar_rows] * 12)[:700]
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    for layout in ("csr", "dense"):
        outs = []
        for chunk in (None, 37, 1000):
            out = tmp_path / f"{layout}-{chunk}.h5"
            transform_file(feats, tmp_path / "x.npy", out, layout=layout, chunk_rows=chunk)
            outs.append(out.read_bytes())
        assert outs[0] == outs[1] == outs[2], layout
    with h5py.File(tmp_path / "dense-None.h5") as f:
        whole = f["X"][()]
    parts = []
    for a, b in ((0, 250), (250, 251), (251, 700)):
        out = tmp_path / f"shard-{a}.h5"
        transform_file(feats, tmp_path / "x.npy", out, layout="dense", dtype="float32", rows=f"{a}:{b}")
        with h5py.File(out) as f:
            parts.append(f["X"][()])
    assert np.concatenate(parts).tobytes() == whole.tobytes()


def _has(flag: str) -> bool:
    try:
        return f" {flag}" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# Imitated CPUs.  Every x86-64 CPU runs "generic" and (with AVX2) "haswell" code;
# skylake-avx512 only where the host has AVX-512.
VARIANTS = {
    "host": {},
    "generic": {"NUMBA_CPU_NAME": "generic", "OPENBLAS_CORETYPE": "Prescott",
                "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR X86_V3"},
}
if _has("avx2") and _has("fma"):
    VARIANTS["haswell"] = {"NUMBA_CPU_NAME": "haswell", "OPENBLAS_CORETYPE": "Haswell",
                           "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}
if _has("avx512f"):
    VARIANTS["skylake-avx512"] = {"NUMBA_CPU_NAME": "skylake-avx512", "OPENBLAS_CORETYPE": "SkylakeX"}


@pytest.mark.slow
def test_same_bytes_on_imitated_cpus(tmp_path):
    """Feature files and transform outputs of every scheme and base kind hash the same
    under each imitated CPU (numba target, OpenBLAS kernel, numpy SIMD level)."""
    results = {}
    for name, env in VARIANTS.items():
        full = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CPU", "NPY_DISABLE"))}
        full.update(env)
        # one directory for all: outputs record their input and feature-file paths
        r = subprocess.run([sys.executable, str(HASHES), str(tmp_path / "run")], env=full, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"
        results[name] = json.loads(r.stdout)
    host = results.pop("host")
    for name, got in results.items():
        differ = sorted(k for k in host if got[k] != host[k])
        assert not differ, f"{name} differs from the host in {differ}"
    for key in host:  # --chunk-rows 7 gives the same file as the default
        if key.endswith("/None"):
            assert host[key] == host[key[:-4] + "7"], key


def test_same_bytes_without_hardware_fma(tmp_path):
    """Output definition 3's angles are float32 fused multiply-adds.  Compiled for this
    CPU they use its FMA instructions; compiled for ``NUMBA_CPU_NAME=generic`` (x86-64
    without FMA) LLVM calls the C library's correctly rounded ``fmaf`` instead.  Each
    subprocess starts from an empty numba cache, and the test checks that the two code
    generations really differ (hardware FMA in one, calls to fmaf in the other) and
    that the bytes of the angles, cos/sin and a whole transform are the same."""
    script = ROOT / "tests" / "tools" / "fma_bytes.py"
    runs = {}
    for name, cpu in (("host", None), ("generic", "generic")):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CPU", "NUMBA_CACHE_DIR"))}
        env["NUMBA_CACHE_DIR"] = str(tmp_path / f"cache-{name}")  # empty: everything compiled anew
        if cpu:
            env["NUMBA_CPU_NAME"] = cpu
        r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"
        runs[name] = json.loads(r.stdout)
    host, generic = runs["host"], runs["generic"]
    assert not generic["vfmadd"] and generic["calls fmaf"], generic
    if _has("fma"):
        assert host["vfmadd"] and not host["calls fmaf"], host
    assert host["hashes"] == generic["hashes"]


def test_numba_is_told_to_keep_the_c_librarys_exp_and_log(tmp_path):
    """A loop of exp or log that LLVM vectorises would call Intel's SVML where numba finds
    it (conda's ``icc_rt``), with other last bits: importing rfsgen before numba turns
    that off for the process, whatever the environment said.  Imported after numba with
    SVML in use, rfsgen warns and keeps what it compiles out of the on-disk cache other
    processes read, unless the user chose the cache directory (SVML is imitated: no
    llvmlite here is built with it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_DISABLE_INTEL_SVML", "NUMBA_CACHE_DIR")}
    env["TMPDIR"] = str(tmp_path)
    for given in (None, "0"):
        if given is not None:
            env["NUMBA_DISABLE_INTEL_SVML"] = given
        r = subprocess.run([sys.executable, "-c", "import rfsgen.transform, numba, os; "
                            "print(os.environ['NUMBA_DISABLE_INTEL_SVML'], numba.config.DISABLE_INTEL_SVML, "
                            "numba.config.USING_SVML)"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["1", "1", "False"]
    svml_first = ("import warnings, numba; numba.config.USING_SVML = True\n"
                  "with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
                  "    import rfsgen, rfsgen._compiled as c\n"
                  "print(c.faint_rows._cache._cache_path)\n"
                  "print(*(type(x.message).__name__ + ': ' + str(x.message) for x in w))")
    r = subprocess.run([sys.executable, "-c", svml_first], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path, said = r.stdout.splitlines()
    assert path.startswith(str(tmp_path / "rfsgen-numba-svml-"))
    assert said.startswith("RfsgenWarning: numba was imported before rfsgen with Intel SVML in use")
    assert f"this process caches compiled code in {tmp_path}" in said
    assert said.endswith("set NUMBA_DISABLE_INTEL_SVML=1")
    r = subprocess.run([sys.executable, "-c", svml_first], env={**env, "NUMBA_CACHE_DIR": str(tmp_path / "mine")},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path, said = r.stdout.splitlines()
    assert path.startswith(str(tmp_path / "mine")) and "(NUMBA_CACHE_DIR) is then shared" in said
    r = subprocess.run([sys.executable, "-W", "error", "-c", "import numba; import rfsgen.transform, numba; "
                        "assert not numba.config.CACHE_DIR"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

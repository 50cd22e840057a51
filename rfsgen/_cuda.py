"""``--device cuda``: gaussian and laplace atoms, and the products into columns, on a GPU with
the CPU's bits.

What runs on the GPU: the angles of output definition 3 (:mod:`rfsgen._sincos32`) and their
cos and sin, one thread per (row, atom): ``theta = fma(x[c], w[c], ...)`` for c = 0, 1, ...,
w - 1 from +0.0, one float32 rounding per term (CUDA's ``fmaf``, the IEEE fused multiply-add,
``fma.rn.f32``), on the same float32 rows and frequencies the CPU path rounds (the host rounds
them, :func:`rfsgen.bases.phases_of`, and copies them over); then the fast-range cos and sin
with the CPU's float64 Cody-Waite reduction and polynomials (the constants of
:mod:`rfsgen._sincos32` and :mod:`rfsgen._sincos`, and :func:`rfsgen._sincos._quadrant`
compiled for the device).  The CPU's fixed order is a sequential sum (its register tiles and
runs only choose which independent sums run together), so one thread per sum gives its bits.

The products into columns (:func:`columns`, the GPU's :func:`rfsgen._compiled.columns`): each
row's factors (atoms read from the chunk's source values and their powers by repeated
squaring), then one thread per (row, output column) multiplies the column's factors left to
right in float64 and stores its scale (the activations' weights) times the real or imaginary
part in the output dtype, as the CPU's vector loop does lane by lane.  For a dense chunk whose
parts all run there (:func:`columns_resident`), the atoms' cos and sin are written on the GPU
straight into their place in the chunk's source values and multiplied there: only the rows go
over and the output comes back.

What stays on the CPU: everything else.  Angles beyond ``FAST_LIMIT`` (about 8.2e5), inf and
NaN are redone by the CPU's Payne-Hanek routine (:func:`rfsgen._sincos.redo_slow`) from the
float32 angles the GPU returns; rows over the float32 overflow bound are redone by
:func:`rfsgen.bases._careful_angles` as on the CPU; preparing the rows, the other bases'
atoms (sphere, circle, categorical, binary, brownian: cheap next to the products), the
log-domain columns of heavy-tailed activations, the overflow and underflow checks, EOF
columns and the writer run on the CPU.  Each chunk's source values go to the GPU and its
output comes back (no streams or pinned buffers yet).

**No contraction.**  NVVM contracts ``a * b + c`` into a fused multiply-add by default
(``-fma=1``) even without fast-math, which would change the float64 reduction and
polynomial bits; so the device code spells every float64 operation with libdevice's
``__nv_dmul_rn`` and ``__nv_dadd_rn``, which are never contracted, in the CPU's order.

**The simulator** (``NUMBA_ENABLE_CUDASIM=1``, the tests) runs the kernel in Python with
numpy scalars.  Its ``cuda.fma`` is ``a * b + c`` on them: for float32 values the product is
rounded to float32 and then the sum again, not a fused multiply-add (tests/test_gpu.py shows
it differing).  So under the simulator :func:`_fma32` is an exact emulation (the product of
two float32 values is exact in float64; the float64 sum and its two-sum error decide the
one float32 rounding, the reference of tests/test_sincos32.py), and the float64 operations
are Python's IEEE float64 ones, never contracted: the simulator compares real bits of the
same kernel source.

numba.cuda is imported only here, and this module only when the device is not the CPU.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .errors import DeviceError

DEVICES = ("cpu", "cuda", "auto")


def _simulator() -> bool:
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


def available() -> bool:
    """True when numba's CUDA target finds a GPU (or its simulator is enabled)."""
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:  # a broken driver or toolkit: no GPU
        return False


def resolve(device: str) -> tuple[str, str]:
    """``(device, note)``: ``cpu`` or ``cuda`` for ``--device`` ``device``, and a few words
    saying which and why.  ``cuda`` without a GPU is a :class:`DeviceError` (checked before
    any output is opened).  ``auto`` picks the GPU when numba's CUDA target finds one, never
    the simulator (a test device: ``--device cuda`` uses it when it is enabled)."""
    if device not in DEVICES:
        raise DeviceError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return "cpu", "cpu"
    if device == "cuda":
        if not available():
            why = "numba's CUDA target finds no GPU here (no CUDA device, driver or toolkit)"
            raise DeviceError(f"device='cuda': {why}; use device='cpu' or 'auto'",
                              cli=f"--device cuda: {why}; use --device cpu or auto")
        return "cuda", "cuda (numba's CUDA simulator)" if _simulator() else "cuda"
    if not _simulator() and available():
        return "cuda", "cuda (--device auto: a GPU was found)"
    return "cpu", "cpu (--device auto: no GPU found)"


_KERNEL = None
cuda = None  # numba.cuda, a module global (the simulator swaps the kernels' global ``cuda``)


def _host_cuda():
    """numba.cuda for host code (copies, buffers, streams).  Not the module global ``cuda``:
    while a kernel runs, the simulator replaces that global with its fake device module,
    which another thread's host code would then see."""
    from numba import cuda as host

    return host


def _build():
    """Compile (lazily, once) the kernel for the real target or the simulator."""
    global _KERNEL, cuda
    if _KERNEL is not None:
        return _KERNEL
    from numba import cuda

    from ._sincos import FAST_LIMIT, INV_PIO2, P1, P2, P3, _quadrant
    from ._sincos32 import _ROUND, C1, C2, C3, C4, C5, S1, S2, S3, S4, S5

    if _simulator():
        def _dmul(a, b):
            return float(a) * float(b)

        def _dadd(a, b):
            return float(a) + float(b)

        def _fma32(a, b, c):
            return fma32_exact(a, b, c)

        quadrant = _quadrant.py_func
    else:  # pragma: no cover - needs a GPU
        from numba.cuda import libdevice

        _dmul, _dadd, _fma32 = libdevice.dmul_rn, libdevice.dadd_rn, cuda.fma
        quadrant = cuda.jit(device=True)(_quadrant.py_func)

    @cuda.jit(device=True)
    def sincos_fast(x):
        # rfsgen._sincos32._reduce, _kernels and sincos_into's quadrant step, in its order
        fn = _dadd(_dadd(_dmul(x, INV_PIO2), _ROUND), -_ROUND)
        r = _dadd(_dadd(_dadd(x, -_dmul(fn, P1)), -_dmul(fn, P2)), -_dmul(fn, P3))
        q = np.int32(fn)
        z = _dmul(r, r)
        ps = _dadd(S4, _dmul(z, S5))
        ps = _dadd(S3, _dmul(z, ps))
        ps = _dadd(S2, _dmul(z, ps))
        ps = _dadd(S1, _dmul(z, ps))
        s = _dadd(r, _dmul(_dmul(r, z), ps))
        pc = _dadd(C4, _dmul(z, C5))
        pc = _dadd(C3, _dmul(z, pc))
        pc = _dadd(C2, _dmul(z, pc))
        pc = _dadd(C1, _dmul(z, pc))
        c = _dadd(1.0, _dmul(z, pc))
        return quadrant(q, s, c)

    @cuda.jit
    def phases_kernel(x2, w, node, pan, theta, re, im, slow):
        r, k = cuda.grid(2)
        if r < x2.shape[0] and k < node.shape[0]:
            col0 = node[k] * w
            acc = np.float32(0.0)
            for c in range(w):
                acc = _fma32(x2[r, col0 + c], pan[c, k], acc)
            theta[r, k] = acc
            x = _dadd(np.float64(acc), 0.0)  # the sign of a zero angle dropped
            if not (abs(x) <= FAST_LIMIT):
                x = 0.0  # redone on the CPU (redo_slow), as sincos_into does
                slow[0] = 1  # the angles go back to the host only when one needs it
            ss, cc = sincos_fast(x)
            re[r, k] = cc
            im[r, k] = ss

    @cuda.jit
    def factors_kernel(src, ir, cr, ii, ci, xatom, xpow, fr, fi):
        # rfsgen._compiled._columns' gather and _power for one (row, factor), in their order
        r, f = cuda.grid(2)
        a = ir.shape[0]
        if r < src.shape[0] and f < fr.shape[1]:
            k = f if f < a else xatom[f - a]
            zr = _dmul(cr[k], src[r, ir[k]])
            zi = _dmul(ci[k], src[r, ii[k]]) if ii[k] >= 0 else 0.0
            if f < a:
                fr[r, f] = zr
                fi[r, f] = zi
                return
            p = xpow[f - a]
            sign = 1.0
            if p < 0:
                p = -p
                sign = -1.0
            ar = zr
            ai = _dmul(sign, zi)
            rr = 1.0
            ri = 0.0
            while p > 0:
                if p & 1:
                    x = _dadd(_dmul(rr, ar), -_dmul(ri, ai))
                    ri = _dadd(_dmul(rr, ai), _dmul(ri, ar))
                    rr = x
                p >>= 1
                if p > 0:
                    x = _dadd(_dmul(ar, ar), -_dmul(ai, ai))
                    ai = _dmul(_dmul(2.0, ar), ai)
                    ar = x
            fr[r, f] = rr
            fi[r, f] = ri

    @cuda.jit
    def columns_kernel(fr, fi, fidx, fptr, sc, imag, pos, out):
        # rfsgen._vector.product for one (row, output column): the complex product of the
        # column's factors left to right, then sc times its real or imaginary part
        r, j = cuda.grid(2)
        if r < out.shape[0] and j < out.shape[1]:
            p = pos[j]
            q0 = fptr[p]
            q1 = fptr[p + 1]
            xr = 1.0
            xi = 0.0
            if q1 > q0:
                xr = fr[r, fidx[q0]]
                xi = fi[r, fidx[q0]]
                for q in range(q0 + 1, q1):
                    u = fr[r, fidx[q]]
                    w = fi[r, fidx[q]]
                    x = _dadd(_dmul(xr, u), -_dmul(xi, w))
                    xi = _dadd(_dmul(xr, w), _dmul(xi, u))
                    xr = x
            out[r, j] = _dmul(sc[p], xi if imag[p] else xr)

    _KERNEL = (phases_kernel, factors_kernel, columns_kernel)
    return _KERNEL


def fma32_exact(a, b, c):
    """``a * b + c`` rounded once to float32 (round to nearest, ties to even) for float32
    scalars, in Python's float64: the product is exact, the sum ``s`` and its error ``e``
    (two-sum) are exact, and ``float32(s)`` is the correctly rounded result unless ``s`` is a
    float32 midpoint and ``e`` is not 0 (then ``e``'s sign says which side)."""
    a, b, c = float(a), float(b), float(c)
    p = a * b
    s = p + c
    if not math.isfinite(s):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.float32(s)
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    with np.errstate(over="ignore"):
        r = np.float32(s)
    rd = float(r)
    if e != 0 and s != rd and math.isfinite(rd):
        other = np.nextafter(r, np.float32(np.inf) if s > rd else np.float32(-np.inf))
        if s == (rd + float(other)) * 0.5:
            r = max(r, other) if e > 0 else min(r, other)
    return np.float32(r)


class _Staging(threading.local):
    """One thread's stream, device arrays and page-locked host buffers, reused from chunk to
    chunk (a device allocation per chunk costs more than a small kernel, and copies from
    page-locked memory run at the bus's speed).  Thread-local: transforms of one feature
    set may run in several threads at once (a Dask worker's), each with its own."""

    def __init__(self):
        self.stream = _host_cuda().stream()
        self.device = {}
        self.host = {}

    def on_device(self, name, shape, dtype):
        a = self.device.get(name)
        if a is None or a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
            a = self.device[name] = _host_cuda().device_array(shape, dtype, stream=self.stream)
        return a

    def on_host(self, name, shape, dtype):
        a = self.host.get(name)
        if a is None or a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
            a = self.host[name] = _host_cuda().pinned_array(shape, dtype)
        return a

    def upload(self, name, x):
        """``x`` (C order) to the device, through a page-locked buffer, on the stream."""
        h = self.on_host(name, x.shape, x.dtype)
        h[...] = x
        d = self.on_device(name, x.shape, x.dtype)
        d.copy_to_device(h, stream=self.stream)
        return d


class _PhaseArrays:
    """A phase plan's atoms' nodes and float32 frequencies on the GPU (made once per plan,
    shared read-only by every thread) and each thread's :class:`_Staging`."""

    def __init__(self, plan):
        from ._sincos32 import unpack_panels

        node = np.repeat(plan.nodes, plan.ends - plan.starts).astype(np.int64)
        self.node = _host_cuda().to_device(node)
        self.pan = _host_cuda().to_device(np.ascontiguousarray(unpack_panels(plan.pan, plan.loc)))  # (w, a)
        self.staging = _Staging()


_LOCK = threading.Lock()  # first uses of a plan from several threads build its device arrays once
_SIM_LOCK = threading.Lock()


def _launch(kernel, blocks, tpb, stream, *args) -> None:
    """Launch ``kernel`` on ``stream``.  numba's simulator runs one kernel at a time in a
    process (it refuses concurrent ones), so under it launches from several threads take
    turns; each thread's copies and buffers stay its own either way."""
    if _simulator():
        with _SIM_LOCK:
            kernel[blocks, tpb, stream](*args)
    else:  # pragma: no cover - needs a GPU
        kernel[blocks, tpb, stream](*args)


def phases(x2, w, plan, re, im) -> None:
    """The GPU's :func:`rfsgen._sincos32.phases`: cos and sin of the float32 angles of
    ``x2`` (float32 ``(m, G w)``) and ``plan`` (:class:`rfsgen.bases._PhasePlan`: atoms
    sorted by node, their packed float32 frequencies ``plan.pan``) into float64 ``re, im`` ``(m, a)``
    (views allowed), with the CPU path's bits.  The frequencies go to the GPU once per plan
    (``plan.gpu``); the float32 angles come back only when one is beyond the fast range,
    for the CPU's Payne-Hanek routine."""
    from ._sincos import redo_slow

    kernel = _build()[0]
    if plan.gpu is None:
        with _LOCK:
            if plan.gpu is None:
                plan.gpu = _PhaseArrays(plan)
    gpu = plan.gpu
    st = gpu.staging
    m, a = re.shape
    d_x = st.upload("x", np.ascontiguousarray(x2))
    d_slow = st.upload("slow", np.zeros(1, np.int32))
    d_theta = st.on_device("theta", (m, a), np.float32)
    d_re = st.on_device("re", (m, a), np.float64)
    d_im = st.on_device("im", (m, a), np.float64)
    tpb = (8, 32)
    blocks = (-(-m // tpb[0]), -(-a // tpb[1]))
    _launch(kernel, blocks, tpb, st.stream, d_x, w, gpu.node, gpu.pan, d_theta, d_re, d_im, d_slow)
    hre, him = st.on_host("re", (m, a), np.float64), st.on_host("im", (m, a), np.float64)
    slow = st.on_host("slow", (1,), np.int32)
    d_re.copy_to_host(hre, stream=st.stream)
    d_im.copy_to_host(him, stream=st.stream)
    d_slow.copy_to_host(slow, stream=st.stream)
    st.stream.synchronize()
    if slow[0]:
        theta = d_theta.copy_to_host(stream=st.stream)
        st.stream.synchronize()
        redo_slow(theta.reshape(-1), m * a, hre.reshape(-1), him.reshape(-1))
    re[...] = hre
    im[...] = him


class ColumnsPlan:
    """The static arrays of :func:`rfsgen._compiled.columns` (``ir, cr, ii, ci, xatom,
    xpow, fidx, fptr, sc, imag, pos``: how atoms are read, raised and multiplied into
    columns), copied to the GPU once, on first use.  Pickles without its device copies."""

    def __init__(self, *static):
        self.static = static
        self._device = None
        self._staging = None

    def __getstate__(self):
        return {"static": self.static, "_device": None, "_staging": None}

    def device_arrays(self):
        if self._device is None:
            _build()
            with _LOCK:
                if self._device is None:
                    self._staging = _Staging()
                    self._device = tuple(_host_cuda().to_device(np.ascontiguousarray(a)) for a in self.static)
        return self._device


def columns(src, plan: ColumnsPlan, out) -> None:
    """The GPU's :func:`rfsgen._compiled.columns` with its bits: the factor values of each
    row (atoms ``cr * src[:, ir] + i ci * src[:, ii]`` and their powers by repeated
    squaring), then each output column's complex product, left to right, times its scale,
    real or imaginary part, into ``out`` (float32 or float64 ``(m, D)``, C order) from
    ``src`` (float64 ``(m, s)``).  Every float64 operation is an uncontracted
    ``__nv_dmul_rn``/``__nv_dadd_rn`` in the CPU's order (the CPU loop's 8-row lanes and
    tiles only choose which independent products run together)."""
    _build()
    plan.device_arrays()
    _products(plan, plan._staging.upload("src", np.ascontiguousarray(src)), out)


def _products(plan: ColumnsPlan, d_src, out) -> None:
    """:func:`columns`' kernels on the chunk's source values already on the GPU (``d_src``),
    on the plan's stream, then ``out`` back through a page-locked buffer."""
    _, factors_kernel, columns_kernel = _build()
    ir, cr, ii, ci, xatom, xpow, fidx, fptr, sc, imag, pos = plan.device_arrays()
    st = plan._staging
    m, d = out.shape
    n_factors = plan.static[0].size + plan.static[4].size
    d_fr = st.on_device("fr", (m, max(n_factors, 1)), np.float64)
    d_fi = st.on_device("fi", (m, max(n_factors, 1)), np.float64)
    d_out = st.on_device("out", (m, d), out.dtype)
    tpb = (8, 32)
    if n_factors:
        _launch(factors_kernel, (-(-m // tpb[0]), -(-n_factors // tpb[1])), tpb, st.stream, d_src, ir, cr, ii, ci,
                xatom, xpow, d_fr, d_fi)
    _launch(columns_kernel, (-(-m // tpb[0]), -(-d // tpb[1])), tpb, st.stream, d_fr, d_fi, fidx, fptr, sc, imag, pos,
            d_out)
    h_out = st.on_host("out", (m, d), out.dtype)
    d_out.copy_to_host(h_out, stream=st.stream)
    st.stream.synchronize()
    out[...] = h_out


def columns_resident(host, jobs, plan: ColumnsPlan, out) -> bool:
    """A chunk's output with its atoms kept on the GPU: the source values ``host`` (float64
    ``(m, s)``, every group but the GPU's filled in) go over, each job's angles and their cos
    and sin are written straight into their place there (``jobs``: ``(offset, x2, width,
    phase plan)``, the atoms' cos at columns ``offset..offset + a`` and sin after them, as
    :func:`phases` computes them), then :func:`columns` runs on them and ``out`` comes back:
    no copy of the atoms to the host and back.  False, with ``out`` unwritten, when an
    angle is beyond the fast range (the caller takes the host's path for the chunk, whose
    Payne-Hanek redo gives the same bits)."""
    phases_kernel = _build()[0]
    plan.device_arrays()
    st = plan._staging
    m = out.shape[0]
    d_src = st.upload("src", np.ascontiguousarray(host))
    tpb = (8, 32)
    for j, (offset, x2, w, pplan) in enumerate(jobs):
        if pplan.gpu is None:
            with _LOCK:
                if pplan.gpu is None:
                    pplan.gpu = _PhaseArrays(pplan)
        a = pplan.order.size
        d_x = st.upload(f"x{j}", np.ascontiguousarray(x2))
        d_theta = st.on_device(f"theta{j}", (m, a), np.float32)
        d_slow = st.upload(f"slow{j}", np.zeros(1, np.int32))
        _launch(phases_kernel, (-(-m // tpb[0]), -(-a // tpb[1])), tpb, st.stream, d_x, w, pplan.gpu.node,
                pplan.gpu.pan, d_theta, d_src[:, offset:offset + a], d_src[:, offset + a:offset + 2 * a], d_slow)
    slow = st.on_host("slow", (max(len(jobs), 1),), np.int32)
    for j in range(len(jobs)):
        st.device[f"slow{j}"].copy_to_host(slow[j:j + 1], stream=st.stream)
    st.stream.synchronize()
    if jobs and slow[:len(jobs)].any():
        return False
    _products(plan, d_src, out)
    return True

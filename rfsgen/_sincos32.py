"""Output definition 3: gaussian and laplace angles as float32 fused multiply-adds in
one fixed order, and a float32-accurate cos and sin of them, compiled with numba.

**Angles.** ``theta[r, k] = fma(x[r, c], w[c, k], ...)`` for c = 0, 1, ..., d - 1 in
that order from +0.0, one rounding per term (``llvm.fma.f32``), with ``x`` the prepared
row rounded once to float32 and ``w`` the scaled frequency (``omega * scale`` in
float64) rounded once to float32.  Hardware FMA where the CPU has it; on a CPU
without it LLVM calls the C library's ``fmaf``, which is correctly rounded (glibc), so
the bits are the same, only slower (a test compiles for ``NUMBA_CPU_NAME=generic`` and
compares).  Never fast-math: the loops only choose which independent sums run
together (register tiles of :data:`ROWS` rows x :data:`TILE` atoms over frequencies
packed tile by tile, runs of :data:`SUM_BLOCK` terms continued exactly from the stored
float32 partial sum, cache blocks of rows and atoms), whatever the threads, chunks or
CPU.  The sum's sign of
zero is dropped (``+ 0.0``): a term ``0 * w`` adds nothing else, so sparse rows can
skip their zeros and give the same bits.

**cos and sin** of a float32 angle ``t``: ``t`` is widened to float64 exactly and
reduced there, ``t = n pi/2 + r``, by Cody-Waite with the 33-bit pieces P1, P2, P3 of
:mod:`rfsgen._sincos` (``t - n P1`` exact by Sterbenz, ``n P1, n P2, n P3`` exact for
``|n| < 2^20``): because ``t`` has 24 significant bits, the nearest a float32 comes to
a multiple of pi/2 in that range is far above the reduction's error (checked over every
float32, ``tests/tools/fit_sincos32.py``), so no double-double tail is needed.  Then
polynomials of degree 11 (sin) and 10 (cos) (``tests/tools/fit_sincos32.py``:
relative error 2^-47.4 and 2^-43.6 on [0, pi/4]; one term fewer each would do for the
float32 rounding alone, but the values go into float64 products, where |cos|^2 + |sin|^2
should stay 1 to about 1e-13), evaluated in float64.  Beyond ``FAST_LIMIT`` (about 8.2e5), and for inf and NaN, the
float64 Payne-Hanek routine of :mod:`rfsgen._sincos` (under 1 ulp of float64) is used
one value at a time.  The values are float64 (not rounded to float32: the product
loop multiplies them in float64) within about 2^-43 of the true ones, so their float32
rounding is within 1 ulp of the correctly rounded float32 result (tests/test_sincos32.py).
Why float64 inside: the float32 angle itself is exact in float64, and a float64
reduction and polynomial cost about what float32 ones with extra-precise pieces would,
without float32's error analysis; the measured cost is in docs/performance.md.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ._signals import deferred
from ._compiled import TILE as LANES
from ._compiled import tile_buffers, tile_columns
from ._sincos import FAST_LIMIT, INV_PIO2, P1, P2, P3, _quadrant, redo_slow

with deferred():
    import numba
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

#: Polynomial coefficients (tests/tools/fit_sincos32.py, a weighted Lawson minimax fit
#: on [0, pi/4 + 1e-3]): sin r = r + r^3 (S1 + z S2 + ... + z^4 S5), cos r = 1 +
#: z (C1 + z C2 + ... + z^4 C5), z = r^2; relative errors 2^-47.4 and 2^-43.6.
S1, S2, S3, S4, S5 = (-0.1666666666662993, 0.00833333332499818, -0.00019841263684465828, 2.7555330133928292e-06,
                      -2.4759754698868524e-08)
C1, C2, C3, C4, C5 = (-0.49999999999482764, 0.0416666665522539, -0.0013888880595787224, 2.4798947257634943e-05,
                      -2.717381383767921e-07)
_ROUND = 6755399441055744.0  # 1.5 * 2^52: adding and subtracting it rounds to an integer


def _wide_vectors() -> bool:
    """Whether numba compiles for AVX-512 (32 vector registers): the register tile's
    rows follow (the bits do not: the tile only chooses which independent sums run
    together)."""
    from numba.core import config

    feats = config.CPU_FEATURES
    if feats is None:
        from llvmlite import binding

        try:
            return bool(binding.get_host_cpu_features().get("avx512f", False))
        except RuntimeError:
            return False
    return "+avx512f" in feats.split(",")


ATOMS = 16  # atoms of one vector (<16 x float>: 2 AVX2 or 1 AVX-512 register)
TILE = 2 * ATOMS  # atoms of one register tile and of one packed tile of frequencies
ROWS = 8 if _wide_vectors() else 3  # rows of one register tile: 16 AVX-512 or 12 AVX2 accumulators
ROW_BLOCK = 384  # rows sharing one pass over a cache block of frequencies (at most)
PART_VALUES = ROW_BLOCK * 768  # float32 angles of one row block (1.2 MB): fewer rows where a block has more atoms
SPLIT_ROWS = 128  # fewer rows a thread: phases_out shares a chunk out by blocks of atoms (out_parts)
OMEGA_BLOCK = 196608  # float32 frequency values per cache block (768 KiB: L2)
SUM_BLOCK = 256  # terms of a sum per pass
ROW_GROUPS = 8  # groups of LANES rows whose angles _phase_columns computes per pass over the packed tiles
GROUP_ANGLES = 1 << 19  # ... as long as their float32 angles stay within 2 MiB a thread
SPARSE_RATIO = 8  # at most 1 in 8 values nonzero: sums over the nonzero values only


def _fma_fn(builder, ty):
    suffix = "f32" if not isinstance(ty, ir.VectorType) else f"v{ty.count}f32"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]), f"llvm.fma.{suffix}")


@intrinsic
def fma32(typingctx, a, b, c):
    """``a * b + c`` with one rounding, float32 (``llvm.fma.f32``)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.call(_fma_fn(builder, ir.FloatType()), list(args))

    return sig, codegen


def _matrix(t, dtype):
    return isinstance(t, types.Array) and t.ndim == 2 and t.layout == "C" and t.dtype == dtype


def _ptr(context, builder, aryty, ary, *indices):
    arr = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, arr, list(indices), wraparound=False)


def _angle_codegen(indexed):
    """The code of :func:`angle_tile` (``indexed`` False: arguments ``x, r0, nr, col0, w,
    tile, c0, dst, init``) and of :func:`angle_tile_at` (True: ``x, r0, nr, cols, col0, w,
    tile, c0, dst, init``, term c of a row read at ``x[row, cols[col0 + c]]``)."""
    shift = 1 if indexed else 0
    nvec = TILE // ATOMS

    def codegen(context, builder, signature, args):
        t = signature.args
        intp = types.intp

        def ix(i):
            return context.cast(builder, args[i], t[i], intp)

        def const(v):
            return context.get_constant(intp, v)

        vt = ir.VectorType(ir.FloatType(), ATOMS)
        fma = _fma_fn(builder, vt)
        i32 = ir.IntType(32)
        last = builder.sub(ix(2), const(1))
        om_base = builder.bitcast(_ptr(context, builder, t[5 + shift], args[5 + shift], ix(6 + shift), const(0)),
                                  vt.as_pointer())
        xrows = []
        for i in range(ROWS):
            ci = const(i)
            off = builder.select(builder.icmp_signed("<", ci, last), ci, last)
            first_col = const(0) if indexed else ix(3)
            xrows.append(_ptr(context, builder, t[0], args[0], builder.add(ix(1), off), first_col))
        if indexed:
            col_ptr = _ptr(context, builder, t[3], args[3], ix(4))
        first = context.cast(builder, args[8 + shift], t[8 + shift], types.boolean)
        zero = ir.Constant(vt, [0.0] * ATOMS)
        dbase = builder.bitcast(_ptr(context, builder, t[7 + shift], args[7 + shift], const(0), const(0)),
                                vt.as_pointer())
        dvecs = [builder.gep(dbase, [const(i * nvec + j)]) for i in range(ROWS) for j in range(nvec)]
        accs = [cgutils.alloca_once_value(builder, builder.select(first, zero, builder.load(p, align=4)))
                for p in dvecs]
        undef = ir.Constant(vt, ir.Undefined)
        mask = ir.Constant(ir.VectorType(i32, ATOMS), [0] * ATOMS)
        with cgutils.for_range_slice(builder, const(0), ix(4 + shift), const(1), inc=True) as (c, _):
            row = builder.gep(om_base, [builder.mul(c, const(nvec))])
            ovs = [builder.load(builder.gep(row, [const(j)]), align=4) for j in range(nvec)]
            at = c
            if indexed:
                at = context.cast(builder, builder.load(builder.gep(col_ptr, [c])), t[3].dtype, intp)
            for i in range(ROWS):
                xv = builder.load(builder.gep(xrows[i], [at]), align=4)
                xs = builder.shuffle_vector(builder.insert_element(undef, xv, ir.Constant(i32, 0)), undef, mask)
                for j in range(nvec):
                    acc = accs[i * nvec + j]
                    builder.store(builder.call(fma, [xs, ovs[j], builder.load(acc)]), acc)
        for p, acc in zip(dvecs, accs):
            builder.store(builder.load(acc), p, align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def angle_tile(typingctx, x, r0, nr, col0, w, tile, c0, dst, init):
    """``dst[i, t] = fma-sum over c < w of x[r0 + min(i, nr - 1), col0 + c] * tile[c0 + c, t]``
    for i < ROWS, t < TILE, continued from ``dst`` (or from +0.0 when ``init``), in
    the order c = 0, 1, ...: one register tile (ROWS x 2 vectors of ATOMS).  ``x``,
    ``tile`` (a packed tile: ``(w, TILE)``), ``dst`` (``(ROWS, TILE)``) float32
    C-ordered; rows past ``nr`` repeat the last row (computed, ignored by the caller).
    The tile's frequencies of one term are 128 contiguous bytes, the next term's right
    after them."""
    f32 = types.float32
    if not (_matrix(x, f32) and _matrix(tile, f32) and _matrix(dst, f32)):
        return None
    return types.void(x, r0, nr, col0, w, tile, c0, dst, init), _angle_codegen(False)


@intrinsic
def angle_tile_at(typingctx, x, r0, nr, cols, col0, w, tile, c0, dst, init):
    """:func:`angle_tile` with each row's terms read through ``cols`` (int64 1-D): term c of
    row ``r`` is ``x[r, cols[col0 + c]]`` (the caller keeps ``cols[col0:col0 + w]`` within
    ``x``'s columns), so a patch's values are read where they sit in the input row, not
    gathered first.  The same fma chain, so the same bits."""
    f32 = types.float32
    if not (_matrix(x, f32) and _matrix(tile, f32) and _matrix(dst, f32) and isinstance(cols, types.Array)
            and cols.ndim == 1 and isinstance(cols.dtype, types.Integer)):
        return None
    return types.void(x, r0, nr, cols, col0, w, tile, c0, dst, init), _angle_codegen(True)


SINCOS_LANES = 8  # angles of one sincos_lanes call (<8 x double>: 1 AVX-512 or 2 AVX2 registers)


assert TILE % SINCOS_LANES == 0  # a tile's rows are whole calls of sincos_lanes / value_lanes


def _splat(ty, v):
    return ir.Constant(ty, [v] * ty.count)


def _element_bytes(t) -> int:
    return 8 if isinstance(t, ir.DoubleType) else 4 if isinstance(t, ir.FloatType) else t.width // 8


def _lanes_in(context, builder, aryty, ary, at, vt):
    """``ary[at:at + vt.count]`` as one vector: a vector load from a C-ordered array, lane
    by lane otherwise (a strided view)."""
    intp = types.intp
    if aryty.layout == "C":
        return builder.load(builder.bitcast(_ptr(context, builder, aryty, ary, at), vt.as_pointer()),
                            align=_element_bytes(vt.element))
    v = ir.Constant(vt, ir.Undefined)
    for lane in range(vt.count):
        p = _ptr(context, builder, aryty, ary, builder.add(at, context.get_constant(intp, lane)))
        v = builder.insert_element(v, builder.load(p), ir.Constant(ir.IntType(32), lane))
    return v


def _lanes_out(context, builder, aryty, ary, at, v):
    intp = types.intp
    vt = v.type
    if aryty.layout == "C":
        builder.store(v, builder.bitcast(_ptr(context, builder, aryty, ary, at), vt.as_pointer()),
                      align=_element_bytes(vt.element))
        return
    for lane in range(vt.count):
        p = _ptr(context, builder, aryty, ary, builder.add(at, context.get_constant(intp, lane)))
        builder.store(builder.extract_element(v, ir.Constant(ir.IntType(32), lane)), p)


def _reduced_lanes(context, builder, th_t, theta, at):
    """sincos_into's loop up to its polynomials, for SINCOS_LANES angles ``theta[at:]``
    at once: ``(fast, r, z, q)``, the lanes within the fast range (<n x i1>), the reduced
    angles, their squares (<n x double>) and quadrants (<n x i32>; a lane beyond the fast
    range, inf or NaN is reduced as 0.0).  The same IEEE operations in the same order in
    every lane, with no fast-math flag (so no fused multiply-add): each lane has the
    scalar loop's bits."""
    n = SINCOS_LANES
    vd = ir.VectorType(ir.DoubleType(), n)
    x = builder.fpext(_lanes_in(context, builder, th_t, theta, at, ir.VectorType(ir.FloatType(), n)), vd)
    x = builder.fadd(x, _splat(vd, 0.0))  # the sign of a zero angle dropped
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vd, [vd]), f"llvm.fabs.v{n}f64")
    fast = builder.fcmp_ordered("<=", builder.call(fabs, [x]), _splat(vd, FAST_LIMIT))  # false for NaN
    x = builder.select(fast, x, _splat(vd, 0.0))
    fn = builder.fsub(builder.fadd(builder.fmul(x, _splat(vd, INV_PIO2)), _splat(vd, _ROUND)), _splat(vd, _ROUND))
    r = builder.fsub(builder.fsub(builder.fsub(x, builder.fmul(fn, _splat(vd, P1))), builder.fmul(fn, _splat(vd, P2))),
                     builder.fmul(fn, _splat(vd, P3)))
    q = builder.fptosi(fn, ir.VectorType(ir.IntType(32), n))
    return fast, r, builder.fmul(r, r), q


def _horner(builder, z, coeffs):
    """``c0 + z (c1 + z (... + z c_last))`` in _kernels' order; each coefficient a vector
    (lane by lane: sin's or cos's)."""
    acc = builder.fmul(z, coeffs[-1])
    for c in reversed(coeffs[1:-1]):
        acc = builder.fmul(z, builder.fadd(c, acc))
    return builder.fadd(coeffs[0], acc)


def _slow_count(builder, fast):
    n = SINCOS_LANES
    i = ir.IntType(n)
    ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i, [i]), f"llvm.ctpop.i{n}")
    return builder.zext(builder.call(ctpop, [builder.bitcast(builder.not_(fast), i)]), ir.IntType(64))


def _lane_bits(builder, q, bit):
    vi = q.type
    return builder.icmp_signed("!=", builder.and_(q, _splat(vi, bit)), _splat(vi, 0))


def _sincos_lanes_codegen(context, builder, signature, args):
    th_t, at_t, re_t, im_t = signature.args
    theta, at, re, im = args
    at = context.cast(builder, at, at_t, types.intp)
    fast, r, z, q = _reduced_lanes(context, builder, th_t, theta, at)
    vd = r.type
    s = builder.fadd(r, builder.fmul(builder.fmul(r, z), _horner(builder, z, [_splat(vd, c) for c in (S1, S2, S3, S4, S5)])))
    c = builder.fadd(_splat(vd, 1.0), builder.fmul(z, _horner(builder, z, [_splat(vd, c) for c in (C1, C2, C3, C4, C5)])))
    odd = _lane_bits(builder, q, 1)  # _quadrant's steps
    ss = builder.select(odd, c, s)
    cc = builder.select(odd, builder.fneg(s), c)
    flip = _lane_bits(builder, q, 2)
    _lanes_out(context, builder, re_t, re, at, builder.select(flip, builder.fneg(cc), cc))
    _lanes_out(context, builder, im_t, im, at, builder.select(flip, builder.fneg(ss), ss))
    return _slow_count(builder, fast)


def _value_lanes_codegen(context, builder, signature, args, out_at=None):
    # One polynomial a lane: sin's where the wanted value (sin or cos of the angle) is
    # +-sin r, cos's where it is +-cos r, by the quadrant; with B = z the cos form
    # 1.0 + z P(z) is A + B P(z) (z * 1.0 is z), the sin form r + (r z) P(z).  So each
    # lane computes exactly the operations that give _kernels' value it uses.
    th_t, at_t, sc_t, sin_t, k_t, out_t = signature.args[:6]
    theta, at, sc, want_sin, k, out = args[:6]
    at = context.cast(builder, at, at_t, types.intp)
    k = context.cast(builder, k, k_t, types.intp)
    n = SINCOS_LANES
    fast, r, z, q = _reduced_lanes(context, builder, th_t, theta, at)
    vd = r.type
    sin_bytes = _lanes_in(context, builder, sin_t, want_sin, k, ir.VectorType(ir.IntType(8), n))
    wants_sin = builder.icmp_unsigned("!=", sin_bytes, _splat(sin_bytes.type, 0))
    odd = _lane_bits(builder, q, 1)
    use_sin = builder.xor(wants_sin, odd)
    coeffs = [builder.select(use_sin, _splat(vd, a), _splat(vd, b)) for a, b in zip((S1, S2, S3, S4, S5),
                                                                                   (C1, C2, C3, C4, C5))]
    a = builder.select(use_sin, r, _splat(vd, 1.0))
    b = builder.select(use_sin, builder.fmul(r, z), z)
    v = builder.fadd(a, builder.fmul(b, _horner(builder, z, coeffs)))
    # _quadrant: sin is -(.) where q & 2; cos is -(.) where (q & 1) xor (q & 2)
    neg = builder.xor(_lane_bits(builder, q, 2), builder.and_(builder.not_(wants_sin), odd))
    v = builder.select(neg, builder.fneg(v), v)
    v = builder.fmul(_lanes_in(context, builder, sc_t, sc, k, vd), v)
    if out_t.dtype == types.float32:
        v = builder.fptrunc(v, ir.VectorType(ir.FloatType(), n))
    if out_at is None:
        _lanes_out(context, builder, out_t, out, at, v)
    else:  # out[row, col:col + n] of a C-ordered matrix
        row, col = (context.cast(builder, args[i], signature.args[i], types.intp) for i in out_at)
        p = _ptr(context, builder, out_t, out, row, col)
        builder.store(v, builder.bitcast(p, v.type.as_pointer()), align=_element_bytes(v.type.element))
    return _slow_count(builder, fast)


def _value_lanes_at_codegen(context, builder, signature, args):
    return _value_lanes_codegen(context, builder, signature, args, out_at=(6, 7))


@intrinsic
def sincos_lanes(typingctx, theta, at, re, im):
    """``re[at + l] = cos(theta[at + l])``, ``im[at + l] = sin(...)`` for l <
    :data:`SINCOS_LANES`, as :func:`sincos_into`'s loop computes each (a zero, an angle
    beyond the fast range, inf or NaN gives 0.0's values there); returns how many of the
    angles are beyond the fast range (int64), for :func:`redo_slow`.  ``theta`` float32,
    ``re``, ``im`` float64, 1-D; the caller keeps ``at + SINCOS_LANES`` within all three."""
    one_d = all(isinstance(a, types.Array) and a.ndim == 1 for a in (theta, re, im))
    if not (one_d and theta.dtype == types.float32 and re.dtype == im.dtype == types.float64
            and isinstance(at, types.Integer)):
        return None
    return types.int64(theta, at, re, im), _sincos_lanes_codegen


@intrinsic
def value_lanes(typingctx, theta, at, sc, want_sin, k, out):
    """``out[at + l] = sc[k + l] * (sin if want_sin[k + l] else cos)(theta[at + l])`` for l
    < :data:`SINCOS_LANES`, the float64 product cast to ``out``'s dtype: the bits of
    :func:`sincos_into` followed by :func:`_store_tile`'s product, computing only the
    polynomial the value needs.  Returns how many angles are beyond the fast range (their
    values are then not the right ones: the caller redoes the tile through
    :func:`sincos_into`).  ``theta`` float32, ``sc`` float64, ``want_sin`` bool, ``out``
    float32 or float64, 1-D; the caller keeps every index within."""
    one_d = all(isinstance(a, types.Array) and a.ndim == 1 for a in (theta, sc, want_sin, out))
    if not (one_d and theta.dtype == types.float32 and sc.dtype == types.float64 and want_sin.dtype == types.boolean
            and out.dtype in (types.float32, types.float64) and isinstance(at, types.Integer)
            and isinstance(k, types.Integer)):
        return None
    return types.int64(theta, at, sc, want_sin, k, out), _value_lanes_codegen


@intrinsic
def value_lanes_at(typingctx, theta, at, sc, want_sin, k, out, row, col):
    """:func:`value_lanes` storing into ``out[row, col:col + SINCOS_LANES]`` of a C-ordered
    float32 or float64 matrix (the caller keeps them within ``out``)."""
    one_d = all(isinstance(a, types.Array) and a.ndim == 1 for a in (theta, sc, want_sin))
    if not (one_d and _matrix(out, out.dtype if isinstance(out, types.Array) else None)
            and theta.dtype == types.float32 and sc.dtype == types.float64 and want_sin.dtype == types.boolean
            and out.dtype in (types.float32, types.float64)
            and all(isinstance(i, types.Integer) for i in (at, k, row, col))):
        return None
    return types.int64(theta, at, sc, want_sin, k, out, row, col), _value_lanes_at_codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _kernels(r):  # pragma: no cover - compiled
    z = r * r
    s = r + (r * z) * (S1 + z * (S2 + z * (S3 + z * (S4 + z * S5))))
    c = 1.0 + z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * C5))))
    return s, c


@numba.njit(cache=True, nogil=True, inline="always")
def _reduce(x):  # pragma: no cover - compiled
    """(r, n) with x = n pi/2 + r, |r| <= pi/4 (+ a little), for float64 x holding a
    float32 value, |x| <= FAST_LIMIT."""
    fn = (x * INV_PIO2 + _ROUND) - _ROUND
    r = ((x - fn * P1) - fn * P2) - fn * P3
    return r, fn


@numba.njit(cache=True, nogil=True, boundscheck=False)
def sincos_into(theta, n, re, im):  # pragma: no cover - compiled
    """``re[i] = cos(theta[i])``, ``im[i] = sin(theta[i])`` for i < n: ``theta`` float32,
    ``re, im`` float64 1-D arrays.  The sign of a zero angle is dropped (+0.0).
    Branch-free over the fast range, :data:`SINCOS_LANES` angles at a time in explicit
    vectors (:func:`sincos_lanes`: the loop vectoriser chose 256-bit vectors, half of an
    AVX-512 register); angles beyond it, inf and NaN are then redone one by one by
    :func:`rfsgen._sincos.slow_sincos`.  ``n`` is clamped to 0 .. the arrays' sizes."""
    n = max(0, min(n, theta.size, re.size, im.size))
    slow = 0
    v = n - n % SINCOS_LANES
    for i in range(0, v, SINCOS_LANES):
        slow += sincos_lanes(theta, i, re, im)
    for i in range(v, n):
        x = np.float64(theta[i]) + 0.0
        big = not (abs(x) <= FAST_LIMIT)
        slow += big
        if big:
            x = 0.0
        r, fn = _reduce(x)
        q = np.int32(fn)
        s, c = _kernels(r)
        ss, cc = _quadrant(q, s, c)
        re[i] = cc
        im[i] = ss
    if slow:
        redo_slow(theta, n, re, im)


@numba.njit(cache=True, nogil=True)
def sincos(t):  # pragma: no cover - compiled
    """(sin t, cos t) of one float32 angle: the bits of :func:`sincos_into`."""
    th = np.empty(1, np.float32)
    th[0] = t
    re = np.empty(1)
    im = np.empty(1)
    sincos_into(th, 1, re, im)
    return im[0], re[0]


# ----------------------------------------------------------------------------- angles
def atom_block(w: int) -> int:
    """Atoms per block (a multiple of TILE): their frequencies, min(w, SUM_BLOCK)
    values each, fill about one cache block of OMEGA_BLOCK float32 values."""
    return max(TILE, OMEGA_BLOCK // max(min(w, SUM_BLOCK), 1) // TILE * TILE)


def tile_count(blk_start, blk_end):
    """Packed tiles of the blocks (TILE atoms each, the last of a block padded with zeros)."""
    return int((-(-(blk_end - blk_start) // TILE)).sum())


def pack_panels(omega, order, scale, blk_start, blk_end):
    """The float32 scaled frequencies, packed tile by tile as sgemm packs its panels:
    block b owns tiles ``tile0[b]:tile0[b + 1]``, tile j of it holds TILE sorted atoms
    from ``k = blk_start[b] + TILE (j - tile0[b])``, and ``tiles[j, c, t] =
    float32(omega[order[k + t], c] * scale)`` (one float64 multiply, one rounding; zeros
    past the block's end), so a tile's TILE frequencies of one input column are 128
    contiguous bytes and its ``w`` columns follow one another.  Returns ``tile0``,
    ``tiles`` (float32 ``(n_tiles, w, TILE)``), ``loc`` (int64 ``(a,)``: sorted atom k
    sits at ``tiles[loc[k] // TILE, :, loc[k] % TILE]``) and the largest L1 norm of a
    float32 row (inf if a value is)."""
    n_tiles = -(-(blk_end - blk_start) // TILE)
    tile0 = np.zeros(blk_start.size + 1, np.int64)
    np.cumsum(n_tiles, out=tile0[1:])
    tiles = np.zeros((int(tile0[-1]), omega.shape[1], TILE), np.float32)
    loc = np.zeros(order.size, np.int64)
    l1 = _pack(omega, order, float(scale), blk_start, blk_end, tile0, tiles, loc)
    return tile0, tiles, loc, l1


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pack(omega, order, scale, blk_start, blk_end, tile0, tiles, loc):  # pragma: no cover - compiled
    w = omega.shape[1]
    l1 = 0.0
    for b in range(blk_start.size):
        for k in range(blk_start[b], blk_end[b]):
            j = tile0[b] + (k - blk_start[b]) // TILE
            t = (k - blk_start[b]) % TILE
            loc[k] = j * TILE + t
            row = omega[order[k]]
            s = 0.0
            for c in range(w):
                v = np.float32(row[c] * scale)
                tiles[j, c, t] = v
                s += abs(np.float64(v))
            l1 = max(l1, s) if s == s else math.inf
    return l1


def unpack_panels(tiles, loc):
    """The packed frequencies as a float32 ``(w, a)`` matrix, column k the sorted atom k
    (the GPU's layout)."""
    flat = tiles.transpose(1, 0, 2).reshape(tiles.shape[1], -1)
    return np.ascontiguousarray(flat[:, loc])


def phases(x2, w, blk_start, blk_end, blk_node, tile0, tiles, re, im, finite=False, sparse=None,
           csr=None) -> None:
    """cos and sin of the float32 angles ``theta[r, k] = fma-sum over c of x2[r, node(k) w + c]
    * omt[c, k]`` into float64 ``re, im`` ``(m, a)`` (atoms sorted by node in blocks
    ``blk_start[b]:blk_end[b]`` of node ``blk_node[b]``; ``tile0, tiles`` the frequencies
    ``omt`` packed by :func:`pack_panels`).  ``x2`` float32 ``(m, G w)`` C order.

    One node (G = 1) over rows with fewer than 1 in SPARSE_RATIO values nonzero, when
    ``finite`` (no infinite frequency), sums over the nonzero values only: a zero term
    changes only the sign of a zero sum, which is dropped, so the bits are the same.
    ``sparse`` forces either way (tests).  ``csr``, if given, returns the frequencies of
    :func:`pack_csr_tiles` (made on first use): such rows then go through
    :func:`phases_csr`, the loop of CSR rows (the same sums in the same order)."""
    from ._compiled import _rows_for, on_rows

    m = x2.shape[0]
    g = x2.shape[1] // max(w, 1)
    if sparse is None:
        sparse = g == 1 and finite and m * w > 0 and np.count_nonzero(x2) * SPARSE_RATIO < m * w
    if sparse:
        rows, cols = np.nonzero(x2)
        ptr = np.zeros(m + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=m), out=ptr[1:])
        vals = x2[rows, cols]
        if csr is not None:
            phases_csr(ptr, cols.astype(np.int64), vals, w, *csr(), re, im)
            return
        on_rows(_phases_sparse, m, ptr, cols.astype(np.int64), vals, blk_start, blk_end, tile0, tiles, re, im,
                min_rows=_rows_for(max(1, int(ptr[-1]) // max(m, 1)) * re.shape[1]))
        return
    on_rows(_phases, m, x2, w, blk_start, blk_end, blk_node, tile0, tiles, re, im, align=ROWS, min_rows=ROWS)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _phases_sparse(ptr, cols, vals, blk_start, blk_end, tile0, tiles, re, im, start, stop):  # pragma: no cover
    # One node: each atom's sum over the row's nonzero values in ascending column order,
    # a packed tile's TILE sums at once in registers (csr_tile_packed: its frequencies of
    # one column are TILE contiguous values).
    a = re.shape[1]
    acc = np.empty(tiles.shape[0] * TILE, np.float32)
    th = np.empty(a, np.float32)
    cb = np.empty(a)
    sb = np.empty(a)
    for r in range(start, stop):
        for j in range(tiles.shape[0]):
            csr_tile_packed(cols, vals, ptr[r], ptr[r + 1], 0, tiles[j], 0, acc, j * TILE, True)
        for b in range(blk_start.size):
            for k in range(blk_start[b], blk_end[b]):
                th[k] = acc[tile0[b] * TILE + k - blk_start[b]]
        sincos_into(th, a, cb, sb)
        for k in range(a):
            re[r, k] = cb[k]
            im[r, k] = sb[k]


@numba.njit(cache=True, nogil=True, inline="always")
def _row_block(most):  # pragma: no cover - compiled
    """Rows of one pass over a cache block of ``most`` packed tiles: ROW_BLOCK, fewer (down
    to ROWS) where the block's angles would pass PART_VALUES (narrow nodes: a block of width-1
    atoms holds 196,608 of them, 302 MB of angles at 384 rows a thread)."""
    return max(ROWS, min(ROW_BLOCK, PART_VALUES // max(most * TILE, 1)) // ROWS * ROWS)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _block_angles(x2, w, kc, blk_node, tile0, tiles, part, b0, b1, q0, q1):  # pragma: no cover - compiled
    # The angles of rows q0:q1 against the atoms of blocks b0:b1 into part[(r - q0) // ROWS,
    # tile - tile0[b0]]: one packed tile at a time (in L1 while the row block's register tiles
    # use it), the sums in runs of kc terms, each continued exactly from its float32 partial sum.
    for c0 in range(0, w, kc):
        nc = min(kc, w - c0)
        for b in range(b0, b1):
            col0 = blk_node[b] * w + c0
            for j in range(tile0[b], tile0[b + 1]):
                for r0 in range(q0, q1, ROWS):
                    dst = part[(r0 - q0) // ROWS, j - tile0[b0]]
                    angle_tile(x2, r0, min(ROWS, q1 - r0), col0, nc, tiles[j], c0, dst, c0 == 0)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _phases(x2, w, blk_start, blk_end, blk_node, tile0, tiles, re, im, start, stop):  # pragma: no cover - compiled
    # Blocks of _row_block rows x a cache block of atoms (OMEGA_BLOCK frequencies of a run
    # of SUM_BLOCK terms: in L2); inside, one packed tile (its run's frequencies contiguous,
    # 32 KiB: it stays in L1) against each register tile of ROWS rows in turn, so the
    # frequencies come from L2 once per row block, not once per register tile: 1.5-1.7x on
    # the angles at d = 3072 (docs/performance.md).  The sums run in runs of kc terms, each
    # continued exactly from its float32 partial sum, so no order of the loops changes a bit.
    nb = blk_start.size
    kc = min(w, SUM_BLOCK)
    per_block = max(TILE, OMEGA_BLOCK // max(kc, 1))
    most = 1
    b0 = 0
    while b0 < nb:
        b1 = b0 + 1
        while b1 < nb and blk_end[b1] - blk_start[b0] <= per_block:
            b1 += 1
        most = max(most, tile0[b1] - tile0[b0])
        b0 = b1
    rb = _row_block(most)
    part = np.empty((rb // ROWS, most, ROWS, TILE), np.float32)
    cb = np.empty(ROWS * TILE)
    sb = np.empty(ROWS * TILE)
    packed = np.empty(ROWS * TILE, np.float32)  # a partial tile's angles, its atoms only
    for q0 in range(start, stop, rb):
        q1 = min(stop, q0 + rb)
        b0 = 0
        while b0 < nb:
            b1 = b0 + 1
            while b1 < nb and blk_end[b1] - blk_start[b0] <= per_block:
                b1 += 1
            _block_angles(x2, w, kc, blk_node, tile0, tiles, part, b0, b1, q0, q1)
            for r0 in range(q0, q1, ROWS):
                nr = min(ROWS, q1 - r0)
                ri = (r0 - q0) // ROWS
                for b in range(b0, b1):
                    k0 = blk_start[b]
                    k1 = blk_end[b]
                    for j in range(tile0[b], tile0[b + 1]):
                        k = k0 + TILE * (j - tile0[b])
                        kn = min(TILE, k1 - k)
                        pt = part[ri, j - tile0[b0]]
                        if kn < TILE:  # a block's last tile: cos and sin of its atoms only (elementwise: the same bits)
                            for i in range(nr):
                                for t in range(kn):
                                    packed[i * kn + t] = pt[i, t]
                            sincos_into(packed, nr * kn, cb, sb)
                            for i in range(nr):
                                for t in range(kn):
                                    re[r0 + i, k + t] = cb[i * kn + t]
                                    im[r0 + i, k + t] = sb[i * kn + t]
                            continue
                        sincos_into(pt.reshape(ROWS * TILE), nr * TILE, cb, sb)
                        for i in range(nr):
                            for t in range(kn):
                                re[r0 + i, k + t] = cb[i * TILE + t]
                                im[r0 + i, k + t] = sb[i * TILE + t]
            b0 = b1


def phases_out(x2, w, blk_start, blk_end, blk_node, tile0, tiles, col, sc, imag, out, col2=None, sc2=None,
               imag2=None) -> None:
    """:func:`phases`' dense loop, its values written straight into output columns: atom
    k (in the blocks' sorted order) is output column ``col[k]`` of ``out`` (float32 or
    float64 ``(m, D)`` C order), ``out[r, col[k]] = sc[k] * (sin if imag[k] else cos)``
    of the angle, the float64 multiply then the cast to ``out``'s dtype: the product
    loop's bits for a column of one factor (rfsgen._vector.product with no further
    factor: ``sc * Re`` or ``sc * Im`` of ``1.0 * cos + i 1.0 * sin``), without the
    float64 values in between.  ``col`` int64, each below ``out.shape[1]`` (-1: no
    column), the columns of ``col`` and ``col2`` all distinct (ValueError otherwise: two
    values in one cell would land in an order that depends on the threads); ``sc``
    float64, ``imag`` bool, ``(a,)`` each.  The caller makes sure no angle can overflow
    (rfsgen.bases.fused_values); angles beyond the fast range are redone by
    :func:`sincos_into` as in :func:`phases`.  ``col2``, ``sc2``, ``imag2`` (optional,
    ``(a,)`` each): a second column of the same atom, written the same way (the [cos, sin]
    pairs of ``--scheme orf``: one angle, both columns); -1 where an atom has one column."""

    a = col.size
    if col2 is None:
        col2, sc2, imag2 = np.full(a, -1, np.int64), np.zeros(a), np.zeros(a, np.bool_)
    if not (sc.size == imag.size == col2.size == sc2.size == imag2.size == a and col.dtype == col2.dtype == np.int64):
        raise ValueError("phases_out: col, sc, imag, col2, sc2 and imag2 must hold one entry per atom (col int64)")
    if not (x2.ndim == 2 and x2.dtype == np.float32 and x2.flags.c_contiguous and out.ndim == 2
            and out.shape[0] >= x2.shape[0] and out.flags.c_contiguous):
        raise ValueError("phases_out: x2 C-ordered float32 (m, G w), out C-ordered with at least m rows")
    _check_blocks(w, blk_start, blk_end, blk_node, tile0, tiles, a, x2.shape[1])
    if not _distinct_columns(col, col2, out.shape[1]):
        raise ValueError("phases_out: col and col2 must be distinct columns of out (or -1: none)")
    from . import _compiled

    parts = out_parts(x2.shape[0], blk_start.size, _compiled.threads())
    _compiled.run_parts(_phases_out_part, list(range(parts.shape[0] + 1)), x2, w, blk_start, blk_end, blk_node, tile0,
                        tiles, col, sc, imag, out, col2, sc2, imag2, parts)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _distinct_columns(col, col2, d):  # pragma: no cover - compiled
    """Whether every entry of ``col`` and ``col2`` is -1 (none) or a column below ``d`` that no
    other entry names: one pass and a byte a column (a few hundred microseconds at D = 2e5,
    where numpy's bincount took 2.4 ms of a 5 ms chunk)."""
    seen = np.zeros(d, np.uint8)
    for arr in (col, col2):
        for i in range(arr.size):
            c = arr[i]
            if c == -1:
                continue
            if c < 0 or c >= d or seen[c]:
                return False
            seen[c] = 1
    return True


def out_parts(m: int, nb: int, n: int) -> np.ndarray:
    """How :func:`phases_out` shares ``m`` rows and ``nb`` blocks of atoms among ``n``
    threads: int64 ``(P, 4)``, part p the rows ``[p, 2]:[p, 3]`` of blocks ``[p, 0]:[p, 1]``.
    By rows where each thread gets at least :data:`SPLIT_ROWS` rows; else by blocks first,
    then the rows among the threads left over: each thread then reads only its blocks'
    frequencies, reused over all the chunk's rows, where cut by rows every thread would
    read all of them for its few rows (d = 3072, D = 16384: 200 MB of packed frequencies
    for each 63 rows of a 126-row chunk on 2 threads).  Row cuts fall on multiples of
    :data:`ROWS`.  The parts cover rows x blocks exactly once, and each value is the sum
    of its own row and atom, so the bytes do not depend on the parts."""
    n = max(1, n)
    kb = 1 if m >= n * SPLIT_ROWS or nb < 2 else min(nb, n)
    kr = max(1, min(n // kb, m // ROWS))
    rows = [0] + [(m * i // kr) // ROWS * ROWS for i in range(1, kr)] + [m]
    blocks = [nb * i // kb for i in range(kb + 1)]
    return np.array([(blocks[i], blocks[i + 1], rows[j], rows[j + 1]) for i in range(kb) for j in range(kr)
                     if blocks[i] < blocks[i + 1] and rows[j] < rows[j + 1]], np.int64).reshape(-1, 4)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _phases_out_part(x2, w, blk_start, blk_end, blk_node, tile0, tiles, col, sc, imag, out, col2, sc2, imag2, parts,
                     p0, p1):  # pragma: no cover - compiled
    for p in range(p0, p1):  # (clamped: the parts are out_parts', always within)
        b_lo = max(parts[p, 0], 0)
        b_hi = min(parts[p, 1], blk_start.size)
        start = max(parts[p, 2], 0)
        stop = min(parts[p, 3], x2.shape[0])
        if b_lo < b_hi and start < stop:
            _phases_out(x2, w, blk_start, blk_end, blk_node, tile0, tiles, col, sc, imag, out, col2, sc2, imag2,
                        b_lo, b_hi, start, stop)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _phases_out(x2, w, blk_start, blk_end, blk_node, tile0, tiles, col, sc, imag, out, col2, sc2, imag2, b_lo, b_hi,
                start, stop):  # pragma: no cover
    # _phases' loops and sums over blocks b_lo:b_hi, the same tiles in the same order; only
    # the store differs.
    nb = b_hi
    d = out.shape[1]
    kc = min(w, SUM_BLOCK)
    per_block = max(TILE, OMEGA_BLOCK // max(kc, 1))
    most = 1
    b0 = b_lo
    while b0 < nb:
        b1 = b0 + 1
        while b1 < nb and blk_end[b1] - blk_start[b0] <= per_block:
            b1 += 1
        most = max(most, tile0[b1] - tile0[b0])
        b0 = b1
    rb = _row_block(most)
    part = np.empty((rb // ROWS, most, ROWS, TILE), np.float32)
    cb = np.empty(ROWS * TILE)
    sb = np.empty(ROWS * TILE)
    vb = np.empty(ROWS * TILE, out.dtype)
    tsc = np.zeros(TILE)
    tim = np.zeros(TILE, np.bool_)
    for q0 in range(start, stop, rb):
        q1 = min(stop, q0 + rb)
        b0 = b_lo
        while b0 < nb:
            b1 = b0 + 1
            while b1 < nb and blk_end[b1] - blk_start[b0] <= per_block:
                b1 += 1
            _block_angles(x2, w, kc, blk_node, tile0, tiles, part, b0, b1, q0, q1)
            for r0 in range(q0, q1, ROWS):
                nr = min(ROWS, q1 - r0)
                ri = (r0 - q0) // ROWS
                for b in range(b0, b1):
                    k0 = blk_start[b]
                    k1 = blk_end[b]
                    for j in range(tile0[b], tile0[b + 1]):
                        k = k0 + TILE * (j - tile0[b])
                        ang = part[ri, j - tile0[b0]].reshape(ROWS * TILE)
                        kn = min(TILE, k1 - k)
                        _store_tile(out, r0, nr, col, sc, imag, k, kn, ang, cb, sb, vb, tsc, tim)
                        if _any_second(col2, k, kn):
                            _store_tile(out, r0, nr, col2, sc2, imag2, k, kn, ang, cb, sb, vb, tsc, tim)
            b0 = b1


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _any_second(col2, k, kn):  # pragma: no cover - compiled
    for t in range(kn):
        if col2[k + t] >= 0:
            return True
    return False


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _store_tile(out, r0, nr, col, sc, imag, k, kn, ang, cb, sb, vb, tsc, tim):  # pragma: no cover - compiled
    # out[r0 + i, col[k + t]] = sc[k + t] * (sin if imag[k + t] else cos) of the angle
    # ang[i * TILE + t], i < nr, t < kn; col -1: no column.  The values are computed
    # branch-free over the whole tile (the atom's own scale and part copied to tsc, tim:
    # zeros past kn), one polynomial a value (value_lanes); a tile with an angle beyond
    # the fast range takes both cos and sin from sincos_into instead, which redoes such
    # angles.  Then rows go out whole where the tile's columns are one run, one by one
    # otherwise.
    d = out.shape[1]
    c0 = col[k]
    run = 0 <= c0 and c0 <= d - kn  # (not c0 + kn: it may wrap)
    for t in range(TILE):
        if t < kn:
            tsc[t] = sc[k + t]
            tim[t] = imag[k + t]
            run = run and col[k + t] == c0 + t
        else:
            tsc[t] = 0.0
            tim[t] = False
    slow = 0
    nr = min(nr, ROWS, out.shape[0] - r0)
    if run and kn == TILE:  # a whole tile into one run of columns: straight into the rows
        for i in range(nr):
            for t in range(0, TILE, SINCOS_LANES):
                slow += value_lanes_at(ang, i * TILE + t, tsc, tim, t, out, r0 + i, c0 + t)
        if not slow:
            return
    else:
        for i in range(nr):
            for t in range(0, TILE, SINCOS_LANES):
                slow += value_lanes(ang, i * TILE + t, tsc, tim, t, vb)
    if slow:
        sincos_into(ang, nr * TILE, cb, sb)
        for i in range(nr):
            for t in range(TILE):
                s = sb[i * TILE + t]
                c = cb[i * TILE + t]
                vb[i * TILE + t] = tsc[t] * (s if tim[t] else c)
    if run:
        for i in range(nr):
            for t in range(kn):
                out[r0 + i, c0 + t] = vb[i * TILE + t]
    else:
        for i in range(nr):
            for t in range(kn):
                c = col[k + t]
                if 0 <= c < d:  # (always but -1: the caller's columns; keeps the stores in bounds)
                    out[r0 + i, c] = vb[i * TILE + t]


def phase_columns(x, cols, w, blk_start, blk_end, blk_node, tile0, tiles, n_atoms, xatom, xpow, fidx, fptr, sc, imag,
                  pos, real, out, groups=None) -> None:
    """:func:`phases` and the product loop (:func:`rfsgen._compiled.columns`) in one pass
    over each tile of rows, so that the atoms' float64 cos and sin (135 KB a row for
    mnist-conv) never reach memory: per tile of rows, each packed tile's angles, their
    cos and sin straight into the product loop's lane rows, then the tile's columns.

    ``x`` float32 ``(m, width)`` C order, the rows; node g's term c is ``x[:, cols[g w +
    c]]`` (``cols`` int64, read in place: :func:`angle_tile_at`); atoms, blocks and packed
    frequencies as for :func:`phases`, in node order, atom k of the blocks being lane row k
    of the product loop with factors ``cr = ci = 1`` (its gather's ``1.0 * cos`` and ``1.0
    * sin`` are the values themselves); ``n_atoms`` their number; ``xatom`` ... ``real``
    and ``out`` as for :func:`rfsgen._compiled.columns`.  The same sums, cos, sin and
    products in the same order, so the bytes of :func:`phases` followed by the product
    loop.  The caller makes sure no angle can overflow, as for :func:`phases_out`
    (rfsgen.bases.gathered_columns); angles beyond the fast range are redone by
    :func:`sincos_into`.  Raises ValueError where ``cols`` or the blocks would read outside
    ``x``, ``cols`` or the lane rows.

    ``groups`` (default: up to ROW_GROUPS, as many as GROUP_ANGLES angles hold) is how many
    tiles of rows share one pass over the packed frequencies; it changes no bit."""
    from ._compiled import check_products, on_rows

    if x.dtype != np.float32 or x.ndim != 2 or not x.flags.c_contiguous or cols.dtype != np.int64 \
            or cols.ndim != 1 or not cols.flags.c_contiguous:
        raise ValueError("x must be C-ordered float32 rows and cols contiguous int64")
    if cols.size and not (0 <= int(cols.min()) and int(cols.max()) < x.shape[1]):
        raise ValueError("cols must point into x's columns")
    _check_blocks(w, blk_start, blk_end, blk_node, tile0, tiles, n_atoms, cols.size)
    check_products(n_atoms, xatom, xpow, fidx, fptr, sc, imag, pos, real, out, x.shape[0])
    if groups is None:
        groups = min(ROW_GROUPS, GROUP_ANGLES // max(n_atoms * LANES, 1))
    groups = max(1, int(groups))
    on_rows(_phase_columns, x.shape[0], x, cols, w, blk_start, blk_end, blk_node, tile0, tiles, n_atoms, xatom, xpow,
            fidx, fptr, sc, imag, pos, real, out, groups, align=LANES, min_rows=LANES)


def _check_blocks(w, blk_start, blk_end, blk_node, tile0, tiles, n_atoms, n_values) -> None:
    """Raise ValueError unless the blocks of atoms (:func:`phases`' arrays) read only atoms
    below ``n_atoms``, node values below ``n_values`` (``w`` a node) and packed tiles that
    exist: each block a non-empty run of atoms in order, its tiles ``tile0[b]:tile0[b + 1]``
    (enough for its atoms) within ``tiles`` (float32 ``(n, >= w, TILE)``, C order)."""
    ints = (blk_start, blk_end, blk_node, tile0)
    ok = (w >= 1 and all(isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype.kind == "i" for a in ints)
          and blk_start.size == blk_end.size == blk_node.size and tile0.size == blk_start.size + 1
          and isinstance(tiles, np.ndarray) and tiles.dtype == np.float32 and tiles.ndim == 3
          and tiles.flags.c_contiguous and tiles.shape[1] >= w and tiles.shape[2] == TILE)
    if ok and blk_start.size:
        need = -(-(blk_end - blk_start) // TILE)
        ok = (int(blk_start.min()) >= 0 and bool(np.all(blk_end > blk_start)) and int(blk_end.max()) <= n_atoms
              and int(blk_node.min()) >= 0 and (int(blk_node.max()) + 1) * w <= n_values
              and int(tile0[0]) >= 0 and bool(np.all(np.diff(tile0) == need)) and int(tile0[-1]) <= tiles.shape[0])
    if not ok:
        raise ValueError("the blocks must read within the atoms, the node values and the packed tiles")


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _phase_columns(x, cols, w, blk_start, blk_end, blk_node, tile0, tiles, n_atoms, xatom, xpow, fidx, fptr, sc, imag,
                   pos, real, out, groups, start, stop):  # pragma: no cover - compiled
    # Per span of ``groups`` tiles of LANES rows: each packed tile of atoms' frequencies
    # (in L1 while it lasts) against every register tile of ROWS rows of the span (the sums
    # continued in runs of kc terms, as in _phases), the angles kept lane-major per tile of
    # rows; then per tile of rows, cos and sin of its atoms into the lane rows and the
    # product loop's columns.  One pass over the packed tiles (MiBs for patch nodes: from L3)
    # serves the whole span, not LANES rows.
    kc = min(w, SUM_BLOCK)
    fr, fi, tile = tile_buffers(n_atoms + xatom.size, out)
    span = groups * LANES
    part = np.empty((-(-span // ROWS), ROWS, TILE), np.float32)
    ang = np.empty((groups, n_atoms * LANES), np.float32)  # each group's angles, lane-major as its lane rows
    frv = fr.reshape(-1)
    fiv = fi.reshape(-1)
    for r0 in range(start, stop, span):
        n = min(span, stop - r0)
        ng = -(-n // LANES)
        for b in range(blk_start.size):
            k0 = blk_start[b]
            for j in range(tile0[b], tile0[b + 1]):
                k = k0 + TILE * (j - tile0[b])
                kn = min(TILE, blk_end[b] - k)
                for q in range(-(-n // ROWS)):  # the packed tile stays in L1 for all the span's rows
                    nr = min(ROWS, n - q * ROWS)
                    for c0 in range(0, w, kc):
                        angle_tile_at(x, r0 + q * ROWS, nr, cols, blk_node[b] * w + c0, min(kc, w - c0), tiles[j], c0,
                                      part[q], c0 == 0)
                for g in range(ng):
                    for t in range(kn):
                        for lane in range(LANES):
                            i = g * LANES + lane
                            ang[g, (k + t) * LANES + lane] = part[i // ROWS, i % ROWS, t] if i < n else 0.0
        for g in range(ng):
            rg = r0 + g * LANES
            nn = min(LANES, stop - rg)
            for b in range(blk_start.size):
                k0 = blk_start[b]
                for j in range(tile0[b], tile0[b + 1]):
                    k = k0 + TILE * (j - tile0[b])
                    kn = min(TILE, blk_end[b] - k)
                    sincos_into(ang[g, k * LANES:], kn * LANES, frv[k * LANES:], fiv[k * LANES:])
                    if nn < LANES:  # the product loop's zero rows past the last
                        for t in range(kn):
                            for i in range(nn, LANES):
                                fr[k + t, i] = 0.0
                                fi[k + t, i] = 0.0
            tile_columns(fr, fi, n_atoms, xatom, xpow, fidx, fptr, sc, imag, pos, real, tile, out, rg, nn)


# ----------------------------------------------------------------------------- angles of CSR rows
def phases_csr(ptr, pos, vals, w, tile_k, tile_node, tiles, re, im) -> None:
    """:func:`phases` of rows given in CSR form, never densified: row ``r`` holds the
    float32 values ``vals[ptr[r]:ptr[r + 1]]`` at positions ``pos`` (int64, sorted and
    unique within the row, each below ``G w``: node ``pos // w``, column ``pos % w``),
    every other value zero; the frequencies as :func:`pack_csr_tiles` packs them.  The
    angle of atom k (node n) is the fma sum over the row's stored values at node n in
    ascending column order, from +0.0: the dense loop's order with its zero terms left
    out.  A term ``0 * pan[c, k]`` (pan finite) changes only the sign of a zero partial
    sum, and the sign of a zero sum is dropped, so the bits are the dense loop's (the
    caller checks that ``pan`` is finite).  ``pos`` is read only within each row's
    ``ptr`` range."""
    from ._compiled import _rows_for, on_rows

    m = ptr.size - 1
    per_row = max(1, int(ptr[-1]) // max(m, 1))
    on_rows(_phases_csr, m, ptr, pos, vals, w, tile_k, tile_node, tiles, re, im,
            min_rows=_rows_for(per_row * re.shape[1] + 16 * re.shape[1]))


CSR_WIDE = 4  # ATOMS-atom vectors summed together by csr_tile (independent fma chains per stored value)


def _csr_tile(nv):
    @intrinsic
    def csr_tile(typingctx, pos, vals, q0, q1, lo, pan, k0, dst, kd, init):
        """``dst[kd + t] = fma-sum over q in q0..q1 - 1 of vals[q] * pan[pos[q] - lo, k0 + t]``
        for t < nv * ATOMS, continued from ``dst`` (from +0.0 when ``init``), in the order of
        q: ``nv`` register tiles of ATOMS atoms.  ``pan`` float32 C-ordered with nv * ATOMS readable columns from ``k0``;
        ``pos`` int64, ``vals`` float32, ``dst`` float32 1-D with nv * ATOMS values from kd."""
        f32 = types.float32
        if not (_matrix(pan, f32) and isinstance(dst, types.Array) and dst.dtype == f32
                and isinstance(vals, types.Array) and vals.dtype == f32 and isinstance(pos, types.Array)):
            return None
        sig = types.void(pos, vals, q0, q1, lo, pan, k0, dst, kd, init)

        def codegen(context, builder, signature, args):
            t = signature.args
            intp = types.intp

            def ix(i):
                return context.cast(builder, args[i], t[i], intp)

            vt = ir.VectorType(ir.FloatType(), ATOMS)
            fma = _fma_fn(builder, vt)
            i32 = ir.IntType(32)
            i8p = ir.IntType(8).as_pointer()
            pan_arr = context.make_array(t[5])(context, builder, args[5])
            stride = cgutils.unpack_tuple(builder, pan_arr.strides, 2)[0]
            base = builder.bitcast(_ptr(context, builder, t[5], args[5], context.get_constant(intp, 0), ix(6)), i8p)
            pos_base = _ptr(context, builder, t[0], args[0], context.get_constant(intp, 0))
            val_base = _ptr(context, builder, t[1], args[1], context.get_constant(intp, 0))
            zero = ir.Constant(vt, [0.0] * ATOMS)
            first = context.cast(builder, args[9], t[9], types.boolean)
            d = builder.bitcast(_ptr(context, builder, t[7], args[7], ix(8)), i8p)
            dvec = [builder.bitcast(builder.gep(d, [context.get_constant(intp, 4 * ATOMS * j)]), vt.as_pointer())
                    for j in range(nv)]
            accs = [cgutils.alloca_once_value(builder, builder.select(first, zero, builder.load(dvec[j], align=4)))
                    for j in range(nv)]
            undef = ir.Constant(vt, ir.Undefined)
            mask = ir.Constant(ir.VectorType(i32, ATOMS), [0] * ATOMS)
            lo_ = ix(4)
            with cgutils.for_range_slice(builder, ix(2), ix(3), context.get_constant(intp, 1), inc=True) as (q, _):
                c = builder.sub(context.cast(builder, builder.load(builder.gep(pos_base, [q])), t[0].dtype, intp), lo_)
                row = builder.gep(base, [builder.mul(c, stride)])
                xv = builder.load(builder.gep(val_base, [q]))
                xs = builder.shuffle_vector(builder.insert_element(undef, xv, ir.Constant(i32, 0)), undef, mask)
                for j in range(nv):
                    ov = builder.load(builder.bitcast(builder.gep(row, [context.get_constant(intp, 4 * ATOMS * j)]),
                                                      vt.as_pointer()), align=4)
                    builder.store(builder.call(fma, [xs, ov, builder.load(accs[j])]), accs[j])
            for j in range(nv):
                builder.store(builder.load(accs[j]), dvec[j], align=4)
            return context.get_dummy_value()

        return sig, codegen

    return csr_tile


csr_tile_wide = _csr_tile(CSR_WIDE)
csr_tile_packed = _csr_tile(TILE // ATOMS)  # one packed tile of pack_panels


CSR_ACC = 1 << 20  # float32 partial sums held at once per thread (4 MiB): the rows of one group
CSR_COLS = 1024  # input columns per run of a tile (1024 x 64 float32 frequencies: 256 KiB, in L2)


def pack_csr_tiles(packed, loc, starts, ends, nodes):
    """The frequencies of :func:`pack_panels` (``packed``, ``loc``) again, in wider tiles for :func:`phases_csr`: tile j
    is ``CSR_WIDE * ATOMS`` atoms of one node from ``tile_k[j]`` (a node's atoms ``s:e``
    from its blocks, in tiles from ``s``; zeros past ``e``), ``tiles[j]`` its ``(w,
    CSR_WIDE * ATOMS)`` frequencies, contiguous (a tile's 64 frequencies of one input column
    are 256 bytes in a row, the tile's w rows one after another).  Returns ``(tile_k,
    tile_node, tiles)``."""
    tw = CSR_WIDE * ATOMS
    run_s, run_e, run_n = [], [], []
    for s0, e0, n0 in zip(starts.tolist(), ends.tolist(), nodes.tolist()):
        if run_n and run_n[-1] == n0 and run_e[-1] == s0:
            run_e[-1] = e0
        else:
            run_s.append(s0)
            run_e.append(e0)
            run_n.append(n0)
    tile_k, tile_node = [], []
    for s0, e0, n0 in zip(run_s, run_e, run_n):
        for k in range(s0, e0, tw):
            tile_k.append(k)
            tile_node.append(n0)
    tile_k = np.array(tile_k, np.int64)
    tile_node = np.array(tile_node, np.int64)
    ends_of = np.repeat(np.array(run_e, np.int64), [len(range(s0, e0, tw)) for s0, e0 in zip(run_s, run_e)])
    tiles = np.zeros((tile_k.size, packed.shape[1], tw), np.float32)
    _pack_tiles(packed, loc, tile_k, ends_of, tiles)
    return tile_k, tile_node, tiles


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pack_tiles(packed, loc, tile_k, tile_end, tiles):  # pragma: no cover - compiled
    for j in range(tile_k.size):
        n = min(tiles.shape[2], tile_end[j] - tile_k[j])
        for t in range(n):
            src = packed[loc[tile_k[j] + t] // TILE]
            lane = loc[tile_k[j] + t] % TILE
            for c in range(packed.shape[1]):
                tiles[j, c, t] = src[c, lane]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _phases_csr(ptr, pos, vals, w, tile_k, tile_node, tiles, re, im, start, stop):  # pragma: no cover
    # Tiles of atoms outside, rows inside, over groups of rows: a tile's frequencies (w x 64
    # float32, contiguous) are read by every row of the group while they are in cache.
    # Each atom's sum still runs over its row's stored values in ascending column order
    # (one csr_tile call per row and tile), so the grouping changes no bit.  A tile's
    # values past its node's atoms (zero frequencies) land on the next node's atoms,
    # which its own tiles overwrite afterwards, or on the padding past a.
    a = re.shape[1]
    nt = tile_k.size
    width = a + CSR_WIDE * ATOMS
    rb = max(1, min(stop - start, CSR_ACC // width))
    acc = np.zeros((rb, width), np.float32)
    qa = np.empty(rb, np.int64)
    qb = np.empty(rb, np.int64)
    cur = np.empty(rb, np.int64)
    for g0 in range(start, stop, rb):
        n = min(rb, stop - g0)
        for i in range(n):
            qb[i] = ptr[g0 + i]  # each row's cursor: nodes come in ascending order
        for j in range(nt):
            lo = tile_node[j] * w
            hi = lo + w
            if j == 0 or tile_node[j] != tile_node[j - 1]:  # (the same node: the same ranges)
                for i in range(n):
                    e = ptr[g0 + i + 1]
                    q = qb[i]
                    while q < e and pos[q] < lo:
                        q += 1
                    qq = q
                    while qq < e and pos[qq] < hi:
                        qq += 1
                    qa[i] = q
                    qb[i] = qq
            tile = tiles[j]
            k = tile_k[j]
            if w <= CSR_COLS:
                for i in range(n):
                    csr_tile_wide(pos, vals, qa[i], qb[i], lo, tile, 0, acc[i], k, True)
            else:
                # the node's columns in runs of CSR_COLS (a run's frequencies stay in L2), each
                # sum continued exactly from its float32 partial sum: the same order
                for i in range(n):
                    cur[i] = qa[i]
                for c0 in range(0, w, CSR_COLS):
                    end = lo + min(w, c0 + CSR_COLS)
                    for i in range(n):
                        q = cur[i]
                        qq = q
                        e = qb[i]
                        while qq < e and pos[qq] < end:
                            qq += 1
                        csr_tile_wide(pos, vals, q, qq, lo, tile, 0, acc[i], k, c0 == 0)
                        cur[i] = qq
        for i in range(n):
            sincos_into(acc[i], a, re[g0 + i], im[g0 + i])

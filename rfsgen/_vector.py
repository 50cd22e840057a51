"""Eight-lane float64 vector operations for the transform loop, as numba intrinsics.

Why these exist: numba compiles with LLVM's SLP vectoriser switched off, and LLVM
fully unrolls a constant 8-iteration lane loop before its loop vectoriser runs, so
a loop such as ``for t in range(8): re[t] = a[t] * b[t] - ...`` ends up as eight
scalar multiplies.  These intrinsics emit the ``<8 x double>`` operations
directly.  They use plain IEEE ``fmul``/``fadd``/``fsub`` (no fast-math flags, so
no fused multiply-add and no reassociation): every lane computes exactly what the
scalar expression would, bit for bit.

Conventions: a "lane row" is the 8 consecutive elements starting at ``a[i, 0]`` of a
C-contiguous 2-D array (the caller guarantees at least 8 columns).  No bounds
checks are made; the caller's indices are trusted.

numba's on-disk cache of a compiled loop is keyed on its own file alone: after editing
this one (or :mod:`rfsgen._compiled`, whose product loop :mod:`rfsgen._sincos32` compiles
into its own), touch ``_compiled.py`` and ``_sincos32.py`` (or delete
``rfsgen/__pycache__``) so the loops are compiled again.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 8
_F64 = ir.DoubleType()
_V64 = ir.VectorType(_F64, LANES)
_I32 = ir.IntType(32)


def _is_matrix(t, dtype=None) -> bool:
    return isinstance(t, types.Array) and t.ndim == 2 and t.layout == "C" and (dtype is None or t.dtype == dtype)


def _index(context, builder, value, ty):
    return context.cast(builder, value, ty, types.intp)


def _item_ptr(context, builder, aryty, ary, *indices):
    arr = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, arr, list(indices), wraparound=False)


def _load_row(context, builder, aryty, ary, i):
    """The lane row ``ary[i, 0:8]`` as ``<8 x dtype>``."""
    zero = context.get_constant(types.intp, 0)
    ptr = _item_ptr(context, builder, aryty, ary, i, zero)
    vt = ir.VectorType(context.get_data_type(aryty.dtype), LANES)
    return builder.load(builder.bitcast(ptr, vt.as_pointer()), align=aryty.dtype.bitwidth // 8)


def _store_row(context, builder, aryty, ary, i, vec):
    """``ary[i, 0:8] = vec`` (float64 lanes rounded to a float32 array's dtype)."""
    zero = context.get_constant(types.intp, 0)
    ptr = _item_ptr(context, builder, aryty, ary, i, zero)
    vt = ir.VectorType(context.get_data_type(aryty.dtype), LANES)
    if vt != vec.type:
        vec = builder.fptrunc(vec, vt)
    builder.store(vec, builder.bitcast(ptr, vt.as_pointer()), align=aryty.dtype.bitwidth // 8)


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(_V64, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V64, ir.Undefined), ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))


@intrinsic
def gather(typingctx, src, r0, col, c, dst, k):
    """``dst[k, t] = c * src[r0 + t, col]`` for the 8 lanes t: one column of 8 rows."""
    if not (_is_matrix(src, types.float64) and _is_matrix(dst, types.float64)):
        return None
    sig = types.void(src, r0, col, c, dst, k)

    def codegen(context, builder, signature, args):
        t = signature.args
        arr = context.make_array(t[0])(context, builder, args[0])
        first = cgutils.get_item_pointer(context, builder, t[0], arr, [
            _index(context, builder, args[1], t[1]), _index(context, builder, args[2], t[2])], wraparound=False)
        row_bytes = cgutils.unpack_tuple(builder, arr.strides, 2)[0]
        base = builder.bitcast(first, ir.IntType(8).as_pointer())
        vec = ir.Constant(_V64, ir.Undefined)
        for lane in range(LANES):
            ptr = builder.gep(base, [builder.mul(row_bytes, ir.Constant(row_bytes.type, lane))])
            x = builder.load(builder.bitcast(ptr, _F64.as_pointer()), align=8)
            vec = builder.insert_element(vec, x, ir.Constant(_I32, lane))
        cv = _splat(builder, context.cast(builder, args[3], t[3], types.float64))
        _store_row(context, builder, t[4], args[4], _index(context, builder, args[5], t[5]), builder.fmul(cv, vec))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def product(typingctx, fr, fi, first, fidx, q0, q1, imag, s, dst, k):
    """One column for 8 lanes: ``P = F[first] * F[fidx[q0]] * ... * F[fidx[q1 - 1]]``
    (complex, left to right, with ``F = fr + i fi`` lane rows), then
    ``dst[k] = s * (Im P if imag else Re P)`` in ``dst``'s dtype.

    The running product stays in registers (a memory round trip through a 512-bit
    store and reload per factor costs more than the multiply).
    """
    if not (_is_matrix(fr, types.float64) and _is_matrix(fi, types.float64) and _is_matrix(dst)
            and dst.dtype in (types.float32, types.float64)
            and isinstance(fidx, types.Array) and fidx.ndim == 1 and isinstance(fidx.dtype, types.Integer)):
        return None
    sig = types.void(fr, fi, first, fidx, q0, q1, imag, s, dst, k)

    def codegen(context, builder, signature, args):
        t = signature.args
        start = _index(context, builder, args[2], t[2])
        x = _load_row(context, builder, t[0], args[0], start)
        y = _load_row(context, builder, t[1], args[1], start)
        acc_r = cgutils.alloca_once_value(builder, x)
        acc_i = cgutils.alloca_once_value(builder, y)
        lo = _index(context, builder, args[4], t[4])
        hi = _index(context, builder, args[5], t[5])
        with cgutils.for_range_slice(builder, lo, hi, context.get_constant(types.intp, 1), inc=True) as (q, _):
            fp = _item_ptr(context, builder, t[3], args[3], q)
            f = _index(context, builder, builder.load(fp), t[3].dtype)
            u = _load_row(context, builder, t[0], args[0], f)
            w = _load_row(context, builder, t[1], args[1], f)
            xr = builder.load(acc_r)
            xi = builder.load(acc_i)
            builder.store(builder.fsub(builder.fmul(xr, u), builder.fmul(xi, w)), acc_r)
            builder.store(builder.fadd(builder.fmul(xr, w), builder.fmul(xi, u)), acc_i)
        take_imag = context.cast(builder, args[6], t[6], types.boolean)
        v = builder.select(take_imag, builder.load(acc_i), builder.load(acc_r))
        sv = _splat(builder, context.cast(builder, args[7], t[7], types.float64))
        _store_row(context, builder, t[8], args[8], _index(context, builder, args[9], t[9]), builder.fmul(sv, v))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def product_real(typingctx, fr, first, fidx, q0, q1, s, dst, k):
    """:func:`product`'s real part for factors whose imaginary parts are all zeros:
    ``P = fr[first] * fr[fidx[q0]] * ... * fr[fidx[q1 - 1]]`` (left to right, one multiply
    a factor), ``dst[k] = s * P`` in ``dst``'s dtype; returns whether a lane of ``P`` is zero.

    With every imaginary part a zero (of either sign), :func:`product`'s real part at each
    step is ``x * u - (a zero)``, which is ``x * u`` exactly unless ``x * u`` is itself a
    zero: so where no lane of ``P`` is zero (no step was), the stored values have
    :func:`product`'s bits; otherwise the caller computes the column with :func:`product`
    (the sign of a zero may differ)."""
    if not (_is_matrix(fr, types.float64) and _is_matrix(dst) and dst.dtype in (types.float32, types.float64)
            and isinstance(fidx, types.Array) and fidx.ndim == 1 and isinstance(fidx.dtype, types.Integer)):
        return None
    sig = types.boolean(fr, first, fidx, q0, q1, s, dst, k)

    def codegen(context, builder, signature, args):
        t = signature.args
        start = _index(context, builder, args[1], t[1])
        acc = cgutils.alloca_once_value(builder, _load_row(context, builder, t[0], args[0], start))
        lo = _index(context, builder, args[3], t[3])
        hi = _index(context, builder, args[4], t[4])
        with cgutils.for_range_slice(builder, lo, hi, context.get_constant(types.intp, 1), inc=True) as (q, _):
            f = _index(context, builder, builder.load(_item_ptr(context, builder, t[2], args[2], q)), t[2].dtype)
            builder.store(builder.fmul(builder.load(acc), _load_row(context, builder, t[0], args[0], f)), acc)
        v = builder.load(acc)
        sv = _splat(builder, context.cast(builder, args[5], t[5], types.float64))
        _store_row(context, builder, t[6], args[6], _index(context, builder, args[7], t[7]), builder.fmul(sv, v))
        zeros = builder.fcmp_ordered("==", v, ir.Constant(_V64, [0.0] * LANES))
        any_zero = builder.icmp_unsigned("!=", builder.bitcast(zeros, ir.IntType(LANES)), ir.Constant(ir.IntType(LANES), 0))
        return any_zero

    return sig, codegen


@intrinsic
def power_row(typingctx, fr, fi, k, p, dst):
    """``F[dst] = F[k] ** p`` for the 8 lanes (``F = fr + i fi``): the operations of
    :func:`rfsgen._compiled._power` in its order, lane for lane (so the same bits), by
    repeated squaring in registers.  ``p < 0`` takes the conjugate's power (negative
    powers occur only for unit-modulus factors).  Kept in registers because a store and a
    reload of the lane rows at every step made raising the powers twice as slow."""
    if not (_is_matrix(fr, types.float64) and _is_matrix(fi, types.float64)
            and isinstance(p, types.Integer)):
        return None
    sig = types.void(fr, fi, k, p, dst)

    def codegen(context, builder, signature, args):
        t = signature.args
        i64 = ir.IntType(64)
        ik = _index(context, builder, args[2], t[2])
        idst = _index(context, builder, args[4], t[4])
        pv = context.cast(builder, args[3], t[3], types.int64)
        negative = builder.icmp_signed("<", pv, ir.Constant(i64, 0))
        sv = _splat(builder, builder.select(negative, ir.Constant(_F64, -1.0), ir.Constant(_F64, 1.0)))
        e_ptr = cgutils.alloca_once_value(builder, builder.select(negative, builder.neg(pv), pv))
        br = cgutils.alloca_once_value(builder, _load_row(context, builder, t[0], args[0], ik))
        bi = cgutils.alloca_once_value(builder, builder.fmul(sv, _load_row(context, builder, t[1], args[1], ik)))
        rr = cgutils.alloca_once_value(builder, ir.Constant(_V64, [1.0] * LANES))
        ri = cgutils.alloca_once_value(builder, ir.Constant(_V64, [0.0] * LANES))
        two = ir.Constant(_V64, [2.0] * LANES)
        bb_cond = builder.append_basic_block("power.cond")
        bb_body = builder.append_basic_block("power.body")
        bb_end = builder.append_basic_block("power.end")
        builder.branch(bb_cond)
        builder.position_at_end(bb_cond)
        e = builder.load(e_ptr)
        builder.cbranch(builder.icmp_signed(">", e, ir.Constant(i64, 0)), bb_body, bb_end)
        builder.position_at_end(bb_body)
        with builder.if_then(builder.trunc(e, ir.IntType(1))):
            xr, xi, yr, yi = builder.load(rr), builder.load(ri), builder.load(br), builder.load(bi)
            builder.store(builder.fsub(builder.fmul(xr, yr), builder.fmul(xi, yi)), rr)
            builder.store(builder.fadd(builder.fmul(xr, yi), builder.fmul(xi, yr)), ri)
        e = builder.lshr(e, ir.Constant(i64, 1))
        builder.store(e, e_ptr)
        with builder.if_then(builder.icmp_signed(">", e, ir.Constant(i64, 0))):
            yr, yi = builder.load(br), builder.load(bi)
            builder.store(builder.fsub(builder.fmul(yr, yr), builder.fmul(yi, yi)), br)
            builder.store(builder.fmul(builder.fmul(two, yr), yi), bi)
        builder.branch(bb_cond)
        builder.position_at_end(bb_end)
        _store_row(context, builder, t[0], args[0], idst, builder.load(rr))
        _store_row(context, builder, t[1], args[1], idst, builder.load(ri))
        return context.get_dummy_value()

    return sig, codegen


def _transpose(builder, rows):
    """Transpose a square block held as a list of vectors (log2(n) rounds of shuffles)."""
    n = len(rows)
    step = 1
    while step < n:
        new = list(rows)
        for i in range(n):
            if i & step:
                continue
            lo = [c if not c & step else n + c - step for c in range(n)]
            hi = [c + step if not c & step else n + c for c in range(n)]
            new[i] = builder.shuffle_vector(rows[i], rows[i + step], ir.Constant(ir.VectorType(_I32, n), lo))
            new[i + step] = builder.shuffle_vector(rows[i], rows[i + step], ir.Constant(ir.VectorType(_I32, n), hi))
        rows = new
        step *= 2
    return rows


@intrinsic
def transpose_out(typingctx, tile, pos, j, out, r0):
    """``out[r0 + t, j + c] = tile[pos[j + c], t]`` for t, c < 8: an 8 x 8 block moved
    from the column-major tile into 8 output rows."""
    if not (_is_matrix(tile) and _is_matrix(out) and tile.dtype == out.dtype
            and isinstance(pos, types.Array) and pos.ndim == 1 and isinstance(pos.dtype, types.Integer)):
        return None
    sig = types.void(tile, pos, j, out, r0)

    def codegen(context, builder, signature, args):
        t = signature.args
        jj = _index(context, builder, args[2], t[2])
        rr = _index(context, builder, args[4], t[4])
        rows = []
        for c in range(LANES):
            p = _item_ptr(context, builder, t[1], args[1], builder.add(jj, context.get_constant(types.intp, c)))
            rows.append(_load_row(context, builder, t[0], args[0], _index(context, builder, builder.load(p), t[1].dtype)))
        vt = rows[0].type
        for lane, vec in enumerate(_transpose(builder, rows)):
            ptr = _item_ptr(context, builder, t[3], args[3], builder.add(rr, context.get_constant(types.intp, lane)), jj)
            builder.store(vec, builder.bitcast(ptr, vt.as_pointer()), align=t[3].dtype.bitwidth // 8)
        return context.get_dummy_value()

    return sig, codegen


#: Lane rows (8 rows each) of one block of the log-domain loop: 4 x 2 accumulators.
LOG_BLOCKS = 4


@intrinsic
def log_sums(typingctx, la, ag, local, power, q0, q1, lg0, acc):
    """One heavy-tailed column over ``8 * LOG_BLOCKS`` rows: for lane rows ``b <
    LOG_BLOCKS``, ``acc[b] = lg0 + sum_q power[q] * la[local[q] * LOG_BLOCKS + b]`` and
    ``acc[LOG_BLOCKS + b] = 0.0 + sum_q power[q] * ag[local[q] * LOG_BLOCKS + b]``, term by
    term from ``q0`` to ``q1`` (one multiply and one add each: what the scalar loop
    computes, lane for lane)."""
    if not (_is_matrix(la, types.float64) and _is_matrix(ag, types.float64) and _is_matrix(acc, types.float64)
            and isinstance(local, types.Array) and local.ndim == 1 and isinstance(local.dtype, types.Integer)
            and isinstance(power, types.Array) and power.ndim == 1 and power.dtype == types.float64):
        return None
    sig = types.void(la, ag, local, power, q0, q1, lg0, acc)

    def codegen(context, builder, signature, args):
        t = signature.args
        intp = types.intp
        nb = context.get_constant(intp, LOG_BLOCKS)
        init = _splat(builder, context.cast(builder, args[6], t[6], types.float64))
        zv = ir.Constant(_V64, [0.0] * LANES)
        acc_l = [cgutils.alloca_once_value(builder, init) for _ in range(LOG_BLOCKS)]
        acc_p = [cgutils.alloca_once_value(builder, zv) for _ in range(LOG_BLOCKS)]
        lo = _index(context, builder, args[4], t[4])
        hi = _index(context, builder, args[5], t[5])
        with cgutils.for_range_slice(builder, lo, hi, context.get_constant(intp, 1), inc=True) as (q, _):
            j = _index(context, builder, builder.load(_item_ptr(context, builder, t[2], args[2], q)), t[2].dtype)
            pv = _splat(builder, builder.load(_item_ptr(context, builder, t[3], args[3], q)))
            row = builder.mul(j, nb)
            for b in range(LOG_BLOCKS):
                k = builder.add(row, context.get_constant(intp, b))
                u = _load_row(context, builder, t[0], args[0], k)
                w = _load_row(context, builder, t[1], args[1], k)
                builder.store(builder.fadd(builder.load(acc_l[b]), builder.fmul(pv, u)), acc_l[b])
                builder.store(builder.fadd(builder.load(acc_p[b]), builder.fmul(pv, w)), acc_p[b])
        for b in range(LOG_BLOCKS):
            _store_row(context, builder, t[7], args[7], context.get_constant(intp, b), builder.load(acc_l[b]))
            _store_row(context, builder, t[7], args[7], context.get_constant(intp, LOG_BLOCKS + b), builder.load(acc_p[b]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def log_moduli(typingctx, la, local, power, q0, q1, lg0, acc):
    """:func:`log_sums` without the phases: ``acc[b] = lg0 + sum_q power[q] * la[local[q] *
    LOG_BLOCKS + b]`` for lane rows ``b < LOG_BLOCKS``, term by term from ``q0`` to ``q1``:
    the same operations in the same order as :func:`log_sums`' log-moduli, so the same bits."""
    if not (_is_matrix(la, types.float64) and _is_matrix(acc, types.float64)
            and isinstance(local, types.Array) and local.ndim == 1 and isinstance(local.dtype, types.Integer)
            and isinstance(power, types.Array) and power.ndim == 1 and power.dtype == types.float64):
        return None
    sig = types.void(la, local, power, q0, q1, lg0, acc)

    def codegen(context, builder, signature, args):
        t = signature.args
        intp = types.intp
        nb = context.get_constant(intp, LOG_BLOCKS)
        init = _splat(builder, context.cast(builder, args[5], t[5], types.float64))
        acc_l = [cgutils.alloca_once_value(builder, init) for _ in range(LOG_BLOCKS)]
        lo = _index(context, builder, args[3], t[3])
        hi = _index(context, builder, args[4], t[4])
        with cgutils.for_range_slice(builder, lo, hi, context.get_constant(intp, 1), inc=True) as (q, _):
            j = _index(context, builder, builder.load(_item_ptr(context, builder, t[1], args[1], q)), t[1].dtype)
            pv = _splat(builder, builder.load(_item_ptr(context, builder, t[2], args[2], q)))
            row = builder.mul(j, nb)
            for b in range(LOG_BLOCKS):
                k = builder.add(row, context.get_constant(intp, b))
                u = _load_row(context, builder, t[0], args[0], k)
                builder.store(builder.fadd(builder.load(acc_l[b]), builder.fmul(pv, u)), acc_l[b])
        for b in range(LOG_BLOCKS):
            _store_row(context, builder, t[6], args[6], context.get_constant(intp, b), builder.load(acc_l[b]))
        return context.get_dummy_value()

    return sig, codegen

"""rfsgen's compiled loops (numba): the transform's products of factor values into
columns, and the sampler's per-draw hashing.

Kept apart so that the rest imports without compiling anything.  numba is a required
dependency (not optional) so that the output never depends on whether it is
installed; see the README's Performance section for the measurements behind it.
"""

from __future__ import annotations

import numba
import numpy as np

TILE = 8  # rows per tile: one 64-byte cache line of float64 per factor


@numba.njit(parallel=True, cache=True, nogil=True, boundscheck=False)
def columns(zr, zi, ptr, atom, power, take_imag, scale, out):  # pragma: no cover - compiled
    """out[r, j] = scale[j] * Re (or -Im) of prod_{q in ptr[j]:ptr[j+1]} z[atom[q], r] ** power[q].

    zr, zi: float64 (n_atoms, m), the atoms' values feature-major; ptr: int64 (D + 1);
    atom, power: int64 (nnz); take_imag: bool (D,) (a column cos(theta + pi/2) is -Im);
    scale: float64 (D,); out: float32/float64 (m, D), C order.

    Rows go in tiles of TILE: a tile's atom values are first copied into a small
    contiguous buffer (one cache line per atom, no TLB misses), every column's
    complex product runs across the tile's rows in SIMD lanes, in float64, into a
    column-major tile that is then written out row by row.  Negative
    powers occur only for unit-modulus factors, where z^-k = conj(z)^k.  Each output
    value depends only on its own row: the result does not depend on threads or on
    how rows are chunked.
    """
    m, d = out.shape
    n_atoms = zr.shape[0]
    n_tiles = (m + TILE - 1) // TILE
    for b in numba.prange(n_tiles):
        r0 = b * TILE
        n = min(TILE, m - r0)
        br = np.zeros((n_atoms, TILE))
        bi = np.zeros((n_atoms, TILE))
        for k in range(n_atoms):
            for t in range(n):
                br[k, t] = zr[k, r0 + t]
                bi[k, t] = zi[k, r0 + t]
        tile = np.empty((d, TILE), dtype=out.dtype)
        pr = np.empty(TILE)
        pi = np.empty(TILE)
        fr = np.empty(TILE)
        fi = np.empty(TILE)
        for j in range(d):
            for t in range(TILE):
                pr[t] = 1.0
                pi[t] = 0.0
            for q in range(ptr[j], ptr[j + 1]):
                k = atom[q]
                if power[q] == 1:
                    for t in range(TILE):
                        a = br[k, t]
                        c = bi[k, t]
                        x = pr[t] * a - pi[t] * c
                        pi[t] = pr[t] * c + pi[t] * a
                        pr[t] = x
                else:
                    _power(br[k], bi[k], power[q], fr, fi)
                    for t in range(TILE):
                        x = pr[t] * fr[t] - pi[t] * fi[t]
                        pi[t] = pr[t] * fi[t] + pi[t] * fr[t]
                        pr[t] = x
            s = scale[j]
            if take_imag[j]:
                for t in range(TILE):
                    tile[j, t] = -s * pi[t]
            else:
                for t in range(TILE):
                    tile[j, t] = s * pr[t]
        # Rows of the tile go out as contiguous runs.
        for t in range(n):
            for j in range(d):
                out[r0 + t, j] = tile[j, t]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _power(zr, zi, p, fr, fi):  # pragma: no cover - compiled
    """(fr + i fi) = (zr + i zi) ** p for each lane, by repeated squaring."""
    sign = 1.0
    if p < 0:
        p = -p
        sign = -1.0
    for t in range(TILE):
        ar = zr[t]
        ai = sign * zi[t]
        rr = 1.0
        ri = 0.0
        e = p
        while e > 0:
            if e & 1:
                x = rr * ar - ri * ai
                ri = rr * ai + ri * ar
                rr = x
            e >>= 1
            if e > 0:
                x = ar * ar - ai * ai
                ai = 2.0 * ar * ai
                ar = x
        fr[t] = rr
        fi[t] = ri


# ----------------------------------------------------------------------------- sampler keys
_SALTS = (np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344))
_C0 = np.uint64(0x100000001B3)
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, nogil=True, inline="always")
def _mix(x):  # pragma: no cover - compiled
    """splitmix64 finaliser (wrapping uint64 arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M2
    x = x ^ (x >> np.uint64(27))
    x = x * _M3
    return x ^ (x >> np.uint64(31))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def draw_keys(kind, ptr, node, code, power, continuous, first_draw, out):  # pragma: no cover - compiled
    """Two 64-bit hashes per draw of (kind, its sorted terms) into ``out`` (n, 2) uint64.

    The same arithmetic as the numpy formulation it replaced (``rfsgen.sampler.term_keys``),
    bit for bit: term t of a draw contributes mix(base_t ^ mix(t + salt)) to a wrapping sum.
    Hashed keys get an even second half; a draw with a continuous term is unique by
    construction and gets (first_draw + i, all ones) instead.
    """
    for i in range(kind.size):
        if continuous[i]:
            out[i, 0] = np.uint64(first_draw + i)
            out[i, 1] = np.uint64(0xFFFFFFFFFFFFFFFF)
            continue
        a = ptr[i]
        z = ptr[i + 1]
        for half in range(2):
            salt = _SALTS[half]
            acc = np.uint64(0)
            for q in range(a, z):
                base = (np.uint64(node[q]) * _C0) ^ (np.uint64(code[q]) * _M1) ^ (np.uint64(power[q]) * _M3)
                acc += _mix(base ^ _mix(np.uint64(q - a) + salt))
            head = _mix(np.uint64(kind[i]) + np.uint64(z - a) * _M1 + salt)
            out[i, half] = _mix(acc ^ head)
        out[i, 1] &= np.uint64(0xFFFFFFFFFFFFFFFE)

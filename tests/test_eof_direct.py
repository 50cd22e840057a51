"""EOF at full speed: CSR rows written straight from the level vectors (no dense chunk zeroed
and compressed) and one transcendental call fewer per pinned laplace level give the same
bytes as the dense path they replace -- in memory and in files, whatever the chunk size or
thread count, both boundaries and kernels, float32 and float64, a recorded scale exponent,
column weights, rows outside the box (clipped, counted) and rows on a face (exact zeros,
dropped); NaN rows are refused as before, and a set whose columns do not follow its level
vectors keeps the dense path."""

import hashlib

import numpy as np
import pytest

from rfsgen import _compiled, eof, parse_skeleton
from rfsgen.errors import DataError
from rfsgen.features import save
from rfsgen.output import _sparse_parts
from rfsgen.transform import transform, transform_file


def skeleton(kernel, d, boundary="pinned", scale=1.3, domain="[-2, 3]"):
    sc = f", scale: {scale}" if kernel == "laplace" else ""
    return parse_skeleton(f"rfsgen: 1\ninput: {{width: {d + 1}}}\nnodes:\n  - {{name: x, base: {kernel}{sc}, "
                          f"domain: {domain}, boundary: {boundary}, columns: '0:{d}'}}\n", f"{kernel}.yaml")


def rows(d, m=150, seed=0):
    """Rows in and around the box [-2, 3]: some outside (clipped), some on a face or a grid
    point (exact zeros of pinned features), one unused column."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.5, 3.5, (m, d + 1))
    x[::9, 0] = -2.0  # on the face: pinned features 0
    x[::11, 1 % d] = 3.0
    x[::13, 0] = 0.5  # the centre
    x[::17, d - 1] = -2.0 + 5.0 * 0.375  # a grid point
    return x


def dense_reference(fs, x, dtype):
    """The path the direct one replaces: the dense chunk, compacted (rfsgen.output._sparse_parts)."""
    vals = eof.Transformer(fs, dtype).chunk(x)
    data, indices, counts = _sparse_parts(vals)
    return data, indices, np.concatenate([[0], np.cumsum(counts)])


CASES = [(k, b) for k in eof.KERNELS for b in ("pinned", "free")]


@pytest.mark.parametrize("kernel,boundary", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_in_memory_csr_is_the_dense_path_compacted(kernel, boundary, dtype, monkeypatch):
    d = 3
    fs = eof.sample(skeleton(kernel, d, boundary), columns=40, seed=4)  # a subset: some slots unused
    x = rows(d)
    ref = dense_reference(fs, x, np.dtype(dtype))
    assert eof.Transformer(fs, np.dtype(dtype)).direct_csr
    assert (np.diff(ref[2]) < eof.Transformer(fs).max_row_nonzeros).any()  # zeros were dropped
    for n_threads in (1, 2):
        monkeypatch.setattr(_compiled, "threads", lambda n=n_threads: n)
        for chunk_rows in (1, 7, 64):
            z = transform(fs, x, layout="csr", dtype=dtype, chunk_rows=chunk_rows)
            assert z.data.dtype == np.dtype(dtype) and z.indices.dtype == np.int32
            assert z.data.tobytes() == ref[0].tobytes()
            assert np.array_equal(z.indices, ref[1]) and np.array_equal(z.indptr, ref[2])


@pytest.mark.parametrize("kernel,boundary", CASES)
def test_files_are_byte_identical_to_the_dense_path(kernel, boundary, tmp_path, monkeypatch):
    """transform_file --layout csr: the same file bytes (values, record, checksums) whether
    the rows are written straight or through dense chunks, for chunk sizes 1, 7, 64 and 1 or 2
    threads."""
    d = 3
    fs = eof.sample(skeleton(kernel, d, boundary), level=4, seed=1)
    save(fs, tmp_path / "f.h5")
    np.save(tmp_path / "x.npy", rows(d, 200))

    def digest(tag, chunk_rows):
        out = tmp_path / f"{tag}-{chunk_rows}.h5"
        info = transform_file(tmp_path / "f.h5", tmp_path / "x.npy", out, layout="csr", chunk_rows=chunk_rows)
        return hashlib.sha256(out.read_bytes()).hexdigest(), info["clipped"]

    dense_init = eof.Transformer.__init__

    def no_direct(self, *a, **k):
        dense_init(self, *a, **k)
        self.direct_csr = False

    want = {}
    with monkeypatch.context() as mp:
        mp.setattr(eof.Transformer, "__init__", no_direct)
        for chunk_rows in (1, 7, 64):
            want[chunk_rows] = digest("dense", chunk_rows)
    assert len(set(want.values())) == 1 and want[1][1] > 0  # (rows were clipped, and counted)
    for n_threads in (1, 2):
        monkeypatch.setattr(_compiled, "threads", lambda n=n_threads: n)
        for chunk_rows in (1, 7, 64):
            assert digest(f"direct{n_threads}", chunk_rows) == want[1]


def test_a_recorded_scale_exponent_and_column_weights_come_out_the_same(monkeypatch):
    """A laplace node narrow enough for a scale exponent (features times 2^e), and float column
    weights (an LKRF pool's): the direct rows multiply as the dense chunk did."""
    d = 30
    fs = eof.sample(skeleton("laplace", d, scale=0.7), columns=300, seed=2)
    assert fs.eof.scale_exponent >= eof.SCALE_FROM
    fs.column_weight = np.random.default_rng(1).uniform(0.1, 3.0, fs.columns)
    x = rows(d, 120, seed=3)
    for dtype in ("float32", "float64"):
        ref = dense_reference(fs, x, np.dtype(dtype))
        for n_threads in (1, 2):
            monkeypatch.setattr(_compiled, "threads", lambda n=n_threads: n)
            z = transform(fs, x, layout="csr", dtype=dtype, chunk_rows=7)
            assert z.data.tobytes() == ref[0].tobytes() and np.array_equal(z.indptr, ref[2])
            assert np.array_equal(z.indices, ref[1])


def test_nan_rows_are_refused_and_clipped_values_counted_as_before():
    d = 3
    fs = eof.sample(skeleton("laplace", d), level=3)
    x = rows(d, 30)
    tr, dense = eof.Transformer(fs), eof.Transformer(fs)
    T = tr.max_row_nonzeros
    data, indices, counts = np.empty(30 * T, np.float32), np.empty(30 * T, np.int32), np.empty(30, np.int64)
    tr.csr_rows(x, data, indices, counts)
    dense.chunk(x)
    assert tr.clipped == dense.clipped > 0
    x[5, 1] = np.nan
    with pytest.raises(DataError, match="row 5"):
        transform(fs, x, layout="csr")
    with pytest.raises(DataError, match="row 15"):
        tr.csr_rows(x, data, indices, counts, row0=10)
    with pytest.raises(ValueError, match="must hold"):
        tr.csr_rows(rows(d, 30), data[:10], indices, counts)


def test_columns_not_in_level_vector_order_keep_the_dense_path():
    """A set whose columns are permuted (not in its level vectors' order) cannot be written row
    by row in column order: it takes the dense path, with the same values."""
    d = 3
    fs = eof.sample(skeleton("brownian", d), level=3)
    x = rows(d, 40)
    ref = transform(fs, x, layout="dense")
    perm = np.random.default_rng(0).permutation(fs.columns)
    fs.eof = eof.Columns(fs.eof.meta, fs.eof.level[perm], fs.eof.index[perm])
    assert not eof.Transformer(fs).direct_csr
    z = transform(fs, x, layout="csr", chunk_rows=7)
    assert np.array_equal(z.toarray(), ref[:, perm])


def test_the_factor_loop_is_the_per_level_factor_bit_for_bit():
    """:func:`rfsgen.eof._row_factors` (one expm1 fewer per pinned laplace level) against
    :func:`rfsgen.eof._factor_any` per value: cells and bits, extreme and grid-point values,
    scales from 1e-100 to 1e100, levels to 51."""
    rng = np.random.default_rng(5)
    extreme = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 0.5, 0.25, 0.75, 2.0**-60, 1 - 2.0**-53, 5e-324, 3.0])
    for kernel in (0, 1):
        for free in (False, True):
            for top in (1, 2, 3, 5, 51):
                d, m = 8, 60
                s = rng.choice([1e-100, 1e-5, 0.3, 1.0, 7.0, 300.0, 1e5, 1e100], d)
                mult = rng.choice([1.0, 2.0**40, 0.5], d)
                u = np.where(rng.random((m, d)) < 0.3, rng.choice(extreme, (m, d)), rng.random((m, d)))
                u[:20] = rng.integers(0, 2**min(top, 20) + 1, (20, d)) / 2.0**min(top, 20)
                n1, n2, edge = (np.zeros((d, top + 1)) for _ in range(3))
                for j in range(d):
                    for lv in range(1, top + 1):
                        n1[j, lv], n2[j, lv] = eof._norms_any(kernel, free, s[j], lv)
                        edge[j, lv] = eof._edge(kernel, free, s[j], lv)
                cell, val = np.zeros((d, top + 1), np.int64), np.zeros((d, top + 1))
                for r in range(m):
                    eof._row_factors(kernel, free, s, u, r, top, n1, n2, edge, mult, cell, val)
                    for j in range(d):
                        for lv in range(1, top + 1):
                            c, v = eof._factor_any(kernel, free, s[j], u[r, j], lv, n1[j, lv], n2[j, lv])
                            assert c == cell[j, lv]
                            assert np.float64(v * mult[j]).tobytes() == np.float64(val[j, lv]).tobytes()


def test_rows_of_unknown_count_stream_through_the_direct_path(tmp_path):
    """Text rows (their count unknown until read) in memory: the streamed CSR pieces, the same
    arrays as the dense path's."""
    d = 3
    fs = eof.sample(skeleton("laplace", d, "free"), level=4)
    x = rows(d, 50)
    np.savetxt(tmp_path / "x.csv", x, delimiter=",")
    ref = dense_reference(fs, np.loadtxt(tmp_path / "x.csv", delimiter=","), np.dtype(np.float32))
    for chunk_rows in (1, 7, 64):
        z = transform(fs, str(tmp_path / "x.csv"), layout="csr", chunk_rows=chunk_rows)
        assert z.data.tobytes() == ref[0].tobytes()
        assert np.array_equal(z.indices, ref[1]) and np.array_equal(z.indptr, ref[2])

"""rfsgen.paths: CSR rows through the gaussian and laplace angle loop without densifying them
(Transformer._source_sparse, rfsgen._sincos32.phases_csr): the bytes of the dense path."""

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import SMALL_SKELETONS, load_shipped, skeleton_path
from rfsgen import parse_skeleton, sample, transform
from rfsgen._threads import using
from rfsgen.errors import DataError
from rfsgen.inputs import SparseRows, open_input
from rfsgen.paths import Transformer

MIXED = """
rfsgen: 1
input: {width: 24}
nodes:
  - {name: g, base: gaussian, scale: 0.4, columns: "0:8"}
  - {name: h, base: gaussian, scale: 0.3, columns: "5:13"}
  - {name: s, base: sphere, scheme: coordinate, zero: uniform, columns: "13:19"}
  - {name: l, base: laplace, scale: 0.5, per: column, columns: "19:24"}
  - {name: mid, activation: tanh, inputs: [g, h, s]}
  - {name: out, activation: {name: exp, beta: 1.0}, inputs: [mid, l]}
"""

SPHERE_GAUSS = """
rfsgen: 1
input: {width: 12}
nodes:
  - {name: s, base: sphere, scheme: pair, zero: uniform, columns: "0:6"}
  - {name: g, base: gaussian, scale: 0.7, columns: "6:12"}
  - {name: out, activation: {name: exp, beta: 1.0}, inputs: [s, g]}
"""


def _skeleton(name):
    if name in ("rbf", "laplace", "mnist-conv"):
        return load_shipped(skeleton_path(name), auto_width=40)
    text = {"mixed": MIXED, "sphere-gauss": SPHERE_GAUSS}.get(name) or SMALL_SKELETONS[name]
    return parse_skeleton(text, f"{name}.yaml")


def _rows(width, n, density, seed, dtype=np.float64):
    """CSR rows with empty rows, explicit zeros, -0.0, tiny values (products that underflow
    to -0.0 in float32) and large ones."""
    rng = np.random.default_rng(seed)
    x = sp.random(n, width, density=density, format="csr", random_state=seed, dtype=np.float64)
    x.data = rng.standard_normal(x.data.size) * rng.choice([1.0, 1e-30, 1e-45, 30.0], x.data.size, p=[.85, .05, .05, .05])
    pick = rng.random(x.data.size)
    x.data[pick < 0.05] = 0.0
    x.data[(pick >= 0.05) & (pick < 0.1)] = -0.0
    x = x.astype(dtype)
    for r in (0, n // 2, n - 1):  # empty rows
        x.data[x.indptr[r]:x.indptr[r + 1]] = 0.0
    x = sp.csr_matrix((x.data, x.indices, x.indptr), shape=x.shape)
    x.eliminate_zeros() if seed % 3 == 0 else None  # some inputs with their stored zeros dropped
    return x


def _dense_of(x):
    with open_input(x) as src:
        return src.read()


def _spy(monkeypatch, module, name, calls=None):
    """Replace ``module.name`` by a wrapper that appends each call's result (whether the
    path applied) to the returned list (``calls``, if given)."""
    calls = [] if calls is None else calls
    real = getattr(module, name)

    def spy(*a, **k):
        ok = real(*a, **k)
        calls.append(ok)
        return ok

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.fixture
def counted(monkeypatch):
    """Counts the chunks that took the CSR angle loop (a silent fall back to dense fails)."""
    import rfsgen.paths as paths

    return _spy(monkeypatch, paths, "csr_phases")


@pytest.mark.parametrize("name", ["rbf", "laplace", "mnist-conv", "mixed", "sphere-gauss", "gauss-laplace"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_csr_rows_give_the_dense_bytes(name, dtype, counted):
    skel = _skeleton(name)
    fs = sample(skel, 256, seed=3)
    assert Transformer(fs).reads_sparse
    n = 24 if name == "mnist-conv" else 40
    for seed, density in ((1, 0.3), (2, 0.05), (3, 0.6)):
        x = _rows(skel.width, n, density, seed, np.float32 if seed == 2 else np.float64)
        want = transform(fs, _dense_of(x), layout="dense", dtype=dtype)
        for chunk_rows in (1, 7, 64):
            for threads in (1, 2):
                with using(min(threads, _most())):
                    got = transform(fs, x, layout="dense", dtype=dtype, chunk_rows=chunk_rows)
                assert got.tobytes() == want.tobytes(), (seed, chunk_rows, threads)
        got = transform(fs, x, layout="csr", dtype=dtype)
        assert got.toarray().tobytes() == transform(fs, _dense_of(x), layout="csr", dtype=dtype).toarray().tobytes()
    assert counted and all(counted)


def _most():
    from rfsgen._threads import most

    return most()


def test_unsorted_and_duplicate_indices_add_up_as_the_dense_chunk(counted):
    skel = load_shipped(skeleton_path("rbf"), auto_width=6)
    fs = sample(skel, 128, seed=1)
    # row 0: unsorted; row 1: a duplicate (0.5 + -0.5 = +0.0) and -0.0; row 2: empty; row 3: duplicates
    indptr = np.array([0, 3, 7, 7, 10])
    indices = np.array([4, 1, 2, 3, 3, 0, 5, 2, 2, 1])
    data = np.array([1.5, -2.0, 0.25, 0.5, -0.5, -0.0, 3.0, 1e-3, 2.0, -1.0])
    x = sp.csr_matrix((data, indices, indptr), shape=(4, 6))
    dense = _dense_of(x)
    assert dense[1, 3] == 0 and not np.signbit(dense[1, 3]) and dense[3, 2] == 1e-3 + 2.0
    for dtype in ("float32", "float64"):
        assert transform(fs, x, layout="dense", dtype=dtype).tobytes() == \
            transform(fs, dense, layout="dense", dtype=dtype).tobytes()
    coo = sp.coo_matrix((data, (np.repeat(np.arange(4), np.diff(indptr)), indices)), shape=(4, 6))
    assert transform(fs, coo, layout="dense").tobytes() == transform(fs, dense, layout="dense").tobytes()
    assert counted and all(counted)


def test_non_finite_values_are_refused_as_the_dense_path_refuses_them():
    fs = sample(load_shipped(skeleton_path("rbf"), auto_width=6), 64, seed=1)
    x = sp.csr_matrix(np.array([[0, 1.0, 0, 0, 0, 0], [0, 0, 0, 2.0, np.inf, np.nan]]))
    with open_input(x) as src:
        rows = next(src.sparse_chunks(2))[1]
    assert isinstance(rows, SparseRows)
    with pytest.raises(DataError) as sparse_err:
        Transformer(fs).chunk(rows, 10, "x.npz")
    with pytest.raises(DataError) as dense_err:
        Transformer(fs).chunk(x.toarray(), 10, "x.npz")
    assert str(sparse_err.value) == str(dense_err.value)
    assert "row 11, column 4" in str(sparse_err.value)


def test_values_that_could_overflow_an_angle_take_the_dense_path(counted):
    fs = sample(load_shipped(skeleton_path("rbf"), auto_width=6), 64, seed=1)
    x = sp.csr_matrix(np.array([[0, 1.0, 0, 0, 0, 0], [0, 0, 0, 1e36, 0, 0], [3e38, 0, 0, 0, 0, 1.0]]))
    assert transform(fs, x, layout="dense").tobytes() == transform(fs, x.toarray(), layout="dense").tobytes()
    assert counted == [False]


def test_sparse_rows_toarray_and_canonical_form():
    ptr = np.array([0, 2, 2, 5])
    cols = np.array([3, 0, 1, 1, 4])
    vals = np.array([1.0, -0.0, 2.0, 3.0, 4.0])
    rows = SparseRows.canonical(ptr, cols, vals, np.float64, 5)
    assert rows.indptr.tolist() == [0, 2, 2, 4] and rows.indices.tolist() == [0, 3, 1, 4]
    assert rows.data.tolist() == [0.0, 1.0, 5.0, 4.0]
    assert not np.signbit(rows.data[0])  # a chunk with duplicates adds every value into +0.0
    no_dup = SparseRows.canonical(np.array([0, 2]), np.array([3, 0]), np.array([1.0, -0.0]), np.float64, 5)
    assert no_dup.indices.tolist() == [0, 3] and np.signbit(no_dup.data[0])
    assert rows.toarray([2, 0]).tolist() == [[0, 5.0, 0, 0, 4.0], [0, 0, 0, 1.0, 0]]


def test_transform_file_reads_csr_rows_sparse(tmp_path, counted):
    import h5py

    from rfsgen import save_features
    from rfsgen.transform import transform_file

    fs = sample(load_shipped(skeleton_path("rbf"), auto_width=30), 96, seed=2)
    save_features(fs, tmp_path / "f.h5")
    x = _rows(30, 50, 0.2, 4)
    sp.save_npz(tmp_path / "x.npz", x)
    np.save(tmp_path / "x.npy", _dense_of(x))
    for layout in ("dense", "csr"):
        transform_file(tmp_path / "f.h5", tmp_path / "x.npz", tmp_path / f"a-{layout}.h5", layout=layout, chunk_rows=9)
        transform_file(tmp_path / "f.h5", tmp_path / "x.npy", tmp_path / f"b-{layout}.h5", layout=layout, chunk_rows=9)
        with h5py.File(tmp_path / f"a-{layout}.h5") as a, h5py.File(tmp_path / f"b-{layout}.h5") as b:
            for key in ("X",) if layout == "dense" else ("X/data", "X/indices", "X/indptr"):
                assert a[key][...].tobytes() == b[key][...].tobytes()
    assert counted and all(counted)


@pytest.mark.parametrize("D", [1, 17, 100, 20_000])
def test_csr_rows_any_number_of_atoms(D, counted):
    """Atom counts off the 64- and 16-atom tiles, and enough atoms (20,000) that one thread's
    rows are summed in several groups (rfsgen._sincos32.CSR_ACC)."""
    fs = sample(load_shipped(skeleton_path("laplace"), auto_width=300), D, seed=5)
    x = _rows(300, 130, 0.1, 7)
    want = transform(fs, _dense_of(x), layout="dense")
    with using(1):
        assert transform(fs, x, layout="dense", chunk_rows=130).tobytes() == want.tobytes()
    assert transform(fs, x, layout="dense", chunk_rows=50).tobytes() == want.tobytes()
    assert counted and all(counted)


@pytest.mark.parametrize("width", [1023, 1024, 1025, 3000])
def test_csr_rows_wider_than_a_column_run(width, counted):
    """Nodes wider than rfsgen._sincos32.CSR_COLS: each tile's sums run over the columns in
    runs, continued exactly from the float32 partial sums: still the dense bytes."""
    fs = sample(load_shipped(skeleton_path("rbf"), auto_width=width), 150, seed=6)
    x = _rows(width, 40, 0.05, 8)
    # a few rows with values right at the run boundaries
    x = sp.csr_matrix(x.toarray() + sp.csr_matrix(([1.25, -3.5, 2.0, 0.75], ([1, 1, 2, 3], [1023 % width, 1024 % width,
                                                                                           width - 1, 0])),
                                                       shape=(40, width)).toarray())
    want = transform(fs, _dense_of(x), layout="dense", dtype="float64")
    for chunk_rows in (3, 40):
        assert transform(fs, x, layout="dense", dtype="float64", chunk_rows=chunk_rows).tobytes() == want.tobytes()
    assert counted and all(counted)


# ---------------------------------------------------------------- columns straight from the angles
@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the chunks written straight from the angles (rfsgen.bases.fused_gathered from
    the rows' columns, fused_values from a prepared group)."""
    import rfsgen.bases as bases

    return _spy(monkeypatch, bases, "fused_values", _spy(monkeypatch, bases, "fused_gathered"))


def _fused_rows(width, n, seed):
    """Dense rows with zero rows, -0.0, angles beyond the fast range (|theta| > 8.2e5) and
    a row that could overflow a float32 angle (the scaled redo)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, width)) * rng.choice([1.0, 3.0, 1e-30], (n, 1))
    x[0] = 0.0
    x[1, ::2] = -0.0
    x[2] *= 1e6  # beyond the fast range: the Payne-Hanek redo
    return x


def _both(fs, x, monkeypatch, **kw):
    import rfsgen.paths as paths

    monkeypatch.setattr(paths, "FUSED", True)
    got = transform(fs, x, layout="dense", **kw)
    monkeypatch.setattr(paths, "FUSED", False)
    want = transform(fs, x, layout="dense", **kw)
    monkeypatch.setattr(paths, "FUSED", True)
    return got, want


@pytest.mark.parametrize("name", ["rbf", "laplace", "mnist-conv"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_columns_give_the_product_loops_bytes(name, dtype, monkeypatch, fused_calls):
    skel = _skeleton(name)
    fs = sample(skel, 300, seed=5)
    # mnist-conv: columns of several factors, the product loop
    assert Transformer(fs, np.dtype(dtype)).fused == (name != "mnist-conv")
    n = 24 if name == "mnist-conv" else 45
    x = _fused_rows(skel.width, n, 1)
    for chunk_rows in (1, 7, 64):
        for threads in (1, 2):
            with using(min(threads, _most())):
                got, want = _both(fs, x, monkeypatch, dtype=dtype, chunk_rows=chunk_rows)
            assert got.tobytes() == want.tobytes(), (chunk_rows, threads)
    got, want = _both(fs, x.astype(np.float32), monkeypatch, dtype=dtype, chunk_rows=7)  # float32 rows
    assert got.tobytes() == want.tobytes()
    if name != "mnist-conv":
        assert any(fused_calls)
        big = np.abs(np.asarray(Transformer(fs).fs.omega)).max() * 1e6
        assert big > 8.2e5  # row 2 reaches the slow range


def _declined(fs, w, calls, monkeypatch):
    """Rows ``w`` wide that a fast path must decline, each giving the other path's bytes:
    an angle that could overflow float32 (the scaled float64 redo) and mostly zeros over a
    single node (the CSR rows' loop).  ``calls``: the path's spy.  Returns the generator."""
    rng = np.random.default_rng(4)
    over = rng.standard_normal((9, w))
    over[4, 3] = 1e36
    mostly_zero = np.zeros((9, w))
    mostly_zero[:, 5] = rng.standard_normal(9)
    for x in (over, mostly_zero):
        calls.clear()
        for dtype in ("float32", "float64"):
            got, want = _both(fs, x, monkeypatch, dtype=dtype, chunk_rows=64)
            assert got.tobytes() == want.tobytes()
        assert calls and not any(calls)
    return rng


@pytest.mark.parametrize("name", ["rbf", "laplace"])
def test_fused_falls_back_where_the_dense_loop_does_not_apply(name, monkeypatch, fused_calls):
    skel = _skeleton(name)
    fs = sample(skel, 100, seed=2)
    w = skel.width
    _declined(fs, w, fused_calls, monkeypatch)
    # CSR rows take the CSR loop, never the fused one
    fused_calls.clear()
    x = _rows(w, 20, 0.3, 1)
    got, want = _both(fs, x, monkeypatch, dtype="float32")
    assert got.tobytes() == want.tobytes() and not fused_calls


def test_fused_judges_zeros_on_the_first_rows_of_a_chunk(monkeypatch, fused_calls):
    """Whether a chunk's single node is mostly zeros (the CSR rows' loop) is a choice of
    speed judged on its first rfsgen.bases.SPARSE_SAMPLE rows: a chunk dense there and
    mostly zeros after them, or the reverse, gives the product loop's bytes either way."""
    import rfsgen.bases as bases

    monkeypatch.setattr(bases, "SPARSE_SAMPLE", 8)
    skel = _skeleton("rbf")
    fs = sample(skel, 64, seed=4)
    dense = _fused_rows(skel.width, 12, 3)
    sparse = np.zeros((12, skel.width))
    sparse[:, 3] = np.arange(1.0, 13.0)
    for x, fused in ((np.vstack([dense, sparse]), True), (np.vstack([sparse, dense]), False)):
        fused_calls.clear()
        got, want = _both(fs, x, monkeypatch, dtype="float32", chunk_rows=24)
        assert got.tobytes() == want.tobytes()
        assert fused_calls[0] is fused


def test_fused_columns_match_a_reference_one_operation_at_a_time():
    """Each fused value is float32(sc * cos) or float32(sc * sin) of the atom's float64
    cos/sin values (Transformer.source), one float64 multiply and one rounding."""
    skel = load_shipped(skeleton_path("rbf"), auto_width=5)
    fs = sample(skel, 40, seed=9)
    t = Transformer(fs)
    assert t.fused
    x = np.random.default_rng(3).standard_normal((11, 5))
    got = t.chunk(x)
    src = Transformer(fs).source(x)
    a = t.groups[0].gi.size
    for j in range(fs.columns):
        k = int(np.flatnonzero(t.fused_col == j)[0])
        part = src[:, a + k] if t.fused_imag[k] else src[:, k]
        assert (t.fused_sc[k] * part).astype(np.float32).tobytes() == got[:, j].tobytes()


@pytest.mark.parametrize("name", ["rbf", "mnist-conv"])
def test_orf_pairs_share_one_angle(name, monkeypatch, fused_calls):
    """--scheme orf's [cos, sin] pairs hold the same frequency bits: one atom serves both
    columns (half the angles), with the bytes of one atom per term (the twins switched off)
    and of the product loop; a plain node writes both columns from the fused loop."""
    import rfsgen.paths as paths

    skel = _skeleton(name)
    fs = sample(skel, 300, seed=5, scheme="orf")
    t = Transformer(fs)
    assert 2 * t.ir.size == fs.node.size
    assert t.fused == (name == "rbf") and (t.fused_second is not None if t.fused else t.phase_products)
    x = _fused_rows(skel.width, 24, 2)
    for dtype in ("float32", "float64"):
        got, want = _both(fs, x, monkeypatch, dtype=dtype, chunk_rows=7)
        assert got.tobytes() == want.tobytes()
        with monkeypatch.context() as mp:
            mp.setattr(paths, "_frequency_twins", lambda omega, node, code, cont, *_: np.where(cont, np.arange(node.size), -1))
            assert 2 * Transformer(fs).ir.size == 2 * fs.node.size
            alone = transform(fs, x, layout="dense", dtype=dtype, chunk_rows=7)
        assert got.tobytes() == alone.tobytes()
    assert any(fused_calls) == (name == "rbf")
    if name == "rbf":  # the second columns' arrays must cover every atom
        from rfsgen._sincos32 import phases_out

        col2, sc2, imag2 = t.fused_second
        for bad in ((col2[:-1], sc2, imag2), (col2, sc2[:-1], imag2), (col2.astype(np.int32), sc2, imag2)):
            with pytest.raises(ValueError, match="one entry per atom"):
                phases_out(np.zeros((8, 40), np.float32), 40, *([np.zeros(1, np.int64)] * 5), t.fused_col, t.fused_sc,
                           t.fused_imag, np.empty((8, fs.columns), np.float32), *bad)


def test_orf_atoms_are_a_view_of_the_frequencies():
    """The first frequency of each orf pair is read through a strided view of the feature
    set's frequencies (no copy kept per transformer, none made per chunk: one cached plan);
    a feature set made in memory with float32 frequencies transforms as its float64 copy."""
    import dataclasses

    import rfsgen.bases as bases

    fs = sample(_skeleton("rbf"), 300, seed=5, scheme="orf")
    t = Transformer(fs)
    codes = t.groups[0].codes
    assert np.shares_memory(codes, fs.omega) and not codes.flags.c_contiguous
    x = _fused_rows(40, 30, 4)
    plans = len(bases._PLANS)
    t.chunk(x[:10])
    t.chunk(x[10:])
    assert len(bases._PLANS) <= plans + 1
    fs32 = dataclasses.replace(fs, omega=fs.omega.astype(np.float32))
    want = dataclasses.replace(fs, omega=fs.omega.astype(np.float32).astype(np.float64))
    got = transform(fs32, x, layout="dense")
    assert got.tobytes() == transform(want, x, layout="dense").tobytes()


def test_the_fused_loops_refuse_arrays_they_cannot_index():
    """phases_out and gather_columns32 check their rows, output and columns before any
    compiled loop reads them."""
    from rfsgen._compiled import gather_columns32
    from rfsgen._sincos32 import phases_out
    from rfsgen.bases import _phase_plan

    fs = sample(_skeleton("rbf"), 64, seed=5)
    t = Transformer(fs)
    plan = _phase_plan(t.groups[0].gi, t.groups[0].codes, 1.0)
    blocks = (plan.starts, plan.ends, plan.nodes, plan.tile0, plan.pan, t.fused_col, t.fused_sc, t.fused_imag)
    with pytest.raises(ValueError, match="out C-ordered with at least m rows"):
        phases_out(np.ones((16, 40), np.float32), 40, *blocks, np.empty((8, 64), np.float32))
    with pytest.raises(ValueError, match="the blocks must read within"):  # rows narrower than the node
        phases_out(np.ones((16, 20), np.float32), 40, *blocks, np.empty((16, 64), np.float32))
    a = t.fused_col.size
    for bad in (64, -7, 2**63 - 1):  # past out (2^63 - 1 + 32 would wrap a run's end), below -1
        col = np.arange(a, dtype=np.int64)
        col[5] = bad
        with pytest.raises(ValueError, match="distinct columns of out"):
            phases_out(np.ones((16, 40), np.float32), 40, *blocks[:5], col, t.fused_sc, t.fused_imag,
                       np.empty((16, 64), np.float32))
    twice = np.arange(a, dtype=np.int64) % 32  # two atoms in one column: their order would follow the threads
    second = (np.where(np.arange(a) == 3, 40, -1).astype(np.int64), t.fused_sc, t.fused_imag)
    for col, more in ((twice, ()), (np.arange(a, dtype=np.int64), second)):
        with pytest.raises(ValueError, match="distinct columns of out"):
            phases_out(np.ones((16, 40), np.float32), 40, *blocks[:5], col, t.fused_sc, t.fused_imag,
                       np.empty((16, 64), np.float32), *more)
    x = np.ones((4, 10))
    for cols in (np.array([0, 10]), np.array([-1, 3])):
        with pytest.raises(ValueError, match="cols and ucols must lie in"):
            gather_columns32(x, cols, np.unique(cols), np.empty((4, 2), np.float32), np.empty(4))
    with pytest.raises(ValueError, match="out and top hold every row"):
        gather_columns32(x, np.array([0, 1]), np.array([0, 1]), np.empty((3, 2), np.float32), np.empty(4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fused_store_puts_each_atom_in_its_own_column(dtype):
    """phases_out writes a tile's rows whole where its atoms' columns are one run and
    value by value otherwise: both give each atom's column float(sc * cos or sin), -1
    columns nothing, whatever the order of the columns (identity, reversed, a run broken
    by one swap, a tile partly without columns) and rows (partial row tiles, the slow
    range's redo)."""
    from rfsgen._sincos32 import phases_out
    from rfsgen.bases import _phase_plan

    fs = sample(_skeleton("rbf"), 80, seed=5)  # 80 atoms: two full tiles and a partial one
    t = Transformer(fs)
    scale = fs.skeleton.input_groups[0][0].param("scale")
    plan = _phase_plan(t.groups[0].gi, t.groups[0].codes, scale)
    blocks = (plan.starts, plan.ends, plan.nodes, plan.tile0, plan.pan)
    x = _fused_rows(40, 11, 6).astype(np.float32)
    a = plan.order.size
    sc, imag = t.fused_sc, t.fused_imag
    ident = np.zeros((x.shape[0], a), dtype)
    phases_out(x, 40, *blocks, np.arange(a, dtype=np.int64), sc, imag, ident)
    # the product loop's bytes (test_fused_columns_match_a_reference_one_operation_at_a_time
    # ties those to float(sc * cos) or float(sc * sin) of each angle)
    assert plan.in_order
    slow = Transformer(fs, dtype)
    slow.fused = False
    assert ident.tobytes() == slow.chunk(x)[:, t.fused_col].tobytes()
    rng = np.random.default_rng(1)
    swap = np.arange(a, dtype=np.int64)
    swap[[5, 6]] = swap[[6, 5]]
    holes = np.arange(a, dtype=np.int64)
    holes[40:44] = -1
    for col in (np.arange(a)[::-1].copy(), swap, rng.permutation(a).astype(np.int64), holes):
        out = np.full((x.shape[0], a), 7.0, dtype)
        phases_out(x, 40, *blocks, col, sc, imag, out)
        kept = col >= 0
        assert out[:, col[kept]].tobytes() == ident[:, kept].tobytes()
        assert (out[:, ~np.isin(np.arange(a), col)] == 7.0).all()
    # a second column per atom (orf), some atoms without one
    col2 = np.where(np.arange(a) % 3 == 0, -1, a + np.arange(a)).astype(np.int64)
    out = np.full((x.shape[0], 2 * a), 7.0, dtype)
    phases_out(x, 40, *blocks, np.arange(a, dtype=np.int64), sc, imag, out, col2, -sc, ~imag)
    assert out[:, :a].tobytes() == ident.tobytes()
    flip = np.zeros_like(ident)
    phases_out(x, 40, *blocks, np.arange(a, dtype=np.int64), -sc, ~imag, flip)
    has = col2 >= 0
    assert out[:, col2[has]].tobytes() == flip[:, has].tobytes()
    assert (out[:, a + np.flatnonzero(~has)] == 7.0).all()


def test_the_fused_loop_shares_a_chunk_by_rows_or_blocks_alike():
    """out_parts covers a chunk's rows x blocks of atoms exactly once, by rows where each
    thread gets SPLIT_ROWS rows or more (or one block), else by blocks first; every way of
    sharing gives the bytes of one part and of the product loop (three blocks of atoms,
    parts run one after another: no second core needed)."""
    from rfsgen._sincos32 import ROWS, SPLIT_ROWS, _phases_out_part, out_parts
    from rfsgen.bases import _phase_plan

    for m in (0, 1, 7, 8, 100, 255, 256, 2000):
        for nb in (0, 1, 2, 6, 13):
            for n in (1, 2, 3, 16):
                parts = out_parts(m, nb, n)
                assert parts.shape[1] == 4 and len(parts) <= n
                cover = np.zeros((m, nb), np.int64)
                for b0, b1, r0, r1 in parts:
                    assert 0 <= b0 < b1 <= nb and 0 <= r0 < r1 <= m and r0 % ROWS == 0
                    cover[r0:r1, b0:b1] += 1
                assert (cover == 1).all()
                if m >= n * SPLIT_ROWS or nb < 2:
                    assert all(b0 == 0 and b1 == nb for b0, b1, _, _ in parts)
    skel = parse_skeleton("rfsgen: 1\ninput: {width: 300}\nnodes:\n  - {name: x, base: gaussian, scale: 0.05}\n"
                          "output: x\n", "wide.yaml")
    fs = sample(skel, 1700, seed=3)
    t = Transformer(fs)
    plan = _phase_plan(t.groups[0].gi, t.groups[0].codes, 0.05)
    assert plan.in_order and plan.starts.size == 3
    x = _fused_rows(300, 21, 7).astype(np.float32)
    a = plan.order.size
    args = (x, 300, plan.starts, plan.ends, plan.nodes, plan.tile0, plan.pan, t.fused_col, t.fused_sc, t.fused_imag)
    second = (np.full(a, -1, np.int64), np.zeros(a), np.zeros(a, np.bool_))
    one = np.full((21, a), 7.0, np.float32)
    _phases_out_part(*args, one, *second, out_parts(21, 3, 1), 0, 1)
    slow = Transformer(fs)
    slow.fused = False
    assert one.tobytes() == slow.chunk(x)[:, t.fused_col].tobytes()
    for n in (2, 3, 5):
        parts = out_parts(21, 3, n)
        assert len(parts) > 1 and (parts[:, 1] - parts[:, 0] < 3).any()  # by blocks
        got = np.full((21, a), 7.0, np.float32)
        _phases_out_part(*args, got, *second, parts, 0, len(parts))
        assert got.tobytes() == one.tobytes(), n


def test_narrow_nodes_take_fewer_rows_a_pass(monkeypatch):
    """A cache block of width-1 atoms holds 196,608 of them: its row blocks shrink so that
    their angles stay within PART_VALUES, down to one register tile of rows; several
    passes over the rows give the product loop's bytes."""
    from rfsgen._sincos32 import PART_VALUES, ROW_BLOCK, ROWS, TILE, _row_block

    assert _row_block(24) == ROW_BLOCK and _row_block(6144) == ROWS and _row_block(0) == ROW_BLOCK
    skel = parse_skeleton("rfsgen: 1\ninput: {width: 1}\nnodes:\n  - {name: x, base: gaussian}\noutput: x\n",
                          "narrow.yaml")
    fs = sample(skel, 20000, seed=2)
    t = Transformer(fs)
    assert t.fused
    tiles = -(-t.groups[0].gi.size // TILE)
    assert _row_block(tiles) * tiles * TILE <= PART_VALUES and _row_block(tiles) < 50
    x = _fused_rows(1, 50, 8)
    got, want = _both(fs, x, monkeypatch, chunk_rows=50)
    assert got.tobytes() == want.tobytes()


def test_frequency_twins_need_the_same_node_and_bits():
    """Twins are the same bits at the same node: equal rows at two nodes, rows one ulp or a
    sign of zero apart, and rows that hash alike (the same first four values) but differ
    further on stay apart; integer terms are not frequencies (-1)."""
    from rfsgen.paths import _frequency_twins

    skel = parse_skeleton("rfsgen: 1\ninput: {width: 12}\nnodes:\n  - {name: a, base: gaussian, columns: '0:6'}\n"
                          "  - {name: b, base: gaussian, columns: '6:12'}\n  - {name: c, activation: relu, "
                          "inputs: [a, b]}\noutput: c\n", "t.yaml")
    base = np.arange(1.0, 7.0)
    rows = np.array([base, base, base, base, base, base, base, base])
    rows[2, 5] = np.nextafter(6.0, 7.0)  # one ulp apart, same hash
    rows[3, 0] = 0.0
    rows[4, 0] = -0.0  # a sign of zero apart from row 3
    rows[6, 4] = 9.0  # the same first four values: the same hash, other bits
    node = np.array([0, 0, 0, 0, 0, 1, 0, 0, 2])
    code = np.concatenate([np.arange(8) * 6, [99]])
    omega = np.concatenate([rows.ravel(), [0.0] * 70])
    group_of = np.array([0, 0, -1])
    twin = _frequency_twins(omega, node, code, np.array([True] * 8 + [False]), group_of, skel)
    assert twin.tolist() == [0, 0, 2, 3, 4, 5, 6, 0, -1]


# ---------------------------------------------------------------- angles and products in one pass
RELU_GAUSS = """
rfsgen: 1
input: {width: 14}
nodes:
  - {name: g, base: gaussian, scale: 0.6, columns: "1:11"}
  - {name: out, activation: {name: polynomial, degree: 3, c: 1}, inputs: [g]}
"""

PATCH_LAPLACE = """
rfsgen: 1
input: {shape: [6, 6, 1]}
nodes:
  - {name: p, base: laplace, scale: 0.5, per: patch, patch: {size: 3, stride: 1}}
  - {name: b, activation: {name: exp, beta: 1.0}, conv: {size: 2, stride: 2}}
  - {name: out, activation: relu, dense: true}
"""


@pytest.fixture
def one_pass_calls(monkeypatch):
    """Counts the chunks whose angles and products ran in one pass (rfsgen.bases.gathered_columns)."""
    import rfsgen.paths as paths

    return _spy(monkeypatch, paths, "gathered_columns")


def _one_pass_skeleton(name):
    text = {"relu-gauss": RELU_GAUSS, "patch-laplace": PATCH_LAPLACE}.get(name)
    return parse_skeleton(text, f"{name}.yaml") if text else _skeleton(name)


@pytest.mark.parametrize("name", ["mnist-conv", "relu-gauss", "patch-laplace"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rows", ["float32", "float64"])
def test_angles_and_products_in_one_pass_give_the_two_passes_bytes(name, dtype, rows, monkeypatch, one_pass_calls):
    """Rows with zero rows, -0.0, tiny values and angles beyond the fast range (the
    Payne-Hanek redo), in chunks that end inside a tile of 8 rows, on 1 and 2 threads,
    float32 and float64 rows (rounded to float32 in place of the gather): the bytes of
    the angle loop followed by the product loop (FUSED False)."""
    skel = _one_pass_skeleton(name)
    fs = sample(skel, 300, seed=5)
    t = Transformer(fs, np.dtype(dtype))
    assert t.phase_products and not t.fused
    n = 21 if name == "mnist-conv" else 45
    x = _fused_rows(skel.width, n, 1).astype(rows)
    for chunk_rows in (1, 7, 64):
        for threads in (1, 2):
            one_pass_calls.clear()
            with using(min(threads, _most())):
                got, want = _both(fs, x, monkeypatch, dtype=dtype, chunk_rows=chunk_rows)
            assert got.tobytes() == want.tobytes(), (chunk_rows, threads)
            # (a single node's zero row alone in its chunk takes the CSR rows' loop)
            assert one_pass_calls and all(one_pass_calls[1:]) and (one_pass_calls[0] or name == "relu-gauss")


@pytest.mark.parametrize("groups, limit", [(1, 1 << 30), (3, 1 << 30), (8, 1 << 30), (8, 1)])
def test_tiles_of_rows_sharing_a_pass_over_the_frequencies_change_no_bit(groups, limit, monkeypatch, one_pass_calls):
    """The one pass computes the angles of up to ROW_GROUPS tiles of 8 rows per pass over the
    packed frequencies (fewer where GROUP_ANGLES angles would not hold them: ``limit`` 1
    leaves one): 45 rows end inside the fourth tile of rows of a pass of 3 and inside the
    sixth of a pass of 8, in chunks of 64 and 7 rows, on 1 and 2 threads; each gives the
    bytes of the two passes."""
    from rfsgen import _sincos32

    monkeypatch.setattr(_sincos32, "ROW_GROUPS", groups)
    monkeypatch.setattr(_sincos32, "GROUP_ANGLES", limit)
    skel = _one_pass_skeleton("mnist-conv")
    fs = sample(skel, 300, seed=6)
    x = _fused_rows(skel.width, 45, 2).astype(np.float32)
    for chunk_rows in (64, 7):
        for threads in (1, 2):
            one_pass_calls.clear()
            with using(min(threads, _most())):
                got, want = _both(fs, x, monkeypatch, dtype="float32", chunk_rows=chunk_rows)
            assert got.tobytes() == want.tobytes(), (chunk_rows, threads)
            assert one_pass_calls and all(one_pass_calls[1:])


def test_one_pass_falls_back_where_the_dense_loop_does_not_apply(monkeypatch, one_pass_calls):
    """A row whose angles could overflow float32 (the scaled float64 redo) and rows mostly
    zeros over a single node (the CSR rows' loop) take the two passes; a value beyond
    float32 in a column the group never reads does not stop the one pass."""
    fs = sample(_one_pass_skeleton("relu-gauss"), 200, seed=3)
    rng = _declined(fs, 14, one_pass_calls, monkeypatch)
    outside = rng.standard_normal((9, 14))
    outside[:, 0] = 1e300  # column 0 is not the node's: rounded to inf in float32, never read
    outside[:, 13] = -1e300
    one_pass_calls.clear()
    got, want = _both(fs, outside, monkeypatch, dtype="float64", chunk_rows=64)
    assert got.tobytes() == want.tobytes() and one_pass_calls == [True]
    # CSR rows take the CSR loop
    one_pass_calls.clear()
    got, want = _both(fs, _rows(14, 20, 0.3, 1), monkeypatch, dtype="float32")
    assert got.tobytes() == want.tobytes() and not one_pass_calls


def test_one_pass_only_for_one_gaussian_or_laplace_group_on_the_cpu():
    """Other atoms (a sphere group, two groups), plain random Fourier features (written
    straight from the angles) and the GPU keep their own paths."""
    for name, want in (("sphere-gauss", False), ("mixed", False), ("gauss-laplace", False), ("rbf", False),
                       ("mnist-conv", True), ("relu-gauss", True)):
        assert Transformer(sample(_one_pass_skeleton(name), 100, seed=1)).phase_products is want, name
    fs = sample(_one_pass_skeleton("relu-gauss"), 100, seed=1)
    assert not Transformer(fs, device="cuda").phase_products


def test_phase_columns_refuses_reads_outside_its_arrays():
    from rfsgen._sincos32 import phase_columns
    from rfsgen.bases import _phase_plan

    fs = sample(_one_pass_skeleton("relu-gauss"), 50, seed=1)
    t = Transformer(fs)
    ga = t.groups[0]
    plan = _phase_plan(ga.gi, np.ascontiguousarray(ga.codes, dtype=np.float64), 0.6)
    x = np.zeros((8, 14), np.float32)
    out = np.empty((8, fs.columns), np.float32)
    static = (t.xatom, t.xpow, t.fidx, t.fptr, t.sc, t.imag, t.pos, t.real)
    cols = np.arange(1, 11, dtype=np.int64)

    def call(x=x, cols=cols, n_atoms=plan.order.size, w=10, tiles=plan.pan, tile0=plan.tile0, ends=plan.ends,
             static=static, out=out):
        phase_columns(x, cols, w, plan.starts, ends, plan.nodes, tile0, tiles, n_atoms, *static, out)

    call()
    xatom, xpow, fidx, fptr, sc, imag, pos, real = static
    wide = np.arange(1, 21, dtype=np.int64)
    for bad in (dict(cols=cols + 4), dict(cols=cols - 2), dict(cols=cols[:9], w=10), dict(n_atoms=3),
                dict(x=x.astype(np.float64)), dict(cols=cols.astype(np.int32)),
                dict(cols=wide[::2]),  # in range, but not contiguous
                dict(out=out[:5]), dict(out=np.empty((8, fs.columns + 1), np.float32)),
                dict(tiles=np.ascontiguousarray(plan.pan[:, :, :16])), dict(tiles=plan.pan[:-1]),
                dict(tile0=plan.tile0 + 1), dict(ends=plan.ends + 40), dict(w=0),
                dict(static=(xatom, xpow, fidx + 1000, fptr, sc, imag, pos, real)),
                dict(static=(xatom, xpow, fidx, fptr[::-1].copy(), sc, imag, pos, real)),
                dict(static=(xatom, xpow, fidx, fptr, sc, imag, pos + fs.columns, real)),
                dict(static=(xatom, xpow, fidx, fptr, sc[:-1], imag, pos, real))):
        with pytest.raises(ValueError):
            call(**bad)


def test_the_product_loop_refuses_reads_outside_its_arrays():
    from rfsgen._compiled import columns

    fs = sample(_one_pass_skeleton("relu-gauss"), 50, seed=1)
    t = Transformer(fs)
    src = t.source(np.zeros((8, 14)))
    out = np.empty((8, fs.columns), np.float32)

    def call(src=src, ir=t.ir, ii=t.ii, fidx=t.fidx, pos=t.pos, out=out):
        columns(src, ir, t.cr, ii, t.ci, t.xatom, t.xpow, fidx, t.fptr, t.sc, t.imag, pos, out, t.real)

    call()
    for bad in (dict(ir=t.ir + src.shape[1]), dict(ii=t.ii + src.shape[1]), dict(ii=np.full_like(t.ii, -7)),
                dict(fidx=t.fidx + t.ir.size), dict(pos=t.pos - 1), dict(out=out[:4]),
                dict(src=np.asfortranarray(src))):
        with pytest.raises(ValueError):
            call(**bad)

import io
from pathlib import Path

import h5py
import numpy as np
import pytest

from rfsgen import DataError, InputError, UsageError
from rfsgen.inputs import open_input, parse_rows


@pytest.fixture
def table():
    return np.arange(30, dtype=np.float64).reshape(10, 3) / 7


def read(spec, **kw):
    with open_input(spec, **kw) as src:
        return src.read()


def test_formats_agree(tmp_path, table):
    np.save(tmp_path / "a.npy", table)
    np.savez(tmp_path / "b.npz", rows=table, other=table[:2])
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("grp/rows", data=table)
    np.savetxt(tmp_path / "d.csv", table, delimiter=",", header="a,b,c", comments="")
    np.savetxt(tmp_path / "e.tsv", table, delimiter="\t")
    for spec in ("a.npy", "b.npz:rows", "c.h5:/grp/rows", "c.h5", "d.csv", "e.tsv"):
        np.testing.assert_allclose(read(tmp_path / spec if ":" not in spec else f"{tmp_path}/{spec}"), table, rtol=1e-15)


def test_images_are_flattened_and_chunks_cover_rows(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 255, (7, 4, 4, 3)).astype(np.uint8)
    np.save(tmp_path / "i.npy", imgs)
    with open_input(tmp_path / "i.npy") as src:
        assert src.width == 48 and src.n_rows == 7
        chunks = list(src.chunks(3, 1, 6))
    assert [r for r, _ in chunks] == [1, 4]
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), imgs.reshape(7, -1)[1:6])


def test_stdin_npy_and_csv(table):
    buf = io.BytesIO()
    np.save(buf, table)
    got = read("-", stdin=io.BufferedReader(io.BytesIO(buf.getvalue())))
    np.testing.assert_array_equal(got, table)
    text = "\n".join(",".join(str(float(v)) for v in r) for r in table).encode()
    np.testing.assert_array_equal(read("-", stdin=io.BufferedReader(io.BytesIO(text))), table)


def test_csv_errors(tmp_path):
    (tmp_path / "bad.csv").write_text("1,2,3\n4,x,6\n")
    with pytest.raises(DataError, match=r"bad.csv:2: column 1: 'x' is not a number"):
        read(tmp_path / "bad.csv")
    (tmp_path / "ragged.csv").write_text("1,2,3\n4,5\n")
    with pytest.raises(InputError, match=r"ragged.csv:2: has 2 fields but the first row has 3"):
        read(tmp_path / "ragged.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InputError, match="is empty"):
        read(tmp_path / "empty.csv")
    # digits grouped with underscores: Python's float() takes them, numpy's reader does not;
    # the message names the line and column all the same (and such a first line is no header)
    (tmp_path / "grouped.csv").write_text("1,2,3\n4,5,6\n7,8_0,9\n")
    with pytest.raises(DataError, match=r"grouped.csv:3: column 1: '8_0' is not a number .*; fix or drop that row$"):
        read(tmp_path / "grouped.csv")
    (tmp_path / "grouped1.csv").write_text("1_0,2_0\n3,4\n")
    with pytest.raises(DataError, match=r"grouped1.csv:1: column 0: '1_0' is not a number \(read as comma-separated, "
                                        r"no header line\)"):
        read(tmp_path / "grouped1.csv")


def test_open_errors(tmp_path, table):
    np.savez(tmp_path / "b.npz", rows=table, other=table)
    with pytest.raises(InputError, match="holds 2 arrays \\(rows, other\\); choose one"):
        read(tmp_path / "b.npz")
    with pytest.raises(InputError, match="has no array 'nope' \\(available: rows, other\\)"):
        read(f"{tmp_path}/b.npz:nope")
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("x", data=table)
    with pytest.raises(InputError, match="has no dataset or CSR group '/y' \\(available: /x\\)"):
        read(f"{tmp_path}/c.h5:/y")
    with pytest.raises(InputError, match="no such input file"):
        read(tmp_path / "missing.npy")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(InputError, match="not a readable .npy"):
        read(tmp_path / "junk.npy")
    (tmp_path / "x.parquet").write_bytes(b"")
    with pytest.raises(InputError, match="unknown input format '.parquet'"):
        read(tmp_path / "x.parquet")


def test_parse_rows():
    assert parse_rows("10:20") == (10, 20)
    assert parse_rows(":5") == (0, 5)
    assert parse_rows("7:") == (7, None)
    with pytest.raises(UsageError):
        parse_rows("a:b")
    with pytest.raises(UsageError):
        parse_rows("9:3")


def test_in_memory_inputs_work_or_say_what_is_accepted(table):
    import scipy.sparse as sp

    from rfsgen import InputError

    with open_input(table.tolist()) as src:  # a list of rows
        np.testing.assert_array_equal(src.read(), table)
    with open_input(tuple(map(tuple, table))) as src:
        np.testing.assert_array_equal(src.read(), table)
    for fmt in ("csr", "csc", "coo"):
        with open_input(sp.random(7, 5, density=0.4, format=fmt, random_state=1)) as src:
            assert src.n_rows == 7 and src.width == 5
            np.testing.assert_array_equal(src.read(), sp.random(7, 5, density=0.4, format="csr", random_state=1).toarray())
    with pytest.raises(InputError, match=r"1-D array of 4 values is ambiguous: .*reshape\(1, -1\)"):
        open_input(np.arange(4.0))
    with pytest.raises(InputError, match="cannot read rows from a dict"):
        open_input({"a": 1})
    with pytest.raises(InputError, match="ragged or not numbers"):
        open_input([[1, 2], [3]])
    with pytest.raises(InputError, match="holds booleans"):
        open_input(np.ones((2, 3), dtype=bool))


def test_sparse_and_list_inputs_transform_like_dense(table):
    import scipy.sparse as sp

    from rfsgen import parse_skeleton, sample, transform

    s = parse_skeleton("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: c, base: circle, per: column}\n"
                       "  - {name: o, activation: relu, inputs: [c]}\n")
    fs = sample(s, 50, seed=1)
    dense = transform(fs, table, layout="dense")
    assert transform(fs, sp.csr_matrix(table), layout="dense").tobytes() == dense.tobytes()
    assert transform(fs, table.tolist(), layout="dense").tobytes() == dense.tobytes()


def test_dense_rows_in_memory_do_not_import_scipy_sparse():
    """Asking whether in-memory rows are a sparse matrix imports nothing: such a matrix
    exists only once scipy.sparse is imported (19 MiB of a transform's peak otherwise)."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, rfsgen\n"
            "fs = rfsgen.sample(rfsgen.parse_skeleton('rfsgen: 1\\ninput: {width: 3}\\nnodes:\\n"
            "  - {name: x, base: gaussian, scale: 1.0}\\noutput: x\\n', 's.yaml'), 16, seed=1)\n"
            "y = rfsgen.transform(fs, np.ones((4, 3), np.float32), layout='dense')\n"
            "print(y.shape, 'scipy.sparse' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["(4,", "16)", "False"]


def test_array_likes_with_slicing_are_read_in_chunks(tmp_path, table):
    import h5py

    with h5py.File(tmp_path / "t.h5", "w") as f:
        f["x"] = table
    with h5py.File(tmp_path / "t.h5", "r") as f, open_input(f["x"]) as src:  # any object with shape/dtype/slicing
        assert src.name == "<Dataset>"
        np.testing.assert_array_equal(src.read(), table)


# ----------------------------------------------------------------------------- malformed files


def test_malformed_files_are_one_line_errors(tmp_path):
    from rfsgen import InputError

    good = tmp_path / "good.npy"
    np.save(good, np.ones((3, 2)))
    raw = good.read_bytes()
    (tmp_path / "negative.npy").write_bytes(raw.replace(b"(3, 2)", b"(-3, 2)"))
    (tmp_path / "garbled.npy").write_bytes(raw.replace(b"'descr'", b"'de%cr'"))
    (tmp_path / "badtext.npy").write_bytes(raw.replace(b"{", b"[", 1))
    for name in ("negative", "garbled", "badtext"):
        with pytest.raises(InputError, match=rf"{name}.npy: not a readable .npy array .*numpy.save") as e:
            open_input(tmp_path / f"{name}.npy")
        assert "\n" not in str(e.value)
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(InputError, match="obj.npz:x: not a readable numeric array"):
        open_input(tmp_path / "obj.npz")
    (tmp_path / "c.csv").write_text("1,2\n3,4 # note\n")
    with pytest.raises(DataError, match=r"c.csv:2: column 1: '4 # note' is not a number"):
        with open_input(tmp_path / "c.csv") as src:
            src.read()


def test_bad_stdin_is_a_one_line_error():
    from rfsgen import InputError

    with pytest.raises(InputError, match="is not UTF-8 text"):
        with open_input("-", stdin=io.BufferedReader(io.BytesIO(b"1,2\n\xff\xfe,3\n"))) as src:
            src.read()
    closed = io.BufferedReader(io.BytesIO(b""))
    closed.close()
    with pytest.raises(InputError, match="standard input is closed"):
        open_input("-", stdin=closed)


# ----------------------------------------------------------------------------- atomic outputs


def _sparse_table(n=40, width=6, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, width))
    x[np.abs(x) < 0.9] = 0.0
    return x


def _chunks(spec, chunk_rows, start=0, stop=None):
    with open_input(spec) as src:
        parts = [b for _, b in src.chunks(chunk_rows, start, stop)]
        return np.concatenate(parts), src


def test_sparse_inputs_read_like_their_dense_form(tmp_path):
    """scipy.sparse in memory (every format), save_npz archives and anndata CSR groups
    give the same float64 rows as the dense array, chunk by chunk, for any chunk size."""
    import scipy.sparse as sp

    x = _sparse_table()
    sp.save_npz(tmp_path / "csr.npz", sp.csr_matrix(x))
    sp.save_npz(tmp_path / "csr-raw.npz", sp.csr_array(x), compressed=False)
    sp.save_npz(tmp_path / "csc.npz", sp.csc_matrix(x))
    sp.save_npz(tmp_path / "coo.npz", sp.coo_matrix(x))
    m = sp.csr_matrix(x)
    with h5py.File(tmp_path / "a.h5ad", "w") as f:
        g = f.create_group("X")
        g.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": [40, 6]})
        for k in ("data", "indices", "indptr"):
            g.create_dataset(k, data=getattr(m, k))
        g2 = f.create_group("layers/counts")
        g2.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": [40, 6]})
        for k in ("data", "indices", "indptr"):
            g2.create_dataset(k, data=getattr(sp.csr_matrix(2 * x), k))
    specs = [tmp_path / "csr.npz", tmp_path / "csr-raw.npz", tmp_path / "csc.npz", tmp_path / "coo.npz",
             tmp_path / "a.h5ad", f"{tmp_path}/a.h5ad:/X"]
    specs += [sp.csr_matrix(x).asformat(f) for f in ("csr", "csc", "coo", "lil", "dok", "bsr", "dia")]
    specs += [sp.csr_array(x).asformat(f) for f in ("csr", "csc", "coo")]
    for spec in specs:
        for chunk in (1, 7, 100):
            got, src = _chunks(spec, chunk)
            assert got.dtype == np.float64 and got.tobytes() == x.tobytes(), (spec, chunk)
        got, _ = _chunks(spec, 4, 9, 30)
        assert got.tobytes() == x[9:30].tobytes(), spec
    got, _ = _chunks(f"{tmp_path}/a.h5ad:/layers/counts", 5)
    assert got.tobytes() == (2 * x).tobytes()
    f32 = sp.csr_matrix(x.astype(np.float32))
    assert _chunks(f32, 8)[0].tobytes() == x.astype(np.float32).tobytes()  # float32 stays float32


def test_h5ad_row_names_and_plain_h5_csr_group(tmp_path):
    import scipy.sparse as sp

    x = _sparse_table(n=5)
    m = sp.csr_matrix(x)
    with h5py.File(tmp_path / "a.h5ad", "w") as f:
        g = f.create_group("X")
        g.attrs.update({"encoding-type": "csr_matrix", "shape": [5, 6]})
        for k in ("data", "indices", "indptr"):
            g.create_dataset(k, data=getattr(m, k))
        obs = f.create_group("obs")
        obs.attrs.update({"encoding-type": "dataframe", "_index": "_index"})
        obs.create_dataset("_index", data=np.array([f"cell-{i}" for i in range(5)], dtype=object),
                           dtype=h5py.string_dtype())
    with open_input(tmp_path / "a.h5ad") as src:
        assert src.row_names(1, 3) == ["cell-1", "cell-2"]
    with h5py.File(tmp_path / "b.h5", "w") as f:  # the only matrix in a plain HDF5 file: found without a key
        g = f.create_group("m")
        g.attrs.update({"encoding-type": "csr_matrix", "shape": [5, 6]})
        for k in ("data", "indices", "indptr"):
            g.create_dataset(k, data=getattr(m, k))
    with open_input(tmp_path / "b.h5") as src:
        assert src.name.endswith("b.h5:/m") and src.row_names(0, 5) is None
        assert src.read().tobytes() == x.tobytes()


def test_sparse_input_errors(tmp_path):
    import scipy.sparse as sp

    x = _sparse_table(n=6)
    m = sp.csr_matrix(x)

    def h5(name, attrs, parts):
        with h5py.File(tmp_path / name, "w") as f:
            g = f.create_group("X")
            g.attrs.update(attrs)
            for k, v in parts.items():
                g.create_dataset(k, data=v)
        return tmp_path / name

    good = {"data": m.data, "indices": m.indices, "indptr": m.indptr}
    csr = {"encoding-type": "csr_matrix", "shape": [6, 6]}
    cases = {
        h5("csc.h5ad", {"encoding-type": "csc_matrix", "shape": [6, 6]}, good): r"is a csc_matrix; .* needs CSR",
        h5("missing.h5ad", csr, {"data": m.data, "indptr": m.indptr}): "has no 'indices' dataset",
        h5("ptr.h5ad", csr, dict(good, indptr=m.indptr[:-1])): "indptr has 6 entries for 6 rows",
        h5("back.h5ad", csr, dict(good, indptr=m.indptr[::-1].copy())): "not increasing",
        h5("col.h5ad", csr, dict(good, indices=m.indices + 3)): r"row \d: a column index is outside 0..5",
        h5("str.h5ad", csr, dict(good, data=np.array([b"a"] * m.nnz))): "not real numbers",
    }
    for path, msg in cases.items():
        with pytest.raises(InputError, match=msg):
            read(path)
    np.savez(tmp_path / "fake.npz", format=np.array("csr"), shape=np.array([6, 6]), data=m.data)
    with pytest.raises(InputError, match="a CSR archive needs data, format, indices, indptr, shape"):
        read(tmp_path / "fake.npz")


# ----------------------------------------------------------------------------- crafted inputs (issue 23, item 9)
import crafted  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rfsgen import budget  # noqa: E402
from rfsgen.errors import LimitError  # noqa: E402

_CRAFT = settings(max_examples=25, derandomize=True, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])


def _refused(spec, stdin=None, small="64M"):
    """Open and read ``spec`` under a small budget: a one-line InputError or LimitError."""
    with budget.limited(small):
        with pytest.raises((InputError, LimitError)) as e:
            with open_input(spec, stdin=stdin) as src:
                src.read()
                src.row_names(0, src.n_rows or 0)
    assert "\n" not in str(e.value)
    return e.value


@_CRAFT
@given(rows=st.integers(10**7, 10**15), width=st.integers(1, 10**6),
       kind=st.sampled_from(["npy", "npz", "h5", "h5-chunked", "coo", "csr", "csc", "stdin"]))
def test_crafted_files_declaring_huge_shapes_are_refused_before_allocating(tmp_path, rows, width, kind):
    if kind == "npy":
        spec, stdin = crafted.huge_npy(tmp_path, (rows, width)), None
    elif kind == "npz":
        spec, stdin = crafted.dense_npz(tmp_path, (rows, width)), None
    elif kind == "h5":
        assume(rows * width * 8 < 2**62)  # HDF5 cannot describe a larger contiguous dataset
        spec, stdin = crafted.h5_dense(tmp_path, (rows, width)), None
    elif kind == "h5-chunked":
        spec, stdin = crafted.h5_dense(tmp_path, (rows, width), chunks=(min(rows, 2**20), min(width, 2**10))), None
    elif kind == "stdin":
        spec, stdin = "-", io.BufferedReader(io.BytesIO(crafted.npy_bytes((rows, width))))
    else:
        spec, stdin = crafted.sparse_npz(tmp_path, kind, (rows, width)), None
    err = str(_refused(spec, stdin))
    assert any(w in err for w in ("declares", "memory budget", "indptr has", "not a readable", "ever written")), err


@_CRAFT
@given(kind=st.sampled_from(["loop", "external_link", "external_storage", "virtual"]), length=st.integers(1, 20))
def test_hdf5_links_and_storage_outside_the_file_are_refused(tmp_path, kind, length):
    spec = crafted.h5_soft_loop(tmp_path, length) if kind == "loop" else crafted.h5_outside(tmp_path, kind)
    err = _refused(spec)
    assert "/X" in str(err) and str(tmp_path) in str(err)


@_CRAFT
@given(n=st.integers(1, 50), declared=st.integers(-5, 10**12), lo=st.integers(-3, 3), end=st.integers(-3, 10**9),
       col=st.integers(-10, 10**9))
def test_csr_declared_counts_are_validated_before_use(tmp_path, n, declared, lo, end, col):
    """indptr's ends, the number of values and the column range checked against each other."""
    nnz = 4
    indptr = np.linspace(lo, end, n + 1).astype(np.int64)
    if lo == 0 and 0 <= end <= nnz and (np.diff(indptr) >= 0).all() and 0 <= col < 6 and declared == n:
        return  # a valid matrix
    spec = crafted.h5_csr(tmp_path, (declared, 6), indptr, np.full(nnz, col), np.ones(nnz))
    _refused(spec)


@_CRAFT
@given(names=st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=5))
def test_row_names_with_nul_are_an_input_error(tmp_path, names):
    names = [n.rstrip(b"\x00") or b"x" for n in names]
    spec = crafted.h5ad_names(tmp_path, names)
    with open_input(spec) as src:
        if any(b"\x00" in n for n in names):
            with pytest.raises(InputError, match=r"row \d+: the row name .* NUL") as e:
                src.row_names(0, src.n_rows)
            assert "\n" not in str(e.value)
        else:
            assert len(src.row_names(0, src.n_rows)) == len(names)


def test_issue_examples_crafted_inputs(tmp_path):
    """The four examples of issue 23 item 9."""
    coo = crafted.sparse_npz(tmp_path, "coo", (10**9, 8))
    assert Path(coo).stat().st_size < 2000
    assert "memory budget" in str(_refused(coo, small="1G"))
    assert "soft links nest" in str(_refused(crafted.h5_soft_loop(tmp_path, 2)))
    nul = crafted.h5ad_names(tmp_path, [b"a\x00b", b"c"])
    assert "NUL" in str(_refused(nul))
    stdin = io.BufferedReader(io.BytesIO(crafted.npy_bytes((10**12, 8))))
    assert "memory budget" in str(_refused("-", stdin))
    assert "declares shape (1000000000000, 8)" in str(_refused(crafted.h5_dense(tmp_path, (10**12, 8))))


def test_valid_sparse_and_h5_inputs_still_read(tmp_path):
    import scipy.sparse as sp

    m = sp.random(30, 6, density=0.3, format="coo", random_state=1)
    sp.save_npz(tmp_path / "coo.npz", m)
    with budget.limited("64M"), open_input(tmp_path / "coo.npz") as src:
        np.testing.assert_array_equal(src.read(), m.toarray())


def test_hdf5_rows_never_written_are_refused_not_read_as_fill(tmp_path):
    """A chunked dataset with chunks never written (a writer that stopped early, or a
    kilobyte declaring 10^9 rows) would read as the fill value: refused, naming the counts."""
    p = tmp_path / "partial.h5"
    with h5py.File(p, "w") as f:
        ds = f.create_dataset("X", shape=(1000, 4), dtype="f8", chunks=(100, 4))
        ds[:300] = 1.0  # chunks 0..2 of 10
    with pytest.raises(InputError, match=r"partial.h5:/X: only 3 of the 10 HDF5 chunks .* incomplete"):
        read(f"{p}:/X")
    with h5py.File(p, "a") as f:
        f["X"][300:] = 0.0  # written zeros are data
    assert read(f"{p}:/X").shape == (1000, 4)
    big = crafted.h5_dense(tmp_path, (10**9, 8), chunks=(1, 8))
    with pytest.raises(InputError, match="only 0 of the 1,000,000,000 HDF5 chunks"):
        read(big)


def test_stdin_npy_declaring_more_rows_than_it_sends_reserves_nothing(tmp_path, monkeypatch):
    """A dense output of a stream is not placed from its header: the short stream is
    the error, not a petabyte reservation (issue 23 item 9)."""
    from click.testing import CliRunner

    from rfsgen.cli import main

    feats = tmp_path / "f.h5"
    skel = tmp_path / "s.yaml"
    skel.write_text("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: x, base: gaussian}\noutput: x\n")
    assert CliRunner().invoke(main, ["sample", str(skel), "-n", "8", "-o", str(feats), "-q"]).exit_code == 0
    res = CliRunner().invoke(main, ["transform", str(feats), "-", "-o", str(tmp_path / "o.h5"), "-q",
                                    "--layout", "dense"], input=crafted.npy_bytes((10**12, 3)))
    assert res.exit_code != 0
    assert "ended early" in res.output or "memory budget" in res.output, res.output
    assert sorted(q.name for q in tmp_path.iterdir()) == ["f.h5", "s.yaml"]


def test_issue_articles_and_singulars_in_messages():
    """"a AnnData" and "1 values" (issue 27)."""
    class AnnData:  # what anndata's object looks like to open_input: no dtype
        shape = (3, 2)

    with pytest.raises(InputError, match=r"^<AnnData>: cannot read rows from an AnnData; "):
        open_input(AnnData())
    with pytest.raises(InputError, match=r"1-D array of 1 value is ambiguous"):
        open_input(np.arange(1.0))


def _coo_case(seed, rows, width=6, nnz=12, bad=0, dup=True):
    """A generated COO matrix declaring ``rows`` rows (up to 2^62) with ``nnz`` stored
    values at random rows (some repeated coordinates with ``dup``), ``bad`` of them NaN/inf."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    r = rng.integers(0, rows, nnz, dtype=np.int64)
    if rows > 4:
        r[:2] = [rows - 1, rows - 3]  # far from row 0
    c = rng.integers(0, width, nnz)
    if dup:
        r[-2:], c[-2:] = r[0], c[0]
    v = rng.normal(size=nnz) * 10.0 ** rng.integers(-3, 4, nnz)
    v[rng.choice(nnz, bad, replace=False)] = rng.choice([np.nan, np.inf, -np.inf], bad)
    return sp.coo_matrix((v, (r, c)), shape=(rows, width)), r, c, v


@pytest.mark.parametrize("seed", range(12))
def test_coo_stored_values_are_checked_before_the_first_chunk(tmp_path, seed):
    """A NaN or inf 2^62 rows away is named (its row and column, the first by row then
    column) when streaming starts, not after 2^62 / chunk empty chunks; a range of rows
    without it still reads."""
    import scipy.sparse as sp

    rows = [2**62, 10**18, 10**9, 40][seed % 4]
    m, r, c, v = _coo_case(seed, rows, bad=1 + seed % 3)
    bad = ~np.isfinite(v)
    i = np.lexsort((c[bad], r[bad]))[0]
    first = (int(r[bad][i]), int(c[bad][i]))
    sp.save_npz(tmp_path / "m.npz", m)
    for spec in (m, tmp_path / "m.npz"):
        with open_input(spec) as src:
            it = src.chunks(1024)
            with pytest.raises(DataError, match=rf": row {first[0]}, column {first[1]}: value is -?(nan|inf); ") as e:
                next(it)  # the first chunk: before it, not 10^15 chunks later
            assert "\n" not in str(e.value)
            clean = int(r[bad].min())  # rows before the first bad one hold only finite values
            a = max(0, clean - 5)
            got = np.concatenate([b for _, b in src.chunks(4, a, clean)] or [np.zeros((0, 6))])
            sel = (r >= a) & (r < clean)
            want = sp.coo_matrix((v[sel], (r[sel] - a, c[sel])), shape=(clean - a, 6)).toarray()
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(12))
def test_coo_column_extremes_match_the_rows_without_streaming_them(seed):
    """``column_extremes`` of a COO matrix (sample --domain-from) equals the min/max over
    its dense rows: duplicates added up, 0 where some row stores nothing.  With 2^62
    declared rows the reference is the stored rows plus one row of zeros."""
    import scipy.sparse as sp

    from rfsgen.inputs import SparseSource

    rows = [7, 30, 2**62, 10**12][seed % 4]
    m, r, c, v = _coo_case(seed, rows, nnz=[4, 12, 40][seed % 3])
    cols = np.sort(np.random.default_rng(seed).choice(6, 1 + seed % 6, replace=False))
    if rows < 100:
        dense = m.toarray()
    else:  # the distinct stored rows, renumbered, and an all-zero row for the others
        u, inv = np.unique(r, return_inverse=True)
        dense = np.vstack([sp.coo_matrix((v, (inv, c)), shape=(u.size, 6)).toarray(), np.zeros((1, 6))])
    lo, hi = SparseSource(m, "m").column_extremes(cols)
    np.testing.assert_array_equal(lo, dense[:, cols].min(axis=0))
    np.testing.assert_array_equal(hi, dense[:, cols].max(axis=0))
    assert SparseSource(sp.csr_matrix(dense), "m").column_extremes(cols) is None  # CSR: its rows are streamed


def test_coo_column_extremes_refuse_non_finite_values_and_sums():
    import scipy.sparse as sp

    from rfsgen.inputs import SparseSource

    m = sp.coo_matrix(([1.0, np.nan, 2.0], ([2**62 - 1, 5, 0], [1, 3, 0])), shape=(2**62, 6))
    assert SparseSource(m, "m").column_extremes([0, 1])[1].tolist() == [2.0, 1.0]  # column 3 is not measured
    with pytest.raises(DataError, match=r"^m: row 5, column 3: value is nan; "):
        SparseSource(m, "m").column_extremes([3])
    over = sp.coo_matrix(([1e308, 1e308], ([7, 7], [2, 2])), shape=(2**40, 6))  # two halves of an overflow
    with pytest.raises(DataError, match=r"^m: row 7, column 2: value is inf; "):
        SparseSource(over, "m").column_extremes([2])


def test_coo_coordinates_outside_the_shape_are_an_input_error():
    import scipy.sparse as sp

    m = sp.coo_matrix(([1.0, 2.0], ([0, 3], [1, 2])), shape=(10, 4))
    m.row[1] = 10  # scipy checks the coordinates when the matrix is made, not after
    with pytest.raises(InputError, match=r"row 10, column 2 lies outside the declared shape \(10, 4\)"):
        open_input(m)


# ----------------------------------------------------------------------------- CSR rows read as CSR
def test_sparse_chunks_are_the_dense_chunks_and_refuse_what_chunks_refuse():
    """CsrRowsSource.sparse_chunks: the same validation as the dense chunks (column indices
    within the width, indptr increasing within the data), and SparseRows.toarray gives each
    dense chunk's bits (unsorted and duplicate entries, -0.0, int data)."""
    from rfsgen.inputs import CsrRowsSource, SparseRows

    indptr = np.array([0, 3, 3, 7, 9])
    indices = np.array([4, 1, 2, 3, 3, 0, 5, 5, 1])
    for data in (np.array([1.5, -2.0, -0.0, 0.5, -0.5, 0.0, 3.0, 1e-3, 2.0]),
                 np.array([1.5, -2.0, -0.0, 0.5, -0.5, 0.0, 3.0, 1e-3, 2.0], np.float32),
                 np.arange(9, dtype=np.int32)):
        src = CsrRowsSource("x", (4, 6), indptr, data, indices)
        for rows in (1, 3, 4):
            dense = list(src.chunks(rows))
            sparse = list(src.sparse_chunks(rows))
            assert [a for a, _ in dense] == [a for a, _ in sparse]
            for (_, d), (_, s) in zip(dense, sparse):
                assert isinstance(s, SparseRows) and s.shape == d.shape and s.dtype == d.dtype
                assert s.toarray().tobytes() == d.tobytes()
                for r in range(s.shape[0]):  # canonical: sorted, unique
                    cols = s.indices[s.indptr[r]:s.indptr[r + 1]]
                    assert (np.diff(cols) > 0).all()
    bad_col = CsrRowsSource("x", (4, 6), indptr, np.ones(9), np.where(indices == 5, 6, indices))
    bad_ptr = CsrRowsSource("x", (4, 6), np.array([0, 3, 2, 7, 9]), np.ones(9), indices)
    for src, msg in ((bad_col, r"row 2: a column index is outside 0..5"), (bad_ptr, "not increasing")):
        for read_with in (src.chunks, src.sparse_chunks):
            with pytest.raises(InputError, match=msg):
                list(read_with(4))


def test_csr_rows_read_as_csr_take_larger_chunks():
    """A CSR input through a gaussian node is read in chunks sized by what a CSR row takes
    (no dense row); a dense input, or a skeleton that takes no CSR rows, as before."""
    import scipy.sparse as sp

    from rfsgen import parse_skeleton, sample
    from rfsgen.inputs import chunk_row_bytes, chunks_for
    from rfsgen.transform import Transformer

    sk = parse_skeleton("rfsgen: 1\ninput: {width: 5000}\nnodes:\n  - {name: x, base: gaussian, scale: 0.1}\n"
                        "output: x\n", "g.yaml")
    tr = Transformer(sample(sk, 64, seed=1))
    x = sp.random(10, 5000, density=0.01, format="csr", random_state=0)
    with open_input(x) as src:
        assert chunk_row_bytes(tr, src) < tr.row_bytes / 10
        assert [c.shape[0] for _, c in chunks_for(src, tr, 4)] == [4, 4, 2]  # a given chunk size is kept
        assert type(next(chunks_for(src, tr, 4))[1]).__name__ == "SparseRows"
    with open_input(x.toarray()) as src:
        assert chunk_row_bytes(tr, src) == tr.row_bytes
        assert isinstance(next(chunks_for(src, tr, 4))[1], np.ndarray)
    tr.reads_sparse = False
    with open_input(x) as src:
        assert chunk_row_bytes(tr, src) == tr.row_bytes
        assert isinstance(next(chunks_for(src, tr, 4))[1], np.ndarray)

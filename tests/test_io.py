import io

import h5py
import numpy as np
import pytest

from rfsgen import DataError, InputError, OutputExistsError, UsageError
from rfsgen.io import atomic_path, open_input, parse_rows


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


def test_open_errors(tmp_path, table):
    np.savez(tmp_path / "b.npz", rows=table, other=table)
    with pytest.raises(InputError, match="holds 2 arrays \\(rows, other\\); choose one"):
        read(tmp_path / "b.npz")
    with pytest.raises(InputError, match="has no array 'nope' \\(available: rows, other\\)"):
        read(f"{tmp_path}/b.npz:nope")
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("x", data=table)
    with pytest.raises(InputError, match="has no dataset '/y' \\(available: /x\\)"):
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


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            open(tmp, "wb").write(b"partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            open(tmp, "wb").write(b"partial")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with atomic_path(target) as tmp:
        open(tmp, "wb").write(b"done")
    assert target.read_bytes() == b"done"
    with pytest.raises(OutputExistsError, match="already exists; pass --overwrite"):
        with atomic_path(target):
            pass

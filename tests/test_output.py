"""The output writer (rfsgen/output.py): the integrity record every output carries, its
checksum (record version 2, checked against a numpy reference; version 1's, which merge
still verifies), and that the record never depends on how the data was written."""

import hashlib
import json

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import skeleton_path
from rfsgen import load_skeleton, sample, save_features
from rfsgen._compiled import xxh64
from rfsgen.output import (CHECKSUM, CHECKSUM_BLOCK, OUTPUT_DEFINITION, RECORD_ATTR, BlockChecksum, DataChecksum,
                           NamesChecksum, add_digests, canonical_json, number_names_digest, seal_of)
from rfsgen.transform import Transformer, transform_file


def _xxh64(data: bytes, seed: int = 0) -> int:
    whole = len(data) // 8 * 8
    return int(xxh64(np.frombuffer(data[:whole], dtype=np.uint64), np.frombuffer(data[whole:], dtype=np.uint8),
                     seed, 0)[0])


@pytest.mark.parametrize("data, seed, want", [
    (b"", 0, 0xEF46DB3751D8E999), (b"a", 0, 0xD24EC4F1A98C6E5B), (b"abc", 0, 0x44BC2CF5AD770999),
    (b"a" * 32, 0, 0x856E843298F99AD7), (b"b" * 64, 0, 0xECBAF4BDF26B6349),
    (b"Nobody inspects the spammish repetition", 0, 0xFBCEA83C8A378BF1),
    (b"The quick brown fox jumps over the lazy dog", 0, 0x0B242D361FDA71BC),
    (bytes(range(100)), 0, 0x6AC1E58032166597), (b"abc", 12345, 0x01700E64F6F23509)])
def test_xxh64_is_the_reference_xxh64(data, seed, want):
    """Published XXH64 vectors (xxHash's spec; python-xxhash's documentation)."""
    assert _xxh64(data, seed) == want


def _reference(data: bytes) -> str:
    """Version 1's checksum, spelled out: XXH64 of each 1 MiB block, SHA-256 of the hashes."""
    sha = hashlib.sha256()
    for a in range(0, len(data), CHECKSUM_BLOCK):
        sha.update(_xxh64(data[a:a + CHECKSUM_BLOCK]).to_bytes(8, "little"))
    return sha.hexdigest()


@settings(max_examples=15, deadline=None, derandomize=True)
@given(size=st.sampled_from([0, 4, 12, CHECKSUM_BLOCK - 4, CHECKSUM_BLOCK, CHECKSUM_BLOCK + 4,
                            2 * CHECKSUM_BLOCK + 36]),
       cuts=st.lists(st.integers(0, 2 * CHECKSUM_BLOCK + 40), max_size=6), offset=st.sampled_from([0, 4]))
def test_the_checksum_does_not_depend_on_how_the_bytes_are_fed(size, cuts, offset):
    raw = np.random.default_rng(size).integers(0, 2**32, size // 4 + 1, dtype=np.uint32)
    data = raw.view(np.uint8)[offset:offset + size]  # offset 4: pieces start unaligned for uint64
    want = _reference(data.tobytes())
    c = BlockChecksum()
    points = sorted({min(p, size) for p in cuts} | {0, size})
    for a, b in zip(points, points[1:]):
        c.update(data[a:b])
    assert c.hexdigest() == want
    assert c.size == size


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [7, 262144 + 3, 3 * 131072])
def test_the_checksum_finds_nan_and_infinity_where_asked(dtype, n):
    rng = np.random.default_rng(n)
    clean = rng.standard_normal(n).astype(dtype)
    c = BlockChecksum(finite=dtype)
    c.update(clean)
    c.hexdigest()
    assert c.first_bad is None
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, n // 2, n - 1):
            x = clean.copy()
            x[where] = bad
            c = BlockChecksum(finite=dtype)
            for piece in np.array_split(x, 3):
                c.update(piece)
            digest = c.hexdigest()
            assert c.first_bad is not None and c.first_bad <= where * x.itemsize < c.first_bad + CHECKSUM_BLOCK
            plain = BlockChecksum()  # the check does not change the checksum
            plain.update(x)
            assert plain.hexdigest() == digest and plain.first_bad is None


# ----------------------------------------------------------------------------- record version 2's checksum
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


def _fmix_a(x):
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


def _fmix_b(x):
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_sums(halves, seed: int, row: int, first: int = 0) -> tuple:
    """docs/integrity.md spelled out in numpy (uint64 lanes, every step masked to 32 bits):
    the sums ``(A, B)`` of a row's run of values, given as their 32-bit halves (uint32,
    taken two a word, an odd last one with a zero high half), whose words are at positions
    ``first ..`` of global row ``row`` of dataset ``seed``."""
    h = np.asarray(halves, dtype=np.uint32).reshape(-1)
    if h.size % 2:
        h = np.append(h, np.uint32(0))
    lo, hi = h[0::2].astype(np.uint64), h[1::2].astype(np.uint64)
    p = first + np.arange(lo.size, dtype=np.uint64)
    keys = np.array([_mix64((_mix64(row ^ (seed << 56)) + int(g)) & M64) for g in p >> np.uint64(32)],
                    dtype=np.uint64)
    k1, k2, q = keys & np.uint64(M32), keys >> np.uint64(32), p & np.uint64(M32)
    m = np.uint64(M32)
    with np.errstate(over="ignore"):
        a = _fmix_a(((lo ^ k1) + q) & m)
        b = _fmix_b((((hi ^ k2) + q) + a) & m)
    return int(a.sum(dtype=np.uint64)) & M32, int(b.sum(dtype=np.uint64)) & M32


def _halves(values):
    """The 32-bit halves the checksum takes of values: float bits (a float64's low half
    first), column indices as unsigned 32-bit integers."""
    v = np.ascontiguousarray(values)
    return v.view(np.uint32).reshape(-1) if v.dtype.kind == "f" else v.astype(np.uint32).reshape(-1)


def reference_digests(parts: dict, start: int, columns: int = -1) -> dict:
    """The record's ``datasets`` of X's datasets ``parts`` (name -> array), first row
    ``start``; CSR: a row of ``columns`` values has no checksum of its indices."""
    out = {}
    if "X" in parts:
        x = parts["X"]
        out["X"] = [reference_sums(_halves(x[r]), 1, start + r) for r in range(x.shape[0])]
    else:
        data, indices, indptr = parts["X/data"], parts["X/indices"], parts["X/indptr"]
        rows = range(indptr.size - 1)
        out["X/data"] = [reference_sums(_halves(data[indptr[r]:indptr[r + 1]]), 2, start + r) for r in rows]
        out["X/indices"] = [reference_sums(_halves(indices[indptr[r]:indptr[r + 1]]), 3, start + r) for r in rows
                            if indptr[r + 1] - indptr[r] != columns]
        out["X/indptr"] = [reference_sums(np.array([indptr[r + 1] - indptr[r]], np.int64).view(np.uint32), 4, start + r)
                           for r in rows]
    return {k: f"{sum(a for a, _ in v) & M32:08x}{sum(b for _, b in v) & M32:08x}" for k, v in out.items()}


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(1, 4), row=st.sampled_from([0, 1, 77, 2**31 + 5, 2**40 + 3]),
       first=st.sampled_from([0, 3, 2**32 - 5, 2**32, 5 * 2**32 + 7]), n=st.integers(0, 40),
       kind=st.sampled_from(["float32", "float64", "int32", "int64"]))
def test_the_compiled_sums_are_the_documented_definition(seed, row, first, n, kind):
    """Bytes-exact against the numpy reference: both float widths, int32 and int64 column
    indices, odd and even runs, row numbers past 2^32 and positions crossing 2^32."""
    from rfsgen._compiled import run_sums

    rng = np.random.default_rng([seed, row % 1000, first % 1000, n])
    v = (rng.standard_normal(n).astype(kind) if kind.startswith("float") else
         rng.integers(0, 10**8, n).astype(kind))
    a, b, _ = run_sums(_halves(v), seed, row, first, np.uint32(0), np.uint32(0), np.uint32(1))
    assert (int(a), int(b)) == reference_sums(_halves(v), seed, row, first)


def test_int32_and_int64_indices_give_one_checksum():
    rng = np.random.default_rng(4)
    data = rng.standard_normal(30).astype(np.float32)
    ptr = np.array([0, 4, 4, 19, 30], dtype=np.int64)
    cols = np.concatenate([np.sort(rng.choice(10**8, k, replace=False)) for k in np.diff(ptr)])
    digests = []
    for dt in (np.int32, np.int64):
        c = DataChecksum("csr", np.float32, 10**8)
        c.csr(data, cols.astype(dt), ptr, 2**33)
        digests.append(c.hexdigests())
    assert digests[0] == digests[1] == reference_digests({"X/data": data, "X/indices": cols, "X/indptr": ptr}, 2**33)


def test_one_changed_value_always_changes_the_sums():
    """H(row, position, .) is a bijection of a word: every single-bit change of any
    value (float32, float64, a column index) changes the dataset's sums."""
    from rfsgen._compiled import run_sums

    rng = np.random.default_rng(0)
    for v in (rng.standard_normal(9).astype(np.float32), rng.standard_normal(9), rng.integers(0, 10**8, 9)):
        w = _halves(v)
        base = run_sums(w, 2, 5, 0, np.uint32(0), np.uint32(0), np.uint32(1))[:2]
        for i in range(w.size):
            for bit in range(32):
                x = w.copy()
                x[i] ^= np.uint32(1 << bit)
                assert run_sums(x, 2, 5, 0, np.uint32(0), np.uint32(0), np.uint32(1))[:2] != base


@settings(max_examples=12, deadline=None, derandomize=True)
@given(m=st.integers(0, 40), d=st.integers(1, 20), cuts=st.lists(st.integers(0, 40), max_size=4),
       dtype=st.sampled_from(["float32", "float64"]), zeros=st.floats(0, 1), row0=st.integers(0, 10**6))
def test_data_checksum_adds_up_over_any_pieces_and_threads(m, d, cuts, dtype, zeros, row0):
    """Dense and CSR digests of rows fed in pieces (any order, threads on or off) are the
    reference's, and the pieces' digests add up to the whole's (as shards do in a merge)."""
    from rfsgen.output import _sparse_parts

    rng = np.random.default_rng([m, d, row0])
    x = rng.standard_normal((m, d)).astype(dtype)
    x[rng.random((m, d)) < zeros] = 0
    data, indices, counts = (np.copy(a) for a in _sparse_parts(x))
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    want = {**reference_digests({"X": x}, row0),
            **reference_digests({"X/data": data, "X/indices": indices, "X/indptr": ptr}, row0, d)}
    points = sorted({min(c, m) for c in cuts} | {0, m})
    pieces = list(zip(points, points[1:]))
    for threads in (False, True):
        dense, csr = DataChecksum("dense", dtype, d, threads=threads), DataChecksum("csr", dtype, d, threads=threads)
        parts = []
        for a, b in reversed(pieces):  # the order does not matter
            dense.dense(x[a:b], row0 + a)
            csr.csr(data[ptr[a]:], indices[ptr[a]:], ptr[a:b + 1], row0 + a)
            one = DataChecksum("dense", dtype, d)
            one.dense(x[a:b], row0 + a)
            parts.append(one.hexdigests())
        assert {**dense.hexdigests(), **csr.hexdigests()} == want
        assert add_digests({"X": "0" * 16}, *parts) == {"X": want["X"]}


def _numpy_csr(x):
    """CSR pieces without zeros, spelled out in numpy: (data, indices, counts)."""
    rows, cols = np.nonzero(x)
    return x[rows, cols], cols.astype(np.int32), np.bincount(rows, minlength=x.shape[0]).astype(np.int64)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(shape=st.sampled_from([(1, 1), (3, 7), (17, 40), (5, 1001), (300, 1000), (263, 1001)]),
       dtype=st.sampled_from(["float32", "float64"]), row0=st.sampled_from([0, 9, 2**31 - 3, 2**32 + 1]),
       zeros=st.sampled_from([0.0, 0.001, 0.3, 1.0]), tail=st.booleans(), tiny=st.booleans(), at=st.integers(0, 10**6))
def test_csr_pieces_of_a_chunk_are_hashed_as_they_are_made(shape, dtype, row0, zeros, tail, tiny, at):
    """A transform's CSR pieces, and its checksum fed in the same passes: the numpy
    definition's pieces (+0 and -0 dropped, subnormals kept) and the reference's digests,
    with rows in every state (full, some zeros, none stored), rows ending in zeros at the
    boundary between two threads' rows (300 x 1000 and 263 x 1001 split in two), and
    chunks with no zero at all (given as views)."""
    from rfsgen.output import _sparse_parts

    m, d = shape
    rng = np.random.default_rng([m, d, at])
    x = rng.standard_normal((m, d)).astype(dtype)
    hit = rng.random((m, d)) < zeros
    x[hit] = np.where(rng.random(int(hit.sum())) < 0.5, 0.0, -0.0)  # both zeros, by their sign
    if tail:  # rows ending in zeros, the one before a thread's first row among them
        x[[(m // 2 - 1) % m, m - 1], d // 2:] = -0.0
    if tiny:  # the least magnitudes, all their bits zero but sign and the lowest
        x.reshape(-1)[at % x.size] = np.finfo(dtype).smallest_subnormal * (-1) ** at
    want = _numpy_csr(x)
    ptr = np.concatenate([[0], np.cumsum(want[2])])
    ref = reference_digests({"X/data": want[0], "X/indices": want[1], "X/indptr": ptr}, row0, d)
    plain = _sparse_parts(x)
    c = DataChecksum("csr", dtype, d)
    hashed = c.csr_parts(x, row0)
    for got in (plain, hashed):
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))
    assert c.hexdigests() == ref
    if not zeros and not tail:  # no zero: the chunk itself, no copy
        assert np.shares_memory(plain[0], x) and np.shares_memory(hashed[0], x)
    with pytest.raises(ValueError, match="CSR data of dtype"):  # not its rows
        DataChecksum("csr", "float64" if dtype == "float32" else "float32", d).csr_parts(x, row0)
    with pytest.raises(ValueError, match="writer's checksum"):
        DataChecksum("csr", dtype, d, finite=True).csr_parts(x, row0)


@pytest.mark.parametrize("x", [np.empty((5, 0), np.float32), np.empty((0, 4), np.float64),
                               np.array([[1.5, 0.0], [2.0, 3.0]], np.float16), np.array([[1.5, 2.0]], ">f4"),
                               np.array([[1.5, -0.0], [0.0, 3.0]], ">f8")])
def test_csr_pieces_of_other_chunks_follow_numpy(x):
    """Chunks the transform never writes (no rows or columns, float16, big-endian) take
    numpy's path: the same pieces as numpy's definition (found by review: 0 columns
    gave unset counts, float16 and big-endian floats a compile error)."""
    from rfsgen.output import _sparse_parts

    got, want = _sparse_parts(x), _numpy_csr(x)
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want))
    if x.shape[1] == 0 and x.dtype == np.float32:  # a checksum of rows storing nothing
        c = DataChecksum("csr", np.float32, 0)
        c.csr_parts(x, 3)
        assert c.hexdigests() == reference_digests({"X/data": want[0], "X/indices": want[1],
                                                    "X/indptr": np.zeros(6, np.int64)}, 3, 0)


@pytest.mark.parametrize("chunk", [1, 2, 7, None])
def test_csr_outputs_mixing_chunks_with_and_without_zeros_carry_the_reference_checksums(files, chunk, tmp_path):
    """Chunks without zeros are hashed in the writer's search for zeros, the others
    after compressing: any mix of the two gives the reference's digests and one file."""
    x = np.random.default_rng(3).standard_normal((30, 8))
    x[[4, 5, 21], 5] = 0.0  # these rows only get zero features
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / f"o{chunk}.h5"
    transform_file(files / "f.h5", tmp_path / "x.npy", out, layout="csr", chunk_rows=chunk, rows="2:30")
    with h5py.File(out, "r") as f:
        parts = {f"X/{k}": f["X"][k][()] for k in ("data", "indices", "indptr")}
    short = sorted(np.flatnonzero(np.diff(parts["X/indptr"]) < 150) + 2)
    assert short == [4, 5, 21]
    assert _record(out)["datasets"] == reference_digests(parts, 2, 150)
    ref = tmp_path / "o-ref.h5"
    transform_file(files / "f.h5", tmp_path / "x.npy", ref, layout="csr", chunk_rows=30, rows="2:30")
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_data_checksum_finds_the_rows_holding_nan_or_infinity(dtype):
    x = np.random.default_rng(1).standard_normal((50, 33)).astype(dtype)
    c = DataChecksum("dense", dtype, 33, finite=True)
    assert c.dense(x, 0) is None
    plain = DataChecksum("dense", dtype, 33)
    plain.dense(x, 0)
    for bad in (np.nan, np.inf, -np.inf):
        for r, col in ((0, 0), (17, 5), (17, 32), (49, 31), (49, 32)):  # even and odd columns, the odd last one
            y = x.copy()
            y[r, col] = bad
            if r < 49:
                y[r + 1:, 0] = np.nan  # a later row too: the first is named
            assert DataChecksum("dense", dtype, 33, finite=True).dense(y, 7) == r
            ptr = np.arange(51, dtype=np.int64) * 33
            assert DataChecksum("csr", dtype, 33, finite=True).csr(y.reshape(-1), np.tile(np.arange(33), 50), ptr,
                                                                   7) == (r, "nonfinite")
    unchecked = DataChecksum("dense", dtype, 33, finite=True)
    unchecked.dense(x, 0)
    assert unchecked.hexdigests() == plain.hexdigests()  # the check does not change the checksum


def _csr_faults_reference(data, indices, ptr, width):
    """The verifying checksum's row faults, from their definition: per row, 1 when its
    columns are not strictly increasing within 0 .. width - 1, 2 when it stores a zero."""
    out = []
    for r in range(ptr.size - 1):
        cols = indices[ptr[r]:ptr[r + 1]].astype(np.int64)
        vals = data[ptr[r]:ptr[r + 1]]
        f = 0
        if cols.size and (np.any(np.diff(cols) <= 0) or cols[0] < 0 or cols[-1] >= width):
            f |= 1
        if np.any(vals == 0):
            f |= 2
        out.append(f)
    return np.array(out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_verifying_csr_checksum_finds_every_structure_fault_first_row_first(dtype):
    # Generated rows (empty, partial, full) with generated damage: a column moved out of
    # order, repeated, negative, at or past the width, a full row's columns shifted, a
    # stored +0 or -0, NaN; the first faulty row and its kind are what the definition says.
    rng = np.random.default_rng(23)
    width = 37
    for case in range(400):
        m = int(rng.integers(1, 12))
        rows = [np.sort(rng.choice(width, size=int(rng.choice([0, width, rng.integers(1, width)])),
                                   replace=False)) for _ in range(m)]
        ptr = np.concatenate([[0], np.cumsum([r.size for r in rows])]).astype(np.int64)
        indices = np.concatenate(rows).astype(np.int32) if ptr[-1] else np.zeros(0, np.int32)
        data = (rng.uniform(0.5, 2, ptr[-1]) * rng.choice([-1, 1], ptr[-1])).astype(dtype)
        for _ in range(int(rng.integers(0, 3))):
            if not ptr[-1]:
                break
            k = int(rng.integers(0, ptr[-1]))
            what = int(rng.integers(0, 8))
            if what == 0:
                indices[k] = -1 - int(rng.integers(0, 2**31 - 1))
            elif what == 1:
                indices[k] = width + int(rng.integers(0, 3))
            elif what == 2 and k + 1 < ptr[-1]:
                indices[k + 1] = indices[k]
            elif what == 3 and k + 1 < ptr[-1]:
                indices[k], indices[k + 1] = indices[k + 1], indices[k]
            elif what == 4:
                data[k] = 0.0
            elif what == 5:
                data[k] = -0.0
            elif what == 6:
                data[k] = np.nan
            else:
                indices[k] = (indices[k] + 1) % (width + 1)
        ref = _csr_faults_reference(data, indices, ptr, width)
        nan = np.flatnonzero(~np.isfinite(data))
        if nan.size:
            want = (int(np.searchsorted(ptr, nan[0], side="right")) - 1, "nonfinite")
        elif (ref & 1).any():
            want = (int(np.argmax((ref & 1) != 0)), "indices")
        elif (ref & 2).any():
            want = (int(np.argmax((ref & 2) != 0)), "zero")
        else:
            want = None
        for threads in (False, True):
            c = DataChecksum("csr", dtype, width, finite=True, threads=threads)
            assert c.csr(data, indices, ptr, 5) == want, case
        plain = DataChecksum("csr", dtype, width)
        assert plain.csr(data, indices, ptr, 5) is None
        assert plain.hexdigests() == c.hexdigests()  # the checks do not change the checksum


@pytest.mark.parametrize("bad", [2**32 + 3, -1, -2**32 + 3])
def test_verifying_csr_checksum_finds_int64_columns_that_uint32_would_wrap(bad):
    ptr = np.array([0, 2, 4], dtype=np.int64)
    cols = np.array([0, 1, 1, bad], dtype=np.int64)
    assert DataChecksum("csr", np.float32, 5, finite=True).csr(np.ones(4, np.float32), cols, ptr, 0) == (1, "indices")


def test_names_checksum_is_the_json_of_all_names_in_any_blocks():
    names = ["a", "é", "x\ny", '"q"', "", "7"]
    want = hashlib.sha256(json.dumps(names, separators=(",", ":")).encode()).hexdigest()
    for cut in range(len(names) + 1):
        c = NamesChecksum()
        c.update(names[:cut])
        c.update(names[cut:])
        assert c.hexdigest() == want
    assert number_names_digest(3, 9) == hashlib.sha256(
        json.dumps([str(i) for i in range(3, 9)], separators=(",", ":")).encode()).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("out")
    x = np.random.default_rng(2).standard_normal((45, 8))
    x[:, 5] = 0.0  # zero features: CSR drops them
    np.save(d / "x.npy", x)
    save_features(sample(load_skeleton(skeleton_path("tabular-circle")), 150, seed=4), d / "f.h5")
    return d


def _record(path) -> dict:
    with h5py.File(path, "r") as f:
        text = f.attrs[RECORD_ATTR]
        return json.loads(text) | {"_text": text, "_attrs": list(f.attrs)}


class _Remote:
    """A stand-in for rfsgen.dask's cluster engine: chunks arrive as arrays."""

    remote = True

    def __init__(self, fs, dtype, device="cpu"):
        self.tr = Transformer(fs, dtype, device)
        self.columns, self.dtype = self.tr.columns, self.tr.dtype

    def chunks(self, src, chunk_rows, start=0, stop=None, buffers=1):
        for row0, vals in self.tr.chunks(src, chunk_rows, start, stop, buffers=1):
            yield row0, vals.copy()


@pytest.mark.parametrize("layout, compression, dtype", [("csr", "none", "float32"), ("dense", "none", "float32"),
                                                        ("dense", "gzip", "float64"), ("csr", "lzf", "float64")])
def test_every_output_carries_a_sealed_record_that_describes_it(files, layout, compression, dtype):
    outs = []
    for k, (chunk, engine) in enumerate(((None, None), (4, None), (13, _Remote))):
        out = files / f"o-{layout}-{compression}-{k}.h5"
        transform_file(files / "f.h5", files / "x.npy", out, layout=layout, compression=compression, dtype=dtype,
                       rows="5:44", chunk_rows=chunk, engine=engine, overwrite=True)
        outs.append(out)
    first = outs[0].read_bytes()
    assert all(o.read_bytes() == first for o in outs[1:])  # chunking and engine change no byte
    rec = _record(outs[0])
    assert set(rec["_attrs"]) == {"encoding-type", "encoding-version", "rfsgen_version", "features_file",
                                  "features_sha256", "input", "rows_start", "rows_stop", "columns", "layout",
                                  "output_definition", RECORD_ATTR}  # two more than before records and issue 26
    plain = {k: v for k, v in rec.items() if not k.startswith("_")}
    assert rec["_text"] == canonical_json(plain)
    assert rec["seal"] == seal_of(plain)
    with h5py.File(outs[0], "r") as f:
        for k in ("rfsgen_version", "features_file", "features_sha256", "input", "rows_start", "rows_stop", "columns",
                  "layout"):
            v = f.attrs[k]
            assert rec[k] == (v.item() if isinstance(v, np.generic) else v)
        assert f.attrs["output_definition"] == OUTPUT_DEFINITION == 3
        assert rec["features_sha256"] == hashlib.sha256((files / "f.h5").read_bytes()).hexdigest()
        assert (rec["rows_start"], rec["rows_stop"], rec["shape"]) == (5, 44, [39, 150])
        assert (rec["dtype"], rec["compression"], rec["checksum"]) == (dtype, compression, CHECKSUM)
        x = f["X"]
        parts = {"X": x} if layout == "dense" else {f"X/{k}": x[k] for k in ("data", "indices", "indptr")}
        want = reference_digests({k: ds[()] for k, ds in parts.items()}, 5, 150)
        assert rec["datasets"] == want
        assert rec["nnz"] == (39 * 150 if layout == "dense" else x["data"].shape[0])
        assert rec["obs_names"] == "numbers" and rec["obs_names_sha256"] == number_names_digest(5, 44)


@pytest.mark.parametrize("values, block", [(None, 1 << 20), (0, 1 << 12), (4096, 1 << 12), (4097, 1 << 13),
                                           (45 * 150, 1 << 13), (10**6, 1 << 20), (10**12, 1 << 20)])
def test_csr_blocks_follow_the_output_size(values, block):
    from rfsgen.output import csr_block

    assert csr_block(values) == block


def test_a_small_csr_output_is_small_and_its_shards_merge_to_its_bytes(files, tmp_path):
    """45 rows x 150 columns: HDF5 chunks of 2^13 values, not 2^20 (the file is ~100 KB,
    not ~8 MB); shards of other sizes (other blocks) merge to the same bytes."""
    import os

    from rfsgen.merge import merge_files

    transform_file(files / "f.h5", files / "x.npy", tmp_path / "all.h5", layout="csr")
    with h5py.File(tmp_path / "all.h5") as f:
        assert f["X/data"].chunks == (1 << 13,) and f["X/indices"].chunks == (1 << 13,)
    assert os.path.getsize(tmp_path / "all.h5") < 200_000
    for a, b in ((0, 7), (7, 45)):
        transform_file(files / "f.h5", files / "x.npy", tmp_path / f"s{a}.h5", layout="csr", rows=f"{a}:{b}")
    merge_files([tmp_path / "s0.h5", tmp_path / "s7.h5"], tmp_path / "m.h5")
    assert (tmp_path / "m.h5").read_bytes() == (tmp_path / "all.h5").read_bytes()


def test_a_sparse_csr_output_is_sized_to_its_stored_values(tmp_path):
    """docs/python.md's AnnData example (500 sparse rows x 4096 columns, ~11k stored values):
    chunks follow the values stored, not rows x columns (8.6 MB before); chunk sizes,
    shards and merge still give the same bytes."""
    import os

    import scipy.sparse as sp

    from rfsgen.merge import merge_files
    from rfsgen.skeleton import parse_skeleton

    counts = sp.random(500, 200, density=0.05, format="csr", rng=np.random.default_rng(0))
    sp.save_npz(tmp_path / "x.npz", counts)
    skel = parse_skeleton("rfsgen: 1\ninput: {width: auto}\nnodes:\n"
                          "  - {name: s, base: sphere, scheme: coordinate, zero: uniform}\n"
                          "  - {name: out, activation: {name: polynomial, degree: 2, c: 0.5}, inputs: [s]}\n")
    save_features(sample(skel.bind(200), 4096, seed=0), tmp_path / "f.h5")
    outs = []
    for k, chunk in enumerate((None, 7, 100)):
        out = tmp_path / f"o{k}.h5"
        info = transform_file(tmp_path / "f.h5", tmp_path / "x.npz", out, layout="csr", chunk_rows=chunk)
        outs.append(out.read_bytes())
    assert outs[1] == outs[0] and outs[2] == outs[0]
    nnz = info["nnz"]
    assert nnz < 100_000
    with h5py.File(tmp_path / "o0.h5") as f:
        block = f["X/data"].chunks[0]
        assert block == f["X/indices"].chunks[0] and block // 2 < nnz <= block
    assert os.path.getsize(tmp_path / "o0.h5") < 8 * block + 300_000  # names: ~200 KB
    for a, b in ((0, 3), (3, 250), (250, 500)):
        transform_file(tmp_path / "f.h5", tmp_path / "x.npz", tmp_path / f"s{a}.h5", layout="csr", rows=f"{a}:{b}")
    merge_files([tmp_path / f"s{a}.h5" for a in (250, 0, 3)], tmp_path / "m.h5")
    assert (tmp_path / "m.h5").read_bytes() == outs[0]


def test_a_small_dense_stream_is_one_chunk_of_its_rows(files, tmp_path):
    """A stream of unknown length (or a compressed dense output) is chunked; fewer rows
    than a block make one chunk of exactly those rows, whatever the chunk size."""
    import io

    x = np.load(files / "x.npy")[:32]
    outs = []
    for chunk in (None, 5):
        buf = io.BytesIO()
        np.save(buf, x)
        buf.seek(0)
        out = tmp_path / f"d{chunk}.h5"
        transform_file(files / "f.h5", "-", out, layout="dense", chunk_rows=chunk, stdin=io.BufferedReader(buf))
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    with h5py.File(tmp_path / "dNone.h5") as f:
        assert f["X"].chunks == (32, 150)


_COORDINATE = ("rfsgen: 1\ninput: {width: auto}\nnodes:\n"
               "  - {name: s, base: sphere, scheme: coordinate, zero: uniform}\n"
               "  - {name: out, activation: {name: polynomial, degree: 2, c: 0.5}, inputs: [s]}\n")


@pytest.mark.parametrize("skeleton, layout", [("tabular-circle", "dense"), ("cifar-deep", "dense"),
                                              ("shallow-gaussian", "dense"), ("coordinate", "csr")])
def test_auto_layout_follows_the_expected_density(skeleton, layout):
    from rfsgen.output import auto_layout, expected_density
    from rfsgen.skeleton import parse_skeleton

    skel = parse_skeleton(_COORDINATE).bind(30) if skeleton == "coordinate" else load_skeleton(skeleton_path(skeleton))
    fs = sample(skel, 200, seed=1)
    d = expected_density(fs)
    assert auto_layout(fs) == d["layout"] == layout and d["columns"] == 200
    if layout == "dense":  # circle, gaussian-like and sphere 'pair' factors are never zero
        assert d["density"] == 1.0 and d["nonzero_columns"] == 200
    else:  # only the constant columns of the polynomial never vanish
        lengths = np.diff(fs.ptr)
        assert d["nonzero_columns"] == int((lengths == 0).sum()) and d["density"] < 0.5


def test_layout_auto_is_the_default_and_writes_what_an_explicit_layout_writes(files, tmp_path):
    from click.testing import CliRunner

    from rfsgen.cli import main
    from rfsgen.skeleton import parse_skeleton

    def run(*args):
        res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
        assert res.exit_code == 0, res.output

    save_features(sample(parse_skeleton(_COORDINATE).bind(8), 40, seed=2), tmp_path / "c.h5")
    for feats, layout in ((files / "f.h5", "dense"), (tmp_path / "c.h5", "csr")):
        run("transform", feats, files / "x.npy", "-o", tmp_path / "auto.h5", "-q", "--overwrite")
        run("transform", feats, files / "x.npy", "-o", tmp_path / "explicit.h5", "-q", "--overwrite", "--layout", layout)
        assert (tmp_path / "auto.h5").read_bytes() == (tmp_path / "explicit.h5").read_bytes()
        out = transform_file(feats, files / "x.npy", tmp_path / "py.h5", overwrite=True)  # Python: auto too
        with h5py.File(tmp_path / "py.h5") as f:
            assert f.attrs["layout"] == layout and (layout == "dense") == isinstance(f["X"], h5py.Dataset)
        assert out["rows"] == 45


@settings(max_examples=60, derandomize=True, deadline=None)
@given(columns=st.integers(1, 10**6), row_bytes=st.integers(0, 10**8))
def test_chunk_rows_follow_the_widest_intermediate(columns, row_bytes):
    """A chunk holds about CHUNK_BYTES counted at the wider of a row's intermediates and
    its columns in float64 (never more, unless the 16-row floor)."""
    from rfsgen import budget
    from rfsgen.output import CHUNK_BYTES, default_chunk_rows

    with budget.limited(1 << 40):
        rows = default_chunk_rows(columns, row_bytes)
    per_row = max(8 * columns, row_bytes)
    assert 16 <= rows <= 8192
    assert rows == 16 or rows * per_row <= CHUNK_BYTES
    assert rows == 8192 or (rows + 1) * per_row > CHUNK_BYTES


def test_patch_skeleton_chunks_are_sized_from_their_atoms():
    """Issue 26: cifar-patches at D = 4096 has 2 x 12,643 atoms a row; chunks were sized
    from D alone (2048 rows, over 1 GB of intermediates); now about 64 MiB."""
    from rfsgen.output import default_chunk_rows
    from rfsgen.transform import Transformer

    tr = Transformer(sample(load_skeleton(skeleton_path("cifar-patches")), 4096, seed=1))
    assert tr.source_width == 2 * 12643
    rows = default_chunk_rows(tr.columns, tr.row_bytes)
    assert rows * tr.row_bytes <= 64 << 20 and rows < 2048


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compress_into_is_compress_rows_on_every_thread(dtype, monkeypatch):
    """The in-memory CSR's compression (a counting pass, then every row written at its place,
    rows split over threads) gives compress_rows' arrays: exact zeros of either sign dropped,
    NaN, subnormals and full rows kept, written at an offset into longer arrays."""
    from rfsgen import _compiled
    from rfsgen._compiled import compress_rows
    from rfsgen.output import compress_into

    rng = np.random.default_rng(3)
    vals = rng.standard_normal((6000, 70)).astype(dtype)  # rows for 3 parts of 1,872
    vals[rng.random(vals.shape) < 0.3] = 0.0
    vals[5] = -0.0
    vals[6, 3] = np.nan
    vals[7, 9] = np.finfo(dtype).tiny / 4
    vals[8] = 1.0
    want_d, want_i, want_c = np.zeros(420_009, dtype), np.zeros(420_009, np.int32), np.zeros(6000, np.int64)
    k = compress_rows(vals, want_d, want_i, want_c)
    for parts in (1, 3):
        monkeypatch.setattr(_compiled, "threads", lambda: parts)
        assert len(_compiled.row_parts(6000, min_rows=(1 << 17) // 70)) - 1 == parts
        data, indices, counts = np.zeros(420_009, dtype), np.zeros(420_009, np.int32), np.zeros(6000, np.int64)
        assert compress_into(vals, data[9:], indices[9:], counts) == k
        assert data[9:9 + k].tobytes() == want_d[:k].tobytes()
        assert indices[9:9 + k].tolist() == want_i[:k].tolist() and counts.tolist() == want_c.tolist()
        assert not data[:9].any() and not data[9 + k:].any()  # nothing written outside its place
    with pytest.raises(ValueError, match="must hold"):
        compress_into(vals, np.zeros(100, dtype), np.zeros(100, np.int32), np.zeros(6000, np.int64))

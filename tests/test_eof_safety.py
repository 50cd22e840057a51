"""Issue 37 (items 1-5, EOF): compiled loops stay inside their arrays whatever values they
get; boxes whose width overflows or that lose the rows' resolution are refused at
sample; EOF features stay usable in float32 (a recorded power-of-two scale) and a row
that would underflow or overflow the output dtype is an error; NaN rows and bad seeds on
the EOF path; the memory budget of kernel --eof and of the EOF transform's tables."""

import json
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from conftest import ROOT
from rfsgen import eof, parse_skeleton
from rfsgen.budget import limited
from rfsgen.cli import main
from rfsgen.errors import DataError, FeatureFileError, LimitError, UsageError
from rfsgen.features import load, save
from rfsgen.transform import transform


def skel_text(kernel, d, domain=None, scale=1.0):
    dom = f", domain: {domain}" if domain is not None else ""
    sc = f", scale: {scale:.6e}" if kernel == "laplace" else ""
    return f"rfsgen: 1\ninput: {{width: {d}}}\nnodes:\n  - {{name: x, base: {kernel}{sc}{dom}, columns: '0:{d}'}}\n"


def skeleton(kernel, d, domain=None, scale=1.0):
    return parse_skeleton(skel_text(kernel, d, domain, scale), f"{kernel}.yaml")


def run(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def one_line(result):
    err = result.stderr if hasattr(result, "stderr") else result.output
    lines = [ln for ln in err.splitlines() if ln.startswith("rfsgen: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------- 1. compiled loops
BOUNDS_SCRIPT = textwrap.dedent("""
    import numpy as np
    from rfsgen import eof, parse_skeleton
    from rfsgen._compiled import search_right, cis
    from rfsgen._sincos import sincos_into, sincos, slow_sincos

    EXTREME = np.array([np.nan, np.inf, -np.inf, 1e308, -1e308, -0.0, 0.0, 1.0, np.nextafter(1.0, 2.0),
                        5e-324, -5e-324, 0.5, 0.25, 2.0**-60, 1 - 2.0**-53, 1.7976931348623157e308, -3.0])
    rng = np.random.default_rng(37)
    checked = 0
    for kernel, boundary in [(k, b) for k in eof.KERNELS for b in ("pinned", "free")]:
        free = boundary == "free"
        for d, level in ((1, 6), (3, 4), (5, 3)):
            skel = parse_skeleton("rfsgen: 1\\ninput: {width: %d}\\nnodes:\\n  - {name: x, base: %s%s, domain: [-2, 3], "
                                  "boundary: %s, columns: '0:%d'}\\n"
                                  % (d, kernel, ", scale: 1.3" if kernel == "laplace" else "", boundary, d), "k.yaml")
            fs = eof.sample(skel, level=level)
            t = eof.Transformer(fs, np.float64)
            for case in range(60):  # generated: mixtures of extreme and ordinary unit coordinates
                m = int(rng.integers(1, 6))
                u = np.where(rng.random((m, d)) < 0.5, rng.choice(EXTREME, (m, d)), rng.random((m, d)))
                out = np.zeros((m, t.columns))
                peak = np.zeros(m)
                eof._rows(np.ascontiguousarray(u), t.kernel, t.free, t.s, t.mult, t.top, t.act_ptr, t.act_j, t.act_l,
                          t.act_stride, t.off, t.table, out, peak, 0, m)
                assert np.isfinite(out).all() and np.isfinite(peak).all(), (kernel, d, u)
                # the same rows clipped first (what the transform does) give the same values
                clipped = np.clip(np.nan_to_num(u, nan=0.0), 0.0, 1.0)
                ref = np.zeros_like(out)
                eof._rows(np.ascontiguousarray(clipped), t.kernel, t.free, t.s, t.mult, t.top, t.act_ptr, t.act_j, t.act_l,
                          t.act_stride, t.off, t.table, ref, peak, 0, m)
                assert np.array_equal(out, ref)
                # a table that points anywhere is skipped, never followed
                bad = t.table.copy()
                bad[rng.integers(0, bad.size, max(1, bad.size // 3))] = rng.choice([10**12, -5, 2**62, t.columns])
                eof._rows(np.ascontiguousarray(u), t.kernel, t.free, t.s, t.mult, t.top, t.act_ptr, t.act_j, t.act_l,
                          t.act_stride, t.off, bad, out, peak, 0, m)
                # the CSR loop: the dense rows' non-zeros, a wrong table skipped, short arrays left alone
                T = t.max_row_nonzeros
                data, ind, cnt = np.zeros(m * T), np.zeros(m * T, np.int32), np.zeros(m, np.int64)
                for table in (bad, t.table):
                    eof._rows_csr(np.ascontiguousarray(u), t.kernel, t.free, t.s, t.mult, t.top, t.pad_j, t.pad_l,
                                  t.pad_stride, t.off, table, t.columns, np.zeros(0), data, ind, cnt, peak, 0, m)
                    assert np.isfinite(data).all() and ((ind >= 0) & (ind < max(t.columns, 1))).all()
                rr, cc = np.nonzero(ref)
                assert np.array_equal(cnt, np.count_nonzero(ref, axis=1))
                assert np.array_equal(data[:rr.size], ref[rr, cc]) and np.array_equal(ind[:rr.size], cc)
                eof._rows_csr(np.ascontiguousarray(u), t.kernel, t.free, t.s, t.mult, t.top, t.pad_j, t.pad_l,
                              t.pad_stride, t.off, t.table, t.columns, np.zeros(0), data[:m * T - 1], ind, cnt, peak, 0, m)
                cell, val = eof.factors(kernel, t.s, clipped, t.top, boundary)
                assert np.isfinite(val).all()
                for lv in range(1, t.top + 1):  # slot levels: the free grid's level lv - 1
                    assert ((cell[:, :, lv] >= 0) & (cell[:, :, lv] < eof.cells_per_level(lv - free, free))).all()
                checked += 1
            # extreme scales and levels: memory safety only (the box check refuses these scales)
            for s in (0.0, np.nan, np.inf, 1e308, 5e-324, -1.0):
                try:  # or an error (numba raises ZeroDivisionError for s = 0), never a stray access
                    eof.factors(kernel, np.full(d, s), rng.choice(EXTREME, (4, d)), 5, boundary)
                except ZeroDivisionError:
                    pass
    cdf = np.cumsum(np.full(10, 0.1))
    guide = np.searchsorted(cdf, np.arange(9) / 8, side="right").astype(np.int64)
    for case in range(200):
        with np.errstate(over="ignore", invalid="ignore"):
            v = rng.choice(EXTREME, 7) * rng.choice([1.0, 1e300, -1.0], 7)
        idx = np.empty(7, np.int64)
        search_right(cdf, guide, v, idx)
        assert ((idx >= 0) & (idx <= cdf.size)).all(), (v, idx)
        ok = np.isfinite(v) & (v >= 0) & (v <= 1)
        assert np.array_equal(idx[ok], np.searchsorted(cdf, v[ok], side="right"))
        with np.errstate(over="ignore", invalid="ignore"):
            theta = np.concatenate([EXTREME, rng.choice(EXTREME, 9) * rng.random(9) * 1e300])
        re, im = np.empty_like(theta), np.empty_like(theta)
        sincos_into(theta, theta.size, re, im)
        assert np.isfinite(re[np.isfinite(theta)]).all() and np.isnan(re[~np.isfinite(theta)]).all()
        for x in theta[:5]:
            sincos(x), slow_sincos(x)
        re2, im2 = np.empty((1, theta.size)), np.empty((1, theta.size))
        cis(theta[None, :], re2, im2)
        assert np.array_equal(re2[0], re, equal_nan=True)
        checked += 1
    print("checked", checked)
""")


def test_every_compiled_entry_point_stays_in_bounds_on_extreme_values(tmp_path):
    """Generated cases (fixed seed) of NaN, +-inf, +-1e308, subnormals and out-of-cube
    values fed straight into the EOF loop (bypassing the transform's checks), its 1-D
    factors, the sampler's bucket search and the sin/cos kernels, compiled with bounds
    checks on (``NUMBA_BOUNDSCHECK=1``, a fresh cache): nothing reads or writes outside
    an array (an IndexError would fail the run), and every value from finite scales is
    finite and equals the clipped row's."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT),
               NUMBA_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", BOUNDS_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checked 920" in r.stdout


# ---------------------------------------------------------------------- 2. boxes and extremes
@pytest.mark.parametrize("kernel", eof.KERNELS)
@pytest.mark.parametrize("scheme", ["eof", "rfs"])
def test_sample_refuses_a_domain_whose_width_overflows(tmp_path, kernel, scheme):
    """The issue's [-1e308, 1e308] (hi - lo overflows): refused at sample, one line naming the
    node and the fix, exit 2, no file -- under eof (was: SIGSEGV in transform, NaN laplace
    features) and the default scheme (was: all-zero brownian features)."""
    p = tmp_path / "wide.yaml"
    p.write_text(skel_text(kernel, 2, "[-1.0e+308, 1.0e+308]"))
    args = ["--scheme", "eof", "--level", 6] if scheme == "eof" else ["-n", 8]
    r = run("sample", p, *args, "-o", tmp_path / "f.h5")
    assert r.exit_code == 2
    line = one_line(r)
    assert "node 'x'" in line and "hi - lo overflows" in line and "state a box" in line
    assert not list(tmp_path.glob("f.h5*"))


def test_sample_refuses_a_domain_that_loses_the_rows_resolution(tmp_path):
    p = tmp_path / "narrow.yaml"
    p.write_text(skel_text("brownian", 2, "[[1.0e+16, 0], [1.0000000001e+16, 1]]"))
    r = run("sample", p, "--scheme", "eof", "--level", 3, "-o", tmp_path / "f.h5")
    assert r.exit_code == 2
    line = one_line(r)
    assert "column 0" in line and "resolution" in line and "500,000 float64 values" in line


def test_domain_from_rows_of_1e308_and_a_huge_margin_are_refused_at_sample(tmp_path):
    """Never a feature file that transform then refuses: the measured box's width, and the
    margin's widening, are checked at sample (rows: exit 1; --margin: exit 2), naming the column."""
    p = tmp_path / "lap.yaml"
    p.write_text(skel_text("laplace", 2))
    big = tmp_path / "big.npy"
    np.save(big, np.array([[1e308, 0.0], [-1e308, 1.0], [0.0, 2.0]]))
    r = run("sample", p, "--scheme", "eof", "-n", 10, "--domain-from", big, "-o", tmp_path / "f.h5")
    assert r.exit_code == 1
    line = one_line(r)
    assert "big.npy" in line and "column 0" in line and "overflows" in line and "rescale the column" in line
    ok = tmp_path / "ok.npy"
    np.save(ok, np.array([[0.1, 0.2], [0.5, 1.0], [0.9, 0.3]]))
    r = run("sample", p, "--scheme", "eof", "-n", 10, "--domain-from", ok, "--margin", "1e308", "-o", tmp_path / "f.h5")
    assert r.exit_code == 2
    line = one_line(r)
    assert "--margin 1e+308" in line and "node 'x', column 0" in line and "smaller --margin" in line
    assert not list(tmp_path.glob("f.h5*"))
    r = run("approx", p, big, "--scheme", "eof", "-n", 8, "--subset", 3)
    assert r.exit_code == 1 and "overflows" in one_line(r)


def forged(tmp_path, skel, mutate, **kw):
    fs = eof.sample(skel, **kw)
    fs.eof = eof.Columns(dict(fs.eof.meta), fs.eof.level, fs.eof.index)
    mutate(fs.eof.meta)
    path = tmp_path / "forged.h5"
    save(fs, path, overwrite=True)
    return path


@pytest.mark.parametrize("lo, hi", [([-1e308, 0.0], [1e308, 1.0]), ([1e16, 0.0], [1e16 + 2, 1.0])])
def test_a_feature_file_with_an_unsafe_box_is_refused_on_load(tmp_path, lo, hi):
    path = forged(tmp_path, skeleton("brownian", 2, "[0, 1]"), lambda m: m.update(lo=lo, hi=hi), level=3)
    with pytest.raises(FeatureFileError, match="the EOF box of 'x', column 0"):
        load(path)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(kernel=st.sampled_from(eof.KERNELS),
       lo=st.floats(allow_nan=False, allow_infinity=False, min_value=-1.7e308, max_value=1.7e308),
       span=st.floats(min_value=1e-320, max_value=1e308), scale=st.sampled_from([1e-90, 0.3, 1.0, 1e60]))
def test_every_accepted_box_gives_finite_features_and_kernel(kernel, lo, span, scale):
    """Generated boxes, from subnormal widths to ones near float64's largest: the library
    either refuses the box (UsageError / the skeleton's ValueError, one line) or gives
    finite EOF features, a finite limit kernel and, for brownian, finite default-scheme
    features -- for rows inside, on and far outside the box (+-1e308)."""
    hi = lo + span
    if not np.isfinite(hi) or not hi > lo:
        return
    try:
        skel = skeleton(kernel, 2, f"[{lo!r}, {hi!r}]", scale)
        fs = eof.sample(skel, level=3)
    except (ValueError, UsageError) as err:
        assert "\n" not in str(err)
        return
    mid = lo + (hi - lo) / 2
    x = np.array([[mid, mid], [lo, hi], [1e308, -1e308], [-1e308, mid], [mid, lo + (hi - lo) / 3]])
    z = transform(fs, x, layout="dense", dtype="float64")
    # (a laplace kernel far narrower than the box decays to float64 zero off the grid's centers)
    assert np.isfinite(z).all() and (z[0].any() or scale * (hi - lo) > 1e6)
    k = eof.kernel(skel, x, lo=fs.eof.lo, hi=fs.eof.hi)
    assert np.isfinite(k).all() and k[0, 0] > 0
    if kernel == "brownian":
        from rfsgen import sample

        z = transform(sample(skel, 16, seed=1), x[:2], layout="dense", dtype="float64")
        assert np.isfinite(z).all() and z[0].any()


def test_a_wide_finite_brownian_box_is_not_all_zero():
    """[-8e307, 8e307]: finite width.  Rows inside have the kernel 1/4 per column at the
    center (not zero); under eof and the default scheme the features are not all zero."""
    from rfsgen import sample

    skel = skeleton("brownian", 2, "[-8.0e+307, 8.0e+307]")
    x = np.array([[0.1, 5.0], [1e307, -1e307]])
    k = eof.kernel(skel, x, lo=skel.nodes[skel.output].base.params[0][1][0], hi=8e307)
    assert np.isfinite(k).all() and k[0, 0] == pytest.approx(1 / 16)
    for fs in (eof.sample(skel, level=4), sample(skel, 64, seed=0)):
        z = transform(fs, x, layout="dense", dtype="float64")
        assert np.isfinite(z).all() and z[0].any()


# ---------------------------------------------------------------------- 3. float32
def test_eof_d81_laplace_float32_is_not_all_zero(tmp_path):
    """The issue's case: a laplace node on rows in [0, 1]^81, 160 columns, default float32.
    Was: an all-zero matrix (values about 1e-60).  Now the file records a scale 2^e and
    float32 keeps every non-zero of float64, to float32's precision; the kernel is
    recovered as Z Z^T / 4^e."""
    p = tmp_path / "l81.yaml"
    p.write_text(skel_text("laplace", 81))
    rows = tmp_path / "u.npy"
    np.save(rows, np.random.default_rng(0).random((40, 81)))
    assert run("sample", p, "--scheme", "eof", "-n", 160, "--domain-from", rows, "-o", tmp_path / "f.h5").exit_code == 0
    fs = load(tmp_path / "f.h5")
    e = fs.eof.scale_exponent
    assert e > 0 and json.loads(h5py.File(tmp_path / "f.h5", "r").attrs["eof"])["scale_exponent"] == e
    x = np.load(rows)
    z32 = transform(fs, x, layout="dense")
    z64 = transform(fs, x, layout="dense", dtype="float64")
    assert z32.dtype == np.float32 and np.count_nonzero(z32) == np.count_nonzero(z64) > 0
    np.testing.assert_allclose(z32, z64, rtol=2e-7, atol=0)
    assert 2.0**-40 < np.abs(z64).max() < 2.0**120
    # Z Z^T / 4^e is the unscaled features' Gram matrix, bit for bit (a power of two)
    plain = eof.Columns({k: v for k, v in fs.eof.meta.items() if k != "scale_exponent"}, fs.eof.level, fs.eof.index)
    fs0 = load(tmp_path / "f.h5")
    fs0.eof = plain
    z0 = transform(fs0, x, layout="dense", dtype="float64")
    assert np.array_equal(z64 * 2.0**-e, z0)


@pytest.mark.parametrize("kernel, d, scale", [("brownian", 30, 1.0), ("laplace", 30, 0.7), ("laplace", 1, 1e-80)])
def test_scaled_features_are_exactly_two_to_the_e_times_the_unscaled(kernel, d, scale):
    skel = skeleton(kernel, d, "[-1, 2]", scale)
    fs = eof.sample(skel, columns=300, seed=3)
    e = fs.eof.scale_exponent
    assert e >= eof.SCALE_FROM
    x = np.random.default_rng(d).uniform(-1, 2, (25, d))
    z = transform(fs, x, layout="dense", dtype="float64")
    fs.eof = eof.Columns({k: v for k, v in fs.eof.meta.items() if k != "scale_exponent"}, fs.eof.level, fs.eof.index)
    z0 = transform(fs, x, layout="dense", dtype="float64")
    assert np.array_equal(z, np.ldexp(z0, e)) and z.any()
    assert np.count_nonzero(z.astype(np.float32)) == np.count_nonzero(z)


@pytest.mark.parametrize("kernel, d", [("brownian", 8), ("laplace", 4), ("brownian", 1)])
def test_no_scale_where_none_is_needed_keeps_the_file(kernel, d, tmp_path):
    """Features of unit-ish order: no scale recorded, the 'eof' attribute has its old keys
    (the bytes of existing EOF files and outputs are unchanged)."""
    fs = eof.sample(skeleton(kernel, d, "[-2, 3]", 1.3), level=3)
    assert fs.eof.scale_exponent == 0 and "scale_exponent" not in fs.eof.meta
    assert (fs.eof.multipliers() == 1.0).all()


def test_a_row_that_would_underflow_or_overflow_the_dtype_is_an_error():
    """Without the scale (a file of before), d = 81 underflows float32: a one-line DataError
    naming the row, never a silent zero; float64 holds it.  A scale pushing values past
    float32's largest is an error too."""
    skel = skeleton("laplace", 81, "[-0.05, 1.05]")
    fs = eof.sample(skel, columns=160, seed=0)
    fs.eof = eof.Columns({k: v for k, v in fs.eof.meta.items() if k != "scale_exponent"}, fs.eof.level, fs.eof.index)
    x = np.random.default_rng(0).random((5, 81))
    with pytest.raises(DataError, match=r"^<array>: row 0: its largest EOF feature is .*below float32's smallest normal"):
        transform(fs, x, layout="dense")
    assert transform(fs, x, layout="dense", dtype="float64").any()
    meta = dict(fs.eof.meta, scale_exponent=400)
    fs.eof = eof.Columns(meta, fs.eof.level, fs.eof.index)
    with pytest.raises(DataError, match="beyond float32"):
        transform(fs, x, layout="dense")


@pytest.mark.parametrize("bad", [0, -3, True, 1.5, 10**9])
def test_a_bad_scale_exponent_in_a_file_is_refused(tmp_path, bad):
    skel = skeleton("brownian", 30, "[0, 1]")
    assert eof.sample(skel, level=1).eof.scale_exponent > 0
    path = forged(tmp_path, skel, lambda m: m.update(scale_exponent=bad), level=1)
    with pytest.raises(FeatureFileError, match="scale exponent"):
        load(path)


# ---------------------------------------------------------------------- 4. NaN rows and seeds
def test_kernel_eof_refuses_nan_rows(tmp_path):
    p = tmp_path / "lap.yaml"
    p.write_text(skel_text("laplace", 2))
    train, rows = tmp_path / "train.npy", tmp_path / "rows.npy"
    np.save(train, np.array([[0.1, 0.2], [0.5, 1.0], [0.9, 0.3]]))
    np.save(rows, np.array([[0.1, 0.2], [np.nan, 1.0]]))
    r = run("kernel", p, rows, "--eof", "--domain-from", train, "-o", tmp_path / "K.npy")
    assert r.exit_code == 1
    assert "rows.npy: row 1, column 0: value is nan" in one_line(r)
    assert not list(tmp_path.glob("K.npy*"))
    r = run("kernel", p, train, rows, "--eof", "--domain-from", train, "-o", tmp_path / "K.npy")
    assert r.exit_code == 1 and "rows.npy: row 1" in one_line(r)


@pytest.mark.parametrize("seed", ["-1", str(2**64), str(2**63)])
@pytest.mark.parametrize("how", [["-n", "5"], ["--level", "2"]])
def test_eof_seed_is_checked_like_every_scheme(tmp_path, seed, how):
    p = tmp_path / "b.yaml"
    p.write_text(skel_text("brownian", 2))
    r = run("sample", p, "--scheme", "eof", *how, "--seed", seed, "-o", tmp_path / "f.h5")
    assert r.exit_code == 2
    assert f"--seed must be an integer from 0 to 2**63 - 1, got {seed}" in one_line(r)
    assert not list(tmp_path.glob("f.h5*"))


# ---------------------------------------------------------------------- 5. the memory budget
def test_kernel_eof_is_counted_against_the_budget(tmp_path):
    """The issue's 4,000 rows under --max-memory 64M (was: 733 MiB used, exit 0)."""
    p = tmp_path / "lap.yaml"
    p.write_text(skel_text("laplace", 2, "[0, 1]"))
    rows = tmp_path / "r.npy"
    np.save(rows, np.random.default_rng(0).random((4000, 2)))
    r = run("kernel", p, rows, "--eof", "-o", tmp_path / "K.npy", "--max-memory", "64M")
    assert r.exit_code == 1
    line = one_line(r)
    assert "the EOF limit kernel on 4000 x 4000 rows" in line and "64.0 MiB" in line and "--rows" in line
    assert not list(tmp_path.glob("K.npy*"))


def test_kernel_eof_blocks_give_the_same_bits():
    skel = skeleton("laplace", 3, "[0, 1]")
    x = np.random.default_rng(1).random((300, 3))
    whole = eof.kernel(skel, x, lo=0.0, hi=1.0)
    with limited(8.0 * 300 * 300 + 8.0 * 6 * 300 + 8 * eof.K1_TEMPORARIES * 300 * 7):  # blocks of about 7 rows
        blocked = eof.kernel(skel, x, lo=0.0, hi=1.0)
    assert np.array_equal(whole, blocked)


def test_eof_transform_counts_its_per_thread_tables():
    """A node of 8,000 brownian columns: each thread's (d + 1)^2 table is 512 MB, counted
    before the transform starts (was: uncounted)."""
    skel = skeleton("brownian", 8000, "[0, 1]")
    fs = eof.sample(skel, level=1)
    with limited("64M"), pytest.raises(LimitError, match=r"working tables in 8000 dimensions"):
        eof.Transformer(fs)


# ---------------------------------------------------------------------- 5. boundary: free
@pytest.mark.parametrize("d, scale, width", [(81, 1.0, 1.1), (30, 3.0, 3.0), (2, 1e-80, 3.0), (3, 1e90, 3.0)])
def test_free_boundary_float32_is_usable_and_finite(d, scale, width):
    """The free boundary's features are products of level-0 factors exp(-s |u - 1/2|): at
    d = 81 they underflow float32 unless scaled; the recorded 2^e keeps every non-zero of
    float64 in float32 and Z Z^T / 4^e is the unscaled Gram matrix.  Extreme scales (s tiny or
    huge) and rows on faces, at the centre and outside the box give finite values, never NaN."""
    text = skel_text("laplace", d, f"[-1, {width - 1}]", scale).replace("columns:", "boundary: free, columns:")
    skel = parse_skeleton(text, "free.yaml")
    fs = eof.sample(skel, columns=200, seed=4)
    rng = np.random.default_rng(d)
    x = rng.uniform(-1, width - 1, (30, d))
    x[0], x[1], x[2], x[3] = -1.0, width - 1.0, (width - 2) / 2, 1e300  # faces, centre, far outside
    x[4] = -1e308
    z64 = transform(fs, x, layout="dense", dtype="float64")
    assert np.isfinite(z64).all() and (z64.any() or scale > 1e10)  # a kernel far narrower than a cell: zeros
    e = fs.eof.scale_exponent
    if d == 81:
        assert e >= eof.SCALE_FROM
    if np.abs(z64).max(axis=1).min() >= np.finfo(np.float32).tiny:
        z32 = transform(fs, x, layout="dense")
        assert np.count_nonzero(z32) == np.count_nonzero(z64)
        np.testing.assert_allclose(z32, z64, rtol=2e-7, atol=0)
    plain = eof.Columns({k: v for k, v in fs.eof.meta.items() if k != "scale_exponent"}, fs.eof.level, fs.eof.index)
    fs.eof = plain
    z0 = transform(fs, x, layout="dense", dtype="float64")
    assert np.array_equal(z64 * 2.0**-e, z0)

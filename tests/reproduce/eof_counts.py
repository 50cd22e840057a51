"""The seed 002's EOF feature counts (Table 2: 2048 / 161 / 338 / 128): which index-set
convention gives them?  (issue 40, item 3)

    python tests/reproduce/eof_counts.py [--no-check] [--json PATH]

The seed (``seeds/002_f98ed459b9c81ecb.txt``, section 7) draws a random D-subset of the
smallest sparse grid I_n = {l in N1^d : |l|_1 <= n + d - 1} (its equation (11)) with at least
D features; each level vector l holds 2^(|l|_1 - d) features (odd indices, 2^(l_j - 1) per
coordinate).  Its Table 2 lists, in its own order, MNIST (d = 32, D = 80): 2048,
Superconductivity (d = 81, D = 160): 161, Electrical Grids Stability (d = 13, D = 60): 338,
Energy Efficiency (d = 8, D = 60): 128 -- the column where LKRF and EERF list their pool
N0 = 10 D, so for EOF the size of the grid the D features were drawn from.  rfsgen's
grid at those (d, D) has 2177 / 163 / 391 / 161 features (levels n = 3 / 2 / 3 / 3).

Every count here is a closed form (a binomial or multinomial sum over the level vectors'
*shapes*: which excess levels k_j = l_j - 1 > 0 occur, how often; ``count``), cross-checked
against rfsgen.eof's own enumeration (``grid_counts``, ``level_vectors``,
``enumerate_features``, ``smallest_level``; imported read-only) and against brute force
(``brute_count``) for small d.

A convention is (per-coordinate weights, index set, offset):

* weights w(k), the number of features a coordinate contributes at excess level k = l - 1
  (a level vector holds prod_j w(k_j)): ``interior`` 1, 2, 4, ... (the seed's odd indices,
  2^(l-1), rfsgen's); ``nodal`` 1, 3, 7, ... (2^l - 1: every point of each level vector's
  full grid, not only the new odd ones); ``vectors`` 1, 1, 1, ... (counting level vectors);
  ``boundary`` 2, 1, 2, 4, ... (a level 0 holding the two face points, then interior);
  ``modified`` 1, 1, 2, 4, ... (one level-0 function per coordinate, e.g. a constant);
  ``nodal+bd`` 3, 5, 9, ... (2^l + 1: full grids with their faces);
* index set: ``sparse`` |k|_1 <= B (equation (11) with B = n - 1; "<" instead of "<=", or
  levels from 0 instead of 1, only relabel B); ``energy T`` |k|_1 - T max_j k_j <= (1 - T) B
  (Griebel-Knapek's optimised grids: T = 0 is sparse, T > 0 drops mixed levels, T < 0 adds
  them); ``full`` max_j k_j <= B;
* dimension: d, d - 1 (a column dropped, e.g. an id, intercept or label column), d - 2,
  d + 1 (a column added);
* offset: + 0, + 1 (an extra constant / intercept column), - 1 (the root feature dropped).

Two searches: (1) the level B chosen by the seed's rule (the smallest grid with at least D
features, under that convention) at the seed's d shifted by one common amount; (2) any
level, each data set its own dimension in ``DIMS`` (d - 5 .. d + 5, and Energy Efficiency's
one-hot expansions 14 and 16): any data-set dimension convention near the stated d.  And
two count-as-cap candidates (the largest power of two <= rfsgen's count; D itself).

Result (printed; asserted by tests/test_reproduce_eof_counts.py; docs/eof-experiment.md):
no convention of the family gives all four numbers, not even with any level and each data
set its own dimension near the stated one.  The closest is the seed's own grid on d - 1
coordinates plus one constant feature (2 d^2 at n = 3): 2048 / 162 / 338 / 128, exact on
three sets, one over on Superconductivity, whose 161 is the plain d - 1 grid (2 (d - 1) + 1
at n = 2).  The seed's grid (interior weights; any set of level vectors containing the root
l = (1, ..., 1), as every sparse or full grid does) always has an *odd* number of features --
every other level vector holds 2^(|l|_1 - d), an even number -- so 2048, 338 and 128 are not
the size of any such grid, in any dimension, at any level.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The seed's Table 2 in its own order: (data set, d from Table 1, D, the EOF count).
SEED_TABLE2 = (
    ("MNIST", 32, 80, 2048),
    ("Superconductivity", 81, 160, 161),
    ("Electrical Grids Stability", 13, 60, 338),
    ("Energy Efficiency", 8, 60, 128),
)

#: rfsgen's counts at the seed's (d, D): the smallest I_n with >= D features.
RFSGEN_COUNTS = (2177, 163, 391, 161)

#: Per-coordinate weights w(k), k = l - 1 >= 0 (see the module docstring).
WEIGHTS = {
    "interior": lambda k: 1 << k,
    "nodal": lambda k: (2 << k) - 1,
    "vectors": lambda k: 1,
    "boundary": lambda k: 2 if k == 0 else 1 << (k - 1),
    "modified": lambda k: 1 if k == 0 else 1 << (k - 1),
    "nodal+bd": lambda k: (1 << k) + 1,
}

#: Index sets: "sparse", "energy T" (T a float < 1), "full".
INDEX_SETS = ("sparse", "energy 0.25", "energy 0.5", "energy 0.75", "energy -1", "full")
DIM_SHIFTS = (0, -1, -2, 1)

#: Search (2)'s dimensions per data set: d - 5 .. d + 5 (a few columns dropped or added: an id,
#: intercept or label column; Electrical Grids' 13 = 12 inputs + "stab", the score its label
#: thresholds, 11 without p1 = -(p2 + p3 + p4); Superconductivity's target left in: 82), and
#: Energy Efficiency with its categorical X6 (4 orientations) and X8 (6 glazing distributions)
#: one-hot: 16, or 14 dropping one level each.  A fully free dimension explains anything (level
#: vectors in one dimension: n of them at level n), so it is not searched.
DIMS = {name: sorted(set(range(max(1, d - 5), d + 6)) | ({14, 16} if name == "Energy Efficiency" else set()))
        for name, d, _, _ in SEED_TABLE2}
OFFSETS = (0, 1, -1)


# ---------------------------------------------------------------------- closed forms
def seed_count(d: int, n: int) -> int:
    """|I_n| of the seed's equation (11) with odd-index features: sum_{i < n} C(i + d - 1, d - 1) 2^i."""
    return sum(math.comb(i + d - 1, d - 1) << i for i in range(n))


@lru_cache(maxsize=None)
def _shapes(top: int, sum_cap: int, parts: int) -> tuple:
    """The multisets of at most ``parts`` excess levels k >= 1 (non-increasing tuples) with
    parts <= ``top`` and sum <= ``sum_cap``: the shapes of a level vector's refined coordinates."""
    out = [()]
    if parts:
        for p in range(min(top, sum_cap), 0, -1):
            out += [(p,) + rest for rest in _shapes(p, sum_cap - p, parts - 1)]
    return tuple(out)


def _admits(index_set: str, shape: tuple, B: int) -> bool:
    if index_set == "sparse":
        return sum(shape) <= B
    if index_set == "full":
        return not shape or shape[0] <= B
    T = float(index_set.split()[1])
    return sum(shape) - T * (shape[0] if shape else 0) <= (1 - T) * B + 1e-9


@lru_cache(maxsize=None)
def count(d: int, B: int, weights: str = "interior", index_set: str = "sparse") -> int:
    """The number of features of the index set at level B (excess bound) in d dimensions:
    sum over shapes (multisets of refined excess levels, j of them) of the number of level
    vectors with that shape, d! / ((d - j)! prod_v m_v!), times prod w(k) w(0)^(d - j)."""
    if d < 0 or B < 0:
        return 0
    w = WEIGHTS[weights]
    if index_set == "full":  # a product of d one-dimensional grids
        return sum(w(k) for k in range(B + 1)) ** d
    T = 0.0 if index_set == "sparse" else float(index_set.split()[1])
    sum_cap = B if T >= 0 else math.floor((1 - T) * B)  # |k|_1 <= (1 - T) B + T max <= this
    total = 0
    for shape in _shapes(B, sum_cap, d):
        j = len(shape)
        if not _admits(index_set, shape, B):
            continue
        vectors = math.factorial(d) // math.factorial(d - j)
        for _, run in itertools.groupby(shape):
            vectors //= math.factorial(len(list(run)))
        total += vectors * math.prod(w(k) for k in shape) * w(0) ** (d - j)
    return total


def binomial_count(d: int, B: int, weights: str) -> int:
    """Single binomial sums for the sparse index set (a second closed form, for the cross-check):
    interior sum_m C(m + d - 1, d - 1) 2^m; vectors C(B + d, d); boundary / modified
    sum_{j, m} C(d, j) w0^(d - j) C(m - 1, j - 1) 2^(m - j) (j coordinates refined, excess m)."""
    if weights == "interior":
        return sum(math.comb(m + d - 1, d - 1) << m for m in range(B + 1))
    if weights == "vectors":
        return math.comb(B + d, d)
    w0 = {"boundary": 2, "modified": 1}[weights]
    return w0 ** d + sum(math.comb(d, j) * w0 ** (d - j) * math.comb(m - 1, j - 1) * (1 << (m - j))
                         for j in range(1, min(d, B) + 1) for m in range(j, B + 1))


def brute_count(d: int, B: int, weights: str = "interior", index_set: str = "sparse") -> int:
    """Every level vector, one by one (small d only)."""
    w = WEIGHTS[weights]
    return sum(math.prod(w(k) for k in ks) for ks in itertools.product(range(B + 1), repeat=d)
               if _admits(index_set, tuple(sorted((k for k in ks if k), reverse=True)), B))


# ---------------------------------------------------------------------- the searches
def rule_level(d: int, D: int, weights: str, index_set: str, offset: int, max_level: int = 40):
    """The seed's rule: the smallest level B whose grid (plus ``offset``) has >= D features."""
    for B in range(max_level + 1):
        if count(d, B, weights, index_set) + offset >= D:
            return B
    return None


def conventions():
    for weights in WEIGHTS:
        for index_set in INDEX_SETS:
            for shift in DIM_SHIFTS:
                for offset in OFFSETS:
                    yield weights, index_set, shift, offset


def at_rule_levels():
    """Search (1): every convention at the seed's d + shift, level by the seed's rule."""
    rows = []
    for weights, index_set, shift, offset in conventions():
        counts, levels = [], []
        for _, d, D, _ in SEED_TABLE2:
            B = rule_level(d + shift, D, weights, index_set, offset)
            levels.append(B)
            counts.append(None if B is None else count(d + shift, B, weights, index_set) + offset)
        hits = sum(c == t for c, (*_, t) in zip(counts, SEED_TABLE2))
        rows.append({"weights": weights, "index_set": index_set, "dim": shift, "offset": offset,
                     "levels": levels, "counts": counts, "matches": hits})
    return rows


def free_solutions(weights, index_set, offset):
    """Search (2): per data set, every (dimension in ``DIMS``, level B) whose count + offset is
    the seed's; exhaustive over levels (counts grow strictly with B)."""
    sols = []
    for name, *_, target in SEED_TABLE2:
        found = []
        for dim in DIMS[name]:
            B = 0
            while (c := count(dim, B, weights, index_set) + offset) <= target:
                if c == target:
                    found.append((dim, B))
                B += 1
        sols.append(found)
    return sols


def free_search():
    out = []
    for weights in WEIGHTS:
        for index_set in INDEX_SETS:
            for offset in OFFSETS:
                sols = free_solutions(weights, index_set, offset)
                out.append({"weights": weights, "index_set": index_set, "offset": offset, "solutions": sols,
                            "sets_matched": sum(bool(s) for s in sols)})
    return out


def caps():
    """Count-as-cap candidates: the largest power of two <= rfsgen's |I_n|, and D itself."""
    pow2 = [1 << (c.bit_length() - 1) for c in RFSGEN_COUNTS]
    return {"largest power of two <= rfsgen's count": pow2, "D": [D for _, _, D, _ in SEED_TABLE2]}


# ---------------------------------------------------------------------- cross-checks
def cross_check(max_d: int = 6, max_n: int = 5) -> list[str]:
    """Closed forms against rfsgen.eof's enumeration and against brute force; returns what disagrees."""
    from rfsgen import eof

    bad = []
    for d in range(1, max_d + 1):
        for n in range(1, max_n + 1):
            vectors, features = eof.grid_counts(n, d)
            lv = eof.level_vectors(n, d)
            t, _ = eof.enumerate_features(lv)
            for what, got, want in (("features", seed_count(d, n), features), ("count", count(d, n - 1), features),
                                    ("enumerated", t.size, features), ("vectors", count(d, n - 1, "vectors"), vectors),
                                    ("level_vectors", lv.shape[0], vectors)):
                if got != want:
                    bad.append(f"d={d} n={n} {what}: {got} != {want}")
            if d <= 4 and n <= 4:
                for weights in WEIGHTS:
                    for index_set in INDEX_SETS:
                        if count(d, n - 1, weights, index_set) != brute_count(d, n - 1, weights, index_set):
                            bad.append(f"d={d} B={n - 1} {weights} {index_set}: closed form != brute force")
                for weights in ("interior", "vectors", "boundary", "modified"):
                    if binomial_count(d, n - 1, weights) != count(d, n - 1, weights):
                        bad.append(f"d={d} B={n - 1} {weights}: binomial sum != shape sum")
    for (_, d, D, _), want in zip(SEED_TABLE2, RFSGEN_COUNTS):
        n = eof.smallest_level(d, D)
        if eof.grid_counts(n, d)[1] != want or rule_level(d, D, "interior", "sparse", 0) != n - 1:
            bad.append(f"d={d} D={D}: rfsgen's smallest_level disagrees")
    for d in (81, 32, 13, 8):  # the large d, by rfsgen's formula
        for n in (1, 2, 3, 4):
            if count(d, n - 1) != eof.grid_counts(n, d)[1]:
                bad.append(f"d={d} n={n}: count != grid_counts")
    return bad


# ---------------------------------------------------------------------- report
def _fmt(c, t):
    if c is None:
        return "-"
    return f"**{c}**" if c == t else str(c) if c < 10 ** 7 else f"{float(c):.2e}"


def rule_table(rule_rows, cap_rows) -> list[str]:
    """Search (1) as a markdown table: rfsgen's family (interior weights, sparse set), every
    other weighting on the sparse set and every other index set with interior weights (at d,
    offset 0), and every convention with >= 2 matches; levels as n = B + 1 (the seed's and
    rfsgen's numbering)."""
    names = [f"{name} (d={d}, D={D})" for name, d, D, _ in SEED_TABLE2]
    lines = ["| weights | index set | dim | offset | levels n | " + " | ".join(names) + " | matches |",
             "|---|---|---|---|---|" + "---|" * len(names) + "---|",
             "| **seed's Table 2** | | | | | " + " | ".join(str(t) for *_, t in SEED_TABLE2) + " | |"]
    def show(r):
        return (r["matches"] >= 2 or (r["weights"] == "interior" and r["index_set"] == "sparse")
                or (r["dim"] == 0 and r["offset"] == 0 and (r["index_set"] == "sparse" or r["weights"] == "interior")))

    order = {w: i for i, w in enumerate(WEIGHTS)}
    shown = sorted((r for r in rule_rows if show(r)),
                   key=lambda r: (-r["matches"], order[r["weights"]], INDEX_SETS.index(r["index_set"])))
    for r in shown:
        dim = "d" if not r["dim"] else f"d{r['dim']:+d}"
        lines.append(f"| {r['weights']} | {r['index_set']} | {dim} | {r['offset']:+d} | "
                     f"{'/'.join('-' if b is None else str(b + 1) for b in r['levels'])} | "
                     + " | ".join(_fmt(c, t) for c, (*_, t) in zip(r["counts"], SEED_TABLE2))
                     + f" | {r['matches']}/4 |")
    for what, cs in cap_rows.items():
        m = sum(c == t for c, (*_, t) in zip(cs, SEED_TABLE2))
        lines.append(f"| cap: {what} | | d | | | " + " | ".join(_fmt(c, t) for c, (*_, t) in zip(cs, SEED_TABLE2))
                     + f" | {m}/4 |")
    return lines


def free_table(free_rows) -> list[str]:
    """Search (2): how many conventions match k of the four sets."""
    hist = [sum(r["sets_matched"] == k for r in free_rows) for k in range(5)]
    return ["| sets matched | 0 | 1 | 2 | 3 | 4 |", "|---|---|---|---|---|---|",
            "| conventions | " + " | ".join(map(str, hist)) + " |"]


def report(rule_rows, free_rows, cap_rows) -> str:
    best = max(r["matches"] for r in rule_rows)
    lines = ["# The seed's EOF counts against index-set conventions", "",
             "Level chosen by the seed's rule (smallest grid with >= D features); **bold** = the seed's number.", ""]
    lines += rule_table(rule_rows, cap_rows)
    lines += ["", f"Conventions at the rule's level: {len(rule_rows)} "
              f"({len(WEIGHTS)} weights x {len(INDEX_SETS)} index sets x {len(DIM_SHIFTS)} dimensions x "
              f"{len(OFFSETS)} offsets); rows shown: rfsgen's family (interior, sparse), the other weights "
              "and index sets at d + 0, and every row with >= 2 matches; "
              f"the best matches {best}/4.", "",
              f"Free search ({len(free_rows)} conventions: weights x index set x offset; each data set its own "
              "dimension (d - 5 .. d + 5, and Energy Efficiency one-hot: 14, 16) and any level): "
              "conventions matching k of the 4 sets:", ""]
    lines += free_table(free_rows)
    lines += ["", "Those matching 3 (dimension, level n per set; [] = none; at most 4 shown):", ""]
    for r in free_rows:
        if r["sets_matched"] >= 3:
            lines.append(f"- {r['weights']}, {r['index_set']}, offset {r['offset']:+d}: "
                         + "; ".join(f"{n}: {[(dim, B + 1) for dim, B in s[:4]]}"
                                     for (n, *_), s in zip(SEED_TABLE2, r["solutions"])))
    odd = all(seed_count(d, n) % 2 == 1 for d in range(1, 100) for n in range(1, 6))
    lines += ["", f"Parity: the seed's grid |I_n| is odd for every d in 1..99, n in 1..5: {odd} "
              "(the root level vector holds 1 feature, every other 2^(|l|_1 - d), even); "
              "2048, 338 and 128 are even."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-check", action="store_true", help="skip the cross-check against rfsgen.eof")
    ap.add_argument("--json", help="also write every row here")
    args = ap.parse_args(argv)
    if not args.no_check:
        bad = cross_check()
        if bad:
            print("eof_counts: cross-check failed:\n  " + "\n  ".join(bad), file=sys.stderr)
            return 1
        print("cross-check: closed forms = rfsgen.eof (grid_counts, level_vectors, enumerate_features, "
              "smallest_level) and brute force: ok\n")
    rule_rows = at_rule_levels()
    free_rows = free_search()
    cap_rows = caps()
    print(report(rule_rows, free_rows, cap_rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"seed": SEED_TABLE2, "rule": rule_rows, "free": free_rows,
                                               "caps": cap_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

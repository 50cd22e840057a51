"""Template expansion of skeleton entries into DAG nodes: ``per:`` and ``columns`` of
input nodes, ``conv``, ``pool``, ``dense``, ``each`` and ``inputs`` wirings of internal
nodes, and the probe width of ``input: {width: auto}``.

:mod:`rfsgen.skeleton` validates the document and the DAG (keys, names, entry order,
cycles, output, depth) and calls :class:`Expander` once per entry in topological
order.  Every template's size — nodes, child references, input column references,
and the memory they take — is computed from its parameters *before* anything is
built and compared with the limits of :mod:`rfsgen.skeleton` (stated in docs/reliability.md, Limits)
and with the memory budget (:func:`rfsgen.budget.check`): a ``conv`` of size 200
over a 400 x 400 array is refused from its arithmetic, not after building 1.6e9
child references.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np

from . import bases as _bases
from . import budget
from .nodes import (
    AUTO_PROBE_WIDTH,
    COMMON_KEYS,
    INPUT_NODE_KEYS,
    MAX_COLUMN_REFS,
    MAX_EDGES,
    MAX_NODES,
    MAX_WIDTH,
    PER_VALUES,
    REF,
    InputNode,
    InternalNode,
    Layer,
)

# Memory the expansion takes at its peak, measured with tracemalloc on CPython 3.12 and
# rounded up (pixel + conv + dense: 142 MB measured, 158 MB estimated; overlapping
# patches: 197 / 199 MB; pixel + each: 62 / 85 MB): a node (its dataclass, label, id)
# ~ 400 bytes; a child or column reference (an int in a tuple, plus the list it came
# from) ~ 50 bytes.
NODE_BYTES = 400
REF_BYTES = 50


def _labels(name: str, shape: tuple):
    """Node labels of a template in row-major order: ``name`` for a single node,
    ``name[i, j]`` for an array (itertools.product is numpy's C order)."""
    if not shape:
        return iter((name,))
    return (f"{name}[{', '.join(map(str, pos))}]" for pos in itertools.product(*map(range, shape)))


def _fmt_int(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"{n:.3g}"


class Expander:
    """Expands entries into ``nodes`` (InputNode / InternalNode, ids in creation order),
    ``arrays`` (entry name -> read-only int64 array of node ids, shaped like the
    entry's template) and ``layers``; ``edges`` counts child references and
    ``columns`` input column references so far."""

    def __init__(self, path: str, width: int, shape: tuple | None, err, check_keys):
        self.path = path
        self.width = width
        self.shape = shape
        self.err = err  # (line, message) -> SkeletonError, from the validating builder
        self.check_keys = check_keys
        self.nodes: list = []
        self.arrays: dict[str, np.ndarray] = {}
        self.layers: list = []
        self.edges = 0
        self.columns = 0

    # ------------------------------------------------------------------ size arithmetic
    def reserve(self, e, name: str, nodes: int, edges: int = 0, columns: int = 0, line=None, fix: str = "") -> None:
        """Check that adding ``nodes`` nodes with ``edges`` child references and
        ``columns`` input column references (Python ints: exact) stays within
        MAX_NODES, MAX_EDGES, MAX_COLUMN_REFS and the memory budget; nothing is built."""
        line = line or e.line
        fix = fix or "use larger windows or strides, or pool first"
        total = len(self.nodes) + nodes
        if total > MAX_NODES:
            raise self.err(line, f"node '{name}' would bring the skeleton to {_fmt_int(total)} nodes, over the limit of "
                                 f"{MAX_NODES}; {fix}")
        if self.edges + edges > MAX_EDGES:
            raise self.err(line, f"node '{name}' would bring the skeleton to {_fmt_int(self.edges + edges)} child "
                                 f"references, over the limit of {MAX_EDGES}; {fix}")
        if self.columns + columns > MAX_COLUMN_REFS:
            raise self.err(line, f"node '{name}' would bring the skeleton to {_fmt_int(self.columns + columns)} input "
                                 f"column references, over the limit of {MAX_COLUMN_REFS}; {fix}")
        est = NODE_BYTES * total + REF_BYTES * (self.edges + edges + self.columns + columns)
        budget.check(est, f"skeleton '{self.path}', node '{name}' (line {line})", fix)

    # ------------------------------------------------------------------ input nodes
    def input_layer(self, e) -> None:
        """Expand an input entry (``base``, ``columns``, ``per``, ``group``, ``patch``)."""
        name = e["name"]
        base_name = e["base"]
        known = isinstance(base_name, str) and base_name in _bases.REGISTRY
        base_keys = tuple(_bases.REGISTRY[base_name].params) if known else ()
        if not known:
            raise self.err(e.lines["base"], f"unknown base '{base_name}' in node '{name}' (allowed: {_bases.allowed_names()})")
        self.check_keys(e, COMMON_KEYS + INPUT_NODE_KEYS + base_keys, f"input node '{name}' (base {base_name})")
        params = {k: e[k] for k in base_keys if k in e}
        cols = self.parse_columns(e)
        per = e.get("per", "all")
        if per not in PER_VALUES:
            raise self.err(e.lines["per"], f"'per' of node '{name}' must be one of {', '.join(PER_VALUES)}, got {per!r}")
        if "patch" in e and per != "patch":
            raise self.err(e.lines["patch"], f"'patch' needs 'per: patch' in node '{name}'")
        if "group" in e and per != "group":
            raise self.err(e.lines["group"], f"'group' needs 'per: group' in node '{name}'")
        if per == "all":
            self.reserve(e, name, 1, columns=len(cols))
            groups, shape = [cols], ()
        elif per == "column":
            self.reserve(e, name, len(cols), columns=len(cols), fix="select fewer columns, or use per: group")
            groups, shape = [[c] for c in cols], (len(cols),)
        elif per == "group":
            g = e.get("group")
            if isinstance(g, bool) or not isinstance(g, int) or g < 1:
                raise self.err(e.lines.get("group", e.line), f"node '{name}' with 'per: group' needs 'group: K' (columns per node)")
            if len(cols) % g:
                raise self.err(e.lines["group"], f"node '{name}': {len(cols)} columns do not split into groups of {g}")
            self.reserve(e, name, len(cols) // g, columns=len(cols), fix="use larger groups")
            groups, shape = [cols[i:i + g] for i in range(0, len(cols), g)], (len(cols) // g,)
        else:
            if self.shape is None:
                raise self.err(e.lines["per"], f"'per: {per}' in node '{name}' needs 'input: {{shape: [H, W, C]}}'")
            if "columns" in e:
                raise self.err(e.lines["columns"], f"'per: {per}' in node '{name}' takes the whole image; drop 'columns'")
            h, w, c = self.shape
            if per == "pixel":
                size, stride = (1, 1), (1, 1)
            else:
                if "patch" not in e:
                    raise self.err(e.lines["per"], f"node '{name}' with 'per: patch' needs 'patch: {{size: K, stride: S}}'")
                size, stride = self.parse_window(e, "patch", 2)
            if size[0] > h or size[1] > w:
                raise self.err(e.lines.get("patch", e.line), f"patch {size[0]}x{size[1]} of node '{name}' does not fit "
                                                             f"the {h}x{w} image; use a smaller size")
            oh, ow = (h - size[0]) // stride[0] + 1, (w - size[1]) // stride[1] + 1
            self.reserve(e, name, oh * ow, columns=oh * ow * size[0] * size[1] * c,
                         line=e.lines.get("patch", e.line), fix="use a smaller patch or a larger stride")
            # A patch's columns in (row, column, channel) order of the image.
            groups = [[((r * stride[0] + i) * w + q * stride[1] + j) * c + k
                       for i in range(size[0]) for j in range(size[1]) for k in range(c)]
                      for r in range(oh) for q in range(ow)]
            shape = (oh, ow)
        try:
            base = _bases.make_base(base_name, params, len(groups[0]))
        except ValueError as ex:
            raise self.err(e.line, f"node '{name}': {ex}") from None
        ids = []
        for label, cols_k in zip(_labels(name, shape), groups):
            node = InputNode(len(self.nodes), label, name, base, tuple(int(c) for c in cols_k))
            self.nodes.append(node)
            ids.append(node.id)
        self.columns += sum(len(g) for g in groups)
        self.register(name, "input", shape, ids, e.line)

    def parse_columns(self, e) -> list:
        """The columns (list of int) an input entry selects, counted (and the count
        checked against MAX_COLUMN_REFS and the memory budget) before they are listed."""
        name = e["name"]
        if "columns" not in e or e["columns"] == "all":
            self.reserve(e, name, 0, columns=self.width)
            return list(range(self.width))
        spec = e["columns"]
        line = e.lines["columns"]
        parts, count = [], 0
        items = spec if isinstance(spec, list) else [spec]
        for item in items:
            if isinstance(item, int) and not isinstance(item, bool):
                parts.append((item,))
                count += 1
            elif isinstance(item, str) and re.fullmatch(r"\s*\d*\s*:\s*\d*\s*", item):
                a, b = item.split(":")
                a, b = int(a) if a.strip() else 0, int(b) if b.strip() else self.width
                if b > self.width:
                    raise self.err(line, f"columns '{item}' of node '{name}' go past the input row (0..{self.width - 1})")
                parts.append(range(a, b))
                count += max(0, b - a)
            else:
                raise self.err(line, f"'columns' of node '{name}' must be 'all', an index, 'A:B', or a list of those; got {item!r}")
        if count > MAX_COLUMN_REFS:
            raise self.err(line, f"'columns' of node '{name}' lists {_fmt_int(count)} columns, over the limit of "
                                 f"{MAX_COLUMN_REFS}")
        self.reserve(e, name, 0, columns=count, line=line, fix="select fewer columns")
        cols = [c for part in parts for c in part]
        if not cols:
            raise self.err(line, f"'columns' of node '{name}' selects no column")
        bad = [c for c in cols if c < 0 or c >= self.width]
        if bad:
            raise self.err(line, f"column {bad[0]} of node '{name}' is outside the input row (0..{self.width - 1})")
        return cols

    # ------------------------------------------------------------------ internal nodes
    def internal_layer(self, e, wiring: str, deps: list, act) -> None:
        """Expand an internal entry whose ``wiring`` (inputs, dense, each, conv, pool)
        takes the entries ``deps`` (already expanded), with activation ``act``."""
        name = e["name"]
        if wiring == "inputs":
            refs = e["inputs"] if isinstance(e["inputs"], list) else [e["inputs"]]
            line = e.lines["inputs"]
            sels = [self.select(str(r), line, name) for r in refs]
            self.reserve(e, name, 1, edges=sum(s.size for s in sels), line=line, fix="refer to fewer nodes")
            children = []
            for s in sels:
                children.extend(s.ravel().tolist())
            self.add_internal(name, "inputs", (), [children], act, e.line)
            return
        src = self.arrays[deps[0]]
        if wiring == "dense":
            if e["dense"] not in (True, None) and e["dense"] != {}:
                raise self.err(e.lines["dense"], f"'dense' of node '{name}' takes no options; write 'dense: true'")
            self.reserve(e, name, 1, edges=src.size, line=e.lines["dense"])
            self.add_internal(name, "dense", (), [src.ravel().tolist()], act, e.line)
        elif wiring == "each":
            self.reserve(e, name, src.size, edges=src.size, line=e.lines["each"])
            self.add_internal(name, "each", src.shape, [[int(i)] for i in src.ravel()], act, e.line)
        else:
            size, stride = self.parse_window(e, wiring, src.ndim)
            if src.ndim == 0:
                raise self.err(e.lines[wiring], f"'{wiring}' of node '{name}' needs an array below it, but '{deps[0]}' is a single node")
            out_shape = []
            for ax in range(src.ndim):
                if size[ax] > src.shape[ax]:
                    raise self.err(
                        e.lines[wiring],
                        f"{wiring} window {'x'.join(map(str, size))} of node '{name}' does not fit the "
                        f"{'x'.join(map(str, src.shape))} array '{deps[0]}'; use a smaller size",
                    )
                out_shape.append((src.shape[ax] - size[ax]) // stride[ax] + 1)
            count = math.prod(out_shape)
            self.reserve(e, name, count, edges=count * math.prod(size), line=e.lines[wiring])
            kids = []
            for pos in np.ndindex(*out_shape):
                window = tuple(slice(p * s, p * s + k) for p, s, k in zip(pos, stride, size))
                kids.append(src[window].ravel().tolist())
            self.add_internal(name, wiring, tuple(out_shape), kids, act, e.line)

    def parse_window(self, e, wiring, ndim):
        spec = e[wiring]
        line = e.lines[wiring]
        if not isinstance(spec, dict) or "size" not in spec:
            raise self.err(line, f"'{wiring}' of node '{e['name']}' must be a mapping with 'size' (and optional 'stride')")
        self.check_keys(spec, ("size", "stride"), f"'{wiring}' of node '{e['name']}'")
        ndim = max(ndim, 1)

        def vec(v, key):
            v = [v] * ndim if isinstance(v, int) and not isinstance(v, bool) else v
            if not isinstance(v, list) or len(v) != ndim or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
                raise self.err(spec.lines.get(key, line), f"'{key}' of '{wiring}' in node '{e['name']}' must be a positive integer or a list of {ndim}")
            return tuple(v)

        size = vec(spec["size"], "size")
        stride = vec(spec.get("stride", spec["size"] if wiring == "pool" else 1), "stride")
        return size, stride

    def add_internal(self, name, kind, shape, kids, act, line):
        """Create one internal node per entry of ``kids`` (lists of child ids); the
        sizes were reserved by the caller."""
        self.edges += sum(len(k) for k in kids)
        ids = []
        for label, children in zip(_labels(name, shape), kids):
            node = InternalNode(len(self.nodes), label, name, act, tuple(int(c) for c in children))
            self.nodes.append(node)
            ids.append(node.id)
        self.register(name, kind, shape, ids, line)

    def register(self, name, kind, shape, ids, line):
        arr = np.array(ids, dtype=np.int64).reshape(shape)
        arr.setflags(write=False)
        self.arrays[name] = arr
        self.layers.append(Layer(name, kind, tuple(shape), tuple(ids), line))

    def select(self, ref, line, owner) -> np.ndarray:
        """The node ids (an int64 array, a view: nothing is copied) that ``ref``
        (``name``, ``name[i]``, ``name[i, a:b]``) selects."""
        m = REF.match(ref)
        arr = self.arrays[m.group(1)]
        if m.group(2) is None:
            return arr
        index = []
        for part in m.group(2).split(","):
            part = part.strip()
            try:
                if ":" in part:
                    a, b = (part.split(":") + [""])[:2]
                    index.append(slice(int(a) if a else None, int(b) if b else None))
                else:
                    index.append(int(part))
            except ValueError:
                raise self.err(line, f"bad index '{part}' in reference '{ref}' of node '{owner}'") from None
        if len(index) > arr.ndim:
            raise self.err(line, f"reference '{ref}' in node '{owner}' has {len(index)} indices but '{m.group(1)}' has shape {list(arr.shape)}")
        try:
            sel = np.asarray(arr[tuple(index)])
        except IndexError:
            raise self.err(line, f"reference '{ref}' in node '{owner}' is out of range for shape {list(arr.shape)}") from None
        if not sel.size:
            raise self.err(line, f"reference '{ref}' in node '{owner}' selects no node")
        return sel


# ----------------------------------------------------------------------------- width: auto
def auto_width(entries, bind_width: int | None, line: int, err) -> int:
    """For ``input: {width: auto}``: check that the structure does not depend on the
    width, and return the width to build at — ``bind_width``, or the probe: the
    smallest multiple of every ``group`` size that is at least AUTO_PROBE_WIDTH.
    A group size, or a least common multiple of group sizes, over MAX_WIDTH is an
    error (no row width could be split into those groups)."""
    entries = entries if isinstance(entries, list) else []
    step, step_by = 1, []
    for e in entries:
        if not isinstance(e, dict) or "base" not in e:
            refs = e.get("inputs", []) if isinstance(e, dict) else []
            for r in refs if isinstance(refs, list) else [refs]:
                m = REF.match(str(r))
                if m and m.group(2) is not None:
                    raise err(e.lines["inputs"], f"node '{e.get('name')}' refers to '{r}', an index into an "
                              "array whose size follows the width; a 'width: auto' skeleton cannot index "
                              "its nodes (use dense, conv, pool or each), or give 'width: N'")
            continue
        name = e.get("name")
        if "columns" in e and e["columns"] != "all":
            raise err(e.lines["columns"], f"input node '{name}' picks columns {e['columns']!r}, which needs a "
                      "fixed width; with 'width: auto' an input node takes all columns (per: all, column or "
                      "group), or give 'width: N'")
        if e.get("per") in ("pixel", "patch"):
            raise err(e.lines["per"], f"'per: {e['per']}' in node '{name}' needs an image shape; "
                      "'width: auto' takes per: all, column or group")
        g = e.get("group")
        if isinstance(g, int) and not isinstance(g, bool) and g >= 1:
            gline = e.lines.get("group", e.line)
            if g > MAX_WIDTH:
                raise err(gline, f"'group: {_fmt_int(g)}' of node '{name}' is over the limit of {MAX_WIDTH} values "
                          "per row; use a smaller group")
            step = math.lcm(step, g)
            step_by.append(f"{g} ('{name}')")
            if step > MAX_WIDTH:
                raise err(gline, f"the groups {', '.join(step_by)} need a row width that is a multiple of "
                          f"{_fmt_int(step)}, over the limit of {MAX_WIDTH} values per row; use group sizes "
                          "that divide one another")
    if bind_width is not None:
        w = int(bind_width)
        if w < 1 or w > MAX_WIDTH:
            raise err(line, f"cannot bind 'width: auto' to {w} columns (1 to {MAX_WIDTH})")
        return w
    return step * max(1, -(-AUTO_PROBE_WIDTH // step))

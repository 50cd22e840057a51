"""Computation skeletons: YAML files parsed into an immutable, validated DAG.

A skeleton file (schema version 1) looks like::

    rfsgen: 1
    input: {shape: [24, 24, 3]}          # or {width: N}, or {width: auto}
    nodes:
      - {name: pixels, base: sphere, scheme: pair, per: pixel}
      - {name: conv1, activation: {name: exp, beta: 0.25}, conv: {size: 5, stride: 2}}
      - {name: conv2, activation: relu, conv: {size: 4, stride: 2}}
      - {name: out, activation: relu, dense: true}
    output: out                           # optional: the unique node that feeds nothing

A skeleton with ``input: {width: auto}`` takes its width from the data: it parses
to an *unbound* :class:`Skeleton` (no nodes yet) and :meth:`Skeleton.bind` builds
it for a given width (the scikit-learn estimator does this at fit time).

This module reads the YAML (one guarded loader: only null, bool, int, float, str,
lists and mappings; recursive aliases and alias bombs refused on the composed graph
before any value is built) and validates the document and the DAG; the templates
(``per:``, conv, pool, dense, each, inputs, ``width: auto``) are expanded by
:mod:`rfsgen.templates`, which checks every size from the parameters first.

See docs/skeletons.md for the whole language.  :func:`load_skeleton`
and :func:`parse_skeleton` return a :class:`Skeleton`; every problem raises a
:class:`~rfsgen.errors.SkeletonError` whose one-line message names the file,
the line and the key, and lists the allowed values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml

from . import _params, templates
from . import activations as _act
from . import bases as _bases
from .errors import SkeletonError

# The language's keys and limits, the reference syntax and the node types live one module
# down, shared with the template expander (rfsgen.templates); this module is their public home.
from .nodes import (  # noqa: F401 (re-exported)
    AUTO_PROBE_WIDTH,
    COMMON_KEYS,
    INPUT_KEYS,
    INPUT_NODE_KEYS,
    INTERNAL_KEYS,
    MAX_COLUMN_REFS,
    MAX_DEPTH,
    MAX_EDGES,
    MAX_NAME,
    MAX_NODES,
    MAX_SOURCE_BYTES,
    MAX_WIDTH,
    MAX_YAML_NODES,
    PER_VALUES,
    REF,
    SCHEMA_VERSION,
    TOP_KEYS,
    WIRINGS,
    InputNode,
    InternalNode,
    Layer,
)


# ----------------------------------------------------------------------------- DAG objects
@dataclass(frozen=True, eq=False)
class Skeleton:
    """An immutable, validated computation skeleton.

    ``nodes`` are in topological order (children before parents); ``output`` is
    the id of the unique node with out-degree 0.  ``width`` is the number of
    float columns of one input row; ``shape`` is ``(H, W, C)`` for images.
    """

    source: str
    path: str
    width: int
    shape: tuple | None
    nodes: tuple
    output: int
    layers: tuple
    description: str = ""
    unused_inputs: tuple = ()  # labels of input nodes pruned because they feed nothing
    auto: bool = False  # the file says 'input: {width: auto}'; unbound while width is None
    #: ``((name, activation), ...)``: Python activations (``make_activation(fn, name=...)``)
    #: that the text names; not in the text, so feature files cannot carry them.
    activations: tuple = ()
    #: ``((name, value), ...)`` in the file's order: the values of the parameters the file
    #: declares under ``params:`` (defaults, or those set by ``params=`` / ``--set``).
    params: tuple = ()

    def __repr__(self) -> str:
        """One line with the essentials (the source text is ``source``): name, width or
        shape, nodes, output, parameters."""
        return f"Skeleton({self._summary()})"

    def _summary(self, short: bool = False) -> str:
        """The inside of :meth:`__repr__` (``short``: the name, width and nodes only, for a
        feature set's repr), under 200 characters whatever the path and parameters."""
        name = self.path if len(self.path) <= 40 else "..." + self.path[-37:]
        if not self.bound:
            shape = "width=auto (unbound)"
        else:
            shape = f"width={self.width}" + (f", shape={tuple(self.shape)}" if self.shape and not short else "")
            n_in = sum(isinstance(n, InputNode) for n in self.nodes)
            shape += f", nodes={len(self.nodes)}" + ("" if short else
                                                      f" ({n_in} input), output={self.nodes[self.output].label!r}")
        params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.params)
        if len(params) > (30 if short else 60):
            params = params[:(27 if short else 57)] + "..."
        return f"{name!r}, {shape}" + (f", params: {params}" if params else "")

    # -------------------------------------------------------------- width: auto
    @property
    def bound(self) -> bool:
        """False for a ``width: auto`` skeleton not yet bound to a width (no nodes)."""
        return self.width is not None

    def bind(self, width: int) -> "Skeleton":
        """This skeleton for rows of ``width`` values.

        A ``width: auto`` skeleton is built for ``width``; a fixed-width skeleton is
        returned as it is when ``width`` matches, else :class:`InputError`.
        """
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)):
            raise TypeError(f"width must be an integer, got {width!r}")
        width = int(width)
        if self.width == width:
            return self
        if not self.auto:
            from .errors import InputError, count

            raise InputError(f"rows have {count(width, 'value')} but skeleton '{self.path}' expects width {self.width}; "
                             "pass matching rows, or write 'input: {width: auto}' in the skeleton")
        return parse_skeleton(self.source, self.path, width=width, activations=dict(self.activations),
                              params=dict(self.params))

    def require_bound(self, what: str) -> None:
        if not self.bound:
            raise SkeletonError(
                f"{self.path}: the skeleton has 'input: {{width: auto}}', so {what} needs its width: bind it first "
                "(skeleton.bind(n_columns), --width N on the command line, or rfsgen.sklearn.SkeletonFeatures, "
                "which binds at fit time)"
            )

    # -------------------------------------------------------------- structure
    @cached_property
    def input_nodes(self) -> tuple:
        return tuple(n for n in self.nodes if isinstance(n, InputNode))

    def check_walkable(self) -> None:
        """Raise :class:`SkeletonError` naming the file and the first input node whose base
        has no compositional features or exact kernel (``Base.walk_problem``: a brownian node
        with ``boundary: free``).  The walked schemes and the exact kernel call it before any work."""
        for n in self.input_nodes:
            problem = n.base.walk_problem
            if problem:
                raise SkeletonError(f"{self.path}: node '{n.label}': {problem}")

    @cached_property
    def internal_nodes(self) -> tuple:
        return tuple(n for n in self.nodes if isinstance(n, InternalNode))

    @cached_property
    def input_groups(self) -> list:
        """Input nodes grouped by base: list of ``(base, node_ids, columns)`` where
        ``columns`` is an int64 ``(G, base.width)`` array."""
        groups: dict = {}
        for n in self.input_nodes:
            groups.setdefault(n.base, []).append(n)
        out = []
        for base, ns in groups.items():
            ids = np.array([n.id for n in ns], dtype=np.int64)
            cols = np.array([n.columns for n in ns], dtype=np.int64).reshape(len(ns), base.width)
            out.append((base, ids, cols))
        return out

    @cached_property
    def complexity(self) -> float:
        """C(S): expected number of base factors per feature (may be ``inf``)."""
        c = np.zeros(len(self.nodes))
        for n in self.nodes:
            if isinstance(n, InputNode):
                c[n.id] = 1.0
            else:
                mean = float(np.mean(c[list(n.children)]))
                d = n.activation.derivative_at_one
                c[n.id] = 0.0 if mean == 0 or d == 0 else d * mean
        return float(c[self.output])

    @cached_property
    def depth(self) -> int:
        """Number of internal nodes on the longest path from an input to the output."""
        d = np.zeros(len(self.nodes), dtype=np.int64)
        for n in self.internal_nodes:
            d[n.id] = 1 + max(d[c] for c in n.children)
        return int(d[self.output])

    def node(self, label: str):
        for n in self.nodes:
            if n.label == label:
                return n
        raise KeyError(label)

    def describe(self) -> dict:
        """A JSON-ready summary: layers, node counts, fan-in, depth, width, C(S).
        For an unbound ``width: auto`` skeleton: path, ``width: "auto"`` and no layers."""
        extra = {"params": dict(self.params)} if self.params else {}
        if not self.bound:
            return {"path": self.path, "width": "auto", "shape": None, "description": self.description,
                    **extra, "layers": []}
        layers = []
        for layer in self.layers:
            first = self.nodes[layer.ids[0]]
            info = {"name": layer.name, "kind": layer.kind, "shape": list(layer.shape), "nodes": len(layer.ids)}
            if isinstance(first, InputNode):
                info["base"] = first.base.label
                info["columns_per_node"] = first.base.width
                info["norm_bound"] = first.base.norm_bound
            else:
                fan = [len(self.nodes[i].children) for i in layer.ids]
                info["activation"] = first.activation.label
                info["fan_in"] = [min(fan), max(fan)]
                info["derivative_at_one"] = first.activation.derivative_at_one
                info["truncation"] = first.activation.truncation
            layers.append(info)
        return {
            "path": self.path,
            "width": self.width,
            "width_auto": self.auto,
            "shape": list(self.shape) if self.shape else None,
            "nodes": len(self.nodes),
            "input_nodes": len(self.input_nodes),
            "internal_nodes": len(self.internal_nodes),
            "depth": self.depth,
            "output": self.nodes[self.output].label,
            "complexity": self.complexity,
            "unused_input_nodes": len(self.unused_inputs),
            **extra,
            "layers": layers,
            # The node whose features have infinite variance (variance_risk), or None.
            "infinite_variance": variance_risk(self),
        }


# ----------------------------------------------------------------------------- YAML with lines
class _LineDict(dict):
    """A dict that remembers the line of each key (1-based) and its own line."""

    line = 0
    lines: dict


#: Longest integer literal (characters) a skeleton may hold: every skeleton number is far
#: smaller, and converting a long literal costs time (a 100,000-part base-60 ``1:2:3...``
#: is quadratic) or fails (Python's 4,300-digit limit).
MAX_INT_CHARS = 100

_TAG = "tag:yaml.org,2002:"
#: The only YAML types a skeleton holds.  Timestamps, binary, sets, ordered maps,
#: pairs and python/* tags are refused by name; plain scalars that YAML 1.1 would
#: read as dates (``2001-02-30``) or as ``=`` stay strings.
_SCALAR_TYPES = {"null": "null", "bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


class _Loader(yaml.SafeLoader):
    """PyYAML's SafeLoader restricted to null, bool, int, float, str, lists and
    mappings (with merge keys); it records each anchored node's anchor name so a
    recursive alias can be reported by name."""

    yaml_constructors = {}  # only those registered below: nothing inherited
    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_TAG + "timestamp", _TAG + "value")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    # YAML 1.1 reads a number with an exponent but no dot (1e-06, 2E5: what Python's repr
    # and most tools write) as a string; YAML 1.2, and a reader of a skeleton, reads a number.
    for _first in "-+.0123456789":
        yaml_implicit_resolvers.setdefault(_first, []).append(
            (_TAG + "float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")))
    del _first

    def __init__(self, text, name):
        super().__init__(text)
        self.name = name
        self.anchor_of: dict[int, str] = {}  # id(node) -> anchor, for error messages

    def compose_node(self, parent, index):
        event = self.peek_event()
        anchor = None if isinstance(event, yaml.AliasEvent) else getattr(event, "anchor", None)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self.anchor_of[id(node)] = anchor
        return node


def _where(loader, node) -> str:
    return f"{loader.name}:{node.start_mark.line + 1}"


def _scalar(kind, construct):
    """A constructor for the scalar type ``kind`` that turns any failure to build the
    value (``!!int six``, ``!!bool maybe``, an integer too long for Python) into a
    one-line SkeletonError naming the line."""

    def build(loader, node):
        text = node.value if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(text, str):
            raise SkeletonError(f"{_where(loader, node)}: '!!{kind}' must tag a single value, not a list or mapping; "
                                "drop the tag")
        if kind == "int" and len(text) > MAX_INT_CHARS:
            raise SkeletonError(f"{_where(loader, node)}: an integer of {len(text)} characters, over the limit of "
                                f"{MAX_INT_CHARS}; skeleton numbers are far smaller (see docs/reliability.md, Limits)")
        try:
            return construct(loader, node)
        except SkeletonError:
            raise
        except Exception:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise SkeletonError(f"{_where(loader, node)}: {shown!r} is not {_SCALAR_TYPES[kind]} (it is tagged or "
                                f"read as !!{kind}); write a valid {kind}, or quote it to make it a string") from None

    return build


def _refuse(loader, node):
    tag = "!!" + node.tag[len(_TAG):] if node.tag.startswith(_TAG) else node.tag
    raise SkeletonError(f"{_where(loader, node)}: the YAML tag '{tag}' is not allowed in a skeleton; write plain "
                        "values (strings, numbers, true/false, null, lists and mappings) without tags")


def _construct_mapping(loader, node, deep=False):
    if not isinstance(node, yaml.MappingNode):
        raise SkeletonError(f"{_where(loader, node)}: '!!map' must tag a mapping; drop the tag")
    loader.flatten_mapping(node)
    out = _LineDict()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise SkeletonError(f"{loader.name}:{key_node.start_mark.line + 1}: a mapping key must be a plain value")
        if key in out:
            raise SkeletonError(
                f"{loader.name}:{key_node.start_mark.line + 1}: duplicate key '{key}'; keep only one"
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_seq(loader, node):
    if not isinstance(node, yaml.SequenceNode):
        raise SkeletonError(f"{_where(loader, node)}: '!!seq' must tag a list; drop the tag")
    return loader.construct_yaml_seq(node)


for _kind in _SCALAR_TYPES:
    _Loader.add_constructor(_TAG + _kind, _scalar(_kind, getattr(yaml.SafeLoader, f"construct_yaml_{_kind}")))
_Loader.add_constructor(_TAG + "seq", _construct_seq)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(None, _refuse)  # every other tag


# ----------------------------------------------------------------------------- parsing
def shipped_dir():
    """The folder of the skeletons shipped with rfsgen (a :mod:`importlib.resources`
    traversable), or None.

    An installed wheel has them as package data in ``rfsgen/skeletons/`` (mapped from the
    repository's top-level ``skeletons/``, their one copy: see pyproject.toml); a source
    checkout (an editable install, or ``PYTHONPATH``) reads that top-level folder itself."""
    from importlib.resources import files

    installed = files("rfsgen").joinpath("skeletons")
    if installed.is_dir():
        return installed
    root = Path(__file__).resolve().parent.parent
    if (root / "skeletons").is_dir() and (root / "pyproject.toml").is_file():
        return root / "skeletons"
    return None


def shipped_skeletons() -> dict:
    """The shipped skeletons: ``{name: one-line description}`` in name order (the name is
    the file name without ``.yaml``; the description is the file's ``description:``)."""
    folder = shipped_dir()
    if folder is None:
        return {}
    out = {}
    for entry in sorted((e for e in folder.iterdir() if e.name.endswith(".yaml")), key=lambda e: e.name):
        name = entry.name[: -len(".yaml")]
        loader = _Loader(entry.read_text(encoding="utf-8"), name)
        try:  # only the 'description:' (building each DAG would take a while for the image ones)
            doc = loader.get_single_data()
        finally:
            loader.dispose()
        out[name] = " ".join(str(doc.get("description") or "").split()) if isinstance(doc, dict) else ""
    return out


def _shipped_text(name: str) -> str | None:
    """The text of the shipped skeleton ``name`` (``NAME`` or ``NAME.yaml``), or None."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    folder = shipped_dir()
    if folder is None or not stem:
        return None
    entry = folder.joinpath(stem + ".yaml")
    return entry.read_text(encoding="utf-8") if entry.is_file() else None


def load_skeleton(path, *, activations=None, params=None) -> Skeleton:
    """Read and parse a skeleton file, or a shipped skeleton by name (``"cifar-deep"``,
    listed by :func:`shipped_skeletons` and ``rfsgen skeletons``).  A path that exists
    wins over a name.  ``-`` is not accepted: skeletons are files.  ``activations`` and
    ``params`` as for :func:`parse_skeleton`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        shipped = _shipped_text(str(path)) if not p.is_symlink() else None
        if shipped is not None:
            name = str(path)
            return parse_skeleton(shipped, name[: -len(".yaml")] if name.endswith(".yaml") else name,
                                  activations=activations, params=params)
        raise SkeletonError(f"{path}: no such skeleton file or shipped skeleton; {_shipped_hint(str(path))}") from None
    except IsADirectoryError:
        raise SkeletonError(f"{path}: is a directory, not a skeleton file")
    except UnicodeDecodeError:
        raise SkeletonError(f"{path}: not a UTF-8 text file; a skeleton is a YAML file")
    except OSError as e:
        raise SkeletonError(f"{path}: cannot read skeleton ({e.strerror})")
    return parse_skeleton(text, str(path), activations=activations, params=params)


def _shipped_hint(path: str) -> str:
    """What to write instead of a missing skeleton ``path``: the shipped names."""
    names = list(shipped_skeletons())
    if not names:
        return "check the path"
    stem = Path(path).name
    stem = stem[: -len(".yaml")] if stem.endswith(".yaml") else stem
    if stem in names:
        return f"check the path, or use the shipped skeleton by its name '{stem}'"
    return f"check the path, or give a shipped skeleton's name: {', '.join(names)} (see 'rfsgen skeletons')"


def parse_skeleton(text: str, path: str = "<skeleton>", *, width: int | None = None,
                   activations=None, params=None, warn: bool = False) -> Skeleton:
    """Parse skeleton YAML ``text``; ``path`` is used in error messages.

    Parsing does not warn about the features' variance: sampling does
    (:func:`warn_variance`, where the features are made, not on every load of the
    skeleton or of a feature file made from it).  ``warn=True`` warns here as well.

    ``activations`` maps names to activations made in Python by
    ``rfsgen.make_activation(fn, name=...)``; nodes use them as ``activation: NAME``.
    Feature files record the skeleton text only, so they cannot carry these: use
    ``{name: function, expr: ...}`` for a skeleton whose feature files must load alone.

    ``width`` binds a ``width: auto`` skeleton (see :meth:`Skeleton.bind`); without
    it such a skeleton is checked at a probe width and returned unbound.

    ``params`` maps the names of parameters the file declares (``params: {gamma: 0.5}``,
    used as ``scale: $gamma``) to values: numbers, or their text (``"0.3"``, as the
    command line's ``--set gamma=0.3`` passes them).  Unset parameters take their
    defaults; the values used are :attr:`Skeleton.params`.
    """
    if not isinstance(text, str):
        raise SkeletonError(f"{path}: a skeleton must be YAML text, not {type(text).__name__}")
    if len(text) > MAX_SOURCE_BYTES:
        raise SkeletonError(f"{path}: the skeleton is {len(text)} characters, over the limit of {MAX_SOURCE_BYTES}; "
                            "skeletons describe structure in a few lines (use conv/pool/dense/each templates)")
    loader = None
    try:
        loader = _Loader(text, path)
        node = loader.get_single_node()
        if node is None:
            raise SkeletonError(f"{path}: the file is empty; a skeleton needs rfsgen, input and nodes")
        _check_yaml_graph(node, path, loader.anchor_of)
        doc = loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else "?"
        problem = e.problem or e.context
        fix = "fix the syntax"
        if "'['" in str(problem) or "']'" in str(problem):
            fix = 'quote node references with indices inside [...] lists, e.g. inputs: ["x[3]", "y[0:2]"]'
        raise SkeletonError(f"{path}:{line}: malformed YAML: {problem}; {fix}") from None
    except yaml.YAMLError as e:  # ReaderError (unprintable characters) and others without a mark
        detail = " ".join(str(e).split())[:200]
        raise SkeletonError(f"{path}: not a readable YAML skeleton ({detail}); save it as plain UTF-8 text") from None
    except RecursionError:
        raise SkeletonError(f"{path}: the YAML is nested too deeply; a skeleton needs only a few levels") from None
    finally:
        if loader is not None:
            loader.dispose()
    resolved, sites = _params.resolve(doc, path, params)
    try:
        skel = _Builder(path, text, width, _custom(activations, path), resolved).build(doc)
    except SkeletonError as e:
        raise _params.blame(e, path, sites) from None
    if width is not None and skel.width != width:
        return skel.bind(width)  # a fixed-width file: same skeleton or an InputError
    if warn:
        warn_variance(skel, stacklevel=2)
    return skel


def _count_expressions(builder, entries) -> None:
    """Refuse, before any is compiled, more than MAX_EXPRESSIONS distinct expressions."""
    seen = {}
    for e in entries:
        spec = e.get("activation")
        if isinstance(spec, dict) and spec.get("name") == "function" and isinstance(spec.get("expr"), str):
            seen.setdefault(spec["expr"], e)
            if len(seen) > _act.MAX_EXPRESSIONS:
                raise builder.err(e.lines.get("activation", e.line),
                                  f"node '{e['name']}': more than {_act.MAX_EXPRESSIONS} distinct expressions in one "
                                  "skeleton (each is checked at parse time and projected when sampling); reuse "
                                  "expressions or use named activations")


def variance_series(activation) -> str | None:
    """How ``activation``'s degree series makes the variance of features above an input with
    C > 1 blow up (docs/skeletons.md, "Infinite variance over inputs with C > 1"): ``"infinite"``
    for a series with radius 1 and an infinite tail, sampled exactly (``_act.heavy_tailed``:
    relu, step, leaky_relu, arccos 0 and 1: sum_i a_i m^i = inf for every m > 1); ``"cut"`` for
    a projected series that had not converged by degree MAX_QUADRATURE_DEGREE (a kink or a jump:
    elu, abs, arccos 2, kinked expressions), whose sum at m > 1 is finite only through the cut
    and astronomically large (over 1e11 at m = 1.05); None for an entire series (exp,
    polynomial, coefficients) or a fast-converging one (tanh, erf, sigmoid, ...)."""
    if _act.heavy_tailed(activation):
        return "infinite"
    if activation.name in ("identity", "exp", "polynomial", "coefficients"):
        return None
    cut = activation.truncation > 0 and activation.coefficients.size > _act.MAX_QUADRATURE_DEGREE
    if activation.tail is None and cut:
        return "cut"
    return None


def variance_risk(skel: Skeleton) -> dict | None:
    """The first node (children first) whose activation's series blows up (:func:`variance_series`)
    above an input node with C = sup |psi| > 1, or None when the features have finite variance.

    The variance of one draw's estimate of k(x, x') is at most its fourth moment, which obeys
    m_input <= C^4 and m_v = sigma_hat_v(mean of m over v's children): the dual's series
    evaluated at a point m >= 1, with m > 1 as soon as some input below has C > 1 (E|psi|^4 >
    (E|psi|^2)^2 = 1 unless |psi| is constant), through any activation.  An entire or
    fast-converging series is moderate there; one with radius 1 and an infinite tail is
    infinite.  Returns ``{"node", "activation", "series", "input", "base", "norm_bound",
    "line", "message"}``; ``message`` is the one-line warning text."""
    if not skel.bound:
        return None
    # Cheap tests first: most skeletons have only C = 1 bases.
    if not any(base.norm_bound > 1.0 + 1e-12 for base, _, _ in skel.input_groups):
        return None
    big = np.zeros(len(skel.nodes), dtype=bool)  # reaches an input node with C > 1
    kinds: dict[int, str | None] = {}  # per activation object: the series is built once
    for n in skel.nodes:  # children first
        if isinstance(n, InputNode):
            big[n.id] = n.base.norm_bound > 1.0 + 1e-12
            continue
        big[n.id] = bool(big[list(n.children)].any())
        if not big[n.id]:
            continue
        key = id(n.activation)
        if key not in kinds:
            kinds[key] = variance_series(n.activation)
        if kinds[key] is None:
            continue
        first = next(c for c in skel.input_nodes if big[c.id])
        layer = next((la for la in skel.layers if n.id in la.ids), None)
        line = layer.line if layer is not None else None
        return {"node": n.label, "activation": n.activation.label, "series": kinds[key], "input": first.label,
                "base": first.base.label, "norm_bound": float(first.base.norm_bound), "line": line,
                "message": _variance_message(skel.path, line, n, first, kinds[key])}
    return None


def _variance_message(path, line, node, first, series) -> str:
    act = node.activation.label
    where = f"{path}:{line}" if line is not None else str(path)
    why = ("has features of infinite variance (its degree series has an infinite tail)"
           if series == "infinite" else
           "has features of astronomically large variance (its series is cut at degree 1024 at a kink or jump)")
    return (f"{where}: node '{node.label}' ({act}) sits above input node '{first.label}' ({first.base.label}, "
            f"C = {first.base.norm_bound:.3g} > 1) and {why}: unbiased, but a rare huge column can put single "
            "kernel entries far off (cifar-deep, D = 2048: one seed in 100-200 off by > 0.05); more features, "
            "--scheme strat or exact do not remove it; to fix it, use inputs with C = 1 below it or exp, polynomial, "
            "tanh, erf, sigmoid or sin (docs/skeletons.md, 'Infinite variance over inputs with C > 1')")


def warn_variance(skel: Skeleton, stacklevel: int = 2) -> None:
    """Warn (:class:`~rfsgen.errors.VarianceWarning`, one line) when ``skel``'s random features
    have infinite variance (:func:`variance_risk`).  Said where features are made from a
    skeleton (``sample``, ``SkeletonFeatures.fit``, ``rfsgen sample``), not where a skeleton or a
    feature file is loaded; ``rfsgen skeleton`` shows the same as a line of its report."""
    risk = variance_risk(skel)
    if risk is not None:
        import warnings

        from .errors import VarianceWarning

        warnings.warn(VarianceWarning(risk["message"]), stacklevel=stacklevel + 1)


def _check_yaml_graph(root, path, anchor_of=None):
    """Refuse, on the composed YAML graph and before any Python value is built, a
    recursive alias (``&a [1, *a]``, a merge ``<<: *m`` inside ``m``) and documents
    whose values, with aliases expanded, exceed MAX_YAML_NODES (``&a [*b, *b, ...]``
    chains grow exponentially while the text stays tiny).

    One depth-first pass with a memo of each node's expanded size: time and memory
    are linear in the composed nodes (bounded by the text), whatever the aliases."""
    anchor_of = anchor_of or {}
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes on the current path from the root
    stack = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = ()
        if leaving:
            open_.discard(key)
            total = 1 + sum(sizes[id(c)] for c in children)
            sizes[key] = total
            if total > MAX_YAML_NODES:
                line = node.start_mark.line + 1
                raise SkeletonError(f"{path}:{line}: the YAML expands to more than {MAX_YAML_NODES} values (aliases?); "
                                    "write the structure out, or use the conv/pool/dense/each templates")
            continue
        if key in sizes:
            continue
        if key in open_:  # reached again below itself: only an alias can do that
            name = anchor_of.get(key)
            what = f"the anchor '&{name}'" if name else "an anchored value"
            raise SkeletonError(f"{path}:{node.start_mark.line + 1}: {what} contains an alias to itself (a recursive "
                                "YAML structure); a skeleton cannot contain itself: write the value out")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def _custom(activations, path) -> tuple:
    """Check ``parse_skeleton``'s ``activations`` mapping; returns it as sorted pairs."""
    if not activations:
        return ()
    if not isinstance(activations, Mapping):
        raise TypeError("activations must be a mapping of names to make_activation(fn, name=...) results")
    out = []
    for name, act in sorted(activations.items()):
        if not isinstance(act, _act.ActivationRef) or act.name != "python":
            raise TypeError(f"activations[{name!r}] must come from rfsgen.make_activation(fn, name=...)")
        if name in _act.REGISTRY:
            raise SkeletonError(f"{path}: Python activation '{name}' has the name of a built-in activation; rename it")
        out.append((name, act))
    return tuple(out)


class _Builder:
    def __init__(self, path: str, text: str, bind_width: int | None = None, custom: tuple = (), params: tuple = ()):
        self.custom = custom
        self.params = params
        self.path = path
        self.text = text
        self.bind_width = bind_width
        self.auto = False
        self.nodes: list = []
        self.arrays: dict[str, np.ndarray] = {}
        self.layers: list = []
        self.expand = None  # the templates.Expander, once the input width is known

    # ------------------------------------------------------------------ errors
    def err(self, line, msg) -> SkeletonError:
        where = f"{self.path}:{line}" if line else self.path
        return SkeletonError(f"{where}: {msg}")

    def check_keys(self, mapping, allowed, what):
        for key in mapping:
            if key not in allowed:
                raise self.err(
                    mapping.lines.get(key, mapping.line),
                    f"unknown key '{key}' in {what} (allowed: {', '.join(allowed)})",
                )

    # ------------------------------------------------------------------ top level
    def build(self, doc) -> Skeleton:
        if not isinstance(doc, dict):
            raise self.err(1, "a skeleton must be a YAML mapping with keys rfsgen, input, nodes, output")
        self.check_keys(doc, TOP_KEYS, "the skeleton")
        if "rfsgen" not in doc:
            raise self.err(1, f"missing 'rfsgen: {SCHEMA_VERSION}' (the schema version) at the top")
        if type(doc["rfsgen"]) is not int or doc["rfsgen"] != SCHEMA_VERSION:  # (true and 1.0 are not versions)
            raise self.err(
                doc.lines["rfsgen"],
                f"schema version {doc['rfsgen']!r} is not supported (this rfsgen reads version {SCHEMA_VERSION})",
            )
        self.width, self.shape = self.parse_input(doc)
        entries = doc.get("nodes")
        if not isinstance(entries, list) or not entries:
            raise self.err(doc.lines.get("nodes", doc.line), "'nodes' must be a non-empty list of node entries")
        self.expand = templates.Expander(self.path, self.width, self.shape, self.err, self.check_keys)
        self.build_entries(entries, doc.lines.get("nodes", 1))
        self.nodes, self.arrays, self.layers = self.expand.nodes, self.expand.arrays, self.expand.layers
        output = self.prune(self.find_output(doc))
        self.check_depth(doc)
        description = doc.get("description", "")
        if self.auto and self.bind_width is None:
            return Skeleton(source=self.text, path=self.path, width=None, shape=None, nodes=(), output=-1, layers=(),
                            description=str(description or ""), auto=True, activations=self.custom,
                            params=self.params)
        return Skeleton(
            source=self.text,
            path=self.path,
            width=self.width,
            shape=self.shape,
            nodes=tuple(self.nodes),
            output=output,
            layers=tuple(self.layers),
            description=str(description or ""),
            unused_inputs=tuple(self.unused),
            auto=self.auto,
            activations=self.custom,
            params=self.params,
        )

    def parse_input(self, doc):
        spec = doc.get("input")
        line = doc.lines.get("input", doc.line)
        if not isinstance(spec, dict):
            raise self.err(line, "'input' must be a mapping with 'width: N' or 'shape: [H, W, C]'")
        self.check_keys(spec, INPUT_KEYS, "'input'")
        if ("width" in spec) == ("shape" in spec):
            raise self.err(line, "'input' needs exactly one of 'width: N' or 'shape: [H, W, C]'")
        if "width" in spec:
            w = spec["width"]
            if w == "auto":
                self.auto = True
                return templates.auto_width(doc.get("nodes"), self.bind_width, spec.lines["width"], self.err), None
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise self.err(spec.lines["width"], f"'width' must be a positive integer or 'auto', got {w!r}")
            if w > MAX_WIDTH:
                raise self.err(spec.lines["width"], f"'width' {w} is over the limit of {MAX_WIDTH} values per row")
            return w, None
        shape = spec["shape"]
        if (
            not isinstance(shape, list)
            or len(shape) != 3
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape)
        ):
            raise self.err(spec.lines["shape"], f"'shape' must be three positive integers [H, W, C], got {shape!r}")
        width = shape[0] * shape[1] * shape[2]  # Python integers: no overflow
        if width > MAX_WIDTH:
            raise self.err(spec.lines["shape"], f"'shape' {shape} makes rows of {width} values, over the limit of "
                                                f"{MAX_WIDTH}")
        return int(width), tuple(shape)

    # ------------------------------------------------------------------ entries
    def build_entries(self, entries, line):
        by_name = {}
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise self.err(line, f"node entry {i + 1} must be a mapping with at least 'name'")
            if "name" not in e:
                raise self.err(e.line, "node entry has no 'name'")
            name = e["name"]
            if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME:
                raise self.err(e.lines["name"], f"node name {name!r} must start with a letter and use letters, digits, "
                                                f"_ . - (at most {MAX_NAME} characters)")
            if name in by_name:
                raise self.err(e.lines["name"], f"node name '{name}' is already used on line {by_name[name].line}")
            by_name[name] = e
        _count_expressions(self, entries)
        # Entry-level dependencies: 'inputs' references and 'from' (default: previous entry).
        deps = {}
        for i, e in enumerate(entries):
            name = e["name"]
            if "base" in e:
                deps[name] = []
                continue
            if "activation" not in e and "pool" not in e:
                raise self.err(e.line, f"node '{name}' needs 'base' (an input node) or 'activation' (an internal node)")
            wiring = [k for k in WIRINGS if k in e]
            if len(wiring) != 1:
                raise self.err(
                    e.line,
                    f"node '{name}' needs exactly one of {', '.join(WIRINGS)} to say what it takes as input"
                    + (f" (it has {', '.join(wiring)})" if wiring else ""),
                )
            if wiring[0] == "inputs":
                refs = e["inputs"]
                if isinstance(refs, str):
                    refs = [refs]
                if not isinstance(refs, list) or not refs:
                    raise self.err(e.lines["inputs"], f"'inputs' of node '{name}' must be a non-empty list of node names")
                names = []
                for r in refs:
                    m = REF.match(str(r))
                    if not m:
                        raise self.err(e.lines["inputs"], f"bad reference {r!r} in 'inputs' of node '{name}'; write name, name[i] or name[i, j]")
                    names.append(m.group(1))
                deps[name] = names
            elif wiring[0] == "each":
                src = e["each"]
                if not isinstance(src, str) or not REF.match(src) or "[" in src:
                    raise self.err(e.lines["each"], f"'each' of node '{name}' must name a node entry, got {src!r}")
                if "from" in e:
                    raise self.err(e.lines["from"], f"node '{name}' says both 'each: {src}' and 'from'; 'each' names "
                                                     "its source, so drop 'from'")
                deps[name] = [src]
            else:
                src = e.get("from")
                if src is None:
                    if i == 0:
                        raise self.err(e.line, f"node '{name}' is the first entry, so it has nothing to take '{wiring[0]}' from; add 'from: NAME'")
                    src = entries[i - 1]["name"]
                deps[name] = [str(src)]
            for d in deps[name]:
                if d not in by_name:
                    hint = _close(d, by_name)
                    raise self.err(
                        e.lines.get("inputs", e.lines.get("from", e.line)),
                        f"node '{name}' refers to '{d}', which is not defined{hint}",
                    )
        order = self.toposort(deps, by_name)
        for name in order:
            self.build_entry(by_name[name], deps[name])

    def toposort(self, deps, by_name):
        state: dict[str, int] = {}
        order: list[str] = []
        for start in by_name:  # iterative DFS keeps file order where possible
            if start in state:
                continue
            stack = [(start, iter(deps[start]))]
            state[start] = 1
            path = [start]
            while stack:
                name, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    path.pop()
                    state[name] = 2
                    order.append(name)
                elif state.get(nxt) == 1:
                    cycle = path[path.index(nxt):] + [nxt]
                    raise self.err(by_name[nxt].line, f"cycle in the skeleton: {' -> '.join(reversed(cycle))}; a skeleton must be a DAG")
                elif nxt not in state:
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append((nxt, iter(deps[nxt])))
        return order

    def build_entry(self, e, deps):
        if "base" in e:
            self.expand.input_layer(e)
        else:
            self.build_internal(e, deps)

    # ------------------------------------------------------------------ internal nodes
    def build_internal(self, e, deps):
        name = e["name"]
        self.check_keys(e, COMMON_KEYS + INTERNAL_KEYS, f"internal node '{name}'")
        wiring = next(k for k in WIRINGS if k in e)
        if wiring == "pool":
            if "activation" in e:
                raise self.err(e.lines["activation"], f"pool node '{name}' averages its window and takes no activation; use 'conv' for window + activation")
            act = _act.make_activation("identity")
        else:
            act = self.parse_activation(e)
        self.expand.internal_layer(e, wiring, deps, act)

    def parse_activation(self, e):
        name = e["name"]
        spec = e.get("activation")
        line = e.lines.get("activation", e.line)
        if spec is None:
            raise self.err(line, f"internal node '{name}' needs an 'activation' (allowed: {_act.allowed_names()})")
        if isinstance(spec, str):
            act_name, params = spec, {}
        elif isinstance(spec, dict) and "name" in spec:
            act_name = spec["name"]
            params = {k: v for k, v in spec.items() if k != "name"}
        else:
            raise self.err(line, f"'activation' of node '{name}' must be a name or a mapping with 'name' and parameters")
        custom = dict(self.custom)
        if isinstance(act_name, str) and act_name in custom:
            if params:
                raise self.err(line, f"Python activation '{act_name}' of node '{name}' takes no parameters")
            return custom[act_name]
        if not isinstance(act_name, str) or act_name not in _act.REGISTRY:
            raise self.err(line, f"unknown activation '{act_name}' in node '{name}' (allowed: {_act.allowed_names()})")
        try:
            return _act.make_activation(act_name, params)
        except ValueError as ex:
            raise self.err(line, f"node '{name}': {ex}") from None

    # ------------------------------------------------------------------ output
    def prune(self, output: int) -> int:
        """Drop nodes the output does not reach and renumber; returns the new output id."""
        keep = np.zeros(len(self.nodes), dtype=bool)
        keep[output] = True
        for n in reversed(self.nodes):  # parents come after children
            if keep[n.id] and isinstance(n, InternalNode):
                keep[list(n.children)] = True
        self.unused = [n.label for n in self.nodes if not keep[n.id]]
        if keep.all():
            return output
        new_id = np.cumsum(keep) - 1
        nodes = []
        for n in self.nodes:
            if not keep[n.id]:
                continue
            if isinstance(n, InputNode):
                nodes.append(InputNode(int(new_id[n.id]), n.label, n.layer, n.base, n.columns))
            else:
                kids = tuple(int(new_id[c]) for c in n.children)
                nodes.append(InternalNode(int(new_id[n.id]), n.label, n.layer, n.activation, kids))
        self.nodes = nodes
        layers = []
        for layer in self.layers:
            ids = tuple(int(new_id[i]) for i in layer.ids if keep[i])
            if ids:
                shape = layer.shape if len(ids) == len(layer.ids) else (len(ids),)
                layers.append(Layer(layer.name, layer.kind, shape, ids, layer.line))
        self.layers = layers
        return int(new_id[output])

    def check_depth(self, doc):
        depth = np.zeros(len(self.nodes), dtype=np.int64)
        for n in self.nodes:  # children come first
            if isinstance(n, InternalNode):
                depth[n.id] = 1 + max(depth[c] for c in n.children)
                if depth[n.id] > MAX_DEPTH:
                    raise self.err(doc.lines.get("nodes", doc.line), f"node '{n.label}' is {depth[n.id]} layers deep, over "
                                                                    f"the limit of {MAX_DEPTH}")

    def find_output(self, doc) -> int:
        used = np.zeros(len(self.nodes), dtype=bool)
        for n in self.nodes:
            if isinstance(n, InternalNode):
                used[list(n.children)] = True
        internal = np.array([isinstance(n, InternalNode) for n in self.nodes])
        # Input nodes that feed nothing are allowed (a conv's valid windows may leave
        # border pixels out); they are pruned.  Other extra sinks are errors.
        sinks = np.flatnonzero(~used & internal) if internal.any() else np.flatnonzero(~used)
        line = doc.lines.get("output", doc.line)
        if "output" in doc:
            want = doc["output"]
            if not isinstance(want, str) or want not in self.arrays:
                raise self.err(line, f"'output' names '{want}', which is not a node{_close(str(want), self.arrays)}")
            if self.arrays[want].size != 1:
                raise self.err(line, f"'output' must be a single node, but '{want}' is an array of {self.arrays[want].size}; add a 'dense' node")
        if len(sinks) != 1:
            labels = [self.nodes[i].label for i in sinks[:5]]
            more = f" and {len(sinks) - 5} more" if len(sinks) > 5 else ""
            raise self.err(
                line,
                f"the skeleton has {len(sinks)} output nodes ({', '.join(labels)}{more}); "
                "exactly one node may feed nothing: connect the others or add a 'dense' node over them",
            )
        out = int(sinks[0])
        if "output" in doc and out != int(self.arrays[doc["output"]].ravel()[0]):
            raise self.err(line, f"'output' is '{doc['output']}' but the node that feeds nothing is '{self.nodes[out].label}'")
        return out


def _close(name: str, known) -> str:
    import difflib

    m = difflib.get_close_matches(name, list(known), n=1)
    names = list(known)
    listed = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    return f" (did you mean '{m[0]}'? defined: {listed})" if m else f" (defined: {listed})"


"""Skeleton parameters: ``params:`` declarations and ``$name`` references.

A skeleton may declare named numeric parameters at its top level, each with a default::

    params:
      scale: 0.5                                   # a number: the default
      beta: {default: 1.0, min: 0, description: exp's beta}

and use them wherever a number goes, as a whole YAML value: ``scale: $scale``,
``activation: {name: exp, beta: $beta}``, ``coefficients: [$a, 0.5]``.  The caller
sets values by name (``parse_skeleton(..., params={"scale": 0.3})``, the command
line's ``--set scale=0.3``, ``SkeletonFeatures(params=...)``); the rest take their
defaults.  A parameter's type is its default's: an integer default takes integers
only, a float default any finite number (stored as float).  ``min``/``max`` bound it
(inclusive).  Every problem is a one-line :class:`~rfsgen.errors.SkeletonError`
naming the file, the line and the parameter.

Substitution happens on the parsed YAML document before the skeleton is built, so
a parameterised file builds exactly the skeleton of the same file with the values
written in.  Free text (``description``) is never substituted; a ``$name`` where a
name or a choice goes (node names, ``base``, ``scheme``, ``per``, ``inputs``,
``from``, ``each``, ``output``, an activation's ``name`` or ``expr``) is an error.
"""

from __future__ import annotations

import math
import re

from .errors import SkeletonError

REF = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)\Z")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
DECL_KEYS = ("default", "min", "max", "description")
#: Keys whose values are names, choices or free text: never a parameter.
#: (``activation: NAME``: a name; ``activation: {name: exp, beta: $b}``: its keys decide.)
TEXT_KEYS = ("rfsgen", "name", "base", "scheme", "per", "inputs", "from", "each", "output", "expr", "zero",
             "activation")
MAX_PARAMS = 100


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _line(mapping, key):
    lines = getattr(mapping, "lines", None) or {}
    return lines.get(key, getattr(mapping, "line", 0))


def _err(path, line, msg) -> SkeletonError:
    return SkeletonError(f"{path}:{line}: {msg}" if line else f"{path}: {msg}")


def _declarations(doc, path) -> dict:
    """``{name: (default, lo, hi, line)}`` from the document's ``params:`` block."""
    if not isinstance(doc, dict) or "params" not in doc:
        return {}
    block = doc["params"]
    line = _line(doc, "params")
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise _err(path, line, "'params' must be a mapping of parameter names to defaults, e.g. "
                               "'params: {gamma: 0.5}'")
    if len(block) > MAX_PARAMS:
        raise _err(path, line, f"{len(block)} parameters, over the limit of {MAX_PARAMS}")
    out = {}
    for name, spec in block.items():
        where = _line(block, name)
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise _err(path, where, f"parameter name {name!r} must start with a letter or _ and use letters, digits "
                                    "and _ (it is written $NAME where it is used)")
        lo = hi = None
        if isinstance(spec, dict):
            for k in spec:
                if k not in DECL_KEYS:
                    raise _err(path, _line(spec, k), f"unknown key '{k}' in parameter '{name}' (allowed: "
                                                     f"{', '.join(DECL_KEYS)})")
            if "default" not in spec:
                raise _err(path, where, f"parameter '{name}' has no default; write '{name}: {{default: NUMBER}}'")
            default, lo, hi = spec["default"], spec.get("min"), spec.get("max")
            for k, v in (("min", lo), ("max", hi)):
                if v is not None and (not _is_number(v) or not math.isfinite(v)):
                    raise _err(path, _line(spec, k), f"'{k}' of parameter '{name}' must be a finite number, got {v!r}")
            if lo is not None and hi is not None and lo > hi:
                raise _err(path, _line(spec, "max"), f"parameter '{name}' has min {lo} above max {hi}")
        else:
            default = spec
        if default is None:
            raise _err(path, where, f"parameter '{name}' has no default; write '{name}: NUMBER'")
        if isinstance(default, str) and REF.match(default):
            raise _err(path, where, f"the default of parameter '{name}' refers to '{default}'; a default must be a "
                                    "number")
        if not _is_number(default) or not math.isfinite(default):
            raise _err(path, where, f"the default of parameter '{name}' must be a finite number, got {default!r}; "
                                    "parameters stand for numbers")
        out[name] = (default, lo, hi, where)
        _check_range(path, name, default, lo, hi, where, "its default")
    return out


def _check_range(path, name, value, lo, hi, line, what):
    if lo is not None and value < lo:
        raise _err(path, line, f"parameter '{name}' is {value!r} ({what}), below its min {lo}")
    if hi is not None and value > hi:
        raise _err(path, line, f"parameter '{name}' is {value!r} ({what}), above its max {hi}")


def _convert(path, name, value, default, line):
    """``value`` (a number, or its text) as the type of ``default``."""
    text = value
    if isinstance(value, str):
        t = value.strip()
        try:
            value = int(t) if re.fullmatch(r"[+-]?\d{1,100}", t) else float(t)
        except ValueError:
            raise _err(path, line, f"parameter '{name}' must be a number, got {text!r}") from None
    elif hasattr(value, "item") and not isinstance(value, bool):  # numpy scalars
        value = value.item()
    if not _is_number(value):
        raise _err(path, line, f"parameter '{name}' must be a number, got {text!r} ({type(text).__name__})")
    if not math.isfinite(value):
        raise _err(path, line, f"parameter '{name}' must be finite, got {text!r}")
    if isinstance(default, int):
        if isinstance(value, float):
            if not value.is_integer():
                raise _err(path, line, f"parameter '{name}' takes an integer (its default is {default}), got {text!r}")
            value = int(value)
        return value
    return float(value)


def resolve(doc, path, given) -> tuple:
    """Substitute the parameters into ``doc`` (in place).

    Returns ``(values, sites)``: ``values`` the ``((name, value), ...)`` used, in the
    file's order; ``sites`` maps a line to the ``(name, value)`` pairs substituted there
    (and on the lines of the mappings around it), for :func:`blame`."""
    decl = _declarations(doc, path)
    given = dict(given or {})
    for name in given:
        if name not in decl:
            line = _line(doc, "params") if decl else 0
            known = (f"declared: {', '.join(decl)}" if decl else
                     "the skeleton declares no parameters; add 'params: {NAME: DEFAULT}' to it")
            raise _err(path, line, f"unknown parameter {name!r} ({known})")
    values = {}
    for name, (default, lo, hi, line) in decl.items():
        if name in given:
            v = _convert(path, name, given[name], default, line)
            _check_range(path, name, v, lo, hi, line, "as set")
        else:
            v = default
        values[name] = v
    sites: dict = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("params", "description"):
                continue
            _walk(doc, key, value, _line(doc, key), path, values, sites, (), key in TEXT_KEYS, key)
    return tuple(values.items()), sites


def _walk(container, key, value, line, path, values, sites, around, text, key_name):
    """Substitute in ``container[key]`` = ``value`` (on ``line``); ``around`` holds the
    lines of the enclosing mappings below the top level and of the keys that lead to
    them (a check may report a value's error there); ``text``: under a key whose
    values are names or choices."""
    if isinstance(value, str):
        m = REF.match(value)
        if m is None:
            return
        name = m.group(1)
        if name not in values:
            known = f"declared: {', '.join(values)}" if values else "the skeleton declares no parameters"
            raise _err(path, line, f"unknown parameter '${name}' ({known}); declare it under 'params:' with a "
                                   "default")
        if text:
            raise _err(path, line, f"parameter '${name}' stands for a number, but '{key_name}' takes a name or a "
                                   "choice; write the value itself")
        container[key] = values[name]
        for ln in {line, *around}:
            sites.setdefault(ln, []).append((name, values[name]))
        return
    if isinstance(value, dict):
        inner = around + ((line,) if around else ()) + (getattr(value, "line", line),)
        for k, v in value.items():
            if k == "description":
                continue
            _walk(value, k, v, _line(value, k), path, values, sites, inner, k in TEXT_KEYS, k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(value, i, v, getattr(v, "line", line), path, values, sites, around, text, key_name)


def blame(e: SkeletonError, path: str, sites: dict) -> SkeletonError:
    """``e`` with the parameters substituted on its line named (the value a check
    refused may have come from a parameter)."""
    msg = str(e)
    m = re.match(re.escape(path) + r":(\d+):", msg)
    if m is None or not sites.get(int(m.group(1))):
        return e
    named = []
    for name, value in sites[int(m.group(1))]:
        if (name, value) not in named:
            named.append((name, value))
    note = ", ".join(f"'{n}' = {v!r}" for n, v in named)
    return type(e)(f"{msg} (with parameter{'s' if len(named) > 1 else ''} {note}: set another value, "
                   "or change its default)")

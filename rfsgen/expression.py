"""Safe scalar expressions in ``x`` for user-defined activations (``name: function``).

The text is parsed with :mod:`ast` and every node is checked against an explicit
whitelist (never ``eval``/``exec``); the tree is compiled into nested :class:`Expr`
objects that evaluate one float at a time with the C library's :mod:`math`
functions (so coefficient tables have the same bits on every CPU, see
``rfsgen.activations._libm``) and pickle as plain data.  Names follow numpy's
(``maximum``, ``where``, ``arctan``) so an expression reads like numpy code.
"""

from __future__ import annotations

import ast
import math
import operator

#: Limits checked before and after parsing: characters, bracket nesting, AST nodes,
#: depth of the operation tree (a sum of n terms is n - 1 deep).
MAX_CHARS = 1000
MAX_BRACKETS = 20
MAX_NODES = 200
MAX_DEPTH = 50


def _where(c, a, b):
    return a if c else b


def _sign(v):
    return (v > 0) - (v < 0) + 0.0


def _clip(v, lo, hi):
    return min(max(v, lo), hi)


def _heaviside(v, at0):
    return 1.0 if v > 0 else (at0 if v == 0 else 0.0)


#: name -> (scalar function, number of arguments)
FUNCTIONS = {
    "abs": (abs, 1), "sqrt": (math.sqrt, 1), "exp": (math.exp, 1), "expm1": (math.expm1, 1),
    "log": (math.log, 1), "log1p": (math.log1p, 1), "sin": (math.sin, 1), "cos": (math.cos, 1),
    "tan": (math.tan, 1), "tanh": (math.tanh, 1), "sinh": (math.sinh, 1), "cosh": (math.cosh, 1),
    "arctan": (math.atan, 1), "arcsinh": (math.asinh, 1), "erf": (math.erf, 1), "erfc": (math.erfc, 1),
    "sign": (_sign, 1), "maximum": (max, 2), "minimum": (min, 2), "heaviside": (_heaviside, 2),
    "where": (_where, 3), "clip": (_clip, 3),
}
CONSTANTS = {"pi": math.pi, "e": math.e}
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.USub: "-", ast.UAdd: "+",
            ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}

ALLOWED = ("the variable x, numbers, constants " + ", ".join(CONSTANTS) + ", operators + - * / ** and "
           "comparisons < <= > >= == != (as where's condition), and the functions "
           + ", ".join(f"{n}({', '.join('abc'[:k])})" for n, (_, k) in FUNCTIONS.items()))


class ExpressionError(ValueError):
    """An expression outside the whitelist; one line naming the token and what is allowed."""


class Expr:
    """A compiled expression node: ``op`` (a key of the tables above, or 'x'/'num') and
    its operands.  ``Expr(...)(z)`` evaluates at the float ``z``; pickles as data."""

    __slots__ = ("op", "args")

    def __init__(self, op, args):
        self.op, self.args = op, args

    def __call__(self, z: float) -> float:
        op, args = self.op, self.args
        if op == "x":
            return z
        if op == "num":
            return args
        vals = [a(z) for a in args]
        kind, name = op
        if kind == "call":
            return float(FUNCTIONS[name][0](*vals))
        if kind == "bin":
            return float(BINARY[name](*vals))
        if kind == "un":
            return float(UNARY[name](*vals))
        return float(COMPARE[name](*vals))

    def __getstate__(self):
        return self.op, self.args

    def __setstate__(self, state):
        self.op, self.args = state


_OPS = {**{k: ("bin", k) for k in BINARY}, **{k: ("un", k) for k in UNARY}, **{k: ("cmp", k) for k in COMPARE}}


def _reject(node, text, why=""):
    token = ast.get_source_segment(text, node) or type(node).__name__
    if len(token) > 40:
        token = token[:37] + "..."
    raise ExpressionError(f"expression '{_short(text)}': {why or 'not allowed'}: '{token}' "
                          f"(column {getattr(node, 'col_offset', 0) + 1}); allowed: {ALLOWED}")


def _short(text):
    return text if len(text) <= 60 else text[:57] + "..."


def compile_expression(text) -> Expr:
    """Parse ``text`` (a str) into an :class:`Expr`; raises :class:`ExpressionError`."""
    if not isinstance(text, str):
        raise ExpressionError(f"'expr' must be a string (an expression in x), got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression of {len(text)} characters, over the limit of {MAX_CHARS}")
    if not text.strip():
        raise ExpressionError(f"'expr' is empty; give an expression in x (allowed: {ALLOWED})")
    # Nesting is bounded before ast.parse recurses into it (deep brackets exhaust the parser).
    depth = level = 0
    for ch in text:
        level += ch in "([{"
        level -= ch in ")]}"
        depth = max(depth, level)
    if depth > MAX_BRACKETS:
        raise ExpressionError(f"expression '{_short(text)}' nests {depth} brackets deep, over the limit of {MAX_BRACKETS}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as ex:
        msg = getattr(ex, "msg", None) or str(ex) or type(ex).__name__
        raise ExpressionError(f"expression '{_short(text)}' is not valid: {msg}; allowed: {ALLOWED}") from None
    count = sum(1 for _ in ast.walk(tree))
    if count > MAX_NODES:
        raise ExpressionError(f"expression '{_short(text)}' has {count} syntax nodes, over the limit of {MAX_NODES}")
    return _build(tree.body, text.strip(), 0)


def _build(node, text, depth) -> Expr:
    if depth > MAX_DEPTH:
        raise ExpressionError(f"expression '{_short(text)}' nests deeper than {MAX_DEPTH} operations")
    t = type(node)
    if t is ast.Name:
        if node.id == "x":
            return Expr("x", ())
        if node.id in CONSTANTS:
            return Expr("num", CONSTANTS[node.id])
        _reject(node, text, "unknown name")
    if t is ast.Constant:
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            _reject(node, text, "not a finite real number")
        return Expr("num", float(v))
    if t is ast.BinOp and type(node.op) in BINARY:
        return Expr(_OPS[type(node.op)], (_build(node.left, text, depth + 1), _build(node.right, text, depth + 1)))
    if t is ast.UnaryOp and type(node.op) in UNARY:
        return Expr(_OPS[type(node.op)], (_build(node.operand, text, depth + 1),))
    if t is ast.Compare and len(node.ops) == 1 and type(node.ops[0]) in COMPARE:
        return Expr(_OPS[type(node.ops[0])], (_build(node.left, text, depth + 1), _build(node.comparators[0], text, depth + 1)))
    if t is ast.Call:
        f = node.func
        if type(f) is not ast.Name:
            _reject(node, text, "only calls of the listed functions are allowed")
        if f.id not in FUNCTIONS:
            _reject(f, text, "unknown function")
        if node.keywords:
            _reject(node, text, "keyword arguments are not allowed")
        want = FUNCTIONS[f.id][1]
        if len(node.args) != want or any(type(a) is ast.Starred for a in node.args):
            _reject(node, text, f"{f.id} takes {want} argument{'s' if want > 1 else ''}")
        return Expr(("call", f.id), tuple(_build(a, text, depth + 1) for a in node.args))
    if t in (ast.BinOp, ast.UnaryOp, ast.Compare):
        _reject(node, text, "operator not allowed")
    _reject(node, text)

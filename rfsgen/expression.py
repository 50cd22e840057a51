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
_FLOAT_MAX = 1.7976931348623157e308
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
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            _reject(node, text, "not a finite real number")
        try:
            finite = math.isfinite(float(v))
        except OverflowError:  # an integer literal beyond the float range (10**400)
            finite = False
        if not finite:
            _reject(node, text, f"not a finite real number (a float holds magnitudes up to {_FLOAT_MAX:.4g})")
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


# --------------------------------------------------------------------------- vectorised evaluation
# The same values as Expr.__call__, bit for bit, for a whole float64 array at once:
# + - * / and comparisons are IEEE operations in numpy as in Python, maximum/minimum
# pick the operand Python's max/min pick, and every other function (and **) goes
# through the C library element by element (as rfsgen.activations._libm), never
# numpy's SIMD transcendental functions.  Errors are raised as the scalar path
# raises them (ZeroDivisionError, ValueError, OverflowError, TypeError).
def _map(fn, *arrays):
    import numpy as np

    lists = [a.tolist() for a in arrays]
    return np.fromiter(map(lambda *v: float(fn(*v)), *lists), dtype=np.float64, count=arrays[0].size)


def _vec_call(name, vals):
    import numpy as np

    if name == "abs":
        return np.abs(vals[0])
    if name == "sqrt":
        if (vals[0] < 0).any():
            raise ValueError("math domain error")
        return np.sqrt(vals[0])  # correctly rounded, as math.sqrt
    if name == "sign":
        return (vals[0] > 0).astype(np.float64) - (vals[0] < 0) + 0.0
    if name == "maximum":  # max(a, b) returns a unless b > a
        return np.where(vals[1] > vals[0], vals[1], vals[0])
    if name == "minimum":
        return np.where(vals[1] < vals[0], vals[1], vals[0])
    if name == "clip":
        v = np.where(vals[1] > vals[0], vals[1], vals[0])
        return np.where(vals[2] < v, vals[2], v)
    if name == "heaviside":
        return np.where(vals[0] > 0, 1.0, np.where(vals[0] == 0, vals[1], 0.0))
    if name == "where":
        return np.where(vals[0] != 0, vals[1], vals[2])
    return _map(FUNCTIONS[name][0], *vals)


def evaluate(expr: Expr, z):
    """``expr`` at every value of the float64 array ``z`` (a new float64 array), with the
    bits of ``expr(v)`` for each ``v``; raises what the scalar evaluation raises."""
    import numpy as np

    op, args = expr.op, expr.args
    if op == "x":
        return np.array(z, dtype=np.float64, copy=True)
    if op == "num":
        return np.full(np.shape(z), args, dtype=np.float64)
    vals = [evaluate(a, z) for a in args]
    kind, name = op
    if kind == "call":
        return _vec_call(name, vals)
    if kind == "un":
        return -vals[0] if name is ast.USub else vals[0]
    if kind == "cmp":
        return COMPARE[name](vals[0], vals[1]).astype(np.float64)
    a, b = vals
    if name is ast.Pow:
        return _map(operator.pow, a, b)
    if name is ast.Div:
        if (b == 0).any():
            raise ZeroDivisionError("float division by zero")
        return a / b
    with np.errstate(over="ignore", invalid="ignore"):
        return BINARY[name](a, b)


# --------------------------------------------------------------------------- text
_PREC = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2, ast.Pow: 4}


def render(expr: Expr) -> str:
    """``expr`` as text (for messages naming a sub-expression)."""
    op, args = expr.op, expr.args
    if op == "x":
        return "x"
    if op == "num":
        return f"{args:g}"
    kind, name = op
    if kind == "call":
        return f"{name}({', '.join(render(a) for a in args)})"
    if kind == "un":
        inner = render(args[0])
        return _SYMBOLS[name] + (inner if args[0].op in ("x", "num") or args[0].op[0] == "call" else f"({inner})")
    parts = []
    for a in args:
        t = render(a)
        if kind == "bin" and a.op not in ("x", "num") and a.op[0] in ("bin", "un", "cmp") \
                and (a.op[0] != "bin" or _PREC[a.op[1]] <= _PREC[name]):
            t = f"({t})"
        parts.append(t)
    return f"{parts[0]} {_SYMBOLS[name]} {parts[1]}"


# --------------------------------------------------------------------------- singularities
# Interval arithmetic (outward rounded) over the whole real line finds the points where an
# expression is not a finite real number: a division by an operand that vanishes, tan at
# its poles, log / log1p / sqrt / ** outside their domains.  Such a function is not
# square-integrable under the Gaussian (a pole of order >= 1/2) or not defined on all of R,
# whatever the quadrature nodes happen to see (1/(x - 0.3) is finite at every one).
_INF = math.inf
_TINY = 5e-324  # exp, cosh, erfc... are > 0: an underflowed 0 is not a zero of the function


class _Bad(Exception):
    def __init__(self, why, node):
        self.why, self.node = why, node


def _out(lo, hi):
    if lo != lo or hi != hi:  # NaN from inf - inf or 0 * inf: nothing is known
        return -_INF, _INF
    # an infinite bound stays infinite: it stands for a value beyond the float range
    return (lo if lo == _INF else math.nextafter(lo, -_INF)), (hi if hi == -_INF else math.nextafter(hi, _INF))


def _safe(fn, v, over):
    try:
        return fn(v)
    except OverflowError:
        return over
    except ValueError:
        return math.nan


def _mono(fn, lo, hi, increasing=True, positive=False):
    a, b = _safe(fn, lo, _INF), _safe(fn, hi, _INF)
    if not increasing:
        a, b = _safe(fn, hi, 0.0), _safe(fn, lo, _INF)
    a, b = _out(a, b)
    return (max(a, _TINY), b) if positive else (a, b)


def _trig_range(lo, hi, shift):
    """Range of sin(v + shift) (shift = 0 sin, pi/2 cos) over [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo >= 2 * math.pi:
        return -1.0, 1.0
    f = math.sin if shift == 0 else math.cos
    vals = [f(lo), f(hi)]
    # critical points of sin(v + shift): v + shift = pi/2 + k pi
    k0 = math.ceil((lo + shift - math.pi / 2) / math.pi)
    k1 = math.floor((hi + shift - math.pi / 2) / math.pi)
    for k in range(k0, k1 + 1):
        vals.append(1.0 if k % 2 == 0 else -1.0)
    return max(-1.0, min(vals) - 1e-15), min(1.0, max(vals) + 1e-15)


def _mul(a, b):
    prods = [p for p in (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])]
    if any(p != p for p in prods):
        return -_INF, _INF
    return _out(min(prods), max(prods))


def _ipow(a, b, node):
    lo, hi = a
    if b[0] == b[1] and float(b[0]).is_integer():
        n = b[0]
        if n == 0:
            return 1.0, 1.0
        if n < 0 and lo <= 0 <= hi:
            raise _Bad("zero raised to a negative power", node.args[0])

        def p(v):
            return _safe(lambda t: math.pow(t, n), v, _INF if (v > 0 or n % 2 == 0) else -_INF)

        if n % 2 == 0:
            if lo <= 0 <= hi:
                return (0.0 if n > 0 else 0.0), max(p(lo), p(hi)) if n > 0 else _out(0, _INF)[1]
            vals = (p(lo), p(hi))
            return _out(min(vals), max(vals))
        vals = (p(lo), p(hi))
        return _out(min(vals), max(vals))
    if lo < 0:
        raise _Bad("a negative number raised to a non-integer power", node.args[0])
    if lo <= 0 and b[0] < 0:
        raise _Bad("zero raised to a negative power", node.args[0])
    vals = [_safe(lambda t: math.pow(t[0], t[1]), (u, v), _INF) for u in (lo, hi) for v in b]
    vals = [v for v in vals if v == v]
    if not vals:
        return -_INF, _INF
    return _out(min(vals), max(vals))


def _same(a: Expr, b: Expr) -> bool:
    """Structurally equal sub-expressions (the same function of x)."""
    if a is b:
        return True
    if a.op != b.op:
        return False
    if a.op == "num":
        return a.args == b.args
    return a.op == "x" or (len(a.args) == len(b.args) and all(_same(u, v) for u, v in zip(a.args, b.args)))


def _interval(expr: Expr, lo: float, hi: float):
    op, args = expr.op, expr.args
    if op == "x":
        return lo, hi
    if op == "num":
        return args, args
    vals = [_interval(a, lo, hi) for a in args]
    kind, name = op
    if kind == "un":
        return (-vals[0][1], -vals[0][0]) if name is ast.USub else vals[0]
    if kind == "cmp":
        (a0, a1), (b0, b1) = vals
        if name in (ast.Lt, ast.LtE):
            a0, a1, b0, b1 = b0, b1, a0, a1  # a < b  <=>  b > a
        strict = name in (ast.Lt, ast.Gt)
        if name in (ast.Eq, ast.NotEq):
            sure_ne = a1 < b0 or b1 < a0
            sure_eq = a0 == a1 == b0 == b1
            t, f = (sure_eq, sure_ne) if name is ast.Eq else (sure_ne, sure_eq)
        else:
            t = a0 > b1 if strict else a0 >= b1
            f = a1 <= b0 if strict else a1 < b0
        return (1.0, 1.0) if t else (0.0, 0.0) if f else (0.0, 1.0)
    if kind == "bin":
        a, b = vals
        if name is ast.Add:
            return _out(a[0] + b[0], a[1] + b[1])
        same = _same(args[0], args[1])
        if name is ast.Sub:
            return (0.0, 0.0) if same else _out(a[0] - b[1], a[1] - b[0])
        if name is ast.Mult:
            if same:  # a square is >= 0 (x * x over [-1, 1] is [0, 1], not [-1, 1])
                m = _mul(a, b)[1]
                return (0.0, m) if a[0] <= 0 <= a[1] else _out(min(a[0] * a[0], a[1] * a[1]), m)
            return _mul(a, b)
        if name is ast.Div:
            if b[0] <= 0 <= b[1]:
                raise _Bad("a division by zero", args[1])
            return _mul(a, (1.0 / b[1], 1.0 / b[0]) if b[0] > 0 or b[1] < 0 else (-_INF, _INF))
        return _ipow(a, b, expr)
    (v0, v1) = vals[0]
    if name == "abs":
        if v0 >= 0:
            return v0, v1
        if v1 <= 0:
            return -v1, -v0
        return 0.0, max(-v0, v1)
    if name == "sqrt":
        if v0 < 0:
            raise _Bad("the square root of a negative number", args[0])
        return _mono(math.sqrt, v0, v1)
    if name == "log":
        if v0 <= 0:
            raise _Bad("the log of zero or of a negative number", args[0])
        return _mono(math.log, v0, v1)
    if name == "log1p":
        if v0 <= -1:
            raise _Bad("log1p of a number <= -1", args[0])
        return _mono(math.log1p, v0, v1)
    if name == "tan":
        if not (math.isfinite(v0) and math.isfinite(v1)) or v1 - v0 >= math.pi:
            raise _Bad("tan at one of its poles (pi/2 + k pi)", args[0])
        k0 = math.ceil((v0 - math.pi / 2) / math.pi - 1e-15)
        k1 = math.floor((v1 - math.pi / 2) / math.pi + 1e-15)
        if k0 <= k1:
            raise _Bad("tan at one of its poles (pi/2 + k pi)", args[0])
        return _out(math.tan(v0), math.tan(v1))
    if name in ("exp", "cosh"):
        if name == "cosh":
            if v0 <= 0 <= v1:
                return 1.0, _safe(math.cosh, max(-v0, v1), _INF)
            a, b = sorted((abs(v0), abs(v1)))
            return _mono(math.cosh, a, b, positive=True)
        return _mono(math.exp, v0, v1, positive=True)
    if name in ("expm1", "tanh", "arctan", "arcsinh", "erf", "sinh"):
        return _mono(FUNCTIONS[name][0], v0, v1)
    if name == "erfc":
        return _mono(math.erfc, v0, v1, increasing=False, positive=True)
    if name in ("sin", "cos"):
        return _trig_range(v0, v1, 0.0 if name == "sin" else math.pi / 2)
    if name == "sign":
        return (_sign(v0), _sign(v1))
    if name == "heaviside":
        h0 = vals[1]
        cands = [0.0] * (v0 < 0) + [1.0] * (v1 > 0) + list(h0) * (v0 <= 0 <= v1)
        return min(cands), max(cands)
    if name in ("maximum", "minimum"):
        (b0, b1) = vals[1]
        return (max(v0, b0), max(v1, b1)) if name == "maximum" else (min(v0, b0), min(v1, b1))
    if name == "clip":
        (l0, l1), (h0, h1) = vals[1], vals[2]
        m0, m1 = max(v0, l0), max(v1, l1)
        return min(m0, h0), min(m1, h1)
    if name == "where":
        (a0, a1), (b0, b1) = vals[1], vals[2]
        if v0 > 0 or v1 < 0:
            return a0, a1
        if v0 == v1 == 0:
            return b0, b1
        return min(a0, b0), max(a1, b1)
    raise AssertionError(name)


#: Intervals the line is first cut into, and the most bisections spent on one of them.
_INNER = 64.0
_PIECES = 256
_MAX_SPLITS = 4000


def _cover():
    """The real line as intervals: [-64, 64] in 256 pieces, then pieces growing by 2**8
    in length out to the float range, then the infinite ends."""
    out = []
    step = 2 * _INNER / _PIECES
    inner = [-_INNER + i * step for i in range(_PIECES + 1)]
    out += list(zip(inner[:-1], inner[1:]))
    a = _INNER
    while a < _FLOAT_MAX:  # floats end there: the line beyond is not evaluated
        b = min(a * 256.0, _FLOAT_MAX)
        out += [(a, b), (-b, -a)]
        a = b
    return out


def singular_point(expr: Expr):
    """Where ``expr`` is not a finite real number for some real x: ``(x, why, operand)`` with
    ``x`` a float near the point, ``why`` what happens and ``operand`` the sub-expression
    (an :class:`Expr`), or None.  Bisects the intervals whose enclosure is in doubt down
    to a width of 1e-9 (relative); a doubt that survives is reported (a denominator that
    comes within rounding of zero counts as vanishing)."""
    import heapq

    todo = [(_gap(lo, hi), lo, hi) for lo, hi in _cover()]  # nearest to 0 first
    heapq.heapify(todo)
    splits = 0
    while todo:
        _, lo, hi = heapq.heappop(todo)
        try:
            _interval(expr, lo, hi)
        except _Bad as bad:
            mid = lo / 2 + hi / 2
            if hi - lo <= 1e-9 * max(1.0, abs(mid)) or splits >= _MAX_SPLITS:
                return (0.0 if lo <= 0 <= hi and bad.why == "a division by zero" else mid), bad.why, bad.node
            splits += 1
            heapq.heappush(todo, (_gap(lo, mid), lo, mid))
            heapq.heappush(todo, (_gap(mid, hi), mid, hi))
    return None


def _gap(lo, hi):
    return 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))


# --------------------------------------------------------------------------- breakpoints
def _switches(expr: Expr, out: list) -> None:
    """The sub-expressions whose sign changes switch a branch of ``expr``: the difference of
    maximum's, minimum's and a comparison's operands, clip's value less either bound, the
    operand of abs, sign and heaviside, and where's condition."""
    op, args = expr.op, expr.args
    if op in ("x", "num"):
        return
    kind, name = op
    if kind == "cmp" or (kind == "call" and name in ("maximum", "minimum")):
        out.append(Expr(("bin", ast.Sub), (args[0], args[1])))
    elif kind == "call" and name in ("abs", "sign", "heaviside", "where"):
        out.append(args[0])
    elif kind == "call" and name == "clip":
        out += [Expr(("bin", ast.Sub), (args[0], args[1])), Expr(("bin", ast.Sub), (args[0], args[2]))]
    for a in args:
        _switches(a, out)


def breakpoints(expr: Expr, reach: float, step: float = 1e-3) -> list[float]:
    """Where a branch of ``expr`` may switch inside [-reach, reach]: each switching
    sub-expression's changes of sign class (-, 0, +) between the points of a grid of ``step``,
    refined by bisection to neighbouring floats (sorted, distinct).  Two changes closer than
    ``step`` can cancel out unseen (a documented limit)."""
    import numpy as np

    fns: list = []
    _switches(expr, fns)
    z = np.linspace(-reach, reach, int(round(2 * reach / step)) + 1)
    found = set()
    for g in fns:
        try:
            with np.errstate(all="ignore"):
                s = np.sign(evaluate(g, z))
        except (ArithmeticError, ValueError, TypeError):
            continue
        for i in np.flatnonzero(s[:-1] != s[1:]):
            lo, hi, cls = float(z[i]), float(z[i + 1]), s[i]
            while True:
                mid = lo / 2 + hi / 2
                if mid in (lo, hi):
                    break
                try:
                    same = np.sign(g(mid)) == cls
                except (ArithmeticError, ValueError, TypeError):
                    break
                lo, hi = (mid, hi) if same else (lo, mid)
            found.add(hi if cls == 0 or abs(hi) < abs(lo) else lo)
    out: list[float] = []
    for t in sorted(found):  # one point per switch: merge those within 1e-9 (both sides of a zero)
        if not out or t - out[-1] > 1e-9:
            out.append(t)
    return out

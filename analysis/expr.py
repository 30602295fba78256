"""The condition language of rule specs: small, safe arithmetic over named quantities.

A rule spec writes every threshold and condition as text (``"slope > slope_factor * (lam -
lam_miss)"``), so that a registration can freeze it and a reviewer can read it. This module parses
those strings into a restricted Python AST and evaluates them against a mapping of quantities.

What is allowed: numbers, strings (for comparing labels, ``"cut.endpoint == 'STUCK'"``), names
and dotted names (``burst.followup_hit``, ``arm.gate.t_on``), + - * / **, comparisons (chained),
``and`` / ``or`` / ``not``, ``x if c else y`` and a fixed set of functions. Nothing else: no
attribute access on objects, no subscripts, no keywords, no lambdas.

Missing data never passes: a missing value (None) reads as NaN, every comparison with NaN is false,
NaN is false in a boolean context, a division by zero is NaN, and comparing a string with a number
is false (not an error), so a run whose quantity could not be measured fails the condition that
needs it instead of crashing the verdict or slipping through.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from harness.errors import RuleError

NAN = float("nan")


_BIN: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_CMP: dict[type, Callable[[Any, Any], bool]] = {
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def _nanfun(f: Callable[..., float]) -> Callable[..., float]:
    def g(*xs: Any) -> float:
        vals = [float("nan") if x is None else x for x in xs]
        if any(isinstance(v, float) and math.isnan(v) for v in vals):
            return NAN
        return f(*vals)

    return g


def _nanmin(*xs: Any) -> float:
    return min(xs) if not any(_isnan(x) for x in xs) else NAN


def _nanmax(*xs: Any) -> float:
    return max(xs) if not any(_isnan(x) for x in xs) else NAN


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "min": min,
    "max": max,
    "ceil": _nanfun(lambda x: float(math.ceil(x))),
    "floor": _nanfun(lambda x: float(math.floor(x))),
    "sqrt": _nanfun(lambda x: math.sqrt(x) if x >= 0 else NAN),
    "isnan": lambda x: _isnan(x),
    "nanmin": _nanmin,
    "nanmax": _nanmax,
}


def _isnan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def truth(v: Any) -> bool:
    """Truth of a condition's value: NaN and None are false (missing data never passes)."""
    if _isnan(v):
        return False
    return bool(v)


def dotted(node: ast.AST) -> str | None:
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


_ALLOWED = (
    ast.Expression,
    ast.Compare,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Name,
    ast.Attribute,
    ast.Constant,
    ast.Call,
    ast.IfExp,
    ast.Load,
    ast.And,
    ast.Or,
    ast.Not,
    ast.USub,
    ast.UAdd,
    *_BIN,
    *_CMP,
)


@lru_cache(maxsize=1024)
def parse(expr: str, extra_functions: frozenset[str] = frozenset()) -> ast.Expression:
    """Parse and check a condition; RuleError names what is not allowed."""
    if not isinstance(expr, str):
        raise RuleError(f"condition {expr!r}: expected a string")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise RuleError(f"condition {expr!r} is not a valid expression: {exc.msg}") from None
    allowed_funcs = set(FUNCTIONS) | set(extra_functions)
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise RuleError(f"condition {expr!r}: {type(node).__name__} is not allowed in a rule")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str)):
            raise RuleError(f"condition {expr!r}: constant {node.value!r} is not allowed in a rule")
        if isinstance(node, ast.Attribute) and dotted(node) is None:
            raise RuleError(f"condition {expr!r}: attributes are allowed only on names (a.b.c)")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in allowed_funcs and not node.keywords
        ):
            raise RuleError(
                f"condition {expr!r}: only the functions {sorted(allowed_funcs)} may be called, without keywords"
            )
    return tree


def names(expr: str) -> set[str]:
    """Every (dotted) quantity a condition reads."""
    out: set[str] = set()

    def walk(n: ast.AST) -> None:
        d = dotted(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
        if d is not None:
            out.add(d)
            return
        if isinstance(n, ast.Call):
            for a in n.args:
                walk(a)
            return
        for c in ast.iter_child_nodes(n):
            walk(c)

    walk(parse(expr, frozenset(_calls(expr))))
    return out


def _calls(expr: str) -> set[str]:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return set()
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _compare(op: ast.cmpop, a: Any, b: Any) -> bool:
    if isinstance(a, str) != isinstance(b, str):
        return isinstance(op, ast.NotEq)
    try:
        return bool(_CMP[type(op)](a, b))
    except TypeError:
        return False


class Evaluator:
    """Evaluates parsed conditions against `env` (any Mapping; `functions` add callables)."""

    def __init__(self, env: Mapping[str, Any], functions: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self.env = env
        self.functions = {**FUNCTIONS, **(functions or {})}
        self._extra = frozenset(functions or {})

    def lookup(self, name: str, expr: str) -> Any:
        try:
            v = self.env[name]
        except KeyError:
            raise RuleError(f"condition {expr!r}: unknown quantity {name!r}") from None
        return NAN if v is None else v

    def __call__(self, expr: str) -> Any:
        return self._ev(parse(expr, self._extra), expr)

    def detail(self, expr: str) -> dict[str, Any]:
        """The condition, its truth, and for a comparison the values of both sides."""
        tree = parse(expr, self._extra)
        out: dict[str, Any] = {"condition": expr}
        body = tree.body
        if isinstance(body, ast.Compare) and len(body.ops) == 1:
            lhs = self._ev(body.left, expr)
            rhs = self._ev(body.comparators[0], expr)
            out["holds"] = _compare(body.ops[0], lhs, rhs)
            out["lhs"], out["rhs"] = _plain(lhs), _plain(rhs)
        else:
            v = self._ev(body, expr)
            out["holds"] = truth(v)
            if not isinstance(v, bool):
                out["value"] = _plain(v)
        return out

    def _ev(self, n: ast.AST, expr: str) -> Any:
        if isinstance(n, ast.Expression):
            return self._ev(n.body, expr)
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, (ast.Name, ast.Attribute)):
            return self.lookup(dotted(n) or "", expr)
        if isinstance(n, ast.BinOp):
            a, b = self._ev(n.left, expr), self._ev(n.right, expr)
            if isinstance(a, str) or isinstance(b, str):
                return NAN
            if isinstance(n.op, ast.Div) and b == 0:
                return NAN
            try:
                return _BIN[type(n.op)](a, b)
            except (OverflowError, ZeroDivisionError, ValueError):
                return NAN
        if isinstance(n, ast.UnaryOp):
            v = self._ev(n.operand, expr)
            if isinstance(n.op, ast.Not):
                return not truth(v)
            if isinstance(v, str):
                return NAN
            return -v if isinstance(n.op, ast.USub) else +v
        if isinstance(n, ast.BoolOp):
            vals = [truth(self._ev(x, expr)) for x in n.values]
            return all(vals) if isinstance(n.op, ast.And) else any(vals)
        if isinstance(n, ast.Compare):
            left = self._ev(n.left, expr)
            for op, right_node in zip(n.ops, n.comparators):
                right = self._ev(right_node, expr)
                if not _compare(op, left, right):
                    return False
                left = right
            return True
        if isinstance(n, ast.IfExp):
            return self._ev(n.body, expr) if truth(self._ev(n.test, expr)) else self._ev(n.orelse, expr)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            fn = self.functions[n.func.id]
            args = [self._ev(a, expr) for a in n.args]
            return fn(*args)
        raise RuleError(f"condition {expr!r}: cannot evaluate {type(n).__name__}")


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def evaluate(expr: str, env: Mapping[str, Any], functions: Mapping[str, Callable[..., Any]] | None = None) -> Any:
    """Evaluate one condition against `env`."""
    return Evaluator(env, functions)(expr)


# ---------------------------------------------------------------------------------------------
# where expressions read their names: layered environments, and spec sections in order
# ---------------------------------------------------------------------------------------------
# Run quantities under these prefixes may be absent (an arm without a gate has no arm.gate.t_on, a
# run without a frozen prediction no pred.*): they read as NaN, so conditions on them are false.
RUN_NAN_PREFIXES = ("arm", "pred", "protocol")


class Env(Mapping[str, Any]):
    """Layered lookup (later layers win). Names under a `nan_prefixes` entry that no layer has
    read as NaN: the quantities of a run that does not exist are missing, not unknown."""

    def __init__(self, *layers: Mapping[str, Any], nan_prefixes: Sequence[str] = (), all_nan: bool = False) -> None:
        self.layers = [dict(x) for x in layers]
        self.nan_prefixes = tuple(f"{p}." for p in nan_prefixes)
        self.all_nan = all_nan

    def set(self, key: str, value: Any) -> None:
        self.layers[-1][key] = value

    def __getitem__(self, key: str) -> Any:
        for layer in reversed(self.layers):
            if key in layer:
                return layer[key]
        if self.all_nan or key.startswith(self.nan_prefixes):
            return NAN
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for layer in reversed(self.layers):
            for k in layer:
                if k not in seen:
                    seen.add(k)
                    yield k

    def __len__(self) -> int:
        return sum(1 for _ in self)


def ordered(section: Any, where: str) -> list[tuple[str, Any]]:
    """A mapping, or a list of one-key mappings, as ordered (name, value) pairs."""
    if section is None:
        return []
    if isinstance(section, Mapping):
        return list(section.items())
    if isinstance(section, list):
        out: list[tuple[str, Any]] = []
        for item in section:
            if not (isinstance(item, Mapping) and len(item) == 1):
                raise RuleError(f"{where}: expected a mapping or a list of one-key mappings, got {item!r}")
            out.extend(item.items())
        return out
    raise RuleError(f"{where}: expected a mapping, got {type(section).__name__}")

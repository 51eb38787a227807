"""Element-wise and broadcast operators: a body of Binary/Unary over accesses, no summation.

Each access becomes an operand read through its view and arranged for ONNX
(right-aligned) broadcasting against the traversal: its iterators in traversal
order, size-1 dimensions where it does not vary, leading ones dropped
(``B[f]`` against ``L n, f, h, w`` is reshaped to ``[F, 1, 1]``). Constant
sub-expressions become scalar initializers. Patterns (``PATTERNS``) map
combinations to single operators first: HardSwish, HardSigmoid, Gelu (the
expressions ``einopt.frontend.importers_elementwise`` imports them as, so that a
model comes back with the operators it had), Pow for a cube, Reciprocal, PRelu,
Clip. A pattern's operator is used only where the opset has it
(``PATTERN_OPSETS``: Gelu from 20, HardSwish from 14); otherwise its expression
is written as the chain of operators it is.

A pattern matches only an expression its operator computes with the same
float32 operations as the chain would (constants compared as the float32
values the chain would hold): ``(0.5 * x) * (erf(x * c) + 1)`` is Gelu,
``0.5 * (x * (erf(..) + 1))`` is not (it overflows where Gelu does not).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import numpy as np

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.rewrite import accesses, fold_chain, operands
from einopt.frontend.importers_elementwise import (
    GELU_OPSET,
    GELU_SQRT1_2,
    GELU_TANH_B,
    GELU_TANH_C,
    HARD_SWISH_ALPHA,
    HARD_SWISH_BETA,
)
from einopt.instantiate import BINARY_OPS, UNARY_OPS, UNARY_PARAM, UNARY_PARAM_INPUT
from einopt.instantiate.plan import (
    NO_MATCH_CONTEXT,
    Literal,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Reshape,
    normalize,
    steps_shape,
)
from einopt.instantiate.views import (
    arranged,
    compile_time_term,
    finish,
    simple_view,
)

__all__ = ["PATTERNS", "PATTERN_OPSETS", "match_elementwise"]


@dataclasses.dataclass(frozen=True)
class Hit:
    """A pattern's result: one operator over sub-expressions (or literal scalars)."""

    op_type: str
    args: tuple[ir.ValueExpr | float, ...]
    attrs: tuple[tuple[str, object], ...] = ()


Pattern = Callable[[ir.ValueExpr], Hit | None]


def _pairs(e: ir.ValueExpr, op: str) -> Iterator[tuple[ir.ValueExpr, ir.ValueExpr]]:
    """``(a, b)`` and, for a commutative ``op``, ``(b, a)`` when ``e`` is ``a op b``."""
    if isinstance(e, ir.Binary) and e.op == op:
        yield e.a, e.b
        if op in ir.COMMUTATIVE_OPS:
            yield e.b, e.a


def _is_constant(e: ir.ValueExpr) -> bool:
    return not e.iters() and not _has_access(e)


def _has_access(e: ir.ValueExpr) -> bool:
    return any(isinstance(x, ir.Access) for x in ir.walk(e, stop=ir.Access))


def constant_value(e: ir.ValueExpr) -> float:
    """A constant sub-expression's value, computed by the reference interpreter (float64)."""
    return float(evaluate(ir.Scope((ir.Iter("i", 0, 1),), (), e), {})[0])


def _zero(e: ir.ValueExpr) -> bool:
    return isinstance(e, ir.Const) and e.value == 0.0


def _prelu(e: ir.ValueExpr) -> Hit | None:
    """``max(X, 0) + A * min(X, 0) -> PRelu(X, A)`` (A broadcastable to X)."""
    for pos, neg in _pairs(e, "+"):
        for x, z in _pairs(pos, "max"):
            if not _zero(z):
                continue
            for a, m in _pairs(neg, "*"):
                for x2, z2 in _pairs(m, "min"):
                    if x2 is x and _zero(z2) and a.iters() <= x.iters():
                        return Hit("PRelu", (x, a))
    return None


def _clip(e: ir.ValueExpr) -> Hit | None:
    """``min(max(X, lo), hi) -> Clip(X, lo, hi)``; ``max(min(X, hi), lo)`` when ``lo <= hi``;
    ``min(relu(X), hi) -> Clip(X, 0, hi)``."""
    for inner, hi in _pairs(e, "min"):
        if not _is_constant(hi):
            continue
        if isinstance(inner, ir.Unary) and inner.fn == "relu":
            return Hit("Clip", (inner.x, 0.0, constant_value(hi)))
        for x, lo in _pairs(inner, "max"):
            if _is_constant(lo) and not _is_constant(x):
                return Hit("Clip", (x, constant_value(lo), constant_value(hi)))
    for inner, lo in _pairs(e, "max"):
        if not _is_constant(lo):
            continue
        for x, hi in _pairs(inner, "min"):
            if _is_constant(hi) and not _is_constant(x) and constant_value(lo) <= constant_value(hi):
                return Hit("Clip", (x, constant_value(lo), constant_value(hi)))
    return None


def _is(e: ir.ValueExpr, value: float) -> bool:
    """``e`` is a constant holding ``value`` in float32 (as an emitted literal or attribute would)."""
    if isinstance(e, ir.Const):
        v = e.value
    elif _is_constant(e):
        v = constant_value(e)
    else:
        return False
    return bool(np.float32(v) == np.float32(value))


def _f32(v: float) -> float:
    return float(np.float32(v))


def _affine(e: ir.ValueExpr) -> tuple[ir.ValueExpr, float, float] | None:
    """``(x, a, b)`` when ``e`` is ``a * x + b``, ``x + b`` or ``a * x`` for constants ``a, b``."""
    for ax, b in _pairs(e, "+"):
        if _is_constant(b) and not _is_constant(ax):
            x, a = _scaled(ax)
            return x, a, constant_value(b)
    x, a = _scaled(e)
    return (x, a, 0.0) if x is not e else None


def _scaled(e: ir.ValueExpr) -> tuple[ir.ValueExpr, float]:
    """``(x, a)`` when ``e`` is ``a * x`` for a constant ``a``, else ``(e, 1)``."""
    for x, a in _pairs(e, "*"):
        if _is_constant(a) and not _is_constant(x):
            return x, constant_value(a)
    return e, 1.0


def _hard_sigmoid_parts(e: ir.ValueExpr) -> tuple[ir.ValueExpr, float, float] | None:
    """``(x, alpha, beta)`` when ``e`` is ``max(min(alpha * x + beta, 1), 0)`` or
    ``min(max(alpha * x + beta, 0), 1)`` (the same values, NaN included)."""
    for outer, inner_op, bound, inner_bound in (("max", "min", 0.0, 1.0), ("min", "max", 1.0, 0.0)):
        for inner, b in _pairs(e, outer):
            if not _is(b, bound):
                continue
            for lin, ib in _pairs(inner, inner_op):
                if _is(ib, inner_bound):
                    found = _affine(lin)
                    if found is not None:
                        return found
    return None


def _hard_sigmoid(e: ir.ValueExpr) -> Hit | None:
    """``max(min(alpha * X + beta, 1), 0) -> HardSigmoid(X, alpha, beta)`` (``X + beta``: alpha 1,
    ``alpha * X``: beta 0; a bare ``X`` is left to Clip)."""
    found = _hard_sigmoid_parts(e)
    if found is None:
        return None
    x, alpha, beta = found
    return Hit("HardSigmoid", (x,), (("alpha", _f32(alpha)), ("beta", _f32(beta))))


def _hard_swish(e: ir.ValueExpr) -> Hit | None:
    """``X * HardSigmoid(X, 1/6, 1/2) -> HardSwish(X)``."""
    for x, h in _pairs(e, "*"):
        found = _hard_sigmoid_parts(h)
        if found is not None and found[0] is x:
            if (_f32(found[1]), _f32(found[2])) == (_f32(HARD_SWISH_ALPHA), _f32(HARD_SWISH_BETA)):
                return Hit("HardSwish", (x,))
    return None


def _gelu(e: ir.ValueExpr) -> Hit | None:
    """``(0.5 * X) * (erf(X * c) + 1) -> Gelu(X)`` and ``(0.5 * X) * (tanh(X * ((C * X) * X + B)) + 1)
    -> Gelu(X, approximate="tanh")``: ONNX Runtime's kernels, operation for operation
    (``einopt.frontend.importers_elementwise.gelu``)."""
    for half_x, u in _pairs(e, "*"):
        for half, x in _pairs(half_x, "*"):
            if not _is(half, 0.5) or _is_constant(x):
                continue
            for t, one in _pairs(u, "+"):
                if not _is(one, 1.0) or not isinstance(t, ir.Unary):
                    continue
                if t.fn == "erf" and any(a is x and _is(c, GELU_SQRT1_2) for a, c in _pairs(t.x, "*")):
                    return Hit("Gelu", (x,))
                if t.fn == "tanh" and any(a is x and _gelu_cubic(p, x) for a, p in _pairs(t.x, "*")):
                    return Hit("Gelu", (x,), (("approximate", "tanh"),))
    return None


def _gelu_cubic(e: ir.ValueExpr, x: ir.ValueExpr) -> bool:
    """``e`` is ``(C * x) * x + B`` with Gelu's tanh-form constants."""
    for q, b in _pairs(e, "+"):
        if _is(b, GELU_TANH_B):
            for cx, x2 in _pairs(q, "*"):
                if x2 is x and any(a is x and _is(c, GELU_TANH_C) for a, c in _pairs(cx, "*")):
                    return True
    return False


def _cube(e: ir.ValueExpr) -> Hit | None:
    """``(X * X) * X -> Pow(X, 3)`` (ONNX Runtime computes a scalar exponent 3 as ``x * x * x``)."""
    for sq, x in _pairs(e, "*"):
        if not _is_constant(x) and any(a is x and b is x for a, b in _pairs(sq, "*")):
            return Hit("Pow", (x, 3.0))
    return None


def _reciprocal(e: ir.ValueExpr) -> Hit | None:
    """``1 / X -> Reciprocal(X)`` (which divides)."""
    for one, x in _pairs(e, "/"):
        if _is(one, 1.0) and not _is_constant(x):
            return Hit("Reciprocal", (x,))
    return None


PATTERNS: dict[str, Pattern] = {
    "HardSwish": _hard_swish,
    "HardSigmoid": _hard_sigmoid,  # before Clip, which would take its clamp
    "Gelu": _gelu,
    "Pow": _cube,
    "Reciprocal": _reciprocal,
    "PRelu": _prelu,
    "Clip": _clip,
}
"""Operators for combinations, tried in order at every node of a body (from the root down)."""

PATTERN_OPSETS: dict[str, int] = {"HardSwish": 14, "Gelu": GELU_OPSET}
"""The first default-domain opset with a pattern's operator (the others are in every opset emitted)."""


class _Builder:
    """Numbers operands and ops of one element-wise body (shared sub-expressions once)."""

    def __init__(self, traversal: tuple[ir.Iter, ...], ctx: MatchContext) -> None:
        self.traversal = traversal
        self.ctx = ctx
        # The patterns whose operator the emitted opset has (None: any).
        self.patterns = [
            p for name, p in PATTERNS.items() if ctx.opset is None or PATTERN_OPSETS.get(name, 0) <= ctx.opset
        ]
        self.operands: list[Operand] = []
        self.ops: list[OpNode] = []
        self.memo: dict[object, int] = {}

    def operand(self, op: Operand, key: object) -> int:
        if key not in self.memo:
            self.operands.append(op)
            self.memo[key] = -len(self.operands)  # renumbered in ``match``
        return self.memo[key]

    def op(self, node: OpNode, key: object) -> int:
        if key not in self.memo:
            self.ops.append(node)
            self.memo[key] = len(self.ops) - 1
        return self.memo[key]

    def scalar(self, v: float) -> int:
        return self.operand(Operand(Literal(np.asarray(v, dtype=np.float32))), ("literal", float(v)))

    def value(self, e: ir.ValueExpr | float) -> int | Refusal:
        if isinstance(e, float):
            return self.scalar(e)
        if e in self.memo:
            return self.memo[e]
        if _is_constant(e):
            return self.scalar(constant_value(e))
        for hit in (p(e) for p in self.patterns):
            if hit is not None:
                args = [self.value(a) for a in hit.args]
                bad = next((a for a in args if isinstance(a, Refusal)), None)
                return bad or self.op(OpNode(hit.op_type, tuple(args), hit.attrs), e)
        if isinstance(e, ir.Access):
            return self.access(e)
        folded = _constants_folded(e, self.traversal, self.ctx)
        if folded is not None:
            value = self.value(folded)
            if not isinstance(value, Refusal):
                self.memo[e] = value
            return value
        if isinstance(e, ir.Binary):
            a, b = self.value(e.a), self.value(e.b)
            bad = next((x for x in (a, b) if isinstance(x, Refusal)), None)
            return bad or self.op(OpNode(BINARY_OPS[e.op], (a, b)), e)
        if isinstance(e, ir.Unary):
            x = self.value(e.x)
            if isinstance(x, Refusal):
                return x
            if e.fn in UNARY_PARAM_INPUT:  # Pow's exponent: a one-element initializer
                return self.op(OpNode(UNARY_OPS[e.fn], (x, self.scalar(e.param))), e)
            attrs = ((UNARY_PARAM[e.fn], e.param),) if e.fn in UNARY_PARAM else ()
            return self.op(OpNode(UNARY_OPS[e.fn], (x,), attrs), e)
        return Refusal(f"cannot map {type(e).__name__} to an element-wise operator")

    def access(self, acc: ir.Access) -> int | Refusal:
        view = simple_view(acc)
        if isinstance(view, Refusal):
            return view
        first = next((d for d, t in enumerate(self.traversal) if t in view.labels), len(self.traversal))
        groups = [(t,) if t in view.labels else () for t in self.traversal[first:]]
        shape = tuple(acc.source.shape)
        steps = arranged(view, groups)
        if steps and isinstance(steps[-1], Reshape):
            before = steps_shape(steps[:-1], shape)
            if len(before) <= len(self.traversal) and _strip(before) == _strip(steps[-1].shape):
                steps = steps[:-1]  # only leading 1s differ: broadcasting aligns from the right
        return self.operand(Operand(acc.source, steps), acc)


def _constants_folded(
    e: ir.ValueExpr, traversal: tuple[ir.Iter, ...], ctx: MatchContext
) -> ir.ValueExpr | None:
    """A sum (or product) chain with two or more constant terms, at least one a tensor, as the
    other terms and one term computed at compile time: ``X[n, j] + b1[j] + b2[j]`` as
    ``X[n, j] + B[j]`` (``B = b1 + b2``, one Add instead of two; two merged contractions each
    bring their bias). None when there is nothing to fold, or when the folded constant would be
    larger than its largest term (``a[i] + b[j]`` stays two broadcast vectors)."""
    if not (isinstance(e, ir.Binary) and e.op in ("+", "*")):
        return None
    terms = operands(e, e.op)
    constant = [t for t in terms if all(ctx.is_constant(a.source) for a in accesses(t))]
    tensors = [t for t in constant if accesses(t)]
    if len(constant) < 2 or not tensors or len(constant) == len(terms):
        return None
    read = set().union(*(t.iters() for t in constant))
    if not any(read <= t.iters() for t in tensors):
        return None
    term = compile_time_term(constant, e.op, traversal)
    return fold_chain([t for t in terms if t not in constant] + [term], e.op)


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def match_elementwise(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """Binary/unary operators over broadcast accesses (``L n, f: X[n, f] * s[f] + 1.0``)."""
    if scope.summation:
        return Refusal("sums over iterators: not element-wise")
    b = _Builder(scope.traversal, ctx)
    root = b.value(scope.body)
    if isinstance(root, Refusal):
        return root
    if not b.ops:
        return Refusal("no operator in the body (a layout or a constant)")
    n = len(b.operands)

    def renumber(v: int | None) -> int | None:
        return None if v is None else (-v - 1 if v < 0 else n + v)

    ops = tuple(dataclasses.replace(op, inputs=tuple(renumber(v) for v in op.inputs)) for op in b.ops)
    if renumber(root) != n + len(ops) - 1:
        return Refusal("the result is not the last operator")  # cannot happen: the root is built last
    present = scope.body.iters()
    first = next((d for d, t in enumerate(scope.traversal) if t in present), len(scope.traversal))
    groups = [(t,) if t in present else () for t in scope.traversal[first:]]
    label = "+".join(dict.fromkeys(op.op_type for op in ops))
    post = finish(groups, scope.traversal)
    rank = max(len(o.shape) for o in b.operands)
    if rank < len(groups):  # every operand dropped leading size-1 dims, so the result lacks them too
        grouped = tuple(math.prod(t.extent for t in g) for g in groups)
        post = normalize((Reshape(grouped), *post), grouped[len(groups) - rank :])
    return OperatorMatch(label, tuple(b.operands), ops, post)

"""Element-wise and broadcast operators: a body of Binary/Unary over accesses, no summation.

Each access becomes an operand read through its view and arranged for ONNX
(right-aligned) broadcasting against the traversal: its iterators in traversal
order, size-1 dimensions where it does not vary, leading ones dropped
(``B[f]`` against ``L n, f, h, w`` is reshaped to ``[F, 1, 1]``). Constant
sub-expressions become scalar initializers. Patterns (``PATTERNS``) map
combinations to single operators first: PRelu, Clip.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import numpy as np

from einopt.core import ir
from einopt.instantiate import BINARY_OPS, UNARY_OPS, UNARY_PARAM
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
    arrange,
    finish,
    simple_view,
)

__all__ = ["PATTERNS", "match_elementwise"]


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
    from einopt.core.interp import evaluate

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


PATTERNS: dict[str, Pattern] = {"PRelu": _prelu, "Clip": _clip}


class _Builder:
    """Numbers operands and ops of one element-wise body (shared sub-expressions once)."""

    def __init__(self, traversal: tuple[ir.Iter, ...]) -> None:
        self.traversal = traversal
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
        for hit in (p(e) for p in PATTERNS.values()):
            if hit is not None:
                args = [self.value(a) for a in hit.args]
                bad = next((a for a in args if isinstance(a, Refusal)), None)
                return bad or self.op(OpNode(hit.op_type, tuple(args), hit.attrs), e)
        if isinstance(e, ir.Access):
            return self.access(e)
        if isinstance(e, ir.Binary):
            a, b = self.value(e.a), self.value(e.b)
            bad = next((x for x in (a, b) if isinstance(x, Refusal)), None)
            return bad or self.op(OpNode(BINARY_OPS[e.op], (a, b)), e)
        if isinstance(e, ir.Unary):
            x = self.value(e.x)
            if isinstance(x, Refusal):
                return x
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
        steps = normalize(view.steps + arrange(view.labels, view.shape, groups), shape)
        if steps and isinstance(steps[-1], Reshape):
            before = steps_shape(steps[:-1], shape)
            if len(before) <= len(self.traversal) and _strip(before) == _strip(steps[-1].shape):
                steps = steps[:-1]  # only leading 1s differ: broadcasting aligns from the right
        return self.operand(Operand(acc.source, steps), acc)


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def match_elementwise(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """Binary/unary operators over broadcast accesses (``L n, f: X[n, f] * s[f] + 1.0``)."""
    if scope.summation:
        return Refusal("sums over iterators: not element-wise")
    b = _Builder(scope.traversal)
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

"""Matchers of reductions by maximum: ReduceMax, MaxPool, Softmax.

They read back the forms of :mod:`einopt.frontend.importers_max`:

* ReduceMax: ``L x.. Max y..: X[..]`` with any view of ``X`` (a transposed or sliced read becomes
  layout steps on the operand); ``keepdims=1`` when the reduced dimensions stay in place at
  extent 1. The axes are an input from opset 18 (an attribute before).
* MaxPool: ``L n, c, o.. Max t..: X[n, c, o*s + t*d - pb, ..]``, plus the importer's penalty
  scope (``-inf`` outside ``X``) read at the index of each spatial dimension whose windows leave
  ``X``; a window that reads outside ``X`` without a penalty reads 0, which MaxPool cannot give,
  and is refused. Pads are the begin offsets and the least end pads holding every window; a
  MaxPool that would compute more outputs than the scope has is sliced.
* Softmax, on the output scope ``L all..: exp(X - M[rest..]) / S[rest..]`` with ``M`` and ``S``
  the importer's inline maximum and sum: the whole scope must have the canonical key of the
  importer's form over the same axes once element-wise scopes are inlined (so an input the normal
  form inlined into ``M`` and ``S``, or an element-wise ``X`` such as an attention's scaled and
  masked scores, still matches; such an ``X`` becomes Softmax's input scope), and ``M`` and ``S``
  are consumed. One axis is Softmax's
  ``axis`` from opset 13; axes running to the last are the coerced 2-D form before 13 (and a
  Reshape around a Softmax over the last axis from 13).

Only matchers marked :func:`reads_maxima` see a max scope or fuse one: every other matcher reads a
reduction as a sum, and :func:`einopt.instantiate.match.match` refuses it for them.

This module must not import ``einopt.instantiate.match`` at module level: that module imports
this one for its table.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from einopt.core import ir, keys
from einopt.core.index import bounds
from einopt.core.rewrite import accesses, operands, substitute_iters, transform
from einopt.core.syntax import brief
from einopt.frontend.importers_max import (
    REDUCE_MAX_AXES_INPUT_OPSET,
    SOFTMAX_AXIS_OPSET,
    penalty,
    softmax,
)
from einopt.frontend.operand import Operand as SourceOperand
from einopt.frontend.pooling import pool_output_size
from einopt.instantiate.plan import (
    NO_MATCH_CONTEXT,
    Literal,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Reshape,
    Slice,
    steps_cost,
)
from einopt.instantiate.views import finish, positional, simple_view

__all__ = [
    "MAX_MATCHERS",
    "MAX_PREFERRED",
    "reads_maxima",
    "takes_maxima",
    "match_reduce_max",
    "match_max_pool",
    "match_softmax",
]

Matcher = Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]

_READS_MAXIMA: set[Matcher] = set()


def reads_maxima(fn: Matcher) -> Matcher:
    """Mark ``fn`` as a matcher that reads max scopes as maxima (so it may match or fuse them).

    A matcher of com.microsoft attention, which fuses a Softmax's inline maximum, marks itself so.
    """
    _READS_MAXIMA.add(fn)
    return fn


def takes_maxima(fn: Matcher) -> bool:
    """Whether ``fn`` was marked by :func:`reads_maxima`."""
    return fn in _READS_MAXIMA


def _positions(its: tuple[ir.Iter, ...], labels: tuple[ir.Iter, ...]) -> tuple[int, ...]:
    return tuple(d for d, it in enumerate(labels) if it in its)


# --------------------------------------------------------------------------
# ReduceMax
# --------------------------------------------------------------------------


@reads_maxima
def match_reduce_max(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L x.. Max y..: X[..]`` (any view of ``X``) as ReduceMax over the reduced dimensions."""
    if not scope.is_max:
        return Refusal("not a maximum")
    if not isinstance(scope.body, ir.Access):
        return Refusal("the body is not one read: not a ReduceMax")
    view = simple_view(scope.body)
    if isinstance(view, Refusal):
        return Refusal(f"operand {scope.body}: {view.reason}")
    reduced = set(scope.summation)
    axes = _positions(scope.summation, view.labels)
    if not axes:
        return Refusal("the reduced iterators are not read: not a reduction")
    kept = tuple(it for it in view.labels if it not in reduced)
    in_place = finish([() if it in reduced else (it,) for it in view.labels], scope.traversal)
    dropped = finish([(it,) for it in kept], scope.traversal)
    keepdims = (steps_cost(in_place, False), len(in_place)) <= (steps_cost(dropped, False), len(dropped))
    found: tuple[Operand, ...] = (Operand(view.source, view.steps),)
    attrs: tuple[tuple[str, object], ...] = (("keepdims", int(keepdims)),)
    if ctx.opset is None or ctx.opset >= REDUCE_MAX_AXES_INPUT_OPSET:
        found += (Operand(Literal(np.asarray(axes, dtype=np.int64))),)
    else:
        attrs = (("axes", axes), *attrs)
    op = OpNode("ReduceMax", tuple(range(len(found))), attrs)
    return OperatorMatch("ReduceMax", found, (op,), in_place if keepdims else dropped)


# --------------------------------------------------------------------------
# MaxPool
# --------------------------------------------------------------------------


def _penalty_of(acc: ir.Access, ctx: MatchContext) -> ir.Scope | None:
    """The importer's penalty scope ``acc`` reads (``-inf`` outside a length), or None."""
    src = acc.source
    if not isinstance(src, ir.Scope) or src.rank != 1 or src in ctx.bound:
        return None
    (h,) = src.traversal
    for sub in ir.scopes_in(src.body):
        if sub is not src and sub.rank == 1 and src is penalty(sub.shape[0], h.lo, h.hi):
            return src
    return None


def _taps_inside(o: int, s: int, k: int, dil: int, pb: int, n: int) -> bool:
    return any(0 <= o * s + t * dil - pb < n for t in range(k))


@reads_maxima
def match_max_pool(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L n, c, o.. Max t..: X[n, c, o*s + t*d - pb, ..] (+ penalties)`` as MaxPool."""
    if not scope.is_max:
        return Refusal("not a maximum")
    traversal = scope.traversal
    terms = operands(scope.body, "+")
    reads = [t for t in terms if isinstance(t, ir.Access) and t.source.rank == len(traversal)]
    if len(reads) != 1 or len(traversal) < 3:
        return Refusal("not one [N, C, spatial..] read plus penalties: not a pooling")
    (x,) = reads
    src = x.source
    forms = [positional(idx, o) for idx, o in zip(x.indices, src.origin, strict=True)]
    for d in (0, 1):
        if forms[d] != ({traversal[d]: 1}, 0) or traversal[d].extent != src.shape[d]:
            return Refusal(f"dimension {d} is not read whole, in place")
    penalties: dict[int, ir.Scope] = {}
    for t in terms:
        if t is x:
            continue
        pen = _penalty_of(t, ctx) if isinstance(t, ir.Access) else None
        d = next(
            (d for d in range(2, len(traversal)) if pen is not None and t.indices[0] is x.indices[d]), None
        )
        if d is None or d in penalties:
            return Refusal(f"a term besides the window read that is not its -inf padding: {brief(t)}")
        penalties[d] = pen
    taps: list[ir.Iter] = []
    kernel, strides, dilations, begin, end = [], [], [], [], []
    post_ends: list[int] = []
    for d in range(2, len(traversal)):
        if forms[d] is None:
            return Refusal(f"index {x.indices[d]} is not affine")
        coeffs, const = forms[d]
        o, n = traversal[d], src.shape[d]
        rest = {it: c for it, c in coeffs.items() if it is not o}
        if coeffs.get(o, 0) < 1 or len(rest) > 1 or const > 0:
            return Refusal(f"index {x.indices[d]} is not a window o*s + t*d - pad")
        t, dil = next(iter(rest.items())) if rest else (None, 1)
        if t is not None and (t not in scope.summation or t in taps or dil < 1):
            return Refusal(f"index {x.indices[d]} is not a window o*s + t*d - pad")
        k = t.extent if t is not None else 1
        dil = dil if k > 1 else 1
        s, pb = coeffs[o], -const
        if t is not None:
            taps.append(t)
        lo, hi = (b - src.origin[d] for b in bounds(x.indices[d]))
        if lo < 0 or hi >= n:
            pen = penalties.get(d)
            if pen is None:
                return Refusal(f"windows of dimension {d} read outside X as 0 (MaxPool pads with -inf)")
            (h,) = pen.traversal
            # The penalty is 0 on [0, n) of the index it is read at: X's positions when X starts at 0.
            if src.origin[d] or h.lo > lo or h.hi <= hi:
                return Refusal(f"the -inf padding of dimension {d} does not cover every window")
        if not all(_taps_inside(p, s, k, dil, pb, n) for p in range(o.extent)):
            return Refusal(
                f"a window of dimension {d} reads only padding (ONNX Runtime gives float32's lowest)"
            )
        pe = max(0, (o.extent - 1) * s + (k - 1) * dil + 1 - pb - n)
        if pb >= k or pe >= k:
            return Refusal(f"pads {pb}, {pe} of dimension {d} not below the kernel {k} (ONNX Runtime)")
        kernel.append(k)
        strides.append(s)
        dilations.append(dil)
        begin.append(pb)
        end.append(pe)
        post_ends.append(o.extent)
    read = {it for t in terms for it in t.iters()}
    if any(it in read for it in scope.summation if it not in taps):
        return Refusal("a reduced iterator that is not a window tap")
    sizes = [
        pool_output_size(src.shape[d + 2], *g, False)
        for d, g in enumerate(zip(kernel, strides, dilations, begin, end, strict=True))
    ]
    attrs: list[tuple[str, object]] = [
        ("kernel_shape", tuple(kernel)),
        ("strides", tuple(strides)),
        ("pads", tuple(begin + end)),
    ]
    if any(d != 1 for d in dilations):
        attrs.append(("dilations", tuple(dilations)))
    cut = [d for d, (size, want) in enumerate(zip(sizes, post_ends, strict=True)) if size != want]
    post = ()
    if cut:  # MaxPool computes more windows than the scope: keep the first ones
        post = (
            Slice(
                (0,) * len(cut),
                tuple(post_ends[d] for d in cut),
                tuple(d + 2 for d in cut),
                (1,) * len(cut),
            ),
        )
    consumes = tuple(dict.fromkeys(s for pen in penalties.values() for s in ir.scopes_in(pen)))
    op = OpNode("MaxPool", (0,), tuple(attrs))
    return OperatorMatch("MaxPool", (Operand(src),), (op,), post, consumes)


# --------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------


def _softmax_parts(scope: ir.Scope) -> tuple[ir.ValueExpr, ir.Access, ir.Access] | Refusal:
    """``(X, M read, S read)`` of ``exp(X - M) / S``, or why the body is not that."""
    body = scope.body
    if not (isinstance(body, ir.Binary) and body.op == "/" and isinstance(body.b, ir.Access)):
        return Refusal("not a quotient by a read: not a softmax")
    num = body.a
    if not (isinstance(num, ir.Unary) and num.fn == "exp"):
        return Refusal("the numerator is not an exp: not a softmax")
    diff = num.x
    if not (isinstance(diff, ir.Binary) and diff.op == "-"):
        return Refusal("the exponent is not a difference: not a softmax")
    if not isinstance(diff.b, ir.Access) or not isinstance(diff.b.source, ir.Scope):
        return Refusal("the exponent does not subtract a scope: not a softmax")
    return diff.a, diff.b, body.b


def _in_place(e: ir.ValueExpr, traversal: tuple[ir.Iter, ...]) -> bool:
    """``e`` reads a whole source at the positions of ``traversal``, in order."""
    if not isinstance(e, ir.Access) or e.source.rank != len(traversal):
        return False
    return all(
        positional(idx, o) == ({t: 1}, 0) and t.extent == n
        for idx, o, t, n in zip(e.indices, e.source.origin, traversal, e.source.shape, strict=True)
    )


def _flat_key(scope: ir.Scope) -> str:
    """The canonical key of ``scope`` with every read of a scope without reduction that stays inside
    its box replaced by that scope's body, in nested scopes too: one form whatever the normal form
    inlined.

    Iterative over the nesting: the scopes ``scope`` reaches are flattened and keyed producers
    first, each memoised on the node (pure functions of immutable nodes), so neither the flattening
    nor ``keys.key`` (which keys a read's source first) goes deeper than one scope. A translated
    model nests one scope per node, hundreds deep, and the Softmax candidates of a program share
    what lies upstream of them.
    """
    for s in ir.scopes_in(scope):
        keys.key(_flat(s))
    return keys.key(_flat(scope))


def _flat(s: ir.Scope) -> ir.Scope:
    return ir._cached(s, "match_max.flattened", lambda: s.replace(body=transform(s.body, _flat_read)))


def _flat_read(x: ir.ValueExpr) -> ir.ValueExpr | None:
    """A read of a scope, flattened (its source is, being a producer): the source's body when the
    scope has no reduction and the read stays inside its box (outside it reads 0)."""
    if not isinstance(x, ir.Access) or not isinstance(x.source, ir.Scope):
        return None
    src = _flat(x.source)
    inside = all(
        it.lo <= lo and hi < it.hi
        for idx, it in zip(x.indices, src.traversal, strict=True)
        for lo, hi in (bounds(idx),)
    )
    if src.summation or not inside:
        return ir.Access(src, x.indices)
    return substitute_iters(src.body, dict(zip(src.traversal, x.indices, strict=True)))


def _softmax_node(
    shape: tuple[int, ...], red: list[int], ctx: MatchContext
) -> tuple[tuple, tuple, tuple] | Refusal:
    """``(operand steps, attributes, post steps)`` of one Softmax over the axes ``red``."""
    rank = len(shape)
    suffix = red == list(range(red[0], rank))
    old = ctx.opset is not None and ctx.opset < SOFTMAX_AXIS_OPSET
    if old:
        if not suffix:
            return Refusal(
                f"Softmax before opset {SOFTMAX_AXIS_OPSET} normalises the axes from one on, not {red}"
            )
        return (), (("axis", red[0]),), ()
    if len(red) == 1:
        return (), (("axis", red[0]),), ()
    if not suffix:
        return Refusal(f"Softmax over axes {red}: one axis, or the last ones")
    flat = (*shape[: red[0]], math.prod(shape[red[0] :]))
    return (Reshape(flat),), (("axis", len(flat) - 1),), (Reshape(shape),)


@reads_maxima
def match_softmax(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L all..: exp(X - M[rest..]) / S[rest..]`` (the importer's form) as one Softmax.

    ``X`` is a whole source read in place, or an element-wise expression (the scores of an
    attention, scaled and masked; a layout read the normal form inlined), which becomes a scope of
    its own, Softmax's input. The scope must have the canonical key of the importer's form over
    that input once element-wise scopes are inlined on both sides.
    """
    if scope.summation:
        return Refusal("a reduction: not a softmax's output")
    parts = _softmax_parts(scope)
    if isinstance(parts, Refusal):
        return parts
    x, m, s = parts
    traversal = scope.traversal
    if m.source in ctx.bound or s.source in ctx.bound:
        return Refusal("its maximum or its sum is a program binding (materialised anyway)")
    kept = m.iters()
    red = [d for d, t in enumerate(traversal) if t not in kept]
    if not red:
        return Refusal("nothing is normalised")
    src = x.source if _in_place(x, traversal) else ir.Scope(traversal, (), x)
    operand = SourceOperand("X", src, tuple(src.shape), onnx.TensorProto.FLOAT)
    if _flat_key(softmax(operand, red).y) != _flat_key(scope):
        return Refusal(f"not exp(X - max) / sum(exp(X - max)) over axes {red}")
    node = _softmax_node(tuple(src.shape), red, ctx)
    if isinstance(node, Refusal):
        return node
    steps, attrs, post = node
    op = OpNode("Softmax", (0,), attrs)
    # The maximum, the sum, and the maximum the sum reads (the same one, unless renamed apart).
    inner = [a.source for a in accesses(s.source.body) if isinstance(a.source, ir.Scope) and a.source.is_max]
    consumes = tuple(dict.fromkeys((m.source, s.source, *inner)))
    return OperatorMatch("Softmax", (Operand(src, steps),), (op,), post, consumes)


MAX_MATCHERS: dict[str, Matcher] = {
    "MaxPool": match_max_pool,
    "ReduceMax": match_reduce_max,
    "Softmax": match_softmax,
}
"""Matcher per name, in order of preference, tried where ``einopt.instantiate.match.MATCHERS`` places them."""

MAX_PREFERRED: dict[str, Matcher] = {
    "MaxPool": match_max_pool,
    "ReduceMax": match_reduce_max,
    "Softmax": match_softmax,
}
"""The matcher of each original ONNX operator type these matchers instantiate."""

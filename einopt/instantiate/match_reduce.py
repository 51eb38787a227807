"""Matchers of reductions by sum and normalizations: ReduceMean, ReduceSumSquare, ReduceL2,
GlobalAveragePool, AveragePool, LayerNormalization.

They read back the forms of :mod:`einopt.frontend.importers_reduce`, with any view of the input
(a transposed or sliced read becomes layout steps on the operand, as for ReduceSum):

* ReduceMean: ``L x.. Sum y..: c * X[..]`` with ``c = 1/N`` (``N`` the elements summed into one).
  The axes are an input from opset 18 (an attribute before); ``keepdims=1`` when the reduced
  dimensions stay in place at extent 1 (as an original ``keepdims=1`` node wrote them).
* ReduceSumSquare: ``X[..] * X[..]`` summed; ReduceL2: ``L: sqrt(S[..])`` fusing that inline scope.
* GlobalAveragePool: the mean over every dimension after the first two.
* AveragePool: ``L n, c, o.. Sum t..: X[n, c, o*s + t*d - pb, ..]`` times a constant (the kernel
  size's inverse, or any other: a ``Mul`` after it) or divided by the importer's count scope,
  which decides ``count_include_pad``; pads, ``ceil_mode`` and ``dilations`` are chosen so that
  ONNX Runtime's windows and divisors are the expression's.
* LayerNormalization (opset >= 17), on the output scope: its inline scopes (mean, centred values,
  variance, ...) are consumed. The scope and the importer's chain rebuilt from the candidate
  operands must agree once element-wise inline scopes are substituted into their readers (so
  element-wise steps fused by the search still match); the comparison is by canonical key.

This module must not import ``einopt.instantiate.match`` at module level: that module imports
this one for its table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import onnx

from einopt.core import ir, keys
from einopt.core.index import bounds
from einopt.core.rewrite import substitute_iters, transform
from einopt.frontend.importers_reduce import count_scope, layer_norm
from einopt.frontend.operand import Operand as SourceOperand
from einopt.frontend.operand import Unsupported
from einopt.frontend.pooling import PoolGeometry, pool_output_size
from einopt.instantiate.plan import (
    NO_MATCH_CONTEXT,
    LayoutStep,
    Literal,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Reshape,
    Scale,
    steps_cost,
)
from einopt.instantiate.views import View, as_product, finish, positional, simple_view

__all__ = [
    "REDUCE_MATCHERS",
    "REDUCE_PREFERRED",
    "match_reduce_mean",
    "match_reduce_sum_square",
    "match_reduce_l2",
    "match_global_average_pool",
    "match_average_pool",
    "match_layer_norm",
]

Matcher = Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]

# Opsets from which these operators take their forms.
AXES_INPUT_OPSET = 18  # ReduceMean, ReduceSumSquare, ReduceL2: axes as an input
POOL_DILATIONS_OPSET = 19  # AveragePool's dilations
POOL_CEIL_OPSET = 10  # AveragePool's ceil_mode
LAYER_NORM_OPSET = 17


def _is_one(x: float) -> bool:
    """A scale that is 1 up to the rounding of ``1/N`` (far below float32's)."""
    return abs(x - 1.0) <= 1e-12


# --------------------------------------------------------------------------
# Reductions of one access
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Reduction:
    """``scale * Sum_summed f(X[view])``: the view, its summed and kept labels, the elements summed."""

    view: View
    scale: float
    summed: tuple[ir.Iter, ...]  # in the view's order
    kept: tuple[ir.Iter, ...]
    count: int


def _reduction(scope: ir.Scope, square: bool) -> _Reduction | Refusal:
    """The scope as a scaled sum of one access (``square``: of an access times itself)."""
    if not scope.summation:
        return Refusal("no summation: not a reduction")
    prod = as_product(scope.body)
    if isinstance(prod, Refusal):
        return prod
    scale, factors = prod
    if square:
        if len(factors) != 2 or factors[0] is not factors[1]:
            return Refusal("not the square of one access")
    elif len(factors) != 1:
        return Refusal(f"a product of {len(factors)} accesses: not a single-tensor reduction")
    view = simple_view(factors[0])
    if isinstance(view, Refusal):
        return Refusal(f"operand {factors[0]}: {view.reason}")
    read = set(view.labels)
    for s in scope.summation:  # summed but unread: a factor of its extent
        if s not in read:
            scale *= s.extent
    summed = tuple(it for it in view.labels if it in scope.summation)
    kept = tuple(it for it in view.labels if it not in scope.summation)
    return _Reduction(view, scale, summed, kept, math.prod(it.extent for it in summed))


def _not_a_mean(r: _Reduction) -> Refusal:
    return Refusal(f"scaled by {r.scale:g}, not 1/{r.count}: a sum, not a mean")


def _reduce_node(
    op_type: str, r: _Reduction, traversal: tuple[ir.Iter, ...], ctx: MatchContext
) -> OperatorMatch:
    """``op_type`` over the summed axes, with ``keepdims`` as the traversal keeps them (cheapest)."""
    axes = tuple(d for d, it in enumerate(r.view.labels) if it in r.summed)
    kept_in_place = finish([() if it in r.summed else (it,) for it in r.view.labels], traversal)
    dropped = finish([(it,) for it in r.kept], traversal)
    keepdims = (steps_cost(kept_in_place, False), len(kept_in_place)) <= (
        steps_cost(dropped, False),
        len(dropped),
    )
    post = kept_in_place if keepdims else dropped
    operands: tuple[Operand, ...] = (Operand(r.view.source, r.view.steps),)
    attrs: tuple[tuple[str, object], ...] = (("keepdims", int(keepdims)),)
    if ctx.opset is None or ctx.opset >= AXES_INPUT_OPSET:
        operands += (Operand(Literal(np.asarray(axes, dtype=np.int64))),)
    else:
        attrs = (("axes", axes), *attrs)
    op = OpNode(op_type, tuple(range(len(operands))), attrs)
    return OperatorMatch(op_type, operands, (op,), post)


def match_reduce_mean(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L x.. Sum y..: (1/N) * X[..]`` (any view of ``X``) as ReduceMean over the summed dimensions."""
    r = _reduction(scope, square=False)
    if isinstance(r, Refusal):
        return r
    if not r.summed:
        return Refusal("the summed iterators are not read: not a reduction")
    if not _is_one(r.scale * r.count):
        return _not_a_mean(r)
    return _reduce_node("ReduceMean", r, scope.traversal, ctx)


def match_reduce_sum_square(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L x.. Sum y..: X[..] * X[..]`` as ReduceSumSquare (a constant factor multiplies the result)."""
    r = _reduction(scope, square=True)
    if isinstance(r, Refusal):
        return r
    if not r.summed:
        return Refusal("the summed iterators are not read: not a reduction")
    m = _reduce_node("ReduceSumSquare", r, scope.traversal, ctx)
    if r.scale != 1.0:
        m = dataclasses.replace(m, post=(Scale(r.scale), *m.post))
    return m


def match_reduce_l2(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L x..: sqrt(S[x..])`` with ``S`` an inline sum of squares read in place, as ReduceL2."""
    body = scope.body
    if scope.summation or not (isinstance(body, ir.Unary) and body.fn == "sqrt"):
        return Refusal("not sqrt of a reduction")
    inner = body.x
    if not (isinstance(inner, ir.Access) and isinstance(inner.source, ir.Scope)):
        return Refusal("not sqrt of a scope")
    s = inner.source
    if s in ctx.bound:
        return Refusal("the sum of squares is a program binding (materialised anyway)")
    if not _in_place(inner, scope.traversal):
        return Refusal("the sum of squares is not read in place")
    m = match_reduce_sum_square(s, ctx)
    if isinstance(m, Refusal):
        return Refusal(f"inside sqrt: {m.reason}")
    if any(isinstance(st, Scale) for st in m.post):
        return Refusal("a scaled sum of squares (the scale would move under the root)")
    (op,) = m.ops
    return dataclasses.replace(
        m, op_type="ReduceL2", ops=(dataclasses.replace(op, op_type="ReduceL2"),), consumes=(s,)
    )


def _in_place(acc: ir.Access, traversal: tuple[ir.Iter, ...]) -> bool:
    """``acc`` reads its scope at exactly the positions of ``traversal`` (same extents, in order)."""
    src = acc.source
    if len(acc.indices) != len(traversal) or src.shape != tuple(t.extent for t in traversal):
        return False
    for idx, t, o in zip(acc.indices, traversal, src.origin, strict=True):
        pf = positional(idx, o)
        if pf is None or pf != ({t: 1}, 0):
            return False
    return True


def match_global_average_pool(
    scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT
) -> OperatorMatch | Refusal:
    """The mean over every dimension after the first two (``[N, C, ..] -> [N, C, 1, ..]``)."""
    r = _reduction(scope, square=False)
    if isinstance(r, Refusal):
        return r
    labels = r.view.labels
    if len(labels) < 3 or set(labels[:2]) & set(r.summed) or set(labels[2:]) - set(r.summed):
        return Refusal("not a reduction of every dimension after the first two")
    if not _is_one(r.scale * r.count):
        return _not_a_mean(r)
    post = finish([(labels[0],), (labels[1],), *[()] * (len(labels) - 2)], scope.traversal)
    op = OpNode("GlobalAveragePool", (0,))
    return OperatorMatch("GlobalAveragePool", (Operand(r.view.source, r.view.steps),), (op,), post)


# --------------------------------------------------------------------------
# AveragePool
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Window:
    """An AveragePool-shaped read ``X[n, c, o*s + t*d - pb, ..]``: its source, geometry and divisor."""

    source: ir.Tensor | ir.Scope
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    out: tuple[int, ...]
    scale: float
    count: ir.Access | None  # the count scope read, for ``X / Cnt``


def _window(scope: ir.Scope) -> _Window | Refusal:
    body = scope.body
    count = None
    if isinstance(body, ir.Binary) and body.op == "/" and isinstance(body.b, ir.Access):
        acc, count, scale = body.a, body.b, 1.0
        if not isinstance(acc, ir.Access) or not isinstance(count.source, ir.Scope):
            return Refusal("not a window divided by a count")
    else:
        prod = as_product(body)
        if isinstance(prod, Refusal):
            return prod
        scale, factors = prod
        if len(factors) != 1:
            return Refusal(f"a product of {len(factors)} accesses: not a pooling")
        (acc,) = factors
    src, traversal = acc.source, scope.traversal
    if len(traversal) < 3 or src.rank != len(traversal):
        return Refusal("not [N, C, spatial..] read from a source of that rank")
    forms = [positional(idx, o) for idx, o in zip(acc.indices, src.origin, strict=True)]
    for d in (0, 1):
        if forms[d] != ({traversal[d]: 1}, 0) or traversal[d].extent != src.shape[d]:
            return Refusal(f"dimension {d} is not read whole, in place")
    taps: list[ir.Iter] = []
    geometry: list[tuple[int, int, int, int]] = []  # kernel, stride, dilation, begin pad
    for d in range(2, len(traversal)):
        form = forms[d]
        if form is None:
            return Refusal(f"index {acc.indices[d]} is not affine")
        coeffs, const = form
        o = traversal[d]
        rest = {it: c for it, c in coeffs.items() if it is not o}
        if coeffs.get(o, 0) < 1 or len(rest) > 1 or const > 0:
            return Refusal(f"index {acc.indices[d]} is not a window o*s + t*d - pad")
        if rest:
            ((t, dil),) = rest.items()
            if t not in scope.summation or t in taps or dil < 1:
                return Refusal(f"index {acc.indices[d]} is not a window o*s + t*d - pad")
            taps.append(t)
            geometry.append((t.extent, coeffs[o], dil if t.extent > 1 else 1, -const))
        else:
            geometry.append((1, coeffs[o], 1, -const))
    if set(scope.summation) != set(taps):
        return Refusal("a summed iterator that is not a window tap")
    kernel, strides, dilations, pads = (tuple(g[k] for g in geometry) for k in range(4))
    out = tuple(t.extent for t in traversal[2:])
    return _Window(src, kernel, strides, dilations, pads, out, scale, count)


def _end_pad(w: _Window, spatial: tuple[int, ...], d: int) -> int:
    """The least end pad that holds every window of dimension ``d``."""
    e = w.dilations[d] * (w.kernel[d] - 1) + 1
    return max(0, (w.out[d] - 1) * w.strides[d] + e - w.pads_begin[d] - spatial[d])


def _same_scope(a: ir.Scope, b: ir.Scope) -> bool:
    return a is b or keys.key(a) == keys.key(b)


def _count_ends(cnt: ir.Scope, spatial: tuple[int, ...]) -> tuple[int, ...] | None:
    """The end pads of the padded ones scope a count reads (``[-pb, H + pe)``), if it reads one."""
    body = cnt.body
    if not (isinstance(body, ir.Access) and isinstance(body.source, ir.Scope)):
        return None
    ranges = body.source.traversal
    if len(ranges) != len(spatial):
        return None
    return tuple(it.hi - n for it, n in zip(ranges, spatial, strict=True))


def _divisor(
    w: _Window, spatial: tuple[int, ...], outputs: tuple[ir.Iter, ...], ctx: MatchContext
) -> tuple[tuple[int, ...], bool, bool] | Refusal:
    """``(end pads, ceil_mode, count_include_pad)`` under which ONNX Runtime's windows and divisors
    are the scope's (``outputs``: its spatial traversal iterators)."""
    rank = len(spatial)
    if w.count is None:
        # A constant divisor: every window inside the padded input, whole (end pads that hold them all).
        ends = tuple(_end_pad(w, spatial, d) for d in range(rank))
        include = any(w.pads_begin) or any(ends)
        options: list[range | tuple[int, ...]] = [(pe,) for pe in ends]
        ceils: tuple[bool, ...] = (False,)
    else:
        cnt = w.count
        if cnt.source in ctx.bound:
            return Refusal("the count is a program binding (materialised anyway)")
        if not _in_place(cnt, outputs):
            return Refusal("the count is not read at the output positions")
        for include in (False, True):
            pads_end = _count_ends(cnt.source, spatial) if include else (0,) * rank
            g = PoolGeometry(w.kernel, w.strides, w.dilations, w.pads_begin, pads_end or (0,) * rank, w.out)
            if pads_end is not None and _same_scope(cnt.source, count_scope(spatial, g, include)):
                break
        else:
            return Refusal("the divisor is not the windows' count")
        # Excluding pads, the end pad only sets the output size (ONNX Runtime wants it below the kernel).
        options = [(pe,) for pe in pads_end] if include else [range(k) for k in w.kernel]
        ceils = (False, True)
    for ceil in ceils:
        chosen = [
            next(
                (
                    pe
                    for pe in opts
                    if pool_output_size(
                        spatial[d], w.kernel[d], w.strides[d], w.dilations[d], w.pads_begin[d], pe, ceil
                    )
                    == w.out[d]
                ),
                None,
            )
            for d, opts in enumerate(options)
        ]
        if None not in chosen:
            return tuple(chosen), ceil, bool(include)
    return Refusal("no pads and ceil_mode give the output's size (it covers part of the pooling)")


def match_average_pool(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L n, c, o.. Sum t..: X[n, c, o*s + t*d - pb, ..]`` times a constant, or over its count,
    as AveragePool (a constant other than the kernel size's inverse multiplies the result)."""
    if not scope.summation:
        return Refusal("no summation: not a pooling")
    w = _window(scope)
    if isinstance(w, Refusal):
        return w
    spatial = tuple(w.source.shape[2:])
    form = _divisor(w, spatial, scope.traversal[2:], ctx)
    if isinstance(form, Refusal):
        return form
    pads_end, ceil, include = form
    if any(p >= k for p, k in zip(w.pads_begin + pads_end, w.kernel * 2, strict=True)):
        return Refusal(
            f"pads {list(w.pads_begin + pads_end)} not below the kernel {list(w.kernel)} (ONNX Runtime)"
        )
    attrs: list[tuple[str, object]] = [
        ("kernel_shape", w.kernel),
        ("strides", w.strides),
        ("pads", w.pads_begin + pads_end),
    ]
    needs = []
    if any(d != 1 for d in w.dilations):
        attrs.append(("dilations", w.dilations))
        needs.append(("dilations", POOL_DILATIONS_OPSET))
    if ceil:
        attrs.append(("ceil_mode", 1))
        needs.append(("ceil_mode", POOL_CEIL_OPSET))
    if include:
        attrs.append(("count_include_pad", 1))
    for what, opset in needs:
        if ctx.opset is not None and ctx.opset < opset:
            return Refusal(f"AveragePool {what} needs opset {opset} (emitting for {ctx.opset})")
    factor = w.scale * (math.prod(w.kernel) if w.count is None else 1)
    post: tuple[LayoutStep, ...] = ()
    if not _is_one(factor):
        post = (Scale(factor),)
    consumes: tuple[ir.Scope, ...] = ()
    if w.count is not None:
        consumes = (w.count.source, *ir.scopes_in(w.count.source.body))
    op = OpNode("AveragePool", (0,), tuple(attrs))
    return OperatorMatch("AveragePool", (Operand(w.source),), (op,), post, consumes)


# --------------------------------------------------------------------------
# LayerNormalization
# --------------------------------------------------------------------------


class _Inliner:
    """Substitutes inline element-wise scopes into their readers (inline summing scopes get the same
    treatment inside), recording every inline scope it passes: the scopes a fused operator consumes."""

    def __init__(self, ctx: MatchContext) -> None:
        self.ctx = ctx
        self.consumed: dict[ir.Scope, None] = {}
        self.memo: dict[ir.Scope, ir.Scope] = {}

    def peel(self, e: ir.ValueExpr) -> ir.ValueExpr:
        """``e`` with a read of an inline element-wise scope at its top replaced by that scope's body."""
        while isinstance(e, ir.Access):
            body = self._substituted(e)
            if body is None:
                break
            e = body
        return e

    def _substituted(self, acc: ir.Access) -> ir.ValueExpr | None:
        src = acc.source
        if not isinstance(src, ir.Scope) or src in self.ctx.bound or src.summation:
            return None
        for idx, it in zip(acc.indices, src.traversal, strict=True):
            lo, hi = bounds(idx)
            if lo < it.lo or hi >= it.hi:
                return None  # a read outside the scope is 0, not its body
        self.consumed[src] = None
        return substitute_iters(src.body, dict(zip(src.traversal, acc.indices, strict=True)))

    def value(self, e: ir.ValueExpr) -> ir.ValueExpr:
        def visit(x: ir.ValueExpr) -> ir.ValueExpr | None:
            if not isinstance(x, ir.Access) or not isinstance(x.source, ir.Scope):
                return None
            body = self._substituted(x)
            if body is not None:
                return self.value(body)
            if x.source in self.ctx.bound:
                return None
            self.consumed[x.source] = None
            return ir.Access(self.scope(x.source), x.indices)

        return transform(e, visit)

    def scope(self, s: ir.Scope) -> ir.Scope:
        out = self.memo.get(s)
        if out is None:
            out = self.memo[s] = s.replace(body=self.value(s.body))
        return out


def _pairs(e: ir.ValueExpr, op: str) -> list[tuple[ir.ValueExpr, ir.ValueExpr]]:
    if isinstance(e, ir.Binary) and e.op == op:
        return [(e.a, e.b), (e.b, e.a)] if op in ir.COMMUTATIVE_OPS else [(e.a, e.b)]
    return []


@dataclasses.dataclass(frozen=True, eq=False)
class _NormParts:
    """What a LayerNormalization candidate reads: X, epsilon, scale and bias (values at the output)."""

    x: ir.Access
    mean: ir.ValueExpr
    epsilon: float
    scale: ir.ValueExpr
    bias: ir.ValueExpr | None


def _norm_parts(body: ir.ValueExpr, inl: _Inliner) -> list[_NormParts]:
    """Every reading of ``body`` as ``((X - M) / sqrt(V + eps)) * scale (+ bias)``."""
    body = inl.peel(body)
    forms = [(inl.peel(a), b) for a, b in _pairs(body, "+")] + [(body, None)]
    found = []
    for core, bias in forms:
        for normalized, scale in _pairs(core, "*"):
            for centred, root in _pairs(inl.peel(normalized), "/"):
                centred, root = inl.peel(centred), inl.peel(root)
                if not (isinstance(root, ir.Unary) and root.fn == "sqrt"):
                    continue
                for x, mean in _pairs(centred, "-"):
                    for _, eps in _pairs(inl.peel(root.x), "+"):
                        if isinstance(x, ir.Access) and isinstance(eps, ir.Const):
                            found.append(_NormParts(x, mean, eps.value, scale, bias))
    return found


def _source_operand(e: ir.ValueExpr | None, name: str) -> SourceOperand | None:
    """The importers' operand for what ``e`` reads: its source whole, or a one-element constant."""
    if e is None:
        return None
    if isinstance(e, ir.Const):
        return SourceOperand(name, None, (1,), onnx.TensorProto.FLOAT, np.asarray([e.value]))
    if isinstance(e, ir.Access):
        src = e.source
        return SourceOperand(name, src, tuple(src.shape), onnx.TensorProto.FLOAT)
    raise Unsupported(f"{name} is computed, not read")


def _mean_axis(mean: ir.ValueExpr, rank: int, inl: _Inliner) -> list[int]:
    """The axes to try first: the one the mean scope's summation suggests, then the others."""
    mean = inl.peel(mean)
    guess = rank - len(mean.source.summation) if isinstance(mean, ir.Access) else rank - 1
    return list(dict.fromkeys([min(max(guess, 0), rank - 1), *range(rank - 1, -1, -1)]))


def _a_sum(src: ir.Tensor | ir.Scope) -> bool:
    """Whether ``src`` is computed as a sum (an Add that ONNX Runtime would fuse with the
    normalization after it)."""
    return isinstance(src, ir.Scope) and isinstance(src.body, ir.Binary) and src.body.op == "+"


def _norm_operand(op: SourceOperand, inner: tuple[int, ...], flat: bool = False) -> Operand | None:
    """The operator input for a scale or bias: its source (of ``inner``'s shape on ``flat`` rows,
    whose rank it may not exceed), or the constant filled to ``inner``."""
    if op.expr is not None:
        fit = flat and tuple(op.shape) != inner
        return Operand(op.expr, (Reshape(inner),) if fit else ())
    return Operand(Literal(np.full(inner, float(op.value.reshape(-1)[0]), dtype=np.float32)))


def match_layer_norm(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``((X - M) / sqrt(V + eps)) * Scale (+ B)`` over the importer's mean and variance scopes, as
    one LayerNormalization (consuming the inline scopes it computes)."""
    if ctx.opset is not None and ctx.opset < LAYER_NORM_OPSET:
        return Refusal(f"LayerNormalization needs opset {LAYER_NORM_OPSET} (emitting for {ctx.opset})")
    if scope.summation:
        return Refusal("sums over iterators: not a normalization's output")
    inl = _Inliner(ctx)
    candidates = _norm_parts(scope.body, inl)
    if not candidates:
        return Refusal("not (X - mean) / sqrt(variance + eps) * scale (+ bias)")
    shape = scope.shape
    rank = len(shape)
    expanded = None
    for parts in candidates:
        src = parts.x.source
        if tuple(src.shape) != shape:
            continue
        try:
            x = _source_operand(parts.x, "x")
            scale = _source_operand(parts.scale, "scale")
            bias = _source_operand(parts.bias, "bias")
        except Unsupported:
            continue
        for axis in _mean_axis(parts.mean, rank, inl):
            inner = shape[axis:]
            if any(op is not None and not _fits(op, inner, rank) for op in (scale, bias)):
                continue
            try:
                want = layer_norm(x, axis, parts.epsilon, scale, bias).y
            except (Unsupported, ValueError, ir.IRError):
                continue
            if expanded is None:
                expanded = inl.scope(scope)
            # The same substitutions on both sides: a program binding stays a read of it.
            if keys.key(_Inliner(ctx).scope(want)) != keys.key(expanded):
                continue
            # On the rows merged into one dimension: ONNX Runtime rewrites an Add feeding a
            # LayerNormalization over 3-D values into SkipLayerNormalization, whose CPU kernel runs
            # 3-4x slower than the Add and LayerNormalization it replaces (0.32 against 1.26 ms on
            # [16, 128, 256], 2 threads); on 2-D rows it leaves them as they are.
            rows, post, flat = (), (), axis >= 2 and _a_sum(src)
            if flat:
                rows, post = (Reshape((math.prod(shape[:axis]), *inner)),), (Reshape(shape),)
                axis = 1
            operands = [Operand(src, rows), _norm_operand(scale, inner, flat)]
            if bias is not None:
                operands.append(_norm_operand(bias, inner, flat))
            op = OpNode(
                "LayerNormalization",
                tuple(range(len(operands))),
                (("axis", axis), ("epsilon", float(parts.epsilon))),
            )
            consumed = tuple(s for s in inl.consumed if s is not scope)
            return OperatorMatch("LayerNormalization", tuple(operands), (op,), post, consumed)
    return Refusal("the mean and variance are not LayerNormalization's over trailing axes")


def _fits(op: SourceOperand, inner: tuple[int, ...], rank: int) -> bool:
    """ONNX Runtime reads Scale and B flat: their elements must be the normalised ones."""

    def strip(s: tuple[int, ...]) -> tuple[int, ...]:
        while s and s[0] == 1:
            s = s[1:]
        return s

    return len(op.shape) <= rank and strip(tuple(op.shape)) == strip(tuple(inner))


REDUCE_MATCHERS: dict[str, Matcher] = {
    "LayerNormalization": match_layer_norm,
    "AveragePool": match_average_pool,
    "GlobalAveragePool": match_global_average_pool,
    "ReduceMean": match_reduce_mean,
    "ReduceSumSquare": match_reduce_sum_square,
    "ReduceL2": match_reduce_l2,
}
"""Matcher per name, in order of preference, tried where ``einopt.instantiate.match.MATCHERS`` places them."""

REDUCE_PREFERRED: dict[str, Matcher] = dict(REDUCE_MATCHERS)
"""The matcher of each original ONNX operator type these matchers instantiate."""

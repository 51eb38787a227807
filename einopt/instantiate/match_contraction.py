"""Matchers of contractions: MatMul, Gemm, ReduceSum and Einsum.

A contraction is a product of accesses summed over iterators (``C[m, n] = Sum_k A[m, k] B[k, n]``).
Its iterators are grouped by the accesses they appear in (m in {A, C}, n in {B, C}, k in {A, B},
batch in all); the correspondences and orders within groups are enumerated, and the cheapest in
run-time layout work wins. The table that orders these matchers among the others is
``einopt.instantiate.match.MATCHERS``; the com.microsoft products (``match_contrib``) read
contractions with the same helpers.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import string
from collections.abc import Iterator, Sequence

import numpy as np

from einopt.core import ir
from einopt.core.syntax import brief
from einopt.instantiate import EINSUM_OPSET
from einopt.instantiate.plan import (
    NO_MATCH_CONTEXT,
    LayoutStep,
    Literal,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Scale,
    normalize,
    steps_cost,
)
from einopt.instantiate.views import (
    BiasForm,
    View,
    arranged,
    as_product,
    finish,
    finished,
    simple_view,
    split_bias,
)

__all__ = [
    "match_einsum",
    "match_gemm",
    "match_gemm_any",
    "match_matmul",
    "match_reduce_sum",
]


# Single-sided output iterators tried as broadcast batch dimensions (all subsets up to this many).
_MAX_BATCH_SUBSETS = 4


# --------------------------------------------------------------------------
# Contractions: a product of accesses summed over iterators
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Contraction:
    scale: float  # constant factors times the extents of summed iterators nothing reads
    views: tuple[View, ...]
    traversal: tuple[ir.Iter, ...]
    summation: tuple[ir.Iter, ...]


def _contraction(scope: ir.Scope, need_sum: bool = True) -> _Contraction | Refusal:
    if need_sum and not scope.summation:
        return Refusal("no summation: not a contraction")
    prod = as_product(scope.body)
    if isinstance(prod, Refusal):
        return prod
    scale, factors = prod
    if not factors:
        return Refusal("no access in the body")
    views = []
    for a in factors:
        v = simple_view(a)
        if isinstance(v, Refusal):
            return Refusal(f"operand {brief(a)}: {v.reason}")
        views.append(v)
    read = {it for v in views for it in v.labels}
    for s in scope.summation:
        if s not in read:
            scale *= s.extent
    return _Contraction(scale, tuple(views), scope.traversal, scope.summation)


@functools.lru_cache(maxsize=1 << 15)
def _with_scale(
    steps: tuple[LayoutStep, ...], scale: float, shape: tuple[int, ...]
) -> tuple[LayoutStep, ...]:
    return normalize(steps + (Scale(scale),), shape)


def _orders(*candidates: Sequence[ir.Iter]) -> list[tuple[ir.Iter, ...]]:
    """Distinct orders of one iterator group (each candidate is the group in some tensor's order)."""
    return list(dict.fromkeys(tuple(c) for c in candidates))


def _ordered(its: Sequence[ir.Iter], order: Sequence[ir.Iter]) -> list[ir.Iter]:
    return [it for it in dict.fromkeys(order) if it in its]


@dataclasses.dataclass(frozen=True)
class _Groups:
    """A MatMul/Gemm iterator correspondence: batch, rows, columns and summed groups, each ordered."""

    batch: tuple[ir.Iter, ...]  # output iterators of extent 1 that nothing reads are in no group
    m: tuple[ir.Iter, ...]
    n: tuple[ir.Iter, ...]
    k: tuple[ir.Iter, ...]


def _product_groups(c: _Contraction, va: View, vb: View, allow_batch: bool) -> Iterator[_Groups] | Refusal:
    """Every iterator correspondence of ``Sum_k A * B`` with a MatMul (or Gemm when no batch)."""
    la, lb = set(va.labels), set(vb.labels)
    missing = [t.name for t in c.traversal if t not in la | lb and t.extent > 1]
    if missing:
        return Refusal(f"output iterator(s) {', '.join(missing)} read by neither operand")
    alone = [s.name for s in c.summation if (s in la) != (s in lb)]
    if alone:
        return Refusal(f"{', '.join(alone)} summed within one operand alone (a reduction, not a product)")
    ks = [s for s in c.summation if s in la and s in lb]
    if not ks:
        return Refusal("no iterator is summed over both operands")
    common = [t for t in c.traversal if t in la and t in lb]
    if common and not allow_batch:
        return Refusal(f"{', '.join(t.name for t in common)} in both operands and the output: batched")
    a_only = [t for t in c.traversal if t in la and t not in lb]
    b_only = [t for t in c.traversal if t in lb and t not in la]
    single = a_only + b_only
    if not allow_batch:
        subsets: list[tuple[ir.Iter, ...]] = [()]
    elif len(single) <= _MAX_BATCH_SUBSETS:
        subsets = [s for r in range(len(single) + 1) for s in itertools.combinations(single, r)]
    else:
        subsets = [(), tuple(single)]

    def gen() -> Iterator[_Groups]:
        for sub in subsets:
            bset = set(common) | set(sub)
            batch = _ordered(bset, c.traversal)
            m = [t for t in a_only if t not in sub]
            n = [t for t in b_only if t not in sub]
            for bo in _orders(batch, _ordered(bset, va.labels + vb.labels)):
                for mo in _orders(m, _ordered(m, va.labels)):
                    for no in _orders(n, _ordered(n, vb.labels)):
                        for ko in _orders(_ordered(ks, va.labels), _ordered(ks, vb.labels)):
                            yield _Groups(bo, mo, no, ko)

    return gen()


def _best(cands: Iterator[tuple[float, OperatorMatch]]) -> tuple[float, OperatorMatch] | None:
    """The cheapest candidate (the first of equally cheap ones)."""
    best: tuple[float, OperatorMatch] | None = None
    for cost, m in cands:
        if best is None or cost < best[0]:
            best = (cost, m)
    return best


def _matmul_candidates(c: _Contraction, ctx: MatchContext) -> Iterator[tuple[float, OperatorMatch]] | Refusal:
    reasons = []
    found: list[Iterator[tuple[float, OperatorMatch]]] = []
    for va, vb in ((c.views[0], c.views[1]), (c.views[1], c.views[0])):
        gs = _product_groups(c, va, vb, allow_batch=True)
        if isinstance(gs, Refusal):
            reasons.append(gs.reason)
            continue
        found.append(_matmul_from(c, ctx, va, vb, gs))
    if not found:
        return Refusal(reasons[0])
    return itertools.chain(*found)


def _matmul_from(
    c: _Contraction, ctx: MatchContext, va: View, vb: View, gs: Iterator[_Groups]
) -> Iterator[tuple[float, OperatorMatch]]:
    const_a, const_b = ctx.is_constant(va.source), ctx.is_constant(vb.source)
    scale_on_a = const_a and not const_b
    for g in gs:
        a_groups = _batch_groups(g.batch, va.labels) + [g.m, g.k]
        b_groups = _batch_groups(g.batch, vb.labels) + [g.k, g.n]
        a_steps, b_steps = arranged(va, a_groups), arranged(vb, b_groups)
        if scale_on_a:
            a_steps = _with_scale(a_steps, c.scale, tuple(va.source.shape))
        else:
            b_steps = _with_scale(b_steps, c.scale, tuple(vb.source.shape))
        post = finished((*((t,) for t in g.batch), g.m, g.n), c.traversal)
        cost = steps_cost(a_steps, const_a) + steps_cost(b_steps, const_b) + steps_cost(post, False)
        ops = (OpNode("MatMul", (0, 1)),)
        yield (
            cost,
            OperatorMatch("MatMul", (Operand(va.source, a_steps), Operand(vb.source, b_steps)), ops, post),
        )


def _batch_groups(batch: Sequence[ir.Iter], labels: Sequence[ir.Iter]) -> list[tuple[ir.Iter, ...]]:
    """An operand's batch dimensions: size 1 where it does not vary, leading ones dropped (broadcast)."""
    groups = [(t,) if t in labels else () for t in batch]
    while groups and not groups[0]:
        groups.pop(0)
    return groups


def match_matmul(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L b.., m.., n.. Sum k..: A[..] * B[..]`` as (batched, broadcast) MatMul.

    Groups of several iterators are merged by Reshape; operands and the result
    are transposed as needed (constant operands at compile time). The cheapest
    correspondence wins (fewest run-time Transposes).
    """
    c = _contraction(scope)
    if isinstance(c, Refusal):
        return c
    if len(c.views) != 2:
        return Refusal(f"a product of {len(c.views)} accesses: MatMul takes two")
    # The search asks again for the scopes its states share (matching, distance, FusedMatMul's
    # comparison): the answer depends on the context only through which operands are constant.
    constant = tuple(ctx.is_constant(v.source) for v in c.views)
    memo = ir._cached(scope, "matmul_match", dict)
    if constant not in memo:
        cands = _matmul_candidates(c, ctx)
        if isinstance(cands, Refusal):
            memo[constant] = cands
        else:
            best = _best(cands)
            memo[constant] = best[1] if best else Refusal("no iterator correspondence")
    return memo[constant]


# --------------------------------------------------------------------------
# Gemm
# --------------------------------------------------------------------------


def match_gemm(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """2-D products with transA/transB, alpha, and a bias ``L m, n: S[m, n] + beta * C[..]``.

    Without a bias, Gemm is chosen only when it is cheaper than MatMul (its
    transA/transB save a run-time Transpose or a transposed copy of a constant).
    """
    return _match_gemm(scope, ctx, versus_matmul=True)


def match_gemm_any(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """Gemm wherever it computes the scope, even without a bias and when MatMul is as cheap.

    Not in the matching table; preferred for a scope that was a Gemm originally.
    """
    return _match_gemm(scope, ctx, versus_matmul=False)


def _match_gemm(scope: ir.Scope, ctx: MatchContext, versus_matmul: bool) -> OperatorMatch | Refusal:
    form = split_bias(scope, ctx)
    if isinstance(form, BiasForm):
        c = _contraction(form.inner)
        if isinstance(c, Refusal):
            return Refusal(f"bias form, product: {c.reason}")
        if len(c.views) != 2:
            return Refusal(f"bias form, product of {len(c.views)} accesses: Gemm takes two")
        c = dataclasses.replace(c, traversal=form.traversal)
        found = _gemm(c, ctx, form)
        if isinstance(found, Refusal):
            return Refusal(f"bias form: {found.reason}")
        return dataclasses.replace(found[1], consumes=(form.inner,))
    if not scope.summation:
        return form
    c = _contraction(scope)
    if isinstance(c, Refusal):
        return c
    if len(c.views) != 2:
        return Refusal(f"a product of {len(c.views)} accesses: Gemm takes two")
    found = _gemm(c, ctx, None)
    if isinstance(found, Refusal):
        return found
    cost, gemm = found
    if not versus_matmul:
        return gemm
    plain = _matmul_candidates(c, ctx)
    best = None if isinstance(plain, Refusal) else _best(plain)
    if best is not None and best[0] <= cost:
        return Refusal("no bias, and MatMul is as cheap (no operand needs a run-time transpose)")
    return gemm


def _gemm(c: _Contraction, ctx: MatchContext, bias: BiasForm | None) -> tuple[float, OperatorMatch] | Refusal:
    reasons = []
    cands: list[Iterator[tuple[float, OperatorMatch]]] = []
    for va, vb in ((c.views[0], c.views[1]), (c.views[1], c.views[0])):
        gs = _product_groups(c, va, vb, allow_batch=False)
        if isinstance(gs, Refusal):
            reasons.append(gs.reason)
            continue
        cands.append(_gemm_from(c, ctx, va, vb, gs, bias))
    if not cands:
        return Refusal(reasons[0])
    return _best(itertools.chain(*cands)) or Refusal("the bias does not broadcast to [M, N]")


def _gemm_from(
    c: _Contraction, ctx: MatchContext, va: View, vb: View, gs: Iterator[_Groups], bias: BiasForm | None
) -> Iterator[tuple[float, OperatorMatch]]:
    const_a, const_b = ctx.is_constant(va.source), ctx.is_constant(vb.source)
    for g in gs:
        bias_op = None
        if bias is not None:
            bv = bias.bias
            cg = []
            for grp in (g.m, g.n):
                inside = [t for t in grp if t in bv.labels]
                if inside and len(inside) != len(grp):
                    break
                cg.append(grp if inside else ())
            else:
                while cg and not cg[0]:  # right-aligned broadcasting
                    cg.pop(0)
                if set(bv.labels) <= set(g.m) | set(g.n):
                    c_steps = arranged(bv, cg)
                    bias_op = Operand(bv.source, c_steps)
            if bias_op is None:
                continue
        post = finished((g.m, g.n), c.traversal)
        for ta, tb in itertools.product((0, 1), (0, 1)):
            a_steps = arranged(va, (g.k, g.m) if ta else (g.m, g.k))
            b_steps = arranged(vb, (g.n, g.k) if tb else (g.k, g.n))
            cost = steps_cost(a_steps, const_a) + steps_cost(b_steps, const_b) + steps_cost(post, False)
            if bias_op is not None:
                cost += steps_cost(bias_op.steps, ctx.is_constant(bias_op.source))
            cost += 0.001 * (ta + tb)  # equal cost: no transpose flag
            attrs = (
                ("alpha", float(c.scale)),
                ("beta", float(bias.beta) if bias else 1.0),
                ("transA", ta),
                ("transB", tb),
            )
            operands = (Operand(va.source, a_steps), Operand(vb.source, b_steps))
            if bias_op is not None:
                operands += (bias_op,)
            op = OpNode("Gemm", tuple(range(len(operands))), attrs)
            yield cost, OperatorMatch("Gemm", operands, (op,), post)


# --------------------------------------------------------------------------
# ReduceSum and Einsum
# --------------------------------------------------------------------------


def match_reduce_sum(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L x Sum y: X[..]`` (bare or view indices) as ReduceSum over the summed dimensions."""
    c = _contraction(scope)
    if isinstance(c, Refusal):
        return c
    if len(c.views) != 1:
        return Refusal(f"a product of {len(c.views)} accesses: not a single-tensor reduction")
    (v,) = c.views
    axes = [d for d, it in enumerate(v.labels) if it in c.summation]
    if not axes:
        return Refusal("the summed iterators are not read: not a reduction")
    rest = [it for it in v.labels if it not in c.summation]
    post = finish([(it,) for it in rest], c.traversal)
    if c.scale != 1.0:  # on the (smaller) result
        post = normalize((Scale(c.scale), *post), tuple(it.extent for it in rest))
    operands = (Operand(v.source, v.steps), Operand(Literal(np.asarray(axes, dtype=np.int64))))
    op = OpNode("ReduceSum", (0, 1), (("keepdims", 0),))
    return OperatorMatch("ReduceSum", operands, (op,), post)


def match_einsum(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """Any product of accesses with view indices, summed: ``Einsum`` (the contraction fallback)."""
    if ctx.opset is not None and ctx.opset < EINSUM_OPSET:
        return Refusal(f"Einsum needs opset {EINSUM_OPSET} (emitting for {ctx.opset})")
    c = _contraction(scope, need_sum=False)
    if isinstance(c, Refusal):
        return c
    its = list(c.traversal) + list(c.summation)
    if len(its) > len(string.ascii_lowercase):
        return Refusal(f"{len(its)} iterators: more than Einsum's {len(string.ascii_lowercase)} letters")
    letter = dict(zip(its, string.ascii_lowercase, strict=False))
    read = {it for v in c.views for it in v.labels}
    present = [t for t in c.traversal if t in read]
    eq = ",".join("".join(letter[it] for it in v.labels) for v in c.views)
    eq += "->" + "".join(letter[t] for t in present)
    # the scale folds into a constant operand, else it multiplies the result
    scaled = next((i for i, v in enumerate(c.views) if ctx.is_constant(v.source)), None)
    operands = tuple(
        Operand(v.source, _with_scale(v.steps, c.scale, tuple(v.source.shape)) if i == scaled else v.steps)
        for i, v in enumerate(c.views)
    )
    post = finish([(t,) for t in present], c.traversal)
    if scaled is None:
        post = normalize((Scale(c.scale), *post), tuple(t.extent for t in present))
    op = OpNode("Einsum", tuple(range(len(operands))), (("equation", eq),))
    return OperatorMatch("Einsum", operands, (op,), post)

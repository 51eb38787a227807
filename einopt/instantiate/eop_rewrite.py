"""Equivalence-preserving rewrites of a scope before it is lowered to an eOperator.

:func:`split_iterators` splits iterators read through ``//`` and ``%``
(``h = lo + k*hq + hr``) when that removes divisions, so Reshape-,
DepthToSpace- and SpaceToDepth-like reads become affine;
:func:`unroll_summation` unrolls the summation iterators that would force a
Gather (``T[.., h+r-1, ..]``) into a sum of shifted reads. Both return a
scope that :mod:`einopt.instantiate.eop` lowers as it stands.
"""

from __future__ import annotations

import itertools
import math

from einopt.core import ir
from einopt.core.index import linear_form, simplify, substitute
from einopt.core.rewrite import accesses, fold_chain, map_indices
from einopt.frontend.onnx_graph import unique_name
from einopt.instantiate.eop_access import plan_access, reads_nothing

__all__ = ["split_iterators", "unroll_summation"]

# Largest number of copies of a body made by unrolling summation iterators.
_MAX_UNROLL = 25


def _substituting(m: dict[ir.Iter, ir.IndexExpr]):
    return lambda e: simplify(substitute(e, m))


def _divmods(scope: ir.Scope) -> list[ir.IFloorDiv | ir.IMod]:
    """Every ``//`` and ``%`` in the indices of the body's accesses (with repetition)."""
    out, stack = [], [i for acc in accesses(scope.body) for i in acc.indices]
    while stack:
        e = stack.pop()
        if isinstance(e, (ir.IFloorDiv, ir.IMod)):
            out.append(e)
        stack += ir.children(e)
    return out


def split_iterators(scope: ir.Scope) -> ir.Scope:
    """An equivalent scope (without pad) with iterators split to remove ``//`` and ``%``.

    ``h`` over ``[lo, lo + n*k)`` becomes ``hq`` over ``[0, n)`` then ``hr``
    over ``[0, k)`` with ``h = lo + k*hq + hr``; when ``c*h`` is inside a
    ``// (c*k)`` or ``% (c*k)`` this often simplifies it away (``(h+c)//k``
    with ``k | lo+c`` becomes ``hq + (lo+c)//k``). ``hq, hr`` sit where ``h``
    was, so a row-major reshape of the result restores ``h``. A split is kept
    only when it lowers the number of divisions and moduli.
    """
    # Iterators of extent 1 are constants: reading them leaves nothing to gather.
    units = {it: ir.IConst(it.lo) for it in scope.traversal + scope.summation if it.extent == 1}
    body = map_indices(scope.body, _substituting(units))
    # Splitting is a bijection of the iteration space: a maximum over it is kept, like a sum.
    current = ir.Scope(scope.traversal, scope.summation, body, (), scope.reduce)
    while True:
        count = len(_divmods(current))
        for it, k in _split_candidates(current):
            taken = {x.name for x in current.traversal + current.summation}
            hq = ir.Iter(unique_name(f"{it.name}_q", taken), 0, it.extent // k)
            hr = ir.Iter(unique_name(f"{it.name}_r", taken), 0, k)
            value = ir.IAdd(ir.IMul(ir.IConst(k), hq), hr)
            if it.lo:
                value = ir.IAdd(value, ir.IConst(it.lo))
            body = map_indices(current.body, _substituting({it: value}))

            def replaced(its: tuple[ir.Iter, ...], it: ir.Iter = it, new=(hq, hr)) -> tuple[ir.Iter, ...]:
                return tuple(y for x in its for y in (new if x is it else (x,)))

            candidate = ir.Scope(
                replaced(current.traversal), replaced(current.summation), body, (), current.reduce
            )
            if len(_divmods(candidate)) < count:
                current = candidate
                break
        else:
            return current


# How the unrolled copies of a body are combined, per kind of scope: ``Max[r] f`` is ``max(f(0), f(1), ..)``.
_UNROLLED: dict[str, str] = {"sum": "+", "max": "max"}


def unroll_summation(scope: ir.Scope) -> ir.Scope:
    """An equivalent scope with the summation iterators that force Gathers unrolled into a sum.

    ``Sum[r, s] T[.., h+r-1, w+s-1]`` becomes nine shifted reads of ``T``,
    each a Slice/Pad, instead of a Gather of nine times the output: much
    faster in ONNX Runtime. The cheapest set of iterators (product of extents
    at most ``_MAX_UNROLL``) after which no access needs a Gather is chosen;
    with none, the scope is unchanged. A max scope's copies are combined by
    ``max`` (a max-pooling window becomes a maximum of shifted strided reads);
    with every iterator unrolled it is a scope without reduction.
    """
    if not any(plan_access(a)[3] for a in accesses(scope.body) if not reads_nothing(a)):
        return scope
    best: tuple[int, tuple[ir.Iter, ...], list[ir.ValueExpr]] | None = None
    for r in range(1, len(scope.summation) + 1):
        for its in itertools.combinations(scope.summation, r):
            size = math.prod(it.extent for it in its)
            if size > _MAX_UNROLL or (best is not None and size >= best[0]):
                continue
            copies = [
                map_indices(
                    scope.body,
                    _substituting({it: ir.IConst(v) for it, v in zip(its, values, strict=True)}),
                )
                for values in itertools.product(*(range(it.lo, it.hi) for it in its))
            ]
            accs = {a for c in copies for a in accesses(c)}
            if not any(plan_access(a)[3] for a in accs if not reads_nothing(a)):
                best = (size, its, copies)
    if best is None:
        return scope
    _, its, copies = best
    summation = tuple(it for it in scope.summation if it not in its)
    op = _UNROLLED[scope.reduce]
    body = fold_chain(copies, op)
    return ir.Scope(scope.traversal, summation, body, (), scope.reduce if summation else "sum")


def _split_candidates(scope: ir.Scope) -> list[tuple[ir.Iter, int]]:
    """``(it, n)`` where ``c*it`` appears in an affine ``... // k`` or ``... % k`` with ``k = c*n``."""
    out: dict[tuple[ir.Iter, int], None] = {}
    for x in _divmods(scope):
        lf = linear_form(x.a)
        if lf.atoms:
            continue
        for it, c in lf.coeffs:
            n = x.k // c if c > 0 and x.k % c == 0 else 0
            if 1 < n < it.extent and it.extent % n == 0:
                out.setdefault((it, n))
    return list(out)

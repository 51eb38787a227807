"""Traversal merging (method.md section 3): inline a nested scope by composing index functions.

:func:`inline` is the one inlining used by ``merge_traversal`` (nested
scopes) and ``fuse_expressions`` (bound scopes, :mod:`einopt.rules.fusion`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from einopt.core import ir
from einopt.core.index import bounds
from einopt.core.rewrite import (
    accesses,
    index_text,
    iter_names,
    map_accesses,
    product_factors,
    rename_apart,
    substitute_iters,
)
from einopt.rules.base import Context, Hit, Rule, hit
from einopt.rules.boundary import (
    Finite,
    ProgramFacts,
    ProgramScopeRule,
    finiteness_reason,
    leaves_box,
    nothing_finite,
)

__all__ = ["inline", "inline_problem", "format_indices", "MergeTraversal", "RULES"]


def format_indices(acc: ir.Access) -> str:
    return ", ".join(index_text(i) for i in acc.indices)


def _occurrences(e: ir.ValueExpr, acc: ir.Access) -> int:
    """How many times ``acc`` occurs in the tree of ``e`` (shared subterms counted at every use)."""
    return ir._cached(e, "access_uses", lambda: _uses(e)).get(acc, 0)


def _uses(e: ir.ValueExpr) -> dict[ir.Access, int]:
    """How many times each access occurs in the tree of ``e``: the number of paths to it from ``e``
    in the DAG of its interned subterms (found once per term: the search asks for every read of
    every body it tries to inline)."""
    order: list[ir.ValueExpr] = []  # post-order: every node after its children
    seen: set[ir.ValueExpr] = set()
    stack: list[tuple[ir.ValueExpr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if done:
            order.append(x)
            continue
        if x in seen:
            continue
        seen.add(x)
        stack.append((x, True))
        if not isinstance(x, ir.Access):
            stack.extend((c, False) for c in ir.children(x) if c not in seen)
    paths: dict[ir.ValueExpr, int] = {e: 1}
    for x in reversed(order):  # parents before children
        n = paths.get(x, 0)
        if n and not isinstance(x, ir.Access):
            for c in ir.children(x):
                paths[c] = paths.get(c, 0) + n
    return {x: n for x, n in paths.items() if isinstance(x, ir.Access)}


def _operator(e: ir.ValueExpr) -> str:
    return e.op if isinstance(e, ir.Binary) else e.fn if isinstance(e, ir.Unary) else type(e).__name__


def _factor_problem(body: ir.ValueExpr, acc: ir.Access) -> str | None:
    """Why ``acc`` is not exactly one factor of ``body``'s top-level product (``None`` if it is)."""
    count = _occurrences(body, acc)
    if count > 1:
        return f"it is read {count} times"
    for f in product_factors(body):
        if f is acc:
            return None
        if _occurrences(f, acc):
            return f"it is read under {_operator(f)}"
    return "it is not read"  # pragma: no cover - acc comes from the body


def inline(
    outer: ir.Scope,
    acc: ir.Access,
    name: str,
    finite: Finite = nothing_finite,
    labels: Mapping[ir.Scope, str] | None = None,
) -> ir.Scope | str:
    """``outer`` with the scope read by ``acc`` inlined at that read, or why that is not legal.

    ``I = L_z Sum_w g(z, w)`` read as ``I[Phi]`` becomes ``g(Phi, w)``; a
    summing ``I`` is legal only as one factor of ``outer``'s product (its
    summation joins ``outer``'s, renamed away from ``outer``'s names:
    ``c * Sum_w g = Sum_w c*g``). Reads that may leave ``I``'s box are legal
    only where ``g`` is provably 0 (the read gave 0 there; a product is 0
    only where its other factors are provably finite).

    Parameters
    ----------
    outer : Scope
        The reading scope.
    acc : Access
        An access of ``outer``'s body whose source is a scope.
    name : str
        How to call the inlined scope in reasons.
    finite : callable, optional
        Which input tensors are known to be finite
        (:meth:`~einopt.rules.base.Context.is_finite`); by default none.
    labels : mapping of Scope to str, optional
        Names of scopes, for reasons.

    Returns
    -------
    Scope or str
        The rewritten scope (same traversal, same values), or the reason the
        read cannot be inlined.
    """
    problem = inline_problem(outer, acc, name, finite, labels)
    if problem is not None:
        return problem
    inner = acc.source
    assert isinstance(inner, ir.Scope)
    mapping: dict[ir.Iter, ir.IndexExpr] = dict(zip(inner.traversal, acc.indices, strict=True))
    new_sums, renamed = rename_apart(inner.summation, iter_names(outer))
    mapping.update(renamed)
    g = substitute_iters(inner.body, mapping)
    body = map_accesses(outer.body, lambda a: g if a is acc else a)
    reduce = inner.reduce if inner.summation else outer.reduce
    return ir.Scope(outer.traversal, outer.summation + new_sums, body, outer.pad, reduce)


def inline_problem(
    outer: ir.Scope,
    acc: ir.Access,
    name: str,
    finite: Finite = nothing_finite,
    labels: Mapping[ir.Scope, str] | None = None,
) -> str | None:
    """Why :func:`inline` would refuse (its reason), or None where it would inline: the test alone,
    without building the inlined scope (a search matches far more reads than it inlines)."""
    inner = acc.source
    assert isinstance(inner, ir.Scope)
    if inner.summation:
        sums = ", ".join(it.name for it in inner.summation)
        problem = _reduction_problem(outer, inner, acc)
        if problem:
            return f"{name} {'takes a maximum' if inner.is_max else 'sums'} over {sums}: {problem}"
    reach = tuple(bounds(i) for i in acc.indices)
    owner = getattr(finite, "__self__", None)  # a context's is_finite: its search keeps the answer
    if isinstance(owner, Context):
        leak = owner.remembered(("leaves_box", inner, reach), lambda: leaves_box(inner, reach, finite))
    else:
        leak = leaves_box(inner, reach, finite)
    if leak is not None:
        d = leak.dimension
        z, (a, b) = inner.traversal[d], reach[d]
        where = f"reads {name} at {index_text(acc.indices[d])} in [{a}, {b}], outside [{z.lo}, {z.hi}), "
        if leak.needs_finite:
            return where + f"where {name} is 0 {finiteness_reason(leak.needs_finite, labels or {})}"
        return where + f"where {name} is not provably 0"
    return None


def _reduction_problem(outer: ir.Scope, inner: ir.Scope, acc: ir.Access) -> str | None:
    """Why the reduction of ``inner`` cannot join ``outer``'s at the read ``acc`` (``None`` if it can).

    A sum joins a sum as one factor of its product (``c * Sum_w g = Sum_w c*g``); a maximum joins a
    maximum, or a scope that reduces nothing, only as the whole body (``Max_y Max_w g =
    Max_{y,w} g``: a maximum does not distribute over a product or a sum). The two never mix.
    """
    if inner.is_max:
        if outer.summation and not outer.is_max:
            return "it cannot be inlined into a sum"
        if outer.body is not acc:
            return "it can only be inlined where it is the whole body"
        return None
    if outer.is_max:
        return "it cannot be inlined into a maximum"
    problem = _factor_problem(outer.body, acc)
    return f"it can only be inlined as a factor of a product, but {problem}" if problem else None


class MergeTraversal(ProgramScopeRule):
    """Inline a nested scope at one of its reads by composing index functions::

        L_x Sum_y f(I[Phi(x, y)])  with  I = L_z Sum_w g(z, w)
            ->  L_x Sum_{y, w} f(g(Phi(x, y), w))

    Legal when (a) ``I`` has no summation, or the read is one factor of the
    outer body's product (``c * Sum_w g = Sum_w c*g``; ``w`` is renamed
    away from the outer names); a read under a unary function, a sum or a
    quotient of a summing scope is refused; and (b) every read stays inside
    ``I``'s traversal box, or ``g`` is provably 0 wherever the read can leave
    it (:func:`~einopt.rules.boundary.leaves_box`; a product is 0 there only
    where its other factors are provably finite). One match per (scope,
    read of a scope); a binding's direct reads of other bindings are left
    to ``fuse_expressions``, but a bound scope read from a nested one (the
    zero-insertion scope of a ConvTranspose, read by a split-off partial
    sum) is inlined here. Fig. 5 E4 -> E5 inlines the middle scope
    ``L[r, s, h, w, f] T[r, s, h+r-1, w+s-1, f]`` into the offset reduction.

    Max scopes: a scope without reduction inlines into a maximum as into a sum
    (the body's value at every point is unchanged). A max scope inlines only
    where its read is the whole body of a max scope or of a scope without
    reduction (``Max_y Max_w g = Max_{y,w} g``; the result takes the maximum);
    a sum never joins a maximum, nor a maximum a sum.
    """

    name = "merge_traversal"
    phase = "cleanup"
    undoes = ("split_summation", "substitute_variables", "materialize_access")
    family = "intra"
    math = "L_x f({L_z Sum_w g(z, w)}[Phi(x)]) -> L_x Sum_w f(g(Phi(x), w))"

    def match_in(self, scope: ir.Scope, facts: ProgramFacts, ctx: Context) -> Iterator[Hit | str]:
        for acc in accesses(scope.body):
            if not isinstance(acc.source, ir.Scope):
                continue
            if acc.source in facts.bound and scope in facts.bound:
                continue  # one binding reading another: fuse_expressions' job
            label = facts.labels.get(acc.source, "scope")
            problem = inline_problem(scope, acc, label, ctx.is_finite, facts.labels)
            if problem is not None:
                yield problem
            else:
                yield hit(f"inline {label} read at [{format_indices(acc)}]", access=acc)

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        found = inline(scope, params["access"], "scope", ctx.is_finite)
        if isinstance(found, str):
            raise ValueError(found)
        return found


RULES: tuple[Rule, ...] = (MergeTraversal(),)

"""Access rules: materialise what an access reads as its own (layout) scope.

Both rules move the data movement of one access into a new nested scope, the
data-layout eOperator that converging derivation uses when an operand does not
have the layout an operator wants: the im2col buffer of a convolution
(Fig. 7 i), or an input replicated per group (Fig. 7 k).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from einopt.core import ir
from einopt.core.rewrite import accesses, fresh_name, replace_subterm, source_label, source_ranges
from einopt.rules.base import Context, Hit, Rule, ScopeRule, hit

__all__ = ["MaterializeAccess", "ReplicateAccess", "RULES"]


def _replace_access(scope: ir.Scope, old: ir.Access, new: ir.ValueExpr) -> ir.Scope:
    return scope.replace(body=replace_subterm(scope.body, old, new))


class MaterializeAccess(ScopeRule):
    """Materialise one access as a scope over the iterators it reads::

        L_x Sum_s f(T[tau(v)], ...)  ->  L_x Sum_s f({L_v T[tau(v)]}[v], ...)

    ``v`` are the iterators the access reads, in the scope's order (traversal,
    then summation); the new scope is their box, so every point the outer
    scope reads is computed. Always an identity. Offered for accesses with at
    least one index that is not a plain iterator (otherwise the new scope
    would be a copy). Materialising ``A[h+r-1, w+s-1, c]`` of a 3x3
    convolution gives the im2col buffer ``L[h, w, r, s, c]`` and leaves a
    matmul over ``(r, s, c)`` (Fig. 7 i).

    Max scopes: legal in any scope, and on reads of a max scope: the access is
    replaced by a read equal to it at every point (out-of-range reads
    included), and the scope keeps its reduction.
    """

    name = "materialize_access"
    phase = "converge"
    grows = True
    family = "intra"
    math = "f(T[tau(v)]) -> f({L_v T[tau(v)]}[v])"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        order = scope.traversal + scope.summation
        for acc in accesses(scope.body):
            if all(isinstance(i, ir.Iter) for i in acc.indices):
                yield f"{source_label(acc)} is read at plain iterators: materialising it would only copy it"
                continue
            used = acc.iters()
            v = tuple(it for it in order if it in used)
            if not v:
                continue  # a constant read: nothing to lay out
            shown = ", ".join(it.name for it in v)
            yield hit(f"materialize {source_label(acc)}[...] over ({shown})", access=acc, over=v)

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        acc: ir.Access = params["access"]
        v: tuple[ir.Iter, ...] = params["over"]
        return _replace_access(scope, acc, ir.Scope(v, (), acc)[v])


class ReplicateAccess(ScopeRule):
    """Replicate an operand along a traversal iterator it does not read::

        L_{.., x, ..} f(T[tau])  ->  L_{.., x, ..} f({L_{i.., y} T[i..]}[tau.., x])

    The new scope holds one copy of ``T`` per value of ``x`` (``y`` has
    ``x``'s range). Its new dimension is placed before the first dimension of
    ``T`` whose index reads only iterators that come after ``x`` in the scope
    (traversal order, then summation), so that splitting the output channels
    into groups and replicating the input per group gives the input-channel
    order of a grouped convolution (Fig. 7 k: ``(g, c)`` merges into
    ``g*C + c``). Always an identity: reads of ``T`` outside its range read
    the copies' zeros.

    Max scopes: legal in any scope, and on reads of a max scope: the access is
    replaced by a read equal to it at every point (out-of-range reads
    included), and the scope keeps its reduction.
    """

    name = "replicate_access"
    phase = "converge"
    grows = True
    family = "intra"
    math = "L_x f(T[tau]) -> L_x f({L_{i,y} T[i]}[tau, x])  (x not read by tau)"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        order = {it: k for k, it in enumerate(scope.traversal + scope.summation)}
        for acc in accesses(scope.body):
            used = acc.iters()
            if not used:
                continue
            if all(x in used for x in scope.traversal):
                yield f"{source_label(acc)} reads every traversal iterator: nothing to replicate along"
                continue
            for x in scope.traversal:
                if x in used:
                    continue
                position = next(
                    (
                        d
                        for d, idx in enumerate(acc.indices)
                        if idx.iters() and min(order[it] for it in idx.iters()) > order[x]
                    ),
                    len(acc.indices),
                )
                yield hit(
                    f"replicate {source_label(acc)} along {x.name} (new dimension {position})",
                    access=acc,
                    along=x,
                    position=position,
                )

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        acc: ir.Access = params["access"]
        x: ir.Iter = params["along"]
        position: int = params["position"]
        taken: set[str] = set()
        dims = []
        for lo, hi in source_ranges(acc.source):
            name = fresh_name("i", taken)
            taken.add(name)
            dims.append(ir.Iter(name, lo, hi))
        y = ir.Iter(fresh_name("g", taken), x.lo, x.hi)
        copies = ir.Scope(tuple(dims[:position]) + (y,) + tuple(dims[position:]), (), acc.source[tuple(dims)])
        indices = acc.indices[:position] + (x,) + acc.indices[position:]
        return _replace_access(scope, acc, copies[indices])


RULES: tuple[Rule, ...] = (MaterializeAccess(), ReplicateAccess())

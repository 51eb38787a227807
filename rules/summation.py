"""Summation splitting (method.md section 3): a partial sum becomes a scope."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from einopt.core import ir
from einopt.rules.base import Context, Hit, Rule, ScopeRule, hit

__all__ = ["SplitSummation", "RULES"]


def _names(its: tuple[ir.Iter, ...]) -> str:
    return ", ".join(it.name for it in its)


class SplitSummation(ScopeRule):
    """Split the summation iterators into an outer and an inner group::

        L_x Sum_{s1, s2} f(x, s1, s2)  ->  L_x Sum_{s1} {L_{s1, x} Sum_{s2} f(x, s1, s2)}[s1, x]

    The inner scope sums over ``s2`` only; the outer group ``s1`` becomes part
    of its traversal (first, then ``x``), so the partial sums are materialised
    as a tensor that the outer scope adds up. Always an identity (a finite sum
    regrouped); every non-empty proper subset of the summation is offered as
    the inner group. Conv3x3 ``Sum_{r,s,c} -> Sum_{r,s} {Sum_c}`` is the first
    step of Fig. 5.

    Max scopes: split the same way, both scopes taking the maximum
    (``Max_{s1,s2} f = Max_{s1} Max_{s2} f``: a finite maximum regrouped; the
    inner scope is read inside its box, so no 0 enters).
    """

    name = "split_summation"
    phase = "explore"
    undoes = ("merge_traversal",)
    family = "intra"
    math = "L_x Sum_{s1,s2} f -> L_x Sum_{s1} {L_{s1,x} Sum_{s2} f}[s1, x]"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        sums = scope.summation
        if len(sums) < 2:
            if sums:
                yield f"needs at least two summation iterators, has one ({sums[0].name})"
            return
        for size in range(1, len(sums)):
            for inner in itertools.combinations(sums, size):
                outer = tuple(it for it in sums if it not in inner)
                yield hit(f"Sum[{_names(outer)}] outside, Sum[{_names(inner)}] inside", inner=inner)

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        inner_sums: tuple[ir.Iter, ...] = params["inner"]
        outer_sums = tuple(it for it in scope.summation if it not in inner_sums)
        traversal = outer_sums + scope.traversal
        inner = ir.Scope(traversal, inner_sums, scope.body, (), scope.reduce)
        return ir.Scope(scope.traversal, outer_sums, inner[traversal], scope.pad, scope.reduce)


RULES: tuple[Rule, ...] = (SplitSummation(),)

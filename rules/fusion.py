"""Expression fusion (method.md section 3): substitute a producer expression into its consumer.

Vertical fusion uses the inlining of traversal merging
(:func:`einopt.rules.traversal.inline`) on a bound producer: every read of
the producer in the consumer's body is replaced by the producer's body, and
the producer's binding is dropped when nothing reads it any more.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

from einopt import ir
from einopt.rewrite import accesses, replace_scopes
from einopt.rules.base import NO_CONTEXT, Context, Failure, Match, Rule
from einopt.rules.boundary import Finite, nothing_finite
from einopt.rules.traversal import inline

__all__ = ["fuse", "FuseExpressions", "RULES"]


def fuse(
    program: ir.Program, consumer: str, producer: str, finite: Finite = nothing_finite
) -> ir.Program | str:
    """``program`` with binding ``producer`` inlined into binding ``consumer``, or why not.

    Every read of the producer in the consumer's body (not in scopes nested
    in it) is inlined in turn; the producer's binding is dropped when no
    binding reads it any more and it is not an output. ``finite`` says which
    input tensors are known to be finite (see :func:`~einopt.rules.traversal.inline`).
    """
    c, p = program.scope(consumer), program.scope(producer)
    reads = [a for a in accesses(c.body) if a.source is p]
    if not reads:
        return f"{consumer} does not read {producer}"
    new = c
    for acc in reads:
        found = inline(new, acc, producer, finite, program.names())
        if isinstance(found, str):
            return found
        new = found
    out = replace_scopes(program, {c: new})
    if producer not in program.outputs:
        others = [s for n, s in out.bindings if n != producer]
        # A consumer that became equal to ``p`` (interning) binds it itself.
        if not any(s is not p and p in ir.scopes_in(s) for s in others):
            out = out.replace(bindings=tuple((n, s) for n, s in out.bindings if n != producer))
    return out


class FuseExpressions(Rule):
    """Inline a bound producer ``P`` into a binding ``C`` that reads it (vertical fusion)::

        P = L_z Sum_w g(z, w);  C = L_x f(P[Phi(x)])  ->  C = L_x Sum_w f(g(Phi(x), w))

    Every read of ``P`` in ``C``'s body is inlined with the inlining and
    legality of ``merge_traversal``: a summing ``P`` only as a factor of
    ``C``'s product (``relu`` around an OffsetReduce is refused, a scale
    ``Y[h, w, f] * S[f]`` fuses), and reads outside ``P``'s box only where
    ``P``'s body is provably 0 (``0 * W`` only for a ``W`` known to be finite). ``P``'s binding is dropped when no binding
    reads it any more and it is not a program output. One match per
    (consumer, producer) pair; a chain of layout scopes (transpose, then
    reshape) becomes one expression.
    """

    name = "fuse_expressions"
    phase = "explore"
    family = "inter"
    math = "P = L_z g(z); C = L_x f(P[Phi(x)]) -> C = L_x f(g(Phi(x)))"

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        names = program.names()
        for consumer, c in program.bindings:
            producers = dict.fromkeys(
                names[a.source] for a in accesses(c.body) if a.source in names and a.source is not c
            )
            for producer in producers:
                found = fuse(program, consumer, producer, ctx.is_finite)
                if isinstance(found, str):
                    yield Failure(self.name, consumer, found)
                    continue
                kept = any(n == producer for n, _ in found.bindings)
                what = f"inline {producer} into {consumer}" + ("" if kept else f", drop {producer}")
                yield Match(
                    self.name,
                    consumer,
                    what,
                    types.MappingProxyType({"consumer": consumer, "producer": producer}),
                )

    def apply(self, program: ir.Program, match: Match, ctx: Context = NO_CONTEXT) -> ir.Program:
        if match.rule != self.name:
            raise ValueError(f"{self.name} cannot apply a match of {match.rule}")
        found = fuse(program, match["consumer"], match["producer"], ctx.is_finite)
        if isinstance(found, str):
            raise ValueError(found)
        return found


RULES: tuple[Rule, ...] = (FuseExpressions(),)

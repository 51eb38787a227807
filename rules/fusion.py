"""Expression fusion (method.md section 3): substitute a producer expression into its consumer.

Vertical fusion uses the inlining of traversal merging
(:func:`einopt.rules.traversal.inline`) on a bound producer: every read of
the producer in the consumer's body is replaced by the producer's body, and
the producer's binding is dropped when nothing reads it any more. Its inverse,
:func:`bind_scope`, gives a nested scope a binding of its own, so that the
rules over bindings (expression splitting) can take it.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

from einopt.core import ir
from einopt.core.rewrite import accesses, fresh_name, replace_scopes, sort_bindings
from einopt.rules.base import NO_CONTEXT, Context, Failure, Match, Rule
from einopt.rules.boundary import Finite, nothing_finite
from einopt.rules.traversal import inline

__all__ = ["fuse", "bind_scope", "nested_sums", "FuseExpressions", "BindScope", "RULES"]


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

    Max scopes: as in ``merge_traversal`` (:func:`~einopt.rules.traversal.inline`):
    a producer without reduction inlines into any consumer; a producer that
    takes a maximum only as the whole body of a consumer that takes a maximum
    or reduces nothing; sums and maxima never mix.
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


def nested_sums(program: ir.Program) -> list[tuple[str, ir.Scope]]:
    """Each nested summing scope read directly by a binding's body, once: (binding name, scope).

    Only scopes that are not bound themselves and that sum (a contraction
    written inside its epilogue, ``L_x {L_z Sum_w g}[x] + B``); data-movement
    scopes are left to the normal form.
    """
    bound = {s for _, s in program.bindings}
    seen: set[ir.Scope] = set()
    out = []
    for name, scope in program.bindings:
        for a in accesses(scope.body):
            s = a.source
            if isinstance(s, ir.Scope) and s.summation and s not in bound and s not in seen:
                seen.add(s)
                out.append((name, s))
    return out


def bind_scope(program: ir.Program, binding: str, nested: ir.Scope, name: str) -> ir.Program:
    """``program`` with the nested scope ``nested`` of binding ``binding`` bound as ``name``.

    Nodes are interned, so every read of ``nested`` (in ``binding`` and
    elsewhere) becomes a read of the new binding; no body changes. ``name``
    must be free and ``nested`` must not be bound already.
    """
    if any(n == name for n, _ in program.bindings) or any(t.name == name for t in program.inputs):
        raise ValueError(f"cannot bind a scope as {name}: the name is taken")
    if any(s is nested for _, s in program.bindings):
        raise ValueError(f"the scope is bound already as {program.names()[nested]}")
    if not any(s is nested for s in ir.scopes_in(program.scope(binding))):
        raise ValueError(f"{binding} does not read the scope to bind")
    bindings = list(program.bindings)
    at = next(k for k, (n, _) in enumerate(bindings) if n == binding)
    return program.replace(bindings=sort_bindings([*bindings[:at], (name, nested), *bindings[at:]]))


def bound_name(program: ir.Program, binding: str) -> str:
    """A free name for a scope nested in ``binding``: ``binding`` + ``s`` (``Zs``, ``Zs1``, ...)."""
    taken = {t.name for t in program.inputs} | {n for n, _ in program.bindings}
    return fresh_name(f"{binding}s", taken)


class BindScope(Rule):
    """Give a nested summing scope a binding of its own (the inverse of ``fuse_expressions``)::

        Y = L_x f({L_z Sum_w g(z, w)}[Phi(x)])  ->  P = L_z Sum_w g(z, w);  Y = L_x f(P[Phi(x)])

    Always exact: the scope is the same node, only named (nodes are interned, so
    every read of it becomes a read of ``P``). Only nested scopes that sum and
    are read directly by a binding's body (a contraction written inside its
    bias epilogue); the rules over bindings (``split_expression``) then take it.

    Max scopes: bound like sums (only a name is added; nothing is computed
    differently).
    """

    name = "bind_scope"
    phase = "explore"
    family = "inter"
    undoes = ("fuse_expressions",)
    math = "Y = L_x f({L_z g(z)}[Phi(x)]) -> P = L_z g(z); Y = L_x f(P[Phi(x)])"

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        found = nested_sums(program)
        if not found:
            yield Failure(self.name, "program", "no binding reads a nested scope that sums")
        for binding, scope in found:
            name = bound_name(program, binding)
            yield Match(
                self.name,
                binding,
                f"bind a summing scope nested in {binding} as {name}",
                types.MappingProxyType({"binding": binding, "scope": scope, "name": name}),
            )

    def apply(self, program: ir.Program, match: Match, ctx: Context = NO_CONTEXT) -> ir.Program:
        if match.rule != self.name:
            raise ValueError(f"{self.name} cannot apply a match of {match.rule}")
        return bind_scope(program, match["binding"], match["scope"], match["name"])


RULES: tuple[Rule, ...] = (FuseExpressions(), BindScope())

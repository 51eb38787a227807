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
from collections.abc import Callable, Iterator

from einopt.core import ir
from einopt.core.rewrite import accesses, bound_reads, fresh_name, replace_scopes, sort_bindings, taken_names
from einopt.rules.base import NO_CONTEXT, Context, Failure, Match, Rule
from einopt.rules.boundary import Finite, nothing_finite
from einopt.rules.traversal import inline

__all__ = [
    "fuse",
    "bind_scope",
    "nested_sums",
    "producer_cone",
    "program_reads",
    "FuseExpressions",
    "BindScope",
    "FuseCone",
    "RULES",
]


def fuse(
    program: ir.Program, consumer: str, producer: str, finite: Finite = nothing_finite
) -> ir.Program | str:
    """``program`` with binding ``producer`` inlined into binding ``consumer``, or why not.

    Every read of the producer in the consumer's body (not in scopes nested
    in it) is inlined in turn; the producer's binding is dropped when no
    binding reads it any more and it is not an output. ``finite`` says which
    input tensors are known to be finite (see :func:`~einopt.rules.traversal.inline`).
    """
    new = _inlined(program, consumer, producer, finite)
    return new if isinstance(new, str) else _fused(program, consumer, producer, new)


def _fused(program: ir.Program, consumer: str, producer: str, new: ir.Scope) -> ir.Program:
    """``program`` with binding ``consumer``'s scope ``new`` (the producer inlined into it)."""
    out = replace_scopes(program, {program.scope(consumer): new})
    if _kept(program, consumer, producer, new):
        return out
    return out.replace(bindings=tuple((n, s) for n, s in out.bindings if n != producer))


def _inlined(program: ir.Program, consumer: str, producer: str, finite: Finite) -> ir.Scope | str:
    """The consumer's scope with every read of the producer in its body inlined, or why not."""
    c, p = program.scope(consumer), program.scope(producer)
    reads = [a for a in accesses(c.body) if a.source is p]
    if not reads:
        return f"{consumer} does not read {producer}"
    names = program.names()
    new = c
    for acc in reads:
        found = inline(new, acc, producer, finite, names)
        if isinstance(found, str):
            return found
        new = found
    return new


def _inlined_in(program: ir.Program, consumer: str, producer: str, ctx: Context) -> ir.Scope | str:
    """:func:`_inlined`, once per (consumer scope, producer scope) in a search: the result depends on
    the two scopes and the context only (the names appear in reasons alone)."""
    c, p = program.scope(consumer), program.scope(producer)
    return ctx.remembered(
        ("fuse_expressions", c, p), lambda: _inlined(program, consumer, producer, ctx.is_finite)
    )


def _kept(program: ir.Program, consumer: str, producer: str, new: ir.Scope) -> bool:
    """Whether ``producer`` stays bound once ``consumer`` is ``new``: it is an output, or a binding
    still reads it (another one, or the consumer from a scope nested in it). A consumer that became
    equal to the producer (interning) binds it itself."""
    if producer in program.outputs:
        return True
    reads = program_reads(program)
    others = any(producer in r for n, r in reads.items() if n not in (consumer, producer))
    names = program.names()
    return others or producer in {names[x] for x in bound_reads(new, names)}


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
                # Only the consumer is rewritten to judge the match (the program is rebuilt by apply).
                found = _inlined_in(program, consumer, producer, ctx)
                if isinstance(found, str):
                    yield Failure(self.name, consumer, found)
                    continue
                kept = _kept(program, consumer, producer, found)
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
        consumer, producer = match["consumer"], match["producer"]
        found = _inlined_in(program, consumer, producer, ctx)
        if isinstance(found, str):
            raise ValueError(found)
        return _fused(program, consumer, producer, found)


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
    return fresh_name(f"{binding}s", taken_names(program))


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


def program_reads(program: ir.Program) -> dict[str, set[str]]:
    """Binding name -> the bindings it reads (:func:`~einopt.core.rewrite.bound_reads`), once per
    program."""

    def compute() -> dict[str, set[str]]:
        names = program.names()
        return {n: {names[x] for x in bound_reads(s, names)} for n, s in program.bindings}

    return ir._cached(program, "binding_reads", compute)


def producer_cone(
    program: ir.Program, consumer: str, stop: Callable[[ir.Scope], bool] | None = None
) -> tuple[str, ...]:
    """The bindings only ``consumer`` depends on: those it reads, directly or through one another,
    that are not outputs and that nothing outside them and ``consumer`` reads (in program order).
    ``stop(scope)`` keeps a binding (and what only it reads) out of the cone.
    """
    reads = program_reads(program)
    reach: set[str] = set()
    todo = [consumer]
    while todo:
        for p in reads[todo.pop()]:
            if p in reach or p == consumer or p in program.outputs:
                continue
            if stop is not None and stop(program.scope(p)):
                continue
            reach.add(p)
            todo.append(p)
    # Drop what something outside reads, until what is left is closed (a dropped binding stays
    # bound, so what reads it from inside the cone still may).
    cone = set(reach)
    while bad := {
        p for p in cone if any(p in r for n, r in reads.items() if n not in cone and n != consumer)
    }:
        cone -= bad
    return tuple(n for n, _ in program.bindings if n in cone)


def _projects(ctx: Context) -> Callable[[ir.Scope], bool]:
    """Whether a scope is a projection by weights: it sums and reads a constant tensor (an added
    constant, a bias or an attention mask, does not make one)."""

    def projects(scope: ir.Scope) -> bool:
        return bool(scope.summation) and any(
            isinstance(a.source, ir.Tensor) and ctx.is_constant(a.source) for a in accesses(scope.body)
        )

    return projects


class FuseCone(Rule):
    """Nest the producers only a consumer depends on into it: their bindings go, their scopes stay
    (the inverse of ``bind_scope`` over a whole cone)::

        P1 = L g1;  P2 = L g2(P1);  C = L_x f(P2[Phi(x)])  ->  C = L_x f({L g2({L g1}[..])}[Phi(x)])

    Always exact: nodes are interned, so the scopes are the same, only no longer named; every
    read of them is now a read of a nested scope of ``C``. An operator that computes a chain of
    bindings at once (com.microsoft ``MultiHeadAttention``: the scores, their scale, the softmax
    and the product with V) takes it only as one expression, and one step of this rule makes it
    so where ``fuse_expressions`` needs one per binding and order.

    The cone: the bindings ``C`` reads, directly or through one another, that are not program
    outputs and are read by nothing but ``C`` and the cone. Variants: ``whole`` (all of them) and
    ``activations`` (not the bindings that sum over a constant tensor, nor what only they read: the
    projections by weights stay bound, an operator's inputs).

    Max scopes: nested like sums (nothing is computed differently).
    """

    name = "fuse_cone"
    phase = "explore"
    family = "inter"
    undoes = ("bind_scope",)
    variants = ("whole", "activations")
    math = "P1..Pk only C reads; C = L f(P1..Pk) -> C = L f({P1}..{Pk}) (the bindings go, the scopes stay)"

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        ways = (("whole", None), ("activations", _projects(ctx)))
        for consumer, _ in program.bindings:
            cones = {way: producer_cone(program, consumer, stop) for way, stop in ways}
            if not cones["whole"]:
                yield Failure(self.name, consumer, "no binding only it reads")
            for way, cone in cones.items():
                if cone and (way == "whole" or cone != cones["whole"]):
                    yield Match(
                        self.name,
                        consumer,
                        f"nest {', '.join(cone)} into {consumer}",
                        types.MappingProxyType({"consumer": consumer, "cone": cone, "way": way}),
                    )

    def apply(self, program: ir.Program, match: Match, ctx: Context = NO_CONTEXT) -> ir.Program:
        if match.rule != self.name:
            raise ValueError(f"{self.name} cannot apply a match of {match.rule}")
        consumer, cone = match["consumer"], set(match["cone"])
        reads = program_reads(program)
        outside = set().union(*(r for n, r in reads.items() if n not in cone and n != consumer))
        if bad := cone & (outside | set(program.outputs)):
            raise ValueError(f"{', '.join(sorted(bad))}: read outside the cone of {consumer}")
        # Producers first again: a scope nested now can equal one that a later binding binds.
        return program.replace(bindings=sort_bindings((n, s) for n, s in program.bindings if n not in cone))


RULES: tuple[Rule, ...] = (FuseExpressions(), BindScope(), FuseCone())

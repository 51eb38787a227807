"""Boundary tightening and relaxing (method.md section 3), and the zero analysis they share.

Reading a tensor or a scope outside its range yields 0, so many points of an
expression are provably 0: a product with a factor read out of range, a
padded border, the residues a strided read skips. :func:`is_zero` proves
such facts from index bounds alone; the rules here shrink an iterator's range
to drop provably-0 points (:class:`TightenBoundary`) or grow it over
provably-0 points (:class:`RelaxBoundary`), and :mod:`einopt.rules.traversal`
uses the same analysis to inline a scope read outside its box.

The analysis assumes finite values: ``0 * x`` is taken to be 0, which fails
only when ``x`` is infinite or NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from einopt import ir
from einopt.index import bounds, linear_form
from einopt.rewrite import accesses, source_ranges, substitute_iters
from einopt.rules.base import NO_CONTEXT, Context, Failure, Hit, Match, Rule, ScopeRule, hit, scope_labels

__all__ = [
    "ZERO_PRESERVING",
    "is_zero",
    "fix_iterator",
    "zero_at",
    "nonzero_span",
    "leaves_box",
    "ProgramFacts",
    "ProgramScopeRule",
    "TightenBoundary",
    "RelaxBoundary",
    "RULES",
]

# Unary functions with f(0) = 0 (sigmoid(0) = 1/2 and exp(0) = 1 are not).
ZERO_PRESERVING: frozenset[str] = frozenset({"relu", "tanh", "neg", "abs", "sqrt", "leaky_relu"})

# Binary operators and whether one zero operand (True) or all (False) make the result 0;
# ``/`` is missing: 0/0 is not 0.
_ZERO_IF_ANY: dict[str, bool] = {"*": True, "+": False, "-": False, "max": False, "min": False}

# Most values of one iterator the rules enumerate.
ENUMERATION_LIMIT = 4096

# How deep the zero analysis looks into scopes read by a body (a chain of
# bound scopes would otherwise be walked to its start at every query).
NESTING_LIMIT = 3

Ranges = Mapping[ir.Iter, tuple[int, int]]


# --------------------------------------------------------------------------
# Zero analysis
# --------------------------------------------------------------------------


def is_zero(e: ir.ValueExpr, ranges: Ranges | None = None, depth: int = NESTING_LIMIT) -> bool:
    """Whether ``e`` is provably 0 for every value of its iterators.

    Parameters
    ----------
    e : ValueExpr
        A body (or part of one).
    ranges : mapping of Iter to (lo, hi), optional
        Half-open ranges overriding the iterators' own (as in
        :func:`einopt.index.bounds`).
    depth : int
        How many levels of scopes read by accesses the analysis enters.

    Notes
    -----
    A product is 0 where one factor is; ``+ - max min`` where every operand
    is; a unary function where its argument is and ``f(0) = 0``; a constant
    if it is 0; an access where one index provably leaves the source's range,
    or where the source is a scope whose body is provably 0 on the part of
    its box the access can reach.
    """
    memo: dict[ir.ValueExpr, bool] = {}
    ranges = ranges or {}

    def go(x: ir.ValueExpr) -> bool:
        found = memo.get(x)
        if found is None:
            found = memo[x] = _zero(x, ranges, depth, go)
        return found

    return go(e)


def _zero(x: ir.ValueExpr, ranges: Ranges, depth: int, go: Any) -> bool:
    if isinstance(x, ir.Const):
        return x.value == 0.0
    if isinstance(x, ir.Unary):
        return x.fn in ZERO_PRESERVING and go(x.x)
    if isinstance(x, ir.Binary):
        any_zero = _ZERO_IF_ANY.get(x.op)
        if any_zero is None:
            return False
        return (go(x.a) or go(x.b)) if any_zero else (go(x.a) and go(x.b))
    assert isinstance(x, ir.Access)
    reach = []
    for idx, (lo, hi) in zip(x.indices, source_ranges(x.source), strict=True):
        a, b = bounds(idx, ranges)
        if b < lo or a >= hi:
            return True
        reach.append((max(a, lo), min(b + 1, hi)))
    if isinstance(x.source, ir.Scope) and depth > 0:
        inner = dict(zip(x.source.traversal, reach, strict=True))
        return is_zero(x.source.body, inner, depth - 1)
    return False


def fix_iterator(scope: ir.Scope, it: ir.Iter, value: int) -> ir.ValueExpr:
    """The body with ``it := value`` and every other extent-1 iterator fixed to its value (simplified)."""
    mapping: dict[ir.Iter, ir.IndexExpr] = {
        x: ir.IConst(x.lo) for x in scope.traversal + scope.summation if x.extent == 1
    }
    mapping[it] = ir.IConst(value)
    return substitute_iters(scope.body, mapping)


def zero_at(scope: ir.Scope, it: ir.Iter, value: int) -> bool:
    """Whether the body of ``scope`` is provably 0 wherever iterator ``it`` equals ``value``."""
    return is_zero(fix_iterator(scope, it, value))


def nonzero_span(
    scope: ir.Scope, it: ir.Iter, limit: int = ENUMERATION_LIMIT
) -> tuple[int, int] | None | str:
    """The smallest ``[a, b)`` inside ``it``'s range outside which the body is provably 0.

    Scans inwards from both ends of the range. Returns ``None`` when every
    value gives 0, and a reason when more than ``limit`` values would have
    to be enumerated.
    """
    a, steps = it.lo, 0
    while a < it.hi and zero_at(scope, it, a):
        a, steps = a + 1, steps + 1
        if steps > limit:
            return f"more than {limit} values of {it.name} to enumerate"
    if a == it.hi:
        return None
    b = it.hi
    while b - 1 > a and zero_at(scope, it, b - 1):
        b, steps = b - 1, steps + 1
        if steps > limit:
            return f"more than {limit} values of {it.name} to enumerate"
    return a, b


def leaves_box(scope: ir.Scope, reach: Sequence[tuple[int, int]]) -> tuple[int, tuple[int, int]] | None:
    """Where a read of ``scope`` reaching ``reach`` leaves its box onto points not provably 0.

    Parameters
    ----------
    scope : Scope
        The scope read.
    reach : sequence of (min, max)
        Inclusive bounds of each index of the read.

    Returns
    -------
    (dimension, (lo, hi)) or None
        The first dimension and half-open part of it outside the traversal
        range where the body is not provably 0 (every other traversal
        iterator ranging over its reachable values); ``None`` if there is none.
    """
    hull = {z: (a, b + 1) for z, (a, b) in zip(scope.traversal, reach, strict=True)}
    for z, (a, b) in zip(scope.traversal, reach, strict=True):
        pieces = []
        if a < z.lo:
            pieces.append((a, min(b + 1, z.lo)))
        if b >= z.hi:
            pieces.append((max(a, z.hi), b + 1))
        for piece in pieces:
            if not is_zero(scope.body, {**hull, z: piece}):
                return scope.traversal.index(z), piece
    return None


# --------------------------------------------------------------------------
# Scope rules that need to know the program around a scope
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProgramFacts:
    """What a scope rule may need to know about the program around a scope."""

    labels: Mapping[ir.Scope, str]
    bound: frozenset[ir.Scope]
    outputs: frozenset[ir.Scope]
    readers: Mapping[ir.Scope, tuple[ir.Access, ...]]

    @classmethod
    def of(cls, program: ir.Program) -> ProgramFacts:
        labels = scope_labels(program)
        readers: dict[ir.Scope, list[ir.Access]] = {}
        for s in labels:
            for acc in accesses(s.body):
                if isinstance(acc.source, ir.Scope):
                    readers.setdefault(acc.source, []).append(acc)
        return cls(
            labels,
            frozenset(s for _, s in program.bindings),
            frozenset(s for n, s in program.bindings if n in program.outputs),
            {s: tuple(r) for s, r in readers.items()},
        )

    @classmethod
    def alone(cls, scope: ir.Scope) -> ProgramFacts:
        """A scope on its own: it is treated as a program output."""
        return cls({scope: "Y"}, frozenset({scope}), frozenset({scope}), {})


class ProgramScopeRule(ScopeRule):
    """A :class:`ScopeRule` whose matching sees :class:`ProgramFacts` (outputs, bindings, readers)."""

    def match_in(self, scope: ir.Scope, facts: ProgramFacts, ctx: Context) -> Iterator[Hit | str]:
        raise NotImplementedError

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        return self.match_in(scope, ProgramFacts.alone(scope), ctx)

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        facts = ProgramFacts.of(program)
        for scope, where in facts.labels.items():
            for found in self.match_in(scope, facts, ctx):
                if isinstance(found, str):
                    yield Failure(self.name, where, found)
                else:
                    yield Match(self.name, where, found.summary, found.params, scope)


def _with_range(scope: ir.Scope, it: ir.Iter, lo: int, hi: int) -> ir.Scope:
    """``scope`` with iterator ``it`` ranging over ``[lo, hi)`` (body unchanged otherwise)."""
    new = ir.Iter(it.name, lo, hi)
    body = substitute_iters(scope.body, {it: new})

    def swap(its: tuple[ir.Iter, ...]) -> tuple[ir.Iter, ...]:
        return tuple(new if x is it else x for x in its)

    return ir.Scope(swap(scope.traversal), swap(scope.summation), body, scope.pad)


def _shown(lo: int, hi: int) -> str:
    return f"[{lo}, {hi})"


class TightenBoundary(ProgramScopeRule):
    """Shrink an iterator's range to the values where the body is not provably 0::

        L_x Sum_{y in [a, b)} f  ->  L_x Sum_{y in [a', b')} f      (f = 0 for y outside [a', b'))
        L_{x in [a, b)} f        ->  L_{x in [a', b')} f            (f = 0 for x outside [a', b'))

    The values of each iterator are scanned inwards from both ends; a value is
    dropped when the body with the iterator fixed to it (and every extent-1
    iterator fixed too) is provably 0 (:func:`is_zero`). Dropping zero terms
    of a sum is always legal; a summation range that collapses to one value
    is substituted and removed. Dropping traversal points changes the
    scope's shape, so it is legal only for scopes that are not program
    outputs: every reader then reads 0 outside the new range, as the
    dropped points were. Refused when every value gives 0 and when more than
    4096 values would have to be enumerated. Fig. 5 E5 -> E6 tightens the
    padded ``t1, t2`` of the inner scope to the input's range.
    """

    name = "tighten_boundary"
    family = "intra"
    math = "L_x Sum_{y in [a,b)} f -> Sum_{y in [a',b')} f  (f = 0 outside [a',b'))"

    def match_in(self, scope: ir.Scope, facts: ProgramFacts, ctx: Context) -> Iterator[Hit | str]:
        label = facts.labels.get(scope, "Y")
        for it in scope.traversal + scope.summation:
            span = nonzero_span(scope, it)
            if isinstance(span, str):
                if zero_at(scope, it, it.lo) or zero_at(scope, it, it.hi - 1):
                    yield span
                continue
            if span == (it.lo, it.hi):
                continue
            if span is None:
                yield f"every value of {it.name} gives 0: the scope is 0 everywhere (not tightened)"
                continue
            traversal = it in scope.traversal
            if traversal and scope in facts.outputs:
                yield f"{label} is a program output; its shape is fixed (cannot tighten {it.name})"
                continue
            lo, hi = span
            what = f"tighten {it.name} from {_shown(it.lo, it.hi)} to {_shown(lo, hi)}"
            if not traversal and hi - lo == 1:
                what = f"{what}: Sum over {it.name} becomes {it.name} = {lo}"
            yield hit(what, iterator=it, lo=lo, hi=hi)

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        it: ir.Iter = params["iterator"]
        lo, hi = params["lo"], params["hi"]
        if it in scope.summation and hi - lo == 1:
            body = substitute_iters(scope.body, {it: ir.IConst(lo)})
            summation = tuple(x for x in scope.summation if x is not it)
            return ir.Scope(scope.traversal, summation, body, scope.pad)
        return _with_range(scope, it, lo, hi)


def _round_up(n: int, m: int) -> int:
    return n + (-n) % m


def _relax_candidates(scope: ir.Scope, it: ir.Iter, facts: ProgramFacts) -> list[tuple[int, int]]:
    """New ranges for ``it``: padded to multiples of 2 and 3, and hulls of what it indexes or is read at."""
    lo, hi = it.lo, it.hi
    found: set[tuple[int, int]] = set()
    for m in (2, 3) if it.extent > 1 else ():
        n = _round_up(it.extent, m)
        found |= {(lo, lo + n), (hi - n, hi)}
    # The full range of a source dimension indexed by +-it + k.
    for acc in accesses(scope.body):
        for idx, (slo, shi) in zip(acc.indices, source_ranges(acc.source), strict=True):
            lf = linear_form(idx)
            if lf.atoms or len(lf.coeffs) != 1 or lf.coeffs[0][0] is not it or abs(lf.coeffs[0][1]) != 1:
                continue
            k = lf.const
            a, b = (slo - k, shi - k) if lf.coeffs[0][1] == 1 else (k - shi + 1, k - slo + 1)
            found.add((min(lo, a), max(hi, b)))
    # The values readers of this scope ask for (undoes a tightening).
    if it in scope.traversal:
        d = scope.traversal.index(it)
        for acc in facts.readers.get(scope, ()):
            a, b = bounds(acc.indices[d])
            found.add((min(lo, a), max(hi, b + 1)))
    found.discard((lo, hi))
    return sorted(found)


class RelaxBoundary(ProgramScopeRule):
    """Enlarge an iterator's range over points where the body is provably 0::

        L_x Sum_{y in [a, b)} f  ->  L_x Sum_{y in [a', b')} f      ([a, b) in [a', b'), f = 0 on the new y)

    Redundant computation that enables other rules (Fig. 6: a 5x5
    convolution relaxed to 6x6, whose extra taps read the kernel out of
    range, splits into 3x3 ones). Candidate ranges: the extent padded up to
    a multiple of 2 and of 3 (at the end or at the start), the full range of
    a source dimension the iterator indexes as ``+-it + k``, and (for a
    traversal iterator) the hull of the values readers of the scope ask for.
    Legal when the body is provably 0 at every new value; a traversal
    iterator of a program output is refused (its shape is fixed).
    """

    name = "relax_boundary"
    family = "intra"
    math = "L_x Sum_{y in [a,b)} f -> Sum_{y in [a',b')} f  (f = 0 on the new points)"

    def match_in(self, scope: ir.Scope, facts: ProgramFacts, ctx: Context) -> Iterator[Hit | str]:
        label = facts.labels.get(scope, "Y")
        for it in scope.traversal + scope.summation:
            traversal = it in scope.traversal
            refused = None
            output = traversal and scope in facts.outputs
            for lo, hi in _relax_candidates(scope, it, facts):
                new = [v for v in range(lo, hi) if not it.lo <= v < it.hi]
                what = f"relax {it.name} from {_shown(it.lo, it.hi)} to {_shown(lo, hi)}"
                if len(new) > ENUMERATION_LIMIT:
                    refused = refused or f"{what}: more than {ENUMERATION_LIMIT} new values to enumerate"
                    continue
                bad = next((v for v in new if not zero_at(scope, it, v)), None)
                if bad is not None:
                    if not output:
                        refused = refused or f"{what}: the body is not provably 0 at {it.name} = {bad}"
                elif output:
                    refused = refused or f"{label} is a program output; its shape is fixed (cannot {what})"
                else:
                    yield hit(what, iterator=it, lo=lo, hi=hi)
            if refused:
                yield refused

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        return _with_range(scope, params["iterator"], params["lo"], params["hi"])


RULES: tuple[Rule, ...] = (TightenBoundary(), RelaxBoundary())

"""Boundary tightening and relaxing (method.md section 3), and the zero analysis they share.

Reading a tensor or a scope outside its range yields 0, so many points of an
expression are provably 0: a product with a factor read out of range, a
padded border, the residues a strided read skips. :func:`is_zero` proves
such facts from index bounds alone; the rules here shrink an iterator's range
to drop provably-0 points (:class:`TightenBoundary`) or grow it over
provably-0 points (:class:`RelaxBoundary`), and :mod:`einopt.rules.traversal`
uses the same analysis to inline a scope read outside its box.

``0 * x`` is NaN when ``x`` is infinite or NaN (IEEE, the interpreter, and
ONNX Runtime's Conv over its padding), so a product is provably 0 only where
one factor is and every other factor is provably finite: a finite number, a
constant tensor whose values are all finite (the rule's
:class:`~einopt.rules.base.Context` says which), or functions of those that
cannot overflow. Reads of activations and of weights fed as graph inputs are
never known to be finite, and rules refuse with a reason that names them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from einopt.core import ir
from einopt.core.index import bounds, linear_form, simplify
from einopt.core.ops import BINARY, UNARY
from einopt.core.rewrite import accesses, index_text, source_ranges, substitute_iters
from einopt.rules.base import NO_CONTEXT, Context, Failure, Hit, Match, Rule, ScopeRule, hit, scope_labels

__all__ = [
    "ZERO_PRESERVING",
    "FINITE_PRESERVING",
    "Finite",
    "nothing_finite",
    "is_zero",
    "zero_only_if_finite",
    "finiteness_reason",
    "fix_iterator",
    "zero_at",
    "nonzero_span",
    "zero_where",
    "diagonal",
    "unproven_zero_at",
    "Leak",
    "leaves_box",
    "ProgramFacts",
    "ProgramScopeRule",
    "TightenBoundary",
    "RelaxBoundary",
    "RULES",
]

# Unary functions with f(0) = 0 (sigmoid(0) = 1/2 and exp(0) = 1 are not): ``zero`` in einopt.core.ops.
ZERO_PRESERVING: frozenset[str] = frozenset(op.name for op in UNARY.values() if op.zero)

# Unary functions whose value is finite where their argument is, whatever their parameter
# (sqrt(-1) is NaN, exp overflows; leaky_relu only with a slope in [-1, 1]: ``UnaryOp.keeps_finite``).
FINITE_PRESERVING: frozenset[str] = frozenset(op.name for op in UNARY.values() if op.finite is True)

# Most values of one iterator the rules enumerate.
ENUMERATION_LIMIT = 4096

# How deep the zero analysis looks into scopes read by a body (a chain of
# bound scopes would otherwise be walked to its start at every query).
NESTING_LIMIT = 3

Ranges = Mapping[ir.Iter, tuple[int, int]]

# Which input tensors hold only finite values (``Context.is_finite``).
Finite = Callable[[ir.Tensor], bool]
# The same for any source of a read (the analysis also asks about scopes).
SourceFinite = Callable[[ir.Tensor | ir.Scope], bool]


# --------------------------------------------------------------------------
# Zero analysis
# --------------------------------------------------------------------------


def nothing_finite(t: ir.Tensor) -> bool:
    """The sound default finiteness predicate: no input tensor is known to be finite."""
    return False


def is_zero(
    e: ir.ValueExpr,
    ranges: Ranges | None = None,
    depth: int = NESTING_LIMIT,
    finite: Finite = nothing_finite,
) -> bool:
    """Whether ``e`` is provably 0 for every value of its iterators and of the non-finite inputs.

    Parameters
    ----------
    e : ValueExpr
        A body (or part of one).
    ranges : mapping of Iter to (lo, hi), optional
        Half-open ranges overriding the iterators' own (as in
        :func:`einopt.core.index.bounds`).
    depth : int
        How many levels of scopes read by accesses the analysis enters.
    finite : callable, optional
        Which input tensors hold only finite values (constants whose minimum
        and maximum are finite, :meth:`~einopt.rules.base.Context.is_finite`);
        by default none does.

    Notes
    -----
    ``0 * x`` is NaN when ``x`` is infinite or NaN (IEEE, and the
    interpreter), so a product is 0 only where one factor is 0 and every
    other factor is provably finite. ``+ - max min`` are 0 where every
    operand is (``BinaryOp.zero`` in :mod:`einopt.core.ops`); a unary
    function where its argument is and ``f(0) = 0`` (``UnaryOp.zero``); a
    constant if it is 0; an access where one index provably leaves the
    source's range, or where the source is a scope whose body is provably 0
    on the part of its box the access can reach.

    Provably finite: a value that is provably 0, a finite constant, a read of
    an input ``finite`` accepts, a unary function that keeps finite values
    finite (``UnaryOp.keeps_finite``: ``neg abs relu tanh sigmoid`` and
    ``leaky_relu`` with a slope in ``[-1, 1]``) of a finite value, ``max min``
    of finite values (``BinaryOp.finite``), and a read of a scope without summation whose body is
    finite where it is read. Sums and products of finite values may overflow
    and are not provably finite.
    """
    return _Analysis(ranges or {}, depth, _tensors_only(finite)).zero(e)


def _tensors_only(finite: Finite) -> SourceFinite:
    return lambda src: isinstance(src, ir.Tensor) and finite(src)


class _Analysis:
    """Zero and finiteness facts of the sub-expressions of one body over one box (memoised)."""

    def __init__(self, ranges: Ranges, depth: int, finite: SourceFinite) -> None:
        self.ranges, self.depth, self.finite = ranges, depth, finite
        self.zeros: dict[ir.ValueExpr, bool] = {}
        self.finites: dict[ir.ValueExpr, bool] = {}

    def zero(self, x: ir.ValueExpr) -> bool:
        found = self.zeros.get(x)
        if found is None:
            found = self.zeros[x] = self._zero(x)
        return found

    def bounded(self, x: ir.ValueExpr) -> bool:
        """Whether ``x`` is provably finite."""
        found = self.finites.get(x)
        if found is None:
            found = self.finites[x] = self.zero(x) or self._finite(x)
        return found

    def _zero(self, x: ir.ValueExpr) -> bool:
        if isinstance(x, ir.Const):
            return x.value == 0.0
        if isinstance(x, ir.Unary):
            return UNARY[x.fn].zero and self.zero(x.x)
        if isinstance(x, ir.Binary):
            rule = BINARY[x.op].zero
            if rule == "either":
                # 0 * x = 0 only for a finite x.
                return (self.zero(x.a) and self.bounded(x.b)) or (self.zero(x.b) and self.bounded(x.a))
            return rule == "both" and self.zero(x.a) and self.zero(x.b)
        assert isinstance(x, ir.Access)
        reach = _reach(x, self.ranges)
        if reach is None:
            return True
        inner = self._inner(x.source, reach)
        return inner is not None and inner.zero(x.source.body)

    def _finite(self, x: ir.ValueExpr) -> bool:
        if isinstance(x, ir.Const):
            return math.isfinite(x.value)
        if isinstance(x, ir.Unary):
            return UNARY[x.fn].keeps_finite(x.param) and self.bounded(x.x)
        if isinstance(x, ir.Binary):
            return BINARY[x.op].finite and self.bounded(x.a) and self.bounded(x.b)
        assert isinstance(x, ir.Access)
        if self.finite(x.source):
            return True
        src = x.source
        if not isinstance(src, ir.Scope) or src.summation:
            return False
        reach = _reach(x, self.ranges)
        inner = None if reach is None else self._inner(src, reach)
        return inner is not None and inner.bounded(src.body)

    def _inner(self, src: ir.Tensor | ir.Scope, reach: list[tuple[int, int]]) -> _Analysis | None:
        """The analysis of a scope's body over the part of its box a read reaches (``None`` past the depth)."""
        if not isinstance(src, ir.Scope) or self.depth <= 0:
            return None
        return _Analysis(dict(zip(src.traversal, reach, strict=True)), self.depth - 1, self.finite)


def _reach(x: ir.Access, ranges: Ranges) -> list[tuple[int, int]] | None:
    """The half-open part of each source dimension ``x`` can read in range; ``None`` if it never does."""
    reach = []
    for idx, (lo, hi) in zip(x.indices, source_ranges(x.source), strict=True):
        a, b = bounds(idx, ranges)
        if b < lo or a >= hi:
            return None
        reach.append((max(a, lo), min(b + 1, hi)))
    return reach


def _sources(e: ir.ValueExpr, depth: int) -> dict[ir.Tensor | ir.Scope, None]:
    """The tensors and scopes ``e`` reads, and those read by the scopes it enters (to ``depth``)."""
    out: dict[ir.Tensor | ir.Scope, None] = {}
    for acc in accesses(e):
        out.setdefault(acc.source)
        if isinstance(acc.source, ir.Scope) and depth > 0:
            out.update(_sources(acc.source.body, depth - 1))
    return out


def zero_only_if_finite(
    e: ir.ValueExpr,
    ranges: Ranges | None = None,
    depth: int = NESTING_LIMIT,
    finite: Finite = nothing_finite,
) -> tuple[ir.Tensor | ir.Scope, ...] | None:
    """The values whose finiteness :func:`is_zero` lacks to prove ``e`` 0.

    Returns ``()`` when ``e`` is provably 0 already, ``None`` when it would
    not be even if every value read were finite, and otherwise a minimal set
    (found greedily, in reading order) of the tensors and scopes ``e`` reads
    that would make it provably 0 if they were known to be finite.
    """
    ranges = ranges or {}
    known = _tensors_only(finite)
    if _Analysis(ranges, depth, known).zero(e):
        return ()
    needed = [s for s in _sources(e, depth) if not known(s)]

    def zero_with(assumed: list[ir.Tensor | ir.Scope]) -> bool:
        extra = set(assumed)
        return _Analysis(ranges, depth, lambda s: s in extra or known(s)).zero(e)

    if not zero_with(needed):
        return None
    for s in list(needed):
        rest = [x for x in needed if x is not s]
        if zero_with(rest):
            needed = rest
    return tuple(needed)


def finiteness_reason(needed: Sequence[ir.Tensor | ir.Scope], labels: Mapping[ir.Scope, str]) -> str:
    """``"only if W is finite; W is not a constant known to be finite"`` for what :func:`zero_only_if_finite` found."""
    names = ", ".join(
        s.name if isinstance(s, ir.Tensor) else labels.get(s, "a computed scope") for s in needed
    )
    if len(needed) == 1:
        return f"only if {names} is finite; {names} is not a constant known to be finite"
    return f"only if {names} are finite; they are not constants known to be finite"


def fix_iterator(scope: ir.Scope, it: ir.Iter, value: int) -> ir.ValueExpr:
    """The body with ``it := value`` and every other extent-1 iterator fixed to its value (simplified)."""
    mapping: dict[ir.Iter, ir.IndexExpr] = {
        x: ir.IConst(x.lo) for x in scope.traversal + scope.summation if x.extent == 1
    }
    mapping[it] = ir.IConst(value)
    return substitute_iters(scope.body, mapping)


def zero_at(scope: ir.Scope, it: ir.Iter, value: int, finite: Finite = nothing_finite) -> bool:
    """Whether the body of ``scope`` is provably 0 wherever iterator ``it`` equals ``value``.

    ``finite`` says which input tensors are known to be finite (see :func:`is_zero`). The
    analysis runs over the box with ``it`` (and every extent-1 iterator) narrowed to one value,
    rather than on the body with the value substituted: the same facts (a one-value range is
    exact in :func:`einopt.core.index.bounds`; linear terms cancel in both), without rebuilding it.
    """
    return zero_where(scope, {it: value}, finite)


def zero_where(scope: ir.Scope, fixed: Mapping[ir.Iter, int], finite: Finite = nothing_finite) -> bool:
    """Whether the body of ``scope`` is provably 0 wherever each iterator of ``fixed`` has its value
    (every extent-1 iterator fixed too; see :func:`zero_at`)."""
    ranges = {x: (x.lo, x.hi) for x in scope.traversal + scope.summation if x.extent == 1}
    ranges.update({x: (v, v + 1) for x, v in fixed.items()})
    return is_zero(scope.body, ranges, finite=finite)


def nonzero_span(
    scope: ir.Scope, it: ir.Iter, limit: int = ENUMERATION_LIMIT, finite: Finite = nothing_finite
) -> tuple[int, int] | None | str:
    """The smallest ``[a, b)`` inside ``it``'s range outside which the body is provably 0.

    Scans inwards from both ends of the range. Returns ``None`` when every
    value gives 0, and a reason when more than ``limit`` values would have
    to be enumerated. ``finite`` is as in :func:`is_zero`. Memoised on the scope (per iterator,
    limit and ``finite``): the search asks it of every scope of every state it normalises.
    """
    if not may_vanish(scope):
        return it.lo, it.hi
    if it not in _vanishing_iterators(scope):
        # Fixing ``it`` narrows no read that could leave its range: zero at one value of ``it``
        # exactly where zero everywhere.
        return None if is_zero(scope.body, finite=finite) else (it.lo, it.hi)
    key = (
        "nonzero_span",
        it,
        limit,
        _Same(getattr(finite, "__self__", None)),
        getattr(finite, "__func__", finite),
    )
    return ir._cached(scope, key, lambda: _nonzero_span(scope, it, limit, finite))


def may_vanish(scope: ir.Scope) -> bool:
    """Whether :func:`is_zero` could prove the body 0 anywhere in its box, by a necessary condition
    checked once per scope: a constant 0, a read that can leave its source's range, or a read of a
    scope that may vanish. When it is False, no scan of an iterator's values can find a 0."""

    def compute() -> bool:
        for e in ir.walk(scope.body, stop=ir.Access):
            if isinstance(e, ir.Const) and e.value == 0.0:
                return True
            if isinstance(e, ir.Access) and (_leaving(e) or _reads_vanishing(e)):
                return True
        return False

    return ir._cached(scope, "may_vanish", compute)


def _reads_vanishing(acc: ir.Access) -> bool:
    """Whether ``acc`` reads a scope that may vanish."""
    return isinstance(acc.source, ir.Scope) and may_vanish(acc.source)


def _leaving(acc: ir.Access) -> list[ir.IndexExpr]:
    """The indices of ``acc`` whose bounds reach outside their source dimension."""
    out = []
    for idx, (lo, hi) in zip(acc.indices, source_ranges(acc.source), strict=True):
        a, b = bounds(idx)
        if a < lo or b >= hi:
            out.append(idx)
    return out


def _vanishing_iterators(scope: ir.Scope) -> frozenset[ir.Iter]:
    """The iterators whose fixing can make the body provably 0 somewhere: those read in an index
    that can leave its source's range, or in a read of a scope that may vanish (fixing them
    narrows the part of that scope's box the read reaches)."""

    def compute() -> frozenset[ir.Iter]:
        found: set[ir.Iter] = set()
        for acc in accesses(scope.body):
            for idx in acc.indices if _reads_vanishing(acc) else _leaving(acc):
                found |= idx.iters()
        return frozenset(found)

    return ir._cached(scope, "vanishing_iterators", compute)


class _Same:
    """Hashes and compares by identity (a Context holds arrays: not hashable), holding the object
    so that its id is not reused while a memo key refers to it."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def _nonzero_span(scope: ir.Scope, it: ir.Iter, limit: int, finite: Finite) -> tuple[int, int] | None | str:
    a, steps = it.lo, 0
    while a < it.hi and zero_at(scope, it, a, finite):
        a, steps = a + 1, steps + 1
        if steps > limit:
            return f"more than {limit} values of {it.name} to enumerate"
    if a == it.hi:
        return None
    b = it.hi
    while b - 1 > a and zero_at(scope, it, b - 1, finite):
        b, steps = b - 1, steps + 1
        if steps > limit:
            return f"more than {limit} values of {it.name} to enumerate"
    return a, b


def unproven_zero_at(
    scope: ir.Scope, it: ir.Iter, value: int, finite: Finite, labels: Mapping[ir.Scope, str]
) -> str | None:
    """Why the body is not provably 0 at ``it = value`` although it would be if more values
    were finite (``"only if W is finite; ..."``); ``None`` if finiteness is not what is missing."""
    needed = zero_only_if_finite(fix_iterator(scope, it, value), finite=finite)
    return finiteness_reason(needed, labels) if needed else None


class Leak(NamedTuple):
    """Where a read leaves a scope's box onto points not provably 0 (see :func:`leaves_box`)."""

    dimension: int
    piece: tuple[int, int]
    needs_finite: tuple[ir.Tensor | ir.Scope, ...]  # what would make it 0 if finite (empty: nothing would)


def leaves_box(
    scope: ir.Scope, reach: Sequence[tuple[int, int]], finite: Finite = nothing_finite
) -> Leak | None:
    """Where a read of ``scope`` reaching ``reach`` leaves its box onto points not provably 0.

    Parameters
    ----------
    scope : Scope
        The scope read.
    reach : sequence of (min, max)
        Inclusive bounds of each index of the read.
    finite : callable, optional
        Which input tensors are known to be finite (see :func:`is_zero`).

    Returns
    -------
    Leak or None
        The first dimension and half-open part of it outside the traversal
        range where the body is not provably 0 (every other traversal
        iterator ranging over its reachable values), and the values whose
        finiteness would make it 0 there; ``None`` if there is none.
    """
    hull = {z: (a, b + 1) for z, (a, b) in zip(scope.traversal, reach, strict=True)}
    for z, (a, b) in zip(scope.traversal, reach, strict=True):
        pieces = []
        if a < z.lo:
            pieces.append((a, min(b + 1, z.lo)))
        if b >= z.hi:
            pieces.append((max(a, z.hi), b + 1))
        for piece in pieces:
            box = {**hull, z: piece}
            if not is_zero(scope.body, box, finite=finite):
                needed = zero_only_if_finite(scope.body, box, finite=finite)
                return Leak(scope.traversal.index(z), piece, needed or ())
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
        """The facts of ``program``, computed once per program (programs are immutable)."""
        return ir._cached(program, "program_facts", lambda: cls._compute(program))

    @classmethod
    def _compute(cls, program: ir.Program) -> ProgramFacts:
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

    return ir.Scope(swap(scope.traversal), swap(scope.summation), body, scope.pad, scope.reduce)


def _collapse(scope: ir.Scope, it: ir.Iter, value: ir.IndexExpr) -> ir.Scope:
    """``scope`` (a sum) with summation iterator ``it`` substituted by ``value`` and its sum removed."""
    assert not scope.is_max, "a maximum does not drop its zero terms"
    body = substitute_iters(scope.body, {it: value})
    summation = tuple(x for x in scope.summation if x is not it)
    return ir.Scope(scope.traversal, summation, body, scope.pad)


def _max_reason(it: ir.Iter, what: str) -> str:
    """Why a rule that adds or drops points where the body is 0 leaves a max scope's iterator alone."""
    return (
        f"{it.name} is an iterator of a maximum: {what} points where the body is 0 would change it "
        f"(a maximum of negative values is below 0)"
    )


def _shown(lo: int, hi: int) -> str:
    return f"[{lo}, {hi})"


DIAGONAL_LIMIT = 16
"""Largest extent of the summation iterator a diagonal is looked for on (a kernel tap)."""

PARTNER_LIMIT = 256
"""Largest extent of the iterator a diagonal pairs it with (an output position: DCGAN's last
ConvTranspose has 64, GCN's last upsampling 224). Their pairs are enumerated, at most 16 * 256
points per partner."""


def _diagonal_needs(scope: ir.Scope, b: ir.Iter, ctx: Context) -> str | None:
    """Why ``b`` is no diagonal although it would be if more inputs were finite (a minimal set,
    found greedily in reading order); None when finiteness is not what is missing."""
    unknown = [t for t in ir.tensors_in(scope) if not ctx.is_finite(t)]
    if not unknown or diagonal(scope, b, lambda t: True) is None:
        return None
    needed = list(unknown)
    for t in unknown:
        rest = [u for u in needed if u is not t]
        if diagonal(scope, b, lambda u, rest=rest: ctx.is_finite(u) or u in rest) is not None:
            needed = rest
    _, g = diagonal(scope, b, lambda u: ctx.is_finite(u) or u in needed)
    names = ", ".join(t.name for t in needed)
    verb = "is" if len(needed) == 1 else "are"
    return (
        f"Sum over {b.name} is nonzero only at {b.name} = {index_text(g)} only if "
        f"{names} {verb} finite; {names} {verb} not known to be finite"
    )


def _divmod_partners(scope: ir.Scope, b: ir.Iter) -> list[ir.Iter]:
    """Iterators read with ``b`` inside one ``//`` or ``%`` of an index (a residue pairing, as the
    phases of a strided transposed convolution pair a kernel tap with an output position)."""
    found: dict[ir.Iter, None] = {}
    for acc in accesses(scope.body):
        for idx in acc.indices:
            for atom, _ in linear_form(idx).atoms:
                its = atom.iters()
                if b in its:
                    found.update(dict.fromkeys(sorted(its - {b}, key=lambda x: x.name)))
    mine = set(scope.traversal + scope.summation)
    return [x for x in found if x in mine and 1 < x.extent <= PARTNER_LIMIT]


def diagonal(
    scope: ir.Scope, b: ir.Iter, finite: Finite = nothing_finite
) -> tuple[ir.Iter, ir.IndexExpr] | None:
    """``(x, g)`` when, for every value of another iterator ``x``, the body is provably 0 at every
    value of summation iterator ``b`` except ``b = g(x)``: then ``Sum_b f = f[b := g(x)]``. ``g`` is
    affine, ``a*x + c`` (``a != 0``, in ``b``'s range), or a residue, ``(a*x + c) % m + b.lo`` with
    ``m`` the extent of ``b`` (a tap residue paired with an output position that was not split:
    ``r = h % 2``). ``b`` has at most :data:`DIAGONAL_LIMIT` values and ``x`` at most
    :data:`PARTNER_LIMIT` (their pairs are enumerated);
    ``None`` when there is no such ``x``."""
    if not 1 < b.extent <= DIAGONAL_LIMIT or not may_vanish(scope):
        return None
    for x in _divmod_partners(scope, b):
        points: list[tuple[int, int]] = []
        for xv in range(x.lo, x.hi):
            live = [bv for bv in range(b.lo, b.hi) if not zero_where(scope, {x: xv, b: bv}, finite)]
            if len(live) > 1:
                break
            points += [(xv, bv) for bv in live]
        else:
            if len(points) < 2:
                continue
            found = _affine(points, x, b)
            if found is None:
                found = _residue(points, x, b)
            if found is not None:
                return x, found
    return None


def _affine(points: list[tuple[int, int]], x: ir.Iter, b: ir.Iter) -> ir.IndexExpr | None:
    """``a*x + c`` through every ``(x, b)`` point, inside ``b``'s range for every ``x``; None if none."""
    (x0, b0), (x1, b1) = points[0], points[1]
    if (b1 - b0) % (x1 - x0) or b1 == b0:
        return None
    a = (b1 - b0) // (x1 - x0)
    c = b0 - a * x0
    if all(bv == a * xv + c for xv, bv in points) and all(
        b.lo <= a * xv + c < b.hi for xv in range(x.lo, x.hi)
    ):
        return simplify(a * x + c)
    return None


def _residue(points: list[tuple[int, int]], x: ir.Iter, b: ir.Iter) -> ir.IndexExpr | None:
    """``(a*x + c) % m + b.lo`` (``m`` = ``b``'s extent) through every ``(x, b)`` point; None if none."""
    m = b.extent
    for a in range(1, m):
        for c in range(m):
            if all(bv == (a * xv + c) % m + b.lo for xv, bv in points):
                return simplify(ir.IMod(simplify(a * x + c), m) + b.lo)
    return None


class TightenBoundary(ProgramScopeRule):
    """Shrink an iterator's range to the values where the body is not provably 0::

        L_x Sum_{y in [a, b)} f  ->  L_x Sum_{y in [a', b')} f      (f = 0 for y outside [a', b'))
        L_{x in [a, b)} f        ->  L_{x in [a', b')} f            (f = 0 for x outside [a', b'))

    The values of each iterator are scanned inwards from both ends; a value is
    dropped when the body with the iterator fixed to it (and every extent-1
    iterator fixed too) is provably 0 (:func:`is_zero`: a factor read out of
    range zeroes a product only if every other factor is provably finite, so
    a weight must be a constant known to be finite). Dropping zero terms
    of a sum is always legal; a summation range that collapses to one value
    is substituted and removed. Dropping traversal points changes the
    scope's shape, so it is legal only for scopes that are not program
    outputs: every reader then reads 0 outside the new range, as the
    dropped points were. Refused when every value gives 0 and when more than
    4096 values would have to be enumerated. Fig. 5 E5 -> E6 tightens the
    padded ``t1, t2`` of the inner scope to the input's range.

    The ``diagonal`` variant collapses a summation whose nonzero value follows
    another iterator::

        Sum_{b} f  ->  f[b := a*x + c]      (f = 0 unless b = a*x + c, for every x)

    proved pair by pair over both (small) ranges with the same analysis: after
    splitting an output position ``h = 2q + r`` and a kernel tap ``kh = 2q1 +
    r1`` of a stride-2 transposed convolution, the zero-inserted input is read
    at residue ``(r - r1) % 2``, so only ``r1 = r`` survives (the sub-pixel
    phases).

    Max scopes: traversal iterators are tightened as in a sum (where the body
    is 0 at every reduction point, the maximum is 0, which a read outside the
    new range gives too). Their reduction iterators are left alone, and the
    diagonal is not taken: the points dropped are 0, which a maximum of
    negative values would take.
    """

    name = "tighten_boundary"
    phase = "cleanup"
    variants = ("range", "diagonal")
    undoes = ("relax_boundary",)
    family = "intra"
    math = "L_x Sum_{y in [a,b)} f -> Sum_{y in [a',b')} f  (f = 0 outside [a',b'))"

    def match_in(self, scope: ir.Scope, facts: ProgramFacts, ctx: Context) -> Iterator[Hit | str]:
        label = facts.labels.get(scope, "Y")
        output = scope in facts.outputs
        for it in scope.traversal + scope.summation:
            if output and not ctx.reasons and it in scope.traversal:
                continue  # an output's shape is fixed, and no one asks why (the search's hot path)
            if scope.is_max and it in scope.summation:
                if ctx.reasons:
                    yield _max_reason(it, "dropping")
                continue
            span = nonzero_span(scope, it, finite=ctx.is_finite)
            if isinstance(span, str):
                if zero_at(scope, it, it.lo, ctx.is_finite) or zero_at(scope, it, it.hi - 1, ctx.is_finite):
                    yield span
                continue
            if span == (it.lo, it.hi):
                for v in dict.fromkeys((it.lo, it.hi - 1)) if ctx.reasons else ():
                    why = unproven_zero_at(scope, it, v, ctx.is_finite, facts.labels)
                    if why:
                        yield f"cannot drop {it.name} = {v}: the body is 0 there {why}"
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
            yield hit(what, way="range", iterator=it, lo=lo, hi=hi)
        for b in () if scope.is_max else scope.summation:
            found = diagonal(scope, b, ctx.is_finite)
            if found is None and ctx.reasons:
                why = _diagonal_needs(scope, b, ctx)
                if why:
                    yield why
            if found is not None:
                x, g = found
                yield hit(
                    f"Sum over {b.name} is nonzero only at {b.name} = {g}: substitute it (diagonal)",
                    way="diagonal",
                    iterator=b,
                    partner=x,
                    value=g,
                )

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        it: ir.Iter = params["iterator"]
        if params["way"] == "diagonal":
            return _collapse(scope, it, params["value"])
        lo, hi = params["lo"], params["hi"]
        if it in scope.summation and hi - lo == 1:
            return _collapse(scope, it, ir.IConst(lo))
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
    Legal when the body is provably 0 at every new value (:func:`is_zero`:
    the kernel read out of range times an activation is NaN where the
    activation is infinite, so Fig. 6's relaxation needs the activation to
    be known finite); a traversal iterator of a program output is refused
    (its shape is fixed).

    Max scopes: traversal iterators are relaxed as in a sum (the maximum is 0
    where the body is 0 at every reduction point, as a read outside gave).
    Their reduction iterators are left alone: the new points are 0, which a
    maximum of negative values would take.
    """

    name = "relax_boundary"
    phase = "explore"
    undoes = ("tighten_boundary",)
    grows = True
    family = "intra"
    math = "L_x Sum_{y in [a,b)} f -> Sum_{y in [a',b')} f  (f = 0 on the new points)"

    def match_in(self, scope: ir.Scope, facts: ProgramFacts, ctx: Context) -> Iterator[Hit | str]:
        label = facts.labels.get(scope, "Y")
        for it in scope.traversal + scope.summation:
            traversal = it in scope.traversal
            if scope.is_max and not traversal:
                if ctx.reasons:
                    yield _max_reason(it, "adding")
                continue
            refused = None
            output = traversal and scope in facts.outputs
            for lo, hi in _relax_candidates(scope, it, facts):
                new = [v for v in range(lo, hi) if not it.lo <= v < it.hi]
                what = f"relax {it.name} from {_shown(it.lo, it.hi)} to {_shown(lo, hi)}"
                if len(new) > ENUMERATION_LIMIT:
                    refused = refused or f"{what}: more than {ENUMERATION_LIMIT} new values to enumerate"
                    continue
                bad = next((v for v in new if not zero_at(scope, it, v, ctx.is_finite)), None)
                if bad is not None:
                    if not output and ctx.reasons:
                        why = unproven_zero_at(scope, it, bad, ctx.is_finite, facts.labels)
                        there = (
                            f"0 at {it.name} = {bad} {why}" if why else f"not provably 0 at {it.name} = {bad}"
                        )
                        refused = refused or f"{what}: the body is {there}"
                elif output:
                    refused = refused or f"{label} is a program output; its shape is fixed (cannot {what})"
                else:
                    yield hit(what, iterator=it, lo=lo, hi=hi)
            if refused:
                yield refused

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        return _with_range(scope, params["iterator"], params["lo"], params["hi"])


RULES: tuple[Rule, ...] = (TightenBoundary(), RelaxBoundary())

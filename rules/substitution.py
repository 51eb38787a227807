"""Variable substitution (method.md section 3): new iterators through a bijection.

``L_x f(T[tau(x)]) -> L_x {L_y f(T[tau(Phi^-1(y))])}[Phi(x)]``: the iterators
of a scope are replaced by new ones through a bijection ``Phi`` inferred from
the index functions. The rewritten scope keeps its traversal (and pad) and
reads a new inner scope at ``Phi(x)``; the inner scope traverses a box that
contains ``Phi``'s image and keeps the original summation. Every way is
planned as a pair of maps, ``forward`` (new iterator -> expression of the old
ones, i.e. ``Phi``) and ``inverse`` (old iterator -> expression of the new
ones), which are checked exactly before a match is offered.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from einopt.core import ir
from einopt.core.index import LinearForm, bounds, from_linear_form, linear_form, simplify, substitute
from einopt.core.rewrite import accesses, fresh_name, index_text, iter_names, substitute_iters
from einopt.rules.base import Context, Hit, Rule, ScopeRule, hit
from einopt.rules.boundary import Finite, finiteness_reason, is_zero, zero_only_if_finite

__all__ = ["SubstituteVariables", "RULES"]

Pairs = tuple[tuple[ir.Iter, ir.IndexExpr], ...]


# --------------------------------------------------------------------------
# Exact checks of a substitution
# --------------------------------------------------------------------------


def _zero_based(its: frozenset[ir.Iter]) -> dict[ir.Iter, ir.IndexExpr]:
    """Each iterator as ``it0 + lo`` with ``it0`` in ``[0, extent)`` (``lo`` alone for extent 1), so
    that ``simplify`` sees 0-based ranges."""
    return {it: ir.Iter(it.name, 0, it.extent) + it.lo if it.extent > 1 else ir.IConst(it.lo) for it in its}


def _undoes(
    old: tuple[ir.Iter, ...], there: Mapping[ir.Iter, ir.IndexExpr], back: Mapping[ir.Iter, ir.IndexExpr]
) -> bool:
    """Whether ``back(there(x)) == x`` for every ``x`` in the box of ``old`` (exact, symbolic)."""
    shift = _zero_based(frozenset(old))
    for x in old:
        composed = substitute(back.get(x, x), there)
        if simplify(substitute(composed, shift)) is not simplify(shift[x]):
            return False
    return True


def _into_box(forward: Mapping[ir.Iter, ir.IndexExpr]) -> bool:
    """Whether every ``forward[y]`` stays inside ``y``'s range over the old box."""
    for y, e in forward.items():
        lo, hi = bounds(simplify(e))
        if lo < y.lo or hi >= y.hi:
            return False
    return True


def _is_reindexing(scope: ir.Scope) -> bool:
    """A scope that only reads another scope (what this rule leaves outside): substituting there
    would only push the re-indexing into one more scope."""
    b = scope.body
    return not scope.summation and isinstance(b, ir.Access) and isinstance(b.source, ir.Scope)


# --------------------------------------------------------------------------
# Candidates, inferred from the index functions
# --------------------------------------------------------------------------


def _indices(scope: ir.Scope) -> list[ir.IndexExpr]:
    """Every index of every access of the body, in order, each once."""
    out: dict[ir.IndexExpr, None] = {}
    for a in accesses(scope.body):
        for i in a.indices:
            out.setdefault(i)
    return list(out)


def _fusable(scope: ir.Scope) -> list[ir.IndexExpr]:
    """Candidate expressions to fuse: every index, and the dividend of every ``//`` and ``%`` in one
    (``h + 2 - kh`` in ``(h + 2 - kh) // 2``, the zero-insertion read of a strided ConvTranspose)."""
    out: dict[ir.IndexExpr, None] = {}
    for e in _indices(scope):
        out.setdefault(e)
        for atom in _divmod_atoms(e):
            out.setdefault(atom.a)
    return list(out)


def _divmod_atoms(e: ir.IndexExpr) -> Iterator[ir.IFloorDiv | ir.IMod]:
    for atom, _ in linear_form(e).atoms:
        if isinstance(atom, ir.IFloorDiv | ir.IMod):
            yield atom
            yield from _divmod_atoms(atom.a)
        elif isinstance(atom, ir.IMul):
            yield from _divmod_atoms(atom.a)
            yield from _divmod_atoms(atom.b)


def _split_factors(scope: ir.Scope) -> list[tuple[ir.Iter, int]]:
    """``(iterator, k)`` pairs worth splitting: ``x // k``, ``x % k``, or ``x`` beside a ``k``-times coefficient."""
    found: dict[tuple[ir.Iter, int], None] = {}
    for e in _indices(scope):
        for atom in _divmod_atoms(e):
            inner = linear_form(atom.a)
            for it in sorted(atom.a.iters(), key=lambda i: i.name):
                c = abs(inner.coeff(it))
                k = atom.k // math.gcd(c, atom.k) if c else atom.k
                if k > 1:
                    found.setdefault((it, k))
        coeffs = linear_form(e).coeffs
        for z, cz in coeffs:
            for o, co in coeffs:
                if o is not z and co % cz == 0 and abs(co // cz) > 1:
                    found.setdefault((z, abs(co // cz)))
    return [(it, k) for it, k in found if -(-it.extent // k) > 1]


# Summation iterators up to this extent (kernel windows) are also split by every divisor of it.
_MAX_BLOCKED_EXTENT = 12


def _block_factors(scope: ir.Scope) -> list[tuple[ir.Iter, int]]:
    """``(k, d)`` for small summation iterators ``k`` and each divisor ``1 < d < extent``: the blocks
    that turn a relaxed 6x6 window into 2x2 blocks of 3x3 (Fig. 6)."""
    return [
        (it, d)
        for it in scope.summation
        if it.extent <= _MAX_BLOCKED_EXTENT
        for d in range(2, it.extent)
        if it.extent % d == 0
    ]


def _merge_pairs(scope: ir.Scope) -> list[tuple[ir.Iter, ir.Iter]]:
    """Ordered traversal pairs ``(outer, inner)``: adjacent in the traversal or read together."""
    trav = scope.traversal
    found: dict[tuple[ir.Iter, ir.Iter], None] = {}
    for x, y in zip(trav, trav[1:], strict=False):
        found.setdefault((x, y))

    def in_traversal(e: ir.IndexExpr) -> list[tuple[ir.Iter, int]]:
        """Traversal iterators of ``e`` with their |coefficient| (0 when only read inside ``//``, ``%``)."""
        lf = linear_form(e)
        return [(it, abs(lf.coeff(it))) for it in trav if it in e.iters()]

    for a in accesses(scope.body):
        for e in a.indices:
            its = sorted(in_traversal(e), key=lambda p: (-p[1], trav.index(p[0])))
            for n, (x, _) in enumerate(its):
                for y, _ in its[n + 1 :]:
                    found.setdefault((x, y))
        for e, f in zip(a.indices, a.indices[1:], strict=False):
            for x, _ in in_traversal(e):
                for y, _ in in_traversal(f):
                    if x is not y:
                        found.setdefault((x, y))
    return list(found)


# --------------------------------------------------------------------------
# Plans: the new iterators and the maps Phi and Phi^-1
# --------------------------------------------------------------------------


def _plan(way: str, summary: str, traversal, summation, forward: dict, inverse: dict) -> Hit:
    return hit(
        summary,
        way=way,
        traversal=traversal,
        summation=summation,
        forward=tuple(forward.items()),
        inverse=tuple(inverse.items()),
    )


def _fuse(scope: ir.Scope, e: ir.IndexExpr, x: ir.Iter) -> Hit:
    """``t = e`` replaces ``x`` (coefficient ``c = +-1``): ``x = c*(t - rest)``."""
    lf = linear_form(e)
    c = lf.coeff(x)
    lo, hi = bounds(e)
    t = ir.Iter(fresh_name("t", iter_names(scope)), lo, hi + 1)
    rest = e - c * x
    traversal = tuple(t if it is x else it for it in scope.traversal)
    return _plan(
        "fuse",
        f"fuse {e} into {t.name} (replaces {x.name})",
        traversal,
        scope.summation,
        {t: e},
        {x: simplify(c * (t - rest))},
    )


def _merge(scope: ir.Scope, x: ir.Iter, y: ir.Iter) -> Hit:
    """``z = (x - x.lo)*Y + (y - y.lo)`` at ``x``'s position: ``x = z // Y + x.lo``, ``y = z % Y + y.lo``."""
    Y = y.extent
    z = ir.Iter(fresh_name("z", iter_names(scope)), 0, x.extent * Y)
    traversal = tuple(z if it is x else it for it in scope.traversal if it is not y)
    return _plan(
        "merge",
        f"merge {x.name}, {y.name} into {z.name}",
        traversal,
        scope.summation,
        {z: (x - x.lo) * Y + (y - y.lo)},
        {x: simplify(z // Y + x.lo), y: simplify(z % Y + y.lo)},
    )


def _split_iters(scope: ir.Scope, z: ir.Iter, k: int) -> tuple[ir.Iter, ir.Iter, dict, dict]:
    """``z = k*q + r`` aligned to multiples of ``k`` (so ``z // k`` and ``z % k`` become ``q`` and ``r``)."""
    taken = iter_names(scope)
    q = ir.Iter(fresh_name("q", taken), z.lo // k, -(-z.hi // k))
    r = ir.Iter(fresh_name("r", taken | {q.name}), 0, k)
    forward = {q: z // k, r: z % k}
    return q, r, forward, {z: k * q + r}


def _replace(its: tuple[ir.Iter, ...], old: ir.Iter, new: tuple[ir.Iter, ...]) -> tuple[ir.Iter, ...]:
    return tuple(n for it in its for n in (new if it is old else (it,)))


def _split(scope: ir.Scope, z: ir.Iter, k: int) -> Hit:
    """``z = k*q + r``, ``(q, r)`` at ``z``'s position."""
    q, r, forward, inverse = _split_iters(scope, z, k)
    return _plan(
        "split",
        f"split {z.name} by {k} into {q.name}, {r.name}",
        _replace(scope.traversal, z, (q, r)),
        scope.summation,
        forward,
        inverse,
    )


def _split_sum(scope: ir.Scope, k: ir.Iter, K: int, finite: Finite, flipped: bool = False) -> Hit | str:
    """``Sum k -> Sum q, r`` with ``k = K*q + r`` (``flipped``: ``k = lo + hi - 1 - (K*q + r)``, the
    blocks counted from the other end); the terms outside ``k``'s range must vanish."""
    q, r, forward, inverse = _split_iters(scope, k, K)
    start, end = K * q.lo, K * q.hi
    last = k.lo + k.hi - 1
    if scope.is_max and (start, end) != (k.lo, k.hi):
        # Zero terms leave a sum alone but can raise a maximum (of negative values): no extra terms.
        return (
            f"Max {k.name} over [{k.lo}, {k.hi}) does not split into whole blocks of {K}: "
            f"a maximum would also take the extra terms {k.name} in [{start}, {k.lo}) and [{k.hi}, {end})"
        )
    if flipped:
        mirror = {k: last - k}
        forward = {it: substitute(e, mirror) for it, e in forward.items()}
        inverse = {k: simplify(last - inverse[k])}
    for lo, hi in ((start, k.lo), (k.hi, end)):
        if flipped:  # k' = last - k in [lo, hi)
            lo, hi = last - hi + 1, last - lo + 1
        # The extra terms must be provably 0 (a factor read outside its source, the others
        # finite: 0 * inf is NaN); no scope is entered.
        extra = {k: (lo, hi)}
        if lo < hi and not is_zero(scope.body, extra, depth=0, finite=finite):
            needed = zero_only_if_finite(scope.body, extra, depth=0, finite=finite)
            why = f" (they are 0 {finiteness_reason(needed, {})})" if needed else ""
            return (
                f"Sum {k.name} over [{k.lo}, {k.hi}) does not split into whole blocks of {K}: "
                f"the extra terms {k.name} in [{lo}, {hi}) would not be zero{why}"
            )
    if not (_undoes((k,), forward, inverse) and _undoes((q, r), inverse, forward)):
        return f"splitting {ir.REDUCTIONS[scope.reduce]} {k.name} by {K} is not a bijection"
    way = "split_sum_flipped" if flipped else "split_sum"
    order = f" from its end ({k.name} = {index_text(inverse[k])})" if flipped else ""
    return _plan(
        way,
        f"split {ir.REDUCTIONS[scope.reduce]} {k.name} by {K} into {q.name}, {r.name}{order}",
        None,
        _replace(scope.summation, k, (q, r)),
        forward,
        inverse,
    )


def _read_flipped(scope: ir.Scope) -> set[ir.Iter]:
    """Summation iterators read with a negative coefficient in an index or in the dividend of a
    ``//`` or ``%`` in one (``kh`` of ``(h + 1 - kh) // 2``: a flipped tap of a zero-inserted read)."""
    found: set[ir.Iter] = set()
    for e in _indices(scope):
        for form in (linear_form(e), *(linear_form(a.a) for a in _divmod_atoms(e))):
            found |= {it for it, c in form.coeffs if c < 0}
    return found & set(scope.summation)


def _reversible(scope: ir.Scope) -> list[ir.Iter]:
    """Summation iterators (extent > 1) read with a negative coefficient: a flipped kernel tap."""
    out: dict[ir.Iter, None] = {}
    for e in _indices(scope):
        for it, c in linear_form(e).coeffs:
            if c < 0 and it in scope.summation and it.extent > 1:
                out.setdefault(it)
    return list(out)


def _reverse_sum(scope: ir.Scope, k: ir.Iter) -> Hit:
    """``Sum k`` in the other direction: ``k -> k.lo + k.hi - 1 - k`` (same range, in place)."""
    flipped = {k: simplify(ir.IConst(k.lo + k.hi - 1) - k)}
    summary = f"reverse {ir.REDUCTIONS[scope.reduce]} {k.name} ({k.name} -> {k.lo + k.hi - 1}-{k.name})"
    return _plan("reverse_sum", summary, None, scope.summation, flipped, flipped)


# --------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------

# Ways that rewrite the summation in place (no new scope): checked by their planning function.
_IN_PLACE = ("split_sum", "split_sum_flipped", "reverse_sum")


class SubstituteVariables(ScopeRule):
    """Replace iterators of a scope by new ones through a bijection ``Phi``::

        L_x f(T[tau(x)])  ->  L_x {L_y f(T[tau(Phi^-1(y))])}[Phi(x)]

    The rewritten scope keeps its traversal and pad and has no summation; it
    reads the inner scope ``L_y Sum_s f'`` (the original summation stays
    inside) at ``Phi(x)``. The inner traversal is a box containing ``Phi``'s
    image; its extra points are never read. Legal when ``Phi`` maps the old box
    into the new one and ``Phi^-1(Phi(x)) = x`` there, which is checked
    exactly (in zero-based coordinates with ``einopt.core.index.simplify``).
    ``Phi`` is inferred from the index functions, four ways:

    * fuse: an affine index ``e = c*x + rest`` over traversal iterators only
      (two or more, or one with a shift), ``c = +-1``: ``t = e`` replaces
      ``x`` with range ``bounds(e)``; ``x = c*(t - rest)``.
    * merge: traversal iterators ``x``, ``y`` (adjacent, or read together)
      become ``z = (x - x.lo)*Y + (y - y.lo)`` in ``[0, X*Y)`` at ``x``'s place.
    * split: a traversal iterator ``z`` seen as ``z // k``, ``z % k`` or beside
      a ``k``-times coefficient becomes ``(q, r)``, ``z = z.lo + k*q + r``.
    * split a summation iterator the same way, in place (no new scope): the
      terms past its end must be zero, so its extent must be a multiple of
      ``k`` or the body must be provably 0 there: a factor reads outside its
      source and the other factors are provably finite (a weight must be a
      constant known to be finite: ``0 * inf`` is NaN).
    * split a summation iterator read flipped (a negative coefficient, also inside ``//`` or ``%``)
      into blocks counted from its end, in place: ``k = lo + hi - 1 - (k*q + r)``, so the blocks
      are read forward (reverse and split in one step: a stride-2 ConvTranspose's taps become
      correlation taps of its phases). The same extra terms must be zero.
    * reverse a summation iterator read with a negative coefficient, in place:
      ``k -> lo + hi - 1 - k`` (a flipped kernel becomes a correlation, so a
      stride-1 ConvTranspose form reads like a Conv).

    Max scopes: every way is a bijection of the iteration space, so a maximum
    is kept like a sum: the inner scope of fuse, merge and split takes the
    maximum (the outer one only reads it), and split and reverse in place
    rewrite the maximum's iterators. Splitting a summation iterator into blocks
    that run past its range is refused for a maximum: the extra terms are 0,
    which a maximum of negative values would take.
    """

    name = "substitute_variables"
    phase = "converge"
    undoes = ("merge_traversal",)
    variants = ("fuse", "merge", "split", "split_sum", "split_sum_flipped", "reverse_sum")
    family = "intra"
    math = "L_x f(T[tau(x)]) -> L_x {L_y f(T[tau(Phi^-1(y))])}[Phi(x)]"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        if _is_reindexing(scope):
            return
        seen: set[str] = set()
        for found in self._candidates(scope, ctx):
            key = found if isinstance(found, str) else found.summary
            if key in seen:
                continue
            seen.add(key)
            if isinstance(found, str):
                yield found
            elif found.params["way"] in _IN_PLACE or self._legal(scope, found.params, ctx):
                yield found

    def _candidates(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        trav = set(scope.traversal)
        sums = set(scope.summation)
        for e in _fusable(scope):
            lf = linear_form(e)
            its = [it for it, _ in lf.coeffs]
            if not lf.is_affine or not trav & set(its) or (len(its) < 2 and lf.const == 0):
                continue
            e = simplify(e)
            summed = [it.name for it in its if it in sums]
            if summed:
                # The traversal part of the index (``h + 3*b`` of ``h + 3*b + a``) can still be fused.
                part = from_linear_form(
                    LinearForm(tuple((it, c) for it, c in lf.coeffs if it in trav), (), lf.const)
                )
                if len(part.iters()) < 2:
                    yield f"index {e} reads summation iterator {', '.join(summed)}"
                    continue
                e, lf = simplify(part), linear_form(part)
            for x, c in lf.coeffs:
                if abs(c) == 1:
                    yield _fuse(scope, e, x)
                else:
                    yield f"coefficient {c} of {x.name} in {e}: not a bijection onto a box"
        for x, y in _merge_pairs(scope):
            yield _merge(scope, x, y)
        flipped = _read_flipped(scope)
        for z, k in _split_factors(scope) + _block_factors(scope):
            if z in trav:
                yield _split(scope, z, k)
            elif z in sums:
                yield _split_sum(scope, z, k, ctx.is_finite)
                if z in flipped:
                    yield _split_sum(scope, z, k, ctx.is_finite, flipped=True)
        for k in _reversible(scope):
            yield _reverse_sum(scope, k)

    @staticmethod
    def _legal(scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> bool:
        forward, inverse = params["forward"], params["inverse"]

        def bijection() -> bool:
            there, back = dict(forward), dict(inverse)
            return _into_box(there) and _undoes(scope.traversal, there, back)

        # Whether the plan is a bijection of the box depends on the iterators alone, and the same
        # plan recurs in every state's scopes over them. (Its inner scope cannot be a copy, which
        # would loop: that needs a body that only reads a scope, and such a scope is not matched.)
        return ctx.remembered(("substitute_variables", scope.traversal, forward, inverse), bijection)

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        body = substitute_iters(scope.body, dict(params["inverse"]))
        if params["traversal"] is None:
            return ir.Scope(scope.traversal, params["summation"], body, scope.pad, scope.reduce)
        traversal: tuple[ir.Iter, ...] = params["traversal"]
        inner = ir.Scope(traversal, scope.summation, body, (), scope.reduce)
        read = substitute_iters(inner[traversal], dict(params["forward"]))
        return ir.Scope(scope.traversal, (), read, scope.pad)


RULES: tuple[Rule, ...] = (SubstituteVariables(),)

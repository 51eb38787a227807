"""Layout rules (method.md section 3, Fig. 14): re-lay out one dimension of one access.

Each rule replaces one access ``T[tau]`` in a scope body by a read of a new
data-layout scope ``T'`` (an eOperator after instantiation) that holds ``T``'s
elements in another arrangement; the rewritten scope keeps its traversal.
``T`` is an input tensor or a scope; a scope's dimension ``d`` covers its
traversal range ``[lo, hi)`` (a tensor's ``[0, n)``). Splitting a dimension
by the stride an index function already uses turns ``A[b, 4*q + r, k]`` into
the plain read ``A'[b, q, r, k]`` (Fig. 14), which makes an operand fit a
predefined operator.

Scopes that are already pure data layout (no summation, body one access) are
not rewritten: re-laying out their read only composes two layouts, and
would let the search undo its own steps forever (swap, swap back, ...).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from einopt.core import ir
from einopt.core.index import bounds, linear_form, simplify
from einopt.core.rewrite import accesses, fresh_name, index_text, map_accesses, source_label, source_ranges
from einopt.rules.base import Context, Hit, Rule, ScopeRule, hit

__all__ = ["SplitDimension", "MergeDimensions", "SwapDimensions", "RULES"]


def _is_layout_scope(scope: ir.Scope) -> bool:
    return not scope.summation and isinstance(scope.body, ir.Access)


def _candidate_accesses(scope: ir.Scope) -> list[ir.Access]:
    """Accesses of rank >= 1 that read at least one iterator (layout scopes excluded)."""
    if _is_layout_scope(scope):
        return []
    return [a for a in accesses(scope.body) if a.iters()]


def _replace_access(scope: ir.Scope, old: ir.Access, new: ir.ValueExpr) -> ir.Scope:
    return scope.replace(body=map_accesses(scope.body, lambda a: new if a is old else a))


class _Namer:
    """Fresh iterator names for a new layout scope (tensor names it reads are avoided too)."""

    def __init__(self, src: ir.Tensor | ir.Scope) -> None:
        self.taken = {t.name for t in ir.tensors_in(src)} if isinstance(src, ir.Scope) else {src.name}

    def __call__(self, base: str, lo: int, hi: int) -> ir.Iter:
        name = fresh_name(base, self.taken)
        self.taken.add(name)
        return ir.Iter(name, lo, hi)


def _identity_dims(namer: _Namer, ranges: list[tuple[int, int]]) -> list[ir.Iter]:
    return [namer("i", lo, hi) for lo, hi in ranges]


# --------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------


def _divisors_in(e: ir.IndexExpr) -> set[int]:
    """The ``k`` of every ``// k`` and ``% k`` inside ``e``."""
    return {x.k for x in ir.walk(e) if isinstance(x, (ir.IFloorDiv, ir.IMod))}


def split_factors(e: ir.IndexExpr) -> list[int]:
    """The strides ``k > 1`` an index function suggests splitting its dimension by.

    A coefficient (of an iterator or a non-linear term) that is ``k`` times
    another one (``e = k*q + r``), and the divisor of every ``// k`` or ``% k``.
    """
    lf = linear_form(e)
    cs = [c for _, c in lf.coeffs] + [d for _, d in lf.atoms]
    ks = {a // b for a in cs for b in cs if a % b == 0 and a // b > 1}
    return sorted(ks | {k for k in _divisors_in(e) if k > 1})


class SplitDimension(ScopeRule):
    """Split one dimension of one access by a stride ``k``::

        T[.., e, ..]  ->  T'[.., e // k, e % k, ..],   T' = L[.., q, r:k, ..] T[.., k*q + r, ..]

    (indices simplified with the iterator ranges, so ``A[b, 4*q + r, k]``
    becomes ``A'[b, q, r, k]``). For a dimension over ``[lo, hi)``, ``q``
    ranges over ``[floor(lo/k), ceil(hi/k))``. Always an identity: every ``e``
    in ``[lo, hi)`` is ``k*(e // k) + e % k`` with ``e % k`` in ``[0, k)``;
    reads of ``T'`` beyond ``T``'s range read ``T``'s zeros, and an ``e``
    outside ``[lo, hi)`` maps outside ``T'`` or onto those zeros. ``k`` is
    inferred from the index function (:func:`split_factors`), and only
    ``1 < k < hi - lo`` is offered.

    Max scopes: legal in any scope, and on reads of a max scope: the access is
    replaced by a read equal to it at every point (out-of-range reads
    included), and the scope keeps its reduction.
    """

    name = "split_dimension"
    phase = "converge"
    undoes = ("merge_dimensions",)
    family = "intra"
    math = "T[.., e, ..] -> {L[.., q, r:k, ..] T[.., k*q + r, ..]}[.., e // k, e % k, ..]"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        for acc in _candidate_accesses(scope):
            found = False
            ranges = source_ranges(acc.source)
            for d, (e, (lo, hi)) in enumerate(zip(acc.indices, ranges, strict=True)):
                for k in split_factors(e):
                    if k < hi - lo:
                        found = True
                        yield hit(
                            f"split dimension {d} of {source_label(acc)} by {k}", access=acc, dim=d, k=k
                        )
            compound = [e for e in acc.indices if len(linear_form(e).coeffs) + len(linear_form(e).atoms) > 1]
            if not found and compound:
                yield (
                    f"no index of {source_label(acc)} has a stride to split by "
                    f"(k*q + r, // k or % k with 1 < k < the dimension's size): {index_text(compound[0])}"
                )

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        acc: ir.Access = params["access"]
        d: int = params["dim"]
        k: int = params["k"]
        ranges = source_ranges(acc.source)
        namer = _Namer(acc.source)
        before = _identity_dims(namer, ranges[:d])
        lo, hi = ranges[d]
        q = namer("q", lo // k, -(-hi // k))
        r = namer("r", 0, k)
        after = _identity_dims(namer, ranges[d + 1 :])
        read = tuple(before) + (ir.IAdd(ir.IMul(ir.IConst(k), q), r),) + tuple(after)
        layout = ir.Scope(tuple(before) + (q, r) + tuple(after), (), acc.source[read])
        e = acc.indices[d]
        indices = (
            acc.indices[:d] + (simplify(ir.IFloorDiv(e, k)), simplify(ir.IMod(e, k))) + acc.indices[d + 1 :]
        )
        return _replace_access(scope, acc, layout[indices])


# --------------------------------------------------------------------------
# Merging
# --------------------------------------------------------------------------


class MergeDimensions(ScopeRule):
    """Merge two adjacent dimensions of one access into one::

        T[.., a, b, ..]  ->  T'[.., a*q + (b - lo2), ..],   T' = L[.., z, ..] T[.., z // q, z % q + lo2, ..]

    where dimension ``d + 1`` covers ``[lo2, lo2 + q)`` and ``z`` ranges over
    ``[lo1*q, hi1*q)`` (for a tensor: ``z:p*q`` and ``T[.., z // q, z % q, ..]``).
    Legal iff ``b`` provably stays in ``[lo2, lo2 + q)`` (interval bounds over
    the iterator ranges): then ``z // q = a`` and ``z % q = b - lo2``, and an
    ``a`` outside its range puts ``z`` outside ``T'``, which reads 0 as ``T``
    does. If ``b`` may leave its range, two different reads would alias one
    element of ``T'``, and the rule refuses. Candidates are the adjacent
    pairs of dimensions where at least one index reads an iterator.

    Max scopes: legal in any scope, and on reads of a max scope: the access is
    replaced by a read equal to it at every point (out-of-range reads
    included), and the scope keeps its reduction.
    """

    name = "merge_dimensions"
    phase = "converge"
    undoes = ("split_dimension",)
    family = "intra"
    math = "T[.., a, b, ..] -> {L[.., z, ..] T[.., z // q, z % q, ..]}[.., a*q + b, ..]  (0 <= b < q)"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        for acc in _candidate_accesses(scope):
            ranges = source_ranges(acc.source)
            name = source_label(acc)
            for d in range(len(acc.indices) - 1):
                a, b = acc.indices[d], acc.indices[d + 1]
                if not (a.iters() or b.iters()):
                    continue
                lo2, hi2 = ranges[d + 1]
                blo, bhi = bounds(b)
                if lo2 <= blo and bhi < hi2:
                    yield hit(f"merge dimensions {d}, {d + 1} of {name}", access=acc, dim=d)
                else:
                    yield (
                        f"index {index_text(b)} of dimension {d + 1} of {name} may leave [{lo2}, {hi2}): merging would alias"
                    )

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        acc: ir.Access = params["access"]
        d: int = params["dim"]
        ranges = source_ranges(acc.source)
        (lo1, hi1), (lo2, hi2) = ranges[d], ranges[d + 1]
        q = hi2 - lo2
        namer = _Namer(acc.source)
        before = _identity_dims(namer, ranges[:d])
        z = namer("z", lo1 * q, hi1 * q)
        after = _identity_dims(namer, ranges[d + 2 :])
        read = (
            tuple(before)
            + (simplify(ir.IFloorDiv(z, q)), simplify(ir.IAdd(ir.IMod(z, q), ir.IConst(lo2))))
            + tuple(after)
        )
        layout = ir.Scope(tuple(before) + (z,) + tuple(after), (), acc.source[read])
        a, b = acc.indices[d], acc.indices[d + 1]
        merged = simplify(ir.IAdd(ir.IMul(ir.IConst(q), a), ir.ISub(b, ir.IConst(lo2))))
        indices = acc.indices[:d] + (merged,) + acc.indices[d + 2 :]
        return _replace_access(scope, acc, layout[indices])


# --------------------------------------------------------------------------
# Swapping
# --------------------------------------------------------------------------


class SwapDimensions(ScopeRule):
    """Transpose two adjacent dimensions of one access::

        T[.., a, b, ..]  ->  T'[.., b, a, ..],   T' = L[.., j, i, ..] T[.., i, j, ..]

    Always an identity (``T'`` keeps each dimension's range). To keep the
    number of matches modest, only pairs read out of order are offered: each
    index is ranked by the first of the scope's iterators it reads (traversal
    order, then summation), and the pair is a candidate when the first index
    ranks after the second, so the swap brings the access closer to the
    output order (``A[k, i]`` of a matmul ``L[i, j] Sum[k]`` becomes
    ``A'[i, k]``).

    Max scopes: legal in any scope, and on reads of a max scope: the access is
    replaced by a read equal to it at every point (out-of-range reads
    included), and the scope keeps its reduction.
    """

    name = "swap_dimensions"
    phase = "converge"
    undoes = ("swap_dimensions",)
    family = "intra"
    math = "T[.., a, b, ..] -> {L[.., j, i, ..] T[.., i, j, ..]}[.., b, a, ..]"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        order = {it: k for k, it in enumerate(scope.traversal + scope.summation)}
        for acc in _candidate_accesses(scope):
            ranks = [min((order[it] for it in e.iters()), default=None) for e in acc.indices]
            found = False
            for d in range(len(ranks) - 1):
                ra, rb = ranks[d], ranks[d + 1]
                if ra is not None and rb is not None and ra > rb:
                    found = True
                    yield hit(f"swap dimensions {d}, {d + 1} of {source_label(acc)}", access=acc, dim=d)
            if not found and sum(r is not None for r in ranks) > 1:
                yield f"{source_label(acc)} is read in the scope's iterator order: nothing to swap"

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        acc: ir.Access = params["access"]
        d: int = params["dim"]
        namer = _Namer(acc.source)
        dims = _identity_dims(namer, source_ranges(acc.source))
        swapped = tuple(dims[:d]) + (dims[d + 1], dims[d]) + tuple(dims[d + 2 :])
        layout = ir.Scope(swapped, (), acc.source[tuple(dims)])
        indices = acc.indices[:d] + (acc.indices[d + 1], acc.indices[d]) + acc.indices[d + 2 :]
        return _replace_access(scope, acc, layout[indices])


RULES: tuple[Rule, ...] = (SplitDimension(), MergeDimensions(), SwapDimensions())

"""The expression distance (method.md section 5): how far a scope is from a target operator.

``distance(scope, target, ctx)`` is 0 exactly when the target's matcher
accepts the scope (the instantiation table's own matchers decide, so the
distance cannot disagree with what instantiation will do). Otherwise it is 1
plus the number of *mismatched index positions*: positions of the scope's
accesses that the operator's canonical expression cannot read as they are,
i.e. an index that mixes iterators (``h + r - 1`` for a matmul: one per iterator beyond the
first), reads through ``//`` or ``%``, or has a coefficient other than 1 (a
stride or dilation: one more).
A convolution reads one traversal plus one summation iterator per spatial
position, so a window index is no mismatch for it.

The converging phase takes a step only when it lowers the distance of the
program (:func:`program_distance`): the sum, over the scopes that must run as
operators (contractions whose arithmetic intensity is high,
:func:`is_compute`), of the distance to the nearest target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from einopt.core import ir
from einopt.core.index import linear_form
from einopt.core.rewrite import accesses
from einopt.instantiate.match_band import band_form
from einopt.instantiate.match_contraction import match_gemm, match_matmul
from einopt.instantiate.match_contrib_act import ACTIVATION_MATCHERS
from einopt.instantiate.match_contrib_attention import ATTENTION_MATCHERS
from einopt.instantiate.match_contrib_rotary import ROTARY_MATCHERS, turns_half
from einopt.instantiate.match_conv import match_conv, match_conv_transpose
from einopt.instantiate.match_elementwise import match_elementwise
from einopt.instantiate.plan import NO_MATCH_CONTEXT, MatchContext, OperatorMatch, Refusal, kept_answer

__all__ = [
    "TARGETS",
    "INTENSITY_THRESHOLD",
    "distance",
    "nearest",
    "program_distance",
    "compute_scopes",
    "reads_only",
    "nearest_memo",
    "is_compute",
    "intensity",
    "match_g2bmm",
    "match_gbmm",
    "matcher_context",
    "FUSED",
    "fused_match",
    "may_fuse",
]

INTENSITY_THRESHOLD = 3.0
"""FLOPs per element read or written above which a contraction must run as a predefined operator
(method.md section 4: the paper says 4, its code 3); below it an eOperator is fine (memory bound)."""


def _band(scope: ir.Scope, kind: str) -> OperatorMatch | Refusal:
    """A band product of ``kind`` (:func:`einopt.instantiate.match_band.band_form`: G2BMM
    ``C[b, i, w] = Sum_k A[b, i, k] * B[b, i + d*w + c, k]`` or GBMM
    ``C[b, i, n] = Sum_w A[b, i, w] * B[b, i + d*w + c, n]``), which instantiation runs as blocked
    batched MatMuls."""
    form = band_form(scope)
    if isinstance(form, Refusal):
        return form
    return OperatorMatch(kind, ()) if form.kind == kind else Refusal(f"a {form.kind}, not a {kind}")


def match_g2bmm(scope: ir.Scope, ctx: MatchContext) -> OperatorMatch | Refusal:
    """General-to-band matmul (Longformer's band of ``Q K^T``)."""
    return _band(scope, "G2BMM")


def match_gbmm(scope: ir.Scope, ctx: MatchContext) -> OperatorMatch | Refusal:
    """General band matmul (the band of scores times ``V``)."""
    return _band(scope, "GBMM")


def _matmul(scope: ir.Scope, ctx: MatchContext) -> OperatorMatch | Refusal:
    found = match_matmul(scope, ctx)
    return found if isinstance(found, OperatorMatch) else match_gemm(scope, ctx)


TARGETS: dict[str, Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]] = {
    "MatMul": _matmul,
    "Conv": match_conv,
    "ConvTranspose": match_conv_transpose,
    "G2BMM": match_g2bmm,
    "GBMM": match_gbmm,
    "Elementwise": match_elementwise,
    **ATTENTION_MATCHERS,
}
"""The target operators of the converging phase and the matcher that decides each."""

FUSED: dict[str, Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]] = {
    **ATTENTION_MATCHERS,
    **ACTIVATION_MATCHERS,
    **ROTARY_MATCHERS,
}
"""Targets that compute a chain of scopes as one operator (the attention core, from the scores to
the product with V; a GELU written as five element-wise nodes, with its bias; a rotary embedding's
products with its tables and the concatenation of the turned halves): the scopes nested in
a binding one of them takes are its own, not compute scopes of their own (a ``fuse_cone`` step
makes the chain one binding; see the schedule)."""

_ACTIVATION_CALLS = frozenset({"erf", "tanh", "sigmoid"})
_ACTIVATION_REACH = 4
"""Scopes back from an element-wise consumer its activation call may be (GELU's last product reads
its ``1 + erf(..)`` two bindings after the call)."""


def may_fuse(scope: ir.Scope) -> bool:
    """Whether a :data:`FUSED` target could take ``scope`` (a cheap test before the matchers): an
    attention core is a product with a softmax, so it sums (or re-indexes a nested scope that does)
    and reaches a maximum; an activation is element-wise, with its erf, tanh or sigmoid at most
    :data:`_ACTIVATION_REACH` scopes back; a rotary embedding is element-wise, with a read half a
    dimension away as near."""

    def test() -> bool:
        inner = scope
        while (
            not inner.summation
            and isinstance(inner.body, ir.Access)
            and isinstance(inner.body.source, ir.Scope)
        ):
            inner = inner.body.source
        if inner.summation:
            return any(s.is_max for s in ir.scopes_in(inner))
        return _calls_near(scope, _ACTIVATION_REACH) or turns_half(scope, _ACTIVATION_REACH)

    # Asked for every binding of every state (compute_scopes): once per interned scope.
    return ir._cached(scope, "may_fuse", test)


def _calls_near(scope: ir.Scope, reach: int) -> bool:
    """Whether element-wise ``scope`` or one of the element-wise scopes it reads, ``reach`` deep,
    applies an activation call."""
    if scope.summation or reach < 0:
        return False
    if any(isinstance(e, ir.Unary) and e.fn in _ACTIVATION_CALLS for e in ir.walk(scope.body, ir.Access)):
        return True
    return any(
        isinstance(a.source, ir.Scope) and _calls_near(a.source, reach - 1) for a in accesses(scope.body)
    )


def fused_match(scope: ir.Scope, ctx: MatchContext) -> OperatorMatch | None:
    """The first :data:`FUSED` target that takes ``scope`` whole, or None."""
    if not may_fuse(scope):
        return None
    return kept_answer(scope, "fused_match", ctx, lambda c: _first_fused(scope, c))


def _first_fused(scope: ir.Scope, ctx: MatchContext) -> OperatorMatch | None:
    for fn in FUSED.values():
        found = fn(scope, ctx)
        if isinstance(found, OperatorMatch):
            return found
    return None


def _window(e: ir.IndexExpr, scope: ir.Scope) -> bool:
    lf = linear_form(e)
    if not lf.is_affine or len(lf.coeffs) != 2:
        return False
    (x, cx), (y, cy) = lf.coeffs
    trav, summ = set(scope.traversal), set(scope.summation)
    return abs(cy if x in trav else cx) == 1 and bool({x, y} & trav) and bool({x, y} & summ)


def _index_mismatches(e: ir.IndexExpr, scope: ir.Scope, target: str) -> int:
    if isinstance(e, ir.Iter | ir.IConst):
        return 0
    if target in ("Conv", "ConvTranspose") and _window(e, scope):
        return 0
    # One for every iterator mixed in beyond the first, one for reading through // or %
    # or with a stride: (h + 2 - kh) // 2 is two apart from a plain read, t // 2 one.
    lf = linear_form(e)
    return max(0, len(e.iters()) - 1) + (1 if lf.atoms or any(abs(c) != 1 for _, c in lf.coeffs) else 0)


def _channel_groups(scope: ir.Scope) -> int:
    """Output iterators a convolution's weight varies with beyond the one output channel it has
    (``f, r, r1`` of the sub-pixel phases: two to merge), under the better choice of weight."""
    reads = accesses(scope.body)
    if len(reads) != 2:
        return 0
    trav = set(scope.traversal)
    its = [set().union(*(e.iters() for e in a.indices)) & trav for a in reads]
    windowed = [any(_window(e, scope) for e in a.indices) for a in reads]
    sides = [(w, 1 - w) for w in (0, 1) if not windowed[w]] if any(windowed) else [(0, 1), (1, 0)]
    return min((max(0, len(its[w] - its[x]) - 1) for w, x in sides), default=0)


def mismatches(scope: ir.Scope, target: str, ctx: MatchContext = NO_MATCH_CONTEXT) -> int:
    """Index positions of ``scope`` that ``target``'s canonical expression cannot read as they are.

    A read of a constant (a weight, or a scope only weights feed) counts at most 1: one
    materialisation lays it out at compile time, whatever its indices. For a convolution, every
    output iterator the weight varies with beyond one counts 1 (they merge into its channels).
    """
    n = 0
    for acc in accesses(scope.body):
        k = sum(_index_mismatches(e, scope, target) for e in acc.indices)
        n += min(k, 1) if acc.source in ctx.constant else k
    if target in ("Conv", "ConvTranspose"):
        n += _channel_groups(scope)
    return n


def distance(scope: ir.Scope, target: str, ctx: MatchContext) -> int:
    """0 when ``target``'s matcher accepts ``scope``, else 1 + its mismatched index positions."""
    found = TARGETS[target](scope, ctx)
    return 0 if isinstance(found, OperatorMatch) else 1 + mismatches(scope, target, ctx)


def nearest(scope: ir.Scope, ctx: MatchContext) -> tuple[int, str]:
    """The smallest distance of ``scope`` to any target, and that target (first in table order on
    ties): :func:`distance` for each, stopping at the first that accepts, with the mismatches
    counted once per kind of target (convolutions read windows, the others do not)."""
    best: tuple[int, str] | None = None
    counted: dict[bool, int] = {}
    for t, matcher in TARGETS.items():
        if isinstance(matcher(scope, ctx), OperatorMatch):
            return 0, t
        conv = t in ("Conv", "ConvTranspose")
        if conv not in counted:
            counted[conv] = mismatches(scope, t, ctx)
        if best is None or 1 + counted[conv] < best[0]:
            best = (1 + counted[conv], t)
    assert best is not None
    return best


def _elements(scope: ir.Scope) -> int:
    seen: dict[object, int] = {}
    for acc in accesses(scope.body):
        src = acc.source
        seen[src] = math.prod(src.shape)
    return sum(seen.values()) + math.prod(scope.shape)


def intensity(scope: ir.Scope) -> float:
    """FLOPs (2 per multiply-add) per element of the sources it reads and the tensor it writes."""
    points = math.prod(it.extent for it in (*scope.traversal, *scope.summation))
    return 2.0 * points / max(1, _elements(scope))


def is_compute(scope: ir.Scope) -> bool:
    """A contraction (a sum of a product of reads) whose intensity makes it compute bound."""
    if not scope.summation:
        return False
    reads = accesses(scope.body)
    return len({id(a.source) for a in reads}) >= 2 and intensity(scope) >= INTENSITY_THRESHOLD


def reads_only(node: ir.Scope | ir.ValueExpr, constants: frozenset[str]) -> bool:
    """Whether every tensor ``node`` (a scope, or a value subterm through the scopes it reads) reads is
    in ``constants`` (it is folded at compile time)."""
    return all(t.name in constants for t in ir.tensors_in(node))


def matcher_context(
    root: ir.Program | ir.Scope, constants: frozenset[str], values: Mapping[str, np.ndarray] | None = None
) -> MatchContext:
    """The matchers' context for a program (or a scope on its own, bound as a program's one output):
    constant tensors (and scopes only they feed), bound scopes, and the constants' ``values`` where
    known."""
    tensors = frozenset(t for t in ir.input_tensors(root) if t.name in constants)
    scopes = frozenset(s for s in ir.scopes_in(root) if reads_only(s, constants))
    bound = frozenset(s for _, s in root.bindings) if isinstance(root, ir.Program) else frozenset({root})
    return MatchContext(constant=tensors | scopes, bound=bound, values=values or {})


def nearest_memo(scope: ir.Scope, ctx: MatchContext, memo: dict | None) -> int:
    """:func:`nearest`'s distance, memoised per scope (scopes are interned)."""
    if memo is not None and scope in memo:
        return memo[scope]
    d = nearest(scope, ctx)[0]
    if memo is not None:
        memo[scope] = d
    return d


def compute_scopes(root: ir.Program | ir.Scope, ctx: MatchContext) -> Iterator[ir.Scope]:
    """The scopes of ``root`` that must run as operators: compute bound and not folded at compile
    time, and not inside a binding a :data:`FUSED` target takes (it computes them)."""
    tops = [s for _, s in root.bindings] if isinstance(root, ir.Program) else [root]
    taken: set[ir.Scope] = set()
    for top in tops:
        found = fused_match(top, ctx) if top not in ctx.constant else None
        if found is not None:
            taken.update(found.consumes)  # not its operands' scopes (bound projections, ...)
    return (s for s in ir.scopes_in(root) if s not in ctx.constant and s not in taken and is_compute(s))


def program_distance(root: ir.Program | ir.Scope, ctx: MatchContext, memo: dict | None = None) -> int:
    """Sum of :func:`nearest` distances over the compute scopes of a program (or of a scope on its
    own); 0 when every one is an operator."""
    return sum(nearest_memo(s, ctx, memo) for s in compute_scopes(root, ctx))

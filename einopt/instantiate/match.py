"""Operator matching: which predefined ONNX operator computes a scope, with which attributes.

``MATCHERS`` is a table of ``fn(scope, ctx) -> OperatorMatch | Refusal``, tried in
order (the order is the preference: fused forms such as Conv with bias come
before the element-wise Add that would also match). A :class:`Refusal`
carries a human-readable reason, an :class:`OperatorMatch` the operator, its
derived attributes and the operands with their layout steps.

Matching follows the iterator mapping table: iterators are grouped by the
accesses they appear in (for ``C[m, n] = Sum_k A[m, k] B[k, n]``: m in {A, C},
n in {B, C}, k in {A, B}, batch in all), tensor correspondences (which access
is which input) and orders within groups are enumerated, and attributes come
from the coefficients of the index functions' linear forms. Names of
iterators never matter.

This module holds the table; the contractions (Gemm, MatMul, ReduceSum, Einsum) live in
``match_contraction``, Conv/ConvTranspose in ``match_conv``, element-wise operators in
``match_elementwise``, layout operators and Concat in ``match_layout``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from einopt.core import ir
from einopt.instantiate import BINARY_OPS, UNARY_OPS
from einopt.instantiate.match_band import match_band
from einopt.instantiate.match_contraction import (
    match_einsum,
    match_gemm,
    match_gemm_any,
    match_matmul,
    match_reduce_sum,
)
from einopt.instantiate.match_contrib import CONTRIB_MATCHERS, CONTRIB_PREFERRED
from einopt.instantiate.match_contrib_attention import ATTENTION_MATCHERS
from einopt.instantiate.match_conv import match_conv, match_conv_transpose
from einopt.instantiate.match_elementwise import PATTERNS, match_elementwise
from einopt.instantiate.match_layout import match_cast, match_concat, match_flatten, match_layout
from einopt.instantiate.match_max import MAX_MATCHERS, MAX_PREFERRED, takes_maxima
from einopt.instantiate.match_reduce import REDUCE_MATCHERS, REDUCE_PREFERRED
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    MatchContext,
    OperatorMatch,
    Refusal,
    Transpose,
    _fuses_binding,
    kept_answer,
    layout_cost,
    steps_cost,
)

__all__ = [
    "OperatorMatch",
    "Refusal",
    "MatchContext",
    "Matcher",
    "MATCHERS",
    "PREFERRED",
    "match",
]

log = logging.getLogger(__name__)

Matcher = Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------

MATCHERS: dict[str, Matcher] = {
    # First: they also take the attention core read through its head merge, which the layout
    # matcher would otherwise take as a Transpose + Reshape of the core computed apart.
    **ATTENTION_MATCHERS,
    "Layout": match_layout,
    "Concat": match_concat,
    **CONTRIB_MATCHERS,
    "Gemm": match_gemm,
    "ConvTranspose": match_conv_transpose,
    "Conv": match_conv,
    "MatMul": match_matmul,
    **REDUCE_MATCHERS,
    "ReduceSum": match_reduce_sum,
    **MAX_MATCHERS,
    "Elementwise": match_elementwise,
    "Band": match_band,
    "Einsum": match_einsum,
}


# The matcher of each original ONNX operator type: a scope an operator computed originally is
# instantiated as that operator when this matcher accepts it as cheaply as the table's choice.
PREFERRED: dict[str, Matcher] = {
    "Conv": match_conv,
    "ConvTranspose": match_conv_transpose,
    "Gemm": match_gemm_any,
    "MatMul": match_matmul,
    "ReduceSum": match_reduce_sum,
    "Einsum": match_einsum,
    "Concat": match_concat,
    "Flatten": match_flatten,
    "Cast": match_cast,
    **dict.fromkeys((*BINARY_OPS.values(), *UNARY_OPS.values(), *PATTERNS), match_elementwise),
    **dict.fromkeys(
        ("Transpose", "Reshape", "Slice", "Pad", "Expand", "DepthToSpace", "SpaceToDepth"), match_layout
    ),
    **REDUCE_PREFERRED,
    **MAX_PREFERRED,
    **CONTRIB_PREFERRED,
}


def match(
    scope: ir.Scope,
    ctx: MatchContext = NO_MATCH_CONTEXT,
    matchers: dict[str, Matcher] | None = None,
    prefer: str = "",
) -> tuple[OperatorMatch | None, tuple[tuple[str, Refusal], ...]]:
    """The first matcher (in table order) that accepts ``scope``, and the failures before it.

    A match that fuses a scope in ``ctx.bound`` is refused (that scope is
    computed anyway, so fusing would compute it twice). ``prefer`` is the ONNX
    operator type that computed the scope originally: when its matcher
    (``PREFERRED``) accepts the scope with no more run-time layout work than
    the table's choice, that match is returned instead (a 1x1 Conv stays a
    Conv rather than Reshape + Gemm + Reshape). A com.microsoft operator the
    table chose is kept when the original operator, the last of the scope's
    nodes, needs more nodes for it (a Relu after a Gemm: the product, an Add and
    the Relu); an ONNX Gelu computing the whole scope stays one.
    """
    if matchers is not None and matchers is not MATCHERS:
        return _match(scope, ctx, matchers, prefer)
    # The search instantiates every candidate state: most of its scopes recur from state to state.
    return kept_answer(scope, ("table_match", prefer), ctx, lambda c: _match(scope, c, MATCHERS, prefer))


def _match(
    scope: ir.Scope, ctx: MatchContext, matchers: dict[str, Matcher], prefer: str
) -> tuple[OperatorMatch | None, tuple[tuple[str, Refusal], ...]]:
    found, failures = _first_match(scope, ctx, matchers)
    fn = PREFERRED.get(prefer)
    if fn is None or (found is not None and found.op_type == prefer):
        return found, failures
    r = _call(fn, scope, ctx)
    if not isinstance(r, OperatorMatch) or _fuses_binding(r, ctx):
        return found, failures
    if found is not None and (layout_cost(r, ctx) > layout_cost(found, ctx) or _fuses_more(found, r, ctx)):
        return found, failures
    log.debug("matched %s as %s, its original operator", scope, r.op_type)
    return r, failures


def _fuses_more(found: OperatorMatch, other: OperatorMatch, ctx: MatchContext) -> bool:
    """Whether ``found`` is a com.microsoft operator and ``other`` needs more than one node (its
    operators, and the inline scopes it reads, each materialised by a node of its own)."""
    inline = [o for o in other.operands if isinstance(o.source, ir.Scope) and o.source not in ctx.bound]
    return found.op_type.startswith(f"{CONTRIB_DOMAIN}.") and len(other.ops) + len(inline) > 1


def _first_match(
    scope: ir.Scope, ctx: MatchContext, table: dict[str, Matcher]
) -> tuple[OperatorMatch | None, tuple[tuple[str, Refusal], ...]]:
    failures: list[tuple[str, Refusal]] = []
    for k, (name, fn) in enumerate(table.items()):
        r = _call(fn, scope, ctx)
        if isinstance(r, OperatorMatch):
            if not _fuses_binding(r, ctx):
                if name in COMPUTE and layout_cost(r, ctx) > 0:
                    r = _cheapest_compute(scope, ctx, r, list(table.items())[k + 1 :])
                log.debug("matched %s as %s", scope, r.op_type)
                return r, tuple(failures)
            r = Refusal("fuses a scope that is a program binding")
        failures.append((name, r))
    return None, tuple(failures)


def _call(fn: Matcher, scope: ir.Scope, ctx: MatchContext) -> OperatorMatch | Refusal:
    """``fn(scope, ctx)``, refused where ``fn`` would read a maximum as a sum.

    Matchers read a scope's reduction as a sum unless marked ``match_max.reads_maxima``: a max
    scope, or a match that fuses one, is theirs alone.
    """
    if takes_maxima(fn):
        return fn(scope, ctx)
    if scope.is_max:
        return Refusal("takes a maximum: only the matchers of maxima (ReduceMax, MaxPool, ...) read it")
    r = fn(scope, ctx)
    if isinstance(r, OperatorMatch) and any(s.is_max for s in r.consumes):
        # A consumed scope that an operand reads is computed with that operand, not fused.
        computed = {x for o in r.operands if isinstance(o.source, ir.Scope) for x in ir.scopes_in(o.source)}
        if any(s.is_max and s not in computed for s in r.consumes):
            return Refusal(f"{r.op_type} would fuse a scope that takes a maximum as a sum")
    return r


COMPUTE = frozenset({"Gemm", "ConvTranspose", "Conv", "MatMul"})
"""Matchers of compute operators: among those that accept a scope, run-time layout work decides."""


TRANSPOSE_COST = steps_cost((Transpose((1, 0)),), constant=False)


def _cheapest_compute(
    scope: ir.Scope, ctx: MatchContext, first: OperatorMatch, later: Sequence[tuple[str, Matcher]]
) -> OperatorMatch:
    """``first``, unless a later compute matcher saves at least one run-time transpose.

    A 1x1 convolution at batch > 1 matches Gemm only through transposes of
    its input and output, while Conv takes it as it is.
    """
    best, cost = first, layout_cost(first, ctx)
    for name, fn in later:
        if name not in COMPUTE:
            continue
        r = _call(fn, scope, ctx)
        if isinstance(r, OperatorMatch) and not _fuses_binding(r, ctx):
            c = layout_cost(r, ctx)
            if c <= cost - TRANSPOSE_COST:
                best, cost = r, c
    return best

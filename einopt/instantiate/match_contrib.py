"""Matchers of ONNX Runtime's built-in com.microsoft CPU operators (FusedMatMul, FusedGemm, Gelu, SkipLayerNormalization, attention, ...).

Every onnxruntime CPU package carries these kernels (``com.microsoft`` domain, opset 1), and
ONNX Runtime's own graph optimizer fuses standard subgraphs into them when a pattern matches.
Matched here, they are targets like Conv or MatMul: a scope becomes one of them when it computes
exactly what the operator computes, and measured acceptance decides whether the result is kept.

- ``FusedMatMul``: a (batched, broadcast) product ``alpha * A @ B`` whose operands the operator
  reads transposed in their last two dimensions (``transA``/``transB``) or with their first
  dimension moved behind the other batch dimensions (``transBatchA``/``transBatchB``: a
  ``[S, H, D]`` activation read as ``[H, S, D]``), chosen only when it saves run-time layout work
  that every standard operator needs (the transformer attention's ``Q K^T`` with its scale).
- ``FusedGemm``: ``act(Gemm(A, B, C))``, a Gemm's scope read by an activation (``nn.Linear`` and
  its ReLU, the LSTM gates' sigmoid and tanh).
- ``MultiHeadAttention``: the attention core, scores to the product with V
  (``einopt.instantiate.match_contrib_attention``).
- ``SkipLayerNormalization``, ``SkipSimplifiedLayerNormalization``: LayerNorm or RMSNorm of a
  residual sum (``einopt.instantiate.match_contrib_norm``).
- ``QuickGelu``, ``FastGelu``, ``Gelu``, ``BiasGelu``: element-wise GELU-like functions
  (``einopt.instantiate.match_contrib_act``).

A match's ``op_type`` is ``com.microsoft.NAME``: the report and ``match``'s preference for a
scope's original operator tell it from a default-domain operator of the same name (ONNX's Gelu).

This module must not import ``einopt.instantiate.match`` at module level: that module imports
this one for its table (its helpers are imported inside the matchers).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from einopt.core import ir
from einopt.instantiate.match_contrib_act import (
    ACTIVATION_MATCHERS,
    match_bias_gelu,
    match_fast_gelu,
    match_gelu,
    match_quick_gelu,
)
from einopt.instantiate.match_contrib_attention import ATTENTION_MATCHERS
from einopt.instantiate.match_contrib_norm import NORM_MATCHERS
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    Expand,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Reshape,
    Transpose,
    normalize,
    steps_cost,
)
from einopt.instantiate.views import View, arrange, finish

__all__ = [
    "CONTRIB_DOMAIN",
    "CONTRIB_MATCHERS",
    "CONTRIB_PREFERRED",
    "GEMM_ACTIVATIONS",
    "match_bias_gelu",
    "match_fast_gelu",
    "match_fused_gemm",
    "match_fused_matmul",
    "match_gelu",
    "match_quick_gelu",
]

Groups = list[tuple[ir.Iter, ...]]

# A contrib product must save at least this much run-time layout work (``plan.steps_cost``) over the
# cheapest standard operator: a run-time Transpose, Scale, Slice or Pad, not a free Reshape or a
# transposed copy of a constant.
_SAVING = 1.0


# --------------------------------------------------------------------------
# FusedMatMul
# --------------------------------------------------------------------------


def _fused_layout(groups: Groups, trans: bool, trans_batch: bool) -> Groups:
    """The layout an operand must have so that FusedMatMul reads it as ``groups`` (batch.., rows, cols).

    ONNX Runtime moves the first dimension behind the other batch dimensions (``transBatch``:
    ``[d0, d1, .., d(r-2), d(r-1)] -> [d1, .., d(r-2), d0, d(r-1)]``), then swaps the last two
    (``trans``); this is the inverse.
    """
    g = list(groups)
    if trans:
        g[-2], g[-1] = g[-1], g[-2]
    if trans_batch:
        g = [g[-2], *g[:-2], g[-1]]
    return g


def _fused_candidate(
    scale: float,
    traversal: tuple[ir.Iter, ...],
    ctx: MatchContext,
    va: View,
    vb: View,
    g,
    flags: tuple[int, int, int, int],
) -> tuple[float, OperatorMatch] | None:
    from einopt.instantiate.match import _batch_groups

    trans_a, trans_b, batch_a, batch_b = flags
    if (batch_a or batch_b) and not g.batch:
        return None  # ONNX Runtime: transBatch needs both inputs of one rank >= 3
    if batch_a or batch_b:
        a_batch: Groups = [(t,) if t in va.labels else () for t in g.batch]
        b_batch: Groups = [(t,) if t in vb.labels else () for t in g.batch]
    else:
        a_batch, b_batch = _batch_groups(g.batch, va.labels), _batch_groups(g.batch, vb.labels)
    a_groups = _fused_layout([*a_batch, g.m, g.k], bool(trans_a), bool(batch_a))
    b_groups = _fused_layout([*b_batch, g.k, g.n], bool(trans_b), bool(batch_b))
    a_steps = normalize(va.steps + arrange(va.labels, va.shape, a_groups), tuple(va.source.shape))
    b_steps = normalize(vb.steps + arrange(vb.labels, vb.shape, b_groups), tuple(vb.source.shape))
    post = finish([(t,) for t in g.batch] + [g.m, g.n], traversal)
    cost = (
        steps_cost(a_steps, ctx.is_constant(va.source))
        + steps_cost(b_steps, ctx.is_constant(vb.source))
        + steps_cost(post, False)
        + 0.001 * sum(flags)  # equal cost: fewer flags
    )
    shape = tuple(t.extent for t in g.batch) + (
        math.prod(t.extent for t in g.m),
        math.prod(t.extent for t in g.n),
    )
    attrs = (
        ("alpha", float(scale)),
        ("transA", trans_a),
        ("transB", trans_b),
        ("transBatchA", batch_a),
        ("transBatchB", batch_b),
    )
    op = OpNode("FusedMatMul", (0, 1), attrs, CONTRIB_DOMAIN, shape)
    operands = (Operand(va.source, a_steps), Operand(vb.source, b_steps))
    return cost, OperatorMatch(f"{CONTRIB_DOMAIN}.FusedMatMul", operands, (op,), post)


def _gemm_calls(m: OperatorMatch) -> int:
    """GEMM calls a product match makes: a (Fused)MatMul's broadcast batch, one for the others."""
    if m.op_type == f"{CONTRIB_DOMAIN}.FusedMatMul":
        return math.prod(m.ops[-1].shape[:-2])
    if m.op_type != "MatMul":
        return 1
    a, b = (o.shape[:-2] for o in m.operands[:2])
    return math.prod(np.broadcast_shapes(a, b))


def _standard_layout_cost(scope: ir.Scope, ctx: MatchContext, calls: int) -> float | None:
    """The least run-time layout work of the standard compute operators that accept ``scope`` with
    at most ``calls`` GEMM calls (MatMul avoids a transpose by reading single-sided iterators as
    broadcast batch dimensions: one tiny GEMM per element of theirs, no alternative to one GEMM)."""
    from einopt.instantiate.match import _fuses_binding, layout_cost, match_gemm, match_matmul
    from einopt.instantiate.match_conv import match_conv, match_conv_transpose

    costs = [
        layout_cost(r, ctx)
        for fn in (match_matmul, match_gemm, match_conv, match_conv_transpose)
        if isinstance(r := fn(scope, ctx), OperatorMatch)
        and not _fuses_binding(r, ctx)
        and _gemm_calls(r) <= calls
    ]
    return min(costs, default=None)


def match_fused_matmul(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L b.., m.., n.. Sum k..: alpha * A[..] * B[..]`` as com.microsoft ``FusedMatMul``.

    The iterator correspondences are MatMul's; each operand may be read transposed
    (``transA``/``transB``) and with its first dimension moved behind the batch
    (``transBatchA``/``transBatchB``), and the constant factor is ``alpha``. Chosen only when
    its cheapest form needs less run-time layout work than every standard operator that
    computes the scope with as few GEMM calls (a Transpose of an activation, or a Mul for the
    scale, saved).
    """
    from einopt.instantiate.match import _contraction, _product_groups

    c = _contraction(scope)
    if isinstance(c, Refusal):
        return c
    if len(c.views) != 2:
        return Refusal(f"a product of {len(c.views)} accesses: FusedMatMul takes two")
    best: tuple[tuple[float, int], OperatorMatch] | None = None
    reasons = []
    for va, vb in ((c.views[0], c.views[1]), (c.views[1], c.views[0])):
        gs = _product_groups(c, va, vb, allow_batch=True)
        if isinstance(gs, Refusal):
            reasons.append(gs.reason)
            continue
        for g in gs:
            for flags in itertools.product((0, 1), repeat=4):
                found = _fused_candidate(c.scale, c.traversal, ctx, va, vb, g, flags)
                if found is None:
                    continue
                rank = (found[0], _gemm_calls(found[1]))
                if best is None or rank < best[0]:
                    best = (rank, found[1])
    if best is None:
        return Refusal(reasons[0] if reasons else "no iterator correspondence")
    (cost, calls), fused = best
    standard = _standard_layout_cost(scope, ctx, calls)
    if standard is not None and cost > standard - _SAVING:
        return Refusal(
            "a standard operator needs no more run-time layout work "
            f"({standard:.2f} against FusedMatMul's {cost:.2f})"
        )
    return fused


# --------------------------------------------------------------------------
# FusedGemm: Gemm and an activation
# --------------------------------------------------------------------------

# IR activation -> FusedGemm's ``activation`` and the attribute carrying the IR function's parameter
# (ONNX Runtime builds the activation from the attributes named ``activation_*``; LeakyRelu's slope
# has no default there, so it is always written).
GEMM_ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "relu": ("Relu", None),
    "leaky_relu": ("LeakyRelu", "activation_alpha"),
    "sigmoid": ("Sigmoid", None),
    "tanh": ("Tanh", None),
}
"""The IR's element-wise functions FusedGemm applies (ONNX Runtime's CPU kernel takes more: HardSigmoid,
Elu, Softplus, ...; the IR has no rows for them)."""

# Layout steps an element-wise activation commutes with (a Pad or Slice would move zeros, which an
# activation such as sigmoid does not keep).
_COMMUTING = (Reshape, Transpose, Expand)


def _product_read(scope: ir.Scope, acc: ir.Access, ctx: MatchContext) -> ir.Scope | Refusal:
    """The inline summing scope ``acc`` reads at exactly ``scope``'s positions, in its order."""
    inner = acc.source
    if not isinstance(inner, ir.Scope) or not inner.summation:
        return Refusal("the activation's argument is not an inline product (nor a product plus a bias)")
    if inner in ctx.bound:
        return Refusal("the product scope is a program binding (materialised anyway)")
    same = len(acc.indices) == len(scope.traversal) and all(
        i is t and (t.lo, t.hi) == (it.lo, it.hi)
        for i, t, it in zip(acc.indices, scope.traversal, inner.traversal, strict=False)
    )
    if not same:
        return Refusal(f"the product is not read at the activation's own positions ({acc})")
    return inner


def match_fused_gemm(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L m, n: act(S[m, n] + beta * C[..])`` or ``act(S[m, n])``, ``S`` an inline Gemm product, as
    com.microsoft ``FusedGemm`` (Gemm's attributes, and the activation of :data:`GEMM_ACTIVATIONS`)."""
    from einopt.instantiate.match import match_gemm_any

    if scope.summation:
        return Refusal("sums over iterators: not an activation of a product")
    body = scope.body
    if not isinstance(body, ir.Unary) or body.fn not in GEMM_ACTIVATIONS:
        shown = ", ".join(GEMM_ACTIVATIONS)
        return Refusal(f"the body is not one of the activations FusedGemm applies ({shown})")
    if isinstance(body.x, ir.Access):
        product = _product_read(scope, body.x, ctx)
        if isinstance(product, Refusal):
            return product
        gemm = match_gemm_any(product, ctx)
        consumes: tuple[ir.Scope, ...] = (product,)
    else:
        gemm = match_gemm_any(ir.Scope(scope.traversal, (), body.x), ctx)
        consumes = () if isinstance(gemm, Refusal) else gemm.consumes
    if isinstance(gemm, Refusal):
        return Refusal(f"Gemm: {gemm.reason}")
    if not all(isinstance(st, _COMMUTING) for st in gemm.post):
        return Refusal("the Gemm's result needs layout steps the activation does not commute with")
    core = gemm.ops[-1]
    attrs = dict(core.attrs)
    a, b = (o.shape for o in gemm.operands[:2])
    shape = (a[1] if attrs["transA"] else a[0], b[0] if attrs["transB"] else b[1])
    activation, param = GEMM_ACTIVATIONS[body.fn]
    extra = (("activation", activation),) + (((param, float(body.param)),) if param else ())
    fused = OpNode("FusedGemm", core.inputs, core.attrs + extra, CONTRIB_DOMAIN, shape)
    return OperatorMatch(
        f"{CONTRIB_DOMAIN}.FusedGemm", gemm.operands, (*gemm.ops[:-1], fused), gemm.post, consumes
    )


# --------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------


Matcher = Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]

CONTRIB_MATCHERS: dict[str, Matcher] = {
    "FusedMatMul": match_fused_matmul,
    "FusedGemm": match_fused_gemm,
    **ATTENTION_MATCHERS,
    **NORM_MATCHERS,
    **ACTIVATION_MATCHERS,
}
"""Matcher per name, in order of preference, tried where ``einopt.instantiate.match.MATCHERS`` places them."""

CONTRIB_PREFERRED: dict[str, Matcher] = {
    "FusedMatMul": match_fused_matmul,
    "FusedGemm": match_fused_gemm,
    "QuickGelu": match_quick_gelu,
    "FastGelu": match_fast_gelu,
    "BiasGelu": match_bias_gelu,
    **NORM_MATCHERS,
    **ATTENTION_MATCHERS,
}
"""The matcher of each original ONNX operator type these matchers instantiate (the table is keyed by
op type alone: Gelu, Attention and RotaryEmbedding are also default-domain operators, whose own
matchers stay preferred for them)."""

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
  (``einopt.instantiate.match_contrib_attention``); ``Attention``: the same core whose Q, K and V
  are inline projections of one input by constant weights, packed at compile time (tried first).
- ``SkipLayerNormalization``, ``SkipSimplifiedLayerNormalization``: LayerNorm or RMSNorm of a
  residual sum (``einopt.instantiate.match_contrib_norm``).
- ``QuickGelu``, ``FastGelu``, ``Gelu``, ``BiasGelu``: element-wise GELU-like functions
  (``einopt.instantiate.match_contrib_act``).

A match's ``op_type`` is ``com.microsoft.NAME``: the report and ``match``'s preference for a
scope's original operator tell it from a default-domain operator of the same name (ONNX's Gelu).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import numpy as np

from einopt.core import ir
from einopt.instantiate.match_contraction import (
    _batch_groups,
    _contraction,
    _product_groups,
    _with_scale,
    match_gemm,
    match_gemm_any,
    match_matmul,
)
from einopt.instantiate.match_contrib_act import (
    ACTIVATION_MATCHERS,
    match_bias_gelu,
    match_fast_gelu,
    match_gelu,
    match_quick_gelu,
)
from einopt.instantiate.match_contrib_attention import ATTENTION_MATCHERS
from einopt.instantiate.match_contrib_norm import NORM_MATCHERS
from einopt.instantiate.match_contrib_rotary import ROTARY_MATCHERS
from einopt.instantiate.match_conv import match_conv, match_conv_transpose
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    Expand,
    LayoutStep,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Reshape,
    Transpose,
    _fuses_binding,
    layout_cost,
    steps_cost,
    steps_shape,
)
from einopt.instantiate.views import View, arranged, finished

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


@dataclasses.dataclass(frozen=True, eq=False)
class _Reading:
    """One iterator correspondence of a two-operand product (``va`` read as A): MatMul's operand
    steps, the result's steps, and the GEMM calls of FusedMatMul and MatMul."""

    va: View
    vb: View
    g: object  # einopt.instantiate.match_contraction._Groups
    a: tuple[LayoutStep, ...]
    b: tuple[LayoutStep, ...]
    post: tuple[LayoutStep, ...]
    calls: int  # FusedMatMul's GEMM calls: one per batch element
    matmul_calls: int  # MatMul's: its operands' batch dimensions broadcast


@dataclasses.dataclass(frozen=True, eq=False)
class _Products:
    """A scope as a product of two accesses and every reading of it (in the order MatMul and
    FusedMatMul try them), or why it is none."""

    contraction: object  # einopt.instantiate.match_contraction._Contraction
    readings: tuple[_Reading, ...]
    refusal: Refusal
    fewest_calls: int  # the GEMM calls of any FusedMatMul: at least one per common batch element


def _readings(scope: ir.Scope) -> _Products | Refusal:
    """Every reading of ``scope`` as a MatMul, computed once per (interned) scope."""
    c = _contraction(scope)
    if isinstance(c, Refusal):
        return c
    if len(c.views) != 2:
        return Refusal(f"a product of {len(c.views)} accesses: FusedMatMul takes two")
    la, lb = set(c.views[0].labels), set(c.views[1].labels)
    readings: list[_Reading] = []
    reasons = []
    for va, vb in ((c.views[0], c.views[1]), (c.views[1], c.views[0])):
        gs = _product_groups(c, va, vb, allow_batch=True)
        if isinstance(gs, Refusal):
            reasons.append(gs.reason)
            continue
        for g in gs:
            a = arranged(va, _batch_groups(g.batch, va.labels) + [g.m, g.k])
            b = arranged(vb, _batch_groups(g.batch, vb.labels) + [g.k, g.n])
            post = finished((*((t,) for t in g.batch), g.m, g.n), c.traversal)
            a_shape = steps_shape(a, tuple(va.source.shape))[:-2]
            b_shape = steps_shape(b, tuple(vb.source.shape))[:-2]
            calls = math.prod(t.extent for t in g.batch)
            mm_calls = math.prod(np.broadcast_shapes(a_shape, b_shape))
            readings.append(_Reading(va, vb, g, a, b, post, calls, mm_calls))
    refusal = Refusal(reasons[0] if reasons else "no iterator correspondence")
    common = math.prod(t.extent for t in c.traversal if t in la and t in lb)
    return _Products(c, tuple(readings), refusal, common)


def _flagged(products: _Products) -> list[tuple[dict, dict]]:
    """For each reading, A's and B's steps for each FusedMatMul flag of theirs, keyed by
    ``(trans, transBatch of it, transBatch of either)`` (``(0, 0, 0)``: MatMul's)."""
    out = []
    for r in products.readings:
        g = r.g
        a, b = {}, {}
        for any_batch in (0, 1) if g.batch else (0,):
            for view, steps, last in ((r.va, a, [g.m, g.k]), (r.vb, b, [g.k, g.n])):
                batch = (
                    [(t,) if t in view.labels else () for t in g.batch]
                    if any_batch
                    else _batch_groups(g.batch, view.labels)
                )
                for trans, moved in itertools.product((0, 1), (0, 1) if any_batch else (0,)):
                    layout = _fused_layout([*batch, *last], bool(trans), bool(moved))
                    steps[trans, moved, any_batch] = arranged(view, layout)
        out.append((a, b))
    return out


def _plain(products: _Products, constant: tuple[bool, bool]) -> tuple[float, int] | None:
    """The layout cost and GEMM calls of ``match_contraction.match_matmul``'s match (the first cheapest reading,
    the scale on a constant A when B is not, else on B), ``constant[i]`` telling whether the
    product's ``i``-th access reads a constant."""
    c = products.contraction
    plain: tuple[float, int] | None = None
    for r in products.readings:
        const_a, const_b = constant if r.va is c.views[0] else constant[::-1]
        a_steps, b_steps = r.a, r.b
        if const_a and not const_b:
            a_steps = _with_scale(a_steps, c.scale, tuple(r.va.source.shape))
        else:
            b_steps = _with_scale(b_steps, c.scale, tuple(r.vb.source.shape))
        cost = steps_cost(a_steps, const_a) + steps_cost(b_steps, const_b) + steps_cost(r.post, False)
        if plain is None or cost < plain[0]:
            plain = (cost, r.matmul_calls)
    return plain


@dataclasses.dataclass(frozen=True, eq=False)
class _Choice:
    """The cheapest FusedMatMul of a product, and the cheapest MatMul, for given constant operands."""

    cost: float
    calls: int
    fused: OperatorMatch
    matmul_cost: float
    matmul_calls: int


_FLAGS = tuple(itertools.product((0, 1), repeat=4))  # (transA, transB, transBatchA, transBatchB)


def _choose(scope: ir.Scope, products: _Products, constant: tuple[bool, bool]) -> _Choice | Refusal:
    """The FusedMatMul the enumeration of every reading and flag chooses (the least cost, then the
    fewest GEMM calls; the first of equals), and MatMul's cost; refused without the flags where
    MatMul needs less layout work than any FusedMatMul could save, with no more GEMM calls."""
    plain = _plain(products, constant)
    if plain is None:
        return products.refusal
    matmul_cost, matmul_calls = plain
    if matmul_calls <= products.fewest_calls and matmul_cost < _SAVING:
        return _not_cheaper(f"MatMul's {matmul_cost:.2f}, less than FusedMatMul could save")
    c = products.contraction
    flagged = ir._cached(scope, "contrib_fused_flagged", lambda: _flagged(products))
    best: tuple[tuple[float, int], _Reading, tuple[int, ...], tuple[dict, dict]] | None = None
    for r, (a, b) in zip(products.readings, flagged, strict=True):
        const_a, const_b = constant if r.va is c.views[0] else constant[::-1]
        a_cost = {k: steps_cost(st, const_a) for k, st in a.items()}
        b_cost = {k: steps_cost(st, const_b) for k, st in b.items()}
        post_cost = steps_cost(r.post, False)
        for flags in _FLAGS:
            trans_a, trans_b, batch_a, batch_b = flags
            any_batch = batch_a or batch_b
            if any_batch and not r.g.batch:
                continue  # ONNX Runtime: transBatch needs both inputs of one rank >= 3
            cost = (
                a_cost[trans_a, batch_a, any_batch]
                + b_cost[trans_b, batch_b, any_batch]
                + post_cost
                + 0.001 * sum(flags)  # equal cost: fewer flags
            )
            if best is None or (cost, r.calls) < best[0]:
                best = ((cost, r.calls), r, flags, (a, b))
    (cost, calls), r, flags, steps = best
    return _Choice(cost, calls, _fused_match(c.scale, r, flags, steps), matmul_cost, matmul_calls)


def _fused_match(
    scale: float, r: _Reading, flags: tuple[int, ...], steps: tuple[dict, dict]
) -> OperatorMatch:
    trans_a, trans_b, batch_a, batch_b = flags
    any_batch = batch_a or batch_b
    g = r.g
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
    a, b = steps
    operands = (
        Operand(r.va.source, a[trans_a, batch_a, any_batch]),
        Operand(r.vb.source, b[trans_b, batch_b, any_batch]),
    )
    return OperatorMatch(f"{CONTRIB_DOMAIN}.FusedMatMul", operands, (op,), r.post)


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
    if not scope.summation:
        return Refusal("no summation: not a contraction")
    # The search asks for every scope of every state it costs: the readings are computed once per
    # (interned) scope, the choice once per scope and constant operands.
    products = ir._cached(scope, "contrib_fused_readings", lambda: _readings(scope))
    if isinstance(products, Refusal):
        return products
    views = products.contraction.views
    constant = (ctx.is_constant(views[0].source), ctx.is_constant(views[1].source))
    choices = ir._cached(scope, "contrib_fused_choices", dict)
    if constant not in choices:
        choices[constant] = _choose(scope, products, constant)
    choice = choices[constant]
    if isinstance(choice, Refusal):
        return choice
    # MatMul (computed with the choice) refuses most products without the other standard operators.
    if choice.matmul_calls <= choice.calls and choice.cost > choice.matmul_cost - _SAVING:
        return _not_cheaper(f"MatMul's {choice.matmul_cost:.2f} against FusedMatMul's {choice.cost:.2f}")
    standard = _standard_layout_cost(scope, ctx, choice.calls)
    if standard is not None and choice.cost > standard - _SAVING:
        return _not_cheaper(f"{standard:.2f} against FusedMatMul's {choice.cost:.2f}")
    return choice.fused


def _not_cheaper(costs: str) -> Refusal:
    return Refusal(f"a standard operator needs no more run-time layout work ({costs})")


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
    # before FusedMatMul, which would take the product with V alone (leaving the softmax and the
    # scores to nodes of their own) where it saves MatMul a transpose of V
    **ATTENTION_MATCHERS,
    "FusedMatMul": match_fused_matmul,
    "FusedGemm": match_fused_gemm,
    **NORM_MATCHERS,
    **ACTIVATION_MATCHERS,
    **ROTARY_MATCHERS,
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
op type alone: Gelu and RotaryEmbedding are also default-domain operators, whose own matchers stay
preferred for them; ONNX's own Attention, of opset 23, has no importer, so ``Attention`` names
com.microsoft's)."""

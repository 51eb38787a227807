"""ONNX Runtime's com.microsoft normalizations of a residual sum: SkipLayerNormalization and
SkipSimplifiedLayerNormalization.

Both normalize ``s = X + skip (+ bias)`` over its last dimension ``H``:

- ``SkipLayerNormalization``: ``(s - mean(s)) / sqrt(var(s) + epsilon) * gamma (+ beta)``;
- ``SkipSimplifiedLayerNormalization``: ``s / sqrt(mean(s^2) + epsilon) * gamma`` (RMSNorm).

``X`` is 2-D or 3-D for ONNX Runtime (the rows are merged by a Reshape); ``skip`` has ``X``'s shape
or lacks its leading rows (``[S, H]`` for ``X`` of ``[B, S, H]``); ``gamma``, ``beta`` and ``bias``
are vectors of ``H``.

A scope matches when it reads an inline element-wise scope ``S = X[..] + skip[..] (+ bias[h])``
of its own shape, through inline scopes only (the mean, the centred values, the variance: the
chain every exporter and importer writes in its own way), and besides ``S`` reads only vectors over
its last dimension (``gamma``, ``beta``) and constants (``epsilon`` among them). Which of them is
which, and that the whole is the operator's function, is decided by evaluating the scope with the
reference interpreter on random inputs and comparing with the operator's formula for every
assignment (float64, relative ``RTOL``: an epsilon of 1e-5 against 1e-6 moves the output by 1e-6).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from einopt.core import ir
from einopt.core.interp import evaluate, sample_box
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    LayoutStep,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    apply_steps,
)
from einopt.instantiate.views import View, arranged, finish, simple_view

__all__ = ["NORM_MATCHERS", "RTOL", "match_skip_layer_norm", "match_skip_simplified_layer_norm"]

RTOL = 1e-7
"""How closely the scope must agree with the operator's formula on random inputs (float64)."""

_MAX_EPSILON = 0.1  # constants of the chain tried as epsilon lie in (0, this)


@dataclasses.dataclass(frozen=True, eq=False)
class _SkipNorm:
    """A scope read as a normalization of ``total = x + skip (+ bias)`` (accesses in ``total``'s body;
    ``gamma`` and ``beta`` in the chain's)."""

    total: ir.Scope
    x: ir.Access
    skip: ir.Access
    bias: ir.Access | None
    gamma: ir.Access
    beta: ir.Access | None
    epsilon: float
    simplified: bool
    chain: tuple[ir.Scope, ...]  # the inline scopes the output reads, ``total`` among them


def _terms(e: ir.ValueExpr) -> list[ir.ValueExpr]:
    if isinstance(e, ir.Binary) and e.op == "+":
        return _terms(e.a) + _terms(e.b)
    return [e]


def _vector(acc: ir.Access, last: ir.Iter) -> View | None:
    """The view of ``acc`` when it reads a vector along ``last`` alone (all of its extent)."""
    view = simple_view(acc)
    return view if isinstance(view, View) and view.labels == (last,) else None


def _sum_parts(total: ir.Scope) -> tuple[ir.Access, ir.Access, ir.Access | None] | None:
    """``(x, skip, bias)`` of ``total = x + skip (+ bias)``: bias a vector over the last dimension,
    x reading every dimension of more than one element, skip the other term."""
    terms = _terms(total.body)
    if not 2 <= len(terms) <= 3 or not all(isinstance(t, ir.Access) for t in terms):
        return None
    last = total.traversal[-1]
    biases = [t for t in terms if _vector(t, last) is not None] if len(terms) == 3 else []
    rest = [t for t in terms if t not in biases]
    if len(rest) != 2 or len(biases) > 1:
        return None
    views = [simple_view(t) for t in rest]
    if any(isinstance(v, Refusal) for v in views):
        return None
    x, skip = sorted(zip(rest, views, strict=True), key=lambda tv: -len(tv[1].labels))
    full = {t for t in total.traversal if t.extent > 1}
    if not full <= set(x[1].labels) or last not in skip[1].labels:
        return None
    return x[0], skip[0], biases[0] if biases else None


def _params(
    scope: ir.Scope, chain: list[ir.Scope], total: ir.Scope
) -> tuple[list[ir.Access], list[float]] | str:
    """The vectors over the last dimension the chain reads (gamma, beta) and its small positive
    constants (epsilon), or why the chain reads something else."""
    vectors: dict[ir.Access, None] = {}
    constants: set[float] = set()
    for s in [scope, *chain]:
        if s is total:
            continue
        for e in ir.walk(s.body, stop=ir.Access):
            if isinstance(e, ir.Const) and 0.0 < e.value < _MAX_EPSILON:
                constants.add(e.value)
            if not isinstance(e, ir.Access) or e.source is total or e.source in chain:
                continue
            if not isinstance(e.source, ir.Tensor) or _vector(e, s.traversal[-1]) is None:
                return f"reads {e}: not a vector over the normalized dimension"
            vectors[e] = None
    if len({a.source for a in vectors}) != len(vectors):
        return "reads one parameter in two ways"
    return list(vectors), sorted(constants, reverse=True) or [0.0]


def _normalized(s: np.ndarray, eps: float, simplified: bool) -> np.ndarray:
    if simplified:
        return s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)
    centred = s - np.mean(s, axis=-1, keepdims=True)
    return centred / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + eps)


def _moved(box: tuple[tuple[int, int], ...], scope: ir.Scope, total: ir.Scope) -> tuple[tuple[int, int], ...]:
    """``box`` of ``scope``'s traversal as the same positions of ``total`` (of the same shape)."""
    return tuple(
        (lo - a.lo + b.lo, hi - a.lo + b.lo)
        for (lo, hi), a, b in zip(box, scope.traversal, total.traversal, strict=True)
    )


def _analyse(scope: ir.Scope) -> _SkipNorm | Refusal:
    if scope.summation:
        return Refusal("sums over iterators: not a normalization's output")
    chain = [s for s in ir.scopes_in(scope) if s is not scope]
    if not any(s.summation for s in chain):
        return Refusal("reads no reduction: not a normalization")
    totals = [s for s in chain if not s.summation and s.shape == scope.shape and _sum_parts(s) is not None]
    if not totals:
        return Refusal("reads no inline sum of an input and a skip connection of its shape")
    # What the chain reads is checked for every sum before anything is evaluated: the search asks
    # for every scope of every state, and few that read a sum read only vectors besides.
    reason = "is neither normalization of the sum over its last dimension"
    readings = []
    for total in totals:
        found = _params(scope, chain, total)
        if isinstance(found, str):
            reason = found
        elif found[0]:  # no vector to be gamma: neither operator computes it
            readings.append((total, *found))
    if not readings:
        return Refusal(reason)
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.standard_normal(t.shape) for t in ir.input_tensors(scope)}
    box = sample_box(scope)  # two rows (or batch elements): each is normalized on its own
    y = np.asarray(evaluate(scope, inputs, box=box), dtype=np.float64)
    for total, vectors, epsilons in readings:
        x, skip, bias = _sum_parts(total)
        s = np.asarray(evaluate(total, inputs, box=_moved(box, scope, total)), dtype=np.float64)
        values = {a: apply_steps(simple_view(a).steps, inputs[a.source.name]) for a in vectors}
        roles = [(g, None, True) for g in vectors] if len(vectors) == 1 else []
        roles += [(g, b, False) for g, b in itertools.permutations(vectors, 2)]
        roles += [(g, None, False) for g in vectors] if len(vectors) == 1 else []
        for (gamma, beta, simplified), eps in itertools.product(roles, epsilons):
            want = _normalized(s, eps, simplified) * values[gamma]
            if beta is not None:
                want = want + values[beta]
            if np.allclose(y, want, rtol=RTOL, atol=RTOL * float(np.max(np.abs(want)))):
                return _SkipNorm(total, x, skip, bias, gamma, beta, eps, simplified, tuple(chain))
    return Refusal(reason)


def _analysis(scope: ir.Scope) -> _SkipNorm | Refusal:
    """:func:`_analyse`, memoised on the (interned) scope: instantiation asks for every candidate."""
    return ir._cached(scope, "contrib_skip_norm", lambda: _analyse(scope))


def _layouts(found: _SkipNorm) -> tuple[tuple[LayoutStep, ...], tuple[LayoutStep, ...], list] | Refusal:
    """Steps to ONNX Runtime's layouts: X as ``[rows, H]`` with a skip of the same, or as
    ``[lead, rows, H]`` with a skip ``[rows, H]`` that does not vary along ``lead``; and X's groups."""
    its = found.total.traversal
    xv, sv = simple_view(found.x), simple_view(found.skip)
    rows = [t for t in its[:-1] if t in xv.labels]
    unread = [t for t in rows if t not in sv.labels]
    k = len(unread)
    if unread != rows[:k] or k and all(t in unread for t in rows):
        return Refusal("the skip connection varies along a dimension X does not, or lacks inner rows")
    groups = [tuple(rows[:k]), tuple(rows[k:]), (its[-1],)] if k else [tuple(rows), (its[-1],)]
    x_steps = arranged(xv, groups)
    s_steps = arranged(sv, groups[-2:])
    return x_steps, s_steps, groups


def _match(scope: ir.Scope, ctx: MatchContext, simplified: bool) -> OperatorMatch | Refusal:
    op_type = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    found = _analysis(scope)
    if isinstance(found, Refusal):
        return found
    if found.simplified != simplified:
        other = "RMS" if found.simplified else "layer"
        return Refusal(f"an {other} normalization of the sum: not {op_type}")
    bound = [s for s in found.chain if s in ctx.bound]
    if bound:
        return Refusal("a scope of the normalization is a program binding (materialised anyway)")
    layouts = _layouts(found)
    if isinstance(layouts, Refusal):
        return layouts
    x_steps, s_steps, groups = layouts
    vec = [found.gamma] + ([] if simplified else [found.beta]) + [found.bias]
    operands = [Operand(found.x.source, x_steps), Operand(found.skip.source, s_steps)]
    inputs: list[int | None] = [0, 1]
    for acc in vec:
        if acc is None:
            inputs.append(None)
            continue
        inputs.append(len(operands))
        operands.append(Operand(acc.source, simple_view(acc).steps))
    while inputs[-1] is None:
        inputs.pop()
    shape = tuple(math.prod(t.extent for t in g) for g in groups)
    op = OpNode(op_type, tuple(inputs), (("epsilon", float(found.epsilon)),), CONTRIB_DOMAIN, shape)
    post = finish(groups, found.total.traversal)
    return OperatorMatch(f"{CONTRIB_DOMAIN}.{op_type}", tuple(operands), (op,), post, found.chain)


def match_skip_layer_norm(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """LayerNormalization over the last dimension of an inline ``X + skip (+ bias)``, as com.microsoft
    ``SkipLayerNormalization`` (consuming the chain's inline scopes)."""
    return _match(scope, ctx, simplified=False)


def match_skip_simplified_layer_norm(
    scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT
) -> OperatorMatch | Refusal:
    """RMS normalization over the last dimension of an inline ``X + skip (+ bias)``, as com.microsoft
    ``SkipSimplifiedLayerNormalization``."""
    return _match(scope, ctx, simplified=True)


NORM_MATCHERS = {
    "SkipLayerNormalization": match_skip_layer_norm,
    "SkipSimplifiedLayerNormalization": match_skip_simplified_layer_norm,
}
"""The normalization matchers, in the order the table tries them."""

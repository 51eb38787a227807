"""The com.microsoft matchers stay cheap where the search calls them (every scope of every state).

They refuse by structure before enumerating or evaluating, and compute their analyses once per
(interned) scope; these tests check that they do, and that the short cuts accept exactly what the
plain enumeration and evaluation accept.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import einopt
from einopt.core import ir
from einopt.instantiate import match_contrib, views
from einopt.instantiate.match_contraction import _batch_groups, _contraction, _product_groups, match_matmul
from einopt.instantiate.match_contrib import (
    _SAVING,
    _fused_layout,
    _gemm_calls,
    _standard_layout_cost,
    match_fused_matmul,
)
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Scale,
    layout_cost,
    normalize,
    steps_cost,
)
from einopt.instantiate.views import arrange, finish

PLAIN = "L[b:3, m:4, n:5] Sum[k:6] A[b, m, k] * B[b, k, n] where A:[3,4,6], B:[3,6,5]"
SCORES = "L[h:2, i:5, j:5] Sum[d:4] 0.5 * Q[i, h*4+d] * K[j, h*4+d] where Q:[5,8], K:[5,8]"


# --------------------------------------------------------------------------
# FusedMatMul
# --------------------------------------------------------------------------


def _enumerated_fused_matmul(scope: ir.Scope, ctx: MatchContext) -> OperatorMatch | Refusal:
    """FusedMatMul by the plain enumeration: every correspondence and flag, one candidate each, then
    the standard operators (the specification the memoised matcher must agree with)."""
    c = _contraction(scope)
    if isinstance(c, Refusal) or len(c.views) != 2:
        return Refusal("not a product of two accesses")
    best = None
    for va, vb in ((c.views[0], c.views[1]), (c.views[1], c.views[0])):
        gs = _product_groups(c, va, vb, allow_batch=True)
        if isinstance(gs, Refusal):
            continue
        for g in gs:
            for flags in itertools.product((0, 1), repeat=4):
                ta, tb, ba, bb = flags
                if (ba or bb) and not g.batch:
                    continue
                if ba or bb:
                    a_batch = [(t,) if t in va.labels else () for t in g.batch]
                    b_batch = [(t,) if t in vb.labels else () for t in g.batch]
                else:
                    a_batch, b_batch = _batch_groups(g.batch, va.labels), _batch_groups(g.batch, vb.labels)
                a_groups = _fused_layout([*a_batch, g.m, g.k], bool(ta), bool(ba))
                b_groups = _fused_layout([*b_batch, g.k, g.n], bool(tb), bool(bb))
                a = normalize(va.steps + arrange(va.labels, va.shape, a_groups), tuple(va.source.shape))
                b = normalize(vb.steps + arrange(vb.labels, vb.shape, b_groups), tuple(vb.source.shape))
                post = finish([(t,) for t in g.batch] + [g.m, g.n], c.traversal)
                cost = (
                    steps_cost(a, ctx.is_constant(va.source))
                    + steps_cost(b, ctx.is_constant(vb.source))
                    + steps_cost(post, False)
                    + 0.001 * sum(flags)
                )
                shape = tuple(t.extent for t in g.batch) + (
                    math.prod(t.extent for t in g.m),
                    math.prod(t.extent for t in g.n),
                )
                attrs = (("alpha", float(c.scale)), ("transA", ta), ("transB", tb))
                attrs += (("transBatchA", ba), ("transBatchB", bb))
                op = OpNode("FusedMatMul", (0, 1), attrs, CONTRIB_DOMAIN, shape)
                m = OperatorMatch(
                    f"{CONTRIB_DOMAIN}.FusedMatMul",
                    (Operand(va.source, a), Operand(vb.source, b)),
                    (op,),
                    post,
                )
                rank = (cost, _gemm_calls(m))
                if best is None or rank < best[0]:
                    best = (rank, m)
    if best is None:
        return Refusal("no correspondence")
    (cost, calls), m = best
    standard = _standard_layout_cost(scope, ctx, calls)
    return Refusal("standard") if standard is not None and cost > standard - _SAVING else m


def _random_product(rng: np.random.Generator) -> ir.Scope:
    b, h = ir.Iter("b", 0, 2), ir.Iter("h", 0, 3)
    m, n, k = ir.Iter("m", 0, 4), ir.Iter("n", 0, 5), ir.Iter("k", 0, 6)
    a_dims = [[b, h, m, k], [h, m, k], [m, k], [b, m, k]][rng.integers(4)]
    b_dims = [[b, h, k, n], [k, n], [h, k, n]][rng.integers(3)]
    a_dims = [a_dims[i] for i in rng.permutation(len(a_dims))]
    b_dims = [b_dims[i] for i in rng.permutation(len(b_dims))]
    read = set(a_dims) | set(b_dims)
    out = [t for t in (b, h, m, n) if t in read]
    out = [out[i] for i in rng.permutation(len(out))]
    A = ir.Tensor("A", tuple(d.extent for d in a_dims))
    B = ir.Tensor("B", tuple(d.extent for d in b_dims))
    body = A[tuple(a_dims)] * B[tuple(b_dims)]
    if rng.random() < 0.5:
        body = body * 0.125
    return ir.Scope(tuple(out), (k,), body)


def _same(a: OperatorMatch | Refusal, b: OperatorMatch | Refusal) -> bool:
    if isinstance(a, Refusal) or isinstance(b, Refusal):
        return isinstance(a, Refusal) and isinstance(b, Refusal)
    operands = all(
        x.source is y.source and x.steps == y.steps for x, y in zip(a.operands, b.operands, strict=True)
    )
    return operands and (a.op_type, a.ops, a.post) == (b.op_type, b.ops, b.post)


@pytest.mark.parametrize("seed", range(40))
def test_fused_matmul_agrees_with_the_plain_enumeration(seed):
    """Random products, each operand constant or not: the memoised matcher, with MatMul's refusal
    short cut, accepts exactly what the enumeration of every flag accepts, with the same match."""
    rng = np.random.default_rng(seed)
    scope = _random_product(rng)
    tensors = list(ir.input_tensors(scope))
    for constant in itertools.product((False, True), repeat=len(tensors)):
        ctx = MatchContext(constant=frozenset(t for t, c in zip(tensors, constant, strict=True) if c))
        got, want = match_fused_matmul(scope, ctx), _enumerated_fused_matmul(scope, ctx)
        assert _same(got, want), (scope, constant, got, want)


@pytest.mark.parametrize("seed", range(20))
def test_the_matmul_fused_matmul_derives_is_match_matmul(seed):
    """The matcher computes MatMul's cost and GEMM calls from its readings (for its refusal short
    cuts): they are those of ``match_matmul``'s match."""
    rng = np.random.default_rng(seed)
    scope = _random_product(rng)
    tensors = list(ir.input_tensors(scope))
    products = match_contrib._readings(scope)
    for constant in itertools.product((False, True), repeat=len(tensors)):
        ctx = MatchContext(constant=frozenset(t for t, c in zip(tensors, constant, strict=True) if c))
        key = tuple(ctx.is_constant(v.source) for v in products.contraction.views)
        plain = match_matmul(scope, ctx)
        assert match_contrib._plain(products, key) == (layout_cost(plain, ctx), _gemm_calls(plain))


def test_fused_matmul_is_refused_by_matmul_alone(monkeypatch):
    """A product MatMul computes without layout work is refused without the other standard matchers."""

    def unused(*args):
        raise AssertionError("the standard operators were matched")

    monkeypatch.setattr(match_contrib, "_standard_layout_cost", unused)
    refused = match_fused_matmul(einopt.parse(PLAIN))
    assert isinstance(refused, Refusal) and "standard operator needs no more" in refused.reason


def test_fused_matmul_leaves_the_flags_alone_where_matmul_needs_no_layout_work(monkeypatch):
    """A product MatMul computes with Reshapes at most, and no more GEMM calls than any FusedMatMul
    would make, is refused from MatMul's readings alone: no flag's layout is computed."""

    def unused(*args):
        raise AssertionError("the flags' layouts were computed")

    monkeypatch.setattr(match_contrib, "_flagged", unused)
    for text in (  # sizes of their own: scopes no other test matched
        "L[b:3, m:4, n:7] Sum[k:6] A[b, m, k] * B[b, k, n] where A:[3,4,6], B:[3,6,7]",
        "L[m:4, n:7] Sum[k:6] 0.5 * A[m, k] * B[k, n] where A:[4,6], B:[6,7]",
    ):
        scope = einopt.parse(text)
        a = next(t for t in ir.input_tensors(scope) if t.name == "A")
        refused = match_fused_matmul(scope, MatchContext(constant=frozenset({a})))  # the scale on A
        assert isinstance(refused, Refusal) and "standard operator needs no more" in refused.reason


def test_fused_matmul_arranges_once():
    """The operands' layouts of every reading and flag are computed once: asking again, in another
    context or with other constant operands, or for another scope that reads the same operands in the
    same traversal, arranges nothing new."""
    views._arranged.cache_clear()
    text = "L[h:2, i:7, j:6] Sum[d:4] 0.5 * Q[i, h*4+d] * K[j, h*4+d] where Q:[7,8], K:[6,8]"
    scope = einopt.parse(text)
    first = match_fused_matmul(scope)
    arranged = views._arranged.cache_info().misses
    assert isinstance(first, OperatorMatch) and arranged
    q = next(t for t in ir.input_tensors(scope) if t.name == "Q")
    for ctx in (
        NO_MATCH_CONTEXT,
        MatchContext(bound=frozenset({scope})),
        MatchContext(constant=frozenset({q})),
    ):
        match_fused_matmul(scope, ctx)
    other = einopt.parse(text.replace("0.5", "0.25"))  # another scope: its readings are its own
    assert other is not scope and isinstance(match_fused_matmul(other), OperatorMatch)
    assert views._arranged.cache_info().misses == arranged


def test_matmul_match_is_kept_per_scope_and_constant_operands():
    """MatMul's answer is memoised per scope, keyed by which operands are constant: the scale
    moves to a constant A when one is given, and back on B in a context without it."""
    scope = einopt.parse("L[m:4, n:7] Sum[k:6] 0.5 * A[m, k] * B[k, n] where A:[4,6], B:[6,7]")
    a = next(t for t in ir.input_tensors(scope) if t.name == "A")

    def scaled(m: OperatorMatch) -> list[str]:
        return [o.source.name for o in m.operands if any(isinstance(st, Scale) for st in o.steps)]

    plain = match_matmul(scope)
    on_a = match_matmul(scope, MatchContext(constant=frozenset({a})))
    assert scaled(plain) == ["B"] and scaled(on_a) == ["A"]
    assert match_matmul(scope, MatchContext(bound=frozenset({scope}))) is plain
    assert match_matmul(scope, MatchContext(constant=frozenset({a}))) is on_a


# --------------------------------------------------------------------------
# SkipLayerNormalization
# --------------------------------------------------------------------------


def _unevaluated(monkeypatch, module) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("evaluated")

    monkeypatch.setattr(module, "evaluate", refused)


@pytest.mark.parametrize(
    ("variant", "reason"),
    [("scaled", "not a vector over the normalized dimension"), ("no_gamma", "neither normalization")],
)
def test_skip_norm_refuses_by_what_the_chain_reads_before_evaluating(monkeypatch, variant, reason):
    """An RMSNorm chain that reads a tensor of the output's shape, or no vector to be gamma, is
    refused without evaluating the scope."""
    from test_match_contrib_norm import rms_norm_program

    from einopt.instantiate import match_contrib_norm
    from einopt.instantiate.match_contrib_norm import match_skip_layer_norm, match_skip_simplified_layer_norm

    program, _ = rms_norm_program(count=7)  # a scope of its own (no other test matched it)
    y = program.scope("y")
    if variant == "scaled":
        body = y.body * ir.Tensor(f"z_{variant}", y.shape)[y.traversal]
    else:  # y = normed * gamma[h]: drop gamma
        body = y.body.a
    y = y.replace(body=body)
    _unevaluated(monkeypatch, match_contrib_norm)
    for matcher in (match_skip_layer_norm, match_skip_simplified_layer_norm):
        refused = matcher(y)
        assert isinstance(refused, Refusal) and reason in refused.reason, refused


# --------------------------------------------------------------------------
# MultiHeadAttention
# --------------------------------------------------------------------------


def test_attention_over_bound_scores_is_refused_before_evaluating(monkeypatch):
    """Every reading of the core would fuse the scores the program binds: refused without evaluating;
    unbound, the same core is evaluated once (asking again evaluates nothing)."""
    from test_match_contrib_attention import _core, _ctx

    from einopt.instantiate import match_contrib_attention
    from einopt.instantiate.match_contrib_attention import match_multi_head_attention

    core = _core(s=7, kv=3)  # a scope of its own (no other test matched it)
    scores = next(s for s in ir.scopes_in(core) if s.summation and s.summation[0].name == "d")
    program = ir.Program(tuple(ir.input_tensors(core)), (("S", scores), ("Y", core)), ("Y",))
    real = match_contrib_attention.evaluate
    _unevaluated(monkeypatch, match_contrib_attention)
    refused = match_multi_head_attention(core, _ctx(program))
    assert isinstance(refused, Refusal) and "program binding" in refused.reason
    calls = []
    monkeypatch.setattr(match_contrib_attention, "evaluate", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert isinstance(match_multi_head_attention(core), OperatorMatch) and calls
    calls.clear()
    assert isinstance(match_multi_head_attention(core), OperatorMatch) and not calls


# --------------------------------------------------------------------------
# QuickGelu, FastGelu, Gelu, BiasGelu
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("X[i] * X[i] * 1.703", "uses no sigmoid"),  # no function of the operator's
        ("X[i] * relu(X[i] * 1.703)", "uses relu"),  # another
        ("X[i] * sigmoid(X[i] * 1.703) + tanh(X[i])", "uses tanh"),  # one more
    ],
)
def test_quick_gelu_refuses_by_the_functions_it_uses_before_evaluating(monkeypatch, body, reason):
    from einopt.instantiate import match_contrib_act
    from einopt.instantiate.match_contrib_act import match_quick_gelu

    _unevaluated(monkeypatch, match_contrib_act)
    refused = match_quick_gelu(einopt.parse(f"L[i:9] {body} where X:[9]"))
    assert isinstance(refused, Refusal) and reason in refused.reason, refused


def test_gelu_bodies_are_evaluated_once(monkeypatch):
    """QuickGelu, FastGelu, BiasGelu and Gelu all ask for the body's values: computed once."""
    from einopt.instantiate import match_contrib_act
    from einopt.instantiate.match_contrib_act import ACTIVATION_MATCHERS

    calls = []
    real = match_contrib_act.evaluate
    monkeypatch.setattr(match_contrib_act, "evaluate", lambda *a, **k: calls.append(a) or real(*a, **k))
    scope = einopt.parse("L[i:11] X[i] * sigmoid(X[i] * 1.25) where X:[11]")
    results = [fn(scope, NO_MATCH_CONTEXT) for fn in ACTIVATION_MATCHERS.values()]
    assert isinstance(results[0], OperatorMatch) and not any(
        isinstance(r, OperatorMatch) for r in results[1:]
    )
    n = len(calls)
    assert n == 3  # float64 and float32 values, the sigmoid's argument at 1
    for fn in ACTIVATION_MATCHERS.values():
        fn(scope, NO_MATCH_CONTEXT)
    assert len(calls) == n + 1  # QuickGelu's alpha again, nothing else

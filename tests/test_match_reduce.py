"""Reductions and normalizations come back as the operator they were imported from.

Each one-node model is translated, instantiated with its original operator preferred (as the
pipeline does at depth 0), assembled and run in ONNX Runtime against the original: the emitted
operator must be the original one and its output the original's. The matchers are also checked
without the preference (LayerNormalization and AveragePool are taken from the table), on
element-wise steps fused together (as the search leaves them), below the opsets the operators
need, and on near misses, which must be refused with the reason.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import shared_models
from onnx import TensorProto, helper
from reduce_cases import AVERAGE_POOLS, LAYER_NORMS, REDUCTIONS, i64, ln, pool, translate_nodes
from round_trips import depth0, op_counts, round_trip
from shared_models import needs_shared
from test_importers import Case, build, run_ort

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.rewrite import transform
from einopt.frontend.fold import prepare
from einopt.frontend.importers import translate_single_node
from einopt.instantiate.emit import instantiate
from einopt.instantiate.match import MATCHERS, PREFERRED
from einopt.instantiate.match_reduce import (
    REDUCE_MATCHERS,
    REDUCE_PREFERRED,
    _Inliner,
    match_average_pool,
    match_global_average_pool,
    match_layer_norm,
    match_reduce_mean,
)
from einopt.instantiate.plan import NO_MATCH_CONTEXT, MatchContext, OperatorMatch, Refusal

F32 = np.float32


def _one(op: str):
    return collections.Counter({op: 1})


# --------------------------------------------------------------------------
# Round trips: the original operator comes back, with the original's output
# --------------------------------------------------------------------------

# What does not come back as itself: a ReduceSum that keeps its axes is a ReduceSum and a Reshape,
# a reduction over no axis is its element-wise body.
NOT_ROUND_TRIPPED = frozenset(
    {
        "sum-opset13-input",
        "sum-opset11-attr",
        "sum-all-axes-absent",
        "sum-empty-axes",
        "sum-noop",
        "mean-opset18-noop",
        "sumsquare-noop",
        "l2-noop",
    }
)
ROUND_TRIPS = [
    Case("sum-opset13-drop", "ReduceSum", [("x", (2, 3, 4)), ("a", i64(-1, 0))], {"keepdims": 0}, opset=13),
    Case("mean-opset18-drop", "ReduceMean", [("x", (2, 3, 4)), ("a", i64(-2, 0))], {"keepdims": 0}, opset=18),
    *(c for c in REDUCTIONS + AVERAGE_POOLS + LAYER_NORMS if c.id not in NOT_ROUND_TRIPPED),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c.op}-{c.id}") for c in ROUND_TRIPS])
def test_round_trip_is_the_original_operator(case: Case) -> None:
    assert round_trip(case) == _one(case.op)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=f"{c.op}-{c.id}")
        for c in ROUND_TRIPS
        if c.op in ("LayerNormalization", "AveragePool", "GlobalAveragePool", "ReduceL2")
        and c.id != "2d-kernel-1"
    ],
)
def test_table_choice_without_preference(case: Case) -> None:
    """Without the original operator preferred, the table still finds these (the reduce matchers
    come before ReduceSum, so a mean is not taken as ReduceSum then Mul)."""
    assert round_trip(case, prefer=False, rtol=1e-5) == _one(case.op)


def test_layer_norm_below_opset_17_is_its_steps() -> None:
    """At opset 16 there is no LayerNormalization: the chain comes back as its element-wise steps."""
    program, arrays = translate_single_node(build(ln("ln", (2, 3, 8)))[0])
    (name,) = program.outputs
    scope = program.scope(name)
    ctx = MatchContext(bound=frozenset({scope}), opset=16)
    r = match_layer_norm(scope, ctx)
    assert isinstance(r, Refusal) and "needs opset 17" in r.reason
    inst = instantiate(
        program,
        onnx_names={t.name: t.name for t in program.inputs} | {name: "y"},
        constants={},
        opset=16,
        prefix="p/",
        preferred={name: "LayerNormalization"},
    )
    assert "LayerNormalization" not in op_counts(inst.nodes)
    assert {"Sqrt", "Div", "Sub"} <= set(op_counts(inst.nodes))


# --------------------------------------------------------------------------
# LayerNormalization: fused steps, bound pieces, near misses
# --------------------------------------------------------------------------


def _ln_scope(case: Case) -> tuple[ir.Program, ir.Scope]:
    program, _ = translate_single_node(build(case)[0])
    return program, program.scope(program.outputs[0])


def test_layer_norm_matches_with_its_element_wise_steps_fused() -> None:
    """The search fuses element-wise scopes into their readers: the match sees through that."""
    _, scope = _ln_scope(ln("ln", (2, 3, 8)))
    fused = _Inliner(NO_MATCH_CONTEXT).scope(scope)
    assert fused is not scope and len(ir.scopes_in(fused)) < len(ir.scopes_in(scope))
    m = match_layer_norm(fused, NO_MATCH_CONTEXT)
    assert isinstance(m, OperatorMatch) and m.op_type == "LayerNormalization"
    assert m.attrs == {"axis": 2, "epsilon": pytest.approx(1e-5)}
    assert set(m.consumes) == set(ir.scopes_in(fused)) - {fused}
    eps = _rebuild(fused, lambda x: ir.Const(1e-3) if x is ir.Const(float(F32(1e-5))) else None)
    assert match_layer_norm(eps, NO_MATCH_CONTEXT).attrs["epsilon"] == 1e-3


def test_layer_norm_consumes_its_inline_scopes_and_recomputes_a_bound_mean() -> None:
    """Every inline scope is consumed. A mean that is a program binding is computed anyway, and the
    operator computes it again (cheap next to the chain); a bound step of the chain is refused."""
    program, scope = _ln_scope(ln("ln", (2, 3, 8)))
    m = match_layer_norm(scope, NO_MATCH_CONTEXT)
    assert isinstance(m, OperatorMatch)
    assert set(m.consumes) == set(ir.scopes_in(scope)) - {scope}
    mean = next(s for s in ir.scopes_in(scope) if s.summation and not ir.scopes_in(s.body)[:-1])
    m = match_layer_norm(scope, MatchContext(bound=frozenset({scope, mean})))
    assert isinstance(m, OperatorMatch) and mean not in m.consumes
    centred = next(s for s in ir.scopes_in(scope) if not s.summation and mean in ir.scopes_in(s.body))
    r = match_layer_norm(scope, MatchContext(bound=frozenset({scope, centred})))
    assert isinstance(r, Refusal)


def test_layer_norm_of_a_binding() -> None:
    """X computed in the same program (a Transpose, bound or inline) is the operator's input."""
    model = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                helper.make_node("LayerNormalization", ["t", "s", "b"], ["y"], axis=-1),
            ],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 3]),
                helper.make_tensor_value_info("s", TensorProto.FLOAT, [8]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, [8]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    program = translate_nodes(model)
    y = program.scope("y")
    (t,) = (s for s in ir.scopes_in(y) if isinstance(s.body, ir.Access) and s.body.source.name == "x")
    m = match_layer_norm(y, MatchContext(bound=frozenset({t, y}), opset=17))
    assert isinstance(m, OperatorMatch) and m.operands[0].source is t and t not in m.consumes
    m = match_layer_norm(y, MatchContext(bound=frozenset({y}), opset=17))
    assert isinstance(m, OperatorMatch) and m.operands[0].source is t, "inline: materialised as its input"


def _rebuild(scope: ir.Scope, change) -> ir.Scope:
    """``scope`` with ``change`` applied to every value node of it and of the scopes it reads."""
    memo: dict[ir.Scope, ir.Scope] = {}

    def sc(s: ir.Scope) -> ir.Scope:
        if s not in memo:
            memo[s] = s.replace(body=transform(s.body, visit))
        return memo[s]

    def visit(x):
        if isinstance(x, ir.Access) and isinstance(x.source, ir.Scope):
            return ir.Access(sc(x.source), x.indices)
        return change(x)

    return sc(scope)


@pytest.mark.parametrize(
    "what, change",
    [
        ("a mean over N - 1", lambda x: ir.Const(1 / 7) if x is ir.Const(1 / 8) else None),
        (
            "the bias before the scale",
            lambda x: (
                ir.Binary("*", ir.Binary("+", x.a.a, x.b), x.a.b)
                if isinstance(x, ir.Binary) and x.op == "+" and isinstance(x.a, ir.Binary) and x.a.op == "*"
                else None
            ),
        ),
        (
            "epsilon outside the root",
            lambda x: (
                ir.Binary("+", ir.Unary("sqrt", x.x.a), x.x.b)
                if isinstance(x, ir.Unary) and x.fn == "sqrt"
                else None
            ),
        ),
        ("no square", lambda x: x.a if isinstance(x, ir.Binary) and x.op == "*" and x.a is x.b else None),
    ],
)
def test_layer_norm_near_misses_are_refused(what: str, change) -> None:
    _, scope = _ln_scope(ln("ln", (2, 3, 8)))
    fused = _Inliner(NO_MATCH_CONTEXT).scope(scope)
    other = _rebuild(fused, change)
    assert other is not fused, what
    assert isinstance(match_layer_norm(other, NO_MATCH_CONTEXT), Refusal), what


# --------------------------------------------------------------------------
# Reductions and pooling: near misses, views
# --------------------------------------------------------------------------


def test_reduce_mean_refuses_a_scaled_sum_and_reads_views() -> None:
    x = ir.Tensor("x", (4, 3))
    i, k = ir.Iter("i", 0, 3), ir.Iter("k", 0, 4)
    r = match_reduce_mean(ir.Scope((i,), (k,), x[k, i] * 0.5), NO_MATCH_CONTEXT)
    assert isinstance(r, Refusal) and "not 1/4" in r.reason
    m = match_reduce_mean(ir.Scope((i,), (k,), x[k, i] * 0.25), MatchContext(opset=13))
    assert isinstance(m, OperatorMatch) and m.attrs == {"axes": (0,), "keepdims": 0}
    m = match_reduce_mean(ir.Scope((i,), (k,), x[k, i] * 0.25), MatchContext(opset=18))
    assert m.attrs == {"keepdims": 0} and list(m.operands[1].source.value) == [0]


def test_global_average_pool_needs_every_trailing_dimension() -> None:
    x = ir.Tensor("x", (2, 3, 4, 5))
    n, c, h, u = ir.Iter("n", 0, 2), ir.Iter("c", 0, 3), ir.Iter("h", 0, 4), ir.Iter("u", 0, 1)
    w = ir.Iter("w", 0, 5)
    r = match_global_average_pool(ir.Scope((n, c, h, u), (w,), x[n, c, h, w] * 0.2), NO_MATCH_CONTEXT)
    assert isinstance(r, Refusal) and "every dimension after the first two" in r.reason


def _pool_scope(case: Case) -> ir.Scope:
    program, _ = translate_single_node(build(case)[0])
    return program.scope(program.outputs[0])


def test_average_pool_window_sum_is_a_scaled_pool() -> None:
    """A plain window sum (no divisor) is AveragePool times the kernel size."""
    scope = _pool_scope(pool("p", (1, 2, 6, 5), kernel_shape=[3, 3], strides=[2, 2]))
    total = scope.replace(body=scope.body.a)
    m = match_average_pool(total, NO_MATCH_CONTEXT)
    assert isinstance(m, OperatorMatch) and m.post[0].factor == 9.0
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 5))
    assert np.allclose(evaluate(total, {"x": x}), 9 * evaluate(scope, {"x": x}))


def test_average_pool_refusals() -> None:
    scope = _pool_scope(pool("p", (1, 2, 6, 5), kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    cnt = scope.body.b.source
    r = match_average_pool(scope, MatchContext(bound=frozenset({cnt})))
    assert isinstance(r, Refusal) and "program binding" in r.reason
    other = scope.replace(body=ir.Binary("/", scope.body.a, ir.Access(cnt, tuple(scope.traversal[2:]))))
    wrong = other.replace(
        body=ir.Binary(
            "/", scope.body.a, ir.Access(cnt.replace(body=ir.Const(2.0)), tuple(scope.traversal[2:]))
        )
    )
    r = match_average_pool(wrong, NO_MATCH_CONTEXT)
    assert isinstance(r, Refusal) and "not the windows' count" in r.reason
    dilated = _pool_scope(pool("d", (1, 2, 9, 8), kernel_shape=[2, 2], dilations=[2, 3]))
    r = match_average_pool(dilated, MatchContext(opset=18))
    assert isinstance(r, Refusal) and "dilations needs opset 19" in r.reason


def test_registry() -> None:
    assert set(REDUCE_MATCHERS) <= set(MATCHERS)
    assert all(PREFERRED[op] is fn for op, fn in REDUCE_PREFERRED.items())
    assert set(REDUCE_PREFERRED) >= {"ReduceMean", "GlobalAveragePool", "AveragePool", "LayerNormalization"}


# --------------------------------------------------------------------------
# The shared models at depth 0
# --------------------------------------------------------------------------

_OURS = frozenset(REDUCE_MATCHERS)


@needs_shared
@pytest.mark.parametrize("name", shared_models.names())
def test_shared_models_keep_these_operators_at_depth_0(name: str) -> None:
    """Every ReduceMean, GlobalAveragePool and LayerNormalization of a shared model comes back as
    itself, and the model computes what it did."""
    model = onnx.load(shared_models.path(name))
    before = collections.Counter(n.op_type for n in model.graph.node if n.op_type in _OURS)
    if not before:
        pytest.skip(f"{name} has none of {sorted(_OURS)}")
    feeds, _ = shared_models.data(name)
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    feeds = dict(zip(names, (feeds[f"x{k}"] for k in range(len(names))), strict=True))
    pinned = prepare(model, {k: v.shape for k, v in feeds.items()}).model
    again, ops = depth0(pinned)
    assert {op: ops[op] for op in before} == dict(before)
    want = run_ort(pinned, feeds)
    got = run_ort(again, feeds)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.max(np.abs(w)))))

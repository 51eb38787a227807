"""Reductions by sum and normalizations, imported as ONNX Runtime computes them.

One-node models (ReduceSum, ReduceMean, ReduceSumSquare, ReduceL2, GlobalAveragePool,
AveragePool, LayerNormalization) are checked against ONNX Runtime with the reference
interpreter over every attribute (negative axes, keepdims, opset 13 vs 18 axes, pads,
strides, dilations, ceil_mode, count_include_pad, auto_pad), plus the ONNX backend node
cases of these operators. LayerNormalization is checked at float32 where the mean is
large and the variance tiny, its decomposed exporter form must translate to the same
canonical key, and the shared real models must no longer pass these nodes through for
want of an importer.
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import onnx
import pytest
import shared_models
from onnx import TensorProto, helper, numpy_helper
from reduce_cases import (
    AVERAGE_POOLS,
    LAYER_NORMS,
    REDUCTIONS,
    by_id,
    i64,
    ln,
    ln_model,
    pool,
    translate_nodes,
    vec,
)
from shared_models import needs_shared
from test_importers import Case, Typed, build, cases, check, refusal, run_ort

from einopt.core import ir, keys
from einopt.core.interp import evaluate
from einopt.frontend.fold import prepare
from einopt.frontend.importers import IMPORTERS, translate_single_node
from einopt.frontend.importers_reduce import (
    NONLINEAR,
    REDUCE_IMPORTERS,
    average_pool,
    layer_norm,
)
from einopt.frontend.operand import Operand, Unsupported, node_attrs
from einopt.frontend.partition import ACTIVATIONS
from einopt.frontend.pooling import PoolGeometry
from einopt.frontend.translate import translate_graph
from einopt.rules import NO_CONTEXT, REGISTRY, check_equivalent
from einopt.search import DEFAULT_SCHEDULE
from einopt.search.normal import normalize

F32 = np.float32


# --------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------


@cases(*REDUCTIONS)
def test_reductions(case: Case) -> None:
    check(case)


def test_reduce_mean_form() -> None:
    """A mean is the sum times 1/N, summed over the reduced axes, the kept ones unread at extent 1."""
    program = check(Case("mean-form", "ReduceMean", [("x", (2, 3, 4))], {"axes": [1, 2]}, opset=13))
    s = program.scope("y0")
    assert [it.extent for it in s.traversal] == [2, 1, 1]
    assert sorted(it.extent for it in s.summation) == [3, 4]
    assert isinstance(s.body, ir.Binary) and s.body.op == "*" and s.body.b is ir.Const(1 / 12)


def test_global_average_pool_is_the_spatial_reduce_mean() -> None:
    """GlobalAveragePool and ReduceMean over the spatial axes with keepdims translate to one key."""
    gap, _ = build(Case("gap", "GlobalAveragePool", [("x", (2, 3, 5, 4))]))
    mean, _ = build(Case("gap", "ReduceMean", [("x", (2, 3, 5, 4))], {"axes": [2, -1]}, opset=13))
    assert keys.key(translate_single_node(gap)[0]) == keys.key(translate_single_node(mean)[0])


# --------------------------------------------------------------------------
# AveragePool
# --------------------------------------------------------------------------


@cases(*AVERAGE_POOLS)
def test_average_pool(case: Case) -> None:
    check(case)


def test_average_pool_divisor_forms() -> None:
    """Every window divides by the kernel size: a constant; otherwise a count scope of constant scopes."""
    inner = check(pool("inner", (1, 2, 6, 5), kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1))
    body = inner.scope("y0").body
    assert isinstance(body, ir.Binary) and body.op == "*" and body.b is ir.Const(1 / 9)
    border = check(pool("border", (1, 2, 6, 5), kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    body = border.scope("y0").body
    assert isinstance(body, ir.Binary) and body.op == "/" and isinstance(body.b.source, ir.Scope)
    assert not ir.input_tensors(body.b.source), "the count reads no tensor: folded when emitted"


def test_average_pool_refuses_a_window_over_padding_only() -> None:
    g = PoolGeometry(kernel=(2,), strides=(1,), dilations=(4,), pads_begin=(1,), pads_end=(3,), out=(1,))
    x = Operand("x", ir.Tensor("x", (1, 1, 1)), (1, 1, 1), TensorProto.FLOAT)
    with pytest.raises(Unsupported, match="over padding only"):
        average_pool(x, g, include_pad=False)
    assert average_pool(x, g, include_pad=True).shape == (1, 1, 1)


# --------------------------------------------------------------------------
# LayerNormalization
# --------------------------------------------------------------------------


@cases(*LAYER_NORMS)
def test_layer_normalization(case: Case) -> None:
    check(case)


def test_layer_normalization_default_epsilon_is_float32() -> None:
    """Without the attribute, epsilon is the schema's float32 default, as ONNX Runtime reads it."""
    program = check(ln("no-epsilon", (2, 3, 4)))
    consts = {e for s in ir.scopes_in(program) for e in ir.walk(s.body) if isinstance(e, ir.Const)}
    assert ir.Const(float(F32(1e-5))) in consts and ir.Const(1e-5) not in consts


@pytest.mark.parametrize(
    "case, reason",
    [
        refusal(Case("mean-all-keep0", "ReduceMean", [("x", (2, 3))], {"keepdims": 0}, opset=13), "rank 0"),
        refusal(
            Case("sum-axes-data", "ReduceSum", [("x", (2, 3)), ("a", Typed((1,), TensorProto.INT64))]),
            "is not a constant",
        ),
        refusal(Case("sum-axis-range", "ReduceSum", [("x", (2, 3)), ("a", i64(2))]), "out of range"),
        refusal(Case("sum-axis-twice", "ReduceSum", [("x", (2, 3)), ("a", i64(1, -1))]), "repeats an axis"),
        refusal(
            Case("ln-training", "LayerNormalization", [("x", (2, 3)), ("s", (3,))], outputs=2),
            "Mean/InvStdDev outputs",
        ),
        refusal(
            Case("ln-stash", "LayerNormalization", [("x", (2, 3)), ("s", (3,))], {"stash_type": 0}),
            "stash_type=0",
        ),
        refusal(
            Case("ln-scale-shape", "LayerNormalization", [("x", (2, 3)), ("s", (2, 3))], {"axis": -1}),
            "Scale of shape [2, 3]",
        ),
        refusal(Case("pool-no-kernel", "AveragePool", [("x", (1, 1, 4, 4))]), "without kernel_shape"),
        refusal(
            Case(
                "pool-same-dilated",
                "AveragePool",
                [("x", (1, 1, 6, 6))],
                {"kernel_shape": [2, 2], "dilations": [2, 2], "auto_pad": "SAME_UPPER"},
                opset=19,
            ),
            "auto_pad SAME_UPPER with dilations",
        ),
        refusal(Case("gap-rank2", "GlobalAveragePool", [("x", (2, 3))]), "needs N, C, spatial"),
    ],
)
def test_refused(case: Case, reason: str) -> None:
    model, _ = build(case)
    with pytest.raises(Unsupported, match=re.escape(reason)):
        translate_single_node(model)


@pytest.mark.parametrize(
    ("mean", "std", "width"), [(0.0, 1.0, 64), (100.0, 0.01, 64), (1e3, 1e-3, 256), (4e4, 1.0, 4)]
)
def test_layer_normalization_at_float32_with_large_means(mean: float, std: float, width: int) -> None:
    """The imported form in float32 agrees with ONNX Runtime where ``E[x^2] - E[x]^2`` cancels.

    ONNX Runtime 1.32 centres before squaring (a two-pass variance), as the form does; the one-pass
    formula loses every digit of a variance this small (and goes negative: NaN).
    """
    shape, eps = (8, width), 1e-5
    rng = np.random.default_rng(int(mean) + width)
    x = (mean + std * rng.standard_normal(shape)).astype(F32)
    s, b = rng.standard_normal(width).astype(F32), rng.standard_normal(width).astype(F32)
    model = ln_model(shape, -1, eps)
    (want,) = run_ort(model, {"x": x, "s": s, "b": b})
    program, _ = translate_single_node(model)
    got = evaluate(program, {"x": x, "s": s, "b": b}, mode="float32")["y"]
    exact = evaluate(program, {"x": x, "s": s, "b": b}, mode="float64")["y"]
    # The float32 input alone fixes x - mean to |mean| * 2^-24 absolute: what any float32 kernel can do.
    bound = 8 * 2.0**-24 * (mean / std + 1) * float(np.max(np.abs(s))) + 1e-5 * float(np.max(np.abs(exact)))
    assert np.max(np.abs(want - exact)) <= bound, "ONNX Runtime is as exact as float32 allows"
    assert np.max(np.abs(got - exact)) <= bound, "so is the form, evaluated in float32"
    if std / max(mean, 1.0) < 1e-4:
        one_pass = (x * x).mean(-1, keepdims=True, dtype=F32) - x.mean(-1, keepdims=True, dtype=F32) ** 2
        true_var = x.astype(np.float64).var(-1, keepdims=True)
        assert np.max(np.abs(one_pass - true_var)) > 10 * np.max(true_var), "the one-pass variance cancels"


def test_layer_normalization_backend_cases_through_the_form() -> None:
    """ONNX's LayerNormalization cases (all with Mean and InvStdDev, refused by the importer) through
    the form itself: every axis, epsilon and rank; all three outputs."""
    importlib.import_module("onnx.backend.test.case.node.layernormalization")
    from onnx.backend.test.case import node as node_cases

    found = [
        c
        for c in node_cases._NodeTestCases
        if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type == "LayerNormalization"
    ]
    seen = 0
    for c in found:
        inputs, outputs = c.data_sets[0]
        if np.asarray(inputs[0]).dtype != F32:
            continue
        node = c.model.graph.node[0]
        attrs = node_attrs(node)
        x, s, b = (np.asarray(a) for a in inputs)
        ops = [
            Operand(n, ir.Tensor(n, a.shape), a.shape, TensorProto.FLOAT)
            for n, a in zip("xsb", (x, s, b), strict=True)
        ]
        axis = attrs.get("axis", -1) % x.ndim
        ln = layer_norm(ops[0], axis, float(attrs.get("epsilon", 1e-5)), ops[1], ops[2])
        program = ir.Program(
            tuple(op.expr for op in ops),
            (("m", ln.mean), ("r", ln.inv_std_dev), ("y", ln.y)),
            ("y", "m", "r"),
        )
        got = evaluate(program, {"x": x, "s": s, "b": b})
        for name, want in zip(("y", "m", "r"), outputs, strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{c.name} {name}")
        seen += 1
    assert seen >= 18


# --------------------------------------------------------------------------
# The decomposed form: one canonical key with the operator
# --------------------------------------------------------------------------


def _decomposed_ln(shape, eps: float, square: str) -> onnx.ModelProto:
    """LayerNormalization as torch's exporters write it below opset 17 (x - mean, squared, ...)."""
    inner = [shape[-1]]
    two = numpy_helper.from_array(np.array(2.0, F32), "two")
    epsilon = numpy_helper.from_array(np.array(eps, F32), "eps")
    axes = numpy_helper.from_array(i64(-1), "axes")
    squared = (
        helper.make_node("Pow", ["d", "two"], ["dd"])
        if square == "pow"
        else helper.make_node("Mul", ["d", "d"], ["dd"])
    )
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        squared,
        helper.make_node("ReduceMean", ["dd", "axes"], ["v"], keepdims=1),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "s"], ["ns"]),
        helper.make_node("Add", ["ns", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ln_decomposed",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, inner),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, inner),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[two, epsilon, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize("square", ["mul", "pow"])
def test_decomposed_layer_norm_has_the_operators_key(square: str) -> None:
    if square == "pow" and "Pow" not in IMPORTERS:
        pytest.skip("no Pow importer yet (its constant-exponent form is added in importers_elementwise)")
    shape, eps = (2, 5, 8), float(F32(1e-5))
    decomposed = _decomposed_ln(shape, eps, square)
    fused = ln_model(shape, -1, eps)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal(shape).astype(F32), "s": vec(8, 4), "b": vec(8, 5)}
    np.testing.assert_allclose(run_ort(decomposed, feeds)[0], run_ort(fused, feeds)[0], rtol=1e-5, atol=1e-5)
    a, b = translate_nodes(decomposed), translate_single_node(fused)[0]
    a, b = normalize(a, NO_CONTEXT, DEFAULT_SCHEDULE), normalize(b, NO_CONTEXT, DEFAULT_SCHEDULE)
    assert keys.canonical_form(a) == keys.canonical_form(b)
    assert keys.key(a) == keys.key(b)


# --------------------------------------------------------------------------
# The derivation rules on these programs
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        ln("ln", (2, 3, 4)),
        by_id(LAYER_NORMS, "axis-1"),
        by_id(AVERAGE_POOLS, "2d-pads-exclude"),
        by_id(AVERAGE_POOLS, "2d-ceil-include"),
        by_id(REDUCTIONS, "l2-opset13"),
        by_id(REDUCTIONS, "mean-opset13-attr"),
    ],
    ids=lambda c: c.id,
)
def test_every_rule_keeps_the_values_of_these_programs(case: Case) -> None:
    """Sums divided by, or read under a root by, what follows; a count over a scope of ones: every
    match of every rule (and the normal form after it) computes what the imported program does.
    (A breadth-first walk of every rule, two applications deep, found no wrong program either.)"""
    program, _ = translate_single_node(build(case)[0])
    applied = 0
    for rule in REGISTRY.values():
        for m in rule.matches(program, NO_CONTEXT):
            after = rule.apply(program, m, NO_CONTEXT)
            check_equivalent(program, after, NO_CONTEXT)
            check_equivalent(program, normalize(after, NO_CONTEXT, DEFAULT_SCHEDULE), NO_CONTEXT)
            applied += 1
    assert applied >= 5


# --------------------------------------------------------------------------
# Registry and the shared models
# --------------------------------------------------------------------------


def test_registry() -> None:
    assert set(REDUCE_IMPORTERS) <= set(IMPORTERS)
    assert NONLINEAR <= set(REDUCE_IMPORTERS) and NONLINEAR <= ACTIVATIONS
    assert {"ReduceSum", "ReduceMean", "AveragePool", "GlobalAveragePool"}.isdisjoint(ACTIVATIONS)


_SHARED_OPS = frozenset(REDUCE_IMPORTERS)


@needs_shared
@pytest.mark.parametrize("name", shared_models.names())
def test_shared_models_translate_these_nodes(name: str) -> None:
    """No ReduceMean, GlobalAveragePool, LayerNormalization, ... of a shared model passes through
    for want of an importer; the ones translated on their own agree with ONNX Runtime."""
    model = onnx.load(shared_models.path(name))
    xs, _ = shared_models.data(name)
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    model = prepare(
        model, dict(zip(names, (xs[f"x{k}"].shape for k in range(len(names))), strict=True))
    ).model
    parts = translate_graph(model)
    mine = {i for i, n in enumerate(model.graph.node) if n.op_type in _SHARED_OPS}
    if not mine:
        pytest.skip(f"{name} has none of {sorted(_SHARED_OPS)}")
    for p in parts:
        if mine & set(p.nodes) and not p.translated:
            ops = sorted({model.graph.node[i].op_type for i in mine & set(p.nodes)})
            assert "no importer" not in (p.reason or ""), f"{name}: {ops}: {p.reason}"
    untranslated = [
        (model.graph.node[i].op_type, p.reason)
        for p in parts
        if not p.translated
        for i in mine & set(p.nodes)
    ]
    assert not untranslated, untranslated

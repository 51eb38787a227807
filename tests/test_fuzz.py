"""Graph fuzzing: random models through ``einopt.optimize`` without verification, compared in ONNX Runtime.

Verification rolls a wrong rewrite back, which hides translation bugs; here
it is off, so every output model must equal the original on ordinary, exact
integer and special values (0, -0, +-inf, NaN, huge, small integers), NaN
positions included. The generator is ``einopt.testing.graphs``; the long run is
``scripts/fuzz.py``. The bug tests below reproduce what earlier fuzzing found.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import einopt
from einopt.frontend.fold import prepare
from einopt.frontend.importers import IMPORTERS
from einopt.frontend.translate import translate_graph
from einopt.opsets import default_opset
from einopt.runtime import modelio
from einopt.runtime.verify import Tolerance, compare
from einopt.testing.graphs import (
    DATA_KINDS,
    OP_BUILDERS,
    GraphCase,
    RngDraw,
    _Graph,
    _unoptimized_session,
    build_graph,
    check_case,
    feeds,
    graphs,
    symbolic_case,
)
from einopt.testing.hazards import ANY_DATA, FINITE, INPUT, computed

F32 = np.float32


def test_builders_cover_every_importer() -> None:
    assert set(OP_BUILDERS) == set(IMPORTERS)


@settings(max_examples=400)
@given(graphs(), st.integers(0, 2**32 - 1))
def test_random_graphs_optimize_to_equal_models(case: GraphCase, seed: int) -> None:
    outcome = check_case(case, seed)
    assert outcome.status == "ok", f"{outcome.status} on {outcome.kind} data: {outcome.detail}"


@pytest.mark.tvm
@settings(max_examples=40, deadline=None)
@given(graphs(), st.integers(0, 2**32 - 1))
def test_random_graphs_with_generated_kernels_optimize_to_equal_models(case: GraphCase, seed: int) -> None:
    """The same with ``kernels="tvm"``: element-wise chains and eOperators as generated kernels, NaN
    and infinities included (``scripts/fuzz.py --kernels tvm`` is the long run)."""
    outcome = check_case(case, seed, kernels="tvm")
    assert outcome.status == "ok", f"{outcome.status} on {outcome.kind} data: {outcome.detail}"


@pytest.mark.parametrize("op", sorted(OP_BUILDERS))
@settings(max_examples=8)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_each_op_optimizes_to_equal_models(op: str, data: st.DataObject, seed: int) -> None:
    case = data.draw(graphs(ops=(op, op, op)))
    outcome = check_case(case, seed)
    assert outcome.status == "ok", f"{outcome.status} on {outcome.kind} data: {outcome.detail}"


def test_seeded_graphs_are_reproducible() -> None:
    def text(k: int) -> str:
        rng = np.random.default_rng([3, k])
        return onnx.printer.to_text(build_graph(RngDraw(rng), rng).model)

    assert text(5) == text(5)
    assert text(5) != text(6)


# --------------------------------------------------------------------------
# Computed infinities and NaN (einopt.testing.hazards)
# --------------------------------------------------------------------------

# A NaN a maximum reads, an infinity MaxPool reads (a window of -inf alone) and a -inf Pow's square
# root reads are left out of the inputs of those graphs; the graph must not compute one either.
_WATCHED = {
    "MaxPool": lambda a: np.isnan(a).any() or np.isinf(a).any(),
    "ReduceMax": lambda a: np.isnan(a).any(),
}
_MAKERS = (
    "Sqrt",
    "Div",
    "Reciprocal",
    "Exp",
    "Pow",
    "Softmax",
    "HardSwish",
    "Add",
    "ReduceSumSquare",
    "Relu",
)


def _special_reads(case: GraphCase, seed: int) -> list[str]:
    """The MaxPool and ReduceMax nodes of ``case`` that read a value ``_WATCHED`` refuses, per data kind."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    watched = [(n.op_type, n.input[0]) for n in model.graph.node if n.op_type in _WATCHED]
    outputs = {o.name for o in model.graph.output}
    missing = sorted({v for _, v in watched} - outputs)
    model.graph.output.extend(onnx.ValueInfoProto(name=v) for v in missing)
    session = _unoptimized_session(model)  # the fuzzer's oracle
    names = [v for _, v in watched]
    rng = np.random.default_rng(seed)
    found = []
    for kind in DATA_KINDS:
        values = dict(zip(names, session.run(names, feeds(case, rng, kind)), strict=True))
        found += [f"{op} reads {v} on {kind} data" for op, v in watched if _WATCHED[op](values[v])]
    return found


@settings(max_examples=60)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_maxima_read_no_infinity_or_nan_the_graph_computes(data: st.DataObject, seed: int) -> None:
    # Seed 0 graph 268: Reciprocal of a negative constant, Sqrt (NaN), then MaxPool over [5.12, NaN]:
    # 5.12 in ONNX Runtime, NaN in the IR; the builders excluded NaN inputs only.
    makers = data.draw(st.lists(st.sampled_from(_MAKERS), min_size=1, max_size=3))
    case = data.draw(graphs(ops=(*makers, data.draw(st.sampled_from(sorted(_WATCHED))))))
    assert not _special_reads(case, seed), case


@pytest.mark.parametrize("op", sorted(_WATCHED))
def test_a_maximum_refuses_a_value_that_ordinary_data_makes_nan(op: str) -> None:
    rng = np.random.default_rng(0)
    g = _Graph(RngDraw(rng), rng)
    x = g.by_name[g.new_input((1, 2, 5))]
    (root,) = g.node("Sqrt", [x.name], [x.shape])
    (rectified,) = g.node("Relu", [x.name], [x.shape])
    assert not OP_BUILDERS[op](g, root)
    assert OP_BUILDERS[op](g, rectified)
    assert "nan" not in g.specials


def test_risks_of_computed_values() -> None:
    inputs = (INPUT, INPUT)
    assert computed("Relu", inputs) == INPUT  # selects: its operands' infinities and NaN, no more
    assert computed("Transpose", [FINITE]) == FINITE
    add = computed("Add", inputs)  # inf - inf; 3e38 + 3e38 overflows, to one infinity
    assert add.inf == {"inf", "huge"} and add.nan == {"nan", "inf"}
    assert computed("ReduceSum", [FINITE]).nan == {"huge"}  # partial sums overflow to inf and -inf
    assert computed("Sigmoid", [add]).inf == frozenset()  # bounded, but NaN passes
    assert computed("Sigmoid", [add]).nan == add.nan
    assert ANY_DATA in computed("Reciprocal", [FINITE]).inf  # 1 / 0 on integer data
    assert computed("Sqrt", [FINITE]).nan == {ANY_DATA}
    assert computed("Pow", [FINITE]).nan == frozenset()  # an integer power of a finite value
    assert ANY_DATA in computed("Pow", [FINITE]).inf  # 1 / 0 ** 1, or 1618 ** 4 ** 4
    assert computed("Pow", [FINITE], nan_on_any_data=True).nan == {ANY_DATA}
    assert computed("Mul", [computed("Exp", [FINITE])]).nan >= {ANY_DATA}  # 0 * exp(1000)


# --------------------------------------------------------------------------
# Bugs fuzzing found, each at its cause
# --------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    onnx.checker.check_model(model, full_check=True)
    return model


def _assert_equal_unverified(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> einopt.pipeline.Result:
    """Optimize without verification; the output passes onnx.checker and equals the original on ``feeds``."""
    result = einopt.optimize(model, einopt.Options(max_depth=0, verify=False, accept="verified"))
    onnx.checker.check_model(result.model, full_check=True)
    names = [o.name for o in model.graph.output]
    ref = modelio.run(modelio.session(model), feeds, names)
    got = modelio.run(modelio.session(result.model), feeds, names)
    c = compare(ref, got, Tolerance())
    assert c.ok, c.message
    return result


def _bn(name: str, x: str, y: str, channels: int, seed: int) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    rng = np.random.default_rng(seed)
    params = [
        numpy_helper.from_array(rng.uniform(0.5, 2, channels).astype(F32), f"{name}_{p}") for p in "sbmv"
    ]
    return helper.make_node("BatchNormalization", [x, *(p.name for p in params)], [y]), params


def test_two_batchnorms_of_different_channel_counts_get_their_own_constants() -> None:
    # Both folded scale/shift constants were named c_bn_scale/c_bn_shift: the part failed to build.
    bn1, p1 = _bn("bn1", "x", "y1", 3, seed=1)
    bn2, p2 = _bn("bn2", "t", "y2", 2, seed=2)
    transpose = helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2])
    model = _model([bn1, transpose, bn2], [("x", [2, 3, 4])], [("y1", [2, 3, 4]), ("y2", [3, 2, 4])], p1 + p2)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(F32)
    result = _assert_equal_unverified(model, {"x": x})
    assert [p.status for p in result.parts] == ["rewritten"]


def test_batchnorm_after_batchnorm_applies_each_ones_parameters() -> None:
    # Same names for both BNs' constants: the second BN's parameters were applied twice.
    bn1, p1 = _bn("bn1", "x", "y1", 2, seed=1)
    bn2, p2 = _bn("bn2", "y1", "y2", 2, seed=2)
    model = _model([bn1, bn2], [("x", [3, 2, 4])], [("y2", [3, 2, 4])], p1 + p2)
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(F32)
    result = _assert_equal_unverified(model, {"x": x})
    assert [p.status for p in result.parts] == ["rewritten"]


@pytest.mark.parametrize(
    ("equation", "a", "b", "out"),
    [
        ("ab,cb->cab", [2, 3], [1, 3], [1, 2, 3]),
        ("ab,cb->acb", [2, 3], [1, 3], [2, 1, 3]),
        ("ab,cdb->dcab", [2, 3], [1, 1, 3], [1, 1, 2, 3]),
    ],
)
def test_einsum_keeps_leading_size_one_output_dims(equation: str, a: list, b: list, out: list) -> None:
    # The element-wise match dropped the leading 1s of every operand and so of the result.
    model = _model(
        [helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], [("a", a), ("b", b)], [("y", out)]
    )
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal(a).astype(F32), "b": rng.standard_normal(b).astype(F32)}
    result = _assert_equal_unverified(model, feeds)
    assert result.parts[0].status == "rewritten"


_EXTREMES = np.array([[np.inf, -np.inf, np.nan, 1e38, 3.4028235e38, -3e38, 0.5, -0.0]], F32)


@pytest.mark.parametrize(
    ("inputs", "consts"),
    [
        (["x"], {}),
        (["x", "lo"], {"lo": 0.0}),
        (["x", "", "hi"], {"hi": 1.0}),
        (["x", "lo", "hi"], {"lo": -np.inf, "hi": np.inf}),
    ],
    ids=["no-bounds", "min-only", "max-only", "infinite-bounds"],
)
def test_clip_default_bounds_are_flt_max(inputs: list[str], consts: dict[str, float]) -> None:
    # Clip(x) became Identity and Clip(x, min) Max: ONNX clamps to -+FLT_MAX by default, so +-inf changes.
    inits = [numpy_helper.from_array(F32(v), k) for k, v in consts.items()]
    model = _model([helper.make_node("Clip", inputs, ["y"])], [("x", [1, 8])], [("y", [1, 8])], inits)
    result = _assert_equal_unverified(model, {"x": _EXTREMES})
    got = modelio.run(modelio.session(result.model), {"x": _EXTREMES}, ["y"])["y"]
    if not consts:
        assert got[0, 0] == np.finfo(F32).max and got[0, 1] == -np.finfo(F32).max


def _conv_transpose_model(weight_input: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 3, 3, 1)).astype(F32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[3, 1], strides=[2, 1])
    x = rng.standard_normal((1, 2, 4, 3)).astype(F32)
    if weight_input:
        w[0, 0, 1, 0] = np.inf
        model = _model([node], [("x", [1, 2, 4, 3]), ("w", [2, 3, 3, 1])], [("y", [1, 3, 9, 3])])
        return model, {"x": x, "w": w}
    x[0, 1, 2, 0] = np.inf
    model = _model([node], [("x", [1, 2, 4, 3])], [("y", [1, 3, 9, 3])], [numpy_helper.from_array(w, "w")])
    return model, {"x": x}


def test_conv_transpose_with_a_weight_that_may_be_infinite_passes_through() -> None:
    # The gather form multiplies inserted zeros by weights (0 * inf = NaN); ONNX Runtime never does.
    model, feeds = _conv_transpose_model(weight_input=True)
    result = _assert_equal_unverified(model, feeds)
    assert result.parts[0].status == "passed through"
    assert "not a constant known to be finite" in result.parts[0].reason


def test_conv_transpose_with_finite_constant_weights_is_exact_on_infinite_inputs() -> None:
    model, feeds = _conv_transpose_model(weight_input=False)
    result = _assert_equal_unverified(model, feeds)
    assert result.parts[0].status == "rewritten"
    got = modelio.run(modelio.session(result.model), feeds, ["y"])["y"]
    assert np.isinf(got).any() and not np.isnan(got).all()


def _ml_only_model() -> onnx.ModelProto:
    node = helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L2")
    return _model([node], [("x", [2, 3])], [("y", [2, 3])], opsets=(("ai.onnx.ml", 1),))


def test_a_model_without_default_domain_opset_has_none() -> None:
    # It was reported as opset 1 ("older than 7") and refused.
    model = _ml_only_model()
    assert default_opset(model) is None
    parts = translate_graph(prepare(model).model)
    assert [(p.kind, p.reason) for p in parts] == [
        ("passthrough", "ai.onnx.ml.Normalizer: not a default-domain operator")
    ]


def test_a_model_importing_only_ai_onnx_ml_passes_through() -> None:
    model = _ml_only_model()
    result = einopt.optimize(model)
    assert "no default-domain (ai.onnx) opset" in result.blocked  # a true message, not "opset 1 < 7"
    assert [p.status for p in result.parts] == ["passed through"]
    assert result.model.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("kernels", ["onnx", "tvm"])
def test_a_reduce_mean_equal_to_an_earlier_nodes_mean_is_bound_before_its_reader(kernels: str) -> None:
    # Graph 7-899 (--kernels tvm): ReduceMean(v) over axis 0 is the very scope the LayerNormalization
    # of v before it reads as its mean; the subprogram bound it after its reader (an IRError).
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [])
    ys = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [k]) for n, k in (("y", 3), ("m", 1))]
    nodes = [
        helper.make_node("Neg", ["x"], ["v"]),
        helper.make_node("LayerNormalization", ["v", "s"], ["n"], axis=0),
        helper.make_node("Min", ["n", "z"], ["y"]),
        helper.make_node("ReduceMean", ["v"], ["m"], axes=[0], keepdims=1),
    ]
    scale = numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "s")
    graph = helper.make_graph(nodes, "g", [x, z], ys, [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(3).astype(np.float32), "z": np.array(0.25, np.float32)}
    result = einopt.optimize(model, einopt.Options(max_depth=0, accept="verified", kernels=kernels))
    assert all(p.status != "passed through" for p in result.parts)
    assert compare(modelio.run(model, feeds), modelio.run(result.model, feeds), Tolerance()).ok


@settings(max_examples=150)
@given(graphs(), st.integers(0, 2**32 - 1))
def test_random_graphs_with_a_symbolic_batch_optimize_to_models_equal_at_every_batch(
    case: GraphCase, seed: int
) -> None:
    """The first dimension of every input a symbolic batch: searched at 1, the output must equal the
    input at each batch of 1, 2, 3 and 5 the input runs at (its rewrites' sizes computed at run time,
    or left out); ``scripts/fuzz.py --symbolic`` is the long run."""
    outcome = check_case(symbolic_case(case), seed)
    assert outcome.status == "ok", f"{outcome.status} on {outcome.kind} data: {outcome.detail}"


@pytest.mark.parametrize(
    ("op", "inputs", "shapes", "valid"),
    [
        ("PRelu", ["x", "s"], {"x": [1, 1], "s": [1]}, True),
        ("PRelu", ["x", "s"], {"x": [1, 1], "s": [2]}, False),  # the input broadcasts to the slope
        ("Einsum", ["x", "s"], {"x": [2, 3], "s": [4, 3]}, True),
        ("Einsum", ["x", "s"], {"x": [1, 3], "s": [2, 3]}, False),  # a bound to 1 and 2
    ],
)
def test_a_batch_is_valid_only_where_onnx_rules_hold_not_only_shape_inference(op, inputs, shapes, valid):
    from einopt.testing.graphs import _einsum_letters_agree, _prelu_slopes_fit

    attrs = {"equation": "ab,cb->ac"} if op == "Einsum" and valid else {"equation": "ab,ab->ab"}
    node = helper.make_node(op, inputs, ["y"], **(attrs if op == "Einsum" else {}))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()], []
    )
    assert (_einsum_letters_agree(graph) and _prelu_slopes_fit(graph)) == valid

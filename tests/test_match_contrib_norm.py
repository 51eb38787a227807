"""SkipLayerNormalization and SkipSimplifiedLayerNormalization (``match_contrib_norm``).

The programs come from ONNX graphs as exporters write them (Add then LayerNormalization; Add then
the RMSNorm chain of Pow or Mul, ReduceMean, Add, Sqrt, Div or Reciprocal, Mul), imported, with the
residual sum read inline by the normalization (the program binds only the output, as a search that
keeps the layer whole does). Each is matched, emitted, checked, run in ONNX Runtime at both
optimization extremes and compared with the interpreter; near misses are refused with a reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_match_contrib import attrs_of, contrib, emit_and_run

from einopt.core import ir
from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.instantiate.match import match
from einopt.instantiate.match_contrib import CONTRIB_DOMAIN
from einopt.instantiate.match_contrib_norm import match_skip_layer_norm, match_skip_simplified_layer_norm
from einopt.instantiate.plan import MatchContext, Refusal
from einopt.instantiate.program import program_model
from einopt.rules import get
from einopt.runtime.opcost import node_costs

F = TensorProto.FLOAT
H = 8


def _graph(nodes, inputs: dict[str, list[int]], out_shape, weights: dict[str, np.ndarray], opset: int = 17):
    graph = helper.make_graph(
        nodes,
        "norm",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", F, out_shape)],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _output_only(model: onnx.ModelProto) -> tuple[ir.Program, dict[str, np.ndarray]]:
    """The imported program with the residual sum inlined (bias Adds fused into it) and only the
    output bound: the normalization reads the sum as an inline scope."""
    m = prepare(model, {}).model
    (part,) = [p for p in translate_graph(m) if p.translated]
    program = part.program
    rule = get("fuse_expressions")
    while found := [f for f in rule.match(program) if "into y" not in str(f)]:
        program = rule.apply(program, found[0])
    y = program.scope("y")
    used = {t.name for t in ir.input_tensors(y)}
    inputs = tuple(t for t in program.inputs if t.name in used)
    return ir.Program(inputs, (("y", y),), ("y",)), {k: v for k, v in part.constants.items() if k in used}


def layer_norm_model(
    x=(2, 4, H), skip=(2, 4, H), bias=False, beta=True, eps=1e-5, axis=-1
) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Add", ["x", "skip"], ["s0"])]
    weights = {"gamma": rng.standard_normal(x[axis:] if axis != -1 else (H,))}
    if bias:
        nodes.append(helper.make_node("Add", ["s0", "bias"], ["s"]))
        weights["bias"] = rng.standard_normal(H)
    else:
        nodes[0].output[0] = "s"
    ln_inputs = ["s", "gamma"]
    if beta:
        weights["beta"] = rng.standard_normal(weights["gamma"].shape)
        ln_inputs.append("beta")
    nodes.append(helper.make_node("LayerNormalization", ln_inputs, ["y"], axis=axis, epsilon=eps))
    return _graph(nodes, {"x": list(x), "skip": list(skip)}, list(x), weights)


def rms_norm_program(
    square="mul", inverse="div", bias=False, eps=1e-6, count=H
) -> tuple[ir.Program, dict[str, np.ndarray]]:
    """RMSNorm of ``x + skip (+ bias)`` as the exporters' chains compute it (``s * s`` or ``pow(s, 2)``
    for the square; ``s / sqrt(..)`` or ``s * (1 / sqrt(..))``), written with the Python API."""
    rng = np.random.default_rng(2)
    b, t, h, k = ir.Iter("b", 0, 2), ir.Iter("t", 0, 4), ir.Iter("h", 0, H), ir.Iter("k", 0, H)
    o = ir.Iter("o", 0, 1)
    x, skip = ir.Tensor("x", (2, 4, H)), ir.Tensor("skip", (2, 4, H))
    gamma, bvec = ir.Tensor("gamma", (H,)), ir.Tensor("bias", (H,))
    total = x[b, t, h] + skip[b, t, h]
    if bias:
        total = total + bvec[(h,)]
    s = ir.Scope((b, t, h), (), total)
    sq = s[b, t, k] * s[b, t, k] if square == "mul" else ir.Unary("pow", s[b, t, k], 2.0)
    ms = ir.Scope((b, t, o), (k,), sq * (1.0 / count))
    root = ir.Unary("sqrt", ms[b, t, 0] + eps)
    normed = s[b, t, h] / root if inverse == "div" else s[b, t, h] * (1.0 / root)
    y = ir.Scope((b, t, h), (), normed * gamma[(h,)])
    tensors = tuple(ir.input_tensors(y))
    weights = {"gamma": rng.standard_normal(H)} | ({"bias": rng.standard_normal(H)} if bias else {})
    return ir.Program(tensors, (("y", y),), ("y",)), weights


CASES = [
    # (id, model, operator, epsilon, inputs given (beyond X and skip))
    ("layer_norm", layer_norm_model(), "SkipLayerNormalization", 1e-5, 2),
    ("layer_norm_bert_epsilon", layer_norm_model(eps=1e-12), "SkipLayerNormalization", 1e-12, 2),
    ("layer_norm_no_beta", layer_norm_model(beta=False), "SkipLayerNormalization", 1e-5, 1),
    ("layer_norm_bias", layer_norm_model(bias=True), "SkipLayerNormalization", 1e-5, 3),
    ("layer_norm_2d", layer_norm_model(x=(6, H), skip=(6, H)), "SkipLayerNormalization", 1e-5, 2),
    (
        "layer_norm_rows_merged",
        layer_norm_model(x=(2, 2, 3, H), skip=(2, 2, 3, H)),
        "SkipLayerNormalization",
        1e-5,
        2,
    ),
    ("layer_norm_skip_per_position", layer_norm_model(skip=(4, H)), "SkipLayerNormalization", 1e-5, 2),
    ("rms_norm_mul_div", rms_norm_program(), "SkipSimplifiedLayerNormalization", 1e-6, 1),
    ("rms_norm_pow_reciprocal", rms_norm_program("pow", "mul"), "SkipSimplifiedLayerNormalization", 1e-6, 1),
    ("rms_norm_bias", rms_norm_program(bias=True, eps=1e-5), "SkipSimplifiedLayerNormalization", 1e-5, 2),
]


@pytest.mark.parametrize(("model", "op", "eps", "params"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_skip_normalization(model, op, eps, params):
    program, constants = model if isinstance(model, tuple) else _output_only(model)
    chosen, _ = match(program.scope("y"), MatchContext(bound=frozenset({program.scope("y")})))
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{op}"
    out, nodes = emit_and_run(program, tuple(constants), rtol=1e-4, scale=3.0)
    assert contrib(nodes) == [op]
    assert not {o for _, o in nodes} - {"Reshape", op}, nodes
    assert attrs_of(out, op)["epsilon"] == pytest.approx(eps, rel=1e-6)
    (node,) = [n for n in out.graph.node if n.op_type == op]
    assert len([i for i in node.input if i]) == 2 + params


def _ctx(program: ir.Program) -> MatchContext:
    return MatchContext(bound=frozenset(s for _, s in program.bindings))


def test_layer_norm_is_not_an_rms_norm_nor_the_reverse():
    ln, _ = _output_only(layer_norm_model())
    rms, _ = rms_norm_program()
    assert "not SkipSimplifiedLayerNormalization" in match_skip_simplified_layer_norm(ln.scope("y")).reason
    assert "not SkipLayerNormalization" in match_skip_layer_norm(rms.scope("y")).reason


def test_a_bound_sum_is_not_fused():
    """The imported program as it is binds the sum: it is computed anyway, and LayerNormalization stays."""
    m = prepare(layer_norm_model(), {}).model
    (part,) = [p for p in translate_graph(m) if p.translated]
    refused = match_skip_layer_norm(part.program.scope("y"), _ctx(part.program))
    assert isinstance(refused, Refusal) and "program binding" in refused.reason
    _, nodes = emit_and_run(part.program, tuple(part.constants))
    assert not contrib(nodes)


@pytest.mark.parametrize("gamma_shape", [(H,), (1, 1, H)])
def test_layer_norm_of_a_sum_runs_on_rows_onnx_runtime_does_not_fuse(gamma_shape):
    """A LayerNormalization of a bound 3-D sum is written on its rows merged to 2-D (a scale of rank
    3 reshaped to the normalized dimension): ONNX Runtime then keeps the Add and LayerNormalization
    rather than its slower SkipLayerNormalization."""
    model = layer_norm_model()
    model.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(
            numpy_helper.to_array(model.graph.initializer[0]).reshape(gamma_shape), "gamma"
        )
    )
    (part,) = [p for p in translate_graph(prepare(model, {}).model) if p.translated]
    emitted, nodes = emit_and_run(part.program, tuple(part.constants))
    assert [op for _, op in nodes] == ["Add", "Reshape", "LayerNormalization", "Reshape"]
    ops = [n.op_type for n in onnx.load_from_string(_optimized(emitted)).graph.node]
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    if gamma_shape == (H,):  # what ONNX Runtime makes of the exporter's form
        assert [n.op_type for n in onnx.load_from_string(_optimized(model)).graph.node] == [
            "SkipLayerNormalization"
        ]


def _optimized(model: onnx.ModelProto) -> bytes:
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.optimized_model_filepath = f"{tmp}/m.onnx"
        so.log_severity_level = 3
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return open(f"{tmp}/m.onnx", "rb").read()


REFUSALS = [
    # (id, model, words of the reason)
    (
        "no_skip",
        _graph(
            [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1)],
            {"x": [2, 4, H]},
            [2, 4, H],
            {"gamma": np.ones(H), "beta": np.zeros(H)},
        ),
        "no inline sum",
    ),
    ("two_trailing_axes", layer_norm_model(axis=-2), "not a vector over the normalized dimension"),
    ("rms_norm_over_another_count", rms_norm_program(count=H - 1), "neither normalization"),
    ("skip_broadcast_over_positions", layer_norm_model(skip=(2, 1, H)), "lacks inner rows"),
    ("scaled_by_a_tensor", "scaled", "not a vector over the normalized dimension"),
]


@pytest.mark.parametrize(("model", "reason"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_skip_normalization_refusals(model, reason):
    if isinstance(model, str):
        program, constants = _variant(model)
    else:
        program, constants = model if isinstance(model, tuple) else _output_only(model)
    refused = match_skip_layer_norm(program.scope("y"), _ctx(program))
    assert isinstance(refused, Refusal) and reason in refused.reason, refused
    _, nodes = emit_and_run(program, tuple(constants), rtol=1e-4)
    assert not [op for op in contrib(nodes) if op.startswith("Skip")]


def _variant(what: str) -> tuple[ir.Program, dict[str, np.ndarray]]:
    """An RMSNorm program changed into a near miss."""
    program, weights = rms_norm_program()
    y = program.scope("y")
    if what == "scaled":  # times a tensor of the output's shape
        z = ir.Tensor("z", y.shape)
        y = y.replace(body=y.body * z[y.traversal])
    tensors = tuple(ir.input_tensors(y))
    return ir.Program(tensors, (("y", y),), ("y",)), weights


def test_skip_layer_norm_is_timed():
    program, constants = _output_only(layer_norm_model())
    model, inst = program_model(program, constants, light=True)
    costs = [n.cost for n in node_costs(model, constants)]
    (norm,) = [c for c in costs if c.op == "SkipLayerNormalization"]
    assert norm.kind == "timed" and norm.flops == 10 * 2 * 4 * H

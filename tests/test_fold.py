"""Model preparation: input-shape pinning, shape inference, constant and BatchNormalization folding.

Every transformation is checked the same way: the result passes
``onnx.checker`` (full check), keeps the model's interface, has the expected
op types, and computes the same outputs in ONNX Runtime on seeded inputs.
"""

import collections
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from einopt.errors import ModelError
from einopt.frontend import fold
from einopt.runtime import modelio

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def make_model(nodes, inputs, outputs, initializers=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8, producer_name="einopt-tests")
    helper.set_model_props(model, {"origin": "test_fold"})
    return model


def ops(model):
    return [n.op_type for n in model.graph.node]


def assert_interface_kept(before, after, pinned=()):
    """Names, order and element types of inputs/outputs, opsets and metadata are unchanged."""

    def interface(m, part):
        return [(v.name, v.type.tensor_type.elem_type) for v in getattr(m.graph, part)]

    assert interface(after, "input") == interface(before, "input")
    assert interface(after, "output") == interface(before, "output")
    for a, b in zip(after.graph.input, before.graph.input, strict=True):
        if a.name not in pinned:
            assert a.type == b.type
    assert after.opset_import == before.opset_import
    assert after.metadata_props == before.metadata_props
    assert (after.ir_version, after.producer_name) == (before.ir_version, before.producer_name)


def assert_same_outputs(before, after, shapes=None, seed=0, rtol=1e-5, atol=1e-5):
    feeds = modelio.random_inputs(before, seed, shapes or {})
    want = modelio.run(before, feeds)
    got = modelio.run(after, feeds)
    assert list(got) == list(want)
    for name in want:
        scale = max(1.0, float(np.abs(want[name]).max(initial=0)))
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol * scale, err_msg=name)


def assert_valid(model):
    onnx.checker.check_model(model, full_check=True)


# ----------------------------------------------------------------------------- input shapes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("x=1,3,224,224", ("x", (1, 3, 224, 224))),
        ("input:0=2,5", ("input:0", (2, 5))),
        ("encoder/ids = 4 , 7", ("encoder/ids", (4, 7))),
        ("a=b=3", ("a=b", (3,))),
        ("scalar=", ("scalar", ())),
    ],
    ids=["plain", "colon", "slash-and-spaces", "equals-in-name", "scalar"],
)
def test_parse_input_shape(text, expected):
    assert fold.parse_input_shape(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("x", "expected NAME=D1,D2"),
        ("=1,2", "expected NAME=D1,D2"),
        ("x=1,a", "'a' is not an integer"),
        ("x=1,,2", "'' is not an integer"),
        ("x=2,0", "dimension 0 must be positive"),
        ("x=-1", "dimension -1 must be positive"),
    ],
    ids=["no-equals", "no-name", "letter", "empty-dim", "zero", "negative"],
)
def test_parse_input_shape_errors(text, message):
    with pytest.raises(ModelError, match=message):
        fold.parse_input_shape(text)


def symbolic_model():
    """x[N, 3] + y[N, 3] -> z[N, 3], plus t = Relu(u[N, C])."""
    nodes = [helper.make_node("Add", ["x", "y"], ["z"]), helper.make_node("Relu", ["u"], ["t"])]
    inputs = [vi("x", ["N", 3]), vi("y", ["N", 3]), vi("u", ["N", "C"])]
    return make_model(nodes, inputs, [vi("z", ["N", 3]), vi("t", ["N", "C"])])


def dims(v):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]


def test_pin_input_shapes_propagates_symbols():
    model = symbolic_model()
    before = model.SerializeToString()
    pinned = fold.pin_input_shapes(model, {"x": (2, 3), "u": [2, 7]})
    assert model.SerializeToString() == before
    assert {v.name: dims(v) for v in [*pinned.graph.input, *pinned.graph.output]} == {
        "x": [2, 3],
        "y": [2, 3],
        "u": [2, 7],
        "z": [2, 3],
        "t": [2, 7],
    }
    assert_valid(pinned)
    assert_interface_kept(model, pinned, pinned=("x", "y", "u"))
    assert_same_outputs(model, pinned, shapes={"x": (2, 3), "y": (2, 3), "u": (2, 7)})


def test_pin_input_without_declared_shape():
    model = symbolic_model()
    model.graph.input[2].type.tensor_type.ClearField("shape")
    pinned = fold.pin_input_shapes(model, {"u": (4, 5)})
    assert dims(pinned.graph.input[2]) == [4, 5]


@pytest.mark.parametrize(
    "shapes, message",
    [
        ({"w": (2, 3)}, r"unknown inputs \['w'\]; the model's inputs are \['x', 'y', 'u'\]"),
        ({"x": (2, 3, 1)}, "declares rank 2"),
        ({"x": (2, 4)}, r"declares \['N', 3\]"),
        ({"x": (2, 3), "u": (5, 1)}, "dimension 'N' to both 2 and 5"),
        ({"x": (0, 3)}, "must be positive"),
    ],
    ids=["unknown-name", "rank", "fixed-dim", "symbol-clash", "zero"],
)
def test_pin_input_shapes_errors(shapes, message):
    with pytest.raises(ModelError, match=message):
        fold.pin_input_shapes(symbolic_model(), shapes)


# ----------------------------------------------------------------------------- shape inference


def reshape_chain_model(x_dims=(2, 3, 4), opset=17):
    """Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) -> Relu: the output shape needs data propagation."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    inits = [const("zero", np.array(0, np.int64)), const("axes", [0]), const("minus_one", [-1])]
    n = x_dims[0]
    return make_model(nodes, [vi("x", list(x_dims))], [vi("y", [n, None])], inits, opset=opset)


def value_shapes(model):
    return {v.name: dims(v) for v in model.graph.value_info}


def test_infer_shapes_with_data_propagation():
    model = reshape_chain_model()
    inferred = fold.infer_shapes(model)
    assert value_shapes(inferred)["r"] == [2, 12]
    assert dims(inferred.graph.output[0]) == [2, 12]  # an undeclared output dim is filled in
    assert not model.graph.value_info  # the input is not mutated
    assert_interface_kept(model, inferred)


def test_infer_shapes_skips_the_data_of_large_tensors(monkeypatch):
    """Inference runs on a copy without large tensor data (what makes > 2 GB models work)."""
    w = rand(0, 300, 200)  # 240 KB: stripped
    model = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [vi("x", [5, 300])],
        [vi("y", [5, 200])],
        [const("W", w)],
    )
    seen = []
    real = onnx.shape_inference.infer_shapes

    def spy(m, **kwargs):
        seen.append(m.graph.initializer[0].data_location)
        return real(m, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    inferred = fold.infer_shapes(model)
    assert seen == [TensorProto.EXTERNAL]
    assert value_shapes(inferred) == {"h": [5, 200]}
    np.testing.assert_array_equal(numpy_helper.to_array(inferred.graph.initializer[0]), w)
    assert_same_outputs(model, inferred)


def test_infer_shapes_recovers_from_stale_value_info():
    model = reshape_chain_model()
    model.graph.value_info.append(vi("r", [7, 7, 7], TensorProto.INT32))  # wrong annotation
    inferred = fold.infer_shapes(model)
    assert value_shapes(inferred)["r"] == [2, 12]


def test_infer_shapes_keeps_annotations_it_cannot_infer():
    """A custom op's annotated output type is kept and used downstream."""
    nodes = [
        helper.make_node("Frob", ["x"], ["f"], domain="example.custom"),
        helper.make_node("Relu", ["f"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)], extra_opsets=[("example.custom", 1)])
    model.graph.value_info.append(vi("f", [4, "K"]))
    inferred = fold.infer_shapes(model)
    assert value_shapes(inferred) == {"f": [4, "K"]}
    assert dims(inferred.graph.output[0]) == [4, "K"]


def test_infer_shapes_never_fails(caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] simulated\nsecond line")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", broken)
    model = reshape_chain_model()
    with caplog.at_level(logging.WARNING, logger="einopt.frontend.fold"):
        inferred = fold.infer_shapes(model)
    assert (
        "shape inference failed, continuing without it: InferenceError: [ShapeInferenceError] simulated second line"
        in caplog.text
    )
    assert inferred.SerializeToString() == model.SerializeToString()
    prepared = fold.prepare(model, {"x": (2, 3, 4)})
    assert any(n.startswith("shape inference failed (InferenceError") for n in prepared.notes)
    assert ops(prepared.model) == ["Reshape", "Relu"]  # Shape of a declared static input still folds
    monkeypatch.undo()
    assert_same_outputs(model, prepared.model)


# ----------------------------------------------------------------------------- constant folding


def _x_plus(node_list, inits, c_name, x_dims=(2, 3), extra_inputs=(), opset=17, extra_opsets=()):
    """y = x + <c_name>, where ``node_list`` computes c_name."""
    nodes = [*node_list, helper.make_node("Add", ["x", c_name], ["y"])]
    inputs = [vi("x", list(x_dims)), *extra_inputs]
    return make_model(nodes, inputs, [vi("y", list(x_dims))], inits, opset=opset, extra_opsets=extra_opsets)


def case_constant_nodes():
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(rand(1, 3))),
        helper.make_node("Constant", [], ["two"], value_float=2.0),
        helper.make_node("Constant", [], ["shape"], value_ints=[3, 2]),
        helper.make_node("Mul", ["c", "two"], ["c2"]),
        helper.make_node("Reshape", ["x", "shape"], ["xr"]),
        helper.make_node("Reshape", ["xr", "back"], ["xb"]),
        helper.make_node("Add", ["xb", "c2"], ["y"]),
    ]
    return make_model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], [const("back", [2, 3])]), [
        "Reshape",
        "Reshape",
        "Add",
    ]


def case_constant_of_shape_weights():
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["wshape"], ["w0"], value=numpy_helper.from_array(np.array([0.5], np.float32))
        ),
        helper.make_node("Add", ["w0", "delta"], ["w"]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    inits = [const("wshape", [3, 4]), const("delta", rand(2, 3, 4))]
    return make_model(nodes, [vi("x", [2, 3])], [vi("y", [2, 4])], inits), ["MatMul"]


def case_shape_chain():
    return reshape_chain_model(), ["Reshape", "Relu"]


def case_shape_of_symbolic_input_kept():
    model = reshape_chain_model(x_dims=("N", 3, 4))
    return model, ops(model)


def case_shape_start_end_and_size():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),  # [3]
        helper.make_node("Size", ["x"], ["n"]),  # 24
        helper.make_node("Cast", ["n"], ["nf"], to=F),
        helper.make_node(
            "ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.array([1.0], np.float32))
        ),
        helper.make_node("Mul", ["ones", "nf"], ["c"]),
        helper.make_node("Unsqueeze", ["c", "axis1"], ["c1"]),
        helper.make_node("Add", ["x", "c1"], ["y"]),
    ]
    return make_model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])], [const("axis1", [1])]), ["Add"]


def case_random_kept():
    nodes = [
        helper.make_node("RandomUniform", [], ["r"], shape=[2, 3]),
        helper.make_node("Mul", ["r", "zero"], ["c"]),
    ]
    return _x_plus(nodes, [const("zero", np.float32(0))], "c"), ["RandomUniform", "Mul", "Add"]


def case_shape_of_random_value():
    """Shape of a non-constant value with a static shape folds; the random op stays."""
    nodes = [
        helper.make_node("RandomNormal", [], ["r"], shape=[3, 2]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Reshape", ["x", "s"], ["y"]),
    ]
    return make_model(nodes, [vi("x", [2, 3])], [vi("y", [3, 2])]), ["RandomNormal", "Reshape"]


def case_graph_outputs_kept():
    nodes = [
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Constant", [], ["k"], value_float=3.0),
        helper.make_node("Add", ["x", "ab"], ["y"]),
    ]
    outputs = [vi("y", [2, 3]), vi("ab", [3]), vi("k", [])]
    model = make_model(nodes, [vi("x", [2, 3])], outputs, [const("a", rand(3, 3)), const("b", rand(4, 3))])
    return model, ["Add", "Constant", "Add"]


def case_overridable_initializer_kept():
    """An initializer that is also a graph input may be fed another value (and shape): not constant."""
    nodes = [
        helper.make_node("Neg", ["w"], ["c"]),
        helper.make_node("Shape", ["w"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["z"]),
        helper.make_node("Add", ["c", "z"], ["c2"]),
    ]
    model = _x_plus(nodes, [const("w", rand(5, 3))], "c2", extra_inputs=[vi("w", ["K"])])
    return model, ["Neg", "Shape", "ConstantOfShape", "Add", "Add"]


def case_custom_domain_kept():
    nodes = [helper.make_node("Gelu", ["w"], ["c"], domain="com.microsoft")]
    return _x_plus(nodes, [const("w", rand(6, 3))], "c", extra_opsets=[("com.microsoft", 1)]), ["Gelu", "Add"]


def case_subgraph_kept_and_outer_constant_read():
    """If is not folded; a folded value read only inside its branch stays as an initializer."""
    branch = lambda name, src: helper.make_graph(  # noqa: E731
        [helper.make_node("Identity", [src], [name])], name, [], [vi(name, [3])]
    )
    nodes = [
        helper.make_node("Neg", ["w"], ["neg_w"]),
        helper.make_node(
            "If", ["flag"], ["c"], then_branch=branch("t", "neg_w"), else_branch=branch("e", "w")
        ),
    ]
    inits = [const("w", rand(7, 3)), const("flag", np.array(True))]
    return _x_plus(nodes, inits, "c"), ["If", "Add"]


def case_large_output_kept(monkeypatch):
    monkeypatch.setattr(fold, "MAX_FOLD_ELEMENTS", 10)
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["shape"], ["c"], value=numpy_helper.from_array(np.array([2.0], np.float32))
        )
    ]
    return _x_plus(nodes, [const("shape", [4, 4])], "c", x_dims=(4, 4)), ["ConstantOfShape", "Add"]


def _nonzero_model():
    """The size of NonZero's output is data-dependent: known only after evaluation."""
    nodes = [
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Cast", ["nz"], ["c"], to=F),
        helper.make_node("Mul", ["x", "c"], ["y"]),
    ]
    mask = const("mask", np.array([[1, 0, 1], [0, 1, 1]], np.int64))
    return make_model(nodes, [vi("x", [1])], [vi("y", [2, None])], [mask])


def case_nonzero_folded():
    return _nonzero_model(), ["Mul"]


def case_nonzero_too_large_after_evaluation(monkeypatch):
    monkeypatch.setattr(fold, "MAX_FOLD_ELEMENTS", 3)
    return _nonzero_model(), ["NonZero", "Cast", "Mul"]


FOLD_CASES = [
    case_constant_nodes,
    case_constant_of_shape_weights,
    case_shape_chain,
    case_shape_of_symbolic_input_kept,
    case_shape_start_end_and_size,
    case_random_kept,
    case_shape_of_random_value,
    case_graph_outputs_kept,
    case_overridable_initializer_kept,
    case_custom_domain_kept,
    case_subgraph_kept_and_outer_constant_read,
    case_large_output_kept,
    case_nonzero_folded,
    case_nonzero_too_large_after_evaluation,
]


@pytest.mark.parametrize("case", FOLD_CASES, ids=[c.__name__.removeprefix("case_") for c in FOLD_CASES])
def test_fold_constants(case, monkeypatch):
    model, expected_ops = case(monkeypatch) if "monkeypatch" in case.__code__.co_varnames else case()
    before = model.SerializeToString()
    folded = fold.fold_constants(model)
    assert model.SerializeToString() == before
    assert ops(folded) == expected_ops
    if "com.microsoft" not in {o.domain for o in model.opset_import}:
        assert_valid(folded)
    assert_interface_kept(model, folded)
    if not any(op.startswith("Random") for op in ops(model)):
        assert_same_outputs(model, folded)
    # Every remaining node input is produced, an initializer or a graph input; nothing is left unused.
    g = folded.graph
    available = (
        {i.name for i in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    )
    assert all(i in available for n in g.node for i in n.input if i)
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output} | {"neg_w", "w"}
    assert {t.name for t in g.initializer} <= read


def test_fold_removes_initializers_that_became_unused():
    model = _x_plus(
        [helper.make_node("Neg", ["w"], ["c"]), helper.make_node("Identity", ["kept"], ["k"])],
        [const("w", rand(1, 3)), const("kept", rand(2, 3)), const("unrelated", rand(3, 2))],
        "c",
    )
    model.graph.output.append(vi("k", [3]))
    folded = fold.fold_constants(model)
    assert sorted(t.name for t in folded.graph.initializer) == ["c", "kept", "unrelated"]
    assert ops(folded) == ["Identity", "Add"]
    assert_same_outputs(model, folded)


def test_fold_falls_back_to_node_by_node(monkeypatch):
    """When the batched evaluation fails, nodes are evaluated one at a time and failures stay as nodes."""
    real = fold._run_nodes

    def flaky(m, nodes, *args):
        if len(nodes) > 1 or nodes[0].op_type == "Sqrt":
            raise ModelError("simulated failure")
        return real(m, nodes, *args)

    monkeypatch.setattr(fold, "_run_nodes", flaky)
    nodes = [
        helper.make_node("Neg", ["w"], ["a"]),
        helper.make_node("Exp", ["a"], ["b"]),
        helper.make_node("Sqrt", ["b"], ["c"]),
    ]
    model = _x_plus(nodes, [const("w", rand(1, 3))], "c")
    folded = fold.fold_constants(model)
    assert ops(folded) == ["Sqrt", "Add"]
    assert [t.name for t in folded.graph.initializer] == ["b"]
    assert_valid(folded)
    assert_same_outputs(model, folded)


def test_fold_keeps_a_node_onnxruntime_cannot_evaluate():
    nodes = [
        helper.make_node("Reshape", ["w", "bad_shape"], ["bad"]),  # 3 elements into [4]: fails at run time
        helper.make_node("Neg", ["w"], ["c"]),
    ]
    model = _x_plus(nodes, [const("w", rand(1, 3)), const("bad_shape", [4])], "c")
    model.graph.output.append(vi("bad", [4]))
    folded = fold.fold_constants(model)
    assert ops(folded) == ["Reshape", "Add"]


# ----------------------------------------------------------------------------- BatchNormalization


def bn_params(seed, channels):
    rng = np.random.default_rng(seed)
    return {
        "scale": rng.standard_normal(channels).astype(np.float32),
        "shift": rng.standard_normal(channels).astype(np.float32),
        "mean": rng.standard_normal(channels).astype(np.float32),
        "var": rng.uniform(0.5, 2.0, channels).astype(np.float32),
    }


def producer_bn_model(
    op, x_dims, weights, attrs=None, out_dims=None, bias=None, bn_count=1, seed=0, tail=True
):
    """x -> op(x, W[, bias]) -> BatchNormalization (x bn_count) [-> Relu]."""
    channels = out_dims[1]
    inits = [const("W", weights)] + ([const("bias", bias)] if bias is not None else [])
    nodes = [
        helper.make_node(op, ["x", "W"] + (["bias"] if bias is not None else []), ["p"], **(attrs or {}))
    ]
    src = "p"
    for k in range(bn_count):
        params = bn_params(seed + k, channels)
        inits += [const(f"{name}{k}", v) for name, v in params.items()]
        names = [f"{n}{k}" for n in params]
        nodes.append(helper.make_node("BatchNormalization", [src, *names], [f"bn{k}"], epsilon=1e-3))
        src = f"bn{k}"
    if tail:
        nodes.append(helper.make_node("Relu", [src], ["y"]))
    out = "y" if tail else src
    return make_model(nodes, [vi("x", list(x_dims))], [vi(out, list(out_dims))], inits)


BN_CASES = {
    "conv2d-bias": (
        "Conv",
        (2, 4, 6, 6),
        rand(1, 5, 4, 3, 3),
        {"pads": [1, 1, 1, 1]},
        (2, 5, 6, 6),
        rand(2, 5),
    ),
    "conv2d": ("Conv", (2, 4, 6, 6), rand(1, 5, 4, 3, 3), {"strides": [2, 2]}, (2, 5, 2, 2), None),
    "conv1d": ("Conv", (2, 3, 9), rand(3, 4, 3, 2), {}, (2, 4, 8), rand(4, 4)),
    "conv3d": ("Conv", (1, 2, 4, 4, 4), rand(5, 3, 2, 2, 2, 2), {}, (1, 3, 3, 3, 3), None),
    "conv-group": ("Conv", (2, 4, 5, 5), rand(6, 6, 2, 3, 3), {"group": 2}, (2, 6, 3, 3), rand(7, 6)),
    "conv-depthwise": ("Conv", (1, 4, 5, 5), rand(8, 4, 1, 3, 3), {"group": 4}, (1, 4, 3, 3), None),
    "convtranspose": (
        "ConvTranspose",
        (2, 3, 4, 4),
        rand(9, 3, 5, 3, 3),
        {"strides": [2, 2]},
        (2, 5, 9, 9),
        None,
    ),
    "convtranspose-group-bias": (
        "ConvTranspose",
        (1, 4, 4, 4),
        rand(10, 4, 3, 2, 2),
        {"group": 2},
        (1, 6, 5, 5),
        rand(11, 6),
    ),
    "gemm": ("Gemm", (3, 7), rand(12, 7, 5), {"alpha": 0.5, "beta": 2.0}, (3, 5), rand(13, 5)),
    "gemm-transB-C-row": ("Gemm", (3, 7), rand(14, 5, 7), {"transB": 1}, (3, 5), rand(15, 1, 5)),
    "gemm-transA-no-C": ("Gemm", (7, 3), rand(16, 7, 5), {"transA": 1}, (3, 5), None),
    "gemm-C-matrix": ("Gemm", (3, 7), rand(17, 7, 5), {"beta": 0.25}, (3, 5), rand(18, 3, 5)),
    "gemm-C-column": ("Gemm", (3, 7), rand(19, 7, 5), {}, (3, 5), rand(20, 3, 1)),
    "gemm-C-scalar": ("Gemm", (3, 7), rand(21, 7, 5), {"beta": -1.0}, (3, 5), np.float32(0.7)),
}


@pytest.mark.parametrize("case", BN_CASES.values(), ids=BN_CASES.keys())
def test_fold_batchnorm(case):
    op, x_dims, w, attrs, out_dims, bias = case
    model = producer_bn_model(op, x_dims, w, attrs, out_dims, bias)
    before = model.SerializeToString()
    folded = fold.fold_batchnorm(model)
    assert model.SerializeToString() == before
    assert ops(folded) == [op, "Relu"]
    assert folded.graph.node[0].output[0] == "bn0"
    assert {t.name for t in folded.graph.initializer} == {"W_bn", "W_bn_bias"}
    assert_valid(folded)
    assert_interface_kept(model, folded)
    assert_same_outputs(model, folded)


def test_fold_batchnorm_chain_and_graph_output_name():
    model = producer_bn_model(
        "Conv", (1, 2, 4, 4), rand(0, 3, 2, 1, 1), {}, (1, 3, 4, 4), rand(1, 3), bn_count=2, tail=False
    )
    folded = fold.fold_batchnorm(model)
    assert ops(folded) == ["Conv"]
    assert folded.graph.node[0].output[0] == "bn1" == folded.graph.output[0].name
    assert_valid(folded)
    assert_same_outputs(model, folded)


def test_fold_batchnorm_float64():
    model = producer_bn_model("Gemm", (3, 7), rand(0, 7, 5), {"transB": 0}, (3, 5), rand(1, 5))
    for t in model.graph.initializer:
        if t.data_type == F:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in [*model.graph.input, *model.graph.output]:
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    folded = fold.fold_batchnorm(model)
    assert ops(folded) == ["Gemm", "Relu"]
    assert {t.data_type for t in folded.graph.initializer} == {TensorProto.DOUBLE}
    assert_same_outputs(model, folded, rtol=1e-12, atol=1e-12)


def test_fold_batchnorm_shared_weights_are_not_mutated():
    """Two Convs share W; only the one before the BN gets new weights, W stays for the other."""
    model = producer_bn_model("Conv", (1, 2, 4, 4), rand(0, 3, 2, 1, 1), {}, (1, 3, 4, 4), rand(1, 3))
    model.graph.node.append(helper.make_node("Conv", ["x", "W", "bias"], ["other"]))
    model.graph.output.append(vi("other", [1, 3, 4, 4]))
    folded = fold.fold_batchnorm(model)
    assert ops(folded) == ["Conv", "Relu", "Conv"]
    assert list(folded.graph.node[2].input) == ["x", "W", "bias"]
    assert {t.name for t in folded.graph.initializer} == {"W", "bias", "W_bn", "W_bn_bias"}
    assert_valid(folded)
    assert_same_outputs(model, folded)


def _bn_negative(kind):
    model = producer_bn_model("Conv", (1, 2, 4, 4), rand(0, 3, 2, 1, 1), {}, (1, 3, 4, 4), rand(1, 3))
    g = model.graph
    if kind == "producer-output-read-twice":
        g.node.append(helper.make_node("Sigmoid", ["p"], ["side"]))
        g.output.append(vi("side", [1, 3, 4, 4]))
    elif kind == "producer-output-is-graph-output":
        g.output.append(vi("p", [1, 3, 4, 4]))
    elif kind == "weights-are-graph-input":
        g.input.append(vi("W", [3, 2, 1, 1]))
    elif kind == "mean-is-graph-input":
        g.input.append(vi("mean0", [3]))
    elif kind == "producer-is-matmul":
        g.node[0].CopyFrom(helper.make_node("Mul", ["x", "scale_x"], ["p"]))
        g.initializer.append(const("scale_x", np.float32(3.0)))
    elif kind == "producer-in-other-domain":
        g.node[0].domain = "com.microsoft"
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


@pytest.mark.parametrize(
    "kind",
    [
        "producer-output-read-twice",
        "producer-output-is-graph-output",
        "weights-are-graph-input",
        "mean-is-graph-input",
        "producer-is-matmul",
        "producer-in-other-domain",
    ],
)
def test_fold_batchnorm_refused(kind):
    model = _bn_negative(kind)
    folded = fold.fold_batchnorm(model)
    assert folded.SerializeToString() == model.SerializeToString()


# ----------------------------------------------------------------------------- prepare


def full_model():
    """x[N,3,8,8] -> Conv -> BN -> Reshape(Concat(Shape(x)[0], [-1])) -> Gemm -> BN -> y[N, 10]."""
    n_hidden = 5 * 8 * 8
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s1", "b1", "m1", "v1"], ["cb"]),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["flat"], axis=0),
        helper.make_node("Reshape", ["cb", "flat"], ["r"]),
        helper.make_node("Gemm", ["r", "W2", "C2"], ["g"], transB=1),
        helper.make_node("BatchNormalization", ["g", "s2", "b2", "m2", "v2"], ["y"]),
    ]
    p1, p2 = bn_params(1, 5), bn_params(2, 10)
    inits = [
        const("W1", rand(3, 5, 3, 3, 3)),
        *[const(k, p1[n]) for k, n in zip(["s1", "b1", "m1", "v1"], p1, strict=True)],
        const("zero", np.array(0, np.int64)),
        const("axes", [0]),
        const("minus_one", [-1]),
        const("W2", rand(4, 10, n_hidden) / 10),
        const("C2", rand(5, 10)),
        *[const(k, p2[n]) for k, n in zip(["s2", "b2", "m2", "v2"], p2, strict=True)],
    ]
    return make_model(nodes, [vi("x", ["N", 3, 8, 8])], [vi("y", ["N", 10])], inits)


def test_prepare_pinned():
    model = full_model()
    before = model.SerializeToString()
    prepared = fold.prepare(model, {"x": (2, 3, 8, 8)})
    assert model.SerializeToString() == before
    m = prepared.model
    assert ops(m) == ["Conv", "Reshape", "Gemm"]
    assert dims(m.graph.input[0]) == [2, 3, 8, 8] and dims(m.graph.output[0]) == [2, 10]
    assert value_shapes(m) == {"cb": [2, 5, 8, 8], "r": [2, 320]}
    assert prepared.notes == (
        "pinned input x to [2, 3, 8, 8]",
        "folded 4 nodes into constants (Concat, Gather, Shape, Unsqueeze)",
        "folded 1 BatchNormalization into Conv",
        "folded 1 BatchNormalization into Gemm",
    )
    assert_valid(m)
    assert_interface_kept(model, m, pinned=("x",))
    assert_same_outputs(model, m, shapes={"x": (2, 3, 8, 8)}, rtol=1e-4)


def test_prepare_symbolic():
    model = full_model()
    prepared = fold.prepare(model)
    m = prepared.model
    assert collections.Counter(ops(m)) == collections.Counter(
        ["Conv", "Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Gemm"]
    )
    assert prepared.notes == (
        "folded 1 BatchNormalization into Conv",
        "folded 1 BatchNormalization into Gemm",
        "input x has symbolic dims [N]: parts depending on them pass through (--dim N=VALUE searches them at VALUE)",
    )
    assert_valid(m)
    assert_interface_kept(model, m)
    assert_same_outputs(model, m, shapes={"x": (3, 3, 8, 8)}, rtol=1e-4)


def test_prepare_rejects_bad_shapes():
    with pytest.raises(ModelError, match="declares rank 4"):
        fold.prepare(full_model(), {"x": (2, 3)})

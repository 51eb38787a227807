"""One-node cases of the reductions, pools and normalizations, shared by the importer and matcher tests.

The tables are what the importers must translate as ONNX Runtime computes them
(``test_importers_reduce``, ``test_importers_max``) and what the matchers must give back as the
same operator (``test_match_reduce``, ``test_match_max``); the builders make one case or model.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_importers import Case

from einopt.core import ir
from einopt.frontend.importers import import_node, sanitize_name
from einopt.frontend.importers_reduce import scope_operand
from einopt.frontend.operand import NodeView, Operand, node_attrs
from einopt.opsets import default_opset

F32 = np.float32


def i64(*v: int) -> np.ndarray:
    """An int64 vector (an axes input)."""
    return np.array(v, dtype=np.int64)


def vec(n: int, seed: int) -> np.ndarray:
    """A float32 vector in [0.5, 1.5) (a constant scale or bias)."""
    return np.random.default_rng(seed).uniform(0.5, 1.5, n).astype(F32)


def pool(id_: str, shape: tuple[int, ...], op: str = "AveragePool", opset: int = 19, **attrs) -> Case:
    """A pooling node of one input of ``shape``."""
    return Case(id_, op, [("x", shape)], attrs, opset=opset)


def max_pool(id_: str, shape: tuple[int, ...], opset: int = 17, **attrs) -> Case:
    return pool(id_, shape, "MaxPool", opset, **attrs)


def ln(id_: str, shape, axis=None, scale_shape=None, bias=True, eps=None) -> Case:
    """LayerNormalization of an input of ``shape`` (scale and bias graph inputs)."""
    attrs = {} if axis is None else {"axis": axis}
    if eps is not None:
        attrs["epsilon"] = eps
    inner = tuple(shape[-1 if axis is None else axis :])
    inputs = [("x", shape), ("scale", scale_shape or inner)]
    if bias:
        inputs.append(("bias", inner))
    return Case(id_, "LayerNormalization", inputs, attrs)


def ln_model(shape, axis, eps, opset=17) -> onnx.ModelProto:
    """LayerNormalization of ``x`` with scale ``s`` and bias ``b`` as graph inputs."""
    inner = list(shape[axis:])
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=axis, epsilon=eps)
    graph = helper.make_graph(
        [node],
        "ln",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, inner),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, inner),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def translate_nodes(model: onnx.ModelProto) -> ir.Program:
    """Every node of ``model`` translated into one program (no partition), inputs by their ONNX names."""
    model = onnx.shape_inference.infer_shapes(model)
    graph, opset = model.graph, default_opset(model)
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    types = {vi.name: vi.type.tensor_type for vi in (*graph.input, *graph.value_info, *graph.output)}
    taken: set[str] = set()
    operands: dict[str, Operand] = {}

    def boundary(name: str) -> Operand:
        value = values.get(name)
        tt = types.get(name)
        shape = tuple(value.shape) if value is not None else tuple(d.dim_value for d in tt.shape.dim)
        elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype) if value is not None else tt.elem_type
        expr = ir.Tensor(sanitize_name(name, taken), shape) if elem == TensorProto.FLOAT and shape else None
        return Operand(name, expr, shape, elem, value)

    last = None
    for node in graph.node:
        for name in node.input:
            if name and name not in operands:
                operands[name] = boundary(name)
        shapes = tuple(
            tuple(d.dim_value for d in types[o].shape.dim) if o in types else None for o in node.output
        )
        view = NodeView(
            node,
            tuple(operands.get(n) for n in node.input),
            shapes,
            opset,
            node_attrs(node),
            lambda a, h: None,
        )
        for o, s in zip(node.output, import_node(view), strict=True):
            operands[o] = scope_operand(s, o)
            last = s
    inputs = tuple(t for t in ir.tensors_in(last))
    return ir.Program(inputs, (("y", last),), ("y",))


# --------------------------------------------------------------------------
# Reductions by sum, AveragePool, LayerNormalization
# --------------------------------------------------------------------------

REDUCTIONS = [
    Case("sum-opset13-input", "ReduceSum", [("x", (2, 3, 4)), ("a", i64(1))], opset=13),
    Case("sum-opset11-attr", "ReduceSum", [("x", (2, 3, 4))], {"axes": [0, 2]}, opset=11),
    Case("sum-negative-axes", "ReduceSum", [("x", (2, 3, 4)), ("a", i64(-1, -3))], {"keepdims": 0}),
    Case("sum-keepdims0", "ReduceSum", [("x", (2, 3, 4)), ("a", i64(1))], {"keepdims": 0}),
    Case("sum-all-axes-absent", "ReduceSum", [("x", (2, 3, 4))]),
    Case("sum-empty-axes", "ReduceSum", [("x", (2, 3)), ("a", np.zeros(0, np.int64))]),
    Case("sum-noop", "ReduceSum", [("x", (2, 3)), ("a", np.zeros(0, np.int64))], {"noop_with_empty_axes": 1}),
    Case("sum-size1-axis", "ReduceSum", [("x", (2, 1, 4)), ("a", i64(1))], {"keepdims": 0}),
    Case("mean-opset13-attr", "ReduceMean", [("x", (2, 3, 4))], {"axes": [1]}, opset=13),
    Case(
        "mean-opset13-attr-keep0",
        "ReduceMean",
        [("x", (2, 3, 4))],
        {"axes": [-1, 0], "keepdims": 0},
        opset=13,
    ),
    Case("mean-opset13-all", "ReduceMean", [("x", (3, 5))], opset=13),
    Case("mean-opset18-input", "ReduceMean", [("x", (2, 3, 4)), ("a", i64(2))], opset=18),
    Case(
        "mean-opset18-negative", "ReduceMean", [("x", (2, 3, 4)), ("a", i64(-2))], {"keepdims": 0}, opset=18
    ),
    Case("mean-opset18-absent", "ReduceMean", [("x", (2, 3, 4))], {"keepdims": 1}, opset=18),
    Case(
        "mean-opset18-noop", "ReduceMean", [("x", (2, 3)), ("a", None)], {"noop_with_empty_axes": 1}, opset=18
    ),
    Case("sumsquare-opset13", "ReduceSumSquare", [("x", (2, 3, 4))], {"axes": [1, 2]}, opset=13),
    Case(
        "sumsquare-opset18", "ReduceSumSquare", [("x", (2, 3, 4)), ("a", i64(0))], {"keepdims": 0}, opset=18
    ),
    Case("sumsquare-noop", "ReduceSumSquare", [("x", (2, 3))], {"noop_with_empty_axes": 1}, opset=18),
    Case("l2-opset13", "ReduceL2", [("x", (2, 3, 4))], {"axes": [-1]}, opset=13),
    Case("l2-opset18", "ReduceL2", [("x", (2, 3, 4)), ("a", i64(0, 1))], {"keepdims": 0}, opset=18),
    Case("l2-noop", "ReduceL2", [("x", (2, 3))], {"noop_with_empty_axes": 1}, opset=18),
    Case("gap-2d", "GlobalAveragePool", [("x", (2, 3, 5, 4))]),
    Case("gap-1d", "GlobalAveragePool", [("x", (2, 3, 7))]),
    Case("gap-3d", "GlobalAveragePool", [("x", (1, 2, 3, 4, 2))]),
]

AVERAGE_POOLS = [
    pool("1d", (2, 3, 9), kernel_shape=[3]),
    pool("1d-stride-pad", (2, 3, 9), kernel_shape=[3], strides=[2], pads=[1, 2]),
    pool("2d", (2, 3, 6, 5), kernel_shape=[2, 3]),
    pool("2d-stride", (1, 2, 7, 7), kernel_shape=[3, 3], strides=[2, 2]),
    pool("2d-pads-exclude", (1, 2, 6, 5), kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    pool("2d-pads-include", (1, 2, 6, 5), kernel_shape=[3, 3], pads=[1, 2, 1, 0], count_include_pad=1),
    pool(
        "2d-pads-stride-include",
        (1, 2, 7, 6),
        kernel_shape=[3, 2],
        pads=[1, 1, 1, 0],
        strides=[2, 2],
        count_include_pad=1,
    ),
    pool(
        "2d-ceil-exclude", (1, 2, 7, 6), kernel_shape=[3, 2], pads=[1, 1, 1, 0], strides=[2, 2], ceil_mode=1
    ),
    pool(
        "2d-ceil-include",
        (1, 2, 7, 6),
        kernel_shape=[3, 2],
        pads=[1, 1, 1, 0],
        strides=[2, 2],
        ceil_mode=1,
        count_include_pad=1,
    ),
    pool("2d-ceil-no-pads", (1, 2, 8, 8), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    pool("2d-dilations", (1, 2, 9, 8), kernel_shape=[2, 2], dilations=[2, 3]),
    pool(
        "2d-dilations-pads-ceil-include",
        (2, 2, 9, 8),
        kernel_shape=[3, 2],
        pads=[1, 1, 1, 0],
        strides=[2, 3],
        dilations=[2, 2],
        count_include_pad=1,
        ceil_mode=1,
    ),
    pool("2d-same-upper", (1, 2, 7, 6), kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    pool(
        "2d-same-lower-include",
        (1, 2, 7, 6),
        kernel_shape=[3, 2],
        strides=[2, 1],
        auto_pad="SAME_LOWER",
        count_include_pad=1,
    ),
    pool("2d-valid", (1, 2, 7, 6), kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID"),
    pool("2d-kernel-1", (1, 2, 4, 4), kernel_shape=[1, 1], strides=[2, 2]),
    pool("3d", (1, 2, 4, 5, 6), kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[0, 1, 0, 1, 1, 1]),
    pool("2d-opset11", (1, 2, 7, 6), opset=11, kernel_shape=[3, 2], pads=[1, 1, 1, 0], ceil_mode=1),
]

LAYER_NORMS = [
    ln("last-axis", (2, 3, 8)),
    ln("axis-1", (2, 3, 4), axis=1),
    ln("axis-negative-2", (2, 3, 4), axis=-2),
    ln("axis-0", (3, 4), axis=0, eps=1e-3),
    ln("no-bias", (2, 5, 6), bias=False),
    ln("scale-leading-ones", (2, 3, 4), axis=-1, scale_shape=(1, 1, 4)),
    ln("rank-4", (2, 2, 3, 4), axis=2, eps=1e-2),
    Case("constant-scale-bias", "LayerNormalization", [("x", (2, 3, 4)), ("s", vec(4, 1)), ("b", vec(4, 2))]),
    Case("one-element-normalized", "LayerNormalization", [("x", (3, 1)), ("s", vec(1, 1)), ("b", vec(1, 2))]),
]


def by_id(table: list[Case], id_: str) -> Case:
    """The case of ``table`` named ``id_``."""
    (case,) = (c for c in table if c.id == id_)
    return case


# --------------------------------------------------------------------------
# ReduceMax, MaxPool, Softmax
# --------------------------------------------------------------------------

REDUCE_MAXES = [
    Case("keep-opset13", "ReduceMax", [("x", (2, 3, 4))], {"axes": [1]}, opset=13),
    Case("drop-opset13", "ReduceMax", [("x", (2, 3, 4))], {"axes": [-1, 0], "keepdims": 0}, opset=13),
    Case("all-opset13", "ReduceMax", [("x", (3, 5))], opset=13),
    Case("input-opset18", "ReduceMax", [("x", (2, 3, 4)), ("a", i64(2))], opset=18),
    Case("input-drop-opset18", "ReduceMax", [("x", (2, 3, 4)), ("a", i64(-2, 0))], {"keepdims": 0}, opset=18),
    Case("no-axes-opset18", "ReduceMax", [("x", (2, 3))], opset=18),
    Case("noop-opset18", "ReduceMax", [("x", (2, 3))], {"noop_with_empty_axes": 1}, opset=18),
    Case("unit-axis", "ReduceMax", [("x", (2, 1, 4))], {"axes": [1]}, opset=13),
]

MAX_POOLS = [
    max_pool("1d", (2, 3, 9), kernel_shape=[3]),
    max_pool("2d-2x2-stride2", (1, 3, 8, 6), kernel_shape=[2, 2], strides=[2, 2]),
    max_pool("2d-3x3-stride2-pad1", (1, 2, 7, 7), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    max_pool("2d-uneven-pads", (1, 2, 6, 5), kernel_shape=[3, 2], pads=[2, 0, 1, 1]),
    max_pool("2d-dilated", (1, 2, 9, 8), kernel_shape=[2, 3], dilations=[2, 1], strides=[1, 2]),
    max_pool("2d-dilated-padded", (1, 1, 7, 7), kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 1, 2, 1]),
    max_pool("2d-ceil", (1, 2, 7, 6), kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    max_pool(
        "2d-ceil-pads", (1, 2, 7, 6), kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 0], ceil_mode=1
    ),
    max_pool("2d-same-upper", (1, 2, 7, 6), kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    max_pool("2d-same-lower", (1, 2, 6, 6), kernel_shape=[2, 3], auto_pad="SAME_LOWER"),
    max_pool("2d-valid", (1, 2, 7, 6), kernel_shape=[3, 2], auto_pad="VALID"),
    max_pool("3d", (1, 2, 4, 5, 4), kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 0, 0, 1, 1]),
    max_pool("opset11", (1, 2, 6, 6), opset=11, kernel_shape=[2, 2], strides=[2, 2]),
]

SOFTMAXES = [
    Case("last-opset13", "Softmax", [("x", (2, 3, 5))], opset=13),
    Case("middle-opset13", "Softmax", [("x", (2, 3, 5))], {"axis": 1}, opset=13),
    Case("first-opset13", "Softmax", [("x", (4, 3))], {"axis": -2}, opset=13),
    Case("vector-opset13", "Softmax", [("x", (6,))], opset=13),
    Case("default-opset11", "Softmax", [("x", (2, 3, 4))], opset=11),  # coerced 2-D at axis 1
    Case("axis2-opset11", "Softmax", [("x", (2, 3, 4, 2))], {"axis": 2}, opset=11),
    Case("axis0-opset11", "Softmax", [("x", (3, 4))], {"axis": 0}, opset=11),  # everything at once
    Case("last-opset11", "Softmax", [("x", (2, 5))], {"axis": -1}, opset=11),
]

"""FLOPs and bytes of an ONNX model, per node from inferred shapes.

Counts are the textbook ones (a multiply-add is 2 FLOPs); data movement
(Reshape, Transpose, Gather, Pad, ...) costs no FLOPs but its bytes; views
(Reshape, Squeeze, Unsqueeze, Flatten, Identity) cost nothing. einopt's
eOperators are ONNX functions: they are inlined first, so their standard ops
are counted like any others.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import onnx
import onnx.inliner
import onnx.shape_inference

from einopt.core.ops import BINARY, UNARY

Shapes = Mapping[str, tuple[int, ...]]
Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Cost:
    """Totals, per-op-type ``(flops, bytes)``, and the nodes whose shapes are unknown (counted as 0)."""

    flops: int
    bytes: int
    by_op: dict[str, tuple[int, int]]
    unknown: list[str]


def _size(shape: Shape) -> int:
    return math.prod(shape)


def _matmul(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    a = ins[0]
    k = a[-1] if len(a) else 1
    return 2 * _size(out) * k


def _gemm(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    trans_a = next((at.i for at in node.attribute if at.name == "transA"), 0)
    k = ins[0][0] if trans_a else ins[0][1]
    return 2 * _size(out) * k + (_size(out) if len(ins) > 2 else 0)


def _conv(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    w = ins[1]  # [F, C/group, k..]: each output element sums C/group * prod(k) products
    return 2 * _size(out) * _size(w[1:]) + (_size(out) if len(ins) > 2 else 0)


def _conv_transpose(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    x, w = ins[0], ins[1]  # w: [C, F/group, k..]: each input element scatters F/group * prod(k) products
    return 2 * _size(x) * _size(w[1:]) + (_size(out) if len(ins) > 2 else 0)


def _einsum(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    """One multiply (and add) per point of the joint index space of the operands, per extra operand."""
    eq = next((at.s.decode() for at in node.attribute if at.name == "equation"), "")
    lhs = eq.replace(" ", "").split("->")[0].split(",")
    if len(lhs) != len(ins) or any(
        "." in term or len(term) != len(shape) for term, shape in zip(lhs, ins, strict=True)
    ):
        return 0  # broadcast ellipses: left uncounted rather than guessed
    extent: dict[str, int] = {}
    for term, shape in zip(lhs, ins, strict=True):
        for letter, n in zip(term, shape, strict=True):
            extent[letter] = max(extent.get(letter, 1), n)
    return max(1, 2 * (len(ins) - 1)) * math.prod(extent.values())


def _per_output(k: float) -> Callable[[Sequence[Shape], Shape, onnx.NodeProto], int]:
    return lambda ins, out, node: int(k * _size(out))


def _per_input(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    return _size(ins[0])


def _pool(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    kernel = next((list(at.ints) for at in node.attribute if at.name == "kernel_shape"), [1])
    return _size(out) * math.prod(kernel)


# Element-wise ONNX ops einopt has no IR operation for (those it has are rows of einopt.core.ops,
# whose ``flops`` say what an element costs).
_ELEMENTWISE = (
    "PRelu Clip Pow Where Equal Less Greater Not And Or Mean Reciprocal Floor Ceil Round Sign"
).split()
_TRANSCENDENTAL = "Log Erf Gelu Elu Selu Softplus HardSigmoid HardSwish Sin Cos".split()
_IR_ELEMENTWISE: dict[str, int] = {
    **{op.onnx: op.flops for op in UNARY.values()},
    **{name: op.flops for op in BINARY.values() for name in (op.onnx, op.onnx_variadic) if name},
}

FLOPS: dict[str, Callable[[Sequence[Shape], Shape, onnx.NodeProto], int]] = {
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Einsum": _einsum,
    "BatchNormalization": _per_output(2),
    "LayerNormalization": _per_output(6),
    "Softmax": _per_output(4),
    "LogSoftmax": _per_output(4),
    "ReduceSum": _per_input,
    "ReduceMean": _per_input,
    "ReduceMax": _per_input,
    "GlobalAveragePool": _per_input,
    "GlobalMaxPool": _per_input,
    "MaxPool": _pool,
    "AveragePool": _pool,
    **{op: _per_output(1) for op in _ELEMENTWISE},
    **{op: _per_output(4) for op in _TRANSCENDENTAL},
    **{op: _per_output(flops) for op, flops in _IR_ELEMENTWISE.items()},
}
"""FLOPs of a node from its input shapes, output shape and attributes; ops not listed (data movement) have 0."""


def _col_buffer(ins: Sequence[Shape], out: Shape, node: onnx.NodeProto) -> int:
    """ConvTranspose runs as a GEMM into a column buffer, then col2im adds the columns into the
    output: ``F * prod(k)`` values per input position, written once and read once."""
    x, w = ins[0], ins[1]
    group = next((at.i for at in node.attribute if at.name == "group"), 1)
    return 2 * x[0] * group * _size(w[1:]) * _size(x[2:])


WORKSPACE: dict[str, Callable[[Sequence[Shape], Shape, onnx.NodeProto], int]] = {
    "ConvTranspose": _col_buffer,
}
"""Elements a node moves through a scratch buffer besides its inputs and outputs (as ONNX Runtime's
CPU kernels run it), counted in its bytes."""

VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
"""Ops that ONNX Runtime can run without moving data: no bytes."""


def itemsize(dtype: int) -> int:
    """Bytes per element of an ONNX element type (4 for types numpy cannot represent)."""
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(dtype).itemsize
    except (KeyError, ValueError, TypeError):
        return 4


def _value_types(model: onnx.ModelProto) -> dict[str, tuple[Shape, int]]:
    g = model.graph
    types: dict[str, tuple[Shape, int]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if all(d is not None for d in dims):
            types[vi.name] = (tuple(dims), t.elem_type)
    for init in g.initializer:
        types[init.name] = (tuple(init.dims), init.data_type)
    for node in g.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            t = node.attribute[0].t
            types[node.output[0]] = (tuple(t.dims), t.data_type)
    return types


def value_bytes(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes of every value of ``model`` whose shape is fully known (inputs, initializers, intermediates)."""
    return {name: _size(shape) * itemsize(dtype) for name, (shape, dtype) in _value_types(model).items()}


def model_cost(model: onnx.ModelProto) -> Cost:
    """FLOPs and bytes moved by one run of ``model`` (local functions inlined, shapes inferred).

    Parameters
    ----------
    model : onnx.ModelProto
        Any model; nodes whose shapes cannot be inferred count 0 and are listed in ``unknown``.

    Returns
    -------
    Cost
    """
    m = onnx.inliner.inline_local_functions(model) if model.functions else model
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - a model shape inference rejects still gets what is declared
        pass
    types = _value_types(m)
    sizes = value_bytes(m)
    flops = nbytes = 0
    by_op: dict[str, list[int]] = {}
    unknown: list[str] = []
    for i, node in enumerate(m.graph.node):
        names = [n for n in node.input if n] + [n for n in node.output if n]
        if node.op_type == "Constant":
            continue
        if not node.output or any(n not in types for n in names):
            unknown.append(node.name or f"{node.op_type}_{i}")
            continue
        ins = [types[n][0] for n in node.input if n]
        out = types[node.output[0]][0]
        f = FLOPS[node.op_type](ins, out, node) if node.op_type in FLOPS else 0
        b = 0 if node.op_type in VIEWS else sum(sizes[n] for n in names)
        if node.op_type in WORKSPACE:
            b += WORKSPACE[node.op_type](ins, out, node) * itemsize(types[node.output[0]][1])
        flops += f
        nbytes += b
        acc = by_op.setdefault(node.op_type, [0, 0])
        acc[0] += f
        acc[1] += b
    return Cost(int(flops), int(nbytes), {k: (int(v[0]), int(v[1])) for k, v in by_op.items()}, unknown)


# A 2-core CPU's orders of magnitude; the search only compares estimates with each other, and the
# next stage replaces them by measurements.
PEAK_FLOPS = 50e9
"""FLOP/s assumed by :func:`estimate_seconds`."""
BANDWIDTH = 10e9
"""Bytes/s assumed by :func:`estimate_seconds`."""


def estimate_seconds(cost: Cost, *, peak_flops: float = PEAK_FLOPS, bandwidth: float = BANDWIDTH) -> float:
    """An analytic run time: FLOPs at the peak rate plus bytes at the memory bandwidth."""
    return cost.flops / peak_flops + cost.bytes / bandwidth

"""Importers of element-wise ONNX operators: arithmetic, activations, BatchNormalization.

Every result is ``L i0, i1, ..: f(A[..], B[..], ..)`` over the broadcast
output shape, operands read with :func:`~einopt.frontend.operand.read`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from einopt.core import ir
from einopt.core.ops import BINARY, UNARY, UnaryOp
from einopt.frontend.operand import (
    Importer,
    NodeView,
    Operand,
    Unsupported,
    access,
    broadcast_shapes,
    checked_output,
    constant,
    float_data,
    numbered,
    operand_shape,
    read,
)

__all__ = ["ELEMENTWISE_IMPORTERS"]


def _present_inputs(view: NodeView) -> list[Operand]:
    """All inputs of a variadic node, each checked to be float32 data."""
    ops = [float_data(view.input(i), f"input {i}") for i in range(len(view.inputs))]
    if not ops:
        raise Unsupported(f"{view.op_type} without inputs")
    return ops


def _pointwise(view: NodeView, operands: list[Operand], body: Callable[..., ir.ValueExpr]) -> ir.Scope:
    """``L i..: body(read(op0), read(op1), ..)`` over the broadcast shape of ``operands``."""
    shape = checked_output(view, 0, broadcast_shapes(operands))
    its = numbered("i", shape)
    return ir.Scope(its, (), body(*(read(o, its) for o in operands)))


def _refuse_legacy_broadcast(view: NodeView) -> None:
    # Before opset 7 broadcasting was opt-in with 'broadcast'/'axis' attributes.
    if view.attr("broadcast") is not None or view.attr("axis") is not None:
        raise Unsupported(f"legacy {view.op_type} broadcast attributes (opset < 7)")


def _binary(op: str) -> Importer:
    def importer(view: NodeView) -> tuple[ir.Scope, ...]:
        _refuse_legacy_broadcast(view)
        a = float_data(view.input(0), "input A")
        b = float_data(view.input(1), "input B")
        return (_pointwise(view, [a, b], lambda x, y: ir.Binary(op, x, y)),)

    importer.__doc__ = f"``A {op} B`` with broadcasting."
    return importer


def _variadic(op: str) -> Importer:
    def importer(view: NodeView) -> tuple[ir.Scope, ...]:
        def fold(*xs: ir.ValueExpr) -> ir.ValueExpr:
            out = xs[0]
            for x in xs[1:]:
                out = ir.Binary(op, out, x)
            return out

        return (_pointwise(view, _present_inputs(view), fold),)

    importer.__doc__ = f"``((A {op} B) {op} C) ..`` with broadcasting; one input is a copy."
    return importer


def _unary(op: UnaryOp) -> Importer:
    def importer(view: NodeView) -> tuple[ir.Scope, ...]:
        param = None if op.onnx_param is None else float(view.attr(op.onnx_param, op.param_default))
        x = float_data(view.input(0), "input X")
        return (_pointwise(view, [x], lambda v: ir.Unary(op.name, v, param)),)

    if op.onnx_param is None:
        importer.__doc__ = f"``{op.name}(X)``."
    else:
        importer.__doc__ = (
            f"``{op.name}(X, {op.onnx_param})`` ({op.onnx_param} defaults to {op.param_default})."
        )
    return importer


def import_prelu(view: NodeView) -> tuple[ir.Scope, ...]:
    """``max(X, 0) + A * min(X, 0)`` with the slope ``A`` broadcast to ``X``."""
    x = float_data(view.input(0), "input X")
    slope = float_data(view.input(1), "slope")
    if broadcast_shapes([x, slope]) != operand_shape(x):
        raise Unsupported(f"slope shape {list(operand_shape(slope))} does not broadcast to X")
    zero = ir.Const(0.0)

    def body(v: ir.ValueExpr, a: ir.ValueExpr) -> ir.ValueExpr:
        return ir.Binary("+", ir.Binary("max", v, zero), ir.Binary("*", a, ir.Binary("min", v, zero)))

    return (_pointwise(view, [x, slope], body),)


# ONNX Clip's default bounds: numeric_limits<float>::lowest() and max(), so +-inf clamp to +-FLT_MAX.
_FLT_MAX = float(np.finfo(np.float32).max)


def _clip_bound(view: NodeView, index: int, attr: str, default: float) -> float:
    """A Clip bound: an attribute before opset 11, an optional constant input since; ``default`` if absent."""
    if view.opset < 11:
        value = view.attr(attr)
        return default if value is None else float(value)
    operand = view.input(index)
    if operand is None:
        return default
    arr = constant(operand, f"Clip {attr}")
    if arr.size != 1 or arr.dtype.kind != "f":
        raise Unsupported(f"Clip {attr} must be one float, got {arr.dtype} of shape {list(arr.shape)}")
    return float(arr.reshape(-1)[0])


def import_clip(view: NodeView) -> tuple[ir.Scope, ...]:
    """``min(max(X, lo), hi)``; an absent bound is ``-+FLT_MAX`` (ONNX's default), an infinite one is left out."""
    x = float_data(view.input(0), "input X")
    lo = _clip_bound(view, 1, "min", -_FLT_MAX)
    hi = _clip_bound(view, 2, "max", _FLT_MAX)
    if math.isnan(lo) or math.isnan(hi):
        raise Unsupported("Clip bound is NaN")

    def body(v: ir.ValueExpr) -> ir.ValueExpr:
        if lo != -math.inf:  # max(x, -inf) is x, NaN included
            v = ir.Binary("max", v, ir.Const(lo))
        if hi != math.inf:
            v = ir.Binary("min", v, ir.Const(hi))
        return v

    return (_pointwise(view, [x], body),)


def import_batch_normalization(view: NodeView) -> tuple[ir.Scope, ...]:
    """Inference BatchNormalization ``X[n, c, ..] * scale[c] + shift[c]``.

    ``scale = gamma / sqrt(var + epsilon)`` and ``shift = beta - mean * scale``
    are folded (in float64, stored as float32) into new constants.
    """
    if view.opset < 7:
        raise Unsupported("BatchNormalization before opset 7 (is_test/spatial semantics)")
    if view.attr("training_mode", 0):
        raise Unsupported("BatchNormalization in training mode")
    if view.attr("spatial", 1) != 1:
        raise Unsupported("BatchNormalization with spatial=0")
    if sum(1 for name in view.node.output if name) != 1:
        raise Unsupported("BatchNormalization with running-statistics outputs (training form)")
    x = float_data(view.input(0), "input X")
    shape = operand_shape(x)
    if len(shape) < 2:
        raise Unsupported(f"BatchNormalization input of rank {len(shape)} (needs N, C, ..)")
    channels = shape[1]
    params = []
    for i, what in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        operand = view.input(i)
        if operand is not None and operand.elem_type != onnx.TensorProto.FLOAT:
            raise Unsupported(f"BatchNormalization {what}: only float32 parameters")
        arr = constant(operand, f"BatchNormalization {what}").astype(np.float64)
        if arr.shape != (channels,):
            raise Unsupported(f"BatchNormalization {what} of shape {list(arr.shape)}, expected [{channels}]")
        params.append(arr)
    gamma, beta, mean, var = params
    eps = float(view.attr("epsilon", 1e-5))
    scale = gamma / np.sqrt(var + eps)
    shift = beta - mean * scale
    folded = []
    for arr, hint in ((scale, "bn_scale"), (shift, "bn_shift")):
        arr32 = arr.astype(np.float32)
        tensor = view.new_constant(arr32, hint)
        folded.append(Operand(tensor.name, tensor, (channels,), onnx.TensorProto.FLOAT, arr32))
    out = checked_output(view, 0, shape)
    its = numbered("i", out)
    scale_op, shift_op = folded
    body = ir.Binary(
        "+",
        ir.Binary("*", read(x, its), access(scale_op, (its[1],))),
        access(shift_op, (its[1],)),
    )
    return (ir.Scope(its, (), body),)


ELEMENTWISE_IMPORTERS: dict[str, Importer] = {
    # The IR's element-wise operations, from their rows in einopt.core.ops.
    **{op.onnx: _binary(op.name) for op in BINARY.values() if op.onnx != op.onnx_variadic},
    **{op.onnx_variadic: _variadic(op.name) for op in BINARY.values() if op.onnx_variadic},
    **{op.onnx: _unary(op) for op in UNARY.values()},
    "PRelu": import_prelu,
    "Clip": import_clip,
    "BatchNormalization": import_batch_normalization,
}

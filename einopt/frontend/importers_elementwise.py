"""Importers of element-wise ONNX operators: arithmetic, activations, BatchNormalization.

Every result is ``L i0, i1, ..: f(A[..], B[..], ..)`` over the broadcast
output shape, operands read with :func:`~einopt.frontend.operand.read`.

Operators that are compositions of the IR's operations (HardSigmoid, HardSwish,
Gelu, Reciprocal, Pow with the exponents 2, 3, 1/2, -1 and 1) become the
expression ONNX Runtime's CPU kernel computes, operation for operation in
float32 (:func:`hard_sigmoid`, :func:`gelu`): the interpreter in float32 then
gives ORT's values, up to an ulp of its erf, tanh and pow.
``einopt.instantiate.match_elementwise`` recognises these expressions to write
the single operator back.
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
    broadcast_dims,
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
        x = float_data(view.input(0), "input X")
        shape: tuple[int, ...] = ()
        if op.param_input:
            _refuse_legacy_broadcast(view)
            param, shape = _constant_number(view, 1, op.param or "parameter")
        elif op.onnx_param is not None:
            param = float(view.attr(op.onnx_param, op.param_default))
        else:
            param = None
        form = _PARTICULAR.get(op.name, {}).get(param, lambda v: ir.Unary(op.name, v, param))
        return (_pointwise_to(view, x, shape, form),)

    if op.onnx_param is None:
        importer.__doc__ = f"``{op.name}(X)``."
    elif op.param_input:
        importer.__doc__ = f"``{op.name}(X, {op.onnx_param})`` for a constant one-element {op.onnx_param}."
    else:
        importer.__doc__ = (
            f"``{op.name}(X, {op.onnx_param})`` ({op.onnx_param} defaults to {op.param_default})."
        )
    return importer


def _constant_number(view: NodeView, index: int, what: str) -> tuple[float, tuple[int, ...]]:
    """The value and shape of a constant one-element numeric input (a parameter given as an input)."""
    operand = view.input(index)
    if operand is None:
        raise Unsupported(f"missing input {what}")
    if operand.value is None:
        raise Unsupported(
            f"{view.op_type} {what} {operand.name} is not a constant (only a constant is translated)"
        )
    arr = np.asarray(operand.value)
    if arr.dtype.kind not in "fiu":
        raise Unsupported(f"{view.op_type} {what} {operand.name}: {arr.dtype} (only a number)")
    if arr.size != 1:
        raise Unsupported(
            f"{view.op_type} {what} {operand.name} has {arr.size} elements (only one constant {what} is translated)"
        )
    value = float(arr.reshape(-1)[0])
    if not math.isfinite(value):
        raise Unsupported(f"{view.op_type} {what} {operand.name} is {value}")
    return value, tuple(int(n) for n in arr.shape)


def _pointwise_to(
    view: NodeView, x: Operand, other: tuple[int, ...], body: Callable[[ir.ValueExpr], ir.ValueExpr]
) -> ir.Scope:
    """``L i..: body(read(x))`` over the broadcast of ``x``'s shape and ``other`` (a constant
    operand's shape: a one-element exponent of higher rank adds leading 1s to the result)."""
    shape = checked_output(view, 0, broadcast_dims(operand_shape(x), other))
    its = numbered("i", shape)
    return ir.Scope(its, (), body(read(x, its)))


# Pow (a constant one-element exponent, float or integer; a varying or per-element one is refused)
# with an exponent whose power is an expression of the IR: ONNX Runtime computes x * x and x * x * x
# for a one-element exponent 2 and 3 (std::pow otherwise); pow(x, 1) is x. Its powf of 1/2 and -1
# is within an ulp of sqrt(x) and 1/x (which are correctly rounded) and differs only at
# -inf ** 1/2 (inf; sqrt gives NaN) and in the sign of -0 ** 1/2 (+0; sqrt gives -0).
_POWERS: dict[float | None, Callable[[ir.ValueExpr], ir.ValueExpr]] = {
    1.0: lambda x: x,
    2.0: lambda x: ir.Binary("*", x, x),
    3.0: lambda x: ir.Binary("*", ir.Binary("*", x, x), x),
    0.5: lambda x: ir.Unary("sqrt", x),
    -1.0: lambda x: ir.Binary("/", ir.Const(1.0), x),
}


# IR expressions for particular parameters of a function, imported instead of the function.
_PARTICULAR: dict[str, dict[float | None, Callable[[ir.ValueExpr], ir.ValueExpr]]] = {"pow": _POWERS}


def import_reciprocal(view: NodeView) -> tuple[ir.Scope, ...]:
    """``1 / X`` (ONNX Runtime divides: the same float32 values)."""
    x = float_data(view.input(0), "input X")
    return (_pointwise(view, [x], lambda v: ir.Binary("/", ir.Const(1.0), v)),)


def hard_sigmoid(x: ir.ValueExpr, alpha: float, beta: float) -> ir.ValueExpr:
    """HardSigmoid as ONNX Runtime computes it.

    Parameters
    ----------
    x : ir.ValueExpr
        The argument.
    alpha, beta : float
        The slope and offset (ONNX's attributes, float32 values).

    Returns
    -------
    ir.ValueExpr
        ``max(min(alpha * x + beta, 1), 0)``: the product and the sum rounded to float32 each
        (no fused multiply-add), then the clamp (NaN stays NaN).
    """
    affine = ir.Binary("+", ir.Binary("*", ir.Const(alpha), x), ir.Const(beta))
    return ir.Binary("max", ir.Binary("min", affine, ir.Const(1.0)), ir.Const(0.0))


# HardSwish is x * HardSigmoid(x) with these (ONNX's definition; the attribute is float32's 1/6).
HARD_SWISH_ALPHA = float(np.float32(1 / 6))
HARD_SWISH_BETA = 0.5


def hard_swish(x: ir.ValueExpr) -> ir.ValueExpr:
    """``x * hard_sigmoid(x, 1/6, 1/2)``: ONNX Runtime's HardSwish."""
    return ir.Binary("*", x, hard_sigmoid(x, HARD_SWISH_ALPHA, HARD_SWISH_BETA))


# ONNX Runtime's Gelu constants, rounded to float32 as its kernel does: 1/sqrt(2) for the erf form;
# sqrt(2/pi) and 0.044715 * sqrt(2/pi) for the tanh form.
GELU_SQRT1_2 = float(np.float32(math.sqrt(0.5)))
GELU_TANH_B = float(np.float32(math.sqrt(2 / math.pi)))
GELU_TANH_C = float(np.float32(0.044715 * math.sqrt(2 / math.pi)))


def gelu(x: ir.ValueExpr, approximate: str = "none") -> ir.ValueExpr:
    """Gelu as ONNX Runtime's kernel computes it, in its order of float32 operations.

    Parameters
    ----------
    x : ir.ValueExpr
        The argument.
    approximate : {"none", "tanh"}
        ONNX's attribute: the exact (erf) form or the tanh approximation.

    Returns
    -------
    ir.ValueExpr
        ``"none"``: ``(0.5 * x) * (erf(x * GELU_SQRT1_2) + 1)``; ``"tanh"``:
        ``(0.5 * x) * (tanh(x * ((GELU_TANH_C * x) * x + GELU_TANH_B)) + 1)``, which is
        ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` factored (and rounded differently
        from that form as written, which exporters decompose). ORT's Gelu equals the chain of
        its Erf (Tanh) and these float32 operations bit for bit.

    Raises
    ------
    ValueError
        For another ``approximate``.
    """
    if approximate == "none":
        inner = ir.Unary("erf", ir.Binary("*", x, ir.Const(GELU_SQRT1_2)))
    elif approximate == "tanh":
        cubic = ir.Binary("*", ir.Binary("*", ir.Const(GELU_TANH_C), x), x)
        inner = ir.Unary("tanh", ir.Binary("*", x, ir.Binary("+", cubic, ir.Const(GELU_TANH_B))))
    else:
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return ir.Binary("*", ir.Binary("*", ir.Const(0.5), x), ir.Binary("+", inner, ir.Const(1.0)))


def import_hard_sigmoid(view: NodeView) -> tuple[ir.Scope, ...]:
    """``max(min(alpha * X + beta, 1), 0)`` (alpha defaults to 0.2, beta to 0.5)."""
    # float32 attributes: an absent one is the float32 default, as ORT reads it.
    alpha, beta = (float(np.float32(view.attr(a, d))) for a, d in (("alpha", 0.2), ("beta", 0.5)))
    x = float_data(view.input(0), "input X")
    return (_pointwise(view, [x], lambda v: hard_sigmoid(v, alpha, beta)),)


def import_hard_swish(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X * max(min(X / 6 + 1/2, 1), 0)`` (with float32's 1/6 as the factor)."""
    x = float_data(view.input(0), "input X")
    return (_pointwise(view, [x], hard_swish),)


# The first default-domain opset with Gelu (an older model's Gelu is some other domain's).
GELU_OPSET = 20


def import_gelu(view: NodeView) -> tuple[ir.Scope, ...]:
    """Gelu (opset 20) with ``approximate`` "none" (the erf form) or "tanh" (see :func:`gelu`)."""
    if view.opset < GELU_OPSET:
        raise Unsupported(
            f"Gelu is a default-domain operator from opset {GELU_OPSET} (the model has {view.opset})"
        )
    approximate = view.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"Gelu approximate={approximate!r} (only 'none' and 'tanh')")
    x = float_data(view.input(0), "input X")
    return (_pointwise(view, [x], lambda v: gelu(v, approximate)),)


def import_prelu(view: NodeView) -> tuple[ir.Scope, ...]:
    """``max(X, 0) + A * min(X, 0)`` with the slope ``A`` broadcast to ``X``: ONNX Runtime's PRelu
    for a finite slope (an infinite or NaN slope times the zero of ``min(X, 0)`` is NaN where
    ONNX Runtime gives ``X``)."""
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
    scale_op, shift_op = (view.constant_operand(scale, "bn_scale"), view.constant_operand(shift, "bn_shift"))
    out = checked_output(view, 0, shape)
    its = numbered("i", out)
    body = ir.Binary(
        "+",
        ir.Binary("*", read(x, its), access(scale_op, (its[1],))),
        access(shift_op, (its[1],)),
    )
    return (ir.Scope(its, (), body),)


_LOWEST = float(np.finfo(np.float32).min)


def import_where(view: NodeView) -> tuple[ir.Scope, ...]:
    """``Where(C, A, B)`` for a constant condition ``C``, as arithmetic on float32 ``A`` and ``B``.

    - ``C`` the same everywhere: ``A`` or ``B``, broadcast.
    - ``B`` one constant no greater than float32's lowest finite value (-3.4e38 or -inf: a masked
      score, what transformers write for a causal mask): ``A + where(C, 0, B)``, an additive mask
      (attention's bias). Equal to Where for every finite ``A`` when ``B`` is -inf, and for every
      ``|A| < 2^103`` when it is -3.4e38 (beyond, the sum moves off the lowest value).
    - Otherwise ``A * C + B * (1 - C)`` with ``C`` as a 0/1 float32 constant (the product with a
      constant ``B`` folded): equal for finite ``A`` and ``B``, up to the sign of a zero.
    """
    cond = view.input(0)
    if cond is None or cond.value is None:
        raise Unsupported(f"Where condition {cond.name if cond else ''} is not a constant")
    c = np.asarray(cond.value).astype(bool)
    a = float_data(view.input(1), "input X")
    b = float_data(view.input(2), "input Y")
    shape = checked_output(view, 0, broadcast_dims(c.shape, operand_shape(a), operand_shape(b)))
    its = numbered("i", shape)
    if c.all() or not c.any():
        chosen = a if c.all() else b
        return (ir.Scope(its, (), read(chosen, its)),)

    b_value = None if b.value is None else np.asarray(b.value, np.float32)
    if b_value is not None and b_value.size == 1 and float(b_value.reshape(-1)[0]) <= _LOWEST:
        mask = view.constant_operand(np.where(c, np.float32(0), b_value.reshape(-1)[0]), "where_mask")
        return (ir.Scope(its, (), ir.Binary("+", read(a, its), read(mask, its))),)
    taken = ir.Binary("*", read(a, its), read(view.constant_operand(c, "where_cond"), its))
    if b_value is not None:
        other = read(view.constant_operand(np.where(c, np.float32(0), b_value), "where_else"), its)
    else:
        other = ir.Binary("*", read(b, its), read(view.constant_operand(~c, "where_not_cond"), its))
    return (ir.Scope(its, (), ir.Binary("+", taken, other)),)


ELEMENTWISE_IMPORTERS: dict[str, Importer] = {
    # The IR's element-wise operations, from their rows in einopt.core.ops.
    **{op.onnx: _binary(op.name) for op in BINARY.values() if op.onnx != op.onnx_variadic},
    **{op.onnx_variadic: _variadic(op.name) for op in BINARY.values() if op.onnx_variadic},
    **{op.onnx: _unary(op) for op in UNARY.values()},
    "Reciprocal": import_reciprocal,
    "HardSigmoid": import_hard_sigmoid,
    "HardSwish": import_hard_swish,
    "Gelu": import_gelu,
    "PRelu": import_prelu,
    "Clip": import_clip,
    "BatchNormalization": import_batch_normalization,
    "Where": import_where,
}

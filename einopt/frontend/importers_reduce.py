"""Importers of reductions by sum and normalizations: ReduceSum, ReduceMean, ReduceSumSquare,
ReduceL2, GlobalAveragePool, AveragePool, LayerNormalization.

The forms (``einopt.instantiate.match_reduce`` reads them back):

* ReduceSum: ``L kept.. Sum red..: X[..]``. With ``keepdims=1`` every reduced dimension stays as
  an unread traversal iterator of extent 1. Empty axes reduce every axis, or none with
  ``noop_with_empty_axes=1`` (a reduction over no axis: ``X`` itself, ``X * X`` for
  ReduceSumSquare, as ONNX Runtime computes it).
* ReduceMean: the same body times ``1/N`` (``N`` = the number of elements reduced into one).
* ReduceSumSquare: ``X[..] * X[..]``; ReduceL2: ``L: sqrt(S[..])`` over that scope.
* GlobalAveragePool: ReduceMean over the spatial axes with ``keepdims=1`` (one canonical key for
  both).
* AveragePool: ``L n, c, o.. Sum t..: X[n, c, o*s + t*d - pb, ..] * (1/K)`` when every window
  divides by the kernel size ``K``; otherwise ``X[..] / Cnt[o..]`` with the count scope
  ``Cnt = L o.. Sum t..: Ones[o*s + t*d - pb, ..]`` over ``Ones = L h..: 1.0`` on ``[0, H)``
  (``count_include_pad=0``) or ``[-pb, H + pe)`` (``count_include_pad=1``, where ONNX Runtime
  clips a window to the padded input). Reads outside ``Ones`` are 0, so ``Cnt`` is exactly the
  number of taps ONNX Runtime divides by, and both are constant scopes (folded when emitted).
* LayerNormalization (``stash_type=1``): the chain its exporters write, one scope per step::

      M  = ReduceMean(X, axes=[axis..], keepdims=1)     D  = X - M
      DD = D * D                                         V  = ReduceMean(DD, keepdims=1)
      VE = V + epsilon                                   SD = sqrt(VE)
      Y  = (D / SD) * Scale (+ B)

  as ONNX Runtime 1.32 computes it (a centred two-pass variance; its AVX2 kernel multiplies by
  ``1 / SD`` where this divides, the same up to rounding), so the decomposed exporter form and
  the operator translate to one canonical key. The optional outputs are ``M`` and ``1 / SD``;
  they are refused when named (the training form: the one operator cannot give them back).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from einopt.core import ir
from einopt.core.index import simplify
from einopt.core.interp import evaluate
from einopt.frontend.operand import (
    Importer,
    NodeView,
    Operand,
    Unsupported,
    access,
    checked_output,
    float_data,
    numbered,
    operand_shape,
    read,
)
from einopt.frontend.pooling import (
    PoolGeometry,
    normalized_axes,
    pool_geometry,
    reduce_axes,
)

__all__ = [
    "REDUCE_IMPORTERS",
    "NONLINEAR",
    "reduction",
    "reduce_importer",
    "average_pool",
    "count_scope",
    "layer_norm",
    "LayerNorm",
]

Shape = tuple[int, ...]


# --------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------


def scope_operand(scope: ir.Scope, name: str) -> Operand:
    """A scope as the float32 operand of a following step (what the translator hands the next node)."""
    return Operand(name, scope, scope.shape, onnx.TensorProto.FLOAT)


def reduced_shape(shape: Shape, axes: Sequence[int], keepdims: bool) -> Shape:
    """The output shape of a reduction over ``axes`` (normalised, distinct)."""
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def reduction(
    x: Operand, axes: Sequence[int], keepdims: bool, *, square: bool = False, mean: bool = False
) -> ir.Scope:
    """``L kept.. Sum red..: f(X[..])``: the sum (``mean``: times ``1/N``) of ``X`` or ``X * X``.

    Parameters
    ----------
    x : Operand
        The float32 data.
    axes : sequence of int
        Normalised (non-negative), distinct axes to reduce; empty for a reduction over none.
    keepdims : bool
        Keep each reduced axis as an unread traversal iterator of extent 1.
    square : bool
        Sum ``X * X`` (ReduceSumSquare).
    mean : bool
        Multiply by ``1/N``, ``N`` the number of elements summed into one (ReduceMean).

    Returns
    -------
    ir.Scope
        The reduction; its traversal iterators are ``i0, i1, ..``, its summation ``k0, k1, ..``.
    """
    shape = operand_shape(x)
    axes = sorted(axes)
    its = numbered("i", reduced_shape(shape, axes, keepdims))
    ks = numbered("k", [shape[d] for d in axes])
    kept = iter([it for d, it in enumerate(its) if d not in axes] if keepdims else its)
    idx = [ks[axes.index(d)] if d in axes else next(kept) for d in range(len(shape))]
    body = access(x, idx)
    if square:
        body = ir.Binary("*", body, body)
    count = math.prod(shape[d] for d in axes)
    if mean and count != 1:
        body = ir.Binary("*", body, ir.Const(1.0 / count))
    return ir.Scope(its, ks, body)


def reduce_importer(since: int, build: Callable[[Operand, list[int], bool], ir.Scope]) -> Importer:
    """The importer of a Reduce* node: its axes (an attribute before opset ``since``, an input from
    it on, ``noop_with_empty_axes``) and ``keepdims`` read and checked, then ``build(x, axes, keepdims)``."""

    def importer(view: NodeView) -> tuple[ir.Scope, ...]:
        x = float_data(view.input(0), "input data")
        shape = operand_shape(x)
        axes = reduce_axes(view, len(shape), since)
        keepdims = bool(view.attr("keepdims", 1))
        checked_output(view, 0, reduced_shape(shape, axes, keepdims))
        return (build(x, axes, keepdims),)

    return importer


import_reduce_sum = reduce_importer(13, reduction)
import_reduce_sum.__doc__ = "``L kept.. Sum red..: X[..]`` (axes an input from opset 13)."
import_reduce_mean = reduce_importer(18, functools.partial(reduction, mean=True))
import_reduce_mean.__doc__ = "``L kept.. Sum red..: X[..] * (1/N)`` (axes an input from opset 18)."
import_reduce_sum_square = reduce_importer(18, functools.partial(reduction, square=True))
import_reduce_sum_square.__doc__ = "``L kept.. Sum red..: X[..] * X[..]`` (axes an input from opset 18)."


def import_reduce_l2(view: NodeView) -> tuple[ir.Scope, ...]:
    """``L: sqrt(S[..])`` over the ReduceSumSquare scope ``S``."""
    (s,) = import_reduce_sum_square(view)
    return (ir.Scope(s.traversal, (), ir.Unary("sqrt", ir.Access(s, s.traversal))),)


def import_global_average_pool(view: NodeView) -> tuple[ir.Scope, ...]:
    """ReduceMean over every spatial axis with ``keepdims=1``."""
    x = float_data(view.input(0), "input X")
    shape = operand_shape(x)
    if len(shape) < 3:
        raise Unsupported(f"GlobalAveragePool of {list(shape)} (needs N, C, spatial..)")
    axes = list(range(2, len(shape)))
    checked_output(view, 0, reduced_shape(shape, axes, True))
    return (reduction(x, axes, True, mean=True),)


# --------------------------------------------------------------------------
# AveragePool
# --------------------------------------------------------------------------


def _window(o: ir.Iter, t: ir.Iter, s: int, d: int, pb: int) -> ir.IndexExpr:
    return simplify(o * s + t * d - pb)


def count_scope(spatial: Shape, g: PoolGeometry, include_pad: bool) -> ir.Scope:
    """``L o.. Sum t..: Ones[o*s + t*d - pb, ..]``: the number of taps a window divides by.

    ``Ones = L h..: 1.0`` covers the input (``[0, H)``) or, with ``include_pad``, the padded input
    (``[-pb, H + pe)``); reads outside it are 0.
    """
    ranges = [
        (-pb, n + pe) if include_pad else (0, n)
        for n, pb, pe in zip(spatial, g.pads_begin, g.pads_end, strict=True)
    ]
    ones = ir.Scope(tuple(ir.Iter(f"h{d}", lo, hi) for d, (lo, hi) in enumerate(ranges)), (), ir.Const(1.0))
    os_, ts = numbered("o", g.out), numbered("t", g.kernel)
    idx = tuple(
        _window(o, t, s, d, pb)
        for o, t, s, d, pb in zip(os_, ts, g.strides, g.dilations, g.pads_begin, strict=True)
    )
    return ir.Scope(os_, ts, ir.Access(ones, idx))


def average_pool(x: Operand, g: PoolGeometry, include_pad: bool) -> ir.Scope:
    """``L n, c, o.. Sum t..: X[n, c, o*s + t*d - pb, ..] * (1/K)``, or ``/ Cnt[o..]`` where the
    divisor varies (see the module docstring).

    Raises
    ------
    Unsupported
        When a window reads only padding with ``count_include_pad=0`` (ONNX Runtime outputs 0
        there; the form would divide 0 by 0).
    """
    shape = operand_shape(x)
    spatial = shape[2:]
    cnt = count_scope(spatial, g, include_pad)
    counts = evaluate(cnt, {})
    if not np.all(counts > 0):
        raise Unsupported("AveragePool window over padding only (count_include_pad=0)")
    n, c = numbered("b", shape[:2])
    os_, ts = numbered("o", g.out), numbered("t", g.kernel)
    idx = [
        _window(o, t, s, d, pb)
        for o, t, s, d, pb in zip(os_, ts, g.strides, g.dilations, g.pads_begin, strict=True)
    ]
    xa = access(x, (n, c, *idx))
    size = math.prod(g.kernel)
    if np.all(counts == size):
        body = xa if size == 1 else ir.Binary("*", xa, ir.Const(1.0 / size))
    else:
        body = ir.Binary("/", xa, ir.Access(cnt, os_))
    return ir.Scope((n, c, *os_), ts, body)


def import_average_pool(view: NodeView) -> tuple[ir.Scope, ...]:
    """AveragePool with any pads, strides, dilations, ``ceil_mode`` and ``count_include_pad``."""
    x = float_data(view.input(0), "input X")
    shape = operand_shape(x)
    if len(shape) < 3:
        raise Unsupported(f"AveragePool of {list(shape)} (needs N, C, spatial..)")
    include_pad = view.attr("count_include_pad", 0)
    if include_pad not in (0, 1):
        raise Unsupported(f"count_include_pad={include_pad}")
    g = pool_geometry(view, shape[2:])
    checked_output(view, 0, shape[:2] + g.out)
    return (average_pool(x, g, bool(include_pad)),)


# --------------------------------------------------------------------------
# LayerNormalization
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LayerNorm:
    """The scopes of one LayerNormalization: its output, mean and inverse standard deviation."""

    y: ir.Scope
    mean: ir.Scope
    inv_std_dev: ir.Scope


def _pointwise(shape: Shape, body: Callable[..., ir.ValueExpr], *operands: Operand) -> ir.Scope:
    """``L i..: body(read(op0), ..)``, exactly as the element-wise importers read their inputs."""
    its = numbered("i", shape)
    return ir.Scope(its, (), body(*(read(o, its) for o in operands)))


def _binary(op: str) -> Callable[[ir.ValueExpr, ir.ValueExpr], ir.ValueExpr]:
    return lambda a, b: ir.Binary(op, a, b)


def layer_norm(x: Operand, axis: int, epsilon: float, scale: Operand, bias: Operand | None) -> LayerNorm:
    """LayerNormalization over ``X.shape[axis:]`` as the chain of the module docstring.

    Parameters
    ----------
    x : Operand
        The float32 data.
    axis : int
        The first normalised axis (non-negative).
    epsilon : float
        Added to the variance.
    scale, bias : Operand
        Read broadcast against ``X`` (right-aligned); ``bias`` may be None.

    Returns
    -------
    LayerNorm
        The output and the optional outputs' scopes.
    """
    shape = operand_shape(x)
    axes = range(axis, len(shape))
    m = scope_operand(reduction(x, axes, True, mean=True), "mean")
    d = scope_operand(_pointwise(shape, _binary("-"), x, m), "centered")
    dd = scope_operand(_pointwise(shape, _binary("*"), d, d), "squared")
    v = scope_operand(reduction(dd, axes, True, mean=True), "variance")
    stat = m.shape
    ve = scope_operand(_pointwise(stat, lambda a: ir.Binary("+", a, ir.Const(epsilon)), v), "variance_eps")
    sd = scope_operand(_pointwise(stat, lambda a: ir.Unary("sqrt", a), ve), "std_dev")
    y = _pointwise(shape, _binary("/"), d, sd)
    y = _pointwise(shape, _binary("*"), scope_operand(y, "normalized"), scale)
    if bias is not None:
        y = _pointwise(shape, _binary("+"), scope_operand(y, "scaled"), bias)
    inv = _pointwise(stat, lambda a: ir.Binary("/", ir.Const(1.0), a), sd)
    return LayerNorm(y, m.expr, inv)


def _strip(shape: Shape) -> Shape:
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _normalized_operand(operand: Operand, inner: Shape, rank: int, what: str) -> Operand:
    """``operand`` when its elements are the normalised ones (leading 1s aside): ONNX broadcasts
    it, ONNX Runtime reads it flat, and the two agree only then."""
    shape = operand_shape(operand)
    if len(shape) > rank or _strip(shape) != _strip(inner):
        raise Unsupported(
            f"LayerNormalization {what} of shape {list(shape)} for normalised shape {list(inner)}"
        )
    return operand


def import_layer_normalization(view: NodeView) -> tuple[ir.Scope, ...]:
    """LayerNormalization (opset 17) with ``stash_type=1``, as the chain of the module docstring."""
    x = float_data(view.input(0), "input X")
    shape = operand_shape(x)
    rank = len(shape)
    (axis,) = normalized_axes([int(view.attr("axis", -1))], rank, "LayerNormalization")
    stash = int(view.attr("stash_type", 1))
    if stash != 1:
        raise Unsupported(f"LayerNormalization stash_type={stash} (only float32 statistics)")
    if any(view.node.output[1:]):
        raise Unsupported("LayerNormalization with its Mean/InvStdDev outputs (training form)")
    inner = shape[axis:]
    scale = _normalized_operand(float_data(view.input(1), "Scale"), inner, rank, "Scale")
    bias = view.input(2)
    if bias is not None:
        bias = _normalized_operand(float_data(bias, "B"), inner, rank, "B")
    checked_output(view, 0, shape)
    epsilon = float(np.float32(view.attr("epsilon", 1e-5)))  # a float32 attribute, its default too
    ln = layer_norm(x, axis, epsilon, scale, bias)
    return (ln.y, ln.mean, ln.inv_std_dev)[: len(view.node.output)]


REDUCE_IMPORTERS: dict[str, Importer] = {
    "ReduceSum": import_reduce_sum,
    "ReduceMean": import_reduce_mean,
    "ReduceSumSquare": import_reduce_sum_square,
    "ReduceL2": import_reduce_l2,
    "GlobalAveragePool": import_global_average_pool,
    "AveragePool": import_average_pool,
    "LayerNormalization": import_layer_normalization,
}
"""Importer per ONNX op type."""

NONLINEAR: frozenset[str] = frozenset({"ReduceSumSquare", "ReduceL2", "LayerNormalization"})
"""The op types above that are not linear in their data input (they start a subprogram of their own)."""

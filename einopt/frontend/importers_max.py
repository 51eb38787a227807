"""Importers of reductions by maximum: ReduceMax, MaxPool, Softmax.

The forms (``einopt.instantiate.match_max`` reads them back):

* ReduceMax: ``L kept.. Max red..: X[..]``. With ``keepdims=1`` every reduced dimension stays as
  an unread traversal iterator of extent 1. Empty axes reduce every axis, or none with
  ``noop_with_empty_axes=1`` (then ``X`` itself: a copy, a scope without reduction).
* MaxPool: ``L n, c, o.. Max t..: X[n, c, o*s + t*d - pb, ..] + P0[..] + ..``. ONNX pads a window
  with ``-inf`` (ONNX Runtime takes the maximum of the taps inside the input), while a read
  outside a tensor is 0 in the IR; so each spatial dimension whose windows leave the input adds
  its penalty scope ``Pd = L h=lo:hi: 1 - 1/Ones[h]`` (``Ones = L u:n 1.0``: ``Pd`` is 0 on the
  input and ``-inf`` on the padding, and ``0 + -inf`` is ``-inf``), read at the same index. A
  window inside the input reads no penalty. Windows made only of padding (ONNX Runtime gives
  float32's lowest value there) and a used ``Indices`` output are refused.
* Softmax: ``M = L rest.. Max red..: X[..]``, ``S = L rest.. Sum red..: exp(X[..] - M[rest..])``,
  ``Y = L all..: exp(X[..] - M[rest..]) / S[rest..]``: max-subtracted, exponentiated, summed and
  divided, as ONNX Runtime computes it (no overflow for large inputs). From opset 13 ``red`` is
  the one ``axis`` (default -1); before, the input is coerced to 2-D at ``axis`` (default 1), so
  ``red`` is every axis from ``axis`` on.

Where ONNX Runtime's kernels differ from a maximum (the interpreter's, TVM's, an eOperator's
ReduceMax): a NaN counts there only as the first value a window compares, and MaxPool starts from
float32's lowest value, so a window of ``-inf`` alone gives that rather than ``-inf``. Matched back,
the operators compute as before; a rewritten expression may differ on such inputs, and so does a
maximum of constants, which the emitter folds with the interpreter (a MaxPool of ``sqrt`` of
negative weights: ``scripts/fuzz.py`` seed 0 graph 268).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from einopt.core import ir
from einopt.core.index import bounds, simplify
from einopt.frontend.importers_reduce import reduce_importer, reduced_shape
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
)
from einopt.frontend.pooling import PoolGeometry, pool_geometry

__all__ = [
    "MAX_IMPORTERS",
    "NONLINEAR",
    "REDUCE_MAX_AXES_INPUT_OPSET",
    "SOFTMAX_AXIS_OPSET",
    "max_reduction",
    "max_pool",
    "penalty",
    "softmax",
    "softmax_axes",
    "Softmax",
]

REDUCE_MAX_AXES_INPUT_OPSET = 18
"""From this opset ReduceMax takes its axes as an input (an attribute before)."""

SOFTMAX_AXIS_OPSET = 13
"""From this opset Softmax normalises along one axis (before: every axis from ``axis`` on)."""


# --------------------------------------------------------------------------
# ReduceMax
# --------------------------------------------------------------------------


def max_reduction(x: Operand, axes: Sequence[int], keepdims: bool) -> ir.Scope:
    """``L kept.. Max red..: X[..]`` (a copy of ``X`` when ``axes`` is empty).

    Parameters
    ----------
    x : Operand
        The float32 data.
    axes : sequence of int
        Normalised (non-negative), distinct axes to reduce.
    keepdims : bool
        Keep each reduced axis as an unread traversal iterator of extent 1.

    Returns
    -------
    ir.Scope
        Traversal iterators ``i0, i1, ..``, reduction iterators ``k0, k1, ..``.
    """
    shape = operand_shape(x)
    axes = sorted(axes)
    its = numbered("i", reduced_shape(shape, axes, keepdims))
    ks = numbered("k", [shape[d] for d in axes])
    kept = iter([it for d, it in enumerate(its) if d not in axes] if keepdims else its)
    idx = [ks[axes.index(d)] if d in axes else next(kept) for d in range(len(shape))]
    return ir.Scope(its, ks, access(x, idx), (), "max" if ks else "sum")


import_reduce_max = reduce_importer(REDUCE_MAX_AXES_INPUT_OPSET, max_reduction)
import_reduce_max.__doc__ = (
    "``L kept.. Max red..: X[..]`` (axes an input from opset 18, ``keepdims``, ``noop_with_empty_axes``)."
)


# --------------------------------------------------------------------------
# MaxPool
# --------------------------------------------------------------------------


def penalty(n: int, lo: int, hi: int) -> ir.Scope:
    """``L h=lo:hi: 1 - 1/Ones[h]`` with ``Ones = L u:n 1.0``: 0 on ``[0, n)``, ``-inf`` elsewhere.

    Added to a read of a dimension of length ``n`` inside a maximum, it turns the IR's 0 outside the
    tensor into ONNX's ``-inf`` padding (``[lo, hi)`` covers every position read).
    """
    ones = ir.Scope((ir.Iter("u", 0, n),), (), ir.Const(1.0))
    h = ir.Iter("h", lo, hi)
    return ir.Scope((h,), (), ir.Binary("-", ir.Const(1.0), ir.Binary("/", ir.Const(1.0), ones[h])))


def _taps(o: int, g: PoolGeometry, d: int, n: int) -> list[int]:
    """The positions window ``o`` of dimension ``d`` reads inside the input (length ``n``)."""
    start = o * g.strides[d] - g.pads_begin[d]
    return [p for t in range(g.kernel[d]) if 0 <= (p := start + t * g.dilations[d]) < n]


def max_pool(x: Operand, g: PoolGeometry) -> ir.Scope:
    """``L n, c, o.. Max t..: X[n, c, o*s + t*d - pb, ..]`` plus a penalty per padded dimension.

    Raises
    ------
    Unsupported
        When a window reads only padding (ONNX Runtime gives float32's lowest value there).
    """
    shape = operand_shape(x)
    spatial = shape[2:]
    n, c = numbered("b", shape[:2])
    os_, ts = numbered("o", g.out), numbered("t", g.kernel)
    idx = [
        simplify(o * s + t * dil - pb)
        for o, t, s, dil, pb in zip(os_, ts, g.strides, g.dilations, g.pads_begin, strict=True)
    ]
    body: ir.ValueExpr = access(x, (n, c, *idx))
    for d, (i, size) in enumerate(zip(idx, spatial, strict=True)):
        lo, hi = bounds(i)
        if lo >= 0 and hi < size:
            continue  # every window of this dimension stays inside the input
        empty = [o for o in range(g.out[d]) if not _taps(o, g, d, size)]
        if empty:
            raise Unsupported(f"MaxPool window {empty[0]} of spatial dimension {d} reads only padding")
        body = ir.Binary("+", body, ir.Access(penalty(size, min(lo, 0), max(hi + 1, size)), (i,)))
    return ir.Scope((n, c, *os_), ts, body, (), "max")


def import_max_pool(view: NodeView) -> tuple[ir.Scope, ...]:
    """MaxPool with any kernel, strides, dilations, pads (``-inf``) and ``ceil_mode``; no ``Indices``."""
    if len(view.node.output) > 1 and view.node.output[1]:
        raise Unsupported("MaxPool's Indices output is used (an argmax einopt does not compute)")
    x = float_data(view.input(0), "input X")
    shape = operand_shape(x)
    if len(shape) < 3:
        raise Unsupported(f"MaxPool of {list(shape)} (needs N, C, spatial..)")
    g = pool_geometry(view, shape[2:])
    checked_output(view, 0, shape[:2] + g.out)
    return (max_pool(x, g),)


# --------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Softmax:
    """The scopes of one Softmax over some axes: the maximum ``M``, the sum ``S`` and the output ``Y``."""

    maximum: ir.Scope
    total: ir.Scope
    y: ir.Scope


def softmax(x: Operand, axes: Sequence[int]) -> Softmax:
    """``exp(X - M) / S`` over the distinct, normalised ``axes`` (see the module docstring).

    When every axis is reduced, ``M`` and ``S`` keep one unread traversal iterator of extent 1 (a
    scope has at least one).
    """
    shape = operand_shape(x)
    axes = sorted(axes)
    rest = [d for d in range(len(shape)) if d not in axes]
    outer = numbered("r", [shape[d] for d in rest]) or (ir.Iter("r0", 0, 1),)
    ks = numbered("k", [shape[d] for d in axes])

    def reduced() -> list[ir.Iter]:
        kept = iter(outer)
        return [ks[axes.index(d)] if d in axes else next(kept) for d in range(len(shape))]

    m = ir.Scope(outer, ks, access(x, reduced()), (), "max")
    at = outer if rest else (ir.IConst(0),)
    shifted = ir.Unary("exp", ir.Binary("-", access(x, reduced()), m[at]))
    s = ir.Scope(outer, ks, shifted)
    its = numbered("i", shape)
    here = tuple(its[d] for d in rest) or (ir.IConst(0),)
    numerator = ir.Unary("exp", ir.Binary("-", access(x, its), m[here]))
    return Softmax(m, s, ir.Scope(its, (), ir.Binary("/", numerator, s[here])))


def softmax_axes(rank: int, axis: int, opset: int) -> list[int]:
    """The axes a Softmax normalises: ``axis`` (opset >= 13) or every axis from it on (before)."""
    if not -rank <= axis < rank:
        raise Unsupported(f"Softmax axis {axis} out of range for rank {rank}")
    axis %= rank
    return [axis] if opset >= SOFTMAX_AXIS_OPSET else list(range(axis, rank))


def import_softmax(view: NodeView) -> tuple[ir.Scope, ...]:
    """Softmax along ``axis`` (opset 13), or over the 2-D coercion at ``axis`` (before 13)."""
    x = float_data(view.input(0), "input")
    shape = operand_shape(x)
    default = -1 if view.opset >= SOFTMAX_AXIS_OPSET else 1
    axes = softmax_axes(len(shape), int(view.attr("axis", default)), view.opset)
    checked_output(view, 0, shape)
    return (softmax(x, axes).y,)


MAX_IMPORTERS: dict[str, Importer] = {
    "ReduceMax": import_reduce_max,
    "MaxPool": import_max_pool,
    "Softmax": import_softmax,
}
"""Importer per ONNX op type."""

NONLINEAR: frozenset[str] = frozenset(MAX_IMPORTERS)
"""The op types above that are not linear in their data input (they start a subprogram of their own)."""

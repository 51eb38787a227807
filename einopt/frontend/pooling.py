"""The attributes that windowed and reducing ONNX operators share, read once for all importers.

Per spatial dimension integers (``kernel_shape``, ``strides``, ``dilations``, ``pads``), the
pooling geometry (``auto_pad`` resolved as ONNX Runtime does, ``ceil_mode``) that AveragePool and
MaxPool share, and the reduced axes of the Reduce* family (an attribute before some opset, a
constant input from it on). Conv reads its strides, dilations and explicit pads here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from einopt.frontend.operand import NodeView, Unsupported, constant_ints

__all__ = [
    "AUTO_PADS",
    "PoolGeometry",
    "explicit_pads",
    "ints_attr",
    "normalized_axes",
    "pool_geometry",
    "pool_output_size",
    "reduce_axes",
]

Shape = tuple[int, ...]

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
"""The values of ``auto_pad`` ONNX defines."""


def ints_attr(view: NodeView, name: str, rank: int, default: int) -> Shape:
    """The integer attribute ``name`` with one value per dimension (``default`` for each if absent).

    Raises
    ------
    Unsupported
        If the attribute does not have ``rank`` values.
    """
    value = view.attr(name)
    if value is None:
        return (default,) * rank
    value = tuple(int(v) for v in value)
    if len(value) != rank:
        raise Unsupported(f"{view.op_type} {name}={list(value)} for {rank} spatial dimensions")
    return value


def explicit_pads(view: NodeView, rank: int) -> tuple[Shape, Shape]:
    """The begin and end pads of ``pads`` (zeros if absent), refused if any is negative."""
    pads = ints_attr(view, "pads", 2 * rank, 0)
    if any(p < 0 for p in pads):
        raise Unsupported(f"negative pads {list(pads)}")
    return pads[:rank], pads[rank:]


# --------------------------------------------------------------------------
# Pooling windows
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PoolGeometry:
    """Per spatial dimension: kernel, stride, dilation, begin and end pads, output size."""

    kernel: Shape
    strides: Shape
    dilations: Shape
    pads_begin: Shape
    pads_end: Shape
    out: Shape


def pool_output_size(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool) -> int:
    """ONNX's pooled size of one dimension (a last window that would start in the end padding is
    dropped in ``ceil_mode``)."""
    span = n + pb + pe - d * (k - 1) - 1
    if span < 0:
        return 0
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= n + pb else out


def pool_geometry(view: NodeView, spatial: Shape) -> PoolGeometry:
    """Kernel, strides, dilations, pads (``auto_pad`` resolved as ONNX Runtime does) and sizes.

    Parameters
    ----------
    view
        An AveragePool or MaxPool node.
    spatial
        The input's spatial extents (its shape after N and C).

    Raises
    ------
    Unsupported
        Without ``kernel_shape``, with non-positive kernel, strides or dilations, negative pads,
        ``SAME_*`` padding with dilations, or a kernel larger than the padded input.
    """
    rank = len(spatial)
    if view.attr("kernel_shape") is None:
        raise Unsupported(f"{view.op_type} without kernel_shape")
    kernel = ints_attr(view, "kernel_shape", rank, 1)
    strides = ints_attr(view, "strides", rank, 1)
    dilations = ints_attr(view, "dilations", rank, 1)
    if any(v < 1 for v in kernel + strides + dilations):
        raise Unsupported(f"kernel {list(kernel)}, strides {list(strides)}, dilations {list(dilations)}")
    ceil_mode = bool(view.attr("ceil_mode", 0))
    auto_pad = str(view.attr("auto_pad", "NOTSET"))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if any(d != 1 for d in dilations):
            raise Unsupported(f"auto_pad {auto_pad} with dilations {list(dilations)}")
        total = [(-(-n // s) - 1) * s + k - n for n, s, k in zip(spatial, strides, kernel, strict=True)]
        if any(t < 0 for t in total):
            raise Unsupported(f"auto_pad {auto_pad} with negative padding {total}")
        begin = tuple(t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total)
        end = tuple(t - b for t, b in zip(total, begin, strict=True))
    elif auto_pad == "VALID":
        begin = end = (0,) * rank
    elif auto_pad == "NOTSET":
        begin, end = explicit_pads(view, rank)
    else:
        raise Unsupported(f"auto_pad={auto_pad}")
    out = tuple(
        pool_output_size(*dims, ceil_mode)
        for dims in zip(spatial, kernel, strides, dilations, begin, end, strict=True)
    )
    if any(o < 1 for o in out):
        raise Unsupported(f"{view.op_type} kernel larger than the padded input")
    return PoolGeometry(kernel, strides, dilations, begin, end, out)


# --------------------------------------------------------------------------
# Reduced axes
# --------------------------------------------------------------------------


def normalized_axes(axes: Sequence[int], rank: int, what: str) -> list[int]:
    """``axes`` made non-negative and sorted, refused if out of range or repeated."""
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise Unsupported(f"{what} axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise Unsupported(f"{what} repeats an axis: {list(axes)}")
    return sorted(out)


def reduce_axes(view: NodeView, rank: int, since: int) -> list[int]:
    """The reduced axes of a Reduce* node: an attribute before opset ``since``, a constant input from it on.

    Absent or empty axes reduce every axis, unless ``noop_with_empty_axes`` (then none).
    """
    if view.opset < since:
        given = view.attr("axes")
        axes = None if given is None else [int(a) for a in given]
    else:
        operand = view.input(1)
        axes = None if operand is None else constant_ints(operand, f"{view.op_type} axes")
    if not axes:
        return [] if view.attr("noop_with_empty_axes", 0) else list(range(rank))
    return normalized_axes(axes, rank, view.op_type)

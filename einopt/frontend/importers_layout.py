"""Importers of layout operators: data movement only, one access per input.

Transpose ``X[permuted iterators]``; Slice/Split ``X[i*step + start]``; Pad
``X[i - pb]``; Concat ``A[.., i, ..] + B[.., i - offset, ..] + ..``;
Squeeze/Unsqueeze index removed dimensions by ``0`` and leave inserted ones
unread; Reshape/Flatten ``X[unravel(ravel(i))]``; DepthToSpace/SpaceToDepth
move block offsets between the channel and spatial indices with ``//`` and ``%``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from einopt.core import ir
from einopt.core.index import simplify
from einopt.frontend.operand import (
    Importer,
    NodeView,
    Operand,
    Unsupported,
    access,
    broadcast_dims,
    checked_output,
    constant,
    constant_ints,
    float_data,
    make_iters,
    numbered,
    operand_shape,
    read,
)

__all__ = ["LAYOUT_IMPORTERS"]


def _ints_from(view: NodeView, attr: str, index: int, since: int) -> list[int] | None:
    """An integer list that is an attribute before opset ``since`` and a constant input from it on."""
    if view.opset < since:
        value = view.attr(attr)
        return None if value is None else [int(v) for v in value]
    operand = view.input(index)
    return None if operand is None else constant_ints(operand, f"{view.op_type} {attr}")


def _axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise Unsupported(f"{what} axis {axis} out of range for rank {rank}")
    return axis % rank


def _axes(axes: Sequence[int], rank: int, what: str) -> list[int]:
    out = [_axis(a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise Unsupported(f"{what} repeats an axis: {list(axes)}")
    return out


def _data(view: NodeView) -> tuple[Operand, tuple[int, ...]]:
    x = float_data(view.input(0), "input")
    return x, operand_shape(x)


IndexFn = Callable[[tuple[ir.Iter, ...]], Sequence[ir.IndexLike]]


def _copy(view: NodeView, x: Operand, out: Sequence[int], index: IndexFn) -> ir.Scope:
    """``L i..: X[index(i..)]`` over the checked output shape."""
    its = numbered("i", checked_output(view, 0, out))
    return ir.Scope(its, (), access(x, tuple(index(its))))


def import_identity(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[i]``."""
    x, shape = _data(view)
    return (_copy(view, x, shape, lambda its: its),)


def import_cast(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[i]`` for a Cast to float32 of float32 data (what exporters write around a mask); a Cast
    that changes the element type changes the values and is refused."""
    x, shape = _data(view)
    to = view.attr("to")
    if to != onnx.TensorProto.FLOAT:
        raise Unsupported(f"Cast to {onnx.TensorProto.DataType.Name(to) if to else to}: not float32")
    return (_copy(view, x, shape, lambda its: its),)


def import_expand(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[i..]`` broadcast to the constant shape input (numpy alignment: size-1 dimensions repeat)."""
    x, shape = _data(view)
    target = tuple(constant_ints(view.input(1), "Expand shape"))
    out = checked_output(view, 0, broadcast_dims(shape, target))
    its = numbered("i", out)
    return (ir.Scope(its, (), read(x, its)),)


def import_transpose(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[permuted iterators]``: output dimension ``j`` reads input dimension ``perm[j]``."""
    x, shape = _data(view)
    perm = view.attr("perm")
    perm = list(range(len(shape)))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(len(shape))):
        raise Unsupported(f"perm {perm} is not a permutation of {len(shape)} axes")

    def index(its):
        idx = [None] * len(shape)
        for j, p in enumerate(perm):
            idx[p] = its[j]
        return idx

    return (_copy(view, x, [shape[p] for p in perm], index),)


def _size(e: ir.IndexExpr) -> int:
    """Number of nodes of an index expression (to pick the simpler of two equal forms)."""
    return 1 + sum(map(_size, ir.children(e)))


def _unravel_ravel(in_shape: Sequence[int], its: Sequence[ir.Iter]) -> list[ir.IndexExpr]:
    """Input indices of the element at output iterators ``its`` in row-major order.

    Each index is ``(flat // stride) % n``; dividing step by step by the
    trailing sizes often simplifies further (``(4*i + j) // 4 -> i``), so the
    smaller of the two equal forms is kept.
    """
    flat: ir.IndexExpr = ir.IConst(0)
    for it in its:
        flat = flat * it.extent + it
    flat = simplify(flat)
    out: list[ir.IndexExpr] = []
    rest, stride = flat, 1
    for n in reversed(in_shape):
        direct = simplify((flat // stride) % n)
        stepwise = simplify(rest % n)
        out.append(stepwise if _size(stepwise) < _size(direct) else direct)
        rest, stride = simplify(rest // n), stride * n
    return out[::-1]


def _reshaped(view: NodeView, x, shape: Sequence[int], out: Sequence[int]) -> ir.Scope:
    if math.prod(out) != math.prod(shape):
        raise Unsupported(f"cannot reshape {list(shape)} into {list(out)}")
    return _copy(view, x, out, lambda its: _unravel_ravel(shape, its))


def _computed_target(view: NodeView) -> list[int] | None:
    """A Reshape target computed at run time (``Shape`` -> ``Gather`` -> ``Concat``, as exporters write
    for a symbolic batch or sequence) as the output shape shape inference found for the model as
    prepared (None when the target is a constant, a graph input, or the output's shape is not
    known): the part is
    translated at the shapes the model was prepared at, and a rewrite of it is kept only where it is
    checked to hold at other values of the symbolic dimensions too."""
    operand = view.input(1) if view.opset >= 5 else None
    out = view.output_shapes[0] if view.output_shapes else None
    if operand is None or operand.value is not None or operand.fed or out is None or 0 in out:
        return None  # a constant, or a target the caller feeds (an overridable initializer)
    return list(out)


def import_reshape(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[unravel(ravel(i))]``; ``0`` copies an input dimension (unless allowzero), ``-1`` is inferred."""
    x, shape = _data(view)
    target = _computed_target(view) or _ints_from(view, "shape", 1, since=5)
    if target is None:
        raise Unsupported("Reshape without a target shape")
    allowzero = bool(view.attr("allowzero", 0))
    out = []
    for j, v in enumerate(target):
        if v == 0 and not allowzero:
            if j >= len(shape):
                raise Unsupported(f"Reshape shape {target}: 0 at axis {j} beyond the input rank")
            v = shape[j]
        elif v < -1:
            raise Unsupported(f"Reshape shape {target} has a negative size")
        out.append(v)
    if out.count(-1) > 1:
        raise Unsupported(f"Reshape shape {target} infers more than one dimension")
    if -1 in out:
        known = math.prod(v for v in out if v != -1)
        if known == 0 or math.prod(shape) % known:
            raise Unsupported(f"Reshape shape {target} does not fit {list(shape)}")
        out[out.index(-1)] = math.prod(shape) // known
    return (_reshaped(view, x, shape, out),)


def import_flatten(view: NodeView) -> tuple[ir.Scope, ...]:
    """Reshape to ``(prod(shape[:axis]), prod(shape[axis:]))``."""
    x, shape = _data(view)
    rank = len(shape)
    axis = int(view.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise Unsupported(f"Flatten axis {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return (_reshaped(view, x, shape, [math.prod(shape[:axis]), math.prod(shape[axis:])]),)


def import_squeeze(view: NodeView) -> tuple[ir.Scope, ...]:
    """Removed size-1 dimensions are read at ``0``."""
    x, shape = _data(view)
    axes = _ints_from(view, "axes", 1, since=13)
    if axes == []:  # ONNX Runtime squeezes every size-1 dimension, the reference none
        raise Unsupported("Squeeze with an empty axes list")
    if axes is None:
        removed = {d for d, n in enumerate(shape) if n == 1}
    else:
        removed = set(_axes(axes, len(shape), "Squeeze"))
        if any(shape[d] != 1 for d in removed):
            raise Unsupported(f"Squeeze axes {axes} of {list(shape)} are not all of size 1")
    kept = [d for d in range(len(shape)) if d not in removed]

    def index(its):
        idx: list[ir.IndexLike] = [0] * len(shape)
        for it, d in zip(its, kept, strict=True):
            idx[d] = it
        return idx

    return (_copy(view, x, [shape[d] for d in kept], index),)


def import_unsqueeze(view: NodeView) -> tuple[ir.Scope, ...]:
    """Inserted size-1 dimensions are not read."""
    x, shape = _data(view)
    axes = _ints_from(view, "axes", 1, since=13)
    if axes is None:
        raise Unsupported("Unsqueeze without axes")
    rank = len(shape) + len(axes)
    inserted = set(_axes(axes, rank, "Unsqueeze"))
    kept = [d for d in range(rank) if d not in inserted]
    out = [1] * rank
    for d, n in zip(kept, shape, strict=True):
        out[d] = n
    return (_copy(view, x, out, lambda its: [its[d] for d in kept]),)


def import_concat(view: NodeView) -> tuple[ir.Scope, ...]:
    """``A[.., i, ..] + B[.., i - offset, ..] + ..`` (reads outside an input are 0)."""
    parts = [float_data(view.input(i), f"input {i}") for i in range(len(view.inputs))]
    if not parts:
        raise Unsupported("Concat without inputs")
    shapes = [operand_shape(p) for p in parts]
    rank = len(shapes[0])
    axis = _axis(int(view.attr("axis", 0)), rank, "Concat")
    for s in shapes:
        if len(s) != rank or any(
            a != b for d, (a, b) in enumerate(zip(s, shapes[0], strict=True)) if d != axis
        ):
            raise Unsupported(f"Concat of incompatible shapes {[list(s) for s in shapes]}")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    its = numbered("i", checked_output(view, 0, out))
    body: ir.ValueExpr | None = None
    offset = 0
    for part, s in zip(parts, shapes, strict=True):
        idx = list(its)
        idx[axis] = simplify(its[axis] - offset)
        term = access(part, tuple(idx))
        body = term if body is None else ir.Binary("+", body, term)
        offset += s[axis]
    return (ir.Scope(its, (), body),)


def _split_sizes(view: NodeView, dim: int) -> list[int]:
    sizes = _ints_from(view, "split", 1, since=13)
    count = len(view.node.output)
    if sizes is None:
        pieces = view.attr("num_outputs") if view.opset >= 18 else None
        if pieces is not None:
            chunk = -(-dim // int(pieces))
            sizes = [min(chunk, max(0, dim - chunk * k)) for k in range(int(pieces))]
        elif dim % count:
            raise Unsupported(f"Split of {dim} into {count} equal parts")
        else:
            sizes = [dim // count] * count
    if len(sizes) != count or sum(sizes) != dim or any(v < 0 for v in sizes):
        raise Unsupported(f"Split sizes {sizes} do not cut {dim} into {count} outputs")
    return sizes


def import_split(view: NodeView) -> tuple[ir.Scope, ...]:
    """Output ``k`` is ``X[.., i + start_k, ..]``."""
    x, shape = _data(view)
    axis = _axis(int(view.attr("axis", 0)), len(shape), "Split")
    outs = []
    start = 0
    for k, size in enumerate(_split_sizes(view, shape[axis])):
        out = list(shape)
        out[axis] = size
        its = numbered("i", checked_output(view, k, out))
        idx = list(its)
        idx[axis] = simplify(its[axis] + start)
        outs.append(ir.Scope(its, (), access(x, tuple(idx))))
        start += size
    return tuple(outs)


def _slice_range(start: int, end: int, step: int, n: int) -> tuple[int, int]:
    """ONNX's clamping of one sliced axis: ``(first index, size)``."""
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return start, max(0, -(-(end - start) // step))


def import_slice(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[i*step + start]`` per sliced axis after ONNX's clamping (negative steps too)."""
    x, shape = _data(view)
    starts = _ints_from(view, "starts", 1, since=10)
    ends = _ints_from(view, "ends", 2, since=10)
    if starts is None or ends is None or len(starts) != len(ends):
        raise Unsupported("Slice needs starts and ends of one length")
    axes = _ints_from(view, "axes", 3, since=10)
    axes = _axes(list(range(len(starts))) if axes is None else axes, len(shape), "Slice")
    steps = _ints_from(view, "steps", 4, since=10) or [1] * len(starts)
    if not len(axes) == len(steps) == len(starts) or 0 in steps:
        raise Unsupported(f"Slice axes {axes} / steps {steps} do not fit starts {starts}")
    first, step = [0] * len(shape), [1] * len(shape)
    out = list(shape)
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        first[a], out[a] = _slice_range(b, e, s, shape[a])
        step[a] = s
    return (
        _copy(
            view, x, out, lambda its: [simplify(i * s + f) for i, s, f in zip(its, step, first, strict=True)]
        ),
    )


def _pad_value(view: NodeView) -> float:
    if view.opset < 11:
        return float(view.attr("value", 0.0))
    operand = view.input(2)
    if operand is None:
        return 0.0
    value = constant(operand, "Pad constant_value")
    if value.size != 1:
        raise Unsupported("Pad constant_value of more than one element")
    return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])


def import_pad(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[i - pb]`` for mode constant with value 0 (negative pads crop)."""
    mode = str(view.attr("mode", "constant"))
    if mode != "constant":
        raise Unsupported(f"Pad mode {mode} (only constant)")
    if _pad_value(view) != 0.0:
        raise Unsupported("Pad with a nonzero constant value")
    x, shape = _data(view)
    pads = _ints_from(view, "pads", 1, since=11)
    if pads is None:
        raise Unsupported("Pad without pads")
    axes = _ints_from(view, "axes", 3, since=18) if view.opset >= 18 else None
    axes = _axes(list(range(len(shape))) if axes is None else axes, len(shape), "Pad")
    if len(pads) != 2 * len(axes):
        raise Unsupported(f"Pad pads {pads} for {len(axes)} axes")
    begin, out = [0] * len(shape), list(shape)
    for a, pb, pe in zip(axes, pads[: len(axes)], pads[len(axes) :], strict=True):
        begin[a] = pb
        out[a] = shape[a] + pb + pe
    return (_copy(view, x, out, lambda its: [simplify(i - b) for i, b in zip(its, begin, strict=True)]),)


def _blocksize(view: NodeView) -> int:
    b = view.attr("blocksize")
    if b is None or int(b) < 1:
        raise Unsupported(f"{view.op_type} blocksize {b}")
    return int(b)


def _mode(view: NodeView) -> str:
    mode = str(view.attr("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise Unsupported(f"{view.op_type} mode {mode}")
    return mode


def import_depth_to_space(view: NodeView) -> tuple[ir.Scope, ...]:
    """DCR ``X[n, (h % b)*b*C + (w % b)*C + c, h // b, w // b]``; CRD ``c*b*b + (h % b)*b + w % b``."""
    x, shape = _data(view)
    b, mode = _blocksize(view), _mode(view)
    if len(shape) != 4 or shape[1] % (b * b):
        raise Unsupported(f"DepthToSpace of {list(shape)} with blocksize {b}")
    n_, c_, h_, w_ = shape
    channels = c_ // (b * b)
    out = checked_output(view, 0, (n_, channels, h_ * b, w_ * b))
    n, c, h, w = make_iters(["n", "c", "h", "w"], out)
    if mode == "DCR":
        ch = (h % b) * (b * channels) + (w % b) * channels + c
    else:
        ch = c * (b * b) + (h % b) * b + w % b
    idx = (n, simplify(ch), simplify(h // b), simplify(w // b))
    return (ir.Scope((n, c, h, w), (), access(x, idx)),)


def import_space_to_depth(view: NodeView) -> tuple[ir.Scope, ...]:
    """The inverse of DepthToSpace: the output channel splits into block offsets and a channel."""
    x, shape = _data(view)
    b, mode = _blocksize(view), _mode(view)
    if len(shape) != 4 or shape[2] % b or shape[3] % b:
        raise Unsupported(f"SpaceToDepth of {list(shape)} with blocksize {b}")
    n_, c_, h_, w_ = shape
    out = checked_output(view, 0, (n_, c_ * b * b, h_ // b, w_ // b))
    n, c, h, w = make_iters(["n", "c", "h", "w"], out)
    if mode == "DCR":  # channel = (bh*b + bw)*C + c
        ch, bh, bw = c % c_, c // (c_ * b), (c // c_) % b
    else:  # channel = c*b*b + bh*b + bw
        ch, bh, bw = c // (b * b), (c // b) % b, c % b
    idx = (n, simplify(ch), simplify(h * b + bh), simplify(w * b + bw))
    return (ir.Scope((n, c, h, w), (), access(x, idx)),)


LAYOUT_IMPORTERS: dict[str, Importer] = {
    "Identity": import_identity,
    "Cast": import_cast,
    "Expand": import_expand,
    "Transpose": import_transpose,
    "Reshape": import_reshape,
    "Flatten": import_flatten,
    "Squeeze": import_squeeze,
    "Unsqueeze": import_unsqueeze,
    "Concat": import_concat,
    "Split": import_split,
    "Slice": import_slice,
    "Pad": import_pad,
    "DepthToSpace": import_depth_to_space,
    "SpaceToDepth": import_space_to_depth,
}

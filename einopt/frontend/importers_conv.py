"""Importers of Conv and ConvTranspose (any number of spatial dimensions).

Conv::

    S = L n, f, o.. Sum c, r..: X[n, ch, o*s + r*d - pb, ..] * W[f, c, r..]

ConvTranspose (stride 1)::

    S = L n, f, o.. Sum c, r..: X[n, ch, o + pb - r*d, ..] * W[ch, f % Fg, r..]

With a stride > 1 the ConvTranspose input is read through the zero-insertion
scope ``U = L n, c, i0, p0, ..: X[n, c, i0, ..]`` (every ``p`` in ``[0, 1)``)
at ``U[n, ch, e // s, e % s, ..]`` for ``e = o + pb - r*d``. A bias adds
``L n, f, o..: S[n, f, o..] + B[f]``. ``ch`` is ``c`` for one group and
``Cg * (f // Fg) + c`` otherwise (``Cg``/``Fg`` = input/output channels per group).

ONNX Runtime's ConvTranspose never multiplies the zeros this gather form reads
(border taps, inserted zeros) by a weight, and ``0 * inf`` is NaN: a
ConvTranspose that reads such zeros is translated only when ``W`` is a
constant with finite entries. (Conv's padding is multiplied, in ONNX Runtime
too.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from einopt.core import ir
from einopt.core.index import bounds, simplify
from einopt.frontend.operand import (
    Importer,
    NodeView,
    Operand,
    Unsupported,
    access,
    checked_output,
    float_data,
    make_iters,
    numbered,
    operand_shape,
)
from einopt.frontend.pooling import AUTO_PADS, explicit_pads, ints_attr

__all__ = ["CONV_IMPORTERS"]

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Per spatial dimension: stride, dilation, begin pad and output size."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    out: tuple[int, ...]


def _operands(view: NodeView) -> tuple[Operand, Operand, Shape, Shape, Shape, int, str]:
    """X, W and their shapes, with the spatial rank and kernel checked."""
    x = float_data(view.input(0), "input X")
    w = float_data(view.input(1), "weight W")
    xs, ws = operand_shape(x), operand_shape(w)
    if len(xs) < 3 or len(ws) != len(xs):
        raise Unsupported(f"{view.op_type} with X {list(xs)} and W {list(ws)} (need N, C, spatial..)")
    kernel = ws[2:]
    given = view.attr("kernel_shape")
    if given is not None and tuple(int(k) for k in given) != kernel:
        raise Unsupported(f"kernel_shape {list(given)} disagrees with W of shape {list(ws)}")
    group = int(view.attr("group", 1))
    if group < 1:
        raise Unsupported(f"group={group}")
    auto_pad = str(view.attr("auto_pad", "NOTSET"))
    if auto_pad not in AUTO_PADS:
        raise Unsupported(f"auto_pad={auto_pad}")
    return x, w, xs, ws, kernel, group, auto_pad


def _conv_geometry(view: NodeView, spatial: Shape, kernel: Shape, auto_pad: str) -> _Geometry:
    rank = len(spatial)
    strides = ints_attr(view, "strides", rank, 1)
    dilations = ints_attr(view, "dilations", rank, 1)
    if any(v < 1 for v in strides + dilations):
        raise Unsupported(f"strides {list(strides)} / dilations {list(dilations)} must be positive")
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilations, strict=True)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if any(d != 1 for d in dilations):
            raise Unsupported(
                f"auto_pad {auto_pad} with dilations {list(dilations)} (ONNX Runtime refuses it)"
            )
        out = [-(-n // s) for n, s in zip(spatial, strides, strict=True)]
        total = [
            max(0, (o - 1) * s + e - n) for o, s, e, n in zip(out, strides, extent, spatial, strict=True)
        ]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        return _Geometry(strides, dilations, tuple(begin), tuple(out))
    begin, end = ((0,) * rank, (0,) * rank) if auto_pad == "VALID" else explicit_pads(view, rank)
    out = [
        (n + b + a - e) // s + 1 for n, b, a, e, s in zip(spatial, begin, end, extent, strides, strict=True)
    ]
    if any(n + b + a - e < 0 for n, b, a, e in zip(spatial, begin, end, extent, strict=True)):
        raise Unsupported("Conv kernel larger than the padded input")
    return _Geometry(strides, dilations, begin, tuple(out))


def _group_channel(c: ir.Iter, f: ir.Iter, in_per_group: int, out_per_group: int, group: int) -> ir.IndexExpr:
    """The input channel read for output channel ``f`` and group-local channel ``c``."""
    if group == 1:
        return c
    return simplify(in_per_group * (f // out_per_group) + c)


def _with_bias(view: NodeView, s: ir.Scope, channels: int) -> ir.Scope:
    """``L n, f, o..: S[n, f, o..] + B[f]`` when a bias is given."""
    b = view.input(2)
    if b is None:
        return s
    b = float_data(b, "bias B")
    if operand_shape(b) != (channels,):
        raise Unsupported(f"bias of shape {list(operand_shape(b))}, expected [{channels}]")
    its = s.traversal
    return ir.Scope(its, (), ir.Binary("+", ir.Access(s, its), access(b, (its[1],))))


def _names(rank: int) -> tuple[list[str], list[str]]:
    return [f"o{d}" for d in range(rank)], [f"r{d}" for d in range(rank)]


def import_conv(view: NodeView) -> tuple[ir.Scope, ...]:
    """Conv: pads, ``auto_pad``, strides, dilations and groups (see the module docstring)."""
    x, w, xs, ws, kernel, group, auto_pad = _operands(view)
    batch, channels, spatial = xs[0], xs[1], xs[2:]
    filters = ws[0]
    if channels % group or filters % group or ws[1] != channels // group:
        raise Unsupported(f"Conv group={group} does not fit X {list(xs)} and W {list(ws)}")
    geo = _conv_geometry(view, spatial, kernel, auto_pad)
    out = checked_output(view, 0, (batch, filters, *geo.out))
    o_names, r_names = _names(len(spatial))
    n, f, *o = make_iters(["n", "f", *o_names], out)
    c, *r = make_iters(["c", *r_names], (ws[1], *kernel))
    ch = _group_channel(c, f, ws[1], filters // group, group)
    x_idx = [
        simplify(oi * s + ri * d - pb)
        for oi, ri, s, d, pb in zip(o, r, geo.strides, geo.dilations, geo.pads_begin, strict=True)
    ]
    body = ir.Binary("*", access(x, (n, ch, *x_idx)), access(w, (f, c, *r)))
    s = ir.Scope((n, f, *o), (c, *r), body)
    return (_with_bias(view, s, filters),)


def _transpose_geometry(view: NodeView, spatial: Shape, kernel: Shape, auto_pad: str) -> _Geometry:
    rank = len(spatial)
    strides = ints_attr(view, "strides", rank, 1)
    dilations = ints_attr(view, "dilations", rank, 1)
    out_pad = ints_attr(view, "output_padding", rank, 0)
    if any(v < 1 for v in strides + dilations) or any(v < 0 for v in out_pad):
        raise Unsupported(
            f"strides {list(strides)}, dilations {list(dilations)}, output_padding {list(out_pad)}"
        )
    # The output of the full transposed convolution, before any padding is cut.
    full = [
        s * (n - 1) + a + d * (k - 1) + 1
        for n, s, a, d, k in zip(spatial, strides, out_pad, dilations, kernel, strict=True)
    ]
    wanted = view.attr("output_shape")
    if wanted is not None:
        wanted = [int(v) for v in wanted]
        if len(wanted) == rank + 2:  # some exporters give N and C too
            wanted = wanted[2:]
        if len(wanted) != rank:
            raise Unsupported(f"output_shape {wanted} for {rank} spatial dimensions")
        # Pads are ignored; an output larger than the full one is extended with zeros at the end.
        total = [max(0, fu - o) for fu, o in zip(full, wanted, strict=True)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # Padding towards in * stride; when the full output is smaller it is kept (ONNX Runtime's rule).
        total = [max(0, fu - n * s) for fu, n, s in zip(full, spatial, strides, strict=True)]
        wanted = [fu - t for fu, t in zip(full, total, strict=True)]
    if wanted is not None:
        # SAME_UPPER cuts more at the end, SAME_LOWER and NOTSET more at the beginning.
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        return _Geometry(strides, dilations, tuple(begin), tuple(wanted))
    begin, end = ((0,) * rank, (0,) * rank) if auto_pad == "VALID" else explicit_pads(view, rank)
    out = [fu - b - e for fu, b, e in zip(full, begin, end, strict=True)]
    return _Geometry(strides, dilations, begin, tuple(out))


def import_conv_transpose(view: NodeView) -> tuple[ir.Scope, ...]:
    """ConvTranspose: strides, pads, output_padding, output_shape, auto_pad, dilations, groups."""
    x, w, xs, ws, kernel, group, auto_pad = _operands(view)
    batch, channels, spatial = xs[0], xs[1], xs[2:]
    if ws[0] != channels or channels % group:
        raise Unsupported(f"ConvTranspose group={group} does not fit X {list(xs)} and W {list(ws)}")
    in_per_group, out_per_group = channels // group, ws[1]
    filters = out_per_group * group
    geo = _transpose_geometry(view, spatial, kernel, auto_pad)
    out = checked_output(view, 0, (batch, filters, *geo.out))
    rank = len(spatial)
    o_names, r_names = _names(rank)
    n, f, *o = make_iters(["n", "f", *o_names], out)
    c, *r = make_iters(["c", *r_names], (in_per_group, *kernel))
    ch = _group_channel(c, f, in_per_group, out_per_group, group)
    taps = [
        simplify(oi + pb - ri * d) for oi, ri, d, pb in zip(o, r, geo.dilations, geo.pads_begin, strict=True)
    ]
    _check_implicit_zeros(w, xs, taps, geo.strides)
    if all(s == 1 for s in geo.strides):
        x_read = access(x, (n, ch, *taps))
    else:
        u = _zero_insertion(x, xs)
        u_idx: list[ir.IndexExpr] = []
        for e, s in zip(taps, geo.strides, strict=True):
            u_idx += [e // s, e % s] if s > 1 else [e, ir.IConst(0)]
        x_read = ir.Access(u, (n, ch, *u_idx))
    w_read = access(w, (ch, simplify(f % out_per_group), *r))
    s = ir.Scope((n, f, *o), (c, *r), ir.Binary("*", x_read, w_read))
    return (_with_bias(view, s, filters),)


def _check_implicit_zeros(w: Operand, xs: Shape, taps: list[ir.IndexExpr], strides: tuple[int, ...]) -> None:
    """Refuse a ConvTranspose whose expression would multiply implicit zeros by weights that may be inf or NaN.

    ONNX Runtime scatters ``X * W`` into the output and never multiplies the
    zeros a gather form reads (border taps, inserted zeros, an ``output_shape``
    margin) by a weight; the expression does, and ``0 * inf`` is NaN. So the
    translation is exact only when those reads cannot occur or ``W`` is a
    constant with finite entries.
    """
    if w.value is not None and np.isfinite(w.value).all():
        return
    in_range = all(0 <= bounds(t)[0] and bounds(t)[1] < n for t, n in zip(taps, xs[2:], strict=True))
    if not in_range or any(s > 1 for s in strides):
        raise Unsupported(
            "ConvTranspose weight W is not a constant known to be finite: the expression would multiply "
            "implicit zeros by it (0 * inf = NaN), which ONNX Runtime never does"
        )


def _zero_insertion(x: Operand, xs: Shape) -> ir.Scope:
    """``U = L n, c, i0, p0, i1, p1, ..: X[n, c, i0, i1, ..]`` with every ``p`` in ``[0, 1)``."""
    rank = len(xs) - 2
    n, c = make_iters(["n", "c"], xs[:2])
    spatial = numbered("i", xs[2:])
    phases = numbered("p", [1] * rank)
    traversal = (n, c, *(it for pair in zip(spatial, phases, strict=True) for it in pair))
    return ir.Scope(traversal, (), access(x, (n, c, *spatial)))


CONV_IMPORTERS: dict[str, Importer] = {
    "Conv": import_conv,
    "ConvTranspose": import_conv_transpose,
}

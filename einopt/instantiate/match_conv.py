"""Conv and ConvTranspose: attributes from the coefficients of the input's index functions.

Iterators are grouped by where they appear, never by name. With ``X`` the
input access and ``W`` the weight access of a product of two accesses:

* batch ``n``: an output iterator read bare by ``X`` alone;
* output channel ``f``: the output iterator ``W`` reads;
* input channel ``c``: the summed iterator of ``X``'s channel dimension, whose
  index is ``c + Cg*(f // Fg)`` (groups ``G = F / Fg``; ``c`` alone for one
  group, ``Cg*f + c`` when ``Fg = 1``, ``f`` alone for depthwise);
* spatial pairs ``(o, k)``: an ``X`` index ``s*o + d*k + e`` with ``o`` an
  output and ``k`` a summed iterator ``W`` reads. For Conv the stride is
  ``s``, the dilation ``d`` and the begin pad ``-e`` (a negative pad slices the
  input first; the end pad follows from the output extent, and up to ``s - 1``
  trailing input positions no window reaches need no Slice: Conv's output
  extent rounds them away). A strided index ``s*o + e`` (``s > 1``) without a
  kernel iterator is a 1-wide kernel with stride ``s`` (a 1x1 downsampling
  convolution whose extent-1 kernel iterators were dropped) when ``X`` is read
  in Conv's own order, batch, channel, spatial (elsewhere such a strided
  contraction is a MatMul over a strided Slice). For
  ConvTranspose the index is ``o + pb - d*k``, read through the
  zero-insertion scope ``U`` (``(..) // s, (..) % s``) for strides ``s > 1``.

A negative ``d`` (Conv) or positive ``d`` (ConvTranspose) reverses ``W`` along
``k``. Any dimension order of ``X``, ``W`` and the output is accepted
(transposes on inputs, folded into constants, and on the output). A Conv
weight read past its ends (a kernel widened by boundary relaxing) is padded
only when it is constant, at compile time: ONNX Runtime's optimizer mistakes
a run-time Pad of a Conv's weight for padding of its input. A bias
``L ..: S[..] + B[f]`` over an inline ``S`` fuses into the operator's ``B``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

from einopt.core import ir
from einopt.core.index import linear_form
from einopt.core.syntax import brief
from einopt.instantiate.plan import (
    NO_MATCH_CONTEXT,
    Expand,
    LayoutStep,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Pad,
    Refusal,
    Scale,
    Slice,
    normalize,
    steps_shape,
)
from einopt.instantiate.views import (
    BiasForm,
    View,
    arrange,
    as_product,
    finish,
    positional,
    simple_view,
    source_name,
    split_bias,
    window_1d,
)

__all__ = ["match_conv", "match_conv_transpose"]


# Labels of input dimensions that are not iterators (tuples never equal an ir.Iter).
_CHANNEL = ("role", "channel")
_MEMBER = ("role", "member of a group")


@dataclasses.dataclass(frozen=True, eq=False)
class _Core:
    """A Conv/ConvTranspose without bias: inputs, attributes, and how the result is labelled."""

    op_type: str
    x: Operand
    w: Operand
    attrs: tuple[tuple[str, object], ...]
    f: ir.Iter | None
    out_groups: tuple[tuple[ir.Iter, ...], ...]
    out_steps: tuple[LayoutStep, ...]  # on the raw result, before ``finish`` (ConvTranspose's zero margins)
    raw_shape: tuple[int, ...]  # the operator's output shape
    consumes: tuple[ir.Scope, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Channel:
    dim: int
    c: ir.Iter | None
    f: ir.Iter | None
    cg: int
    fg: int
    groups: int
    offset: int  # positional constant of the index (only for one group)


@dataclasses.dataclass(frozen=True)
class _Spatial:
    dim: int
    o: ir.Iter
    k: ir.Iter | None  # None: a 1-wide kernel nothing iterates over
    s: int  # coefficient of o
    d: int  # coefficient of k
    e: int  # positional constant

    @property
    def width(self) -> int:
        return self.k.extent if self.k is not None else 1


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------


def match_conv(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L n, f, o.. Sum c, k..: X[n, c, s*o + d*k - p, ..] * W[f, c, k..]`` (any layout), with bias."""
    return _with_bias(scope, ctx, _conv_core)


def match_conv_transpose(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``Sum c, k..: X[n, c, o + p - d*k, ..] * W[c, f, k..]``, strides through the ``U`` scope."""
    return _with_bias(scope, ctx, _conv_transpose_core)


def _with_bias(scope: ir.Scope, ctx: MatchContext, core_fn) -> OperatorMatch | Refusal:
    form = split_bias(scope, ctx)
    if isinstance(form, BiasForm):
        core = core_fn(form.inner, ctx)
        if isinstance(core, Refusal):
            return Refusal(f"bias form, product: {core.reason}")
        return _bias_match(core, form)
    if not scope.summation:
        return form
    core = core_fn(scope, ctx)
    if isinstance(core, Refusal):
        return core
    return _assemble(core, scope.traversal, None, ())


def _bias_match(core: _Core, form: BiasForm) -> OperatorMatch | Refusal:
    """``B`` of shape ``[F]``: the bias along the output channel, or broadcast along it when constant in it."""
    view: View = form.bias
    if not set(view.labels) <= {core.f}:
        shown = ", ".join(it.name for it in view.labels)
        return Refusal(
            f"the bias varies along {shown}, not the output channel alone: not a {core.op_type} bias"
        )
    channels = core.f.extent if core.f is not None else 1
    steps = view.steps + arrange(view.labels, view.shape, [tuple(view.labels)]) + (Scale(form.beta),)
    if not view.labels and channels > 1:
        steps += (Expand((channels,)),)
    bias = Operand(view.source, normalize(steps, tuple(view.source.shape)))
    return _assemble(core, form.traversal, bias, (form.inner,))


def _assemble(
    core: _Core, traversal: tuple[ir.Iter, ...], bias: Operand | None, consumes: tuple[ir.Scope, ...]
) -> OperatorMatch:
    operands = (core.x, core.w) + ((bias,) if bias is not None else ())
    op = OpNode(core.op_type, tuple(range(len(operands))), core.attrs)
    post = normalize(core.out_steps + finish(core.out_groups, traversal), core.raw_shape)
    return OperatorMatch(core.op_type, operands, (op,), post, core.consumes + consumes)


def _size(group: tuple[ir.Iter, ...]) -> int:
    return math.prod(it.extent for it in group)


def _attempts(scope: ir.Scope, ctx: MatchContext, attempt) -> _Core | Refusal:
    """Try both tensor correspondences (which factor is the input, which the weight)."""
    prod = as_product(scope.body)
    if isinstance(prod, Refusal):
        return prod
    scale, factors = prod
    if not scope.summation:
        return Refusal("no summation")
    if len(factors) != 2:
        return Refusal(f"a product of {len(factors)} accesses, not input * weight")
    reasons = []
    for x, w in ((factors[0], factors[1]), (factors[1], factors[0])):
        r = attempt(scope, x, w, scale, ctx)
        if not isinstance(r, Refusal):
            return r
        reasons.append(r.reason)
    if reasons[0] == reasons[1]:
        return Refusal(reasons[0])
    return Refusal(
        f"with {brief(factors[0])} as input: {reasons[0]}; with {brief(factors[1])} as input: {reasons[1]}"
    )


# --------------------------------------------------------------------------
# Shared analysis of the input and the weight
# --------------------------------------------------------------------------


def _parse_channel(
    dim: int, idx: ir.IndexExpr, origin: int, summ: frozenset, weight_iters: set
) -> _Channel | Refusal:
    """``c + Cg*(f // Fg)``, ``c + Cg*f`` (Fg = 1), ``c`` (one group) or ``f // Fg`` / ``f`` (Cg = 1)."""
    lf = linear_form(idx)
    coeffs = dict(lf.coeffs)
    shape_msg = f"input channel index {idx} is not c + Cg*(f // Fg)"
    cs = [it for it in coeffs if it in summ]
    fs = [it for it in coeffs if it not in summ]
    if len(cs) > 1 or len(fs) > 1 or len(lf.atoms) > 1 or (fs and lf.atoms):
        return Refusal(shape_msg)
    c = cs[0] if cs else None
    if c is not None and coeffs[c] != 1:
        return Refusal(f"{shape_msg}: {c.name} has coefficient {coeffs[c]}")
    cg = c.extent if c is not None else 1
    const = lf.const + (c.lo if c is not None else 0) - origin
    f, fg, a = None, 1, 0
    if fs:
        f, fg, a = fs[0], 1, coeffs[fs[0]]
        const += a * f.lo
    elif lf.atoms:
        atom, a = lf.atoms[0]
        inner = positional(atom.a) if isinstance(atom, ir.IFloorDiv) else None
        if inner is None or len(inner[0]) != 1 or inner[1] != 0 or next(iter(inner[0].values())) != 1:
            return Refusal(shape_msg)
        f = next(iter(inner[0]))
        fg = atom.k
        if f.lo != 0:
            return Refusal(f"{shape_msg}: the group iterator {f.name} starts at {f.lo}, not 0")
    if f is None:
        return _Channel(dim, c, None, cg, 1, 1, const)
    if f not in weight_iters:
        return Refusal(f"{shape_msg}: {f.name} is not an output channel of the weight")
    if a != cg:
        return Refusal(f"{shape_msg} (Cg = {cg}, but the group term has coefficient {a})")
    if const != 0:
        return Refusal(f"{shape_msg}: offset {const}")
    if f.extent % fg:
        return Refusal(f"{shape_msg}: {f.extent} output channels do not split into groups of {fg}")
    return _Channel(dim, c, f, cg, fg, f.extent // fg, 0)


def _weight_view(w: ir.Access) -> View | Refusal:
    view = simple_view(w)
    if isinstance(view, Refusal):
        return Refusal(f"weight {brief(w)}: {view.reason}")
    return view


def _flip(labels: Sequence[Hashable], ks: list[ir.Iter]) -> tuple[LayoutStep, ...]:
    """Reverse the weight (dimensions ``labels``) along kernel iterators ``ks``."""
    if not ks:
        return ()
    axes = tuple(list(labels).index(k) for k in ks)
    return (
        Slice(tuple(k.extent - 1 for k in ks), tuple(-(k.extent + 1) for k in ks), axes, (-1,) * len(ks)),
    )


def _output_channel(scope: ir.Scope, weight_iters: set[ir.Iter]) -> ir.Iter | None | Refusal:
    """The one traversal iterator the weight varies with (the output channel), if any."""
    f_its = [t for t in scope.traversal if t in weight_iters]
    if len(f_its) > 1:
        return Refusal(
            f"the weight varies with several output iterators ({', '.join(t.name for t in f_its)})"
        )
    return f_its[0] if f_its else None


def _check_roles(
    scope: ir.Scope,
    batch: list[ir.Iter],
    f: ir.Iter | None,
    channel: _Channel | None,
    spatial: list[_Spatial],
    weight: set,
    read: frozenset,
) -> Refusal | None:
    roles = batch + ([f] if f else []) + [sp.o for sp in spatial]
    c = channel.c if channel else None
    sums = ([c] if c else []) + [sp.k for sp in spatial if sp.k is not None]
    if len(set(roles)) != len(roles) or len(set(sums)) != len(sums):
        return Refusal("an iterator plays two roles (batch, channel, spatial)")
    for t in scope.traversal:
        if t not in roles and (t in read or t.extent > 1):
            return Refusal(f"output iterator {t.name} is neither batch, output channel nor spatial")
    for s in scope.summation:
        if s not in sums and (s in read or s.extent > 1):
            return Refusal(f"summed iterator {s.name} is neither an input channel nor a kernel iterator")
    if c is not None and c not in weight:
        return Refusal(f"the weight does not read the input channel iterator {c.name}")
    extra = weight - set(sums) - ({f} if f else set())
    if extra:
        return Refusal(f"the weight reads {', '.join(sorted(it.name for it in extra))} outside its roles")
    if not spatial:
        return Refusal("no spatial dimension s*o + d*k + e (a plain contraction)")
    return None


def _x_operand(
    x_src: ir.Tensor | ir.Scope,
    rank: int,
    batch_dims: list[tuple[int, ir.Iter, int]],
    channel: _Channel | None,
    spatial_dims: list[int],
    slices: list[tuple[int, int, int, int]],
    pads: dict[int, tuple[int, int]],
    batch: list[ir.Iter],
) -> Operand | Refusal:
    """The input read through its windows, arranged as ``[batch, channel, spatial..]``."""
    shape = tuple(x_src.shape)
    for dim, it, e in batch_dims:
        win = window_1d(1, e, it.extent, shape[dim])
        if win is None:
            return Refusal(f"the batch dimension {dim} is read only outside its range")
        sl, pad = win
        if sl is not None:
            slices.append((dim, *sl))
        pads[dim] = pad
    if channel is not None and channel.groups == 1:
        win = window_1d(1, channel.offset, channel.cg, shape[channel.dim])
        if win is None:
            return Refusal("the input channels are read only outside their range")
        sl, pad = win
        if sl is not None:
            slices.append((channel.dim, *sl))
        pads[channel.dim] = pad
    elif channel is not None and shape[channel.dim] != channel.groups * channel.cg:
        return Refusal(
            f"the input has {shape[channel.dim]} channels, not groups * Cg = {channel.groups * channel.cg}"
        )
    steps: list[LayoutStep] = []
    if slices:
        dims, starts, ends, stps = zip(*sorted(slices), strict=True)
        steps.append(Slice(starts, ends, dims, stps))
    if any(p != (0, 0) for p in pads.values()):
        steps.append(
            Pad(
                tuple(pads.get(d, (0, 0))[0] for d in range(rank))
                + tuple(pads.get(d, (0, 0))[1] for d in range(rank))
            )
        )
    labels: list[Hashable] = [None] * rank
    for dim, it, _ in batch_dims:
        labels[dim] = it
    if channel is not None:
        labels[channel.dim] = _CHANNEL
    for i, dim in enumerate(spatial_dims):
        labels[dim] = ("role", "spatial", i)
    groups = [tuple(batch), (_CHANNEL,) if channel is not None else ()]
    groups += [(("role", "spatial", i),) for i in range(len(spatial_dims))]
    cur = steps_shape(steps, shape)
    steps += arrange(labels, cur, groups)
    return Operand(x_src, normalize(steps, shape))


# --------------------------------------------------------------------------
# Conv
# --------------------------------------------------------------------------


def _conv_core(scope: ir.Scope, ctx: MatchContext) -> _Core | Refusal:
    return _attempts(scope, ctx, _conv_attempt)


def _conv_attempt(
    scope: ir.Scope, x: ir.Access, w: ir.Access, scale: float, ctx: MatchContext
) -> _Core | Refusal:
    wv = _weight_view(w)
    if isinstance(wv, Refusal):
        return wv
    weight = set(wv.labels)
    summ = frozenset(scope.summation)
    src = x.source
    shape, origin = tuple(src.shape), src.origin
    batch_dims: list[tuple[int, ir.Iter, int]] = []
    spatial: list[_Spatial] = []
    channel: _Channel | None = None
    for j, idx in enumerate(x.indices):
        pf = positional(idx, origin[j])
        if pf is not None:
            coeffs, e = pf
            ts = [it for it in coeffs if it not in summ]
            ks = [it for it in coeffs if it in summ]
            if len(ts) == 1 and len(ks) == 1 and ts[0] not in weight and ks[0] in weight:
                o, k = ts[0], ks[0]
                if coeffs[o] <= 0:
                    return Refusal(f"spatial index {idx}: stride {coeffs[o]} of {o.name} is not positive")
                spatial.append(_Spatial(j, o, k, coeffs[o], coeffs[k], e))
                continue
            if len(ts) == 1 and not ks and ts[0] not in weight:
                if coeffs[ts[0]] > 1:  # s*o + e: a 1-wide kernel with stride s
                    spatial.append(_Spatial(j, ts[0], None, coeffs[ts[0]], 1, e))
                    continue
                if coeffs[ts[0]] != 1:
                    return Refusal(f"batch index {idx} is not a bare iterator")
                batch_dims.append((j, ts[0], e))
                continue
            if not ts and not ks:
                return Refusal(f"input dimension {j} is read at a constant index {idx}")
        if any(it not in summ and it not in weight for it in idx.iters()):
            return Refusal(f"spatial index {idx} is not s*o + d*k + e (one output and one kernel iterator)")
        if channel is not None:
            return Refusal(f"two channel-like input dimensions: {x.indices[channel.dim]} and {idx}")
        ch = _parse_channel(j, idx, origin[j], summ, weight)
        if isinstance(ch, Refusal):
            return ch
        channel = ch
    f = _output_channel(scope, weight)
    if isinstance(f, Refusal):
        return f
    if channel is not None and channel.f is not None and channel.f is not f:
        return Refusal("the group term is not the output channel")
    batch = [t for t in scope.traversal if any(t is b for _, b, _ in batch_dims)]
    bad = _check_roles(scope, batch, f, channel, spatial, weight, x.iters() | weight)
    if bad:
        return bad
    if any(sp.k is None for sp in spatial):
        order = (
            [j for j, _, _ in batch_dims] + ([channel.dim] if channel else []) + [sp.dim for sp in spatial]
        )
        if order != sorted(order):
            return Refusal(
                "a strided read without a kernel iterator outside Conv's [batch, channel, spatial] order"
            )
    flips = [sp.k for sp in spatial if sp.d < 0]
    slices: list[tuple[int, int, int, int]] = []
    pads: dict[int, tuple[int, int]] = {}
    conv_pads_begin, conv_pads_end, strides, dilations = [], [], [], []
    for sp in spatial:
        d, e = sp.d, sp.e
        if d < 0:  # reversed kernel: k' = K-1-k
            e, d = e + d * (sp.width - 1), -d
        length = (sp.o.extent - 1) * sp.s + (sp.width - 1) * d + 1
        start, end = max(e, 0), min(e + length, shape[sp.dim])
        if start >= end:
            return Refusal(f"spatial index {x.indices[sp.dim]} reads only padding")
        kept = shape[sp.dim] if shape[sp.dim] - end < sp.s else end  # Conv rounds < s extra positions away
        if start > 0 or kept < shape[sp.dim]:
            slices.append((sp.dim, start, kept, 1))
        conv_pads_begin.append(start - e)
        conv_pads_end.append(e + length - end)
        strides.append(sp.s)
        dilations.append(d)
    x_op = _x_operand(src, len(shape), batch_dims, channel, [sp.dim for sp in spatial], slices, pads, batch)
    if isinstance(x_op, Refusal):
        return x_op
    c = channel.c if channel else None
    w_groups = [(f,) if f else (), (c,) if c else ()] + [(sp.k,) if sp.k else () for sp in spatial]
    w_steps = wv.steps + _flip(wv.labels, flips) + arrange(wv.labels, wv.shape, w_groups) + (Scale(scale),)
    attrs = (
        ("kernel_shape", tuple(sp.width for sp in spatial)),
        ("strides", tuple(strides)),
        ("dilations", tuple(dilations)),
        ("pads", tuple(conv_pads_begin + conv_pads_end)),
        ("group", channel.groups if channel else 1),
    )
    out_groups = (tuple(batch), (f,) if f else ()) + tuple((sp.o,) for sp in spatial)
    w_op = Operand(w.source, normalize(w_steps, tuple(w.source.shape)))
    if not ctx.is_constant(w.source) and any(isinstance(st, Pad) for st in w_op.steps):
        # ONNX Runtime's Pad fusion folds a zero Pad feeding a Conv into the Conv's pads as if it
        # padded the input, and the model no longer loads. Layout steps between the two do not
        # protect it (ONNX Runtime's transpose optimizer cancels Transposes around a Pad), so a
        # weight is padded only at compile time; its other layout steps run fine.
        return Refusal(
            f"the weight {source_name(w.source)} is computed at run time and would need zero padding "
            "(ONNX Runtime's Pad fusion takes a Pad feeding a Conv for the input's padding)"
        )
    raw = tuple(_size(g) for g in out_groups)
    return _Core("Conv", x_op, w_op, attrs, f, out_groups, (), raw)


# --------------------------------------------------------------------------
# ConvTranspose
# --------------------------------------------------------------------------


def _conv_transpose_core(scope: ir.Scope, ctx: MatchContext) -> _Core | Refusal:
    return _attempts(scope, ctx, _conv_transpose_attempt)


def _zero_insertion(acc: ir.Access, ctx: MatchContext):
    """``U[.., E // s, E % s, ..]`` over ``U = L .., i, p, ..: X[.., i, ..]`` (p in [0, 1)).

    Returns ``(X access source, [(index E, stride s) per X dimension], (U,))``,
    None when ``acc`` does not read such a scope, or a Refusal.
    """
    u = acc.source
    if not isinstance(u, ir.Scope) or u in ctx.bound or u.summation or not isinstance(u.body, ir.Access):
        return None
    inner = u.body
    x0 = inner.source
    read: dict[ir.Iter, int] = {}
    for j, idx in enumerate(inner.indices):
        if not isinstance(idx, ir.Iter) or idx in read or idx.lo != x0.origin[j] or idx.extent != x0.shape[j]:
            return None
        read[idx] = j
    zeros = [d for d, it in enumerate(u.traversal) if it not in read]
    if any(u.traversal[d].extent != 1 or u.traversal[d].lo != 0 for d in zeros):
        return None
    outer = {it: acc.indices[d] for d, it in enumerate(u.traversal)}
    mods = {}
    for d in zeros:
        idx = acc.indices[d]
        if not isinstance(idx, ir.IMod):
            return Refusal(f"the zero-insertion dimension of U is read with {idx}, not (..) % s")
        mods[(idx.a, idx.k)] = d
    dims: list[tuple[ir.IndexExpr, int]] = [None] * x0.rank  # type: ignore[list-item]
    for it, j in read.items():
        idx = outer[it]
        if isinstance(idx, ir.IFloorDiv) and (idx.a, idx.k) in mods:
            mods.pop((idx.a, idx.k))
            dims[j] = (idx.a, idx.k)
        else:
            dims[j] = (idx, 1)
    if mods:
        return Refusal("a (..) % s read of U has no matching (..) // s")
    return x0, dims, (u,)


def _conv_transpose_attempt(
    scope: ir.Scope, x: ir.Access, w: ir.Access, scale: float, ctx: MatchContext
) -> _Core | Refusal:
    summ = frozenset(scope.summation)
    through = _zero_insertion(x, ctx)
    if isinstance(through, Refusal):
        return through
    if through is None:
        src, dims, consumes = x.source, [(i, 1) for i in x.indices], ()
    else:
        src, dims, consumes = through
    shape, origin = tuple(src.shape), src.origin
    w_iters = set(w.iters())
    batch_dims: list[tuple[int, ir.Iter, int]] = []
    spatial: list[_Spatial] = []
    channel: _Channel | None = None
    for j, (idx, s) in enumerate(dims):
        pf = positional(idx, s * origin[j])
        if pf is not None:
            coeffs, e = pf
            ts = [it for it in coeffs if it not in summ]
            ks = [it for it in coeffs if it in summ]
            if len(ts) == 1 and len(ks) == 1 and ts[0] not in w_iters and ks[0] in w_iters:
                o, k = ts[0], ks[0]
                if coeffs[o] != 1:
                    return Refusal(f"spatial index {idx}: {o.name} has coefficient {coeffs[o]}, not 1")
                if coeffs[k] > 0 and s == 1:
                    return Refusal(
                        f"spatial index {idx} adds the kernel iterator: a Conv, not a ConvTranspose"
                    )
                spatial.append(_Spatial(j, o, k, s, -coeffs[k], e))
                continue
            if s == 1 and len(ts) == 1 and not ks and ts[0] not in w_iters and coeffs[ts[0]] == 1:
                batch_dims.append((j, ts[0], e))
                continue
        if s != 1 or channel is not None:
            return Refusal(f"input index {idx} is neither o + p - d*k nor an input channel")
        ch = _parse_channel(j, idx, origin[j], summ, w_iters)
        if isinstance(ch, Refusal):
            return ch
        channel = ch
    f = _output_channel(scope, w_iters)
    if isinstance(f, Refusal):
        return f
    batch = [t for t in scope.traversal if any(t is b for _, b, _ in batch_dims)]
    bad = _check_roles(scope, batch, f, channel, spatial, w_iters, x.iters() | w_iters)
    if bad:
        return bad
    groups = channel.groups if channel else 1
    x_channel = (dims[channel.dim][0], origin[channel.dim]) if channel else None
    w_op = _ct_weight(w, channel, x_channel, f, spatial)
    if isinstance(w_op, Refusal):
        return w_op
    begins, ends, out_pads, lead, trail = [], [], [], [], []
    for i, sp in enumerate(spatial):
        d, pb = sp.d, sp.e
        if d < 0:  # o + pb + |d|*k: reversed kernel k' = K-1-k
            pb, d = pb - d * (sp.k.extent - 1), -d
        full = (shape[sp.dim] - 1) * sp.s + (sp.k.extent - 1) * d + 1
        w0, w1 = pb, pb + sp.o.extent
        if w1 <= 0 or w0 >= full:
            return Refusal(f"spatial index {dims[sp.dim][0]} reads only zeros")
        begin = max(w0, 0)
        if w1 <= full:
            end, op, extra = full - w1, 0, 0
        else:
            op = min(w1 - full, sp.s - 1)
            end, extra = 0, w1 - full - op
        begins.append(begin)
        ends.append(end)
        out_pads.append(op)
        lead.append(begin - w0)
        trail.append(extra)
        spatial[i] = dataclasses.replace(sp, d=d, e=pb)
    x_op = _x_operand(src, len(shape), batch_dims, channel, [sp.dim for sp in spatial], [], {}, batch)
    if isinstance(x_op, Refusal):
        return x_op
    w_op = Operand(w_op.source, normalize(w_op.steps + (Scale(scale),), tuple(w.source.shape)))
    attrs = [
        ("kernel_shape", tuple(sp.k.extent for sp in spatial)),
        ("strides", tuple(sp.s for sp in spatial)),
        ("dilations", tuple(sp.d for sp in spatial)),
        ("pads", tuple(begins + ends)),
        ("group", groups),
    ]
    if any(out_pads):
        attrs.append(("output_padding", tuple(out_pads)))
    out_groups = (tuple(batch), (f,) if f else ()) + tuple((sp.o,) for sp in spatial)
    out_steps: tuple[LayoutStep, ...] = ()
    if any(lead) or any(trail):
        out_steps = (Pad((0, 0, *lead, 0, 0, *trail)),)
    raw = tuple(_size(g) for g in out_groups[:2]) + tuple(
        sp.o.extent - a - b for sp, a, b in zip(spatial, lead, trail, strict=True)
    )
    return _Core("ConvTranspose", x_op, w_op, tuple(attrs), f, out_groups, out_steps, raw, consumes)


def _ct_weight(
    w: ir.Access,
    channel: _Channel | None,
    x_channel: tuple[ir.IndexExpr, int] | None,
    f: ir.Iter | None,
    spatial: list[_Spatial],
) -> Operand | Refusal:
    """The weight as ``[C, F/G, K..]``: ``W[c, f, k..]`` for one group, else
    ``W[<the input's channel index>, f % Fg, k..]``."""
    flips = [sp.k for sp in spatial if sp.d < 0]
    c = channel.c if channel else None
    shape = tuple(w.source.shape)
    if channel is None or channel.groups == 1:
        wv = _weight_view(w)
        if isinstance(wv, Refusal):
            return wv
        w_groups = [(c,) if c else (), (f,) if f else ()] + [(sp.k,) for sp in spatial]
        steps = wv.steps + _flip(wv.labels, flips) + arrange(wv.labels, wv.shape, w_groups)
        return Operand(w.source, normalize(steps, shape))
    assert x_channel is not None
    x_lf = linear_form(x_channel[0])
    x_key = (dict(x_lf.coeffs), dict(x_lf.atoms), x_lf.const - x_channel[1])
    kernels = {sp.k: sp for sp in spatial}
    labels: list[Hashable] = []
    for j, idx in enumerate(w.indices):
        lf, o, n = linear_form(idx), w.source.origin[j], shape[j]
        pf = positional(idx, o)
        if (dict(lf.coeffs), dict(lf.atoms), lf.const - o) == x_key and n == channel.groups * channel.cg:
            labels.append(_CHANNEL)
        elif _is_group_member(idx, f, channel.fg) and n == channel.fg:
            labels.append(_MEMBER)
        elif pf is not None and pf[1] == 0 and len(pf[0]) == 1:
            ((k, a),) = pf[0].items()
            if k not in kernels or a != 1 or n != k.extent:
                return Refusal(f"weight index {idx} is not a kernel iterator")
            labels.append(k)
        elif pf is not None and not pf[0] and pf[1] == 0 and n == 1 and channel.fg == 1:
            labels.append(_MEMBER)
        else:
            return Refusal(f"grouped weight index {idx} is not the input channel index, {f} % Fg or a kernel")
    need = [_CHANNEL, _MEMBER] + [sp.k for sp in spatial]
    if len(labels) != len(need) or set(labels) != set(need):
        return Refusal(f"grouped weight {brief(w)} is not W[c + Cg*(f // Fg), f % Fg, k..]")
    steps = _flip(labels, flips) + arrange(
        labels, shape, [(_CHANNEL,), (_MEMBER,)] + [(sp.k,) for sp in spatial]
    )
    return Operand(w.source, normalize(steps, shape))


def _is_group_member(idx: ir.IndexExpr, f: ir.Iter | None, fg: int) -> bool:
    """``idx`` is ``f % Fg`` (f starting at 0)."""
    if f is None or not isinstance(idx, ir.IMod) or idx.k != fg:
        return False
    pf = positional(idx.a)
    return pf is not None and pf == ({f: 1}, 0) and f.lo == 0

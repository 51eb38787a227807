"""Views of accesses as layout steps, arranging labelled dimensions, and index maps.

Every analysis works in *positions*: an iterator ``it`` of a scope is stored at
position ``p = value - it.lo``, and a source (tensor or scope) dimension ``d``
holds index value ``origin[d] + p`` at position ``p``.

:func:`simple_view` turns an access whose dimensions are affine in one
iterator each (strided, reversed, offset, broadcast by a constant index),
row-major merges of several iterators (``A[m1*M2 + m2]``) or unravelled reads
of one iterator (``A[t // W, t % W]``) into ``Slice``/``Pad``/``Reshape`` steps
and one label (the iterator) per resulting dimension. :func:`arrange` and
:func:`finish` order and group labelled dimensions with ``Transpose`` and
``Reshape`` (and ``Expand`` for output iterators nothing reads).
:func:`index_map` and :func:`plan_map` give the exact integer maps layout
plans are checked with.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable, Sequence

import numpy as np

from einopt.core import ir
from einopt.core.index import bounds, linear_form, simplify
from einopt.core.interp import eval_index
from einopt.core.rewrite import accesses, fold_chain, operands
from einopt.core.syntax import brief
from einopt.instantiate.plan import (
    Expand,
    LayoutStep,
    Literal,
    MatchContext,
    Pad,
    Refusal,
    Reshape,
    Slice,
    Source,
    Transpose,
    apply_steps,
    normalize,
)

__all__ = [
    "window_1d",
    "simple_view",
    "arrange",
    "finish",
    "index_map",
    "positional",
    "as_product",
    "iter_list",
    "to_traversal",
    "plan_map",
    "source_name",
    "BiasForm",
    "split_bias",
    "View",
]


# --------------------------------------------------------------------------
# Index helpers
# --------------------------------------------------------------------------


def positional(idx: ir.IndexExpr, origin: int = 0) -> tuple[dict[ir.Iter, int], int] | None:
    """An affine index as ``({it: coefficient}, constant)`` over iterator *positions*
    and source *positions* (``origin`` subtracted); None when not affine."""
    lf = linear_form(idx)
    if lf.atoms:
        return None
    coeffs = dict(lf.coeffs)
    return coeffs, lf.const + sum(c * it.lo for it, c in coeffs.items()) - origin


def iter_list(e: ir.IndexExpr) -> tuple[ir.Iter, ...]:
    """The iterators of an index expression, in first-appearance order (atoms' last, by name)."""
    lf = linear_form(e)
    out = [it for it, _ in lf.coeffs]
    for atom, _ in lf.atoms:
        out += sorted((it for it in atom.iters() if it not in out), key=lambda it: it.name)
    return tuple(dict.fromkeys(out))


def as_product(body: ir.ValueExpr) -> tuple[float, list[ir.Access]] | Refusal:
    """``body`` as ``scale * A1 * A2 * ...`` (constants, ``neg`` and ``/ constant`` fold into scale)."""
    scale = 1.0
    factors: list[ir.Access] = []
    stack = [body]
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Binary) and e.op == "*":
            stack += (e.b, e.a)
        elif isinstance(e, ir.Binary) and e.op == "/" and isinstance(e.b, ir.Const) and e.b.value != 0.0:
            scale /= e.b.value
            stack.append(e.a)
        elif isinstance(e, ir.Unary) and e.fn == "neg":
            scale = -scale
            stack.append(e.x)
        elif isinstance(e, ir.Const):
            scale *= e.value
        elif isinstance(e, ir.Access):
            factors.append(e)
        else:
            what = e.op if isinstance(e, ir.Binary) else getattr(e, "fn", type(e).__name__)
            return Refusal(f"the body is not a product of accesses (it uses {what!r})")
    return scale, factors


def source_name(src: Source) -> str:
    if isinstance(src, ir.Tensor):
        return src.name
    if isinstance(src, ir.Scope):
        return "a nested scope"
    return "a literal"


# --------------------------------------------------------------------------
# One-dimensional windows
# --------------------------------------------------------------------------


def window_1d(
    s: int, c: int, n: int, size: int
) -> tuple[tuple[int, int, int] | None, tuple[int, int]] | None:
    """Read ``X'[p] = X[c + s*p]`` for ``0 <= p < n`` from ``X`` of length ``size`` (0 outside).

    Returns ``(slice, pads)``: a ``(start, end, step)`` slice of ``X`` (None
    when it is all of ``X`` in order) followed by ``(before, after)`` zero pads;
    None when every read falls outside ``X``.
    """
    if s == 0:
        raise ValueError("window_1d needs a non-zero step")
    if s > 0:
        a = max(0, _ceil_div(-c, s))
        b = min(n, _ceil_div(size - c, s))
    else:
        t = -s
        a = max(0, (c - size) // t + 1)
        b = min(n, c // t + 1)
    if a >= b:
        return None
    start = c + s * a
    last = c + s * (b - 1)
    if s > 0:
        end = last + 1
    else:
        end = last - 1 if last >= 1 else -(size + 1)
    sl = None if (s == 1 and start == 0 and end == size) else (start, end, s)
    return sl, (a, n - b)


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


# --------------------------------------------------------------------------
# Simple views
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class View:
    """An access as an array with one dimension per iterator it reads.

    ``source`` read through ``steps`` gives an array whose dimension ``i`` is
    iterator ``labels[i]`` at its positions. ``valid[i]`` is the position range
    ``[a, b)`` of ``labels[i]`` where the read is inside the source, when the
    dimension was read on its own (None when it shares a component).
    """

    source: ir.Tensor | ir.Scope | Literal
    labels: tuple[ir.Iter, ...]
    steps: tuple[LayoutStep, ...]
    valid: tuple[tuple[int, int] | None, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(it.extent for it in self.labels)


def _components(indices: Sequence[ir.IndexExpr]) -> list[tuple[list[int], list[ir.Iter]]]:
    """Source dimensions grouped by shared iterators, ordered by first dimension."""
    its_of = [iter_list(i) for i in indices]
    seen: set[int] = set()
    out: list[tuple[list[int], list[ir.Iter]]] = []
    for d0 in range(len(indices)):
        if d0 in seen:
            continue
        dims, its, todo = [d0], list(its_of[d0]), list(its_of[d0])
        seen.add(d0)
        while todo:
            it = todo.pop()
            for d, others in enumerate(its_of):
                if d not in seen and it in others:
                    seen.add(d)
                    dims.append(d)
                    new = [x for x in others if x not in its]
                    its += new
                    todo += new
        out.append((sorted(dims), its))
    return out


def simple_view(acc: ir.Access) -> View | Refusal:
    """The view of an access (memoised on the interned access: matchers ask again and again).

    See :func:`_simple_view`.
    """
    return ir._cached(acc, "simple_view", lambda: _simple_view(acc))


def _simple_view(acc: ir.Access) -> View | Refusal:
    """Decompose an access into layout steps with one labelled dimension per iterator.

    Each group of source dimensions sharing iterators must be one of: a
    constant index (selected with ``Slice``, dimension dropped); one iterator
    read affinely or as an unravelled row-major index over consecutive
    dimensions (``Reshape`` merge, then a strided ``Slice`` and zero ``Pad``);
    one dimension read as a contiguous row-major merge of several iterators
    (``Slice``/``Pad``, then a ``Reshape`` split).
    """
    src = acc.source
    shape = tuple(src.shape)
    origin = src.origin
    name = source_name(src)
    mid_shape: list[int] = []
    slices: list[tuple[int, int, int, int]] = []  # (axis, start, end, step) on mid dims
    pads: list[tuple[int, int]] = []
    final: list[int] = []
    labels: list[ir.Iter] = []
    valid: list[tuple[int, int] | None] = []
    for dims, its in _components(acc.indices):
        idxs = [acc.indices[d] for d in dims]
        if not its:
            (d,) = dims
            lo, hi = bounds(idxs[0])
            q = lo - origin[d]
            if lo != hi or not 0 <= q < shape[d]:
                return Refusal(
                    f"{name} is read at constant index {idxs[0]} outside dimension {d} (size {shape[d]}): "
                    "only zeros"
                )
            axis = len(mid_shape)
            mid_shape.append(shape[d])
            pads.append((0, 0))
            if shape[d] != 1:
                slices.append((axis, q, q + 1, 1))
            continue
        if len(its) == 1:
            res = _single_iterator(acc, dims, its[0], name)
            if isinstance(res, Refusal):
                return res
            size, s, c = res
            win = window_1d(s, c, its[0].extent, size)
            if win is None:
                return Refusal(f"{name} is read only outside its range along dimension(s) {dims}")
            sl, pad = win
            axis = len(mid_shape)
            mid_shape.append(size)
            pads.append(pad)
            if sl is not None:
                slices.append((axis, *sl))
            final.append(its[0].extent)
            labels.append(its[0])
            valid.append((pad[0], its[0].extent - pad[1]))
            continue
        if len(dims) == 1:
            res = _split(idxs[0], origin[dims[0]], name)
            if isinstance(res, Refusal):
                return res
            order, s, c = res
            total = math.prod(it.extent for it in order)
            win = window_1d(s, c, total, shape[dims[0]])
            if win is None:
                return Refusal(f"{name} is read only outside its range along dimension {dims[0]}")
            sl, pad = win
            axis = len(mid_shape)
            mid_shape.append(shape[dims[0]])
            pads.append(pad)
            if sl is not None:
                slices.append((axis, *sl))
            final += [it.extent for it in order]
            labels += order
            full = pad == (0, 0)
            valid += [(0, it.extent) if full else None for it in order]
            continue
        shown = ", ".join(it.name for it in its)
        return Refusal(f"dimensions {dims} of {name} read iterators {shown} jointly: not a view")
    steps: list[LayoutStep] = []
    if len(mid_shape) != len(shape):
        steps.append(Reshape(tuple(mid_shape)))
    if slices:
        axes, starts, ends, stps = zip(*slices, strict=True)
        steps.append(Slice(tuple(starts), tuple(ends), tuple(axes), tuple(stps)))
    if any(p != (0, 0) for p in pads):
        steps.append(Pad(tuple(p[0] for p in pads) + tuple(p[1] for p in pads)))
    steps.append(Reshape(tuple(final)))
    return View(src, tuple(labels), normalize(steps, shape), tuple(valid))


def _single_iterator(
    acc: ir.Access, dims: list[int], it: ir.Iter, name: str
) -> tuple[int, int, int] | Refusal:
    """One iterator reading consecutive dimensions: ``(merged size, step, offset)`` over positions."""
    src = acc.source
    shape, origin = tuple(src.shape), src.origin
    if len(dims) == 1:
        pf = positional(acc.indices[dims[0]], origin[dims[0]])
        if pf is not None:
            return shape[dims[0]], pf[0][it], pf[1]
    if dims != list(range(dims[0], dims[0] + len(dims))):
        return Refusal(f"dimensions {dims} of {name} read {it.name} jointly but are not adjacent")
    sizes = [shape[d] for d in dims]
    total = math.prod(sizes)
    shown = ", ".join(str(acc.indices[d]) for d in dims)
    exact = _affine_flat(acc, dims, sizes, it)
    if exact is not None:
        return total, *exact
    # Reject on a sample first: the full check enumerates the iterator (10^7 values after a merge).
    n = it.extent
    if n > 3 * _SAMPLE:
        spread = np.linspace(_SAMPLE, n - _SAMPLE - 1, _SAMPLE).astype(np.int64)
        sample = np.concatenate([np.arange(_SAMPLE), spread, np.arange(n - _SAMPLE, n)])
        res = _strided_fit(acc, dims, sizes, it, sample)
        if isinstance(res, Refusal):
            return Refusal(f"{name}[{shown}] {res.reason} of {it.name}")
        if not _even_steps(acc, dims, sizes, it, spread):
            return Refusal(f"{name}[{shown}] is not a strided view of {it.name}")
    res = _strided_fit(acc, dims, sizes, it, np.arange(n, dtype=np.int64))
    if res is None:
        return Refusal(f"{name}[{shown}] is read only outside its range")
    if isinstance(res, Refusal):
        return Refusal(f"{name}[{shown}] {res.reason} of {it.name}")
    return (total, *res)


_SAMPLE = 2048


def _flat_reads(
    acc: ir.Access, dims: list[int], sizes: list[int], it: ir.Iter, points: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """At the positions ``points`` of ``it``: the row-major position read in ``dims`` (sizes
    ``sizes``) of the source, and whether every one of those dimensions is read in range."""
    env = {it: points + it.lo}
    flat = np.zeros(points.size, dtype=np.int64)
    ok = np.ones(points.size, dtype=bool)
    origin = acc.source.origin
    for d, n in zip(dims, sizes, strict=True):
        pos = np.broadcast_to(eval_index(acc.indices[d], env) - origin[d], (points.size,))
        ok &= (pos >= 0) & (pos < n)
        flat = flat * n + pos
    return flat, ok


def _even_steps(acc: ir.Access, dims: list[int], sizes: list[int], it: ir.Iter, at: np.ndarray) -> bool:
    """Whether the flattened read steps by one nonzero amount from ``p`` to ``p + 1`` at every
    position ``p`` of ``at`` where both are in range (a strided view does, everywhere)."""
    at = at[at + 1 < it.extent]
    flat, ok = _flat_reads(acc, dims, sizes, it, np.stack([at, at + 1], axis=1).reshape(-1))
    both = ok[0::2] & ok[1::2]
    steps = (flat[1::2] - flat[0::2])[both]
    return steps.size == 0 or (steps[0] != 0 and bool(np.all(steps == steps[0])))


def _affine_flat(acc: ir.Access, dims: list[int], sizes: list[int], it: ir.Iter) -> tuple[int, int] | None:
    """``(step, offset)`` when the flattened read provably is ``step * p + offset`` and in range
    exactly where that value is (every dimension after the first provably inside), else None."""
    origin = acc.source.origin
    flat: ir.IndexExpr = ir.IConst(0)
    for k, (d, n) in enumerate(zip(dims, sizes, strict=True)):
        pos = acc.indices[d] - origin[d]
        lo, hi = bounds(pos)
        if k and not (0 <= lo and hi < n):
            return None
        flat = flat * n + pos
    pf = positional(simplify(flat))
    if pf is None or set(pf[0]) - {it} or not pf[0].get(it):
        return None
    return pf[0][it], pf[1]


def _strided_fit(
    acc: ir.Access, dims: list[int], sizes: list[int], it: ir.Iter, points: np.ndarray
) -> tuple[int, int] | Refusal | None:
    """Fit the flattened read as ``step * p + offset`` over the positions ``points`` of ``it``.

    ``points`` is increasing and starts ``0, 1, 2, ...``: the step comes from the first two
    in-range positions, which must lie in that contiguous prefix, so a failure on the points
    is a failure on the whole range. None when that cannot be decided on these points (or,
    over the whole range, when no position is in range).
    """
    flat, ok = _flat_reads(acc, dims, sizes, it, points)
    where = np.flatnonzero(ok)
    whole = points.size == it.extent
    if where.size < 2 and not whole or where.size >= 2 and points[where[1]] != where[1]:
        return None  # the first in-range positions are not in the sample's prefix
    if where.size == 0:
        return None
    p0 = int(points[where[0]])
    total = math.prod(sizes)
    if where.size == 1:
        s = total  # one read: a step past the whole source leaves every other position out of range
    else:
        p1 = int(points[where[1]])
        ds = int(flat[where[1]] - flat[where[0]])
        if ds % (p1 - p0) or ds == 0:
            return Refusal("is not a strided view")
        s = ds // (p1 - p0)
    c = int(flat[where[0]]) - s * p0
    expect = c + s * points
    if not (np.array_equal((expect >= 0) & (expect < total), ok) and np.array_equal(flat[ok], expect[ok])):
        return Refusal("is not a row-major (reshape) view")
    return s, c


def _split(idx: ir.IndexExpr, origin: int, name: str) -> tuple[list[ir.Iter], int, int] | Refusal:
    """One dimension read as a row-major merge ``s*(i*J + j) + c``: ``(iterators outer first, s, c)``."""
    pf = positional(idx, origin)
    if pf is None:
        return Refusal(f"index {idx} of {name} is not affine in its iterators")
    coeffs, c = pf
    # outer first; of equal coefficients, extent-1 iterators innermost (so names never decide)
    order = sorted(coeffs, key=lambda it: (-abs(coeffs[it]), it.extent == 1, it.name))
    signs = {coeffs[it] > 0 for it in order}
    s = coeffs[order[-1]]
    stride = s
    ok = len(signs) == 1
    for it in reversed(order):
        ok = ok and coeffs[it] == stride
        stride *= it.extent
    if not ok:
        shown = ", ".join(f"{it.name} (extent {it.extent})" for it in order)
        return Refusal(f"index {idx} of {name} merges {shown} non-contiguously: not a reshape")
    return order, s, c


# --------------------------------------------------------------------------
# Arranging labelled dimensions
# --------------------------------------------------------------------------


def arrange(
    labels: Sequence[Hashable], shape: Sequence[int], groups: Sequence[Sequence[Hashable]]
) -> tuple[LayoutStep, ...]:
    """Steps from dimensions ``labels`` to one dimension per group (row-major merge; () -> size 1).

    Every label must be in exactly one group, except size-1 dimensions, which may be dropped.
    """
    labels, shape = list(labels), tuple(shape)
    flat = [lab for g in groups for lab in g]
    if len(set(flat)) != len(flat) or any(lab not in labels for lab in flat):
        raise ValueError(f"bad grouping {groups} of {labels}")
    rest = [d for d, lab in enumerate(labels) if lab not in flat]
    if any(shape[d] != 1 for d in rest):
        raise ValueError(f"dimensions {[labels[d] for d in rest]} are not grouped")
    perm = tuple(labels.index(lab) for lab in flat) + tuple(rest)
    target = tuple(math.prod(shape[labels.index(lab)] for lab in g) for g in groups)
    return normalize((Transpose(perm), Reshape(target)), shape)


def finish(groups: Sequence[Sequence[ir.Iter]], traversal: Sequence[ir.Iter]) -> tuple[LayoutStep, ...]:
    """Steps from a result with one dimension per group to the scope's traversal layout."""
    shape = tuple(math.prod(it.extent for it in g) for g in groups)
    labels = [it for g in groups for it in g]
    split = tuple(it.extent for it in labels)
    return normalize((Reshape(split), *to_traversal(labels, split, traversal)), shape)


# --------------------------------------------------------------------------
# Index maps: the exact check of layout plans
# --------------------------------------------------------------------------


# Layouts are pure functions of interned iterators and hashable steps, and the states of a search
# share most accesses and traversals: the matchers' arrangements are computed once across scopes
# (bounded caches).
@functools.lru_cache(maxsize=1 << 15)
def _arranged(
    labels: tuple[ir.Iter, ...], steps: tuple[LayoutStep, ...], source: tuple[int, ...], groups: tuple
) -> tuple[LayoutStep, ...]:
    return normalize(steps + arrange(labels, tuple(t.extent for t in labels), groups), source)


def arranged(view: View, groups: Sequence[Sequence[ir.Iter]]) -> tuple[LayoutStep, ...]:
    """``view`` read from its source and arranged to one dimension per group (:func:`arrange`
    after the view's own steps, normalised; memoised)."""
    return _arranged(view.labels, view.steps, tuple(view.source.shape), tuple(map(tuple, groups)))


@functools.lru_cache(maxsize=1 << 15)
def finished(
    groups: tuple[tuple[ir.Iter, ...], ...], traversal: tuple[ir.Iter, ...]
) -> tuple[LayoutStep, ...]:
    """:func:`finish`, memoised (both arguments tuples)."""
    return finish(groups, traversal)


def index_map(traversal: Sequence[ir.Iter], acc: ir.Access) -> np.ndarray:
    """For every traversal position, the row-major position read in ``acc.source`` (-1 outside)."""
    r = len(traversal)
    env = {
        t: np.arange(t.lo, t.hi, dtype=np.int64).reshape((1,) * d + (t.extent,) + (1,) * (r - d - 1))
        for d, t in enumerate(traversal)
    }
    out_shape = tuple(t.extent for t in traversal)
    flat = np.zeros((1,) * r, dtype=np.int64)
    ok = np.ones((1,) * r, dtype=bool)
    for idx, o, n in zip(acc.indices, acc.source.origin, acc.source.shape, strict=True):
        pos = eval_index(idx, env) - o
        ok = ok & (pos >= 0) & (pos < n)
        flat = flat * n + np.clip(pos, 0, n - 1)
    return np.broadcast_to(np.where(ok, flat, -1), out_shape)


def plan_map(shape: tuple[int, ...], steps: Sequence[LayoutStep]) -> np.ndarray:
    """The index map of ``steps`` applied to a source of ``shape`` (-1 for inserted zeros)."""
    return apply_steps(steps, np.arange(math.prod(shape), dtype=np.int64).reshape(shape), fill=-1)


def to_traversal(
    labels: Sequence[ir.Iter], shape: Sequence[int], traversal: Sequence[ir.Iter]
) -> tuple[LayoutStep, ...]:
    """Steps from dimensions labelled by iterators to the traversal layout (Expand for unread ones)."""
    steps = list(arrange(labels, shape, [(t,) if t in labels else () for t in traversal]))
    if any(t not in labels and t.extent > 1 for t in traversal):
        steps.append(Expand(tuple(t.extent for t in traversal)))
    return normalize(steps, tuple(shape))


# --------------------------------------------------------------------------
# Bias forms: ``L x: S[x] + B[..]`` with S an inline contraction scope
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class BiasForm:
    """``L x: S[x] + beta * B[..]``: the inline scope ``S`` read at its own positions, plus a bias.

    ``traversal`` is the outer traversal in ``S``'s iterators; ``bias`` views
    the bias access with labels translated to ``S``'s iterators (a constant
    bias ``S[..] + c`` is a scalar :class:`Literal` with no labels).
    """

    inner: ir.Scope
    traversal: tuple[ir.Iter, ...]
    bias: View
    beta: float


def split_bias(scope: ir.Scope, ctx: MatchContext) -> BiasForm | Refusal:
    """Recognise ``S[..] + B[..]`` or ``S[..] + c`` (either order, ``beta * B`` allowed), S an inline
    summing scope."""
    if scope.summation:
        return Refusal("not a bias form: the outer scope sums")
    body = scope.body
    if not (isinstance(body, ir.Binary) and body.op == "+"):
        return Refusal("not a bias form S[..] + B[..]")
    if len(operands(body, "+")) > 2:
        body = _one_constant_bias(scope, ctx)
        if isinstance(body, Refusal):
            return body
    reasons = []
    for inner, other in ((body.a, body.b), (body.b, body.a)):
        if not (isinstance(inner, ir.Access) and isinstance(inner.source, ir.Scope)):
            continue
        s = inner.source
        if s in ctx.bound:
            reasons.append("the product scope is a program binding (materialised anyway)")
            continue
        if not s.summation:
            reasons.append("the inner scope does not sum")
            continue
        to_inner = _identity_positions(scope.traversal, inner)
        if to_inner is None:
            reasons.append(f"the inner scope is not read at its own positions ({brief(inner)})")
            continue
        beta, bias = 1.0, other
        for c, a in _pairs_const(other):
            beta, bias = c, a
        if isinstance(bias, ir.Const):  # a one-element bias the importer turned into a constant
            scalar = Literal(np.asarray(bias.value, dtype=np.float32))
            traversal = tuple(to_inner.get(t, t) for t in scope.traversal)
            return BiasForm(s, traversal, View(scalar, (), (), ()), beta)
        if not isinstance(bias, ir.Access):
            reasons.append("the bias term is not an access (or a constant times an access)")
            continue
        view = simple_view(bias)
        if isinstance(view, Refusal):
            reasons.append(f"bias: {view.reason}")
            continue
        labels = tuple(to_inner.get(it, it) for it in view.labels)
        return BiasForm(
            s,
            tuple(to_inner.get(t, t) for t in scope.traversal),
            dataclasses.replace(view, labels=labels),
            beta,
        )
    return Refusal("not a bias form: " + ("; ".join(reasons) or "no inline scope is added"))


def _one_constant_bias(scope: ir.Scope, ctx: MatchContext) -> ir.ValueExpr | Refusal:
    """``S[..] + B1[..] + B2[..] + ..`` as ``S[..] + B[..]``, ``B`` the sum of the constant terms
    (a scope computed at compile time): two merged contractions keep both their biases."""
    terms = operands(scope.body, "+")
    inner = [
        t for t in terms if isinstance(t, ir.Access) and isinstance(t.source, ir.Scope) and t.source.summation
    ]
    if len(inner) != 1:
        return Refusal(f"not a bias form: {len(inner)} summing terms in a sum of {len(terms)}")
    rest = [t for t in terms if t is not inner[0]]
    if not all(ctx.is_constant(a.source) for t in rest for a in accesses(t)):
        return Refusal("not a bias form: a term besides the contraction is not constant")
    if not any(t.iters() for t in rest):
        if not all(isinstance(t, ir.Const) for t in rest):
            return Refusal("not a bias form: a scalar bias that is not a constant")
        return ir.Binary("+", inner[0], ir.Const(sum(t.value for t in rest)))
    return ir.Binary("+", inner[0], compile_time_term(rest, "+", scope.traversal))


def compile_time_term(terms: Sequence[ir.ValueExpr], op: str, traversal: Sequence[ir.Iter]) -> ir.Access:
    """Constant ``terms`` of an ``op`` chain as one term: a scope over the traversal iterators they
    read, which the emitter computes at compile time (it reads only constants), read in place."""
    read = set().union(*(t.iters() for t in terms))
    its = tuple(it for it in traversal if it in read)
    return ir.Access(ir.Scope(its, (), fold_chain(terms, op)), its)


def _pairs_const(e: ir.ValueExpr) -> list[tuple[float, ir.ValueExpr]]:
    if isinstance(e, ir.Binary) and e.op == "*":
        if isinstance(e.a, ir.Const):
            return [(e.a.value, e.b)]
        if isinstance(e.b, ir.Const):
            return [(e.b.value, e.a)]
    return []


def _identity_positions(traversal: Sequence[ir.Iter], acc: ir.Access) -> dict[ir.Iter, ir.Iter] | None:
    """Outer -> inner iterator map when ``acc`` reads its scope at exactly the outer positions (outer
    iterators with one value may go unread: the result gets a unit dimension there)."""
    s = acc.source
    out: dict[ir.Iter, ir.Iter] = {}
    for idx, it in zip(acc.indices, s.traversal, strict=True):
        if not isinstance(idx, ir.Iter) or idx.lo != it.lo or idx.hi != it.hi or idx in out:
            return None
        out[idx] = it
    unread = set(traversal) - set(out)
    clash = unread & set(out.values())  # an unread one must not pass for an inner iterator
    return out if set(out) <= set(traversal) and all(t.extent == 1 for t in unread) and not clash else None

"""Q, K and V as projections of one input: the packed weights of com.microsoft ``Attention``.

``Attention`` is the MultiHeadAttention core (``match_contrib_attention``) of ``Q = X Wq + bq``,
``K = X Wk + bk`` and ``V = X Wv + bv``, one input ``X [B, S, hidden]`` and the weights packed along
their columns (``[Wq | Wk | Wv]``, ``[hidden, Hq + Hk + Hv]``), the biases likewise.

Each read of Q, K or V by the core (an access at iterators with roles: the batch ``b``, the head
``h``, the query ``i`` or key ``j`` position, the head's dimension ``d`` or ``e``) is followed into
the inline scope it reads: a contraction over one iterator of ``X`` times a constant weight (any
simple view of it: MatMul's ``W[k, n]``, Gemm's ``W[n, k]``), optionally inside a bias form
``S[..] + B[..]`` (``views.split_bias``). Substituting the read's indices into the projection writes
each factor in the core's iterators: ``X`` must read only the batch, the position and the summed
hidden iterator, the weight and the bias only the head and its dimension. The packed weight and
bias are IR scopes over the constant tensors (the emitter evaluates a scope that reads only
constants at compile time); a projection without a bias packs zeros.
"""

from __future__ import annotations

import dataclasses

from einopt.core import ir
from einopt.core.index import bounds, simplify, substitute
from einopt.core.rewrite import accesses, fresh_name, map_accesses, substitute_iters
from einopt.instantiate.plan import MatchContext, Operand, Refusal
from einopt.instantiate.views import arranged, as_product, simple_view, source_name, split_bias
from einopt.rules.merge import concat_scope

__all__ = ["Packing", "Projection", "pack", "read_projection"]

Roles = dict[ir.Iter, str]  # an iterator's role in the core: "b", "h", "i", "j", "d", "e"


@dataclasses.dataclass(frozen=True, eq=False)
class Projection:
    """One of Q, K, V as the core reads it, ``X[..] * W[..] + bias``, in the core's iterators.

    ``x`` reads ``batch``, ``position`` and ``kappa`` (the summed hidden iterator, renamed apart from
    the core's); ``weight`` (the projection's constant factor included) reads ``kappa``, ``head`` and
    ``column``; ``bias`` (None: none) reads ``head`` and ``column``.
    """

    x: ir.Access
    weight: ir.ValueExpr
    bias: ir.ValueExpr | None
    kappa: ir.Iter
    batch: ir.Iter | None
    position: ir.Iter
    head: ir.Iter | None
    column: ir.Iter | None


def _constant(src: ir.Tensor | ir.Scope, ctx: MatchContext) -> bool:
    """A constant source: one ``ctx`` knows, or a scope that reads only constant tensors."""
    return ctx.is_constant(src) or (
        isinstance(src, ir.Scope) and all(ctx.is_constant(t) for t in ir.input_tensors(src))
    )


def read_projection(
    acc: ir.Access, roles: Roles, position: str, column: str, ctx: MatchContext
) -> Projection | Refusal:
    """The projection ``acc`` reads, in the core's iterators.

    ``acc`` is the core's read of Q, K or V, ``roles`` its iterators' roles, ``position`` the role of
    its position (``"i"`` or ``"j"``) and ``column`` that of the head's dimension (``"d"`` or
    ``"e"``); ``ctx`` tells the constants (the weight and the bias must be). Program bindings are
    not looked at: the caller refuses a match that fuses one.
    """
    by_role = {r: it for it, r in roles.items()}
    if position not in by_role:
        return Refusal(f"no {position} positions (one, dropped): not a projection of positions")
    rows = {by_role.get("b"), by_role.get(position)} - {None}
    cols = {by_role.get("h"), by_role.get(column)} - {None}
    # an iterator of one value without a role reads its one position
    fixed = {
        it: ir.IConst(it.lo) for i in acc.indices for it in i.iters() if it not in roles and it.extent == 1
    }
    found = _through_layout(acc, fixed)
    if isinstance(found, Refusal):
        return found
    p, at, outer = found
    product, bias = p, None
    if not p.summation:
        form = split_bias(p, MatchContext(constant=ctx.constant))
        if isinstance(form, Refusal):
            return Refusal(f"not a projection plus a bias: {form.reason}")
        product = form.inner
        inner = {a for a in accesses(p.body) if a.source is product}
        if len(inner) != 1:
            return Refusal("the bias form reads its product at two places")
        # the bias is the body without the product (split_bias checked it is a sum of the two)
        bias = substitute_iters(map_accesses(p.body, lambda a: ir.Const(0.0) if a in inner else a), at)
        bias = bias if outer == 1.0 else ir.Binary("*", ir.Const(outer), bias)
        (read,) = inner
        at = {t: simplify(substitute(i, at)) for t, i in zip(product.traversal, read.indices, strict=True)}
    if len(product.summation) != 1:
        return Refusal(
            f"the projection sums over {len(product.summation)} iterators, not one (the hidden one)"
        )
    prod = as_product(product.body)
    if isinstance(prod, Refusal) or len(prod[1]) != 2:
        return Refusal("the projection is not a product of an input and a weight")
    scale, factors = prod
    (k,) = product.summation
    taken = {it.name for it in roles} | {it.name for i in acc.indices for it in i.iters()}
    kappa = ir.Iter(fresh_name(k.name, taken), k.lo, k.hi)
    at[k] = kappa
    reads = [substitute_iters(f, at) for f in factors]
    # where both factors read only the hidden iterator, the constant one is the weight
    orders = sorted((reads, reads[::-1]), key=lambda xw: not _constant(xw[1].source, ctx))
    split = next(
        (
            (x, w)
            for x, w in orders
            if kappa in x.iters() & w.iters() and x.iters() <= rows | {kappa} and w.iters() <= cols | {kappa}
        ),
        None,
    )
    if split is None:
        return Refusal("the projection is not an input read at the batch and positions times a weight")
    x, w = split
    if not _constant(w.source, ctx):
        return Refusal(f"the weight {source_name(w.source)} is not a constant")
    if bias is not None:
        if not bias.iters() <= cols:
            return Refusal("the bias reads the batch or the positions")
        if not all(_constant(a.source, ctx) for a in accesses(bias)):
            return Refusal("the bias is not a constant")
    weight = w if scale * outer == 1.0 else ir.Binary("*", ir.Const(scale * outer), w)
    return Projection(
        x, weight, bias, kappa, by_role.get("b"), by_role[position], by_role.get("h"), by_role.get(column)
    )


def _through_layout(
    acc: ir.Access, at: dict[ir.Iter, ir.IndexExpr]
) -> tuple[ir.Scope, dict[ir.Iter, ir.IndexExpr], float] | Refusal:
    """The scope ``acc`` reads past inline layout scopes (one read of a scope, maybe scaled, nothing
    summed: the heads' reshapes and transposes), its traversal's indices in the core's iterators
    (``at`` substituted into ``acc``'s), and the constant factor on the way. Every read must be in
    its scope's range: a zero read outside is no projection of X."""
    outer = 1.0
    while True:
        p = acc.source
        if not isinstance(p, ir.Scope):
            return Refusal(f"reads the tensor {p.name}, not a projection")
        indices = tuple(simplify(substitute(i, at)) for i in acc.indices)
        inside = all(
            t.lo <= lo and hi < t.hi for t, (lo, hi) in zip(p.traversal, map(bounds, indices), strict=True)
        )
        if not inside:
            return Refusal("reads a scope outside its range on the way to the projection")
        at = dict(zip(p.traversal, indices, strict=True))
        prod = as_product(p.body) if not p.summation else None
        if not isinstance(prod, tuple) or len(prod[1]) != 1 or not isinstance(prod[1][0].source, ir.Scope):
            return p, at, outer
        outer *= prod[0]
        acc = prod[1][0]


@dataclasses.dataclass(frozen=True, eq=False)
class Packing:
    """Attention's first three inputs: ``x`` (X read as ``[B, S, hidden]``), the packed ``weights``
    ``[hidden, sum(sizes)]`` and ``bias`` ``[sum(sizes)]``, and the hidden sizes of Q, K and V."""

    x: Operand
    weights: ir.Scope
    bias: ir.Scope
    sizes: tuple[int, int, int]


def pack(projections: tuple[Projection, Projection, Projection], heads: int) -> Packing | Refusal:
    """Q's, K's and V's projections (of one input read through one view) packed, ``heads`` heads."""
    reads = []
    for p in projections:
        view = simple_view(p.x)
        if isinstance(view, Refusal):
            return Refusal(f"X: {view.reason}")
        names = {p.batch: "b", p.position: "s", p.kappa: "k"}
        labels = tuple(names[it] for it in view.labels)
        if "s" not in labels or "k" not in labels:
            return Refusal("X is not read at every position and hidden element")
        if p.batch is not None and p.batch.extent > 1 and "b" not in labels:
            return Refusal("X is broadcast along the batch")
        reads.append((view, labels))
    if len({(v.source, v.steps, labels) for v, labels in reads}) != 1:
        return Refusal("Q, K and V do not project one same input X read through one same view")
    q = projections[0]
    view = reads[0][0]
    groups = [(q.batch,) if q.batch in view.labels else (), (q.position,), (q.kappa,)]
    steps = arranged(view, groups)
    columns = [_columns(p, heads) for p in projections]
    sizes = tuple(w.shape[1] for w, _ in columns)
    hq, hk, hv = sizes
    (wq, bq), (wk, bk), (wv, bv) = columns
    weights = concat_scope(concat_scope(wq, wk, 1, hq, hk), wv, 1, hq + hk, hv)
    bias = concat_scope(concat_scope(bq, bk, 0, hq, hk), bv, 0, hq + hk, hv)
    return Packing(Operand(view.source, steps), weights, bias, sizes)


def _columns(p: Projection, heads: int) -> tuple[ir.Scope, ir.Scope]:
    """The projection's weight ``[hidden, heads * width]`` and bias ``[heads * width]`` (zeros
    without one), each column ``c`` the head ``c // width`` and its element ``c % width`` as the
    operator splits them."""
    width = p.column.extent if p.column is not None else 1
    k = ir.Iter("k", 0, p.kappa.extent)
    c = ir.Iter("c", 0, heads * width)
    at: dict[ir.Iter, ir.IndexExpr] = {p.kappa: k + p.kappa.lo}
    if p.column is not None:
        at[p.column] = c % width + p.column.lo
    if p.head is not None:
        at[p.head] = c // width + p.head.lo
    weight = ir.Scope((k, c), (), substitute_iters(p.weight, at))
    bias = substitute_iters(p.bias, at) if p.bias is not None else ir.Const(0.0)
    return weight, ir.Scope((c,), (), bias)

"""Importers of Gather and GatherElements with constant, affine indices: reads, not data.

A gather whose index tensor is a known constant that is an affine function of
the output position is a plain read with an affine index function:

* Gather ``out[a.., j.., b..] = X[a.., c0 + sum_k c_k*j_k, b..]`` (a rank-0
  index removes the axis);
* GatherElements ``out[p] = X[p with p[axis] = c0 + sum_d c_d*p_d]``.

The coefficients are fitted from the entries (after adding ``dim`` to negative
ones) and the whole tensor is checked against the fit; any other index tensor
(not constant, not affine, out of range) is refused, so the node passes through.

Reads see through sum-free copy scopes (Reshape, Transpose, Pad, Slice, ...)
whenever the composed index provably stays inside the intermediate scope, so a
gather on a flattened axis comes out as an affine read of the unflattened
tensor: ``(i*N + i + j*d) // N -> i`` when ``0 <= i + j*d < N``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from einopt.core import ir
from einopt.core.index import bounds, linear_form, simplify, substitute
from einopt.frontend.operand import (
    Importer,
    NodeView,
    Operand,
    Unsupported,
    access,
    checked_output,
    constant,
    float_data,
    numbered,
    operand_shape,
)

__all__ = ["GATHER_IMPORTERS", "affine_fit", "simplify_divmod"]


# --------------------------------------------------------------------------
# Fitting an affine function to a constant index tensor
# --------------------------------------------------------------------------


def affine_fit(idx: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """``(c0, c)`` with ``idx[j..] == c0 + sum_k c[k]*j_k`` everywhere, or ``None``.

    Parameters
    ----------
    idx : numpy.ndarray
        An integer tensor (any rank, no zero-sized dimension).

    Returns
    -------
    tuple or None
        The constant and one coefficient per dimension (0 for size-1
        dimensions), or ``None`` when the entries are not affine in the position.
    """
    idx = np.asarray(idx, dtype=np.int64)
    origin = (0,) * idx.ndim
    c0 = int(idx[origin])
    coeffs = []
    for k, n in enumerate(idx.shape):
        unit = tuple(1 if d == k else 0 for d in range(idx.ndim))
        coeffs.append(int(idx[unit]) - c0 if n > 1 else 0)
    fitted = np.full(idx.shape, c0, dtype=np.int64)
    for k, c in enumerate(coeffs):
        shape = [1] * idx.ndim
        shape[k] = idx.shape[k]
        fitted = fitted + c * np.arange(idx.shape[k], dtype=np.int64).reshape(shape)
    return (c0, tuple(coeffs)) if np.array_equal(fitted, idx) else None


def _constant_indices(view: NodeView, dim: int) -> np.ndarray:
    """The normalised (``0 <= idx < dim``) constant index tensor of a gather node."""
    operand = view.input(1)
    if operand is None:
        raise Unsupported(f"{view.op_type} without indices")
    if operand.value is None:
        raise Unsupported(f"{view.op_type} indices {operand.name} are not a constant")
    idx = constant(operand, f"{view.op_type} indices")
    if idx.dtype.kind not in "iu":
        raise Unsupported(f"{view.op_type} indices {operand.name}: expected integers, got {idx.dtype}")
    if idx.size == 0:
        raise Unsupported(f"{view.op_type} indices {operand.name} are empty")
    idx = idx.astype(np.int64)
    lo, hi = int(idx.min()), int(idx.max())
    if lo < -dim or hi >= dim:
        raise Unsupported(
            f"{view.op_type} indices {operand.name} range over [{lo}, {hi}], outside [-{dim}, {dim})"
        )
    return np.where(idx < 0, idx + dim, idx)


def _affine(view: NodeView, idx: np.ndarray, its: Sequence[ir.Iter]) -> ir.IndexExpr:
    """``c0 + sum_k c_k*its[k]`` fitted to ``idx``; Unsupported when not affine."""
    fit = affine_fit(idx)
    if fit is None:
        raise Unsupported(f"{view.op_type} indices are not an affine function of the output position")
    c0, coeffs = fit
    expr: ir.IndexExpr = ir.IConst(c0)
    for it, c in zip(its, coeffs, strict=True):
        if c:
            expr = expr + it * c
    return simplify(expr)


# --------------------------------------------------------------------------
# Simplifying and composing the reads
# --------------------------------------------------------------------------


def _split_atom(atom: ir.IndexExpr) -> ir.IndexExpr | None:
    """``x // k -> q`` and ``x % k -> r`` for affine ``x = k*q + r`` with ``0 <= r < k``.

    ``index.simplify`` splits off only the terms whose coefficient ``k``
    divides; this also splits ``c*it`` into ``k*(c // k)*it + (c % k)*it``
    (Euclidean remainders), which is what proves ``(i*(N+1) + j*d) // N = i``
    when ``i + j*d < N``.
    """
    if not isinstance(atom, (ir.IFloorDiv, ir.IMod)):
        return None
    inner = linear_form(simplify(atom.a))
    if not inner.is_affine:
        return None
    k = atom.k
    q: ir.IndexExpr = ir.IConst(inner.const // k)
    r: ir.IndexExpr = ir.IConst(inner.const % k)
    for it, c in inner.coeffs:
        if c // k:
            q = q + it * (c // k)
        if c % k:
            r = r + it * (c % k)
    lo, hi = bounds(r)
    if not (0 <= lo and hi < k):
        return None
    return simplify(q if isinstance(atom, ir.IFloorDiv) else r)


def simplify_divmod(e: ir.IndexExpr) -> ir.IndexExpr:
    """:func:`einopt.core.index.simplify`, plus Euclidean splitting of ``//``/``%`` atoms of affine arguments."""
    e = simplify(e)
    lf = linear_form(e)
    if lf.is_affine:
        return e
    out: ir.IndexExpr = ir.IConst(lf.const)
    for it, c in lf.coeffs:
        out = out + it * c
    for atom, d in lf.atoms:
        split = _split_atom(atom)
        out = out + (atom if split is None else split) * d
    return simplify(out)


def _inside(idx: Sequence[ir.IndexExpr], scope: ir.Scope) -> bool:
    """True when every index provably stays in the scope's traversal range."""
    for e, it in zip(idx, scope.traversal, strict=True):
        lo, hi = bounds(e)
        if lo < it.lo or hi >= it.hi:
            return False
    return True


def _see_through(acc: ir.Access) -> ir.Access:
    """Compose ``acc`` with the sum-free copy scopes it reads while the composed read stays in range.

    A copy scope ``L i..: Y[f(i..)]`` read at ``g`` inside its range is
    ``Y[f(g)]`` exactly; outside its range it is 0 while ``Y[f(g)]`` might
    not be, hence the range check at every step.
    """
    while isinstance(acc.source, ir.Scope):
        scope = acc.source
        body = scope.body
        if scope.summation or not isinstance(body, ir.Access) or not _inside(acc.indices, scope):
            break
        at = {it: e for it, e in zip(scope.traversal, acc.indices, strict=True)}
        acc = ir.Access(body.source, tuple(simplify_divmod(substitute(e, at)) for e in body.indices))
    return acc


def _gathered(x: Operand, idx: Sequence[ir.IndexExpr]) -> ir.ValueExpr:
    """``x[idx]`` (affine, in range), seen through copy scopes."""
    read = access(x, tuple(simplify_divmod(e) for e in idx))
    return _see_through(read) if isinstance(read, ir.Access) else read


# --------------------------------------------------------------------------
# The importers
# --------------------------------------------------------------------------


def _axis(view: NodeView, rank: int) -> int:
    axis = int(view.attr("axis", 0))
    if not -rank <= axis < rank:
        raise Unsupported(f"{view.op_type} axis {axis} out of range for rank {rank}")
    return axis % rank


def import_gather(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[a.., c0 + sum_k c_k*j_k, b..]`` for constant indices affine in their position ``j..``."""
    x = float_data(view.input(0), "data")
    shape = operand_shape(x)
    axis = _axis(view, len(shape))
    idx = _constant_indices(view, shape[axis])
    out = checked_output(view, 0, (*shape[:axis], *idx.shape, *shape[axis + 1 :]))
    its = numbered("i", out)
    j = its[axis : axis + idx.ndim]
    index = [*its[:axis], _affine(view, idx, j), *its[axis + idx.ndim :]]
    return (ir.Scope(its, (), _gathered(x, index)),)


def import_gather_elements(view: NodeView) -> tuple[ir.Scope, ...]:
    """``X[p with p[axis] = c0 + sum_d c_d*p_d]`` for constant indices affine in the position ``p``."""
    x = float_data(view.input(0), "data")
    shape = operand_shape(x)
    axis = _axis(view, len(shape))
    idx = _constant_indices(view, shape[axis])
    if idx.ndim != len(shape) or any(
        m > n for d, (m, n) in enumerate(zip(idx.shape, shape, strict=True)) if d != axis
    ):
        raise Unsupported(f"GatherElements indices of shape {list(idx.shape)} for data {list(shape)}")
    its = numbered("i", checked_output(view, 0, idx.shape))
    index = list(its)
    index[axis] = _affine(view, idx, its)
    return (ir.Scope(its, (), _gathered(x, index)),)


GATHER_IMPORTERS: dict[str, Importer] = {
    "Gather": import_gather,
    "GatherElements": import_gather_elements,
}

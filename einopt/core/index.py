"""Analysis of index expressions: linear forms, bounds, simplification.

The linear-form view writes an index expression as

    sum_i c_i * x_i  +  sum_j d_j * atom_j  +  const

where ``x_i`` are iterators and each ``atom_j`` is an expression that is not
linear in iterators: a floor division or modulo by a constant, or a product of
two non-constant expressions. Analyses (operator matching, bounds, canonical
keys) work on this view; the IR itself keeps the expression as written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from einopt.core.ir import (
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IndexExpr,
    ISub,
    Iter,
    _cached,
    rebuild,
)

__all__ = ["LinearForm", "linear_form", "bounds", "simplify", "from_linear_form", "substitute"]


@dataclasses.dataclass(frozen=True, slots=True)
class LinearForm:
    """``sum(c * it for it, c in coeffs) + sum(d * a for a, d in atoms) + const``.

    ``coeffs`` and ``atoms`` keep first-appearance order and never hold a zero
    coefficient.
    """

    coeffs: tuple[tuple[Iter, int], ...]
    atoms: tuple[tuple[IndexExpr, int], ...]
    const: int

    def coeff(self, it: Iter) -> int:
        for x, c in self.coeffs:
            if x is it:
                return c
        return 0

    @property
    def is_affine(self) -> bool:
        """True when there are no div/mod or product atoms."""
        return not self.atoms

    @property
    def is_constant(self) -> bool:
        return not self.coeffs and not self.atoms


def _combine(*parts: tuple[LinearForm, int]) -> LinearForm:
    coeffs: dict[Iter, int] = {}
    atoms: dict[IndexExpr, int] = {}
    const = 0
    for lf, scale in parts:
        for it, c in lf.coeffs:
            coeffs[it] = coeffs.get(it, 0) + scale * c
        for a, d in lf.atoms:
            atoms[a] = atoms.get(a, 0) + scale * d
        const += scale * lf.const
    return LinearForm(
        tuple((k, v) for k, v in coeffs.items() if v),
        tuple((k, v) for k, v in atoms.items() if v),
        const,
    )


def linear_form(e: IndexExpr) -> LinearForm:
    """The linear-form view of ``e`` (cached on the node)."""
    return _cached(e, "linear_form", lambda: _linear_form(e))


def _linear_form(e: IndexExpr) -> LinearForm:
    rule = _LINEAR_FORMS.get(type(e))
    if rule is None:
        raise TypeError(f"not an index expression: {e!r}")
    return rule(e)


def _atom(e: IndexExpr) -> LinearForm:
    return LinearForm((), ((e, 1),), 0)


def _product(e: IMul) -> LinearForm:
    la, lb = linear_form(e.a), linear_form(e.b)
    if la.is_constant:
        return _combine((lb, la.const))
    if lb.is_constant:
        return _combine((la, lb.const))
    return _atom(e)


# The linear form of each index class, from its operands' (cached) forms.
_LINEAR_FORMS: dict[type, Callable[[Any], LinearForm]] = {
    IConst: lambda e: LinearForm((), (), e.value),  # c
    Iter: lambda e: LinearForm(((e, 1),), (), 0),  # 1*x
    IAdd: lambda e: _combine((linear_form(e.a), 1), (linear_form(e.b), 1)),  # a + b
    ISub: lambda e: _combine((linear_form(e.a), 1), (linear_form(e.b), -1)),  # a - b
    IMul: _product,  # c*b and a*c are linear; a product of two non-constants is an atom
    IFloorDiv: _atom,  # a // k
    IMod: _atom,  # a % k
}


# --------------------------------------------------------------------------
# Bounds
# --------------------------------------------------------------------------

Ranges = Mapping[Iter, tuple[int, int]]


def bounds(e: IndexExpr, ranges: Ranges | None = None) -> tuple[int, int]:
    """Inclusive ``(min, max)`` of ``e`` over its iterators' ranges.

    ``ranges`` overrides an iterator's half-open range ``[lo, hi)``. The
    result is exact for affine expressions (each iterator contributes
    independently) and a sound over-approximation otherwise.
    """
    if ranges is None:
        return _cached(e, "bounds", lambda: _bounds(e, {}))
    return _bounds(e, ranges)


def _iter_bounds(it: Iter, ranges: Ranges) -> tuple[int, int]:
    lo, hi = ranges.get(it, (it.lo, it.hi))
    return lo, hi - 1


def _bounds(e: IndexExpr, ranges: Ranges) -> tuple[int, int]:
    lf = linear_form(e)
    lo = hi = lf.const
    for it, c in lf.coeffs:
        a, b = _iter_bounds(it, ranges)
        lo += min(c * a, c * b)
        hi += max(c * a, c * b)
    for atom, d in lf.atoms:
        a, b = _atom_bounds(atom, ranges)
        lo += min(d * a, d * b)
        hi += max(d * a, d * b)
    return lo, hi


def _atom_bounds(e: IndexExpr, ranges: Ranges) -> tuple[int, int]:
    if isinstance(e, IFloorDiv):
        a, b = _bounds(e.a, ranges)
        return a // e.k, b // e.k
    if isinstance(e, IMod):
        a, b = _bounds(e.a, ranges)
        if a // e.k == b // e.k:  # no wrap-around inside the range
            return a % e.k, b % e.k
        return 0, e.k - 1
    if isinstance(e, IMul):
        a, b = _bounds(e.a, ranges)
        c, d = _bounds(e.b, ranges)
        products = (a * c, a * d, b * c, b * d)
        return min(products), max(products)
    return _bounds(e, ranges)


# --------------------------------------------------------------------------
# Simplification
# --------------------------------------------------------------------------


def simplify(e: IndexExpr) -> IndexExpr:
    """An equal index expression in simpler form.

    Folds constants, collects like terms, and applies (for iterator ranges
    as bound in ``e``):

    * ``x // 1 -> x``, ``x % 1 -> 0``
    * ``(k*q + r) // k -> q + r // k`` and ``(k*q + r) % k -> r % k``
    * ``r // k -> c`` and ``r % k -> r - k*c`` when ``k*c <= r < k*c + k`` (``c = 0``: ``0 <= r < k``;
      a residue iterator fixed to one value by a residue split)
    * ``k*(x // k) + x % k -> x``
    """
    return _cached(e, "simplified", lambda: from_linear_form(_simplified_form(e)))


def _simplified_form(e: IndexExpr) -> LinearForm:
    lf = linear_form(e)
    parts: list[tuple[LinearForm, int]] = [(LinearForm(lf.coeffs, (), lf.const), 1)]
    for atom, d in lf.atoms:
        parts.append((_simplify_atom(atom), d))
    return _recombine_divmod(_combine(*parts))


def _simplify_atom(atom: IndexExpr) -> LinearForm:
    if isinstance(atom, IMul):
        a, b = simplify(atom.a), simplify(atom.b)
        la, lb = linear_form(a), linear_form(b)
        if la.is_constant or lb.is_constant:
            return linear_form(IMul(a, b))
        return LinearForm((), ((IMul(a, b), 1),), 0)
    assert isinstance(atom, (IFloorDiv, IMod))
    k = atom.k
    inner = _simplified_form(atom.a)
    if k == 1:
        return inner if isinstance(atom, IFloorDiv) else LinearForm((), (), 0)
    # Split inner = k*q + r, where q collects the parts whose coefficients k divides.
    q_coeffs = tuple((it, c // k) for it, c in inner.coeffs if c % k == 0)
    r_coeffs = tuple((it, c) for it, c in inner.coeffs if c % k != 0)
    q_atoms = tuple((a, d // k) for a, d in inner.atoms if d % k == 0)
    r_atoms = tuple((a, d) for a, d in inner.atoms if d % k != 0)
    q = LinearForm(q_coeffs, q_atoms, inner.const // k)
    r = LinearForm(r_coeffs, r_atoms, inner.const % k)
    r_expr = from_linear_form(r)
    lo, hi = bounds(r_expr)
    # r in one block [k*c, k*c + k) (r constant, or r in [0, k) with c = 0): r // k = c, r % k = r - k*c.
    c = lo // k
    if isinstance(atom, IFloorDiv):
        if c == hi // k:
            return _combine((q, 1), (LinearForm((), (), c), 1))
        return _combine((q, 1), (LinearForm((), ((IFloorDiv(r_expr, k), 1),), 0), 1))
    if c == hi // k:
        return _combine((r, 1), (LinearForm((), (), -k * c), 1))
    return LinearForm((), ((IMod(r_expr, k), 1),), 0)


def _recombine_divmod(lf: LinearForm) -> LinearForm:
    """``c*k*(x // k) + c*(x % k) -> c*x``, repeatedly."""
    atoms = dict(lf.atoms)
    extra: list[tuple[LinearForm, int]] = []
    changed = True
    while changed:
        changed = False
        for a, d in list(atoms.items()):
            if not isinstance(a, IMod) or a not in atoms:
                continue
            div = IFloorDiv(a.a, a.k)
            if atoms.get(div) == d * a.k:
                del atoms[a], atoms[div]
                extra.append((_simplified_form(a.a), d))
                changed = True
    if not extra:
        return lf
    return _combine(
        (LinearForm(lf.coeffs, tuple(atoms.items()), lf.const), 1),
        *extra,
    )


def from_linear_form(lf: LinearForm) -> IndexExpr:
    """Build ``c1*x1 + ... + d1*a1 + ... + const``, terms in order, subtracting negatives."""
    terms: list[tuple[IndexExpr, int]] = [*lf.coeffs, *lf.atoms]
    if lf.const:
        terms.append((IConst(1), lf.const))
    if not terms:
        return IConst(0)

    def scaled(x: IndexExpr, c: int) -> IndexExpr:
        if isinstance(x, IConst):
            return IConst(c)
        return x if c == 1 else IMul(IConst(c), x)

    x0, c0 = terms[0]
    out = scaled(x0, c0) if c0 > 0 or isinstance(x0, IConst) else IMul(IConst(c0), x0)
    for x, c in terms[1:]:
        out = IAdd(out, scaled(x, c)) if c > 0 else ISub(out, scaled(x, -c))
    return out


def substitute(e: IndexExpr, mapping: Mapping[Iter, IndexExpr]) -> IndexExpr:
    """``e`` with the iterators in ``mapping`` replaced (others kept); not simplified."""
    if isinstance(e, Iter):
        return mapping.get(e, e)
    return rebuild(e, lambda x: substitute(x, mapping))

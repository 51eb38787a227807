"""Reading one access of an eOperator's source as an ONNX value (Slice, Pad, Reshape, Gather).

:func:`plan_access` splits the source dimensions an access reads (mixed-radix
positions ``c*x + y`` become two dimensions, :func:`split_dim`) and sorts them
into constant ones, simple ones (``c*it + k`` of an iterator no other
dimension uses) and groups sharing iterators (:func:`group_dims`).
:func:`slice_and_pad` reads the constant and simple dimensions, :func:`gather`
one merged group with a constant index. Reads outside the source give 0.
:mod:`einopt.instantiate.eop` puts these steps together (and bounds the
Gather index size).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from einopt.core import ir
from einopt.core.index import LinearForm, bounds, from_linear_form, linear_form
from einopt.core.interp import eval_index
from einopt.core.rewrite import accesses
from einopt.instantiate.eop_graph import Graph

__all__ = [
    "Dim",
    "accesses",
    "plan_access",
    "group_dims",
    "split_dim",
    "reads_nothing",
    "slice_and_pad",
    "gather",
]


@dataclasses.dataclass
class Dim:
    """One source dimension of an access: its size and the position it reads (index - origin)."""

    size: int
    pos: ir.IndexExpr

    @property
    def form(self) -> LinearForm:
        return linear_form(self.pos)

    @property
    def deps(self) -> frozenset[ir.Iter]:
        lf = self.form
        return frozenset(it for it, _ in lf.coeffs) if not lf.atoms else self.pos.iters()


def plan_access(acc: ir.Access) -> tuple[list[Dim], list[int], list[int], list[list[int]]]:
    """How to read ``acc``: its source dimensions (mixed-radix ones split) and which are
    constant, simple (``c*it + k`` of an iterator no other dimension uses) or gathered in groups."""
    src = acc.source
    dims = [
        Dim(n, i if o == 0 else ir.IAdd(i, ir.IConst(-o)))
        for n, i, o in zip(src.shape, acc.indices, src.origin, strict=True)
    ]
    dims = [part for d in dims for part in split_dim(d)]
    uses: dict[ir.Iter, int] = {}
    for d in dims:
        for it in d.deps:
            uses[it] = uses.get(it, 0) + 1
    consts = [k for k, d in enumerate(dims) if not d.deps]
    simple = [
        k
        for k, d in enumerate(dims)
        if d.deps and not d.form.atoms and len(d.form.coeffs) == 1 and uses[d.form.coeffs[0][0]] == 1
    ]
    groups = group_dims([k for k in range(len(dims)) if k not in consts and k not in simple], dims)
    return dims, consts, simple, groups


def group_dims(ks: list[int], dims: list[Dim]) -> list[list[int]]:
    """Dimensions ``ks`` partitioned into groups connected by shared iterators (each sorted)."""
    groups: list[tuple[set[int], set[ir.Iter]]] = []
    for k in ks:
        merged, its = {k}, set(dims[k].deps)
        for grp in [g for g in groups if g[1] & its]:
            groups.remove(grp)
            merged |= grp[0]
            its |= grp[1]
        groups.append((merged, its))
    return sorted(sorted(m) for m, _ in groups)


def split_dim(d: Dim) -> list[Dim]:
    """Split a dimension read at a mixed-radix position ``c*x + y`` (``0 <= y < c``) into two.

    With ``pos = m*hi + lo`` and ``lo`` provably in ``[0, m)``, reading a
    dimension of size ``N`` (``m`` divides ``N``) at ``pos`` is reading the
    ``(N/m, m)`` reshape at ``(hi, lo)``, out-of-range reads included.
    """
    lf = d.form
    if lf.atoms or len(lf.coeffs) < 2:
        return [d]
    const = lf.const + sum(c * it.lo for it, c in lf.coeffs)  # position at iterator positions 0
    for m in sorted({abs(c) for _, c in lf.coeffs if abs(c) > 1}, reverse=True):
        if d.size % m:
            continue
        high = [(it, c // m) for it, c in lf.coeffs if c % m == 0]
        low = [(it, c) for it, c in lf.coeffs if c % m != 0]
        lo_min = sum(min(0, c * (it.extent - 1)) for it, c in low)
        lo_max = sum(max(0, c * (it.extent - 1)) for it, c in low)
        r0 = -lo_min + (const + lo_min) % m
        if not high or r0 + lo_max >= m:
            continue
        h0 = (const - r0) // m
        hi_form = LinearForm(tuple(high), (), h0 - sum(c * it.lo for it, c in high))
        lo_form = LinearForm(tuple(low), (), r0 - sum(c * it.lo for it, c in low))
        return split_dim(Dim(d.size // m, from_linear_form(hi_form))) + split_dim(
            Dim(m, from_linear_form(lo_form))
        )
    return [d]


def reads_nothing(acc: ir.Access) -> bool:
    """True when some index provably stays outside its source dimension (the access is 0)."""
    for i, n, o in zip(acc.indices, acc.source.shape, acc.source.origin, strict=True):
        lo, hi = bounds(i)
        if hi < o or lo >= o + n:
            return True
    return False


def slice_and_pad(g: Graph, x: str, dims: list[Dim], consts: list[int], simple: list[int]) -> str | None:
    """Cut constant dims to their element and simple dims to their strided range, zero-padded.

    ``None`` when some dimension reads nothing in range (the access is 0).
    """
    starts, ends, axes, steps = [], [], [], []
    pads = [0] * (2 * len(dims))
    for k in consts:
        p = int(eval_index(dims[k].pos, {}))
        if not 0 <= p < dims[k].size:
            return None
        if dims[k].size == 1:
            continue
        starts.append(p)
        ends.append(p + 1)
        axes.append(k)
        steps.append(1)
    for k in simple:
        d = dims[k]
        (it, c), size = d.form.coeffs[0], d.size
        a = c * it.lo + d.form.const  # the position read at iterator position 0
        # Iterator positions q in [q0, q1] read in range: 0 <= a + c*q < size.
        if c > 0:
            q0, q1 = max(0, -(a // c)), min(it.extent - 1, (size - 1 - a) // c)
        else:
            q0, q1 = max(0, -((size - 1 - a) // -c)), min(it.extent - 1, a // -c)
        if q0 > q1:
            return None
        start, last = a + c * q0, a + c * q1
        # A negative step stops before position 0 with end -size-1 (end -1 would mean the last element).
        end = last + 1 if c > 0 else (last - 1 if last >= 1 else -size - 1)
        if not (c == 1 and start == 0 and end == size):
            starts.append(start)
            ends.append(end)
            axes.append(k)
            steps.append(c)
        pads[k], pads[len(dims) + k] = q0, it.extent - 1 - q1
    if axes:
        ins = [x, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps)]
        x = g.op("Slice", ins)
    if any(pads):
        x = g.op("Pad", [x, g.ints(pads)])
    return x


def gather(g: Graph, x: str, axis: int, rank: int, dims: list[Dim], its: list[ir.Iter]) -> str:
    """Read merged ``dims`` (axis ``axis`` of ``x``, of rank ``rank``) at every point of ``its``.

    The index has one axis per iterator of ``its``, which replace ``axis``;
    reads out of range point at a zero appended to that axis. The caller
    bounds the size of the index (the product of the extents of ``its``).
    """
    shape = tuple(it.extent for it in its)
    total = math.prod(d.size for d in dims)
    dtype = np.int32 if total < 2**31 else np.int64
    if g.light and all(d.form.is_affine for d in dims):
        # Shape only: affine positions reach their bounds, so the bounds say whether a read
        # falls outside exactly as the index would.
        inside = all(0 <= bounds(d.pos)[0] and bounds(d.pos)[1] < d.size for d in dims)
        return g.op("Gather", [_zero_row(g, x, axis, rank, inside), g.shaped(shape, dtype)], axis=axis)
    grids = np.meshgrid(*(np.arange(it.lo, it.hi, dtype=np.int64) for it in its), indexing="ij", sparse=True)
    env = dict(zip(its, grids, strict=True))
    positions = [np.broadcast_to(eval_index(d.pos, env), shape) for d in dims]
    valid = np.ones(shape, dtype=bool)
    for p, d in zip(positions, dims, strict=True):
        valid &= (p >= 0) & (p < d.size)
    flat = np.ravel_multi_index(tuple(np.where(valid, p, 0) for p in positions), [d.size for d in dims])
    flat = np.where(valid, flat, total)
    x = _zero_row(g, x, axis, rank, bool(valid.all()))
    return g.op("Gather", [x, g.const(flat.astype(dtype))], axis=axis)


def _zero_row(g: Graph, x: str, axis: int, rank: int, inside: bool) -> str:
    """``x`` with a zero appended to ``axis`` (where reads out of range point), unless every read is ``inside``."""
    if inside:
        return x
    pads = [0] * (2 * rank)
    pads[rank + axis] = 1
    return g.op("Pad", [x, g.ints(pads)])

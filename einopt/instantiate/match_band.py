"""Band products (G2BMM and GBMM) as blocked batched MatMuls in standard ONNX operators.

A band product reads one operand along a diagonal of two iterators
(Longformer's sliding-window attention):

* G2BMM ``C[b, i, w] = Sum_k A[b, i, k] * B[b, i + d*w + c, k]`` (the band of ``A B^T``);
* GBMM ``C[b, i, n] = Sum_w A[b, i, w] * B[b, i + d*w + c, n]`` (band weights times values).

ONNX Runtime has no band kernel, and the direct standard-op form (Gather the
band of ``B``, then Einsum) gathers ``W`` rows per output row. This lowering
runs it as blocked dense products instead, the way a band kernel tiles it:

1. Residues: with dilation ``d``, row ``i = d*a + r`` only meets rows of
   ``B`` with the same residue ``r``, so ``r`` joins the batch (Reshape +
   Transpose) and the band has dilation 1.
2. Blocks: ``Bk`` consecutive rows ``a`` meet a window of ``J = Bk + W - 1``
   rows of ``B``; the windows are gathered (a constant-index ``Gather`` of
   whole rows, ``J / Bk`` times ``B``) and multiplied densely by one batched
   MatMul, ``J / W`` times the band's FLOPs.
3. Skew: the band is the diagonal strip ``S[e, e + w]`` of each block
   (G2BMM), read by padding each flattened block by one element per row
   (Pad + Reshape + Slice); GBMM writes its band weights into the strip the
   same way backwards before its MatMul.

Every step is a layout step or a plain operator, so the result runs in stock
ONNX Runtime; reads outside ``B`` are zeros, as everywhere in the IR.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from einopt.core import ir
from einopt.core.index import bounds, linear_form
from einopt.instantiate.plan import (
    NO_MATCH_CONTEXT,
    LayoutStep,
    Literal,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Pad,
    Refusal,
    Reshape,
    Scale,
    Slice,
    Transpose,
    normalize,
)
from einopt.instantiate.views import View, arrange, as_product, finish, simple_view

__all__ = ["Band", "band_form", "match_band", "block_rows"]

KINDS = ("G2BMM", "GBMM")


@dataclasses.dataclass(frozen=True)
class Band:
    """A scope read as a band product: ``plain`` is ``A``, ``banded`` is ``B`` with its band index
    ``i + d*w + c`` replaced by ``rows`` (an iterator over every row the band reaches)."""

    kind: str  # "G2BMM" or "GBMM"
    scale: float
    plain: View
    banded: View
    batch: tuple[ir.Iter, ...]
    i: ir.Iter
    w: ir.Iter
    k: ir.Iter  # the summed iterator (w itself for GBMM)
    n: ir.Iter | None  # GBMM: B's own output iterator
    rows: ir.Iter
    dilation: int


def band_form(scope: ir.Scope) -> Band | Refusal:
    """``scope`` as a band product, or why it is not one (memoised on the interned scope: the
    search's distance asks for G2BMM and GBMM, and instantiation again)."""
    return ir._cached(scope, "band_form", lambda: _band_form(scope))


def _band_form(scope: ir.Scope) -> Band | Refusal:
    if len(scope.summation) != 1:
        return Refusal("band product: not summed over exactly one iterator")
    found = as_product(scope.body)
    if isinstance(found, Refusal):
        return found
    scale, reads = found
    if len(reads) != 2:
        return Refusal(f"band product: a product of {len(reads)} reads, not two")
    trav, (k,) = set(scope.traversal), scope.summation
    reason = "band product: no read has exactly one diagonal index i + d*w + c"
    for x, y in (reads, reads[::-1]):
        band = [d for d, e in enumerate(y.indices) if not isinstance(e, ir.Iter | ir.IConst)]
        if len(band) != 1 or not all(isinstance(e, ir.Iter | ir.IConst) for e in x.indices):
            continue
        e = y.indices[band[0]]
        lf = linear_form(e)
        if not lf.is_affine or len(lf.coeffs) != 2:
            continue
        xs = {e for e in x.indices if isinstance(e, ir.Iter)}
        ys = {e for d, e in enumerate(y.indices) if d != band[0] and isinstance(e, ir.Iter)}
        for (i, ci), (w, cw) in (lf.coeffs, lf.coeffs[::-1]):
            if ci != 1 or cw < 1 or i not in xs or i not in trav or i in ys or w in ys:
                continue
            batch = tuple(it for it in scope.traversal if it in xs and it in ys)
            if k in ys and k in xs and w in trav and w not in xs:
                kind, n = "G2BMM", None
                if (
                    not _covers(trav, set(batch) | {i, w})
                    or xs != set(batch) | {i, k}
                    or ys != set(batch) | {k}
                ):
                    continue
            elif w is k and k in xs:
                ns = ys - set(batch)
                if len(ns) != 1 or xs != set(batch) | {i, k} or not _covers(trav, set(batch) | {i} | ns):
                    continue
                kind, n = "GBMM", next(iter(ns))
            else:
                continue
            lo, hi = bounds(e)
            rows = ir.Iter("_rows", lo, hi + 1)
            plain = simple_view(x)
            banded = simple_view(
                ir.Access(y.source, tuple(rows if d == band[0] else f for d, f in enumerate(y.indices)))
            )
            if isinstance(plain, Refusal) or isinstance(banded, Refusal):
                reason = f"band product: {(plain if isinstance(plain, Refusal) else banded).reason}"
                continue
            return Band(kind, scale, plain, banded, batch, i, w, k, n, rows, cw)
    return Refusal(reason)


def _covers(traversal: set[ir.Iter], read: set[ir.Iter]) -> bool:
    """Whether ``read`` is the traversal but for iterators of extent 1 (read at constant indices)."""
    return read <= traversal and all(it.extent == 1 for it in traversal - read)


def block_rows(window: int, rows: int) -> int:
    """Rows per block for a band ``window`` wide over ``rows`` rows: the smallest power of two at
    least half the window (a block's dense product is then under 3x the band's FLOPs and its
    gathered window under 3x the block), at most the rows."""
    b = 1
    while 2 * b < window and b < rows:
        b *= 2
    return max(1, min(b, rows))


def match_band(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """A band product as blocked batched MatMuls (see the module docstring)."""
    f = band_form(scope)
    if isinstance(f, Refusal):
        return f
    d, W, L = f.dilation, f.w.extent, f.i.extent
    Bt = math.prod(it.extent for it in f.batch)
    m = -(-L // d)  # rows per residue
    Bk = block_rows(W, m)
    nc = -(-m // Bk)
    M, J = nc * Bk, Bk + W - 1
    inner = f.k if f.kind == "G2BMM" else f.w  # A's other axis: k, or the band weights' w
    cols = f.k if f.kind == "G2BMM" else f.n
    assert cols is not None
    # A: [Bt, L, X] -> rows padded to d*M -> [Bt*d, nc, Bk, X] (residues into the batch)
    X = inner.extent
    a_steps: list[LayoutStep] = [
        *f.plain.steps,
        *arrange(f.plain.labels, f.plain.shape, [f.batch, (f.i,), (inner,)]),
    ]
    a_steps += _residues(Bt, L, d * M, d, X, (Bt * d, nc, Bk, X))
    if f.kind == "GBMM":
        # The band weights [Bk, W] of each block written into its strip [Bk, J] at (e, e + w).
        a_steps += [
            Pad((0, 0, 0, 0, 0, 0, 0, Bk)),
            Reshape((Bt * d, nc, Bk * (J + 1))),
            Slice((0,), (Bk * J,), (2,), (1,)),
            Reshape((Bt * d, nc, Bk, J)),
        ]
    # B: [Bt, R, Y] -> rows padded to d*(M + W - 1) -> [Bt*d, M + W - 1, Y]
    Y = cols.extent
    R = f.rows.extent
    b_steps: list[LayoutStep] = [
        *f.banded.steps,
        *arrange(f.banded.labels, f.banded.shape, [f.batch, (f.rows,), (cols,)]),
    ]
    b_steps += _residues(Bt, R, d * (M + W - 1), d, Y, (Bt * d, M + W - 1, Y))
    window = np.arange(nc, dtype=np.int64)[:, None] * Bk + np.arange(J, dtype=np.int64)[None, :]
    operands = (
        Operand(f.plain.source, normalize(a_steps, f.plain.source.shape)),
        Operand(f.banded.source, normalize(b_steps, f.banded.source.shape)),
        Operand(Literal(window)),
    )
    gather = OpNode("Gather", (1, 2), (("axis", 1),))  # [Bt*d, nc, J, Y]: each block's window
    if f.kind == "G2BMM":
        ops = (gather, OpNode("Transpose", (3,), (("perm", (0, 1, 3, 2)),)), OpNode("MatMul", (0, 4)))
        # [Bt*d, nc, Bk, J] -> the strip S[e, e + w] -> [Bt*d, nc, Bk, W]
        post: list[LayoutStep] = [
            Reshape((Bt * d, nc, Bk * J)),
            Pad((0, 0, 0, 0, 0, Bk)),
            Reshape((Bt * d, nc, Bk, J + 1)),
            Slice((0,), (W,), (3,), (1,)),
        ]
        out_cols, last = f.w, W
    else:
        ops = (gather, OpNode("MatMul", (0, 3)))
        post, out_cols, last = [], f.n, Y
    # [Bt*d, nc, Bk, Z] -> [Bt, d, M, Z] -> [Bt, M, d, Z] -> [Bt, L, Z] -> the traversal layout
    post += [Reshape((Bt, d, M, last)), Transpose((0, 2, 1, 3)), Reshape((Bt, M * d, last))]
    if M * d != L:
        post.append(Slice((0,), (L,), (1,), (1,)))
    if f.scale != 1.0:
        post.append(Scale(f.scale))
    post += finish([f.batch, (f.i,), (out_cols,)], scope.traversal)
    return OperatorMatch(
        f.kind, operands, ops, normalize(post, (Bt * d, nc, Bk, J if f.kind == "G2BMM" else Y))
    )


def _residues(Bt: int, n: int, padded: int, d: int, X: int, out: tuple[int, ...]) -> list[LayoutStep]:
    """``[Bt, n, X]`` with rows ``d*a + r`` zero-padded to ``padded >= n`` rows, residues ``r``
    moved into the batch: ``out`` (``[Bt*d, ..., X]``, rows ``a`` in order)."""
    pad = [Pad((0, 0, 0, 0, padded - n, 0))] if padded > n else []
    return [*pad, Reshape((Bt, padded // d, d, X)), Transpose((0, 2, 1, 3)), Reshape(out)]

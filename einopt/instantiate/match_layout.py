"""Pure layout operators: a single access without summation, and Concat.

A layout plan is a chain of steps (``Slice``, ``Pad``, ``Transpose``,
``Reshape``, ``Expand``, ``DepthToSpace``, ``SpaceToDepth``) applied to the
source. Every plan is checked against the scope's integer index map (the
source position each output element reads, -1 for zero): a wrong layout match
is impossible. Maps are built with numpy up to :data:`CHECK_LIMIT` elements;
above it only plans from :func:`einopt.instantiate.plan.simple_view` are
accepted (they are exact by construction: every dimension group is derived
arithmetically or checked along its single iterator), others are refused.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from einopt.core import ir
from einopt.core.index import substitute
from einopt.core.rewrite import operands as chain_operands
from einopt.instantiate.plan import (
    NO_MATCH_CONTEXT,
    DepthToSpace,
    LayoutStep,
    Literal,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    Reshape,
    SpaceToDepth,
    Transpose,
    normalize,
)
from einopt.instantiate.views import (
    index_map,
    plan_map,
    simple_view,
    to_traversal,
)

__all__ = [
    "CHECK_LIMIT",
    "layout_plan",
    "match_layout",
    "match_flatten",
    "match_concat",
    "step_label",
    "through_layout",
]

log = logging.getLogger(__name__)

# Largest index map (elements of the output or the source) checked exhaustively.
CHECK_LIMIT = 1 << 22


def step_label(steps: Sequence[LayoutStep]) -> str:
    """``"Slice+Transpose"`` for the steps' operator types (``"Identity"`` for none)."""
    return "+".join(type(st).__name__ for st in steps) or "Identity"


def match_layout(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """A single access without summation as a chain of layout operators.

    ``L i, j: X[j, i]`` is a Transpose, ``X[2*i + 1]`` a Slice with step 2,
    ``X[i - 1]`` over a wider range a Pad, ``X[i // 4, i % 4]`` a Reshape,
    DepthToSpace/SpaceToDepth index patterns those operators, and simple
    compositions (Slice then Transpose) several steps.
    """
    if scope.summation:
        return Refusal("sums over iterators: not a layout operator")
    body = scope.body
    if not isinstance(body, ir.Access):
        return Refusal("the body is not a single access")
    steps = layout_plan(scope.traversal, body)
    if isinstance(steps, Refusal):
        return steps
    return OperatorMatch(step_label(steps), (Operand(body.source, steps),))


def through_layout(fn: Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]):
    """``fn``, and also a scope that only re-indexes a nested scope ``fn`` takes: the same operator
    with the re-indexing after it as layout steps (the attention core's head merge, transposed and
    reshaped back to ``[B, S, hidden]``, is the operator's own output layout: the steps cancel).

    Only for an operator whose last node states its output shape (com.microsoft ones): the steps
    are normalised from it."""

    def matcher(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
        found = fn(scope, ctx)
        body = scope.body
        if (
            isinstance(found, OperatorMatch)
            or scope.summation
            or not isinstance(body, ir.Access)
            or not isinstance(body.source, ir.Scope)
            or body.source in ctx.bound
        ):
            return found
        inner = matcher(body.source, ctx)  # through a chain of re-indexings
        if not isinstance(inner, OperatorMatch) or not inner.ops or inner.ops[-1].shape is None:
            return found
        plan = layout_plan(scope.traversal, body)
        if isinstance(plan, Refusal):
            return found
        start = tuple(inner.ops[-1].shape)
        post = normalize(inner.post + plan, start)
        final = tuple(t.extent for t in scope.traversal)
        if post and math.prod(start) <= CHECK_LIMIT:
            # Steps that only split and merge back around a unit dimension (a batch of 1) do not
            # cancel step by step: their index map says whether they are one Reshape.
            flat = plan_map(start, post).ravel()
            if np.array_equal(flat, np.arange(flat.size)):
                post = normalize((Reshape(final),), start)
        return dataclasses.replace(inner, post=post, consumes=(*inner.consumes, body.source))

    matcher.__name__ = matcher.__qualname__ = f"{fn.__name__}_through_layout"
    matcher.__doc__ = fn.__doc__
    return matcher


def match_flatten(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """A layout that is one Reshape of ``X`` to ``[prod(shape[:axis]), prod(shape[axis:])]`` as ``Flatten``.

    Not in the matching table (Reshape says the same); preferred for a scope
    that was a Flatten originally. Of equal axes (size-1 dimensions), the last.
    """
    m = match_layout(scope, ctx)
    if isinstance(m, Refusal):
        return m
    (operand,) = m.operands
    steps, shape = operand.steps, tuple(operand.source.shape)
    if len(steps) != 1 or not isinstance(steps[0], Reshape) or len(steps[0].shape) != 2:
        return Refusal(f"the layout is {step_label(steps)}, not one Reshape to two dimensions")
    rows = steps[0].shape[0]
    axes = [a for a in range(len(shape) + 1) if math.prod(shape[:a]) == rows]
    if not axes:
        return Refusal(f"no leading dimensions of {list(shape)} multiply to {rows}")
    op = OpNode("Flatten", (0,), (("axis", axes[-1]),))
    return OperatorMatch("Flatten", (Operand(operand.source),), (op,))


def match_cast(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """A plain copy as ``Cast`` to float32 (the IR's data is float32, so the Cast changes nothing).

    Not in the matching table (Identity says the same); preferred for a scope that was a Cast
    originally, so that a model written back at depth 0 has the nodes it had.
    """
    m = match_layout(scope, ctx)
    if isinstance(m, Refusal):
        return m
    (operand,) = m.operands
    if operand.steps:
        return Refusal(f"the layout is {step_label(operand.steps)}, not a copy")
    op = OpNode("Cast", (0,), (("to", onnx.TensorProto.FLOAT),))
    return OperatorMatch("Cast", (operand,), (op,))


def layout_plan(traversal: Sequence[ir.Iter], acc: ir.Access) -> tuple[LayoutStep, ...] | Refusal:
    """Steps computing ``L traversal: acc`` from ``acc.source``, checked against the index map."""
    src_shape = tuple(acc.source.shape)
    out_shape = tuple(t.extent for t in traversal)
    small = max(math.prod(src_shape), math.prod(out_shape)) <= CHECK_LIMIT
    view = simple_view(acc)
    if not isinstance(view, Refusal):
        steps = normalize(view.steps + to_traversal(view.labels, view.shape, traversal), src_shape)
        if small and not np.array_equal(plan_map(src_shape, steps), index_map(traversal, acc)):
            log.warning("layout plan %s does not reproduce %s", steps, acc)
            return Refusal(f"the view plan {step_label(steps)} does not reproduce the index map")
        return steps
    if not small:
        return Refusal(f"{view.reason}; the exhaustive layout check is limited to {CHECK_LIMIT} elements")
    m = np.asarray(index_map(traversal, acc))
    for name, guess in _GUESSES.items():
        steps = guess(src_shape, out_shape, m)
        if steps is None:
            continue
        steps = normalize(steps, src_shape)
        got = plan_map(src_shape, steps)
        if got.shape == m.shape and np.array_equal(got, m):
            log.debug("layout %s matched as %s", acc, name)
            return steps
    return Refusal(f"{view.reason}; no Reshape/Transpose/DepthToSpace/SpaceToDepth reproduces the index map")


# --------------------------------------------------------------------------
# Guesses for index maps that are not simple views
# --------------------------------------------------------------------------

# A guess at the layout steps that turn an array of one shape into another with the given index map
# (None: this kind of plan cannot); every guess is checked against the map before it is used.
LayoutGuess = Callable[[tuple[int, ...], tuple[int, ...], np.ndarray], tuple[LayoutStep, ...] | None]


def _bijective(m: np.ndarray, size: int) -> bool:
    flat = m.ravel()
    return m.size == size and flat.min() >= 0 and bool((np.bincount(flat, minlength=size) == 1).all())


def _deduce_perm(m: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The perm ``P`` with ``m == transpose(arange(shape), P).ravel()``, if any (then checked)."""
    flat = m.ravel()
    if flat[0] != 0:
        return None
    coords = np.unravel_index(flat, shape)
    first_change = {}
    for a, n in enumerate(shape):
        if n > 1:
            changed = np.flatnonzero(coords[a] != 0)
            first_change[a] = int(changed[0]) if changed.size else 0
    moving = sorted(first_change, key=lambda a: -first_change[a])
    return tuple(moving) + tuple(a for a, n in enumerate(shape) if n == 1)


def _reshape(src: tuple[int, ...], out: tuple[int, ...], m: np.ndarray) -> tuple[LayoutStep, ...] | None:
    return (Reshape(out),) if math.prod(src) == math.prod(out) else None


def _transpose_reshape(
    src: tuple[int, ...], out: tuple[int, ...], m: np.ndarray
) -> tuple[LayoutStep, ...] | None:
    if not _bijective(m, math.prod(src)):
        return None
    perm = _deduce_perm(m, src)
    return None if perm is None else (Transpose(perm), Reshape(out))


def _reshape_transpose(
    src: tuple[int, ...], out: tuple[int, ...], m: np.ndarray
) -> tuple[LayoutStep, ...] | None:
    size = math.prod(src)
    if not _bijective(m, size):
        return None
    inverse = np.empty(size, dtype=np.int64)
    inverse[m.ravel()] = np.arange(size)
    q = _deduce_perm(inverse, out)
    if q is None:
        return None
    back = tuple(int(i) for i in np.argsort(q))
    return (Reshape(tuple(out[a] for a in q)), Transpose(back))


def _block(depth: tuple[int, ...], space: tuple[int, ...]) -> int | None:
    """The block size ``b`` with ``depth = [N, C*b*b, H, W]`` and ``space = [N, C, H*b, W*b]``."""
    if len(depth) != 4 or len(space) != 4 or space[2] % depth[2]:
        return None
    b = space[2] // depth[2]
    if b < 2 or space[3] != depth[3] * b or depth[1] != space[1] * b * b or depth[0] != space[0]:
        return None
    return b


def _depth_to_space(mode: str) -> LayoutGuess:
    def guess(src: tuple[int, ...], out: tuple[int, ...], m: np.ndarray) -> tuple[LayoutStep, ...] | None:
        b = _block(src, out)
        return None if b is None else (DepthToSpace(b, mode),)

    return guess


def _space_to_depth(
    src: tuple[int, ...], out: tuple[int, ...], m: np.ndarray
) -> tuple[LayoutStep, ...] | None:
    b = _block(out, src)
    return None if b is None else (SpaceToDepth(b),)


# Tried in order; each guess is then checked against the index map.
_GUESSES: dict[str, LayoutGuess] = {
    "Reshape": _reshape,
    "DepthToSpace(DCR)": _depth_to_space("DCR"),
    "DepthToSpace(CRD)": _depth_to_space("CRD"),
    "SpaceToDepth": _space_to_depth,
    "Transpose+Reshape": _transpose_reshape,
    "Reshape+Transpose": _reshape_transpose,
}


# --------------------------------------------------------------------------
# Concat
# --------------------------------------------------------------------------


def match_concat(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """A sum of accesses whose in-range parts are disjoint slabs along one axis.

    ``L i: A[i] + B[i - 4]`` with ``A: [4]`` and ``i:10`` is
    ``Concat(A, B[:6])``; gaps between slabs are filled with zeros.
    """
    if scope.summation:
        return Refusal("sums over iterators: not a concatenation")
    terms = chain_operands(scope.body, "+")
    if len(terms) < 2 or not all(isinstance(t, ir.Access) for t in terms):
        return Refusal("the body is not a sum of two or more accesses")
    trav = scope.traversal
    boxes: list[list[tuple[int, int]]] = []
    for k, term in enumerate(terms):
        view = simple_view(term)
        if isinstance(view, Refusal):
            return Refusal(f"term {k + 1}: {view.reason}")
        box = []
        for t in trav:
            if t not in view.labels:
                box.append((0, t.extent))
                continue
            valid = view.valid[view.labels.index(t)]
            if valid is None:
                return Refusal(
                    f"term {k + 1} reads {t.name} jointly with other iterators; its extent is unclear"
                )
            box.append(valid)
        boxes.append(box)
    partial = sorted({d for box in boxes for d, t in enumerate(trav) if box[d] != (0, t.extent)})
    if not partial:
        return Refusal("every term covers the whole output: a sum, not a concatenation")
    segments: dict[int, list[tuple[int, int]]] = {}
    for d in partial:
        found = _segments(sorted({box[d] for box in boxes}), trav[d].extent)
        if isinstance(found, str):
            return Refusal(f"terms {found} along {trav[d].name}")
        segments[d] = found
    cells: dict[tuple[tuple[int, int], ...], int] = {}
    for k, box in enumerate(boxes):
        cell = tuple(box[d] for d in partial)
        if cell in cells:
            return Refusal(f"terms {cells[cell] + 1} and {k + 1} cover the same slab")
        cells[cell] = k
    operands: list[Operand] = []
    ops: list[OpNode] = []

    def leaf(cell: tuple[tuple[int, int], ...]) -> int | Refusal:
        """The operand of one cell of the grid (zeros where no term reads)."""
        at = dict(zip(partial, cell, strict=True))
        k = cells.get(cell)
        if k is None:
            shape = tuple(at[d][1] - at[d][0] if d in at else t.extent for d, t in enumerate(trav))
            operands.append(Operand(Literal(np.zeros(shape, dtype=np.float32))))
            return len(operands) - 1
        cuts = {trav[d]: ir.Iter(trav[d].name, trav[d].lo + a, trav[d].lo + b) for d, (a, b) in at.items()}
        acc = ir.Access(terms[k].source, tuple(substitute(i, cuts) for i in terms[k].indices))
        steps = layout_plan(tuple(cuts.get(x, x) for x in trav), acc)
        if isinstance(steps, Refusal):
            return Refusal(f"term {k + 1}: {steps.reason}")
        operands.append(Operand(acc.source, steps))
        return len(operands) - 1

    def joined(prefix: tuple[tuple[int, int], ...]) -> int | Refusal:
        """The concatenation of every cell under ``prefix`` (innermost cut axis first)."""
        if len(prefix) == len(partial):
            return leaf(prefix)
        axis = partial[len(prefix)]
        pieces = []
        for seg in segments[axis]:
            v = joined((*prefix, seg))
            if isinstance(v, Refusal):
                return v
            pieces.append(v)
        if len(pieces) == 1:
            return pieces[0]
        ops.append(OpNode("Concat", tuple(pieces), (("axis", axis),)))
        return -len(ops)  # resolved below: ops are numbered after every operand

    top = joined(())
    if isinstance(top, Refusal):
        return top
    if not ops:
        return Refusal("a single term: not a concatenation")
    n = len(operands)
    ops = [OpNode(o.op_type, tuple(n - i - 1 if i < 0 else i for i in o.inputs), o.attrs) for o in ops]
    return OperatorMatch("Concat", tuple(operands), tuple(ops))


def _segments(intervals: list[tuple[int, int]], extent: int) -> list[tuple[int, int]] | str:
    """The intervals along one axis with the gaps between them (zero fills) covering ``[0, extent)``,
    or why they cannot be concatenated."""
    out: list[tuple[int, int]] = []
    at = 0
    for a, b in intervals:
        if a < at:
            return f"overlap (positions {a}..{at - 1})"
        if a > at:
            out.append((at, a))
        out.append((a, b))
        at = b
    if at < extent:
        out.append((at, extent))
    return out

"""What an operator match says: layout steps, operands, operator nodes, refusals.

An :class:`OperatorMatch` describes how to compute one scope with ONNX operators:
``operands`` (a tensor, scope or literal array read through layout ``steps``),
``ops`` (operator nodes over operands and earlier ops) and ``post`` (layout
steps on the result). A :class:`LayoutStep` (Slice, Pad, Transpose, ...) is a
small frozen record with a numpy meaning (``apply``), so a constant operand is
transformed at compile time and a layout plan can be checked against the
scope's integer index map.


The analyses that build plans (views of accesses, arranging dimensions,
index maps) are in :mod:`einopt.instantiate.views`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from einopt.core import ir

__all__ = [
    "LayoutStep",
    "Slice",
    "Pad",
    "Transpose",
    "Reshape",
    "Expand",
    "Scale",
    "DepthToSpace",
    "SpaceToDepth",
    "Literal",
    "Source",
    "Operand",
    "OpNode",
    "CONTRIB_DOMAIN",
    "OperatorMatch",
    "Refusal",
    "MatchContext",
    "NO_MATCH_CONTEXT",
    "known_values",
    "kept_answer",
    "normalize",
    "steps_shape",
    "apply_steps",
    "steps_cost",
    "layout_cost",
]


# --------------------------------------------------------------------------
# Layout steps
# --------------------------------------------------------------------------


class LayoutStep:
    """A layout (or scaling) transformation of one array, with a numpy meaning."""

    __slots__ = ()

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        raise NotImplementedError

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        """The step on ``arr``; ``fill`` is the value of inserted (padding) elements."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Slice(LayoutStep):
    """ONNX ``Slice`` with non-negative starts (an end of ``-(n+1)`` runs to the start)."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    axes: tuple[int, ...]
    steps: tuple[int, ...]

    def _slices(self, rank: int) -> tuple[slice, ...]:
        sl = [slice(None)] * rank
        for s, e, a, st in zip(self.starts, self.ends, self.axes, self.steps, strict=True):
            sl[a] = slice(s, e, st)
        return tuple(sl)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(len(range(*s.indices(n))) for s, n in zip(self._slices(len(shape)), shape, strict=True))

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        return arr[self._slices(arr.ndim)]


@dataclasses.dataclass(frozen=True)
class Pad(LayoutStep):
    """ONNX ``Pad`` with zeros; ``pads`` is all befores then all afters."""

    pads: tuple[int, ...]

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        r = len(shape)
        return tuple(n + self.pads[d] + self.pads[r + d] for d, n in enumerate(shape))

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        r = arr.ndim
        return np.pad(arr, [(self.pads[d], self.pads[r + d]) for d in range(r)], constant_values=fill)


@dataclasses.dataclass(frozen=True)
class Transpose(LayoutStep):
    perm: tuple[int, ...]

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[p] for p in self.perm)

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        return np.transpose(arr, self.perm)


@dataclasses.dataclass(frozen=True)
class Reshape(LayoutStep):
    shape: tuple[int, ...]

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape {list(shape)} to {list(self.shape)}")
        return self.shape

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        return arr.reshape(self.shape)


@dataclasses.dataclass(frozen=True)
class Expand(LayoutStep):
    """Broadcast size-1 dimensions to ``shape``."""

    shape: tuple[int, ...]

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(shape, self.shape))

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        return np.array(np.broadcast_to(arr, self.out_shape(arr.shape)))


@dataclasses.dataclass(frozen=True)
class Scale(LayoutStep):
    """Multiply by a constant (a ``Mul``; folded into constant operands)."""

    factor: float

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        return (arr * self.factor).astype(arr.dtype)


@dataclasses.dataclass(frozen=True)
class DepthToSpace(LayoutStep):
    blocksize: int
    mode: str  # "DCR" or "CRD"

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n, c, h, w = shape
        b = self.blocksize
        return (n, c // (b * b), h * b, w * b)

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        n, c, h, w = arr.shape
        b = self.blocksize
        if self.mode == "DCR":
            t = arr.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = arr.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return t.reshape(self.out_shape(arr.shape))


@dataclasses.dataclass(frozen=True)
class SpaceToDepth(LayoutStep):
    blocksize: int

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n, c, h, w = shape
        b = self.blocksize
        return (n, c * b * b, h // b, w // b)

    def apply(self, arr: np.ndarray, fill: Any = 0) -> np.ndarray:
        n, c, h, w = arr.shape
        b = self.blocksize
        t = arr.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
        return t.reshape(self.out_shape(arr.shape))


def steps_shape(steps: Iterable[LayoutStep], shape: tuple[int, ...]) -> tuple[int, ...]:
    for st in steps:
        shape = st.out_shape(shape)
    return shape


def apply_steps(steps: Iterable[LayoutStep], arr: np.ndarray, fill: Any = 0) -> np.ndarray:
    for st in steps:
        arr = st.apply(arr, fill)
    return arr


def normalize(steps: Iterable[LayoutStep], shape: tuple[int, ...]) -> tuple[LayoutStep, ...]:
    """Equal steps without no-ops: identity transposes and reshapes, chained reshapes merged,
    chained transposes composed, transposes that only move size-1 dimensions turned into reshapes."""
    out: list[tuple[LayoutStep, tuple[int, ...]]] = []  # (step, its input shape)
    cur = tuple(shape)
    for st in steps:
        nxt = st.out_shape(cur)
        if isinstance(st, Transpose):
            moved = [p for p in st.perm if cur[p] != 1]
            if moved == sorted(moved):
                st = Reshape(nxt)
        if out and isinstance(st, Transpose) and isinstance(out[-1][0], Transpose):
            prev, cur = out.pop()
            st = Transpose(tuple(prev.perm[p] for p in st.perm))
        if out and isinstance(st, Reshape) and isinstance(out[-1][0], Reshape):
            _, cur = out.pop()
        if out and isinstance(st, Scale) and isinstance(out[-1][0], Scale):
            prev, cur = out.pop()
            st = Scale(prev.factor * st.factor)
        identity = (
            (isinstance(st, (Reshape, Expand)) and nxt == cur)
            or (isinstance(st, Transpose) and st.perm == tuple(range(len(cur))))
            or (isinstance(st, Scale) and st.factor == 1.0)
        )
        if not identity:
            out.append((st, cur))
        cur = nxt
    return tuple(st for st, _ in out)


# Runtime cost of a step on a value computed at run time (constants fold for free).
_STEP_COST: dict[type, float] = {
    Transpose: 10.0,
    Slice: 4.0,
    Pad: 4.0,
    Expand: 4.0,
    Scale: 3.0,
    DepthToSpace: 10.0,
    SpaceToDepth: 10.0,
    Reshape: 0.1,
}


def steps_cost(steps: Sequence[LayoutStep], constant: bool) -> float:
    """How much ``steps`` cost: nodes at run time, or a (small) new initializer when constant."""
    if constant:
        return 0.01 * bool(steps)
    return sum(_STEP_COST[type(st)] for st in steps)


# --------------------------------------------------------------------------
# Matches
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Literal:
    """A constant array operand (a scalar constant of the body, Clip bounds, zero fill)."""

    value: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


Source = ir.Tensor | ir.Scope | Literal


@dataclasses.dataclass(frozen=True, eq=False)
class Operand:
    """An operator input: ``source`` read through ``steps``."""

    source: Source
    steps: tuple[LayoutStep, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return steps_shape(self.steps, tuple(self.source.shape))


CONTRIB_DOMAIN = "com.microsoft"
"""The domain of ONNX Runtime's contrib operators (every onnxruntime build has their CPU kernels;
imported at opset version 1)."""


@dataclasses.dataclass(frozen=True)
class OpNode:
    """One operator node; ``inputs`` number values: operands first, then earlier ops (None: omitted).

    ``domain`` is the operator's domain ("" for the default one, ``com.microsoft`` for ONNX Runtime's
    contrib operators); ``shape`` its output's shape where ONNX shape inference cannot tell it (an
    operator outside the default domain), so the costing still knows every shape after it.
    """

    op_type: str
    inputs: tuple[int | None, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    domain: str = ""
    shape: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class OperatorMatch:
    """How to compute a scope with predefined operators (what a matcher returns when it accepts the
    scope; not a rule's :class:`einopt.rules.Match`).

    The result is the last op's output (operand 0 when ``ops`` is empty, a pure
    layout match) followed by ``post``. ``consumes`` lists the inline scopes
    the match fuses (so they are not materialised for it).
    """

    op_type: str
    operands: tuple[Operand, ...]
    ops: tuple[OpNode, ...] = ()
    post: tuple[LayoutStep, ...] = ()
    consumes: tuple[ir.Scope, ...] = ()

    @property
    def attrs(self) -> dict[str, Any]:
        """The attributes of the main (last) operator."""
        return dict(self.ops[-1].attrs) if self.ops else {}

    @property
    def steps(self) -> tuple[LayoutStep, ...]:
        """Layout steps of a pure layout match (operand 0's steps, then ``post``)."""
        return (self.operands[0].steps if not self.ops else ()) + self.post


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a matcher refused a scope (a rule's near miss is an :class:`einopt.rules.Failure`)."""

    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclasses.dataclass(frozen=True)
class MatchContext:
    """What a matcher may know besides the scope (a rule's is an :class:`einopt.rules.Context`).

    ``constant``: tensors and scopes whose values are known at compile time
    (layout steps on them are free). ``bound``: scopes materialised as program
    bindings, which a matcher must not fuse (they are computed anyway).
    ``opset``: operators newer than it are refused. ``values``: the arrays of
    constant input tensors by name, for a matcher whose operator holds only
    for some values (RotaryEmbedding's tables repeat their halves); absent
    ones are unknown and such a matcher refuses.
    """

    constant: frozenset = frozenset()
    bound: frozenset = frozenset()
    opset: int | None = None  # default-domain opset emitted for (None: any operator is available)
    values: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def is_constant(self, src: Source) -> bool:
        return isinstance(src, Literal) or src in self.constant


def known_values(tensors: Iterable[ir.Tensor], values: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
    """The arrays ``values`` holds for ``tensors`` (None where it holds none), for a memo whose
    answer depends on them: keyed by their identities (callers copy the mapping, never the arrays),
    the entry holding the arrays too, so that an id names no other array while the entry lives."""
    return tuple(values.get(t.name) for t in tensors)


# The context of a scope matched on its own: nothing constant, nothing bound.
NO_MATCH_CONTEXT = MatchContext()


def _fuses_binding(m: OperatorMatch, ctx: MatchContext) -> bool:
    """True when ``m`` fuses a scope that is a program binding (computed anyway, so it would run twice)."""
    return any(s in ctx.bound for s in m.consumes)


def layout_cost(m: OperatorMatch, ctx: MatchContext) -> float:
    """Run-time layout work a match adds around its operators (transposes of activations cost most)."""
    return sum(steps_cost(o.steps, ctx.is_constant(o.source)) for o in m.operands) + steps_cost(m.post, False)


T = TypeVar("T")


def kept_answer(
    scope: ir.Scope, what: Hashable, ctx: MatchContext, compute: Callable[[MatchContext], T]
) -> T:
    """``compute(ctx)``, a matcher's answer about ``scope``, kept on the scope (scopes are interned)
    with the questions it asked of the context: which scopes and tensors are constant or bound (the
    only questions a matcher asks of those sets), the opset, and the constant tensors' values, by
    identity. An answer is reused wherever those questions get the same answers.

    The search asks again about every scope its states share, in contexts that differ elsewhere
    (a producer the scope never looked at became a binding), and about every scope a rewrite
    rebuilt around an unchanged body."""
    arrays = known_values([t for t in ir.tensors_in(scope) if t in ctx.constant], ctx.values)
    kept = ir._cached(scope, what, dict).setdefault((ctx.opset, tuple(map(id, arrays))), [])
    for asked, found, _arrays in kept:
        if all(
            (x in (ctx.bound if bound else ctx.constant)) == answer for (bound, x), answer in asked.items()
        ):
            return found
    asked: dict[tuple[bool, object], bool] = {}
    tracked = dataclasses.replace(
        ctx, constant=_Asked(ctx.constant, False, asked), bound=_Asked(ctx.bound, True, asked)
    )
    found = compute(tracked)
    kept.append((asked, found, arrays))  # the arrays kept too: their ids name no other array meanwhile
    return found


class _Asked:
    """A set of a :class:`MatchContext` (``constant`` or ``bound``) that records every membership
    question asked of it, with its answer, in ``asked``."""

    __slots__ = ("items", "bound", "asked")

    def __init__(self, items: frozenset, bound: bool, asked: dict) -> None:
        self.items, self.bound, self.asked = items, bound, asked

    def __contains__(self, x: object) -> bool:
        answer = x in self.items
        self.asked[self.bound, x] = answer
        return answer

    def __hash__(self) -> int:
        return hash(self.items)

    def __eq__(self, other: object) -> bool:
        return self.items == (other.items if isinstance(other, _Asked) else other)

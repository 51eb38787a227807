"""The reference interpreter: what every einopt expression means.

``evaluate(node, inputs)`` computes a ``Scope`` or a ``Program`` with numpy.
Every derivation rule and every lowering is tested against it, so it follows
the semantics of ``einopt.core.ir`` literally:

* a scope ``L[x] Sum[y] f`` evaluates ``f`` at every point of ``x`` and ``y``
  and sums over ``y``; a max scope ``L[x] Max[y] f`` takes the maximum over
  ``y`` instead (``y`` is never empty there); array position ``p`` in dimension
  ``d`` of the result holds traversal value ``x[d].lo + p``;
* reading an input tensor outside ``0 <= i < shape`` or a scope outside its
  traversal ranges yields 0 (a scope's ``pad`` does not change values);
* index ``//`` and ``%`` are floor division and modulo (Python/numpy).

It evaluates without building the full iteration space. Inside one scope every
sub-expression is an array with one axis per scope iterator (traversal, then
summation), of size 1 on the axes it does not depend on, so numpy broadcasting
does the rest. The body is expanded into a signed sum of products; each product
is contracted with ``np.einsum`` over the summation iterators it reads and is
multiplied by the extent of those it does not read. A term whose largest
operand would exceed ``_BUDGET`` elements is evaluated in chunks of a summation
range. A max scope evaluates its body over the whole iteration space of the
iterators it reads and takes the maximum over the summation axes, in chunks of
a summation range likewise. Nested scopes are evaluated once per call (nodes
are interned, so identity is structural equality) and then gathered from; a
nested scope read only on a box of its traversal at most half its size (a
scope sampled on a few rows reads its producers on those rows alone) is
evaluated on that box only.

Modes: ``"float64"`` (default), ``"float32"`` (inputs cast to float32, every
operation in float32) and ``"int"``: exact integer arithmetic in int64 for
checking rules that only hold up to rounding in floating point. Integer mode
refuses operations without an exact integer meaning (those not ``exact`` in
``einopt.core.ops``: ``/``, sqrt, exp, tanh, sigmoid; non-integer constants or
parameters such as leaky_relu slopes) and non-integer inputs.
int64 arithmetic wraps on overflow, so keep integer test data small.

In floating point the result equals the literal evaluation up to rounding:
summation order is unspecified and products are expanded over sums (which can
also turn an overflow ``inf * 0`` into a different NaN or infinity).
"""

from __future__ import annotations

import functools
import math
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from einopt.core.index import bounds, linear_form
from einopt.core.ir import (
    Access,
    Binary,
    Const,
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IndexExpr,
    IRError,
    ISub,
    Iter,
    Node,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    input_tensors,
    scopes_in,
    walk,
)
from einopt.core.ops import BINARY, UNARY

__all__ = ["evaluate", "eval_index", "sample_box", "EvaluationError", "MODES"]

MODES: dict[str, type] = {"float64": np.float64, "float32": np.float32, "int": np.int64}

# Largest operand (in elements) built at once before a term is chunked.
_BUDGET = 1 << 22

# A nested scope read on a box of at most this fraction of its traversal is evaluated on the box alone.
_PART = 0.5

# A product of sums is expanded into a sum of products only up to this many terms.
_MAX_TERMS = 16


class EvaluationError(IRError):
    """An expression cannot be evaluated on the given inputs or in the given mode."""


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def evaluate(
    node: Scope | Program,
    inputs: Mapping[str, Any],
    *,
    mode: str = "float64",
    box: tuple[tuple[int, int], ...] | None = None,
) -> np.ndarray | dict[str, np.ndarray]:
    """Evaluate a scope or a program on concrete input tensors.

    Parameters
    ----------
    node : Scope or Program
        The expression to evaluate.
    inputs : mapping of str to array-like
        One array per input tensor, keyed by tensor name, of exactly the
        tensor's shape. Extra entries are ignored.
    mode : {"float64", "float32", "int"}
        Arithmetic to compute in. ``"int"`` is exact int64 arithmetic: inputs
        must be integer-valued and the expression may not use ``/``, sqrt,
        exp, tanh, sigmoid, or non-integer constants and slopes.
    box : tuple of (int, int), optional
        For a scope: the half-open range of traversal values to evaluate per
        dimension (within the traversal), e.g. from :func:`sample_box`; only
        the values it reads are computed.

    Returns
    -------
    numpy.ndarray or dict of str to numpy.ndarray
        For a scope, an array of shape ``scope.shape`` (the box's, with
        ``box``) whose position ``p`` in dimension ``d`` holds traversal value
        ``scope.traversal[d].lo + p`` (the box's start + ``p``).
        For a program, one such array per output, in ``program.outputs`` order.

    Raises
    ------
    EvaluationError
        On an unknown mode, a missing, misshapen or non-numeric input, or (in
        integer mode) an inexact operation or a non-integer input.
    """
    if mode not in MODES:
        raise EvaluationError(f"unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    if not isinstance(node, (Scope, Program)):
        raise EvaluationError(f"evaluate takes a Scope or a Program, got {type(node).__name__}")
    if box is not None and not (
        isinstance(node, Scope)
        and len(box) == len(node.traversal)
        and all(it.lo <= lo < hi <= it.hi for (lo, hi), it in zip(box, node.traversal, strict=True))
    ):
        raise EvaluationError(f"box {box} is not within the traversal of a scope")
    tensors = input_tensors(node)
    exact = mode == "int"
    if exact:
        _check_exact(node)
    ev = _Evaluator(_load_inputs(tensors, inputs, mode), MODES[mode], exact)
    # IEEE semantics for x/0, sqrt(-1), exp overflow: no warnings from the specification.
    with np.errstate(all="ignore"):
        if isinstance(node, Scope):
            if box is not None:
                dom = {it: r for it, r in zip(node.traversal, box, strict=True)}
                return _REDUCERS[node.reduce](
                    ev, _Frame(node, dom | {it: (it.lo, it.hi) for it in node.summation})
                )
            return ev.scope(node)
        out: dict[str, np.ndarray] = {}
        for name in node.outputs:
            arr = ev.scope(node.scope(name))
            # A scope bound under two output names still gives two arrays.
            out[name] = arr.copy() if any(arr is a for a in out.values()) else arr
        return out


def sample_box(scope: Scope, size: int = 2, dims: Sequence[int] | None = None) -> tuple[tuple[int, int], ...]:
    """A box of ``scope``'s traversal to check a claim about it on: its last ``size`` values along
    the first of ``dims`` (default: every dimension but the last) of extent more than ``size``, the
    whole traversal elsewhere. Operators whose rows are independent (normalizations over the last
    dimension; attention over batch elements) are checked on a few rows at the cost of a few rows."""
    box = [(it.lo, it.hi) for it in scope.traversal]
    allowed = range(len(box) - 1) if dims is None else dims
    cut = next((d for d in allowed if scope.traversal[d].extent > size), None)
    if cut is not None:
        box[cut] = (scope.traversal[cut].hi - size, scope.traversal[cut].hi)
    return tuple(box)


def _load_inputs(tensors: list[Tensor], inputs: Mapping[str, Any], mode: str) -> dict[str, np.ndarray]:
    """Check and convert each input to the mode's dtype."""
    # Tensor names are unique: Scope and Program refuse two tensors under one name.
    out: dict[str, np.ndarray] = {}
    for t in tensors:
        what = f"input {t.name} (expected shape {t.shape})"
        if t.name not in inputs:
            raise EvaluationError(f"missing {what}")
        try:
            arr = np.asarray(inputs[t.name])
        except (TypeError, ValueError) as exc:
            raise EvaluationError(f"{what} is not an array: {exc}") from None
        if arr.dtype.kind not in "biuf":
            raise EvaluationError(f"{what} is not a real numeric array (dtype {arr.dtype})")
        if arr.shape != t.shape:
            raise EvaluationError(f"{what} has shape {arr.shape}")
        if mode == "int":
            arr = _as_exact_int(arr, what)
        out[t.name] = arr.astype(MODES[mode], copy=False)
    return out


def _as_exact_int(arr: np.ndarray, what: str) -> np.ndarray:
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise EvaluationError(f"integer mode: {what} holds non-integer values")
    if arr.size and arr.dtype.kind in "uf" and not (-(2**63) <= arr.min() and arr.max() < 2**63):
        raise EvaluationError(f"integer mode: {what} holds values outside int64")
    return arr


# --------------------------------------------------------------------------
# Integer mode: refuse what has no exact integer meaning
# --------------------------------------------------------------------------


def _check_exact(node: Scope | Program) -> None:
    for s in scopes_in(node):
        for e in walk(s.body, stop=Access):
            problem = _inexact(e)
            if problem:
                raise EvaluationError(f"integer mode: {problem} has no exact integer meaning")


def _inexact(e: ValueExpr) -> str | None:
    if isinstance(e, Binary) and not BINARY[e.op].exact:
        return f"{BINARY[e.op].title} '{e.op}'"
    if isinstance(e, Unary) and not UNARY[e.fn].exact:
        return f"function {e.fn}"
    if isinstance(e, Unary) and e.param is not None and not e.param.is_integer():
        return f"{e.fn} with {UNARY[e.fn].param} {e.param!r}"
    if isinstance(e, Const) and not e.value.is_integer():
        return f"constant {e.value!r}"
    return None


# --------------------------------------------------------------------------
# Element-wise operations
# --------------------------------------------------------------------------

# The operations' numpy forms are rows of einopt.core.ops (UNARY, BINARY).

_INDEX_BINARY: dict[type, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    IAdd: np.add,
    ISub: np.subtract,
    IMul: np.multiply,
}

_INDEX_BY_CONST: dict[type, Callable[[np.ndarray, int], np.ndarray]] = {
    IFloorDiv: np.floor_divide,
    IMod: np.mod,
}


def eval_index(e: IndexExpr, env: Mapping[Iter, np.ndarray]) -> np.ndarray:
    """``e`` on integer arrays of iterator values ``env`` (floor ``//`` and ``%``), int64."""
    if isinstance(e, IConst):
        return np.asarray(e.value, dtype=np.int64)
    if isinstance(e, Iter):
        return env[e]
    if type(e) in _INDEX_BINARY:
        return _INDEX_BINARY[type(e)](eval_index(e.a, env), eval_index(e.b, env))
    return _INDEX_BY_CONST[type(e)](eval_index(e.a, env), e.k)


# --------------------------------------------------------------------------
# Evaluation of scopes
# --------------------------------------------------------------------------


class _Frame:
    """The iteration space of one scope (or one chunk of it).

    ``axes`` are the scope's traversal then summation iterators; ``dom`` gives
    each one's current half-open range (a chunk narrows a summation range).
    Arrays computed in a frame have one axis per entry of ``axes`` and are
    memoised in ``memo`` by node.
    """

    __slots__ = ("scope", "axes", "pos", "dom", "memo")

    def __init__(self, scope: Scope, dom: dict[Iter, tuple[int, int]]) -> None:
        self.scope = scope
        self.axes = scope.traversal + scope.summation
        self.pos = {it: d for d, it in enumerate(self.axes)}
        self.dom = dom
        self.memo: dict[Node, np.ndarray] = {}

    def extent(self, it: Iter) -> int:
        lo, hi = self.dom[it]
        return hi - lo

    def restrict(self, it: Iter, lo: int, hi: int) -> _Frame:
        return _Frame(self.scope, {**self.dom, it: (lo, hi)})

    def out_shape(self) -> tuple[int, ...]:
        """The shape of the scope's value on this frame: its traversal's current extents."""
        return tuple(self.extent(it) for it in self.scope.traversal)

    def shape_of(self, its: frozenset[Iter] | set[Iter]) -> tuple[int, ...]:
        """The broadcast shape of an array depending on ``its``."""
        return tuple(self.extent(it) if it in its else 1 for it in self.axes)


class _Evaluator:
    """Holds the inputs and the memo of evaluated scopes for one ``evaluate`` call."""

    def __init__(self, arrays: dict[str, np.ndarray], dtype: type, exact: bool) -> None:
        self.arrays = arrays
        self.dtype = np.dtype(dtype)
        self.exact = exact
        self.scopes: dict[Scope, np.ndarray] = {}
        self.parts: dict[tuple[Scope, tuple[tuple[int, int], ...]], np.ndarray] = {}

    def scalar(self, v: float | int) -> np.ndarray:
        return np.asarray(int(v) if self.exact else v, dtype=self.dtype)

    # ---- scopes and terms ------------------------------------------------

    def scope(self, s: Scope) -> np.ndarray:
        """The materialised value of ``s`` (computed once per call)."""
        out = self.scopes.get(s)
        if out is None:
            frame = _Frame(s, {it: (it.lo, it.hi) for it in s.traversal + s.summation})
            out = self.scopes[s] = _REDUCERS[s.reduce](self, frame)
        return out

    def part(self, s: Scope, box: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, tuple[int, ...]]:
        """``s`` on the inclusive ``box`` of its traversal values it is read on, and the traversal
        value at the array's position 0: ``s`` whole unless the box is at most ``_PART`` of it."""
        whole = self.scopes.get(s)
        if whole is None and math.prod(hi - lo + 1 for lo, hi in box) <= _PART * math.prod(s.shape):
            out = self.parts.get((s, box))
            if out is None:
                dom = {it: (lo, hi + 1) for it, (lo, hi) in zip(s.traversal, box, strict=True)}
                frame = _Frame(s, dom | {it: (it.lo, it.hi) for it in s.summation})
                out = self.parts[s, box] = _REDUCERS[s.reduce](self, frame)
            return out, tuple(lo for lo, _ in box)
        return (whole if whole is not None else self.scope(s)), s.origin

    def total(self, frame: _Frame) -> np.ndarray:
        """A sum scope: its body's terms, each contracted over the summation iterators."""
        out = np.zeros(frame.out_shape(), dtype=self.dtype)
        for coef, factors in _terms(frame.scope.body, self.exact):
            out += self.term(frame, coef, factors)
        return out

    def maximum(self, frame: _Frame) -> np.ndarray:
        """A max scope: the body at every point it depends on, maximised over the summation axes."""
        s = frame.scope
        body = s.body
        size = math.prod(frame.shape_of(body.iters()))
        if size > _BUDGET:
            split = [it for it in s.summation if it in body.iters() and frame.extent(it) > 1]
            if split:
                it = max(split, key=frame.extent)
                lo, hi = frame.dom[it]
                step = max(1, (hi - lo) * _BUDGET // size)
                parts = [self.maximum(frame.restrict(it, a, min(a + step, hi))) for a in range(lo, hi, step)]
                return functools.reduce(np.maximum, parts)
        v = self.value(frame, body)
        v = v.reshape((1,) * (len(frame.axes) - v.ndim) + v.shape)
        # Summation axes the body does not read have size 1 here: the maximum of one repeated value.
        v = v.max(axis=tuple(range(len(s.traversal), len(frame.axes))))
        return np.array(np.broadcast_to(v, frame.out_shape()), dtype=self.dtype)

    def term(self, frame: _Frame, coef: float | int, factors: tuple[ValueExpr, ...]) -> np.ndarray:
        """``coef * Sum[summation] prod(factors)`` as a traversal-shaped array."""
        deps = frozenset().union(*(f.iters() for f in factors))
        size = max((math.prod(frame.shape_of(f.iters())) for f in factors), default=1)
        if size > _BUDGET:
            split = [it for it in frame.scope.summation if it in deps and frame.extent(it) > 1]
            if split:
                it = max(split, key=frame.extent)
                lo, hi = frame.dom[it]
                step = max(1, (hi - lo) * _BUDGET // size)
                parts = (
                    self.term(frame.restrict(it, a, min(a + step, hi)), coef, factors)
                    for a in range(lo, hi, step)
                )
                return sum(parts)
        mult = math.prod(frame.extent(it) for it in frame.scope.summation if it not in deps)
        if not factors:
            return self.scalar(coef * mult)
        letters = dict(zip(frame.axes, string.ascii_letters, strict=False))
        operands, specs = [], []
        for f in factors:
            its = [it for it in frame.axes if it in f.iters()]
            operands.append(self.compact(frame, self.value(frame, f), its))
            specs.append("".join(letters[it] for it in its))
        outs = [it for it in frame.scope.traversal if it in deps]
        spec = ",".join(specs) + "->" + "".join(letters[it] for it in outs)
        r = np.einsum(spec, *operands, optimize=True)
        r = r.reshape(tuple(frame.extent(it) if it in deps else 1 for it in frame.scope.traversal))
        if coef * mult != 1:
            r = r * self.scalar(coef * mult)
        return r

    def compact(self, frame: _Frame, a: np.ndarray, its: list[Iter]) -> np.ndarray:
        """Drop the size-1 axes of a frame-shaped array, keeping (and filling) those of ``its``."""
        a = np.asarray(a)
        a = a.reshape((1,) * (len(frame.axes) - a.ndim) + a.shape)
        keep = {frame.pos[it] for it in its}
        a = a.squeeze(axis=tuple(d for d in range(a.ndim) if d not in keep))
        return np.broadcast_to(a, tuple(frame.extent(it) for it in its))

    # ---- values and indices ----------------------------------------------

    def value(self, frame: _Frame, e: ValueExpr) -> np.ndarray:
        """``e`` at every point of the frame, as a frame-broadcast array."""
        out = frame.memo.get(e)
        if out is None:
            if isinstance(e, Const):
                out = self.scalar(e.value)
            elif isinstance(e, Access):
                out = self.gather(frame, e)
            elif isinstance(e, Binary):
                out = BINARY[e.op].numpy(np, self.value(frame, e.a), self.value(frame, e.b))
            elif isinstance(e, Unary):
                out = UNARY[e.fn].numpy(np, self.value(frame, e.x), e.param)
            else:
                raise EvaluationError(f"cannot evaluate {type(e).__name__}")
            frame.memo[e] = out = np.asarray(out, dtype=self.dtype)
        return out

    def index(self, frame: _Frame, e: IndexExpr) -> np.ndarray:
        """The integer index ``e`` at every point of the frame (int64, frame-broadcast)."""
        out = frame.memo.get(e)
        if out is None:
            if isinstance(e, IConst):
                out = np.asarray(e.value, dtype=np.int64)
            elif isinstance(e, Iter):
                lo, hi = frame.dom[e]
                out = np.arange(lo, hi, dtype=np.int64).reshape(frame.shape_of({e}))
            elif type(e) in _INDEX_BINARY:
                out = _INDEX_BINARY[type(e)](self.index(frame, e.a), self.index(frame, e.b))
            else:
                out = _INDEX_BY_CONST[type(e)](self.index(frame, e.a), e.k)
            frame.memo[e] = out
        return out

    def gather(self, frame: _Frame, acc: Access) -> np.ndarray:
        """Read ``acc`` at every point of the frame; out-of-range reads give 0."""
        src = acc.source
        read = [bounds(e, frame.dom) for e in acc.indices]
        if isinstance(src, Tensor):
            arr, origin = self.arrays[src.name], src.origin
        else:
            box = tuple(
                (max(lo, it.lo), min(hi, it.hi - 1)) for (lo, hi), it in zip(read, src.traversal, strict=True)
            )
            if any(lo > hi for lo, hi in box):
                return self.scalar(0)
            arr, origin = self.part(src, box)
        spans = [(lo - o, hi - o) for (lo, hi), o in zip(read, origin, strict=True)]
        if any(hi < 0 or lo >= n for (lo, hi), n in zip(spans, arr.shape, strict=True)):
            return self.scalar(0)
        if all(lo >= 0 and hi < n for (lo, hi), n in zip(spans, arr.shape, strict=True)):
            view = _slice_view(frame, arr, acc.indices, origin)
            if view is not None:
                return view
        idx, mask = [], None
        for e, o, (lo, hi), n in zip(acc.indices, origin, spans, arr.shape, strict=True):
            i = self.index(frame, e)
            if o:
                i = i - o
            if lo < 0 or hi >= n:
                ok = (i >= 0) & (i < n)
                mask = ok if mask is None else mask & ok
                i = np.clip(i, 0, n - 1)
            idx.append(i)
        out = arr[tuple(idx)]
        if mask is not None:
            out = np.where(mask, out, self.scalar(0))
        return out


# How each kind of scope (``Scope.reduce``) is evaluated.
_REDUCERS: dict[str, Callable[[_Evaluator, _Frame], np.ndarray]] = {
    "sum": _Evaluator.total,
    "max": _Evaluator.maximum,
}


def _slice_view(
    frame: _Frame, arr: np.ndarray, indices: tuple[IndexExpr, ...], origin: tuple[int, ...]
) -> np.ndarray | None:
    """A strided view for in-range indices ``c*i + k`` (``c > 0``) of distinct iterators, else None."""
    sl: list[slice | int] = []
    its: list[Iter] = []
    for e, o in zip(indices, origin, strict=True):
        lf = linear_form(e)
        if lf.atoms or len(lf.coeffs) > 1:
            return None
        if not lf.coeffs:
            sl.append(lf.const - o)
            continue
        ((it, c),) = lf.coeffs
        if c <= 0 or it in its:
            return None
        lo, hi = frame.dom[it]
        sl.append(slice(c * lo + lf.const - o, c * (hi - 1) + lf.const - o + 1, c))
        its.append(it)
    view = arr[tuple(sl)]
    order = sorted(range(len(its)), key=lambda k: frame.pos[its[k]])
    return view.transpose(order).reshape(frame.shape_of(set(its)))


# --------------------------------------------------------------------------
# Sum-of-products form of a body
# --------------------------------------------------------------------------


def _terms(e: ValueExpr, exact: bool) -> list[tuple[float | int, tuple[ValueExpr, ...]]]:
    """``e`` as ``sum(coef * prod(factors))``; factors are never constants.

    Sums and negations are distributed; a product of sums is expanded while
    it stays within ``_MAX_TERMS`` terms, otherwise it is one opaque factor.
    """
    if isinstance(e, Const):
        return [(int(e.value) if exact else e.value, ())]
    if isinstance(e, Unary) and e.fn == "neg":
        return [(-c, fs) for c, fs in _terms(e.x, exact)]
    if isinstance(e, Binary) and e.op in ("+", "-"):
        sign = 1 if e.op == "+" else -1
        return _terms(e.a, exact) + [(sign * c, fs) for c, fs in _terms(e.b, exact)]
    if isinstance(e, Binary) and e.op == "*":
        ta, tb = _terms(e.a, exact), _terms(e.b, exact)
        if len(ta) * len(tb) <= _MAX_TERMS:
            return [(ca * cb, fa + fb) for ca, fa in ta for cb, fb in tb]
    return [(1, (e,))]

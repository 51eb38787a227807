"""Hypothesis strategies for random *valid* IR, small enough to evaluate quickly.

    >>> from strategies import scopes, programs, random_inputs
    >>> @given(scopes(integer_safe=True), st.integers(0, 2**32 - 1))
    ... def test_x(s, seed):
    ...     inputs = random_inputs(s, np.random.default_rng(seed), integer=True)

Every expression draws its input tensors from a small pool (``A``, ``B``,
``C``, ``D``) with one shape per name, so a scope or program always has
consistent inputs. Iterator ranges may start below zero and indices may read
out of range (which yields 0). Each scope's iteration domain is kept at most
``_DOMAIN_BUDGET`` points so that a reference interpreter evaluates it fast.

Every subtree is drawn in its own Hypothesis span and its shape depends only
on its own choices, so the shrinker can replace a node by a child or drop
it: failures shrink to small expressions in seconds, not minutes.

Options (all strategies accept them):

* ``integer_safe``: only the operations exact on integers (``exact`` in
  ``einopt.core.ops``: ``+ - * max min`` and ``neg abs relu``; none with a
  parameter) with small integer constants, so float64 evaluation on small
  integer inputs is exact.
* ``finite`` (default): keep results finite: ``/`` divides by a nonzero
  constant or by ``abs(x) + c``, and a function reads its argument folded into
  its ``sample_range`` (:func:`tame`: ``sqrt`` reads ``abs(x)``, ``exp`` reads
  ``min(x, 8.0)``). With ``finite=False`` anything goes, including constants
  ``inf``, ``nan`` and ``-0.0`` (useful for syntax round trips).
* ``binary_ops`` / ``unary_fns``: restrict the operators explicitly.
* ``allow_max`` (off by default, so that existing draws are unchanged): a scope
  with summation iterators is sometimes a max scope (``L[..] Max[..] f``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from einopt.core.ir import (
    BINARY_OPS,
    UNARY_FUNCS,
    Access,
    Binary,
    Const,
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IndexExpr,
    ISub,
    Iter,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    input_tensors,
    scopes_in,
    tensors_in,
)
from einopt.core.ops import BINARY, UNARY

__all__ = ["scopes", "programs", "random_inputs", "tame", "INTEGER_BINARY_OPS", "INTEGER_UNARY_FNS"]

TENSOR_NAMES = ("A", "B", "C", "D")
ITER_NAMES = ("i", "j", "k", "l", "m", "n")
BINDING_NAMES = ("X", "Y", "Z")

INTEGER_BINARY_OPS = tuple(op.name for op in BINARY.values() if op.exact)
INTEGER_UNARY_FNS = tuple(op.name for op in UNARY.values() if op.exact and op.param is None)

# Largest number of points (product of iterator extents) in one scope.
_DOMAIN_BUDGET = 240
# Tallest operator tree in one scope body (so at most 2**3 leaves).
_MAX_HEIGHT = 3

_SPECIAL_FLOATS = (float("inf"), float("-inf"), float("nan"), -0.0, 1e-05, 1e20, 0.1)

# Strategies are built once: creating and validating one per draw dominated the run time.
_ints = functools.cache(st.integers)
_FLOAT_CONSTS = st.one_of(st.sampled_from((0.0, 1.0, -1.0, 2.0, 0.5, 3.0)), st.floats(-4.0, 4.0, width=32))
_ANY_CONSTS = st.one_of(_FLOAT_CONSTS, st.sampled_from(_SPECIAL_FLOATS))
_SHAPES = st.lists(st.integers(1, 5), min_size=1, max_size=4)
_ITER_DRAWS = st.lists(st.tuples(st.integers(1, 5), st.integers(-2, 2)), min_size=1, max_size=3)
_SUM_DRAWS = st.lists(st.tuples(st.integers(1, 5), st.integers(-2, 2)), max_size=3)


@dataclasses.dataclass
class _Ctx:
    """Options and per-expression state threaded through one draw."""

    draw: st.DrawFn
    binary_ops: tuple[str, ...]
    unary_fns: tuple[str, ...]
    integer_safe: bool
    finite: bool
    allow_divmod: bool
    allow_nested: bool
    allow_pad: bool
    tensors: dict[str, Tensor]
    allow_max: bool = False
    # Scopes built so far: nested ones may be read again (shared subexpressions).
    made: list[Scope] = dataclasses.field(default_factory=list)
    # Program bindings readable from the scope being built.
    bound: list[Scope] = dataclasses.field(default_factory=list)
    # Calls waiting to run inside a span (see ``_sub``).
    pending: list[tuple[Callable[..., Any], tuple]] = dataclasses.field(default_factory=list)
    span: st.SearchStrategy | None = None

    def int(self, lo: int, hi: int) -> int:
        return self.draw(_ints(lo, hi))

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[self.draw(_ints(0, len(seq) - 1))]

    def rarely(self, n: int) -> bool:
        """True with chance 1/n; False is what Hypothesis shrinks towards."""
        return self.draw(_ints(0, n - 1)) == n - 1


def _make_ctx(
    draw: st.DrawFn,
    *,
    allow_divmod: bool,
    allow_unary: bool,
    allow_nested: bool,
    allow_pad: bool,
    integer_safe: bool,
    finite: bool,
    binary_ops: Sequence[str] | None,
    unary_fns: Sequence[str] | None,
    allow_max: bool = False,
) -> _Ctx:
    if binary_ops is None:
        binary_ops = INTEGER_BINARY_OPS if integer_safe else BINARY_OPS
    if unary_fns is None:
        unary_fns = INTEGER_UNARY_FNS if integer_safe else tuple(UNARY_FUNCS)
    if integer_safe:
        bad = (set(binary_ops) - set(INTEGER_BINARY_OPS)) | (set(unary_fns) - set(INTEGER_UNARY_FNS))
        if bad:
            raise ValueError(f"integer_safe excludes {sorted(bad)}")
    if not allow_unary:
        unary_fns = ()
    if not binary_ops:
        raise ValueError("need at least one binary operator")
    # One shape per pool name, drawn up front so that shrinking keeps them aligned.
    tensors = {name: Tensor(name, tuple(draw(_SHAPES))) for name in TENSOR_NAMES}
    return _Ctx(
        draw=draw,
        tensors=tensors,
        binary_ops=tuple(binary_ops),
        unary_fns=tuple(unary_fns),
        integer_safe=integer_safe,
        finite=finite,
        allow_divmod=allow_divmod,
        allow_nested=allow_nested,
        allow_pad=allow_pad,
        allow_max=allow_max,
    )


@st.composite
def _run_pending(draw: st.DrawFn, ctx: _Ctx) -> Any:
    ctx.draw = draw  # the same function as before; it now records into this span
    build, args = ctx.pending.pop()
    return build(ctx, *args)


def _sub(ctx: _Ctx, build: Callable[..., Any], *args: Any) -> Any:
    """``build(ctx, *args)`` drawn as one Hypothesis span.

    Spans let the shrinker replace a node by one of its children or delete
    it. One span strategy per context is reused for every call, since
    building a fresh strategy per call is slow.
    """
    if ctx.span is None:
        ctx.span = _run_pending(ctx)
    ctx.pending.append((build, args))
    return ctx.draw(ctx.span)


# --------------------------------------------------------------------------
# Index expressions
# --------------------------------------------------------------------------


def _index_term(ctx: _Ctx, its: Sequence[Iter]) -> IndexExpr:
    kind = ctx.int(0, 6)
    it = ctx.pick(its)
    if kind <= 2:
        return it
    if kind == 3:
        return IMul(IConst(ctx.int(-2, 3)), it)
    if kind == 4:
        return IMul(it, IConst(ctx.int(-2, 3)))
    if kind == 5:
        return IMul(IConst(-1), it)
    # A rare non-linear product of two iterators.
    return IMul(it, ctx.pick(its))


def _index_tail(ctx: _Ctx, its: Sequence[Iter], e: IndexExpr) -> IndexExpr:
    op = ctx.pick((IAdd, ISub))
    if ctx.int(0, 1):
        return op(e, _sub(ctx, _index_term, its))
    return op(e, IConst(ctx.int(-2, 2)))


def _index(ctx: _Ctx, its: Sequence[Iter]) -> IndexExpr:
    """An index such as ``i``, ``2*i+j-1``, ``(i+1)//2`` or ``-j%3``."""
    if ctx.rarely(10):
        return IConst(ctx.int(-1, 3))
    e = _sub(ctx, _index_term, its)
    for _ in range(2):
        if not ctx.rarely(2):
            break
        e = _sub(ctx, _index_tail, its, e)
    if ctx.rarely(4) and ctx.allow_divmod:
        k = ctx.int(1, 4)
        e = IFloorDiv(e, k) if ctx.int(0, 1) else IMod(e, k)
        if ctx.rarely(4):
            e = IAdd(e, IConst(ctx.int(-1, 2)))
    return e


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------


def _const(ctx: _Ctx) -> Const:
    if ctx.integer_safe:
        return Const(float(ctx.int(-3, 3)))
    return Const(ctx.draw(_FLOAT_CONSTS if ctx.finite else _ANY_CONSTS))


def _access(ctx: _Ctx, source: Tensor | Scope, its: Sequence[Iter]) -> Access:
    return Access(source, tuple(_sub(ctx, _index, its) for _ in range(source.rank)))


def _leaf(ctx: _Ctx, its: Sequence[Iter], depth: int) -> ValueExpr:
    # Hypothesis shrinks towards 0, so 0 is the plainest leaf: a tensor access.
    kind = ctx.int(0, 9)
    if kind == 9:
        return _const(ctx)
    if kind in (7, 8) and ctx.bound:
        return _access(ctx, ctx.pick(ctx.bound), its)
    if kind == 6 and ctx.allow_nested and depth > 0:
        if ctx.made and ctx.rarely(3):
            sub = ctx.pick(ctx.made)
        else:
            sub = _sub(ctx, _scope, depth - 1)
            ctx.made.append(sub)
        return _access(ctx, sub, its)
    return _access(ctx, ctx.tensors[ctx.pick(TENSOR_NAMES[:3])], its)


def tame(fn: str, x: ValueExpr) -> ValueExpr:
    """``x`` folded into the ``sample_range`` of function ``fn`` (where it is finite and moderate).

    A lower bound ``lo`` folds ``x`` to ``lo + abs(x)`` (``abs(x)`` for 0), an upper bound ``hi``
    clamps it with ``min(x, hi)``; a function without bounds reads ``x`` itself.
    """
    lo, hi = UNARY[fn].sample_range
    if lo > -math.inf:
        x = Unary("abs", x) if lo == 0.0 else Binary("+", Const(float(lo)), Unary("abs", x))
    if hi < math.inf:
        x = Binary("min", x, Const(float(hi)))
    return x


def _unary(ctx: _Ctx, x: ValueExpr) -> ValueExpr:
    fn = ctx.pick(ctx.unary_fns)
    if ctx.finite:
        x = tame(fn, x)
    param = ctx.pick(UNARY[fn].sample_params) if UNARY_FUNCS[fn] else None
    return Unary(fn, x, param)


def _binary(ctx: _Ctx, a: ValueExpr, b: ValueExpr) -> ValueExpr:
    op = ctx.pick(ctx.binary_ops)
    if op == "/" and ctx.finite:
        if isinstance(b, Const) or ctx.int(0, 1):
            b = Const(ctx.pick((2.0, -4.0, 0.5, 3.0)))
        else:
            b = Binary("+", Unary("abs", b), Const(ctx.pick((1.0, 2.0))))
    return Binary(op, a, b)


def _value(ctx: _Ctx, its: Sequence[Iter], depth: int, height: int) -> ValueExpr:
    """A random value tree at most ``height`` operators tall."""
    kind = ctx.int(0, 9)
    if height <= 0 or kind < 5:
        return _sub(ctx, _leaf, its, depth)
    if kind == 5 and ctx.unary_fns:
        return _unary(ctx, _sub(ctx, _value, its, depth, height - 1))
    a = _sub(ctx, _value, its, depth, height - 1)
    return _binary(ctx, a, _sub(ctx, _value, its, depth, height - 1))


# --------------------------------------------------------------------------
# Scopes and programs
# --------------------------------------------------------------------------


def _iters(
    names: Sequence[str], draws: Sequence[tuple[int, int]], budget: int
) -> tuple[tuple[Iter, ...], int]:
    out = []
    for name, (ext, lo) in zip(names, draws, strict=False):
        ext = max(1, min(ext, budget))
        budget //= ext
        out.append(Iter(name, lo, lo + ext))
    return tuple(out), budget


def _scope(ctx: _Ctx, depth: int) -> Scope:
    trav = ctx.draw(_ITER_DRAWS)
    summ = ctx.draw(_SUM_DRAWS)
    # Rotating the names keeps them distinct while nested scopes often reuse outer names.
    rot = ctx.int(0, len(ITER_NAMES) - 1)
    names = ITER_NAMES[rot:] + ITER_NAMES[:rot]
    traversal, budget = _iters(names, trav, _DOMAIN_BUDGET)
    summation, _ = _iters(names[len(traversal) :], summ, budget)
    body = _sub(ctx, _value, traversal + summation, depth, _MAX_HEIGHT)
    pad: tuple[tuple[int, int], ...] = ()
    if ctx.allow_pad and ctx.rarely(6):
        pad = tuple((ctx.int(0, 2), ctx.int(0, 2)) for _ in traversal)
        if all(p == (0, 0) for p in pad):
            pad = ()
    # Drawn only when allowed, so that the draws of every other strategy stay as they were.
    reduce = "max" if ctx.allow_max and summation and ctx.rarely(2) else "sum"
    return Scope(traversal, summation, body, pad, reduce)


@st.composite
def scopes(
    draw: st.DrawFn,
    max_depth: int = 2,
    allow_divmod: bool = True,
    allow_unary: bool = True,
    allow_nested: bool = True,
    allow_pad: bool = True,
    integer_safe: bool = False,
    finite: bool = True,
    binary_ops: Sequence[str] | None = None,
    unary_fns: Sequence[str] | None = None,
    allow_max: bool = False,
) -> Scope:
    """A random closed ``Scope``; nested scopes go ``max_depth`` levels deep."""
    ctx = _make_ctx(
        draw,
        allow_divmod=allow_divmod,
        allow_unary=allow_unary,
        allow_nested=allow_nested,
        allow_pad=allow_pad,
        integer_safe=integer_safe,
        finite=finite,
        binary_ops=binary_ops,
        unary_fns=unary_fns,
        allow_max=allow_max,
    )
    return _sub(ctx, _scope, max_depth)


@st.composite
def programs(
    draw: st.DrawFn,
    max_depth: int = 1,
    allow_divmod: bool = True,
    allow_unary: bool = True,
    allow_nested: bool = True,
    allow_pad: bool = True,
    integer_safe: bool = False,
    finite: bool = True,
    binary_ops: Sequence[str] | None = None,
    unary_fns: Sequence[str] | None = None,
    allow_max: bool = False,
) -> Program:
    """A random ``Program``: 2-3 bindings, later ones reading earlier ones, 1-2 outputs.

    The inputs are the tensors read in first-use order, sometimes followed
    by an unused input ``D``.
    """
    ctx = _make_ctx(
        draw,
        allow_divmod=allow_divmod,
        allow_unary=allow_unary,
        allow_nested=allow_nested,
        allow_pad=allow_pad,
        integer_safe=integer_safe,
        finite=finite,
        binary_ops=binary_ops,
        unary_fns=unary_fns,
        allow_max=allow_max,
    )
    bindings: list[tuple[str, Scope]] = []
    for name in BINDING_NAMES[: ctx.int(2, 3)]:
        s = _sub(ctx, _scope, max_depth)
        # A later binding equal to a scope nested in an earlier one makes an invalid program.
        assume(all(s not in scopes_in(prev) for _, prev in bindings))
        bindings.append((name, s))
        ctx.bound.append(s)
    names = [n for n, _ in bindings]
    outputs = [names[-1]]
    if ctx.int(0, 1):
        outputs.insert(ctx.int(0, 1), ctx.pick(names[:-1]))
    inputs: dict[Tensor, None] = {}
    for _, s in bindings:
        for t in tensors_in(s):
            inputs.setdefault(t)
    if ctx.rarely(4):
        inputs.setdefault(ctx.tensors[TENSOR_NAMES[3]])
    return Program(tuple(inputs), tuple(bindings), tuple(outputs))


def random_inputs(
    node: Scope | Program, rng: np.random.Generator, integer: bool = False
) -> dict[str, np.ndarray]:
    """A float64 array for every input tensor of ``node``.

    Normal values, or with ``integer=True`` small integers in ``[-3, 3]``
    (still float64), so integer-safe expressions evaluate exactly.
    """
    tensors = input_tensors(node)
    out: dict[str, np.ndarray] = {}
    for t in tensors:
        if integer:
            out[t.name] = rng.integers(-3, 4, size=t.shape).astype(np.float64)
        else:
            out[t.name] = rng.standard_normal(t.shape)
    return out

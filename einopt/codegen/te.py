"""Lowering of einopt expressions to TVM tensor expressions (TE).

Every scope becomes one ``te.compute`` stage, computed once and materialised:

* the stage has shape ``scope.shape``; the compute variable ``p`` of a
  traversal iterator ``x`` stands for the traversal value ``x.lo + p``;
* summation iterators become ``te.reduce_axis`` over ``[0, extent)`` shifted
  by ``lo``, and the body is wrapped in the scope's reducer (``_REDUCERS``:
  ``te.sum``, or a maximum whose identity is ``-inf``);
* reading a scope at traversal value ``v`` reads array position ``v - lo``.

Reads outside a tensor's (or scope's) valid range yield 0, as in the reference
interpreter. An access is guarded with ``if_then_else`` only on the sides of
the dimensions where ``einopt.core.index.bounds`` cannot prove the index in range,
so provably safe accesses compile to plain loads. A scope with ``pad`` that
some other scope reads is materialised padded with zeros: reads that stay in
the padded region need no guard.

Each guard on the innermost traversal iterator is recorded, so that the
schedule can split off the guard-free interior of that loop and vectorise it
(TVM scalarises a vector loop whose ``if_then_else`` condition varies by lane).

Index ``//`` and ``%`` in buffer positions are written ``(... | 0)`` to work
around a TVM 0.27 miscompilation (see ``_BodyLowerer.index``).

This module imports TVM; ``einopt.codegen`` imports it only when compiling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tvm import te, tirx
from tvm.tirx import expr as tirx_expr

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
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    input_tensors,
    scopes_in,
)
from einopt.core.ops import BINARY, TVM_DTYPE, UNARY, tvm_opaque
from einopt.core.rewrite import accesses

__all__ = ["StageInfo", "Output", "Lowered", "lower"]

DTYPE = TVM_DTYPE


@dataclasses.dataclass(frozen=True)
class StageInfo:
    """What a schedule needs to know about one stage (one TE compute, one block).

    ``interior`` is the range ``[a, b)`` of positions of the innermost spatial
    axis where no guard depends on that axis, or ``None`` when a guard depends
    on it in a way the analysis cannot bound (e.g. through ``//`` or ``%``).
    """

    name: str
    shape: tuple[int, ...]
    reduce_extents: tuple[int, ...]
    interior: tuple[int, int] | None


@dataclasses.dataclass(frozen=True)
class Output:
    """One result buffer: its name (``None`` for a lone scope) and, if it is
    materialised with padding, the slices that cut the computed range out."""

    name: str | None
    scope: Scope
    buffer_shape: tuple[int, ...]
    view: tuple[slice, ...] | None


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A lowered expression: the prim func and how to call it.

    Parameters of ``func`` are ``inputs`` (sorted by name) followed by the
    distinct output buffers in ``outputs`` order. ``func`` lacks the stages
    that nothing reads in the end (``te.create_prim_func`` drops them).
    """

    func: tirx.PrimFunc
    inputs: tuple[Tensor, ...]
    outputs: tuple[Output, ...]
    stages: tuple[StageInfo, ...]


# --------------------------------------------------------------------------
# Tables: index operators
# --------------------------------------------------------------------------

_INDEX_BINARY: dict[type, Callable] = {
    IAdd: lambda a, b: a + b,
    ISub: lambda a, b: a - b,
    IMul: lambda a, b: a * b,
}

_INDEX_DIVMOD: dict[type, Callable] = {
    IFloorDiv: tirx.floordiv,  # floor semantics, like Python's //
    IMod: tirx.floormod,  # result in [0, k)
}

# The value operators' and unary functions' TVM forms are rows of einopt.core.ops.


def _f32(v: float) -> tirx.PrimExpr:
    return tirx.const(v, DTYPE)


# How each kind of scope (``Scope.reduce``) reduces its body. The maximum starts from -inf (TVM's
# ``te.max`` starts from the dtype's lowest finite value, which an all ``-inf`` window would return).
_REDUCERS: dict[str, Callable] = {
    "sum": te.sum,
    "max": te.comm_reducer(
        lambda a, b: tirx.max(a, b), lambda dtype: tirx.const(float("-inf"), dtype), "max"
    ),
}


# --------------------------------------------------------------------------
# Lowering
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Guard:
    """An index checked at run time against ``[lo, hi)`` on the sides marked."""

    index: IndexExpr
    lo: int
    hi: int
    check_lo: bool
    check_hi: bool


@dataclasses.dataclass(frozen=True)
class _Buffer:
    """A materialised scope: array position 0 holds traversal value ``origin``;
    reads in ``[origin, origin + shape)`` need no guard (padding holds zeros)."""

    tensor: te.Tensor
    origin: tuple[int, ...]
    shape: tuple[int, ...]


def lower(node: Scope | Program) -> Lowered:
    """Lower a scope or a program to a TVM prim func with one stage per scope.

    Parameters
    ----------
    node : Scope or Program
        The expression. A scope's result is its one output; a program's
        outputs are its named outputs.

    Returns
    -------
    Lowered
        The prim func (unscheduled), its parameter order and per-stage facts
        for the schedule.
    """
    return _Lowerer(node).run()


class _Lowerer:
    def __init__(self, node: Scope | Program) -> None:
        if isinstance(node, Program):
            roots = [node.scope(n) for n in node.outputs]
            names = node.names()
        elif isinstance(node, Scope):
            roots = [node]
            names = {}
        else:
            raise IRError(f"can only compile a Scope or a Program, got {type(node).__name__}")
        # Tensor names are unique: Scope and Program refuse two tensors under one name.
        tensors = input_tensors(node)
        self.node = node
        self.inputs = tuple(sorted(tensors, key=lambda t: t.name))
        self.roots = roots
        self.placeholders = {t: te.placeholder(t.shape, t.dtype, name=t.name) for t in self.inputs}
        # Producers before consumers; bindings no output depends on are left out.
        self.scopes = list(dict.fromkeys(s for root in roots for s in scopes_in(root)))
        # Only a scope that another scope reads needs its padding materialised.
        self.read: set[Scope] = set()
        for s in self.scopes:
            self.read.update(a.source for a in accesses(s.body) if isinstance(a.source, Scope))
        self.taken = {t.name for t in self.inputs}
        self.stage_names = {s: self._fresh(names.get(s, f"s{i}")) for i, s in enumerate(self.scopes)}
        self.buffers: dict[Scope, _Buffer] = {}
        self.stages: list[StageInfo] = []

    def _fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def run(self) -> Lowered:
        for s in self.scopes:  # producers before consumers
            self.buffers[s] = self._stage(s, self.stage_names[s], padded=bool(s.pad) and s in self.read)
        outputs: list[Output] = []
        params: list[te.Tensor] = [self.placeholders[t] for t in self.inputs]
        seen: set[Scope] = set()
        out_names = self.node.outputs if isinstance(self.node, Program) else (None,)
        for name, s in zip(out_names, self.roots, strict=True):
            buf = self.buffers[s]
            view = None
            if buf.shape != s.shape:
                view = tuple(
                    slice(it.lo - o, it.hi - o) for it, o in zip(s.traversal, buf.origin, strict=True)
                )
            outputs.append(Output(name, s, buf.shape, view))
            if s not in seen:
                seen.add(s)
                params.append(buf.tensor)
        func = te.create_prim_func(params)
        return Lowered(func, self.inputs, tuple(outputs), tuple(self.stages))

    # -- stages -------------------------------------------------------------

    def _stage(self, s: Scope, name: str, padded: bool) -> _Buffer:
        if not padded:
            tensor, guards = self._compute(s, name, origin=s.origin, shape=s.shape, pad_guard=False)
            self._record(name, s, s.shape, s.origin, guards)
            return _Buffer(tensor, s.origin, s.shape)
        origin = tuple(it.lo - b for it, (b, _) in zip(s.traversal, s.pad, strict=True))
        shape = tuple(n + b + a for n, (b, a) in zip(s.shape, s.pad, strict=True))
        if not s.summation:
            # One stage: the body where it is defined, zeros in the padding.
            tensor, guards = self._compute(s, name, origin=origin, shape=shape, pad_guard=True)
            self._record(name, s, shape, origin, guards)
            return _Buffer(tensor, origin, shape)
        # A reduction cannot sit under a condition: compute, then copy into the padded buffer.
        body_name = self._fresh(f"{name}_body")
        inner, guards = self._compute(s, body_name, origin=s.origin, shape=s.shape, pad_guard=False)
        self._record(body_name, s, s.shape, s.origin, guards)
        zero = _f32(0.0)
        pads = s.pad

        def copy(*p: tirx.PrimExpr) -> tirx.PrimExpr:
            src = inner[tuple(pi - b if b else pi for pi, (b, _) in zip(p, pads, strict=True))]
            conds = _pad_conditions(s, p, origin)
            return tirx.if_then_else(tirx.all(*conds), src, zero) if conds else src

        tensor = te.compute(shape, copy, name=name, varargs_names=[it.name for it in s.traversal])
        x, (b, a) = s.traversal[-1], pads[-1]
        interior = (b, b + x.extent) if (b or a) else (0, shape[-1])
        self.stages.append(StageInfo(name, shape, (), interior))
        return _Buffer(tensor, origin, shape)

    def _record(self, name: str, s: Scope, shape, origin, guards: list[_Guard]) -> None:
        x = s.traversal[-1]
        interior = _interior(guards, x, origin[-1], shape[-1])
        if interior is not None and s.pad and shape != s.shape:
            b = x.lo - origin[-1]
            interior = (max(interior[0], b), min(interior[1], b + x.extent))
            if interior[0] >= interior[1]:
                interior = (0, 0)
        self.stages.append(StageInfo(name, shape, tuple(it.extent for it in s.summation), interior))

    def _compute(
        self, s: Scope, name: str, origin: tuple[int, ...], shape: tuple[int, ...], pad_guard: bool
    ) -> tuple[te.Tensor, list[_Guard]]:
        guards: list[_Guard] = []

        def fcompute(*p: tirx.PrimExpr) -> tirx.PrimExpr:
            env: dict[Iter, tirx.PrimExpr] = {}
            for it, pi, o in zip(s.traversal, p, origin, strict=True):
                env[it] = pi + o if o else pi
            axes = []
            for it in s.summation:
                ax = te.reduce_axis((0, it.extent), name=it.name)
                axes.append(ax)
                env[it] = ax.var + it.lo if it.lo else ax.var
            body = _BodyLowerer(self, env, guards).value(s.body)
            if axes:
                return _REDUCERS[s.reduce](body, axis=axes)
            conds = _pad_conditions(s, p, origin) if pad_guard else []
            if conds:
                return tirx.if_then_else(tirx.all(*conds), body, _f32(0.0))
            return body

        tensor = te.compute(shape, fcompute, name=name, varargs_names=[it.name for it in s.traversal])
        return tensor, guards


def _pad_conditions(s: Scope, p, origin) -> list[tirx.PrimExpr]:
    """Position conditions selecting the computed range of a padded buffer."""
    conds = []
    for it, pi, o, (b, a) in zip(s.traversal, p, origin, s.pad, strict=True):
        if b:
            conds.append(pi >= it.lo - o)
        if a:
            conds.append(pi < it.hi - o)
    return conds


_LEAVES = (tirx_expr.Var, tirx_expr.FloatImm, tirx_expr.IntImm)
_REREAD = frozenset({"max", "min"})
"""Binary operators whose TVM form reads an operand more than once (NaN kept: ``ops._tvm_nan_first``)."""


def _bound(x: tirx.PrimExpr, form: Callable[[tirx.PrimExpr], tirx.PrimExpr]) -> tirx.PrimExpr:
    """``form(x)`` with ``x`` computed once: a function's TVM form reads its argument several times
    (ReLU's NaN test, value and maximum), and code generation would compute each read again (LLVM
    does not merge the branches of guarded loads: a phase interleave with its ReLU on [128, 16, 16]
    took 134 us, 19 us with the argument bound once)."""
    if isinstance(x, _LEAVES):
        return form(x)
    v = tirx.Var("v", TVM_DTYPE)
    return tirx.Let(v, x, form(v))


class _BodyLowerer:
    """Lowers one scope body under an environment mapping iterators to TIR values."""

    def __init__(self, lowerer: _Lowerer, env: dict[Iter, tirx.PrimExpr], guards: list[_Guard]) -> None:
        self.lowerer = lowerer
        self.env = env
        self.guards = guards
        self.memo: dict[ValueExpr, tirx.PrimExpr] = {}

    def index(self, e: IndexExpr, opaque: bool = False) -> tirx.PrimExpr:
        """Lower an index; ``opaque`` writes each ``//`` and ``%`` as ``(... | 0)``.

        Buffer positions need ``opaque``: TVM 0.27's FlattenBuffer simplifies
        every buffer index with its iterator-map analysis, which miscompiles
        floordiv/floormod of sums with negative coefficients or offsets
        (``(1 - i) % 2`` becomes ``-(i % -2)``; ``((i + 2) // 3 + j + 1) % 3``
        loses its ``+ 1``). That analysis gives up on a bitwise or, which the
        simplifier keeps and LLVM removes. (A ``Let`` also hides the index,
        but loop partitioning copies it and the simplifier then fails on the
        variable bound twice.) Conditions stay plain, so that the simplifier
        can prove them in the guard-free interior of a loop.
        """
        if isinstance(e, Iter):
            return self.env[e]
        if isinstance(e, IConst):
            return tirx.const(e.value, "int32")
        if type(e) in _INDEX_BINARY:
            return _INDEX_BINARY[type(e)](self.index(e.a, opaque), self.index(e.b, opaque))
        if type(e) in _INDEX_DIVMOD:
            value = _INDEX_DIVMOD[type(e)](self.index(e.a, opaque), e.k)
            return tirx.bitwise_or(value, tirx.const(0, "int32")) if opaque else value
        raise IRError(f"cannot lower index expression {e!r}")

    def value(self, e: ValueExpr) -> tirx.PrimExpr:
        out = self.memo.get(e)
        if out is None:
            out = self.memo[e] = self._value(e)
        return out

    def _value(self, e: ValueExpr) -> tirx.PrimExpr:
        if isinstance(e, Const):
            return _f32(e.value)
        if isinstance(e, Access):
            return self.access(e)
        if isinstance(e, Binary):
            # Each operand opaque, so that TVM computes in floating point what it would fold as exact.
            a, b = tvm_opaque(tirx, self.value(e.a), 0), tvm_opaque(tirx, self.value(e.b), 1)
            if e.op in _REREAD:
                return _bound(a, lambda a: _bound(b, lambda b: BINARY[e.op].tvm(tirx, a, b)))
            return BINARY[e.op].tvm(tirx, a, b)
        if isinstance(e, Unary):
            return _bound(self.value(e.x), lambda x: UNARY[e.fn].tvm(tirx, x, e.param))
        raise IRError(f"cannot lower value expression {e!r}")

    def access(self, e: Access) -> tirx.PrimExpr:
        src = e.source
        if isinstance(src, Tensor):
            tensor = self.lowerer.placeholders[src]
            origin, shape = src.origin, src.shape
        else:
            buf = self.lowerer.buffers[src]
            tensor, origin, shape = buf.tensor, buf.origin, buf.shape
        conds: list[tirx.PrimExpr] = []
        positions: list[tirx.PrimExpr] = []
        for ix, o, n in zip(e.indices, origin, shape, strict=True):
            lo, hi = o, o + n
            mn, mx = bounds(ix)
            if mx < lo or mn >= hi:
                return _f32(0.0)  # always outside: the read is the constant 0
            if mn < lo:
                conds.append(self.index(ix) >= lo)
            if mx >= hi:
                conds.append(self.index(ix) < hi)
            if mn < lo or mx >= hi:
                self.guards.append(_Guard(ix, lo, hi, mn < lo, mx >= hi))
            v = self.index(ix, opaque=True)
            positions.append(v - o if o else v)
        load = tensor[tuple(positions)]
        if tensor.dtype != DTYPE:
            load = load.astype(DTYPE)
        if conds:
            # if_then_else evaluates lazily, so the load never leaves the buffer.
            return tirx.if_then_else(tirx.all(*conds), load, _f32(0.0))
        return load


def _interior(guards: list[_Guard], x: Iter, origin: int, n: int) -> tuple[int, int] | None:
    """Positions ``[a, b)`` of the axis of ``x`` where every guard that depends on ``x`` holds.

    For a guard on ``c*x + rest`` (``rest`` free of ``x``), the guard holds for
    every value of the other iterators when ``c*x + min(rest) >= lo`` and
    ``c*x + max(rest) < hi``. ``None`` if ``x`` occurs inside ``//``, ``%`` or
    a product, where this bound does not apply.
    """
    a, b = x.lo, x.hi
    for g in guards:
        lf = linear_form(g.index)
        if any(x in atom.iters() for atom, _ in lf.atoms):
            return None
        c = lf.coeff(x)
        if c == 0:
            continue
        rmin, rmax = bounds(g.index, {x: (0, 1)})
        if g.check_lo:  # c*x + rmin >= g.lo
            if c > 0:
                a = max(a, -((rmin - g.lo) // c))
            else:
                b = min(b, (g.lo - rmin) // c + 1)
        if g.check_hi:  # c*x + rmax <= g.hi - 1
            if c > 0:
                b = min(b, (g.hi - 1 - rmax) // c + 1)
            else:
                a = max(a, -((rmax - g.hi + 1) // c))
    a, b = max(a - origin, 0), min(b - origin, n)
    return (a, b) if a < b else (0, 0)

"""Python API for writing expressions by operator overloading.

    >>> from einopt import tensor, iters, L, Sum  # and Max, for a maximum over iterators
    >>> h, w, f, r, s, c = iters("h:56 w:56 f:64 r:3 s:3 c:64")
    >>> A, K = tensor("A", (56, 56, 64)), tensor("K", (3, 3, 64, 64))
    >>> conv = L(h, w, f)(Sum(r, s, c)(A[h + r - 1, w + s - 1, c] * K[r, s, f, c]))

Building is lazy: nothing is computed until the expression is evaluated,
compiled or exported. Python numbers become constants; ``==`` is never
overloaded (it is identity, since nodes are interned).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from einopt.core import ops
from einopt.core.ir import (
    Binary,
    IRError,
    Iter,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    ValueLike,
    as_value,
    scopes_in,
    tensors_in,
)


def tensor(name: str, shape: Sequence[int], dtype: str = "float32") -> Tensor:
    """An input tensor; index it with iterators to read it: ``A[i, j + 1]``."""
    return Tensor(name, tuple(int(n) for n in shape), dtype)


_ITER_SPEC = re.compile(r"^([A-Za-z_]\w*)(?:=(-?\d+))?:(-?\d+)$")


def iters(spec: str) -> tuple[Iter, ...]:
    """Iterators from a spec such as ``"h:56 w:56 t=-1:57"`` (``i:n`` means ``i=0:n``)."""
    out = []
    for word in spec.replace(",", " ").split():
        m = _ITER_SPEC.match(word)
        if not m:
            raise IRError(f"bad iterator spec {word!r}: expected NAME:HI or NAME=LO:HI")
        name, lo, hi = m.group(1), int(m.group(2) or 0), int(m.group(3))
        out.append(Iter(name, lo, hi))
    return tuple(out)


class _Summed:
    """``Sum(r, s)(body)`` or ``Max(r, s)(body)``: a body with a pending reduction, waiting for ``L(...)``."""

    __slots__ = ("summation", "body", "reduce")

    def __init__(self, summation: tuple[Iter, ...], body: ValueExpr, reduce: str = "sum") -> None:
        self.summation = summation
        self.body = body
        self.reduce = reduce


class Sum:
    """Summation iterators: ``Sum(r, s, c)(body)``, to be wrapped by ``L(...)``."""

    __slots__ = ("its",)
    reduce = "sum"

    def __init__(self, *its: Iter) -> None:
        self.its = its

    def __call__(self, body: ValueLike) -> _Summed:
        return _Summed(self.its, as_value(body), self.reduce)


class Max(Sum):
    """Iterators to take the maximum over: ``L(i)(Max(j)(X[i, j]))`` is ``L[i] Max[j] X[i, j]``."""

    __slots__ = ()
    reduce = "max"


class L:
    """Traversal iterators (the output layout): ``L(h, w, f)(body)`` is a ``Scope``.

    ``pad`` optionally gives ``(before, after)`` zero padding of the
    materialised result per traversal dimension.
    """

    __slots__ = ("its", "pad")

    def __init__(self, *its: Iter, pad: Sequence[tuple[int, int]] = ()) -> None:
        self.its = its
        self.pad = tuple((int(a), int(b)) for a, b in pad)

    def __call__(self, body: ValueLike | _Summed) -> Scope:
        if isinstance(body, _Summed):
            return Scope(self.its, body.summation, body.body, self.pad, body.reduce)
        return Scope(self.its, (), as_value(body), self.pad)


def program(
    outputs: Mapping[str, Scope],
    intermediates: Mapping[str, Scope] | None = None,
    inputs: Sequence[Tensor] | None = None,
) -> Program:
    """A program with named outputs; ``intermediates`` names shared scopes.

    Bindings are ordered producers first. ``inputs`` defaults to every
    tensor read, in first-use order.
    """
    named: dict[Scope, str] = {}
    for name, s in {**(intermediates or {}), **outputs}.items():
        if s in named:
            raise IRError(f"scope bound to both {named[s]} and {name}")
        named[s] = name
    order: list[tuple[str, Scope]] = []
    placed: set[Scope] = set()
    for s in named:
        for sub in scopes_in(s):
            if sub in named and sub not in placed:
                placed.add(sub)
                order.append((named[sub], sub))
    if inputs is None:
        seen: dict[Tensor, None] = {}
        for _, s in order:
            for t in tensors_in(s):
                seen.setdefault(t)
        inputs = list(seen)
    return Program(tuple(inputs), tuple(order), tuple(outputs))


def _unary(op: ops.UnaryOp) -> Callable[..., ValueExpr]:
    """The constructor ``f(x)``, or ``f(x, <param>)`` for a function with a constant parameter."""
    if op.param is None:

        def make(x: ValueLike) -> ValueExpr:
            return Unary(op.name, as_value(x))

        make.__doc__ = f"Element-wise ``{op.name}(x)``."
    else:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        signature = inspect.Signature(
            [inspect.Parameter("x", kind), inspect.Parameter(op.param, kind, annotation=float)],
            return_annotation=ValueExpr,
        )

        def make(*args: Any, **kwargs: Any) -> ValueExpr:
            x, param = signature.bind(*args, **kwargs).arguments.values()
            return Unary(op.name, as_value(x), float(param))

        make.__signature__ = signature  # type: ignore[attr-defined]
        make.__doc__ = f"Element-wise ``{op.name}(x, {op.param})`` with a constant {op.param}."
    make.__name__ = make.__qualname__ = op.api
    return make


def _binary(op: ops.BinaryOp) -> Callable[[ValueLike, ValueLike], ValueExpr]:
    """The constructor ``f(a, b)`` of an operator written as a call."""

    def make(a: ValueLike, b: ValueLike) -> ValueExpr:
        return Binary(op.name, as_value(a), as_value(b))

    make.__name__ = make.__qualname__ = str(op.api)
    make.__doc__ = f"Element-wise {op.title} ``{op.name}(a, b)``."
    return make


FUNCTIONS: dict[str, Callable[..., ValueExpr]] = {
    **{op.api: _unary(op) for op in ops.UNARY.values()},
    **{op.api: _binary(op) for op in ops.BINARY.values() if op.api is not None},
}
"""The element-wise constructors by name (``relu``, ``absolute``, ``leaky_relu``, ``maximum``,
...), one per row of :mod:`einopt.core.ops`; each is also an attribute of this module and of
``einopt``. The infix operators are Python's: ``a + b``, ``-a``."""

globals().update(FUNCTIONS)

__all__ = ["tensor", "iters", "L", "Sum", "program", "FUNCTIONS", *FUNCTIONS]

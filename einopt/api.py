"""Python API for writing expressions by operator overloading.

    >>> from einopt import tensor, iters, L, Sum
    >>> h, w, f, r, s, c = iters("h:56 w:56 f:64 r:3 s:3 c:64")
    >>> A, K = tensor("A", (56, 56, 64)), tensor("K", (3, 3, 64, 64))
    >>> conv = L(h, w, f)(Sum(r, s, c)(A[h + r - 1, w + s - 1, c] * K[r, s, f, c]))

Building is lazy: nothing is computed until the expression is evaluated,
compiled or exported. Python numbers become constants; ``==`` is never
overloaded (it is identity, since nodes are interned).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

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

__all__ = [
    "tensor",
    "iters",
    "L",
    "Sum",
    "program",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "neg",
    "absolute",
    "sqrt",
    "leaky_relu",
    "maximum",
    "minimum",
]


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
    """``Sum(r, s)(body)``: a body with pending summation, waiting for ``L(...)``."""

    __slots__ = ("summation", "body")

    def __init__(self, summation: tuple[Iter, ...], body: ValueExpr) -> None:
        self.summation = summation
        self.body = body


class Sum:
    """Summation iterators: ``Sum(r, s, c)(body)``, to be wrapped by ``L(...)``."""

    __slots__ = ("its",)

    def __init__(self, *its: Iter) -> None:
        self.its = its

    def __call__(self, body: ValueLike) -> _Summed:
        return _Summed(self.its, as_value(body))


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
            return Scope(self.its, body.summation, body.body, self.pad)
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


def _unary(fn: str):
    def f(x: ValueLike) -> ValueExpr:
        return Unary(fn, as_value(x))

    f.__name__ = fn
    f.__doc__ = f"Element-wise {fn}."
    return f


relu = _unary("relu")
sigmoid = _unary("sigmoid")
tanh = _unary("tanh")
exp = _unary("exp")
neg = _unary("neg")
absolute = _unary("abs")
sqrt = _unary("sqrt")


def leaky_relu(x: ValueLike, slope: float) -> ValueExpr:
    """``x if x > 0 else slope * x`` with a constant slope."""
    return Unary("leaky_relu", as_value(x), float(slope))


def maximum(a: ValueLike, b: ValueLike) -> ValueExpr:
    return Binary("max", as_value(a), as_value(b))


def minimum(a: ValueLike, b: ValueLike) -> ValueExpr:
    return Binary("min", as_value(a), as_value(b))

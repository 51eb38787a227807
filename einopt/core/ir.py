"""The tensor-algebra IR: immutable, interned expression nodes.

An expression is written ``L_x Sum_y f(T[tau(x, y)])`` (method.md section 2).
Every node is a frozen dataclass interned on construction, so two equal nodes
are the same object: ``is`` is structural equality, and nodes can key caches.
Constructors validate but never simplify; ``einopt.core.index.simplify`` and the
derivation rules are the only places that rewrite.

Semantics (the reference interpreter ``einopt.core.interp`` is the specification):

* An iterator ``Iter(name, lo, hi)`` ranges over ``lo <= i < hi``.
* A ``Scope`` is ``L[traversal] Sum[summation] body``. It is a *closed* term:
  its body only uses its own iterators. Its result is a tensor indexed by the
  *values* of its traversal iterators, so ``S[i]`` reads the element computed
  at traversal value ``i`` (ranges may start below zero).
* A scope reduces its body over its summation iterators by its ``reduce``
  (:data:`REDUCTIONS`): ``"sum"`` (the default, ``Sum``) adds, ``"max"``
  (``L[traversal] Max[summation] body``) takes the maximum. A max scope has at
  least one reduction iterator: the maximum over none is the body itself, which
  the IR writes one way only, as a scope without reduction.
* Reading any tensor or scope outside its range yields 0. So the maximum over a
  window that leaves a tensor's range includes those zeros: it is not a
  max-pooling with ``-inf`` padding.
* The order of summation iterators is irrelevant; the order of traversal
  iterators is the output layout.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any, ClassVar, Union

from einopt.core import ops

__all__ = [
    "Node",
    "IndexExpr",
    "Iter",
    "IConst",
    "IAdd",
    "ISub",
    "IMul",
    "IFloorDiv",
    "IMod",
    "ValueExpr",
    "Const",
    "Access",
    "Binary",
    "Unary",
    "Tensor",
    "Scope",
    "Program",
    "IRError",
    "BINARY_OPS",
    "UNARY_FUNCS",
    "DTYPES",
    "REDUCTIONS",
    "RESERVED_NAMES",
    "as_index",
    "as_value",
    "scopes_in",
    "tensors_in",
    "input_tensors",
    "set_formatter",
    "children",
    "walk",
    "rebuild",
]


class IRError(ValueError):
    """An expression is malformed (wrong rank, free iterator, bad range, ...)."""


# --------------------------------------------------------------------------
# Interning
# --------------------------------------------------------------------------


class _InternMeta(type):
    """Construct, validate, then return the canonical instance.

    The intern key is the node's class and field values; child nodes are
    themselves interned, so they compare by identity and the key is cheap.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        table = Node._table
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        if not kwargs and len(args) == len(names):
            # Fast path: an equal node exists already, so it was validated already.
            try:
                found = table.get(cls._key_of(args))
            except TypeError:  # unhashable argument: let validation explain
                found = None
            if found is not None:
                return found
        node = super().__call__(*args, **kwargs)
        key = cls._key_of(tuple(getattr(node, n) for n in names))
        found = table.get(key)
        if found is not None:
            return found
        table[key] = node
        return node


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False, weakref_slot=True)
class Node(metaclass=_InternMeta):
    """Base of every IR node: immutable, interned, compared by identity."""

    _table: ClassVar[weakref.WeakValueDictionary] = weakref.WeakValueDictionary()
    # Derived facts (free iterators, linear forms, keys, ...): see ``_cached``.
    _memo: dict | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def _key_of(cls, values: tuple) -> tuple:
        return (cls, *values)

    def replace(self, **changes: Any) -> Node:
        """Return a node with some fields changed (``self`` if none change)."""
        if all(getattr(self, k) is v for k, v in changes.items()):
            return self
        names = _FIELD_NAMES.get(type(self))
        if names is None or any(k not in names for k in changes):
            return dataclasses.replace(self, **changes)
        # Positional: the interning fast path finds an equal node without validating it again.
        return type(self)(*(changes[n] if n in changes else getattr(self, n) for n in names))

    def __reduce__(self) -> tuple:
        return (type(self), tuple(getattr(self, n) for n in _FIELD_NAMES[type(self)]))

    def __copy__(self) -> Node:
        return self

    def __deepcopy__(self, memo: dict) -> Node:
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"

    def __str__(self) -> str:
        # Memoised: matchers put node text in every failure reason, and the search asks thousands.
        formatter = _formatter
        if formatter is not None:
            try:
                return _cached(self, "str", lambda: formatter(self))
            except Exception:  # noqa: BLE001 - printing must never fail, even mid-development
                pass
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in _FIELD_NAMES.get(type(self), ()))
        return f"{type(self).__name__}({fields})"


# How ``str()`` prints a node. The IR does not depend on its text syntax: the syntax
# (einopt.core.syntax, which imports this module) installs its printer here when it is
# imported, and ``import einopt`` imports it. Until then nodes print their fields.
_formatter: Callable[[Node], str] | None = None


def set_formatter(formatter: Callable[[Node], str]) -> None:
    """Make ``str(node)`` print with ``formatter`` (the text syntax's ``format_node``).

    Parameters
    ----------
    formatter : callable
        Returns the text of any node.
    """
    global _formatter
    _formatter = formatter


def _cached(node: Node, name: Hashable, compute) -> Any:
    """Per-node memo for derived facts (nodes are immutable, so it never goes stale)."""
    memo = node._memo
    if memo is None:
        memo = {}
        object.__setattr__(node, "_memo", memo)
    elif name in memo:
        return memo[name]
    value = memo[name] = compute()
    return value


# --------------------------------------------------------------------------
# Index expressions
# --------------------------------------------------------------------------

IndexLike = Union["IndexExpr", int]


def as_index(x: IndexLike) -> IndexExpr:
    """Coerce an int to ``IConst``; pass index expressions through."""
    if isinstance(x, IndexExpr):
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        raise IRError(f"index expressions are built from iterators and integers, got {x!r}")
    return IConst(x)


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class IndexExpr(Node):
    """An integer expression of iterators: ``+ - *``, ``//`` and ``%`` by constants."""

    def __add__(self, other: IndexLike) -> IndexExpr:
        return IAdd(self, as_index(other))

    def __radd__(self, other: IndexLike) -> IndexExpr:
        return IAdd(as_index(other), self)

    def __sub__(self, other: IndexLike) -> IndexExpr:
        return ISub(self, as_index(other))

    def __rsub__(self, other: IndexLike) -> IndexExpr:
        return ISub(as_index(other), self)

    def __mul__(self, other: IndexLike) -> IndexExpr:
        return IMul(self, as_index(other))

    def __rmul__(self, other: IndexLike) -> IndexExpr:
        return IMul(as_index(other), self)

    def __neg__(self) -> IndexExpr:
        return IMul(IConst(-1), self)

    def __floordiv__(self, k: int) -> IndexExpr:
        return IFloorDiv(self, k)

    def __mod__(self, k: int) -> IndexExpr:
        return IMod(self, k)

    def iters(self) -> frozenset[Iter]:
        """The iterators this expression reads."""
        return _cached(self, "iters", lambda: _free_iters(self))


def _free_iters(root: Node) -> frozenset[Iter]:
    """Iterators read by an index or value expression (iterative: bodies can be long chains)."""
    out: set[Iter] = set()
    stack: list[Node] = [root]
    while stack:
        e = stack.pop()
        memo = e._memo
        if memo is not None and "iters" in memo:
            out |= memo["iters"]
        elif isinstance(e, Iter):
            out.add(e)
        else:
            stack.extend(children(e))
    return frozenset(out)


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Iter(IndexExpr):
    """An iterator ``name`` over the half-open range ``[lo, hi)``."""

    name: str
    lo: int
    hi: int

    def __post_init__(self) -> None:
        _check_name(self.name, "iterator")
        for bound in (self.lo, self.hi):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise IRError(f"iterator {self.name}: bounds must be integers, got {bound!r}")
        if self.hi <= self.lo:
            raise IRError(f"iterator {self.name}: empty range [{self.lo}, {self.hi})")

    @property
    def extent(self) -> int:
        return self.hi - self.lo


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class IConst(IndexExpr):
    value: int

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise IRError(f"index constant must be an integer, got {self.value!r}")


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class IAdd(IndexExpr):
    a: IndexExpr
    b: IndexExpr

    def __post_init__(self) -> None:
        _check_index_operands(self, self.a, self.b)


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class ISub(IndexExpr):
    a: IndexExpr
    b: IndexExpr

    def __post_init__(self) -> None:
        _check_index_operands(self, self.a, self.b)


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class IMul(IndexExpr):
    a: IndexExpr
    b: IndexExpr

    def __post_init__(self) -> None:
        _check_index_operands(self, self.a, self.b)


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class IFloorDiv(IndexExpr):
    """Floor division by a positive constant ``k``."""

    a: IndexExpr
    k: int

    def __post_init__(self) -> None:
        _check_index_operands(self, self.a)
        _check_divisor(self.k, "//")


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class IMod(IndexExpr):
    """Modulo by a positive constant ``k`` (result in ``[0, k)``)."""

    a: IndexExpr
    k: int

    def __post_init__(self) -> None:
        _check_index_operands(self, self.a)
        _check_divisor(self.k, "%")


def _check_index_operands(node: Node, *operands: Any) -> None:
    for x in operands:
        if not isinstance(x, IndexExpr):
            raise IRError(f"{type(node).__name__}: operand must be an index expression, got {x!r}")


def _check_divisor(k: Any, op: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise IRError(f"'{op}' needs a positive integer constant, got {k!r}")


# --------------------------------------------------------------------------
# Value expressions
# --------------------------------------------------------------------------

ValueLike = Union["ValueExpr", float, int]

# The element-wise operations are rows of einopt.core.ops; these views serve validation and syntax.
BINARY_OPS: tuple[str, ...] = tuple(ops.BINARY)
COMMUTATIVE_OPS: frozenset[str] = frozenset(op.name for op in ops.BINARY.values() if op.commutative)

# Unary functions usable in fused eOperators; ``True`` marks a function that
# takes one float parameter (leaky_relu's slope).
UNARY_FUNCS: dict[str, bool] = {op.name: op.param is not None for op in ops.UNARY.values()}

DTYPES: tuple[str, ...] = ("float32", "float64", "float16", "int32", "int64")

REDUCTIONS: dict[str, str] = {"sum": "Sum", "max": "Max"}
"""How a scope reduces its body over its summation iterators: each kind and its text-syntax keyword.
The interpreter, the keys, codegen and eOperators each read the kind from their own table."""

# Words of the text syntax; no tensor, iterator or binding may be called so.
RESERVED_NAMES: frozenset[str] = frozenset(
    {"L", *REDUCTIONS.values(), "where", "return", "inf", "nan", *UNARY_FUNCS}
    | {op.name for op in ops.BINARY.values() if not op.infix}
)


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise IRError(f"{what} name must be an identifier, got {name!r}")
    if name in RESERVED_NAMES:
        raise IRError(f"{what} name {name!r} is a reserved word of the text syntax")


def as_value(x: ValueLike) -> ValueExpr:
    """Coerce a Python number to ``Const``; pass value expressions through."""
    if isinstance(x, ValueExpr):
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise IRError(f"value expressions are built from accesses and numbers, got {x!r}")
    return Const(float(x))


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class ValueExpr(Node):
    """A scalar computation on tensor elements."""

    def __add__(self, other: ValueLike) -> ValueExpr:
        return Binary("+", self, as_value(other))

    def __radd__(self, other: ValueLike) -> ValueExpr:
        return Binary("+", as_value(other), self)

    def __sub__(self, other: ValueLike) -> ValueExpr:
        return Binary("-", self, as_value(other))

    def __rsub__(self, other: ValueLike) -> ValueExpr:
        return Binary("-", as_value(other), self)

    def __mul__(self, other: ValueLike) -> ValueExpr:
        return Binary("*", self, as_value(other))

    def __rmul__(self, other: ValueLike) -> ValueExpr:
        return Binary("*", as_value(other), self)

    def __truediv__(self, other: ValueLike) -> ValueExpr:
        return Binary("/", self, as_value(other))

    def __rtruediv__(self, other: ValueLike) -> ValueExpr:
        return Binary("/", as_value(other), self)

    def __neg__(self) -> ValueExpr:
        return Unary("neg", self)

    def iters(self) -> frozenset[Iter]:
        """Free iterators of this value (nested scopes are closed, so only their indices count)."""
        return _cached(self, "iters", lambda: _free_iters(self))


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Const(ValueExpr):
    value: float

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, float):
            raise IRError(f"value constant must be a float, got {self.value!r}")

    @classmethod
    def _key_of(cls, values: tuple) -> tuple:
        # 0.0 and -0.0 compare equal but print differently; NaN never equals itself.
        (v,) = values
        return (Const, v.hex() if isinstance(v, float) and not math.isnan(v) else repr(v))


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Binary(ValueExpr):
    op: str
    a: ValueExpr
    b: ValueExpr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise IRError(f"unknown binary operator {self.op!r} (expected one of {', '.join(BINARY_OPS)})")
        for x in (self.a, self.b):
            if not isinstance(x, ValueExpr):
                raise IRError(f"operand of '{self.op}' must be a value expression, got {x!r}")


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Unary(ValueExpr):
    fn: str
    x: ValueExpr
    param: float | None = None

    def __post_init__(self) -> None:
        if self.fn not in UNARY_FUNCS:
            raise IRError(f"unknown function {self.fn!r} (expected one of {', '.join(UNARY_FUNCS)})")
        if not isinstance(self.x, ValueExpr):
            raise IRError(f"argument of {self.fn} must be a value expression, got {self.x!r}")
        if UNARY_FUNCS[self.fn]:
            if isinstance(self.param, bool) or not isinstance(self.param, float):
                raise IRError(f"{self.fn} needs a float parameter, got {self.param!r}")
        elif self.param is not None:
            raise IRError(f"{self.fn} takes no parameter, got {self.param!r}")

    @classmethod
    def _key_of(cls, values: tuple) -> tuple:
        fn, x, p = values
        return (Unary, fn, x, p.hex() if isinstance(p, float) else repr(p))


# --------------------------------------------------------------------------
# Tensors, scopes, accesses
# --------------------------------------------------------------------------


class _Indexable:
    """Mixin: ``T[i, j]`` builds an ``Access``."""

    __slots__ = ()

    def __getitem__(self, idx: IndexLike | tuple[IndexLike, ...]) -> Access:
        if not isinstance(idx, tuple):
            idx = (idx,)
        return Access(self, tuple(as_index(i) for i in idx))


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Tensor(_Indexable, Node):
    """An input tensor: valid indices are ``0 <= i < shape[d]``; outside reads 0."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        _check_name(self.name, "tensor")
        if not isinstance(self.shape, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in self.shape
        ):
            raise IRError(f"tensor {self.name}: shape must be a tuple of positive ints, got {self.shape!r}")
        if self.dtype not in DTYPES:
            raise IRError(
                f"tensor {self.name}: unsupported dtype {self.dtype!r} (expected one of {', '.join(DTYPES)})"
            )

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def origin(self) -> tuple[int, ...]:
        return (0,) * len(self.shape)


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Scope(_Indexable, Node):
    """``L[traversal] Sum[summation] body``, materialised as a tensor.

    ``pad`` optionally gives, per traversal dimension, how many zero elements
    the materialised buffer carries before and after the computed range. It
    does not change the value (reads outside the range are 0 anyway); it lets
    codegen read the padded region without guards.

    ``reduce`` is how the body is reduced over the summation iterators
    (:data:`REDUCTIONS`): ``"sum"``, or ``"max"`` (``L[traversal] Max[summation]
    body``, which needs at least one summation iterator).
    """

    traversal: tuple[Iter, ...]
    summation: tuple[Iter, ...]
    body: ValueExpr
    pad: tuple[tuple[int, int], ...] = ()
    reduce: str = "sum"

    def __post_init__(self) -> None:
        if not isinstance(self.traversal, tuple) or not self.traversal:
            raise IRError("a scope needs at least one traversal iterator")
        if not isinstance(self.summation, tuple):
            raise IRError("summation iterators must be a tuple")
        if self.reduce not in REDUCTIONS:
            raise IRError(f"unknown reduction {self.reduce!r} (expected one of {', '.join(REDUCTIONS)})")
        if self.reduce != "sum" and not self.summation:
            raise IRError(
                f"a {self.reduce} scope needs at least one reduction iterator "
                f"(over none it is its body: write a scope without reduction)"
            )
        for it in self.traversal + self.summation:
            if not isinstance(it, Iter):
                raise IRError(f"scope iterators must be Iter, got {it!r}")
        names = [it.name for it in self.traversal + self.summation]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise IRError(f"iterator names bound twice in one scope: {', '.join(dup)}")
        if not isinstance(self.body, ValueExpr):
            raise IRError(f"scope body must be a value expression, got {self.body!r}")
        bound = set(self.traversal) | set(self.summation)
        free = self.body.iters() - bound
        if free:
            shown = ", ".join(f"{it.name}={it.lo}:{it.hi}" for it in sorted(free, key=lambda i: i.name))
            raise IRError(f"scope body uses iterators it does not bind: {shown}")
        if self.pad:
            if len(self.pad) != len(self.traversal) or not all(
                isinstance(p, tuple)
                and len(p) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p)
                for p in self.pad
            ):
                raise IRError("scope pad must give (before, after) >= 0 for every traversal iterator")
            if all(p == (0, 0) for p in self.pad):
                raise IRError("scope pad of all zeros: leave pad empty instead")
        _tensors_by_name(self)  # two different tensors under one name are ambiguous

    @property
    def rank(self) -> int:
        return len(self.traversal)

    @property
    def is_max(self) -> bool:
        """Whether the scope takes the maximum over its summation iterators."""
        return self.reduce == "max"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(it.extent for it in self.traversal)

    @property
    def origin(self) -> tuple[int, ...]:
        """Traversal value stored at array position 0 in each dimension."""
        return tuple(it.lo for it in self.traversal)

    def iters(self) -> frozenset[Iter]:
        """A scope is closed: it has no free iterators."""
        return frozenset()


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Access(ValueExpr):
    """``source[indices]`` where the source is an input tensor or a scope."""

    source: Tensor | Scope
    indices: tuple[IndexExpr, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.source, (Tensor, Scope)):
            raise IRError(f"only tensors and scopes can be indexed, got {self.source!r}")
        if not isinstance(self.indices, tuple) or not all(isinstance(i, IndexExpr) for i in self.indices):
            raise IRError("access indices must be a tuple of index expressions")
        if len(self.indices) != self.source.rank:
            what = self.source.name if isinstance(self.source, Tensor) else "scope"
            raise IRError(
                f"{what} has rank {self.source.rank} but is indexed with {len(self.indices)} indices"
            )


def _tensors_by_name(scope: Scope) -> dict[str, Tensor]:
    """The input tensors a scope reads (nested scopes included), by name; refuses name clashes."""

    def compute() -> dict[str, Tensor]:
        found: dict[str, Tensor] = {}

        def add(t: Tensor) -> None:
            other = found.setdefault(t.name, t)
            if other is not t:
                raise IRError(
                    f"two different tensors named {t.name}: {list(other.shape)} {other.dtype} "
                    f"and {list(t.shape)} {t.dtype}"
                )

        for e in walk(scope.body, stop=Access):
            if isinstance(e, Access):
                src = e.source
                for t in (src,) if isinstance(src, Tensor) else _tensors_by_name(src).values():
                    add(t)
        return found

    return _cached(scope, "tensors_by_name", compute)


# --------------------------------------------------------------------------
# Programs: named expressions forming a DAG
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)
class Program(Node):
    """An ordered set of named scopes that may read each other, with designated inputs and outputs.

    A binding's scope reads an earlier binding by accessing that very scope
    object (nodes are interned), so a program is a let-block over scopes; the
    names matter for printing and export, not for meaning.
    """

    inputs: tuple[Tensor, ...]
    bindings: tuple[tuple[str, Scope], ...]
    outputs: tuple[str, ...]

    def __post_init__(self) -> None:
        names = collections.Counter([t.name for t in self.inputs] + [n for n, _ in self.bindings])
        dup = sorted(n for n, k in names.items() if k > 1)
        if dup:
            raise IRError(f"program names defined twice: {', '.join(dup)}")
        for n, s in self.bindings:
            _check_name(n, "binding")
            if not isinstance(s, Scope):
                raise IRError(f"program binding {n} must be a Scope, got {type(s).__name__}")
        declared = set(self.inputs)
        first: dict[Scope, int] = {}
        for k, (_, s) in enumerate(self.bindings):
            first.setdefault(s, k)
        for k, (n, s) in enumerate(self.bindings):
            for t in tensors_in(s):
                if t not in declared:
                    raise IRError(
                        f"binding {n} reads tensor {t.name}{list(t.shape)} that is not a program input"
                    )
            for sub in scopes_in(s):
                if first.get(sub, -1) > k and sub is not s:
                    raise IRError(
                        f"binding {n} reads {self.bindings[first[sub]][0]}, which is bound after it"
                    )
        bound = {n for n, _ in self.bindings}
        if not self.outputs:
            raise IRError("a program needs at least one output")
        for o in self.outputs:
            if o not in bound:
                raise IRError(f"program output {o!r} is not a bound expression")

    def scope(self, name: str) -> Scope:
        for n, s in self.bindings:
            if n == name:
                return s
        raise KeyError(name)

    def names(self) -> dict[Scope, str]:
        """The name of each bound scope (the first name if a scope is bound twice)."""
        out: dict[Scope, str] = {}
        for n, s in self.bindings:
            out.setdefault(s, n)
        return out


# --------------------------------------------------------------------------
# Traversals
# --------------------------------------------------------------------------


# How each node class holds its sub-expressions: its children in order, and the node rebuilt
# from new children with its other fields kept. The children of a value or index node are its
# sub-values and sub-indices; an access's children are its indices, not its source (a scope is
# closed: a body's traversal does not enter the scopes it reads, see ``scopes_in``). A scope's
# child is its body (its iterators are binders, not sub-expressions); a program's children are
# its bound scopes, in binding order.
@dataclasses.dataclass(frozen=True, slots=True)
class _Shape:
    children: Callable[[Any], tuple[Node, ...]]
    rebuild: Callable[[Any, tuple], Node] | None  # None for a leaf: it has nothing to replace


_LEAF = _Shape(lambda n: (), None)
_OPERANDS = _Shape(lambda n: (n.a, n.b), lambda n, c: type(n)(*c))
_DIVMOD = _Shape(lambda n: (n.a,), lambda n, c: type(n)(c[0], n.k))

_SHAPES: dict[type, _Shape] = {
    Iter: _LEAF,
    IConst: _LEAF,
    IAdd: _OPERANDS,
    ISub: _OPERANDS,
    IMul: _OPERANDS,
    IFloorDiv: _DIVMOD,
    IMod: _DIVMOD,
    Const: _LEAF,
    Binary: _Shape(lambda n: (n.a, n.b), lambda n, c: Binary(n.op, *c)),
    Unary: _Shape(lambda n: (n.x,), lambda n, c: Unary(n.fn, c[0], n.param)),
    Access: _Shape(lambda n: n.indices, lambda n, c: Access(n.source, c)),
    Tensor: _LEAF,
    Scope: _Shape(lambda n: (n.body,), lambda n, c: n.replace(body=c[0])),
    Program: _Shape(
        lambda n: tuple(s for _, s in n.bindings),
        lambda n, c: n.replace(bindings=tuple((name, s) for (name, _), s in zip(n.bindings, c, strict=True))),
    ),
}


def _shape(node: Node) -> _Shape:
    try:
        return _SHAPES[type(node)]
    except KeyError:
        raise TypeError(f"not an IR node: {node!r}") from None


def children(node: Node) -> tuple[Node, ...]:
    """The direct sub-expressions of ``node``, in field order.

    ``a + b`` has ``(a, b)``, ``relu(x)`` has ``(x,)``, ``T[i, j+1]`` has its indices
    ``(i, j+1)`` (not ``T``: a source is read, not contained), ``x // 2`` has ``(x,)``;
    iterators, constants and tensors have none. A scope has its body, a program its bound
    scopes in binding order.

    Parameters
    ----------
    node : Node
        Any IR node.

    Returns
    -------
    tuple of Node
        The children, possibly with repeats (``x * x``).
    """
    return _shape(node).children(node)


def walk(root: Node, stop: type | tuple[type, ...] = ()) -> Iterator[Node]:
    """Every node under ``root`` once: ``root`` first, then pre-order, left to right.

    Iterative (bodies can be long chains). A subterm shared by two parents comes once,
    where it is first reached. Scopes that an access reads are not entered (see
    ``children``).

    Parameters
    ----------
    root : Node
        Any IR node.
    stop : type or tuple of types, optional
        Nodes of these classes are yielded but their children are not visited:
        ``stop=Access`` walks the value nodes of a body without their indices.

    Yields
    ------
    Node
        Each distinct node once.
    """
    seen: set[Node] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        if not isinstance(node, stop):
            stack += _shape(node).children(node)[::-1]


def rebuild(node: Node, fn: Callable[[Node], Node]) -> Node:
    """``node`` with each child ``c`` replaced by ``fn(c)``, its other fields kept.

    Returns ``node`` itself when ``fn`` returns every child unchanged, and an interned node
    otherwise (validated: a replacement of the wrong kind raises ``IRError``). Not recursive:
    ``fn`` decides whether to go deeper, so a bottom-up rewrite is
    ``def go(x): return rewrite_one(rebuild(x, go))``.

    Parameters
    ----------
    node : Node
        Any IR node (a leaf comes back unchanged, ``fn`` is not called).
    fn : callable
        Maps a child to its replacement.

    Returns
    -------
    Node
        The rebuilt node.
    """
    shape = _shape(node)
    old = shape.children(node)
    new = tuple([fn(c) for c in old])
    for a, b in zip(old, new):  # noqa: B905 - the same length by construction
        if a is not b:
            return shape.rebuild(node, new)
    return node


def scopes_in(root: Node) -> list[Scope]:
    """All scopes reachable from ``root`` (including itself), producers before consumers."""
    return list(_reachable(root, Scope))


def input_tensors(node: Scope | Program) -> list[Tensor]:
    """The inputs of a scope (tensors read, first use first) or a program (as declared)."""
    return list(node.inputs) if isinstance(node, Program) else tensors_in(node)


def tensors_in(root: Node) -> list[Tensor]:
    """All input tensors reachable from ``root`` in first-use order (depth first, left to right)."""
    return list(_reachable(root, Tensor))


def _reachable(root: Node, kind: type[Scope] | type[Tensor]) -> tuple:
    """The scopes or the tensors reachable from ``root`` (itself included), memoised per node. Built
    from the nested scopes' own lists in depth-first order, left to right, so a rewritten scope
    reuses what its unchanged parts already know: tensors come in first-use order, scopes children
    first (producers before consumers).

    Iterative over the nesting (a translated model nests one scope per node, hundreds deep): a node
    whose nested scopes do not all have their list yet stacks them and waits for them.
    """
    name = "scopes_in" if kind is Scope else "tensors_in"
    stack: list[Node] = [root]
    while stack:
        node = stack[-1]
        if node._memo is not None and name in node._memo:
            stack.pop()
        elif missing := _reachable_from_known(node, kind, name):
            stack += missing
        else:
            stack.pop()
    return root._memo[name]


def _reachable_from_known(node: Node, kind: type[Scope] | type[Tensor], name: str) -> list[Scope]:
    """Memoises ``node``'s list when every scope nested in it has its own, and returns ``[]``;
    otherwise memoises nothing and returns the nested scopes without one."""
    out: dict[int, Node] = {}
    missing: list[Scope] = []
    stack: list[Node] = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, Access):
            nested: Node = x.source
        elif isinstance(x, Scope) and x is not node:
            nested = x
        else:
            stack.extend(reversed(children(x)))
            continue
        if isinstance(nested, Tensor):
            if kind is Tensor:
                out.setdefault(id(nested), nested)
        elif nested._memo is not None and name in nested._memo:
            for y in nested._memo[name]:
                out.setdefault(id(y), y)
        else:
            missing.append(nested)
    if missing:
        return missing
    if isinstance(node, kind):
        out.setdefault(id(node), node)
    _cached(node, name, lambda: tuple(out.values()))
    return []

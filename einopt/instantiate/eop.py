"""eOperators: expressions that match no predefined operator, as model-local ONNX functions.

An eOperator is one ``ir.Scope`` emitted as a call to an ``onnx.FunctionProto``
in domain ``einopt.eop`` whose body uses only default-domain operators, so
stock ONNX Runtime runs it and Netron shows it as one node; the function's
doc_string holds the expression text.

Meaning (``einopt.core.interp`` is the specification): the function's output is the
scope materialised, shape = traversal extents, position ``p`` holding traversal
value ``lo + p`` (``pad`` is ignored). Each input is one source the body reads
directly: a ``Tensor`` or a nested ``Scope`` materialised the same way (array
position ``p`` holds value ``origin + p``). Reads outside a source give 0. The
body computes in float32; tensors of other dtypes are cast on entry.

Lowering. First two equivalence-preserving rewrites of the scope:

* iterators read through ``//`` and ``%`` are split (``h = lo + k*hq + hr``)
  when that removes divisions, so Reshape-, DepthToSpace- and SpaceToDepth-like
  reads become affine (``eop_rewrite.split_iterators``); a final Reshape merges ``hq, hr``;
* summation iterators that would force a Gather (``T[.., h+r-1, ..]``) are
  unrolled into a sum of shifted reads when there are few enough copies
  (``eop_rewrite.unroll_summation``).

Then every value is a tensor with one axis per iterator it depends on
(``_Val``). An access reads, per source dimension: a constant index with
``Slice``; ``c*it + k`` of an iterator no other dimension uses with ``Slice``
(step ``c``) and a zero ``Pad`` for the out-of-range part; a mixed-radix
``x*W + y`` by reshaping the dimension into two (``eop_access.split_dim``); the rest
grouped into dimensions sharing iterators, each group merged and read with one
``Gather`` whose constant int32/int64 index spans only that group's iterators
(out-of-range reads point at an appended zero). The body is a signed sum of
products: a product summed over iterators is an ``Einsum`` (``Mul`` +
``ReduceSum`` before opset 12), a single summed factor a ``ReduceSum``, other
arithmetic element-wise operators (``BINARY_OPS``, ``UNARY_OPS``) with ``Transpose``
and ``Reshape`` lining operands up for broadcasting; terms are added. A max scope's
body is computed element-wise over the iterators it reads and reduced by one
``ReduceMax`` over the summation iterators among them (a maximum over an
iterator the body does not read is the body: nothing to reduce). A term
that is only a read outside its source is dropped; a product with such a read
is computed (``0 * inf`` is NaN, as in the interpreter).

This module holds the entry points and the lowering of the body; the rewrites
are in :mod:`einopt.instantiate.eop_rewrite`, reading one access (planning,
Slice/Pad, Gather) in :mod:`einopt.instantiate.eop_access`, and the node
builder in :mod:`einopt.instantiate.eop_graph`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import string
from collections.abc import Iterable

import onnx
from onnx import helper

from einopt.core import ir
from einopt.core.rewrite import map_accesses
from einopt.core.syntax import brief, format_expr
from einopt.frontend.onnx_graph import unique_name
from einopt.instantiate import BINARY_OPS, EINSUM_OPSET, EOP_DOMAIN, UNARY_OPS, UNARY_PARAM, UNARY_PARAM_INPUT
from einopt.instantiate.eop_access import Dim, accesses, gather, plan_access, reads_nothing, slice_and_pad
from einopt.instantiate.eop_graph import Graph
from einopt.instantiate.eop_rewrite import split_iterators, unroll_summation

__all__ = ["EOperator", "EOperatorError", "eoperator", "eop_name", "MAX_INDEX_ELEMENTS", "MIN_OPSET"]

log = logging.getLogger(__name__)

# Largest constant Gather index tensor (elements) one access may need.
MAX_INDEX_ELEMENTS = 2**27
# Pad and Slice with tensor inputs (opset 11) are the oldest forms used.
MIN_OPSET = 11
# A product of sums is distributed only up to this many terms.
_MAX_TERMS = 16
# Einsum subscripts (lower case only: the safest subset across runtimes).
_LETTERS = string.ascii_lowercase


class EOperatorError(ValueError):
    """A scope cannot be emitted as an eOperator; the message says why."""


@dataclasses.dataclass(frozen=True)
class EOperator:
    """A scope as an ONNX function: call it with one input per source, in order.

    ``function`` has the given name, domain ``einopt.eop`` and a default-domain
    opset import; ``sources`` are the function's inputs: every distinct tensor
    or nested scope the scope's body reads directly (first read first).
    """

    function: onnx.FunctionProto
    sources: tuple[ir.Tensor | ir.Scope, ...]


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------


def eoperator(scope: ir.Scope, name: str, opset: int, light: bool = False) -> EOperator:
    """Lower ``scope`` to a model-local ONNX function of standard operators.

    Parameters
    ----------
    scope : ir.Scope
        The expression; its ``pad`` is ignored.
    name : str
        The function's name (an identifier; callers keep names unique per model).
    opset : int
        Default-domain opset version the body is written for (>= ``MIN_OPSET``).
    light : bool
        Declare the constant Gather indices (type and shape) without computing them: the
        function can be shape-inferred and costed, not run.

    Returns
    -------
    EOperator
        The function and its sources (the inputs of a call, in order).

    Raises
    ------
    EOperatorError
        On a bad name or opset, or when an access would need a constant index
        tensor over ``MAX_INDEX_ELEMENTS`` elements.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise EOperatorError(f"eOperator name must be an identifier, got {name!r}")
    if name in _onnx_op_types():
        raise EOperatorError(
            f"eOperator name {name!r} is an ONNX operator type: ONNX Runtime (1.31) optimizers match "
            "nodes by type without checking the domain and crash on such a function call"
        )
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise EOperatorError(
            f"opset {opset} unsupported: eOperators need {MIN_OPSET} <= opset <= {onnx.defs.onnx_opset_version()}"
        )
    # The search lowers the eOperators of every candidate state, and most recur from state to state:
    # the function is lowered once per scope, opset and lightness, and each call gets its own copy
    # under its own name.
    fn, sources = ir._cached(scope, ("eoperator", opset, light), lambda: _lowered_once(scope, opset, light))
    named = onnx.FunctionProto()
    named.CopyFrom(fn)
    named.name = name
    log.debug("eOperator %s: %d nodes for %s", name, len(named.node), scope)
    return EOperator(named, sources)


def _lowered_once(
    scope: ir.Scope, opset: int, light: bool
) -> tuple[onnx.FunctionProto, tuple[ir.Tensor | ir.Scope, ...]]:
    """:func:`_lowered`; a light one shared by every scope with the same body up to the scopes it
    reads. A function reads its sources as inputs, by their boxes alone (the module docstring), so a
    scope rebuilt around a rewritten producer lowers to the same function; a light function's text
    (its docstring, which prints the sources) is never shown."""
    if not light:
        return _lowered(scope, opset, light)
    sources = _sources(scope.body)
    stand_ins = _stand_ins(sources)
    if stand_ins is None:
        return _lowered(scope, opset, light)
    body = map_accesses(scope.body, lambda a: ir.Access(stand_ins.get(a.source, a.source), a.indices))
    shared = scope.replace(body=body)
    fn, _ = ir._cached(shared, ("eoperator", opset, light), lambda: _lowered(shared, opset, light))
    return fn, sources


def _stand_ins(sources: tuple[ir.Tensor | ir.Scope, ...]) -> dict[ir.Scope, ir.Scope] | None:
    """The scopes among ``sources``, each by a stand-in with its box that reads a tensor of its own
    (the k-th scope read, ``einopt_source<k>``); None where a source tensor has such a name."""
    if any(isinstance(s, ir.Tensor) and s.name.startswith("einopt_source") for s in sources):
        return None
    out: dict[ir.Scope, ir.Scope] = {}
    for s in sources:
        if isinstance(s, ir.Scope):
            its = tuple(ir.Iter(f"i{d}", it.lo, it.hi) for d, it in enumerate(s.traversal))
            read = ir.Tensor(f"einopt_source{len(out)}", s.shape)[
                tuple(it - it.lo if it.lo else it for it in its)
            ]
            out[s] = ir.Scope(its, (), read)
    return out


def _lowered(
    scope: ir.Scope, opset: int, light: bool
) -> tuple[onnx.FunctionProto, tuple[ir.Tensor | ir.Scope, ...]]:
    """:func:`eoperator`'s function (unnamed) and sources."""
    sources = _sources(scope.body)
    taken = {s.name for s in sources if isinstance(s, ir.Tensor)}
    input_names: list[str] = []
    for s in sources:
        if isinstance(s, ir.Tensor):
            input_names.append(s.name)
        else:
            input_names.append(unique_name(f"S{len(input_names)}", taken))
    output = unique_name("Y", taken)
    g = Graph(opset, taken, light)
    split = unroll_summation(split_iterators(scope))
    low = _Lowerer(g, split, dict(zip(sources, input_names, strict=True)))
    result = low.finish(low.body(), scope.shape)
    g.set_output(result, output)
    doc = (
        ""
        if light
        # a light function is costed, never shown
        else (
            format_expr(scope)
            + "\n\ninputs: "
            + ", ".join(
                n if isinstance(s, ir.Tensor) else f"{n} (nested scope, origin {list(s.origin)})"
                for n, s in zip(input_names, sources, strict=True)
            )
        )
    )
    fn = helper.make_function(
        EOP_DOMAIN, "", input_names, [output], g.nodes, [helper.make_opsetid("", opset)], doc_string=doc
    )
    return fn, tuple(sources)


def eop_name(scope: ir.Scope) -> str:
    """A short CamelCase name of what ``scope`` computes.

    ``Relayout`` (one access, no summation), ``OffsetReduce`` (a sum over one
    access with an index adding iterators), ``Reduce`` (a sum over one
    access), ``Contract`` (a sum over a product of accesses), ``Fill`` (a
    constant); otherwise the names of up to four distinct operators in
    evaluation order (``AddRelu``), followed by ``Reduce`` when summed. A
    maximum says ``MaxReduce`` where a sum says ``Reduce`` (``OffsetMaxReduce``
    for a pooling window). A
    name that is an ONNX operator type gets the suffix ``Eop`` (``AddEop``):
    ONNX Runtime mistakes such calls for the operator.
    """
    body = scope.body
    reduce = ("Max" if scope.is_max else "") + "Reduce"
    if isinstance(body, ir.Access):
        if not scope.summation:
            return "Relayout"
        adds = any(len(i.iters()) >= 2 for i in body.indices)
        return ("Offset" if adds else "") + reduce
    factors = _product_factors(body)
    if (
        scope.summation
        and not scope.is_max
        and factors is not None
        and sum(isinstance(f, ir.Access) for f in factors) >= 2
    ):
        return "Contract"
    ops: dict[str, None] = {}
    _op_names(body, ops)
    if not ops:
        return "Fill"
    name = "".join(list(ops)[:4]) + (reduce if scope.summation else "")
    return name + "Eop" if name in _onnx_op_types() else name


@functools.cache
def _onnx_op_types() -> frozenset[str]:
    return frozenset(schema.name for schema in onnx.defs.get_all_schemas())


def _product_factors(e: ir.ValueExpr) -> list[ir.ValueExpr] | None:
    """The factors of a product of accesses and constants, or None for anything else."""
    if isinstance(e, (ir.Access, ir.Const)):
        return [e]
    if isinstance(e, ir.Unary) and e.fn == "neg":
        return _product_factors(e.x)
    if isinstance(e, ir.Binary) and e.op == "*":
        a, b = _product_factors(e.a), _product_factors(e.b)
        return None if a is None or b is None else a + b
    return None


def _op_names(e: ir.ValueExpr, out: dict[str, None]) -> None:
    if isinstance(e, ir.Binary):
        _op_names(e.a, out)
        _op_names(e.b, out)
        out.setdefault(BINARY_OPS[e.op])
    elif isinstance(e, ir.Unary):
        _op_names(e.x, out)
        out.setdefault(UNARY_OPS[e.fn])


def _sources(body: ir.ValueExpr) -> tuple[ir.Tensor | ir.Scope, ...]:
    """Distinct tensors and nested scopes read directly by ``body``, first read first."""
    return tuple(dict.fromkeys(a.source for a in accesses(body)))


# --------------------------------------------------------------------------
# Sum-of-products form
# --------------------------------------------------------------------------

_Term = tuple[float, tuple[ir.ValueExpr, ...]]


def _terms(e: ir.ValueExpr) -> list[_Term]:
    """``e`` as ``sum(coef * prod(factors))``; a product of sums is distributed when that helps.

    Distributing pays when the terms of a sum depend on fewer iterators than
    the sum (``(A[i,k] + B[k,j]) * C[k]`` summed over ``k`` would otherwise
    build an ``i*j*k`` intermediate).
    """
    if isinstance(e, ir.Const):
        return [(e.value, ())]
    if isinstance(e, ir.Unary) and e.fn == "neg":
        return [(-c, fs) for c, fs in _terms(e.x)]
    if isinstance(e, ir.Binary) and e.op in ("+", "-"):
        sign = 1.0 if e.op == "+" else -1.0
        return _terms(e.a) + [(sign * c, fs) for c, fs in _terms(e.b)]
    if isinstance(e, ir.Binary) and e.op == "*":
        ta, tb = _terms(e.a), _terms(e.b)
        if (
            len(ta) == 1
            and len(tb) == 1
            or (len(ta) * len(tb) <= _MAX_TERMS and (_uneven(e.a, ta) or _uneven(e.b, tb)))
        ):
            return [(ca * cb, fa + fb) for ca, fa in ta for cb, fb in tb]
    return [(1.0, (e,))]


def _is_zero(coef: float, factors: tuple[ir.ValueExpr, ...]) -> bool:
    """A term that is 0 everywhere: a finite coefficient times one read outside its source.

    ``0 * x`` is NaN for an infinite or NaN ``x`` (IEEE, and the interpreter), so
    a zero read times another factor is kept: the term is computed, as the
    specification and ONNX Runtime's own kernels (Conv's padding) compute it.
    """
    (only,) = factors if len(factors) == 1 else (None,)
    return isinstance(only, ir.Access) and reads_nothing(only) and math.isfinite(coef)


def _uneven(e: ir.ValueExpr, terms: list[_Term]) -> bool:
    """True when some term of ``e`` depends on fewer iterators than ``e``."""
    its = e.iters()
    return len(terms) > 1 and any(frozenset().union(*(f.iters() for f in fs)) != its for _, fs in terms)


# --------------------------------------------------------------------------
# Lowering a scope
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Val:
    """A lowered value: a tensor with one axis per iterator of ``axes`` (rank 0 when empty)."""

    name: str
    axes: tuple[ir.Iter, ...]


class _Lowerer:
    """Lowers one (split) scope into ``g``; values are memoised per node."""

    def __init__(self, g: Graph, scope: ir.Scope, inputs: dict[ir.Tensor | ir.Scope, str]) -> None:
        self.g = g
        self.scope = scope
        self.axes = scope.traversal + scope.summation
        self.pos = {it: d for d, it in enumerate(self.axes)}
        self.inputs = inputs
        self.loaded: dict[ir.Tensor | ir.Scope, str] = {}
        self.memo: dict[ir.ValueExpr, _Val] = {}
        self.cache: dict[tuple[str, tuple[ir.Iter, ...]], str] = {}

    def zero(self) -> _Val:
        return _Val(self.g.scalar(0.0), ())

    def in_order(self, its: Iterable[ir.Iter]) -> tuple[ir.Iter, ...]:
        return tuple(sorted(set(its), key=self.pos.__getitem__))

    def aligned(self, v: _Val, axes: tuple[ir.Iter, ...]) -> str:
        """``v`` broadcastable over ``axes`` (a superset of its axes): transposed, size 1 where unused."""
        key = (v.name, axes)
        if key not in self.cache:
            name = v.name
            mine = [it for it in axes if it in v.axes]
            if list(v.axes) != mine:
                name = self.g.op("Transpose", [name], perm=[v.axes.index(it) for it in mine])
            if len(mine) != len(axes):
                name = self.g.reshape(name, [it.extent if it in v.axes else 1 for it in axes])
            self.cache[key] = name
        return self.cache[key]

    def elementwise(self, op_type: str, vals: list[_Val], **attrs: object) -> _Val:
        """``op_type`` on ``vals`` lined up by broadcasting (rank-0 operands broadcast as they are)."""
        shaped = [v for v in vals if v.axes]
        if all(v.axes == shaped[0].axes for v in shaped):
            axes = shaped[0].axes if shaped else ()
            return _Val(self.g.op(op_type, [v.name for v in vals], **attrs), axes)
        axes = self.in_order(it for v in shaped for it in v.axes)
        names = [self.aligned(v, axes) if v.axes else v.name for v in vals]
        return _Val(self.g.op(op_type, names, **attrs), axes)

    # ---- the whole body --------------------------------------------------

    def body(self) -> _Val:
        """The scope's body reduced over its summation iterators (a value over traversal iterators)."""
        return _REDUCERS[self.scope.reduce](self)

    def maximum(self) -> _Val:
        """A max scope's body, element-wise, then ``ReduceMax`` over the summation iterators it reads."""
        v = self.value(self.scope.body)
        used = [it for it in v.axes if it in self.scope.summation]
        if not used:
            return v
        reduced = self.g.reduce("ReduceMax", v.name, [v.axes.index(it) for it in used])
        return _Val(reduced, tuple(it for it in v.axes if it not in used))

    def total(self) -> _Val:
        """A sum scope's body as a signed sum of products, each contracted over the summation iterators."""
        parts = [
            self.term(coef, factors)
            for coef, factors in _terms(self.scope.body)
            if not _is_zero(coef, factors)
        ]
        if not parts:
            return self.zero()
        if len(parts) == 1:
            return parts[0]
        return self.elementwise("Add" if len(parts) == 2 else "Sum", parts)

    def term(self, coef: float, factors: tuple[ir.ValueExpr, ...]) -> _Val:
        """``coef * Sum[summation] prod(factors)``."""
        summation = self.scope.summation
        vals = [self.value(f) for f in factors]
        arrays = [v for v in vals if v.axes]
        scalars = [v for v in vals if not v.axes]
        deps = {it for v in arrays for it in v.axes}
        used = [it for it in summation if it in deps]
        scale = coef * math.prod(it.extent for it in summation if it not in deps)
        if len(arrays) >= 2 and used and self.g.opset >= EINSUM_OPSET and len(self.axes) <= len(_LETTERS):
            vals = [self.einsum(arrays, self.in_order(deps - set(used))), *scalars]
        elif used:
            out = self.product(arrays)
            reduced = self.g.reduce_sum(out.name, [out.axes.index(it) for it in used])
            vals = [_Val(reduced, tuple(it for it in out.axes if it not in used)), *scalars]
        if scale != 1.0 or not vals:
            vals.append(_Val(self.g.scalar(scale), ()))
        return self.product(vals)

    def product(self, vals: list[_Val]) -> _Val:
        out = vals[0]
        for v in vals[1:]:
            out = self.elementwise("Mul", [out, v])
        return out

    def einsum(self, arrays: list[_Val], out_axes: tuple[ir.Iter, ...]) -> _Val:
        letters = dict(zip(self.axes, _LETTERS, strict=False))
        specs = ["".join(letters[it] for it in v.axes) for v in arrays]
        equation = ",".join(specs) + "->" + "".join(letters[it] for it in out_axes)
        return _Val(self.g.op("Einsum", [v.name for v in arrays], equation=equation), out_axes)

    def finish(self, v: _Val, shape: tuple[int, ...]) -> str:
        """``v`` (over traversal iterators) laid out in traversal order, broadcast, reshaped to ``shape``."""
        trav = self.scope.traversal
        full = [it.extent for it in trav]
        expand = any(it.extent > 1 and it not in v.axes for it in trav)
        name = self.aligned(v, trav) if v.axes else v.name
        if expand:
            name = self.g.op("Expand", [name, self.g.ints(full)])
        if tuple(full) != shape or not (v.axes or expand):
            name = self.g.reshape(name, shape)
        return name

    # ---- element-wise values ---------------------------------------------

    def value(self, e: ir.ValueExpr) -> _Val:
        out = self.memo.get(e)
        if out is None:
            if isinstance(e, ir.Const):
                out = _Val(self.g.scalar(e.value), ())
            elif isinstance(e, ir.Access):
                out = self.access(e)
            elif isinstance(e, ir.Binary):
                out = self.elementwise(BINARY_OPS[e.op], [self.value(e.a), self.value(e.b)])
            elif isinstance(e, ir.Unary):
                attrs = {UNARY_PARAM[e.fn]: e.param} if e.fn in UNARY_PARAM else {}
                param = [_Val(self.g.scalar(e.param), ())] if e.fn in UNARY_PARAM_INPUT else []
                out = self.elementwise(UNARY_OPS[e.fn], [self.value(e.x), *param], **attrs)
            else:
                raise EOperatorError(f"cannot lower {type(e).__name__}")
            self.memo[e] = out
        return out

    # ---- accesses ----------------------------------------------------------

    def load(self, src: ir.Tensor | ir.Scope) -> str:
        """The function input holding ``src``, cast to float32 once if stored otherwise."""
        if src not in self.loaded:
            name = self.inputs[src]
            if isinstance(src, ir.Tensor) and src.dtype != "float32":
                name = self.g.op("Cast", [name], to=onnx.TensorProto.FLOAT)
            self.loaded[src] = name
        return self.loaded[src]

    def access(self, acc: ir.Access) -> _Val:
        """``acc`` over the iterators it reads (in the order the reads leave them)."""
        if reads_nothing(acc):
            return self.zero()
        dims, consts, simple, groups = plan_access(acc)
        x = self.load(acc.source)
        if len(dims) != acc.source.rank:
            x = self.g.reshape(x, [d.size for d in dims])
        x = slice_and_pad(self.g, x, dims, consts, simple)
        if x is None:
            return self.zero()
        if all(grp == list(range(grp[0], grp[-1] + 1)) for grp in groups):
            return self._gather_in_place(acc, x, dims, consts, groups)
        # Each group merged into one outer axis (so Gather copies contiguous blocks), then the
        # simple dims; constant dims (now of size 1) are dropped.
        order = [k for grp in groups for k in grp] + consts + simple
        if order != list(range(len(dims))):
            x = self.g.op("Transpose", [x], perm=order)
        simple_its = [dims[k].form.coeffs[0][0] for k in simple]
        shape = [math.prod(dims[k].size for k in grp) for grp in groups] + [it.extent for it in simple_its]
        if consts or any(len(grp) > 1 for grp in groups):
            x = self.g.reshape(x, shape)
        # Gather the last group first, so that earlier groups keep their axis.
        group_its = [[it for it in self.axes if any(it in dims[k].deps for k in grp)] for grp in groups]
        rank = len(shape)
        for a in reversed(range(len(groups))):
            _check_index_size(acc, group_its[a])
            x = gather(self.g, x, a, rank, [dims[k] for k in groups[a]], group_its[a])
            rank += len(group_its[a]) - 1
        return _Val(x, tuple(it for its in group_its for it in its) + tuple(simple_its))

    def _gather_in_place(
        self, acc: ir.Access, x: str, dims: list[Dim], consts: list[int], groups: list[list[int]]
    ) -> _Val:
        """Read with every group of adjacent dims merged and gathered where it is (no Transpose).

        A banded read ``S[b, h, i, i + d*j]`` gathers the last axis of ``S`` viewed as
        ``[b, h, n*N]``, rather than transposing all of ``S`` to put the band first and back.
        """
        first = {grp[0]: grp for grp in groups}
        in_group = {k for grp in groups for k in grp}
        shape: list[int] = []
        layout: list[tuple[list[int], list[ir.Iter]]] = []  # per axis: its group (or []) and iterators
        for k, d in enumerate(dims):
            if k in first:
                grp = first[k]
                shape.append(math.prod(dims[m].size for m in grp))
                layout.append((grp, [it for it in self.axes if any(it in dims[m].deps for m in grp)]))
            elif k not in in_group and k not in consts:
                it = d.form.coeffs[0][0]
                shape.append(it.extent)
                layout.append(([], [it]))
        if consts or any(len(grp) > 1 for grp in groups):
            x = self.g.reshape(x, shape)
        rank = len(shape)
        for a in reversed(range(len(layout))):  # the last group first, so earlier axes keep their place
            grp, its = layout[a]
            if grp:
                _check_index_size(acc, its)
                x = gather(self.g, x, a, rank, [dims[m] for m in grp], its)
                rank += len(its) - 1
        return _Val(x, tuple(it for _, its in layout for it in its))


# How each kind of scope (``Scope.reduce``) is lowered.
_REDUCERS = {"sum": _Lowerer.total, "max": _Lowerer.maximum}


def _check_index_size(acc: ir.Access, its: list[ir.Iter]) -> None:
    """Refuse a Gather of ``acc`` over ``its`` whose constant index would exceed ``MAX_INDEX_ELEMENTS``."""
    count = math.prod(it.extent for it in its)
    if count > MAX_INDEX_ELEMENTS:
        raise EOperatorError(
            f"access {brief(acc)} needs a constant Gather index of {count} elements over iterators "
            f"{', '.join(it.name for it in its)} (limit {MAX_INDEX_ELEMENTS})"
        )

"""Instantiation: an ``ir.Program`` as ONNX nodes, initializers and eOperator functions.

Each scope (program bindings in order, and the inline scopes they read) is
materialised once, by the first of:

1. every tensor it reads is a known constant: evaluated at compile time with
   the reference interpreter (float64, stored as float32) into an initializer;
2. a matcher of ``einopt.instantiate.match.MATCHERS`` accepts it (or, for a
   binding with a preferred operator type, normally the ONNX operator that
   computed it originally, that operator's matcher when it is as cheap): its
   operands' layout steps are emitted (or folded, for constant operands), then
   its operators and the steps on the result;
3. otherwise an eOperator, as the backend writes it (:mod:`einopt.backends`): with
   the portable backend (the default) a call of a model-local function of standard
   operators in domain ``einopt.eop`` (``einopt.instantiate.eop``), which is also
   the form of any scope a backend does not write itself (the TVM backend: one
   reading a non-float tensor).

A backend may also write a match otherwise (the TVM backend: a chain of
element-wise nodes as one generated kernel), write groups of bindings as one
node, and change the nodes at the end (:mod:`einopt.backends.tvm.emit`).

Nodes are interned: the same operator on the same inputs is emitted once.
Program outputs are produced under exactly the ONNX names given; every other
value gets a fresh readable name starting with the prefix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.frontend.onnx_graph import FreshNames, unique_name
from einopt.instantiate import EINSUM_OPSET, EOP_DOMAIN, eop
from einopt.instantiate.backend import PORTABLE, Backend
from einopt.instantiate.match import MATCHERS, match
from einopt.instantiate.plan import (
    DepthToSpace,
    Expand,
    LayoutStep,
    Literal,
    MatchContext,
    OperatorMatch,
    Pad,
    Reshape,
    Scale,
    Slice,
    SpaceToDepth,
    Transpose,
)
from einopt.opsets import KERNEL_DOMAIN

if TYPE_CHECKING:
    from einopt.frontend.translate import Part

__all__ = [
    "Choice",
    "Instantiated",
    "InstantiationError",
    "MIN_OPSET",
    "instantiate",
    "original_ops",
]

log = logging.getLogger(__name__)

LIGHT_LIMIT = 1024
"""Initializers up to this many bytes keep their values in a ``light`` instantiation (shape
inference reads Reshape targets and the like)."""

# From opset 7 on, element-wise ops broadcast like numpy; forms that changed later (Slice, Pad,
# Clip, ReduceSum, Expand, DepthToSpace's mode) are chosen per opset below.
MIN_OPSET = 7


@dataclasses.dataclass(frozen=True)
class _Shaped:
    """A compile-time value known by its shape only (a ``light`` instantiation's large constants)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def light_omits(dtype: np.dtype | type, nbytes: int) -> bool:
    """Whether a ``light`` instantiation leaves a value's contents out: floating point and over
    :data:`LIGHT_LIMIT` bytes (integer shapes, axes and pads always keep theirs)."""
    return np.dtype(dtype).kind == "f" and nbytes > LIGHT_LIMIT


def _weightlike(arr: np.ndarray | _Shaped) -> bool:
    return light_omits(arr.dtype, arr.nbytes)


class InstantiationError(ValueError):
    """A program cannot be instantiated (bad names, unsupported opset, no eOperator available)."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """How one materialised scope was instantiated.

    ``binding`` is the binding name (``binding/k`` for the k-th inline scope
    materialised for it); ``how`` is ``"constant"``, a match label (``"Conv"``,
    ``"Slice+Transpose"``) or ``"eop:<name>"``; ``failures`` lists the
    matchers tried before, with their reasons.
    """

    binding: str
    how: str
    failures: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class AtShape:
    """A rewrite run at one assignment of a model's symbolic dimensions only."""

    rewrite: Instantiated  # what runs there
    values: str  # the assignment, e.g. "batch=1, sequence=128"
    why: str  # why the rewrite holds there only


@dataclasses.dataclass(frozen=True)
class Instantiated:
    """ONNX pieces computing a program: add them to a graph (and the functions to the model)."""

    nodes: tuple[onnx.NodeProto, ...]  # topologically ordered
    initializers: tuple[onnx.TensorProto, ...]
    functions: tuple[onnx.FunctionProto, ...]  # eOperators, domain "einopt.eop" (and einopt.shape)
    choices: tuple[Choice, ...]
    # With ``light``: the large initializers' names, types and shapes, without their values.
    placeholders: tuple[onnx.ValueInfoProto, ...] = ()
    # Types and shapes of the values ONNX shape inference cannot infer (outputs of operators outside
    # the default domain, such as ONNX Runtime's com.microsoft ones).
    value_info: tuple[onnx.ValueInfoProto, ...] = ()
    # Set when these nodes run a rewrite at the searched shape of a model's symbolic dimensions
    # only, and the input's own nodes at every other (:mod:`einopt.stages.specialize`).
    only_at: AtShape | None = None

    @property
    def has_generated_kernels(self) -> bool:
        """Whether any node is one of einopt's generated kernels (``--kernels tvm``)."""
        return any(n.domain == KERNEL_DOMAIN for n in self.nodes)


def instantiate(
    program: ir.Program,
    *,
    onnx_names: Mapping[str, str],
    constants: Mapping[str, np.ndarray],
    opset: int,
    prefix: str,
    taken_function_names: set[str] | frozenset[str] = frozenset(),
    preferred: Mapping[str, str] | None = None,
    light: bool = False,
    backend: Backend = PORTABLE,
) -> Instantiated:
    """Emit ONNX nodes computing ``program``.

    Parameters
    ----------
    program : ir.Program
        The subprogram.
    onnx_names : mapping of str to str
        ONNX value names of the program's input tensors and output bindings
        (outputs are produced under exactly these names). Constant inputs
        without a name get an initializer of their own.
    constants : mapping of str to numpy.ndarray
        Arrays of the program inputs known at compile time (weights).
    opset : int
        Default-domain opset version to emit for (>= ``MIN_OPSET``).
    prefix : str
        Start of every new value, node and function name.
    taken_function_names : set of str
        Function names already used in the model.
    preferred : mapping of str to str, optional
        ONNX operator type to prefer per binding name (see :func:`original_ops`):
        a binding whose operator's matcher accepts it with no more run-time
        layout work than the table's first choice is instantiated as that operator.
    light : bool
        Leave the values of initializers over :data:`LIGHT_LIMIT` bytes out
        (``placeholders`` gives their names, types and shapes), and with them
        the work of computing them (folding large constant scopes, eOperators'
        Gather indices): enough to cost the result, not to run it. Large
        constants are not deduplicated by content then. Generated kernels are
        not compiled then (a session compiles what its nodes describe).
    backend : Backend
        How eOperators are written (:mod:`einopt.backends`; the module docstring).

    Returns
    -------
    Instantiated
        Nodes (topologically ordered), new initializers, eOperator functions
        and one :class:`Choice` per materialised scope.

    Raises
    ------
    InstantiationError
        On an opset outside ``[MIN_OPSET, onnx's latest]``, a program input or
        output without an ONNX name (and no constant value), or a scope no
        matcher accepts when eOperators are unavailable.
    """
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise InstantiationError(
            f"opset {opset} unsupported: need {MIN_OPSET} <= opset <= {onnx.defs.onnx_opset_version()}"
        )
    missing = [o for o in program.outputs if o not in onnx_names]
    if missing:
        raise InstantiationError(f"program output(s) {', '.join(missing)} have no ONNX name")
    em = _Emitter(program, onnx_names, constants, opset, prefix, set(taken_function_names), light, backend)
    outputs = set(program.outputs)
    preferred = preferred or {}
    grouped = {n: g for g in backend.groups(em, program, constants) for n in g}
    handled: set[str] = set()
    for name, scope in program.bindings:
        if name in handled:
            continue
        group = grouped.get(name)
        if group is not None:
            for n in group:  # tried once: each member is emitted on its own if it cannot be one kernel
                grouped.pop(n)
            if backend.emit_group(em, group):
                handled.update(group)
                continue
        prefer = preferred.get(name, "")
        if name in outputs:
            em.materialise(scope, name, onnx_names[name], prefer=prefer)
        elif scope not in em.scopes:
            em.materialise(scope, name, em.fresh(name), required=False, prefer=prefer)
    _split_tilings(em, program)
    backend.finish(em, {onnx_names[o] for o in program.outputs})
    inits, placeholders = [], []
    for name, arr in em.inits.items():
        if isinstance(arr, _Shaped):  # light: ``initializer`` kept no values
            dtype = helper.np_dtype_to_tensor_dtype(arr.dtype)
            placeholders.append(helper.make_tensor_value_info(name, dtype, list(arr.shape)))
        else:
            inits.append(numpy_helper.from_array(arr, name))
    produced = {o for n in em.nodes for o in n.output}
    value_info = tuple(
        helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(shape))
        for name, shape in em.shapes.items()
        if name in produced
    )
    return Instantiated(
        tuple(em.nodes),
        tuple(inits),
        tuple(em.functions),
        tuple(em.choices),
        tuple(placeholders),
        value_info,
    )


def _split_tilings(em: _Emitter, program: ir.Program) -> None:
    """Slices that cut one value into consecutive pieces along one axis, covering it, become one Split
    (one kernel instead of one per piece: the bindings a merged contraction feeds read such pieces)."""
    if em.opset < 13:  # the split sizes as an input
        return
    shapes = {name: scope.shape for scope, name in em.scopes.items()}
    shapes |= {em.tensors[t.name]: t.shape for t in program.inputs if t.name in em.tensors}
    tiles: dict[tuple[str, int], list[tuple[int, int, onnx.NodeProto]]] = {}
    for node in em.nodes:
        cut = _tile(em, node, shapes)
        if cut is not None:
            x, axis, start, end = cut
            tiles.setdefault((x, axis), []).append((start, end, node))
    for (x, axis), pieces in tiles.items():
        pieces.sort(key=lambda p: p[0])
        bounds = [0] + [end for _, end, _ in pieces]
        if len(pieces) < 2 or [s for s, _, _ in pieces] != bounds[:-1] or bounds[-1] != shapes[x][axis]:
            continue
        sizes = em.int64s([end - start for start, end, _ in pieces])
        dropped = {id(node) for _, _, node in pieces}
        source, outputs = x, [node.output[0] for _, _, node in pieces]
        biased = _biases_first(
            em, x, axis, [(node.output[0], end - start) for start, end, node in pieces], shapes
        )
        new: list[onnx.NodeProto] = []
        if biased is not None:  # the Split cuts the biased value into what the Adds computed
            bias, adds = biased
            outputs = [n.output[0] for n in adds]
            dropped |= {id(n) for n in adds}
            if not _into_gemm(em, x, bias, dropped):
                add = helper.make_node("Add", [x, bias], [em.fresh("biased")], name=em.node_name("add"))
                source, new = add.output[0], [add]
        new.append(helper.make_node("Split", [source, sizes], outputs, name=em.node_name("split"), axis=axis))
        first = min(i for i, n in enumerate(em.nodes) if id(n) in dropped)
        em.nodes = (
            [n for n in em.nodes[:first] if id(n) not in dropped]
            + new
            + [n for n in em.nodes[first:] if id(n) not in dropped]
        )
    em.drop_unread_integer_constants()


def _biases_first(
    em: _Emitter, x: str, axis: int, pieces: list[tuple[str, int]], shapes
) -> tuple[str, list[onnx.NodeProto]] | None:
    """When each piece ``(name, size)`` of ``x`` split along ``axis`` is read only by an ``Add`` of a
    constant over that piece (the gate biases after a merged LSTM MatMul): the initializer of the
    constants joined along ``axis``, to add before the Split, and the ``Add`` nodes it replaces
    (None otherwise). One kernel instead of one per piece, which ONNX Runtime fuses into the MatMul
    before it (a Gemm)."""
    outputs = set(em.onnx_names.values())
    full = shapes[x]
    rank = len(full)
    adds, values = [], []
    for piece, size in pieces:
        readers = [n for n in em.nodes if piece in n.input]
        if piece in outputs or len(readers) != 1 or readers[0].op_type != "Add":
            return None
        (add,) = readers
        if list(add.input).count(piece) != 1:
            return None
        value = em.known.get(add.input[1] if add.input[0] == piece else add.input[0])
        if value is None or np.dtype(value.dtype) != np.float32 or len(value.shape) > rank:
            return None
        shape = (1,) * (rank - len(value.shape)) + tuple(value.shape)
        if shape[axis] != size or any(d not in (1, full[i]) for i, d in enumerate(shape) if i != axis):
            return None
        adds.append(add)
        values.append((value, shape))
    if len({sh[:axis] + sh[axis + 1 :] for _, sh in values}) != 1:
        return None
    if any(isinstance(v, _Shaped) for v, _ in values):
        shape = values[0][1]
        joined: np.ndarray | _Shaped = _Shaped(
            shape[:axis] + (full[axis],) + shape[axis + 1 :], np.dtype(np.float32)
        )
    else:
        joined = np.concatenate([np.asarray(v, np.float32).reshape(sh) for v, sh in values], axis=axis)
    return em.initializer(joined, "bias"), adds


def _into_gemm(em: _Emitter, x: str, bias: str, dropped: set[int]) -> bool:
    """Make ``bias`` the C input of the Gemm computing ``x`` when it has none (and ``beta`` 1), no
    other node reads ``x`` and it is no program output: the Gemm adds it (one kernel fewer)."""
    gemm = next((n for n in em.nodes if x in n.output), None)
    if gemm is None or gemm.op_type != "Gemm" or len(gemm.input) != 2 or x in em.onnx_names.values():
        return False
    if any(a.name == "beta" and a.f != 1.0 for a in gemm.attribute):
        return False
    if any(x in n.input and id(n) not in dropped for n in em.nodes):
        return False
    gemm.input.append(bias)
    key = em.key_of.pop(x, None)  # no longer the bias-less Gemm it was emitted as
    if key is not None:
        em.interned.pop(key, None)
    return True


def _tile(em: _Emitter, node: onnx.NodeProto, shapes) -> tuple[str, int, int, int] | None:
    """``(x, axis, start, end)`` of a Slice of ``x`` along one axis with step 1 (None otherwise)."""
    if node.op_type != "Slice" or len(node.input) < 4 or node.input[0] not in shapes:
        return None
    values = [em.known.get(n) for n in node.input[1:]]
    if any(not isinstance(v, np.ndarray) or v.size != 1 for v in values):
        return None
    start, end, axis, *step = (int(v.reshape(-1)[0]) for v in values)
    extent = shapes[node.input[0]]
    axis = axis + len(extent) if axis < 0 else axis
    if step not in ([], [1]) or not 0 <= axis < len(extent) or start < 0:
        return None
    return node.input[0], axis, start, min(end, extent[axis]) if end >= 0 else extent[axis] + end


def original_ops(model: onnx.ModelProto, part: Part) -> dict[str, str]:
    """The ONNX operator type that computed each binding of ``part`` in ``model`` (``preferred`` of
    :func:`instantiate`).

    ``model`` is the graph the part was cut from (its ``nodes`` index it);
    bindings no node of the part produces are left out.
    """
    if part.program is None:
        return {}
    producer = {o: model.graph.node[i].op_type for i in part.nodes for o in model.graph.node[i].output if o}
    return {
        name: producer[part.names[name]]
        for name, _ in part.program.bindings
        if part.names.get(name) in producer
    }


def _identifier(text: str) -> str:
    out = re.sub(r"\W", "_", text)
    return out if out and not out[0].isdigit() else "_" + out


class _Emitter:
    """Names, interned nodes and initializers, and compile-time values of one instantiation."""

    def __init__(
        self,
        program: ir.Program,
        onnx_names: Mapping[str, str],
        constants: Mapping[str, np.ndarray],
        opset: int,
        prefix: str,
        taken_functions: set[str],
        light: bool = False,
        backend: Backend = PORTABLE,
    ) -> None:
        self.light = light
        self.backend = backend
        self.program = program
        self.onnx_names = onnx_names
        self.constants = constants
        self.opset = opset
        self.prefix = prefix
        self.taken_functions = taken_functions
        self.used = FreshNames(onnx_names.values())
        self.node_names = FreshNames()
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray | _Shaped] = {}
        self.init_by_content: dict[tuple, str] = {}
        self.known: dict[str, np.ndarray | _Shaped] = {}  # compile-time values by ONNX name
        self.interned: dict[tuple, str] = {}
        self.key_of: dict[str, tuple] = {}
        self.scopes: dict[ir.Scope, str] = {}
        self.tensors: dict[str, str] = {}
        self.unmatched_scopes: dict[ir.Scope, bool] = {}  # scopes no matcher accepts (a backend's memo)
        self.functions: list[onnx.FunctionProto] = []
        self.choices: list[Choice] = []
        self.inline_count: dict[str, int] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}  # outputs whose shapes ONNX cannot infer
        const_scopes = {s for s in ir.scopes_in(program) if self.reads_constants(s)}
        const_tensors = {t for t in program.inputs if t.name in constants}
        self.ctx = MatchContext(
            constant=frozenset(const_tensors | const_scopes),
            bound=frozenset(s for _, s in program.bindings),
            opset=opset,
            values=constants,
        )

    # ---- names -----------------------------------------------------------

    def fresh(self, base: str) -> str:
        return self.used.fresh(self.prefix + _identifier(base))

    def node_name(self, base: str) -> str:
        return self.node_names.fresh(self.prefix + _identifier(base))

    # ---- values ----------------------------------------------------------

    def initializer(self, arr: np.ndarray | _Shaped, base: str) -> str:
        # Costed, never run: no values, no hashing (a value derived from one without values, e.g. a
        # small slice of a large weight, has none either).
        if isinstance(arr, _Shaped) or (self.light and _weightlike(arr)):
            name = self.fresh(base)
            self.inits[name] = self.known[name] = _Shaped(tuple(arr.shape), np.dtype(arr.dtype))
            return name
        arr = np.ascontiguousarray(arr)
        digest = hashlib.blake2b(
            memoryview(arr.reshape(-1)).cast("B") if arr.size else b"", digest_size=16
        ).hexdigest()
        key = (arr.dtype.str, arr.shape, digest)
        name = self.init_by_content.get(key)
        if name is None:
            name = self.fresh(base)
            self.inits[name] = arr
            self.init_by_content[key] = name
            self.known[name] = arr
        return name

    def drop_unread_integer_constants(self) -> None:
        """Integer initializers (shapes, split sizes, axes) that no node reads any more."""
        read = {i for n in self.nodes for i in n.input}
        for name in [n for n, v in self.inits.items() if n not in read and np.dtype(v.dtype).kind == "i"]:
            del self.inits[name]

    def int64s(self, values: tuple[int, ...] | list[int]) -> str:
        return self.initializer(np.asarray(values, dtype=np.int64), "shape")

    def scalar(self, v: float) -> str:
        return self.initializer(np.asarray(v, dtype=np.float32), "const")

    def tensor(self, t: ir.Tensor) -> str:
        name = self.tensors.get(t.name)
        if name is not None:
            return name
        if t.name in self.onnx_names:
            name = self.onnx_names[t.name]
            if t.name in self.constants:
                self.known[name] = np.asarray(self.constants[t.name], dtype=np.float32)
        elif t.name in self.constants:
            name = self.initializer(np.asarray(self.constants[t.name], dtype=np.float32), t.name)
        else:
            raise InstantiationError(f"program input {t.name} has no ONNX name and no constant value")
        self.tensors[t.name] = name
        return name

    def value_of(self, src: ir.Tensor | ir.Scope | Literal, label: str) -> str:
        if isinstance(src, ir.Tensor):
            return self.tensor(src)
        if isinstance(src, Literal):
            v = src.value
            return self.initializer(v if v.dtype == np.int64 else v.astype(np.float32), "const")
        if src in self.scopes:
            return self.scopes[src]
        k = self.inline_count[label] = self.inline_count.get(label, 0) + 1
        return self.materialise(src, f"{label}/{k}", None)

    # ---- nodes -----------------------------------------------------------

    def node(
        self, op_type: str, inputs: list[str], attrs: tuple[tuple[str, Any], ...] = (), **kw: Any
    ) -> str:
        """The output of ``op_type(inputs)``, emitted once per distinct node."""
        key = (op_type, tuple(inputs), attrs, kw.get("domain", ""))
        out = self.interned.get(key)
        if out is None:
            out = self.fresh(kw.pop("base", op_type.lower()))
            clean = {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs}
            self.nodes.append(
                helper.make_node(op_type, inputs, [out], name=self.node_name(op_type.lower()), **clean, **kw)
            )
            self.interned[key] = out
            self.key_of[out] = key
        return out

    def steps(self, name: str, steps: tuple[LayoutStep, ...]) -> str:
        for st in steps:
            value = self.known.get(name)
            if isinstance(value, _Shaped):
                name = self.initializer(_Shaped(st.out_shape(value.shape), value.dtype), "folded")
            elif value is not None:
                name = self.initializer(st.apply(value).astype(value.dtype), "folded")
            else:
                name = _STEP_EMITTERS[type(st)](self, name, st)
        return name

    def bind(self, value: str, target: str, first_node: int, required: bool = True) -> str:
        """Make ``value`` available as ``target``: rename its fresh node's output, else (if the
        name is ``required``) copy it with Identity."""
        last = self.nodes[-1] if len(self.nodes) > first_node else None
        reused = value in self.onnx_names.values() or value in self.scopes.values()
        if last is not None and list(last.output) == [value] and not reused:
            last.output[0] = target
            if value in self.shapes:
                self.shapes[target] = self.shapes.pop(value)
            key = self.key_of.pop(value)
            self.interned[key] = target
            self.key_of[target] = key
            return target
        if not required:
            return value
        self.nodes.append(helper.make_node("Identity", [value], [target], name=self.node_name("identity")))
        return target

    # ---- scopes ----------------------------------------------------------

    def materialise(
        self, scope: ir.Scope, label: str, target: str | None, required: bool = True, prefer: str = ""
    ) -> str:
        """The ONNX value holding ``scope``: named ``target`` when given (if not ``required``,
        only when that costs no Identity node); ``prefer`` is the operator type to prefer."""
        done = self.scopes.get(scope)
        if done is not None:
            if target is None or target == done:
                return done
            return self.bind(done, target, len(self.nodes))
        first = len(self.nodes)
        failures: tuple[tuple[str, str], ...] = ()
        if self.reads_constants(scope):  # a program's scope, or one a match made (a folded bias)
            shaped = _Shaped(scope.shape, np.dtype(np.float32))
            if self.light and _weightlike(shaped):
                value = self.initializer(shaped, label)
            else:
                value = self.initializer(np.asarray(evaluate(scope, self.constants), dtype=np.float32), label)
            how = "constant"
        else:
            m, fails = match(scope, self.ctx, MATCHERS, prefer)
            failures = tuple((n, f.reason) for n, f in fails)
            written = self.backend.emit_match(self, scope, m, label) if m is not None else None
            if written is not None:
                value, how = written
            elif m is not None:
                value, how = self.emit_match(m, label), m.op_type
            else:
                value, how = self.eoperator(scope, label)
        if target is not None:
            value = self.bind(value, target, first, required)
        self.scopes[scope] = value
        self.choices.append(Choice(label, how, failures))
        log.debug("%s: %s", label, how)
        return value

    def reads_constants(self, scope: ir.Scope) -> bool:
        """Whether every tensor ``scope`` reads is a known constant (it is then a compile-time value)."""
        return all(t.name in self.constants for t in ir.input_tensors(scope))

    def emit_match(self, m: OperatorMatch, label: str) -> str:
        values = [self.steps(self.value_of(op.source, label), op.steps) for op in m.operands]
        for op in m.ops:
            inputs = ["" if i is None else values[i] for i in op.inputs]
            inputs, attrs = _FORMS.get(op.op_type, _same)(self, inputs, op.attrs)
            values.append(self.node(op.op_type, inputs, attrs, domain=op.domain))
            if op.shape is not None:
                self.shapes[values[-1]] = op.shape
        return self.steps(values[-1] if m.ops else values[0], m.post)

    def eoperator(self, scope: ir.Scope, label: str) -> tuple[str, str]:
        kind = eop.eop_name(scope)
        written = self.backend.emit_eoperator(self, scope, label, kind)
        if written is not None:
            return written
        fname = unique_name(_identifier(self.prefix + kind), self.taken_functions)
        op = eop.eoperator(scope, fname, self.opset, self.light)
        self.functions.append(op.function)
        inputs = [self.value_of(s, label) for s in op.sources]
        out = self.node(op.function.name, inputs, (), domain=EOP_DOMAIN, base=kind)
        return out, f"eop:{kind}"


# --------------------------------------------------------------------------
# Operator forms that depend on the opset
# --------------------------------------------------------------------------

Attrs = tuple[tuple[str, Any], ...]


def _same(em: _Emitter, inputs: list[str], attrs: Attrs) -> tuple[list[str], Attrs]:
    return inputs, attrs


def _reduce_sum(em: _Emitter, inputs: list[str], attrs: Attrs) -> tuple[list[str], Attrs]:
    """ReduceSum's axes are an input from opset 13, an attribute before."""
    if em.opset >= 13:
        return inputs, attrs
    axes = tuple(int(a) for a in em.known[inputs[1]])
    return inputs[:1], (*attrs, ("axes", axes))


def _clip(em: _Emitter, inputs: list[str], attrs: Attrs) -> tuple[list[str], Attrs]:
    """Clip's bounds are inputs from opset 11, attributes before."""
    if em.opset >= 11:
        return inputs, attrs
    bounds = tuple(
        (name, float(np.asarray(em.known[i]).reshape(-1)[0]))
        for name, i in zip(("min", "max"), inputs[1:], strict=False)
        if i
    )
    return inputs[:1], (*attrs, *bounds)


def _einsum(em: _Emitter, inputs: list[str], attrs: Attrs) -> tuple[list[str], Attrs]:
    _needs(em, "Einsum", EINSUM_OPSET)
    return inputs, attrs


def _needs(em: _Emitter, what: str, opset: int) -> None:
    if em.opset < opset:
        raise InstantiationError(f"{what} needs opset {opset} (the model has {em.opset})")


_FORMS: dict[str, Callable[[_Emitter, list[str], Attrs], tuple[list[str], Attrs]]] = {
    "ReduceSum": _reduce_sum,
    "Clip": _clip,
    "Einsum": _einsum,
}


# --------------------------------------------------------------------------
# Layout steps as ONNX nodes
# --------------------------------------------------------------------------


def _slice(em: _Emitter, x: str, st: Slice) -> str:
    if em.opset < 10:  # attributes, and no steps
        if any(s != 1 for s in st.steps):
            raise InstantiationError(f"a strided Slice needs opset 10 (the model has {em.opset})")
        return em.node("Slice", [x], (("starts", st.starts), ("ends", st.ends), ("axes", st.axes)))
    return em.node(
        "Slice", [x, em.int64s(st.starts), em.int64s(st.ends), em.int64s(st.axes), em.int64s(st.steps)]
    )


def _pad(em: _Emitter, x: str, st: Pad) -> str:
    if em.opset < 11:
        return em.node("Pad", [x], (("pads", st.pads),))
    return em.node("Pad", [x, em.int64s(st.pads)])


def _transpose(em: _Emitter, x: str, st: Transpose) -> str:
    return em.node("Transpose", [x], (("perm", st.perm),))


def _reshape(em: _Emitter, x: str, st: Reshape) -> str:
    return em.node("Reshape", [x, em.int64s(st.shape)])


def _expand(em: _Emitter, x: str, st: Expand) -> str:
    _needs(em, "Expand", 8)
    return em.node("Expand", [x, em.int64s(st.shape)])


def _scale(em: _Emitter, x: str, st: Scale) -> str:
    return em.node("Mul", [x, em.scalar(st.factor)])


def _depth_to_space(em: _Emitter, x: str, st: DepthToSpace) -> str:
    if em.opset < 11:  # no mode attribute: DCR only
        if st.mode != "DCR":
            raise InstantiationError(f"DepthToSpace mode {st.mode} needs opset 11 (the model has {em.opset})")
        return em.node("DepthToSpace", [x], (("blocksize", st.blocksize),))
    return em.node("DepthToSpace", [x], (("blocksize", st.blocksize), ("mode", st.mode)))


def _space_to_depth(em: _Emitter, x: str, st: SpaceToDepth) -> str:
    return em.node("SpaceToDepth", [x], (("blocksize", st.blocksize),))


_STEP_EMITTERS: dict[type, Callable[[_Emitter, str, Any], str]] = {
    Slice: _slice,
    Pad: _pad,
    Transpose: _transpose,
    Reshape: _reshape,
    Expand: _expand,
    Scale: _scale,
    DepthToSpace: _depth_to_space,
    SpaceToDepth: _space_to_depth,
}

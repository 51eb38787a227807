"""Translate a prepared ONNX graph into subprograms of einopt expressions.

:func:`translate_graph` classifies every node by trying its importer on
boundary operands, groups the translatable ones (``partition.group_nodes``)
and translates each group into an ``ir.Program``: the values it reads from
outside become input tensors (constants keep their arrays), the values it
produces for the rest of the graph become outputs.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from einopt.core import ir
from einopt.core.rewrite import sort_bindings
from einopt.frontend.importers import IMPORTERS, import_node, sanitize_name
from einopt.frontend.onnx_graph import constants
from einopt.frontend.operand import NodeView, Operand, Unsupported, node_attrs
from einopt.frontend.partition import ACTIVATIONS, absorb_gates, group_nodes
from einopt.opsets import DEFAULT_DOMAINS, default_opset

log = logging.getLogger(__name__)

_FLOAT = onnx.TensorProto.FLOAT


@dataclasses.dataclass(frozen=True)
class ValueType:
    """What shape inference knows about an ONNX value."""

    elem_type: int
    shape: tuple[int, ...] | None  # None unless every dimension is a known non-negative int


@dataclasses.dataclass(frozen=True, eq=False)
class Part:
    """One subprogram: original nodes, their translation, and the ONNX boundary.

    ``program`` is ``None`` for nodes that pass through (``reason`` says why).
    ``names`` maps the program's input tensor and output binding names to ONNX
    value names; ``constants`` maps input tensor names to their arrays.
    """

    name: str
    kind: str  # "linear" | "activation" | "passthrough"
    nodes: tuple[int, ...]  # indices into graph.node
    program: ir.Program | None = None
    names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    constants: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    reason: str | None = None

    @property
    def translated(self) -> bool:
        return self.program is not None


def value_types(model: onnx.ModelProto) -> dict[str, ValueType]:
    """Element type and concrete shape of every value shape inference knows."""
    g = model.graph
    out: dict[str, ValueType] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        shape: tuple[int, ...] | None = None
        if t.HasField("shape"):
            dims = t.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                shape = tuple(int(d.dim_value) for d in dims)
        if shape is not None or vi.name not in out:  # a declared symbolic output keeps an inferred shape
            out[vi.name] = ValueType(t.elem_type, shape)
    for init in g.initializer:
        out[init.name] = ValueType(init.data_type, tuple(int(d) for d in init.dims))
    return out


class _Names:
    """Injective map from ONNX value names to einopt identifiers."""

    def __init__(self) -> None:
        self.ir: dict[str, str] = {}
        self.taken: set[str] = set()

    def __call__(self, onnx_name: str) -> str:
        if onnx_name not in self.ir:
            self.ir[onnx_name] = sanitize_name(onnx_name, self.taken)
        return self.ir[onnx_name]


class _Translator:
    """Per-graph state shared by the classification and the group translation."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.graph = model.graph
        self.opset = default_opset(model)
        self.types = value_types(model)
        self.constant_protos = constants(model.graph)
        self._arrays: dict[str, np.ndarray] = {}
        self.names = _Names()
        self.new_constants: dict[str, np.ndarray] = {}
        self.fed = {i.name for i in model.graph.input}

    def array(self, name: str) -> np.ndarray | None:
        if name not in self.constant_protos:
            return None
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self.constant_protos[name])
        return self._arrays[name]

    def boundary(self, name: str) -> Operand:
        """The operand for a value read from outside the subprogram."""
        vt = self.types.get(name)
        value = self.array(name)
        elem = vt.elem_type if vt else 0
        shape = vt.shape if vt else None
        if value is not None:
            shape = tuple(value.shape)
        expr = None
        if elem == _FLOAT and shape is not None and all(d > 0 for d in shape):
            expr = ir.Tensor(self.names(name), shape)
        return Operand(name, expr, shape, elem, value, fed=name in self.fed)

    def view(self, node: onnx.NodeProto, operands: Mapping[str, Operand]) -> NodeView:
        inputs = tuple(operands[n] if n else None for n in node.input)
        shapes = tuple(self.types[o].shape if o in self.types else None for o in node.output)
        return NodeView(node, inputs, shapes, self.opset or 0, node_attrs(node), self._new_constant)

    def _new_constant(self, array: np.ndarray, hint: str) -> ir.Tensor:
        # A fresh name per constant: two nodes with the same hint (two BatchNormalizations)
        # must not share one (``self.names`` would map the same hint to the same name).
        name = sanitize_name("c_" + hint, self.names.taken)
        arr = np.asarray(array, dtype=np.float32)
        self.new_constants[name] = arr
        return ir.Tensor(name, tuple(arr.shape))

    def import_node(self, node: onnx.NodeProto, operands: Mapping[str, Operand]) -> tuple[ir.Scope, ...]:
        """Translate one node; raises Unsupported with the reason it cannot be."""
        if node.op_type not in IMPORTERS or node.domain not in DEFAULT_DOMAINS:
            return import_node(self.view(node, operands))  # raises Unsupported with the reason
        if self.opset is None:
            raise Unsupported("the model imports no default-domain opset")
        for o in node.output:
            vt = self.types.get(o)
            if o and (vt is None or vt.elem_type != _FLOAT):
                raise Unsupported(f"output {o!r} is not float32")
            if o and vt.shape is None:
                raise Unsupported(f"output {o!r} has a symbolic or unknown shape")
        try:
            scopes = import_node(self.view(node, operands))
        except ir.IRError as e:
            raise Unsupported(f"{node.op_type}: {e}") from e
        for o, s in zip(node.output, scopes, strict=True):
            if o and s.shape != self.types[o].shape:
                raise Unsupported(
                    f"{node.op_type}: translated shape {list(s.shape)} != inferred {list(self.types[o].shape)}"
                )
        return scopes

    def classify(self, index: int, node: onnx.NodeProto) -> tuple[str | None, str | None]:
        """(kind, reason): kind is None when the node passes through."""
        try:
            self.import_node(node, {n: self.boundary(n) for n in node.input if n})
        except Unsupported as e:
            return None, str(e)
        return ("activation" if node.op_type in ACTIVATIONS else "linear"), None


def translate_graph(model: onnx.ModelProto, *, fuse_activations: bool = False) -> list[Part]:
    """Partition and translate a shape-inferred model.

    With ``fuse_activations`` (generated kernels: ``--kernels tvm``), element-wise activations join
    the element-wise work around them (see :func:`~einopt.frontend.partition.group_nodes`), which a
    generated kernel computes whole (:mod:`einopt.backends.tvm.kernelfusion`).

    Returns one :class:`Part` per subprogram and one per passed-through node,
    in graph order of their first node.
    """
    t = _Translator(model)
    nodes = list(t.graph.node)
    classes = [t.classify(i, n) for i, n in enumerate(nodes)]
    kinds = absorb_gates(nodes, [k for k, _ in classes], t.constant_protos)
    groups = group_nodes(nodes, kinds, t.constant_protos, fuse_activations=fuse_activations)
    in_group = {i for g in groups for i in g.nodes}
    readers: dict[str, set[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, set()).add(i)
    graph_outputs = {o.name for o in t.graph.output}

    parts: list[Part] = []
    for g in groups:
        parts.append(_translate_group(t, nodes, g.nodes, g.kind, readers, graph_outputs, len(parts)))
    for i, node in enumerate(nodes):
        if i not in in_group:
            parts.append(Part(_part_name(len(parts), [node]), "passthrough", (i,), reason=classes[i][1]))
    parts.sort(key=lambda p: p.nodes[0])
    return parts


def _part_name(k: int, nodes: Sequence[onnx.NodeProto]) -> str:
    first = nodes[0]
    label = re.sub(r"\W", "_", first.name or first.op_type.lower())
    return f"sp{k}_{label}"


def _translate_group(
    t: _Translator,
    nodes: Sequence[onnx.NodeProto],
    members: tuple[int, ...],
    kind: str,
    readers: Mapping[str, set[int]],
    graph_outputs: set[str],
    k: int,
) -> Part:
    member_set = set(members)
    group_nodes_ = [nodes[i] for i in members]
    name = _part_name(k, group_nodes_)
    operands: dict[str, Operand] = {}
    produced: dict[str, ir.Scope] = {}
    t.new_constants = {}
    try:
        for node in group_nodes_:
            for n in node.input:
                if n and n not in operands:
                    operands[n] = t.boundary(n)
            scopes = t.import_node(node, operands)
            for o, s in zip(node.output, scopes, strict=True):
                if o:
                    vt = t.types[o]
                    operands[o] = Operand(o, s, s.shape, vt.elem_type)
                    produced[o] = s
    except Unsupported as e:  # a node that translated alone may still fail in context
        return Part(name, "passthrough", members, reason=str(e))

    outputs = [
        o for o in produced if o in graph_outputs or any(r not in member_set for r in readers.get(o, ()))
    ]
    bindings: list[tuple[str, ir.Scope]] = []
    names: dict[str, str] = {}
    for o, s in produced.items():
        bname = t.names(o)
        bindings.append((bname, s))
        names[bname] = o
    # Producers first: a node's scope can equal one nested in an earlier node's (a ReduceMean of
    # what a LayerNormalization normalises is that LayerNormalization's mean), which reads it then.
    bindings = list(sort_bindings(bindings))
    needed = _needed(bindings, {t.names(o) for o in outputs})
    bindings = [(n, s) for n, s in bindings if n in needed]
    inputs: dict[str, ir.Tensor] = {}
    for _, s in bindings:
        for tensor in ir.input_tensors(s):
            inputs[tensor.name] = tensor
    constants: dict[str, np.ndarray] = {}
    onnx_of_ir = {v: k for k, v in t.names.ir.items()}
    for tname in inputs:
        if tname in t.new_constants:
            constants[tname] = t.new_constants[tname]
            continue
        onnx_name = onnx_of_ir[tname]
        names[tname] = onnx_name
        value = t.array(onnx_name)
        if value is not None:
            constants[tname] = value
    program = ir.Program(
        tuple(inputs[n] for n in sorted(inputs)),
        tuple(bindings),
        tuple(t.names(o) for o in outputs),
    )
    return Part(name, kind, members, program, names, constants)


def _needed(bindings: Sequence[tuple[str, ir.Scope]], outputs: set[str]) -> set[str]:
    """Binding names the outputs depend on (dead intermediate bindings are dropped)."""
    by_scope: dict[ir.Scope, list[str]] = {}
    for n, s in bindings:
        by_scope.setdefault(s, []).append(n)
    needed = set(outputs)
    for n, s in reversed(bindings):
        if n in needed:
            for sub in ir.scopes_in(s):
                if sub is not s and sub in by_scope:
                    needed.add(by_scope[sub][0])
    return needed

"""ONNX models out of expressions: a whole model from one program (:func:`program_model`, and
:func:`to_onnx`, the public API's form), or an input model with its rewritten subprograms' nodes
replaced (:func:`assemble`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from einopt.backends import Backend
from einopt.backends.portable import PORTABLE
from einopt.core import ir
from einopt.frontend.onnx_graph import read_counts, subgraph_reads, unique_name
from einopt.instantiate.emit import Instantiated, instantiate, light_omits
from einopt.runtime.modelio import missing_opsets

PROGRAM_OPSET = 17
"""Default-domain opset of models built from programs (ONNX Runtime runs it everywhere)."""

_DTYPES = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE}


def program_model(
    program: ir.Program,
    constants: Mapping[str, np.ndarray] | None = None,
    *,
    opset: int = PROGRAM_OPSET,
    name: str = "einopt",
    light: bool = False,
    backend: Backend = PORTABLE,
) -> tuple[onnx.ModelProto, Instantiated]:
    """A model computing ``program``, runnable in stock ONNX Runtime, and how it was instantiated.

    Parameters
    ----------
    program : ir.Program
        The program; its outputs become the graph outputs, under their binding names.
    constants : mapping of str to numpy.ndarray, optional
        Values of inputs that are weights: they become initializers (float32)
        and may be folded at compile time. Every other input is a graph input
        under its tensor name.
    opset : int
        Default-domain opset to emit for.
    name : str
        The graph's name.
    light : bool
        Weights and folded constants over ``emit.LIGHT_LIMIT`` bytes become typed
        graph inputs instead of initializers: a model to cost (same nodes,
        shapes, FLOPs and bytes), not to run. The search costs candidates so.
    backend : Backend
        How eOperators are written (:mod:`einopt.backends`).

    Returns
    -------
    (onnx.ModelProto, Instantiated)
        The model (eOperators as model-local functions) and the instantiation's choices.
    """
    constants = dict(constants or {})
    known = {t.name for t in program.inputs}
    unknown = sorted(set(constants) - known)
    if unknown:
        raise ValueError(f"constants {', '.join(unknown)} are not inputs of the program")
    names = {t.name: t.name for t in program.inputs} | {o: o for o in program.outputs}
    inst = instantiate(
        program, onnx_names=names, constants=constants, opset=opset, prefix="e/", light=light, backend=backend
    )
    used = {i for n in inst.nodes for i in n.input}
    # Without values (``light``): large weights the nodes read are declared like activations.
    declared = {
        n for n, v in constants.items() if light and n in used and light_omits(np.float32, np.size(v) * 4)
    }
    graph = helper.make_graph(
        list(inst.nodes),
        name,
        [
            helper.make_tensor_value_info(t.name, _DTYPES.get(t.dtype, onnx.TensorProto.FLOAT), t.shape)
            for t in program.inputs
            if t.name not in constants or t.name in declared
        ]
        + list(inst.placeholders),
        [
            helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, program.scope(o).shape)
            for o in program.outputs
        ],
        [
            numpy_helper.from_array(np.asarray(constants[t.name], dtype=np.float32), t.name)
            for t in program.inputs
            if t.name in constants and t.name in used and t.name not in declared
        ]
        + list(inst.initializers),
        value_info=list(inst.value_info),
    )
    opsets = [helper.make_opsetid("", opset), *missing_opsets(inst.nodes)]
    model = helper.make_model(
        graph, opset_imports=opsets, functions=list(inst.functions), producer_name="einopt"
    )
    model.ir_version = 8
    return model, inst


def weight_names(constants: Mapping[str, np.ndarray], inst: Instantiated) -> frozenset[str]:
    """The names in a :func:`program_model` model that hold weights: the constants and, in a ``light``
    one, the folded constants declared by shape (what :func:`einopt.runtime.opcost.node_costs` folds)."""
    return frozenset(constants) | {v.name for v in inst.placeholders}


def as_program(node: ir.Scope | ir.Program) -> ir.Program:
    """``node`` as a program: a program as it is, a scope as the program computing it as ``Y``
    (``Y_1``, ... when an input is named ``Y``)."""
    if isinstance(node, ir.Program):
        return node
    if not isinstance(node, ir.Scope):
        raise TypeError(f"expected an einopt Scope or Program, not {type(node).__name__}")
    inputs = tuple(ir.input_tensors(node))
    out = unique_name("Y", {t.name for t in inputs})
    return ir.Program(inputs, ((out, node),), (out,))


def to_onnx(
    source: ir.Scope | ir.Program | object,
    constants: Mapping[str, np.ndarray] | None = None,
    *,
    opset: int = PROGRAM_OPSET,
) -> onnx.ModelProto:
    """An ONNX model computing an expression, a program or a search candidate (``einopt.to_onnx``).

    Parameters
    ----------
    source : ir.Scope, ir.Program or einopt.search.Candidate
        What to compute. A scope becomes the program with one output ``Y``
        (see :func:`as_program`); a candidate contributes its program.
    constants : mapping of str to numpy.ndarray, optional
        Values of inputs that are weights; they become initializers. Every
        other input is a graph input under its tensor name.
    opset : int
        Default-domain opset to emit for.

    Returns
    -------
    onnx.ModelProto
        A model stock ONNX Runtime runs: graph inputs are the non-constant
        input tensors, graph outputs the program's outputs, by name;
        eOperators are model-local functions.

    Raises
    ------
    TypeError
        ``source`` is none of the above.
    einopt.instantiate.emit.InstantiationError
        Some scope matches no operator and no eOperator.

    Examples
    --------
    >>> import einopt
    >>> mm = einopt.parse("L[i:3, j:2] Sum[k:4] X[i, k] * W[k, j] where X: [3, 4], W: [4, 2]")
    >>> [n.op_type for n in einopt.to_onnx(mm).graph.node]
    ['MatMul']
    """
    from einopt.search import Candidate

    program = source.program if isinstance(source, Candidate) else as_program(source)
    return program_model(program, constants, opset=opset)[0]


def assemble(
    model: onnx.ModelProto,
    replacements: Mapping[tuple[int, ...], object],
) -> onnx.ModelProto:
    """A copy of ``model`` with each node group replaced by an instantiation.

    Parameters
    ----------
    model
        The prepared model the parts were translated from.
    replacements
        Maps the node indices of a part to its ``Instantiated`` (``nodes``,
        ``initializers``, ``functions``).

    Graph inputs, outputs, opset imports and metadata are kept; initializers
    no node reads any more are dropped; nodes are put in topological order.
    Generated kernels of different parts that embed the same kernel library
    read one copy of it.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    old = list(model.graph.node)
    owner = {i: key for key in replacements for i in key}
    nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    new_infos: list[onnx.ValueInfoProto] = []
    functions: list[onnx.FunctionProto] = []
    for i, node in enumerate(old):
        key = owner.get(i)
        if key is None:
            nodes.append(node)
        elif i == key[0]:
            inst = replacements[key]
            nodes.extend(inst.nodes)
            new_inits.extend(inst.initializers)
            new_infos.extend(inst.value_info)
            functions.extend(inst.functions)
    nodes = toposort(
        nodes, {i.name for i in g.input} | {t.name for t in g.initializer} | {t.name for t in new_inits}
    )
    del g.node[:]
    g.node.extend(nodes)

    used = set(read_counts(g)) | {o.name for o in g.output} | {i.name for i in g.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept + [t for t in new_inits if t.name in used])

    produced = {o for n in nodes for o in n.output} | {i.name for i in g.input}
    infos = {vi.name: vi for vi in [*g.value_info, *new_infos]}  # a new node's output: its own
    vis = [vi for name, vi in infos.items() if name in produced]
    del g.value_info[:]
    g.value_info.extend(vis)

    out.opset_import.extend(missing_opsets(nodes, out.opset_import))
    if functions:
        out.functions.extend(functions)
        out.ir_version = max(out.ir_version, 8)  # model-local functions need IR version 8
    return out


def toposort(nodes: Sequence[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Stable topological order (a node keeps its place unless it reads a later node's output)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    done: list[bool] = [False] * len(nodes)
    order: list[onnx.NodeProto] = []

    def deps(k: int) -> list[int]:
        reads = set(nodes[k].input)
        for a in nodes[k].attribute:  # outer-scope values read by subgraphs
            for sub in [a.g] if a.HasField("g") else a.graphs:
                reads.update(subgraph_reads(sub))
        return sorted(producer[r] for r in reads if r in producer and r not in available and producer[r] != k)

    for start in range(len(nodes)):
        if done[start]:
            continue
        stack = [(start, iter(deps(start)))]
        on_stack = {start}
        while stack:
            k, it = stack[-1]
            nxt = next((d for d in it if not done[d]), None)
            if nxt is None:
                stack.pop()
                on_stack.discard(k)
                if not done[k]:
                    done[k] = True
                    order.append(nodes[k])
            elif nxt in on_stack:
                raise ValueError(f"graph has a cycle through node {nodes[nxt].name or nodes[nxt].op_type}")
            else:
                on_stack.add(nxt)
                stack.append((nxt, iter(deps(nxt))))
    return order

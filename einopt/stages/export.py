"""ONNX models out of expressions: a whole model from an expression, a program or a search candidate
(:func:`to_onnx`, the public API's form of :func:`einopt.instantiate.program.program_model`), or an
input model with its rewritten subprograms' nodes replaced (:func:`assemble`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from einopt.core import ir
from einopt.frontend.onnx_graph import read_counts, subgraph_reads
from einopt.instantiate.program import PROGRAM_OPSET, as_program, program_model
from einopt.runtime.modelio import missing_opsets
from einopt.search import Candidate


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
        (see :func:`einopt.instantiate.program.as_program`); a candidate contributes its program.
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
    # Nodes that computed only what the replaced ones read (a Reshape target from Shape, Gather and
    # Concat, as exporters write for a symbolic dimension) go with them, and so do new nodes whose
    # outputs nothing reads any more (a part folded to a constant leaves its producers' rewrites
    # with no reader); nodes the input model computed for nothing stay.
    was_dead = {id(n) for n in old} - {id(n) for n in _live(old, model.graph.output)}
    reads = {id(n) for n in _live(nodes, g.output)}
    nodes = [n for n in nodes if id(n) in reads or id(n) in was_dead]
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

    out.opset_import.extend(missing_opsets(nodes, out.opset_import, functions))
    if functions:
        out.functions.extend(functions)
        out.ir_version = max(out.ir_version, 8)  # model-local functions need IR version 8
    return out


def _live(nodes: Sequence[onnx.NodeProto], outputs) -> list[onnx.NodeProto]:
    """The ``nodes`` (topologically ordered) whose outputs reach ``outputs``."""
    needed = {o.name for o in outputs}
    live = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(i for i in node.input if i)
            for a in node.attribute:
                for sub in [a.g] if a.HasField("g") else a.graphs:
                    needed.update(subgraph_reads(sub))
    return live


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

"""Assemble the output model: replace rewritten subprograms' nodes by their instantiation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from einopt.frontend.onnx_graph import read_counts, subgraph_reads
from einopt.instantiate import EOP_DOMAIN


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
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    old = list(model.graph.node)
    owner = {i: key for key in replacements for i in key}
    nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    functions: list[onnx.FunctionProto] = []
    for i, node in enumerate(old):
        key = owner.get(i)
        if key is None:
            nodes.append(node)
        elif i == key[0]:
            inst = replacements[key]
            nodes.extend(inst.nodes)
            new_inits.extend(inst.initializers)
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
    vis = [vi for vi in g.value_info if vi.name in produced]
    del g.value_info[:]
    g.value_info.extend(vis)

    if functions:
        out.functions.extend(functions)
        if not any(o.domain == EOP_DOMAIN for o in out.opset_import):
            out.opset_import.append(onnx.helper.make_opsetid(EOP_DOMAIN, 1))
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

"""Rewrites kept at the searched shape only, behind a run-time test of the model's input shapes.

A model with symbolic dimensions is searched at their representative values. A rewrite whose sizes
cannot be written for every value (:mod:`einopt.stages.generalize`: a layout that needs a batch of 1,
an eOperator written for the searched image size) would be left out. Instead its part becomes one
call of a model-local function (domain :data:`SHAPE_DOMAIN`) whose body compares the shapes of the
model's symbolic inputs with the searched ones and runs, in an ``If``, the rewrite where they are
equal and the part's own nodes from the input model where they are not. At the searched shape the
output runs the rewrite (verified and timed there like any other); at every other it computes what
the input computes, with the input's nodes (verified at the checked shapes like every rewrite).

Every name the body reads from the model is a function input (the part's inputs and weights, the
tested graph inputs): what reads what stays explicit in the main graph. The rewrite's own new
constants are initializers of its branch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from einopt.frontend.onnx_graph import FreshNames, has_subgraph, outer_reads
from einopt.frontend.translate import Part
from einopt.instantiate.emit import AtShape, Instantiated
from einopt.opsets import default_opset
from einopt.runtime.modelio import missing_opsets

__all__ = ["SHAPE_DOMAIN", "specialized"]

SHAPE_DOMAIN = "einopt.shape"
"""The domain of the functions that run a rewrite at the searched shape only."""


def specialized(
    model: onnx.ModelProto,
    part: Part,
    inst: Instantiated,
    shapes: Mapping[str, Sequence[int]],
    *,
    prefix: str,
    taken: set[str],
    at: AtShape | None = None,
) -> Instantiated | None:
    """``inst`` (a rewrite of ``part`` of ``model``) run where the graph inputs of ``shapes`` have
    those shapes, and ``part``'s nodes of ``model`` where they do not: one function call (its name
    not in ``taken``, nor among ``inst``'s functions). None when it cannot be written so (generated
    kernels, which the runtime finds among the graph's nodes only; a node with a subgraph). ``at``
    (its ``rewrite`` is ``inst``) is what the result's ``only_at`` says."""
    old = [model.graph.node[i] for i in part.nodes]
    if not shapes or inst.has_generated_kernels or any(has_subgraph(n) for n in (*old, *inst.nodes)):
        return None
    outputs = [part.names[o] for o in part.program.outputs]
    local = {t.name for t in inst.initializers}
    inputs = list(dict.fromkeys([*shapes, *outer_reads(inst.nodes, local), *outer_reads(old)]))
    names = FreshNames(
        {*inputs, *outputs, *(x for n in (*old, *inst.nodes) for x in (*n.input, *n.output))} | local
    )

    read = {x for n in inst.nodes for x in n.input}
    constants = [t for t in inst.initializers if t.name in read]  # ONNX Runtime warns of the others
    then_graph = _branch("then", inst.nodes, outputs, names, constants, inst.value_info)
    else_graph = _branch("else", old, outputs, names)
    body = _shape_test(shapes, names)
    body.append(
        helper.make_node("If", [body[-1].output[0]], outputs, then_branch=then_graph, else_branch=else_graph)
    )

    used = {f.name for f in inst.functions} | taken
    fname = FreshNames(used).fresh(prefix.rstrip("/") + "_at_searched_shape")
    present = {o.domain: o.version for o in model.opset_import}
    domains = {"": default_opset(model)}
    for o in missing_opsets([*inst.nodes, *old]):
        domains[o.domain] = present.get(o.domain, o.version)
    searched = ", ".join(f"{n}: {list(s)}" for n, s in shapes.items())
    fn = helper.make_function(
        SHAPE_DOMAIN,
        fname,
        inputs,
        outputs,
        body,
        [helper.make_opsetid(d, v) for d, v in domains.items()],
        doc_string=f"the rewrite where the inputs have the searched shapes ({searched}), the input's nodes elsewhere",
    )
    call = helper.make_node(fname, inputs, outputs, domain=SHAPE_DOMAIN, name=prefix + "at_searched_shape")
    return dataclasses.replace(
        inst, nodes=(call,), initializers=(), functions=(*inst.functions, fn), value_info=(), only_at=at
    )


def _branch(
    which: str,
    nodes: Sequence[onnx.NodeProto],
    outputs: Sequence[str],
    names: FreshNames,
    initializers: Sequence[onnx.TensorProto] = (),
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.GraphProto:
    """``nodes`` as an ``If`` branch: the part's outputs renamed (a branch may not define a name its
    ``If`` defines)."""
    renamed = {o: names.fresh(f"{o}@{which}") for o in outputs}
    body = []
    for n in nodes:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.input[:] = [renamed.get(x, x) for x in n.input]
        m.output[:] = [renamed.get(x, x) for x in n.output]
        body.append(m)
    infos = []
    for vi in value_info:
        v = onnx.ValueInfoProto()
        v.CopyFrom(vi)
        v.name = renamed.get(vi.name, vi.name)
        infos.append(v)
    return helper.make_graph(
        body,
        which,
        [],
        [onnx.ValueInfoProto(name=renamed[o]) for o in outputs],
        initializer=list(initializers),
        value_info=infos,
    )


def _shape_test(shapes: Mapping[str, Sequence[int]], names: FreshNames) -> list[onnx.NodeProto]:
    """Nodes computing a boolean scalar (the last node's output): every input in ``shapes`` has that
    shape."""
    nodes: list[onnx.NodeProto] = []

    def node(op_type: str, inputs: list[str], **attrs) -> str:
        out = names.fresh(f"shape_test_{op_type.lower()}")
        nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def constant(value: np.ndarray) -> str:
        return node("Constant", [], value=numpy_helper.from_array(value))

    have = [node("Shape", [x]) for x in shapes]
    both = node("Concat", have, axis=0) if len(have) > 1 else have[0]
    searched = constant(np.asarray([d for s in shapes.values() for d in s], dtype=np.int64))
    differ = node("Not", [node("Equal", [both, searched])])
    count = node("ReduceSum", [node("Cast", [differ], to=onnx.TensorProto.INT64)], keepdims=0)
    node("Equal", [count, constant(np.asarray(0, dtype=np.int64))])
    return nodes

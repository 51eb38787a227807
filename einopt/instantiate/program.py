"""A whole ONNX model computing one program (:func:`program_model`): the instantiation's nodes with
the program's inputs and outputs as the graph's, runnable in stock ONNX Runtime. The search costs
its candidates on such models; :func:`einopt.stages.export.to_onnx` is the public API's form.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from einopt.core import ir
from einopt.frontend.onnx_graph import unique_name
from einopt.instantiate.backend import PORTABLE, Backend
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
    opsets = [helper.make_opsetid("", opset), *missing_opsets(inst.nodes, functions=inst.functions)]
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

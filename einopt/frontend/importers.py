"""The ONNX operator importers: one function per op type, ``fn(view) -> scopes``.

The expression forms are documented in :mod:`einopt.frontend`; the
importers themselves live in ``importers_elementwise`` (arithmetic,
activations, BatchNormalization), ``importers_linear`` (MatMul, Gemm,
Einsum), ``importers_conv`` (Conv, ConvTranspose) and ``importers_layout``
(Transpose, Reshape, Slice, Pad, Concat, ...) and ``importers_gather``
(Gather, GatherElements with constant affine indices). Operators not in
:data:`IMPORTERS` (Softmax, Gelu, Erf, pooling, ...) pass through.

:func:`translate_single_node` turns a one-node model into a program; tests
and debugging use it, the model translator builds its views itself.
"""

from __future__ import annotations

import keyword
import logging
import re
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from einopt.core import ir
from einopt.frontend.importers_conv import CONV_IMPORTERS
from einopt.frontend.importers_elementwise import ELEMENTWISE_IMPORTERS
from einopt.frontend.importers_gather import GATHER_IMPORTERS
from einopt.frontend.importers_layout import LAYOUT_IMPORTERS
from einopt.frontend.importers_linear import LINEAR_IMPORTERS
from einopt.frontend.importers_max import MAX_IMPORTERS
from einopt.frontend.importers_reduce import REDUCE_IMPORTERS
from einopt.frontend.onnx_graph import unique_name
from einopt.frontend.operand import Importer, NodeView, Operand, Unsupported, node_attrs
from einopt.opsets import DEFAULT_DOMAINS, default_opset

__all__ = ["IMPORTERS", "import_node", "translate_single_node", "sanitize_name"]

log = logging.getLogger(__name__)

IMPORTERS: dict[str, Importer] = {
    **ELEMENTWISE_IMPORTERS,
    **LINEAR_IMPORTERS,
    **CONV_IMPORTERS,
    **LAYOUT_IMPORTERS,
    **GATHER_IMPORTERS,
    **REDUCE_IMPORTERS,
    **MAX_IMPORTERS,
}
"""Importer per ONNX op type (default domain)."""


def import_node(view: NodeView) -> tuple[ir.Scope, ...]:
    """Translate one node with its registered importer.

    Parameters
    ----------
    view : NodeView
        The node with its operands resolved.

    Returns
    -------
    tuple of ir.Scope
        One scope per node output.

    Raises
    ------
    Unsupported
        When the op has no importer (or is not in the default domain), or the
        importer refuses the node; the message says why.
    """
    if view.node.domain not in DEFAULT_DOMAINS:
        raise Unsupported(f"{view.node.domain}.{view.op_type}: not a default-domain operator")
    importer = IMPORTERS.get(view.op_type)
    if importer is None:
        raise Unsupported(f"no importer for {view.op_type}")
    scopes = importer(view)
    if len(scopes) != len(view.node.output):
        raise Unsupported(f"{view.op_type}: {len(scopes)} results for {len(view.node.output)} outputs")
    return scopes


def sanitize_name(name: str, taken: set[str]) -> str:
    """An IR name for an ONNX value name: an identifier, not reserved, not in ``taken`` (added to it)."""
    base = re.sub(r"\W", "_", name) or "v"
    if base[0].isdigit():
        base = "v_" + base
    if base in ir.RESERVED_NAMES or keyword.iskeyword(base):
        base += "_"
    return unique_name(base, taken)


def _type_of(vi_type: onnx.TypeProto | None, value: np.ndarray | None) -> tuple[int, tuple[int, ...] | None]:
    """``(elem_type, shape)``: elem_type 0 for non-tensors, shape None when not fully known."""
    if value is not None:
        return onnx.helper.np_dtype_to_tensor_dtype(value.dtype), tuple(int(n) for n in value.shape)
    if vi_type is None or not vi_type.HasField("tensor_type"):
        return 0, None
    tt = vi_type.tensor_type
    if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
        return tt.elem_type, None
    return tt.elem_type, tuple(int(d.dim_value) for d in tt.shape.dim)


def translate_single_node(
    model: onnx.ModelProto, constants: Mapping[str, np.ndarray] | None = None
) -> tuple[ir.Program, dict[str, np.ndarray]]:
    """Translate a model of one node into a program.

    Shape inference runs first. Graph inputs and initializers become
    ``ir.Tensor`` inputs named by :func:`sanitize_name` (an identifier name is
    kept as is); initializers and ``constants`` (graph inputs to treat as known
    constants, e.g. a Reshape shape) also give the operands their ``value``.

    Parameters
    ----------
    model : onnx.ModelProto
        A model whose graph holds exactly one node.
    constants : mapping of str to numpy.ndarray, optional
        Values of graph inputs to treat as constants, by ONNX name.

    Returns
    -------
    program : ir.Program
        One binding per node output, named after the output.
    arrays : dict of str to numpy.ndarray
        The constant inputs of ``program`` by tensor name (initializers,
        ``constants`` that are read, and constants the importer created).

    Raises
    ------
    Unsupported
        When the node cannot be translated.
    """
    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    graph = model.graph
    if len(graph.node) != 1:
        raise ValueError(f"expected a model of one node, got {len(graph.node)}")
    (node,) = graph.node
    opset = default_opset(model) or 0
    types = {vi.name: vi.type for vi in (*graph.input, *graph.value_info, *graph.output)}
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    values.update({k: np.asarray(v) for k, v in (constants or {}).items()})
    taken: set[str] = set()
    tensors: dict[str, ir.Tensor] = {}
    arrays: dict[str, np.ndarray] = {}

    def operand(name: str) -> Operand | None:
        if not name:
            return None
        value = values.get(name)
        elem_type, shape = _type_of(types.get(name), value)
        expr = None
        if elem_type == onnx.TensorProto.FLOAT and shape is not None and all(n > 0 for n in shape):
            if name not in tensors:
                tensors[name] = ir.Tensor(sanitize_name(name, taken), shape)
            expr = tensors[name]
            if value is not None:
                arrays[expr.name] = value.astype(np.float32)
        return Operand(name, expr, shape, elem_type, value)

    def new_constant(array: np.ndarray, hint: str) -> ir.Tensor:
        tensor = ir.Tensor(sanitize_name(hint, taken), tuple(int(n) for n in array.shape))
        arrays[tensor.name] = array
        return tensor

    inputs = tuple(operand(name) for name in node.input)
    view = NodeView(
        node=node,
        inputs=inputs,
        output_shapes=tuple(_type_of(types.get(name), None)[1] for name in node.output),
        opset=opset,
        attrs=node_attrs(node),
        new_constant=new_constant,
    )
    scopes = import_node(view)
    bindings = tuple((sanitize_name(name, taken), s) for name, s in zip(node.output, scopes, strict=True))
    read: dict[ir.Tensor, None] = {}
    for _, s in bindings:
        read.update(dict.fromkeys(ir.tensors_in(s)))
    program = ir.Program(tuple(read), bindings, tuple(n for n, _ in bindings))
    log.debug("translated %s %s:\n%s", node.op_type, node.name, program)
    used = {t.name for t in read}
    return program, {k: v for k, v in arrays.items() if k in used}

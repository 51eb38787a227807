"""Canonical keys of ONNX node groups: what was timed, or whether two node groups are the same.

Two node groups get the same key when they compute the same thing the same
way up to the names of their values and nodes: values are renamed in the
order they are first read or produced, node names and doc strings are
ignored, local functions are renamed in the order they are called.

- :func:`timing_key` is what a timing depends on (the measurement cache's
  key): ops, attributes, wiring, shapes and element types, the contents of
  non-float constants (shapes, axes, indices decide what a kernel does), but
  not the values of float weights (a Conv takes as long with other weights).
- :func:`content_key` also hashes every constant's bytes: equal keys mean
  the same nodes on the same data (a re-instantiation identical to the
  original is "unchanged").

Keys are SHA-256 hex digests of a JSON canonical form, stable across runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}

Tensor = np.ndarray | onnx.TensorProto


def timing_key(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], extra: object = None) -> str:
    """Key of what timing ``model`` on arrays shaped like ``feeds`` measures (weights' values excluded)."""
    return _digest(_canonical(model, feeds, with_values=False), extra)


def content_key(
    nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, Tensor],
    outputs: Sequence[str],
    opset: int = onnx.defs.onnx_opset_version(),
) -> str:
    """Key of a node group and the constants it reads (by name), values included.

    Names read by the nodes that are neither produced by them nor in
    ``constants`` are the group's inputs and keep their names (they are the
    boundary both groups share); ``outputs`` keep theirs too.
    """
    form, _ = _nodes_form(nodes, constants, keep=set(outputs), with_values=True, opset=opset)
    return _digest(form, None)


def _digest(form: object, extra: object) -> str:
    text = json.dumps([form, extra], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _tensor_form(t: Tensor, with_values: bool) -> list:
    """dtype, shape and (unless a float tensor keyed for timing) a digest of the values.

    Only what is hashed is converted: keying a big model reads its weights' types, not their bytes.
    """
    if isinstance(t, onnx.TensorProto):
        if not with_values and t.data_type in _FLOAT_TYPES:
            return [str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))), list(t.dims)]
        t = numpy_helper.to_array(t)
    a = np.asarray(t)
    form: list = [str(a.dtype), list(a.shape)]
    if with_values or a.dtype.kind != "f":
        form.append(hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    return form


def _attr_form(a: onnx.AttributeProto, with_values: bool) -> list:
    if a.type == onnx.AttributeProto.TENSOR:
        return [a.name, "tensor", _tensor_form(a.t, with_values)]
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        return [
            a.name,
            "graph",
            [hashlib.sha256(g.SerializeToString(deterministic=True)).hexdigest() for g in graphs],
        ]
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif isinstance(value, list):
        value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return [a.name, int(a.type), value]


# Attributes whose absence means a value the schema does not state: all ones or all zeros.
_IMPLICIT = {"strides": 1, "dilations": 1, "pads": 0}
_IMPLICIT_OPS = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "ConvInteger", "QLinearConv"}
# Determined by another input (the weight's shape), which the key already holds.
_DERIVED = {("Conv", "kernel_shape"), ("ConvTranspose", "kernel_shape")}


def _is_default(node: onnx.NodeProto, a: onnx.AttributeProto, opset: int) -> bool:
    """Whether ``a`` says what its absence would (so ``group=1`` on a Conv keys like no ``group``)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if (node.op_type, a.name) in _DERIVED:
        return True
    if node.op_type in _IMPLICIT_OPS and a.name in _IMPLICIT:
        return all(v == _IMPLICIT[a.name] for v in a.ints)
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return False
    default = schema.attributes[a.name].default_value if a.name in schema.attributes else None
    if default is None or default.type == onnx.AttributeProto.UNDEFINED:
        return False
    return onnx.helper.get_attribute_value(default) == onnx.helper.get_attribute_value(a)


def _nodes_form(
    nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, Tensor],
    keep: set[str],
    with_values: bool,
    renamed: Mapping[str, str] | None = None,
    functions: Mapping[tuple[str, str], str] | None = None,
    opset: int = onnx.defs.onnx_opset_version(),
) -> tuple[list, dict[str, str]]:
    """Nodes in order with canonical value names (``keep``: names that stay); also the renaming."""
    names: dict[str, str] = dict(renamed or {})
    functions = functions or {}

    def name_of(v: str, produced: bool) -> str:
        if not v:
            return ""
        if v in keep:
            return f"={v}"
        if v not in names:
            if v in constants and not produced:
                names[v] = "c" + json.dumps(_tensor_form(constants[v], with_values))
            else:
                names[v] = f"v{len(names)}"
        return names[v]

    form = []
    for n in nodes:
        op = functions.get((n.domain, n.op_type), f"{n.domain}:{n.op_type}")
        form.append(
            [
                op,
                [name_of(i, False) for i in n.input],
                [name_of(o, True) for o in n.output],
                sorted(
                    (_attr_form(a, with_values) for a in n.attribute if not _is_default(n, a, opset)),
                    key=lambda x: x[0],
                ),
            ]
        )
    return form, names


def _function_keys(model: onnx.ModelProto, with_values: bool) -> dict[tuple[str, str], str]:
    """Each local function's canonical body digest (functions may call earlier ones)."""
    keys: dict[tuple[str, str], str] = {}
    for f in model.functions:
        formal = {v: f"a{k}" for k, v in enumerate(f.input)}
        body, names = _nodes_form(list(f.node), {}, set(), with_values, formal, keys)
        outs = [names.get(o, o) for o in f.output]
        attrs = sorted(f.attribute)
        keys[(f.domain, f.name)] = "fn:" + _digest([body, outs, attrs], None)
    return keys


def _canonical(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], with_values: bool) -> list:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    renamed: dict[str, str] = {}
    inputs = []
    for k, i in enumerate(x for x in g.input if x.name not in inits):
        renamed[i.name] = f"i{k}"
        a = feeds.get(i.name)
        inputs.append([str(a.dtype), list(a.shape)] if a is not None else [i.type.SerializeToString().hex()])
    functions = _function_keys(model, with_values)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    form, names = _nodes_form(list(g.node), inits, set(), with_values, renamed, functions, opset)
    outs = [names.get(o.name, "?") for o in g.output]  # the graph outputs by position
    opsets = sorted((o.domain, o.version) for o in model.opset_import)
    return [inputs, form, outs, opsets]

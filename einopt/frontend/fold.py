"""Prepare an ONNX model for translation: pin input shapes, infer shapes, fold constants and BatchNormalization.

:func:`prepare` runs pin -> (infer -> fold constants) to a fixpoint -> fold
BatchNormalization -> infer. Each stage is also a public function that returns
a new model; none changes graph input/output names, order or element types,
opset imports or metadata (pinning sets the pinned dims, and shape inference
may fill in output dims that were not declared).

BatchNormalization folding lives in :mod:`einopt.frontend.batchnorm` and the
graph helpers shared with it in :mod:`einopt.frontend.onnx_graph`;
:func:`fold_batchnorm` is re-exported here.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from einopt.errors import ModelError, UnsupportedModelError
from einopt.frontend.batchnorm import fold_batchnorm, fold_batchnorm_in_place
from einopt.frontend.onnx_graph import (
    constants,
    delete_at,
    drop_unused_initializers,
    drop_value_info,
    has_subgraph,
    static_shapes,
    subgraph_reads,
)
from einopt.opsets import DEFAULT_DOMAINS
from einopt.runtime import modelio
from einopt.runtime.verify import capture

log = logging.getLogger(__name__)

__all__ = [
    "Prepared",
    "prepare",
    "pin_input_shapes",
    "parse_input_shape",
    "infer_shapes",
    "fold_constants",
    "fold_batchnorm",
]

# Folded outputs larger than this stay as nodes (they would bloat the model).
MAX_FOLD_ELEMENTS = 1 << 26
# Ops whose results are random or depend on a seed: never evaluated at compile time.
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
_MAX_FOLD_ROUNDS = 8


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A prepared model and human-readable facts about the preparation, for the report.

    ``changes`` are the notes that say what preparation did to the model (pinned
    shapes, folded nodes): they do not hold for an output that is the input itself.
    """

    model: onnx.ModelProto
    notes: tuple[str, ...]
    changes: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- input shapes


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``"NAME=1,3,224,224"`` into ``("NAME", (1, 3, 224, 224))``.

    The name may contain ``=``, ``:`` or ``/``: the text is split at the last
    ``=``. ``"NAME="`` is a scalar.

    Raises
    ------
    ModelError
        No ``=``, an empty name, or a dimension that is not a positive integer.
    """
    name, sep, dims = text.rpartition("=")
    name = name.strip()
    if not sep or not name:
        raise ModelError(f"bad input shape {text!r}: expected NAME=D1,D2,... (e.g. x=1,3,224,224)")
    parts = [p.strip() for p in dims.split(",")] if dims.strip() else []
    shape: list[int] = []
    for p in parts:
        try:
            d = int(p)
        except ValueError:
            raise ModelError(f"bad input shape {text!r}: dimension {p!r} is not an integer") from None
        if d < 1:
            raise ModelError(f"bad input shape {text!r}: dimension {d} must be positive")
        shape.append(d)
    return name, tuple(shape)


def pin_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """Set the dims of graph inputs to concrete values.

    A symbolic dim pinned on one input takes the same value wherever else it
    appears (other inputs, outputs, value_info).

    Raises
    ------
    ModelError
        Unknown input name, rank mismatch, a fixed dim that differs, a
        non-positive dim, or one symbolic dim pinned to two values.
    """
    m = modelio.copy_model(model)
    _pin(m, shapes)
    return m


def _pin(m: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> list[str]:
    g = m.graph
    by_name = {i.name: i for i in g.input}
    unknown = sorted(set(shapes) - set(by_name))
    if unknown:
        raise ModelError(f"cannot pin unknown inputs {unknown}; the model's inputs are {list(by_name)}")
    symbols: dict[str, int] = {}
    notes = []
    for name, dims in shapes.items():
        dims = [int(d) for d in dims]
        if any(d < 1 for d in dims):
            raise ModelError(f"cannot pin input {name!r} to {dims}: dimensions must be positive")
        vi = by_name[name]
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"cannot pin input {name!r}: it is not a tensor")
        tt = vi.type.tensor_type
        declared = [x.dim_value if x.HasField("dim_value") else x.dim_param or "?" for x in tt.shape.dim]
        if tt.HasField("shape") and len(tt.shape.dim) != len(dims):
            raise ModelError(
                f"cannot pin input {name!r} to {dims}: the model declares rank {len(tt.shape.dim)}"
            )
        if not tt.HasField("shape"):
            tt.shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in dims)
        for d, value in zip(tt.shape.dim, dims, strict=True):
            if d.HasField("dim_value") and d.dim_value != value:
                raise ModelError(f"cannot pin input {name!r} to {dims}: the model declares {declared}")
            if d.HasField("dim_param"):
                if symbols.setdefault(d.dim_param, value) != value:
                    raise ModelError(
                        f"cannot pin dimension {d.dim_param!r} to both {symbols[d.dim_param]} and {value}"
                    )
            d.dim_value = value
        notes.append(f"pinned input {name} to {dims}")
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.name not in shapes and vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param in symbols:
                    d.dim_value = symbols[d.dim_param]
    return notes


# ----------------------------------------------------------------------------- shape inference


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference with data propagation; never fails.

    Runs on a copy without the data of large tensors (so models over 2 GB
    work) and copies the inferred value_info and output types back. If ONNX
    cannot infer the model, a warning is logged and the model is returned as is.
    """
    m = modelio.copy_model(model)
    _infer(m)
    return m


def _complete(vi: onnx.ValueInfoProto | None) -> bool:
    """A tensor type with an element type and every dim known (value or symbol)."""
    if vi is None or not vi.type.HasField("tensor_type"):
        return False
    tt = vi.type.tensor_type
    return bool(tt.elem_type) and tt.HasField("shape") and all(d.WhichOneof("value") for d in tt.shape.dim)


def _infer(m: onnx.ModelProto) -> str | None:
    """Infer shapes in place; return the reason when ONNX could not.

    ONNX keeps existing value_info when it disagrees with what it infers, so
    inference first runs without the model's annotations; they are used (in a
    second run) only for values it could not infer, e.g. custom op outputs.
    """
    skeleton = modelio.strip_tensors(m)
    annotations = list(skeleton.graph.value_info)
    del skeleton.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
        known = {vi.name for vi in inferred.graph.value_info if _complete(vi)}
        extra = [vi for vi in annotations if vi.name not in known]
        if extra:
            for vi in extra:
                skeleton.graph.value_info.add().CopyFrom(vi)
            inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception as e:  # noqa: BLE001 - ONNX raises many types; the pipeline goes on
        error = f"{type(e).__name__}: {' '.join(str(e).split())}"
        log.warning("shape inference failed, continuing without it: %s", error)
        return error
    g = m.graph
    del g.value_info[:]
    for vi in inferred.graph.value_info:
        g.value_info.add().CopyFrom(vi)
    for out, vi in zip(g.output, inferred.graph.output, strict=True):
        if out.type.tensor_type.elem_type in (0, vi.type.tensor_type.elem_type):
            out.CopyFrom(vi)
    return None


# ----------------------------------------------------------------------------- constant folding


def _constant_tensor(node: onnx.NodeProto) -> TensorProto | None:
    """The value of a Constant node as a tensor named after its output (None for sparse values)."""
    a = node.attribute[0] if len(node.attribute) == 1 else None
    convert = _CONSTANT_ATTRS.get(a.name) if a is not None else None
    if convert is None:
        return None
    t = convert(a)
    t.name = node.output[0]
    return t


def _copy_tensor(t: TensorProto) -> TensorProto:
    out = TensorProto()
    out.CopyFrom(t)
    return out


_CONSTANT_ATTRS: dict[str, Callable[[onnx.AttributeProto], TensorProto]] = {
    "value": lambda a: _copy_tensor(a.t),
    "value_float": lambda a: numpy_helper.from_array(np.array(a.f, np.float32)),
    "value_floats": lambda a: numpy_helper.from_array(np.array(list(a.floats), np.float32)),
    "value_int": lambda a: numpy_helper.from_array(np.array(a.i, np.int64)),
    "value_ints": lambda a: numpy_helper.from_array(np.array(list(a.ints), np.int64)),
    "value_string": lambda a: numpy_helper.from_array(np.array(a.s, dtype=object)),
    "value_strings": lambda a: numpy_helper.from_array(np.array(list(a.strings), dtype=object)),
}


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    """Shape (with start/end) or Size of a value of known shape."""
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    return np.array(shape[slice(attrs.get("start", 0), attrs.get("end"))], np.int64)


def _why_not_foldable(
    node: onnx.NodeProto, constant: set[str], shapes: Mapping[str, tuple[int, ...]]
) -> str | None:
    """Why ``node`` cannot be evaluated at compile time, or None if it can."""
    if node.domain not in DEFAULT_DOMAINS:
        return f"domain {node.domain!r}"
    if node.op_type in NONDETERMINISTIC:
        return "nondeterministic"
    if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
        return "Dropout with training_mode"
    if has_subgraph(node):
        return "has a subgraph"
    missing = [i for i in node.input if i and i not in constant]
    if missing:
        return f"input {missing[0]!r} is not constant"
    sizes = [int(np.prod(shapes[o])) for o in node.output if o in shapes]
    if any(s > MAX_FOLD_ELEMENTS for s in sizes):
        return "output too large"
    return None


def fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """Evaluate the constant parts of the graph at compile time.

    Constant nodes become initializers; nodes whose inputs are all constants
    (initializers that are not graph inputs, or folded values), and Shape/Size
    of values whose inferred shape is fully static, are evaluated (in one
    ONNX Runtime session) and replaced by initializers. Never folded: nodes
    producing a graph output, nondeterministic ops, nodes with subgraphs,
    non-default domains, outputs over ``MAX_FOLD_ELEMENTS`` elements.
    Initializers that become unused are removed. Shape inference and folding
    repeat until nothing changes.
    """
    m = modelio.copy_model(model)
    _fold_to_fixpoint(m)
    return m


def _fold_to_fixpoint(m: onnx.ModelProto) -> tuple[collections.Counter[str], str | None]:
    total: collections.Counter[str] = collections.Counter()
    error = None
    for _ in range(_MAX_FOLD_ROUNDS):
        error = _infer(m)
        folded = _fold_once(m)
        total += folded
        if not folded:
            break
    return total, error


def _fold_once(m: onnx.ModelProto) -> collections.Counter[str]:
    """One folding pass in place; returns the folded op types."""
    g = m.graph
    graph_outputs = {o.name for o in g.output}
    shapes = static_shapes(g)
    inits = constants(g)
    constant = set(inits)
    direct: dict[str, TensorProto] = {}  # values known without running anything
    batch: list[int] = []
    folded: set[int] = set()
    for idx, node in enumerate(g.node):
        if any(o in graph_outputs for o in node.output) or node.domain not in DEFAULT_DOMAINS:
            continue
        if node.op_type == "Constant" and (t := _constant_tensor(node)) is not None:
            direct[t.name] = t
        elif node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            value = _shape_value(node, shapes[node.input[0]])
            direct[node.output[0]] = numpy_helper.from_array(value, node.output[0])
        elif (reason := _why_not_foldable(node, constant, shapes)) is None:
            batch.append(idx)
        else:
            log.debug("not folding %s %r: %s", node.op_type, node.name, reason)
            continue
        folded.add(idx)
        constant.update(o for o in node.output if o)
    if not folded:
        return collections.Counter()
    values = _evaluate(m, batch, inits, direct)
    folded -= {i for i in batch if not all(o in values for o in g.node[i].output if o)}
    # Keep (unfold) producers of needed values that are too large, until nothing changes.
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    while True:
        kept = [n for i, n in enumerate(g.node) if i not in folded]
        needed = {x for n in kept for x in n.input if x} | _subgraph_names(kept)
        big = {
            producer[x]
            for x in needed
            if x in producer and producer[x] in folded and _too_big(x, values, direct)
        }
        if not big:
            break
        folded -= big
    stats = collections.Counter(g.node[i].op_type for i in folded)
    read_before = {x for i in folded for x in g.node[i].input if x}
    produced = {o for i in folded for o in g.node[i].output if o}
    for name in sorted(produced & needed):
        t = direct[name] if name in direct else numpy_helper.from_array(values[name], name)
        g.initializer.add().CopyFrom(t)
    delete_at(g.node, folded)
    drop_unused_initializers(g, read_before)
    drop_value_info(g)
    return stats


def _subgraph_names(nodes: Sequence[onnx.NodeProto]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else a.graphs:
                names.update(subgraph_reads(sub))
    return names


def _too_big(name: str, values: Mapping[str, np.ndarray], direct: Mapping[str, TensorProto]) -> bool:
    if name in direct:
        return False
    value = values.get(name)
    # sequences and optionals are not tensors: they cannot become initializers
    return not isinstance(value, np.ndarray) or value.size > MAX_FOLD_ELEMENTS


def _evaluate(
    m: onnx.ModelProto,
    batch: Sequence[int],
    inits: Mapping[str, TensorProto],
    direct: Mapping[str, TensorProto],
) -> dict[str, np.ndarray]:
    """Run the ``batch`` nodes in one small model; on failure, node by node, skipping those that fail."""
    if not batch:
        return {}
    nodes = [m.graph.node[i] for i in batch]
    try:
        return _run_nodes(m, nodes, inits, direct, {})
    except (UnsupportedModelError, ModelError) as e:
        log.debug("batched constant folding failed (%s); folding node by node", e)
    values: dict[str, np.ndarray] = {}
    for node in nodes:
        if not all(i in inits or i in direct or i in values for i in node.input if i):
            continue
        try:
            values.update(_run_nodes(m, [node], inits, direct, values))
        except (UnsupportedModelError, ModelError) as e:
            log.debug("not folding %s %r: %s", node.op_type, node.name, e)
    return values


def _run_nodes(
    m: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    inits: Mapping[str, TensorProto],
    direct: Mapping[str, TensorProto],
    values: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    produced = [o for n in nodes for o in n.output if o]
    read = sorted({i for n in nodes for i in n.input if i} - set(produced))
    graph = onnx.GraphProto(name="fold")
    for node in nodes:
        graph.node.add().CopyFrom(node)
    for name in read:
        t = graph.initializer.add()
        if name in values:
            t.CopyFrom(numpy_helper.from_array(values[name], name))
        else:
            t.CopyFrom(inits[name] if name in inits else direct[name])
    graph.output.extend(onnx.ValueInfoProto(name=o) for o in produced)
    part = onnx.ModelProto(ir_version=m.ir_version, graph=graph)
    part.opset_import.extend(m.opset_import)
    try:
        return modelio.run(modelio.session(part, threads=1), {}, produced)
    except (TypeError, RuntimeError) as e:  # e.g. an output type numpy cannot hold
        raise UnsupportedModelError(str(e)) from e


# ----------------------------------------------------------------------------- the whole preparation


def _counts(stats: collections.Counter[str]) -> str:
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(stats.items()))


def _symbolic_notes(m: onnx.ModelProto) -> list[str]:
    notes = []
    for vi in modelio.feed_inputs(m):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            notes.append(f"input {vi.name} has unknown rank: parts depending on it pass through")
            continue
        symbolic = [d.dim_param or "?" for d in tt.shape.dim if not d.HasField("dim_value")]
        if symbolic:
            dims = ", ".join(symbolic)
            named = [d for d in symbolic if d != "?"]
            hint = f" (--dim {named[0]}=VALUE searches them at VALUE)" if named else ""
            notes.append(
                f"input {vi.name} has symbolic dims [{dims}]: parts depending on them pass through{hint}"
            )
    return notes


def _measure_shapes(m: onnx.ModelProto) -> None:
    """The shapes of values that inference left unknown (behind a Reshape whose target is computed
    from a symbolic dimension's Shape, say), measured by running ``m`` once on seeded random inputs
    at its pinned input shapes, set as value_info in place (none when ``m`` cannot run on them)."""
    known = static_shapes(m.graph)
    missing = [o for n in m.graph.node for o in n.output if o and o not in known]
    if not missing:
        return
    try:
        values = capture(m, modelio.random_inputs(m, 0, {}), missing)
    except Exception as e:  # noqa: BLE001 - then those shapes stay unknown, as without measuring
        log.info("could not measure the shapes shape inference left unknown: %s", e)
        return
    declared = {vi.name: vi for vi in m.graph.value_info}
    for name, a in values.items():
        vi = onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        if name in declared:
            declared[name].CopyFrom(vi)
        else:
            m.graph.value_info.append(vi)


def prepare(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] = {},
    *,
    fold: bool = True,
    representative: Mapping[str, Sequence[int]] = {},
) -> Prepared:
    """Pin input shapes, infer shapes, fold constants and BatchNormalization.

    Parameters
    ----------
    model
        A loaded model (not modified).
    input_shapes
        Concrete shapes for graph inputs (see :func:`pin_input_shapes`).
    fold
        Fold constants and BatchNormalization (off: only pin and infer shapes).
    representative
        Shapes for graph inputs with symbolic dims that the output keeps symbolic: set after folding,
        for shape inference only, so that no value that depends on a symbolic dim (a Shape of it,
        a Reshape target computed from one) is folded into a constant of the representative value.

    Returns
    -------
    Prepared
        The new model and notes for the report (what was pinned and folded,
        which inputs stay symbolic, whether shape inference failed).

    Raises
    ------
    ModelError
        Bad ``input_shapes``.
    """
    m = modelio.copy_model(model)
    changes = _pin(m, input_shapes)
    if not fold:
        _pin(m, representative)
        error = _infer(m)
        if representative:
            _measure_shapes(m)
        found = [f"shape inference failed ({error})"] if error else []
        return Prepared(m, tuple(changes + found + _symbolic_notes(m)), tuple(changes))
    folded, error = _fold_to_fixpoint(m)
    if folded:
        changes.append(f"folded {sum(folded.values())} nodes into constants ({_counts(folded)})")
    bn = fold_batchnorm_in_place(m)
    for op, n in sorted(bn.items()):
        changes.append(f"folded {n} BatchNormalization into {op}")
    if representative:
        _pin(m, representative)
        del m.graph.value_info[:]  # inferred with symbolic dims: inferred again at the values
    if bn or representative:
        error = _infer(m)
    if representative:
        _measure_shapes(m)
    found = [f"shape inference failed ({error}): shapes it would give are unknown"] if error else []
    return Prepared(m, tuple(changes + found + _symbolic_notes(m)), tuple(changes))

"""What an importer sees of an ONNX node, and what it may return.

An importer is ``fn(view: NodeView) -> tuple[ir.Scope, ...]`` (one scope per
node output), registered in ``einopt.frontend.importers.IMPORTERS`` by op type.
It raises :class:`Unsupported` (with a reason) when the node cannot be
translated; the node then passes through untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from einopt.core import ir
from einopt.core.index import bounds


class Unsupported(Exception):
    """This node (or model part) cannot be translated; the message says why."""


@dataclasses.dataclass(frozen=True, eq=False)
class Operand:
    """One ONNX value feeding a node.

    ``expr`` is what an expression reads for it: an ``ir.Tensor`` for a
    subprogram input (graph input, activation output, initializer) or the
    ``ir.Scope`` that computes it inside the subprogram; ``None`` when the
    value is not a float32 tensor of concrete positive shape. ``value`` is the
    array when the value is a known constant (initializers, folded constants),
    which importers need for shape-like inputs (Reshape's shape, Slice's
    starts, Pad's pads, ...).
    """

    name: str
    expr: ir.Tensor | ir.Scope | None
    shape: tuple[int, ...] | None
    elem_type: int  # onnx.TensorProto data type
    value: np.ndarray | None = None
    fed: bool = False  # a graph input: what the caller feeds (an initializer listed as an input too)


@dataclasses.dataclass(eq=False)
class NodeView:
    """An ONNX node with its operands resolved, handed to an importer."""

    node: onnx.NodeProto
    inputs: tuple[Operand | None, ...]  # None for an omitted optional input
    output_shapes: tuple[tuple[int, ...] | None, ...]  # from shape inference
    opset: int  # default-domain opset version of the model (0 when it imports none)
    attrs: dict[str, Any]
    # Registers a new constant tensor (e.g. folded BatchNormalization scales)
    # and returns the ir.Tensor to read it through. Set by the translator.
    new_constant: Callable[[np.ndarray, str], ir.Tensor]

    @property
    def op_type(self) -> str:
        return self.node.op_type

    def input(self, i: int) -> Operand | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def constant_operand(self, array: np.ndarray, hint: str) -> Operand:
        """A new float32 constant (folded from the node's constants) as an operand to read."""
        arr = np.ascontiguousarray(array, dtype=np.float32)
        tensor = self.new_constant(arr, hint)
        return Operand(tensor.name, tensor, tuple(arr.shape), onnx.TensorProto.FLOAT, arr)


Importer = Callable[[NodeView], tuple[ir.Scope, ...]]


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values (bytes decoded to str)."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


# --------------------------------------------------------------------------
# Reading operands (shared by the importers)
# --------------------------------------------------------------------------


def type_name(elem_type: int) -> str:
    """The ONNX name of a tensor element type (``FLOAT``, ``INT64``, ...), or ``"non-tensor"``."""
    try:
        return onnx.TensorProto.DataType.Name(elem_type) if elem_type else "non-tensor"
    except ValueError:
        return f"type {elem_type}"


def operand_shape(operand: Operand) -> tuple[int, ...]:
    """The operand's concrete shape; :class:`Unsupported` if unknown or zero-sized."""
    shape = operand.shape
    if shape is None and operand.expr is not None:
        shape = operand.expr.shape
    if shape is None and operand.value is not None:
        shape = tuple(operand.value.shape)
    if shape is None or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise Unsupported(f"{operand.name}: unknown or dynamic shape")
    if any(n == 0 for n in shape):
        raise Unsupported(f"{operand.name}: zero-sized dimension in shape {list(shape)}")
    return tuple(shape)


def float_data(operand: Operand | None, what: str) -> Operand:
    """Check that an operand is float32 data an expression can read, and return it.

    Raises
    ------
    Unsupported
        When the operand is absent, not float32, of unknown or zero-sized
        shape, or has no expression to read it through (and is not an
        inlinable one-element constant).
    """
    if operand is None:
        raise Unsupported(f"missing input {what}")
    if operand.elem_type != onnx.TensorProto.FLOAT:
        raise Unsupported(f"{what} {operand.name}: {type_name(operand.elem_type)} data (only float32)")
    operand_shape(operand)
    if operand.expr is None and not _is_scalar_constant(operand):
        raise Unsupported(f"{what} {operand.name}: no tensor to read it through")
    return operand


def _is_scalar_constant(operand: Operand) -> bool:
    return operand.value is not None and operand.value.size == 1


def access(operand: Operand, indices: Sequence[ir.IndexLike]) -> ir.ValueExpr:
    """``operand[indices]`` at ONNX positions (no broadcasting).

    Parameters
    ----------
    operand : Operand
        A float32 operand (see :func:`float_data`).
    indices : sequence of IndexExpr or int
        One index per operand dimension; reads outside the operand are 0.

    Returns
    -------
    ir.ValueExpr
        An ``Access`` of the operand's expression, or ``Const`` for a constant
        of one element when every index provably stays in range (out-of-range
        reads must stay 0, so e.g. a padded read keeps the access). A scope
        whose traversal does not start at 0 is read at its origin plus the
        position.
    """
    shape = operand_shape(operand)
    idx = tuple(ir.as_index(i) for i in indices)
    if len(idx) != len(shape):
        raise ValueError(f"{operand.name} has rank {len(shape)} but is read with {len(idx)} indices")
    if _is_scalar_constant(operand) and all(bounds(i) == (0, 0) for i in idx):
        return ir.Const(float(np.asarray(operand.value, dtype=np.float64).reshape(-1)[0]))
    if operand.expr is None:
        raise Unsupported(f"{operand.name}: no tensor to read it through")
    origin = operand.expr.origin
    if any(origin):
        idx = tuple(i + o if o else i for i, o in zip(idx, origin, strict=True))
    return ir.Access(operand.expr, idx)


def read(operand: Operand, out_iters: Sequence[ir.Iter]) -> ir.ValueExpr:
    """Read an operand broadcast against output iterators (numpy/ONNX right alignment).

    Parameters
    ----------
    operand : Operand
        A float32 operand whose shape broadcasts to the iterators' extents.
    out_iters : sequence of ir.Iter
        The output iterators; the operand's dimensions align with the last
        ``rank`` of them.

    Returns
    -------
    ir.ValueExpr
        ``operand[..]`` where a size-1 dimension against an iterator of
        extent > 1 is indexed by ``0``; ``Const`` for a constant of one element.
    """
    shape = operand_shape(operand)
    if len(shape) > len(out_iters):
        raise ValueError(f"{operand.name} of rank {len(shape)} read against rank {len(out_iters)}")
    its = tuple(out_iters)[len(out_iters) - len(shape) :]
    idx: list[ir.IndexExpr] = []
    for n, it in zip(shape, its, strict=True):
        if n == it.extent:
            idx.append(it)
        elif n == 1:
            idx.append(ir.IConst(0))
        else:
            raise ValueError(f"{operand.name}: dimension {n} does not broadcast to {it.extent}")
    return access(operand, idx)


def constant(operand: Operand | None, what: str) -> np.ndarray:
    """The value of a constant (shape-like) operand; :class:`Unsupported` if it is not known."""
    if operand is None:
        raise Unsupported(f"missing input {what}")
    if operand.value is None:
        raise Unsupported(f"{what} {operand.name} is not a constant")
    return np.asarray(operand.value)


def constant_ints(operand: Operand | None, what: str) -> list[int]:
    """A constant integer operand as a flat list of Python ints."""
    value = constant(operand, what)
    if value.dtype.kind not in "iu":
        raise Unsupported(f"{what} {operand.name}: expected integers, got {value.dtype}")
    return [int(v) for v in value.reshape(-1)]


# --------------------------------------------------------------------------
# Building results (shared by the importers)
# --------------------------------------------------------------------------


def make_iters(names: Sequence[str], extents: Sequence[int]) -> tuple[ir.Iter, ...]:
    """Iterators ``name in [0, extent)``, one per output (or reduction) dimension."""
    return tuple(ir.Iter(n, 0, int(e)) for n, e in zip(names, extents, strict=True))


def numbered(prefix: str, extents: Sequence[int]) -> tuple[ir.Iter, ...]:
    """Iterators ``prefix0, prefix1, ..`` over ``[0, extent)``."""
    return make_iters([f"{prefix}{d}" for d in range(len(extents))], extents)


def broadcast_dims(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The numpy/ONNX multidirectional broadcast of shapes; :class:`Unsupported` if they clash."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise Unsupported(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_shapes(operands: Sequence[Operand]) -> tuple[int, ...]:
    """The broadcast of the operands' shapes."""
    return broadcast_dims(*(operand_shape(o) for o in operands))


def checked_output(view: NodeView, k: int, shape: Sequence[int]) -> tuple[int, ...]:
    """Check an importer's computed output shape against shape inference and the IR's limits."""
    shape = tuple(int(n) for n in shape)
    if not shape:
        raise Unsupported(f"output {k} is a scalar (rank 0)")
    if any(n <= 0 for n in shape):
        raise Unsupported(f"output {k} has a zero-sized or negative dimension: {list(shape)}")
    known = view.output_shapes[k] if k < len(view.output_shapes) else None
    if known is not None and tuple(known) != shape:
        raise Unsupported(f"output {k}: computed shape {list(shape)} but shape inference says {list(known)}")
    return shape

"""The body of an eOperator function under construction: ONNX nodes, fresh names, shared constants.

:class:`Graph` is the node builder used by :mod:`einopt.instantiate.eop`
(lowering a scope) and :mod:`einopt.instantiate.eop_access` (reading accesses);
:func:`einopt.frontend.onnx_graph.unique_name` picks unused names (function inputs, split iterators).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["Graph"]

# From which opset each reduction takes its axes as an input instead of an attribute.
_REDUCE_AXES_INPUT_OPSET: dict[str, int] = {"ReduceSum": 13, "ReduceMax": 18}


class Graph:
    """The function body under construction: nodes, fresh value names, shared constants."""

    def __init__(self, opset: int, taken: set[str], light: bool = False) -> None:
        self.opset = opset
        self.light = light  # large constants get a type and a shape, not values (costing only)
        self.nodes: list[onnx.NodeProto] = []
        self.taken = taken
        self.count = 0
        self.consts: dict[tuple, str] = {}
        self.producer: dict[str, onnx.NodeProto] = {}

    def op(self, op_type: str, inputs: Sequence[str], **attrs: object) -> str:
        """Append an ``op_type`` node reading ``inputs``; return the name of its one output."""
        out = self.fresh()
        node = helper.make_node(op_type, list(inputs), [out], **attrs)
        self.nodes.append(node)
        self.producer[out] = node
        return out

    def fresh(self) -> str:
        """An unused value name ``t<n>``."""
        while True:
            self.count += 1
            name = f"t{self.count}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def const(self, array: np.ndarray) -> str:
        """A Constant node; small ones (shapes, axes, scalars) are shared."""
        if array.size > 64:
            return self.op("Constant", [], value=numpy_helper.from_array(array))
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.consts:
            self.consts[key] = self.op("Constant", [], value=numpy_helper.from_array(array))
        return self.consts[key]

    def shaped(self, shape: tuple[int, ...], dtype: type) -> str:
        """A Constant node declaring a tensor of ``shape`` and ``dtype`` without its values: the
        model can be shape-inferred and costed, not run (``light``)."""
        t = onnx.TensorProto()
        t.dims.extend(shape)
        t.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        return self.op("Constant", [], value=t)

    def ints(self, values: Iterable[int]) -> str:
        """An int64 1-D constant (shapes, axes, pads)."""
        return self.const(np.asarray(list(values), dtype=np.int64))

    def scalar(self, value: float) -> str:
        """A float32 scalar constant."""
        return self.const(np.asarray(value, dtype=np.float32))

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        """``x`` reshaped to ``shape`` (a Reshape of a Reshape reads the first one's input)."""
        before = self.producer.get(x)
        if before is not None and before.op_type == "Reshape":  # reshape(reshape(y)) -> reshape(y)
            x = before.input[0]
        return self.op("Reshape", [x, self.ints(shape)])

    def reduce(self, op_type: str, x: str, axes: Sequence[int]) -> str:
        """``x`` reduced by ``op_type`` (``ReduceSum``, ``ReduceMax``) over ``axes`` (dropped), in the
        form the opset wants."""
        if self.opset >= _REDUCE_AXES_INPUT_OPSET[op_type]:
            return self.op(op_type, [x, self.ints(axes)], keepdims=0)
        return self.op(op_type, [x], axes=list(axes), keepdims=0)

    def reduce_sum(self, x: str, axes: Sequence[int]) -> str:
        """``x`` summed over ``axes`` (dropped), in the form the opset wants."""
        return self.reduce("ReduceSum", x, axes)

    def set_output(self, value: str, output: str) -> None:
        """Make ``value`` the function's output and drop the nodes it does not need."""
        node = self.producer.get(value)
        if node is not None and node.op_type != "Constant":
            node.output[0] = output
        else:
            self.nodes.append(helper.make_node("Identity", [value], [output]))
        needed = {output}
        kept = []
        for n in reversed(self.nodes):
            if n.output[0] in needed:
                kept.append(n)
                needed.update(n.input)
        self.nodes = kept[::-1]

"""A small ONNX graph builder for the evaluation models: named nodes, seeded weights.

Every model is built with plain ``onnx.helper`` (opset 17, IR version 8) so
that it runs in ONNX Runtime without PyTorch. Weights come from one seeded
generator, drawn in graph order, so the same seed gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


class GraphBuilder:
    """Collects nodes and initializers; every node gets a unique, readable name.

    Parameters
    ----------
    name : str
        The graph name.
    seed : int
        Seed of the weight generator.
    """

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._used: set[str] = set()
        self._scope: list[str] = []

    # -- names -------------------------------------------------------------
    def scope(self, name: str) -> _Scope:
        """A ``with`` block that prefixes node and tensor names with ``name.``."""
        return _Scope(self, name)

    def fresh(self, base: str) -> str:
        """A unique name ``scope.base`` (``scope.base_2`` ... when taken)."""
        stem = ".".join([*self._scope, base])
        name, k = stem, 1
        while name in self._used:
            k += 1
            name = f"{stem}_{k}"
        self._used.add(name)
        return name

    # -- tensors -----------------------------------------------------------
    def const(self, base: str, value: np.ndarray) -> str:
        """Add an initializer (kept in its dtype) and return its name."""
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, base: str, shape: Sequence[int], fan_in: float, gain: float = math.sqrt(2.0)) -> str:
        """A float32 normal weight with standard deviation ``gain / sqrt(fan_in)`` (He scaling)."""
        std = gain / math.sqrt(max(fan_in, 1.0))
        return self.const(base, (self.rng.standard_normal(tuple(shape)) * std).astype(np.float32))

    def scalar(self, base: str, value: float) -> str:
        """A 0-d float32 constant (Clip bounds; ``const`` would store a 1-element vector)."""
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.array(value, dtype=np.float32), name))
        return name

    def uniform(self, base: str, shape: Sequence[int], low: float, high: float) -> str:
        """A float32 weight drawn uniformly from ``[low, high)``."""
        return self.const(base, self.rng.uniform(low, high, tuple(shape)).astype(np.float32))

    def ints(self, base: str, values: Sequence[int] | np.ndarray) -> str:
        """An int64 constant (shapes, axes, pads, gather indices)."""
        return self.const(base, np.asarray(values, dtype=np.int64))

    # -- nodes -------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> str | list[str]:
        """Add a node named after its op type in the current scope; return its output name(s)."""
        name = self.fresh(op_type.lower())
        outputs = [name] if n_out == 1 else [f"{name}:{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def constant_node(self, values: Sequence[int] | np.ndarray) -> str:
        """An int64 ``Constant`` node (how torch.onnx.export writes shapes and indices); its output name."""
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(values, dtype=np.int64)))

    # -- common layers -----------------------------------------------------
    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        kernel: tuple[int, int] | int,
        stride: int = 1,
        pad: tuple[int, int] | int = 0,
        dilation: int = 1,
        bias: bool = True,
        gain: float = math.sqrt(2.0),
        groups: int = 1,
    ) -> str:
        """A Conv with He-scaled weights (``pad`` is per spatial axis, symmetric).

        ``groups`` splits the channels (``groups == cin == cout`` is a depthwise conv); each output
        then sums ``cin / groups * kh * kw`` terms, the fan-in of the He scaling.
        """
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        if cin % groups or cout % groups:
            raise ValueError(f"groups={groups} must divide cin={cin} and cout={cout}")
        w = self.weight("weight", (cout, cin // groups, kh, kw), cin // groups * kh * kw, gain)
        ins = [x, w] + ([self.weight("bias", (cout,), 1.0, 0.1)] if bias else [])
        return self.op(
            "Conv",
            ins,
            kernel_shape=[kh, kw],
            strides=[stride, stride],
            pads=[ph, pw, ph, pw],
            dilations=[dilation, dilation],
            **({"group": groups} if groups != 1 else {}),
        )

    def conv_transpose(
        self,
        x: str,
        cin: int,
        cout: int,
        kernel: int,
        stride: int,
        pad: int,
        output_padding: int = 0,
        gain: float = math.sqrt(2.0),
    ) -> str:
        """A ConvTranspose with bias; each output sums about ``cin * (kernel/stride)^2`` terms."""
        w = self.weight("weight", (cin, cout, kernel, kernel), cin * (kernel / stride) ** 2, gain)
        b = self.weight("bias", (cout,), 1.0, 0.1)
        attrs = {"output_padding": [output_padding] * 2} if output_padding else {}
        return self.op(
            "ConvTranspose",
            [x, w, b],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            **attrs,
        )

    def batch_norm(self, x: str, channels: int, scale: float = 1.0) -> str:
        """BatchNormalization (inference) with seeded running statistics."""
        gamma = self.uniform("scale", (channels,), 0.8 * scale, 1.2 * scale)
        beta = self.weight("bias", (channels,), 1.0, 0.1)
        mean = self.weight("mean", (channels,), 1.0, 0.1)
        var = self.uniform("var", (channels,), 0.5, 1.5)
        return self.op("BatchNormalization", [x, gamma, beta, mean, var], epsilon=1e-5)

    def linear(self, x: str, din: int, dout: int, gain: float = math.sqrt(2.0)) -> str:
        """``MatMul(x, W) + b`` (the form a user writes; einopt sees the matmul)."""
        w = self.weight("weight", (din, dout), din, gain)
        b = self.weight("bias", (dout,), 1.0, 0.1)
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    # -- the model ---------------------------------------------------------
    def model(
        self,
        inputs: Sequence[tuple[str, Sequence[int]]],
        outputs: Sequence[tuple[str, str, Sequence[int]]],
        doc: str,
    ) -> onnx.ModelProto:
        """The finished model; ``outputs`` are ``(tensor, public name, shape)``: the tensor is renamed."""
        rename = {tensor: public for tensor, public, _ in outputs}
        for node in self.nodes:
            for names in (node.input, node.output):
                for k, n in enumerate(names):
                    names[k] = rename.get(n, n)
        graph_outputs = [
            helper.make_tensor_value_info(public, TensorProto.FLOAT, list(shape))
            for _, public, shape in outputs
        ]
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
            graph_outputs,
            self.initializers,
            doc_string=doc,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="einopt.models",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        return model


class _Scope:
    def __init__(self, builder: GraphBuilder, name: str) -> None:
        self.builder, self.name = builder, name

    def __enter__(self) -> GraphBuilder:
        self.builder._scope.append(self.name)
        return self.builder

    def __exit__(self, *exc: object) -> None:
        self.builder._scope.pop()

"""Post-optimization of an assembled model: what no single subprogram could see.

Each subprogram is instantiated on its own, so the seams between rewritten
subprograms can hold work that cancels out: a Transpose at the end of one and
its inverse at the start of the next, two Reshapes in a row, a Reshape to the
shape its input already has, or nodes that read only weights once two
rewrites meet. :func:`postoptimize` folds what reads only weights (ONNX
Runtime would fold it when the session is created; folding it here keeps the
file honest) and applies a small table of layout peepholes until none fires.
Graph inputs and outputs keep their names; a value that is a graph output is
never bypassed. The assembled model is verified and timed after this, like
any other rewrite.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import onnx
from onnx import helper, numpy_helper

from einopt.frontend.fold import fold_constants, infer_shapes

__all__ = ["postoptimize", "PEEPHOLES"]

log = logging.getLogger(__name__)


class _Graph:
    """The nodes of a graph with who reads what, for peepholes that rewire and drop nodes."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.retyped: set[str] = set()  # values whose shape a peephole changed (see ``shapes``)
        self.nodes = list(g.node)
        self.inits = {t.name: t for t in g.initializer}
        self.outputs = {o.name for o in g.output}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)
        for t in g.initializer:
            self.shapes[t.name] = tuple(t.dims)

    def producer(self, name: str) -> onnx.NodeProto | None:
        return next((n for n in self.nodes if name in n.output), None)

    def readers(self, name: str) -> list[onnx.NodeProto]:
        return [n for n in self.nodes if name in n.input]

    def ints(self, name: str) -> list[int] | None:
        t = self.inits.get(name)
        return None if t is None else [int(v) for v in numpy_helper.to_array(t).reshape(-1)]

    def bypass(self, node: onnx.NodeProto, by: str) -> bool:
        """Drop ``node`` (one output), its readers reading ``by`` instead; not for a graph output."""
        out = node.output[0]
        if out in self.outputs:
            return False
        for n in self.readers(out):
            for i, name in enumerate(n.input):
                if name == out:
                    n.input[i] = by
        self.nodes.remove(node)
        return True

    def only_reader(self, name: str) -> onnx.NodeProto | None:
        readers = self.readers(name)
        return readers[0] if len(readers) == 1 and name not in self.outputs else None


def _perm(node: onnx.NodeProto) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _transpose_pair(g: _Graph, node: onnx.NodeProto) -> bool:
    # Transpose(p2) of Transpose(p1) -> one Transpose(p1[p2]), nothing when that is the identity
    if node.op_type != "Transpose":
        return False
    first = g.producer(node.input[0])
    if first is None or first.op_type != "Transpose" or g.only_reader(first.output[0]) is not node:
        return False
    p1, p2 = _perm(first), _perm(node)
    if p1 is None or p2 is None:
        return False
    composed = [p1[i] for i in p2]
    if composed == sorted(composed):
        return g.bypass(node, first.input[0]) and g.bypass(first, first.input[0])
    node.input[0] = first.input[0]
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("perm", composed))
    g.nodes.remove(first)
    return True


def _reshape_pair(g: _Graph, node: onnx.NodeProto) -> bool:
    # Reshape(s2) of Reshape(s1) -> Reshape(s2) when s2 names no dimension of the middle value (no 0)
    if node.op_type != "Reshape" or len(node.input) < 2:
        return False
    first = g.producer(node.input[0])
    target = g.ints(node.input[1])
    if first is None or first.op_type != "Reshape" or target is None or 0 in target:
        return False
    if g.only_reader(first.output[0]) is not node:
        return False
    node.input[0] = first.input[0]
    g.nodes.remove(first)
    return True


ROW_WISE_UNARY = frozenset(
    {
        "Abs", "Ceil", "Celu", "Cos", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish",
        "LeakyRelu", "Log", "Mish", "Neg", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign",
        "Sin", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
    }
)  # fmt: skip
"""Default-domain operators of one input computed element by element: any shape computes the same."""
ROW_WISE_CONTRIB = frozenset({"Gelu", "FastGelu", "QuickGelu", "BiasGelu"})
"""ONNX Runtime's com.microsoft operators computed element by element, with at most a bias along the
last axis."""


def _row_wise(g: _Graph, node: onnx.NodeProto) -> bool:
    """Whether ``node`` computes the same on its first input of any shape that keeps the last
    dimension: element by element (its other inputs constants along the last axis), or row by row
    along the last axis (LayerNormalization, Softmax and LogSoftmax at opset 13 and later)."""
    if [o for o in node.output if o] != node.output[:1] or any(i not in g.inits for i in node.input[1:] if i):
        return False
    vectors = all(len(g.inits[i].dims) <= 1 for i in node.input[1:] if i)  # a bias, a scale
    if node.domain == "com.microsoft":
        return node.op_type in ROW_WISE_CONTRIB and vectors
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ROW_WISE_UNARY:
        return len(node.input) == 1
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    rank = len(g.shapes.get(node.input[0], ()))
    last = axis in (-1, rank - 1) and rank > 0
    if node.op_type == "LayerNormalization":
        return last and vectors
    return node.op_type in ("Softmax", "LogSoftmax") and g.opset >= 13 and last


def _row_wise_through_reshape(g: _Graph, node: onnx.NodeProto) -> bool:
    # Reshape(x) -> row-wise op -> Reshapes: the op on x itself (the Reshapes after it then read a
    # value of x's shape; a Reshape back to x's shape goes, two in a row become one)
    if not _row_wise(g, node):
        return False
    first = g.producer(node.input[0])
    if first is None or first.op_type != "Reshape":
        return False
    x, y, out = first.input[0], node.input[0], node.output[0]
    if x not in g.shapes or y not in g.shapes or out in g.outputs or not g.shapes[x] or not g.shapes[y]:
        return False  # a scalar has no rows
    if g.shapes[x][-1] != g.shapes[y][-1]:
        return False
    readers = g.readers(out)
    targets = [g.ints(r.input[1]) if r.op_type == "Reshape" and len(r.input) > 1 else None for r in readers]
    if not readers or any(t is None or 0 in t for t in targets) or any(r.input[0] != out for r in readers):
        return False
    node.input[0] = x
    for a in node.attribute:
        if a.name == "axis":
            a.i = -1
    g.shapes[out] = g.shapes[x]
    g.retyped.add(out)
    if not g.readers(y) and y not in g.outputs:
        g.nodes.remove(first)
    return True


def _identity_layout(g: _Graph, node: onnx.NodeProto) -> bool:
    # Transpose by the identity permutation, Reshape to the shape it already has -> nothing
    if node.op_type == "Transpose":
        perm = _perm(node)
        if perm is not None and perm == sorted(perm):
            return g.bypass(node, node.input[0])
    if node.op_type == "Reshape" and node.input[0] in g.shapes and node.output[0] in g.shapes:
        if g.shapes[node.input[0]] == g.shapes[node.output[0]]:
            return g.bypass(node, node.input[0])
    return False


PEEPHOLES: Mapping[str, Callable[[_Graph, onnx.NodeProto], bool]] = {
    "transpose pair": _transpose_pair,
    "reshape pair": _reshape_pair,
    "identity layout": _identity_layout,
    "row-wise op through a reshape": _row_wise_through_reshape,
}
"""Name -> a peephole applied at one node (True when it changed the graph)."""


def postoptimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with weight-only nodes folded and layout work that cancels across subprograms removed.

    Parameters
    ----------
    model : onnx.ModelProto
        An assembled model (not changed).

    Returns
    -------
    onnx.ModelProto
        A new model computing the same outputs, under the same input and output names.
    """
    declared = {vi.name for vi in model.graph.value_info}
    try:
        out = fold_constants(model)
    except Exception as e:  # noqa: BLE001 - folding is an improvement, not a requirement
        log.info("post-optimization: constants not folded: %s", e)
        out = onnx.ModelProto()
        out.CopyFrom(model)
    try:
        out = infer_shapes(out)
    except Exception as e:  # noqa: BLE001 - the shape-free peepholes still apply
        log.info("post-optimization: no shapes: %s", e)
    g = _Graph(out)
    fired: dict[str, int] = {}
    changed = True
    while changed:
        changed = False
        for node in list(g.nodes):
            if node not in g.nodes:
                continue
            for name, peephole in PEEPHOLES.items():
                if peephole(g, node):
                    fired[name] = fired.get(name, 0) + 1
                    changed = True
                    break
    if fired:
        log.info("post-optimization: %s", ", ".join(f"{k} x{v}" for k, v in sorted(fired.items())))
    del out.graph.node[:]
    out.graph.node.extend(g.nodes)
    read = {i for n in g.nodes for i in n.input} | {o.name for o in out.graph.output}
    kept = [t for t in out.graph.initializer if t.name in read]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    names = {o for n in g.nodes for o in n.output} | {i.name for i in out.graph.input} | set(g.inits)
    vis = [vi for vi in out.graph.value_info if vi.name in names and vi.name in declared]
    for vi in vis:
        if vi.name in g.retyped:
            del vi.type.tensor_type.shape.dim[:]
            for d in g.shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = d
    del out.graph.value_info[:]
    out.graph.value_info.extend(vis)
    return out

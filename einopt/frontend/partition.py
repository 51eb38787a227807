"""Split a graph into subprograms at non-linear activations and unsupported ops.

Every node is classified (see :func:`classify`): *linear* nodes (supported
tensor-algebra operators, and the non-linear ones in :data:`ABSORBED` that a
target operator takes with the linear work around them) are grouped into subprograms, *activation* nodes
(supported non-linear element-wise functions) become single-node
subprograms, everything else passes through. Two linear nodes join one
group when one reads the other's output or both read the same non-constant
value (so the search can merge expressions that share an input), unless the
union would make the quotient graph cyclic: a group is replaced as one unit,
so no path may leave it and come back.

A *tail* activation (:data:`TAILS`: a maximum of linear functions with
constant slopes, such as PRelu) joins the group of the linear node it reads,
as that group's last step: the search can then distribute it over the
linear work (``max(conv(x, W), conv(x, a*W))`` for slopes in [0, 1]). Nothing
joins a group through a tail: what reads a tail's output starts a group of
its own, as after any activation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import onnx

from einopt.core.ops import BINARY, UNARY
from einopt.frontend import importers_max, importers_reduce

# Non-linear operations that a target operator takes whole with the linear work around them:
# Softmax into attention (com.microsoft MultiHeadAttention), GELU's erf and its exact or tanh
# form's polynomial (Gelu, BiasGelu, FastGelu, FusedGemm). They do not cut subprograms: they are
# grouped like linear nodes, so attention (projections, scale, mask, Softmax, product) and an MLP
# with its GELU are one program the search rewrites whole.
ABSORBED: frozenset[str] = frozenset({"Softmax", "Erf", "Gelu", "Pow"})

# Non-linear element-wise ops: subprogram boundaries, translated on their own
# so later fusion can absorb them into an eOperator. The IR's operations say so in
# einopt.core.ops (``activation``); PRelu, Clip, HardSigmoid, HardSwish and Gelu are imported as
# forms of those operations.
ACTIVATIONS: frozenset[str] = (
    frozenset(
        {"PRelu", "Clip", "HardSigmoid", "HardSwish", "Gelu"}
        | {op.onnx for op in UNARY.values() if op.activation}
        | {name for op in BINARY.values() if op.activation for name in (op.onnx, op.onnx_variadic) if name}
        | importers_reduce.NONLINEAR
        | importers_max.NONLINEAR
    )
    - ABSORBED
)

ELEMENTWISE_ACTIVATIONS: frozenset[str] = ACTIVATIONS - importers_reduce.NONLINEAR - importers_max.NONLINEAR
"""The activations that work element by element (no reduction, no window): those ONNX Runtime may
fuse into the node before them."""

ELEMENTWISE_LINEAR: frozenset[str] = frozenset(
    {op.onnx for op in UNARY.values() if not op.activation}
    | {name for op in BINARY.values() if not op.activation for name in (op.onnx, op.onnx_variadic) if name}
)
"""Linear operators that work element by element (Add, Sub, Mul, Div, Neg, Sum, ...)."""

GATES: frozenset[str] = frozenset({"Tanh", "Sigmoid"})
"""Activations that a fused target takes whole when they gate their own argument (see
:func:`absorb_gates`): GELU's tanh form into FastGelu, SiLU/Swish (``x * sigmoid(a x)``) into
QuickGelu."""

_GATE_ALGEBRA: frozenset[str] = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Neg"})
"""Element-wise algebra a gate's argument and product are written with."""

_GATE_STEPS = 6
"""How many algebra nodes back an argument's sources are looked for, and forward the product."""


TAILS: frozenset[str] = frozenset(
    {"PRelu", "LayerNormalization"} | {op.onnx for op in UNARY.values() if op.tail}
)
"""Activations that join the group of the linear node they read (as its last step): a PRelu's
slopes distribute over the linear work, a LayerNormalization after a residual Add is
SkipLayerNormalization's."""


MAX_GROUP_NODES = 48
"""Nodes one subprogram holds at most: a union that would pass it is not made. A search state's
cost grows with its program (every state is normalized, keyed and instantiated whole), and a
pre-LayerNorm transformer's residual stream would otherwise join its whole stack into one
subprogram (ViT: 204 nodes, 13.9 GB and 10 minutes for 1,200 states). 48 holds a transformer
layer's attention or MLP, and every subprogram of the convolutional evaluation models."""


@dataclasses.dataclass(frozen=True)
class Group:
    """Node indices (graph order) of one subprogram, and whether it is an activation."""

    nodes: tuple[int, ...]
    kind: str  # "linear" | "activation"


def group_nodes(
    nodes: Sequence[onnx.NodeProto],
    kinds: Sequence[str | None],
    constants: Mapping[str, object] | frozenset[str],
    *,
    fuse_activations: bool = False,
) -> list[Group]:
    """Group translatable nodes into convex subprograms.

    With ``fuse_activations``, an element-wise activation (:data:`ELEMENTWISE_ACTIVATIONS`, tails
    aside: they keep joining the linear node they read) joins
    like a linear node, but only element-wise work (:data:`ELEMENTWISE_LINEAR`): a group holds either
    such activations or operators with reductions (MatMul, Gemm, Conv, ...), never both. The
    element-wise tail of an LSTM cell (gates, products, sum) is then one subprogram that a generated
    kernel computes whole, while its MatMuls stay a subprogram the search rewrites as before.

    Parameters
    ----------
    nodes
        The graph's nodes in topological order.
    kinds
        Per node: ``"linear"``, ``"activation"`` or ``None`` (passes through).
    constants
        Names of constant values; sharing a constant does not join nodes.
    fuse_activations
        Element-wise activations join element-wise work (above).

    Returns
    -------
    list[Group]
        In order of their first node.
    """
    n = len(nodes)
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for o in node.output:
            if o:
                producer[o] = i
    preds: list[list[int]] = [[] for _ in range(n)]
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if not name:
                continue
            if name in producer and producer[name] not in preds[i]:
                preds[i].append(producer[name])
            if name not in constants:
                readers.setdefault(name, []).append(i)

    label = list(range(n))  # group id of each node: the smallest node index in the group
    fused = [
        fuse_activations and k == "activation" and node.op_type in ELEMENTWISE_ACTIVATIONS - TAILS
        for node, k in zip(nodes, kinds, strict=True)
    ]
    linear = [k == "linear" or f for k, f in zip(kinds, fused, strict=True)]
    # per group label: whether it holds a fused activation, and whether work that is not element-wise
    has_activation = fused[:]
    has_reduction = [
        k == "linear" and node.op_type not in ELEMENTWISE_LINEAR for node, k in zip(nodes, kinds, strict=True)
    ]
    candidates: list[tuple[int, int]] = []
    for i in range(n):
        if linear[i]:
            candidates += [(p, i) for p in preds[i] if linear[p]]
        elif kinds[i] == "activation" and nodes[i].op_type in TAILS:
            sources = [p for p in preds[i] if linear[p]]
            candidates += [(sources[0], i)] if len(sources) == 1 else []
    for rs in readers.values():
        lin = [r for r in rs if linear[r]]
        candidates += [(lin[0], r) for r in lin[1:]]
    size = [1] * n  # nodes per group, at each group's label
    for a, b in candidates:
        ga, gb = label[a], label[b]
        if ga == gb or size[ga] + size[gb] > MAX_GROUP_NODES:
            continue
        if (has_activation[ga] or has_activation[gb]) and (has_reduction[ga] or has_reduction[gb]):
            continue
        keep, gone = min(ga, gb), max(ga, gb)
        moved = [i for i in range(n) if label[i] == gone]
        for i in moved:
            label[i] = keep
        if not _acyclic(preds, label):
            for i in moved:
                label[i] = gone
        else:
            size[keep] += size[gone]
            has_activation[keep] = has_activation[keep] or has_activation[gone]
            has_reduction[keep] = has_reduction[keep] or has_reduction[gone]
    members: dict[int, list[int]] = {}
    for i in range(n):
        if kinds[i] is not None:
            members.setdefault(label[i], []).append(i)
    return [
        Group(tuple(ms), "linear" if any(kinds[i] == "linear" for i in ms) else kinds[ms[0]] or "linear")
        for _, ms in sorted(members.items(), key=lambda kv: kv[1][0])
    ]


def absorb_gates(
    nodes: Sequence[onnx.NodeProto],
    kinds: Sequence[str | None],
    constants: Mapping[str, object] | frozenset[str],
) -> list[str | None]:
    """The kinds with every gating activation made linear.

    An activation in :data:`GATES` *gates its argument* when its output, through element-wise
    algebra, is multiplied by a value computed by element-wise algebra from the same sources as
    its own argument: ``0.5 x (1 + tanh(c (x + 0.044715 x^3)))`` or ``x * sigmoid(x)``, the forms
    FastGelu and QuickGelu compute in one kernel. Such an activation does not cut its subprogram
    (like :data:`ABSORBED`), so the search sees the whole function and the linear work around it.
    An LSTM's gates (``sigmoid(i) * tanh(g)``, of different slices) still cut.
    """
    producer = {o: i for i, node in enumerate(nodes) for o in node.output if o}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)

    def algebra(i: int) -> bool:
        return nodes[i].op_type in _GATE_ALGEBRA and kinds[i] == "linear"

    def sources(value: str, steps: int = _GATE_STEPS) -> frozenset[str]:
        """The non-constant values ``value`` is computed from by element-wise algebra alone."""
        if value in constants:
            return frozenset()
        p = producer.get(value)
        if p is None or steps == 0 or not algebra(p):
            return frozenset({value})
        return frozenset().union(*(sources(v, steps - 1) for v in nodes[p].input if v))

    def gates(node: onnx.NodeProto) -> bool:
        argument = sources(node.input[0])
        frontier, seen = [node.output[0]], set()
        for _ in range(_GATE_STEPS):
            step = []
            for value in frontier:
                for r in readers.get(value, ()):
                    if r in seen or not algebra(r):
                        continue
                    seen.add(r)
                    others = [v for v in nodes[r].input if v and v != value]
                    if nodes[r].op_type == "Mul" and any(
                        v not in constants and sources(v) <= argument for v in others
                    ):
                        return True
                    step += list(nodes[r].output)
            frontier = step
        return False

    return [
        "linear" if kind == "activation" and node.op_type in GATES and gates(node) else kind
        for node, kind in zip(nodes, kinds, strict=True)
    ]


def _acyclic(preds: list[list[int]], label: list[int]) -> bool:
    """Is the graph with every group contracted to one vertex still a DAG?"""
    succ: dict[int, set[int]] = {}
    indeg: dict[int, int] = {}
    for i, gi in enumerate(label):
        indeg.setdefault(gi, 0)
        for p in preds[i]:
            gp = label[p]
            if gp != gi and gi not in succ.setdefault(gp, set()):
                succ[gp].add(gi)
                indeg[gi] = indeg.get(gi, 0) + 1
    ready = [g for g, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        g = ready.pop()
        seen += 1
        for s in succ.get(g, ()):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return seen == len(indeg)

"""Cost on the target: what each operator of a candidate takes in ONNX Runtime on this machine.

A candidate program's predicted time is the sum over its nodes (eOperators
inlined into the standard operators ONNX Runtime runs them as) of:

- nothing for a node that reads only weights (ONNX Runtime folds it when the
  session is created), and a kernel's bookkeeping for a view (Reshape,
  Squeeze, ... alias their input);
- otherwise the node's own time, measured once as a single-operator session
  in the process's global thread pool, interleaved with the other new nodes,
  and kept in the measurement cache (SQLite) under its signature: operator,
  attributes, input shapes and element types, which inputs are weights, and
  the values of integer weights (shapes, axes, pads). A second run of a
  model, or another model with the same layers, measures nothing;
- a generated kernel (``ai.einopt``) is timed the same way, in a session with
  einopt's custom-op library, when the caller names the code generator's
  build (``kernel_build``: a light instantiation's kernels are compiled from
  their nodes' descriptions only once they are timed, and kept in the kernel
  cache on disk); its time is stored under its description, its shapes and
  the code generator's build, so a changed code generator times it again;
- for a node no session can run, its bytes over the machine's measured
  bandwidth plus its FLOPs at the measured MatMul rate.

A convolution is timed together with the element-wise nodes ONNX Runtime
fuses into it (:data:`FUSES`: a bias or scale by a constant, the sum with
another tensor of its shape, an activation), as one session: ONNX Runtime's
own fusions decide what that costs. Costed node by node, ``conv(x, a*W) +
relu(conv(x, (1-a)*W))`` would be two convolutions plus a ReLU and an Add;
ONNX Runtime runs it as two convolution kernels.

A single-operator session's run costs more than the node does inside a model
(Python's call, feeding the inputs, the session's bookkeeping): a few
microseconds, as much as a small node's own work. So each node is timed
against its twin, a session fed the same inputs that computes nothing (the
Shape of its first input), called right before it after the same cache
flush: the median of the differences is the node's time (at least one
kernel's bookkeeping). Taking a machine-wide overhead measured once off each
node instead left a 128x128 GEMM at 0.2-1.7 us from one process to the next,
and a candidate predicted 10x slower than its input was never timed.

The calibration (bandwidth, FLOP rate, what one run of a session and one
kernel inside a session cost) is measured once per machine and cached with
the timings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx.inliner
import onnx.shape_inference
from onnx import helper, numpy_helper

from einopt.core.cost import FLOPS, VIEWS, itemsize
from einopt.opsets import KERNEL_DOMAIN
from einopt.runtime.modelio import available_bytes, missing_opsets, session
from einopt.runtime.timing import configure_threads, time_interleaved

__all__ = [
    "Calibration",
    "NodeCost",
    "Prediction",
    "OpCosts",
    "node_costs",
    "calibrate",
    "footprint",
    "memory_limit",
]

log = logging.getLogger(__name__)

FORMAT = 4
"""Bumped when what a stored node time means changes (3: a convolution's time includes the
element-wise nodes fused into it; 4: the run overhead is the node's twin's, see the module's
docstring)."""
GROUP = 16
"""New nodes timed together (interleaved) at a time."""
RUNS = (8, 30)
"""Timed samples per node, at least and at most."""
GROUP_BUDGET_S = 0.25
"""Seconds of timed samples per group, after which no new round starts."""
SLOW_S = 0.02
"""A node whose first run alone takes longer is timed twice more only."""
MEMORY_SHARE = 0.25
"""The share of the available memory the nodes timed together may need (inputs and outputs, twice
over for ONNX Runtime's own buffers); a node needing more alone is costed analytically."""
FUSES = {
    "Conv": frozenset({"Add", "Mul", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"}),
    "Gemm": frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"}),
}
"""Operators ONNX Runtime fuses element-wise successors into, and which successors (CPU, all graph
optimizations: into a Conv a bias or scale by a constant, the sum with another tensor of the output's
shape in its blocked layout, an activation; into a Gemm an activation, making a FusedGemm). A successor joins the group when it is the only reader of the
value before it; what ONNX Runtime really fuses, the group's single session shows."""
FUSED_MAX = 3
"""Element-wise nodes a group takes at most after its head."""
TIMED_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})
"""Domains whose nodes are timed alone: the default one and ONNX Runtime's own contrib operators
(``com.microsoft``, built into every ONNX Runtime); a node of any other is costed analytically, but
for einopt's generated kernels when the caller names the code generator's build (``kernel_build``)."""
CALL_S = 1e-7
"""Seconds one GEMM call of a batched MatMul takes at least (ONNX Runtime loops over the batch: a
broadcast product of 36M one-row matrices takes 10 s however few its FLOPs)."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What this machine does per second and per kernel, measured once (see :func:`calibrate`)."""

    bandwidth: float  # bytes/s through an element-wise Add on tensors far beyond the caches
    flops: float  # FLOP/s of a 512^3 MatMul
    run_s: float  # one run of a one-node session from Python, beyond the node's own work (a node
    # without a twin pays it)
    kernel_s: float  # one more tiny kernel inside a session

    def analytic(self, flops: int, nbytes: int, calls: int = 1) -> float:
        """Seconds of a node no session could time: its FLOPs and bytes at the measured rates."""
        return self.kernel_s + flops / self.flops + nbytes / self.bandwidth + (calls - 1) * CALL_S

    def bound(self, flops: int, nbytes: int, calls: int = 1) -> float:
        """Seconds a node takes at least: the slower of its FLOPs and its bytes at the measured rates,
        and its GEMM calls (a batched MatMul's batch) at :data:`CALL_S` each."""
        return max(self.kernel_s, flops / self.flops, nbytes / self.bandwidth, calls * CALL_S)


@dataclasses.dataclass(frozen=True)
class NodeCost:
    """One node of a candidate as costed: ``kind`` is "folded", "view", "timed" or "analytic"."""

    op: str
    kind: str
    key: str = ""  # the signature's digest (timed nodes)
    what: str = ""  # e.g. "MatMul 1x512 512x1024"
    flops: int = 0
    bytes: int = 0
    calls: int = 1  # GEMM calls (the batch of a MatMul)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A candidate's predicted seconds and what they are made of."""

    seconds: float
    nodes: tuple[tuple[NodeCost, float], ...]

    @property
    def timed_fraction(self) -> float:
        """The share of the prediction that comes from timed nodes (the rest is estimated)."""
        timed = sum(s for n, s in self.nodes if n.kind == "timed")
        return timed / self.seconds if self.seconds > 0 else 1.0


# --------------------------------------------------------------------------
# Signatures
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Value:
    shape: tuple[int, ...]
    dtype: int
    data: np.ndarray | None  # weights with known values (None: an activation, or a weight by shape only)
    weight: bool


@dataclasses.dataclass(frozen=True)
class _Node:
    cost: NodeCost
    node: onnx.NodeProto | None = None
    inputs: tuple[_Value | None, ...] = ()
    outputs: tuple[tuple[str, int], ...] = ()  # (name, element type) of the last node
    opset: int = 17
    # Element-wise nodes ONNX Runtime fuses into ``node``, in order, each with its inputs' values:
    # the group is timed as one session.
    fused: tuple[tuple[onnx.NodeProto, tuple[_Value | None, ...]], ...] = ()
    generated: bool = False  # one of einopt's generated kernels


def memory_limit() -> int:
    """Bytes the nodes timed together may need: :data:`MEMORY_SHARE` of the available memory (4 GB
    where that is unknown)."""
    available = available_bytes()
    return int(MEMORY_SHARE * (available if available is not None else 16e9))


def footprint(cost: NodeCost) -> int:
    """Bytes a node's single-operator session needs, about: its inputs and outputs, twice."""
    return 2 * cost.bytes


def node_costs(
    model: onnx.ModelProto,
    weights: Iterable[str] = (),
    kernel_build: str | None = None,
    signatures: bool = True,
) -> list[_Node]:
    """The nodes of ``model`` as ONNX Runtime runs them (local functions inlined), each with what
    decides its cost. ``weights`` names graph inputs that are weights declared by shape only (a light
    instantiation's large constants): nodes reading only weights are folded. With ``kernel_build``
    (``einopt.backends.tvm.ortkernel.build_id()``), a generated kernel is timed like any node (its
    signature: its description, the shapes and the build); without, it is costed analytically.
    Without ``signatures`` (an analytic estimate's nodes), the timed nodes' keys are left empty and
    the weights' values unread."""
    m = onnx.inliner.inline_local_functions(model) if model.functions else model
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - what inference cannot type is costed analytically below
        pass
    g = m.graph
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 17)
    values: dict[str, _Value] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if t.HasField("shape") and all(d >= 0 for d in dims):
            values[vi.name] = _Value(tuple(dims), t.elem_type, None, vi.name in weights)
    for init in g.initializer:
        values[init.name] = _Value(
            tuple(init.dims), init.data_type, _array(init) if signatures else None, True
        )
    entries: list[_Node] = []
    forms: dict[int, list | None] = {}  # entry index -> the signature form of a timed node (None: unsigned)
    at: dict[int, int] = {}  # graph node index -> its entry index
    for index, node in enumerate(g.node):
        if node.op_type == "Constant":
            t = next((a.t for a in node.attribute if a.name == "value"), None)
            if t is not None:
                values[node.output[0]] = _Value(tuple(t.dims), t.data_type, _array(t), True)
            continue
        at[index] = len(entries)
        ins = tuple(values.get(n) if n else None for n in node.input)
        known = all(v is not None for v, n in zip(ins, node.input, strict=True) if n)
        outs = [values.get(n) for n in node.output if n]
        if known and all(v.weight for v in ins if v is not None):
            for n in node.output:  # folded at session creation: its results are weights too
                if n in values:
                    values[n] = dataclasses.replace(values[n], weight=True, data=None)
            entries.append(_Node(NodeCost(node.op_type, "folded")))
            continue
        flops, nbytes = _flops_bytes(node, ins, outs) if known else (0, 0)
        if node.op_type in VIEWS:
            entries.append(_Node(NodeCost(node.op_type, "view")))
            continue
        generated = node.domain == KERNEL_DOMAIN and kernel_build is not None
        timed = node.domain in TIMED_DOMAINS or generated
        if not known or not timed or any(v is None for v in outs):
            entries.append(_Node(NodeCost(node.op_type, "analytic", flops=flops, bytes=nbytes)))
            continue
        forms[len(entries)] = (
            [
                node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}",
                opset,
                sorted((a.name, _attribute(a)) for a in node.attribute),
                [_value_form(v) for v in ins],
                len(node.output),
                *([kernel_build] if generated else []),
            ]
            if signatures
            else None
        )
        what = f"{node.op_type} " + " ".join("x".join(map(str, v.shape)) or "scalar" for v in ins if v)
        entries.append(
            _Node(
                NodeCost(node.op_type, "timed", "", what, flops, nbytes, _calls(node, outs)),
                node,
                ins,
                tuple((n, values[n].dtype) for n in node.output if n),
                opset,
                generated=generated,
            )
        )
    outputs = {o.name for o in g.output}
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(g.node):
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(index)
    out: list[_Node] = []
    taken: set[int] = set()
    for e, n in enumerate(entries):
        if e in taken:
            continue
        chain = _fusable_chain(n, entries, at, readers, outputs, taken) if e in forms else []
        taken.update(chain)
        group = [n, *(entries[c] for c in chain)]
        form = [FORMAT, *(forms[i] for i in [e, *chain])] if e in forms else None
        if form is not None:
            digest = (
                hashlib.sha256(json.dumps(form, separators=(",", ":")).encode()).hexdigest()
                if signatures
                else ""
            )
            n = dataclasses.replace(
                n,
                cost=dataclasses.replace(
                    n.cost,
                    key=digest,
                    what=" + ".join([n.cost.what, *(m.node.op_type for m in group[1:])]),
                    flops=sum(m.cost.flops for m in group),
                    bytes=sum(m.cost.bytes for m in group),
                ),
                outputs=group[-1].outputs,
                fused=tuple((m.node, m.inputs) for m in group[1:]),
            )
        out.append(n)
    return out


def _fusable_chain(
    head: _Node,
    entries: Sequence[_Node],
    at: Mapping[int, int],
    readers: Mapping[str, list[int]],
    outputs: set[str],
    taken: set[int],
) -> list[int]:
    """Entry indices of the element-wise nodes after ``head`` that ONNX Runtime fuses into it
    (:data:`FUSES`): each the only reader of the value before it, which is no graph output, and in
    no other group (``taken``)."""
    ops = FUSES.get(head.node.op_type) if head.node.domain in ("", "ai.onnx") else None
    chain: list[int] = []
    current = head
    while ops and len(chain) < FUSED_MAX and len(current.node.output) == 1:
        value = current.node.output[0]
        if value in outputs or len(readers.get(value, ())) != 1:
            break
        e = at.get(readers[value][0])
        nxt = entries[e] if e is not None else None
        if e in taken or nxt is None or nxt.cost.kind != "timed" or nxt.node.op_type not in ops:
            break
        if list(nxt.node.input).count(value) != 1 or not _fuses_after(nxt, value):
            break
        chain.append(e)
        current = nxt
    return chain


def _fuses_after(n: _Node, value: str) -> bool:
    """Whether ``n``'s inputs other than ``value`` are what a fusion into the group's head takes:
    constants (a Mul's scale, an activation's parameters), or for an Add a constant or a tensor of
    ``value``'s shape (the sum ONNX Runtime adds into the convolution's output)."""
    chained = next(v for name, v in zip(n.node.input, n.inputs, strict=True) if name == value)
    for name, v in zip(n.node.input, n.inputs, strict=True):
        if not name or name == value:
            continue
        if v is None:
            return False
        if v.weight:
            continue
        if n.node.op_type != "Add" or chained is None or v.shape != chained.shape:
            return False
    return True


def _array(t: onnx.TensorProto) -> np.ndarray | None:
    """A tensor's values, or None when it is declared by shape only (a light instantiation's)."""
    if not (t.raw_data or t.float_data or t.int64_data or t.int32_data or t.double_data):
        return (
            None
            if math.prod(t.dims) > 0
            else np.zeros(tuple(t.dims), helper.tensor_dtype_to_np_dtype(t.data_type))
        )
    return numpy_helper.to_array(t)


def _attribute(a: onnx.AttributeProto) -> object:
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, list):
        return [x.decode(errors="replace") if isinstance(x, bytes) else x for x in v]
    if isinstance(v, int | float | str):
        return v
    return hashlib.sha256(a.SerializeToString()).hexdigest()  # tensors and graphs: their bytes


def _value_form(v: _Value | None) -> list | None:
    """Shape, element type, weight or not; integer weights' values (they say what the node does)."""
    if v is None:
        return None
    form: list = [list(v.shape), v.dtype, v.weight]
    if v.weight and v.data is not None and v.data.dtype.kind in "iub":
        form.append(
            v.data.ravel().tolist() if v.data.size <= 64 else hashlib.sha256(v.data.tobytes()).hexdigest()
        )
    return form


def _flops_bytes(
    node: onnx.NodeProto, ins: Sequence[_Value | None], outs: Sequence[_Value | None]
) -> tuple[int, int]:
    if any(v is None for v in outs) or not outs:
        return 0, 0
    shapes = [v.shape for v in ins if v is not None]
    if node.domain == KERNEL_DOMAIN:  # a generated kernel: its FLOPs are an attribute
        flops = _int_attr(node, "flops")
    else:
        table = CONTRIB_FLOPS if node.domain == "com.microsoft" else FLOPS
        flops = table[node.op_type](shapes, outs[0].shape, node) if node.op_type in table else 0
    nbytes = sum(math.prod(v.shape) * itemsize(v.dtype) for v in [*ins, *outs] if v is not None)
    return int(flops), int(nbytes)


def _int_attr(node: onnx.NodeProto, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)


def _fused_matmul_flops(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], node: onnx.NodeProto) -> int:
    k = ins[0][-2] if _int_attr(node, "transA") else ins[0][-1]
    return 2 * math.prod(out) * k


def _fused_gemm_flops(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], node: onnx.NodeProto) -> int:
    k = ins[0][0] if _int_attr(node, "transA") else ins[0][1]
    return (2 * k + (len(ins) > 2) + 1) * math.prod(out)  # the products, the bias, the activation


def _per_element(k: int):
    return lambda ins, out, node: k * math.prod(out)


def _attention_flops(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], node: onnx.NodeProto) -> int:
    (b, s, d), (_, n, _) = ins[0], ins[1]
    heads = max(_int_attr(node, "num_heads"), 1)
    return 2 * b * s * n * (d + out[-1]) + 5 * b * heads * s * n  # two products, the softmax


def _packed_attention_flops(
    ins: Sequence[tuple[int, ...]], out: tuple[int, ...], node: onnx.NodeProto
) -> int:
    (b, s, d), (_, h) = ins[0], ins[1]
    heads = max(_int_attr(node, "num_heads"), 1)
    hv = out[-1]
    hq = (h - hv) // 2
    # the packed projection and its bias, then the core over the sequence itself (no past state)
    return 2 * b * s * d * h + b * s * h + 2 * b * s * s * (hq + hv) + 5 * b * heads * s * s


CONTRIB_FLOPS = {
    "FusedMatMul": _fused_matmul_flops,
    "FusedGemm": _fused_gemm_flops,
    # a transcendental function counts 4, as in einopt.core.cost
    "QuickGelu": _per_element(6),
    "FastGelu": _per_element(10),
    "Gelu": _per_element(7),
    "BiasGelu": _per_element(8),
    "SkipLayerNormalization": _per_element(10),
    "SkipSimplifiedLayerNormalization": _per_element(7),
    "MultiHeadAttention": _attention_flops,
    "Attention": _packed_attention_flops,
    "RotaryEmbedding": _per_element(3),  # two products and a sum per element
}
"""FLOPs of ONNX Runtime's com.microsoft operators (``einopt.core.cost.FLOPS`` has the default domain's)."""


def _calls(node: onnx.NodeProto, outs: Sequence[_Value | None]) -> int:
    """GEMM calls a node makes: a (Fused)MatMul's output batch (all but its last two dimensions)."""
    if node.op_type not in ("MatMul", "FusedMatMul") or not outs or outs[0] is None:
        return 1
    return math.prod(outs[0].shape[:-2])


# --------------------------------------------------------------------------
# Single-operator sessions
# --------------------------------------------------------------------------


def _single(n: _Node, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of node ``n`` alone, with the nodes fused into it: activations are graph inputs (fed
    random values), weights are initializers (so ONNX Runtime pre-packs them as it does in the
    model); the values one node of the group passes to the next stay inside."""
    steps = [(n.node, n.inputs), *n.fused]
    made = {o for node, _ in steps[:-1] for o in node.output}
    nodes, inputs, inits, feeds = [], [], [], {}
    local: dict[str, str] = {}
    for node_in, ins in steps:
        node = onnx.NodeProto()
        node.CopyFrom(node_in)
        node.ClearField("name")
        for i, (name, v) in enumerate(zip(node.input, ins, strict=True)):
            if not name:
                continue
            if name in made:
                node.input[i] = local.setdefault(name, f"t{len(local)}")
                continue
            if name in local:
                node.input[i] = local[name]
                continue
            local[name] = node.input[i] = f"in{len(local)}"
            data = v.data if v.data is not None else _fill(node_in, i, v, ins, rng)
            if v.weight:
                inits.append(numpy_helper.from_array(data, local[name]))
            else:
                inputs.append(helper.make_tensor_value_info(local[name], v.dtype, v.shape))
                feeds[local[name]] = data
        for k, o in enumerate(node.output):
            if o in made:
                node.output[k] = local.setdefault(o, f"t{len(local)}")
        nodes.append(node)
    outputs = []
    for j, (name, dtype) in enumerate(n.outputs):
        for k, o in enumerate(nodes[-1].output):
            if o == name:
                nodes[-1].output[k] = f"out{j}"
        outputs.append(helper.make_tensor_value_info(f"out{j}", dtype, None))
    return _model(nodes, inputs, outputs, inits, n.opset), feeds


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    """A model of ``nodes`` (value infos and initializer protos given) importing the default domain at
    ``opset`` and any other domain a node uses."""
    m = helper.make_model(
        helper.make_graph(nodes, "op", inputs, outputs, list(inits)),
        opset_imports=[helper.make_opsetid("", opset), *missing_opsets(nodes)],
    )
    m.ir_version = 8
    return m


def _binary(
    op: str, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...], rng: np.random.Generator
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``c = op(a, b)`` on float32 inputs of the given shapes, with random feeds."""
    f = onnx.TensorProto.FLOAT
    m = _model(
        [helper.make_node(op, ["a", "b"], ["c"])],
        [helper.make_tensor_value_info("a", f, a), helper.make_tensor_value_info("b", f, b)],
        [helper.make_tensor_value_info("c", f, out)],
    )
    return m, {"a": rng.standard_normal(a).astype(np.float32), "b": rng.standard_normal(b).astype(np.float32)}


def _fill(node: onnx.NodeProto, i: int, v: _Value, ins: Sequence[_Value | None], rng) -> np.ndarray:
    """Values for an input known by shape only: random floats; gather indices that stay in range and
    walk the axis in order (as layout gathers do); zeros for other integers."""
    dtype = helper.tensor_dtype_to_np_dtype(v.dtype)
    if np.dtype(dtype).kind == "f":
        return rng.random(v.shape, dtype=np.float32).astype(dtype, copy=False) - 0.5
    if node.op_type in ("Gather", "GatherElements") and i == 1 and ins[0] is not None:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        extent = max(1, ins[0].shape[axis])
        return (np.arange(math.prod(v.shape)) % extent).reshape(v.shape).astype(dtype)
    return np.zeros(v.shape, dtype)


def _twin(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A session of ``model``'s graph inputs that computes nothing (the Shape of the first), or None
    for a model without graph inputs: what a run costs beyond the node's work."""
    if not model.graph.input:
        return None
    first = model.graph.input[0].name
    out = helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, None)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    return _model([helper.make_node("Shape", [first], ["shape"])], list(model.graph.input), [out], (), opset)


def _runner(sess, feeds: Mapping[str, np.ndarray]):
    names = [o.name for o in sess.get_outputs()]
    feeds = dict(feeds)
    return lambda: sess.run(names, feeds)


FLUSH_BYTES = 8 << 20
"""Bytes an untimed run between two timed ones moves, on every core of the pool: more than the L2
caches hold, so a node's weights are not left there by its own previous run (in a model, the
other nodes' data has evicted them)."""


def _flusher():
    """An Add session over :data:`FLUSH_BYTES` in the global pool (every core's caches get touched)."""
    n = FLUSH_BYTES // 12
    m, feeds = _binary("Add", (n,), (n,), (n,), np.random.default_rng(0))
    return _runner(session(m), feeds)


def _cold_call(fn, flush) -> float:
    """Seconds of one call of ``fn`` right after ``flush()``."""
    import time

    flush()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _time_cold(
    fns: Mapping[str, object],
    flush,
    budget_s: float = GROUP_BUDGET_S,
    twins: Mapping[str, object] | None = None,
) -> dict[str, float | None]:
    """Median seconds of one call of each of ``fns``, each call timed alone after ``flush()``; for
    a key with a twin in ``twins``, the median of the differences between its call and its twin's
    call made right before it (each after its own flush): the run's overhead taken off in pairs.

    A first untimed round runs each callable once; one that took over
    :data:`SLOW_S` is timed twice more and keeps the faster of those two runs
    (at that length, noise is small against the node; its first runs are not:
    a 12 ms convolution over 17 MB took 17 and 16 ms in its first two, while
    its buffers were first touched). The others go round-robin (one more untimed round)
    until :data:`RUNS` and ``budget_s`` are met. A callable that raises gets None.
    """
    out: dict[str, float | None] = {}
    first: dict[str, float] = {}
    for k, fn in fns.items():
        try:
            first[k] = _cold_call(fn, flush)
        except Exception as e:  # noqa: BLE001 - a node that fails on random values: analytic
            log.info("a node failed to run alone: %s", e)
            out[k] = None
    twins = twins or {}

    def timed(k: str) -> tuple[float, float]:
        """One timed call of ``k`` (its twin's call taken off) and the seconds both took."""
        base = _cold_call(twins[k], flush) if k in twins else 0.0
        dt = _cold_call(fns[k], flush)
        return dt - base, dt + base

    for k in [k for k, dt in first.items() if dt > SLOW_S]:
        first.pop(k)
        out[k] = min(timed(k)[0] for _ in range(2))
    samples: dict[str, list[float]] = {k: [] for k in first}
    spent = 0.0
    for r in range(1 + RUNS[1]):
        if r >= 1 + RUNS[0] and spent >= budget_s:
            break
        for k in first:
            dt, took = timed(k)
            if r >= 1:
                samples[k].append(dt)
                spent += took
    out.update({k: float(np.median(v)) for k, v in samples.items()})
    return out


def calibrate() -> Calibration:
    """Measure this machine's bandwidth, MatMul rate and per-run and per-kernel overheads."""
    configure_threads()
    f = onnx.TensorProto.FLOAT
    rng = np.random.default_rng(0)

    def chain(op: str, k: int, shape: tuple[int, ...]) -> tuple[onnx.ModelProto, dict]:
        nodes = [helper.make_node(op, [f"v{i}"], [f"v{i + 1}"]) for i in range(k)]
        m = _model(
            nodes,
            [helper.make_tensor_value_info("v0", f, shape)],
            [helper.make_tensor_value_info(f"v{k}", f, shape)],
        )
        return m, {"v0": rng.standard_normal(shape).astype(np.float32)}

    big = (1 << 23,)  # 32 MB per tensor: far beyond any cache
    mm = 512
    cases = {
        "one": chain("Relu", 1, (1,)),
        "chain": chain("Relu", 33, (1,)),
        "add": _binary("Add", big, big, big, rng),
        "matmul": _binary("MatMul", (mm, mm), (mm, mm), (mm, mm), rng),
    }
    fns = {name: _runner(session(m), feeds) for name, (m, feeds) in cases.items()}
    quiet = {k: fns[k] for k in ("add", "matmul")}
    t, _ = time_interleaved(quiet, min_runs=10, max_runs=40, budget_s=1.0)
    med = {k: v.median_ms / 1e3 for k, v in t.items()}
    med |= _time_cold({k: fns[k] for k in ("one", "chain")}, _flusher(), budget_s=0.2)
    kernel = max((med["chain"] - med["one"]) / 32, 1e-7)
    return Calibration(
        bandwidth=3 * big[0] * 4 / med["add"],
        flops=2 * mm**3 / med["matmul"],
        run_s=max(med["one"] - kernel, 0.0),
        kernel_s=kernel,
    )


# --------------------------------------------------------------------------
# The cost model
# --------------------------------------------------------------------------


class OpCosts:
    """Predicts candidates' seconds from their nodes' measured times (see the module's docstring).

    Parameters
    ----------
    cache : MeasurementCache
        Where node times and the calibration are kept.
    seed : int
        Seeds the random values single-operator sessions run on.
    """

    def __init__(self, cache, seed: int = 0) -> None:
        self.cache = cache
        self.seed = seed
        self.measured = 0  # nodes timed by this object
        self.generated_measured = 0  # of which generated kernels
        self._calibration: Calibration | None = None
        self.scale: dict[str, float] = {}  # operator ("" : any) -> measured / estimated seconds
        self._ratios: dict[str, tuple[str, float]] = {}  # signature -> operator, measured / estimated

    def learn(self, nodes: Iterable[_Node]) -> None:
        """Scale the estimates of nodes not timed by what timed ones took against their estimates.

        The estimate puts a node's FLOPs and bytes at the machine's best measured rates; a timed node
        mostly takes longer (a 2x2 convolution runs far below a MatMul's FLOP rate). A program whose
        nodes are estimated would otherwise look faster than its input, whose nodes are timed (at GCN
        batch 16, phase forms estimated at 1.5x measured 0.35-0.9x). The scale is the median ratio per
        operator among the signatures with a time (in ``nodes`` or given before), and over all of them
        for an operator with none.
        """
        cal = self.calibration
        for n in nodes:
            c = n.cost
            stored = self._stored(c.key) if c.kind == "timed" and c.key not in self._ratios else None
            if stored and stored["seconds"] is not None:
                self._ratios[c.key] = (c.op, stored["seconds"] / cal.analytic(c.flops, c.bytes, c.calls))
        ratios: dict[str, list[float]] = {"": [r for _, r in self._ratios.values()]}
        for op, r in self._ratios.values():
            ratios.setdefault(op, []).append(r)
        self.scale = {op: float(np.median(r)) for op, r in ratios.items() if r}

    @property
    def calibration(self) -> Calibration:
        if self._calibration is None:
            key = self.cache.key("calibration", str(FORMAT))
            found = self.cache.value(key)
            if found is None:
                found = dataclasses.asdict(calibrate())
                self.cache.remember(key, "calibration", found)
            self._calibration = Calibration(**found)
        return self._calibration

    def predict(self, models: Sequence[tuple[onnx.ModelProto, Iterable[str]]]) -> list[Prediction]:
        """Predicted seconds of each ``(model, weights)``, timing the nodes not timed before (together).

        ``weights`` names the graph inputs that are weights (see :func:`node_costs`).
        """
        nodes = [node_costs(m, w) for m, w in models]
        self.measure(n for ns in nodes for n in ns)
        return [self.prediction(ns) for ns in nodes]

    def measure(self, nodes: Iterable[_Node], deadline: float | None = None, ordered: bool = False) -> None:
        """Time the nodes whose signature has no stored time yet (each signature once), biggest
        first (``ordered``: in the order given); those left when the ``time.monotonic()`` deadline
        passes stay unmeasured."""
        import time

        todo: dict[str, _Node] = {}
        for n in nodes:
            if n.cost.kind == "timed" and n.cost.key not in todo and self._stored(n.cost.key) is None:
                todo[n.cost.key] = n
        if not todo:
            return
        cal = self.calibration

        configure_threads()
        rng = np.random.default_rng(self.seed)
        flush = _flusher()
        # Nodes of similar size are timed together (a group runs as long as its slowest node), unless the
        # caller's order says what matters first.
        items = list(todo.items())
        if not ordered:
            items.sort(key=lambda kv: -cal.bound(kv[1].cost.flops, kv[1].cost.bytes, kv[1].cost.calls))
        groups = self._groups(items, memory_limit())
        for g, group in enumerate(groups):
            if deadline is not None and time.monotonic() > deadline:
                left = sum(len(later) for later in groups[g:])
                log.info("cost stage out of time: %d nodes left unmeasured", left)
                break
            fns, twins, whats = {}, {}, {}
            for key, n in group:
                try:
                    model, feeds = _single(n, rng)
                    fns[key] = _runner(session(model), feeds)
                    twin = _twin(model)
                    if twin is not None:
                        twins[key] = _runner(session(twin), feeds)
                    whats[key] = n.cost.what
                except Exception as e:  # noqa: BLE001 - a node no session runs is costed analytically
                    log.info("cannot time %s alone: %s", n.cost.what, e)
                    self._store(key, n.cost.what, None)
            t = _time_cold(fns, flush, twins=twins)
            for key, median in t.items():
                if median is not None and median > SLOW_S:
                    log.info("%s: %.3g s alone", whats[key], median)
                if median is None:
                    self._store(key, whats[key], None)
                    continue
                seconds = max(median - (0.0 if key in twins else cal.run_s), cal.kernel_s)
                self._store(key, whats[key], seconds)
                self.measured += 1
                self.generated_measured += todo[key].generated

    def _stored(self, key: str) -> dict | None:
        return self.cache.value(self.cache.key("op", key))

    def _store(self, key: str, what: str, seconds: float | None) -> None:
        self.cache.remember(self.cache.key("op", key), what, {"seconds": seconds})

    def _groups(self, items: list[tuple[str, _Node]], limit: int) -> list[list[tuple[str, _Node]]]:
        """``items`` (in timing order) in groups of at most :data:`GROUP` that fit in ``limit`` bytes
        together; a node that alone does not is stored as not timed (costed analytically)."""
        groups: list[list[tuple[str, _Node]]] = []
        used = limit + 1
        for key, n in items:
            need = footprint(n.cost)
            if need > limit:
                log.info(
                    "%s needs %.1f GB: too big to time alone, costed analytically", n.cost.what, need / 1e9
                )
                self._store(key, n.cost.what, None)
                continue
            if used + need > limit or len(groups[-1]) >= GROUP:
                groups.append([])
                used = 0
            groups[-1].append((key, n))
            used += need
        return groups

    def prediction(self, nodes: Sequence[_Node], bound: bool = False) -> Prediction:
        """The sum of ``nodes``' stored times; a node without one is estimated from its FLOPs and bytes,
        scaled as :meth:`learn` found (``bound``: by what it takes at least, see :meth:`Calibration.bound`)."""
        cal = self.calibration
        parts = []
        for n in nodes:
            c = n.cost
            if c.kind == "folded":
                s = 0.0
            elif c.kind == "view":
                s = cal.kernel_s
            else:
                stored = self._stored(c.key) if c.kind == "timed" else None
                s = stored["seconds"] if stored and stored["seconds"] is not None else None
                if s is None:
                    c = dataclasses.replace(c, kind="analytic")
                    s = (
                        cal.bound(c.flops, c.bytes, c.calls)
                        if bound
                        else cal.analytic(c.flops, c.bytes, c.calls)
                        * self.scale.get(c.op, self.scale.get("", 1.0))
                    )
            parts.append((c, float(s)))
        return Prediction(sum(s for _, s in parts), tuple(parts))

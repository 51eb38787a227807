"""The pipeline's cost stage: every program a search found, costed on this machine.

The search ranks what it finds by an analytic estimate (FLOPs and bytes at
nominal rates), which cannot tell one MatMul on a concatenated weight from
four on its slices: the bytes are the same, the kernels are not. Here every
found program of every subprogram (and the subprogram's original nodes) is
costed by :class:`einopt.runtime.opcost.OpCosts`: the sum of its nodes' times in ONNX
Runtime, each node timed once as a single-operator session and cached. The
programs are re-ranked by that prediction, and selection times the best of
them against the original nodes: the prediction chooses what to time, the
timing decides.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

from einopt.frontend.translate import Part, value_types
from einopt.instantiate.backend import PORTABLE, Backend
from einopt.instantiate.program import program_model, weight_names
from einopt.runtime.opcost import OpCosts, footprint, memory_limit, node_costs
from einopt.search.results import Candidate
from einopt.stages.context import StageContext
from einopt.stages.partsearch import PartSearch
from einopt.stages.verify import Epilogue, epilogue

__all__ = ["predict", "SLACK", "BUDGET_S"]

log = logging.getLogger(__name__)

SLACK = 2.0
"""A found program whose nodes take at least this many times its input's predicted time is not
costed further (selection would not time it either)."""
BUDGET_S = 40.0
"""Seconds the cost stage may spend timing nodes for one model (with the search's 150 s and the
selection's 60 s, a model stays within 5 minutes on a 2-core machine)."""


def predict(
    ctx: StageContext,
    parts: Sequence[Part],
    searches: Mapping[str, PartSearch],
    costs: OpCosts,
    budget_s: float | None = None,
) -> dict[str, PartSearch]:
    """Each part's found programs with measured-operator predictions, best predicted first.

    Parameters
    ----------
    ctx : StageContext
        The prepared model the parts were cut from (``ctx.model``: the input of each part is
        costed as its original nodes), and how the found programs' eOperators are written
        (``ctx.backend``: a generated kernel is compiled once it is timed, and timed like any node).
    parts : sequence of Part
        The translated subprograms.
    searches : mapping
        Part name -> what its search found.
    costs : OpCosts
        Times the nodes not timed before (all together) and predicts.
    budget_s : float, optional
        Seconds of node timing at most (default :data:`BUDGET_S`); nodes not
        timed by then are estimated.

    Returns
    -------
    dict
        Part name -> its search, each :class:`~einopt.search.Candidate` with ``cost`` measured
        (``timed_share`` of it from nodes timed alone) and ``estimated_cost`` the search's analytic
        estimate.
    """
    model, backend = ctx.model, ctx.backend
    deadline = time.monotonic() + (BUDGET_S if budget_s is None else budget_s)
    types = value_types(model)
    inits = {t.name: t for t in model.graph.initializer}
    nodes: dict[tuple[str, int], list] = {}
    for p in parts:
        search = searches.get(p.name)
        if p.program is None or search is None or not search.candidates:
            continue
        tail = epilogue(model, p)
        for i, c in enumerate(search.candidates):
            try:
                m, weights, built = _original(model, p, types) if not c.trace else _light(c, p, backend)
                m = _with_epilogue(m, tail, {} if not c.trace else p.names, inits)
                nodes[(p.name, i)] = node_costs(m, weights, built)
            except Exception as e:  # noqa: BLE001 - what cannot be built keeps its analytic estimate
                log.info("%s: cannot cost a found program: %s", p.name, e)
    # The inputs first: a program that takes at least SLACK times its input's time (its unmeasured
    # nodes at the machine's peak rates) is never timed, so its nodes are not measured either.
    inputs = {name: k for name, k in nodes if not searches[name].candidates[k].trace}
    costs.measure((n for name, k in inputs.items() for n in nodes[(name, k)]), deadline)
    costs.learn(n for ns in nodes.values() for n in ns)
    base = {name: costs.prediction(nodes[(name, k)]).seconds for name, k in inputs.items()}
    hopeless = {
        key
        for key, ns in nodes.items()
        if key[0] in base and costs.prediction(ns, bound=True).seconds > SLACK * base[key[0]]
    }
    # A derived program with a node too big to time alone would not fit its verification either.
    limit = memory_limit()
    too_big = {key for key, ns in nodes.items() if key not in inputs.items() and _largest(ns) > limit}
    skip = hopeless | too_big
    _measure_promising(costs, {key: ns for key, ns in nodes.items() if key not in skip}, base, deadline)
    new: dict[str, list[Candidate]] = {n: list(s.candidates) for n, s in searches.items()}
    for name in sorted({name for name, _ in too_big}):
        count = sum(1 for n, _ in too_big if n == name)
        log.info("%s: %d found programs need more memory than this machine has to spare", name, count)
    for (name, i), ns in nodes.items():
        c = new[name][i]
        if (name, i) in too_big:
            new[name][i] = dataclasses.replace(c, cost=math.inf, estimated_cost=c.cost)
            continue
        pr = costs.prediction(ns, bound=(name, i) in hopeless)
        new[name][i] = dataclasses.replace(
            c, cost=pr.seconds, estimated_cost=c.cost, timed_share=pr.timed_fraction
        )
    log.info(
        "cost stage: %d nodes timed, %d of them generated kernels", costs.measured, costs.generated_measured
    )
    out = dict(searches)
    for name, cands in new.items():
        ranked = sorted(cands, key=lambda c: (c.cost, c.depth))
        out[name] = dataclasses.replace(searches[name], candidates=tuple(ranked))
    return out


def _measure_promising(
    costs: OpCosts, nodes: Mapping[tuple[str, int], list], base: Mapping[str, float], deadline: float
) -> None:
    """Time the programs' nodes, the most promising programs first, until the deadline.

    In rounds: each part's best predicted program whose nodes are not all timed yet (a node not
    timed is estimated), the parts predicted to save the most first. A round's timings change the
    predictions the next round picks by, so what the selection will time (each part's best few)
    is measured first; when the budget runs out (GCN at batch 16 has 50 subprograms of big
    convolutions), the rest keep estimates instead of the nodes that happen to be biggest.
    """
    left = dict(nodes)
    while left and time.monotonic() < deadline:
        best: dict[str, tuple[float, tuple[str, int]]] = {}
        for key, ns in left.items():
            s = costs.prediction(ns).seconds
            if key[0] not in best or (s, key) < best[key[0]]:
                best[key[0]] = (s, key)
        picked = sorted(best.values(), key=lambda sk: (sk[0] - base.get(sk[1][0], sk[0]), sk[1]))
        measured = [n for _, key in picked for n in left.pop(key)]
        costs.measure(measured, deadline, ordered=True)
        costs.learn(measured)


def _largest(nodes) -> int:
    return max((footprint(n.cost) for n in nodes), default=0)


def _with_epilogue(
    m: onnx.ModelProto, tail: Epilogue, names: Mapping[str, str], inits: Mapping[str, onnx.TensorProto]
) -> onnx.ModelProto:
    """``m`` (a part's nodes, its outputs named by ``names``' keys, or ONNX's names when ``names`` is
    empty) with the part's epilogue after it, so that what ONNX Runtime fuses into the part's last
    nodes (:data:`einopt.runtime.opcost.FUSES`) is costed as one group."""
    if not tail.nodes:
        return m
    local = {onnx_name: name for name, onnx_name in names.items()}
    graph_outputs = {o.name: o for o in m.graph.output}
    after = []
    for node in tail.nodes:
        node = onnx.NodeProto.FromString(node.SerializeToString())
        node.input[:] = [local.get(i, i) for i in node.input]
        after.append(node)
    out = onnx.ModelProto.FromString(m.SerializeToString())
    out.graph.node.extend(after)
    have = {t.name for t in out.graph.initializer}
    read = dict.fromkeys(i for n in after for i in n.input if i in inits and i not in have)
    out.graph.initializer.extend(inits[i] for i in read)
    del out.graph.output[:]
    for o in tail.outputs:
        name = local.get(o, o)
        out.graph.output.append(graph_outputs.get(name) or onnx.ValueInfoProto(name=name))
    return out


def _light(
    c: Candidate, p: Part, backend: Backend = PORTABLE
) -> tuple[onnx.ModelProto, frozenset[str], str | None]:
    """The candidate as a light model, its weights' names, and the build its generated kernels are
    timed under (None without any: see :func:`einopt.runtime.opcost.node_costs`)."""
    m, inst = program_model(c.program, dict(p.constants), light=True, backend=backend)
    return m, weight_names(p.constants, inst), backend.kernel_build(inst)


def _original(model: onnx.ModelProto, p: Part, types) -> tuple[onnx.ModelProto, frozenset[str], None]:
    """The part's original nodes as a model (weights as the model's initializers)."""
    nodes = [model.graph.node[i] for i in p.nodes]
    made = {o for n in nodes for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    read = list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in made))
    inputs = []
    for name in read:
        if name in inits:
            continue
        t = types.get(name)
        if t is None or t.shape is None:
            raise ValueError(f"no shape for {name}")
        inputs.append(helper.make_tensor_value_info(name, t.elem_type, t.shape))
    outputs = [onnx.ValueInfoProto(name=p.names[o]) for o in p.program.outputs]
    graph = helper.make_graph(nodes, "part", inputs, outputs, [inits[n] for n in read if n in inits])
    m = helper.make_model(graph, opset_imports=list(model.opset_import), functions=list(model.functions))
    m.ir_version = model.ir_version
    return m, frozenset(n for n in read if n in inits), None

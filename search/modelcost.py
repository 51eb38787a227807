"""The analytic cost of a candidate's ONNX model: FLOPs and bytes of its nodes at a nominal rate
(nodes reading only weights are folded), and what it runs as (its operators).

Both the search (:mod:`einopt.search.candidates`) and the process that costs its candidates beside
it (:mod:`einopt.search.costprocess`) cost models so.
"""

from __future__ import annotations

import hashlib

from einopt.core.cost import BANDWIDTH, PEAK_FLOPS
from einopt.runtime.opcost import node_costs

__all__ = ["analytic", "estimate", "operators"]


def analytic(model, weights: frozenset[str]) -> tuple[float, tuple[str, ...]]:
    """The analytic estimate of a (light) model, nodes reading only weights left out (folded when the
    session is created), and what identifies the work it does: its nodes (operator and input shapes)
    as a multiset. Two candidates that only order the same nodes differently are one candidate."""
    nodes = [n.cost for n in node_costs(model, weights, signatures=False)]
    flops = sum(c.flops for c in nodes)
    nbytes = sum(c.bytes for c in nodes if c.kind != "view")
    return flops / PEAK_FLOPS + nbytes / BANDWIDTH, tuple(
        sorted(c.what or c.op for c in nodes if c.kind != "folded")
    )


def estimate(model, weights: frozenset[str], estimates: dict) -> tuple[float, tuple[str, ...]]:
    """:func:`analytic`, once per distinct model in ``estimates``: about half the candidates of a
    search instantiate to a model byte for byte like an earlier one's (a rewrite the instantiation
    does not see, such as an element-wise chain nested otherwise)."""
    key = (hashlib.blake2b(model.SerializeToString(), digest_size=16).digest(), weights)
    found = estimates.get(key)
    if found is None:
        found = estimates[key] = analytic(model, weights)
    return found


def operators(model) -> tuple[str, ...]:
    """What a model runs as: ONNX op types, eOperators (its local functions) as ``"eop:NAME"``, operators
    of another domain (ONNX Runtime's contrib ones) as ``"DOMAIN.NAME"``."""
    local = {(f.domain, f.name) for f in model.functions}
    return tuple(
        f"eop:{node.op_type}"
        if (node.domain, node.op_type) in local
        else f"{node.domain}.{node.op_type}"
        if node.domain not in ("", "ai.onnx")
        else node.op_type
        for node in model.graph.node
    )

"""Facts about ONNX graphs and small in-place edits of them, shared by the preparation stages.

Used by :mod:`einopt.frontend.fold` (constant folding) and
:mod:`einopt.frontend.batchnorm` (BatchNormalization folding): which values
are read and how often (subgraphs included), which initializers are true
constants, static shapes, fresh names, and removing nodes, initializers or
stale value_info.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import onnx
from onnx import TensorProto

__all__ = [
    "outer_reads",
    "subgraph_reads",
    "read_counts",
    "has_subgraph",
    "static_shapes",
    "constants",
    "all_names",
    "unique_name",
    "FreshNames",
    "delete_at",
    "drop_value_info",
    "drop_unused_initializers",
]


def subgraph_reads(graph: onnx.GraphProto) -> Iterable[str]:
    """Every name read anywhere in ``graph`` (over-approximates the outer values a subgraph uses)."""
    for node in graph.node:
        yield from (i for i in node.input if i)
        for a in node.attribute:
            for g in [a.g] if a.HasField("g") else a.graphs:
                yield from subgraph_reads(g)
    yield from (o.name for o in graph.output)


def outer_reads(nodes: Iterable[onnx.NodeProto], local: Iterable[str] = ()) -> list[str]:
    """Values ``nodes`` read that neither they nor ``local`` produce (in first-read order)."""
    nodes = list(nodes)
    inside = {o for n in nodes for o in n.output} | set(local)
    return list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in inside))


def read_counts(graph: onnx.GraphProto) -> collections.Counter[str]:
    """How many times each value is read by nodes of ``graph``, subgraph reads included."""
    counts: collections.Counter[str] = collections.Counter()
    for node in graph.node:
        counts.update(i for i in node.input if i)
        for a in node.attribute:
            for g in [a.g] if a.HasField("g") else a.graphs:
                counts.update(set(subgraph_reads(g)))
    return counts


def has_subgraph(node: onnx.NodeProto) -> bool:
    """True when ``node`` has a graph-valued attribute (If, Loop, Scan, ...)."""
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """Values whose shape is fully known (declared or inferred), plus constant initializer shapes."""
    out: dict[str, tuple[int, ...]] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            if all(d.HasField("dim_value") for d in tt.shape.dim):
                out[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for t in constants(graph).values():  # an overridable initializer's shape is what its input declares
        out[t.name] = tuple(int(d) for d in t.dims)
    return out


def constants(graph: onnx.GraphProto) -> dict[str, TensorProto]:
    """Initializers that are not graph inputs (inputs with a default can be overridden)."""
    inputs = {i.name for i in graph.input}
    return {t.name: t for t in graph.initializer if t.name not in inputs}


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name used in ``graph``: inputs, outputs, value_info, initializers, node outputs, reads."""
    names = {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
    names |= {t.name for t in graph.initializer}
    names |= set(subgraph_reads(graph))
    names |= {o for n in graph.node for o in n.output}
    return names


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``, which it is added to."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


class FreshNames:
    """Names taken so far; :meth:`fresh` hands out new ones as :func:`unique_name` does, remembering
    how far each base's count got (an emitter asks for ``matmul`` hundreds of times)."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self.taken = set(taken)
        self.next: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``, ... : the first not taken, which is taken now."""
        if base not in self.taken:
            self.taken.add(base)
            return base
        k = self.next.get(base, 1)
        while f"{base}_{k}" in self.taken:  # names are never given back: those before k stay taken
            k += 1
        name = f"{base}_{k}"
        self.taken.add(name)
        self.next[base] = k + 1
        return name


def delete_at(repeated: object, indices: Iterable[int]) -> None:
    """Delete the elements at ``indices`` from a repeated protobuf field."""
    for i in sorted(set(indices), reverse=True):
        del repeated[i]  # type: ignore[attr-defined]


def drop_value_info(graph: onnx.GraphProto) -> None:
    """Drop value_info of values no node produces any more, or that are now initializers."""
    produced = {o for n in graph.node for o in n.output}
    inits = {t.name for t in graph.initializer}
    delete_at(
        graph.value_info,
        [i for i, v in enumerate(graph.value_info) if v.name not in produced or v.name in inits],
    )


def drop_unused_initializers(graph: onnx.GraphProto, candidates: set[str]) -> int:
    """Remove the ``candidates`` no node reads any more (graph inputs and outputs are kept)."""
    reads = read_counts(graph)
    keep = {v.name for v in [*graph.input, *graph.output]}
    dead = [
        i
        for i, t in enumerate(graph.initializer)
        if t.name in candidates and not reads[t.name] and t.name not in keep
    ]
    delete_at(graph.initializer, dead)
    return len(dead)

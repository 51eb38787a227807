"""Verification of the rewritten parts: each part's original nodes and its new nodes as two small
models, run on the values that really reach the part when the original model runs on the
verification inputs, and compared (:func:`verify_parts`). A part that differs is rolled back by
the caller. The same pairs, with each part's :func:`epilogue`, are what part timings run.

The comparison, the capture of intermediate values and the end-to-end check are runtime services
(:mod:`einopt.runtime.verify`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from einopt.core.cost import value_bytes
from einopt.frontend.onnx_graph import outer_reads
from einopt.frontend.partition import ELEMENTWISE_ACTIVATIONS
from einopt.runtime import modelio
from einopt.runtime.verify import Agreement, Tolerance, capture, compare, subgraph_model

if TYPE_CHECKING:
    from einopt.frontend.translate import Part
    from einopt.instantiate.emit import Instantiated


@dataclasses.dataclass(frozen=True)
class PartPair:
    """One rewritten part as two standalone models fed with the values that reach it."""

    name: str
    original: onnx.ModelProto
    original_feeds: dict[str, np.ndarray]
    rewritten: onnx.ModelProto
    rewritten_feeds: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """The element-wise activations right after a part, which ONNX Runtime may fuse into the node
    that makes their input (Gemm + Sigmoid into FusedGemm, Conv + Relu into FusedConv).

    A part's nodes end where the graph's activations start, so a part timed on its own cannot see
    that fusion: four Gemms each read by a Sigmoid become four fused kernels, one Gemm split four
    ways does not. Timing a part's nodes with its epilogue (the same nodes on both sides) shows it.
    """

    nodes: tuple[onnx.NodeProto, ...]
    outputs: tuple[str, ...]
    """The values the part with its epilogue gives the rest of the graph: each epilogue node's
    outputs, and the part's outputs still read by something else (or graph outputs)."""


def epilogue(model: onnx.ModelProto, part: Part) -> Epilogue:
    """``part``'s :class:`Epilogue` in ``model``: each node reading one of its outputs that is an
    element-wise activation (:data:`einopt.frontend.partition.ELEMENTWISE_ACTIVATIONS`) whose
    other inputs are initializers (a Clip's bounds, a LeakyRelu has none)."""
    outputs = [part.names[o] for o in part.program.outputs]
    mine = set(outputs)
    constants = {t.name for t in model.graph.initializer} - {i.name for i in model.graph.input}
    inside = set(part.nodes)
    taken: list[onnx.NodeProto] = []
    other_readers: set[str] = {o.name for o in model.graph.output} & mine
    for index, node in enumerate(model.graph.node):
        if index in inside:
            continue
        read = [i for i in node.input if i in mine]
        if not read:
            continue
        others = [i for i in node.input if i and i not in mine]
        if (
            node.op_type in ELEMENTWISE_ACTIVATIONS
            and node.domain in ("", "ai.onnx")
            and len(read) == 1
            and all(i in constants for i in others)
        ):
            taken.append(node)
        else:
            other_readers.update(read)
    made = [o for n in taken for o in n.output if o]
    kept = [o for o in outputs if o in other_readers or not any(o in n.input for n in taken)]
    return Epilogue(tuple(taken), tuple(dict.fromkeys([*kept, *made])))


CAPTURE_BYTES = 2 << 30
"""Intermediate values captured at once for part checks; more parts means more runs of the model."""


def part_pairs(
    model: onnx.ModelProto,
    parts: Sequence[Part],
    emitted: Mapping[str, Instantiated],
    feeds: Mapping[str, np.ndarray],
    max_bytes: int = CAPTURE_BYTES,
    epilogues: bool = False,
    declared: Mapping[str, Sequence[int | str | None]] | None = None,
) -> Iterator[PartPair]:
    """For each part, its original nodes and its new nodes as two models on the values ``feeds`` produce.

    Parameters
    ----------
    model : onnx.ModelProto
        The prepared model the parts were cut from.
    parts, emitted
        The translated parts and their instantiations (by part name).
    feeds : mapping
        Graph inputs; the original model runs on them to capture the parts' boundary values.
    max_bytes : int
        Capture at most about this many bytes of intermediate values per run of
        the model (parts are taken in order, in groups that fit; a part that
        alone needs more is a group of its own), so big models at big batches
        are checked without holding every intermediate value at once.
    epilogues : bool
        Append each part's :func:`epilogue` to both its models (for timing: what ONNX Runtime
        fuses across the part's boundary is then in both), instead of ending at the part's outputs
        (for checking them).
    declared : mapping, optional
        Dims of values (by name) as the output declares them where it keeps symbolic dimensions: a
        part's inputs are declared so in both its models (ONNX Runtime runs some forms slower where
        it cannot know a shape: they are timed as the output runs them).
    """
    nodes = list(model.graph.node)
    boundary: dict[str, tuple[list[str], list[str]]] = {}
    # The model's constants stay constants in the part models (as initializers, not fed
    # inputs): ORT prepacks and folds constant weights, so timing them as inputs is unfair.
    fed = {i.name for i in model.graph.input}
    consts = {t.name: t for t in model.graph.initializer if t.name not in fed}
    for p in parts:
        inst = emitted[p.name]
        old = [nodes[i] for i in p.nodes]
        boundary[p.name] = (
            outer_reads(old, consts),
            outer_reads(inst.nodes, {t.name for t in inst.initializers} | set(consts)),
        )
    for group in _groups(parts, boundary, _value_bytes(model, feeds), max_bytes):
        values = capture(model, feeds, {n for p in group for n in sum(boundary[p.name], [])})
        for p in group:
            inst = emitted[p.name]
            outputs = [p.names[o] for o in p.program.outputs]
            after: list[onnx.NodeProto] = []
            if epilogues:
                tail = epilogue(model, p)
                after, outputs = list(tail.nodes), list(tail.outputs)
            old_in, new_in = boundary[p.name]
            old_nodes = [*(nodes[i] for i in p.nodes), *after]
            new_nodes = [*inst.nodes, *after]
            old_feeds = {n: values[n] for n in old_in}
            new_feeds = {n: values[n] for n in new_in}
            yield PartPair(
                p.name,
                subgraph_model(
                    model, old_nodes, old_feeds, outputs, _constants(old_nodes, consts), declared=declared
                ),
                old_feeds,
                subgraph_model(
                    model,
                    new_nodes,
                    new_feeds,
                    outputs,
                    [*inst.initializers, *_constants(new_nodes, consts)],
                    inst.functions,
                    declared,
                ),
                new_feeds,
            )
        del values


def _constants(
    nodes: Sequence[onnx.NodeProto], consts: Mapping[str, onnx.TensorProto]
) -> list[onnx.TensorProto]:
    """The model constants ``nodes`` read, in first-read order."""
    return [consts[n] for n in dict.fromkeys(i for node in nodes for i in node.input) if n in consts]


def _value_bytes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Bytes of each intermediate value whose shape is known (graph inputs and initializers cost nothing)."""
    skip = set(feeds) | {t.name for t in model.graph.initializer}
    return {name: n for name, n in value_bytes(model).items() if name not in skip}


def _groups(
    parts: Sequence[Part],
    boundary: Mapping[str, tuple[list[str], list[str]]],
    sizes: Mapping[str, int],
    max_bytes: int,
) -> Iterator[list[Part]]:
    group: list[Part] = []
    names: set[str] = set()
    for p in parts:
        mine = set(sum(boundary[p.name], []))
        grown = names | mine
        if group and sum(sizes.get(n, 0) for n in grown) > max_bytes:
            yield group
            group, grown = [], mine
        group.append(p)
        names = grown
    if group:
        yield group


def verify_parts(
    model: onnx.ModelProto,
    parts: Sequence[Part],
    emitted: Mapping[str, Instantiated],
    datasets: Sequence[Mapping[str, np.ndarray]],
    tol: Tolerance,
) -> dict[str, Agreement]:
    """Run each part's original and new nodes on the values that reach it; compare."""
    checks: dict[str, Agreement] = {}
    for feeds in datasets:
        todo = [p for p in parts if p.name not in checks or checks[p.name].ok]
        for pair in part_pairs(model, todo, emitted, feeds):
            try:
                ref, first = _run_timed(pair.original, pair.original_feeds)
                got, second = _run_timed(pair.rewritten, pair.rewritten_feeds)
            except Exception as e:  # noqa: BLE001 - a rewrite ORT cannot run is a failed rewrite
                checks[pair.name] = Agreement(
                    False, float("inf"), f"ONNX Runtime failed: {type(e).__name__}: {e}"
                )
                continue
            c = compare(ref, got, tol)
            prev = checks.get(pair.name)
            if prev is None:
                checks[pair.name] = dataclasses.replace(c, run_seconds=(first, second))
            else:
                checks[pair.name] = dataclasses.replace(
                    prev, ok=c.ok, max_abs_error=max(c.max_abs_error, prev.max_abs_error), message=c.message
                )
    return checks


def _run_timed(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> tuple[dict, float]:
    """The outputs of one run, and its wall seconds (the session is made first and is not counted;
    one session at a time, as large parts need)."""
    sess = modelio.session(model, arena=False)
    t = time.perf_counter()
    out = modelio.run(sess, feeds)
    return out, time.perf_counter() - t

"""Numerical verification in ONNX Runtime: per subprogram, then end to end.

Each rewritten subprogram is checked on its own, on the values that really
reach it when the original model runs on the verification inputs: the
original nodes and the new nodes run as two small models and their outputs
are compared. A subprogram that differs is rolled back by the caller. The
assembled model is then compared with the original on the same inputs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from einopt.core.cost import value_bytes
from einopt.errors import UnsupportedModelError
from einopt.frontend.partition import ELEMENTWISE_ACTIVATIONS
from einopt.runtime import modelio

if TYPE_CHECKING:
    from einopt.frontend.translate import Part
    from einopt.instantiate.emit import Instantiated

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``|got - ref| <= atol * scale + rtol * |ref|`` elementwise, ``scale = max(1, max |ref|)``.

    The defaults allow float32 reassociation of long sums while catching a
    wrong index, a lost term or a swapped operand.
    """

    rtol: float = 1e-3
    atol: float = 1e-4


@dataclasses.dataclass(frozen=True)
class Agreement:
    """Whether two runs' outputs agree within the tolerance: the largest absolute difference, and a
    message naming the first output that differs and how ("" when they agree)."""

    ok: bool
    max_abs_error: float
    message: str = ""
    # verify_parts: wall seconds of one (first) run of the original and of the new nodes on the
    # first data set, sessions made beforehand; a rough screen, never a timing
    run_seconds: tuple[float, float] | None = None


def compare(
    refs: Mapping[str, np.ndarray], gots: Mapping[str, np.ndarray], tol: Tolerance = Tolerance()
) -> Agreement:
    """Compare named outputs; the message names the first output that differs and how."""
    worst = 0.0
    for name, ref in refs.items():
        got = gots[name]
        if isinstance(ref, list | tuple) or ref is None or isinstance(got, list | tuple) or got is None:
            c = _compare_sequences(name, ref, got, tol)  # sequence- or optional-typed outputs
            if not c.ok:
                return c
            worst = max(worst, c.max_abs_error)
            continue
        ref = np.asarray(ref)
        got = np.asarray(got)
        if ref.shape != got.shape or ref.dtype != got.dtype:
            return Agreement(
                False,
                float("inf"),
                f"output {name!r}: {got.dtype}{list(got.shape)} != {ref.dtype}{list(ref.shape)}",
            )
        if ref.size == 0:
            continue
        if not np.issubdtype(ref.dtype, np.floating):
            if not np.array_equal(ref, got):
                return Agreement(False, float("inf"), f"output {name!r}: values differ")
            continue
        r = ref.astype(np.float64)
        g = got.astype(np.float64)
        same_special = (np.isnan(r) & np.isnan(g)) | (np.isinf(r) & (r == g))
        finite = np.isfinite(r)
        scale = max(1.0, float(np.max(np.abs(r[finite]))) if finite.any() else 1.0)
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.where(same_special, 0.0, np.abs(g - r))
        err = np.where(np.isnan(err), np.inf, err)
        bad = err > tol.atol * scale + tol.rtol * np.abs(np.where(finite, r, 0.0))
        bad &= ~same_special
        worst = max(worst, float(err.max()))
        if bad.any():
            at = tuple(int(v) for v in np.argwhere(bad)[0])
            return Agreement(
                False,
                worst,
                f"output {name!r} differs at {list(at)}: {g[at]:.6g} vs {r[at]:.6g} (max error {worst:.3g})",
            )
    return Agreement(True, worst)


def _compare_sequences(name: str, ref: object, got: object, tol: Tolerance) -> Agreement:
    if ref is None or got is None:
        ok = ref is None and got is None
        return Agreement(
            ok, 0.0 if ok else float("inf"), "" if ok else f"output {name!r}: optional presence differs"
        )
    if not isinstance(ref, list | tuple) or not isinstance(got, list | tuple) or len(ref) != len(got):
        return Agreement(False, float("inf"), f"output {name!r}: sequences differ in length or kind")
    return compare(
        {f"{name}[{k}]": r for k, r in enumerate(ref)}, {f"{name}[{k}]": g for k, g in enumerate(got)}, tol
    )


def capture(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], names: Iterable[str]
) -> dict[str, np.ndarray]:
    """Run ``model`` on ``feeds`` and return the values of ``names`` (inputs, initializers or intermediates)."""
    wanted = list(dict.fromkeys(names))
    graph_inputs = {i.name for i in model.graph.input}
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, np.ndarray] = {}
    to_run: list[str] = []
    for n in wanted:
        if n in feeds:
            out[n] = np.asarray(feeds[n])
        elif n in inits and n not in graph_inputs:
            out[n] = onnx.numpy_helper.to_array(inits[n])
        else:
            to_run.append(n)
    if to_run:
        # The wanted values become graph outputs for one run: in place and undone after, since a
        # copy of a big model is a copy of all its weights (``model`` is as it was on return).
        outputs = model.graph.output
        kept = len(outputs)
        existing = {o.name for o in outputs}
        types = {vi.name: vi for vi in model.graph.value_info}
        try:
            for n in to_run:
                if n not in existing:
                    outputs.append(types[n] if n in types else onnx.ValueInfoProto(name=n))
            out.update(modelio.run(model, feeds, outputs=to_run))
        finally:
            del outputs[kept:]
    return out


def subgraph_model(
    template: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    initializers: Sequence[onnx.TensorProto] = (),
    functions: Sequence[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    """A standalone model of ``nodes`` whose graph inputs are typed after ``inputs``'s arrays."""
    init_names = {t.name for t in initializers}
    graph_inputs = [
        onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
        for n, a in inputs.items()
        if n not in init_names
    ]
    graph = onnx.helper.make_graph(
        list(nodes),
        "part",
        graph_inputs,
        [onnx.ValueInfoProto(name=o) for o in outputs],
        initializer=list(initializers),
    )
    opsets = [*template.opset_import, *modelio.missing_opsets(nodes, template.opset_import)]
    m = onnx.helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    m.ir_version = max(template.ir_version, 8 if functions else template.ir_version)
    return m


def verification_inputs(
    model: onnx.ModelProto,
    *,
    seed: int = 0,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    given: Sequence[Mapping[str, np.ndarray] | str | Path] = (),
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], str]:
    """Verification inputs, the original model's outputs on them, and a note on the ones that are unusable.

    Seeded random inputs come first, then the user's (``given``: arrays by
    input name, or ``.npz`` paths). Inputs the original model cannot run on
    (integer inputs that must hold valid indices, shape tensors, strings, a
    model ONNX Runtime cannot load) are dropped with a note; with none left,
    nothing can be verified. Inputs that do not fit the model are a ``ModelError``.
    """
    candidates: list[tuple[str, dict[str, np.ndarray] | None, str]] = []
    try:
        candidates.append(
            ("generated inputs", modelio.random_inputs(model, seed, dict(input_shapes or {})), "")
        )
    except UnsupportedModelError as e:
        candidates.append(("generated inputs", None, str(e)))
    for k, d in enumerate(given):
        feeds = modelio.load_inputs(d, model) if isinstance(d, str | Path) else dict(d)
        candidates.append((f"given inputs #{k + 1}" if len(given) > 1 else "the given inputs", feeds, ""))
    sets: list[dict[str, np.ndarray]] = []
    refs: list[dict[str, np.ndarray]] = []
    problems: list[str] = []
    sess = None
    for label, feeds, problem in candidates:
        if feeds is None:
            problems.append(f"no {label}: {problem}")
            continue
        try:
            sess = sess or modelio.session(model, arena=False)
            refs.append(modelio.run(sess, feeds))
            sets.append(feeds)
        except Exception as e:  # noqa: BLE001 - ORT's errors have many types
            problems.append(f"ONNX Runtime cannot run the original model on {label} ({first_line(e)})")
    note = "; ".join(problems)
    if problems and not sets:
        hint = "" if given else " (pass real inputs with --inputs)"
        note += f": nothing can be verified, so the model passes through{hint}"
    return sets, refs, note


def first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


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
            _reads(old, set(consts)),
            _reads(inst.nodes, {t.name for t in inst.initializers} | set(consts)),
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
                subgraph_model(model, old_nodes, old_feeds, outputs, _constants(old_nodes, consts)),
                old_feeds,
                subgraph_model(
                    model,
                    new_nodes,
                    new_feeds,
                    outputs,
                    [*inst.initializers, *_constants(new_nodes, consts)],
                    inst.functions,
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


def _reads(nodes: Sequence[onnx.NodeProto], local: set[str] = frozenset()) -> list[str]:
    """Values the nodes read from outside themselves (in first-read order)."""
    produced = {o for n in nodes for o in n.output}
    return list(
        dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced and i not in local)
    )


def compare_models(
    references: Sequence[Mapping[str, np.ndarray]],
    out: onnx.ModelProto,
    datasets: Sequence[Mapping[str, np.ndarray]],
    tol: Tolerance,
) -> Agreement:
    worst = 0.0
    sess = None
    for ref, feeds in zip(references, datasets, strict=True):
        try:
            sess = sess or modelio.session(out, arena=False)
            got = modelio.run(sess, feeds)
        except Exception as e:  # noqa: BLE001
            return Agreement(
                False, float("inf"), f"ONNX Runtime cannot run the optimized model: {first_line(e)}"
            )
        c = compare(ref, got, tol)
        if not c.ok:
            return c
        worst = max(worst, c.max_abs_error)
    return Agreement(True, worst)

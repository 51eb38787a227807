"""Numerical verification in ONNX Runtime: comparing outputs within a tolerance, the inputs to
verify on, intermediate values captured from a run, standalone models of some nodes, and the
assembled model against the original (:func:`compare_models`).

The check of each rewritten part on its own, on the values that reach it, is a pipeline stage
(:mod:`einopt.stages.verify`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from einopt.errors import UnsupportedModelError
from einopt.runtime import modelio

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
    declared: Mapping[str, Sequence[int | str | None]] | None = None,
) -> onnx.ModelProto:
    """A standalone model of ``nodes`` whose graph inputs are typed after ``inputs``'s arrays; an
    input in ``declared`` has those dims instead (a name for a symbolic one, None for an unknown
    one: ONNX Runtime runs a model whose shapes it cannot know otherwise)."""
    init_names = {t.name for t in initializers}
    declared = declared or {}

    def dims(n: str, a: np.ndarray) -> list:
        d = declared.get(n)
        return list(d) if d is not None and len(d) == a.ndim else list(a.shape)

    graph_inputs = [
        onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), dims(n, a))
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
    opsets = [*template.opset_import, *modelio.missing_opsets(nodes, template.opset_import, functions)]
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

"""The whole product in one screen: load -> prepare -> partition and translate ->
(search) -> instantiate -> verify -> assemble.

>>> result = optimize("model.onnx", Options(seed=0))   # doctest: +SKIP
>>> result.save("out.onnx")                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from einopt import modelio
from einopt.export import assemble
from einopt.frontend.fold import prepare
from einopt.frontend.onnx_graph import DEFAULT_DOMAINS, default_opset
from einopt.frontend.translate import Part, translate_graph
from einopt.instantiate.emit import Instantiated, instantiate
from einopt.syntax import format_expr
from einopt.verify import Comparison, Tolerance, compare_models, first_line, verification_inputs, verify_parts

log = logging.getLogger(__name__)

MIN_OPSET = 7  # numpy-style broadcasting; older models pass through
REPORT_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that determines the output model (same options, same model)."""

    max_depth: int = 0
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    inputs: Sequence[
        Mapping[str, np.ndarray] | str | Path
    ] = ()  # extra verification data sets (or .npz paths)
    verify: bool = True
    seed: int = 0
    tolerance: Tolerance = Tolerance()


@dataclasses.dataclass(frozen=True)
class PartResult:
    """What happened to one subprogram (or one passed-through node)."""

    name: str
    kind: str  # linear | activation | passthrough
    ops: tuple[str, ...]  # original op types
    status: str  # rewritten | rolled back | passed through
    reason: str = ""
    new_ops: tuple[str, ...] = ()
    expression: str = ""
    max_error: float | None = None
    trace: str = ""  # the derivation that produced the rewrite ("" when no rule was applied)
    bench: Mapping[str, float] | None = None  # original_ms, optimized_ms, speedup (``measure_parts``)


@dataclasses.dataclass(frozen=True)
class Workspace:
    """What measuring the rewritten parts on their own needs (kept off the report)."""

    model: onnx.ModelProto  # the prepared model the parts were cut from
    parts: tuple[Part, ...]  # the parts whose rewrite is in the output
    emitted: Mapping[str, Instantiated]
    feeds: Mapping[str, np.ndarray] | None  # the first verification inputs (None: unverified)


@dataclasses.dataclass(frozen=True)
class Result:
    model: onnx.ModelProto
    parts: tuple[PartResult, ...]
    notes: tuple[str, ...]
    verified: bool
    seconds: Mapping[str, float]
    blocked: str = ""  # why the whole model passed through untouched, if it did
    workspace: Workspace | None = dataclasses.field(default=None, repr=False, compare=False)

    def save(self, path: str | Path, *, external_data: bool | None = None) -> None:
        modelio.save_model(self.model, path, external_data=external_data)

    def counts(self) -> dict[str, int]:
        """Op counts: translated (in any subprogram), re-instantiated (rewritten), passed through."""
        c = {"nodes": 0, "translated": 0, "rewritten": 0, "rolled_back": 0, "passed_through": 0}
        for p in self.parts:
            n = len(p.ops)
            c["nodes"] += n
            if p.kind != "passthrough":
                c["translated"] += n
            key = {"rewritten": "rewritten", "rolled back": "rolled_back"}.get(p.status, "passed_through")
            c[key] += n
        return c

    def report(self) -> dict:
        """A JSON-serialisable summary (the report format of ``einopt.report``; ``bench`` filled by the caller)."""
        return {
            "einopt_report": REPORT_VERSION,
            "model": "",
            "output": "",
            "verified": self.verified,
            "blocked": self.blocked,
            "counts": self.counts(),
            "notes": list(self.notes),
            "seconds": dict(self.seconds),
            "subprograms": [_part_dict(p) for p in self.parts],
            "bench": None,
        }

    def with_part_timings(self, timings: Mapping[str, Mapping[str, float]]) -> Result:
        """A copy whose parts carry ``timings[name]`` (see :func:`einopt.measure.measure_parts`)."""
        parts = tuple(dataclasses.replace(p, bench=timings.get(p.name, p.bench)) for p in self.parts)
        return dataclasses.replace(self, parts=parts)


def _part_dict(p: PartResult) -> dict:
    d = dataclasses.asdict(p)
    d["bench"] = dict(p.bench) if p.bench is not None else None
    return d


def optimize(source: str | Path | onnx.ModelProto, options: Options = Options()) -> Result:
    """Optimize an ONNX model; every rewritten subprogram is verified unless ``options.verify`` is off.

    A model einopt cannot handle at all (too old an opset, or one ONNX Runtime
    cannot run so nothing can be verified) comes back untouched, with a note
    saying why.
    """
    clock = _Clock()
    original = modelio.load_model(source)
    opset = default_opset(original)
    if opset < MIN_OPSET:
        return _untouched(
            original, f"default-domain opset {opset} is older than {MIN_OPSET}: the model passes through"
        )
    datasets, references, data_note = (
        verification_inputs(original, options) if options.verify else ([], [], "")
    )
    if options.verify and not datasets:
        return _untouched(original, data_note)
    result = _rewrite(original, options, datasets, references, data_note, clock, fold=True)
    if isinstance(result, str):  # folding broke the model (an ONNX Runtime or folding bug): try without
        log.warning("the folded model differs from the original (%s); retrying without folding", result)
        result = _rewrite(original, options, datasets, references, data_note, clock, fold=False)
    if isinstance(result, str):
        return _untouched(
            original, f"the prepared model differs from the original ({result}): it passes through"
        )
    return result


def _rewrite(
    original: onnx.ModelProto,
    options: Options,
    datasets: Sequence[Mapping[str, np.ndarray]],
    references: Sequence[Mapping[str, np.ndarray]],
    data_note: str,
    clock: _Clock,
    fold: bool,
) -> Result | str:
    """Prepare, translate, instantiate, verify and assemble; a string says why the prepared model is wrong."""
    opset = default_opset(original)
    prepared = prepare(original, options.input_shapes, fold=fold)
    model = prepared.model
    clock("prepare")
    parts = translate_graph(model)
    clock("translate")
    # The search (rules + distance-guided exploration) plugs in here; depth 0 keeps the translation.
    emitted, reasons = _instantiate(parts, opset, {f.name for f in original.functions})
    clock("instantiate")

    checks: dict[str, Comparison] = {}
    if options.verify and emitted:
        checks = verify_parts(
            model, [p for p in parts if p.name in emitted], emitted, datasets, options.tolerance
        )
        for name, c in checks.items():
            if not c.ok:
                log.warning("%s: rewrite differs from the original, rolled back: %s", name, c.message)
                reasons[name] = f"verification failed: {c.message}"
                del emitted[name]
    clock("verify parts")

    by_name = {p.name: p for p in parts}
    out = assemble(model, {by_name[n].nodes: inst for n, inst in emitted.items()})
    notes = list(prepared.notes) + ([data_note] if data_note else [])
    if not fold:
        notes.append(
            "constant and BatchNormalization folding skipped: the folded model differed from the original"
        )
    if options.verify:
        final = compare_models(references, out, datasets, options.tolerance)
        if not final.ok and emitted:
            log.warning(
                "assembled model differs from the original (%s); rolling back every rewrite", final.message
            )
            for n in emitted:
                reasons[n] = f"rolled back with the whole model: {final.message}"
            emitted = {}
            out = assemble(model, {})
            final = compare_models(references, out, datasets, options.tolerance)
        if not final.ok:
            return final.message
    clock("verify model")
    check_note = _check_output(original, out)
    notes += [check_note] if check_note else []
    results = tuple(_part_result(model, p, emitted, reasons, checks) for p in parts)
    workspace = Workspace(
        model, tuple(p for p in parts if p.name in emitted), emitted, datasets[0] if datasets else None
    )
    return Result(out, results, tuple(notes), options.verify, clock.seconds, workspace=workspace)


def _untouched(model: onnx.ModelProto, reason: str) -> Result:
    log.warning("%s", reason)
    parts = tuple(
        PartResult(f"node{i}_{n.op_type}", "passthrough", (n.op_type,), "passed through", reason)
        for i, n in enumerate(model.graph.node)
    )
    return Result(model, parts, (reason,), False, {}, blocked=reason)


def _instantiate(
    parts: Sequence[Part], opset: int, taken: set[str]
) -> tuple[dict[str, Instantiated], dict[str, str]]:
    """Instantiate every translated part; a part that fails passes through with the reason."""
    emitted: dict[str, Instantiated] = {}
    reasons: dict[str, str] = {}
    for p in parts:
        if not p.translated:
            continue
        try:
            inst = instantiate(
                p.program,
                onnx_names=p.names,
                constants=p.constants,
                opset=opset,
                prefix=p.name + "/",
                taken_function_names=taken,
            )
        except Exception as e:  # noqa: BLE001 - one bad part must not sink the model; the report says why
            log.warning("%s: instantiation failed, passing through: %s", p.name, first_line(e))
            reasons[p.name] = f"instantiation failed: {first_line(e)}"
            continue
        taken |= {f.name for f in inst.functions}
        emitted[p.name] = inst
    return emitted, reasons


def _check_output(original: onnx.ModelProto, out: onnx.ModelProto) -> str:
    """``onnx.checker`` (full) on the output; only a note when the original fails it too."""
    try:
        onnx.checker.check_model(out, full_check=True)
        return ""
    except Exception as e:  # noqa: BLE001
        try:
            onnx.checker.check_model(original, full_check=True)
        except Exception:  # noqa: BLE001
            return f"the original model fails onnx.checker full_check too: {str(e).splitlines()[0]}"
        raise


def _part_result(
    model: onnx.ModelProto,
    p: Part,
    emitted: Mapping[str, Instantiated],
    reasons: Mapping[str, str],
    checks: Mapping[str, Comparison],
) -> PartResult:
    ops = tuple(model.graph.node[i].op_type for i in p.nodes)
    text = format_expr(p.program) if p.program is not None else ""
    err = checks[p.name].max_abs_error if p.name in checks else None
    if p.name in emitted:
        new_ops = tuple(
            n.op_type if n.domain in DEFAULT_DOMAINS else f"{n.domain}.{n.op_type}"
            for n in emitted[p.name].nodes
        )
        return PartResult(p.name, p.kind, ops, "rewritten", "", new_ops, text, err)
    if p.translated:
        return PartResult(p.name, p.kind, ops, "rolled back", reasons.get(p.name, ""), (), text, err)
    return PartResult(p.name, p.kind, ops, "passed through", p.reason or "", (), "", None)


class _Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._t, 4)
        self._t = now

"""The whole product in one screen: load -> prepare -> partition and translate ->
(search) -> instantiate -> verify -> accept (measured) -> assemble -> verify.

A subprogram's new nodes reach the output only when they differ from its
original nodes, are verified equal, and are measured faster (per part, then
the whole model against the input, with rollback: :mod:`einopt.accept`).
When nothing is accepted, the output is the input model itself.

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
from einopt.accept import Decision, ModelRound, accept_rewrites, is_unchanged
from einopt.errors import UnsupportedModelError
from einopt.export import assemble
from einopt.frontend.fold import prepare
from einopt.frontend.onnx_graph import DEFAULT_DOMAINS, default_opset
from einopt.frontend.translate import Part, translate_graph
from einopt.instantiate.emit import Instantiated, instantiate, original_ops
from einopt.report import CHANGED, REPORT_VERSION, STATUSES
from einopt.syntax import format_expr
from einopt.timing import NOISE_BAND
from einopt.timing import Comparison as TimingComparison
from einopt.verify import (
    Comparison,
    Tolerance,
    compare_models,
    first_line,
    verification_inputs,
    verify_parts,
)

log = logging.getLogger(__name__)

MIN_OPSET = 7  # numpy-style broadcasting; older models pass through
ACCEPT_MODES = ("measured", "verified")
NO_SEARCH = "max_depth > 0 needs the search, which is not in this version of einopt yet (only 0 is accepted)"


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that determines the output model (same options and a warm cache, same model).

    Parameters
    ----------
    max_depth : int
        Search depth (only 0, translate and re-instantiate, until the search lands).
    input_shapes : mapping
        Concrete shapes for graph inputs with symbolic dims.
    inputs : sequence
        Extra verification data sets (arrays by input name, or ``.npz`` paths).
    verify : bool
        Verify every rewrite and the output in ONNX Runtime.
    seed : int
        Seed of the random verification and timing inputs.
    tolerance : Tolerance
        Verification tolerance.
    accept : {"measured", "verified"}
        ``measured``: a rewrite is kept only when measured faster, per part
        and for the whole model. ``verified``: every verified rewrite is kept
        and nothing is timed (experts; the report says the output was not timed).
    cache : bool or path
        The measurement cache: True for the default file in the user's cache
        directory, a path for another file, False for none (timings are then
        kept for this run only).
    noise : float
        A rewrite must be measured at least ``1 + noise`` times faster on its own.
    part_budget_s, model_budget_s : float
        Seconds of timed runs per subprogram and per whole-model comparison.
    """

    max_depth: int = 0
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    inputs: Sequence[Mapping[str, np.ndarray] | str | Path] = ()
    verify: bool = True
    seed: int = 0
    tolerance: Tolerance = Tolerance()
    accept: str = "measured"
    cache: bool | str | Path = True
    noise: float = NOISE_BAND
    part_budget_s: float = 1.0
    model_budget_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_depth != 0:
            raise ValueError(
                NO_SEARCH if self.max_depth > 0 else f"max_depth must be >= 0, not {self.max_depth}"
            )
        if self.accept not in ACCEPT_MODES:
            raise ValueError(f"accept must be one of {', '.join(ACCEPT_MODES)}, not {self.accept!r}")
        if not 0 <= self.noise < 1:
            raise ValueError(f"noise must be in [0, 1), not {self.noise}")
        if self.part_budget_s <= 0 or self.model_budget_s <= 0:
            raise ValueError("timing budgets must be positive")


@dataclasses.dataclass(frozen=True)
class PartResult:
    """What happened to one subprogram (or one passed-through node)."""

    name: str
    kind: str  # linear | activation | passthrough
    ops: tuple[str, ...]  # original op types
    status: str  # one of STATUSES
    reason: str = ""
    new_ops: tuple[str, ...] = ()
    expression: str = ""
    max_error: float | None = None
    trace: str = ""  # the derivation that produced the rewrite ("" when no rule was applied)
    bench: Mapping[str, object] | None = None  # original_ms, optimized_ms, speedup, cached, unreliable


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
    acceptance: Mapping[str, object] = dataclasses.field(default_factory=dict)
    workspace: Workspace | None = dataclasses.field(default=None, repr=False, compare=False)

    def save(self, path: str | Path, *, external_data: bool | None = None) -> None:
        modelio.save_model(self.model, path, external_data=external_data)

    def counts(self) -> dict[str, int]:
        """Op counts (nodes, translated, passed_through) and subprogram counts by status.

        ``subprograms`` counts the translated subprograms; ``rewritten`` those
        whose new nodes differ from the original and were verified (accepted,
        not faster, rolled back, or kept untimed); the status counts follow.
        """
        c = {"nodes": 0, "translated": 0, "passed_through": 0, "subprograms": 0, "rewritten": 0}
        c |= {s.replace(" ", "_"): 0 for s in STATUSES if s not in ("passed through", "rewritten")}
        for p in self.parts:
            c["nodes"] += len(p.ops)
            if p.kind == "passthrough":
                c["passed_through"] += len(p.ops)
                continue
            c["translated"] += len(p.ops)
            c["subprograms"] += 1
            if p.status in CHANGED:
                c["rewritten"] += 1
            if p.status != "rewritten":
                c[p.status.replace(" ", "_")] += 1
        return c

    def changed(self) -> bool:
        """Whether the output differs from the input model."""
        return any(p.status in ("accepted", "rewritten") for p in self.parts)

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
            "acceptance": dict(self.acceptance),
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
    """Optimize an ONNX model: verified equal, and measured not slower (unless ``accept="verified"``).

    A model einopt cannot work on (no default-domain opset, too old an opset,
    no inputs ONNX Runtime can run it on, so nothing can be verified) comes
    back untouched, with a note saying why; only a model that cannot be read
    at all is an error.
    """
    clock = _Clock()
    original = modelio.load_model(source)
    why = _unworkable(original)
    if why:
        return _untouched(original, why)
    datasets, references, data_note = (
        verification_inputs(
            original, seed=options.seed, input_shapes=options.input_shapes, given=options.inputs
        )
        if options.verify
        else ([], [], "")
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


def _unworkable(model: onnx.ModelProto) -> str:
    """Why einopt cannot translate anything in ``model`` ("" when it can try)."""
    if not any(o.domain in DEFAULT_DOMAINS for o in model.opset_import):
        domains = ", ".join(sorted({o.domain for o in model.opset_import})) or "none"
        return (
            f"the model imports no default-domain (ai.onnx) opset (only: {domains}), "
            "so einopt has nothing to translate: it passes through"
        )
    opset = default_opset(model)
    if opset < MIN_OPSET:
        return f"default-domain opset {opset} is older than {MIN_OPSET}: the model passes through"
    return ""


def _rewrite(
    original: onnx.ModelProto,
    options: Options,
    datasets: Sequence[Mapping[str, np.ndarray]],
    references: Sequence[Mapping[str, np.ndarray]],
    data_note: str,
    clock: _Clock,
    fold: bool,
) -> Result | str:
    """Prepare, translate, instantiate, verify, accept and assemble; a string says why the prepared model is wrong."""
    opset = default_opset(original)
    prepared = prepare(original, options.input_shapes, fold=fold)
    model = prepared.model
    if options.verify and fold:  # the unchanged parts of an output come from the prepared model
        folded = compare_models(references, model, datasets, options.tolerance)
        if not folded.ok:
            return folded.message
    clock("prepare")
    parts = translate_graph(model)
    by_name = {p.name: p for p in parts}
    clock("translate")
    # The search (rules + distance-guided exploration) plugs in here; depth 0 keeps the translation.
    emitted, reasons = _instantiate(model, parts, opset, {f.name for f in original.functions})
    clock("instantiate")

    checks: dict[str, Comparison] = {}
    if options.verify and emitted:
        checks = verify_parts(model, [by_name[n] for n in emitted], emitted, datasets, options.tolerance)
        for name, c in checks.items():
            if not c.ok:
                log.warning("%s: rewrite differs from the original, rolled back: %s", name, c.message)
                reasons[name] = f"verification failed: {c.message}"
                del emitted[name]
    clock("verify parts")

    instantiated = dict(emitted)  # the report shows what every part became, unchanged ones too
    unchanged = _unchanged(model, by_name, emitted)
    for name in unchanged:
        del emitted[name]
    decided = accept_rewrites(
        original,
        model,
        by_name,
        emitted,
        datasets[0] if datasets else _timing_feeds(original, options),
        mode=options.accept,
        cache=options.cache,
        noise=options.noise,
        part_budget_s=options.part_budget_s,
        model_budget_s=options.model_budget_s,
    )
    clock("accept")
    kept = {n: emitted[n] for n in decided.kept}

    notes = list(prepared.notes) + ([data_note] if data_note else []) + list(decided.notes)
    if not fold:
        notes.append(
            "constant and BatchNormalization folding skipped: the folded model differed from the original"
        )
    out = assemble(model, {by_name[n].nodes: inst for n, inst in kept.items()}) if kept else original
    if options.verify and kept:  # the input itself needs no check against its own outputs
        final = compare_models(references, out, datasets, options.tolerance)
        if not final.ok:
            log.warning(
                "assembled model differs from the original (%s); rolling back every rewrite", final.message
            )
            for n in kept:
                reasons[n] = f"rolled back with the whole model: {final.message}"
            kept, out = {}, original
    clock("verify model")
    if kept:
        check_note = _check_output(original, out)
        notes += [check_note] if check_note else []
        if options.input_shapes:
            notes.append("the output keeps the pinned input shapes: its rewrites were instantiated for them")
    else:  # the output is the input: what preparation changed is not in it
        notes = [n for n in notes if n not in prepared.changes]
        notes.append("no rewrite was accepted: the output is the input model, unchanged")
    results = tuple(
        _part_result(model, p, instantiated, kept, unchanged, decided, reasons, checks, options)
        for p in parts
    )
    workspace = Workspace(model, tuple(by_name[n] for n in kept), kept, datasets[0] if datasets else None)
    return Result(
        out,
        results,
        tuple(notes),
        options.verify,
        clock.seconds,
        acceptance=decided.report,
        workspace=workspace,
    )


def _unchanged(
    model: onnx.ModelProto, by_name: Mapping[str, Part], emitted: Mapping[str, Instantiated]
) -> set[str]:
    """The parts whose instantiation is their original nodes again."""
    nodes = list(model.graph.node)
    inits = {t.name: t for t in model.graph.initializer}
    return {
        name
        for name, inst in emitted.items()
        if not inst.functions
        and is_unchanged(
            [nodes[i] for i in by_name[name].nodes],
            inst.nodes,
            inits,
            inst.initializers,
            [by_name[name].names[o] for o in by_name[name].program.outputs],
            default_opset(model),
        )
    }


def _timing_feeds(model: onnx.ModelProto, options: Options) -> dict[str, np.ndarray] | None:
    try:
        return modelio.random_inputs(model, options.seed, dict(options.input_shapes))
    except UnsupportedModelError:
        return None


def _untouched(model: onnx.ModelProto, reason: str) -> Result:
    log.warning("%s", reason)
    parts = tuple(
        PartResult(f"node{i}_{n.op_type}", "passthrough", (n.op_type,), "passed through", reason)
        for i, n in enumerate(model.graph.node)
    )
    return Result(model, parts, (reason,), False, {}, blocked=reason)


def _instantiate(
    model: onnx.ModelProto, parts: Sequence[Part], opset: int, taken: set[str]
) -> tuple[dict[str, Instantiated], dict[str, str]]:
    """Instantiate every translated part (preferring its original operators); a part that fails passes through."""
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
                preferred=original_ops(model, p),
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


def _new_ops(inst: Instantiated) -> tuple[str, ...]:
    return tuple(n.op_type if n.domain in DEFAULT_DOMAINS else f"{n.domain}.{n.op_type}" for n in inst.nodes)


def _part_result(
    model: onnx.ModelProto,
    p: Part,
    emitted: Mapping[str, Instantiated],
    kept: Mapping[str, Instantiated],
    unchanged: set[str],
    decided: Decision,
    reasons: Mapping[str, str],
    checks: Mapping[str, Comparison],
    options: Options,
) -> PartResult:
    ops = tuple(model.graph.node[i].op_type for i in p.nodes)
    if not p.translated:
        return PartResult(p.name, p.kind, ops, "passed through", p.reason or "", (), "", None)
    text = format_expr(p.program)
    err = checks[p.name].max_abs_error if p.name in checks else None
    verdict = decided.verdicts.get(p.name)
    bench = part_bench(verdict.timing) if verdict else None
    new_ops = _new_ops(emitted[p.name]) if p.name in emitted else ()
    if p.name in unchanged:
        status, reason = "unchanged", "re-instantiated as the same nodes"
    elif p.name in kept:
        status = "accepted" if options.accept == "measured" else "rewritten"
        reason = verdict.reason if verdict else "verified, not timed"
    elif p.name in reasons:
        status, reason, new_ops = "failed", reasons[p.name], ()
    elif verdict is not None and verdict.accepted:
        status, reason = "rolled back", _rollback_reason(p.name, decided.rounds)
    elif verdict is not None:
        status, reason = "not faster", verdict.reason
    else:
        status, reason = "not faster", "could not be timed: the original nodes stay"
    return PartResult(p.name, p.kind, ops, status, reason, new_ops, text, err, bench=bench)


def part_bench(t: TimingComparison) -> dict[str, object]:
    """A subprogram's ``bench`` entry of the report from its side-by-side timing."""
    return {
        "original_ms": t.before.median_ms,
        "optimized_ms": t.after.median_ms,
        "speedup": t.speedup,
        "cached": t.cached,
        "unreliable": t.unreliable(),
    }


def _rollback_reason(name: str, rounds: Sequence[ModelRound]) -> str:
    for r in rounds:
        if name in r.rolled_back:
            t = r.timing
            if t.unreliable():
                return f"faster on its own, but the whole-model timing was disturbed by other work ({t.unreliable()}): rolled back"
            return (
                f"faster on its own, but the whole model with it ran {t.after.median_ms:.3g} ms "
                f"against the input's {t.before.median_ms:.3g} ms ({t.speedup:.2f}x): rolled back"
            )
    return "rolled back with the whole model"


class _Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._t, 4)
        self._t = now

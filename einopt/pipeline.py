"""The whole product in one screen: load -> prepare -> partition and translate ->
search -> cost -> select (instantiate, verify, time the candidates) -> accept
(measured) -> assemble -> verify.

Every subprogram is searched (:mod:`einopt.stages.partsearch`, identical ones once);
what it found is costed by its operators' measured times (:mod:`einopt.stages.predict`);
its best predicted candidates are instantiated, verified and timed against its
original nodes, and the fastest is chosen (:mod:`einopt.stages.select`). A subprogram's new
nodes reach the output only when they differ from its original nodes, are
verified equal, and are measured faster (per part, then the whole model
against the input, with rollback: :mod:`einopt.stages.accept`). When nothing is
accepted, the output is the input model itself.

>>> result = optimize("model.onnx", Options(seed=0))   # doctest: +SKIP
>>> result.save("out.onnx")                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from einopt.core.syntax import format_expr
from einopt.errors import UnsupportedModelError
from einopt.frontend.fold import prepare
from einopt.frontend.onnx_graph import DEFAULT_DOMAINS, default_opset
from einopt.frontend.translate import Part, translate_graph
from einopt.instantiate.emit import Instantiated
from einopt.reports.report import CHANGED, REPORT_VERSION, STATUSES
from einopt.runtime import modelio
from einopt.runtime.cache import MeasurementCache, resolve_path
from einopt.runtime.opcost import OpCosts
from einopt.runtime.timing import NOISE_BAND, configure_threads
from einopt.runtime.timing import Comparison as TimingComparison
from einopt.runtime.verify import (
    Tolerance,
    compare_models,
    verification_inputs,
)
from einopt.search.engine import DEFAULT_MAX_DEPTH
from einopt.stages.accept import MODEL_NOISE, Decision, ModelRound, Timer, accept_rewrites
from einopt.stages.export import assemble
from einopt.stages.partsearch import PartSearch, Progress, Settings, search_parts
from einopt.stages.postopt import postoptimize
from einopt.stages.predict import predict
from einopt.stages.select import DEFAULT_TOP_K, NOT_TIMED, Selection, select

log = logging.getLogger(__name__)

MIN_OPSET = 7  # numpy-style broadcasting; older models pass through
ACCEPT_MODES = ("measured", "verified")
DEFAULT_TIME_BUDGET = 150.0
"""Seconds of search per model by default: with the cost stage (at most 40 s), the selection (60 s), the
whole-model acceptance (GCN at batch 16: two rounds, 32 s) and preparation, a model stays within 5
minutes on a 2-core machine."""
DEFAULT_PART_SEARCH = 60.0


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that determines the output model (same options and a warm cache, same model).

    Parameters
    ----------
    max_depth : int
        Explorative search depth per subprogram (0: no search, translate and
        re-instantiate only).
    time_budget : float
        Seconds the searches of the whole model may take (a search running
        when they are spent stops at its own budget; subprograms not searched
        by then keep their input). Selection and timing come on top.
    part_search_s : float
        Seconds one subprogram's search may take.
    jobs : int
        Processes searching distinct subprograms side by side (timing stays
        serial). The output does not depend on it.
    top_k : int
        Derived programs instantiated, verified and timed per subprogram.
    ray : str, optional
        Address of a Ray cluster to run the subprogram searches on (``"auto"``,
        ``"ray://host:10001"``); needs ``pip install 'einopt[ray]'``. The
        output does not depend on it.
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
    model_noise : float
        The whole output must be faster than the input by more than ``1 + model_noise``
        times, 95% confident, in two separate comparisons (else the output is the input).
    part_budget_s, model_budget_s : float
        Seconds of timed runs per subprogram and per whole-model comparison.
    """

    max_depth: int = DEFAULT_MAX_DEPTH
    time_budget: float = DEFAULT_TIME_BUDGET
    part_search_s: float = DEFAULT_PART_SEARCH
    jobs: int = 1
    top_k: int = DEFAULT_TOP_K
    ray: str | None = None
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    inputs: Sequence[Mapping[str, np.ndarray] | str | Path] = ()
    verify: bool = True
    seed: int = 0
    tolerance: Tolerance = Tolerance()
    accept: str = "measured"
    cache: bool | str | Path = True
    noise: float = NOISE_BAND
    model_noise: float = MODEL_NOISE
    part_budget_s: float = 1.0
    model_budget_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_depth", "jobs", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "jobs" else 0):
                raise ValueError(f"{name} must be an integer >= {1 if name == 'jobs' else 0}, not {value!r}")
        if not self.time_budget > 0 or not self.part_search_s > 0:
            raise ValueError("time_budget and part_search_s must be positive seconds")
        if self.accept not in ACCEPT_MODES:
            raise ValueError(f"accept must be one of {', '.join(ACCEPT_MODES)}, not {self.accept!r}")
        if not 0 <= self.noise < 1:
            raise ValueError(f"noise must be in [0, 1), not {self.noise}")
        if not 0 <= self.model_noise < 1:
            raise ValueError(f"model_noise must be in [0, 1), not {self.model_noise}")
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
    search: Mapping[str, object] | None = None  # its search's counts and the candidates tried


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
        """A JSON-serialisable summary (the report format of ``einopt.reports.report``; ``bench`` filled by the caller)."""
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
            "search": search_summary(self.parts),
            "bench": None,
        }

    def with_part_timings(self, timings: Mapping[str, Mapping[str, float]]) -> Result:
        """A copy whose parts carry ``timings[name]`` (see :func:`einopt.reports.measure.measure_parts`)."""
        parts = tuple(dataclasses.replace(p, bench=timings.get(p.name, p.bench)) for p in self.parts)
        return dataclasses.replace(self, parts=parts)


def search_summary(parts: Sequence[PartResult]) -> dict[str, object]:
    """Totals of a model's searches, and how well predicted speedups ranked the measured ones.

    ``rank_correlation`` is Spearman's over every candidate that was timed
    (predicted against measured speedup); None with fewer than 3 of them.
    """
    own = [p.search for p in parts if p.search and not p.search["same_as"]]
    timed = [
        (c["predicted_speedup"], c["measured_speedup"])
        for p in parts
        if p.search
        for c in p.search["candidates"]
        if c["predicted_speedup"] is not None and c["measured_speedup"] is not None
    ]
    pieces = [q for s in own for q in s["stats"].get("pieces", ()) if "generated" in q and not q["same_as"]]
    return {
        "searched": sum(1 for s in own if s["stats"].get("searched", True)),
        "expressions": sum(1 for q in pieces if not q["cached"]),
        "cached": sum(1 for s in own if s["cached"]),
        "states": sum(int(s["stats"].get("generated", 0)) for s in own),
        "seconds": round(sum(float(s["seconds"]) for s in own), 3),
        "incomplete": sum(1 for s in own if s["stats"].get("searched", True) and not s["stats"]["complete"]),
        "timed_candidates": len(timed),
        "rank_correlation": _spearman(timed) if len(timed) >= 3 else None,
    }


def _spearman(pairs: Sequence[tuple[float, float]]) -> float | None:
    a, b = (_ranks([p[k] for p in pairs]) for k in (0, 1))
    if a.std() == 0 or b.std() == 0:
        return None
    return round(float(np.corrcoef(a, b)[0, 1]), 3)


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v))
    for x in np.unique(v):
        ranks[v == x] = ranks[v == x].mean()
    return ranks


def _part_dict(p: PartResult) -> dict:
    d = dataclasses.asdict(p)
    d["bench"] = dict(p.bench) if p.bench is not None else None
    d["search"] = dict(p.search) if p.search is not None else None
    return d


def optimize(
    source: str | Path | onnx.ModelProto,
    options: Options = Options(),
    progress: Callable[[Progress], None] | None = None,
) -> Result:
    """Optimize an ONNX model: verified equal, and measured not slower (unless ``accept="verified"``).

    ``progress`` is called with a :class:`einopt.stages.partsearch.Progress` as the
    subprograms are searched (for a progress display; it changes nothing).

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
    result = _rewrite(original, options, datasets, references, data_note, clock, progress, fold=True)
    if isinstance(result, str):  # folding broke the model (an ONNX Runtime or folding bug): try without
        log.warning("the folded model differs from the original (%s); retrying without folding", result)
        result = _rewrite(original, options, datasets, references, data_note, clock, progress, fold=False)
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
    progress: Callable[[Progress], None] | None,
    fold: bool,
) -> Result | str:
    """Prepare, translate, search, select, accept and assemble; a string says why the prepared model is wrong."""
    prepared = prepare(original, options.input_shapes, fold=fold)
    model = prepared.model
    if options.verify and fold:  # the unchanged parts of an output come from the prepared model
        folded = compare_models(references, model, datasets, options.tolerance)
        if not folded.ok:
            return folded.message
    clock("prepare")
    parts = translate_graph(model)
    translated = [p for p in parts if p.translated]
    by_name = {p.name: p for p in parts}
    clock("translate")
    feeds = datasets[0] if datasets else _timing_feeds(original, options)
    store = MeasurementCache(resolve_path(options.cache))
    try:
        searches = _search(parts, options, store, progress)
        clock("search")
        timed = options.accept == "measured" and feeds is not None
        if timed:
            configure_threads()
            searches = predict(model, translated, searches, OpCosts(store))
            clock("cost")
        selections = select(
            model,
            translated,
            searches,
            datasets=datasets,
            tolerance=options.tolerance,
            timer=Timer(store, part_budget_s=options.part_budget_s) if timed else None,
            feeds=feeds,
            taken={f.name for f in original.functions},
            top_k=options.top_k if options.max_depth > 0 else 0,
        )
        clock("select")
        emitted = {n: s.chosen.instantiated for n, s in selections.items() if s.chosen is not None}
        decided = accept_rewrites(
            original,
            model,
            by_name,
            emitted,
            feeds,
            mode=options.accept,
            cache=store,
            noise=options.noise,
            model_noise=options.model_noise,
            part_budget_s=options.part_budget_s,
            model_budget_s=options.model_budget_s,
            measured={n: s.chosen.measured for n, s in selections.items() if s.chosen and s.chosen.measured},
        )
    finally:
        store.close()
    clock("accept")
    kept = {n: emitted[n] for n in decided.kept}
    reasons: dict[str, str] = {}

    notes = list(prepared.notes) + ([data_note] if data_note else []) + list(decided.notes)
    if not fold:
        notes.append(
            "constant and BatchNormalization folding skipped: the folded model differed from the original"
        )
    out = (
        postoptimize(assemble(model, {by_name[n].nodes: inst for n, inst in kept.items()}))
        if kept
        else original
    )
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
        _part_result(model, p, selections.get(p.name), kept, decided, reasons, options) for p in parts
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


def _search(
    parts: Sequence[Part],
    options: Options,
    store: MeasurementCache,
    progress: Callable[[Progress], None] | None,
) -> dict[str, PartSearch]:
    """Every translated part searched (identical ones once; none at depth 0)."""
    if options.max_depth == 0:
        return {}
    settings = Settings(
        max_depth=options.max_depth,
        part_budget_s=options.part_search_s,
        exact=not options.verify,
    )
    deadline = time.monotonic() + options.time_budget
    return search_parts(
        parts,
        settings,
        store,
        jobs=options.jobs,
        deadline=deadline,
        progress=progress,
        ray_address=options.ray,
    )


def _part_result(
    model: onnx.ModelProto,
    p: Part,
    selection: Selection | None,
    kept: Mapping[str, Instantiated],
    decided: Decision,
    reasons: Mapping[str, str],
    options: Options,
) -> PartResult:
    ops = tuple(model.graph.node[i].op_type for i in p.nodes)
    if not p.translated or selection is None:
        return PartResult(p.name, p.kind, ops, "passed through", p.reason or "", (), "", None)
    text = format_expr(p.program)
    chosen = selection.chosen
    verdict = decided.verdicts.get(p.name)
    bench = part_bench(verdict.timing) if verdict else None
    search = _search_report(selection)
    if chosen is None:
        first = selection.tried[0] if selection.tried else None
        if first is not None and first.unchanged:
            status, reason = "unchanged", "re-instantiated as the same nodes"
            if len(selection.tried) > 1:
                reason += "; no candidate the search found was verified and timed"
        elif first is not None and first.rejected.startswith(NOT_TIMED):
            status, reason = "not faster", f"could not be timed ({first.rejected}): the original nodes stay"
        else:
            status = "failed"
            reason = first.rejected if first is not None else "nothing to instantiate"
        new_ops = _new_ops(first.instantiated) if first is not None and first.instantiated else ()
        return PartResult(p.name, p.kind, ops, status, reason, new_ops, text, None, search=search)
    err = chosen.verified.max_abs_error if chosen.verified is not None else None
    new_ops = _new_ops(chosen.instantiated)
    trace = chosen.found.trace_text()
    if p.name in kept:
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
    return PartResult(p.name, p.kind, ops, status, reason, new_ops, text, err, trace, bench, search)


def _search_report(selection: Selection) -> dict[str, object]:
    """The report's ``search`` entry of a part: the search's counts and every candidate tried."""
    s = selection.search
    base = s.input.predicted_s if s.input is not None else None
    return {
        "stats": dict(s.stats),
        "seconds": s.seconds,
        "cached": s.cached,
        "same_as": s.same_as,
        "predicted_speedup": selection.predicted_speedup,
        "candidates": [c.as_dict(base) for c in selection.tried],
    }


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
            if r.stage != "round":
                return f"faster on its own, but rolled back with the whole model: {r.reason}"
            if t.unreliable():
                return f"faster on its own, but the whole-model timing was disturbed by other work ({t.unreliable()}): rolled back"
            return (
                f"faster on its own, but the whole model with it ran {t.after.median_ms:.3g} ms "
                f"against the input's {t.before.median_ms:.3g} ms ({r.reason}): rolled back"
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

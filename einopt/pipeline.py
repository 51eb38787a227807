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

from einopt import backends
from einopt.errors import ModelError, UnsupportedModelError
from einopt.frontend.fold import prepare
from einopt.frontend.symbolic import (
    DimRange,
    Dims,
    check_assignments,
    declared_shapes,
    keep_symbolic,
    representative,
    second_probe,
    seen_values,
    shapes_at,
)
from einopt.frontend.translate import Part, translate_graph
from einopt.opsets import DEFAULT_DOMAINS, check_opset
from einopt.reports.result import PartResult, Result, Workspace, part_result
from einopt.runtime import modelio
from einopt.runtime.cache import MeasurementCache, resolve_path
from einopt.runtime.opcost import OpCosts
from einopt.runtime.timing import MODEL_NOISE, NOISE_BAND, configure_threads
from einopt.runtime.verify import Tolerance, compare_models, verification_inputs
from einopt.search.budget import Budget
from einopt.stages.accept import accept
from einopt.stages.context import ACCEPT_MODES, ShapeCheck, ShapeTiming, StageContext
from einopt.stages.generalize import Probe
from einopt.stages.output import verify_output
from einopt.stages.partsearch import DEFAULT_BUDGET, PartSearch, Progress, Settings, search_parts
from einopt.stages.predict import predict
from einopt.stages.select import DEFAULT_TOP_K, select
from einopt.stages.shapes import general_rewrites
from einopt.stages.state import fill, start
from einopt.stages.timer import Timer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that determines the output model (same options and a warm cache, same model).

    Parameters
    ----------
    max_depth : int
        Explorative search depth per subprogram (0: no search, translate and
        re-instantiate only).
    states_per_search : int or None
        States one subprogram's search may generate (None: no limit).
    states_per_model : int or None
        States all the searches of the model may generate together (shared
        out by :func:`einopt.stages.partsearch.search_parts`; subprograms not
        searched by then keep their input; None: no limit).
    deadline_s : float or None
        Wall-clock seconds the search stage may take at most, a safety net:
        a search cut short by it is reported and not cached, and the output
        then depends on the machine (None: no deadline).
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
        Concrete shapes for graph inputs with symbolic dims: the output is written for them (a
        static model).
    dims : mapping
        Representative values of symbolic dimensions by name (``{"sequence": 64}``): the model is
        searched and timed at them, and the output keeps them symbolic where its rewrites hold at
        other values too (:mod:`einopt.frontend.symbolic`; without a value here, a dimension takes
        its value in the first of ``inputs``, else a default by name: batch 1, sequence 128, height
        and width 224).
    dim_ranges : mapping
        The values symbolic dimensions are declared to take, by name (``{"sequence":
        DimRange(1, 512)}``): a rewrite is kept only where it holds at such values (it is verified
        at the smallest, the largest and another one); a dimension not named takes any.
    time_shapes : sequence of mapping
        Other values of symbolic dimensions (``[{"batch": 4}]``; a dimension not named keeps its
        representative value) the output is timed at too, against the input: it is kept only where
        it is not slower at any of them (``--time-shapes``).
    specialize : bool
        A rewrite that holds at the representative values only is kept there, behind a run-time
        test of the input shapes, the input's own nodes running at every other value
        (:mod:`einopt.stages.specialize`); False: it is left out (``--no-specialize``).
    inputs : sequence
        Extra verification data sets (arrays by input name, or ``.npz`` paths).
    verify : bool
        Verify every rewrite and the output in ONNX Runtime. Without it, searches
        stored in the cache are not read (nothing would check what they found).
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
        Seconds of timed runs per subprogram and per whole-model comparison
        (timing, not search: the search is bounded by states).
    kernels : {"onnx", "tvm"}
        The eOperator backend (a key of :data:`einopt.backends.BACKENDS`):
        ``onnx`` writes eOperators as model-local functions of standard
        operators (runs in any ONNX Runtime), ``tvm`` as generated kernels
        described in the model, compiled by TVM where it runs and run by
        einopt's custom-op library (:mod:`einopt.backends.tvm.kernels`).

    ``budget`` (not a parameter) is the :class:`einopt.search.Budget` the
    search fields make, the one the search stage is given.
    """

    max_depth: int = DEFAULT_BUDGET.max_depth
    states_per_search: int | None = DEFAULT_BUDGET.states_per_search
    states_per_model: int | None = DEFAULT_BUDGET.states_per_model
    deadline_s: float | None = DEFAULT_BUDGET.deadline_s
    jobs: int = 1
    top_k: int = DEFAULT_TOP_K
    ray: str | None = None
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    dims: Mapping[str, int] = dataclasses.field(default_factory=dict)
    dim_ranges: Mapping[str, DimRange] = dataclasses.field(default_factory=dict)
    time_shapes: Sequence[Mapping[str, int]] = ()
    specialize: bool = True
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
    kernels: str = "onnx"
    budget: Budget = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_depth", "jobs", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "jobs" else 0):
                raise ValueError(f"{name} must be an integer >= {1 if name == 'jobs' else 0}, not {value!r}")
        # Made once, here; the search stage gets it as it is (a bad limit is a ValueError naming it).
        budget = Budget(self.max_depth, self.states_per_search, self.states_per_model, self.deadline_s)
        object.__setattr__(self, "budget", budget)
        if self.accept not in ACCEPT_MODES:
            raise ValueError(f"accept must be one of {', '.join(ACCEPT_MODES)}, not {self.accept!r}")
        if not 0 <= self.noise < 1:
            raise ValueError(f"noise must be in [0, 1), not {self.noise}")
        if not 0 <= self.model_noise < 1:
            raise ValueError(f"model_noise must be in [0, 1), not {self.model_noise}")
        if self.part_budget_s <= 0 or self.model_budget_s <= 0:
            raise ValueError("timing budgets must be positive")
        backends.backend(self.kernels)  # a ValueError naming the backends there are


def optimize(
    source: str | Path | onnx.ModelProto,
    options: Options = Options(),
    progress: Callable[[Progress], None] | None = None,
) -> Result:
    """Optimize an ONNX model: verified equal, and measured not slower (unless ``accept="verified"``).

    ``progress`` is called with a :class:`einopt.stages.partsearch.Progress` as the
    subprograms are searched (for a progress display; it changes nothing).

    A model einopt cannot work on (no default-domain opset, no inputs ONNX
    Runtime can run it on, so nothing can be verified) comes back untouched,
    with a note saying why. A model that cannot be read is a
    :class:`~einopt.errors.ModelError`, and one whose default-domain opset
    einopt does not support an :class:`~einopt.errors.UnsupportedModelError`
    (:func:`einopt.opsets.check_opset`).
    """
    clock = _Clock()
    chosen = backends.backend(options.kernels)
    chosen.check()  # e.g. no C compiler: one clear error before any work
    original = modelio.load_model(source)
    check_opset(original, "the model" if isinstance(source, onnx.ModelProto) else str(source))
    for b in backends.BACKENDS.values():  # an einopt output: its generated nodes checked
        b.check_model(original)
    why = _unworkable(original)
    if why:
        return _untouched(original, why)
    dims, inputs = _shapes(original, options)
    if options.verify and not inputs.datasets:
        return _untouched(original, inputs.note)
    result = _rewrite(original, options, inputs, clock, progress, fold=True, dims=dims)
    if isinstance(result, str):  # folding broke the model (an ONNX Runtime or folding bug): try without
        log.warning("the folded model differs from the original (%s); retrying without folding", result)
        result = _rewrite(original, options, inputs, clock, progress, fold=False, dims=dims)
    if isinstance(result, str):
        return _untouched(
            original, f"the prepared model differs from the original ({result}): it passes through"
        )
    return result


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """Verification inputs, the original's outputs on them, and what the report says of them."""

    datasets: Sequence[Mapping[str, np.ndarray]]
    references: Sequence[Mapping[str, np.ndarray]]
    note: str
    checks: Sequence[ShapeCheck] = ()  # at other values of the symbolic dimensions the output keeps
    timings: Sequence[ShapeTiming] = ()  # --time-shapes


def _shapes(original: onnx.ModelProto, options: Options) -> tuple[Dims, _Inputs]:
    """The values the model's symbolic dimensions are searched at, and the inputs it is verified and
    timed on (:mod:`einopt.frontend.symbolic`).

    Raises
    ------
    ModelError
        A ``--dim`` that the ``--inputs`` contradict, or a bad ``--dim`` or ``--time-shapes``.
    """
    seen = _seen(original, options)
    clash = sorted(n for n, v in options.dims.items() if seen.get(n, v) != v)
    if clash:  # the model is searched at one shape: the timing and part verification run on the inputs
        given = ", ".join(f"{n}={options.dims[n]}" for n in clash)
        raise ModelError(
            f"--dim {given} disagrees with --inputs, which run at "
            f"{', '.join(f'{n}={seen[n]}' for n in clash)}: give one value for each dimension"
        )
    dims = representative(original, options.dims, options.input_shapes, seen=seen, ranges=options.dim_ranges)
    inputs = _verification(original, options, dims)
    runs = inputs.datasets if options.verify else _runs_at(original, options, dims.shapes())
    if not runs and dims.values and not options.dims:
        # the input does not run at the default values (a Reshape to a fixed size, say): its symbolic
        # dimensions stay symbolic, and the parts that depend on them pass through, as without values
        unresolved = Dims({}, {}, (*dims.values, *dims.unresolved))
        fallback = _verification(original, options, unresolved)
        if fallback.datasets or not options.verify:
            values = ", ".join(f"{n}={v}" for n, v in dims.values.items())
            where = f" ({inputs.note})" if inputs.note else ""
            why = f"the model does not run at {values}{where}: give --dim NAME=VALUE"
            dims, inputs = (
                unresolved,
                dataclasses.replace(fallback, note="; ".join(filter(None, [fallback.note, why]))),
            )
    return dims, dataclasses.replace(inputs, timings=_shape_timings(original, options, dims))


def _verification(original: onnx.ModelProto, options: Options, dims: Dims) -> _Inputs:
    """Verification inputs at the pinned and representative shapes, and (where the input model runs
    at those) at the other shapes checked."""
    if not options.verify:
        return _Inputs([], [], "")
    shapes = dict(options.input_shapes) | dims.shapes()
    datasets, references, note = verification_inputs(
        original, seed=options.seed, input_shapes=shapes, given=options.inputs
    )
    checks = _shape_checks(original, options, dims) if datasets else []
    return _Inputs(datasets, references, note, checks)


def _shape_timings(original: onnx.ModelProto, options: Options, dims: Dims) -> list[ShapeTiming]:
    """Timing inputs at each of ``options.time_shapes`` (a dimension not named there at its
    representative value).

    Raises
    ------
    ModelError
        A time shape names a dimension the output does not keep symbolic.
    """
    timings = []
    for values in options.time_shapes:
        unknown = sorted(set(values) - set(dims.values))
        if unknown:
            kept = ", ".join(dims.values) or "none"
            raise ModelError(
                f"--time-shapes names {', '.join(unknown)}, not a symbolic dimension kept ({kept})"
            )
        outside = [n for n, v in values.items() if n in dims.ranges and not dims.ranges[n].holds(v)]
        if outside:
            n = outside[0]
            raise ModelError(
                f"--time-shapes {n}={values[n]} is outside its declared range {dims.ranges[n].text()}"
            )
        shapes = dict(options.input_shapes) | shapes_at(dims, dict(dims.values) | dict(values))
        timings.append(ShapeTiming(dict(values), modelio.random_inputs(original, options.seed, shapes)))
    return timings


def _seen(original: onnx.ModelProto, options: Options) -> dict[str, int]:
    """The symbolic dimensions' values in the user's first inputs (they are searched at those).

    Raises
    ------
    ModelError
        The inputs give an input that ``--input-shape`` pins another shape.
    """
    if not options.inputs:
        return {}
    loaded = [modelio.load_inputs(f, original) if isinstance(f, str | Path) else f for f in options.inputs]
    for feeds in loaded:
        for name, shape in options.input_shapes.items():
            got = getattr(feeds.get(name), "shape", None)
            if got is not None and tuple(got) != tuple(shape):
                raise ModelError(
                    f"--inputs give {name} the shape {list(got)}, but --input-shape pins it to "
                    f"{list(shape)}: give one shape"
                )
    return seen_values(original, loaded[0])


def _shape_checks(original: onnx.ModelProto, options: Options, dims: Dims) -> list[ShapeCheck]:
    """Verification inputs at the other values of ``dims`` (:func:`check_assignments`) that the input
    model runs at (an image side of 1 may be too small for its kernels: not checked)."""
    checks = []
    for values in check_assignments(dims):
        shapes = dict(options.input_shapes) | shapes_at(dims, values)
        datasets, references, _ = verification_inputs(original, seed=options.seed, input_shapes=shapes)
        if datasets:
            checks.append(ShapeCheck(values, datasets, references))
    return checks


def _probe(
    original: onnx.ModelProto,
    options: Options,
    dims: Dims,
    checks: Sequence[ShapeCheck],
    parts: Sequence[Part],
    *,
    fold: bool,
) -> Probe | None:
    """The model prepared and translated at the first of ``checks`` (without verification: of
    :func:`check_assignments`) where each symbolic dimension is at a value of its own, other than its
    representative one and 1 (the odd values), and at larger ones (:func:`second_probe`): what tells
    which of a rewrite's constants are sizes of which dimension (:mod:`einopt.stages.generalize`);
    None without such values, or when the model does not prepare at the first."""
    first = next(
        (
            dict(values)
            for values in ([c.values for c in checks] or check_assignments(dims))
            if all(values.get(n, v) not in (v, 1) for n, v in dims.values.items())
            and len(set(values.values())) == len(values)
            and (checks or _runs_at(original, options, shapes_at(dims, values)))  # checks run there
        ),
        None,
    )
    if first is None:
        return None
    backend = backends.backend(options.kernels)
    translations = []
    runs = (v for v in second_probe(dims, first) if _runs_at(original, options, shapes_at(dims, v)))
    larger = next(runs, None)
    for values in (first, *([larger] if larger is not None else [])):
        try:
            shapes = shapes_at(dims, values)
            prepared = prepare(original, options.input_shapes, fold=fold, representative=shapes)
        except (ModelError, ValueError) as e:  # the first is needed; the second only checks
            log.info("not translated at %s: %s", values, e)
            if not translations:
                return None
            continue
        there = translate_graph(prepared.model, fuse_activations=backend.fuse_activations)
        translations.append((values, prepared.model, there))
    return Probe.of(dims.values, translations, parts)


def _runs_at(original: onnx.ModelProto, options: Options, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether the input model runs on generated inputs of ``shapes`` (without verification, the
    values of symbolic dimensions are chosen among those where it does)."""
    try:
        datasets, _, _ = verification_inputs(
            original, seed=options.seed, input_shapes=dict(options.input_shapes) | dict(shapes)
        )
    except ModelError:
        return False
    return bool(datasets)


def _unworkable(model: onnx.ModelProto) -> str:
    """Why einopt cannot translate anything in ``model`` ("" when it can try)."""
    if not any(o.domain in DEFAULT_DOMAINS for o in model.opset_import):
        domains = ", ".join(sorted({o.domain for o in model.opset_import})) or "none"
        return (
            f"the model imports no default-domain (ai.onnx) opset (only: {domains}), "
            "so einopt has nothing to translate: it passes through"
        )
    return ""


def _rewrite(
    original: onnx.ModelProto,
    options: Options,
    inputs: _Inputs,
    clock: _Clock,
    progress: Callable[[Progress], None] | None,
    *,
    fold: bool,
    dims: Dims,
) -> Result | str:
    """Prepare, translate, search, cost, select, accept, assemble and verify; a string says why the
    prepared model is wrong."""
    backend = backends.backend(options.kernels)
    prepared = prepare(original, options.input_shapes, fold=fold, representative=dims.shapes())
    model = prepared.model
    if options.verify and fold:  # the unchanged parts of an output come from the prepared model
        folded = compare_models(inputs.references, model, inputs.datasets, options.tolerance)
        if not folded.ok:
            return folded.message
    clock("prepare")
    parts = translate_graph(model, fuse_activations=backend.fuse_activations)
    states = start(model, parts)
    translated = [p for p in parts if p.translated]
    clock("translate")
    # timings run on the user's inputs when given (the last usable set), else on the generated ones
    feeds = inputs.datasets[-1] if inputs.datasets else _timing_feeds(original, options, dims)
    store = MeasurementCache(resolve_path(options.cache))
    timer = Timer(store, part_budget_s=options.part_budget_s, model_budget_s=options.model_budget_s)
    ctx = StageContext(
        original,
        model,
        inputs.datasets,
        inputs.references,
        options.tolerance,
        feeds,
        timer=timer if options.accept == "measured" and feeds is not None else None,
        accept=options.accept,
        noise=options.noise,
        model_noise=options.model_noise,
        backend=backend,
        taken={f.name for f in original.functions},
        dims=dims,
        checks=inputs.checks,
        timings=inputs.timings,
        probe=_probe(original, options, dims, inputs.checks, translated, fold=fold),
        specialize=options.specialize,
        declared=declared_shapes(keep_symbolic(model, original)) if dims.values else {},
    )
    try:
        searches = _search(parts, options, store, progress)
        clock("search")
        if ctx.timed:
            configure_threads()
            searches = predict(ctx, translated, searches, OpCosts(store))
            clock("cost")
        states = fill(states, search=searches)
        top_k = options.top_k if options.max_depth > 0 else 0
        states = fill(states, selection=select(ctx, translated, searches, top_k=top_k))
        states = backend.after_selection(ctx, states)
        states = general_rewrites(ctx, states)
        clock("select")
        decided = accept(ctx, states)
    finally:
        store.close()
    states = fill(states, verdict=decided.verdicts, kept={n: True for n in decided.kept})
    clock("accept")
    out, dropped = verify_output(ctx, states)
    states = fill(states, kept={n: False for n in dropped}, dropped=dropped)
    clock("verify model")
    notes = [*prepared.notes, *([inputs.note] if inputs.note else []), *decided.notes]
    if not fold:
        notes.append(
            "constant and BatchNormalization folding skipped: the folded model differed from the original"
        )
    if dims.values and out is not original:
        notes.append(_symbolic_note(dims, inputs.checks))
        only = [s.name for s in states.values() if s.kept and s.emitted is not None and s.emitted.only_at]
        if only:
            notes.append(
                f"{len(only)} rewrite(s) run at the searched values only, the input's own nodes at other "
                f"values (they hold there only; --no-specialize leaves them out): {', '.join(only)}"
            )
    notes = _notes(notes, prepared.changes, original, out, pinned=bool(options.input_shapes))
    results = tuple(part_result(s, decided.rounds, options.accept) for s in states.values())
    kept = [s for s in states.values() if s.kept]
    workspace = Workspace(
        model,
        tuple(s.part for s in kept),
        {s.name: s.emitted for s in kept},
        feeds if inputs.datasets else None,
        ctx.declared,
    )
    return Result(
        out,
        results,
        tuple(notes),
        options.verify,
        clock.seconds,
        acceptance=decided.report,
        workspace=workspace,
        shapes=dict(options.input_shapes) | dims.shapes(),
        symbolic=_symbolic_section(dims, inputs, ctx.probe) if dims.values else {},
    )


def _notes(
    notes: list[str], changes: Sequence[str], original: onnx.ModelProto, out: onnx.ModelProto, pinned: bool
) -> list[str]:
    """What the report says about the run as a whole: ``notes`` (of preparation, the inputs and
    acceptance), without what preparation ``changes`` when the output is the input itself."""
    if out is original:  # what preparation changed is not in the output
        notes = [n for n in notes if n not in changes]
        notes.append("no rewrite was accepted: the output is the input model, unchanged")
        return notes
    check_note = _check_output(original, out)
    notes += [check_note] if check_note else []
    if pinned:
        notes.append("the output keeps the pinned input shapes: its rewrites were instantiated for them")
    return notes


def _symbolic_note(dims: Dims, checks: Sequence[ShapeCheck]) -> str:
    values = ", ".join(f"{n}={v}" for n, v in dims.values.items())
    where = "; ".join(c.text() for c in checks) or "no other values (the input model runs at none)"
    declared = "".join(f" ({n} declared {r.text()})" for n, r in dims.ranges.items())
    return (
        f"the output keeps the symbolic dimensions {', '.join(dims.values)}{declared}: searched and timed "
        f"at {values}, verified there and at {where}"
    )


def _symbolic_section(dims: Dims, inputs: _Inputs, probe: Probe | None) -> dict:
    """The report's ``symbolic`` section: the dimensions the output keeps, each one's searched value
    and declared range, and the values the output was verified and timed at."""
    return {
        "dimensions": [
            {"name": n, "searched_at": v, "declared": dims.ranges[n].text() if n in dims.ranges else None}
            for n, v in dims.values.items()
        ],
        "verified_at": [dict(dims.values)] + [dict(c.values) for c in inputs.checks],
        "timed_at": [dict(dims.values)] + [dict(dims.values) | dict(t.values) for t in inputs.timings],
        "probes": [dict(t.values) for t in probe.at] if probe is not None else [],
    }


def _timing_feeds(model: onnx.ModelProto, options: Options, dims: Dims) -> dict[str, np.ndarray] | None:
    try:
        return modelio.random_inputs(model, options.seed, dict(options.input_shapes) | dims.shapes())
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


def _search(
    parts: Sequence[Part],
    options: Options,
    store: MeasurementCache,
    progress: Callable[[Progress], None] | None,
) -> dict[str, PartSearch]:
    """Every translated part searched (identical ones once; none at depth 0)."""
    if options.max_depth == 0:
        return {}
    settings = Settings(budget=options.budget, exact=not options.verify)
    # unverified, a search read from the cache would reach the output unchecked: search again instead
    return search_parts(
        parts,
        settings,
        store,
        jobs=options.jobs,
        progress=progress,
        ray_address=options.ray,
        reuse=options.verify,
    )


class _Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._t, 4)
        self._t = now

"""Measured acceptance: a rewrite reaches the output only when it is measured faster.

Equal is not enough: a rewritten subprogram replaces its original nodes only
when it differs from them and is measured faster than them, on the values
that really reach it, beyond the noise band (:func:`judge_parts`). The
assembled model is then timed against the input side by side
(:func:`accept_model`), and it is kept only when it is faster beyond the
whole-model band with 95% confidence: the interval of the per-round ratios
of interleaved runs lies above ``1 + band``. While it is not, the accepted
rewrites are rolled back, a kind at a time (rewrites with the same original
and new operators, such as a network's channel shuffles, go together),
smallest measured gain first, half of the kinds at a time while many
remain. A round whose input ran slower or faster than in the timing before
it by more than the band (the machine changed under the measurement) is
retaken, not compared, until two timings in a row agree (when the input keeps moving, the least
of the timings is judged: the gain must hold at every speed the machine ran at). The model that survives is timed against the input
once more in each of three fresh Python processes (:mod:`einopt.runtime.fresh`: a
reading moves from one process to the next by more than the band, and more
runs in one process cannot see that); unless every one of them confirms the
gain, the output is the input. Local timings cannot
see layout interactions inside ONNX Runtime (a Reshape between two
convolutions breaks its blocked NCHWc chain): the whole-model measurement
decides.

Every timing goes through a :class:`Timer`, which consults the measurement
cache first; tests pass a timer of their own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from einopt.opsets import DEFAULT_DOMAINS
from einopt.runtime import bench
from einopt.runtime.cache import MeasurementCache, resolve_path
from einopt.runtime.fresh import PROCESSES, FreshProcessError, least, time_fresh
from einopt.runtime.graphkey import content_key, timing_key
from einopt.runtime.timing import NOISE_BAND, Comparison, configure_threads
from einopt.stages.export import assemble
from einopt.stages.postopt import postoptimize
from einopt.stages.verify import PartPair, part_pairs

if TYPE_CHECKING:
    from einopt.frontend.translate import Part
    from einopt.instantiate.emit import Instantiated

log = logging.getLogger(__name__)

BISECT_FROM = 8
"""With more kinds of accepted rewrites than this, a slow whole model rolls back half of them at a time."""

MODEL_NOISE = 0.02
"""The whole-model band: an output is kept only when it is faster than the input by more than this, 95%
confident (a byte-identical copy of a 2-40 ms model reads 0.99-1.02x over 300 interleaved runs)."""

MODEL_MIN_RUNS = 30
"""Runs per side of a whole-model comparison at least, past its budget if need be: ten runs of a
500 ms model (ViT at batch 16) cannot tell a 10% gain from a machine whose speed drifts by 10%
between rounds (measured on a 2-vCPU VM: the confirmation's 95% interval spanned 0.95-1.17x)."""
MAX_RETAKES = 2
"""Whole-model timings retaken while the input's own time has drifted from the first round's."""


class Timer:
    """Times part pairs and whole models side by side, through the measurement cache.

    Parameters
    ----------
    cache : MeasurementCache
        Where timings are looked up first and stored after.
    part_budget_s, model_budget_s : float
        Seconds of timed runs per part pair and per whole-model comparison.
    min_runs, max_runs : int
        Runs per side, at least and at most.
    model_min_runs : int
        Runs per side of a whole-model comparison at least (:data:`MODEL_MIN_RUNS`).
    model_max_runs : int
        Runs per side of a whole-model comparison at most: a model of a millisecond or less fits many
        in its budget, and they narrow the medians' intervals that decide a disturbed timing.
    processes : int
        Fresh processes a whole-model confirmation is timed in (:data:`einopt.runtime.fresh.PROCESSES`;
        0: in this process).
    """

    def __init__(
        self,
        cache: MeasurementCache,
        *,
        part_budget_s: float = 1.0,
        model_budget_s: float = 10.0,
        min_runs: int = 10,
        max_runs: int = 200,
        model_min_runs: int = MODEL_MIN_RUNS,
        model_max_runs: int = 1000,
        processes: int = PROCESSES,
    ) -> None:
        self.cache = cache
        self.part_budget_s = part_budget_s
        self.model_budget_s = model_budget_s
        self.min_runs = min_runs
        self.max_runs = max_runs
        self.model_min_runs = model_min_runs
        self.model_max_runs = model_max_runs
        self.processes = processes

    def _time(
        self,
        kind,
        before,
        after,
        fa,
        fb,
        budget: float,
        runs: tuple[int, int],
        what: str,
        fresh: bool = False,
    ) -> Comparison:
        """Cached unless ``fresh``; a disturbed new timing is made once more, and that one stays (a
        cached one is trusted: a second run measures nothing new; delete the cache to measure afresh).

        ``kind`` ("part" or "model") is in the key: where a part is the whole model, its selection
        timing and the whole model's are the same pair of graphs, and the confirmation, always made
        afresh, would replace the timing the part was chosen by (a second run then read it and chose
        another candidate).
        """
        key = self._key(kind, before, after, fa, fb)

        def timer() -> Comparison:
            return bench.time_models(
                before, after, fa, fb, min_runs=runs[0], max_runs=runs[1], budget_s=budget
            )

        c = self.cache.measure(key, what, timer, fresh=fresh)
        if c.unreliable() and not c.cached:
            log.info("%s: timing disturbed (%s), timing it again", what, c.unreliable())
            c = self.cache.measure(key, what, timer, fresh=True)
        return c

    def _key(self, kind: str, before, after, fa, fb) -> str:
        return self.cache.key(timing_key(before, fa, kind), timing_key(after, fb, kind))

    def part(self, pair: PartPair) -> Comparison:
        """The rewritten nodes against the original nodes, on the values that reach them."""
        return self._time(
            "part",
            pair.original,
            pair.rewritten,
            pair.original_feeds,
            pair.rewritten_feeds,
            self.part_budget_s,
            (self.min_runs, self.max_runs),
            f"part {pair.name}",
        )

    def confirm(
        self, before: onnx.ModelProto, after: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
    ) -> list[Comparison]:
        """A whole model against another, timed anew in each of :attr:`processes` fresh processes
        (:func:`einopt.runtime.fresh.time_fresh`; in this process, new sessions, when that is 0 or a
        child fails), the whole-model budget shared between them (each still makes the minimum runs).
        The least of the readings replaces the cached whole-model timing."""
        if self.processes <= 0:
            return [self.model(before, after, feeds, fresh=True)]
        readings: list[Comparison] = []

        def timer() -> Comparison:
            readings.extend(
                time_fresh(
                    before,
                    after,
                    feeds,
                    processes=self.processes,
                    min_runs=self.model_min_runs,
                    max_runs=self.model_max_runs,
                    budget_s=self.model_budget_s / self.processes,  # the spread is between processes
                )
            )
            return least(readings)

        try:
            self.cache.measure(
                self._key("model", before, after, feeds, feeds), "whole model", timer, fresh=True
            )
        except FreshProcessError as e:
            log.warning("%s; confirming in this process instead", e)
            return [self.model(before, after, feeds, fresh=True)]
        return readings

    def model(
        self,
        before: onnx.ModelProto,
        after: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        *,
        fresh: bool = False,
    ) -> Comparison:
        """A whole model against another on the same inputs (``fresh``: timed anew, new sessions, even
        when the cache holds a timing; the new one replaces it)."""
        return self._time(
            "model",
            before,
            after,
            feeds,
            feeds,
            self.model_budget_s,
            (self.model_min_runs, self.model_max_runs),
            "whole model",
            fresh,
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What measured acceptance decided for one rewritten subprogram."""

    name: str
    accepted: bool
    timing: Comparison
    reason: str


ROUND_STAGES = ("round", "retake", "confirm")
"""A whole-model timing compared (``round``), not compared because the input's own time drifted
(``retake``), or one fresh process's reading of the surviving model in the final check (``confirm``)."""


@dataclasses.dataclass(frozen=True)
class ModelRound:
    """One whole-model timing: which rewrites were in the model, which it rolled back, and why."""

    kept: tuple[str, ...]
    timing: Comparison
    rolled_back: tuple[str, ...]
    stage: str = "round"  # one of ROUND_STAGES
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "kept": list(self.kept),
            "rolled_back": list(self.rolled_back),
            "stage": self.stage,
            "reason": self.reason,
        } | self.timing.as_dict()


def is_unchanged(
    nodes: Sequence[onnx.NodeProto],
    new_nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, onnx.TensorProto],
    new_constants: Sequence[onnx.TensorProto],
    outputs: Sequence[str],
    opset: int,
) -> bool:
    """Whether a re-instantiation is the original nodes again (same ops, wiring, attributes and data).

    Parameters
    ----------
    nodes : sequence
        The original nodes of the subprogram.
    new_nodes, new_constants : sequence
        Its instantiation and the initializers that came with it.
    constants : mapping
        The model's initializers by name (both node groups may read them).
    outputs : sequence
        The subprogram's output names (shared by both groups).
    opset : int
        The default-domain opset (attribute defaults depend on it).
    """
    if [n.op_type for n in nodes] != [n.op_type for n in new_nodes]:
        return False
    return content_key(nodes, constants, outputs, opset) == content_key(
        new_nodes, dict(constants) | {t.name: t for t in new_constants}, outputs, opset
    )


def judge_parts(
    pairs: Iterable[PartPair | tuple[str, Comparison]], timer: Timer, band: float = NOISE_BAND
) -> dict[str, Verdict]:
    """Time each part pair (or take a ``(name, timing)`` already made); a rewrite is accepted when it
    is faster than the original beyond ``band``."""
    verdicts: dict[str, Verdict] = {}
    for pair in pairs:
        name, t = pair if isinstance(pair, tuple) else (pair.name, timer.part(pair))
        # A disturbed timing is trusted only when even its spread cannot close the gap.
        ok = t.faster(band) and (not t.unreliable() or t.separated(band))
        if ok and t.unreliable():
            reason = (
                f"measured {t.speedup:.2f}x faster on its own (a disturbed timing, {t.unreliable()}, "
                "but its median's 95% interval lies beyond the original's)"
            )
        elif ok:
            reason = f"measured {t.speedup:.2f}x faster on its own"
        elif t.unreliable():
            reason = (
                f"not accepted: its timing was disturbed by other work ({t.speedup:.2f}x; {t.unreliable()})"
            )
        else:
            reason = f"not faster than the original nodes ({t.speedup:.2f}x; needs >= {1 + band:.2f}x)"
        verdicts[name] = Verdict(name, ok, t, reason)
        log.info("%s: %s", name, reason)
    return verdicts


def accept_model(
    original: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    build: Callable[[frozenset[str]], onnx.ModelProto],
    gains: Mapping[str, float],
    timer: Timer,
    *,
    band: float = MODEL_NOISE,
    kinds: Mapping[str, str] | None = None,
) -> tuple[frozenset[str], list[ModelRound]]:
    """Roll back accepted rewrites until the assembled model is faster than the input, for sure.

    A model is kept when :meth:`Comparison.confirms` ``band`` (its 95%
    speedup interval lies above ``1 + band``); then it is timed once more in
    fresh processes (:meth:`Timer.confirm`), and kept only when every one of
    them confirms it too (when one does not, nothing is kept). Otherwise a kind of
    rewrites is rolled back (all of it at once; the kind whose smallest gain
    is smallest first; half of the kinds at a time while more than
    :data:`BISECT_FROM` remain) and the rest is timed again. A timing that
    stays disturbed after a second try (see :meth:`Timer.model`) and does
    not confirm a gain rolls back everything: what cannot be measured is not
    kept. A timing whose input ran more than ``band`` away from the input of
    the timing before it is retaken (:data:`MAX_RETAKES` times), not
    compared, until two in a row agree; when the input keeps moving, the
    least of those timings (the lowest bound on the speedup) is the one
    judged.

    Parameters
    ----------
    original : onnx.ModelProto
        The input model (what the output must be faster than).
    feeds : mapping
        Inputs both models run on.
    build : callable
        The assembled model with exactly the given rewrites in it.
    gains : mapping
        Accepted rewrite -> its measured speedup on its own (rollback order).
    timer : Timer
        How models are timed.
    band : float
        The whole-model noise band.
    kinds : mapping, optional
        Rewrite -> its kind (rewrites of one kind are rolled back together);
        default: each rewrite a kind of its own.

    Returns
    -------
    (frozenset, list)
        The rewrites kept (empty: the output is the input), and every
        whole-model timing made (the last one, when anything is kept, the
        confirmation).
    """
    units = _units(gains, kinds or {})
    rounds: list[ModelRound] = []
    reference: list[float] = []  # the input's median in the first round compared
    while units:
        kept = tuple(sorted(n for u in units for n in u))
        model = build(frozenset(kept))
        t = _steady(timer, original, model, feeds, band, reference, rounds, kept)
        if t.confirms(band):
            rounds.append(ModelRound(kept, t, (), "round", _verdict(t, band)))
            return _confirmed(timer, original, model, feeds, band, kept, rounds)
        if t.unreliable():  # what cannot be measured is not kept
            log.info("whole-model timing disturbed (%s): rolling back every rewrite", t.unreliable())
            drop = units
        else:
            drop = units[: len(units) // 2] if len(units) > BISECT_FROM else units[:1]
        dropped = tuple(sorted(n for u in drop for n in u))
        log.info("whole model %s: rolling back %s", _verdict(t, band), ", ".join(dropped))
        rounds.append(ModelRound(kept, t, dropped, "round", _verdict(t, band)))
        units = units[len(drop) :]
    return frozenset(), rounds


def _confirmed(
    timer: Timer,
    original: onnx.ModelProto,
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    band: float,
    kept: tuple[str, ...],
    rounds: list[ModelRound],
) -> tuple[frozenset[str], list[ModelRound]]:
    """The model that survived the rounds, timed once more in fresh processes (:meth:`Timer.confirm`):
    kept when every reading confirms the gain, that is when the least of them does (each reading is a
    ``confirm`` round; the least one, when it fails, rolls back every rewrite)."""
    readings = timer.confirm(original, model, feeds)
    worst = least(readings)
    ok = worst.confirms(band)
    for k, c in enumerate(readings):
        where = f"fresh process {k + 1} of {len(readings)}" if len(readings) > 1 else "the fresh confirmation"
        if c is worst and not ok:
            why = f"{where} did not establish the gain ({_verdict(c, band)})"
            rounds.append(ModelRound(kept, c, kept, "confirm", why))
            log.info("whole model: %s: rolling back every rewrite", why)
        else:
            rounds.append(ModelRound(kept, c, (), "confirm", f"{where}: {_verdict(c, band)}"))
    return (frozenset(kept) if ok else frozenset()), rounds


def _units(gains: Mapping[str, float], kinds: Mapping[str, str]) -> list[tuple[str, ...]]:
    """The accepted rewrites grouped by kind, in rollback order: the kind whose smallest gain is
    smallest first (ties by name); a rewrite without a kind is a kind of its own."""
    groups: dict[str, list[str]] = {}
    for n in gains:
        groups.setdefault(kinds.get(n, f"\0{n}"), []).append(n)
    units = [tuple(sorted(g)) for g in groups.values()]
    return sorted(units, key=lambda u: (min(gains[n] for n in u), u))


def _steady(
    timer: Timer,
    original: onnx.ModelProto,
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    band: float,
    reference: list[float],
    rounds: list[ModelRound],
    kept: tuple[str, ...],
) -> Comparison:
    """``model`` timed against ``original``, compared only once the input's median agrees within
    ``band`` with the input's median of the timing before it (``reference``: the last one compared in
    this run; one from the cache was made on another run and says nothing about the machine now).

    A timing whose input drifted from the one before it is recorded as a retake and made again; the
    retake is compared when its input agrees with the drifted one (the machine has settled at another
    speed: an input 4% faster for good is no reason to distrust paired ratios). When the input still
    moves after :data:`MAX_RETAKES` retakes (a machine whose speed swings by 10-25% from one timing
    to the next, as a shared VM's can), the timing returned is the least of those made: the one with
    the lowest 95% bound on its speedup, so a gain is kept only when it held at every speed the
    machine ran at."""
    t = timer.model(original, model, feeds)
    if t.cached:
        return t
    previous = reference[-1] if reference else None
    made = [t]
    for attempt in range(MAX_RETAKES + 1):
        drift = t.before.median_ms / previous if previous else 1.0
        if abs(drift - 1.0) <= band:
            reference.append(t.before.median_ms)
            return t
        why = (
            f"the input ran {t.before.median_ms:.3g} ms against {previous:.3g} ms in the timing before "
            f"({drift:.2f}x, beyond the {band:.0%} band): the machine changed under the measurement"
        )
        if attempt == MAX_RETAKES:
            worst = least(made)
            why += f", and kept changing: judged on the least of its {len(made)} timings"
            log.info("whole model: %s", why)
            rounds.append(ModelRound(kept, t, (), "retake", why))
            reference.append(t.before.median_ms)
            return worst
        log.info("whole model: %s; timing it again", why)
        rounds.append(ModelRound(kept, t, (), "retake", why))
        previous = t.before.median_ms
        t = timer.model(original, model, feeds, fresh=True)
        made.append(t)
    return t  # not reached


def _verdict(t: Comparison, band: float) -> str:
    low, high = t.gain_interval
    return f"{t.speedup:.3f}x, 95% interval {low:.3f}-{high:.3f}x against > {1 + band:.2f}x"


def rewrite_kind(model: onnx.ModelProto, part: Part, inst: Instantiated) -> str:
    """What a rewrite does, whatever its position and shapes: its original op types -> its new ones,
    an eOperator by the op types of its body (a network's channel shuffles are one kind)."""
    bodies = {f.name: f for f in inst.functions}

    def op(n: onnx.NodeProto) -> str:
        if n.op_type in bodies and n.domain == bodies[n.op_type].domain:
            return "{" + " ".join(op(m) for m in bodies[n.op_type].node) + "}"
        return n.op_type if n.domain in DEFAULT_DOMAINS else f"{n.domain}.{n.op_type}"

    old = " ".join(model.graph.node[i].op_type for i in part.nodes)
    return f"{old} -> {' '.join(op(n) for n in inst.nodes)}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What acceptance kept, what it measured, and what the report says about it."""

    kept: frozenset[str]
    verdicts: Mapping[str, Verdict]
    rounds: tuple[ModelRound, ...]
    notes: tuple[str, ...]
    report: Mapping[str, object]


def accept_rewrites(
    original: onnx.ModelProto,
    model: onnx.ModelProto,
    parts: Mapping[str, Part],
    emitted: Mapping[str, Instantiated],
    feeds: Mapping[str, np.ndarray] | None,
    *,
    mode: str = "measured",
    cache: bool | str | Path | MeasurementCache = True,
    noise: float = NOISE_BAND,
    model_noise: float = MODEL_NOISE,
    part_budget_s: float = 1.0,
    model_budget_s: float = 10.0,
    measured: Mapping[str, Comparison] | None = None,
    timer: Timer | None = None,
) -> Decision:
    """Measured acceptance of verified rewrites that differ from their original nodes.

    Parameters
    ----------
    original : onnx.ModelProto
        The input model (the whole-model yardstick).
    model : onnx.ModelProto
        The prepared model the parts were cut from.
    parts, emitted : mapping
        Part name -> the part, and -> its verified instantiation.
    feeds : mapping or None
        Inputs to time on (None: nothing can be timed, nothing is accepted).
    mode : {"measured", "verified"}
        ``verified`` keeps every rewrite, untimed.
    cache : bool, path or MeasurementCache
        The measurement cache (True: the default file; False: this run only;
        an open cache is used as it is and left open).
    noise, model_noise, part_budget_s, model_budget_s
        See :class:`einopt.pipeline.Options`.
    timer : Timer, optional
        How parts and models are timed (default: a :class:`Timer` on ``cache`` with these budgets;
        tests pass their own).
    measured : mapping, optional
        Part name -> its rewrite's timing against the original nodes, already
        made (by selection): those parts are judged on it, not timed again.
    """
    report: dict[str, object] = {"mode": mode, "timed": False, "noise_band": noise, "model_band": model_noise}
    if mode == "verified":
        note = "the output was not timed (--accept verified): it may be slower than the input"
        return Decision(frozenset(emitted), {}, (), (note,) if emitted else (), report)
    if not emitted:
        return Decision(frozenset(), {}, (), (), report | {"rounds": [], "cache": None})
    if feeds is None:
        note = "no inputs to time the rewrites on: every subprogram keeps its original nodes"
        return Decision(frozenset(), {}, (), (note,), report)
    configure_threads()
    own = not isinstance(cache, MeasurementCache)
    store = MeasurementCache(resolve_path(cache)) if own else cache
    try:
        timer = timer or Timer(store, part_budget_s=part_budget_s, model_budget_s=model_budget_s)
        made = {n: t for n, t in (measured or {}).items() if n in emitted}
        pairs = part_pairs(
            model, [parts[n] for n in emitted if n not in made], emitted, feeds, epilogues=True
        )
        verdicts = judge_parts([*made.items(), *pairs], timer, noise)
        gains = {n: v.timing.speedup for n, v in verdicts.items() if v.accepted}

        def build(names: frozenset[str]) -> onnx.ModelProto:
            return postoptimize(assemble(model, {parts[n].nodes: emitted[n] for n in names}))

        kinds = {n: rewrite_kind(model, parts[n], emitted[n]) for n in gains}
        kept, rounds = (
            accept_model(original, feeds, build, gains, timer, band=model_noise, kinds=kinds)
            if gains
            else (frozenset(), [])
        )
    finally:
        if own:
            store.close()
    unreliable = [f"{n}: {v.timing.unreliable()}" for n, v in verdicts.items() if v.timing.unreliable()]
    unreliable += [f"whole model: {r.timing.unreliable()}" for r in rounds if r.timing.unreliable()]
    notes = (_disturbed_note(unreliable),) if unreliable else ()
    confirms = [r for r in rounds if r.stage == "confirm"]  # the least reading is the one that decided
    confirm = min(confirms, key=lambda r: r.timing.gain_interval[0]) if confirms else None
    if confirm is not None and not kept:
        notes += (f"the whole model was not kept: {confirm.reason}; the output is the input",)
    report |= {
        "timed": True,
        "confirmation": confirm.as_dict() if confirm is not None else None,
        "rounds": [r.as_dict() for r in rounds],
        "cache": store.describe(),
        "unreliable": unreliable,
    }
    return Decision(kept, verdicts, tuple(rounds), notes, report)


def _disturbed_note(unreliable: Sequence[str], shown: int = 3) -> str:
    """One line on the disturbed timings (the report's ``acceptance.unreliable`` lists them all)."""
    names = [u.split(":", 1)[0] for u in unreliable]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (
        f"{len(names)} timings were disturbed by other work ({', '.join(names[:shown])}{more}; first: "
        f"{unreliable[0].split(': ', 1)[1]}): treat them with care, or measure again on a quiet machine"
    )

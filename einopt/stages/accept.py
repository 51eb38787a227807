"""Measured acceptance: a rewrite reaches the output only when it is measured faster.

Equal is not enough: a rewritten subprogram replaces its original nodes only
when it differs from them and is measured faster than them, on the values
that really reach it, beyond the noise band (:func:`judge_parts`). The
assembled model is then timed against the input side by side, and while it
is slower the accepted rewrites are rolled back, smallest measured gain
first (half of them at a time while many remain), and the model is timed
again (:func:`accept_model`): local timings cannot see layout interactions
inside ONNX Runtime (a Reshape between two convolutions breaks its blocked
NCHWc chain), the whole-model measurement decides.

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

from einopt.runtime import bench
from einopt.runtime.cache import MeasurementCache, resolve_path
from einopt.runtime.graphkey import content_key, timing_key
from einopt.runtime.timing import NOISE_BAND, Comparison, configure_threads
from einopt.runtime.verify import PartPair, part_pairs
from einopt.stages.export import assemble
from einopt.stages.postopt import postoptimize

if TYPE_CHECKING:
    from einopt.frontend.translate import Part
    from einopt.instantiate.emit import Instantiated

log = logging.getLogger(__name__)

BISECT_FROM = 8
"""With more accepted rewrites than this, a slow whole model rolls back half of them at a time."""


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
    model_max_runs : int
        Runs per side of a whole-model comparison at most: a model of a millisecond or less fits many
        in its budget, and they narrow the medians' intervals that decide a disturbed timing.
    """

    def __init__(
        self,
        cache: MeasurementCache,
        *,
        part_budget_s: float = 1.0,
        model_budget_s: float = 10.0,
        min_runs: int = 10,
        max_runs: int = 200,
        model_max_runs: int = 1000,
    ) -> None:
        self.cache = cache
        self.part_budget_s = part_budget_s
        self.model_budget_s = model_budget_s
        self.min_runs = min_runs
        self.max_runs = max_runs
        self.model_max_runs = model_max_runs

    def _time(self, before, after, fa, fb, budget: float, max_runs: int, what: str) -> Comparison:
        """Cached; a disturbed new timing is made once more, and that one stays (a cached one is trusted:
        a second run measures nothing new; delete the cache to measure afresh)."""
        key = self.cache.key(timing_key(before, fa), timing_key(after, fb))

        def timer() -> Comparison:
            return bench.time_models(
                before, after, fa, fb, min_runs=self.min_runs, max_runs=max_runs, budget_s=budget
            )

        c = self.cache.measure(key, what, timer)
        if c.unreliable() and not c.cached:
            log.info("%s: timing disturbed (%s), timing it again", what, c.unreliable())
            c = self.cache.measure(key, what, timer, fresh=True)
        return c

    def part(self, pair: PartPair) -> Comparison:
        """The rewritten nodes against the original nodes, on the values that reach them."""
        return self._time(
            pair.original,
            pair.rewritten,
            pair.original_feeds,
            pair.rewritten_feeds,
            self.part_budget_s,
            self.max_runs,
            f"part {pair.name}",
        )

    def model(
        self, before: onnx.ModelProto, after: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
    ) -> Comparison:
        """A whole model against another on the same inputs."""
        return self._time(
            before, after, feeds, feeds, self.model_budget_s, self.model_max_runs, "whole model"
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What measured acceptance decided for one rewritten subprogram."""

    name: str
    accepted: bool
    timing: Comparison
    reason: str


@dataclasses.dataclass(frozen=True)
class ModelRound:
    """One whole-model timing: which rewrites were in the model, and which it rolled back."""

    kept: tuple[str, ...]
    timing: Comparison
    rolled_back: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"kept": list(self.kept), "rolled_back": list(self.rolled_back)} | self.timing.as_dict()


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
) -> tuple[frozenset[str], list[ModelRound]]:
    """Roll back accepted rewrites until the assembled model is not slower than the input.

    A whole-model timing that stays disturbed after a second try (see
    :meth:`Timer.model`) rolls back everything, unless the output's median is
    faster even at the ends of both medians' 95% confidence intervals: a
    rewrite is kept only when the model is measured not slower.

    Parameters
    ----------
    original : onnx.ModelProto
        The input model (what the output must not be slower than).
    feeds : mapping
        Inputs both models run on.
    build : callable
        The assembled model with exactly the given rewrites in it.
    gains : mapping
        Accepted rewrite -> its measured speedup on its own (rollback order).
    timer : Timer
        How models are timed.

    Returns
    -------
    (frozenset, list)
        The rewrites kept (empty: the output is the input), and every
        whole-model timing made with what it rolled back.
    """
    kept = sorted(gains, key=lambda n: (gains[n], n))  # smallest gain first
    rounds: list[ModelRound] = []
    while kept:
        t = timer.model(original, build(frozenset(kept)), feeds)
        if t.speedup >= 1.0 and (not t.unreliable() or t.separated(0.0)):
            rounds.append(ModelRound(tuple(sorted(kept)), t, ()))
            return frozenset(kept), rounds
        if t.unreliable():  # what cannot be measured is not kept
            log.info("whole-model timing disturbed (%s): rolling back every rewrite", t.unreliable())
            drop = kept
        else:
            drop = kept[: len(kept) // 2] if len(kept) > BISECT_FROM else kept[:1]
        log.info("whole model %.2fx: rolling back %s", t.speedup, ", ".join(drop))
        rounds.append(ModelRound(tuple(sorted(kept)), t, tuple(drop)))
        kept = kept[len(drop) :]
    return frozenset(), rounds


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
    part_budget_s: float = 1.0,
    model_budget_s: float = 10.0,
    measured: Mapping[str, Comparison] | None = None,
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
    noise, part_budget_s, model_budget_s
        See :class:`einopt.pipeline.Options`.
    measured : mapping, optional
        Part name -> its rewrite's timing against the original nodes, already
        made (by selection): those parts are judged on it, not timed again.
    """
    report: dict[str, object] = {"mode": mode, "timed": False, "noise_band": noise}
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
        timer = Timer(store, part_budget_s=part_budget_s, model_budget_s=model_budget_s)
        made = {n: t for n, t in (measured or {}).items() if n in emitted}
        pairs = part_pairs(model, [parts[n] for n in emitted if n not in made], emitted, feeds)
        verdicts = judge_parts([*made.items(), *pairs], timer, noise)
        gains = {n: v.timing.speedup for n, v in verdicts.items() if v.accepted}

        def build(names: frozenset[str]) -> onnx.ModelProto:
            return postoptimize(assemble(model, {parts[n].nodes: emitted[n] for n in names}))

        kept, rounds = accept_model(original, feeds, build, gains, timer) if gains else (frozenset(), [])
    finally:
        if own:
            store.close()
    unreliable = [f"{n}: {v.timing.unreliable()}" for n, v in verdicts.items() if v.timing.unreliable()]
    unreliable += [f"whole model: {r.timing.unreliable()}" for r in rounds if r.timing.unreliable()]
    notes = (_disturbed_note(unreliable),) if unreliable else ()
    report |= {
        "timed": True,
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

"""How a rewrite and a whole model are timed against what they replace (:class:`Timer`).

Every timing of the stages after the search goes through one :class:`Timer`, which consults the
measurement cache first; tests pass a timer of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import onnx

from einopt.runtime import bench
from einopt.runtime.cache import MeasurementCache
from einopt.runtime.fresh import PROCESSES, FreshProcessError, least, time_fresh
from einopt.runtime.graphkey import timing_key
from einopt.runtime.timing import Comparison
from einopt.stages.verify import PartPair

__all__ = ["MODEL_MIN_RUNS", "Timer"]

log = logging.getLogger(__name__)

MODEL_MIN_RUNS = 30
"""Runs per side of a whole-model comparison at least, past its budget if need be: ten runs of a
500 ms model (ViT at batch 16) cannot tell a 10% gain from a machine whose speed drifts by 10%
between rounds (measured on a 2-vCPU VM: the confirmation's 95% interval spanned 0.95-1.17x)."""


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

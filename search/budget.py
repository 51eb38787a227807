"""How much a search may do: explorative depth and generated states, with a clock only as a safety net.

A :class:`Budget` is made once, where the user's limits come in (the command
line, :class:`einopt.pipeline.Options`), and handed down unchanged to
:func:`einopt.stages.partsearch.search_parts` and :func:`einopt.search.search`.
Work is counted in generated states (``Stats.generated``: every program a rule
produced), which do not depend on the machine or its load, so the same input
and budget give the same candidates anywhere. The wall-clock ``deadline_s``
only stops a search that would otherwise run away; a search it cut short says
so (``Stats.stopped == "deadline"``) and is never stored as the budget's
result.
"""

from __future__ import annotations

import dataclasses
import math
import time

from einopt.search.results import SearchError

__all__ = ["Budget", "DEFAULT_MAX_DEPTH", "in_time", "same_result"]

DEFAULT_MAX_DEPTH = 7
"""Explorative steps, the paper's default."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """The limits of a search, or of a model's searches.

    Parameters
    ----------
    max_depth : int
        Explorative derivation steps per search.
    states_per_search : int, optional
        States one search may generate (``Stats.generated``); it stops at
        exactly this many, whatever the machine, its load or ``jobs``
        (``Stats.stopped == "states"``). None: no limit.
    states_per_model : int, optional
        States all the searches of one model may generate together
        (:func:`einopt.stages.partsearch.search_parts` shares them out); a
        single :func:`~einopt.search.search` ignores it. None: no limit.
    deadline_s : float, optional
        Wall-clock seconds, a safety net: a search (or a model's searches)
        still running then stops with what it found, marked
        ``Stats.stopped == "deadline"``. None: no deadline.
    """

    max_depth: int = DEFAULT_MAX_DEPTH
    states_per_search: int | None = None
    states_per_model: int | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if not _count(self.max_depth):
            raise SearchError(f"max_depth must be a non-negative integer, got {self.max_depth!r}")
        for name in ("states_per_search", "states_per_model"):
            value = getattr(self, name)
            if value is not None and not (_count(value) and value > 0):
                raise SearchError(f"{name} must be a positive integer, got {value!r}")
        if self.deadline_s is not None and not (
            isinstance(self.deadline_s, int | float)
            and not isinstance(self.deadline_s, bool)
            and math.isfinite(self.deadline_s)
            and self.deadline_s > 0
        ):
            raise SearchError(f"deadline_s must be positive seconds, got {self.deadline_s!r}")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def in_time(deadline: float | None) -> bool:
    """Whether the ``time.monotonic()`` deadline (None: none) has not passed."""
    return deadline is None or time.monotonic() < deadline


def same_result(ran_with: int | None, generated: int, stopped: str, allowed: int | None) -> bool:
    """Whether deterministic work that ran allowed ``ran_with`` states, generated ``generated`` and
    was cut by ``stopped`` (``""``, ``"states"`` or ``"deadline"``) is what the same work gives
    allowed ``allowed`` states: it was allowed exactly that, or it used no more than that and was
    not cut by its own allowance. (Work cut by the deadline is taken as it is: it depends on the
    clock anyway.) This is what lets work run ahead, allowed an upper bound of what it will be
    allowed, and be run again only when the bound made a difference."""
    if ran_with == allowed or stopped == "deadline":
        return True
    return stopped != "states" and (allowed is None or generated <= allowed)

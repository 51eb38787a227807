"""What a subprogram's search depends on besides the subprogram (:class:`Settings`, part of the
search cache's key), shared by :mod:`einopt.stages.partsearch` (which searches run) and
:mod:`einopt.stages.searchruns` (how they run)."""

from __future__ import annotations

import dataclasses

from einopt.search.budget import DEFAULT_MAX_DEPTH, Budget
from einopt.search.engine import DEFAULT_CONVERGE_DEPTH

__all__ = ["FORMAT", "DEFAULT_BUDGET", "Settings"]

FORMAT = 4
"""Version of what is stored per search; bump it when the search's output for a program changes."""

DEFAULT_BUDGET = Budget(
    max_depth=DEFAULT_MAX_DEPTH, states_per_search=10_000, states_per_model=50_000, deadline_s=600.0
)
"""A model's searches by default (``einopt optimize``): the search generates about 150 states per
second on a 2-core machine that other work keeps busy (85-160 on the evaluation models' searches),
so about what 60 s per search and 150 s per model searched before searches were bounded by states.
The deadline only stops searches that would run away (on a far slower machine)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a subprogram's search depends on besides the subprogram.

    Parameters
    ----------
    budget : Budget
        Explorative depth and states per search and per model, and the
        search stage's wall-clock safety net (:class:`einopt.search.Budget`).
        A search cut short by its states keeps the candidates found by then
        (the report says it was cut short).
    converge_depth : int
        Converging steps per explored state (see :func:`einopt.search.search`).
    candidates : int
        Ranked candidates kept per search (one per distinct work: the multiset
        of its nodes' operators and shapes). The analytic ranking is crude, so
        many are kept: the measured cost stage (:mod:`einopt.stages.predict`) re-ranks them.
    exact : bool
        Share a search only between subprograms whose weights are equal
        (when nothing is verified, nothing may rest on verification).
    """

    budget: Budget = DEFAULT_BUDGET
    converge_depth: int = DEFAULT_CONVERGE_DEPTH
    candidates: int = 32
    exact: bool = False

    def key(self) -> list:
        """What a stored search depends on besides its program. A search stored is one that ran with
        the whole ``states_per_search`` or completed within less (see
        :func:`~einopt.stages.partsearch.search_parts`), so the model's states and the deadline are
        not part of it: a search is shared across models."""
        b = self.budget
        return [FORMAT, b.max_depth, self.converge_depth, b.states_per_search, self.candidates, self.exact]

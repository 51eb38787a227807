"""The search (installed as ``einopt.search``): the rule registry turned into a superoptimizer.

:func:`search` explores math-changing rules breadth first, converges each state
toward operators guided by the expression distance, prunes by fingerprint and
cost, and returns ranked, fully instantiable candidates (see ``engine.py``),
within a :class:`Budget` of depth and generated states (``budget.py``).
The schedule (which rules, in which phase, under which restrictions) is data:
``schedule.py``, printable with ``einopt search --explain-schedule``.

``einopt.superoptimize(program, **kw)`` is :func:`search` (``einopt.search.search``).
"""

from einopt.search.budget import DEFAULT_MAX_DEPTH, Budget
from einopt.search.engine import (
    DEFAULT_CONVERGE_DEPTH,
    Candidate,
    RuleStats,
    SearchError,
    SearchResult,
    Stats,
    TraceStep,
    search,
)
from einopt.search.schedule import DEFAULT_SCHEDULE, Schedule, Use, explain

__all__ = [
    "Budget",
    "DEFAULT_CONVERGE_DEPTH",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_SCHEDULE",
    "Candidate",
    "RuleStats",
    "Schedule",
    "SearchError",
    "SearchResult",
    "Stats",
    "TraceStep",
    "Use",
    "explain",
    "search",
]

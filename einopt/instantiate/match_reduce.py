"""Matchers of reductions by sum and normalizations (ReduceMean, AveragePool, GlobalAveragePool, LayerNormalization).

(Being filled in.) This module must not import ``einopt.instantiate.match`` at module level:
that module imports this one for its table.
"""

from __future__ import annotations

from collections.abc import Callable

from einopt.core import ir
from einopt.instantiate.plan import MatchContext, OperatorMatch, Refusal

__all__ = ["REDUCE_MATCHERS", "REDUCE_PREFERRED"]

REDUCE_MATCHERS: dict[str, Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]] = {}
"""Matcher per name, in order of preference, tried where ``einopt.instantiate.match.MATCHERS`` places them."""

REDUCE_PREFERRED: dict[str, Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]] = {}
"""The matcher of each original ONNX operator type these matchers instantiate."""

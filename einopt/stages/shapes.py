"""Rewrites found at the representative values of a model's symbolic dimensions, checked at others.

The search and selection see the model pinned to one value of each symbolic dimension; a rewrite may
hold only there (a Reshape to the representative batch, a constant of its sequence length). Each
chosen rewrite is put alone into the output as it is written (symbolic dimensions declared again,
:meth:`StageContext.output`) and verified against the input model at every other value the context
checks (:class:`~einopt.stages.context.ShapeCheck`); one that fails, or that ONNX Runtime cannot run
there, is left out with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from einopt.stages.context import StageContext
from einopt.stages.select import LEFT_OUT
from einopt.stages.state import PartState, fill

__all__ = ["general_rewrites"]

log = logging.getLogger(__name__)


def general_rewrites(ctx: StageContext, states: Mapping[str, PartState]) -> dict[str, PartState]:
    """``states``, each chosen rewrite that does not hold at every checked shape ``dropped`` with the
    reason (acceptance then leaves it out). Selection rejects the trials that hold at the
    representative shape only when it verifies them (:meth:`StageContext.shape_specific`, memoised:
    those are not checked again); this catches what a backend's ``after_selection`` chose otherwise."""
    dropped: dict[str, str] = {}
    for name, s in states.items():
        if s.emitted is None:
            continue
        why = ctx.shape_specific(s.part.nodes, s.emitted)
        if why:
            dropped[name] = LEFT_OUT + why
            log.info("%s: %s", name, dropped[name])
    return fill(states, dropped=dropped)

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
from typing import TYPE_CHECKING

from einopt.runtime.verify import compare_models
from einopt.stages.context import StageContext
from einopt.stages.state import PartState, fill

if TYPE_CHECKING:
    from einopt.instantiate.emit import Instantiated

__all__ = ["general_rewrites", "shape_specific"]

log = logging.getLogger(__name__)


def shape_specific(ctx: StageContext, nodes: tuple[int, ...], inst: Instantiated) -> str:
    """Why the rewrite of the part at ``nodes`` by ``inst`` holds at the representative shape only
    (the first checked shape where the output with it alone differs from the input, or cannot run);
    "" when it holds at every shape the context checks."""
    if not ctx.checks:
        return ""
    alone = ctx.output({nodes: inst})
    for check in ctx.checks:
        agreement = compare_models(check.references, alone, check.datasets, ctx.tolerance)
        if not agreement.ok:
            return f"holds at the representative shape only (at {check.text()}: {agreement.message})"
    return ""


def general_rewrites(ctx: StageContext, states: Mapping[str, PartState]) -> dict[str, PartState]:
    """``states``, each chosen rewrite that does not hold at every checked shape ``dropped`` with the
    reason (acceptance then leaves it out). Selection already chose among the trials that hold
    (:func:`shape_specific`); this catches what was chosen after it (a backend's merged parts)."""
    dropped: dict[str, str] = {}
    for name, s in states.items():
        if s.emitted is None or not ctx.checks:
            continue
        why = shape_specific(ctx, s.part.nodes, s.emitted)
        if why:
            dropped[name] = f"left out: {why}"
            log.info("%s: %s", name, dropped[name])
    return fill(states, dropped=dropped)

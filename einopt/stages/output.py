"""The last stage: the output assembled from the rewrites acceptance kept, and verified whole against
the input model (:func:`verify_output`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import onnx

from einopt.stages.context import ShapeCheck, StageContext
from einopt.stages.state import PartState

__all__ = ["verify_output"]

log = logging.getLogger(__name__)


def verify_output(
    ctx: StageContext, states: Mapping[str, PartState]
) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The output: the prepared model with every kept rewrite in it, verified against the input model
    on every verification input, and at every other shape the context checks (the input itself when
    nothing is kept); and, when the assembled model differed from the input and every rewrite was
    rolled back, why each kept one was dropped."""
    kept = [s for s in states.values() if s.kept]
    if not kept:
        return ctx.original, {}
    out = ctx.output({s.part.nodes: s.emitted for s in kept})
    if not ctx.datasets:  # unverified (--no-verify)
        return out, {}
    here = ShapeCheck({}, ctx.datasets, ctx.references)  # the verification inputs themselves
    failed = ctx.first_failure(out, (here, *ctx.checks))
    if failed is None:
        return out, {}
    check, final = failed
    why = final.message + (f" at {check.text()}" if check is not here else "")
    log.warning("assembled model differs from the original (%s); rolling back every rewrite", why)
    return ctx.original, {s.name: f"rolled back with the whole model: {why}" for s in kept}

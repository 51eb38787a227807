"""Depth 0 on a model: every translated part instantiated again and assembled, as the pipeline does.

The matcher tests (``test_match_reduce``, ``test_match_max``) check that a one-node model comes
back as the operator it was, computing what it did in ONNX Runtime.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from test_importers import Case, build, run_ort

from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.instantiate.emit import instantiate, original_ops
from einopt.opsets import DEFAULT_DOMAINS, default_opset
from einopt.stages.export import assemble


def op_counts(nodes) -> collections.Counter:
    """The op types of ``nodes`` counted (every node of a custom domain as ``eop``)."""
    return collections.Counter(n.op_type if n.domain in DEFAULT_DOMAINS else "eop" for n in nodes)


def depth0(
    model: onnx.ModelProto, prefer: bool = True, every_part: bool = False
) -> tuple[onnx.ModelProto, collections.Counter]:
    """The model with every translated part instantiated again, and the op types emitted.

    ``prefer``: each part's original operators preferred (the pipeline at depth 0), else the table
    alone; ``every_part``: every part must have translated.
    """
    model = prepare(model, {}).model
    opset = default_opset(model)
    emitted, ops = {}, collections.Counter()
    for p in translate_graph(model):
        assert p.translated or not every_part, p.reason
        if not p.translated:
            continue
        inst = instantiate(
            p.program,
            onnx_names=p.names,
            constants=p.constants,
            opset=opset,
            prefix=p.name + "/",
            preferred=original_ops(model, p) if prefer else None,
        )
        emitted[p.nodes] = inst
        ops += op_counts(inst.nodes)
    return assemble(model, emitted), ops


def round_trip(
    case: Case, prefer: bool = True, rtol: float = 0.0, feeds: dict | None = None, every_part: bool = False
) -> collections.Counter:
    """Depth 0 on a one-node model: the emitted op types, whose output must be the original's in
    ONNX Runtime (exactly, or to ``rtol`` relative to the largest magnitude)."""
    model, random = build(case)
    feeds = feeds or random
    (want,) = run_ort(model, feeds)
    again, ops = depth0(model, prefer, every_part)
    onnx.checker.check_model(again, full_check=True)
    (got,) = run_ort(again, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(want)))))
    return ops

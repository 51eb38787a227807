"""The ONNX backend node suite and the shipped light models, end to end through `optimize`.

Every node case either optimizes to a model equal to the original in ONNX
Runtime within the case's tolerance, or passes through untouched; no case may
raise. `python scripts/onnx_suite.py` prints the counts.
"""

from __future__ import annotations

import os

import pytest
from onnx_suite_support import light_model, light_model_paths, node_cases, run_node_case

from einopt.pipeline import Options, optimize

CHUNKS = 12

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_node_suite(chunk):
    cases = node_cases()[chunk::CHUNKS]
    failures = []
    optimized = 0
    for case in cases:
        try:
            optimized += run_node_case(case).outcome == "optimized"
        except Exception as e:  # noqa: BLE001 - collect every failing case, not just the first
            failures.append(f"{case.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    # 408 of 1,884 cases optimize (18 to 48 per chunk): passing everything through is not a pass
    assert optimized >= 10, f"only {optimized} of {len(cases)} cases were translated and re-instantiated"


@pytest.mark.parametrize(
    "path", light_model_paths(), ids=lambda p: os.path.basename(p)[len("light_") : -len(".onnx")]
)
def test_light_model(path):
    model = light_model(path)
    result = optimize(model, Options(seed=1, accept="verified"))
    counts = result.counts()
    assert result.verified
    assert counts["translated"] > 0, result.report()["subprograms"]
    assert counts["rewritten"] + counts["unchanged"] == counts["subprograms"], result.report()["subprograms"]
    assert counts["failed"] == 0

"""Timing what ``optimize`` did: each rewritten subprogram on its own, and the whole model.

The whole-model comparison is :func:`einopt.runtime.bench.bench_models`; this module
adds the per-subprogram view: every rewritten part runs as two standalone
models (its original nodes, its new nodes) on the values that really reach it,
interleaved in one process, so the report can say which rewrite won or lost.

>>> result = optimize("model.onnx")                      # doctest: +SKIP
>>> report = benchmark_result(result, "model.onnx")       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from einopt.reports.result import Result, part_bench
from einopt.runtime import bench, modelio
from einopt.runtime.timing import configure_threads
from einopt.stages.verify import part_pairs


def measure_parts(
    result: Result,
    *,
    seed: int = 0,
    warmup: int = 2,
    min_runs: int = 10,
    max_runs: int = 100,
    budget_s: float = 20.0,
) -> dict[str, dict[str, float]]:
    """Time every subprogram in the output against its original nodes, side by side.

    Parts that measured acceptance already timed keep their timing; only the
    others (``accept="verified"``) are timed here.

    Parameters
    ----------
    result : Result
        What :func:`einopt.pipeline.optimize` returned.
    seed : int
        Seed of the random inputs when the result was not verified (verified
        results reuse their first verification inputs).
    warmup, min_runs, max_runs : int
        Per part, as in :func:`einopt.runtime.timing.time_interleaved`.
    budget_s : float
        Time budget for all parts together, shared equally.

    Returns
    -------
    dict
        ``{part name: {"original_ms", "optimized_ms", "speedup", ...}}`` for each part timed here.
    """
    ws = result.workspace
    timed = {p.name for p in result.parts if p.bench is not None}
    todo = [p for p in ws.parts if p.name not in timed] if ws is not None else []
    if not todo:
        return {}
    feeds = ws.feeds if ws.feeds is not None else modelio.random_inputs(ws.model, seed)
    per_part = budget_s / len(todo)
    timings: dict[str, dict[str, float]] = {}
    for pair in part_pairs(ws.model, todo, ws.emitted, feeds, epilogues=True, declared=ws.declared):
        t = bench.time_models(
            pair.original,
            pair.rewritten,
            pair.original_feeds,
            pair.rewritten_feeds,
            warmup=warmup,
            min_runs=min_runs,
            max_runs=max_runs,
            budget_s=per_part,
        )
        timings[pair.name] = part_bench(t)
    return timings


def benchmark_result(
    result: Result,
    source: str | Path | onnx.ModelProto,
    *,
    output: str = "",
    inputs: Mapping[str, np.ndarray] | str | Path | None = None,
    parts: bool = True,
    seed: int = 0,
    budget_s: float = 30.0,
    min_runs: int = 10,
    max_runs: int = 200,
    threads: int | None = None,
) -> dict:
    """The full report of an ``optimize`` run: per-part timings and the side-by-side model benchmark.

    Parameters
    ----------
    result : Result
        The optimization result.
    source : path or onnx.ModelProto
        The original model (what the optimized model is compared with).
    output : str
        Where the optimized model was written (shown in the report).
    inputs : mapping, path or None
        Benchmark inputs (an .npz path or arrays); None = seeded random inputs, of the shapes the
        model was searched and timed at (``result.shapes``: symbolic dimensions at their
        representative values).
    parts : bool
        Also time every rewritten subprogram on its own (:func:`measure_parts`).
    budget_s : float
        Time budget of the whole-model benchmark (the parts get half as much again).
    min_runs, max_runs, threads, seed
        As in :func:`einopt.runtime.bench.bench_models`.

    Returns
    -------
    dict
        The report (see :mod:`einopt.reports.report`), with ``bench`` filled.
    """
    configure_threads(threads)
    if parts:
        result = result.with_part_timings(measure_parts(result, seed=seed, budget_s=budget_s / 2))
    report = result.report()
    report["model"] = str(source) if not isinstance(source, onnx.ModelProto) else source.graph.name
    report["output"] = output
    if inputs is None and result.shapes:
        inputs = modelio.random_inputs(modelio.load_model(source), seed, result.shapes)
    report["bench"] = bench.bench_models(
        source,
        result.model,
        inputs,
        threads=threads,
        seed=seed,
        budget_s=budget_s,
        min_runs=min_runs,
        max_runs=max_runs,
    )
    return report

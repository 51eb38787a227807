"""Side-by-side timing of two ONNX models in ONNX Runtime, the way this machine must be measured.

Both models run in one process on one global thread pool (with per-session
pools, idle sessions' spinning threads take the cores from the active one),
interleaved round-robin after a warm-up, and their outputs are compared
before anything is timed. :func:`bench_models` returns the ``bench`` section
of einopt's report format (see :mod:`einopt.reports.report`); :func:`time_models`
times any two models the same way (acceptance in ``optimize`` uses it per
subprogram and for the whole model). The timing rules themselves are in
:mod:`einopt.runtime.timing`.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx

from einopt.core.cost import model_cost, value_bytes
from einopt.errors import ModelError, UnsupportedModelError
from einopt.opsets import check_opset
from einopt.runtime import modelio
from einopt.runtime.cache import CacheTrustError
from einopt.runtime.timing import (
    Comparison,
    Ratio,
    Timing,
    configure_threads,
    load_average,
    machine_info,
    sample_interleaved,
)
from einopt.runtime.verify import Tolerance, compare, first_line

log = logging.getLogger(__name__)


def profile_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], runs: int = 5) -> dict:
    """Kernels executed per run and median kernel time per op type (ms), from ONNX Runtime's profiler.

    The profiled session is separate from any timed one (profiling adds
    overhead); its first run (allocation, first touch) is dropped. Kernels
    are what ORT runs after its own fusions and layout passes, named by the
    ``op_name`` ORT reports: a Conv+Relu that ORT fused counts once (as
    ``FusedConv``, or ``Conv`` when it runs in the blocked NCHWc layout), and
    the layout conversions it inserted count as ``ReorderInput`` /
    ``ReorderOutput``. The trace file is deleted.

    Each generated kernel (einopt's ``TvmKernel``, ``--kernels tvm``) is also listed with what it
    achieved: its median time, the float32 bytes of its inputs and outputs over that time (GB/s) and
    its FLOPs (its ``flops`` attribute) over that time (GFLOP/s). The profiler's own overhead is in
    the time, so a kernel of a few microseconds reads slower than it runs.

    Returns
    -------
    dict
        ``{"kernels": median kernels per run, "time_by_op": {op: median ms per run},
        "generated_kernels": [{"node", "ms", "bytes", "flops", "gb_s", "gflop_s"}, ...]}`` (slowest first).
    """
    with tempfile.TemporaryDirectory(prefix="einopt-prof-") as tmp:
        sess = modelio.session(model, profile_prefix=os.path.join(tmp, "ort"))
        for _ in range(runs + 1):  # the first run (allocation, first-touch) is dropped below
            sess.run(None, dict(feeds))
        trace = sess.end_profiling()
        events = json.loads(Path(trace).read_text())
    # ORT writes each run's kernel events before the run's own event, so kernels are
    # assigned to runs by time: a kernel belongs to the model_run whose span contains it.
    runs_at = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    per_run: list[dict[str, float]] = [{} for _ in runs_at]
    kernels = [0 for _ in runs_at]
    generated: dict[str, list[float]] = {}
    moved: dict[str, int] = {}
    starts = [a for a, _ in runs_at]
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        k = bisect.bisect_right(starts, e["ts"]) - 1
        if k < 0 or e["ts"] > runs_at[k][1]:
            continue
        op = e.get("args", {}).get("op_name", "?")
        per_run[k][op] = per_run[k].get(op, 0.0) + e.get("dur", 0) / 1e3
        kernels[k] += 1
        if op == GENERATED_OP and k > 0:
            node = str(e["name"])[: -len("_kernel_time")]
            generated.setdefault(node, []).append(e.get("dur", 0) / 1e3)
            moved[node] = _float_bytes(e["args"])
    per_run, kernels = per_run[1:] or per_run, kernels[1:] or kernels
    flops = {
        n.name: next((a.i for a in n.attribute if a.name == "flops"), 0)
        for n in model.graph.node
        if n.op_type == GENERATED_OP
    }
    achieved = []
    for node, times in generated.items():
        ms = float(np.median(times))
        f = flops.get(node, 0)
        achieved.append(
            {
                "node": node,
                "ms": ms,
                "bytes": moved[node],
                "flops": f,
                "gb_s": moved[node] / ms / 1e6 if ms else None,
                "gflop_s": f / ms / 1e6 if ms else None,
            }
        )
    achieved.sort(key=lambda a: -a["ms"])
    ops = sorted({op for r in per_run for op in r})
    return {
        "kernels": int(statistics.median(kernels)) if kernels else 0,
        "time_by_op": {op: float(np.median([r.get(op, 0.0) for r in per_run])) for op in ops},
        "generated_kernels": achieved,
    }


GENERATED_OP = "TvmKernel"
"""The op type of einopt's generated kernels (``einopt.backends.tvm.kernels.OP_TYPE``)."""


def _float_bytes(args: Mapping) -> int:
    """Bytes of the float32 inputs and outputs of a profiled node."""
    total = 0
    for key in ("input_type_shape", "output_type_shape"):
        for entry in args.get(key, []):
            for dtype, shape in entry.items():
                if dtype == "float":
                    total += 4 * math.prod(shape)
    return total


def _signature(model: onnx.ModelProto) -> dict[tuple[str, str], onnx.ValueInfoProto]:
    """The fed inputs and the outputs, in order, by ``("input" or "output", name)``."""
    inits = {t.name for t in model.graph.initializer}
    fed = [("input", i) for i in model.graph.input if i.name not in inits]
    return {(kind, v.name): v for kind, v in [*fed, *(("output", o) for o in model.graph.output)]}


def _signature_difference(original: onnx.ModelProto, optimized: onnx.ModelProto) -> str:
    """How the models' inputs and outputs differ in names, element types or order, in words ('' if not)."""
    a, b = _signature(original), _signature(optimized)

    def elem(v: onnx.ValueInfoProto) -> int:
        return v.type.tensor_type.elem_type

    differences = [
        f"{_value_text(k, v)} vs {_value_text(k, b[k])}"
        for k, v in a.items()
        if k in b and elem(v) != elem(b[k])
    ]
    differences += [f"{_value_text(k, v)} is only in the original" for k, v in a.items() if k not in b]
    differences += [f"{_value_text(k, v)} is only in the optimized model" for k, v in b.items() if k not in a]
    if not differences and list(a) != list(b):

        def order(sig: dict) -> str:
            return ", ".join(f"{kind}s {[n for k, n in sig if k == kind]}" for kind in ("input", "output"))

        differences = [f"the same names in another order: {order(a)} vs {order(b)}"]
    return "; ".join(differences)


def _value_text(key: tuple[str, str], v: onnx.ValueInfoProto) -> str:
    """``input 'x' float32[1,3,224,224]`` (symbolic dims by name, unknown ones as ``?``)."""
    t = v.type.tensor_type
    if not v.type.HasField("tensor_type"):
        return f"{key[0]} {key[1]!r} ({v.type.WhichOneof('value') or 'untyped'})"
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
    except (KeyError, ValueError, TypeError):
        dtype = onnx.TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "untyped"
    dims = ",".join(
        d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in t.shape.dim
    )
    return f"{key[0]} {key[1]!r} {dtype}" + (f"[{dims}]" if t.HasField("shape") else "[?]")


def _feeds(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray] | str | Path | None, seed: int) -> dict:
    if inputs is None:
        return modelio.random_inputs(model, seed)
    if isinstance(inputs, str | Path):
        return modelio.load_inputs(inputs, model)
    feeds = {k: np.asarray(v) for k, v in inputs.items()}
    declared = {i.name for i in model.graph.input}
    required = [i.name for i in modelio.feed_inputs(model)]
    unknown = sorted(set(feeds) - declared)
    missing = [n for n in required if n not in feeds]
    if unknown or missing:
        raise ModelError(
            f"the inputs do not fit the model: unknown names {unknown}, missing {missing} "
            f"(the model's inputs are {required})"
        )
    return feeds


def _stats(model: onnx.ModelProto, timing: Timing | None, profile: dict) -> dict:
    cost = model_cost(model)
    t = (
        dataclasses.asdict(timing)
        if timing
        else {k: None for k in ("median_ms", "p10_ms", "p90_ms", "min_ms")}
    )
    t.pop("runs", None)
    return t | {
        "nodes": len(model.graph.node),
        "kernels": profile.get("kernels", 0),
        "flops": cost.flops,
        "bytes": cost.bytes,
        "time_by_op": profile.get("time_by_op", {}),
        "generated_kernels": profile.get("generated_kernels", []),
    }


def _footprint(model: onnx.ModelProto) -> int:
    """An upper bound of a session's memory: every tensor and every value of known shape at once."""
    return modelio.total_tensor_bytes(model) + sum(value_bytes(model).values())


def _run_blocked(
    sessions: Mapping[str, Callable[[], Callable[[], object]]], min_runs: int, max_runs: int, budget_s: float
) -> dict[str, list[float]]:
    """Alternate whole blocks of runs, holding one session at a time (``sessions``: name -> factory).

    Each block starts with one untimed run; the first timed run sizes the blocks (a quarter of
    the budget each, at least two blocks and ``min_runs`` runs per model).
    """
    samples: dict[str, list[float]] = {n: [] for n in sessions}
    names = list(sessions)
    per_block, blocks, b = 0, 2, 0
    while b < blocks:
        for n in names[b % 2 :] + names[: b % 2]:
            run = sessions[n]()
            run()  # warm-up: allocation, first touch
            while len(samples[n]) < (b + 1) * max(per_block, 1):
                t = time.perf_counter()
                run()
                samples[n].append(time.perf_counter() - t)
                if not per_block:
                    per_block = max(1, min(max_runs, int(budget_s / 4 / max(samples[n][0], 1e-6))))
                    blocks = max(2, -(-min_runs // per_block))
            del run
        b += 1
    return samples


def time_models(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    before_feeds: Mapping[str, np.ndarray],
    after_feeds: Mapping[str, np.ndarray] | None = None,
    *,
    warmup: int = 3,
    min_runs: int = 10,
    max_runs: int = 200,
    budget_s: float = 20.0,
) -> Comparison:
    """Time two models side by side in ONNX Runtime: ``speedup`` is how much faster ``after`` is.

    Both sessions join the process's thread pool (:func:`einopt.runtime.timing.configure_threads`)
    and run interleaved round-robin (:func:`einopt.runtime.timing.sample_interleaved`); the
    comparison carries the per-round ratios' interval (:class:`einopt.runtime.timing.Ratio`).
    When holding both sessions at once would take more than half of the
    memory available (Longformer at batch 16 needs about 8 GB per session),
    they run in alternating blocks instead, one session alive at a time:
    slower to measure, but the same medians.

    Parameters
    ----------
    before, after : onnx.ModelProto
        The models (same outputs).
    before_feeds, after_feeds : mapping
        What each runs on (``after_feeds`` defaults to ``before_feeds``).
    warmup, min_runs, max_runs, budget_s
        As in :func:`einopt.runtime.timing.time_interleaved`.
    """
    configure_threads()
    fa = dict(before_feeds)
    fb = dict(after_feeds) if after_feeds is not None else fa
    load = load_average()
    available = modelio.available_bytes()
    if available is not None and _footprint(before) + _footprint(after) > available // 2:
        log.info("timing in blocks, one session at a time (the two models do not fit in memory together)")

        def factory(model: onnx.ModelProto, feeds: dict) -> Callable[[], Callable[[], object]]:
            def make() -> Callable[[], object]:
                sess = modelio.session(model)
                return lambda: sess.run(None, feeds)

            return make

        t0 = time.perf_counter()
        samples = _run_blocked(
            {"before": factory(before, fa), "after": factory(after, fb)}, min_runs, max_runs, budget_s
        )
        log.debug("blocked timing took %.1f s", time.perf_counter() - t0)
        return Comparison(Timing.of(samples["before"]), Timing.of(samples["after"]), 1, load)
    sa, sb = modelio.session(before), modelio.session(after)
    samples, rounds = sample_interleaved(
        {"before": lambda: sa.run(None, fa), "after": lambda: sb.run(None, fb)},
        warmup=warmup,
        min_runs=min_runs,
        max_runs=max_runs,
        budget_s=budget_s,
    )
    s, a = samples["before"], samples["after"]
    return Comparison(Timing.of(s), Timing.of(a), rounds, load, ratio=Ratio.of(s, a))


def bench_models(
    original: str | Path | onnx.ModelProto,
    optimized: str | Path | onnx.ModelProto,
    inputs: Mapping[str, np.ndarray] | str | Path | None = None,
    *,
    threads: int | None = None,
    seed: int = 0,
    warmup: int = 3,
    min_runs: int = 10,
    max_runs: int = 200,
    budget_s: float = 30.0,
    tolerance: Tolerance | None = None,
    force: bool = False,
) -> dict:
    """Compare two models' outputs, then time them side by side.

    Parameters
    ----------
    original, optimized : path or onnx.ModelProto
        The models; they must have the same fed inputs and outputs (names and element types).
    inputs : mapping, .npz path or None
        What to run on (None: seeded standard-normal inputs).
    threads : int, optional
        Intra-op threads of the global pool (see :func:`configure_threads`).
    warmup, min_runs, max_runs, budget_s
        As in :func:`time_interleaved`.
    tolerance : Tolerance
        For the equality check (default: the verification tolerance).
    force : bool
        Time the models even when their outputs differ.

    Returns
    -------
    dict
        The ``bench`` section of the report: machine, equal, max_error,
        message, runs, warmup, original/optimized statistics and speedup
        (timing fields None when the models differ and ``force`` is off).

    Raises
    ------
    ModelError
        The models' signatures differ, or the inputs do not fit them.
    UnsupportedModelError
        A model's default-domain opset is one einopt does not support.
    """
    n = configure_threads(threads)
    a, b = modelio.load_model(original), modelio.load_model(optimized)
    for model, source in ((a, original), (b, optimized)):
        check_opset(model, "a model" if isinstance(source, onnx.ModelProto) else str(source))
    difference = _signature_difference(a, b)
    if difference:
        raise ModelError(f"the models have different inputs or outputs: {difference}")
    feeds = _feeds(a, inputs, seed)
    try:
        ref = modelio.run(modelio.session(a, arena=False), feeds)
        got = modelio.run(modelio.session(b, arena=False), feeds)
    except (ModelError, UnsupportedModelError, CacheTrustError):  # einopt's own answers, as they are
        raise
    except Exception as e:  # noqa: BLE001 - ORT's errors have many types; wrong inputs are the usual cause
        raise ModelError(f"ONNX Runtime cannot run the models on these inputs: {first_line(e)}") from e
    check = compare(ref, got, tolerance or Tolerance())
    del ref, got
    section: dict = {
        "machine": machine_info(n),
        "equal": check.ok,
        "max_error": check.max_abs_error,
        "message": check.message,
        "runs": 0,
        "warmup": warmup,
        "warmup_rounds": 0,
        "unreliable": "",
    }
    timed: Comparison | None = None
    if check.ok or force:
        timed = time_models(
            a, b, feeds, warmup=warmup, min_runs=min_runs, max_runs=max_runs, budget_s=budget_s
        )
        section["runs"] = min(timed.before.runs, timed.after.runs)
        section["warmup_rounds"] = timed.warmup_rounds
        section["unreliable"] = timed.unreliable()
    timings = {"original": timed.before, "optimized": timed.after} if timed else {}
    for key, model in (("original", a), ("optimized", b)):
        profile = profile_model(model, feeds) if timings else {}
        section[key] = _stats(model, timings.get(key), profile)
    # the median of the per-round ratios (drift cancels in a round), inside its own 95% interval
    section["speedup"] = timed.speedup if timed else None
    section["speedup_95"] = list(timed.gain_interval) if timed else None
    return section

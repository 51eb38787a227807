"""Side-by-side timing of two ONNX models in ONNX Runtime, the way this machine must be measured.

Both models run in one process on one global thread pool (with per-session
pools, idle sessions' spinning threads take the cores from the active one),
interleaved round-robin after a warm-up, and their outputs are compared
before anything is timed. :func:`bench_models` returns the ``bench`` section
of einopt's report format (see :mod:`einopt.report`); :func:`time_interleaved`
times any callables the same way (``einopt.measure`` uses it per subprogram).
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from einopt import modelio
from einopt.cost import model_cost
from einopt.errors import ModelError
from einopt.verify import Tolerance, compare, first_line

_STATE: dict[str, object] = {"threads": None, "pool": None}


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure_threads(threads: int | None = None) -> int:
    """Put every ONNX Runtime session einopt creates from now on into one global thread pool.

    Call it once, early; later calls keep the first configuration and return
    its thread count (ONNX Runtime builds its global pools once per process:
    a second ``set_global_thread_pool_sizes`` fails with "Global thread pools
    have already been created"). Measured with ONNX Runtime 1.31: it need not
    come before the process's first ``InferenceSession``; sessions created
    afterwards with ``use_per_session_threads=False`` join the global pool.
    If the pools were already created by other code, they are used as they
    are. Should a runtime refuse sessions on the global pool, einopt falls
    back to per-session pools of ``threads`` intra-op threads and the machine
    info says ``"thread_pool": "per-session"``.

    Once the global pools exist, ONNX Runtime refuses any session in the
    process that asks for threads of its own: code that creates sessions
    itself after benchmarking must set ``use_per_session_threads = False``
    (:func:`einopt.modelio.session` does). With the environment variable
    ``EINOPT_THREAD_POOL=per-session`` einopt leaves the process alone and
    uses per-session pools with spinning turned off instead (the tests do).

    Parameters
    ----------
    threads : int, optional
        Intra-op threads (default: the cores this process may run on).

    Returns
    -------
    int
        The intra-op thread count in effect.
    """
    if _STATE["threads"] is not None:
        return int(_STATE["threads"])
    n = threads or _cores()
    mode = os.environ.get("EINOPT_THREAD_POOL", "global")
    if mode not in ("global", "per-session"):
        raise ValueError(f"EINOPT_THREAD_POOL must be 'global' or 'per-session', not {mode!r}")
    if mode == "per-session":
        _STATE["threads"], _STATE["pool"] = n, "per-session"
        return n
    from onnxruntime.capi import _pybind_state

    try:
        _pybind_state.set_global_thread_pool_sizes(n, 1)
    except Exception:  # noqa: BLE001 - pools already created by other code: the probe below decides
        pass
    _STATE["threads"] = n
    _STATE["pool"] = "global"
    try:
        modelio.session(_probe_model())
    except Exception:  # noqa: BLE001 - any refusal means: no global pool in this process
        _STATE["pool"] = "per-session"
    return n


def thread_options() -> dict[str, object]:
    """How :func:`einopt.modelio.session` should set up threads (empty before :func:`configure_threads`)."""
    if _STATE["pool"] == "global":
        return {"global_pool": True}
    if _STATE["pool"] == "per-session":
        return {"threads": _STATE["threads"]}
    return {}


def _probe_model() -> onnx.ModelProto:
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "probe",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int) -> dict:
    """What the timings depend on: runtime version, CPU, threads, load at the start."""
    try:
        version = importlib.metadata.version("einopt")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "onnxruntime": ort.__version__,
        "cpu": _cpu_model(),
        "threads": threads,
        "cores": os.cpu_count() or 1,
        "thread_pool": _STATE["pool"] or "per-session",
        "python": platform.python_version(),
        "einopt": version,
        "platform": platform.platform(),
        "load_average": load,
    }


@dataclasses.dataclass(frozen=True)
class Timing:
    """Milliseconds per call: median, 10th and 90th percentiles, best; and how many calls were timed."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    runs: int

    @classmethod
    def of(cls, seconds: list[float]) -> Timing:
        ms = np.asarray(seconds) * 1e3
        return cls(
            float(np.median(ms)),
            float(np.percentile(ms, 10)),
            float(np.percentile(ms, 90)),
            float(ms.min()),
            len(ms),
        )


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    min_runs: int = 10,
    max_runs: int = 200,
    budget_s: float = 20.0,
) -> dict[str, Timing]:
    """Time callables round-robin (the first of each round rotates) until the budget is spent.

    Parameters
    ----------
    fns : mapping
        Name -> callable without arguments.
    warmup : int
        Untimed calls of each callable first.
    min_runs, max_runs : int
        Timed calls per callable: at least ``min_runs`` (even past the
        budget), at most ``max_runs``.
    budget_s : float
        Seconds of timed calls after which no new round starts.

    Returns
    -------
    dict
        Name -> :class:`Timing`.
    """
    if not fns:
        return {}
    if min_runs < 1 or max_runs < min_runs:
        raise ValueError(f"need 1 <= min_runs <= max_runs, got {min_runs}, {max_runs}")
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for k in range(max_runs):
        if k >= min_runs and time.perf_counter() - start >= budget_s:
            break
        order = names[k % len(names) :] + names[: k % len(names)]
        for n in order:
            t = time.perf_counter()
            fns[n]()
            samples[n].append(time.perf_counter() - t)
    return {n: Timing.of(s) for n, s in samples.items()}


def profile_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], runs: int = 5) -> dict:
    """Kernels executed per run and median kernel time per op type (ms), from ONNX Runtime's profiler.

    The profiled session is separate from any timed one (profiling adds
    overhead); its first run (allocation, first touch) is dropped. Kernels
    are what ORT runs after its own fusions and layout passes, named by the
    ``op_name`` ORT reports: a Conv+Relu that ORT fused counts once (as
    ``FusedConv``, or ``Conv`` when it runs in the blocked NCHWc layout), and
    the layout conversions it inserted count as ``ReorderInput`` /
    ``ReorderOutput``. The trace file is deleted.

    Returns
    -------
    dict
        ``{"kernels": median kernels per run, "time_by_op": {op: median ms per run}}``.
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
    per_run, kernels = per_run[1:] or per_run, kernels[1:] or kernels
    ops = sorted({op for r in per_run for op in r})
    return {
        "kernels": int(statistics.median(kernels)) if kernels else 0,
        "time_by_op": {op: float(np.median([r.get(op, 0.0) for r in per_run])) for op in ops},
    }


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
    }


def _time_sessions(sa, sb, feeds, warmup: int, min_runs: int, max_runs: int, budget_s: float):
    return time_interleaved(
        {"original": lambda: sa.run(None, feeds), "optimized": lambda: sb.run(None, feeds)},
        warmup=warmup,
        min_runs=min_runs,
        max_runs=max_runs,
        budget_s=budget_s,
    )


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
    """
    n = configure_threads(threads)
    a, b = modelio.load_model(original), modelio.load_model(optimized)
    difference = _signature_difference(a, b)
    if difference:
        raise ModelError(f"the models have different inputs or outputs: {difference}")
    feeds = _feeds(a, inputs, seed)
    sa, sb = modelio.session(a), modelio.session(b)
    try:
        ref, got = modelio.run(sa, feeds), modelio.run(sb, feeds)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - ORT's errors have many types; wrong inputs are the usual cause
        raise ModelError(f"ONNX Runtime cannot run the models on these inputs: {first_line(e)}") from e
    check = compare(ref, got, tolerance or Tolerance())
    section: dict = {
        "machine": machine_info(n),
        "equal": check.ok,
        "max_error": check.max_abs_error,
        "message": check.message,
        "runs": 0,
        "warmup": warmup,
    }
    timings: dict[str, Timing] = {}
    if check.ok or force:
        timings = _time_sessions(sa, sb, feeds, warmup, min_runs, max_runs, budget_s)
        section["runs"] = timings["original"].runs
    del sa, sb  # free both before profiling
    for key, model in (("original", a), ("optimized", b)):
        profile = profile_model(model, feeds) if timings else {}
        section[key] = _stats(model, timings.get(key), profile)
    o, p = section["original"]["median_ms"], section["optimized"]["median_ms"]
    section["speedup"] = o / p if o and p else None
    return section

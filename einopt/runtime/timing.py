"""Timing on this machine, the one way einopt measures: one thread pool, interleaved rounds, medians.

Every timing einopt makes goes through here: the per-subprogram acceptance
of ``optimize``, its whole-model check, ``optimize --bench`` and ``einopt
bench``. The rules (cpu-measurements.md):

- Every ONNX Runtime session of the process joins one global thread pool
  (:func:`configure_threads`); with per-session pools, idle sessions' threads
  spin and take the cores from the active one.
- Variants run round-robin, the first of each round rotating, after a
  warm-up that lasts until consecutive rounds agree (:func:`time_interleaved`).
- Medians decide; the p10-p90 spread and the load average say how far to
  trust them (:func:`reliability`), and every report says so.

This module imports nothing of einopt's, so the model I/O (which needs the
thread set-up) can import it without a circle.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

NOISE_BAND = 0.05
"""Ratios within ``1 +- NOISE_BAND`` are ties on this machine (identical models read 0.95-1.05)."""

MODEL_NOISE = 0.02
"""The whole-model band: an output is kept only when it is faster than the input by more than this, 95%
confident (a byte-identical copy of a 2-40 ms model reads 0.99-1.02x over 300 interleaved runs)."""

MAX_SPREAD = 1.5
"""A variant whose p90 / p10 exceeds this was disturbed while it ran."""

MAX_LOAD = 1.5
"""A 1-minute load average above this many times the cores means other work was running (einopt's own
timing threads count in it: back-to-back benchmarks on 2 cores read about 2.0-2.3 alone)."""

_STATE: dict[str, object] = {"threads": None, "pool": None}


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure_threads(threads: int | None = None) -> int:
    """Put every ONNX Runtime session einopt creates from now on into one global thread pool.

    Call it once, early; later calls keep the first configuration and return
    its thread count (ONNX Runtime builds its global pools once per process:
    a second ``set_global_thread_pool_sizes`` fails with "Global thread pools
    have already been created"). Sessions created afterwards with
    ``use_per_session_threads=False`` join the global pool. If the pools were
    already created by other code, they are used as they are. Should a runtime
    refuse sessions on the global pool, einopt falls back to per-session pools
    of ``threads`` intra-op threads and the machine info says
    ``"thread_pool": "per-session"``.

    Once the global pools exist, ONNX Runtime refuses any session in the
    process that asks for threads of its own: code that creates sessions
    itself after benchmarking must set ``use_per_session_threads = False``
    (:func:`einopt.runtime.modelio.session` does). With the environment variable
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
    n = threads or cores()
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
        _probe_global_pool()
    except Exception:  # noqa: BLE001 - any refusal means: no global pool in this process
        _STATE["pool"] = "per-session"
    return n


def thread_options() -> dict[str, object]:
    """How :func:`einopt.runtime.modelio.session` should set up threads (empty before :func:`configure_threads`)."""
    if _STATE["pool"] == "global":
        return {"global_pool": True}
    if _STATE["pool"] == "per-session":
        return {"threads": _STATE["threads"]}
    return {}


def _probe_global_pool() -> None:
    import onnx
    import onnxruntime as ort

    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "probe",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.use_per_session_threads = False
    ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])


def cpu_model() -> str:
    """The CPU's model name (timings are only comparable on the same one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def machine_info(threads: int) -> dict:
    """What the timings depend on: runtime version, CPU, threads, load at the start."""
    import onnxruntime as ort

    try:
        version = importlib.metadata.version("einopt")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        load = None
    return {
        "onnxruntime": ort.__version__,
        "cpu": cpu_model(),
        "threads": threads,
        "cores": os.cpu_count() or 1,
        "thread_pool": _STATE["pool"] or "per-session",
        "python": platform.python_version(),
        "einopt": version,
        "platform": platform.platform(),
        "load_average": load,
    }


def environment_key() -> dict[str, object]:
    """What a cached timing is only valid for: ONNX Runtime's version, the CPU, the threads."""
    import onnxruntime as ort

    return {"onnxruntime": ort.__version__, "cpu": cpu_model(), "threads": configure_threads()}


@dataclasses.dataclass(frozen=True)
class Timing:
    """Milliseconds per call: median, 10th and 90th percentiles, best; how many calls were timed; and
    the median's 95% confidence interval (None in timings cached before einopt recorded it)."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    runs: int
    median_low_ms: float | None = None
    median_high_ms: float | None = None

    @classmethod
    def of(cls, seconds: list[float]) -> Timing:
        ms = np.sort(np.asarray(seconds) * 1e3)
        low, high = median_interval(len(ms))
        return cls(
            float(np.median(ms)),
            float(np.percentile(ms, 10)),
            float(np.percentile(ms, 90)),
            float(ms[0]),
            len(ms),
            float(ms[low]),
            float(ms[high]),
        )

    @property
    def interval(self) -> tuple[float, float]:
        """Where the true median lies, 95% confident (p10-p90 for a timing cached without it)."""
        if self.median_low_ms is None or self.median_high_ms is None:
            return self.p10_ms, self.p90_ms
        return self.median_low_ms, self.median_high_ms

    @property
    def spread(self) -> float:
        """p90 / p10: 1.0 for a perfectly steady variant."""
        return self.p90_ms / self.p10_ms if self.p10_ms > 0 else float("inf")


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``before / after`` of each interleaved round (one run of each variant, back to back): their
    median and the median's 95% confidence interval.

    Pairs taken in the same round share whatever the machine was doing then, so a slow stretch
    (another process, a frequency change) moves both sides of a pair and cancels in its ratio:
    the interval of paired ratios is what a whole-model decision rests on.
    """

    median: float
    low: float
    high: float
    pairs: int

    @classmethod
    def of(cls, before: Sequence[float], after: Sequence[float]) -> Ratio:
        """The ratios of ``before[k] / after[k]`` (equal lengths, one entry per round)."""
        if len(before) != len(after) or not before:
            raise ValueError(f"need equal, non-empty sample lists, got {len(before)} and {len(after)}")
        r = np.sort(np.asarray(before, dtype=float) / np.maximum(np.asarray(after, dtype=float), 1e-12))
        low, high = median_interval(len(r))
        return cls(float(np.median(r)), float(r[low]), float(r[high]), len(r))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Two variants timed side by side: ``speedup = before.median / after.median``; ``ratio``, when the
    variants ran interleaved, summarises the per-round ratios (None for timings made in blocks, or
    cached before einopt recorded it)."""

    before: Timing
    after: Timing
    warmup_rounds: int = 0
    load_average: float | None = None
    cached: bool = False
    ratio: Ratio | None = None

    @property
    def speedup(self) -> float:
        """``before / after``: the median of the per-round ratios when the variants ran interleaved
        (the figure :attr:`gain_interval` is the interval of, so the two always agree), else the
        ratio of the medians."""
        if self.ratio is not None:
            return self.ratio.median
        return self.before.median_ms / self.after.median_ms if self.after.median_ms > 0 else float("inf")

    @property
    def gain_interval(self) -> tuple[float, float]:
        """Where the true speedup lies, 95% confident: the paired ratios' interval, or without pairs
        the widest ratio the two medians' intervals allow (a stricter test)."""
        if self.ratio is not None:
            return self.ratio.low, self.ratio.high
        (b_low, b_high), (a_low, a_high) = self.before.interval, self.after.interval
        return b_low / a_high if a_high > 0 else float("inf"), b_high / a_low if a_low > 0 else float("inf")

    def confirms(self, band: float) -> bool:
        """``after`` is faster than ``before`` beyond ``band``, with 95% confidence: the whole of
        :attr:`gain_interval` lies above ``1 + band``."""
        return self.gain_interval[0] > 1.0 + band

    def faster(self, band: float = NOISE_BAND) -> bool:
        """``after`` is faster than ``before`` beyond the noise band."""
        return self.speedup >= 1.0 + band

    def separated(self, band: float = NOISE_BAND) -> bool:
        """``after`` is faster beyond the noise band at both ends of the medians' confidence intervals:
        the high end of its median's beats the low end of ``before``'s. A disturbed timing's spread widens
        those intervals, but cannot explain such a gap away: it still proves ``after`` faster."""
        return self.after.interval[1] * (1.0 + band) <= self.before.interval[0]

    def unreliable(self) -> str:
        """Why this measurement should not be trusted ("" when nothing is wrong)."""
        return reliability({"before": self.before, "after": self.after}, self.load_average)

    def stored(self) -> dict:
        """Everything measured, as JSON values (:meth:`from_stored` reads it back, cached)."""
        return {
            "before": dataclasses.asdict(self.before),
            "after": dataclasses.asdict(self.after),
            "warmup_rounds": self.warmup_rounds,
            "load_average": self.load_average,
            "ratio": dataclasses.asdict(self.ratio) if self.ratio is not None else None,
        }

    @classmethod
    def from_stored(cls, d: Mapping, cached: bool = False) -> Comparison:
        """A comparison from :meth:`stored` (one without ``ratio`` was stored before einopt paired runs)."""
        ratio = Ratio(**d["ratio"]) if d.get("ratio") else None
        return cls(
            Timing(**d["before"]),
            Timing(**d["after"]),
            d["warmup_rounds"],
            d["load_average"],
            cached=cached,
            ratio=ratio,
        )

    def as_dict(self) -> dict:
        return {
            "before_ms": self.before.median_ms,
            "after_ms": self.after.median_ms,
            "before_p10_p90_ms": [self.before.p10_ms, self.before.p90_ms],
            "after_p10_p90_ms": [self.after.p10_ms, self.after.p90_ms],
            "before_median_95_ms": list(self.before.interval),
            "after_median_95_ms": list(self.after.interval),
            "runs": min(self.before.runs, self.after.runs),
            "speedup": self.speedup,
            "speedup_95": list(self.gain_interval),
            "paired": self.ratio is not None,
            "cached": self.cached,
            "unreliable": self.unreliable(),
        }


def reliability(timings: Mapping[str, Timing], load: float | None, n_cores: int | None = None) -> str:
    """Why timings should not be trusted: a variant's spread, or a busy machine ("" when all is well).

    Parameters
    ----------
    timings : mapping
        Name -> :class:`Timing`.
    load : float or None
        The 1-minute load average when timing started (flagged above :data:`MAX_LOAD` x cores).
    n_cores : int, optional
        Cores of the machine (default: this process's).
    """
    why = [
        f"{name} spread p90/p10 = {t.spread:.2f} > {MAX_SPREAD}"
        for name, t in timings.items()
        if t.spread > MAX_SPREAD
    ]
    n = n_cores or cores()
    if load is not None and load > MAX_LOAD * n:
        why.append(f"load average {load:.2f} above {MAX_LOAD:g}x the {n} cores when timing started")
    return "; ".join(why)


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    max_warmup: int = 30,
    min_runs: int = 10,
    max_runs: int = 200,
    budget_s: float = 20.0,
) -> tuple[dict[str, Timing], int]:
    """Time callables round-robin (the first of each round rotates) until the budget is spent: a
    :class:`Timing` per callable of what :func:`sample_interleaved` measured, and the warm-up rounds."""
    samples, rounds = sample_interleaved(
        fns, warmup=warmup, max_warmup=max_warmup, min_runs=min_runs, max_runs=max_runs, budget_s=budget_s
    )
    return {n: Timing.of(s) for n, s in samples.items()}, rounds


def sample_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    max_warmup: int = 30,
    min_runs: int = 10,
    max_runs: int = 200,
    budget_s: float = 20.0,
) -> tuple[dict[str, list[float]], int]:
    """Time callables round-robin (the first of each round rotates) until the budget is spent.

    Parameters
    ----------
    fns : mapping
        Name -> callable without arguments.
    warmup : int
        Untimed rounds first, at least.
    max_warmup : int
        Untimed rounds at most: warm-up goes on while a callable's last call
        differs from its previous one by more than the noise band (caches,
        allocation, CPU frequency settling), within a quarter of the budget.
    min_runs, max_runs : int
        Timed calls per callable: at least ``min_runs`` (even past the
        budget), at most ``max_runs``.
    budget_s : float
        Seconds of timed calls after which no new round starts.

    Returns
    -------
    (dict, int)
        Name -> seconds per call, one sample per timed round (the same count for every callable,
        so ``samples[a][k]`` and ``samples[b][k]`` ran back to back), and the warm-up rounds run.
    """
    if not fns:
        return {}, 0
    if min_runs < 1 or max_runs < min_runs:
        raise ValueError(f"need 1 <= min_runs <= max_runs, got {min_runs}, {max_runs}")
    names = list(fns)
    last: dict[str, float] = {}
    rounds = 0
    start = time.perf_counter()
    while rounds < max(warmup, 0) or (
        rounds < max_warmup and warmup > 0 and time.perf_counter() - start < budget_s / 4
    ):
        steady = True
        for n in names:
            t = time.perf_counter()
            fns[n]()
            dt = time.perf_counter() - t
            if n not in last or abs(dt - last[n]) > NOISE_BAND * max(last[n], 1e-9):
                steady = False
            last[n] = dt
        rounds += 1
        if rounds >= warmup and steady:
            break
    # A sample of a call shorter than MIN_SAMPLE_S is the mean of back-to-back calls lasting about
    # that long: single sub-millisecond calls are mostly timer and scheduler jitter.
    repeat = {
        n: min(MAX_REPEAT, max(1, math.ceil(MIN_SAMPLE_S / max(last.get(n, 1.0), 1e-9)))) for n in names
    }
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for k in range(max_runs):
        if k >= min_runs and time.perf_counter() - start >= budget_s:
            break
        order = names[k % len(names) :] + names[: k % len(names)]
        for n in order:
            fn, times = fns[n], repeat[n]
            t = time.perf_counter()
            for _ in range(times):
                fn()
            samples[n].append((time.perf_counter() - t) / times)
    return samples, rounds


def median_interval(n: int, z: float = 1.96) -> tuple[int, int]:
    """Indices into ``n`` sorted samples that bound their median, 95% confident (``z``), whatever the
    distribution: the order statistics of the binomial's normal approximation (the whole range for a
    handful of samples)."""
    if n < 1:
        raise ValueError("no samples")
    half = z * math.sqrt(n) / 2
    return max(0, math.floor(n / 2 - half) - 1), min(n - 1, math.ceil(n / 2 + half))


MIN_SAMPLE_S = 1e-3
"""Shortest span one timing sample covers (a faster call is repeated back to back within a sample)."""
MAX_REPEAT = 100

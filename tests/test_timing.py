"""einopt.runtime.timing: interleaving, warm-up, reliability flags, the thread pool. No timing ratio is asserted."""

from __future__ import annotations

import numpy as np
import pytest

from einopt.runtime import timing
from einopt.runtime.timing import Comparison, Timing


def test_time_interleaved_rotates_and_respects_run_limits(monkeypatch):
    monkeypatch.setattr(timing, "MIN_SAMPLE_S", 0.0)  # one call per sample
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    t, rounds = timing.time_interleaved(fns, warmup=1, max_warmup=1, min_runs=5, max_runs=5, budget_s=100)
    assert rounds == 1 and all(v.runs == 5 for v in t.values())
    timed = calls[3:]  # after one warm-up round
    assert timed[:3] == ["a", "b", "c"] and timed[3:6] == ["b", "c", "a"] and timed[6:9] == ["c", "a", "b"]
    calls.clear()
    t, rounds = timing.time_interleaved(fns, warmup=0, min_runs=2, max_runs=1000, budget_s=0.0)
    assert rounds == 0 and all(v.runs == 2 for v in t.values())
    with pytest.raises(ValueError):
        timing.time_interleaved(fns, min_runs=3, max_runs=2)


def test_a_sample_of_a_fast_call_averages_back_to_back_calls():
    """Sub-millisecond calls are repeated within a sample, slower ones are not, and a sample is the
    time of one call."""
    import time

    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.002)

    t, rounds = timing.time_interleaved(
        {"fast": fast, "slow": slow}, warmup=1, max_warmup=1, min_runs=4, max_runs=4, budget_s=100
    )
    repeat = (calls["fast"] - rounds) // 4
    assert repeat > 1 and calls == {"fast": rounds + 4 * repeat, "slow": rounds + 4}
    assert t["slow"].median_ms >= 2.0 and t["fast"].median_ms < 1.0 and t["slow"].runs == 4


def test_warmup_goes_on_until_calls_are_steady():
    """The first calls are slow (first touch, caches): warm-up lasts until two calls agree."""
    durations = iter([0.02, 0.01, 0.005] + [0.001] * 1000)

    def slow_start():
        import time

        time.sleep(next(durations))

    _, rounds = timing.time_interleaved({"f": slow_start}, warmup=1, max_warmup=10, min_runs=2, max_runs=2)
    assert 3 <= rounds <= 10


def test_comparison_faster_needs_the_noise_band():
    def t(ms):
        return Timing(ms, ms * 0.9, ms * 1.1, ms * 0.8, 10)

    assert Comparison(t(1.0), t(0.9)).faster()  # 1.11x
    assert not Comparison(t(1.0), t(0.97)).faster()  # 1.03x: a tie
    assert not Comparison(t(1.0), t(1.2)).faster()
    d = Comparison(t(2.0), t(1.0)).as_dict()
    assert d["speedup"] == 2.0 and d["before_ms"] == 2.0 and d["unreliable"] == ""


def test_reliability_flags_spread_and_load():
    steady = Timing(1.0, 0.95, 1.05, 0.9, 20)
    noisy = Timing(1.0, 0.5, 2.0, 0.4, 20)
    assert timing.reliability({"a": steady}, 0.1, 2) == ""
    assert "spread" in timing.reliability({"a": noisy}, 0.1, 2)
    assert "load average 3.50" in timing.reliability({"a": steady}, 3.5, 2)
    assert timing.reliability({"a": steady}, 2.3, 2) == ""  # einopt's own 2 timing threads


def test_configure_threads_is_idempotent():
    n = timing.configure_threads()
    assert timing.configure_threads(n + 3) == n
    assert timing.machine_info(n)["thread_pool"] in {"global", "per-session"}
    assert set(timing.environment_key()) == {"onnxruntime", "cpu", "threads"}


def test_the_medians_interval_holds_the_true_median_95_percent_of_the_time():
    """Order statistics, whatever the distribution: here a skewed one (lognormal, median 1.0)."""
    rng = np.random.default_rng(1)
    for n in (10, 50, 200):
        trials = [timing.Timing.of(list(rng.lognormal(0.0, 0.5, n) / 1e3)) for _ in range(400)]
        held = np.mean([t.median_low_ms <= 1.0 <= t.median_high_ms for t in trials])
        assert 0.93 <= held <= 1.0, (n, held)
        assert all(t.median_low_ms <= t.median_ms <= t.median_high_ms for t in trials)
    assert timing.median_interval(1) == (0, 0) and timing.median_interval(10) == (0, 9)
    with pytest.raises(ValueError):
        timing.median_interval(0)


def test_paired_ratios_cancel_what_both_sides_of_a_round_share():
    """The machine slows down 3x half-way through: the medians' intervals overlap, but each round ran
    both variants under the same conditions, so the per-round ratios still pin the 1.10x gain."""
    rng = np.random.default_rng(0)
    slow = np.where(np.arange(300) < 150, 1.0, 3.0)
    after = 1e-3 * slow * (1 + 0.01 * rng.standard_normal(300))
    before = 1.1 * after * (1 + 0.01 * rng.standard_normal(300))
    c = timing.Comparison(timing.Timing.of(list(before)), timing.Timing.of(list(after)))
    assert c.gain_interval[0] < 1.0  # without pairs: no gain can be shown
    paired = timing.Comparison(c.before, c.after, ratio=timing.Ratio.of(list(before), list(after)))
    low, high = paired.gain_interval
    assert 1.08 < low < 1.1 < high < 1.12 and paired.confirms(0.02) and not paired.confirms(0.12)
    with pytest.raises(ValueError, match="equal"):
        timing.Ratio.of([1.0, 2.0], [1.0])

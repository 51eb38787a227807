"""Measured acceptance: unchanged parts, slow rewrites and slow whole models are rolled back; the cache.

The decisions are tested with timers that return set comparisons (no timing
ratio is asserted anywhere), plus one rewrite made so much slower (a large
MatMul added to a tiny convolution) that no noise can make it look faster.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_models import append_to_output, conv_block, disable_operators, prelu_block

from einopt import pipeline
from einopt.errors import ModelError
from einopt.pipeline import Options, optimize
from einopt.runtime import bench
from einopt.runtime.cache import MeasurementCache
from einopt.runtime.timing import MODEL_NOISE, Comparison, Ratio, Timing
from einopt.stages import accept
from einopt.stages import timer as timer_module
from einopt.stages.accept import accept_model
from einopt.stages.context import ShapeTiming, StageContext
from einopt.stages.timer import Timer


def _t(ms: float) -> Timing:
    return Timing(ms, ms * 0.98, ms * 1.02, ms * 0.97, 20)


def _cmp(before: float, after: float) -> Comparison:
    return Comparison(_t(before), _t(after), 3, 0.0)


def _fake_time_models(monkeypatch, part_speedup: float, model_speedup):
    """Part pairs read ``part_speedup``; whole models read ``model_speedup(after_model)``."""
    calls = {"parts": 0, "models": 0}

    def fake(before, after, fa, fb=None, **kw):
        whole = before.graph.name != "part"
        calls["models" if whole else "parts"] += 1
        s = model_speedup(after) if whole else part_speedup
        return _cmp(1.0, 1.0 / s)

    monkeypatch.setattr(bench, "time_models", fake)
    # the confirmation's fresh processes read the same script (one call per process)
    monkeypatch.setattr(
        timer_module,
        "time_fresh",
        lambda b, a, feeds, *, processes, **kw: [fake(b, a, feeds) for _ in range(processes)],
    )
    return calls


def test_unchanged_parts_leave_the_input_untouched(tmp_path):
    model = conv_block()
    result = optimize(model, Options(max_depth=0, cache=tmp_path / "c.sqlite"))
    assert {p.status for p in result.parts} == {"unchanged"}
    assert result.counts()["unchanged"] == 4 and result.counts()["rewritten"] == 0
    assert result.model.SerializeToString() == model.SerializeToString()
    assert not result.changed() and any("output is the input model" in n for n in result.notes)
    assert all(p.new_ops == p.ops for p in result.parts)  # the report still shows what they became


def test_a_slowed_rewrite_is_not_accepted_and_the_output_is_the_input(monkeypatch, tmp_path):
    """Real timing: the rewrite adds a 192x192x192 MatMul to a tiny conv, about 100x its time."""
    model = conv_block()

    def slow(first, out, p):
        big = numpy_helper.from_array(np.full((192, 192), 1e-3, np.float32), p + "big")
        zero = numpy_helper.from_array(np.zeros((), np.float32), p + "zero")
        # (max(first) * big) @ big @ big, summed, times zero: exactly 0 on finite inputs, but it costs MatMuls
        nodes = [
            helper.make_node("ReduceMax", [first], [p + "m"], keepdims=0),
            helper.make_node("Mul", [p + "m", p + "big"], [p + "a"]),
            helper.make_node("MatMul", [p + "a", p + "big"], [p + "b"]),
            helper.make_node("MatMul", [p + "b", p + "big"], [p + "c"]),
            helper.make_node("ReduceSum", [p + "c"], [p + "s"], keepdims=0),
            helper.make_node("Mul", [p + "s", p + "zero"], [p + "z"]),
            helper.make_node("Add", [first, p + "z"], [out]),
        ]
        return nodes, [big, zero]

    append_to_output(monkeypatch, "conv2", slow)
    result = optimize(model, Options(max_depth=0, cache=False))
    (slow,) = [p for p in result.parts if p.ops == ("Conv", "Add")]
    # no ratio is asserted: either verdict keeps the original nodes (100x leaves no doubt which it is)
    assert slow.status in ("not faster", "rolled back") and slow.bench["cached"] is False
    assert result.model.SerializeToString() == model.SerializeToString()
    assert result.acceptance["timed"] and result.acceptance["cache"]["measured"] in (1, 2)  # 2: timed again


def test_a_slow_whole_model_is_rolled_back(monkeypatch, tmp_path):
    """Every part is faster on its own, the whole model is slower: everything is rolled back."""
    disable_operators(monkeypatch)
    calls = _fake_time_models(monkeypatch, 1.5, lambda m: 0.8)
    model = conv_block()
    result = optimize(model, Options(max_depth=0, cache=False))
    # the two Relu subprograms are the same node group on the same shapes: timed once
    # one kind at a time: the two Relu rewrites are one kind, rolled back together
    assert calls["parts"] == 3 and calls["models"] == 3
    assert {p.status for p in result.parts} == {"rolled back"}
    assert all("whole model" in p.reason and "0.800x" in p.reason for p in result.parts)
    assert result.model.SerializeToString() == model.SerializeToString()
    rounds = result.acceptance["rounds"]
    assert sorted(len(r["rolled_back"]) for r in rounds) == [1, 1, 2]
    assert result.counts()["rolled_back"] == 4 and result.counts()["accepted"] == 0


def test_a_fast_whole_model_keeps_its_rewrites(monkeypatch):
    disable_operators(monkeypatch)
    _fake_time_models(monkeypatch, 1.5, lambda m: 1.2)
    model = conv_block()
    result = optimize(model, Options(max_depth=0, cache=False))
    assert {p.status for p in result.parts} == {"accepted"}
    assert {n.domain for n in result.model.graph.node} == {"einopt.eop"}
    assert result.acceptance["rounds"][0]["speedup"] == pytest.approx(1.2)


def test_disturbed_timings_accept_nothing(monkeypatch):
    """A timing disturbed twice (spread or load) accepts nothing: parts stay, the whole model rolls back."""
    disable_operators(monkeypatch)
    noisy = Comparison(Timing(2.0, 0.5, 4.0, 0.4, 20), _t(1.0), 3, 0.0)  # p90/p10 = 8
    monkeypatch.setattr(bench, "time_models", lambda *a, **k: noisy)
    result = optimize(conv_block(), Options(max_depth=0, cache=False))
    assert {p.status for p in result.parts} == {"not faster"}
    assert all("disturbed by other work" in p.reason for p in result.parts)
    assert result.model.SerializeToString() == conv_block().SerializeToString()
    assert any("timings were disturbed by other work" in n for n in result.notes)

    calls = _fake_time_models(monkeypatch, 1.5, lambda m: 1.2)
    real = bench.time_models

    def whole_noisy(before, after, fa, fb=None, **kw):
        return noisy if before.graph.name != "part" else real(before, after, fa, fb, **kw)

    monkeypatch.setattr(bench, "time_models", whole_noisy)
    result = optimize(conv_block(), Options(max_depth=0, cache=False))
    assert {p.status for p in result.parts} == {"rolled back"} and calls["parts"] == 3
    assert all("disturbed" in p.reason for p in result.parts)
    assert len(result.acceptance["rounds"]) == 1 and len(result.acceptance["rounds"][0]["rolled_back"]) == 4


def test_rollback_order_smallest_gain_first_and_bisection():
    def run(gains, slow_while):
        timed = []

        class FakeTimer:
            def model(self, before, after, feeds, fresh=False):
                timed.append(after)
                return _cmp(1.0, 1.25) if slow_while(after) else _cmp(1.0, 0.9)

            def confirm(self, before, after, feeds):
                return [self.model(before, after, feeds, fresh=True)]

        kept, rounds = accept_model(_whole(FakeTimer()), lambda names: names, gains)
        return kept, rounds, timed

    # slower while "c" (the smallest gain) is in: only "c" goes
    kept, rounds, _ = run({"a": 1.5, "b": 1.2, "c": 1.1}, lambda names: "c" in names)
    assert kept == {"a", "b"} and [r.rolled_back for r in rounds] == [("c",), (), ()]
    assert [r.stage for r in rounds] == ["round", "round", "confirm"]
    # many rewrites: half of them (smallest gains) go at a time
    gains = {f"p{k:02d}": 1.0 + k / 100 for k in range(20)}
    kept, rounds, timed = run(gains, lambda names: "p00" in names or len(names) > 10)
    assert [len(r.rolled_back) for r in rounds[:-2]] == [10] and len(kept) == 10 and "p00" not in kept
    # always slower: nothing is kept
    kept, rounds, _ = run({"a": 2.0}, lambda names: True)
    assert kept == frozenset() and rounds[-1].rolled_back == ("a",)


def test_second_run_measures_nothing_new(monkeypatch, tmp_path):
    disable_operators(monkeypatch)
    calls = _fake_time_models(monkeypatch, 1.5, lambda m: 1.2)
    path = tmp_path / "cache.sqlite"
    first = optimize(conv_block(), Options(max_depth=0, cache=path))
    made, hits = first.acceptance["cache"]["measured"], first.acceptance["cache"]["hits"]
    # 3 distinct part pairs (the two Relu parts are one node group: the second is a hit) + the whole
    # model's round and its confirmation (one measurement: three fresh processes, the least kept)
    assert (made, hits) == (5, 1) and calls == {"parts": 3, "models": 4}
    second = optimize(conv_block(), Options(max_depth=0, cache=path))
    assert calls == {"parts": 3, "models": 7}  # only the confirmation, which is always made afresh
    assert (
        second.acceptance["cache"]["measured"] == 1 and second.acceptance["cache"]["hits"] == made + hits - 1
    )
    assert [p.status for p in second.parts] == [p.status for p in first.parts]
    assert second.model.SerializeToString() == first.model.SerializeToString()
    assert all(p.bench["cached"] for p in second.parts if p.bench)


def test_cache_keys_ignore_names_and_weight_values_not_shapes(tmp_path):
    from einopt.runtime.graphkey import timing_key

    a = conv_block(seed=0)
    b = conv_block(seed=1)  # other weights, same structure
    for n in b.graph.node:
        n.name = "renamed_" + n.name
    x = {"x": np.zeros((1, 8, 6, 6), np.float32)}
    assert timing_key(a, x) == timing_key(b, x)
    assert timing_key(a, x) != timing_key(a, {"x": np.zeros((2, 8, 6, 6), np.float32)})
    cache = MeasurementCache(tmp_path / "c.sqlite")
    k = cache.key("a", "b")
    cache.put(k, _cmp(2.0, 1.0))
    cache.close()
    again = MeasurementCache(tmp_path / "c.sqlite")
    assert again.get(k).speedup == 2.0 and again.get(k).cached
    assert MeasurementCache(None).get(k) is None


def test_unusable_cache_file_is_a_warning_not_a_failure(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = MeasurementCache(blocker / "sub" / "c.sqlite")  # its directory cannot be made
    assert cache.describe()["path"] is None
    assert cache.measure("k", "x", lambda: _cmp(1.0, 1.0)).speedup == 1.0


def test_a_new_cache_file_is_private_and_says_einopt_made_it(tmp_path):
    path = tmp_path / "c.sqlite"
    MeasurementCache(path).close()
    assert path.stat().st_mode & 0o777 == 0o600
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT name, value FROM meta")) == {"schema": "1", "creator": "einopt"}
    cache = MeasurementCache(path)  # its own file: opened again
    assert cache.usable
    cache.close()


def _einopt_cache(path):
    MeasurementCache(path).close()
    return path


def _foreign_db(path, monkeypatch):
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    db.close()


def _not_a_database(path, monkeypatch):
    path.write_bytes(b"a plain file, not SQLite " * 100)


def _group_writable(path, monkeypatch):
    _einopt_cache(path).chmod(0o620)


def _linked(path, monkeypatch):
    path.symlink_to(_einopt_cache(path.parent / "elsewhere.sqlite"))


def _another_users(path, monkeypatch):
    _einopt_cache(path)
    real = os.lstat

    def lstat(p, *args, **kwargs):  # the file (not its folder) as if another user owned it
        st = real(p, *args, **kwargs)
        return os.stat_result((*st[:4], st.st_uid + 1, *st[5:])) if str(p) == str(path) else st

    monkeypatch.setattr(os, "lstat", lstat)


@pytest.mark.parametrize(
    "plant, why",
    [
        (_foreign_db, "is not a measurement cache einopt created"),
        (_not_a_database, "is not a measurement cache einopt created"),
        (_group_writable, "is writable by its group or by others"),
        (_linked, "is a symbolic link"),
        (_another_users, "belongs to another user"),
    ],
)
def test_a_cache_file_einopt_did_not_make_or_others_can_write_is_refused(
    plant, why, tmp_path, monkeypatch, caplog
):
    """Search results read from the cache become candidates: such a file is not read (nor written)."""
    path = tmp_path / "c.sqlite"
    plant(path, monkeypatch)
    before = path.read_bytes()
    with caplog.at_level("WARNING"):
        cache = MeasurementCache(path)
    monkeypatch.undo()
    assert not cache.usable and cache.describe()["path"] is None
    refusals = [r.getMessage() for r in caplog.records if "measurement cache" in r.getMessage()]
    assert len(refusals) == 1 and f"{path} {why}" in refusals[0], refusals
    cache.put("k", _cmp(2.0, 1.0))  # kept for this run only
    assert cache.get("k").speedup == 2.0 and path.read_bytes() == before


def test_a_cache_in_a_folder_others_can_write_is_refused(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level("WARNING"):
        cache = MeasurementCache(shared / "c.sqlite")
    assert not cache.usable and "writable by its group or by others" in caplog.text
    assert not (shared / "c.sqlite").exists()


def test_a_cache_made_before_the_creator_row_is_still_einopts(tmp_path):
    path = _einopt_cache(tmp_path / "c.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM meta WHERE name = 'creator'")
    db.close()
    cache = MeasurementCache(path)
    assert cache.usable
    cache.close()


def test_accept_verified_keeps_rewrites_untimed(monkeypatch):
    disable_operators(monkeypatch)
    calls = _fake_time_models(monkeypatch, 0.5, lambda m: 0.5)
    result = optimize(conv_block(), Options(accept="verified"))
    assert calls == {"parts": 0, "models": 0}
    assert {p.status for p in result.parts} == {"rewritten"}
    assert not result.acceptance["timed"] and any("not timed" in n for n in result.notes)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_depth": -1}, "max_depth must be an integer >= 0"),
        ({"jobs": 0}, "jobs must be an integer >= 1"),
        ({"accept": "fast"}, "accept must be one of"),
        ({"noise": 1.5}, "noise must be in"),
    ],
)
def test_options_are_checked_like_the_cli(options, message):
    with pytest.raises(ValueError, match=message):
        Options(**options)


def test_timer_goes_through_the_cache(monkeypatch, tmp_path):
    calls = _fake_time_models(monkeypatch, 2.0, lambda m: 2.0)
    timer = Timer(MeasurementCache(tmp_path / "c.sqlite"))
    m = conv_block()
    x = {"x": np.zeros((1, 8, 6, 6), np.float32)}
    assert timer.model(m, m, x).speedup == 2.0 and timer.model(m, m, x).cached
    assert calls["models"] == 1 and timer.cache.stats.hits == 1


def test_a_fresh_whole_model_timing_leaves_a_part_timing_of_the_same_graphs_alone(monkeypatch, tmp_path):
    """A part that is the whole model is timed as the same pair of graphs twice: by selection (cached)
    and by the confirmation (always fresh). The confirmation must not replace the timing the part was
    chosen by, or a second run chooses by another number."""
    from einopt.stages.verify import PartPair

    speedups = iter([2.0, 1.5])
    monkeypatch.setattr(bench, "time_models", lambda *a, **k: _cmp(1.0, 1.0 / next(speedups)))
    timer = Timer(MeasurementCache(tmp_path / "c.sqlite"))
    m = conv_block()
    x = {"x": np.zeros((1, 8, 6, 6), np.float32)}
    pair = PartPair("p", m, x, m, x)
    assert timer.part(pair).speedup == 2.0
    assert timer.model(m, m, x, fresh=True).speedup == 1.5
    again = Timer(MeasurementCache(tmp_path / "c.sqlite")).part(pair)
    assert again.cached and again.speedup == 2.0


def test_a_disturbed_timing_is_trusted_only_when_the_medians_intervals_do_not_overlap():
    """Spread makes a timing unreliable, but when the high end of the new nodes' median's 95% interval
    beats the low end of the original's (beyond the noise band), no spread explains the gap away."""
    rng = np.random.default_rng(0)

    def noisy(ms: float) -> Timing:  # a quarter of the runs disturbed: up to 3x slower
        s = ms * (1 + 0.02 * rng.standard_normal(200))
        hit = rng.random(200) < 0.25
        s[hit] *= rng.uniform(1, 3, hit.sum())
        return Timing.of(list(s / 1e3))

    wide = Comparison(noisy(1.3), noisy(1.0), 3, 0.0)  # 1.3x, many runs: narrow medians' intervals
    assert wide.unreliable() and wide.before.p10_ms < wide.after.p90_ms
    old = Comparison(Timing(4.0, 3.0, 8.0, 2.9, 20), _t(1.0), 3, 0.0)  # cached without intervals: p10-p90
    close = Comparison(Timing(4.0, 1.0, 8.0, 0.9, 20, 1.0, 6.0), _t(1.0), 3, 0.0)  # 4x, but 20 wild runs
    assert old.unreliable() and close.unreliable()
    verdicts = accept.judge_parts([("wide", wide), ("old", old), ("close", close)], timer=None)
    assert verdicts["wide"].accepted and "95% interval" in verdicts["wide"].reason
    assert verdicts["old"].accepted
    assert not verdicts["close"].accepted and "disturbed" in verdicts["close"].reason


def test_cached_timings_keep_the_medians_intervals(tmp_path):
    """A timing comes back from the file with its intervals; one stored without them (older einopt)
    falls back to p10-p90, the stricter test."""
    path = tmp_path / "c.sqlite"
    c = Comparison(Timing.of([1e-3, 2e-3, 3e-3] * 10), Timing.of([1e-3] * 30), 3, 0.5)
    MeasurementCache(path).put("k", c)
    back = MeasurementCache(path).get("k")
    assert back.before == c.before and back.before.interval == (
        c.before.median_low_ms,
        c.before.median_high_ms,
    )
    paired = _paired(2.0, 1.25, 1.2, 1.3)
    MeasurementCache(path).put("paired", paired)
    assert MeasurementCache(path).get("paired").ratio == paired.ratio
    MeasurementCache(path).put("old", Comparison(Timing(2.0, 1.0, 3.0, 1.0, 30), _t(1.0), 3, 0.5))
    old = MeasurementCache(path).get("old")
    assert old.before.median_low_ms is None and old.before.interval == (1.0, 3.0) and old.ratio is None


def _paired(before: float, speedup: float, low: float, high: float, pairs: int = 300) -> Comparison:
    """A whole-model comparison whose per-round ratios have the median ``speedup`` and the interval
    ``low``-``high``; the input ran ``before`` ms."""
    return Comparison(_t(before), _t(before / speedup), 3, 0.0, ratio=Ratio(speedup, low, high, pairs))


def _whole(timer, band: float = MODEL_NOISE) -> StageContext:
    """A context for :func:`accept_model` alone: no models (the builds are the rewrites' names), no
    inputs, the whole-model ``timer`` and ``band``."""
    return StageContext(None, None, feeds={}, timer=timer, model_noise=band)


class ScriptedTimer:
    """Whole-model timings read from a script, one per call (a confirmation takes one per fresh
    process); records whether each call was fresh."""

    def __init__(self, *timings: Comparison, processes: int = 1) -> None:
        self.script = list(timings)
        self.fresh: list[bool] = []
        self.processes = processes

    def model(self, before, after, feeds, *, fresh=False):
        self.fresh.append(fresh)
        return self.script.pop(0)

    def confirm(self, before, after, feeds):
        return [self.model(before, after, feeds, fresh=True) for _ in range(self.processes)]


def test_a_gain_inside_the_whole_model_band_is_not_kept():
    """1.01x with a 95% interval of 0.995-1.025x is a tie at a 2% band: nothing is kept."""
    timer = ScriptedTimer(_paired(2.0, 1.01, 0.995, 1.025))
    kept, rounds = accept_model(_whole(timer, 0.02), lambda names: names, {"a": 1.5})
    assert kept == frozenset() and [r.rolled_back for r in rounds] == [("a",)]
    # the same median ratio, measured tightly enough to clear the band, is kept (after its confirmation)
    tight = _paired(2.0, 1.04, 1.03, 1.05)
    kept, rounds = accept_model(_whole(ScriptedTimer(tight, tight)), lambda names: names, {"a": 1.5})
    assert kept == {"a"} and [r.stage for r in rounds] == ["round", "confirm"]


def test_a_neutral_rewrite_timed_inside_the_band_leaves_the_input(monkeypatch):
    """A Transpose pair ONNX Runtime folds away, rewritten into other nodes that are neutral: every part
    reads 1.5x on its own, the whole model reads inside the band, so the output is the input."""
    from onnx_models import tiny_model

    disable_operators(monkeypatch)
    w = np.random.default_rng(0).standard_normal((4, 4, 1, 1)).astype(np.float32)
    model = tiny_model(
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
            helper.make_node("Conv", ["u", "w"], ["c"]),
            helper.make_node("Relu", ["c"], ["y"]),  # a second part: no part pair is the whole model
        ],
        [("x", [1, 4, 6, 6])],
        [("y", [1, 4, 6, 6])],
        [("w", w)],
    )

    def fake(before, after, fa, fb=None, **kw):
        whole = before.graph.name != "part"
        return _paired(1.0, 1.006, 0.99, 1.02) if whole else _cmp(1.0, 1 / 1.5)

    monkeypatch.setattr(bench, "time_models", fake)
    result = optimize(model, Options(max_depth=0, cache=False))
    assert result.model.SerializeToString() == model.SerializeToString()
    rewritten = [p for p in result.parts if p.kind != "passthrough"]
    assert rewritten and {p.status for p in rewritten} == {"rolled back"}
    assert result.acceptance["model_band"] == 0.02 and result.acceptance["confirmation"] is None
    assert all("0.990-1.020x" in p.reason for p in rewritten)


def test_a_drifting_input_time_forces_a_retake():
    """After a rollback, the input ran 1.5x slower than in the round before: that timing is not
    compared but retaken, fresh; the retake agrees with it (the machine settled at another speed) and,
    paired, still confirms the gain."""
    slow = _paired(2.0, 0.9, 0.88, 0.92)
    good = _paired(3.0, 1.25, 1.2, 1.3)  # the same gain, but the machine changed
    gains = {"a": 1.5, "b": 1.2}
    timer = ScriptedTimer(slow, good, good, good)
    kept, rounds = accept_model(_whole(timer), lambda names: names, gains)
    assert kept == {"a"}
    assert [r.stage for r in rounds] == ["round", "retake", "round", "confirm"]
    assert timer.fresh == [False, False, True, True]
    assert "3 ms against 2 ms" in rounds[1].reason and rounds[1].rolled_back == ()
    # a round whose input keeps moving (1.5x from each timing to the next) is judged on the least of
    # its timings: one of them only 1.01-1.11x, inside the band, so nothing is kept
    moving = [
        _paired(2.0 * 1.5**k, g, g - 0.05, g + 0.05)
        for k, g in zip(range(1, 4), (1.25, 1.06, 1.3), strict=False)
    ]
    kept, rounds = accept_model(_whole(ScriptedTimer(slow, *moving)), lambda names: names, gains)
    assert kept == frozenset() and [r.stage for r in rounds] == [
        "round",
        "retake",
        "retake",
        "retake",
        "round",
    ]
    assert "kept changing: judged on the least of its 3 timings" in rounds[-2].reason
    assert rounds[-1].rolled_back == ("a",) and "1.010-1.110x" in rounds[-1].reason
    # the same moving machine with the gain clear in every timing: kept, on its least timing
    moving = [
        _paired(2.0 * 1.5**k, g, g - 0.02, g + 0.02)
        for k, g in zip(range(1, 4), (1.25, 1.1, 1.3), strict=False)
    ]
    kept, rounds = accept_model(_whole(ScriptedTimer(slow, *moving, good)), lambda names: names, gains)
    assert kept == {"a"} and [r.stage for r in rounds][-2:] == ["round", "confirm"]
    assert "1.080-1.120x" in rounds[-2].reason and rounds[-2].timing.before.median_ms == 2.0 * 1.5**2
    # a cached round is no yardstick: the timing after it is compared as it is
    cached = dataclasses.replace(slow, cached=True)
    kept, rounds = accept_model(_whole(ScriptedTimer(cached, good, good)), lambda names: names, gains)
    assert kept == {"a"} and [r.stage for r in rounds] == ["round", "round", "confirm"]


def test_the_confirmation_is_not_retaken_for_a_drifting_input():
    """Fresh processes read the input at their own speeds: a confirmation is judged as it reads, on the
    least of its processes, not retaken against the rounds' input time."""
    good = _paired(2.0, 1.25, 1.2, 1.3)
    drifted = _paired(3.0, 1.25, 1.2, 1.3)
    timer = ScriptedTimer(good, drifted, good, processes=2)
    kept, rounds = accept_model(_whole(timer), lambda names: names, {"a": 1.5})
    assert kept == {"a"} and [r.stage for r in rounds] == ["round", "confirm", "confirm"]
    assert "fresh process 1 of 2" in rounds[1].reason and "fresh process 2 of 2" in rounds[2].reason


def test_every_fresh_process_must_confirm_the_gain():
    """The round and the first fresh process confirm 1.25x, the second reads 1.01x: the output is the
    input, and the failing reading is the one rolled back on (and the report's confirmation)."""
    good, tie = _paired(2.0, 1.25, 1.2, 1.3), _paired(2.0, 1.01, 0.99, 1.03)
    timer = ScriptedTimer(good, good, tie, processes=2)
    kept, rounds = accept_model(_whole(timer), lambda names: names, {"a": 1.5})
    assert kept == frozenset() and [r.stage for r in rounds] == ["round", "confirm", "confirm"]
    assert rounds[1].rolled_back == () and rounds[2].rolled_back == ("a",)
    assert "fresh process 2 of 2 did not establish the gain" in rounds[2].reason
    # either order: the least reading decides
    kept, rounds = accept_model(
        _whole(ScriptedTimer(good, tie, good, processes=2)), lambda names: names, {"a": 1.5}
    )
    assert kept == frozenset() and rounds[1].rolled_back == ("a",) and rounds[2].rolled_back == ()


def test_a_confirmation_times_the_models_in_fresh_processes(tmp_path):
    """Real children: each times the pair in its own process (paired rounds, the requested run counts),
    on inputs whose names are no file names; the least reading is what the cache keeps."""
    from onnx_models import tiny_model

    from einopt.runtime import fresh

    model = tiny_model(
        [helper.make_node("Relu", ["in/put:0"], ["y"])], [("in/put:0", [64, 64])], [("y", [64, 64])], []
    )
    feeds = {"in/put:0": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)}
    timer = Timer(MeasurementCache(tmp_path / "c.sqlite"), model_budget_s=0.2, model_min_runs=20, processes=2)
    readings = timer.confirm(model, model, feeds)
    assert len(readings) == 2 and all(r.ratio is not None and r.before.runs >= 20 for r in readings)
    assert timer.cache.stats.measured == 1
    cached = timer.model(model, model, feeds)
    assert cached.cached and cached.gain_interval == fresh.least(readings).gain_interval


def test_a_failing_child_falls_back_to_this_process(monkeypatch, tmp_path, caplog):
    from onnx_models import tiny_model

    from einopt.runtime import fresh

    model = tiny_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4])], [])
    feeds = {"x": np.ones(4, np.float32)}
    monkeypatch.setattr(fresh.sys, "executable", "/bin/false")
    with pytest.raises(fresh.FreshProcessError, match="fresh process failed: exit status 1"):
        fresh.time_fresh(model, model, feeds, processes=1)
    timer = Timer(MeasurementCache(tmp_path / "c.sqlite"), model_budget_s=0.1, processes=2)
    with caplog.at_level("WARNING"):
        readings = timer.confirm(model, model, feeds)
    assert len(readings) == 1 and "confirming in this process instead" in caplog.text


def test_the_fresh_confirmation_decides():
    """A round clears the band, the fresh confirmation does not: the output is the input."""
    timer = ScriptedTimer(_paired(2.0, 1.25, 1.2, 1.3), _paired(2.0, 1.01, 0.99, 1.03))
    kept, rounds = accept_model(_whole(timer), lambda names: names, {"a": 1.5, "b": 1.2})
    assert kept == frozenset() and rounds[-1].stage == "confirm" and rounds[-1].rolled_back == ("a", "b")
    assert "did not establish" in rounds[-1].reason


def test_rewrites_of_a_kind_roll_back_together():
    """Three shuffles (one kind) and one conv rewrite: the conv kind (smallest gain) goes first, then the
    three shuffles in one round, not one by one."""
    gains = {"c": 1.2, "s1": 1.4, "s2": 1.5, "s3": 1.6}
    kinds = {"c": "Conv -> Conv", "s1": "shuffle", "s2": "shuffle", "s3": "shuffle"}
    timer = ScriptedTimer(*[_paired(2.0, 0.9, 0.88, 0.92)] * 2)
    kept, rounds = accept_model(_whole(timer), lambda names: names, gains, kinds)
    assert kept == frozenset() and [r.rolled_back for r in rounds] == [("c",), ("s1", "s2", "s3")]


def test_rewrite_kinds_ignore_position_and_eoperator_names():
    from einopt.instantiate.emit import Instantiated
    from einopt.stages.accept import rewrite_kind

    model = conv_block()

    def inst(fname: str) -> Instantiated:
        body = helper.make_function(
            "einopt.eop", fname, ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], [], []
        )
        node = helper.make_node(fname, ["x"], ["y"], domain="einopt.eop")
        return Instantiated((node,), (), (body,), ())

    class P:
        nodes = (1,)

    assert rewrite_kind(model, P, inst("sp0_relu")) == rewrite_kind(model, P, inst("sp7_relu"))
    assert rewrite_kind(model, P, inst("sp0_relu")).endswith("-> {Relu}")


def _fake_by_batch(monkeypatch, speedups: dict[int, float]) -> None:
    """Part pairs read 2x faster; whole models read ``speedups[batch of their feeds]``; candidates
    keep the search's analytic ranking (measured operator costs, which a loaded machine reorders,
    would choose which of them are tried)."""
    monkeypatch.setattr(pipeline, "predict", lambda ctx, parts, searches, costs: searches)

    def fake(before, after, fa, fb=None, **kw):
        if before.graph.name == "part":
            return _cmp(1.0, 0.5)
        return _cmp(1.0, 1.0 / speedups[next(iter(fa.values())).shape[0]])

    monkeypatch.setattr(bench, "time_models", fake)
    monkeypatch.setattr(
        timer_module,
        "time_fresh",
        lambda b, a, feeds, *, processes, **kw: [fake(b, a, feeds) for _ in range(processes)],
    )


# top_k 12: the predicted-fastest forms are 1x1 Convs as MatMuls between Reshapes written for the batch
# of 1 (left out); the PRelu as max(y, a*y) after the Conv holds at any batch
SYMBOLIC = {"max_depth": 2, "states_per_search": 300, "top_k": 12, "cache": False, "time_shapes": ({"N": 4},)}


def test_an_output_slower_at_another_timed_shape_is_not_kept(monkeypatch):
    _fake_by_batch(monkeypatch, {1: 1.5, 4: 0.5})
    model = prelu_block(batch="N")
    result = optimize(model, Options(**SYMBOLIC))
    assert result.model.SerializeToString() == model.SerializeToString()
    shape = [r for r in result.acceptance["rounds"] if r["stage"] == "shape"]
    assert len(shape) == 1 and shape[0]["rolled_back"] and "at N=4: 0.500x" in shape[0]["reason"]
    assert any("ran slower at N=4" in n for n in result.notes)
    assert all(p.status in ("rolled back", "unchanged", "not faster") for p in result.parts)


def test_an_output_not_slower_at_another_timed_shape_is_kept(monkeypatch):
    _fake_by_batch(monkeypatch, {1: 1.5, 4: 1.2})
    model = prelu_block(batch="N")
    result = optimize(model, Options(**SYMBOLIC))
    assert result.changed()
    (shape,) = [r for r in result.acceptance["rounds"] if r["stage"] == "shape"]
    assert not shape["rolled_back"] and shape["reason"] == "at N=4: 1.200x"


def test_time_shapes_name_symbolic_dimensions_the_output_keeps():
    with pytest.raises(ModelError, match="--time-shapes names M, not a symbolic dimension kept"):
        optimize(prelu_block(batch="N"), Options(max_depth=0, time_shapes=({"M": 4},)))


def test_a_kind_slower_at_another_timed_shape_is_rolled_back_and_the_rest_kept():
    """Two rewrites, both faster at the searched shape; with both the model is slower at N=4: the one
    of least gain goes, and the rest is timed again (searched shape, confirmation, N=4) and kept."""
    good, slow = _paired(2.0, 1.3, 1.25, 1.35), _paired(2.0, 0.8, 0.78, 0.82)
    timer = ScriptedTimer(good, good, slow, good, good, good)
    ctx = dataclasses.replace(_whole(timer), timings=(ShapeTiming({"N": 4}, {}),))
    kept, rounds = accept_model(ctx, lambda names: names, {"a": 1.5, "b": 1.2})
    assert kept == {"a"}
    assert [(r.stage, r.rolled_back) for r in rounds] == [
        ("round", ()),
        ("confirm", ()),
        ("shape", ("b",)),
        ("round", ()),
        ("confirm", ()),
        ("shape", ()),
    ]
    assert rounds[2].reason == "at N=4: 0.800x, slower beyond the 2% band"

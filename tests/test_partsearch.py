"""The search stage: each expression of a subprogram is also searched on its own, and what it finds
is put back into the subprogram (``einopt.stages.partsearch``)."""

import numpy as np
import pytest
from onnx import helper
from onnx_models import _w, make

from einopt.core.interp import evaluate
from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.runtime.cache import MeasurementCache
from einopt.search import Budget
from einopt.stages import partsearch, searchruns
from einopt.stages.partsearch import Settings, search_parts

DEPTH_1 = Settings(Budget(max_depth=1, states_per_search=1_000))


def _conv_deconv():
    """1x1 Conv -> ConvTranspose k4 s2 p1 -> Relu: one subprogram of two expressions."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
        helper.make_node(
            "ConvTranspose",
            ["c", "V"],
            ["t"],
            name="deconv",
            kernel_shape=[4, 4],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ]
    inits = {"W": _w(rng, 6, 4, 1, 1), "V": _w(rng, 6, 3, 4, 4)}
    return make(nodes, [("x", [1, 4, 4, 4])], [("y", [1, 3, 8, 8])], inits, name="conv_deconv")


@pytest.fixture
def part():
    model = prepare(_conv_deconv(), {}, fold=True).model
    (p,) = [p for p in translate_graph(model) if p.program is not None and len(p.program.bindings) == 2]
    return p


def test_what_an_expression_alone_finds_goes_back_into_its_subprogram(part, tmp_path, monkeypatch):
    real = searchruns._search_one

    def whole_part_finds_nothing(task, settings, allowed, wall, hook=None):
        value = real(task, settings, allowed, wall, hook)
        if "y1 =" in task.text:  # the whole subprogram: only its input, as if cut short at once
            value["found"] = [f for f in value["found"] if not f["trace"]]
        return value

    monkeypatch.setattr(searchruns, "_search_one", whole_part_finds_nothing)
    store = MeasurementCache(tmp_path / "c.sqlite")
    found = search_parts([part], DEPTH_1, store)[part.name]
    store.close()
    derived = [f for f in found.candidates if f.trace]
    assert derived, found.stats
    assert len({f.work for f in derived}) == len(derived)  # one candidate per work
    assert [f.cost for f in found.candidates] == sorted(f.cost for f in found.candidates)
    # every step is labelled in the subprogram's canonical names (bindings y0, y1; inputs x0, ...)
    assert all(s.where.startswith(("y0", "y1")) for f in derived for s in f.trace)
    rng = np.random.default_rng(1)
    feeds = {t.name: part.constants.get(t.name, rng.standard_normal(t.shape)) for t in part.program.inputs}
    want = evaluate(part.program, feeds)
    for f in derived:
        got = evaluate(f.program, feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-9)
    pieces = found.stats["pieces"]
    assert [q["binding"] for q in pieces] == [n for n, _ in part.program.bindings]
    assert found.stats["generated"] == found.stats["whole"]["generated"] + sum(q["generated"] for q in pieces)


def test_an_expression_searched_alone_is_shared_and_cached(part, tmp_path, monkeypatch):
    calls = []
    real = searchruns._search_one
    monkeypatch.setattr(searchruns, "_search_one", lambda *a, **k: calls.append(a[0].text) or real(*a, **k))
    store = MeasurementCache(tmp_path / "c.sqlite")
    settings = DEPTH_1
    first = search_parts([part], settings, store)[part.name]
    assert len(calls) == 3  # the subprogram and each of its two expressions
    second = search_parts([part], settings, store)[part.name]
    store.close()
    assert len(calls) == 3
    assert [f.program for f in second.candidates] == [f.program for f in first.candidates]
    assert all(q["cached"] for q in second.stats["pieces"])


def _model_parts():
    model = prepare(_conv_deconv(), {}, fold=True).model
    return [p for p in translate_graph(model) if p.program is not None]


def _searched(result) -> dict:
    return {
        name: (
            [(f.program, f.trace) for f in ps.candidates],
            ps.stats.get("generated"),
            ps.stats.get("complete"),
        )
        for name, ps in result.items()
    }


# Depth 2: the subprogram's search needs about 1,700 states, its ConvTranspose's alone 1,400, the Conv's 5.
MODEL_STATES = Budget(max_depth=2, states_per_search=400, states_per_model=1_000)


@pytest.mark.slow
def test_the_model_states_are_shared_out_the_same_with_one_job_or_two(monkeypatch):
    """Four distinct searches share 1,000 states: a first pass of 125 each, then the ConvTranspose
    alone with its whole 400, then the subprogram with what is left (345). Two processes start the
    subprogram's second search before the ConvTranspose's is charged: it must still get 345."""
    monkeypatch.setattr(partsearch, "MIN_SHARE", 100)
    runs = {}
    for jobs in (1, 2):
        events = []
        runs[jobs] = search_parts(
            _model_parts(), Settings(MODEL_STATES), MeasurementCache(None), jobs=jobs, progress=events.append
        )
        ran = [e for e in events if e.event in ("done", "deeper")]
        assert sum(e.states for e in ran) <= MODEL_STATES.states_per_model, ran
        assert [e.part for e in ran if e.event == "deeper"] == ["sp0_conv/t", "sp0_conv"], ran
    assert _searched(runs[1]) == _searched(runs[2])
    whole = runs[1]["sp0_conv"].stats
    assert whole["complete"] is False and 125 < whole["whole"]["generated"] < 400
    assert [q["generated"] for q in whole["pieces"]] == [5, 400]


def test_a_search_cut_short_by_its_share_is_not_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(partsearch, "MIN_SHARE", 100)
    store = MeasurementCache(tmp_path / "c.sqlite")
    search_parts(_model_parts(), Settings(MODEL_STATES), store)
    calls = []
    real = searchruns._search_one
    monkeypatch.setattr(searchruns, "_search_one", lambda *a, **k: calls.append(a[0].text) or real(*a, **k))
    again = search_parts(_model_parts(), Settings(MODEL_STATES), store)
    store.close()
    # The Conv's (complete) and the ConvTranspose's (cut by its own 400 states) were kept: the
    # subprogram's, cut by the model's states, is searched again.
    assert len(calls) == 1 and "y1 =" in calls[0]
    assert [q["cached"] for q in again["sp0_conv"].stats["pieces"]] == [True, True]


def test_a_search_cut_short_by_the_deadline_is_not_stored(tmp_path):
    store = MeasurementCache(tmp_path / "c.sqlite")
    # Depth 3: the subprogram's search takes about a minute; the deadline stops it long before.
    settings = Settings(Budget(max_depth=3, deadline_s=1.0))
    found = search_parts(_model_parts(), settings, store)["sp0_conv"]
    assert found.stats["complete"] is False
    stopped = [found.stats["whole"]] + list(found.stats["pieces"])
    assert any(q.get("searched") is False or not q["complete"] for q in stopped), stopped
    assert not any(store.found(k) for k in _unstored_keys(settings))
    store.close()


def _unstored_keys(settings):
    """The keys of the searches of the parts that do not complete within a second."""
    tasks, owner = {}, {}
    for p in _model_parts():
        if len(p.program.bindings) > 1:
            partsearch._task(p.program, p.constants, settings, tasks, owner, p.name)
            name, sub = partsearch._pieces(p.program)[1]
            partsearch._task(sub, p.constants, settings, tasks, owner, f"{p.name}/{name}")
    return list(tasks)

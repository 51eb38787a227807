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
from einopt.stages import partsearch
from einopt.stages.partsearch import Settings, search_parts


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
    real = partsearch._search_one

    def whole_part_finds_nothing(task, settings, budget, hook=None):
        value = real(task, settings, budget, hook)
        if "y1 =" in task.text:  # the whole subprogram: only its input, as if cut short at once
            value["found"] = [f for f in value["found"] if not f["trace"]]
        return value

    monkeypatch.setattr(partsearch, "_search_one", whole_part_finds_nothing)
    store = MeasurementCache(tmp_path / "c.sqlite")
    found = search_parts([part], Settings(max_depth=1, part_budget_s=30.0), store)[part.name]
    store.close()
    derived = [f for f in found.found if f.trace]
    assert derived, found.stats
    assert len({f.work for f in derived}) == len(derived)  # one candidate per work
    assert [f.predicted_s for f in found.found] == sorted(f.predicted_s for f in found.found)
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
    real = partsearch._search_one
    monkeypatch.setattr(partsearch, "_search_one", lambda *a, **k: calls.append(a[0].text) or real(*a, **k))
    store = MeasurementCache(tmp_path / "c.sqlite")
    settings = Settings(max_depth=1, part_budget_s=30.0)
    first = search_parts([part], settings, store)[part.name]
    assert len(calls) == 3  # the subprogram and each of its two expressions
    second = search_parts([part], settings, store)[part.name]
    store.close()
    assert len(calls) == 3
    assert [f.program for f in second.found] == [f.program for f in first.found]
    assert all(q["cached"] for q in second.stats["pieces"])

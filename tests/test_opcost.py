"""The measured cost model: node signatures, single-operator timings in the cache, the cost stage.

No timing is asserted against another (timed tests on a shared machine are
coin flips); what is asserted is what gets timed, what is folded or
estimated, that a second run times nothing, and how the cost stage ranks.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_models import lstm_cell

from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.runtime.cache import MeasurementCache
from einopt.runtime.opcost import Calibration, OpCosts, Prediction, node_costs
from einopt.search import Budget
from einopt.stages.context import StageContext
from einopt.stages.partsearch import PartSearch, Settings, search_parts
from einopt.stages.predict import predict

# The LSTM cell's gate search finds 16 programs within its first 300 states.
LSTM_SEARCH = Settings(Budget(states_per_search=500))

F = onnx.TensorProto.FLOAT


def make(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    """A model from value infos and initializer protos (any element type)."""
    m = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    m.ir_version = 8
    return m


def _matmul_model(m: int, k: int, n: int, name: str = "x", weight_input: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)
    inputs = [helper.make_tensor_value_info(name, F, [m, k])]
    inits = [numpy_helper.from_array(w, "w")]
    if weight_input:  # a light instantiation declares big weights as inputs
        inputs.append(helper.make_tensor_value_info("w", F, [k, n]))
        inits = []
    nodes = [
        helper.make_node("MatMul", [name, "w"], ["y"]),
        helper.make_node("Reshape", ["y", "shape"], ["z"]),
        helper.make_node("Transpose", ["w"], ["wt"]),  # weights only: folded
        helper.make_node("MatMul", ["z", "wt"], ["out"]),
    ]
    inits.append(numpy_helper.from_array(np.array([m, n], np.int64), "shape"))
    return make(nodes, inputs, [helper.make_tensor_value_info("out", F, [m, k])], inits)


def test_nodes_are_folded_viewed_or_timed_by_signature():
    nodes = node_costs(_matmul_model(2, 8, 4))
    assert [(n.cost.op, n.cost.kind) for n in nodes] == [
        ("MatMul", "timed"),
        ("Reshape", "view"),
        ("Transpose", "folded"),
        ("MatMul", "timed"),
    ]
    first, last = nodes[0].cost, nodes[3].cost
    assert first.what == "MatMul 2x8 8x4" and first.flops == 2 * 2 * 8 * 4
    assert first.bytes == 4 * (2 * 8 + 8 * 4 + 2 * 4)
    assert last.what == "MatMul 2x4 4x8" and last.key != first.key


def test_a_signature_ignores_names_and_reads_shapes_and_weights():
    a = node_costs(_matmul_model(2, 8, 4))[0].cost.key
    assert node_costs(_matmul_model(2, 8, 4, name="other"))[0].cost.key == a
    assert node_costs(_matmul_model(3, 8, 4))[0].cost.key != a
    # a weight declared as an input (by shape) is a weight all the same: same node, same time
    assert node_costs(_matmul_model(2, 8, 4, weight_input=True), weights={"w"})[0].cost.key == a
    # ...but an activation in its place is another node (ONNX Runtime cannot pre-pack it)
    assert node_costs(_matmul_model(2, 8, 4, weight_input=True))[0].cost.key != a


def test_integer_weights_are_part_of_the_signature():
    def reshape(target):
        return make(
            [helper.make_node("Reshape", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
            [helper.make_tensor_value_info("x", F, [4, 6])],
            [helper.make_tensor_value_info("z", F, None)],
            [numpy_helper.from_array(np.array(target, np.int64), "s")],
        )

    def slice_(end):
        consts = [np.array([0], np.int64), np.array([end], np.int64), np.array([1], np.int64)]
        return make(
            [helper.make_node("Slice", ["x", "b", "e", "a"], ["y"])],
            [helper.make_tensor_value_info("x", F, [4, 6])],
            [helper.make_tensor_value_info("y", F, None)],
            [numpy_helper.from_array(c, n) for c, n in zip(consts, "bea", strict=True)],
        )

    assert node_costs(slice_(2))[0].cost.key != node_costs(slice_(3))[0].cost.key
    assert [n.cost.what for n in node_costs(reshape([6, 4]))] == ["", "Relu 6x4"]


def _two_convs(relu_reads_twice: bool = False) -> onnx.ModelProto:
    """``conv(x, W1) + b1 + relu(conv(x, W2) + b2)``: what FSRCNN's PRelu becomes (each bias a
    product of constants, folded); ``relu_reads_twice``: the second conv's sum is read twice."""
    rng = np.random.default_rng(0)
    ws = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), f"w{i}") for i in (1, 2)
    ]
    bs = [numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), f"b{i}") for i in (1, 2)]
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], **pads),
        helper.make_node("Conv", ["x", "w2"], ["c2"], **pads),
        helper.make_node("Mul", ["b1", "b2"], ["b12"]),  # constants only: folded
        helper.make_node("Add", ["c1", "b12"], ["a1"]),
        helper.make_node("Add", ["c2", "b2"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r"]),
        helper.make_node("Add", ["a1", "r"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])]
    if relu_reads_twice:
        nodes.append(helper.make_node("Mul", ["a2", "a2"], ["sq"]))
        outputs.append(helper.make_tensor_value_info("sq", F, [1, 4, 8, 8]))
    return make(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])], outputs, ws + bs)


def test_a_convolution_is_costed_with_the_element_wise_nodes_fused_into_it():
    nodes = node_costs(_two_convs())
    assert [(n.cost.op, n.cost.kind) for n in nodes] == [
        ("Conv", "timed"),
        ("Conv", "timed"),
        ("Mul", "folded"),
    ]
    first, second = (n.cost.what for n in nodes[:2])
    assert first == "Conv 1x3x8x8 4x3x3x3 + Add + Add"  # the bias, then the sum with the ReLU's output
    assert second == "Conv 1x3x8x8 4x3x3x3 + Add + Relu"
    assert nodes[0].cost.key != nodes[1].cost.key != node_costs(_two_convs(True))[1].cost.key
    # A value read twice ends its group there: the ReLU is timed on its own.
    split = node_costs(_two_convs(relu_reads_twice=True))
    assert [n.cost.what for n in split if n.cost.kind == "timed"] == [
        "Conv 1x3x8x8 4x3x3x3 + Add + Add",
        "Conv 1x3x8x8 4x3x3x3 + Add",
        "Relu 1x4x8x8",
        "Mul 1x4x8x8 1x4x8x8",
    ]


def test_a_fused_group_runs_as_one_session_equal_to_its_nodes(costs):
    """The group's single session computes what its nodes compute in the model."""
    import onnxruntime as ort

    from einopt.runtime.opcost import _single

    model = _two_convs()
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    nodes = node_costs(model)
    group, feeds = _single(nodes[1], np.random.default_rng(0))
    assert [n.op_type for n in group.graph.node] == ["Conv", "Add", "Relu"]
    got = ort.InferenceSession(group.SerializeToString()).run(None, {group.graph.input[0].name: x})[0]
    w2, b2 = (numpy_helper.to_array(t) for t in model.graph.initializer if t.name in ("w2", "b2"))
    ref = make(
        model.graph.node[1:2]
        + [helper.make_node("Add", ["c2", "b2"], ["a2"]), helper.make_node("Relu", ["a2"], ["r"])],
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("r", F, None)],
        [numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b2, "b2")],
    )
    want = ort.InferenceSession(ref.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (p,) = costs.predict([(model, ())])
    assert [n.kind for n, _ in p.nodes] == ["timed", "timed", "folded"] and costs.measured == 2


@pytest.fixture
def costs(tmp_path):
    store = MeasurementCache(tmp_path / "m.sqlite")
    yield OpCosts(store)
    store.close()


def test_nodes_are_timed_once_and_kept_in_the_cache(costs, tmp_path):
    model = _matmul_model(4, 64, 32)
    (p,) = costs.predict([(model, ())])
    assert costs.measured == 2  # two MatMuls; the Transpose is folded, the Reshape a view
    assert p.seconds > 0 and p.timed_fraction > 0.5
    kinds = [n.kind for n, _ in p.nodes]
    assert kinds == ["timed", "view", "folded", "timed"]
    assert dict(zip(kinds, [s for _, s in p.nodes], strict=True))["folded"] == 0.0
    assert costs.predict([(model, ())])[0].seconds == p.seconds and costs.measured == 2
    costs.cache.close()
    again = OpCosts(MeasurementCache(tmp_path / "m.sqlite"))
    assert again.predict([(model, ())])[0].seconds == p.seconds
    assert again.measured == 0
    assert again.calibration == costs.calibration
    again.cache.close()


def test_estimates_are_scaled_by_what_timed_nodes_took_against_theirs(costs):
    """A node without a time is estimated at the machine's best rates times the median ratio of timed
    to estimated seconds: per operator, or over every operator for one never timed."""
    timed, other = node_costs(_matmul_model(4, 64, 32)), node_costs(_matmul_model(8, 128, 32))
    costs.measure(timed)
    assert costs.prediction(other).timed_fraction == 0.0 and costs.scale == {}
    plain = costs.prediction(other).seconds
    costs.learn(timed)
    cal = costs.calibration
    ratios = [
        costs._stored(n.cost.key)["seconds"] / cal.analytic(n.cost.flops, n.cost.bytes)
        for n in timed
        if n.cost.kind == "timed"
    ]
    assert costs.scale == {"": pytest.approx(np.median(ratios)), "MatMul": pytest.approx(np.median(ratios))}
    scaled = sum(
        cal.analytic(n.cost.flops, n.cost.bytes) * costs.scale["MatMul"]
        for n in other
        if n.cost.kind == "timed"
    )
    assert costs.prediction(other).seconds == pytest.approx(scaled + cal.kernel_s)  # the Reshape: a view
    costs.scale = {"": 1e6}
    assert costs.prediction(other, bound=True).seconds <= plain  # a lower bound stays unscaled


def test_calibration_is_plausible(costs):
    cal = costs.calibration
    assert isinstance(cal, Calibration)
    assert 1e8 < cal.bandwidth < 1e13 and 1e8 < cal.flops < 1e14
    assert 0 < cal.kernel_s < 1e-3 and 0 <= cal.run_s < 1e-2
    assert cal.bound(0, 0) == cal.kernel_s
    assert cal.analytic(10**9, 0) > cal.bound(10**9, 0) > 0


def test_a_node_that_cannot_run_alone_is_estimated(costs):
    # Gather with indices out of range for random values is fine (they are made in range); a node whose
    # shapes inference cannot know is estimated from nothing: kernel time only
    model = make(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("NonZero", ["y"], ["z"])],
        [helper.make_tensor_value_info("x", F, [4, 6])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.INT64, None)],
        [],
    )
    (p,) = costs.predict([(model, ())])
    assert [n.kind for n, _ in p.nodes] == ["timed", "analytic"]
    assert p.nodes[1][1] == costs.calibration.analytic(0, 0)


def test_a_gather_is_timed_on_indices_in_range(costs):
    idx = onnx.TensorProto(name="i", data_type=onnx.TensorProto.INT64, dims=[5, 3])  # by shape only
    model = make(
        [
            helper.make_node("Constant", [], ["i"], value=idx),
            helper.make_node("Gather", ["x", "i"], ["y"], axis=1),
        ],
        [helper.make_tensor_value_info("x", F, [4, 6])],
        [helper.make_tensor_value_info("y", F, [4, 5, 3])],
        [],
    )
    (p,) = costs.predict([(model, ())])
    assert [n.kind for n, _ in p.nodes] == ["timed"] and costs.measured == 1


def test_the_cost_stage_ranks_found_programs_by_measured_operators(tmp_path):
    model = prepare(lstm_cell(hidden=16), {}, fold=True).model
    parts = [p for p in translate_graph(model) if p.translated]
    store = MeasurementCache(tmp_path / "m.sqlite")
    searches = search_parts(parts, LSTM_SEARCH, store)
    (gates,) = [p for p in parts if len(searches[p.name].candidates) > 3]
    costs = OpCosts(store)
    out = predict(StageContext(model, model), parts, searches, costs)
    ranked = out[gates.name].candidates
    assert len(ranked) == len(searches[gates.name].candidates)
    assert [f.cost for f in ranked] == sorted(f.cost for f in ranked)
    assert all(f.estimated_cost is not None for f in ranked)
    assert {f.estimated_cost for f in ranked} == {f.cost for f in searches[gates.name].candidates}
    measured = costs.measured
    assert measured > 0
    # a second stage over the same searches times nothing
    predict(StageContext(model, model), parts, searches, costs)
    assert costs.measured == measured
    store.close()


def test_programs_bound_beyond_the_slack_are_not_timed(tmp_path, monkeypatch):
    import einopt.stages.predict

    model = prepare(lstm_cell(hidden=16), {}, fold=True).model
    parts = [p for p in translate_graph(model) if p.translated]
    store = MeasurementCache(tmp_path / "m.sqlite")
    searches = search_parts(parts, LSTM_SEARCH, store)
    monkeypatch.setattr(einopt.stages.predict, "SLACK", 0.0)  # every derived program is hopeless
    costs = OpCosts(store)
    out = predict(StageContext(model, model), parts, searches, costs)
    inputs = {n.cost.key for p in parts for n in _input_nodes(model, p) if n.cost.kind == "timed"}
    assert costs.measured == len(inputs)
    for p in parts:
        for f in out[p.name].candidates:
            if f.trace:  # bounded: its unmeasured nodes at the peak rates
                assert f.cost > 0
    store.close()


def test_nodes_too_big_for_memory_are_estimated_not_timed(costs, monkeypatch):
    import einopt.runtime.opcost

    model = _matmul_model(4, 64, 32)
    monkeypatch.setattr(einopt.runtime.opcost, "memory_limit", lambda: 0)  # no node fits
    (p,) = costs.predict([(model, ())])
    assert costs.measured == 0
    assert [n.kind for n, _ in p.nodes] == ["analytic", "view", "folded", "analytic"]
    assert p.seconds > 0


def test_found_programs_too_big_for_memory_are_not_tried(tmp_path, monkeypatch):
    import einopt.stages.predict

    model = prepare(lstm_cell(hidden=16), {}, fold=True).model
    parts = [p for p in translate_graph(model) if p.translated]
    store = MeasurementCache(tmp_path / "m.sqlite")
    searches = search_parts(parts, LSTM_SEARCH, store)
    monkeypatch.setattr(einopt.stages.predict, "memory_limit", lambda: 0)  # nothing fits
    out = predict(StageContext(model, model), parts, searches, OpCosts(store))
    derived = [f for p in parts for f in out[p.name].candidates if f.trace]
    assert derived and all(f.cost == float("inf") for f in derived)
    assert all(f.cost < float("inf") for p in parts for f in out[p.name].candidates if not f.trace)
    store.close()


def _input_nodes(model, p):
    from einopt.frontend.translate import value_types
    from einopt.stages.predict import _original

    return node_costs(*_original(model, p, value_types(model)))


def test_the_cost_stage_leaves_parts_without_a_search_alone(costs):
    model = prepare(lstm_cell(hidden=4), {}, fold=True).model
    parts = [p for p in translate_graph(model) if p.translated]
    searches = {p.name: PartSearch.not_searched() for p in parts}
    assert predict(StageContext(model, model), parts, searches, costs) == searches
    assert costs.measured == 0


def test_a_batched_matmul_is_bounded_by_its_gemm_calls():
    model = make(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        [
            helper.make_tensor_value_info("a", F, [6, 1, 3, 1, 8]),
            helper.make_tensor_value_info("b", F, [6, 5, 1, 8, 1]),
        ],
        [helper.make_tensor_value_info("c", F, None)],
        [],
    )
    (n,) = node_costs(model)
    assert n.cost.calls == 6 * 5 * 3
    cal = Calibration(bandwidth=1e10, flops=1e11, run_s=0.0, kernel_s=1e-9)
    assert cal.bound(n.cost.flops, n.cost.bytes, n.cost.calls) >= 90 * 1e-7


def test_the_most_promising_programs_are_measured_first():
    """Rounds of each part's best predicted program not yet timed, the biggest predicted saving first;
    a timing that makes a program look worse lets the part's next one into the following round."""
    import time as clock

    from einopt.stages.predict import _measure_promising

    class Costs:  # node "name:estimate:measured": estimated until measured
        def __init__(self):
            self.timed, self.rounds = set(), []

        def prediction(self, ns):
            return Prediction(sum(float(n.split(":")[2 if n in self.timed else 1]) for n in ns), ())

        def measure(self, ns, deadline, ordered=False):
            ns = list(ns)
            self.rounds.append(ns)
            self.timed |= set(ns)

        def learn(self, ns):
            pass

    nodes = {
        ("a", 1): ["a1:1:9"],  # looks best, measures badly
        ("a", 2): ["a2:3:3"],
        ("a", 3): ["a3:4:4"],
        ("b", 1): ["b1:2:2"],
    }
    costs = Costs()
    _measure_promising(costs, nodes, {"a": 5.0, "b": 3.0}, clock.monotonic() + 60)
    assert costs.rounds == [["a1:1:9", "b1:2:2"], ["a2:3:3"], ["a3:4:4"]]
    costs = Costs()
    _measure_promising(costs, nodes, {"a": 5.0, "b": 3.0}, clock.monotonic() - 1)
    assert costs.rounds == []


def test_a_node_is_timed_against_its_twin_which_runs_its_inputs_and_computes_nothing():
    """The run's overhead is taken off in pairs: the twin, fed the node's inputs, is called right
    before each timed call, and what is kept is the median of the differences."""
    import time

    import onnxruntime as ort

    from einopt.runtime.opcost import _single, _time_cold, _twin

    nodes = node_costs(_matmul_model(2, 8, 4))
    single, feeds = _single(nodes[0], np.random.default_rng(0))
    twin = _twin(single)
    assert [n.op_type for n in twin.graph.node] == ["Shape"]
    assert [i.name for i in twin.graph.input] == [
        i.name for i in single.graph.input
    ] and not twin.graph.initializer
    (shape,) = ort.InferenceSession(twin.SerializeToString()).run(None, feeds)
    assert shape.tolist() == [2, 8]
    # 3 ms against a 2 ms twin: the node's own 1 ms (sleeps are coarse, not that coarse)
    got = _time_cold({"n": lambda: time.sleep(3e-3)}, lambda: None, twins={"n": lambda: time.sleep(2e-3)})
    assert 0.5e-3 < got["n"] < 1.8e-3
    alone = _time_cold({"n": lambda: time.sleep(3e-3)}, lambda: None)
    assert alone["n"] >= 3e-3

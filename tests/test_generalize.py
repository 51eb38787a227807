"""Rewrites of models with symbolic dimensions written for every value of them
(:mod:`einopt.stages.generalize`): sizes solved from a second translation, computed at run time."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import assert_same_outputs, disable_operators

from einopt.core.rewrite import rename_tensors
from einopt.errors import ModelError
from einopt.frontend.fold import prepare
from einopt.frontend.symbolic import DimRange, Dims, check_assignments, keep_symbolic, parse_dim
from einopt.frontend.translate import translate_graph
from einopt.instantiate.backend import PORTABLE
from einopt.instantiate.emit import Instantiated, instantiate
from einopt.pipeline import Options, optimize
from einopt.rules import get as get_rule
from einopt.rules.base import Context
from einopt.rules.derive import Apply, derive
from einopt.runtime import modelio
from einopt.search.results import Candidate
from einopt.stages.export import assemble
from einopt.stages.generalize import Probe, _Sizes, generalized
from einopt.stages.partsearch import canonical_names

VERIFIED = Options(max_depth=0, accept="verified", cache=False)
SHAPES = [(1, 1), (2, 48), (5, 77), (3, 128)]


def _model(nodes, inits, inputs=("x",), hidden=64, out_shape=("batch", "seq", 64)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", hidden]) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _add_layer_norm() -> onnx.ModelProto:
    """``LayerNormalization(x + r)`` over ``[batch, seq, 64]``: the matcher normalises the rows
    merged into one dimension (a Reshape there and one back, written for the searched shape)."""
    rng = np.random.default_rng(0)
    inits = {"g": rng.standard_normal(64).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)}
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    return _model(nodes, inits, inputs=("x", "r"))


def _split_heads() -> onnx.ModelProto:
    """A projection split into 4 heads by a Reshape whose target is computed from ``Shape`` (as
    exporters write it for a symbolic batch and sequence), then the heads moved forward."""
    rng = np.random.default_rng(1)
    inits = {
        "w": rng.standard_normal((64, 64)).astype(np.float32),
        "i0": np.array([0], np.int64),
        "i1": np.array([1], np.int64),
        "heads": np.array([4, 16], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Concat", ["b", "s", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["h"]),
        helper.make_node("Transpose", ["h"], ["y"], perm=[0, 2, 1, 3]),
    ]
    return _model(nodes, inits, out_shape=("batch", 4, "seq", 16))


def _feeds(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    return modelio.random_inputs(model, 7, {i.name: (batch, seq, 64) for i in model.graph.input})


def _declared(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("make", [_add_layer_norm, _split_heads], ids=["layer-norm", "split-heads"])
def test_a_rewrite_with_sizes_of_the_searched_shape_is_written_for_every_shape(make):
    model = make()
    result = optimize(model, VERIFIED)
    assert result.changed(), result.report()
    assert all(p.status == "rewritten" for p in result.parts if p.kind != "passthrough"), [
        (p.name, p.status, p.reason) for p in result.parts
    ]
    out = result.model
    onnx.checker.check_model(out, full_check=True)
    assert _declared(out.graph.input[0]) == _declared(model.graph.input[0])
    assert _declared(out.graph.output[0]) == _declared(model.graph.output[0])
    # the sizes of batch and seq are read from an input's Shape at run time, none written as constants
    assert any(n.op_type == "Shape" and n.name.startswith("sp") for n in out.graph.node)
    for batch, seq in SHAPES:
        assert_same_outputs(model, out, _feeds(model, batch, seq))


def test_a_reshape_with_a_computed_target_is_translated_with_its_neighbours():
    result = optimize(_split_heads(), VERIFIED)
    (linear,) = [p for p in result.parts if p.kind != "passthrough"]
    assert sorted(linear.ops) == ["MatMul", "Reshape", "Transpose"]


def test_the_shape_computation_that_only_the_replaced_nodes_read_goes_with_them():
    out = optimize(_split_heads(), VERIFIED).model
    assert not any(n.op_type == "Concat" and n.output[0] == "target" for n in out.graph.node)
    read = {i for n in out.graph.node for i in n.input} | {"y"}
    assert all(any(o in read for o in n.output) for n in out.graph.node)


def test_a_pinned_model_keeps_constant_sizes():
    model = _add_layer_norm()
    shapes = {"x": (2, 8, 64), "r": (2, 8, 64)}
    pinned = optimize(model, Options(max_depth=0, accept="verified", cache=False, input_shapes=shapes))
    assert pinned.changed()
    assert not any(n.op_type == "Shape" for n in pinned.model.graph.node)


@pytest.mark.parametrize(
    ("rep", "probe", "solved"),
    [
        (64, 64, (64, (0, 0))),  # the same at both: a constant
        (1, 3, (1, (1, 0))),  # the batch
        (128, 195, (1, (1, 1))),  # batch * sequence
        (256, 390, (2, (1, 1))),  # twice that
        (16384, 4225, (1, (0, 2))),  # sequence squared
        (127, 64, None),  # sequence - 1: no product of the dimensions
        (64, 32, None),  # half the sequence: not at an odd one
    ],
)
def test_a_size_is_solved_as_a_product_of_the_dimensions(rep, probe, solved):
    sizes = _Sizes(["batch", "sequence"], [(1, 3), (128, 65)])
    assert sizes.solve(rep, probe) == solved


def test_half_a_sequence_declared_even_is_solved():
    sizes = _Sizes(["batch", "sequence"], [(1, 3), (128, 66)])
    assert sizes.solve(64, 33) == (Fraction(1, 2), (0, 1))


def test_a_size_two_products_fit_equally_is_not_solved():
    sizes = _Sizes(["height", "width"], [(224, 224), (113, 113)])  # a height and a width alike
    assert sizes.solve(224, 113) is None


# --------------------------------------------------------------------------
# A rewrite that depends on a dimension's value: guarded by the declared values
# --------------------------------------------------------------------------


def _projection() -> onnx.ModelProto:
    """``x @ w`` over ``[batch, seq, 8]``."""
    w = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return _model(nodes, {"w": w}, hidden=8, out_shape=("batch", "seq", 8))


def _translated(model: onnx.ModelProto, batch: int, seq: int):
    prepared = prepare(model, representative={"x": (batch, seq, 8)})
    (part,) = [p for p in translate_graph(prepared.model) if p.program is not None]
    return prepared.model, part


def _split_in_halves(part) -> Candidate:
    """The part's sequence split at its middle (two projections, each over half of it): a
    derivation that holds where the sequence is even only, in the part's canonical names as the
    search takes it."""
    names = canonical_names(part.program)
    canon = rename_tensors(part.program, names)
    ctx = Context({names[n]: v for n, v in part.constants.items()})
    half = next(t for t in part.program.inputs if len(t.shape) == 3).shape[1] // 2
    (match,) = [
        m
        for m in get_rule("split_expression").match(canon, ctx)
        if f" at {half} " in getattr(m, "summary", "")
    ]
    trace = derive(canon, [Apply("split_expression", match.where, match.summary)], ctx, verify=False)
    program = rename_tensors(trace.result, {v: n for n, v in names.items()})
    return Candidate(program, trace.steps, (), 0.0)


def _written(seq_at_probe: int):
    model = _projection()
    rep_model, part = _translated(model, 1, 16)
    translations = []
    for batch, seq in [(3, seq_at_probe), (7, 2 * seq_at_probe)]:
        at, there = _translated(model, batch, seq)
        translations.append(({"batch": batch, "seq": seq}, at, [there]))
    probe = Probe.of({"batch": 1, "seq": 16}, translations, [part])
    candidate = _split_in_halves(part)
    inst = instantiate(
        candidate.program, onnx_names=part.names, constants=part.constants, opset=17, prefix="p/"
    )
    out, why = generalized(probe, part, candidate, inst, opset=17, taken=set(), backend=PORTABLE)
    return model, keep_symbolic(assemble(rep_model, {part.nodes: out}), model), inst, out, why


def test_a_rewrite_that_needs_an_even_sequence_is_left_out_at_an_odd_one():
    _, _, inst, out, why = _written(9)
    assert out is inst and "is no product of the symbolic dimensions" in why and "seq=9" in why


def test_a_rewrite_that_needs_an_even_sequence_is_kept_where_the_sequence_is_declared_even():
    model, written, _, out, why = _written(10)
    assert why == "" and any(n.op_type == "Div" for n in out.nodes)  # half the sequence, at run time
    for batch, seq in [(1, 2), (2, 6), (3, 40), (1, 16)]:
        assert_same_outputs(model, written, modelio.random_inputs(model, 5, {"x": (batch, seq, 8)}))


def test_declared_values_choose_where_a_model_is_verified_and_probed():
    dims = Dims({"batch": 1, "seq": 128}, {"x": ("batch", "seq", 8)}, (), {"seq": DimRange(64, 512, 64)})
    assert check_assignments(dims) == [
        {"batch": 1, "seq": 64},
        {"batch": 3, "seq": 64},
        {"batch": 1, "seq": 512},
    ]
    plain = Dims({"batch": 1, "h": 224, "w": 224}, {"x": ("batch", 3, "h", "w")})
    assert check_assignments(plain) == [{"batch": 1, "h": 1, "w": 1}, {"batch": 3, "h": 113, "w": 115}]


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("seq=64", ("seq", 64, None)),
        ("seq=1..512", ("seq", None, DimRange(1, 512))),
        ("seq=64..512/64", ("seq", None, DimRange(64, 512, 64))),
    ],
)
def test_a_dim_is_a_value_or_the_values_it_takes(spec, parsed):
    assert parse_dim(spec) == parsed


@pytest.mark.parametrize("spec", ["seq", "seq=0", "seq=8..4", "seq=3..5/8", "seq=a..b"])
def test_a_bad_dim_is_a_clear_error(spec):
    with pytest.raises(ModelError):
        parse_dim(spec)


def test_a_value_outside_the_declared_range_is_a_clear_error():
    with pytest.raises(ModelError, match="outside its declared range 1..64"):
        optimize(_projection(), Options(max_depth=0, dims={"seq": 128}, dim_ranges={"seq": DimRange(1, 64)}))


def test_the_default_value_moves_into_the_declared_range():
    result = optimize(
        _projection(),
        Options(max_depth=0, accept="verified", cache=False, dim_ranges={"seq": DimRange(1, 64)}),
    )
    section = result.report()["symbolic"]
    assert {d["name"]: (d["searched_at"], d["declared"]) for d in section["dimensions"]} == {
        "batch": (1, None),
        "seq": (64, "1..64"),
    }
    assert section["verified_at"] == [
        {"batch": 1, "seq": 64},
        {"batch": 1, "seq": 1},
        {"batch": 3, "seq": 33},
    ]


def test_inputs_of_another_shape_than_a_pinned_one_are_a_clear_error():
    model = _projection()
    x = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(ModelError, match=r"--inputs give x the shape \[2, 4, 8\], but --input-shape pins it"):
        optimize(model, Options(max_depth=0, input_shapes={"x": (1, 4, 8)}, inputs=({"x": x},)))


def test_unverified_a_rewrite_is_kept_symbolic_only_where_the_probe_writes_it_for_every_shape(monkeypatch):
    model = _split_heads()  # its rewrite's sizes are computed at run time: kept, and right at any shape
    result = optimize(model, Options(max_depth=0, accept="verified", cache=False, verify=False))
    assert result.changed()
    for batch, seq in SHAPES:
        assert_same_outputs(model, result.model, _feeds(model, batch, seq))
    disable_operators(monkeypatch)  # eOperators: functions written for the searched shape
    unverified = Options(max_depth=0, accept="verified", cache=False, verify=False, specialize=False)
    result = optimize(model, unverified)
    assert not result.changed()
    assert all(p.status == "left out" for p in result.parts if p.kind != "passthrough")
    # run at the searched shape only, the input's own nodes elsewhere: right at any shape unverified too
    result = optimize(model, dataclasses.replace(unverified, specialize=True))
    assert result.changed()
    assert all(p.only_at == "batch=1, seq=128" for p in result.parts if p.kind != "passthrough")
    for batch, seq in SHAPES:
        assert_same_outputs(model, result.model, _feeds(model, batch, seq))


def test_a_reshape_target_the_caller_may_feed_is_not_read_as_its_inferred_shape():
    """An initializer listed as a graph input (older exporters) can be overridden by a feed: a Reshape
    target of that kind passes through, as before (the part would otherwise drop it and leave the
    input declared with nothing to read it)."""
    target = np.array([4, 16], np.int64)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "t"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4, 4]),
            helper.make_tensor_value_info("t", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(target, "t")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = optimize(model, VERIFIED)
    reshape = next(p for p in result.parts if "Reshape" in p.ops)
    assert reshape.kind == "passthrough" and "not a constant" in reshape.reason


def test_the_report_and_the_html_say_which_dimensions_stayed_symbolic_and_what_was_left_out(monkeypatch):
    from einopt.reports.report import validate_report
    from einopt.reports.report_html import render_html

    disable_operators(monkeypatch)  # eOperators written for the searched shape: left out
    result = optimize(_split_heads(), dataclasses.replace(VERIFIED, specialize=False))
    report = json.loads(json.dumps(result.report() | {"model": "m.onnx", "output": "o.onnx"}))
    validate_report(report)  # as written to a file
    section = report["symbolic"]
    assert [d["name"] for d in section["dimensions"]] == ["batch", "seq"]
    assert section["left_out"] and section["left_out"] == [
        p.name for p in result.parts if p.status == "left out"
    ]
    assert section["probes"][0] == {"batch": 3, "seq": 65}
    html = render_html(report)
    assert "<h2>Symbolic dimensions</h2>" in html and "batch=3, seq=65" in html
    assert section["left_out"][0] in html and 'class="badge left-out"' in html


def test_a_rewrite_whose_output_nothing_reads_any_more_goes_with_its_producers():
    """A part folded to a constant leaves the rewrite of the part before it with no reader: it goes,
    like the input's nodes that computed only for the replaced ones (kept, it read a value no node
    writes any more)."""
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "k"], ["v6"]),
            helper.make_node("Transpose", ["v6"], ["v7"], perm=[1, 0]),
            helper.make_node("ReduceMax", ["v7"], ["v8"], keepdims=1),
            helper.make_node("Add", ["v8", "c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [
            numpy_helper.from_array(np.array([4, 1], np.int64), "k"),
            numpy_helper.from_array(np.zeros((1, 1), np.float32), "c"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    transpose = Instantiated((helper.make_node("Reshape", ["v6", "p/shape"], ["v7"]),), (), (), ())
    folded = Instantiated(
        (helper.make_node("Identity", ["q/y"], ["y"]),),
        (numpy_helper.from_array(np.ones((1, 1), np.float32), "q/y"),),
        (),
        (),
    )
    out = assemble(model, {(1,): transpose, (3,): folded})
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Identity"]

"""`einopt.optimize` end to end on small models: translate, re-instantiate, verify, roll back."""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3

import numpy as np
import onnx
import pytest
from onnx_models import append_to_output, conv_block, disable_operators, lstm_cell, prelu_block, tiny_model
from onnx_models import assert_same_outputs as _assert_same
from onnx_models import random_feeds as _random_feeds

import einopt
from einopt import pipeline
from einopt.errors import UnsupportedModelError
from einopt.pipeline import Options, optimize
from einopt.runtime import modelio
from einopt.stages import select

# These tests are about the round trip (translate, re-instantiate, verify): every verified
# rewrite is kept untimed. Measured acceptance has its own tests (test_accept.py).
# Depth 0: these tests are about the round trip (translate, instantiate, verify, assemble); the
# search's rewrites are tests/test_optimize_search.py's.
VERIFIED = Options(max_depth=0, accept="verified")


def _round_tripped(result) -> bool:
    """Every translated subprogram came back verified (rewritten or as the same nodes)."""
    c = result.counts()
    return c["subprograms"] > 0 and c["rewritten"] + c["unchanged"] == c["subprograms"]


def test_conv_block_round_trip():
    model = conv_block()
    result = optimize(model, VERIFIED)
    assert result.verified and not result.blocked
    c = result.counts()
    assert c["nodes"] == 5 and c["translated"] == 5 and _round_tripped(result), result.report()
    out = result.model
    onnx.checker.check_model(out, full_check=True)
    # same interface and metadata
    assert [i.name for i in out.graph.input] == ["x"] and [o.name for o in out.graph.output] == ["y"]
    assert out.graph.output[0].type == model.graph.output[0].type
    assert list(out.opset_import) == list(model.opset_import)
    assert out.doc_string == model.doc_string
    assert {p.key: p.value for p in out.metadata_props} == {"author": "einopt tests"}
    # re-instantiated through operator matching as the same kernels (bias fused back into Conv)
    assert sorted(n.op_type for n in out.graph.node) == ["Add", "Conv", "Conv", "Relu", "Relu"]
    _assert_same(model, out, _random_feeds(model))
    kinds = [(p.kind, p.ops) for p in result.parts]
    assert kinds == [
        ("linear", ("Conv",)),
        ("activation", ("Relu",)),
        ("linear", ("Conv", "Add")),
        ("activation", ("Relu",)),
    ]


def test_lstm_cell_groups_shared_inputs():
    model = lstm_cell()
    result = optimize(model, VERIFIED)
    assert result.verified and _round_tripped(result)
    linear = [p for p in result.parts if p.kind == "linear"]
    # the 8 matmuls and 4 adds that read x and h form one subprogram (the search can merge them)
    assert any(sorted(p.ops).count("MatMul") == 8 for p in linear), [p.ops for p in linear]
    _assert_same(model, result.model, _random_feeds(model))


def test_wrong_rewrite_is_rolled_back(monkeypatch, caplog):
    """A rewrite that negates its output (a stand-in for a wrong derivation) is caught and rolled back."""
    model = conv_block()
    append_to_output(
        monkeypatch, "conv2", lambda first, out, p: ([onnx.helper.make_node("Neg", [first], [out])], [])
    )
    with caplog.at_level(logging.WARNING, logger="einopt"):
        result = optimize(model, VERIFIED)
    failed = [p for p in result.parts if p.status == "failed"]
    assert [p.ops for p in failed] == [("Conv", "Add")]
    assert "verification failed" in failed[0].reason
    assert any(failed[0].name in rec.getMessage() for rec in caplog.records)
    assert result.counts()["failed"] == 1 and result.counts()["subprograms"] == 4
    _assert_same(model, result.model, _random_feeds(model))


def test_failed_instantiation_passes_through(monkeypatch):
    model = conv_block()

    def boom(program, **kw):
        raise RuntimeError("no luck")

    monkeypatch.setattr(select, "instantiate", boom)
    result = optimize(model, VERIFIED)
    assert result.counts()["rewritten"] == 0 and result.counts()["failed"] == 4
    assert result.model.SerializeToString() == model.SerializeToString()  # the input, untouched
    assert all(
        "instantiation failed: RuntimeError: no luck" in p.reason
        for p in result.parts
        if p.kind != "passthrough"
    )
    _assert_same(model, result.model, _random_feeds(model))


def test_a_symbolic_batch_is_searched_at_one_and_stays_symbolic():
    model = prelu_block(batch="N")
    result = optimize(model, Options(max_depth=2, accept="verified", cache=False, states_per_search=300))
    assert result.changed()  # the PRelu as max(y, a*y): it holds at any batch
    for vi in (result.model.graph.input[0], result.model.graph.output[0]):
        assert [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim][0] == "N"
    assert any("keeps the symbolic dimensions N: searched and timed at N=1" in n for n in result.notes)
    assert any("verified there and at N=3" in n for n in result.notes)
    for batch in (1, 2, 5):
        feeds = modelio.random_inputs(model, batch, {"x": (batch, 4, 8, 8)})
        _assert_same(model, result.model, feeds)


def test_a_rewrite_that_holds_at_the_representative_batch_only_is_left_out(monkeypatch):
    disable_operators(monkeypatch)  # eOperators: functions whose Reshapes are written for the batch of 1
    model = conv_block(batch="N")
    result = optimize(model, dataclasses.replace(VERIFIED, specialize=False))
    assert not result.changed() and result.model.SerializeToString() == model.SerializeToString()
    for p in result.parts:
        assert p.status == "left out" and p.reason.startswith("holds at the representative shape")
        assert "at N=3" in p.reason


def test_a_symbolic_dim_without_a_value_passes_through():
    model = conv_block(batch="frames")  # no default for the name, no --dim
    result = optimize(model, VERIFIED)
    assert result.counts()["rewritten"] == 0
    assert any("symbolic" in p.reason for p in result.parts)
    assert any("--dim frames=VALUE" in n for n in result.notes)
    given = optimize(model, Options(max_depth=0, accept="verified", dims={"frames": 2}))
    assert _round_tripped(given)
    dims = [d.dim_value or d.dim_param for d in given.model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["frames", 8, 6, 6]


def test_a_pinned_input_writes_a_static_model():
    model = conv_block(batch="N")
    pinned = optimize(model, Options(max_depth=0, accept="verified", input_shapes={"x": (2, 8, 6, 6)}))
    assert _round_tripped(pinned)
    dims = [d.dim_value or d.dim_param for d in pinned.model.graph.input[0].type.tensor_type.shape.dim]
    if pinned.changed():  # rewrites are instantiated for the pinned shapes, and the output says so
        assert dims == [2, 8, 6, 6] and any("pinned input shapes" in n for n in pinned.notes)
    else:  # nothing changed: the output is the input, symbolic dims and all
        assert dims == ["N", 8, 6, 6] and pinned.model.SerializeToString() == model.SerializeToString()


def test_pinned_shapes_stay_in_the_output_of_a_rewrite(monkeypatch):
    disable_operators(monkeypatch)
    pinned = optimize(
        conv_block(batch="N"), Options(max_depth=0, accept="verified", input_shapes={"x": (2, 8, 6, 6)})
    )
    assert pinned.changed()
    dims = [d.dim_value for d in pinned.model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 8, 6, 6] and any("pinned input shapes" in n for n in pinned.notes)


@pytest.mark.parametrize("opset", [6, 99])
def test_an_unsupported_opset_is_an_error(opset):
    model = conv_block()
    model.opset_import[0].version = opset
    with pytest.raises(UnsupportedModelError, match=f"imports default-domain opset {opset}; einopt supports"):
        optimize(model)


def test_given_inputs_are_used_for_verification():
    model = conv_block()
    feeds = _random_feeds(model, seed=9)
    result = optimize(model, Options(max_depth=0, inputs=[feeds], seed=4, accept="verified"))
    assert result.verified and _round_tripped(result)


def test_same_options_same_model():
    a = optimize(conv_block()).model.SerializeToString()
    b = optimize(conv_block()).model.SerializeToString()
    assert a == b


def test_api_is_exported():
    assert einopt.optimize is optimize
    assert einopt.Options is Options


@pytest.mark.parametrize("seed", [0, 1])
def test_report_is_json(seed):
    import json

    report = optimize(conv_block(seed), VERIFIED).report()
    text = json.dumps(report)
    assert json.loads(text)["counts"]["subprograms"] == 4
    assert all("expression" in p for p in report["subprograms"])


def test_broken_folding_is_retried_without_folding(monkeypatch):
    """If the prepared (folded) model differs from the original, einopt optimizes the unfolded one."""
    real = pipeline.prepare

    def bad_prepare(model, shapes, fold=True, **kw):
        prepared = real(model, shapes, fold=fold, **kw)
        if fold:
            w1 = next(t for t in prepared.model.graph.initializer if t.name == "W1")
            w1.CopyFrom(onnx.numpy_helper.from_array(np.zeros_like(onnx.numpy_helper.to_array(w1)), "W1"))
        return prepared

    monkeypatch.setattr(pipeline, "prepare", bad_prepare)
    model = conv_block()
    result = optimize(model, VERIFIED)
    assert result.verified and _round_tripped(result)
    assert any("folding skipped" in n for n in result.notes)
    _assert_same(model, result.model, _random_feeds(model))


def test_eoperators_in_a_written_model(monkeypatch, tmp_path):
    """With no predefined operator available, every subprogram becomes an eOperator: model-local
    functions in domain einopt.eop that stock ONNX Runtime runs, verified equal to the original."""
    disable_operators(monkeypatch)
    model = conv_block()
    result = optimize(model, VERIFIED)
    assert result.verified and result.counts()["rewritten"] == 4
    out = result.model
    assert {n.domain for n in out.graph.node} == {"einopt.eop"}
    assert len(out.functions) == len(out.graph.node) == 6  # conv1's bias add is an eOperator of its own
    assert all(f.domain == "einopt.eop" for f in out.functions)
    assert sum("Contract" in f.name for f in out.functions) == 2  # the two convolutions
    assert all("L[" in f.doc_string for f in out.functions)  # the expression text
    assert {o.domain: o.version for o in out.opset_import}["einopt.eop"] == 1
    onnx.checker.check_model(out, full_check=True)
    result.save(tmp_path / "eop.onnx")
    reloaded = onnx.load(str(tmp_path / "eop.onnx"))
    _assert_same(model, reloaded, _random_feeds(model))


@pytest.mark.parametrize("make_model", [conv_block, lstm_cell], ids=["conv_block", "lstm_cell"])
def test_translated_subprograms_round_trip_through_the_text_syntax(make_model):
    from einopt.frontend.fold import prepare

    parts = einopt.translate(prepare(make_model()).model)
    assert parts and all(p.program is not None for p in parts)
    for p in parts:
        assert einopt.parse(einopt.format_expr(p.program)) is p.program


@pytest.mark.parametrize("batch", [1, 4])
def test_pointwise_conv_stays_a_conv_at_any_batch(batch):
    """A 1x1 conv with bias also matches Gemm (at batch > 1 only through transposes): the original Conv wins."""
    from onnx_models import make

    w = np.random.default_rng(0).standard_normal((6, 5, 1, 1)).astype(np.float32)
    node = onnx.helper.make_node("Conv", ["x", "w", "b"], ["y"], name="pw")
    inits = {"w": w, "b": np.ones(6, np.float32)}
    model = make([node], [("x", [batch, 5, 7, 7])], [("y", [batch, 6, 7, 7])], inits)
    result = optimize(model, Options(max_depth=0, seed=0, accept="verified"))
    (part,) = result.parts
    assert result.verified and part.status in ("rewritten", "unchanged"), part
    assert "Transpose" not in part.new_ops, part.new_ops
    assert part.new_ops == ("Conv",) and part.status == "unchanged"  # the original operator is preferred


def _plant_a_dropped_relu(cache) -> None:
    """Put, first in every search stored in ``cache``, a 'found' program that leaves the Relu out."""
    planted = {
        "program": "y0 = L[i0:2, i1:8] x0[i0, i1]\nreturn y0\nwhere x0: [2, 8]",
        "trace": [["planted", "y0", "the Relu left out"]],
        "operators": ["Identity"],
        "predicted_s": 1e-12,
        "work": ["Identity 2x8"],
    }
    with sqlite3.connect(cache) as db:
        rows = db.execute("SELECT key, value FROM searches").fetchall()
        assert rows
        for key, value in rows:
            value = json.loads(value)
            value["found"].insert(0, planted)
            db.execute("UPDATE searches SET value = ? WHERE key = ?", (json.dumps(value), key))
    db.close()


@pytest.mark.parametrize("verify", [False, True])
def test_a_planted_search_result_is_read_only_when_it_is_verified(verify, tmp_path):
    """Searches read from the cache become candidates: without verification the cache is not read
    (the search runs again); with it, a wrong one is read and fails verification."""
    model = tiny_model([onnx.helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 8])], [("y", [2, 8])])
    options = Options(max_depth=1, verify=verify, cache=tmp_path / "c.sqlite", accept="verified")
    optimize(model, options)
    _plant_a_dropped_relu(tmp_path / "c.sqlite")
    result = optimize(model, options)
    (part,) = [p for p in result.parts if p.kind != "passthrough"]
    assert part.search["cached"] is verify
    planted = [c for c in part.search["candidates"] if c["trace"]]
    if verify:
        assert planted and planted[0]["verified"] is False
    else:
        assert not planted
    assert part.status == "unchanged"
    _assert_same(model, result.model, _random_feeds(model))

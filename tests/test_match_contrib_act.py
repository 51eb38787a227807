"""ONNX Runtime's com.microsoft activations: QuickGelu, FastGelu, Gelu, BiasGelu (``match_contrib_act``).

The same checks as ``test_match_contrib``: each IR body (written with the Python API in the
arrangements exporters and importers use, or imported from ONNX's Gelu) is matched, emitted,
checked, run in ONNX Runtime at both optimization extremes and compared with the reference
interpreter, on random inputs and on the edges (zero, tiny, saturated, large); near misses are
refused with their reason.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper
from test_match_contrib import LEVELS, attrs_of, contrib, emit_and_run, session

import einopt
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.frontend.fold import prepare
from einopt.frontend.importers_elementwise import gelu
from einopt.frontend.translate import translate_graph
from einopt.instantiate.emit import instantiate, original_ops
from einopt.instantiate.match import match
from einopt.instantiate.match_contrib import CONTRIB_DOMAIN, CONTRIB_MATCHERS
from einopt.instantiate.match_contrib_act import (
    match_bias_gelu,
    match_fast_gelu,
    match_gelu,
    match_quick_gelu,
)
from einopt.instantiate.plan import OperatorMatch, Refusal
from einopt.instantiate.program import program_model
from einopt.runtime.opcost import node_costs

ROW, J = ir.Iter("i", 0, 3), ir.Iter("j", 0, 8)
X, B, R = ir.Tensor("X", (3, 8)), ir.Tensor("B", (8,)), ir.Tensor("R", (3,))
x = X[ROW, J]
SQRT_2_PI = math.sqrt(2 / math.pi)


def sig(e):
    return ir.Unary("sigmoid", e)


def tanh(e):
    return ir.Unary("tanh", e)


def erf(e):
    return ir.Unary("erf", e)


def scope(body, traversal=(ROW, J)) -> ir.Scope:
    return ir.Scope(traversal, (), body)


def textbook_tanh(u, c=SQRT_2_PI, k=0.044715):
    """``0.5 u (1 + tanh(c (u + k u^3)))`` as a paper writes it (a cube by pow)."""
    return 0.5 * u * (1.0 + tanh(c * (u + k * ir.Unary("pow", u, 3.0))))


CASES = [
    # (id, body, traversal, operator, attributes)
    ("silu", x * sig(x), (ROW, J), "QuickGelu", {"alpha": 1.0}),
    ("quick_gelu", sig(x * 1.702) * x, (ROW, J), "QuickGelu", {"alpha": np.float32(1.702)}),
    ("quick_gelu_negative_alpha", x * sig(-0.5 * x), (ROW, J), "QuickGelu", {"alpha": -0.5}),
    ("gelu_tanh_as_imported", gelu(x, "tanh"), (ROW, J), "FastGelu", {}),
    ("gelu_tanh_textbook", textbook_tanh(x), (ROW, J), "FastGelu", {}),
    (
        "gelu_tanh_onnxruntime_constants",
        0.5 * x * (1.0 + tanh(0.797885 * x + 0.035677 * x * x * x)),
        (ROW, J),
        "FastGelu",
        {},
    ),
    ("fast_gelu_bias", gelu(x + B[J], "tanh"), (ROW, J), "FastGelu", {}),
    ("fast_gelu_bias_first", textbook_tanh(B[J] + x), (ROW, J), "FastGelu", {}),
    ("gelu_erf_as_imported", gelu(x), (ROW, J), "Gelu", {}),
    ("gelu_erf_divided", x * 0.5 * (1.0 + erf(x / 1.4142135623730951)), (ROW, J), "Gelu", {}),
    (
        "gelu_erf_sqrt_constant",
        0.5 * x * (erf(x / ir.Unary("sqrt", ir.Const(2.0))) + 1.0),
        (ROW, J),
        "Gelu",
        {},
    ),
    ("bias_gelu", gelu(x + B[J]), (ROW, J), "BiasGelu", {}),
    ("gelu_transposed_read", gelu(x), (J, ROW), "Gelu", {}),
    ("gelu_broadcast_input", gelu(B[J]), (ROW, J), "Gelu", {}),
]


@pytest.mark.parametrize(
    ("body", "traversal", "op", "attrs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_activation(body, traversal, op, attrs):
    s = scope(body, traversal)
    chosen, _ = match(s)
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{op}"
    model, nodes = emit_and_run(s, scale=3.0)
    assert contrib(nodes) == [op]
    got = attrs_of(model, op)
    assert {k: got[k] for k in attrs} == pytest.approx(attrs)


EDGES = np.array(
    [
        0.0,
        -0.0,
        1e-6,
        -1e-6,
        1e-3,
        -1e-3,
        1.0,
        -1.0,
        3.0,
        -3.0,
        10.0,
        -10.0,
        30.0,
        -30.0,
        1e3,
        -1e3,
        3e4,
        -3e4,
    ]
)


@pytest.mark.parametrize(
    "case",
    ["silu", "quick_gelu", "gelu_tanh_as_imported", "gelu_erf_as_imported", "bias_gelu", "fast_gelu_bias"],
)
def test_activation_edges(case):
    """The edges, in ONNX Runtime at both levels, against the interpreter (float64). ONNX Runtime's
    float32 sigmoid and tanh are approximations good to about 1e-7 absolute (x * sigmoid(x) at -10
    comes out -3.0e-7 for -4.1e-7): relative error 1e-5 or absolute 1e-6."""
    (body,) = [c[1] for c in CASES if c[0] == case]
    k = ir.Iter("k", 0, len(EDGES))
    e = ir.Tensor("E", (len(EDGES),))
    bias = ir.Tensor("b", (len(EDGES),))
    reads = {X: e[(k,)], B: bias[(k,)]}
    # the same body over one dimension of edge values (X read as E, B as b)
    body_1d = _replace_reads(body, reads)
    s = ir.Scope((k,), (), body_1d)
    model, _ = program_model(einopt.program({"Y": s}))
    assert [n.domain for n in model.graph.node] == [CONTRIB_DOMAIN]
    feeds = {"E": EDGES.astype(np.float32), "b": np.linspace(-2, 2, len(EDGES)).astype(np.float32)}
    feeds = {t.name: feeds[t.name] for t in ir.input_tensors(s)}
    want = evaluate(s, {n: v.astype(np.float64) for n, v in feeds.items()})
    for level in LEVELS:
        got = session(model, level).run(["Y"], feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(level))


def _replace_reads(e, reads):
    if isinstance(e, ir.Access):
        return reads[e.source]
    return ir.rebuild(e, lambda c: _replace_reads(c, reads))


REFUSALS = [
    # (id, body, traversal, matcher, words of the reason)
    ("erf_form_is_no_fast_gelu", gelu(x), (ROW, J), match_fast_gelu, "uses erf"),
    ("tanh_form_is_no_gelu", gelu(x, "tanh"), (ROW, J), match_gelu, "uses tanh"),
    ("tanh_form_is_no_bias_gelu", gelu(x + B[J], "tanh"), (ROW, J), match_bias_gelu, "uses tanh"),
    ("another_constant", 0.5 * x * (1.0 + erf(x / 1.5)), (ROW, J), match_gelu, "computes another function"),
    (
        "textbook_tanh_other_cubic",
        textbook_tanh(x, k=0.05),
        (ROW, J),
        match_fast_gelu,
        "computes another function",
    ),
    ("silu_by_exp", x / (1.0 + ir.Unary("exp", -x)), (ROW, J), match_quick_gelu, "uses exp"),
    ("two_sigmoids", x * sig(x) * sig(2.0 * x), (ROW, J), match_quick_gelu, "2 different sigmoids"),
    ("sigmoid_of_a_square", x * sig(x * x), (ROW, J), match_quick_gelu, "computes another function"),
    ("quick_gelu_takes_no_bias", (x + B[J]) * sig(x + B[J]), (ROW, J), match_quick_gelu, "takes no bias"),
    ("bias_over_the_first_dimension", gelu(x + R[ROW]), (ROW, J), match_bias_gelu, "neither term"),
    ("no_bias_for_bias_gelu", gelu(x), (ROW, J), match_bias_gelu, "no bias"),
    ("product_of_inputs", gelu(x * B[J]), (ROW, J), match_gelu, "reads 2 inputs"),
    ("max_in_the_body", ir.Binary("max", x, ir.Const(0.0)) * sig(x), (ROW, J), match_quick_gelu, "uses max"),
    ("one_value_broadcast", gelu(R[1]), (ROW, J), match_gelu, "needs 1 or more dimensions"),
    ("one_value_fast", gelu(R[1], "tanh"), (ROW, J), match_fast_gelu, "needs 1 or more dimensions"),
    (
        "overflows_in_float32",
        x
        * sig(x)
        * (x * x * x * x * x * x * x * x * x * x + 1.0)
        / (x * x * x * x * x * x * x * x * x * x + 1.0),
        (ROW, J),
        match_quick_gelu,
        "overflows in float32",
    ),
]


@pytest.mark.parametrize(
    ("body", "traversal", "matcher", "reason"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS]
)
def test_activation_refusals(body, traversal, matcher, reason):
    refused = matcher(scope(body, traversal))
    assert isinstance(refused, Refusal) and reason in refused.reason, refused


def test_no_gelu_form_passes_for_the_other():
    """Whatever the table picks for either GELU, the other form's operator is not it."""
    erf_form, tanh_form = scope(gelu(x)), scope(gelu(x, "tanh"))
    assert match(erf_form)[0].op_type == f"{CONTRIB_DOMAIN}.Gelu"
    assert match(tanh_form)[0].op_type == f"{CONTRIB_DOMAIN}.FastGelu"
    for s in (erf_form, tanh_form):
        found = [n for n, fn in CONTRIB_MATCHERS.items() if isinstance(fn(s), OperatorMatch)]
        assert len(found) == 1, found


def _onnx_gelu(approximate: str) -> onnx.ModelProto:
    node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
    graph = helper.make_graph(
        [node],
        "gelu",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize(("approximate", "contrib_op"), [("none", "Gelu"), ("tanh", "FastGelu")])
def test_imported_onnx_gelu(approximate, contrib_op):
    """ONNX's Gelu (opset 20), imported: the table's choice is the com.microsoft operator, while at
    depth 0 (its original operator preferred) it stays ONNX's Gelu."""
    model = prepare(_onnx_gelu(approximate), {}).model
    (part,) = [p for p in translate_graph(model) if p.translated]
    (name, s), *_ = part.program.bindings
    assert match(s)[0].op_type == f"{CONTRIB_DOMAIN}.{contrib_op}"
    assert match(s, prefer="Gelu")[0].op_type != f"{CONTRIB_DOMAIN}.{contrib_op}"
    kept = instantiate(
        part.program,
        onnx_names=part.names,
        constants={},
        opset=20,
        prefix="p/",
        preferred=original_ops(model, part),
    )
    assert [(n.domain, n.op_type) for n in kept.nodes] == [("", "Gelu")]
    _, nodes = emit_and_run(part.program, scale=3.0)
    assert contrib(nodes) == [contrib_op]


def test_activations_are_timed():
    model, _ = program_model(einopt.program({"Y": scope(gelu(x + B[J]))}), light=True)
    (node,) = node_costs(model)
    assert (node.cost.op, node.cost.kind, node.cost.flops) == ("BiasGelu", "timed", 8 * 3 * 8)

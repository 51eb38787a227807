"""ONNX Runtime's com.microsoft operators as predefined operators (``einopt.instantiate.match_contrib``).

Each case builds an IR program (with the Python API, or by importing the unfused ONNX graph an
exporter writes and inlining its layout nodes as the search does), matches and emits it through
``program_model``, checks the model with ``onnx.checker``, runs it in ONNX Runtime with every graph
optimization off and on, and compares with the reference interpreter (float64). The emitted
operator must be the com.microsoft one; a near miss must be refused with its reason.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import einopt
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.instantiate.emit import instantiate
from einopt.instantiate.match import MATCHERS, match
from einopt.instantiate.match_contraction import match_matmul
from einopt.instantiate.match_contrib import CONTRIB_DOMAIN, match_fused_matmul
from einopt.instantiate.plan import NO_MATCH_CONTEXT, OperatorMatch, Refusal, layout_cost
from einopt.instantiate.program import program_model
from einopt.rules import get
from einopt.runtime import modelio
from einopt.runtime.opcost import _single, node_costs
from einopt.runtime.verify import subgraph_model
from einopt.stages.accept import rewrite_kind
from einopt.stages.export import assemble
from einopt.stages.postopt import postoptimize

F = TensorProto.FLOAT
LEVELS = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)


def session(model: onnx.ModelProto, level) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def emit_and_run(
    program: ir.Program | ir.Scope | str,
    constants: tuple[str, ...] = (),
    seed: int = 0,
    rtol: float = 1e-4,
    scale: float = 1.0,
) -> tuple[onnx.ModelProto, list[tuple[str, str]]]:
    """Emit ``program`` as a model (inputs in ``constants`` are weights), check it, run it in ONNX
    Runtime at both optimization extremes on random inputs (times ``scale``) and compare with the
    interpreter; return the model and its nodes' ``(domain, op_type)``."""
    if isinstance(program, str):
        program = einopt.parse(program)
    if isinstance(program, ir.Scope):
        program = einopt.program({"Y": program})
    rng = np.random.default_rng(seed)
    arrays = {t.name: scale * rng.standard_normal(t.shape) for t in program.inputs}
    model, _ = program_model(program, {n: arrays[n] for n in constants})
    onnx.checker.check_model(model, full_check=True)
    feeds = {n: a.astype(np.float32) for n, a in arrays.items() if n not in constants}
    want = evaluate(program, {n: a.astype(np.float32).astype(np.float64) for n, a in arrays.items()})
    for level in LEVELS:
        got = session(model, level).run(list(program.outputs), feeds)
        for o, g in zip(program.outputs, got, strict=True):
            w = want[o]
            assert g.shape == w.shape, o
            bound = max(1.0, float(np.max(np.abs(w), initial=0.0)))
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * bound, err_msg=f"{o} at {level}")
    return model, [(n.domain, n.op_type) for n in model.graph.node]


def contrib(nodes: list[tuple[str, str]]) -> list[str]:
    return [op for domain, op in nodes if domain == CONTRIB_DOMAIN]


def attrs_of(model: onnx.ModelProto, op_type: str) -> dict:
    (node,) = [n for n in model.graph.node if n.op_type == op_type]
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


# --------------------------------------------------------------------------
# FusedMatMul
# --------------------------------------------------------------------------

# The attention scores of 2 heads of 4 over 5 positions: Q and K as the projections write them.
SCORES = "L[h:2, i:5, j:5] Sum[d:4] 0.5 * Q[i, h*4+d] * K[j, h*4+d] where Q:[5,8], K:[5,8]"

FUSED_MATMUL_CASES = [
    # (id, text, constants, expected attributes); no Transpose or Mul is left
    ("attention_scores", SCORES, (), {"transB": 1, "transBatchA": 1, "transBatchB": 1, "alpha": 0.5}),
    (
        "transposed_batched_operand",
        "L[b:3, m:4, n:5] Sum[k:6] A[b, m, k] * B[b, n, k] where A:[3,4,6], B:[3,5,6]",
        (),
        {"transB": 1, "transBatchA": 0, "transBatchB": 0},
    ),
    (
        "both_transposed",
        "L[b:3, m:4, n:5] Sum[k:6] A[b, k, m] * B[b, n, k] where A:[3,6,4], B:[3,5,6]",
        (),
        {"transA": 1, "transB": 1},
    ),
    (
        "broadcast_batch",
        "L[b:3, m:4, n:5] Sum[k:6] A[m, k] * B[b, n, k] where A:[4,6], B:[3,5,6]",
        (),
        {"transB": 1},
    ),
    (
        "scaled_product_of_activations",
        "L[b:3, m:4, n:5] Sum[k:6] 0.25 * A[b, m, k] * B[b, k, n] where A:[3,4,6], B:[3,6,5]",
        (),
        {"alpha": 0.25, "transA": 0, "transB": 0},
    ),
    (
        "batch_first_read_as_batch_last",
        "L[h:2, i:5, e:3] Sum[j:4] P[h, i, j] * V[j, h, e] where P:[2,5,4], V:[4,2,3]",
        (),
        {"transBatchB": 1, "transBatchA": 0},
    ),
]


@pytest.mark.parametrize(
    ("text", "constants", "attrs"),
    [c[1:] for c in FUSED_MATMUL_CASES],
    ids=[c[0] for c in FUSED_MATMUL_CASES],
)
def test_fused_matmul(text, constants, attrs):
    model, nodes = emit_and_run(text, constants)
    assert contrib(nodes) == ["FusedMatMul"]
    assert ("", "Transpose") not in nodes and ("", "Mul") not in nodes, nodes
    got = attrs_of(model, "FusedMatMul")
    assert {k: got[k] for k in attrs} == pytest.approx(attrs)


def test_batched_attention_scores_keep_the_transposes_but_not_the_scale():
    """At batch 2 the heads are not the first dimension, so Q and K are transposed either way (transBatch
    moves only the first); FusedMatMul still takes the scale and reads K^T with transB."""
    text = "L[b:2, h:2, i:5, j:3] Sum[d:4] Q[b, i, h*4+d] * K[b, j, h*4+d] / 2.0 where Q:[2,5,8], K:[2,3,8]"
    model, nodes = emit_and_run(text)
    assert contrib(nodes) == ["FusedMatMul"] and ("", "Mul") not in nodes
    assert nodes.count(("", "Transpose")) == 2
    assert attrs_of(model, "FusedMatMul")["alpha"] == 0.5


def test_fused_matmul_saves_what_matmul_would_transpose():
    scope = einopt.parse(SCORES)
    fused, plain = match_fused_matmul(scope), match_matmul(scope)
    assert isinstance(fused, OperatorMatch) and isinstance(plain, OperatorMatch)
    assert layout_cost(fused, NO_MATCH_CONTEXT) < layout_cost(plain, NO_MATCH_CONTEXT)
    chosen, _ = match(scope, prefer="MatMul")  # the exporter's MatMul does not win back the scope
    assert chosen is not None and chosen.op_type == "com.microsoft.FusedMatMul"


def test_fused_matmul_is_one_gemm_per_batch_not_one_per_element():
    """MatMul avoids transposing B[b, n, k] by reading m and n as broadcast batch dimensions (60 GEMMs
    of one element each); FusedMatMul reads B with transB (3 GEMMs) and wins."""
    scope = einopt.parse("L[b:3, m:4, n:5] Sum[k:6] A[b, m, k] * B[b, n, k] where A:[3,4,6], B:[3,5,6]")
    from einopt.instantiate.match_contrib import _gemm_calls

    plain, fused = match_matmul(scope), match_fused_matmul(scope)
    assert isinstance(fused, OperatorMatch)
    assert (_gemm_calls(plain), _gemm_calls(fused)) == (60, 3)


FUSED_MATMUL_REFUSALS = [
    # (id, text, constants, words of the reason, operator chosen instead)
    (
        "plain_batched_matmul",
        "L[b:3, m:4, n:5] Sum[k:6] A[b, m, k] * B[b, k, n] where A:[3,4,6], B:[3,6,5]",
        (),
        "standard operator needs no more",
        "MatMul",
    ),
    (
        "two_dimensional_gemm",
        "L[m:4, n:5] Sum[k:6] A[m, k] * B[n, k] where A:[4,6], B:[5,6]",
        (),
        "standard operator needs no more",
        "Gemm",
    ),
    (
        "transposed_weight_folds",
        "L[b:3, m:4, n:5] Sum[k:6] A[b, m, k] * W[b, n, k] where A:[3,4,6], W:[3,5,6]",
        ("W",),
        "standard operator needs no more",
        "MatMul",
    ),
    (
        "scale_on_a_weight_folds",
        "L[b:3, m:4, n:5] Sum[k:6] 0.5 * A[b, m, k] * W[k, n] where A:[3,4,6], W:[6,5]",
        ("W",),
        "standard operator needs no more",
        "MatMul",
    ),
    (
        "three_factors",
        "L[m:4, n:5] Sum[k:6] A[m, k] * B[k, n] * C[k] where A:[4,6], B:[6,5], C:[6]",
        (),
        "a product of 3 accesses",
        "Einsum",
    ),
    (
        "reduction_within_one_operand",
        "L[m:4, n:5] Sum[k:6, l:2] A[m, k] * B[n, l] where A:[4,6], B:[5,2]",
        (),
        "summed within one operand alone",
        "Einsum",
    ),
]


@pytest.mark.parametrize(
    ("text", "constants", "reason", "chosen"),
    [c[1:] for c in FUSED_MATMUL_REFUSALS],
    ids=[c[0] for c in FUSED_MATMUL_REFUSALS],
)
def test_fused_matmul_refusals(text, constants, reason, chosen):
    program = einopt.program({"Y": einopt.parse(text)})
    scope = program.scope("Y")
    ctx = instantiation_context(program, constants)
    refused = match_fused_matmul(scope, ctx)
    assert isinstance(refused, Refusal) and reason in refused.reason, refused
    m, _ = match(scope, ctx)
    assert m is not None and m.op_type == chosen
    _, nodes = emit_and_run(program, constants)
    assert not contrib(nodes)


def instantiation_context(program: ir.Program, constants: tuple[str, ...]):
    from einopt.instantiate.plan import MatchContext

    const = frozenset(t for t in program.inputs if t.name in constants)
    return MatchContext(constant=const, bound=frozenset(s for _, s in program.bindings))


@pytest.mark.parametrize("seed", range(16))
def test_random_batched_products(seed):
    """Operands and output in random dimension orders: whatever is chosen is numerically right, and
    FusedMatMul is chosen exactly when it saves run-time layout work over every standard operator."""
    rng = np.random.default_rng(seed)
    b, h = ir.Iter("b", 0, 2), ir.Iter("h", 0, 3)
    m, n, k = ir.Iter("m", 0, 4), ir.Iter("n", 0, 5), ir.Iter("k", 0, 6)
    a_dims = [b, h, m, k] if rng.random() < 0.7 else [h, m, k]
    b_dims = [b, h, k, n]
    a_dims = [a_dims[i] for i in rng.permutation(len(a_dims))]
    b_dims = [b_dims[i] for i in rng.permutation(len(b_dims))]
    out = [b, h, m, n]
    if rng.random() < 0.5:
        out = [out[i] for i in rng.permutation(4)]
    A = ir.Tensor("A", tuple(d.extent for d in a_dims))
    B = ir.Tensor("B", tuple(d.extent for d in b_dims))
    body = A[tuple(a_dims)] * B[tuple(b_dims)]
    if rng.random() < 0.5:
        body = body * 0.125
    scope = ir.Scope(tuple(out), (k,), body)
    chosen, _ = match(scope)
    fused = match_fused_matmul(scope)
    assert chosen is not None
    assert (chosen.op_type == "com.microsoft.FusedMatMul") == isinstance(fused, OperatorMatch)
    _, nodes = emit_and_run(scope, seed=seed)
    if isinstance(fused, OperatorMatch):
        assert contrib(nodes) == ["FusedMatMul"]
        assert layout_cost(fused, NO_MATCH_CONTEXT) < layout_cost(match_matmul(scope), NO_MATCH_CONTEXT)


def test_fused_matmul_exhausts_the_flags_on_every_correspondence():
    """Every layout FusedMatMul can read an operand in, checked against ONNX Runtime: for each of
    the 16 flag combinations, the operand layouts the matcher derives give the product."""
    from einopt.instantiate.match_contrib import _fused_layout

    rng = np.random.default_rng(0)
    dims = {"b": 2, "h": 3, "m": 4, "k": 5, "n": 6}
    logical_a, logical_b = ["b", "h", "m", "k"], ["b", "h", "k", "n"]
    a, b = (
        rng.standard_normal([dims[d] for d in logical_a]),
        rng.standard_normal([dims[d] for d in logical_b]),
    )
    want = a @ b
    for ta, tb, ba, bb in itertools.product((0, 1), repeat=4):
        la = [g[0] for g in _fused_layout([(d,) for d in logical_a], bool(ta), bool(ba))]
        lb = [g[0] for g in _fused_layout([(d,) for d in logical_b], bool(tb), bool(bb))]
        xa = np.transpose(a, [logical_a.index(d) for d in la]).astype(np.float32)
        xb = np.transpose(b, [logical_b.index(d) for d in lb]).astype(np.float32)
        node = helper.make_node(
            "FusedMatMul", ["A", "B"], ["Y"], domain=CONTRIB_DOMAIN,
            transA=ta, transB=tb, transBatchA=ba, transBatchB=bb,
        )  # fmt: skip
        graph = helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("A", F, xa.shape),
                helper.make_tensor_value_info("B", F, xb.shape),
            ],
            [helper.make_tensor_value_info("Y", F, None)],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB_DOMAIN, 1)]
        )
        got = session(model, LEVELS[0]).run(None, {"A": xa, "B": xb})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str((ta, tb, ba, bb)))


# --------------------------------------------------------------------------
# From an exporter's graph: Reshape, Transpose, MatMul, Mul
# --------------------------------------------------------------------------


def _exported_scores(s: int = 6, heads: int = 2, d: int = 4) -> onnx.ModelProto:
    """The attention scores as exporters write them: heads split by Reshape and Transpose, K
    transposed for the MatMul, the scale a Mul."""
    nodes = [
        helper.make_node("Reshape", ["q", "shape"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["k", "shape"], ["k4"]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["y"]),
        helper.make_node("Relu", ["y"], ["out"]),  # another subprogram reads the scores
    ]
    graph = helper.make_graph(
        nodes,
        "scores",
        [helper.make_tensor_value_info(n, F, [1, s, heads * d]) for n in ("q", "k")],
        [helper.make_tensor_value_info("out", F, [1, heads, s, s])],
        [
            numpy_helper.from_array(np.array([1, s, heads, d], np.int64), "shape"),
            numpy_helper.from_array(np.array(d**-0.5, np.float32), "scale"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _inlined(program: ir.Program) -> ir.Program:
    """``program`` with every binding the output reads inlined into it (``fuse_expressions``, as
    the search does)."""
    rule = get("fuse_expressions")
    while found := list(rule.match(program)):
        program = rule.apply(program, found[0])
    return program


def test_exported_attention_scores_become_one_fused_matmul():
    model = prepare(_exported_scores(), {}).model
    (part,) = [p for p in translate_graph(model) if p.translated and p.kind == "linear"]
    program = _inlined(part.program)
    inst = instantiate(program, onnx_names=part.names, constants=part.constants, opset=17, prefix="p/")
    assert [n.op_type for n in inst.nodes if n.domain == CONTRIB_DOMAIN] == ["FusedMatMul"]
    assert not [n for n in inst.nodes if n.op_type in ("Transpose", "Mul", "MatMul")]
    # the assembled model imports com.microsoft, knows the FusedMatMul's output shape, and runs
    out = assemble(model, {part.nodes: inst})
    assert any(o.domain == CONTRIB_DOMAIN and o.version == 1 for o in out.opset_import)
    (fused,) = [n for n in out.graph.node if n.domain == CONTRIB_DOMAIN]
    assert fused.output[0] in {vi.name for vi in out.graph.value_info}
    onnx.checker.check_model(out, full_check=True)
    feeds = modelio.random_inputs(model, 0)
    want = session(model, LEVELS[0]).run(None, feeds)[0]
    final = postoptimize(out)  # what optimize writes
    assert [n.op_type for n in final.graph.node if n.domain == CONTRIB_DOMAIN] == ["FusedMatMul"]
    for level in LEVELS:
        np.testing.assert_allclose(session(out, level).run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(session(final, level).run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
    assert rewrite_kind(model, part, inst).endswith("-> Reshape Reshape com.microsoft.FusedMatMul Reshape")


def test_part_models_import_the_contrib_domain():
    """The part pair acceptance times: the new part's model imports com.microsoft."""
    model = prepare(_exported_scores(), {}).model
    (part,) = [p for p in translate_graph(model) if p.translated and p.kind == "linear"]
    inst = instantiate(
        _inlined(part.program), onnx_names=part.names, constants=part.constants, opset=17, prefix="p/"
    )
    feeds = {n: np.ones((1, 6, 8), np.float32) for n in ("q", "k")}
    m = subgraph_model(model, inst.nodes, feeds, ["y"], inst.initializers)
    assert [o.domain for o in m.opset_import] == ["", CONTRIB_DOMAIN]
    got = modelio.run(m, feeds, ["y"])["y"]
    assert got.shape == (1, 2, 6, 6)


# --------------------------------------------------------------------------
# Costing: a contrib node is timed alone, and the nodes after it know their shapes
# --------------------------------------------------------------------------


def test_contrib_nodes_are_timed_and_shapes_flow_past_them():
    s = einopt.parse(SCORES)
    y = ir.Scope(s.traversal, (), ir.Unary("relu", s[s.traversal]))
    program = einopt.program({"Y": y}, intermediates={"S": s})
    model, inst = program_model(program, light=True)
    assert [vi.name for vi in inst.value_info] == ["e/S"]
    costs = {n.cost.op: n for n in node_costs(model)}
    assert costs["FusedMatMul"].cost.kind == "timed"
    assert costs["FusedMatMul"].cost.flops == 2 * 2 * 5 * 5 * 4
    assert costs["Relu"].cost.kind == "timed"  # its input's shape is S's value_info
    single, feeds = _single(costs["FusedMatMul"], np.random.default_rng(0))
    assert modelio.run(single, feeds, ["out0"])["out0"].shape == (2, 5, 5)


def test_contrib_signatures_name_the_domain():
    """A com.microsoft operator never shares a stored time with a default-domain one of its name."""
    model, _ = program_model(einopt.program({"Y": einopt.parse(SCORES)}), light=True)
    (node,) = [n for n in node_costs(model) if n.cost.op == "FusedMatMul"]
    plain = onnx.ModelProto()
    plain.CopyFrom(model)
    for n in plain.graph.node:
        n.domain = ""  # not a real default-domain op: only its signature is compared
    (other,) = [n for n in node_costs(plain) if n.cost.op == "FusedMatMul"]
    assert node.cost.key != other.cost.key


def test_contrib_matchers_are_in_the_table_before_gemm():
    names = list(MATCHERS)
    assert names.index("FusedMatMul") < names.index("Gemm")


def test_search_candidates_name_contrib_operators_by_domain():
    """A contrib node is no eOperator in a candidate's operator list."""
    from einopt.search.modelcost import operators

    model, _ = program_model(einopt.program({"Y": einopt.parse(SCORES)}))
    assert operators(model) == ("Reshape", "Reshape", "com.microsoft.FusedMatMul")


# --------------------------------------------------------------------------
# FusedGemm
# --------------------------------------------------------------------------


def _linear(act: str, bias: str = " + C[n]", a: str = "A[a,k]", b: str = "B[k,bb]") -> str:
    return f"L[m:4, n:5] {act}({{L[a:4, bb:5] Sum[k:3] {a}*{b}}}[m, n]{bias}) where A:[4,3], B:[3,5], C:[5]"


FUSED_GEMM_CASES = [
    # (id, text, constants, expected attributes)
    ("relu_bias", _linear("relu"), ("B", "C"), {"activation": "Relu", "transB": 0}),
    ("sigmoid_no_bias", _linear("sigmoid", bias=""), (), {"activation": "Sigmoid"}),
    ("tanh_bias", _linear("tanh"), ("B", "C"), {"activation": "Tanh"}),
    (
        "leaky_relu_slope",
        "L[m:4, n:5] leaky_relu({L[a:4, b:5] Sum[k:3] A[a,k]*B[k,b]}[m, n] + D[m, n], 0.2)"
        " where A:[4,3], B:[3,5], D:[4,5]",
        (),
        {"activation": "LeakyRelu", "activation_alpha": 0.2},
    ),
    (
        "linear_layer_transposed_weight_alpha_beta",
        "L[m:4, n:5] relu({L[a:4, b:5] Sum[k:3] 0.5*(X[a,k]*W[b,k])}[m, n] + 2.0*C[n])"
        " where X:[4,3], W:[5,3], C:[5]",
        ("W", "C"),
        {"activation": "Relu", "transB": 1, "alpha": 0.5, "beta": 2.0},
    ),
    (
        "linear_layer_on_a_sequence",
        "L[s:2, t:3, n:5] relu({L[s1:2, t1:3, n1:5] Sum[k:4] X[s1,t1,k]*W[n1,k]}[s, t, n] + C[n])"
        " where X:[2,3,4], W:[5,4], C:[5]",
        ("W", "C"),
        {"activation": "Relu", "transB": 1},
    ),
]


@pytest.mark.parametrize(
    ("text", "constants", "attrs"), [c[1:] for c in FUSED_GEMM_CASES], ids=[c[0] for c in FUSED_GEMM_CASES]
)
def test_fused_gemm(text, constants, attrs):
    model, nodes = emit_and_run(text, constants, scale=2.0)  # both sides of every activation's knee
    assert contrib(nodes) == ["FusedGemm"]
    assert not {op for _, op in nodes} & {"Gemm", "MatMul", "Add", "Relu", "Sigmoid", "Tanh", "LeakyRelu"}
    got = attrs_of(model, "FusedGemm")
    assert {k: got[k] for k in attrs} == pytest.approx(attrs)


def test_fused_gemm_wins_over_the_original_activation():
    """The exporter's last node was the activation: its element-wise matcher would take the scope
    as MatMul + Add + Relu, with no more layout work, but the fused kernel is kept."""
    scope = einopt.parse(_linear("relu"))
    chosen, _ = match(scope, prefer="Relu")
    assert chosen is not None and chosen.op_type == "com.microsoft.FusedGemm"


FUSED_GEMM_REFUSALS = [
    # (id, text, words of the reason)
    ("not_an_activation_of_fused_gemm", _linear("abs"), "not one of the activations"),
    ("activation_of_an_input", "L[m:4] relu(X[m]) where X:[4]", "not an inline product"),
    (
        "batched_product",
        "L[b:2, m:4, n:5] relu({L[b1:2, a:4, c:5] Sum[k:3] A[b1,a,k]*B[b1,k,c]}[b, m, n])"
        " where A:[2,4,3], B:[2,3,5]",
        "Gemm: ",
    ),
    (
        "product_read_transposed",
        "L[n:5, m:4] relu({L[a:4, b:5] Sum[k:3] A[a,k]*B[k,b]}[m, n]) where A:[4,3], B:[3,5]",
        "not read at the activation's own positions",
    ),
    ("summing_scope", "L[m:4] Sum[k:3] A[m,k] where A:[4,3]", "sums over iterators"),
]


@pytest.mark.parametrize(
    ("text", "reason"), [c[1:] for c in FUSED_GEMM_REFUSALS], ids=[c[0] for c in FUSED_GEMM_REFUSALS]
)
def test_fused_gemm_refusals(text, reason):
    from einopt.instantiate.match_contrib import match_fused_gemm

    refused = match_fused_gemm(einopt.parse(text))
    assert isinstance(refused, Refusal) and reason in refused.reason, refused
    _, nodes = emit_and_run(text)
    assert "FusedGemm" not in contrib(nodes)


def test_fused_gemm_refuses_a_bound_product():
    """A product the program binds is computed anyway: the activation does not fuse it."""
    from einopt.instantiate.match_contrib import match_fused_gemm

    s = einopt.parse("L[a:4, b:5] Sum[k:3] A[a,k]*B[k,b] where A:[4,3], B:[3,5]")
    y = ir.Scope(s.traversal, (), ir.Unary("relu", s[s.traversal]))
    program = einopt.program({"Y": y, "S": s})
    refused = match_fused_gemm(y, instantiation_context(program, ()))
    assert isinstance(refused, Refusal) and "program binding" in refused.reason
    _, nodes = emit_and_run(program)
    assert not contrib(nodes)


def test_fused_gemm_is_timed_with_its_flops():
    model, _ = program_model(einopt.program({"Y": einopt.parse(_linear("relu"))}), light=True)
    (node,) = [n for n in node_costs(model) if n.cost.op == "FusedGemm"]
    assert node.cost.kind == "timed" and node.cost.flops == (2 * 3 + 2) * 4 * 5

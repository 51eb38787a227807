"""The activations of modern models: Erf, Pow, Reciprocal, HardSigmoid, HardSwish and Gelu.

Each importer is checked on a one-node model against ONNX Runtime (the interpreter in float32
gives ORT's values: bit for bit where ORT's kernel is plain float32 arithmetic, within ORT's own
error where it calls erf, tanh or powf) and against the interpreter in float64, on random inputs
with the edges (0, -0, tiny, large, the float32 limits, infinities, NaN). Writing the import
back gives the one operator it was (Gelu only where the opset has it), computing the same values.
The exporters' models in ``../shared/models`` translate these nodes instead of passing them by.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import shared_models
from onnx import TensorProto, helper, numpy_helper

import einopt
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.frontend.importers import translate_single_node
from einopt.frontend.importers_elementwise import GELU_SQRT1_2, gelu, hard_sigmoid, hard_swish
from einopt.frontend.operand import Unsupported
from einopt.frontend.partition import ACTIVATIONS

F32 = np.float32
INF = math.inf
EDGES = (0.0, -0.0, 1e-30, -1e-30, 1e-45, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 3.0, -3.0, 5.0, -5.0)
EDGES += (10.0, -10.0, 1e4, -1e4, 1e30, -1e30, 3.4e38, -3.4e38, INF, -INF, math.nan)
# HardSigmoid's clamp points (alpha 0.2 and 1/6, beta 0.5) and their float32 neighbours.
EDGES += tuple(float(np.nextafter(F32(c), F32(d))) for c in (2.5, -2.5, 3.0, -3.0) for d in (-INF, INF))
SHAPE = (4, 64)


@dataclasses.dataclass(frozen=True)
class Case:
    """A one-node model: ``op`` on ``x`` of :data:`SHAPE` (and ``exponent`` as an initializer).

    ``ulps``: how far the float32 interpreter may be from ORT (0: bit for bit), in float32 ulps
    of the result; ``of_x``: and in ulps of ``x`` (Gelu's ``x * (1 + erf)`` scales erf's error by
    ``x``). ``back``: the operator types writing the import back gives.
    """

    id: str
    op: str
    back: tuple[str, ...]
    attrs: tuple[tuple[str, object], ...] = ()
    exponent: np.ndarray | None = None
    opset: int = 17
    ulps: int = 0
    of_x: int = 0
    skip: tuple[float, ...] = ()  # inputs where the import knowingly differs from ORT


CASES = [
    Case("erf", "Erf", ("Erf",), ulps=1),
    Case("pow-2", "Pow", ("Mul",), exponent=np.array(2.0, F32)),
    Case("pow-3", "Pow", ("Pow",), exponent=np.array(3.0, F32)),
    Case("pow-3-int64", "Pow", ("Pow",), exponent=np.array(3, np.int64)),
    Case("pow-2-rank3", "Pow", ("Mul", "Reshape"), exponent=np.full((1, 1, 1), 2.0, F32)),
    # ORT's powf(-inf, 0.5) is inf; sqrt(-inf) is NaN.
    Case("pow-half", "Pow", ("Sqrt",), exponent=np.array(0.5, F32), ulps=1, skip=(-INF,)),
    Case("pow-minus-1", "Pow", ("Reciprocal",), exponent=np.array(-1.0, F32), ulps=1),
    Case("pow-1", "Pow", ("Identity",), exponent=np.array(1.0, F32)),
    Case("pow-0", "Pow", ("Pow",), exponent=np.array(0.0, F32)),
    Case("pow-1.5", "Pow", ("Pow",), exponent=np.array(1.5, F32), ulps=1),
    Case("pow-minus-0.5", "Pow", ("Pow",), exponent=np.array(-0.5, F32), ulps=1),
    # std::pow(float, int64) and std::pow(float, double) compute in double, as the interpreter.
    Case("pow-5-int64", "Pow", ("Pow",), exponent=np.array(5, np.int64)),
    Case("pow-4-float64", "Pow", ("Pow",), exponent=np.array(4.0, np.float64)),
    Case("reciprocal", "Reciprocal", ("Reciprocal",)),
    Case("hardsigmoid-default", "HardSigmoid", ("HardSigmoid",)),
    Case("hardsigmoid-sixth", "HardSigmoid", ("HardSigmoid",), (("alpha", 1 / 6), ("beta", 0.5))),
    Case("hardsigmoid-negative-beta", "HardSigmoid", ("HardSigmoid",), (("alpha", 0.37), ("beta", -0.1))),
    Case("hardswish", "HardSwish", ("HardSwish",), opset=14),
    Case("gelu", "Gelu", ("Gelu",), opset=20, ulps=1, of_x=1),
    Case("gelu-none", "Gelu", ("Gelu",), (("approximate", "none"),), opset=20, ulps=1, of_x=1),
    # ORT's tanh is up to 5 ulps from tanh.
    Case("gelu-tanh", "Gelu", ("Gelu",), (("approximate", "tanh"),), opset=20, ulps=1, of_x=4),
]


def _inputs(seed_text: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    x = rng.normal(0.0, 3.0, size=SHAPE).astype(F32)
    x.reshape(-1)[: len(EDGES)] = EDGES
    return x


def _model(case: Case) -> onnx.ModelProto:
    inputs, inits = ["x"], []
    if case.exponent is not None:
        inputs.append("p")
        inits.append(numpy_helper.from_array(case.exponent, "p"))
    node = helper.make_node(case.op, inputs, ["y"], **dict(case.attrs))
    graph = helper.make_graph(
        [node],
        case.id.replace("-", "_"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=9)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _op_types(model: onnx.ModelProto) -> tuple[str, ...]:
    return tuple(n.op_type for n in model.graph.node) + tuple(
        n.op_type for f in model.functions for n in f.node
    )


def assert_near(got, want, x, ulps: int = 0, of_x: int = 0, what: str = "") -> None:
    """``got`` within ``ulps`` float32 ulps of ``want`` plus ``of_x`` ulps of ``x``, with NaN,
    infinities and their signs in the same places (0 ulps: bit for bit but for the sign of 0)."""
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    x = np.broadcast_to(np.asarray(x, F32), want.shape)
    assert got.shape == want.shape, what
    same_nan = np.isnan(got) == np.isnan(want)
    assert same_nan.all(), (
        f"{what}: NaN at x = {x[~same_nan][:8]}: {got[~same_nan][:8]} vs {want[~same_nan][:8]}"
    )
    finite = np.isfinite(want)
    inf = np.isinf(want)
    assert (got[inf] == want[inf]).all(), f"{what}: infinities differ at x = {x[inf][got[inf] != want[inf]]}"
    g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
    tol = ulps * np.spacing(np.abs(want[finite])).astype(np.float64)
    tol += of_x * np.spacing(np.abs(x[finite])).astype(np.float64)
    bad = np.abs(g - w) > tol
    assert not bad.any(), (
        f"{what}: at x = {x[finite][bad][:8]}: {got[finite][bad][:8]} vs ORT {want[finite][bad][:8]}"
    )


def _masked(case: Case, x: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray]:
    """The arrays where ``x`` is not one of the case's known differences (flattened)."""
    keep = ~np.isin(np.broadcast_to(x, arrays[0].shape), np.array(case.skip, F32))
    return [np.broadcast_to(a, arrays[0].shape)[keep] for a in (x, *arrays)]


CASE_PARAMS = [pytest.param(c, id=c.id) for c in CASES]


# --------------------------------------------------------------------------
# Import: ONNX Runtime and the interpreter agree
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_import_computes_what_onnx_runtime_computes(case: Case) -> None:
    model = _model(case)
    x = _inputs(case.id)
    want = _run(model, x)
    program, arrays = translate_single_node(model)
    got = evaluate(program, {"x": x, **arrays}, mode="float32")["y"]
    xs, g, w = _masked(case, x, got, want)
    assert_near(g, w, xs, case.ulps, case.of_x, case.id)
    # The float64 interpreter on moderate inputs: the same function, rounded differently.
    wide = evaluate(program, {"x": x.astype(np.float64), **arrays}, mode="float64")["y"]
    moderate = (np.abs(np.broadcast_to(x, want.shape)) < 1e4) & np.isfinite(want)
    np.testing.assert_allclose(wide[moderate], want[moderate], rtol=2e-6, atol=1e-6, err_msg=case.id)


def test_erf_is_within_an_ulp_of_onnx_runtime_everywhere() -> None:
    # Beyond the sample points: ORT's Erf (MLAS) against the interpreter's (math.erf, rounded once).
    x = np.random.default_rng(1).normal(0.0, 2.0, size=200_000).astype(F32)
    model = _model(Case("erf-many", "Erf", ()))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = x.size
    model.graph.input[0].type.tensor_type.shape.dim.pop()
    (i,) = einopt.iters(f"i:{x.size}")
    e = einopt.L(i)(einopt.erf(einopt.tensor("x", (x.size,))[i]))
    assert_near(evaluate(e, {"x": x}, mode="float32"), _run(model, x), x, ulps=1, what="erf")


@pytest.mark.parametrize(
    "case, form",
    [
        ("pow-2", lambda x: ir.Binary("*", x, x)),
        ("pow-3", lambda x: ir.Binary("*", ir.Binary("*", x, x), x)),
        ("pow-half", lambda x: ir.Unary("sqrt", x)),
        ("pow-minus-1", lambda x: ir.Binary("/", ir.Const(1.0), x)),
        ("pow-1", lambda x: x),
        ("pow-1.5", lambda x: ir.Unary("pow", x, 1.5)),
        ("pow-5-int64", lambda x: ir.Unary("pow", x, 5.0)),
        ("reciprocal", lambda x: ir.Binary("/", ir.Const(1.0), x)),
        ("hardsigmoid-default", lambda x: hard_sigmoid(x, float(F32(0.2)), 0.5)),
        ("hardswish", hard_swish),
        ("gelu", gelu),
        ("gelu-tanh", lambda x: gelu(x, "tanh")),
    ],
)
def test_import_form(case: str, form) -> None:
    (c,) = [c for c in CASES if c.id == case]
    program, _ = translate_single_node(_model(c))
    scope = program.scope("y")
    x = ir.Access(program.inputs[0], scope.traversal[-len(SHAPE) :])
    assert scope.body is form(x)


@pytest.mark.parametrize(
    "case, reason",
    [
        (Case("pow-input", "Pow", ()), "not a constant"),
        (Case("pow-per-element", "Pow", (), exponent=np.arange(64, dtype=F32)), "has 64 elements"),
        (Case("pow-bool", "Pow", (), exponent=np.array(True)), "only a number"),
        (Case("pow-nan", "Pow", (), exponent=np.array(math.nan, F32)), "is nan"),
        (Case("gelu-opset-18", "Gelu", (), opset=18), "from opset 20"),
    ],
    ids=lambda v: v.id if isinstance(v, Case) else "",
)
def test_refused(case: Case, reason: str) -> None:
    model = _model(case)
    if case.id == "pow-input":  # the exponent as a graph input
        model.graph.node[0].input.append("p")
        model.graph.input.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, []))
    with pytest.raises(Unsupported, match=reason):
        translate_single_node(model)


def test_gelu_with_an_unknown_approximation_is_refused() -> None:
    model = _model(Case("gelu-bad", "Gelu", (), (("approximate", "fast"),), opset=20))
    with pytest.raises(Unsupported, match="approximate='fast'"):
        translate_single_node(model)
    with pytest.raises(ValueError, match="'none' or 'tanh'"):
        gelu(ir.Const(1.0), "fast")


def test_hard_activations_end_subprograms() -> None:
    assert {"HardSigmoid", "HardSwish"} <= ACTIVATIONS
    assert "Reciprocal" not in ACTIVATIONS  # imported as a division, linear like Div


# --------------------------------------------------------------------------
# Writing the import back
# --------------------------------------------------------------------------


def _write_back(program: ir.Program, arrays: dict, opset: int, op: str = "") -> onnx.ModelProto:
    """The program as ``einopt optimize`` writes an unchanged part: its output preferring the
    operator that computed it (``op``)."""
    from einopt.instantiate.emit import instantiate

    names = {t.name: t.name for t in program.inputs} | {o: o for o in program.outputs}
    back = instantiate(
        program, onnx_names=names, constants=arrays, opset=opset, prefix="rt_", preferred={"y": op}
    )
    graph = helper.make_graph(
        list(back.nodes),
        "back",
        [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape)) for t in program.inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=list(back.initializers),
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=9, functions=list(back.functions))


@pytest.fixture
def elementwise_only(monkeypatch):
    """Instantiation with the element-wise matcher alone (the table's com.microsoft operators,
    which take some of these forms too, are tested with their own matchers)."""
    from einopt.instantiate import emit
    from einopt.instantiate.match_elementwise import match_elementwise

    monkeypatch.setattr(emit, "MATCHERS", {"Elementwise": match_elementwise})


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_written_back_as_the_operator_it_was(case: Case) -> None:
    model = _model(case)
    x = _inputs(case.id)
    program, arrays = translate_single_node(model)
    back = _write_back(program, arrays, case.opset, case.op)
    ops = _op_types(back)
    # The operator it was, or one com.microsoft operator the table prefers (FastGelu for Gelu's
    # tanh form): never a chain.
    contrib = len(back.graph.node) == 1 and back.graph.node[0].domain == "com.microsoft"
    assert ops == case.back or (case.back == (case.op,) and contrib), ops
    want = _run(model, x)
    got = _run(back, x)
    if ops == (case.op,):  # the same operator computes the same values
        np.testing.assert_array_equal(got, want)
    else:
        xs, g, w = _masked(case, x, got, want)
        assert_near(g, w, xs, case.ulps, case.of_x, case.id)


@pytest.mark.parametrize("case", [c for c in CASE_PARAMS if c.values[0].back == (c.values[0].op,)])
def test_element_wise_matcher_writes_the_operator_it_was(case: Case, elementwise_only) -> None:
    model = _model(case)
    program, arrays = translate_single_node(model)
    back = einopt.to_onnx(program, arrays, opset=case.opset)
    assert _op_types(back) == case.back
    x = _inputs(case.id)
    np.testing.assert_array_equal(_run(back, x), _run(model, x))


@pytest.mark.parametrize(
    "case, opset, ops",
    [
        ("gelu", 17, ("Mul", "Mul", "Erf", "Add", "Mul")),
        ("gelu-tanh", 19, ("Mul", "Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul")),
        ("hardswish", 13, ("HardSigmoid", "Mul")),
    ],
)
def test_written_back_as_a_chain_before_its_opset(
    case: str, opset: int, ops: tuple[str, ...], elementwise_only
) -> None:
    (c,) = [c for c in CASES if c.id == case]
    model = _model(c)
    program, arrays = translate_single_node(model)
    back = einopt.to_onnx(program, arrays, opset=opset)
    assert sorted(_op_types(back)) == sorted(ops)
    # ORT's Gelu kernel is this chain of its Erf (Tanh) and float32 arithmetic: the same values.
    x = _inputs(case)
    np.testing.assert_array_equal(_run(back, x), _run(model, x))


def _scope(body) -> ir.Scope:
    (i,) = einopt.iters("i:8")
    return einopt.L(i)(body(einopt.tensor("x", (8,))[i]))


@pytest.mark.parametrize(
    "body, ops",
    [
        # Gelu's own order of operations only: x * (1 + erf) overflows where Gelu does not.
        (
            lambda x: ir.Binary(
                "*",
                ir.Const(0.5),
                ir.Binary("*", x, ir.Binary("+", ir.Unary("erf", x * GELU_SQRT1_2), ir.Const(1.0))),
            ),
            ("Mul", "Erf", "Add", "Mul", "Mul"),
        ),
        # Another constant than 1/sqrt(2) (float32) inside erf.
        (lambda x: _gelu_with(x, 0.7), ("Mul", "Mul", "Erf", "Add", "Mul")),
        # A bare clamp to [0, 1] is Clip.
        (lambda x: einopt.maximum(einopt.minimum(x, 1.0), 0.0), ("Clip",)),
        # x * HardSigmoid with other constants than HardSwish's.
        (lambda x: x * hard_sigmoid(x, 0.2, 0.5), ("HardSigmoid", "Mul")),
        # Not a cube of one value.
        (lambda x: (x * x) * (x + 1.0), ("Mul", "Add", "Mul")),
        (lambda x: 2.0 / x, ("Div",)),
    ],
)
def test_patterns_refuse_near_misses(body, ops: tuple[str, ...], elementwise_only) -> None:
    model = einopt.to_onnx(_scope(body), opset=20)
    assert sorted(_op_types(model)) == sorted(ops)


def _gelu_with(x: ir.ValueExpr, c: float) -> ir.ValueExpr:
    inner = ir.Binary("+", ir.Unary("erf", ir.Binary("*", x, ir.Const(c))), ir.Const(1.0))
    return ir.Binary("*", ir.Binary("*", ir.Const(0.5), x), inner)


@pytest.mark.parametrize(
    "body, op, attrs",
    [
        (lambda x: hard_sigmoid(x, 0.25, 0.5), "HardSigmoid", {"alpha": 0.25, "beta": 0.5}),
        # The clamp the other way round, the affine part commuted: the same values.
        (
            lambda x: einopt.minimum(einopt.maximum(0.5 + x * 0.25, 0.0), 1.0),
            "HardSigmoid",
            {"alpha": 0.25, "beta": 0.5},
        ),
        (
            lambda x: einopt.minimum(einopt.maximum(x + 0.5, 0.0), 1.0),
            "HardSigmoid",
            {"alpha": 1.0, "beta": 0.5},
        ),
        (lambda x: hard_sigmoid(x, 1 / 6, 0.5) * x, "HardSwish", {}),
        (lambda x: ir.Binary("*", (x + 1.0) * (x + 1.0), x + 1.0), "Pow", {}),
        (lambda x: 1.0 / (x + 1.0), "Reciprocal", {}),
        (lambda x: gelu(x + 1.0, "tanh"), "Gelu", {"approximate": "tanh"}),
    ],
)
def test_patterns_write_one_operator(body, op: str, attrs: dict, elementwise_only) -> None:
    scope = _scope(body)
    model = einopt.to_onnx(scope, opset=20)
    (node,) = [n for n in model.graph.node if n.op_type == op]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == pytest.approx(
        {k: (v.encode() if isinstance(v, str) else v) for k, v in attrs.items()}
    )
    x = _inputs(op)[0, :8]
    got = _run_named(model, {"x": x})
    want = evaluate(scope, {"x": x}, mode="float32")
    assert_near(got, want, x, ulps=1, of_x=4, what=op)


def _run_named(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


# --------------------------------------------------------------------------
# The exporters' models
# --------------------------------------------------------------------------

# Per shared model: the op types of these activations in it, all of which must translate.
SHARED_ACTIVATIONS = {
    "bert_tiny": {"Erf"},
    "gpt2_tiny_dynamo": {"Pow"},
    "vit_tiny_dynamo": {"Erf"},
    "convnext_block_dynamo": {"Erf"},
    "mobilenet_v3_small": {"HardSwish", "HardSigmoid"},
    "se_block": {"Sigmoid"},  # SiLU: Sigmoid and Mul
}


def _shared(name: str) -> onnx.ModelProto:
    """A shared model, prepared (shapes inferred, constants folded) as ``einopt optimize`` does."""
    path = shared_models.path(name)
    if not path.exists():
        pytest.skip(f"{path} is absent (the exporters' models live in ../shared/models beside the checkout)")
    from einopt.frontend.fold import prepare
    from einopt.runtime.modelio import load_model

    return prepare(load_model(str(path))).model


@pytest.mark.parametrize("name", sorted(SHARED_ACTIVATIONS))
def test_shared_models_translate_their_activations(name: str) -> None:
    from einopt.frontend.translate import translate_graph

    model = _shared(name)
    nodes = model.graph.node
    parts = translate_graph(model)
    kind = {i: p.kind for p in parts for i in p.nodes}
    reason = {i: p.reason for p in parts for i in p.nodes}
    ops = SHARED_ACTIVATIONS[name]
    found = [i for i, n in enumerate(nodes) if n.op_type in ops]
    assert {nodes[i].op_type for i in found} == ops, f"{name} no longer has {ops}"
    passed = {f"{nodes[i].op_type} {nodes[i].name}: {reason[i]}" for i in found if kind[i] == "passthrough"}
    assert not passed, passed
    # Every Mul (SiLU's, GELU's, the scale of attention) reading one of them translates too.
    outputs = {o for i in found for o in nodes[i].output}
    readers = [i for i, n in enumerate(nodes) if n.op_type == "Mul" and outputs & set(n.input)]
    assert all(kind[i] != "passthrough" for i in readers), [reason[i] for i in readers]


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "se_block"])
def test_shared_models_write_their_activations_back(name: str) -> None:
    # Importing a model and writing it back costs nothing: each of these activations (subprograms
    # of their own) comes back as the operator it was. (SiLU's Sigmoid gates its own argument and
    # joins the Conv before it: partition.absorb_gates.)
    from einopt.frontend.translate import translate_graph
    from einopt.instantiate.emit import instantiate, original_ops
    from einopt.opsets import default_opset

    model = _shared(name)
    opset = default_opset(model)
    ops = SHARED_ACTIVATIONS[name]
    written = 0
    parts = translate_graph(model)
    for part in parts:
        originals = [model.graph.node[i].op_type for i in part.nodes]
        if part.program is None or not set(originals) <= ops:
            continue
        back = instantiate(
            part.program,
            onnx_names=part.names,
            constants=part.constants,
            opset=opset,
            prefix="rt_",
            preferred=original_ops(model, part),
        )
        assert not back.functions and [n.op_type for n in back.nodes] == originals, part.name
        written += 1
    own = [p for p in parts if p.kind == "activation" and model.graph.node[p.nodes[0]].op_type in ops]
    assert written == len(own) >= 1

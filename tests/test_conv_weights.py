"""Conv weights known only at run time: padded at compile time or not at all.

ONNX Runtime's Pad fusion (``onnxruntime/core/optimizer/pad_fusion.cc``, on at
``ORT_ENABLE_ALL``) folds a zero Pad that feeds a Conv into the Conv's
``pads``, always as if it padded the input: a Pad feeding the *weight* is
removed and the model no longer loads ("Node input '..' is not a graph input,
initializer, or output of a previous node"). Boundary relaxing widens a kernel
(the weight read past its end, zero there); a constant weight is then padded
at compile time into a new initializer, while for a weight computed at run
time the Conv matcher refuses, whichever dimension the Pad is on (ONNX
Runtime's transpose optimizer cancels Transposes around a Pad and so brings
it next to the Conv). Other run-time layout steps of a Conv weight (Slice,
Transpose, Reshape) and a padded ConvTranspose weight load and run correctly,
and stay accepted.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_instantiate import run_onnx

import einopt
from einopt.core import ir
from einopt.instantiate.match import MATCHERS, match
from einopt.instantiate.plan import MatchContext, OperatorMatch, Pad, Refusal
from einopt.instantiate.program import as_program

ENABLE_ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
DISABLE_ALL = ort.GraphOptimizationLevel.ORT_DISABLE_ALL

# The fuzzer's smallest case after boundary relaxing: the kernel read at r = -1 (zero there).
RELAXED = "L[n:6, f:4, o:2] Sum[c:1, r=-1:5] X[n, c+f, o+2*r-2] * W[f, c, r] where X:[6,4,8], W:[4,1,5]"
REFUSAL = "computed at run time and would need zero padding"


def _session(model: onnx.ModelProto, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    return {
        vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
        for vi in model.graph.input
        if vi.name not in inits
    }


def _weight_pads(model: onnx.ModelProto) -> list[str]:
    """Pad nodes whose output a Conv reads as its weight (what ONNX Runtime's Pad fusion breaks)."""
    pads = {n.output[0]: n.name for n in model.graph.node if n.op_type == "Pad"}
    return [pads[n.input[1]] for n in model.graph.node if n.op_type == "Conv" and n.input[1] in pads]


# --------------------------------------------------------------------------
# What ONNX Runtime's optimizer does with run-time transforms of a weight
# --------------------------------------------------------------------------


def _i(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _t(*perm: int) -> tuple[str, list[np.ndarray], dict]:
    return ("Transpose", [], {"perm": list(perm)})


def _pad(*pads: int) -> tuple[str, list[np.ndarray], dict]:
    return ("Pad", [_i(*pads)], {})


TRANSFORMS = [
    # (id, operator, weight shape, steps (op type, constant inputs, attributes), loads at ENABLE_ALL)
    ("conv_pad_kernel", "Conv", [3, 4, 3], [_pad(0, 0, 1, 0, 0, 0)], False),
    # a Pad of the kernel laid out first: ORT's transpose optimizer cancels the Transposes around it
    (
        "conv_pad_transposed_kernel",
        "Conv",
        [3, 4, 3],
        [_t(2, 1, 0), _pad(1, 0, 0, 0, 0, 0), _t(2, 1, 0)],
        False,
    ),
    ("conv_pad_channels", "Conv", [3, 3, 4], [_pad(0, 1, 0, 0, 0, 0)], True),
    ("conv_slice_reversed", "Conv", [3, 4, 4], [("Slice", [_i(3), _i(-5), _i(2), _i(-1)], {})], True),
    ("conv_transpose_weight", "Conv", [4, 3, 4], [_t(1, 0, 2)], True),
    ("conv_reshape_weight", "Conv", [12, 4], [("Reshape", [_i(3, 4, 4)], {})], True),
    ("convtranspose_pad_kernel", "ConvTranspose", [4, 3, 3], [_pad(0, 0, 1, 0, 0, 0)], True),
]


@pytest.mark.parametrize(
    ("op", "w_shape", "steps", "loads"), [c[1:] for c in TRANSFORMS], ids=[c[0] for c in TRANSFORMS]
)
def test_ort_optimizer_on_a_run_time_weight(op, w_shape, steps, loads):
    # The ground for refusing any run-time Pad of a Conv weight and nothing else: if ONNX Runtime
    # fixes its Pad fusion, the failing cases fail here and the refusal in match_conv can go.
    nodes, inits, value = [], [], "w"
    for k, (op_type, consts, attrs) in enumerate(steps):
        names = [f"k{k}_{j}" for j in range(len(consts))]
        inits += [numpy_helper.from_array(c, n) for c, n in zip(consts, names, strict=True)]
        nodes.append(helper.make_node(op_type, [value, *names], [f"w{k}"], **attrs))
        value = f"w{k}"
    nodes.append(helper.make_node(op, ["x", value], ["y"], kernel_shape=[4], pads=[0, 0]))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 9]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, w_shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = _feeds(model)
    (want,) = _session(model, DISABLE_ALL).run(None, feeds)
    if not loads:
        with pytest.raises(Exception, match="is not a graph input, initializer, or output"):
            _session(model, ENABLE_ALL)
        return
    (got,) = _session(model, ENABLE_ALL).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------
# The matcher
# --------------------------------------------------------------------------


def test_conv_matcher_pads_only_a_constant_weight():
    scope = einopt.parse(RELAXED)
    refused = MATCHERS["Conv"](scope)
    assert isinstance(refused, Refusal) and REFUSAL in refused.reason
    (w,) = [t for t in ir.input_tensors(scope) if t.name == "W"]
    accepted = MATCHERS["Conv"](scope, MatchContext(constant=frozenset({w})))
    assert isinstance(accepted, OperatorMatch) and accepted.attrs["kernel_shape"] == (6,)
    assert any(isinstance(st, Pad) for st in accepted.operands[1].steps)
    m, failures = match(scope)
    assert m is not None and m.op_type != "Conv" and REFUSAL in dict(failures)["Conv"].reason
    run_onnx(RELAXED)  # ONNX Runtime at its default level, ORT_ENABLE_ALL
    inst, ops = run_onnx(RELAXED, ("W",))
    assert ops == ["Conv"]
    assert [tuple(t.dims) for t in inst.initializers if t.data_type == TensorProto.FLOAT] == [(4, 1, 6)]


RUN_TIME_WEIGHTS = [
    # (id, text, operator, its weight's layout steps): accepted with the weight a graph input
    (
        "conv_transposed_weight",
        "L[n:1, f:2, h:4] Sum[c:3, r:3] X[n, c, h+r]*W[c,f,r] where X:[1,3,6], W:[3,2,3]",
        "Conv",
        ["Transpose"],
    ),
    (
        "conv_merged_weight",
        "L[n:1, f:2, h:4] Sum[c:3, r:3] X[n, c, h+r]*W[f,c*3+r] where X:[1,3,6], W:[2,9]",
        "Conv",
        ["Reshape"],
    ),
    (
        "conv_reversed_weight",
        "L[n:1, f:2, h:4] Sum[c:3, r:3] X[n, c, h+r]*W[f,c,2-r] where X:[1,3,6], W:[2,3,3]",
        "Conv",
        ["Slice"],
    ),
    (
        "convtranspose_padded_weight",
        "L[n:1, f:2, h:4] Sum[c:3, r:4] X[n, c, h-2*r+4]*W[f,c,r] where X:[1,3,6], W:[2,3,3]",
        "ConvTranspose",
        ["Pad", "Transpose"],
    ),
]


@pytest.mark.parametrize(
    ("text", "op", "steps"), [c[1:] for c in RUN_TIME_WEIGHTS], ids=[c[0] for c in RUN_TIME_WEIGHTS]
)
def test_other_run_time_weight_layouts_stay_accepted(text, op, steps):
    m, failures = match(einopt.parse(text))
    assert m is not None and m.op_type == op, failures
    assert [type(st).__name__ for st in m.operands[1].steps] == steps
    run_onnx(text)


# --------------------------------------------------------------------------
# Through the search
# --------------------------------------------------------------------------


def test_search_keeps_the_widened_kernel_of_a_constant_weight():
    prog = as_program(einopt.parse(RELAXED.replace("r=-1:5", "r:5")))
    result = einopt.superoptimize(prog, max_depth=1)
    relaxed = [c for c in result.candidates if [t.rule for t in c.trace] == ["relax_boundary"]]
    assert relaxed, [[t.rule for t in c.trace] for c in result.candidates]
    w = np.random.default_rng(1).standard_normal((4, 1, 5))
    for cand in relaxed:
        folded = einopt.to_onnx(cand, {"W": w})
        assert [n.op_type for n in folded.graph.node] == ["Conv"]
        (conv,) = folded.graph.node
        assert [list(a.ints) for a in conv.attribute if a.name == "kernel_shape"] == [[6]]
        run_time = einopt.to_onnx(cand)
        assert _weight_pads(run_time) == []
        feeds = _feeds(run_time)
        (want,) = _session(run_time, DISABLE_ALL).run(None, feeds)
        (got,) = _session(run_time, ENABLE_ALL).run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _padded_conv(weight_is_input: bool) -> onnx.ModelProto:
    """The fuzzer's smallest case: ``Pad(x[4,3,7])`` then a grouped, dilated Conv of kernel 5."""
    w = np.random.default_rng(0).standard_normal((4, 1, 5)).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 7])]
    inits = [numpy_helper.from_array(np.array([0, 1, 0, 2, 0, 1], dtype=np.int64), "pads")]
    if weight_is_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 1, 5]))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    graph = helper.make_graph(
        [
            helper.make_node("Pad", ["x", "pads"], ["p"]),
            helper.make_node(
                "Conv", ["p", "w"], ["y"], group=4, kernel_shape=[5], dilations=[2], pads=[0, 2]
            ),
        ],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4, 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("weight_is_input", [True, False], ids=["weight_input", "weight_initializer"])
def test_unverified_search_output_loads_under_ort_optimizer(weight_is_input):
    model = _padded_conv(weight_is_input)
    options = einopt.Options(verify=False, accept="verified", max_depth=3, cache=False)
    out = einopt.optimize(model, options).model
    assert _weight_pads(out) == []
    feeds = _feeds(model)
    (want,) = _session(model, DISABLE_ALL).run(None, feeds)
    (got,) = _session(out, ENABLE_ALL).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

"""Instantiation: programs as ONNX nodes, checked in ONNX Runtime against the reference interpreter.

Every case builds a full model from ``instantiate``'s output (graph inputs =
the program's non-constant inputs, constants as initializers), runs
``onnx.checker.check_model(full_check=True)``, runs it in ONNX Runtime
(float32) and compares with ``einopt.core.interp.evaluate`` (float64). The
emitted operator types are asserted too.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import einopt
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.instantiate import EOP_DOMAIN
from einopt.instantiate.emit import Instantiated, InstantiationError, instantiate
from einopt.instantiate.match import MATCHERS
from einopt.instantiate.match_contrib import CONTRIB_DOMAIN

OPSET = 17


def as_program(text: str) -> ir.Program:
    e = einopt.parse(text)
    return einopt.program({"out": e}) if isinstance(e, ir.Scope) else e


def run_onnx(
    program: ir.Program | str,
    constants=(),
    opset: int = OPSET,
    seed: int = 0,
    rtol: float = 1e-4,
    preferred=None,
) -> tuple[Instantiated, list[str]]:
    """Instantiate ``program`` (inputs named in ``constants`` are weights, random unless
    ``constants`` maps them to their values; ``preferred`` operator types per binding), run it,
    compare; return the instantiation and the emitted node op types."""
    if isinstance(program, str):
        program = as_program(program)
    rng = np.random.default_rng(seed)
    arrays = {t.name: rng.standard_normal(t.shape) for t in program.inputs}
    arrays |= dict(constants) if isinstance(constants, dict) else {}
    consts = {n: arrays[n] for n in constants}
    names = {t.name: f"in_{t.name}" for t in program.inputs} | {o: f"out_{o}" for o in program.outputs}
    inst = instantiate(
        program, onnx_names=names, constants=consts, opset=opset, prefix="p/", preferred=preferred
    )
    used = {i for n in inst.nodes for i in n.input}
    graph = helper.make_graph(
        list(inst.nodes),
        "g",
        [
            helper.make_tensor_value_info(names[t.name], TensorProto.FLOAT, t.shape)
            for t in program.inputs
            if t.name not in consts
        ],
        [
            helper.make_tensor_value_info(names[o], TensorProto.FLOAT, program.scope(o).shape)
            for o in program.outputs
        ],
        [numpy_helper.from_array(consts[n].astype(np.float32), names[n]) for n in consts if names[n] in used]
        + list(inst.initializers),
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", opset),
            helper.make_opsetid(EOP_DOMAIN, 1),
            helper.make_opsetid(CONTRIB_DOMAIN, 1),
        ],
        functions=list(inst.functions),
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {names[t.name]: arrays[t.name].astype(np.float32) for t in program.inputs if t.name not in consts}
    got = sess.run([names[o] for o in program.outputs], feeds)
    want = evaluate(program, arrays)
    for o, g in zip(program.outputs, got, strict=True):
        w = want[o]
        assert g.shape == w.shape, o
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale, err_msg=o)
    return inst, [n.op_type for n in inst.nodes]


# --------------------------------------------------------------------------
# One scope per case: the emitted operators
# --------------------------------------------------------------------------

U = "{L[n:1, c:3, i0:4, p0:1, i1:4, p1:1] X[n, c, i0, i1]}"

CASES = [
    ("matmul", "L[m:4, n:5] Sum[k:3] A[m,k]*B[k,n] where A:[4,3], B:[3,5]", (), ["MatMul"]),
    ("gemm_transposed_inputs", "L[m:4, n:5] Sum[k:3] A[k,m]*B[n,k] where A:[3,4], B:[5,3]", (), ["Gemm"]),
    (
        "gemm_bias_alpha_beta",
        "L[m:4, n:5] {L[a:4, b:5] Sum[k:3] 0.5*(A[k,a]*B[b,k])}[m, n] + 2.0*C[n] where A:[3,4], B:[5,3], C:[5]",
        ("B", "C"),
        ["Gemm"],
    ),
    (  # two merged nn.Linear products keep both biases: one bias, folded at compile time
        "gemm_two_biases",
        "L[m:4, n:5] {L[a:4, b:5] Sum[k:3] A[a,k]*B[b,k]}[m, n] + C[n] + D[n] where A:[4,3], B:[5,3], C:[5], D:[5]",
        ("B", "C", "D"),
        ["Gemm"],
    ),
    (
        "gemm_bias_matrix",
        "L[m:4, n:5] C[m, n] + {L[a:4, b:5] Sum[k:3] A[a,k]*B[k,b]}[m, n] where A:[4,3], B:[3,5], C:[4,5]",
        (),
        ["Gemm"],
    ),
    (
        "matmul_output_transposed_as_gemm",
        "L[n:5, m:4] Sum[k:3] A[m,k]*B[k,n] where A:[4,3], B:[3,5]",
        (),
        ["Gemm"],
    ),
    (
        "batched_matmul_broadcast",
        "L[b:2, m:4, n:5] Sum[k:3] A[m,k]*B[b,k,n] where A:[4,3], B:[2,3,5]",
        (),
        ["MatMul"],
    ),
    (
        "batched_matmul_permuted_output",
        "L[m:4, b:2, n:5] Sum[k:3] A[b,m,k]*B[b,k,n] where A:[2,4,3], B:[2,3,5]",
        (),
        ["MatMul", "Transpose"],
    ),
    (
        "matmul_merged_rows",
        "L[m1:2, m2:3, n:5] Sum[k:3] A[m1*3+m2,k]*B[k,n] where A:[6,3], B:[3,5]",
        (),
        ["MatMul", "Reshape"],
    ),
    (
        "matmul_two_summed",
        "L[m:4, n:5] Sum[k1:2, k2:3] A[m,k1,k2]*B[k1,k2,n] where A:[4,2,3], B:[2,3,5]",
        (),
        ["Reshape", "Reshape", "MatMul"],
    ),
    (
        "conv2d",
        "L[n:1, f:8, h:5, w:5] Sum[c:3, r:3, s:3] X[n, c, h+r-1, w+s-1]*W[f,c,r,s] where X:[1,3,5,5], W:[8,3,3,3]",
        ("W",),
        ["Conv"],
    ),
    (
        "conv_bias_fused",
        "L[n:1, f:4, h:5] {L[n2:1, f2:4, h2:5] Sum[c:3, r:3] X[n2, c, h2+r-1]*W[f2,c,r]}[n, f, h] + B[f]"
        " where X:[1,3,5], W:[4,3,3], B:[4]",
        ("W", "B"),
        ["Conv"],
    ),
    (
        # A phase of a split ConvTranspose: the result keeps a unit residue axis the conv does not read.
        "conv_bias_fused_unit_axis",
        "L[n:1, f:4, h:5, u=1:2] {L[n2:1, f2:4, h2:5] Sum[c:3, r:3] X[n2, c, h2+r-1]*W[f2,c,r]}[n, f, h] + B[f]"
        " where X:[1,3,5], W:[4,3,3], B:[4]",
        ("W", "B"),
        ["Conv", "Reshape"],
    ),
    (
        "conv_1x1_strided_is_one_conv",  # ResNet's downsample: no Slice in front of the Conv
        "L[n:2, f:4, o0:4, o1:4] {L[n2:2, f2:4, h:4, w:4] Sum[c:3, r0:1, r1:1]"
        " X[n2, c, 2*h+r0, 2*w+r1]*W[f2,c,r0,r1]}[n, f, o0, o1] + B[f]"
        " where X:[2,3,8,8], W:[4,3,1,1], B:[4]",
        ("W", "B"),
        ["Conv"],
    ),
    (
        "conv_1x1_strided_without_kernel_iterators",
        "L[n:2, f:4, o0:4, o1:4] {L[n2:2, f2:4, h:4, w:4] Sum[c:3] X[n2, c, 2*h, 2*w]*W[f2,c]}[n, f, o0, o1]"
        " + B[f] where X:[2,3,8,7], W:[4,3], B:[4]",
        ("W", "B"),
        ["Conv"],
    ),
    (
        "conv_strided_offset_slices_the_start_only",
        "L[n:1, f:4, o0:4, o1:4] Sum[c:3] X[n, c, 2*o0+1, 2*o1-1]*W[f,c] where X:[1,3,8,7], W:[4,3]",
        ("W",),
        ["Slice", "Conv"],
    ),
    (
        "conv_transpose_fsrcnn_constant_bias",  # k9 s4 p4 output_padding 3, one output channel
        "L[n:1, f:1, o0:12, o1:12] {L[n2:1, f2:1, a:12, b:12] Sum[c:2, r0:9, r1:9]"
        " {L[m:1, d:2, i0:3, p0:1, i1:3, p1:1] X[m, d, i0, i1]}"
        "[n2, c, (a-r0+4)//4, (a-r0+4)%4, (b-r1+4)//4, (b-r1+4)%4] * W[c, f2, r0, r1]}[n, f, o0, o1] + -0.25"
        " where X:[1,2,3,3], W:[2,1,9,9]",
        ("W",),
        ["ConvTranspose"],
    ),
    (
        "gemm_constant_bias",
        "L[m:4, n:5] {L[a:4, b:5] Sum[k:3] A[a,k]*B[b,k]}[m, n] + 2.0 where A:[4,3], B:[5,3]",
        ("B",),
        ["Gemm"],
    ),
    (
        "conv_nhwc_no_batch",
        "L[h:5, w:5, f:8] Sum[c:3, r:3, s:3] X[h+r-1, w+s-1, c]*W[r,s,c,f] where X:[5,5,3], W:[3,3,3,8]",
        ("W",),
        ["Transpose", "Reshape", "Conv", "Reshape", "Transpose"],
    ),
    (
        "conv_negative_pad",
        "L[n:1, f:2, h:3] Sum[c:3, r:3] X[n, c, 2*h+r+1]*W[f,c,r] where X:[1,3,9], W:[2,3,3]",
        ("W",),
        ["Slice", "Conv"],
    ),
    (
        "conv_offset_range",
        "L[n:1, f:2, h=-1:4] Sum[c:3, r:3] X[n, c, h+r]*W[f,c,r] where X:[1,3,5], W:[2,3,3]",
        ("W",),
        ["Conv"],
    ),
    (
        "conv_grouped_strided",
        "L[n:1, f:8, h:3, w:3] Sum[c:2, r:3, s:3] X[n, c + 2*(f//4), 2*h+r-1, 2*w+s-1]*W[f,c,r,s]"
        " where X:[1,4,5,5], W:[8,2,3,3]",
        ("W",),
        ["Conv"],
    ),
    (
        "conv_depthwise",
        "L[n:2, f:4, h:5, w:5] Sum[r:3, s:3] X[n, f, h+r-1, w+s-1]*W[f,r,s] where X:[2,4,5,5], W:[4,3,3]",
        ("W",),
        ["Conv"],
    ),
    (
        "conv3d_dilated",
        "L[n:1, f:2, d:3, h:3, w:4] Sum[c:2, a:2, r:2, s:2] X[n, c, d+a, h+2*r-1, w+s]*W[f,c,a,r,s]"
        " where X:[1,2,4,4,5], W:[2,2,2,2,2]",
        ("W",),
        ["Conv"],
    ),
    (
        "conv_transpose_stride1",
        "L[n:1, f:5, o:6] Sum[c:3, k:3] X[n, c, o - k] * W[c, f, k] where X:[1,3,4], W:[3,5,3]",
        ("W",),
        ["ConvTranspose"],
    ),
    (
        "conv_transpose_U_stride2",
        f"L[n:1, f:5, o0:7, o1:7] Sum[c:3, k0:3, k1:3] {U}[n, c, (o0+1-k0)//2, (o0+1-k0)%2, (o1+1-k1)//2,"
        " (o1+1-k1)%2] * W[c, f, k0, k1] where X:[1,3,4,4], W:[3,5,3,3]",
        ("W",),
        ["ConvTranspose"],
    ),
    (
        "conv_transpose_grouped",
        "L[n:1, f:6, o:6] Sum[c:2, k:3] X[n, c + 2*(f//3), o + 1 - 2*k] * W[c + 2*(f//3), f % 3, k]"
        " where X:[1,4,4], W:[4,3,3]",
        ("W",),
        ["ConvTranspose"],
    ),
    (
        "conv_transpose_one_output_per_group",
        "L[n:1, f:3, o:6] Sum[c:2, k:3] X[n, c + 2*f, o - k] * W[c + 2*f, 0, k] where X:[1,6,4], W:[6,1,3]",
        ("W",),
        ["ConvTranspose"],
    ),
    (
        "conv_transpose_zero_margins",
        "L[n:1, f:2, o:8] Sum[c:2, k:3] X[n, c, o - 1 - k] * W[c, f, k] where X:[1,2,4], W:[2,2,3]",
        ("W",),
        ["ConvTranspose", "Pad"],
    ),
    ("prelu", "L[i:4, j:3] max(X[i,j], 0.0) + A[j]*min(X[i,j], 0.0) where X:[4,3], A:[3]", (), ["PRelu"]),
    ("clip", "L[i:3, j:4] min(max(X[i, j], -0.5), 0.5) where X:[3,4]", (), ["Clip"]),
    ("relu6", "L[i:3, j:4] min(relu(X[i, j]), 6.0) where X:[3,4]", (), ["Clip"]),
    (
        "activations_broadcast",
        "L[i:3, j:4] leaky_relu(X[i, j], 0.1) + sigmoid(Y[j]) where X:[3,4], Y:[4]",
        (),
        ["LeakyRelu", "Sigmoid", "Add"],
    ),
    ("outer_product_broadcast", "L[i:3, j:4] X[i] * Y[j] where X:[3], Y:[4]", (), ["Reshape", "Mul"]),
    (
        "channel_scale_folded",
        "L[n:2, c:3, h:4] X[n, c, h] * S[c] + T[c] where X:[2,3,4], S:[3], T:[3]",
        ("S", "T"),
        ["Mul", "Add"],
    ),
    (  # two constant terms of a sum (an embedding plus its position and token-type tables): one Add
        "constant_terms_folded",
        "L[i:3, j:4] X[i, j] + P[i, j] + T[j] where X:[3,4], P:[3,4], T:[4]",
        ("P", "T"),
        ["Add"],
    ),
    (
        "constant_factors_folded",
        "L[i:3, j:4] S[j] * X[i, j] * 2.0 * R[j] where X:[3,4], S:[4], R:[4]",
        ("S", "R"),
        ["Mul"],
    ),
    (  # folded, they would be a [3, 4] constant: two broadcast vectors stay
        "constant_vectors_not_broadcast_into_a_matrix",
        "L[i:3, j:4] X[i, j] + A[i] + B[j] where X:[3,4], A:[3], B:[4]",
        ("A", "B"),
        ["Add", "Add"],
    ),
    ("transpose", "L[i:4, j:3] X[j, i] where X:[3,4]", (), ["Transpose"]),
    ("slice_then_transpose", "L[i:3, j:2] X[2*j+1, 8-2*i] where X:[4,9]", (), ["Slice", "Transpose"]),
    ("pad_from_range", "L[i=-2:6] X[i] where X:[4]", (), ["Pad"]),
    ("reshape_merge", "L[i:6] X[i // 3, i % 3] where X:[2,3]", (), ["Reshape"]),
    ("reshape_general", "L[i:3, j:2] X[(i*2+j) // 3, (i*2+j) % 3] where X:[2,3]", (), ["Reshape"]),
    ("squeeze_select", "L[i:3, j:4] X[j+1, 0, i] where X:[6,1,3]", (), ["Slice", "Reshape", "Transpose"]),
    ("unsqueeze", "L[i:3, u:1, j:4] X[i, j] where X:[3,4]", (), ["Reshape"]),
    ("expand", "L[i:3, j:4] X[i] where X:[3]", (), ["Reshape", "Expand"]),
    (
        "depth_to_space_dcr",
        "L[n:1, c:2, h:4, w:6] X[n, (h%2)*2*2 + (w%2)*2 + c, h//2, w//2] where X:[1,8,2,3]",
        (),
        ["DepthToSpace"],
    ),
    (
        "depth_to_space_crd",
        "L[n:1, c:2, h:4, w:6] X[n, c*4 + (h%2)*2 + w%2, h//2, w//2] where X:[1,8,2,3]",
        (),
        ["DepthToSpace"],
    ),
    (
        "space_to_depth",
        "L[n:1, c:8, h:2, w:3] X[n, c % 2, h*2 + c // 4, w*2 + (c//2)%2] where X:[1,2,4,6]",
        (),
        ["SpaceToDepth"],
    ),
    ("concat", "L[i:3, j:14] A[i, j] + B[i, j - 6] where A:[3,6], B:[3,8]", (), ["Concat"]),
    ("concat_with_gap", "L[i:12] A[i] + B[i-6] where A:[4], B:[6]", (), ["Concat"]),
    (
        "concat_grid",
        "L[i:4, j:5] A[i, j] + B[i, j-2] + C[i-1, j] + D[i-1, j-2] where A:[1,2], B:[1,3], C:[3,2], D:[3,3]",
        (),
        ["Concat", "Concat", "Concat"],
    ),
    (
        "concat_grid_with_a_hole",
        "L[i:4, j:5] A[i, j] + B[i, j-2] + D[i-1, j-2] where A:[1,2], B:[1,3], D:[3,3]",
        (),
        ["Concat", "Concat", "Concat"],
    ),
    (
        "interleave_of_unit_slots",
        "L[h:2, r:2, w:3, q:2] A[h, r, w, q] + B[h, r-1, w, q] + C[h, r, w, q-1] + D[h, r-1, w, q-1]"
        " where A:[2,1,3,1], B:[2,1,3,1], C:[2,1,3,1], D:[2,1,3,1]",
        (),
        ["Concat", "Concat", "Concat"],
    ),
    ("reduce_sum", "L[i:4, j:3] Sum[k:5] X[i,k,j] where X:[4,5,3]", (), ["ReduceSum"]),
    (
        "reduce_sum_transposed",
        "L[j:3, i:4] Sum[k:5] X[i,k,j] where X:[4,5,3]",
        (),
        ["ReduceSum", "Transpose"],
    ),
    (
        "einsum_chain",
        "L[i:4] Sum[j:3, k:5] A[i,j]*B[j,k]*C[k] where A:[4,3], B:[3,5], C:[5]",
        (),
        ["Einsum"],
    ),
]


@pytest.mark.parametrize(("text", "constants", "ops"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_case(text, constants, ops):
    _, got = run_onnx(text, constants)
    assert got == ops


@pytest.mark.parametrize("opset", [11, 12, 13, 18, 21])
@pytest.mark.parametrize(
    "case",
    ["conv_bias_fused", "gemm_bias_alpha_beta", "clip", "reduce_sum", "slice_then_transpose", "concat"],
)
def test_opsets(case, opset):
    _, text, constants, ops = next(c for c in CASES if c[0] == case)
    assert run_onnx(text, constants, opset=opset)[1] == ops


@pytest.mark.parametrize("opset", [7, 9, 10])
@pytest.mark.parametrize(
    "case",
    [
        "conv_bias_fused",
        "gemm_bias_alpha_beta",
        "clip",
        "reduce_sum",
        "concat",
        "pad_from_range",
        "squeeze_select",
        "transpose",
        "prelu",
    ],
)
def test_old_opsets_use_attribute_forms(case, opset):
    _, text, constants, ops = next(c for c in CASES if c[0] == case)
    assert run_onnx(text, constants, opset=opset)[1] == ops


@pytest.mark.parametrize(
    ("case", "opset", "reason"),
    [("slice_then_transpose", 9, "strided Slice needs opset 10"), ("expand", 7, "Expand needs opset 8")],
)
def test_old_opsets_refuse_forms_they_lack(case, opset, reason):
    _, text, constants, _ = next(c for c in CASES if c[0] == case)
    with pytest.raises(InstantiationError, match=reason):
        run_onnx(text, constants, opset=opset)


def test_einsum_needs_opset_12():
    pytest.importorskip("einopt.instantiate.eop")
    _, text, _, _ = next(c for c in CASES if c[0] == "einsum_chain")
    inst, _ = run_onnx(text, opset=11)
    assert inst.choices[0].how.startswith("eop:")
    assert "opset 12" in dict(inst.choices[0].failures)["Einsum"]


# --------------------------------------------------------------------------
# Constants, folding, names
# --------------------------------------------------------------------------


def test_gemm_trans_b_with_constant_weight_reuses_the_initializer():
    inst, ops = run_onnx("L[m:4, n:5] Sum[k:3] A[m,k]*B[n,k] where A:[4,3], B:[5,3]", ("B",))
    assert ops == ["Gemm"]
    (node,) = inst.nodes
    assert list(node.input) == ["in_A", "in_B"]
    assert {a.name: a.i for a in node.attribute if a.name.startswith("trans")} == {"transA": 0, "transB": 1}
    assert inst.initializers == ()  # the weight is read as it is


def test_matmul_transposed_constant_weight_is_folded():
    inst, ops = run_onnx("L[b:2, m:4, n:5] Sum[k:3] A[b,m,k]*B[n,k] where A:[2,4,3], B:[5,3]", ("B",))
    assert ops == ["MatMul"]
    (init,) = inst.initializers
    assert tuple(init.dims) == (3, 5)


def test_constant_scope_is_evaluated_at_compile_time():
    prog = as_program("L[i:3, j:4] W[j, i] * 2.0 + 1.0 where W:[4,3]")
    inst, ops = run_onnx(prog, ("W",))
    assert ops == ["Identity"] and [c.how for c in inst.choices] == ["constant"]
    (init,) = inst.initializers
    assert tuple(init.dims) == (3, 4)


def test_constant_without_onnx_name_becomes_an_initializer():
    prog = as_program("L[i:3, j:4] X[i, j] * S[j] where X:[3,4], S:[4]")
    s = np.arange(4.0)
    inst = instantiate(prog, onnx_names={"X": "x", "out": "y"}, constants={"S": s}, opset=OPSET, prefix="q_")
    (mul,) = inst.nodes
    (init,) = inst.initializers
    assert list(mul.input) == ["x", init.name] and init.name.startswith("q_")
    np.testing.assert_array_equal(numpy_helper.to_array(init), s.astype(np.float32))


def test_multi_binding_program_names_and_sharing():
    prog = as_program(
        """T = L[i:3, j:4] X[i, j] * 2.0
        Z = L[j:4, i:3] T[i, j] + 1.0
        V = L[i:3] Sum[j:4] T[i, j]
        return Z, V, T
        where X: [3, 4]"""
    )
    inst, ops = run_onnx(prog)
    assert sorted(ops) == sorted(["Mul", "Transpose", "Add", "ReduceSum"])
    produced = {o for n in inst.nodes for o in n.output}
    assert {"out_Z", "out_V", "out_T"} <= produced
    assert [c.binding for c in inst.choices] == ["T", "Z", "V"]


@pytest.mark.parametrize(
    ("pieces", "ops"),
    [
        # consecutive pieces covering the axis: one Split (one kernel instead of one per piece)
        ("A = L[i:2, j:3] M[i, j]\nB = L[i:2, j:5] M[i, j + 3]", ["MatMul", "Split"]),
        (
            "A = L[i:2, j:3] M[i, j] + 1.0\nB = L[i:2, j:5] M[i, j + 3] * 2.0",
            ["MatMul", "Split", "Add", "Mul"],
        ),
        # a gap, or an overlap: the Slices stay
        ("A = L[i:2, j:3] M[i, j]\nB = L[i:2, j:4] M[i, j + 4]", ["MatMul", "Slice", "Slice"]),
        ("A = L[i:2, j:4] M[i, j]\nB = L[i:2, j:5] M[i, j + 3]", ["MatMul", "Slice", "Slice"]),
    ],
    ids=["split", "split_then_compute", "gap", "overlap"],
)
def test_pieces_that_tile_a_value_are_one_split(pieces, ops):
    prog = as_program(
        f"""M = L[i:2, j:8] Sum[k:3] X[i, k] * W[k, j]
        {pieces}
        return A, B
        where X: [2, 3], W: [3, 8]"""
    )
    _, got = run_onnx(prog)
    assert got == ops
    _, got = run_onnx(prog, opset=12)  # Split takes its sizes as an input from opset 13 on
    assert "Split" not in got


@pytest.mark.parametrize(
    ("pieces", "ops"),
    [
        # each piece plus its own bias (the LSTM's gates): one Add of the joined biases, then the Split
        ("A = L[i:2, j:3] M[i, j] + b1[j]\nB = L[i:2, j:5] b2[j] + M[i, j + 3]", ["MatMul", "Add", "Split"]),
        # two biases per piece (two merged Gemms each brought theirs): folded, then joined
        (
            "A = L[i:2, j:3] M[i, j] + b1[j] + c1[j]\nB = L[i:2, j:5] b2[j] + M[i, j + 3] + c2[j]",
            ["MatMul", "Add", "Split"],
        ),
        # a bias over the rows, not the split axis, or one that is not a constant: the Adds stay
        (
            "A = L[i:2, j:3] M[i, j] + r[i]\nB = L[i:2, j:5] M[i, j + 3] + b2[j]",
            ["MatMul", "Split", "Add", "Add"],
        ),
        (
            "A = L[i:2, j:3] M[i, j] + v[j]\nB = L[i:2, j:5] M[i, j + 3] + b2[j]",
            ["MatMul", "Split", "Add", "Add"],
        ),
    ],
    ids=["biases", "two_biases", "row_bias", "not_constant"],
)
def test_biases_of_the_pieces_of_a_split_are_added_before_it(pieces, ops):
    prog = as_program(
        f"""M = L[i:2, j:8] Sum[k:3] X[i, k] * W[k, j]
        {pieces}
        return A, B
        where X: [2, 3], W: [3, 8], b1: [3], b2: [5], c1: [3], c2: [5], r: [2], v: [3]"""
    )
    names = {t.name for t in prog.inputs} & {"W", "b1", "b2", "c1", "c2", "r"}
    _, got = run_onnx(prog, constants=sorted(names))
    assert got == ops


def test_biases_of_the_pieces_of_a_gemm_are_its_bias():
    """A merged ``nn.Linear`` (a Gemm with ``transB``, as the exporter wrote it) whose pieces each add
    a bias: the joined bias is the Gemm's C, no Add before the Split."""
    prog = as_program(
        """M = L[i:2, j:8] Sum[k:3] X[i, k] * W[j, k]
        A = L[i:2, j:3] M[i, j] + b1[j]
        B = L[i:2, j:5] M[i, j + 3] + b2[j]
        return A, B
        where X: [2, 3], W: [8, 3], b1: [3], b2: [5]"""
    )
    inst, got = run_onnx(prog, constants=["W", "b1", "b2"], preferred={"M": "Gemm"})
    assert got == ["Gemm", "Split"]
    assert len(inst.nodes[0].input) == 3


def _rope_tables(positions: int, head: int) -> dict[str, np.ndarray]:
    """cos and sin tables as LLaMA's rotary embedding computes them: ``cat(freqs, freqs)``."""
    inv = 1.0 / 10000.0 ** (np.arange(0, head, 2) / head)
    freqs = np.outer(np.arange(positions), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return {"C": np.cos(emb), "S": np.sin(emb)}


def test_rotary_embedding_in_the_half_split_form_is_one_operator():
    """``x * cos + rotate_half(x) * sin`` (rotate_half: the halves swapped, the first negated; reads
    outside x are 0) with LLaMA's tables is com.microsoft RotaryEmbedding, equal in ONNX Runtime."""
    prog = as_program(
        """Y = L[b:2, n:3, s:5, d:8] X[b, n, s, d] * C[s, d] + (neg(X[b, n, s, d + 4]) + X[b, n, s, d - 4]) * S[s, d]
        return Y
        where X: [2, 3, 5, 8], C: [5, 8], S: [5, 8]"""
    )
    inst, ops = run_onnx(prog, constants=_rope_tables(5, 8))
    assert ops == ["RotaryEmbedding"] and inst.nodes[0].domain == CONTRIB_DOMAIN
    # Tables whose halves differ are not RotaryEmbedding's: element-wise operators, still equal.
    _, ops = run_onnx(prog, constants=["C", "S"])
    assert "RotaryEmbedding" not in ops


def test_intermediate_binding_gets_a_prefixed_name():
    prog = as_program(
        """T = L[i:3, j:4] X[i, j] * 2.0
        Z = L[i:3, j:4] relu(T[i, j])
        return Z
        where X: [3, 4]"""
    )
    inst, ops = run_onnx(prog)
    assert ops == ["Mul", "Relu"]
    assert inst.nodes[0].output[0] == "p/T" and list(inst.nodes[1].input) == ["p/T"]


def test_constant_intermediate_binding_needs_no_identity():
    prog = as_program(
        """S = L[j:4] W[j] * 2.0
        Y = L[i:3, j:4] X[i, j] + S[j]
        return Y
        where X: [3, 4], W: [4]"""
    )
    inst, ops = run_onnx(prog, ("W",))
    assert ops == ["Add"] and [c.how for c in inst.choices] == ["constant", "Add"]


def test_scope_bound_to_two_outputs():
    x = einopt.tensor("X", (3, 4))
    i, j = einopt.iters("i:3 j:4")
    s = einopt.L(i, j)(einopt.relu(x[i, j]))
    prog = ir.Program((x,), (("A", s), ("B", s)), ("A", "B"))
    inst, ops = run_onnx(prog)
    assert ops == ["Relu", "Identity"]


def test_identity_output():
    inst, ops = run_onnx("L[i:3, j:4] X[i, j] where X:[3,4]")
    assert ops == ["Identity"]


def test_nodes_are_interned():
    prog = as_program(
        """P = L[i:4, j:3] X[j, i] + 1.0
        Q = L[i:4, j:3] X[j, i] * 2.0
        return P, Q
        where X: [3, 4]"""
    )
    _, ops = run_onnx(prog)
    assert sorted(ops) == ["Add", "Mul", "Transpose"]


def test_inline_scope_with_offset_range_is_read_at_its_origin():
    # T stores value t = -1 at position 0: the conv reads T[h + r - 1] at position h + r (no pad).
    prog = as_program("L[h:4] Sum[r:3] {L[t=-1:5] X[t] * 2.0}[h + r - 1] * W[r] where X:[5], W:[3]")
    inst, ops = run_onnx(prog, ("W",))
    assert ops == ["Pad", "Mul", "Reshape", "Conv", "Reshape"]
    conv = next(n for n in inst.nodes if n.op_type == "Conv")
    assert next(a.ints for a in conv.attribute if a.name == "pads") == [0, 0]
    assert [c.binding for c in inst.choices] == ["out/1", "out"]


def test_inline_conv_feeding_an_activation_is_materialised_first():
    prog = as_program(
        "L[n:1, f:4, h:5] relu({L[n2:1, f2:4, h2:5] Sum[c:3, r:3] X[n2, c, h2+r-1]*W[f2,c,r]}[n, f, h])"
        " where X:[1,3,5], W:[4,3,3]"
    )
    inst, ops = run_onnx(prog, ("W",))
    assert ops == ["Conv", "Relu"]
    assert [(c.binding, c.how) for c in inst.choices] == [("out/1", "Conv"), ("out", "Relu")]


def test_bound_product_is_not_fused_into_gemm():
    prog = as_program(
        """S = L[m:4, n:5] Sum[k:3] A[m, k] * B[k, n]
        Y = L[m:4, n:5] S[m, n] + C[n]
        return S, Y
        where A: [4, 3], B: [3, 5], C: [5]"""
    )
    inst, ops = run_onnx(prog, ("B", "C"))
    assert ops == ["MatMul", "Add"]
    gemm = dict(next(c for c in inst.choices if c.binding == "Y").failures)["Gemm"]
    assert "program binding" in gemm


def test_choices_record_failures():
    inst, _ = run_onnx("L[i:4, j:3] relu(X[i, j]) where X:[4,3]")
    (choice,) = inst.choices
    assert choice.how == "Relu"
    reasons = dict(choice.failures)
    # Every matcher before the chosen one, in table order, with its reason.
    assert list(reasons) == list(MATCHERS)[: list(MATCHERS).index("Elementwise")]
    assert "single access" in reasons["Layout"]


# --------------------------------------------------------------------------
# Preferred operators: the original operator where it is as cheap
# --------------------------------------------------------------------------

PREFERRED_CASES = [
    # (id, text, constants, preferred op, ops without the preference, ops with it)
    (
        "conv_1x1_batch1_stays_a_conv",  # MobileNetV2/FSRCNN: not Reshape + Gemm + Reshape
        "L[n:1, f:4, o0:5, o1:5] {L[n2:1, f2:4, h:5, w:5] Sum[c:3, r0:1, r1:1]"
        " X[n2, c, h+r0, w+r1]*W[f2,c,r0,r1]}[n, f, o0, o1] + B[f] where X:[1,3,5,5], W:[4,3,1,1], B:[4]",
        ("W", "B"),
        "Conv",
        ["Reshape", "Gemm", "Reshape"],
        ["Conv"],
    ),
    (
        "gemm_without_bias_stays_a_gemm",  # not the MatMul of the same cost
        "L[m:4, n:5] Sum[k:3] A[m,k]*B[k,n] where A:[4,3], B:[3,5]",
        ("B",),
        "Gemm",
        ["MatMul"],
        ["Gemm"],
    ),
    (
        "flatten_stays_a_flatten",
        "L[i0:1, i1:16] X[0, i1, 0, 0] where X:[1,16,1,1]",
        (),
        "Flatten",
        ["Reshape"],
        ["Flatten"],
    ),
    (
        "gemm_refused_where_it_needs_a_transpose",  # batch 2: Gemm transposes X, MatMul does not
        "L[n:2, f:4, p:6] Sum[c:3] X[n,c,p]*W[f,c] where X:[2,3,6], W:[4,3]",
        ("W",),
        "Gemm",
        ["MatMul"],
        ["MatMul"],
    ),
    (
        "unknown_operator_type_changes_nothing",
        "L[m:4, n:5] Sum[k:3] A[m,k]*B[k,n] where A:[4,3], B:[3,5]",
        ("B",),
        "LSTM",
        ["MatMul"],
        ["MatMul"],
    ),
    (
        "refusing_matcher_changes_nothing",
        "L[i:4, j:3] relu(X[i, j]) where X:[4,3]",
        (),
        "Conv",
        ["Relu"],
        ["Relu"],
    ),
]


@pytest.mark.parametrize(
    ("text", "constants", "op", "plain", "preferred"),
    [c[1:] for c in PREFERRED_CASES],
    ids=[c[0] for c in PREFERRED_CASES],
)
def test_preferred_operator(text, constants, op, plain, preferred):
    assert run_onnx(text, constants)[1] == plain
    inst, ops = run_onnx(text, constants, preferred={"out": op})
    assert ops == preferred
    assert inst.choices[-1].how in ops


def test_preferred_gemm_reuses_the_weight_with_trans_b():
    inst, _ = run_onnx(
        "L[m:4, n:5] Sum[k:3] A[m,k]*B[n,k] where A:[4,3], B:[5,3]", ("B",), preferred={"out": "Gemm"}
    )
    (gemm,) = inst.nodes
    assert gemm.input[1] == "in_B" and not inst.initializers
    assert {a.name: a.i for a in gemm.attribute if a.name in ("transA", "transB")} == {
        "transA": 0,
        "transB": 1,
    }


def test_preferred_flatten_axis():
    inst, _ = run_onnx("L[i0:2, i1:12] X[i0, i1 // 4, i1 % 4] where X:[2,3,4]", preferred={"out": "Flatten"})
    (node,) = inst.nodes
    assert node.op_type == "Flatten" and node.attribute[0].i == 1


def test_preference_is_per_binding():
    prog = as_program(
        """Y = L[n:1, f:4, h:5, w:5] Sum[c:3, r0:1, r1:1] X[n, c, h+r0, w+r1]*W[f,c,r0,r1]
        Z = L[m:4, n:5] Sum[k:3] A[m,k]*B[n,k]
        return Y, Z
        where X:[1,3,5,5], W:[4,3,1,1], A:[4,3], B:[5,3]"""
    )
    _, ops = run_onnx(prog, ("W", "B"), preferred={"Y": "Conv", "Z": "Gemm"})
    assert ops == ["Conv", "Gemm"]


# --------------------------------------------------------------------------
# eOperators and errors
# --------------------------------------------------------------------------


def test_unmatched_scope_becomes_an_eoperator():
    pytest.importorskip("einopt.instantiate.eop")
    # the offset reduction of the paper: no predefined operator sums shifted copies
    text = "L[h:5, f:3] Sum[r:3] T[r, f, h + r - 1] where T: [3, 3, 5]"
    inst, ops = run_onnx(text)
    (node,) = inst.nodes
    assert node.domain == EOP_DOMAIN and ops == [inst.functions[0].name]
    assert inst.choices[0].how.startswith("eop:") and inst.functions[0].domain == EOP_DOMAIN


def test_eoperator_names_avoid_taken_functions():
    pytest.importorskip("einopt.instantiate.eop")
    prog = as_program("L[h:5, f:3] Sum[r:3] T[r, f, h + r - 1] where T: [3, 3, 5]")
    names = {"T": "t", "out": "y"}
    first = instantiate(prog, onnx_names=names, constants={}, opset=OPSET, prefix="p_")
    taken = {first.functions[0].name}
    second = instantiate(
        prog, onnx_names=names, constants={}, opset=OPSET, prefix="p_", taken_function_names=taken
    )
    assert second.functions[0].name not in taken


def test_errors():
    prog = as_program("L[i:3] X[i] * 2.0 where X:[3]")
    with pytest.raises(InstantiationError, match="opset 6"):
        instantiate(prog, onnx_names={"X": "x", "out": "y"}, constants={}, opset=6, prefix="p")
    with pytest.raises(InstantiationError, match="output"):
        instantiate(prog, onnx_names={"X": "x"}, constants={}, opset=OPSET, prefix="p")
    with pytest.raises(InstantiationError, match="X has no ONNX name"):
        instantiate(prog, onnx_names={"out": "y"}, constants={}, opset=OPSET, prefix="p")

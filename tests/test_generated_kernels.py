"""``--kernels tvm``: eOperators as TVM kernels that ONNX Runtime runs through einopt's custom-op library.

Every generated kernel is compared with the float64 reference interpreter, run
inside ONNX Runtime on ORT's own buffers (``einopt.runtime.modelio.session``
registers the library for a model that needs it). A model written with
generated kernels also runs in a fresh process, and a plain ONNX Runtime
session without the library refuses it with ONNX Runtime's own error.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einopt import L, Sum, exp, iters, program, relu, sigmoid, tanh, tensor
from einopt.backends.tvm import TVM, kernels, ortkernel
from einopt.backends.tvm.kernelfusion import PHASE, fuse_for_kernels
from einopt.backends.tvm.kernelgroups import kernel_groups
from einopt.backends.tvm.ortkernel import (
    KernelUnsupported,
    kernel_flops,
    ort_kernel,
    read_description,
    stand_in,
)
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.instantiate.program import program_model
from einopt.opsets import KERNEL_DOMAIN
from einopt.runtime import modelio

from kernel_support import exported_alignment
from strategies import random_inputs, scopes

needs_cc = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler on this machine"
)


def _conv_program() -> ir.Program:
    """A matmul-shaped binding T read by an OffsetReduce Y (no ONNX operator computes Y)."""
    h, w, f, r, s, c = iters("h:6 w:7 f:4 r:3 s:3 c:3")
    t1, t2 = iters("t1:6 t2:7")
    A, K = tensor("A", (6, 7, 3)), tensor("K", (3, 3, 4, 3))
    T = L(r, s, f, t1, t2)(Sum(c)(A[t1, t2, c] * K[r, s, f, c]))
    Y = L(h, w, f)(Sum(r, s)(T[r, s, f, h + r - 1, w + s - 1]))
    return program({"Y": Y}, {"T": T})


def _shifted_program() -> ir.Program:
    """An inline scope over ``t = -1 : 7`` (origin -1) read by a kernel at ``h + r - 1``."""
    h, f, r, c = iters("h:6 f:4 r:3 c:5")
    (t,) = iters("t=-1:7")
    A, K = tensor("A", (6, 5)), tensor("K", (3, 4, 5))
    inner = L(r, f, t)(Sum(c)(A[t, c] * K[r, f, c]))
    return program({"Y": L(h, f)(Sum(r)(relu(inner[r, f, h + r - 1])))})


def _run_both(prog: ir.Program, seed: int = 0) -> tuple[onnx.ModelProto, dict, dict]:
    """The program written with generated kernels, its ONNX Runtime outputs and the interpreter's."""
    model, inst = program_model(prog, backend=TVM)
    inputs = random_inputs(prog, np.random.default_rng(seed))
    feeds = {k: v.astype(np.float32) for k, v in inputs.items()}
    got = modelio.run(model, feeds)
    want = evaluate(prog, inputs)
    return model, got, want


def _close(got: np.ndarray, want: np.ndarray) -> None:
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def _kernel_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == kernels.DOMAIN]


def test_a_stand_in_reads_its_sources_as_tensors_at_their_origins():
    prog = _shifted_program()
    scope = prog.scope("Y")
    s = stand_in(scope)
    assert [type(x).__name__ for x in s.sources] == ["Scope"]
    assert s.sources[0].origin == (0, 0, -1)
    inputs = random_inputs(prog, np.random.default_rng(0))
    values = {f"x{i:03d}": evaluate(src, inputs) for i, src in enumerate(s.sources)}
    np.testing.assert_allclose(evaluate(s.scope, values), evaluate(scope, inputs), rtol=1e-12)
    assert s.symbol.startswith("einopt_") and s.symbol.isidentifier()


def test_a_scope_reading_a_non_float_tensor_is_no_kernel():
    (i,) = iters("i:4")
    x = tensor("X", (4,), "int64")
    with pytest.raises(KernelUnsupported, match="int64"):
        stand_in(L(i)(x[i] * 2.0))


def test_kernel_flops_count_the_body_and_the_reduction():
    h, w, f, r, s, c = iters("h:6 w:7 f:4 r:3 s:3 c:3")
    Y = _conv_program().scope("Y")
    assert kernel_flops(Y) == 6 * 7 * 4 * 9 * 1  # a sum of reads: one add per point
    A, K = tensor("A", (6, 7, 3)), tensor("K", (3, 3, 4, 3))
    conv = L(h, w, f)(Sum(r, s, c)(A[h + r - 1, w + s - 1, c] * K[r, s, f, c]))
    assert kernel_flops(conv) == 6 * 7 * 4 * 27 * 2


@pytest.mark.tvm
@needs_cc
@pytest.mark.parametrize("make", [_conv_program, _shifted_program])
def test_generated_kernels_equal_the_interpreter_in_onnx_runtime(make):
    model, got, want = _run_both(make())
    nodes = _kernel_nodes(model)
    assert nodes, "the eOperator was not written as a generated kernel"
    assert not model.functions  # no standard-op function beside it
    assert {o.domain for o in model.opset_import} >= {kernels.DOMAIN}
    for name in want:
        _close(got[name], want[name])


@pytest.mark.tvm
@needs_cc
def test_a_model_carries_its_kernels_description_never_its_code():
    prog = _conv_program()
    a = ort_kernel(prog.scope("Y"))
    assert ort_kernel(prog.scope("Y")).description is a.description  # described and compiled once
    assert ortkernel.library(a.description) is ortkernel.library(a.description)
    model, _ = program_model(prog, backend=TVM)
    assert not [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.UINT8]
    (node,) = _kernel_nodes(model)
    attrs = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    d = read_description(attrs["kernel"].decode(), attrs["kernel_sha256"].decode())
    assert d == a.description and attrs["symbol"].decode() == d.symbol
    assert d.program == stand_in(prog.scope("Y")).program and d.inputs == ((3, 3, 4, 6, 7),)


@pytest.mark.tvm
@needs_cc
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_a_generated_kernel_runs_on_any_float_aligned_buffer_without_a_copy(offset, tmp_path):
    # numpy starts a large array 16 bytes past a 64-byte boundary: the kernel reads a graph input
    # where it is, because its code assumes only 4-byte alignment (and its library says so)
    i, j = iters("i:64 j:40")
    x, b = tensor("x", (64, 40)), tensor("b", (40,))
    prog = program({"Y": L(i, j)(tanh(x[i, j] * 0.5 + b[j]))})
    model, _ = program_model(prog, backend=TVM)
    (node,) = _kernel_nodes(model)
    attrs = {x.name: onnx.helper.get_attribute_value(x).decode() for x in node.attribute if x.s}
    library = ortkernel.library(read_description(attrs["kernel"], attrs["kernel_sha256"]))
    assert exported_alignment(library, tmp_path) == 4
    inputs = random_inputs(prog, np.random.default_rng(offset))
    raw = np.empty(64 * 40 + 16 + offset, np.float32)
    start = (-raw.ctypes.data % 64) // 4 + offset  # ``offset`` floats past a 64-byte boundary
    feeds = {"x": raw[start : start + 64 * 40].reshape(64, 40), "b": inputs["b"].astype(np.float32)}
    feeds["x"][...] = inputs["x"]
    assert feeds["x"].ctypes.data % 64 == 4 * offset
    _close(modelio.run(model, feeds)["Y"], evaluate(prog, inputs)["Y"])


def test_element_aligned_declares_every_buffer_aligned_to_its_element_only():
    tvm = pytest.importorskip("tvm")
    from tvm import te

    from einopt.backends.tvm.ortkernel import element_aligned

    a = te.placeholder((8, 16), "float32", name="A")
    k = te.placeholder((16,), "int64", name="K")
    c = te.compute((8, 16), lambda i, j: a[i, j] + k[j].astype("float32"), name="C")
    func = te.create_prim_func([a, k, c])
    assert [p.ty.data_alignment for p in func.params] == [64, 64, 64]
    out, alignment = element_aligned(func)
    assert [p.ty.data_alignment for p in out.params] == [4, 8, 4] and alignment == 4
    llvm = tvm.tirx.build(tvm.IRModule({"f": out.with_attr("global_symbol", "f")}), target="llvm")
    assert "i64 64)" not in llvm.inspect_source("ll")  # no 64-byte alignment assumed anywhere


@pytest.mark.tvm
@needs_cc
def test_a_light_instantiation_compiles_nothing_and_carries_the_flops(monkeypatch):
    monkeypatch.setattr(ortkernel, "_CACHE", {})
    prog = _conv_program()
    model, inst = program_model(prog, backend=TVM, light=True)
    (node,) = _kernel_nodes(model)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["flops"] == kernel_flops(prog.scope("Y"))
    assert attrs["output_shapes"] == [6, 7, 4]
    assert attrs["kernel_sha256"].decode() == ort_kernel(prog.scope("Y"), build=False).description.sha256
    assert not ortkernel._CACHE  # nothing compiled


@pytest.mark.tvm
@needs_cc
def test_the_cost_stage_times_a_generated_kernel_compiled_only_once_it_is_timed(tmp_path, monkeypatch):
    """A light instantiation's kernel is costed by timing its code, compiled from the node's
    description, in a session of its own (which computes what the interpreter does), under a
    signature that names the code generator's build; without a build named, it is estimated."""
    from einopt.instantiate.program import weight_names
    from einopt.runtime.cache import MeasurementCache
    from einopt.runtime.opcost import OpCosts, _single, node_costs

    monkeypatch.setattr(ortkernel, "_CACHE", {})
    monkeypatch.setattr(kernels, "_PREPARED", set())  # so the session asks for the library again
    prog = _conv_program()
    model, inst = program_model(prog, backend=TVM, light=True)
    weights = weight_names({}, inst)
    s = stand_in(prog.scope("Y"))
    nodes = node_costs(model, weights, ortkernel.build_id())
    (kernel,) = [n for n in nodes if n.cost.op == kernels.OP_TYPE]
    assert kernel.cost.kind == "timed" and not ortkernel._CACHE  # costed, not compiled yet
    assert [n.cost.kind for n in node_costs(model, weights) if n.cost.op == kernels.OP_TYPE] == ["analytic"]
    other = node_costs(model, weights, "another build")
    assert kernel.cost.key not in {n.cost.key for n in other}

    single, feeds = _single(kernel, np.random.default_rng(0))
    (source,) = feeds.values()  # the MatMul's output, read through the Reshape to the scope's shape
    want = evaluate(s.scope, {"x000": source.astype(np.float64).reshape(s.sources[0].shape)})
    _close(modelio.run(single, feeds)[single.graph.output[0].name], want)

    store = MeasurementCache(tmp_path / "m.sqlite")
    costs = OpCosts(store)
    costs.measure(nodes)
    p = costs.prediction(nodes)
    assert ortkernel._CACHE and costs.measured >= 1
    timed = [(n, sec) for n, sec in p.nodes if n.op == kernels.OP_TYPE]
    assert [n.kind for n, _ in timed] == ["timed"] and timed[0][1] > 0
    store.close()


@pytest.mark.tvm
@needs_cc
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scopes(max_depth=2))
def test_random_scopes_as_generated_kernels_equal_the_interpreter(scope):
    prog = program({"Y": scope})
    try:
        model, got, want = _run_both(prog)
    except KernelUnsupported:
        pytest.skip("not a kernel")
    _close(got["Y"], want["Y"])


@st.composite
def _wide_reductions(draw: st.DrawFn) -> ir.Program:
    """Reductions as the CPU schedule's paths see them: lanes of 1-40 (whole vector chunks of 8 or
    16, a scalar tail, guards on the lanes or on an outer loop), 1-12 reduction steps, 1-3 outer
    loops, and a weight read per lane (a matrix-vector product) or not (an OffsetReduce)."""
    outer = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    lanes, steps = draw(st.integers(1, 40)), draw(st.integers(1, 12))
    lane_shift, outer_shift = draw(st.sampled_from([0, 0, 1, 3])), draw(st.integers(0, 3))
    its = iters(" ".join(f"o{i}:{e}" for i, e in enumerate(outer)) + f" x:{lanes} r:{steps}")
    *outs, x, r = its
    T = tensor("T", (steps, *outer, lanes))
    # Reads leave T's box by up to the shifts (zero there): guards on the lanes and on o0.
    row = (outs[0] + r - outer_shift, *outs[1:]) if draw(st.booleans()) else tuple(outs)
    read = T[(r, *row, x + (r if lane_shift else 0) - lane_shift)]
    if draw(st.booleans()):
        read = read * tensor("W", (steps, lanes))[r, x]
    return program({"Y": L(*outs, x)(Sum(r)(read))})


@pytest.mark.tvm
@needs_cc
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=_wide_reductions(), min_parallel=st.sampled_from([1, None]))
def test_random_wide_reductions_as_generated_kernels_equal_the_interpreter(
    prog, min_parallel, tmp_path_factory
):
    """The vectorised, partitioned, tiled and parallel schedules (``scopes()`` draws extents of at
    most 5, below one vector chunk), in ONNX Runtime; with ``min_parallel=1`` every outer loop runs in
    parallel. Compiled into a folder of its own: these schedules are not the default ones."""
    from einopt.codegen import schedule

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ortkernel, "_CACHE", {})
        mp.setenv("EINOPT_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        if min_parallel is not None:
            mp.setattr(schedule, "MIN_PARALLEL_WORK", min_parallel)
        for seed in range(2):
            _, got, want = _run_both(prog, seed)
            _close(got["Y"], want["Y"])


@pytest.mark.tvm
@needs_cc
def test_a_model_with_generated_kernels_runs_in_a_fresh_process_and_fails_clearly_without_the_library(
    tmp_path,
):
    prog = _conv_program()
    model, _ = program_model(prog, backend=TVM)
    inputs = random_inputs(prog, np.random.default_rng(3))
    path = tmp_path / "kernels.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "io.npz", **{k: v.astype(np.float32) for k, v in inputs.items()})
    np.save(tmp_path / "want.npy", evaluate(prog, inputs)["Y"])
    script = textwrap.dedent(
        f"""
        import numpy as np, onnxruntime
        import einopt.runtime
        feeds = dict(np.load({str(tmp_path / "io.npz")!r}))
        try:
            onnxruntime.InferenceSession({str(path)!r}, providers=["CPUExecutionProvider"])
        except Exception as e:
            print("PLAIN:", e)
        (y,) = einopt.runtime.session({str(path)!r}).run(["Y"], feeds)
        want = np.load({str(tmp_path / "want.npy")!r})
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
        print("OK")
        """
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout
    plain = next(line for line in done.stdout.splitlines() if line.startswith("PLAIN:"))
    assert "TvmKernel" in plain and kernels.DOMAIN in plain


def _lstm_tail() -> ir.Program:
    """An LSTM cell's element-wise tail: gates from a MatMul's output ``G`` at offsets, two outputs."""
    m, n, k = iters("m:2 n:8 k:6")
    X, W, C = tensor("X", (2, 6)), tensor("W", (32, 6)), tensor("C", (2, 8))
    (wide,) = iters("n:32")
    G = L(m, wide)(Sum(k)(X[m, k] * W[wide, k]))
    gate = {g: L(m, n)(sigmoid(G[m, n + 8 * i])) for i, g in enumerate("ifo")}
    cand = L(m, n)(tanh(G[m, n + 24]))
    c2 = L(m, n)(gate["f"][m, n] * C[m, n] + gate["i"][m, n] * cand[m, n])
    h2 = L(m, n)(gate["o"][m, n] * tanh(c2[m, n]))
    return program({"H": h2, "C2": c2}, {"G": G, **{f"g{g}": s for g, s in gate.items()}, "cand": cand})


def test_kernel_fusion_leaves_the_matmul_and_one_scope_per_output():
    prog = _lstm_tail()
    fused, steps = fuse_for_kernels(prog)
    assert steps and all(s.rule == "fuse_expressions" and s.phase == PHASE for s in steps)
    assert [name for name, _ in fused.bindings] == ["G", "C2", "H"]
    assert fused.scope("G").summation  # the MatMul is no element-wise work: it stays
    inputs = random_inputs(prog, np.random.default_rng(0))
    want, got = evaluate(prog, inputs), evaluate(fused, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12)
    assert fuse_for_kernels(fused)[1] == ()  # a fixed point


def test_kernel_fusion_never_inlines_a_reduction_or_an_output():
    prog = _conv_program()
    assert fuse_for_kernels(prog)[1] == ()  # Y reduces: T is not inlined into it
    (i,) = iters("i:4")
    X = tensor("X", (4,))
    a = L(i)(relu(X[i]))
    b = L(i)(a[i] * 2.0)
    assert fuse_for_kernels(program({"A": a, "B": b}))[1] == ()  # A is an output


def test_kernel_fusion_never_computes_a_producer_twice():
    """A producer that a reduction nested in its one reader also reads stays bound (the reduction
    needs it in memory): inlining it into the reader's element-wise part would compute it a second
    time, in the kernel, beside the producer's operator, which rounds differently (a
    LayerNormalization of a one-element row after a Sigmoid read 8e-4 for -0 after a Sqrt)."""
    i, k = iters("i:4 k:4")
    X = tensor("X", (4,))
    s = L(i)(exp(X[i]))
    total = L(i)(Sum(k)(s[k]))
    y = L(i)(s[i] - total[i] * 0.25)
    assert fuse_for_kernels(program({"Y": y}, intermediates={"S": s}))[1] == ()


@pytest.mark.tvm
@needs_cc
def test_an_elementwise_chain_is_one_generated_kernel_with_kernels_tvm():
    prog, _ = fuse_for_kernels(_lstm_tail())
    model, got, want = _run_both(prog)
    kinds = [n.op_type for n in model.graph.node]
    # C2 is an output that H reads: one kernel writes both (einopt.backends.tvm.kernelgroups).
    assert kinds.count(kernels.OP_TYPE) == 1 and "Sigmoid" not in kinds and "Split" not in kinds
    (node,) = _kernel_nodes(model)
    assert len(node.output) == 2
    for name in want:
        _close(got[name], want[name])
    onnx_model, _ = program_model(prog)  # the portable form writes the chain as standard nodes
    assert "Sigmoid" in {n.op_type for n in onnx_model.graph.node}


def test_partition_with_fused_activations_keeps_matmuls_apart_from_the_elementwise_tail():
    from onnx import helper

    from einopt.frontend.partition import group_nodes

    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["g"]),
        helper.make_node("Sigmoid", ["g"], ["s"]),
        helper.make_node("Tanh", ["g"], ["t"]),
        helper.make_node("Mul", ["s", "t"], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    kinds = ["linear", "activation", "activation", "linear", "activation"]
    plain = group_nodes(nodes, kinds, {"w"})
    assert [g.nodes for g in plain] == [(0,), (1,), (2,), (3,), (4,)]
    fused = group_nodes(nodes, kinds, {"w"}, fuse_activations=True)
    assert [g.nodes for g in fused] == [(0,), (1, 2, 3, 4)]
    assert [g.kind for g in fused] == ["linear", "linear"]


def _optimize_with_kernels(src, out) -> None:
    """``einopt optimize SRC -o OUT --kernels tvm``, untimed and without a search; it must succeed."""
    from click.testing import CliRunner

    from einopt.cli import main

    args = [
        "optimize",
        src,
        "-o",
        out,
        "--kernels",
        "tvm",
        "--max-depth",
        0,
        "--accept",
        "verified",
        "--no-cache",
    ]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output


def _tail_model() -> onnx.ModelProto:
    """``y = sigmoid(a) * c + tanh(b)``: four element-wise nodes, two of them activations."""
    from onnx import TensorProto, helper

    v = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 64])  # noqa: E731
    nodes = [
        helper.make_node("Sigmoid", ["a"], ["s"]),
        helper.make_node("Mul", ["s", "c"], ["m"]),
        helper.make_node("Tanh", ["b"], ["t"]),
        helper.make_node("Add", ["m", "t"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "tail", [v("a"), v("b"), v("c")], [v("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.tvm
@needs_cc
def test_a_kernel_reads_through_the_reshape_a_match_ends_with():
    """A MatMul whose scope has a unit axis in the middle is matched as MatMul + Reshape; the kernel
    reading it takes the MatMul's output in the MatMul's shape (the same bytes), and the Reshape,
    read by nothing else, is gone."""
    i, u, j, k = iters("i:4 u:1 j:6 k:8")
    A, B = tensor("A", (4, 8)), tensor("B", (8, 6))
    m = L(i, u, j)(Sum(k)(A[i, k] * B[k, j]))
    y = L(i, u, j)(tanh(m[i, u, j]) * m[i, u, j] + 1.0)
    prog = program({"Y": y}, intermediates={"M": m})
    model, got, want = _run_both(prog)
    kinds = [n.op_type for n in model.graph.node]
    assert kinds == ["MatMul", kernels.OP_TYPE], kinds
    (node,) = _kernel_nodes(model)
    assert node.input[0] == model.graph.node[0].output[0]
    _close(got["Y"], want["Y"])
    onnx_model, _ = program_model(prog)  # the portable form keeps the Reshape
    assert "Reshape" in {n.op_type for n in onnx_model.graph.node}


def _offset_reduce_with_epilogue() -> ir.Program:
    """A transposed convolution's overlapping taps summed (an OffsetReduce: no predefined operator),
    then its bias and ReLU."""
    c, h, w, r, s = iters("c:16 h:3 w:3 r:2 s:2")
    X, B = tensor("X", (2, 2, 16, 3, 3)), tensor("B", (16,))
    taps = L(c, h, w)(Sum(r, s)(X[r, s, c, h - r + 1, w - s + 1]))
    return program({"Y": L(c, h, w)(relu(taps[c, h, w] + B[c]))}, intermediates={"T": taps})


def test_a_reduction_no_operator_computes_joins_the_kernel_of_its_elementwise_reader():
    assert kernel_groups(_offset_reduce_with_epilogue(), reductions={"T"}) == [("T", "Y")]
    assert kernel_groups(_offset_reduce_with_epilogue()) == []  # a reduction an operator computes stays
    prog = _lstm_tail()  # its MatMul is ORT's: never a member
    assert all("G" not in g for g in kernel_groups(prog, reductions=()))


@pytest.mark.tvm
@needs_cc
@pytest.mark.parametrize("nested", [False, True], ids=["bound", "nested"])
def test_an_offset_reduce_with_its_bias_and_activation_is_one_generated_kernel(nested):
    prog = _offset_reduce_with_epilogue()
    if nested:  # the sums as a scope nested in the output's (how the search leaves them)
        prog = program({"Y": prog.scope("Y")})
        assert [n for n, _ in prog.bindings] == ["Y"]
    model, got, want = _run_both(prog)
    assert [n.op_type for n in model.graph.node] == [kernels.OP_TYPE]
    (node,) = _kernel_nodes(model)
    assert list(node.output) == ["Y"]  # the sums stay inside the kernel
    _close(got["Y"], want["Y"])


@pytest.mark.tvm
@needs_cc
def test_optimize_kernels_tvm_writes_one_kernel_that_runs_with_the_library_only(tmp_path):
    import onnxruntime

    import einopt.runtime

    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_tail_model(), src)
    _optimize_with_kernels(src, out)
    model = onnx.load(out)
    assert [n.op_type for n in model.graph.node] == [kernels.OP_TYPE]
    feeds = {k: np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32) for k in "abc"}
    want = 1 / (1 + np.exp(-feeds["a"])) * feeds["c"] + np.tanh(feeds["b"])
    (got,) = einopt.runtime.session(out).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="TvmKernel"):
        onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_optimize_kernels_tvm_without_a_c_compiler_is_one_clear_error(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from einopt.cli import EXIT_CODES, main

    def no_compiler() -> str:
        raise kernels.NativeBuildError("no C compiler was found (test)")

    monkeypatch.setattr(kernels, "compiler", no_compiler)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_tail_model(), src)
    result = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out), "--kernels", "tvm"])
    assert result.exit_code == EXIT_CODES["unavailable"], result.output
    assert "no C compiler" in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.tvm
@needs_cc
def test_the_profile_lists_each_generated_kernel_with_its_bytes_and_flops():
    from einopt.runtime.bench import profile_model

    prog = _conv_program()
    model, _ = program_model(prog, backend=TVM)
    feeds = {k: v.astype(np.float32) for k, v in random_inputs(prog, np.random.default_rng(0)).items()}
    (k,) = profile_model(model, feeds, runs=3)["generated_kernels"]
    (node,) = _kernel_nodes(model)
    assert k["node"] == node.name
    t = prog.scope("T")
    assert k["bytes"] == 4 * (int(np.prod(t.shape)) + 6 * 7 * 4)  # reads T, writes Y
    assert k["flops"] == kernel_flops(prog.scope("Y")) and k["ms"] > 0 and k["gb_s"] > 0


@pytest.mark.tvm
@needs_cc
def test_parts_with_the_same_kernel_share_one_description_in_the_output(tmp_path):
    from onnx import TensorProto, helper

    import einopt.runtime

    v = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 64])  # noqa: E731
    nodes = []
    for k, (a, b, c) in enumerate(("abc", "def")):
        nodes += [
            helper.make_node("Sigmoid", [a], [f"s{k}"]),
            helper.make_node("Mul", [f"s{k}", c], [f"m{k}"]),
            helper.make_node("Tanh", [b], [f"t{k}"]),
            helper.make_node("Add", [f"m{k}", f"t{k}"], [f"y{k}"]),
        ]
    graph = helper.make_graph(nodes, "two", [v(x) for x in "abcdef"], [v("y0"), v("y1")])
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    _optimize_with_kernels(src, out)
    model = onnx.load(out)
    generated = _kernel_nodes(model)
    sha = [next(a.s for a in n.attribute if a.name == "kernel_sha256") for n in generated]
    assert len(generated) == 2 and sha[0] == sha[1]
    assert not any(t.data_type == onnx.TensorProto.UINT8 for t in model.graph.initializer)
    feeds = {k: np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32) for k in "abcdef"}
    y0, y1 = einopt.runtime.session(out).run(["y0", "y1"], feeds)
    np.testing.assert_allclose(
        y1, 1 / (1 + np.exp(-feeds["d"])) * feeds["f"] + np.tanh(feeds["e"]), rtol=1e-5, atol=1e-6
    )


def test_kernel_groups_join_elementwise_bindings_that_read_one_another():
    fused, _ = fuse_for_kernels(_lstm_tail())
    assert kernel_groups(fused) == [("C2", "H")]
    (i,) = iters("i:4")
    (k,) = iters("k:4")
    X, W = tensor("X", (4,)), tensor("W", (4, 4))
    a = L(i)(relu(X[i]) + 1.0)
    s = L(i)(Sum(k)(a[k] * W[k, i]))  # a reduction between a and b
    b = L(i)(a[i] * s[i])
    prog = program({"B": b}, {"A": a, "S": s})
    assert kernel_groups(prog) == []  # S lies between A and B: one kernel for both would read itself
    c = L(i)(W[i, 0] * 2.0)
    d = L(i)(c[i] + W[i, 1])
    assert kernel_groups(program({"C": c, "D": d})) == [("C", "D")]
    assert kernel_groups(program({"C": c, "D": d}), constants={"W"}) == []  # folded when written


@pytest.mark.tvm
@needs_cc
def test_a_kernel_with_several_outputs_keeps_a_binding_only_its_members_read_inside():
    (i,) = iters("i:37")
    X, Y = tensor("X", (37,)), tensor("Y", (37,))
    a = L(i)(tanh(X[i]) + Y[i])  # read by B and C only: computed inside, not written
    b = L(i)(a[i] * 2.0)
    c = L(i)(sigmoid(a[i]) - b[i])
    prog = program({"B": b, "C": c}, {"A": a})
    model, got, want = _run_both(prog)
    (node,) = _kernel_nodes(model)
    assert len(node.output) == 2 and len(model.graph.node) == 1
    for name in want:
        _close(got[name], want[name])


@pytest.mark.tvm
@needs_cc
def test_a_member_reading_another_through_a_nested_scope_falls_back_to_one_kernel_each():
    from einopt.backends.tvm.ortkernel import stand_in_group

    (i,) = iters("i:6")
    (k,) = iters("k:6")
    X, W = tensor("X", (6,)), tensor("W", (6, 6))
    a = L(i)(tanh(X[i]) + 1.0)
    nested = L(i)(Sum(k)(a[k] * W[k, i]))  # unbound, inside B, reads A: the kernel would read itself
    b = L(i)(nested[i] * a[i])
    prog = program({"A": a, "B": b})
    with pytest.raises(KernelUnsupported, match="nested"):
        stand_in_group((a, b), (True, True))
    model, got, want = _run_both(prog)
    assert all(len(n.output) == 1 for n in _kernel_nodes(model))
    for name in want:
        _close(got[name], want[name])


def test_with_generated_kernels_a_candidate_is_also_tried_with_its_eoperators_as_standard_ops():
    """Selection with the TVM backend measures "a generated kernel" against "standard ops + glue":
    a candidate with an eOperator is tried in both forms, both verified, the kernel form chosen on a
    tie (untimed: it has fewer nodes)."""
    from einopt.frontend.translate import Part
    from einopt.rules import TraceStep
    from einopt.runtime.verify import Tolerance
    from einopt.search.results import Candidate
    from einopt.stages.context import StageContext
    from einopt.stages.partsearch import PartSearch
    from einopt.stages.select import select

    h, w, f, r, s, c = iters("h:6 w:7 f:4 r:3 s:3 c:3")
    A, K = tensor("A", (6, 7, 3)), tensor("K", (3, 3, 4, 3))
    conv = program({"Y": L(h, w, f)(Sum(r, s, c)(A[h + r - 1, w + s - 1, c] * K[r, s, f, c]))})
    model, _ = program_model(conv)
    part = Part("p", "linear", tuple(range(len(model.graph.node))), conv, {n: n for n in "AKY"})
    step = TraceStep("split_expression", "Y", "the matmul-shaped T and its OffsetReduce")
    search = PartSearch(
        (Candidate(conv, (), (), 1.0), Candidate(_conv_program(), (step,), (), 1.0)), {}, 0.0, False
    )
    feeds = {k: v.astype(np.float32) for k, v in random_inputs(conv, np.random.default_rng(0)).items()}

    ctx = StageContext(model, model, [feeds], tolerance=Tolerance(), backend=TVM)
    chosen = select(ctx, [part], {"p": search})["p"]

    derived = [t for t in chosen.tried if t.candidate.trace]
    assert sorted(t.backend.name for t in derived) == ["onnx", "tvm"]
    assert all(t.verified.ok for t in derived)
    portable, generated = sorted(derived, key=lambda t: t.backend.name)
    assert not any(n.domain == KERNEL_DOMAIN for n in portable.instantiated.nodes)
    assert any(n.domain == KERNEL_DOMAIN for n in generated.instantiated.nodes)
    assert chosen.chosen is generated and portable.as_dict(1.0)["kernels"] == "onnx"


def test_a_reduction_with_a_scalar_tail_under_a_parallel_loop_writes_only_its_own_rows():
    """GCN's 15x1 convolution as an OffsetReduce: 28 lanes are three chunks of 8 and a scalar tail
    of 4, under a parallel loop over 64 rows. Accumulating the chunks in a local buffer there once
    copied the whole [4, 16, 24] buffer out in every task, mostly never computed: garbage in ORT."""
    n, f, o0, o1, r = iters("n:1 f:4 o0:16 o1:28 r:15")
    X = tensor("X", (1, 4, 15, 16, 28))
    prog = program({"Y": L(n, f, o0, o1)(Sum(r)(X[n, f, r, o0 + r - 7, o1]))})
    for seed in range(3):
        _, got, want = _run_both(prog, seed)
        _close(got["Y"], want["Y"])

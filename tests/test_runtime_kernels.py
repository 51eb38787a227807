"""einopt's ONNX Runtime custom-op library: TVM kernels run on ORT's buffers, in a fresh process too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from einopt.runtime import kernels

from kernel_support import exported_alignment

tvm = pytest.importorskip("tvm")
from tvm import s_tir, te  # noqa: E402

pytestmark = pytest.mark.skipif(
    not any(__import__("shutil").which(c) for c in ("cc", "gcc", "clang")),
    reason="no C compiler on this machine",
)


def _axpy(name: str, rows: int, cols: int, parallel: bool) -> object:
    """``C = 2 A + B`` over ``[rows, cols]``, built for this CPU (rows in parallel when asked)."""
    a = te.placeholder((rows, cols), "float32", name="A")
    b = te.placeholder((rows, cols), "float32", name="B")
    c = te.compute((rows, cols), lambda i, j: 2.0 * a[i, j] + b[i, j], name="C")
    func = te.create_prim_func([a, b, c]).with_attr("global_symbol", name)
    sch = s_tir.Schedule(func)
    i, j = sch.get_loops(sch.get_sblock("C"))
    if parallel:
        sch.parallel(i)
    return tvm.tirx.build(
        tvm.IRModule({name: sch.mod["main"].with_attr("global_symbol", name)}), target="llvm"
    )


def _model(
    library: bytes, symbol: str, shape: tuple[int, int], kernel_input_shape=None, declared: bool = False
) -> onnx.ModelProto:
    """One kernel node; ``declared``: it declares the shapes the kernel was compiled for (``shape``)."""
    code = numpy_helper.from_array(np.frombuffer(library, dtype=np.uint8), "einopt_kernels")
    inputs = {"input_ranks": [2, 2], "input_shapes": [*shape, *shape]} if declared else {}
    node = helper.make_node(
        kernels.OP_TYPE,
        ["einopt_kernels", "a", "b"],
        ["c"],
        domain=kernels.DOMAIN,
        symbol=symbol,
        output_ranks=[2],
        output_shapes=list(shape),
        **inputs,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, kernel_input_shape or shape) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, shape)],
        initializer=[code],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(kernels.DOMAIN, 1)]
    )


@pytest.fixture(scope="module")
def library() -> bytes:
    return kernels.link_kernels(
        [_axpy("axpy", 64, 96, parallel=False), _axpy("axpy_par", 256, 96, parallel=True)]
    )


@pytest.mark.parametrize("declared", [False, True])
@pytest.mark.parametrize("symbol, shape", [("axpy", (64, 96)), ("axpy_par", (256, 96))])
def test_a_kernel_runs_on_ort_buffers(library, symbol, shape, declared):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    for threads in (1, 2):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        sess = kernels.session(_model(library, symbol, shape, declared=declared).SerializeToString(), options)
        (c,) = sess.run(None, {"a": a, "b": b})
        np.testing.assert_array_equal(c, 2 * a + b)


@pytest.mark.parametrize("declared", [False, True])
def test_a_misaligned_input_is_read_through_an_aligned_copy(library, declared):
    rng = np.random.default_rng(1)
    raw = rng.standard_normal(64 * 96 + 1).astype(np.float32)
    a = raw[1:].reshape(64, 96)  # 4 bytes past an aligned start
    b = rng.standard_normal((64, 96)).astype(np.float32)
    sess = kernels.session(_model(library, "axpy", (64, 96), declared=declared).SerializeToString())
    (c,) = sess.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(c, 2 * a + b)


def test_a_library_says_what_alignment_its_kernels_assume(library, tmp_path):
    assert exported_alignment(library, tmp_path) == 64  # TVM's
    with pytest.raises(ValueError, match="power of two"):
        kernels.link_kernels([], alignment=12)


@pytest.mark.parametrize("declared", [False, True])
def test_a_failed_kernel_check_is_an_ort_error_with_the_kernels_message(library, declared):
    # the node's inputs are [64, 95]: TVM's argument check refuses them, and ORT raises (a node that
    # declares [64, 96] finds the size wrong and reads the real shape, which TVM refuses)
    model = _model(library, "axpy", (64, 96), kernel_input_shape=(64, 95), declared=declared)
    sess = kernels.session(model.SerializeToString())
    x = np.zeros((64, 95), np.float32)
    with pytest.raises(Exception, match="einopt TvmKernel axpy failed: .*shape"):
        sess.run(None, {"a": x, "b": x})


def test_an_unknown_symbol_fails_when_the_session_is_made(library):
    with pytest.raises(Exception, match="no kernel nope"):
        kernels.session(_model(library, "nope", (64, 96)).SerializeToString())


def test_a_model_opened_without_the_library_fails_with_orts_own_error(library):
    with pytest.raises(Exception, match="ai.einopt"):
        onnxruntime.InferenceSession(_model(library, "axpy", (64, 96)).SerializeToString())


def test_the_library_builds_from_a_clean_cache_and_runs_in_a_fresh_process(library, tmp_path, monkeypatch):
    monkeypatch.setenv("EINOPT_CACHE_DIR", str(tmp_path / "cache"))
    path = kernels.library_path()
    assert path.is_file() and str(path).startswith(str(tmp_path / "cache"))
    assert kernels.library_path() == path  # built once
    model = tmp_path / "m.onnx"
    onnx.save(_model(library, "axpy_par", (256, 96)), model)
    script = textwrap.dedent(
        f"""
        import numpy as np, onnxruntime
        options = onnxruntime.SessionOptions()
        options.register_custom_ops_library({str(path)!r})
        sess = onnxruntime.InferenceSession({str(model)!r}, options)
        a = np.arange(256 * 96, dtype=np.float32).reshape(256, 96)
        (c,) = sess.run(None, {{"a": a, "b": a}})
        assert np.array_equal(c, 3 * a), "wrong values"
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_no_compiler_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(kernels.NativeBuildError, match="need a C compiler"):
        kernels.compiler()

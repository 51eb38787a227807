"""einopt's ONNX Runtime custom-op library: kernels built from their nodes' descriptions run on ORT's
buffers, in a fresh process too; a node is checked against its description before anything runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

from einopt import L, iters, program, tensor
from einopt.backends.tvm import TVM, kernels
from einopt.backends.tvm.build import compiler
from einopt.errors import ModelError
from einopt.instantiate.program import program_model
from einopt.runtime import session

pytest.importorskip("tvm")

pytestmark = pytest.mark.skipif(
    not any(__import__("shutil").which(c) for c in ("cc", "gcc", "clang")),
    reason="no C compiler on this machine",
)


def _axpy(rows: int, cols: int) -> onnx.ModelProto:
    """``C = 2 A + B`` over ``[rows, cols]`` as one generated kernel (256 rows run in parallel)."""
    i, j = iters(f"i:{rows} j:{cols}")
    a, b = tensor("A", (rows, cols)), tensor("B", (rows, cols))
    model, _ = program_model(program({"C": L(i, j)(a[i, j] * 2.0 + b[i, j])}), backend=TVM)
    assert [n.op_type for n in model.graph.node] == [kernels.OP_TYPE]
    return model


def _attribute(model: onnx.ModelProto, name: str):
    (node,) = model.graph.node
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def _set_attribute(model: onnx.ModelProto, name: str, value) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    (node,) = out.graph.node
    (a,) = [a for a in node.attribute if a.name == name]
    node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))
    return out


@pytest.mark.parametrize("shape", [(64, 96), (256, 96)])
def test_a_kernel_runs_on_ort_buffers(shape):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    model = _axpy(*shape).SerializeToString()
    for threads in (1, 2):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        (c,) = session(model, options).run(None, {"A": a, "B": b})
        np.testing.assert_array_equal(c, 2 * a + b)


def test_a_misaligned_input_is_read_where_it_is():
    rng = np.random.default_rng(1)
    raw = rng.standard_normal(64 * 96 + 1).astype(np.float32)
    a = raw[1:].reshape(64, 96)  # 4 bytes past an aligned start
    b = rng.standard_normal((64, 96)).astype(np.float32)
    (c,) = session(_axpy(64, 96).SerializeToString()).run(None, {"A": a, "B": b})
    np.testing.assert_array_equal(c, 2 * a + b)


def test_a_failed_kernel_check_is_an_ort_error_with_the_kernels_message():
    # the graph's inputs are [64, 95]: the node declares [64, 96], finds the size wrong and reads the
    # real shape, which TVM's argument check refuses, and ORT raises
    model = _axpy(64, 96)
    for vi in model.graph.input:
        vi.type.tensor_type.shape.dim[1].dim_value = 95
    sess = session(model.SerializeToString())
    x = np.zeros((64, 95), np.float32)
    with pytest.raises(Exception, match="einopt TvmKernel einopt_[0-9a-f]+ failed: .*shape"):
        sess.run(None, {"A": x, "B": x})


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("symbol", "nope", "attribute symbol disagrees"),
        ("output_shapes", [64, 97], "attribute output_shapes disagrees"),
        ("kernel_sha256", "0" * 64, "does not match its SHA-256"),
    ],
)
def test_a_node_that_disagrees_with_its_description_is_refused_before_anything_runs(name, value, message):
    with pytest.raises(ModelError, match=message):
        session(_set_attribute(_axpy(64, 96), name, value).SerializeToString())


@pytest.mark.parametrize(
    "alter, message",
    [
        (lambda text: "{", "not JSON"),
        (lambda text: text.replace("einopt-kernel/1", "einopt-kernel/0"), "of format 'einopt-kernel/0'"),
        (lambda text: text.replace('"schedule":"cpu"', '"schedule":"gpu"'), "unknown schedule"),
        (lambda text: text.replace('"program":"y0 = ', '"program":"y0 = ]] '), "does not parse"),
        (lambda text: text.replace("x000", "evil"), "inputs are not the float32 tensors"),
    ],
    ids=["json", "format", "schedule", "program", "inputs"],
)
def test_a_description_einopt_would_not_write_is_refused(alter, message):
    import hashlib

    model = _axpy(64, 96)
    text = alter(_attribute(model, "kernel").decode())
    model = _set_attribute(model, "kernel", text)
    model = _set_attribute(model, "kernel_sha256", hashlib.sha256(text.encode()).hexdigest())
    with pytest.raises(ModelError, match=message):
        session(model.SerializeToString())


def test_an_altered_description_is_refused_even_with_a_matching_sha256():
    # the attacker rewrites the program and recomputes the hash: the text is not what einopt writes
    import hashlib

    model = _axpy(64, 96)
    text = _attribute(model, "kernel").decode().replace('"schedule":"cpu"', '"schedule":"cpu" ')
    model = _set_attribute(model, "kernel", text)
    model = _set_attribute(model, "kernel_sha256", hashlib.sha256(text.encode()).hexdigest())
    with pytest.raises(ModelError, match="not the one einopt writes"):
        session(model.SerializeToString())


def test_a_model_opened_without_the_library_fails_with_orts_own_error():
    with pytest.raises(Exception, match="ai.einopt"):
        onnxruntime.InferenceSession(_axpy(64, 96).SerializeToString())


def test_the_library_alone_runs_no_kernel_it_was_not_handed():
    # registering the custom-op library without preparing the model: the node is refused when the
    # session is made (in a fresh process, where nothing was prepared before)
    path = kernels.library_path()
    model = _axpy(48, 32)
    script = textwrap.dedent(
        f"""
        import onnxruntime
        options = onnxruntime.SessionOptions()
        options.register_custom_ops_library({str(path)!r})
        try:
            onnxruntime.InferenceSession({model.SerializeToString()!r}, options)
        except Exception as e:
            print("REFUSED:", e)
        """
    )
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=120)
    assert "REFUSED:" in done.stdout and "is not built in this process" in done.stdout, done.stderr


def test_the_library_builds_from_a_clean_cache_and_runs_in_a_fresh_process(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_axpy(256, 96), model)
    script = textwrap.dedent(
        f"""
        import numpy as np, onnxruntime
        from einopt.backends.tvm import kernels
        options = kernels.prepare({str(model)!r}, onnxruntime.SessionOptions())
        sess = onnxruntime.InferenceSession({str(model)!r}, options)
        a = np.arange(256 * 96, dtype=np.float32).reshape(256, 96)
        (c,) = sess.run(None, {{"A": a, "B": a}})
        assert np.array_equal(c, 3 * a), "wrong values"
        print("ok", kernels.library_path())
        """
    )
    env = {**__import__("os").environ, "EINOPT_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr
    assert done.stdout.split()[1].startswith(str(tmp_path / "cache"))


def test_a_session_works_in_a_process_with_a_global_thread_pool(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_axpy(64, 96), model)
    script = textwrap.dedent(
        f"""
        import numpy as np, onnxruntime
        from onnxruntime.capi import _pybind_state
        import einopt.runtime
        _pybind_state.set_global_thread_pool_sizes(2, 1)
        a = np.ones((64, 96), np.float32)
        (c,) = einopt.runtime.session({str(model)!r}).run(None, {{"A": a, "B": a}})
        assert np.array_equal(c, 3 * a)
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_no_compiler_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(kernels.NativeBuildError, match="need a C compiler"):
        compiler()


def test_link_kernels_refuses_an_alignment_that_is_no_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        kernels.link_kernels([], alignment=12)

"""A model file is data: no entry point of einopt loads or runs native code that came inside it, the
caches serve only what einopt built there, and loaded libraries stay loaded once.

The hostile library carries a constructor that writes a marker file the moment it is loaded: the
marker never appears, whatever the entry point.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import einopt.runtime
from einopt import L, iters, program, tensor
from einopt.backends.tvm import TVM, kernels
from einopt.cli import EXIT_CODES, main
from einopt.errors import UnsupportedModelError
from einopt.instantiate.program import program_model
from einopt.runtime import modelio
from einopt.runtime.cache import CacheTrustError
from einopt.runtime.verify import Tolerance, compare_models

pytest.importorskip("tvm")
CC = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on this machine")

PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("ran", f); fclose(f); }
}
__attribute__((visibility("default"))) void *RegisterCustomOps(void *options, void *api) { return 0; }
__attribute__((visibility("default"))) const char *einopt_ort_library_version(void) { return "planted"; }
__attribute__((visibility("default"))) const char *einopt_tvm_last_error(void) { return "planted"; }
__attribute__((visibility("default"))) void einopt_tvm_set_raised(void) {}
"""


def _planted_library(folder: Path, marker: Path) -> bytes:
    """A shared library whose constructor writes ``marker`` when it is loaded."""
    source, out = folder / "planted.c", folder / "planted.so"
    source.write_text(PLANTED)
    subprocess.run(
        [CC, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(out), str(source)], check=True, timeout=120
    )
    return out.read_bytes()


def _hostile_model(library: bytes) -> onnx.ModelProto:
    """One TvmKernel node whose first input is ``library``, as einopt wrote them before kernels were
    described."""
    code = numpy_helper.from_array(np.frombuffer(library, dtype=np.uint8), "einopt_kernels")
    node = helper.make_node(
        kernels.OP_TYPE,
        ["einopt_kernels", "x"],
        ["y"],
        domain=kernels.DOMAIN,
        symbol="planted",
        output_ranks=[2],
        output_shapes=[4, 4],
    )
    v = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in ("x", "y")]
    graph = helper.make_graph([node], "hostile", v[:1], v[1:], initializer=[code])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(kernels.DOMAIN, 1)]
    )


def _axpy(rows: int = 64, cols: int = 96) -> onnx.ModelProto:
    i, j = iters(f"i:{rows} j:{cols}")
    a, b = tensor("A", (rows, cols)), tensor("B", (rows, cols))
    model, _ = program_model(program({"C": L(i, j)(a[i, j] * 2.0 + b[i, j])}), backend=TVM)
    return model


@pytest.fixture
def hostile(tmp_path) -> tuple[Path, Path]:
    marker = tmp_path / "marker"
    path = tmp_path / "evil.onnx"
    onnx.save(_hostile_model(_planted_library(tmp_path, marker)), path)
    return path, marker


def _run_python(script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_the_planted_library_would_run_if_loaded(tmp_path):
    # the fixture is real: loading its library does write the marker
    import ctypes

    marker = tmp_path / "marker"
    (tmp_path / "lib.so").write_bytes(_planted_library(tmp_path, marker))
    ctypes.CDLL(str(tmp_path / "lib.so"))
    assert marker.read_text() == "ran"


@pytest.mark.parametrize(
    "open_it",
    [
        lambda path: einopt.runtime.session(path),
        lambda path: einopt.runtime.session(path.read_bytes()),
        lambda path: kernels.prepare(path),
        lambda path: modelio.session(onnx.load(path)),
        lambda path: modelio.run(onnx.load(path), {"x": np.zeros((4, 4), np.float32)}),
    ],
    ids=["runtime.session", "runtime.session(bytes)", "kernels.prepare", "modelio.session", "modelio.run"],
)
def test_opening_a_model_that_carries_native_code_runs_none_of_it(hostile, open_it):
    path, marker = hostile
    with pytest.raises(UnsupportedModelError, match="never loads native code from a model file"):
        open_it(path)
    assert not marker.exists()


def test_verification_refuses_a_model_that_carries_native_code(hostile):
    path, marker = hostile
    feeds = {"x": np.zeros((4, 4), np.float32)}
    agreement = compare_models([{"y": feeds["x"]}], onnx.load(path), [feeds], Tolerance())
    assert not agreement.ok and "never loads native code" in agreement.message
    assert not marker.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "{evil}", "{evil}", "--min-runs", "3", "--max-runs", "3"],
        ["optimize", "{evil}", "-o", "{out}"],
        ["optimize", "{evil}", "-o", "{out}", "--accept", "verified"],
        ["optimize", "{evil}", "-o", "{out}", "--no-verify"],
        ["optimize", "{evil}", "-o", "{out}", "--no-verify", "--accept", "verified"],
        ["optimize", "{evil}", "-o", "{out}", "--kernels", "tvm"],
    ],
    ids=["bench", "optimize", "accept-verified", "no-verify", "no-verify-accept-verified", "kernels-tvm"],
)
def test_the_cli_refuses_a_model_that_carries_native_code(hostile, tmp_path, args):
    path, marker = hostile
    out = tmp_path / "out.onnx"
    argv = [a.format(evil=path, out=out) for a in args]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == EXIT_CODES["unsupported"], result.output
    assert "never loads native code from a model file" in result.output
    assert "Traceback" not in result.output and not out.exists()
    assert not marker.exists()


def _run_twice(tmp_path: Path, plant, rows: int = 64, cols: int = 96) -> subprocess.CompletedProcess:
    """A model's session run in a fresh process on a fresh cache; then ``plant(cache, first_stdout)``;
    then the same again, whose result is returned (each run checks its values, and prints the kernel
    cache's build folder and the custom-op library's path)."""
    cache, model = tmp_path / "cache", tmp_path / "m.onnx"
    onnx.save(_axpy(rows, cols), model)
    script = f"""
        import logging, sys
        import numpy as np
        import einopt.runtime
        from einopt.backends.tvm import ortkernel
        from einopt.backends.tvm import kernels
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        a = np.ones(({rows}, {cols}), np.float32)
        (c,) = einopt.runtime.session({str(model)!r}).run(None, {{"A": a, "B": a}})
        assert np.array_equal(c, 3 * a), "wrong values"
        print(ortkernel.build_id(), kernels.library_path())
    """
    first = _run_python(script, {"EINOPT_CACHE_DIR": str(cache)})
    assert first.returncode == 0, first.stderr
    build, library = first.stdout.split()
    plant(cache / "kernels" / build, Path(library))
    again = _run_python(script, {"EINOPT_CACHE_DIR": str(cache)})
    assert again.returncode == 0, again.stderr
    return again


def test_a_hostile_library_planted_in_the_kernel_cache_is_refused(tmp_path):
    """A kernel library replaced in the cache (its record left alone) is refused and built again, in a
    fresh process (nothing in memory yet)."""
    marker = tmp_path / "marker"
    planted = []

    def plant(kernel_folder: Path, library: Path) -> None:
        (built,) = kernel_folder.glob("*.so")
        built.write_bytes(_planted_library(tmp_path, marker))
        planted.append(built)

    again = _run_twice(tmp_path, plant)
    assert "refused the cached kernel library" in again.stderr
    assert not marker.exists()
    assert b"planted" not in planted[0].read_bytes()  # built again in its place


def test_a_symbolic_link_in_the_kernel_cache_is_refused(tmp_path):
    marker = tmp_path / "marker"

    def plant(kernel_folder: Path, library: Path) -> None:
        (built,) = kernel_folder.glob("*.so")
        (tmp_path / "planted.so").write_bytes(_planted_library(tmp_path, marker))
        built.unlink()
        built.symlink_to(tmp_path / "planted.so")

    again = _run_twice(tmp_path, plant, 48, 32)
    assert "refused the cached kernel library" in again.stderr and "symbolic link" in again.stderr
    assert not marker.exists()


def test_a_hostile_library_planted_as_the_custom_op_library_is_refused(tmp_path):
    marker = tmp_path / "marker"

    def plant(kernel_folder: Path, library: Path) -> None:
        library.write_bytes(_planted_library(tmp_path, marker))

    again = _run_twice(tmp_path, plant)
    assert "refused einopt's cached ONNX Runtime library" in again.stderr
    assert not marker.exists()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_cache_folder_others_can_write_is_refused(tmp_path, monkeypatch, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("EINOPT_CACHE_DIR", str(shared))
    with pytest.raises(CacheTrustError, match="writable by its group or by others"):
        kernels.library_path()


def test_a_cache_folder_others_can_write_is_one_clear_cli_error(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    model = tmp_path / "m.onnx"
    i, j = iters("i:19 j:23")  # described, not compiled (light): the session compiles it, into the cache
    a, b = tensor("A", (19, 23)), tensor("B", (19, 23))
    onnx.save(
        program_model(program({"C": L(i, j)(a[i, j] * 3.0 + b[i, j])}), backend=TVM, light=True)[0], model
    )
    monkeypatch.setenv("EINOPT_CACHE_DIR", str(shared))
    result = CliRunner().invoke(main, ["bench", str(model), str(model), "--min-runs", "3", "--max-runs", "3"])
    assert result.exit_code == EXIT_CODES["unavailable"], result.output
    assert "writable by its group or by others" in result.output and "Traceback" not in result.output


def test_two_hundred_sessions_map_each_library_once(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_axpy(), model)
    script = f"""
        import gc
        import numpy as np
        import einopt.runtime

        def mapped():
            with open("/proc/self/maps") as f:
                return sum("einopt" in line for line in f)

        a = np.ones((64, 96), np.float32)
        einopt.runtime.session({str(model)!r}).run(None, {{"A": a, "B": a}})
        gc.collect()
        first = mapped()
        for _ in range(200):
            sess = einopt.runtime.session({str(model)!r})
            sess.run(None, {{"A": a, "B": a}})
            del sess
        gc.collect()
        print(first, mapped())
    """
    done = _run_python(script)
    assert done.returncode == 0, done.stderr
    first, after = map(int, done.stdout.split())
    assert first > 0 and after == first


def test_a_model_copied_alone_to_a_fresh_cache_builds_once_and_then_loads(tmp_path):
    """A --kernels tvm model written here, copied with nothing but the file, runs from a fresh cache
    after one local build; a second process builds nothing."""
    model = tmp_path / "copied.onnx"
    onnx.save(_axpy(), model)
    script = f"""
        import logging, sys
        import numpy as np
        import einopt.runtime
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
        a = np.ones((64, 96), np.float32)
        (c,) = einopt.runtime.session({str(model)!r}).run(None, {{"A": a, "B": a}})
        assert np.array_equal(c, 3 * a), "wrong values"
        print("ok")
    """
    env = {"EINOPT_CACHE_DIR": str(tmp_path / "fresh")}
    first = _run_python(script, env)
    assert first.returncode == 0 and first.stdout.strip() == "ok", first.stderr
    assert "building 1 generated kernel(s)" in first.stderr and "compiling kernel" in first.stderr
    (library,) = (tmp_path / "fresh" / "kernels").glob("*/*.so")
    stamp = library.stat().st_mtime_ns
    second = _run_python(script, env)
    assert second.returncode == 0 and second.stdout.strip() == "ok", second.stderr
    assert "building" not in second.stderr and "compiling kernel" not in second.stderr
    assert library.stat().st_mtime_ns == stamp

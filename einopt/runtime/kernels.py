"""Generated kernels inside ONNX Runtime: einopt's custom-op library and the kernel libraries it runs.

Two native pieces, both einopt's own C source (``einopt/runtime/native``), built with the system C
compiler on first use:

- **The custom-op library** (``einopt_ort.c``), registered into an ONNX Runtime session, runs the
  operator ``ai.einopt::TvmKernel``: a TVM-compiled function called on ORT's own buffers (DLPack,
  no copies, no Python). It is built once per source, ONNX Runtime version and CPU into the user
  cache directory (``EINOPT_CACHE_DIR`` overrides it).
- **A kernel library** is one model's compiled kernels (TVM's LLVM object linked with
  ``tvm_shim.c``). It travels inside the model, as the bytes of a uint8 initializer that every
  ``TvmKernel`` node reads as its first input, so a model stays one file; the custom-op library
  loads each distinct one once per process, from memory.

A plain ONNX Runtime session runs such a model after one extra line::

    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(einopt.runtime.kernels.library_path())
    session = onnxruntime.InferenceSession("out.onnx", options)

or ``einopt.runtime.kernels.session("out.onnx")``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from einopt.runtime.cache import cache_dir

__all__ = [
    "DOMAIN",
    "OP_TYPE",
    "NativeBuildError",
    "library_path",
    "link_kernels",
    "register",
    "session",
]

DOMAIN = "ai.einopt"
"""The domain of einopt's generated-kernel nodes (``einopt.runtime.modelio.KERNEL_DOMAIN``)."""
OP_TYPE = "TvmKernel"

NATIVE = Path(__file__).resolve().parent / "native"
LIBRARY_SOURCE = NATIVE / "einopt_ort.c"
SHIM_SOURCE = NATIVE / "tvm_shim.c"

# The buffer alignment (bytes) TVM's generated code assumes unless told otherwise (its kAllocAlignment).
TVM_ALIGNMENT = 64

CFLAGS = ("-O2", "-fPIC", "-shared", "-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra")


class NativeBuildError(RuntimeError):
    """einopt's native code could not be built (no C compiler, or the compiler failed)."""


def compiler() -> str:
    """The C compiler: ``$CC``, else the first of cc, gcc, clang on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise NativeBuildError(
        "einopt's generated kernels need a C compiler to build their ONNX Runtime library, and none was "
        "found (set CC, or install gcc or clang: e.g. `apt install gcc`); --kernels onnx needs none"
    )


def _compile(cmd: Sequence[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeBuildError(f"building {what} failed: {e}") from None
    if done.returncode != 0:
        raise NativeBuildError(f"building {what} failed ({' '.join(cmd)}):\n{done.stderr.strip()}")


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def library_path() -> Path:
    """The custom-op library for this ONNX Runtime and CPU, built into the cache on first use."""
    cc = compiler()
    source = LIBRARY_SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                _ort_version().encode(),
                platform.machine().encode(),
                cc.encode(),
                " ".join(CFLAGS).encode(),
            ]
        )
    ).hexdigest()[:16]
    folder = cache_dir() / "native" / key
    path = folder / "libeinopt_ort.so"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        built = Path(tmp) / path.name
        _compile(
            [
                cc,
                *CFLAGS,
                f'-DEINOPT_SOURCE_HASH="{key}"',
                "-o",
                str(built),
                str(LIBRARY_SOURCE),
                "-ldl",
                "-lpthread",
            ],
            "einopt's ONNX Runtime library",
        )
        os.replace(built, path)  # atomic: another process building the same key reads a whole file
    return path


def register(options: Any = None) -> Any:
    """``options`` (a new ``onnxruntime.SessionOptions`` if None) with einopt's library registered."""
    import onnxruntime

    options = options if options is not None else onnxruntime.SessionOptions()
    options.register_custom_ops_library(str(library_path()))
    return options


def session(
    path: str | Path | bytes, options: Any = None, providers: Sequence[str] = ("CPUExecutionProvider",)
) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``path`` (a file or model bytes) that runs einopt's kernels."""
    import onnxruntime

    model = path if isinstance(path, bytes) else str(path)
    return onnxruntime.InferenceSession(model, register(options), providers=list(providers))


def link_kernels(modules: Sequence[Any], alignment: int = TVM_ALIGNMENT) -> bytes:
    """One kernel library (shared-object bytes) from TVM-built CPU modules (``tvm.tirx.build`` results).

    Each module's object code is written out, linked with the shim into one shared object
    (``-Bsymbolic``: the library's calls stay inside it even where TVM itself is loaded), and read back.
    ``alignment`` is what the modules' code assumes of its buffers, in bytes (TVM's default, unless
    the functions were declared otherwise: see ``einopt.codegen.ortkernel.element_aligned``): the library exports it, and the custom op
    runs a kernel on a less aligned buffer through an aligned copy.
    """
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    cc = compiler()
    with tempfile.TemporaryDirectory(prefix="einopt-link-") as tmp:
        objects = []
        for i, module in enumerate(modules):
            obj = Path(tmp) / f"kernels{i}.o"
            module.write_to_file(str(obj))
            objects.append(str(obj))
        out = Path(tmp) / "kernels.so"
        flags = [*CFLAGS, f"-DEINOPT_BUFFER_ALIGNMENT={alignment}", "-Wl,-Bsymbolic"]
        _compile(
            [cc, *flags, "-o", str(out), *objects, str(SHIM_SOURCE), "-lm"],
            "the kernel library",
        )
        return out.read_bytes()

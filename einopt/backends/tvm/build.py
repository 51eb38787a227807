"""einopt's native code, built with the system C compiler: the C sources (``native/``), the compiler
and its flags, and the link step that makes a kernel library of TVM's object code and einopt's shim.

What is built, and how it is checked and loaded, is :mod:`einopt.backends.tvm.kernels`'s (the custom-op
library) and ``einopt.backends.tvm.ortkernel``'s (kernel libraries); this module only builds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CFLAGS",
    "LIBRARY_SOURCE",
    "SHIM_SOURCE",
    "TVM_ALIGNMENT",
    "NativeBuildError",
    "compiler",
    "link_kernels",
]

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


def run_compiler(cmd: Sequence[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeBuildError(f"building {what} failed: {e}") from None
    if done.returncode != 0:
        raise NativeBuildError(f"building {what} failed ({' '.join(cmd)}):\n{done.stderr.strip()}")


def link_kernels(modules: Sequence[Any], alignment: int = TVM_ALIGNMENT) -> bytes:
    """One kernel library (shared-object bytes) from TVM-built CPU modules (``tvm.tirx.build`` results).

    Each module's object code is written out, linked with the shim into one shared object
    (``-Bsymbolic``: the library's calls stay inside it even where TVM itself is loaded), and read back.
    ``alignment`` is what the modules' code assumes of its buffers, in bytes (TVM's default, unless
    the functions were declared otherwise: see ``einopt.backends.tvm.ortkernel.element_aligned``): the library exports it, and the custom op
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
        run_compiler(
            [cc, *flags, "-o", str(out), *objects, str(SHIM_SOURCE), "-lm"],
            "the kernel library",
        )
        return out.read_bytes()

"""einopt's generated kernels in ONNX Runtime, by their documented name.

The code is the TVM backend's (:mod:`einopt.backends.tvm.kernels`); this module keeps the public
names where the README documents them::

    options = einopt.runtime.kernels.prepare("out.onnx", onnxruntime.SessionOptions())
    session = onnxruntime.InferenceSession("out.onnx", options)
"""

from einopt.backends.tvm.kernels import (
    DOMAIN,
    OP_TYPE,
    NativeBuildError,
    described,
    kernel_nodes,
    library_path,
    link_kernels,
    prepare,
    register,
    session,
)

__all__ = [
    "DOMAIN",
    "OP_TYPE",
    "NativeBuildError",
    "described",
    "kernel_nodes",
    "library_path",
    "link_kernels",
    "prepare",
    "register",
    "session",
]

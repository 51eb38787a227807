"""ONNX Runtime services: model I/O and sessions, timing, benchmarking, the measurement cache, operator costs, verification.

``einopt.runtime.session(path)`` opens a model in ONNX Runtime with the session hooks of its domains
applied: for a model written with ``--kernels tvm``, einopt's custom-op library registered and the
model's generated kernels built from their descriptions (see :mod:`einopt.runtime.sessions`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["session"]


def __getattr__(name: str) -> Any:
    if name == "session":  # imported on use: the package itself loads no ONNX Runtime
        from einopt.runtime.sessions import session

        return session
    raise AttributeError(f"module 'einopt.runtime' has no attribute {name!r}")

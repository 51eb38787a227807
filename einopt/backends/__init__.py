"""eOperator backends: how the eOperators a search finds are written, and what the stages do for it.

A backend is chosen once, from ``Options.kernels`` (the CLI's ``--kernels``), by :func:`backend`;
every stage that depends on it calls its hooks (:class:`Backend`) and never tests its name:

- ``onnx`` (:mod:`einopt.instantiate.backend`, where the interface is too): eOperators as model-local functions of standard ONNX
  operators; the model runs in any ONNX Runtime.
- ``tvm`` (:mod:`einopt.backends.tvm`): eOperators and element-wise chains as generated kernels,
  described in the model, compiled by TVM where it runs, and run in ONNX Runtime by einopt's
  custom-op library.

>>> backend("onnx").fuse_activations
False
"""

from __future__ import annotations

from einopt.backends.tvm import TVM
from einopt.instantiate.backend import PORTABLE, Backend, PortableBackend

__all__ = ["BACKENDS", "Backend", "PORTABLE", "PortableBackend", "TVM", "backend"]


def backend(name: str) -> Backend:
    """The backend called ``name`` (a key of :data:`BACKENDS`).

    Raises
    ------
    ValueError
        No backend has that name.
    """
    found = BACKENDS.get(name)
    if found is None:
        raise ValueError(f"kernels must be one of {', '.join(BACKENDS)}, not {name!r}")
    return found


BACKENDS: dict[str, Backend] = {b.name: b for b in (PORTABLE, TVM)}
"""Every backend, by name (the CLI's ``--kernels`` choices)."""

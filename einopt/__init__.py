"""einopt: a derivation-based superoptimizer for tensor programs.

The expression core is importable without TVM; ``einopt.compile`` imports
TVM on first use (it takes over a second to load). ``einopt.search`` is both
the search package and, called, its :func:`einopt.search.search`.
"""

from __future__ import annotations

import importlib
from typing import Any

from einopt import api as _api
from einopt.api import L, Max, Sum, iters, program, tensor
from einopt.core.ir import (
    Access,
    Binary,
    Const,
    IConst,
    IRError,
    Iter,
    Program,
    Scope,
    Tensor,
    Unary,
)

# The text syntax: imported here, so that nodes print in it (it installs itself as their printer).
from einopt.core.syntax import ParseError, format_expr, parse

# One constructor per element-wise operation (einopt.relu, einopt.maximum, ...; einopt.core.ops).
globals().update(_api.FUNCTIONS)

__version__ = "0.1.0"

# Loaded on first use, so that `import einopt` stays fast: name -> (module, attribute), where an
# empty attribute stands for the module itself.
_LAZY: dict[str, tuple[str, str]] = {
    "evaluate": ("einopt.core.interp", "evaluate"),
    "key": ("einopt.core.keys", "key"),
    "fingerprint": ("einopt.core.keys", "fingerprint"),
    "canonical_form": ("einopt.core.keys", "canonical_form"),
    "simplify": ("einopt.core.index", "simplify"),
    "linear_form": ("einopt.core.index", "linear_form"),
    "compile": ("einopt.codegen", "compile"),
    "cuda_source": ("einopt.codegen", "cuda_source"),
    "optimize": ("einopt.pipeline", "optimize"),
    "Options": ("einopt.pipeline", "Options"),
    "DimRange": ("einopt.frontend.symbolic", "DimRange"),
    "translate": ("einopt.frontend.translate", "translate_graph"),
    "search": ("einopt.search", ""),  # the package
    "superoptimize": ("einopt.search", "search"),
    "to_onnx": ("einopt.stages.export", "to_onnx"),
}

__all__ = [
    "Access",
    "Binary",
    "Const",
    "IConst",
    "IRError",
    "Iter",
    "L",
    "Max",
    "ParseError",
    "Program",
    "Scope",
    "Sum",
    "Tensor",
    "Unary",
    "format_expr",
    "iters",
    "parse",
    "program",
    "tensor",
    *_api.FUNCTIONS,
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = importlib.import_module(module)
        if attr:
            value = getattr(value, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'einopt' has no attribute {name!r}")

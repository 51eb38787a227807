"""Importers of reductions by maximum: ReduceMax, MaxPool, Softmax.

(Being filled in; the registry entries come from here.)
"""

from __future__ import annotations

from einopt.frontend.operand import Importer

__all__ = ["MAX_IMPORTERS", "NONLINEAR"]

MAX_IMPORTERS: dict[str, Importer] = {}
"""Importer per ONNX op type."""

NONLINEAR: frozenset[str] = frozenset()
"""The op types above that are not linear in their data input (they start a subprogram of their own)."""

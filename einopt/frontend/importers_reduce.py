"""Importers of reductions by sum: ReduceSum, ReduceMean, GlobalAveragePool, AveragePool, LayerNormalization.

(Being filled in; the registry entries come from here.)
"""

from __future__ import annotations

from einopt.frontend.operand import Importer

__all__ = ["REDUCE_IMPORTERS", "NONLINEAR"]

REDUCE_IMPORTERS: dict[str, Importer] = {}
"""Importer per ONNX op type."""

NONLINEAR: frozenset[str] = frozenset()
"""The op types above that are not linear in their data input (they start a subprogram of their own)."""

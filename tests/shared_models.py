"""The real torch.onnx exports in ``../shared/models`` (beside the checkout): paths, names, inputs, PyTorch's outputs.

Tests that use them are marked :data:`needs_shared` and skip with a clear reason where the folder
is absent; the models are never copied into the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "models"

needs_shared = pytest.mark.skipif(
    not (SHARED / "index.json").is_file(), reason=f"the shared exporter models are not at {SHARED}"
)


def names() -> list[str]:
    """The shared models' names (empty where the folder is absent)."""
    index = SHARED / "index.json"
    return sorted(json.loads(index.read_text())) if index.is_file() else []


def path(name: str) -> Path:
    return SHARED / f"{name}.onnx"


def data(name: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The inputs (by position as ``x0, x1, ..``) and PyTorch's outputs ``y0, y1, ..`` of a model."""
    with np.load(SHARED / f"{name}.npz") as z:
        xs = {k: z[k] for k in sorted(z.files) if k.startswith("x")}
        ys = [z[f"y{i}"] for i in range(sum(k.startswith("y") for k in z.files))]
    return xs, ys

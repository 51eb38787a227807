"""Errors of the ONNX pipeline that reach the user, one class per exit code."""

from __future__ import annotations


class ModelError(ValueError):
    """The model file or an option about it is bad (unreadable, malformed, wrong shapes): exit 3."""


class UnsupportedModelError(ValueError):
    """The model is valid ONNX but einopt cannot process it at all: exit 6."""


class VerificationError(RuntimeError):
    """The optimized model's outputs differ from the original's: exit 4."""

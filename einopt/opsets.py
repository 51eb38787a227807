"""The ONNX opsets einopt works on: a model's default-domain opset, and the refusal of one outside
the supported range. Every layer that takes a model from the user checks it (the pipeline, the
command line, the benchmark); the importers read the opset to translate by it. Also the domain of
einopt's own generated-kernel nodes, which every layer that writes or reads them names.
"""

from __future__ import annotations

import onnx

from einopt.errors import UnsupportedModelError

__all__ = ["DEFAULT_DOMAINS", "KERNEL_DOMAIN", "MIN_OPSET", "default_opset", "check_opset"]

# Domain names of the default ONNX operator set.
DEFAULT_DOMAINS = ("", "ai.onnx")

KERNEL_DOMAIN = "ai.einopt"
"""The domain of einopt's generated-kernel nodes (``ai.einopt::TvmKernel``, see
:mod:`einopt.backends.tvm.kernels`)."""


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain opset version; ``None`` when it imports none (e.g. only ``ai.onnx.ml``).

    A model without a default-domain import has no default-domain nodes, so
    nothing in it is translated; it is not "too old".
    """
    return next((int(o.version) for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)


MIN_OPSET = 7
"""The oldest default-domain opset einopt works on: numpy-style broadcasting starts there, and ONNX
Runtime guarantees nothing older. The newest is onnx's own (``onnx.defs.onnx_opset_version()``): the
operator schemas einopt translates and emits by."""


def check_opset(model: onnx.ModelProto, source: str = "the model") -> None:
    """Refuse a model whose default-domain opset einopt does not support.

    A model importing no default-domain opset passes (nothing in it is translated).

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    source : str
        What to call it in the message (its path).

    Raises
    ------
    UnsupportedModelError
        When the opset is older than :data:`MIN_OPSET` or newer than onnx's latest.
    """
    opset, newest = default_opset(model), onnx.defs.onnx_opset_version()
    if opset is not None and not MIN_OPSET <= opset <= newest:
        raise UnsupportedModelError(
            f"{source} imports default-domain opset {opset}; einopt supports opsets {MIN_OPSET} to {newest} "
            "(onnx.version_converter can convert a model between opsets)"
        )

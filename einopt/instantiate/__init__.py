"""Expressions back to ONNX: operator matching, eOperators, compile-time constants.

Entry point: :func:`einopt.instantiate.emit.instantiate` turns an
``ir.Program`` (one subprogram) into ONNX nodes, initializers and model-local
functions. Each bound scope is, in order of preference:

1. evaluated at compile time into an initializer when every tensor it reads is
   a known constant;
2. matched to a predefined operator (``match.py``: an iterator-mapping table
   per operator that derives the attributes from the index functions); a
   binding's original operator type (``instantiate(preferred=...)``, from
   ``emit.original_ops``) wins when its matcher adds no run-time layout work;
3. emitted as an eOperator (``eop.py``): a call to a model-local ONNX function
   in domain ``einopt.eop`` whose body uses only standard ops.

Scopes are materialised without their ``pad`` (a codegen hint; reads outside a
scope's range are 0 either way). A tensor holding scope ``S`` stores traversal
value ``S.origin[d] + p`` at array position ``p``.
"""

from einopt.core.ops import BINARY, UNARY

EOP_DOMAIN = "einopt.eop"

# Standard ONNX operators for the IR's element-wise operations (matching and eOperators share
# them), from the rows of einopt.core.ops.
BINARY_OPS: dict[str, str] = {op.name: op.onnx for op in BINARY.values()}
UNARY_OPS: dict[str, str] = {op.name: op.onnx for op in UNARY.values()}
# The attribute carrying a unary function's parameter.
UNARY_PARAM: dict[str, str] = {
    op.name: op.onnx_param for op in UNARY.values() if op.onnx_param is not None and not op.param_input
}
# Unary functions whose ONNX operator takes the parameter as its second input (Pow's exponent):
# it is written as a one-element float32 initializer.
UNARY_PARAM_INPUT: frozenset[str] = frozenset(op.name for op in UNARY.values() if op.param_input)
# Einsum exists from this default-domain opset on.
EINSUM_OPSET = 12

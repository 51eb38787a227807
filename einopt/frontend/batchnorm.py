"""Folding inference-mode BatchNormalization into the Conv, ConvTranspose or Gemm before it.

One folding function per producer op in a table (``_BN_PRODUCERS``);
:func:`fold_batchnorm` returns a new model, :func:`fold_batchnorm_in_place`
is the stage :func:`einopt.frontend.fold.prepare` runs. (``fold_batchnorm``
is also importable from :mod:`einopt.frontend.fold`.)
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from einopt.frontend.onnx_graph import (
    all_names,
    constants,
    delete_at,
    drop_unused_initializers,
    drop_value_info,
    read_counts,
    unique_name,
)
from einopt.opsets import DEFAULT_DOMAINS, default_opset
from einopt.runtime import modelio

log = logging.getLogger(__name__)

__all__ = ["fold_batchnorm", "fold_batchnorm_in_place"]

_FLOATS = (np.float16, np.float32, np.float64)


_BnFold = tuple[np.ndarray, np.ndarray, dict[str, float]] | str


def _bn_into_conv(
    node: onnx.NodeProto, w: np.ndarray, b: np.ndarray | None, a: np.ndarray, c: np.ndarray
) -> _BnFold:
    """Conv: ``W'[m, ...] = W[m, ...] * a[m]``, ``b' = b * a + c``."""
    if w.ndim < 3 or a.shape != (w.shape[0],):
        return f"weight shape {list(w.shape)} does not match {a.size} channels"
    return w * a.reshape(-1, *[1] * (w.ndim - 1)), (0.0 if b is None else b) * a + c, {}


def _bn_into_conv_transpose(
    node: onnx.NodeProto, w: np.ndarray, b: np.ndarray | None, a: np.ndarray, c: np.ndarray
) -> _BnFold:
    """ConvTranspose: ``W[ci, j, ...]`` feeds output channel ``(ci // Cg) * Mg + j``; bias as for Conv."""
    group = next((int(x.i) for x in node.attribute if x.name == "group"), 1)
    if w.ndim < 3 or w.shape[0] % group or a.shape != (w.shape[1] * group,):
        return f"weight shape {list(w.shape)} (group {group}) does not match {a.size} channels"
    ci = np.arange(w.shape[0]) // (w.shape[0] // group)
    scale = a[ci[:, None] * w.shape[1] + np.arange(w.shape[1])[None, :]]
    return w * scale.reshape(*scale.shape, *[1] * (w.ndim - 2)), (0.0 if b is None else b) * a + c, {}


def _bn_into_gemm(
    node: onnx.NodeProto, w: np.ndarray, b: np.ndarray | None, a: np.ndarray, c: np.ndarray
) -> _BnFold:
    """Gemm: the columns of ``op(B)`` scale by ``a``; ``C' = beta * C * a + c`` and ``beta = 1``."""
    attrs = {x.name: x for x in node.attribute}
    trans_b = bool(attrs["transB"].i) if "transB" in attrs else False
    if w.ndim != 2 or a.shape != (w.shape[0 if trans_b else 1],):
        return f"B shape {list(w.shape)} (transB={int(trans_b)}) does not match {a.size} channels"
    beta = attrs["beta"].f if "beta" in attrs else 1.0
    bias = c if b is None else beta * b * a + c
    return w * (a[:, None] if trans_b else a[None, :]), bias, {"beta": 1.0}


# Producer op -> folding function; the weights are input 1, the bias (Gemm: C) input 2.
_BN_PRODUCERS: dict[str, Callable[..., _BnFold]] = {
    "Conv": _bn_into_conv,
    "ConvTranspose": _bn_into_conv_transpose,
    "Gemm": _bn_into_gemm,
}


def fold_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fold inference-mode BatchNormalization into a preceding Conv, ConvTranspose or Gemm.

    With ``a = scale / sqrt(var + eps)`` and ``c = B - mean * a``, the
    producer's weights are scaled per output channel by ``a`` and its bias
    becomes ``bias * a + c``. Folded only when BN has one output and constant
    parameters, the producer's weights and bias are constant initializers,
    and the producer's output is read by the BN alone and is not a graph
    output. New weights get new names; the BN's output name moves to the producer.
    """
    m = modelio.copy_model(model)
    fold_batchnorm_in_place(m)
    return m


def fold_batchnorm_in_place(m: onnx.ModelProto) -> collections.Counter[str]:
    """Fold BatchNormalization as :func:`fold_batchnorm` does, in ``m`` itself.

    Returns
    -------
    collections.Counter[str]
        How many BatchNormalization nodes were folded into each producer op type.
    """
    g = m.graph
    opset = default_opset(m)
    consts = constants(g)
    reads = read_counts(g)
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output if o}
    taken = all_names(g)
    stats: collections.Counter[str] = collections.Counter()
    removed: list[int] = []
    touched: set[str] = set()
    for idx, bn in enumerate(g.node):
        if bn.op_type != "BatchNormalization" or bn.domain not in DEFAULT_DOMAINS:
            continue
        plan = _match_bn(bn, producer.get(bn.input[0]), consts, reads, outputs, opset)
        if isinstance(plan, str):
            log.debug("not folding BatchNormalization %r: %s", bn.name, plan)
            continue
        prod, weight, bias, attrs = plan
        w_name = unique_name(f"{prod.input[1]}_bn", taken)
        b_name = unique_name(f"{prod.input[1]}_bn_bias", taken)
        for name, value in ((w_name, weight), (b_name, bias)):
            t = g.initializer.add()
            t.CopyFrom(numpy_helper.from_array(value, name))
            consts[name] = t
        touched.update(i for i in [*prod.input[1:], *bn.input[1:]] if i)
        prod.input[1] = w_name
        while len(prod.input) < 3:
            prod.input.append("")
        prod.input[2] = b_name
        for key, value in attrs.items():
            delete_at(prod.attribute, [i for i, x in enumerate(prod.attribute) if x.name == key])
            prod.attribute.append(onnx.helper.make_attribute(key, value))
        prod.output[0] = bn.output[0]
        producer[bn.output[0]] = prod
        removed.append(idx)
        stats[prod.op_type] += 1
    delete_at(g.node, removed)
    drop_unused_initializers(g, touched)
    drop_value_info(g)
    return stats


def _match_bn(
    bn: onnx.NodeProto,
    prod: onnx.NodeProto | None,
    consts: Mapping[str, TensorProto],
    reads: Mapping[str, int],
    outputs: set[str],
    opset: int | None,
) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray, dict[str, float]] | str:
    """``(producer, weight, bias, attrs)`` to fold ``bn`` into its producer, or the reason it cannot."""
    attrs = {a.name: a for a in bn.attribute}
    if [o for o in bn.output if o] != [bn.output[0]]:
        return "training outputs are used"
    if "training_mode" in attrs and attrs["training_mode"].i:
        return "training mode"
    if "spatial" in attrs and not attrs["spatial"].i:
        return "spatial=0"
    params = list(bn.input[1:5])
    if len(params) != 4 or any(p not in consts for p in params):
        return "parameters are not constant"
    if prod is None or prod.op_type not in _BN_PRODUCERS or prod.domain not in DEFAULT_DOMAINS:
        return "not produced by Conv/ConvTranspose/Gemm"
    x = bn.input[0]
    if reads[x] != 1 or x in outputs or len(prod.output) != 1:
        return f"{prod.op_type} output is used elsewhere"
    if prod.op_type == "Gemm" and (opset is None or opset < 7):
        return "Gemm before opset 7"
    weight_inputs = [i for i in prod.input[1:3] if i]
    if any(i not in consts for i in weight_inputs):
        return f"{prod.op_type} weights are not constant initializers"
    w = numpy_helper.to_array(consts[prod.input[1]])
    if w.dtype.type not in _FLOATS:
        return f"weights of type {w.dtype}"
    b = numpy_helper.to_array(consts[prod.input[2]]) if len(prod.input) > 2 and prod.input[2] else None
    scale, shift, mean, var = (numpy_helper.to_array(consts[p]).astype(np.float64) for p in params)
    if not (scale.ndim == 1 and scale.shape == shift.shape == mean.shape == var.shape):
        return "parameters are not 1-D of one length"
    eps = attrs["epsilon"].f if "epsilon" in attrs else 1e-5
    a = scale / np.sqrt(var + eps)
    c = shift - mean * a
    result = _BN_PRODUCERS[prod.op_type](
        prod, w.astype(np.float64), None if b is None else b.astype(np.float64), a, c
    )
    if isinstance(result, str):
        return result
    new_w, bias, new_attrs = result
    return prod, new_w.astype(w.dtype), np.ascontiguousarray(bias, dtype=w.dtype), new_attrs

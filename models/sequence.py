"""The sequence evaluation models: a Longformer attention layer and an LSTM cell."""

from __future__ import annotations

import math

import numpy as np
import onnx

from .builder import GraphBuilder

FULL = {
    "longformer": {"n": 2048, "hidden": 512, "heads": 8, "w": 24, "d": 4},
    "lstm": {"hidden": 256},
}
SMALL = {
    "longformer": {"n": 64, "hidden": 32, "heads": 2, "w": 4, "d": 4},
    "lstm": {"hidden": 16},
}


def band_indices(n: int, w: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``idx_v[i, j] = i + j*d`` (rows of the padded keys) and ``idx_s = i*N + idx_v`` (flattened scores)."""
    i = np.arange(n, dtype=np.int64)[:, None]
    idx_v = i + np.arange(2 * w + 1, dtype=np.int64)[None, :] * d
    return i * (n + 2 * w * d) + idx_v, idx_v


def _heads(b: GraphBuilder, x: str, batch: int, n: int, heads: int, dh: int) -> str:
    """[bs, n, D] -> [bs, H, n, dh]."""
    x = b.op("Reshape", [x, b.ints("shape", [batch, n, heads, dh])])
    return b.op("Transpose", [x], perm=[0, 2, 1, 3])


def _layer_norm(b: GraphBuilder, x: str, hidden: int) -> str:
    gamma = b.uniform("scale", (hidden,), 0.8, 1.2)
    return b.op(
        "LayerNormalization", [x, gamma, b.weight("bias", (hidden,), 1.0, 0.1)], axis=-1, epsilon=1e-5
    )


def build_longformer(
    b: GraphBuilder,
    batch: int,
    n: int,
    hidden: int,
    heads: int,
    w: int,
    d: int,
    *,
    gather_elements: bool = False,
) -> onnx.ModelProto:
    """A Longformer layer whose dilated sliding-window attention is written with dense ONNX ops.

    ``gather_elements`` picks the band scores with GatherElements on the
    un-flattened scores instead of Gather on the flattened ones (tests only).
    """
    dh, N, win = hidden // heads, n + 2 * w * d, 2 * w + 1
    idx_s, idx_v = band_indices(n, w, d)
    x0 = "x"
    with b.scope("attention"):
        q, k, v = (_heads(b, b.linear(x0, hidden, hidden, 1.0), batch, n, heads, dh) for _ in range(3))
        q = b.op("Mul", [q, b.const("inv_sqrt_dh", np.array(1.0 / math.sqrt(dh), np.float32))])
        pads = b.ints("pads", [0, 0, w * d, 0, 0, 0, w * d, 0])
        kp = b.op("Pad", [k, pads])
        s = b.op("MatMul", [q, b.op("Transpose", [kp], perm=[0, 1, 3, 2])])  # [bs, H, n, N]
        if gather_elements:
            idx = np.ascontiguousarray(np.broadcast_to(idx_v, (batch, heads, n, win)))
            band = b.op("GatherElements", [s, b.ints("band_index", idx)], axis=3)
        else:
            flat = b.op("Reshape", [s, b.ints("shape", [batch, heads, n * N])])
            band = b.op("Gather", [flat, b.ints("band_index", idx_s)], axis=2)  # [bs, H, n, 2w+1]
        p = b.op("Softmax", [band], axis=-1)
        vg = b.op(
            "Gather", [b.op("Pad", [v, pads]), b.ints("value_index", idx_v)], axis=2
        )  # [bs,H,n,2w+1,dh]
        o = b.op("MatMul", [b.op("Unsqueeze", [p, b.ints("axes", [3])]), vg])  # [bs, H, n, 1, dh]
        o = b.op("Transpose", [b.op("Squeeze", [o, b.ints("axes", [3])])], perm=[0, 2, 1, 3])
        o = b.op("Reshape", [o, b.ints("shape", [batch, n, hidden])])
        x1 = _layer_norm(b, b.op("Add", [b.linear(o, hidden, hidden, 1.0), x0]), hidden)
    with b.scope("ffn"):
        y = b.linear(b.op("Relu", [b.linear(x1, hidden, 4 * hidden)]), 4 * hidden, hidden, 1.0)
        y = _layer_norm(b, b.op("Add", [y, x1]), hidden)
    doc = (
        f"Longformer attention layer (EinNet evaluation), dilated sliding-window attention written with "
        f"standard ONNX ops (dense QK^T on zero-padded keys, constant Gathers of the band): x [{batch},{n},{hidden}] "
        f"-> [{batch},{n},{hidden}]; {heads} heads of {dh}, window w={w} each side (2w+1={win}), dilation d={d}, "
        f"FFN {4 * hidden}, LayerNormalization. Scaled down from the paper's n=10000, w=1000 to n=2048, w=24 "
        "(d=4 kept): the dense scores [bs,H,n,n+2wd] and the gathered values Vg [bs,H,n,2w+1,dh] must fit in "
        "memory at batch 16 (ORT peaks at about 4 GB with w=24, 7.8 GB with w=32); batch 1 runs in about "
        "0.2 s in ONNX Runtime on 2 cores. Seeded random weights."
    )
    return b.model([("x", (batch, n, hidden))], [(y, "y", (batch, n, hidden))], doc)


def build_lstm(b: GraphBuilder, batch: int, hidden: int) -> onnx.ModelProto:
    """One LSTM cell step with 8 separate gate MatMuls (the fused-LSTM example)."""
    gates = {}
    for gate in ("i", "f", "g", "o"):
        with b.scope(f"gate_{gate}"):
            # Weights 1/sqrt(2*hidden): the sum of the two linears has unit variance, so no gate saturates.
            gx = b.op("MatMul", ["x", b.weight("weight_x", (hidden, hidden), 2 * hidden, 1.0)])
            gh = b.op("MatMul", ["h", b.weight("weight_h", (hidden, hidden), 2 * hidden, 1.0)])
            pre = b.op("Add", [b.op("Add", [gx, gh]), b.weight("bias", (hidden,), 1.0, 0.1)])
            gates[gate] = b.op("Tanh" if gate == "g" else "Sigmoid", [pre])
    with b.scope("cell"):
        c = b.op("Add", [b.op("Mul", [gates["f"], "c"]), b.op("Mul", [gates["i"], gates["g"]])])
        h = b.op("Mul", [gates["o"], b.op("Tanh", [c])])
    doc = (
        f"LSTM cell (EinNet fused-LSTM example): x, h, c [{batch},{hidden}] -> h', c' [{batch},{hidden}]; gates "
        "i, f, g, o each MatMul(x, Wx) + MatMul(h, Wh) + b (8 MatMuls), sigmoid for i, f, o, tanh for g, "
        "c' = f*c + i*g, h' = o*tanh(c'); seeded random weights."
    )
    shape = (batch, hidden)
    return b.model(
        [("x", shape), ("h", shape), ("c", shape)], [(h, "h_next", shape), (c, "c_next", shape)], doc
    )

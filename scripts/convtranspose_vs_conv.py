"""A stride-1 ConvTranspose against the Conv over its flipped weight, in ONNX Runtime, side by side.

    python scripts/convtranspose_vs_conv.py

The search reaches both forms of the sub-pixel phase convolution (a stride-1
ConvTranspose with 4x outputs, or a Conv once a tap is read forward); which
kernel is faster depends on the shape, so both stay candidates and the
measured cost decides. Each row checks the two outputs agree, then times them
interleaved after 5 warm-up runs each (2 threads, medians of 30). Run it alone on the machine.
"""

from __future__ import annotations

import os
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SHAPES = [  # (batch, in channels, out channels, spatial, kernel)
    (1, 64, 64, 56, 3),
    (16, 128, 128, 16, 2),
    (1, 256, 256, 14, 3),
    (16, 512, 1024, 4, 2),
]


def _session(op: str, weight: np.ndarray, attrs: dict, shape: list[int]) -> ort.InferenceSession:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["X", "W"], ["Y"], **attrs)
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options)


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for n, c, f, hw, k in SHAPES:
        wt = rng.standard_normal((c, f, k, k)).astype(np.float32)
        wc = np.ascontiguousarray(wt.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
        x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
        transposed = _session("ConvTranspose", wt, {}, [n, c, hw, hw])
        conv = _session("Conv", wc, {"pads": [k - 1] * 4}, [n, c, hw, hw])
        a, b = transposed.run(None, {"X": x})[0], conv.run(None, {"X": x})[0]
        assert np.allclose(a, b, atol=1e-3), float(np.abs(a - b).max())
        for _ in range(5):  # warm up both (allocations, thread pool, blocked-layout reorders)
            transposed.run(None, {"X": x})
            conv.run(None, {"X": x})
        ta, tb = [], []
        for _ in range(30):
            t = time.perf_counter()
            transposed.run(None, {"X": x})
            ta.append(time.perf_counter() - t)
            t = time.perf_counter()
            conv.run(None, {"X": x})
            tb.append(time.perf_counter() - t)
        ma, mb = np.median(ta), np.median(tb)
        print(
            f"[{n},{c},{hw},{hw}] -> {f}, k{k}: ConvTranspose {ma * 1e3:.2f} ms, Conv {mb * 1e3:.2f} ms, "
            f"ConvTranspose / Conv {ma / mb:.2f}"
        )


if __name__ == "__main__":
    main()

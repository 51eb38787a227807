"""ONNX Runtime's SkipLayerNormalization against Add + LayerNormalization on 2-D rows.

At ORT_ENABLE_ALL, ONNX Runtime rewrites an Add feeding a LayerNormalization over 3-D values into
its com.microsoft SkipLayerNormalization; on rows merged to 2-D (Reshape, LayerNormalization,
Reshape: the lowering ``einopt.instantiate.match_reduce.match_layer_norm`` writes for a sum) it
keeps the two. This times both forms side by side (interleaved, medians, 300 runs) at BERT's and
ViT's shapes, with 2 threads and with 1, and prints what ORT made of each::

    python scripts/bench_layernorm.py

Run it alone on the machine. Measured 2026-11-27 (ORT 1.32, 2 threads): 72 against 23 us on
[1,128,256], 1263 against 321 us on [16,128,256], 161 against 47 us on [1,197,384].
"""

from __future__ import annotations

import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SHAPES = ([1, 128, 256], [16, 128, 256], [1, 197, 384])


def model(shape: list[int], rows: bool) -> onnx.ModelProto:
    """``LayerNormalization(x + s)`` over the last dimension, on 3-D values or on 2-D ``rows``."""
    hidden, count = shape[-1], int(np.prod(shape[:-1]))
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), n) for n in ("g", "b")]
    inits += [
        numpy_helper.from_array(np.array([count, hidden], np.int64), "rows"),
        numpy_helper.from_array(np.array(shape, np.int64), "back"),
    ]
    if rows:
        nodes = [
            helper.make_node("Add", ["x", "s"], ["t"]),
            helper.make_node("Reshape", ["t", "rows"], ["t2"]),
            helper.make_node("LayerNormalization", ["t2", "g", "b"], ["y2"], axis=-1, epsilon=1e-12),
            helper.make_node("Reshape", ["y2", "back"], ["y"]),
        ]
    else:
        nodes = [
            helper.make_node("Add", ["x", "s"], ["t"]),
            helper.make_node("LayerNormalization", ["t", "g", "b"], ["y"], axis=-1, epsilon=1e-12),
        ]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "s", "y")]
    graph = helper.make_graph(nodes, "norm", value[:2], value[2:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def session(m: onnx.ModelProto, threads: int, tmp: str) -> tuple[ort.InferenceSession, list[str]]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.optimized_model_filepath = f"{tmp}/optimized.onnx"
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess, [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for threads in (2, 1):
            for shape in SHAPES:
                rng = np.random.default_rng(1)
                feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x", "s")}
                forms = {
                    "3-D": session(model(shape, False), threads, tmp),
                    "rows": session(model(shape, True), threads, tmp),
                }
                got = [s.run(None, feeds)[0] for s, _ in forms.values()]
                assert np.allclose(got[0], got[1], atol=1e-4), "the two forms differ"
                times: dict[str, list[float]] = {k: [] for k in forms}
                for _ in range(20):
                    for s, _ in forms.values():
                        s.run(None, feeds)
                for _ in range(300):
                    for k, (s, _) in forms.items():
                        t = time.perf_counter()
                        s.run(None, feeds)
                        times[k].append(time.perf_counter() - t)
                med = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
                ops = {k: "+".join(o) for k, (_, o) in forms.items()}
                print(
                    f"{threads} threads {shape}: 3-D {med['3-D']:.1f} us ({ops['3-D']}), "
                    f"rows {med['rows']:.1f} us ({ops['rows']}), ratio {med['3-D'] / med['rows']:.2f}"
                )


if __name__ == "__main__":
    main()

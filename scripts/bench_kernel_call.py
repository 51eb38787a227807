"""The cost of calling a generated kernel inside ONNX Runtime, against a trivial ONNX Runtime operator.

Two models, each a chain of N nodes computing ``y = x + 1`` on a small tensor: one with ORT's own
``Add``, one with ``ai.einopt::TvmKernel`` nodes running einopt's generated ``x + 1`` through its
custom-op library. Timed side by side (interleaved, medians), at 1 and 2 threads; the difference
per node is what a generated kernel costs beyond an ORT kernel (the target: within 2 us)::

    python scripts/bench_kernel_call.py [--nodes 64] [--size 16] [--runs 300]

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from einopt import L, iters, program, tensor
from einopt.backends.tvm import TVM, kernels
from einopt.instantiate.program import program_model
from einopt.runtime import session
from einopt.runtime.timing import Timing, load_average, sample_interleaved


def add_one(size: int) -> onnx.NodeProto:
    """einopt's generated kernel of ``y = 1 x + 1`` on ``[1, size]`` (a ``TvmKernel`` node: two element-wise
    operators are one kernel, where ``x + 1`` alone would be an Add)."""
    i, j = iters(f"i:1 j:{size}")
    x = tensor("x", (1, size))
    model, _ = program_model(program({"y": L(i, j)(x[i, j] * 1.0 + 1.0)}), backend=TVM)
    (node,) = model.graph.node
    assert node.op_type == kernels.OP_TYPE
    return node


def chain(nodes: int, size: int, kernel: onnx.NodeProto | None) -> onnx.ModelProto:
    """``nodes`` times ``x + 1``: ORT's Add, or einopt's ``kernel`` when given."""
    inits = [numpy_helper.from_array(np.ones((1, size), np.float32), "one")] if kernel is None else []
    body, value = [], "x"
    for k in range(nodes):
        out = "y" if k == nodes - 1 else f"t{k}"
        if kernel is None:
            body.append(helper.make_node("Add", [value, "one"], [out]))
        else:
            node = onnx.NodeProto()
            node.CopyFrom(kernel)
            node.name = f"k{k}"
            node.input[:] = [value]
            node.output[:] = [out]
            body.append(node)
        value = out
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, size]) for n in ("x", "y")]
    graph = helper.make_graph(body, "chain", io[:1], io[1:], inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(kernels.DOMAIN, 1)] if kernel else [])
    return helper.make_model(graph, opset_imports=opsets)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--runs", type=int, default=300)
    args = ap.parse_args()
    kernel = add_one(args.size)
    x = np.zeros((1, args.size), np.float32)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.nodes} nodes of x + 1 on [1, {args.size}]")
    for threads in (1, 2):
        sessions = {}
        for name, node in (("ort Add", None), ("einopt TvmKernel", kernel)):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            # the chains are kept whole: ORT folds nothing here, and its graph optimizations stay on
            sess = session(chain(args.nodes, args.size, node).SerializeToString(), options)
            (y,) = sess.run(None, {"x": x})
            assert np.array_equal(y, x + args.nodes), name
            sessions[name] = sess
        fns = {n: (lambda s=s: s.run(None, {"x": x})) for n, s in sessions.items()}
        samples, _ = sample_interleaved(fns, min_runs=args.runs, max_runs=args.runs, budget_s=1e9)
        t = {n: Timing.of(s) for n, s in samples.items()}
        ort_us, ours_us = (t[n].median_ms * 1e3 for n in sessions)
        print(
            f"{threads} thread(s): ORT Add chain {ort_us:.1f} us, TvmKernel chain {ours_us:.1f} us: "
            f"{(ours_us - ort_us) / args.nodes:+.2f} us per node beyond ORT's Add "
            f"({ort_us / args.nodes:.2f} us per Add)"
        )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()

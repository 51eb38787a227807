"""Bandwidth of the TVM-compiled OffsetReduce against numpy's copy, in one process.

    python scripts/bench_offset_reduce.py [--runs 200] [--layout 4d|5d]

The OffsetReduce of a Conv3x3 rewritten as Matmul + OffsetReduce (method.md
section 1) is

    L[f:64, h:56, w:56] Sum[r:3, s:3] T[r*3+s, f, h+r-1, w+s-1]

over T of shape [9, 64, 56, 56] (or the 5-D T[r, s, f, h, w]). Bandwidth
counts bytes read plus bytes written; numpy's ``np.copyto`` between two arrays
of T's size is the reference (it reads and writes T's size). The two are run
interleaved, round-robin, and compared by their medians, so load from other
processes hits both alike. The target is a ratio of at least 0.5.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import einopt.codegen
from einopt import L, Sum, iters, tensor


def offset_reduce(layout: str):
    f, h, w, r, s = iters("f:64 h:56 w:56 r:3 s:3")
    if layout == "5d":
        T = tensor("T", (3, 3, 64, 56, 56))
        return L(f, h, w)(Sum(r, s)(T[r, s, f, h + r - 1, w + s - 1]))
    T = tensor("T", (9, 64, 56, 56))
    return L(f, h, w)(Sum(r, s)(T[r * 3 + s, f, h + r - 1, w + s - 1]))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="timed runs of each (after 20 warm-up runs)")
    parser.add_argument("--layout", choices=["4d", "5d"], default="4d")
    args = parser.parse_args()

    import tvm

    node = offset_reduce(args.layout)
    t = node.body.source  # the body is the access T[...]
    t0 = time.perf_counter()
    kernel = einopt.codegen.compile(node)
    compile_s = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    x = rng.standard_normal(t.shape).astype(np.float32)
    call = kernel.prepare(T=x)
    call.run()
    got = call.results()
    # Reference: zero-pad h and w by one and add the nine shifted windows.
    xp = np.pad(x.reshape(9, 64, 56, 56), [(0, 0), (0, 0), (1, 1), (1, 1)])
    want = sum(xp[r * 3 + s, :, r : r + 56, s : s + 56] for r in range(3) for s in range(3))
    err = float(np.max(np.abs(got - want)))

    src, dst = x, np.empty_like(x)
    kernel_bytes = x.nbytes + got.nbytes
    copy_bytes = 2 * src.nbytes
    for _ in range(20):
        call.run()
        np.copyto(dst, src)
    tk, tc = [], []
    for _ in range(args.runs):
        a = time.perf_counter()
        call.run()
        b = time.perf_counter()
        np.copyto(dst, src)
        c = time.perf_counter()
        tk.append(b - a)
        tc.append(c - b)
    mk, mc = float(np.median(tk)), float(np.median(tc))
    bw_kernel = kernel_bytes / mk / 1e9
    bw_copy = copy_bytes / mc / 1e9

    threads = tvm.runtime.num_threads() if hasattr(tvm.runtime, "num_threads") else "?"
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs, TVM threads: {threads})")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"expression: {node}")
    print(f"compile: {compile_s:.2f} s, scheduled: {kernel.scheduled}, max abs error vs numpy: {err:.2e}")
    print(f"runs: {args.runs} interleaved, medians")
    print(f"TVM OffsetReduce: {mk * 1e3:7.3f} ms  {kernel_bytes / 1e6:5.1f} MB  {bw_kernel:6.1f} GB/s")
    print(f"numpy copyto:     {mc * 1e3:7.3f} ms  {copy_bytes / 1e6:5.1f} MB  {bw_copy:6.1f} GB/s")
    print(f"ratio (kernel / copy bandwidth): {bw_kernel / bw_copy:.2f}  (target >= 0.5)")


if __name__ == "__main__":
    main()

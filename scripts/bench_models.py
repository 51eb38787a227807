"""Several models on the same inputs, side by side: interleaved in one process, one thread pool.

``einopt bench`` compares two models; this times any number (an input, its outputs pinned and
symbolic, say) round-robin, and prints each one's median and its speedup over the first, paired
round by round. With ``--free-dim NAME=VALUE`` every model with symbolic dimensions is timed a
second time opened with ONNX Runtime's free-dimension overrides for them
(``SessionOptions.add_free_dimension_override_by_name``: what a server that runs one shape may
do), to tell what a model's rewrites gain from what ONNX Runtime gains from knowing the shape::

    python scripts/bench_models.py --inputs x.npz in.onnx pinned.onnx symbolic.onnx \\
        --free-dim batch=1 --free-dim height=224 --free-dim width=224

Outputs are checked equal to the first model's before anything is timed. Run it alone on the
machine. Measured 2026-12-08 on the PReLU stack (``../shared/models/dynamic``, 1x3x224x224): three
pinned outputs 1.85-1.94x, three symbolic ones 1.68-1.83x; one symbolic output 1.75x as it is and
2.16x with the overrides, where the best pinned one read 1.87x.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from einopt.runtime.sessions import session
from einopt.runtime.timing import configure_threads, load_average, sample_interleaved


def _symbolic(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="models to time; speedups are over the first")
    parser.add_argument("--inputs", required=True, type=Path, help=".npz of the inputs, by name")
    parser.add_argument("--free-dim", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of timed rounds (default 60)")
    parser.add_argument("--max-runs", type=int, default=300, help="timed rounds at most (default 300)")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: every core)")
    args = parser.parse_args(argv)
    free = {}
    for spec in args.free_dim:
        name, _, value = spec.partition("=")
        if not name or not value.isdigit():
            parser.error(f"--free-dim {spec!r} is not NAME=VALUE")
        free[name] = int(value)
    feeds = dict(np.load(args.inputs))
    configure_threads(args.threads)
    runs = {}
    for path in args.models:
        runs[path.name] = session(path)
        if free and _symbolic(path) & set(free):
            options = ort.SessionOptions()
            for name, value in free.items():
                options.add_free_dimension_override_by_name(name, value)
            runs[f"{path.name} (free dims set)"] = session(path, options)
    first = next(iter(runs.values())).run(None, feeds)
    for label, s in runs.items():
        for want, got in zip(first, s.run(None, feeds), strict=True):
            if want.shape != got.shape or not np.allclose(want, got, rtol=1e-4, atol=1e-5):
                print(f"{label}: outputs differ from {args.models[0].name}'s", file=sys.stderr)
                return 1
    fns = {label: (lambda s=s: s.run(None, feeds)) for label, s in runs.items()}
    runs_at_most = max(args.max_runs, 1)
    samples, _ = sample_interleaved(
        fns, min_runs=min(10, runs_at_most), max_runs=runs_at_most, budget_s=args.budget
    )
    base = np.asarray(next(iter(samples.values())))
    print(f"load average {load_average()}; {len(base)} interleaved rounds")
    width = max(len(label) for label in samples)
    for label, t in samples.items():
        paired = float(np.median(base / np.asarray(t)))
        print(f"{label:{width}s}  median {np.median(t) * 1e3:8.2f} ms  speedup {paired:5.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

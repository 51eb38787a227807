"""Generated kernels built where the model runs, against the same kernels carried inside the model.

Once, a ``--kernels tvm`` output carried each kernel's compiled library as a uint8 input of
its ``TvmKernel`` node, which einopt's custom-op library loaded from the model. Now a node carries
the kernel's description and ``einopt.runtime.session`` builds it on this machine. This script times
the two routes on the same outputs: for each output it makes the earlier form's twin (each node's
library, compiled from its description, put back in the model as that node's first input) and runs
it with the earlier custom-op library, compiled from its C source (``--old-source``, e.g. ``git show
363c5ab:einopt/runtime/native/einopt_ort.c > old.c``). Both forms run the same kernels in the same
graph; the input model, the new form and the old twin are timed side by side in one process
(interleaved, global thread pool, medians), and the new form's outputs are checked against PyTorch's
(the ``y`` arrays of the input's npz) and against the input in ONNX Runtime::

    python scripts/bench_kernel_route.py OUT.onnx ... --originals ../shared/models --old-source old.c

``OUT.onnx`` is named ``NAME.tvm.onnx`` or ``NAME.onnx`` for the input ``ORIGINALS/NAME.onnx``. The
old twin loads a library einopt built from an earlier source of its own, which this script compiles:
it is this benchmark's explicit choice, never something einopt does with a model. Run it alone on
the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from einopt.backends.tvm import kernels
from einopt.backends.tvm.build import CFLAGS, compiler
from einopt.backends.tvm.ortkernel import library
from einopt.runtime import session
from einopt.runtime.timing import Timing, configure_threads, load_average, machine_info, sample_interleaved


def old_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` in the earlier form: each kernel's library (built from its description) as its node's
    first input, the description attributes gone."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_sha = {d.sha256: d for d in kernels.described(model)}
    added: dict[str, str] = {}
    for node in out.graph.node:
        if node.domain != kernels.DOMAIN:
            continue
        sha = next(a.s.decode() for a in node.attribute if a.name == "kernel_sha256")
        if sha not in added:
            added[sha] = f"einopt_kernels_{len(added)}"
            data = np.frombuffer(library(by_sha[sha]), dtype=np.uint8)
            out.graph.initializer.append(numpy_helper.from_array(data, added[sha]))
        node.input.insert(0, added[sha])
        for a in [a for a in node.attribute if a.name in ("kernel", "kernel_sha256")]:
            node.attribute.remove(a)
    return out


def old_library(source: Path, folder: Path) -> Path:
    """The earlier custom-op library, compiled from ``source`` into ``folder``."""
    path = folder / "libeinopt_ort_old.so"
    cmd = [compiler(), *CFLAGS, "-o", str(path), str(source), "-ldl", "-lpthread"]
    subprocess.run(cmd, check=True, timeout=300)
    return path


def _options(custom: Path | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.use_per_session_threads = False
    options.log_severity_level = 3
    if custom is not None:
        options.register_custom_ops_library(str(custom))
    return options


def _close(got: np.ndarray, want: np.ndarray) -> float:
    """The largest error relative to the reference's scale."""
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    return float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0)) / scale


def measure(output: Path, original: Path, old_lib: Path, runs: int, folder: Path) -> dict:
    data = np.load(original.with_suffix(".npz"))
    model = onnx.load(output)
    feeds_names = [i.name for i in model.graph.input]
    feeds = {name: data[f"x{k}"] for k, name in enumerate(feeds_names)}
    twin_path = folder / f"{output.stem}.old.onnx"
    onnx.save(old_twin(model), twin_path)
    sessions = {
        "input": ort.InferenceSession(str(original), _options(), providers=["CPUExecutionProvider"]),
        "new route": session(output, _options(), global_threads=True),
        "old route": ort.InferenceSession(
            str(twin_path), _options(old_lib), providers=["CPUExecutionProvider"]
        ),
    }
    results = {name: s.run(None, feeds) for name, s in sessions.items()}
    torch_error = max(_close(got, data[f"y{k}"]) for k, got in enumerate(results["new route"]))
    input_error = max(_close(a, b) for a, b in zip(results["new route"], results["input"], strict=True))
    same = all(np.array_equal(a, b) for a, b in zip(results["new route"], results["old route"], strict=True))
    fns = {name: (lambda s=s: s.run(None, feeds)) for name, s in sessions.items()}
    load_before = load_average()
    samples, _ = sample_interleaved(fns, min_runs=runs, max_runs=runs, budget_s=1e9)
    t = {name: Timing.of(s).median_ms for name, s in samples.items()}
    return {
        "model": original.stem,
        "kernels": sum(n.domain == kernels.DOMAIN for n in model.graph.node),
        "ms": t,
        "new_vs_old": t["old route"] / t["new route"],
        "speedup_new": t["input"] / t["new route"],
        "speedup_old": t["input"] / t["old route"],
        "max_error_vs_pytorch": torch_error,
        "max_error_vs_input": input_error,
        "old_equals_new": same,
        "runs": runs,
        "load": [load_before, load_average()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outputs", nargs="+", type=Path)
    ap.add_argument("--originals", type=Path, required=True, help="folder of the input models and their npz")
    ap.add_argument("--old-source", type=Path, required=True, help="the earlier einopt_ort.c")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--out", type=Path, help="write the rows here (JSON lines, one per output)")
    args = ap.parse_args()
    threads = configure_threads()
    print(json.dumps({"machine": machine_info(threads)}))
    with tempfile.TemporaryDirectory(prefix="einopt-route-") as tmp:
        old_lib = old_library(args.old_source, Path(tmp))
        for output in args.outputs:
            name = output.name.removesuffix(".onnx").removesuffix(".tvm")
            row = measure(output, args.originals / f"{name}.onnx", old_lib, args.runs, Path(tmp))
            line = json.dumps(row)
            print(line, flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()

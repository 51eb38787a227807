"""What the evaluation (:mod:`einopt.evaluation.run`) measures besides ``einopt optimize``, in a process of its own per row.

- OpenVINO against ONNX Runtime on the input model: outputs compared at
  einopt's verification tolerance, then both timed interleaved with as many
  threads (:func:`compare_openvino`). OpenVINO is a benchmark-only extra
  (``pip install -e .[bench]``), imported lazily: without it the result says
  "n/a (pip install openvino)".
- For the shared exporter models: the input model and einopt's output against
  PyTorch's outputs stored beside the inputs in ``NAME.npz``
  (:func:`split_reference`, :func:`reference_agreement`).

The side process (:func:`run_side`) is spawned fresh for each row, so its ONNX
Runtime thread pool and OpenVINO's threads end with it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from einopt.core.cost import value_bytes
from einopt.runtime import modelio
from einopt.runtime.timing import Ratio, Timing, configure_threads, sample_interleaved
from einopt.runtime.verify import Tolerance, compare, first_line

OPENVINO_MISSING = "n/a (pip install openvino)"

_REFERENCE_KEY = re.compile(r"([xy])(\d+)")


def split_reference(arrays: Mapping[str, np.ndarray], where: Path | str = "") -> tuple[dict, list]:
    """A shared ``NAME.npz``'s model inputs (``x0..``, by name) and PyTorch's outputs (``y0..``, in order).

    Raises
    ------
    ValueError
        A key other than ``xN`` / ``yN``, or outputs not numbered ``y0, y1, ...`` without gaps.
    """
    feeds: dict[str, np.ndarray] = {}
    outputs: dict[int, np.ndarray] = {}
    for key, value in arrays.items():
        m = _REFERENCE_KEY.fullmatch(key)
        if m is None:
            raise ValueError(f"{where}: array {key!r} is neither an input xN nor a PyTorch output yN")
        if m.group(1) == "x":
            feeds[key] = value
        else:
            outputs[int(m.group(2))] = value
    if sorted(outputs) != list(range(len(outputs))):
        raise ValueError(f"{where}: PyTorch's outputs must be y0..y{len(outputs) - 1}, got {sorted(outputs)}")
    return feeds, [outputs[k] for k in range(len(outputs))]


def reference_agreement(got: Mapping[str, np.ndarray], expected: Sequence[np.ndarray]) -> dict:
    """Whether a model's outputs (by name, in graph order) equal PyTorch's ``y0..`` at einopt's verification
    tolerance: ``{"ok", "max_error", "message"}``."""

    if len(got) != len(expected):
        return {
            "ok": False,
            "max_error": None,
            "message": f"the model has {len(got)} outputs, PyTorch's reference {len(expected)}",
        }
    labels = [f"y{k} ({name})" for k, name in enumerate(got)]
    c = compare(
        dict(zip(labels, expected, strict=True)), dict(zip(labels, got.values(), strict=True)), Tolerance()
    )
    return {"ok": c.ok, "max_error": c.max_abs_error, "message": c.message}


# ----------------------------------------------------------------------------- the side process


@dataclasses.dataclass(frozen=True)
class SideJob:
    """What a row measures besides ``einopt optimize``, in a process of its own: OpenVINO against ORT on the
    input model, and (shared models) the input and the output against PyTorch's outputs."""

    model: Path
    inputs: Path  # .npz of model inputs
    threads: int | None  # ORT's intra-op threads in einopt's timing (None: einopt's default)
    budget_s: float
    openvino: bool
    reference: Path | None = None  # the shared NAME.npz with PyTorch's outputs
    optimized: Path | None = None  # einopt's output


def run_side(job: SideJob) -> dict:
    """:func:`side_checks` in a fresh process (its sessions and threads end with it)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(side_checks, job).result()
        except BrokenProcessPool:
            return {"error": "the measuring process died (out of memory?)"}
        except Exception as e:  # noqa: BLE001 - one row's failure must not end the evaluation
            return {"error": f"{type(e).__name__}: {e}"}


def side_checks(job: SideJob) -> dict:
    """Run a :class:`SideJob`: ``{"openvino": ..., "pytorch": {"input": ..., "output": ...}}``."""

    threads = configure_threads(job.threads)
    model = modelio.load_model(job.model)
    feeds = modelio.load_inputs(job.inputs, model)
    out: dict = {}
    if job.reference is not None:
        with np.load(job.reference, allow_pickle=False) as npz:
            _, expected = split_reference(dict(npz), job.reference)
        out["pytorch"] = {
            which: reference_agreement(modelio.run(modelio.load_model(path), feeds), expected)
            for which, path in (("input", job.model), ("output", job.optimized or job.model))
        }
    out["openvino"] = (
        compare_openvino(job.model, model, feeds, threads, job.budget_s) if job.openvino else None
    )
    return out


def import_openvino():
    """The ``openvino`` module, or None when it is not installed (a benchmark-only extra)."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino


def openvino_config(threads: int) -> dict[str, object]:
    """OpenVINO CPU settings comparable with einopt's ORT timing: ``threads`` inference threads, one stream
    (one request at a time, like ORT's ``run``), latency hint, float32 (no automatic bf16)."""
    return {
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32",
    }


def run_openvino(ov, path: Path, feeds: Mapping[str, np.ndarray], threads: int, names: Sequence[str]):
    """Compile ``path`` for OpenVINO's CPU device (:func:`openvino_config`) and run it once on ``feeds``.

    Returns
    -------
    (InferRequest, dict)
        The request, to run again, and its outputs by the ONNX output ``names``
        (OpenVINO's output ports carry the ONNX names; by position where one does not).
    """
    compiled = ov.Core().compile_model(str(path), "CPU", openvino_config(threads))
    request = compiled.create_infer_request()
    request.infer(dict(feeds))
    port = {n: k for k, p in enumerate(compiled.outputs) for n in p.get_names()}
    return request, {
        name: np.array(request.get_output_tensor(port.get(name, k)).data) for k, name in enumerate(names)
    }


def compare_openvino(
    path: Path, model, feeds: Mapping[str, np.ndarray], threads: int, budget_s: float
) -> dict:
    """OpenVINO against ONNX Runtime on one model: outputs compared, then timed interleaved.

    Returns
    -------
    dict
        ``speedup`` (ORT median / OpenVINO median, None when not measured, with
        ``note`` saying why), ``speedup_95``, ``ort_ms``, ``openvino_ms``,
        ``runs``, ``equal`` / ``max_error`` / ``message`` (OpenVINO's outputs
        against ORT's), ``version`` and ``threads``.
    """
    ov = import_openvino()
    if ov is None:
        return {"speedup": None, "note": OPENVINO_MISSING}

    available = modelio.available_bytes()
    footprint = modelio.total_tensor_bytes(model) + sum(value_bytes(model).values())
    if available is not None and 2 * footprint > available // 2:
        return {"speedup": None, "note": "n/a (too large to hold beside ONNX Runtime's session)"}
    sess = modelio.session(model)
    ref = modelio.run(sess, feeds)
    try:
        request, got = run_openvino(ov, path, feeds, threads, list(ref))
    except Exception as e:  # noqa: BLE001 - OpenVINO's errors have many types
        return {"speedup": None, "note": f"n/a (OpenVINO cannot run it: {first_line(e)})"}
    check = compare(ref, got, Tolerance())
    samples, _ = sample_interleaved(
        {
            "ort": lambda: sess.run(None, feeds),
            "openvino": lambda: request.infer(feeds, share_inputs=True),
        },
        budget_s=budget_s,
    )
    ort_t, ov_t = Timing.of(samples["ort"]), Timing.of(samples["openvino"])
    ratio = Ratio.of(samples["ort"], samples["openvino"])
    return {
        "speedup": ort_t.median_ms / ov_t.median_ms,
        "speedup_95": [ratio.low, ratio.high],
        "ort_ms": ort_t.median_ms,
        "openvino_ms": ov_t.median_ms,
        "runs": ort_t.runs,
        "equal": check.ok,
        "max_error": check.max_abs_error,
        "message": check.message,
        "version": ov.__version__,
        "threads": threads,
    }


def openvino_text(result: Mapping | None) -> str:
    """The OpenVINO cell: its speedup over ORT, or why there is none; a warning when its outputs differ."""
    if not result:
        return "-"
    if result.get("speedup") is None:
        return result.get("note", "n/a")
    differs = "" if result.get("equal", True) else f" (outputs differ from ORT's: {result['max_error']:.2g})"
    return f"{result['speedup']:.2f}x{differs}"

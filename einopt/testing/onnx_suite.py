"""Run einopt over the ONNX backend node suite and the shipped `light` models.

Shared by tests/test_onnx_suite.py and scripts/onnx_suite.py (which prints the counts).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from einopt.errors import UnsupportedModelError
from einopt.opsets import check_opset
from einopt.pipeline import Options, optimize


@functools.cache
def node_cases() -> tuple:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(load_model_tests(kind="node"))


@dataclasses.dataclass(frozen=True)
class CaseOutcome:
    name: str
    outcome: str  # optimized | passed through | ort cannot run | unsupported opset
    nodes: int
    translated: int
    rewritten: int
    detail: str = ""


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _feeds(model: onnx.ModelProto, inputs) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    return dict(zip(names, inputs, strict=False))


def run_node_case(case) -> CaseOutcome:
    """Optimize one backend case; raise AssertionError if the output model differs from the original."""
    try:
        check_opset(case.model)
    except UnsupportedModelError as e:  # optimize refuses it (exit 6): opset 1's three Not cases
        return CaseOutcome(case.name, "unsupported opset", len(case.model.graph.node), 0, 0, str(e))
    datasets = [_feeds(case.model, inputs) for inputs, _ in case.data_sets]
    try:
        ref_sess = _session(case.model)
        refs = [ref_sess.run(None, feeds) for feeds in datasets]
    except Exception as e:  # noqa: BLE001 - ORT cannot run this case at all (newer opset, unsupported op)
        result = optimize(case.model, Options(max_depth=0, inputs=datasets, accept="verified"))
        c = result.counts()
        assert c["rewritten"] == 0, f"{case.name}: rewrote a model nothing can verify"
        return CaseOutcome(
            case.name, "ort cannot run", c["nodes"], c["translated"], 0, str(e).splitlines()[0][:120]
        )
    # the round trip (translate, re-instantiate, verify) is what is tested here: keep every verified rewrite
    result = optimize(case.model, Options(max_depth=0, inputs=datasets, accept="verified"))
    c = result.counts()
    onnx.checker.check_model(result.model, full_check=False)
    sess = _session(result.model)
    for feeds, ref in zip(datasets, refs, strict=True):
        got = sess.run(None, feeds)
        for r, g, out in zip(ref, got, case.model.graph.output, strict=True):
            _assert_close(g, r, case, out.name)
    reinstantiated = c["rewritten"] + c["unchanged"]
    outcome = "optimized" if reinstantiated else "passed through"
    return CaseOutcome(case.name, outcome, c["nodes"], c["translated"], reinstantiated)


def _assert_close(got, ref, case, name: str) -> None:
    if isinstance(ref, list):  # sequence-typed output
        assert isinstance(got, list) and len(got) == len(ref), f"{case.name}: {name}"
        for k, (g, r) in enumerate(zip(got, ref, strict=True)):
            _assert_close(g, r, case, f"{name}[{k}]")
    elif ref is None:
        assert got is None, f"{case.name}: {name}"
    elif np.asarray(ref).dtype.kind in "fc":
        np.testing.assert_allclose(got, ref, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name}: {name}")
    else:
        np.testing.assert_array_equal(got, ref, err_msg=f"{case.name}: {name}")


def light_model_paths() -> list[str]:
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return sorted(glob.glob(os.path.join(root, "light_*.onnx")))


def light_model(path: str, seed: int = 0) -> onnx.ModelProto:
    """A shipped light model with every ConstantOfShape-filled weight replaced by seeded random values.

    The light models carry no weights: each weight is ``ConstantOfShape(shape)``
    of a constant fill. Random weights make verification meaningful (a rewrite
    that swaps two channels would go unnoticed on constant weights). Weights
    are scaled like a He initialisation so activations stay O(1) through deep
    networks, and BatchNormalization variances are made positive.
    """
    model = onnx.load(path)
    model.ir_version = max(model.ir_version, 4)  # weights become initializers that are not graph inputs
    rng = np.random.default_rng(seed)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    role = _weight_roles(model)
    kept_nodes = []
    new_inits = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            new_inits.append(
                numpy_helper.from_array(_random_weight(rng, shape, role.get(node.output[0])), node.output[0])
            )
        else:
            kept_nodes.append(node)
    used = {i for n in kept_nodes for i in n.input}
    graph = model.graph
    del graph.node[:]
    graph.node.extend(kept_nodes)
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep + new_inits)
    weight_names = {t.name for t in new_inits}
    inputs = [i for i in graph.input if i.name not in weight_names]
    del graph.input[:]
    graph.input.extend(inputs)
    return model


def _weight_roles(model: onnx.ModelProto) -> dict[str, str]:
    roles: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1:
            roles[n.input[1]] = "weight"
            if len(n.input) > 2:
                roles[n.input[2]] = "bias"
        if n.op_type == "BatchNormalization":
            for name, r in zip(n.input[1:], ("scale", "bias", "bias", "var"), strict=False):
                roles[name] = r
    return roles


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...], role: str | None) -> np.ndarray:
    if role == "weight":
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return (rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)
    if role == "var":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if role == "scale":
        return rng.uniform(0.5, 1.0, shape).astype(np.float32)
    return (0.1 * rng.standard_normal(shape)).astype(np.float32)

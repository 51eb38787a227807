"""The evaluation models: structure, determinism, numpy references, the einopt round trip and the CLI."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

from einopt.cli import main
from einopt.models import MODELS, build, sample_inputs, write
from einopt.models.sequence import SMALL, band_indices
from einopt.pipeline import Options, optimize
from einopt.runtime.verify import Tolerance, compare

NAMES = list(MODELS)

# The output shapes of the small models at batch 1 (the full ones are checked by shape inference).
SMALL_OUTPUTS = {
    "infogan": {"image": (1, 3, 32, 32)},
    "dcgan": {"image": (1, 3, 64, 64)},
    "fsrcnn": {"highres": (1, 1, 32, 32)},
    "gcn": {"scores": (1, 5, 64, 64)},
    "resnet18": {"logits": (1, 10)},
    "csrnet": {"density": (1, 8, 8, 8)},
    "longformer": {"y": (1, 64, 32)},
    "lstm": {"h_next": (1, 16), "c_next": (1, 16)},
    "mobilenetv2": {"logits": (1, 10)},
    "squeezenet": {"logits": (1, 10)},
    "shufflenetv2": {"logits": (1, 10)},
    "bert": {"last_hidden_state": (1, 8, 16)},
    "gpt2": {"last_hidden_state": (1, 8, 16)},
    "vit": {"last_hidden_state": (1, 10, 16)},
}
FULL_OUTPUTS = {
    "infogan": {"image": [1, 3, 32, 32]},
    "dcgan": {"image": [1, 3, 64, 64]},
    "fsrcnn": {"highres": [1, 1, 128, 128]},
    "gcn": {"scores": [1, 21, 224, 224]},
    "resnet18": {"logits": [1, 1000]},
    "csrnet": {"density": [1, 64, 14, 14]},
    "longformer": {"y": [1, 2048, 512]},
    "lstm": {"h_next": [1, 256], "c_next": [1, 256]},
    "mobilenetv2": {"logits": [1, 1000]},
    "squeezenet": {"logits": [1, 1000]},
    "shufflenetv2": {"logits": [1, 1000]},
    "bert": {"last_hidden_state": [1, 128, 256]},
    "gpt2": {"last_hidden_state": [1, 128, 256]},
    "vit": {"last_hidden_state": [1, 197, 384]},
}


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The initializers and the values of the Constant nodes (by output name)."""
    nodes = {
        n.output[0]: numpy_helper.to_array(helper.get_attribute_value(n.attribute[0]))
        for n in model.graph.node
        if n.op_type == "Constant"
    }
    return weights(model) | nodes


def _attribute(a: onnx.AttributeProto) -> object:
    """An attribute's value; a tensor (a Constant's shape or mask, whose values and dims hold widths and
    lengths) as its type and rank only."""
    value = helper.get_attribute_value(a)
    return (value.data_type, len(value.dims)) if isinstance(value, onnx.TensorProto) else value


def structure(model: onnx.ModelProto) -> list[tuple]:
    """Op type, name, wiring and attributes of every node; ``group`` only as present or not (it is a width)."""
    return [
        (
            n.op_type,
            n.name,
            list(n.input),
            sorted((a.name, _attribute(a)) for a in n.attribute if a.name != "group"),
            any(a.name == "group" for a in n.attribute),
        )
        for n in model.graph.node
    ]


def test_names_and_errors():
    assert NAMES == [
        "infogan",
        "dcgan",
        "fsrcnn",
        "gcn",
        "resnet18",
        "csrnet",
        "longformer",
        "lstm",
        "mobilenetv2",
        "squeezenet",
        "shufflenetv2",
        "bert",
        "gpt2",
        "vit",
    ]
    with pytest.raises(ValueError, match="choose one of: infogan"):
        build("vgg")
    with pytest.raises(ValueError, match="full, small"):
        build("lstm", size="tiny")
    with pytest.raises(ValueError, match="batch"):
        build("lstm", 0)


def test_builder_keywords_override_the_size():
    """Tests build a transformer with fewer layers: one ViT layer is its attention and MLP once."""
    one, six = build("vit", 1, size="small", layers=1), build("vit", 1, size="small")
    assert [n.op_type for n in one.graph.node].count("Softmax") == 1
    assert [n.op_type for n in six.graph.node].count("Softmax") == 6
    with pytest.raises(TypeError):
        build("vit", 1, size="small", depth=1)


@pytest.mark.parametrize("name", NAMES)
def test_full_structure(name):
    model = build(name, 1)
    onnx.checker.check_model(model, full_check=True)
    assert (model.opset_import[0].version, model.ir_version) == (17, 8)
    assert model.graph.name == name and MODELS[name].title.split()[0] in model.graph.doc_string
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.output}
    assert shapes == FULL_OUTPUTS[name]
    # The small size the tests run has the same nodes, wiring, kernels, strides, paddings and dilations.
    assert structure(build(name, 1, size="small")) == structure(model)


@pytest.mark.parametrize("name", NAMES)
def test_small_runs_deterministic_and_batched(name):
    model = build(name, 1, size="small")
    onnx.checker.check_model(model, full_check=True)
    assert model.SerializeToString() == build(name, 1, size="small").SerializeToString()
    assert model.SerializeToString() != build(name, 1, size="small", seed=1).SerializeToString()
    outs = run(model, sample_inputs(model))
    assert {k: v.shape for k, v in outs.items()} == SMALL_OUTPUTS[name]
    assert all(np.isfinite(v).all() and v.std() > 1e-3 for v in outs.values())
    # Batch 16: same nodes, same weights; only batch dimensions (and shape constants) change.
    big = build(name, 16, size="small")
    assert [(n.op_type, n.name) for n in big.graph.node] == [(n.op_type, n.name) for n in model.graph.node]
    w1, w16 = constants(model), constants(big)
    assert w1.keys() == w16.keys()
    for key, a in w1.items():
        if a.dtype == np.int64 and a.ndim == 1 and not np.array_equal(a, w16[key]):
            assert a[0] == 1 and w16[key][0] == 16 and np.array_equal(a[1:], w16[key][1:]), key
        else:
            assert np.array_equal(a, w16[key]), key
    feeds16 = sample_inputs(big)
    assert all(v.shape[0] == 16 for v in feeds16.values())
    outs16 = run(big, feeds16)
    assert {k: v.shape for k, v in outs16.items()} == {
        k: (16, *s[1:]) for k, s in SMALL_OUTPUTS[name].items()
    }


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_lstm_reference():
    model = build("lstm", 3, size="small")
    feeds = sample_inputs(model, seed=5)
    w = weights(model)
    x, h, c = (feeds[k].astype(np.float64) for k in ("x", "h", "c"))
    gate = {
        g: x @ w[f"gate_{g}.weight_x"] + h @ w[f"gate_{g}.weight_h"] + w[f"gate_{g}.bias"] for g in "ifgo"
    }
    c_next = _sigmoid(gate["f"]) * c + _sigmoid(gate["i"]) * np.tanh(gate["g"])
    h_next = _sigmoid(gate["o"]) * np.tanh(c_next)
    outs = run(model, feeds)
    np.testing.assert_allclose(outs["c_next"], c_next, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs["h_next"], h_next, rtol=1e-4, atol=1e-5)
    assert 0.05 < np.abs(gate["g"]).mean() < 2.0  # tanh is neither linear-only nor saturated


def test_csrnet_reference():
    model = build("csrnet", 1, size="small")
    feeds = sample_inputs(model, seed=2)
    w = weights(model)
    x = feeds["features"][0].astype(np.float64)
    for k in range(1, 7):
        wk, bk = w[f"conv{k}.weight"], w[f"conv{k}.bias"]
        size = x.shape[-1]
        xp = np.pad(x, ((0, 0), (2, 2), (2, 2)))
        y = np.zeros((wk.shape[0], size, size)) + bk[:, None, None]
        for dy in range(3):
            for dx in range(3):
                patch = xp[:, 2 * dy : 2 * dy + size, 2 * dx : 2 * dx + size]
                y += np.einsum("oc,chw->ohw", wk[:, :, dy, dx], patch)
        x = np.maximum(y, 0.0)
    np.testing.assert_allclose(run(model, feeds)["density"][0], x, rtol=1e-4, atol=1e-4)


def _layer_norm(x, gamma, beta):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * gamma + beta


def longformer_reference(w: dict[str, np.ndarray], x: np.ndarray, n, hidden, heads, win, d) -> np.ndarray:
    """Dilated band attention computed directly: key i + (j - win) * d, score 0 outside the sequence."""
    dh, bs = hidden // heads, x.shape[0]
    lin = {
        k: x @ w[f"attention.weight{s}"] + w[f"attention.bias{s}"]
        for k, s in zip("qkv", ("", "_2", "_3"), strict=True)
    }
    q, k, v = (lin[t].reshape(bs, n, heads, dh).transpose(0, 2, 1, 3) for t in "qkv")
    q = q / math.sqrt(dh)
    out = np.zeros_like(q)
    for i in range(n):
        keys = i + (np.arange(2 * win + 1) - win) * d
        inside = (keys >= 0) & (keys < n)
        kk = np.where(inside[:, None], k[:, :, np.clip(keys, 0, n - 1)], 0.0)  # [bs, H, 2w+1, dh]
        vv = np.where(inside[:, None], v[:, :, np.clip(keys, 0, n - 1)], 0.0)
        scores = np.einsum("bhd,bhjd->bhj", q[:, :, i], kk)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, :, i] = np.einsum("bhj,bhjd->bhd", p, vv)
    o = out.transpose(0, 2, 1, 3).reshape(bs, n, hidden)
    x1 = o @ w["attention.weight_4"] + w["attention.bias_4"] + x
    x1 = _layer_norm(x1, w["attention.scale"], w["attention.bias_5"])
    y = np.maximum(x1 @ w["ffn.weight"] + w["ffn.bias"], 0) @ w["ffn.weight_2"] + w["ffn.bias_2"]
    return _layer_norm(y + x1, w["ffn.scale"], w["ffn.bias_3"])


@pytest.mark.parametrize("gather_elements", [False, True])
def test_longformer_reference(gather_elements):
    p = SMALL["longformer"]
    model = build("longformer", 2, size="small", gather_elements=gather_elements)
    onnx.checker.check_model(model, full_check=True)
    assert ("GatherElements" in {n.op_type for n in model.graph.node}) == gather_elements
    feeds = sample_inputs(model, seed=3)
    w = {k: v.astype(np.float64) for k, v in weights(model).items() if v.dtype == np.float32}
    ref = longformer_reference(
        w, feeds["x"].astype(np.float64), p["n"], p["hidden"], p["heads"], p["w"], p["d"]
    )
    np.testing.assert_allclose(run(model, feeds)["y"], ref, rtol=1e-4, atol=1e-4)


def test_band_indices():
    idx_s, idx_v = band_indices(5, 2, 3)
    N = 5 + 2 * 2 * 3
    assert idx_v.shape == (5, 5) and idx_v[2].tolist() == [2, 5, 8, 11, 14]
    assert np.array_equal(idx_s, np.arange(5)[:, None] * N + idx_v)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in ("gpt2", "vit") else n for n in NAMES]
)
def test_round_trip(name):
    """Every small model (each op kind of the full one) survives `einopt optimize`, search included, and
    stays equal (the search is bounded to keep the suite short; nothing is timed: every searched part
    still goes through selection and verification, and every verified rewrite is kept)."""
    _round_trip(name, "verified")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_round_trip_measured(name):
    """The same with measured acceptance: cost stage, timed selection, whole-model rounds and the
    confirmation on every model (the slow tier). A shorter search and shorter timings than the quick
    tier's round trip, which searches the same parts: what is kept is not asserted."""
    limits = {"states_per_search": 150, "states_per_model": 400, "part_budget_s": 0.25, "model_budget_s": 2.0}
    _round_trip(name, "measured", **limits)


def _round_trip(name: str, accept: str, **limits) -> None:
    """``limits``: Options over the quick tier's search of 200 states a part, 600 a model."""
    model = build(name, 1, size="small")
    limits = {"states_per_search": 200, "states_per_model": 600} | limits
    options = Options(seed=0, accept=accept, **limits)
    result = optimize(model, options)
    assert result.verified, (result.blocked, result.notes)
    onnx.checker.check_model(result.model)
    feeds = sample_inputs(model, seed=7)
    comparison = compare(run(model, feeds), run(result.model, feeds), Tolerance())
    assert comparison.ok, comparison.message


def test_write_files(tmp_path):
    path = write("csrnet", 2, tmp_path, size="small")
    assert path == tmp_path / "csrnet_bs2_small.onnx"
    model = onnx.load(path)
    assert model.SerializeToString() == build("csrnet", 2, size="small").SerializeToString()
    with np.load(path.with_suffix(".npz")) as data:
        assert list(data.files) == ["features"] and data["features"].shape == (2, 16, 8, 8)
        assert np.array_equal(data["features"], sample_inputs(model)["features"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csrnet_bs2_small.npz", "csrnet_bs2_small.onnx"]
    with pytest.raises(ValueError):
        write("nope", 1, tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


def test_cli_list():
    result = CliRunner().invoke(main, ["models", "--size", "small"])
    assert result.exit_code == 0, result.output
    for name in NAMES:
        assert name in result.output
    assert "[bs,228,1,1]" in result.output


def test_cli_write(tmp_path):
    args = ["models", "lstm", "fsrcnn", "-b", "1", "-b", "16", "--size", "small", "-o", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    stems = [f"{m}_bs{b}_small" for m in ("lstm", "fsrcnn") for b in (1, 16)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{s}.{e}" for s in stems for e in ("onnx", "npz")
    )
    feeds = dict(np.load(tmp_path / "fsrcnn_bs16_small.npz"))
    assert run(onnx.load(tmp_path / "fsrcnn_bs16_small.onnx"), feeds)["highres"].shape == (16, 1, 32, 32)


@pytest.mark.parametrize(
    "args, message",
    [(["models", "vgg16"], "unknown model 'vgg16'"), (["models", "lstm", "-b", "0"], "positive")],
)
def test_cli_bad_input(args, message):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3
    assert message in result.output and "Traceback" not in result.output

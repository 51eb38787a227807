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
from einopt.models.compact import SMALL as COMPACT_SMALL
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
}


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def structure(model: onnx.ModelProto) -> list[tuple]:
    """Op type, name, wiring and attributes of every node; ``group`` only as present or not (it is a width)."""
    return [
        (
            n.op_type,
            n.name,
            list(n.input),
            sorted((a.name, helper.get_attribute_value(a)) for a in n.attribute if a.name != "group"),
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
    ]
    with pytest.raises(ValueError, match="choose one of: infogan"):
        build("vgg")
    with pytest.raises(ValueError, match="full, small"):
        build("lstm", size="tiny")
    with pytest.raises(ValueError, match="batch"):
        build("lstm", 0)


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
    w1, w16 = weights(model), weights(big)
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


@pytest.mark.parametrize("name", NAMES)
def test_round_trip(name):
    """Every small model (each op kind of the full one) survives `einopt optimize`, search included, and
    stays equal (the search is bounded to keep the suite short: every searched part still goes
    through selection, verification and acceptance)."""
    model = build(name, 1, size="small")
    result = optimize(model, Options(seed=0, time_budget=20.0, part_search_s=4.0))
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


# -- MobileNetV2 and SqueezeNet 1.1: torchvision's layout, checked node by node and against numpy --


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_mobilenetv2_full_layout():
    model = build("mobilenetv2", 1)
    nodes, w = list(model.graph.node), weights(model)
    count = {op: sum(n.op_type == op for n in nodes) for op in {n.op_type for n in nodes}}
    assert count == {
        "Conv": 52,
        "BatchNormalization": 52,
        "Clip": 35,
        "Add": 10,
        "GlobalAveragePool": 1,
        "Flatten": 1,
        "Gemm": 1,
    }
    consumer = {i: n for n in nodes for i in n.input}
    convs = [n for n in nodes if n.op_type == "Conv"]
    for conv in convs:  # un-fused export: every bias-free Conv feeds a BatchNormalization
        assert len(conv.input) == 2 and consumer[conv.output[0]].op_type == "BatchNormalization"
    depthwise = [n for n in convs if "group" in _attrs(n)]
    assert [n.name.split(".")[-2] for n in depthwise] == ["depthwise"] * 17
    for conv in depthwise:
        out_c, in_per_group, kh, kw = w[conv.input[1]].shape
        assert (_attrs(conv)["group"], in_per_group, kh, kw) == (out_c, 1, 3, 3)
        assert _attrs(conv)["pads"] == [1, 1, 1, 1]
    # Stride 2: the stem and the first block of the t/c/n/s rows with s = 2.
    strided = [n.name for n in convs if _attrs(n)["strides"] == [2, 2]]
    assert strided == ["features.0.conv"] + [f"features.{i}.depthwise.conv" for i in (2, 4, 7, 14)]
    widths = [w[n.input[1]].shape[0] for n in convs if n.name.endswith("project.conv")]
    assert widths == [16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 160, 160, 160, 320]
    assert w["features.18.weight"].shape == (1280, 320, 1, 1) and w["classifier.weight"].shape == (1000, 1280)
    for clip in (n for n in nodes if n.op_type == "Clip"):  # ReLU6 as torch.onnx.export writes it
        lo, hi = (w[name] for name in clip.input[1:])
        assert lo.shape == hi.shape == () and (float(lo), float(hi)) == (0.0, 6.0)
    # Residual Adds sit on the blocks with stride 1 and equal channels: 1+2+3+2+2 of them.
    adds = [n.name.split(".")[1] for n in nodes if n.op_type == "Add"]
    assert adds == ["3", "5", "6", "8", "9", "10", "12", "13", "15", "16"]
    assert [n.op_type for n in nodes[-3:]] == ["GlobalAveragePool", "Flatten", "Gemm"]


def test_squeezenet_full_layout():
    model = build("squeezenet", 1)
    nodes, w = list(model.graph.node), weights(model)
    count = {op: sum(n.op_type == op for n in nodes) for op in {n.op_type for n in nodes}}
    assert count == {"Conv": 26, "Relu": 26, "Concat": 8, "MaxPool": 3, "GlobalAveragePool": 1, "Flatten": 1}
    pools = [n for n in nodes if n.op_type == "MaxPool"]
    assert [n.name for n in pools] == ["features.2.maxpool", "features.5.maxpool", "features.8.maxpool"]
    for pool in pools:
        assert _attrs(pool) == {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0] * 4, "ceil_mode": 1}
    assert all(_attrs(n)["axis"] == 1 for n in nodes if n.op_type == "Concat")
    fires = [
        (w[f"features.{i}.squeeze.weight"].shape, w[f"features.{i}.expand3x3.weight"].shape)
        for i in (3, 4, 6, 7, 9, 10, 11, 12)
    ]
    assert [(sq[1], sq[0], e3[0]) for sq, e3 in fires] == [
        (64, 16, 64),
        (128, 16, 64),
        (128, 32, 128),
        (256, 32, 128),
        (256, 48, 192),
        (384, 48, 192),
        (384, 64, 256),
        (512, 64, 256),
    ]
    three = [n for n in nodes if n.op_type == "Conv" and _attrs(n)["kernel_shape"] == [3, 3]]
    assert _attrs(three[0])["strides"] == [2, 2] and _attrs(three[0])["pads"] == [0] * 4
    assert all(_attrs(n)["pads"] == [1] * 4 and n.name.endswith("expand3x3.conv") for n in three[1:])
    assert len(three) == 9 and all(len(n.input) == 3 for n in nodes if n.op_type == "Conv")
    assert w["classifier.weight"].shape == (1000, 512, 1, 1)
    assert [n.op_type for n in nodes[-4:]] == ["Conv", "Relu", "GlobalAveragePool", "Flatten"]


@pytest.mark.parametrize("name", ["mobilenetv2", "squeezenet"])
def test_compact_full_size_runs(name):
    """Full size at batch 1 takes well under a second: activations neither vanish nor blow up."""
    model = build(name, 1)
    logits = run(model, sample_inputs(model))["logits"]
    assert logits.shape == (1, 1000) and np.isfinite(logits).all() and 0.3 < logits.std() < 10


def _conv(x, w, b=None, stride=1, pad=0, groups=1):
    """A direct grouped 2-D convolution of ``x [N, C, H, W]`` in float64."""
    n, c, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    xg = xp.reshape(n, groups, c // groups, *xp.shape[2:])
    wg = w.reshape(groups, cout // groups, cg, kh, kw)
    y = np.zeros((n, groups, cout // groups, ho, wo))
    for dy in range(kh):
        for dx in range(kw):
            patch = xg[
                ..., dy : dy + stride * (ho - 1) + 1 : stride, dx : dx + stride * (wo - 1) + 1 : stride
            ]
            y += np.einsum("goc,ngchw->ngohw", wg[..., dy, dx], patch)
    y = y.reshape(n, cout, ho, wo)
    return y if b is None else y + b[:, None, None]


def _max_pool_ceil(x):
    """MaxPool 3 stride 2 with ceil_mode: the last window may hang over the end (and sees only the inside)."""
    h = x.shape[-1]
    out = -(-(h - 3) // 2) + 1
    xp = np.pad(x, ((0, 0), (0, 0), (0, 2 * out + 1 - h), (0, 2 * out + 1 - h)), constant_values=-np.inf)
    windows = [
        xp[..., dy : dy + 2 * out - 1 : 2, dx : dx + 2 * out - 1 : 2] for dy in range(3) for dx in range(3)
    ]
    return np.max(windows, axis=0)


def mobilenetv2_reference(w, x, blocks):
    """torchvision's MobileNetV2 forward pass, weights by scope name (``features.i.expand`` ...)."""

    def conv_bn(x, scope, stride=1, groups=1, relu6=True):
        k = w[f"{scope}.weight"].shape[-1]
        y = _conv(x, w[f"{scope}.weight"], stride=stride, pad=k // 2, groups=groups)
        inv = w[f"{scope}.scale"] / np.sqrt(w[f"{scope}.var"] + 1e-5)
        y = (y - w[f"{scope}.mean"][:, None, None]) * inv[:, None, None] + w[f"{scope}.bias"][:, None, None]
        return np.clip(y, 0.0, 6.0) if relu6 else y

    x = conv_bn(x, "features.0", stride=2)
    i = 1
    for t, c, n, s in blocks:
        for k in range(n):
            stride, cin = (s if k == 0 else 1), x.shape[1]
            y = conv_bn(x, f"features.{i}.expand") if t != 1 else x
            y = conv_bn(y, f"features.{i}.depthwise", stride=stride, groups=y.shape[1])
            y = conv_bn(y, f"features.{i}.project", relu6=False)
            x = x + y if stride == 1 and cin == c else y
            i += 1
    x = conv_bn(x, f"features.{i}").mean(axis=(2, 3))
    return x @ w["classifier.weight"].T + w["classifier.bias"]


def squeezenet_reference(w, x):
    """torchvision's SqueezeNet 1.1 forward pass (Dropout is the identity at inference)."""

    def conv_relu(x, scope, **kw):
        return np.maximum(_conv(x, w[f"{scope}.weight"], w[f"{scope}.bias"], **kw), 0.0)

    x = _max_pool_ceil(conv_relu(x, "features.0", stride=2))
    for i in (3, 4, 5, 6, 7, 8, 9, 10, 11, 12):
        if i in (5, 8):
            x = _max_pool_ceil(x)
            continue
        s = conv_relu(x, f"features.{i}.squeeze")
        x = np.concatenate(
            [conv_relu(s, f"features.{i}.expand1x1"), conv_relu(s, f"features.{i}.expand3x3", pad=1)], 1
        )
    return conv_relu(x, "classifier").mean(axis=(2, 3))


@pytest.mark.parametrize("name", ["mobilenetv2", "squeezenet"])
def test_compact_reference(name):
    model = build(name, 2, size="small")
    feeds = sample_inputs(model, seed=4)
    w = {k: v.astype(np.float64) for k, v in weights(model).items()}
    x = feeds["image"].astype(np.float64)
    if name == "mobilenetv2":
        ref = mobilenetv2_reference(w, x, COMPACT_SMALL["mobilenetv2"]["blocks"])
    else:
        ref = squeezenet_reference(w, x)
    np.testing.assert_allclose(run(model, feeds)["logits"], ref, rtol=1e-4, atol=1e-4)


def test_max_pool_ceil_reference():
    """The reference pool rounds up like ONNX ceil_mode (a 4-wide input gives 2 outputs, not 1)."""
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    assert _max_pool_ceil(x)[0, 0].tolist() == [[10.0, 11.0], [14.0, 15.0]]
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    graph = helper.make_graph(
        [pool],
        "pool",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 9, 9])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((1, 1, 9, 9)).astype(np.float32)
    np.testing.assert_array_equal(run(model, {"x": x})["y"], _max_pool_ceil(x))


def test_cli_write_compact(tmp_path):
    args = [
        "models",
        "mobilenetv2",
        "squeezenet",
        "-b",
        "1",
        "-b",
        "16",
        "--size",
        "small",
        "-o",
        str(tmp_path),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    for name in ("mobilenetv2", "squeezenet"):
        for batch in (1, 16):
            path = tmp_path / f"{name}_bs{batch}_small.onnx"
            feeds = dict(np.load(path.with_suffix(".npz")))
            assert run(onnx.load(path), feeds)["logits"].shape == (batch, 10)
    assert len(list(tmp_path.iterdir())) == 8

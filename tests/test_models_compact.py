"""The compact classifiers (MobileNetV2, SqueezeNet 1.1, ShuffleNetV2): torchvision's layout as
torch.onnx.export writes it, checked node by node, and the small models against numpy references."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

from einopt.cli import main
from einopt.models import build, sample_inputs
from einopt.models.builder import GraphBuilder
from einopt.models.compact import SMALL as COMPACT_SMALL
from einopt.models.compact import build_shufflenetv2
from einopt.runtime.modelio import run


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


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


def test_shufflenetv2_full_layout():
    """torchvision's ShuffleNetV2 x1.0 as torch.onnx.export (TorchScript, opset 17) writes it, node for node."""
    model = build("shufflenetv2", 1)
    nodes, w = list(model.graph.node), weights(model)
    count = {op: sum(n.op_type == op for n in nodes) for op in {n.op_type for n in nodes}}
    assert count == {
        "Conv": 56,
        "Relu": 37,
        "Constant": 110,
        "Reshape": 32,
        "Transpose": 16,
        "Concat": 16,
        "Shape": 13,
        "Gather": 13,
        "Add": 13,
        "Div": 13,
        "Mul": 26,
        "Slice": 26,
        "MaxPool": 1,
        "ReduceMean": 1,
        "Gemm": 1,
    }
    producer = {o: n for n in nodes for o in n.output}
    value = {n.output[0]: numpy_helper.to_array(_attrs(n)["value"]) for n in nodes if n.op_type == "Constant"}
    # 16 channel shuffles: Concat -> Reshape [1,2,c/2,h,w] -> Transpose (swap the groups) -> Reshape [1,c,h,w].
    transposes = [n for n in nodes if n.op_type == "Transpose"]
    sides = [28] * 4 + [14] * 8 + [7] * 4
    widths = [116] * 4 + [232] * 8 + [464] * 4
    for t, c, h in zip(transposes, widths, sides, strict=True):
        assert _attrs(t)["perm"] == [0, 2, 1, 3, 4]
        split = producer[t.input[0]]
        (merge,) = [n for n in nodes if t.output[0] in n.input]
        assert split.op_type == merge.op_type == "Reshape" and producer[split.input[0]].op_type == "Concat"
        assert value[split.input[1]].tolist() == [1, 2, c // 2, h, h]
        assert value[merge.input[1]].tolist() == [1, c, h, h]
    assert [t.name.rsplit(".", 1)[0] for t in transposes] == [
        f"stage{s}.{k}" for s, n in ((2, 4), (3, 8), (4, 4)) for k in range(n)
    ]
    # x.chunk(2, dim=1) in the 13 stride-1 units: two Slices on axis 1 at (C+1)/2 read from Shape.
    slices = [n for n in nodes if n.op_type == "Slice"]
    for first, second in zip(slices[::2], slices[1::2], strict=True):
        assert first.input[0] == second.input[0] and first.input[2] == second.input[1]
        assert value[first.input[1]].tolist() == [0] and value[first.input[3]].tolist() == [1]
        assert producer[second.input[2]].op_type == "Mul" and value[producer[second.input[2]].input[1]] == [2]
        chunk = producer[producer[first.input[2]].input[0]]
        assert chunk.op_type == "Div" and producer[chunk.input[0]].op_type == "Add"
        gather = producer[producer[chunk.input[0]].input[0]]
        assert gather.op_type == "Gather" and producer[gather.input[0]].op_type == "Shape"
        (concat,) = [n for n in nodes if first.output[0] in n.input]
        assert concat.op_type == "Concat" and list(concat.input).index(first.output[0]) == 0
    # BatchNorm folded: every Conv has a bias; 19 depthwise 3x3 (16 branch2, 3 branch1), none followed by a ReLU.
    convs = [n for n in nodes if n.op_type == "Conv"]
    assert all(len(n.input) == 3 for n in convs) and "BatchNormalization" not in count
    consumer = {i: n for n in nodes for i in n.input}
    depthwise = [n for n in convs if "group" in _attrs(n)]
    assert len(depthwise) == 19
    assert all(n.name.endswith(("branch2.3.conv", "branch1.0.conv")) for n in depthwise)
    for conv in depthwise:
        out_c, in_per_group, kh, kw = w[conv.input[1]].shape
        assert (_attrs(conv)["group"], in_per_group, kh, kw) == (out_c, 1, 3, 3)
        assert _attrs(conv)["pads"] == [1, 1, 1, 1] and consumer[conv.output[0]].op_type == "Conv"
    strided = [n.name for n in convs if _attrs(n)["strides"] == [2, 2]]
    assert strided == ["conv1.0.conv"] + [
        f"stage{s}.0.{b}.conv" for s in (2, 3, 4) for b in ("branch1.0", "branch2.3")
    ]
    assert w["stage2.0.branch1.2.weight"].shape == (58, 24, 1, 1)
    assert w["stage3.0.branch2.0.weight"].shape == (116, 116, 1, 1)
    assert w["stage4.3.branch2.5.weight"].shape == (232, 232, 1, 1)
    assert w["conv5.0.weight"].shape == (1024, 464, 1, 1) and w["fc.weight"].shape == (1000, 1024)
    pool = next(n for n in nodes if n.op_type == "MaxPool")
    assert _attrs(pool) == {
        "ceil_mode": 0,
        "dilations": [1, 1],
        "kernel_shape": [3, 3],
        "pads": [1, 1, 1, 1],
        "strides": [2, 2],
    }
    assert [n.op_type for n in nodes[-4:]] == ["Conv", "Relu", "ReduceMean", "Gemm"]
    assert _attrs(nodes[-2]) == {"axes": [2, 3], "keepdims": 0} and _attrs(nodes[-1])["transB"] == 1


@pytest.mark.parametrize(
    "repeats, channels, message",
    [
        ((4, 8), (24, 116, 232, 464, 1024), "3 stages and 5 widths"),
        ((4, 0, 4), (24, 116, 232, 464, 1024), "3 stages and 5 widths"),
        ((4, 8, 4), (24, 116, 231, 464, 1024), "must be even"),
    ],
)
def test_shufflenetv2_bad_sizes(repeats, channels, message):
    with pytest.raises(ValueError, match=message):
        build_shufflenetv2(GraphBuilder("shufflenetv2", 0), 1, repeats, channels, 64, 10)


@pytest.mark.parametrize("name", ["mobilenetv2", "squeezenet", "shufflenetv2"])
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


def _max_pool_pad1(x):
    """MaxPool 3 stride 2 padding 1 (floor mode): the padding never wins a max."""
    h = x.shape[-1]
    out = (h - 1) // 2 + 1
    xp = np.pad(x, ((0, 0), (0, 0), (1, 2 * out - h), (1, 2 * out - h)), constant_values=-np.inf)
    windows = [
        xp[..., dy : dy + 2 * out - 1 : 2, dx : dx + 2 * out - 1 : 2] for dy in range(3) for dx in range(3)
    ]
    return np.max(windows, axis=0)


def shufflenetv2_reference(w, x, repeats):
    """ShuffleNetV2's forward pass (BatchNorm folded into the conv biases), weights by torchvision module name."""

    def conv(x, scope, stride=1, relu=True, depthwise=False):
        k = w[f"{scope}.weight"].shape[-1]
        groups = x.shape[1] if depthwise else 1
        y = _conv(x, w[f"{scope}.weight"], w[f"{scope}.bias"], stride=stride, pad=k // 2, groups=groups)
        return np.maximum(y, 0.0) if relu else y

    def branch2(x, unit, stride):
        y = conv(x, f"{unit}.branch2.0")
        y = conv(y, f"{unit}.branch2.3", stride=stride, relu=False, depthwise=True)
        return conv(y, f"{unit}.branch2.5")

    x = _max_pool_pad1(conv(x, "conv1.0", stride=2))
    for stage, n in zip((2, 3, 4), repeats, strict=True):
        for k in range(n):
            unit = f"stage{stage}.{k}"
            if k == 0:
                kept = conv(conv(x, f"{unit}.branch1.0", 2, relu=False, depthwise=True), f"{unit}.branch1.2")
                new = branch2(x, unit, 2)
            else:
                half = x.shape[1] // 2
                kept, new = x[:, :half], branch2(x[:, half:], unit, 1)
            # The channel shuffle with 2 groups interleaves the two halves: kept0, new0, kept1, new1, ...
            x = np.stack([kept, new], axis=2).reshape(kept.shape[0], -1, *kept.shape[2:])
    x = conv(x, "conv5.0").mean(axis=(2, 3))
    return x @ w["fc.weight"].T + w["fc.bias"]


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


@pytest.mark.parametrize("name", ["mobilenetv2", "squeezenet", "shufflenetv2"])
def test_compact_reference(name):
    model = build(name, 2, size="small")
    feeds = sample_inputs(model, seed=4)
    w = {k: v.astype(np.float64) for k, v in weights(model).items()}
    x = feeds["image"].astype(np.float64)
    if name == "mobilenetv2":
        ref = mobilenetv2_reference(w, x, COMPACT_SMALL["mobilenetv2"]["blocks"])
    elif name == "shufflenetv2":
        ref = shufflenetv2_reference(w, x, COMPACT_SMALL["shufflenetv2"]["repeats"])
    else:
        ref = squeezenet_reference(w, x)
    np.testing.assert_allclose(run(model, feeds)["logits"], ref, rtol=1e-4, atol=1e-4)


def test_max_pool_pad1_reference():
    """The padded reference pool matches ONNX MaxPool pads 1 (odd and even sides, negative inputs)."""
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for side in (7, 8):
        graph = helper.make_graph(
            [pool],
            "pool",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, side, side])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        x = -np.abs(np.random.default_rng(side).standard_normal((1, 2, side, side))).astype(np.float32)
        np.testing.assert_array_equal(run(model, {"x": x})["y"], _max_pool_pad1(x))


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
        "shufflenetv2",
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
    for name in ("mobilenetv2", "squeezenet", "shufflenetv2"):
        for batch in (1, 16):
            path = tmp_path / f"{name}_bs{batch}_small.onnx"
            feeds = dict(np.load(path.with_suffix(".npz")))
            assert run(onnx.load(path), feeds)["logits"].shape == (batch, 10)
    assert len(list(tmp_path.iterdir())) == 12

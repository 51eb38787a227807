"""The compact classifiers: MobileNetV2, SqueezeNet 1.1 and ShuffleNetV2, laid out as torchvision exports them.

They are not part of the EinNet evaluation: they guard the layouts einopt gives
depthwise, grouped and 1x1 convolutions in ONNX Runtime, and (ShuffleNetV2)
channel splits and shuffles between them. Each ``build_*``
takes a :class:`GraphBuilder`, the batch size and a size table (``FULL`` or
``SMALL`` below: the same layers, kernels, strides and paddings with fewer
channels, pixels and classes).
"""

from __future__ import annotations

import math

import onnx

from .builder import GraphBuilder

# MobileNetV2's (expansion t, channels c, repeats n, first stride s) rows, torchvision's at width 1.0.
MOBILENETV2_BLOCKS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
# SqueezeNet 1.1's fire modules as (squeeze, expand) (expand1x1 and expand3x3 both get ``expand``).
SQUEEZENET_FIRES = ((16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256), (64, 256))
# ShuffleNetV2 x1.0: units in stage2, stage3, stage4; widths of conv1, the three stages and conv5.
SHUFFLENETV2_REPEATS = (4, 8, 4)
SHUFFLENETV2_CHANNELS = (24, 116, 232, 464, 1024)

FULL = {
    "mobilenetv2": {
        "stem": 32,
        "blocks": MOBILENETV2_BLOCKS,
        "last": 1280,
        "size": 224,
        "classes": 1000,
    },
    "squeezenet": {"stem": 64, "fires": SQUEEZENET_FIRES, "size": 224, "classes": 1000},
    "shufflenetv2": {
        "repeats": SHUFFLENETV2_REPEATS,
        "channels": SHUFFLENETV2_CHANNELS,
        "size": 224,
        "classes": 1000,
    },
}
SMALL = {
    "mobilenetv2": {
        "stem": 8,
        "blocks": (
            (1, 4, 1, 1),
            (6, 6, 2, 2),
            (6, 8, 3, 2),
            (6, 10, 4, 2),
            (6, 12, 3, 1),
            (6, 16, 3, 2),
            (6, 20, 1, 1),
        ),
        "last": 32,
        "size": 64,
        "classes": 10,
    },
    # 36 pixels make all three ceil-mode max pools round up (17 -> 8 -> 4 -> 2); at 224 none does.
    "squeezenet": {
        "stem": 16,
        "fires": ((4, 8), (4, 8), (6, 12), (6, 12), (8, 16), (8, 16), (8, 16), (8, 16)),
        "size": 36,
        "classes": 10,
    },
    # All 16 units (the same nodes as the full model); 64 pixels leave 2x2 in stage4.
    "shufflenetv2": {
        "repeats": SHUFFLENETV2_REPEATS,
        "channels": (8, 12, 16, 20, 32),
        "size": 64,
        "classes": 10,
    },
}


def _relu6(b: GraphBuilder, x: str) -> str:
    """ReLU6 as ``torch.onnx.export`` writes it (opset >= 11): Clip with scalar constant min and max inputs."""
    return b.op("Clip", [x, b.scalar("min", 0.0), b.scalar("max", 6.0)])


def _conv_bn(
    b: GraphBuilder,
    x: str,
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    groups: int = 1,
    activation: bool = True,
    bn_scale: float = 1.0,
) -> str:
    """torchvision's Conv2dNormActivation, un-fused: Conv (no bias, same padding), BatchNormalization, ReLU6."""
    gain = math.sqrt(2.0) if activation else 1.0
    y = b.conv(x, cin, cout, kernel, stride, kernel // 2, bias=False, gain=gain, groups=groups)
    y = b.batch_norm(y, cout, scale=bn_scale)
    return _relu6(b, y) if activation else y


def _inverted_residual(b: GraphBuilder, x: str, cin: int, cout: int, stride: int, t: int) -> str:
    """1x1 expansion (when ``t > 1``), 3x3 depthwise, linear 1x1 projection; ``x + y`` when shapes allow."""
    hidden = cin * t
    residual = stride == 1 and cin == cout
    y = x
    if t != 1:
        with b.scope("expand"):
            y = _conv_bn(b, y, cin, hidden, 1)
    with b.scope("depthwise"):
        y = _conv_bn(b, y, hidden, hidden, 3, stride, groups=hidden)
    with b.scope("project"):
        # A residual branch ends with a smaller BN scale so that the sum of the blocks stays O(1).
        y = _conv_bn(b, y, hidden, cout, 1, activation=False, bn_scale=0.5 if residual else 1.0)
    return b.op("Add", [x, y]) if residual else y


def _classifier_head(b: GraphBuilder, x: str, cin: int, classes: int) -> str:
    """Global average pool, Flatten, Gemm (torchvision's adaptive pool, flatten, Linear)."""
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    w = b.weight("weight", (classes, cin), cin, 1.0)
    return b.op("Gemm", [x, w, b.weight("bias", (classes,), 1.0, 0.1)], transB=1)


def build_mobilenetv2(
    b: GraphBuilder,
    batch: int,
    stem: int,
    blocks: tuple[tuple[int, int, int, int], ...],
    last: int,
    size: int,
    classes: int,
) -> onnx.ModelProto:
    """MobileNetV2 (torchvision, width 1.0): stem, inverted residual blocks, 1x1 conv, pool, Gemm.

    Node scopes follow torchvision's module indices: ``features.0`` is the stem,
    ``features.1`` ... the blocks (each with ``expand``, ``depthwise``, ``project``), the
    last ``features.N`` the 1x1 conv to ``last`` channels.
    """
    with b.scope("features.0"):
        x = _conv_bn(b, "image", 3, stem, 3, 2)
    cin, index = stem, 1
    for t, c, n, s in blocks:
        for k in range(n):
            with b.scope(f"features.{index}"):
                x = _inverted_residual(b, x, cin, c, s if k == 0 else 1, t)
            cin, index = c, index + 1
    with b.scope(f"features.{index}"):
        x = _conv_bn(b, x, cin, last, 1)
    with b.scope("classifier"):
        x = _classifier_head(b, x, last, classes)
    table = ", ".join(f"[{t},{c},{n},{s}]" for t, c, n, s in blocks)
    doc = (
        f"MobileNetV2 (torchvision layout, un-fused Conv + BatchNormalization): image [{batch},3,{size},{size}] "
        f"-> logits [{batch},{classes}]; stem conv3x3 s2 to {stem} channels, inverted residual blocks "
        f"t/c/n/s {table} (1x1 expansion, 3x3 depthwise with group = channels, linear 1x1 projection, "
        f"residual Add when stride 1 and channels equal), conv1x1 to {last}, ReLU6 as Clip(0, 6) with "
        "constant inputs, global average pool, Flatten, Gemm; torchvision's sizes are stem 32, "
        "c 16/24/32/64/96/160/320, last 1280, 224 pixels, 1000 classes; seeded He-scaled random weights, "
        "BatchNormalization with seeded running statistics (scale halved after the projections that feed "
        "a residual Add, so that the sums stay O(1))."
    )
    return b.model([("image", (batch, 3, size, size))], [(x, "logits", (batch, classes))], doc)


def _fire(b: GraphBuilder, x: str, cin: int, squeeze: int, expand: int) -> str:
    """Squeeze 1x1 + ReLU, then expand 1x1 + ReLU and expand 3x3 (pad 1) + ReLU concatenated on channels."""
    with b.scope("squeeze"):
        s = b.op("Relu", [b.conv(x, cin, squeeze, 1)])
    with b.scope("expand1x1"):
        e1 = b.op("Relu", [b.conv(s, squeeze, expand, 1)])
    with b.scope("expand3x3"):
        e3 = b.op("Relu", [b.conv(s, squeeze, expand, 3, pad=1)])
    return b.op("Concat", [e1, e3], axis=1)


def _max_pool(b: GraphBuilder, x: str) -> str:
    return b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=1)


def build_squeezenet(
    b: GraphBuilder,
    batch: int,
    stem: int,
    fires: tuple[tuple[int, int], ...],
    size: int,
    classes: int,
) -> onnx.ModelProto:
    """SqueezeNet 1.1 (torchvision): conv3x3 s2, ceil-mode max pools, 8 fire modules, conv1x1 classifier.

    Node scopes follow torchvision's module indices (``features.0`` the conv, ``features.2``
    ... the pools and fire modules, ``classifier`` the final conv); Dropout is left out (inference).
    """
    if len(fires) != 8:
        raise ValueError(f"SqueezeNet 1.1 has 8 fire modules, got {len(fires)}")
    with b.scope("features.0"):
        x = b.op("Relu", [b.conv("image", 3, stem, 3, stride=2)])
    with b.scope("features.2"):
        x = _max_pool(b, x)
    cin, index = stem, 3
    for k, (squeeze, expand) in enumerate(fires):
        if k in (2, 4):  # a max pool after the second and the fourth fire module
            with b.scope(f"features.{index}"):
                x = _max_pool(b, x)
            index += 1
        with b.scope(f"features.{index}"):
            x = _fire(b, x, cin, squeeze, expand)
        cin, index = 2 * expand, index + 1
    with b.scope("classifier"):
        x = b.op("Relu", [b.conv(x, cin, classes, 1)])
        x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    table = ", ".join(f"({s},{e})" for s, e in fires)
    doc = (
        f"SqueezeNet 1.1 (torchvision layout): image [{batch},3,{size},{size}] -> logits [{batch},{classes}]; "
        f"conv3x3 s2 to {stem} channels + ReLU, MaxPool 3 s2 ceil_mode, fire modules (squeeze, expand) "
        f"{table} with further max pools after the 2nd and 4th (squeeze 1x1 + ReLU, expand 1x1 + ReLU and expand "
        f"3x3 pad 1 + ReLU, Concat on channels), Dropout omitted, conv1x1 to {classes} + ReLU, global "
        "average pool, Flatten; torchvision's sizes are stem 64, fires (16,64) (16,64) (32,128) (32,128) "
        "(48,192) (48,192) (64,256) (64,256), 224 pixels, 1000 classes; seeded He-scaled random weights."
    )
    return b.model([("image", (batch, 3, size, size))], [(x, "logits", (batch, classes))], doc)


def _halve(pixels: int) -> int:
    """The side after a 3x3 window with stride 2 and padding 1 (conv1, the max pool, a strided unit)."""
    return (pixels - 1) // 2 + 1


def _conv_relu(b: GraphBuilder, x: str, cin: int, cout: int, kernel: int = 1, stride: int = 1) -> str:
    """Conv (same padding) + ReLU; the eval-mode BatchNormalization after it is folded into its bias at export."""
    return b.op("Relu", [b.conv(x, cin, cout, kernel, stride, kernel // 2)])


def _depthwise(b: GraphBuilder, x: str, channels: int, stride: int) -> str:
    """3x3 depthwise Conv (group = channels, pad 1) with its BatchNormalization folded in; no activation."""
    return b.conv(x, channels, channels, 3, stride, 1, gain=1.0, groups=channels)


def _chunk2(b: GraphBuilder, x: str) -> tuple[str, str]:
    """``x.chunk(2, dim=1)`` as the TorchScript exporter writes it (opset 13+), even with static shapes.

    The channel count is read at run time (Shape, Gather), the chunk size is ``(C + 1) / 2``
    (Add, Div), and two Slices on axis 1 end at ``1 * size`` and ``2 * size`` (Mul); every
    index is a ``Constant`` node.
    """
    shape = b.op("Shape", [x])
    axis = b.constant_node([1])
    dim = b.op("Gather", [shape, axis], axis=0)
    start = b.constant_node([0])
    size = b.op("Div", [b.op("Add", [dim, b.constant_node([1])]), b.constant_node([2])])
    middle = b.op("Mul", [size, b.constant_node([1])])
    first = b.op("Slice", [x, start, middle, axis])
    end = b.op("Mul", [size, b.constant_node([2])])
    return first, b.op("Slice", [x, middle, end, axis])


def _channel_shuffle(b: GraphBuilder, x: str, batch: int, channels: int, pixels: int) -> str:
    """``view(n, 2, c/2, h, w)``, ``transpose(1, 2)``, ``view(n, c, h, w)``: Reshape, Transpose, Reshape.

    With static input shapes the exporter folds ``x.size()`` into the shapes: Constant nodes.
    """
    x = b.op("Reshape", [x, b.constant_node([batch, 2, channels // 2, pixels, pixels])], allowzero=0)
    x = b.op("Transpose", [x], perm=[0, 2, 1, 3, 4])
    return b.op("Reshape", [x, b.constant_node([batch, channels, pixels, pixels])], allowzero=0)


def _shuffle_unit(b: GraphBuilder, x: str, batch: int, cin: int, cout: int, stride: int, pixels: int) -> str:
    """torchvision's ShuffleNetV2 InvertedResidual: two branches of ``cout / 2`` channels, Concat, shuffle.

    Stride 1 splits the input in two: the first half passes through, the second goes through
    branch2 (1x1 + ReLU, 3x3 depthwise, 1x1 + ReLU). Stride 2 feeds the whole input to both
    branch1 (3x3 depthwise s2, 1x1 + ReLU) and branch2 (its depthwise with stride 2). Scopes
    are the branches' module indices (``branch2.3`` is the depthwise conv).
    """
    half = cout // 2
    if stride == 1:
        kept, x = _chunk2(b, x)
        cin = half
    else:
        with b.scope("branch1.0"):
            kept = _depthwise(b, x, cin, stride)
        with b.scope("branch1.2"):
            kept = _conv_relu(b, kept, cin, half)
    with b.scope("branch2.0"):
        y = _conv_relu(b, x, cin, half)
    with b.scope("branch2.3"):
        y = _depthwise(b, y, half, stride)
    with b.scope("branch2.5"):
        y = _conv_relu(b, y, half, half)
    y = b.op("Concat", [kept, y], axis=1)
    return _channel_shuffle(b, y, batch, cout, pixels if stride == 1 else _halve(pixels))


def build_shufflenetv2(
    b: GraphBuilder,
    batch: int,
    repeats: tuple[int, int, int],
    channels: tuple[int, int, int, int, int],
    size: int,
    classes: int,
) -> onnx.ModelProto:
    """ShuffleNetV2 (torchvision) as ``torch.onnx.export(dynamo=False, opset_version=17)`` writes it.

    conv1 (3x3 s2) + ReLU, MaxPool 3 s2 pad 1, ``repeats`` units per stage (the first with
    stride 2), conv5 (1x1) + ReLU, ``x.mean([2, 3])`` as ReduceMean, fc as Gemm. BatchNorm is
    folded into the convolutions (eval mode); node scopes follow torchvision's module names
    (``conv1.0``, ``stage2.0.branch2.3``, ``conv5.0``, ``fc``).
    """
    if len(repeats) != 3 or len(channels) != 5 or min(repeats) < 1:
        raise ValueError(
            f"ShuffleNetV2 has 3 stages and 5 widths, got repeats {repeats} and channels {channels}"
        )
    if any(c % 2 for c in channels[1:4]):
        raise ValueError(f"the stage widths are split in two halves and must be even, got {channels[1:4]}")
    with b.scope("conv1.0"):
        x = _conv_relu(b, "image", 3, channels[0], 3, 2)
    with b.scope("maxpool"):
        x = b.op(
            "MaxPool",
            [x],
            ceil_mode=0,
            dilations=[1, 1],
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        )
    pixels, cin = _halve(_halve(size)), channels[0]
    for stage, (n, cout) in enumerate(zip(repeats, channels[1:4], strict=True), start=2):
        for k in range(n):
            stride = 2 if k == 0 else 1
            with b.scope(f"stage{stage}.{k}"):
                x = _shuffle_unit(b, x, batch, cin, cout, stride, pixels)
            pixels, cin = (_halve(pixels) if stride == 2 else pixels), cout
    with b.scope("conv5.0"):
        x = _conv_relu(b, x, cin, channels[4])
    x = b.op("ReduceMean", [x], axes=[2, 3], keepdims=0)
    with b.scope("fc"):
        w = b.weight("weight", (classes, channels[4]), channels[4], 1.0)
        x = b.op("Gemm", [x, w, b.weight("bias", (classes,), 1.0, 0.1)], alpha=1.0, beta=1.0, transB=1)
    doc = (
        f"ShuffleNetV2 (torchvision layout, as torch.onnx.export writes it at opset 17 with static shapes): "
        f"image [{batch},3,{size},{size}] -> logits [{batch},{classes}]; conv1 3x3 s2 to {channels[0]} "
        f"channels + ReLU, MaxPool 3 s2 pad 1, stages of {'/'.join(map(str, repeats))} units to "
        f"{'/'.join(map(str, channels[1:4]))} channels (stride-2 first unit: branch1 3x3 depthwise s2 + "
        "1x1 + ReLU next to branch2; stride 1: x.chunk(2, dim=1) as Shape/Gather/Add/Div/Mul and two "
        "Slices, the second half through branch2 1x1 + ReLU, 3x3 depthwise, 1x1 + ReLU; Concat, then the "
        "channel shuffle Reshape [n,2,c/2,h,w], Transpose [0,2,1,3,4], Reshape [n,c,h,w] with Constant "
        f"shapes), conv5 1x1 to {channels[4]} + ReLU, ReduceMean over h, w, Gemm; BatchNorm folded into "
        "the conv biases (eval-mode export); torchvision's x1.0 sizes are repeats 4/8/4, widths "
        "24/116/232/464/1024, 224 pixels, 1000 classes; seeded He-scaled random weights."
    )
    return b.model([("image", (batch, 3, size, size))], [(x, "logits", (batch, classes))], doc)

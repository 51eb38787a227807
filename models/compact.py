"""The compact classifiers: MobileNetV2 and SqueezeNet 1.1, laid out as torchvision exports them.

They are not part of the EinNet evaluation: they guard the layouts einopt gives
depthwise, grouped and 1x1 convolutions in ONNX Runtime. Each ``build_*``
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

FULL = {
    "mobilenetv2": {
        "stem": 32,
        "blocks": MOBILENETV2_BLOCKS,
        "last": 1280,
        "size": 224,
        "classes": 1000,
    },
    "squeezenet": {"stem": 64, "fires": SQUEEZENET_FIRES, "size": 224, "classes": 1000},
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

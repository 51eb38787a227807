"""The convolutional evaluation models: InfoGAN, DCGAN, FSRCNN, CSRNet, ResNet-18 and GCN.

Each ``build_*`` takes a :class:`GraphBuilder`, the batch size and a size
table (``FULL`` or ``SMALL`` below: same structure, fewer channels / pixels).
"""

from __future__ import annotations

import math

import onnx

from .builder import GraphBuilder

FULL = {
    "infogan": {"channels": (228, 448, 256, 128, 64, 3)},
    "dcgan": {"channels": (100, 512, 256, 128, 64, 3)},
    "fsrcnn": {"d": 56, "s": 12, "size": 32},
    "csrnet": {"channels": (512, 512, 512, 512, 256, 128, 64), "size": 14},
    "resnet18": {"widths": (64, 128, 256, 512), "size": 224, "classes": 1000},
    "gcn": {"widths": (64, 128, 256, 512), "size": 224, "classes": 21, "k": 15},
}
SMALL = {
    "infogan": {"channels": (12, 16, 12, 8, 8, 3)},
    "dcgan": {"channels": (10, 16, 12, 8, 8, 3)},
    "fsrcnn": {"d": 8, "s": 4, "size": 8},
    "csrnet": {"channels": (16, 16, 16, 16, 12, 8, 8), "size": 8},
    "resnet18": {"widths": (4, 8, 8, 16), "size": 32, "classes": 10},
    "gcn": {"widths": (4, 8, 8, 16), "size": 64, "classes": 5, "k": 15},
}


def build_infogan(b: GraphBuilder, batch: int, channels: tuple[int, ...]) -> onnx.ModelProto:
    """InfoGAN generator: ConvTranspose k2 s1 then four k4 s2 p1, ReLU between, Tanh at the end."""
    x = "z"
    for k, (cin, cout) in enumerate(zip(channels[:-1], channels[1:], strict=True)):
        last = k == len(channels) - 2
        with b.scope(f"deconv{k + 1}"):
            kernel, stride, pad = (2, 1, 0) if k == 0 else (4, 2, 1)
            x = b.conv_transpose(x, cin, cout, kernel, stride, pad, gain=1.0 if last else math.sqrt(2.0))
            x = b.op("Tanh" if last else "Relu", [x])
    size = 2 * 2 ** (len(channels) - 2)
    doc = (
        f"InfoGAN generator (EinNet evaluation): latent [{batch},{channels[0]},1,1] -> image "
        f"[{batch},{channels[-1]},{size},{size}]; ConvTranspose k2 s1 p0 then k4 s2 p1 layers with ReLU, "
        "Tanh output; seeded random weights."
    )
    return b.model(
        [("z", (batch, channels[0], 1, 1))], [(x, "image", (batch, channels[-1], size, size))], doc
    )


def build_dcgan(b: GraphBuilder, batch: int, channels: tuple[int, ...]) -> onnx.ModelProto:
    """DCGAN generator: ConvTranspose k4 s1 p0 then k4 s2 p1, BatchNorm + ReLU between, Tanh at the end."""
    x = "z"
    for k, (cin, cout) in enumerate(zip(channels[:-1], channels[1:], strict=True)):
        last = k == len(channels) - 2
        with b.scope(f"deconv{k + 1}"):
            stride, pad = (1, 0) if k == 0 else (2, 1)
            x = b.conv_transpose(x, cin, cout, 4, stride, pad, gain=1.0 if last else math.sqrt(2.0))
            if not last:
                x = b.op("Relu", [b.batch_norm(x, cout)])
            else:
                x = b.op("Tanh", [x])
    size = 4 * 2 ** (len(channels) - 2)
    doc = (
        f"DCGAN generator (EinNet evaluation): latent [{batch},{channels[0]},1,1] -> image "
        f"[{batch},{channels[-1]},{size},{size}]; ConvTranspose k4 s1 p0 then k4 s2 p1 layers with "
        "BatchNormalization (seeded running statistics) + ReLU, Tanh output; seeded random weights."
    )
    return b.model(
        [("z", (batch, channels[0], 1, 1))], [(x, "image", (batch, channels[-1], size, size))], doc
    )


def _prelu(b: GraphBuilder, x: str, channels: int) -> str:
    return b.op("PRelu", [x, b.uniform("slope", (channels, 1, 1), 0.0, 0.5)])


def build_fsrcnn(b: GraphBuilder, batch: int, d: int, s: int, size: int) -> onnx.ModelProto:
    """FSRCNN x4: feature extraction, shrinking, 4 mapping layers, expanding, ConvTranspose k9 s4."""
    layers = [("extract", 1, d, 5), ("shrink", d, s, 1)]
    layers += [(f"map{k + 1}", s, s, 3) for k in range(4)]
    layers += [("expand", s, d, 1)]
    x = "lowres"
    for name, cin, cout, kernel in layers:
        with b.scope(name):
            x = _prelu(b, b.conv(x, cin, cout, kernel, pad=kernel // 2), cout)
    with b.scope("deconv"):
        x = b.conv_transpose(x, d, 1, 9, 4, 4, output_padding=3, gain=1.0)
    out = 4 * size
    doc = (
        f"FSRCNN x4 super-resolution (EinNet evaluation): [{batch},1,{size},{size}] -> [{batch},1,{out},{out}]; "
        f"Conv5x5 1->{d}, 1x1 {d}->{s}, four 3x3 {s}->{s}, 1x1 {s}->{d}, each with per-channel PRelu "
        "(slopes in [0, 0.5]), ConvTranspose k9 s4 p4 output_padding 3; seeded random weights."
    )
    return b.model([("lowres", (batch, 1, size, size))], [(x, "highres", (batch, 1, out, out))], doc)


def build_csrnet(b: GraphBuilder, batch: int, channels: tuple[int, ...], size: int) -> onnx.ModelProto:
    """CSRNet back end: six 3x3 convs with dilation 2 and padding 2, ReLU after each."""
    x = "features"
    for k, (cin, cout) in enumerate(zip(channels[:-1], channels[1:], strict=True)):
        with b.scope(f"conv{k + 1}"):
            x = b.op("Relu", [b.conv(x, cin, cout, 3, pad=2, dilation=2)])
    doc = (
        f"CSRNet back end (EinNet evaluation): features [{batch},{channels[0]},{size},{size}] -> "
        f"[{batch},{channels[-1]},{size},{size}]; six 3x3 convs with dilation 2, padding 2 "
        f"({' -> '.join(map(str, channels))}), ReLU after each; seeded random weights."
    )
    return b.model(
        [("features", (batch, channels[0], size, size))],
        [(x, "density", (batch, channels[-1], size, size))],
        doc,
    )


# -- ResNet-18 backbone, shared by resnet18 and gcn ---------------------------------------------


def _basic_block(b: GraphBuilder, x: str, cin: int, cout: int, stride: int) -> str:
    y = b.op("Relu", [b.batch_norm(b.conv(x, cin, cout, 3, stride, 1, bias=False), cout)])
    # The residual branch ends with a smaller BN scale so that the sum of 8 blocks stays O(1).
    y = b.batch_norm(b.conv(y, cout, cout, 3, 1, 1, bias=False), cout, scale=0.5)
    if stride != 1 or cin != cout:
        with b.scope("downsample"):
            x = b.batch_norm(b.conv(x, cin, cout, 1, stride, 0, bias=False, gain=1.0), cout)
    return b.op("Relu", [b.op("Add", [y, x])])


def resnet18_backbone(b: GraphBuilder, x: str, widths: tuple[int, ...]) -> list[str]:
    """Stem (conv7x7 s2 + BN + ReLU + maxpool) and 4 stages of 2 BasicBlocks; returns the stage outputs."""
    with b.scope("stem"):
        x = b.op("Relu", [b.batch_norm(b.conv(x, 3, widths[0], 7, 2, 3, bias=False), widths[0])])
        x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    stages, cin = [], widths[0]
    for s, cout in enumerate(widths):
        for k in range(2):
            with b.scope(f"layer{s + 1}.{k}"):
                x = _basic_block(b, x, cin, cout, 2 if (k == 0 and s > 0) else 1)
            cin = cout
        stages.append(x)
    return stages


def build_resnet18(
    b: GraphBuilder, batch: int, widths: tuple[int, ...], size: int, classes: int
) -> onnx.ModelProto:
    """ResNet-18 classifier: backbone, global average pool, Flatten, Gemm."""
    x = resnet18_backbone(b, "image", widths)[-1]
    with b.scope("head"):
        x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
        w = b.weight("weight", (classes, widths[-1]), widths[-1], 1.0)
        x = b.op("Gemm", [x, w, b.weight("bias", (classes,), 1.0, 0.1)], transB=1)
    doc = (
        f"ResNet-18 (EinNet evaluation): image [{batch},3,{size},{size}] -> logits [{batch},{classes}]; "
        f"conv7x7 s2 + maxpool, 4 stages of 2 BasicBlocks (widths {widths}) with BatchNormalization and "
        "1x1 downsampling convs, global average pool, Flatten, Gemm; seeded random weights."
    )
    return b.model([("image", (batch, 3, size, size))], [(x, "logits", (batch, classes))], doc)


def _global_conv(b: GraphBuilder, x: str, cin: int, cout: int, k: int) -> str:
    """The GCN block: (k x 1 then 1 x k) + (1 x k then k x 1), same padding."""
    p = k // 2
    with b.scope("left"):
        left = b.conv(
            b.conv(x, cin, cout, (k, 1), pad=(p, 0), gain=1.0), cout, cout, (1, k), pad=(0, p), gain=1.0
        )
    with b.scope("right"):
        right = b.conv(
            b.conv(x, cin, cout, (1, k), pad=(0, p), gain=1.0), cout, cout, (k, 1), pad=(p, 0), gain=1.0
        )
    return b.op("Add", [left, right])


def _boundary_refine(b: GraphBuilder, x: str, channels: int) -> str:
    """The BR block: ``x + conv3x3(relu(conv3x3(x)))``."""
    y = b.conv(
        b.op("Relu", [b.conv(x, channels, channels, 3, pad=1)]), channels, channels, 3, pad=1, gain=0.5
    )
    return b.op("Add", [x, y])


def build_gcn(
    b: GraphBuilder, batch: int, widths: tuple[int, ...], size: int, classes: int, k: int
) -> onnx.ModelProto:
    """GCN segmentation (Peng et al. 2017) on a ResNet-18 backbone."""
    stages = resnet18_backbone(b, "image", widths)
    scores = []
    for s, (x, cin) in enumerate(zip(stages, widths, strict=True)):
        with b.scope(f"gcn{s + 1}"):
            scores.append(_boundary_refine(b, _global_conv(b, x, cin, classes, k), classes))
    x = scores[-1]
    for s in range(len(scores) - 2, -1, -1):  # 1/32 -> 1/16 -> 1/8 -> 1/4, adding each stage's scores
        with b.scope(f"up{s + 1}"):
            x = b.conv_transpose(x, classes, classes, 4, 2, 1, gain=1.0)
            x = _boundary_refine(b, b.op("Add", [x, scores[s]]), classes)
    for s in range(2):  # 1/4 -> 1/2 -> 1
        with b.scope(f"final{s + 1}"):
            x = _boundary_refine(b, b.conv_transpose(x, classes, classes, 4, 2, 1, gain=1.0), classes)
    doc = (
        f"GCN semantic segmentation (Peng et al., 'Large Kernel Matters', EinNet evaluation) on a ResNet-18 "
        f"backbone (widths {widths}): image [{batch},3,{size},{size}] -> scores [{batch},{classes},{size},{size}]; "
        f"global convolution blocks (k={k}: kx1 then 1xk plus 1xk then kx1) and boundary refinement on each "
        "stage output, ConvTranspose k4 s2 p1 upsampling added stage by stage; seeded random weights."
    )
    return b.model([("image", (batch, 3, size, size))], [(x, "scores", (batch, classes, size, size))], doc)

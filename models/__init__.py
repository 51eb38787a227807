"""The evaluation models of einopt (EinNet's, plus MobileNetV2, SqueezeNet and ShuffleNetV2), as seeded ONNX generators.

Every model is built with plain ``onnx.helper`` (opset 17, IR version 8,
float32) with deterministic He-scaled random weights::

    from einopt.models import MODELS, build, write
    model = build("dcgan", batch=16)               # an onnx.ModelProto
    path = write("lstm", 1, "build/models")        # lstm_bs1.onnx + lstm_bs1.npz

``size="small"`` gives the same structure (every op kind, kernel, stride,
dilation and padding) with few channels, pixels and tokens, for tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from einopt.runtime.inputs import random_inputs
from einopt.runtime.modelio import write_atomic

from . import compact, sequence, transformer, vision
from .builder import GraphBuilder

SIZES = ("full", "small")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One evaluation model: its name, a title, a one-line description, its builder and inputs."""

    name: str
    title: str
    description: str
    build: Callable[..., onnx.ModelProto]
    inputs: str


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "infogan",
            "InfoGAN generator",
            "ConvTranspose 228->448->256->128->64->3, ReLU, Tanh: [bs,228,1,1] -> [bs,3,32,32]",
            vision.build_infogan,
            "z [bs,228,1,1]",
        ),
        ModelSpec(
            "dcgan",
            "DCGAN generator",
            "ConvTranspose 100->512->256->128->64->3, BatchNorm+ReLU, Tanh: [bs,100,1,1] -> [bs,3,64,64]",
            vision.build_dcgan,
            "z [bs,100,1,1]",
        ),
        ModelSpec(
            "fsrcnn",
            "FSRCNN x4 super-resolution",
            "Conv5x5/1x1/3x3 + PRelu (d=56, s=12), ConvTranspose k9 s4: [bs,1,32,32] -> [bs,1,128,128]",
            vision.build_fsrcnn,
            "lowres [bs,1,32,32]",
        ),
        ModelSpec(
            "gcn",
            "GCN segmentation (ResNet-18 backbone)",
            "ResNet-18 + global conv k=15 + boundary refinement + ConvTranspose: [bs,3,224,224] -> [bs,21,224,224]",
            vision.build_gcn,
            "image [bs,3,224,224]",
        ),
        ModelSpec(
            "resnet18",
            "ResNet-18",
            "conv7x7, maxpool, 4 stages of 2 BasicBlocks, avgpool, Gemm: [bs,3,224,224] -> [bs,1000]",
            vision.build_resnet18,
            "image [bs,3,224,224]",
        ),
        ModelSpec(
            "csrnet",
            "CSRNet back end",
            "six dilated (d=2) 3x3 convs 512->512x3->256->128->64 + ReLU: [bs,512,14,14] -> [bs,64,14,14]",
            vision.build_csrnet,
            "features [bs,512,14,14]",
        ),
        ModelSpec(
            "longformer",
            "Longformer attention layer",
            "dilated band attention (n=2048, D=512, H=8, w=24, d=4) + FFN: [bs,2048,512] -> [bs,2048,512]",
            sequence.build_longformer,
            "x [bs,2048,512]",
        ),
        ModelSpec(
            "lstm",
            "LSTM cell",
            "8 gate MatMuls, sigmoid/tanh, c'=f*c+i*g, h'=o*tanh(c'): x, h, c [bs,256] -> h', c' [bs,256]",
            sequence.build_lstm,
            "x, h, c [bs,256]",
        ),
        ModelSpec(
            "mobilenetv2",
            "MobileNetV2",
            "conv3x3 s2, 17 inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project; Conv+BatchNorm, "
            "ReLU6 as Clip), conv1x1 1280, avgpool, Gemm: [bs,3,224,224] -> [bs,1000]",
            compact.build_mobilenetv2,
            "image [bs,3,224,224]",
        ),
        ModelSpec(
            "squeezenet",
            "SqueezeNet 1.1",
            "conv3x3 s2, 3 ceil-mode maxpools, 8 fire modules (squeeze 1x1, expand 1x1 + 3x3, Concat), "
            "conv1x1 1000 + ReLU, avgpool: [bs,3,224,224] -> [bs,1000]",
            compact.build_squeezenet,
            "image [bs,3,224,224]",
        ),
        ModelSpec(
            "shufflenetv2",
            "ShuffleNetV2 x1.0",
            "conv3x3 s2, maxpool, 16 units in stages of 4/8/4 (channel split as Slices, 1x1 + 3x3 depthwise "
            "+ 1x1 branches, Concat, channel shuffle as Reshape/Transpose/Reshape), conv1x1 1024, "
            "ReduceMean, Gemm: [bs,3,224,224] -> [bs,1000]",
            compact.build_shufflenetv2,
            "image [bs,3,224,224]",
        ),
        ModelSpec(
            "bert",
            "BERT encoder",
            "4 post-LayerNorm layers (hidden 256, 4 heads, FFN 1024, exact GELU as Erf), additive attention "
            "mask, TorchScript exporter's nodes: [bs,128,256] + mask [bs,1,1,128] -> [bs,128,256]",
            transformer.build_bert,
            "hidden_states [bs,128,256], attention_mask [bs,1,1,128]",
        ),
        ModelSpec(
            "gpt2",
            "GPT-2 decoder stack",
            "4 pre-LayerNorm blocks (hidden 256, 4 heads), fused QKV Gemm + Split, causal mask as Where, "
            "GELU tanh form, final LayerNorm, TorchScript exporter's nodes: [bs,128,256] -> [bs,128,256]",
            transformer.build_gpt2,
            "hidden_states [bs,128,256]",
        ),
        ModelSpec(
            "vit",
            "ViT encoder",
            "patch 16 Conv, class token, position embedding, 6 pre-LayerNorm blocks (hidden 384, 6 heads, "
            "MLP 1536, exact GELU), final LayerNorm, dynamo exporter's nodes: [bs,3,224,224] -> [bs,197,384]",
            transformer.build_vit,
            "pixel_values [bs,3,224,224]",
        ),
    )
}

_PARAMS = {
    "full": {**vision.FULL, **sequence.FULL, **compact.FULL, **transformer.FULL},
    "small": {**vision.SMALL, **sequence.SMALL, **compact.SMALL, **transformer.SMALL},
}


def _check(name: str, size: str, batch: int) -> None:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of: {', '.join(SIZES)}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")


def build(name: str, batch: int = 1, *, size: str = "full", seed: int = 0, **options) -> onnx.ModelProto:
    """Build an evaluation model.

    Parameters
    ----------
    name : str
        One of ``MODELS``.
    batch : int
        The batch size (the first dimension of every input and output).
    size : {"full", "small"}
        ``"full"`` is the evaluation size; ``"small"`` the same structure, reduced, for tests.
    seed : int
        Seed of the random weights (the same seed gives the same bytes).
    **options
        Builder keywords, over the size's parameters (``layers=1`` for a transformer,
        ``gather_elements=True`` for longformer; tests only).

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    ValueError
        Unknown name or size, or a bad batch.
    """
    _check(name, size, batch)
    graph = name if size == "full" else f"{name}_small"
    return MODELS[name].build(GraphBuilder(graph, seed), batch, **(_PARAMS[size][name] | options))


def sample_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal float32 inputs for every graph input of ``model``, by name.

    The same arrays ``einopt optimize --seed`` verifies with (:func:`einopt.runtime.inputs.random_inputs`).
    """
    return random_inputs(model, seed)


def file_stem(name: str, batch: int, size: str = "full") -> str:
    """``NAME_bsN`` (``NAME_bsN_small`` for the small size)."""
    return f"{name}_bs{batch}" + ("" if size == "full" else f"_{size}")


def write(name: str, batch: int, out_dir: str | Path, *, size: str = "full", seed: int = 0) -> Path:
    """Write ``NAME_bsN.onnx`` and its sample inputs ``NAME_bsN.npz`` (by graph input name) into ``out_dir``.

    Both files are written atomically (a temporary file renamed into place).

    Returns
    -------
    Path
        The ``.onnx`` path; ``path.with_suffix(".npz")`` holds the inputs.
    """
    model = build(name, batch, size=size, seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{file_stem(name, batch, size)}.onnx"
    inputs = sample_inputs(model, seed)
    data = model.SerializeToString()
    write_atomic(path.with_suffix(".npz"), lambda f: np.savez(f, **inputs))
    write_atomic(path, lambda f: f.write(data))
    return path


__all__ = ["MODELS", "SIZES", "ModelSpec", "build", "file_stem", "sample_inputs", "write"]

"""The transformer models: a BERT encoder, a GPT-2 decoder stack and a ViT encoder, in torch.onnx's node patterns.

Each is written node for node as a ``torch.onnx.export`` of the Hugging Face
module would be at opset 17 (checked against exports of equivalent PyTorch
modules with torch 2.13 and against the real exports in ``../shared/models``):
BERT and GPT-2 as the TorchScript exporter writes them, ViT as the dynamo
exporter does. The two exporters differ in a few habits, collected in
:class:`Exporter`; the layer code is shared. Embedding lookups are left out of
BERT and GPT-2 (their input is the hidden states, as in the encoder stack), so
every input is float and ``einopt optimize``'s seeded inputs fit it.

Each ``build_*`` takes a :class:`GraphBuilder`, the batch size and a size
table (``FULL`` or ``SMALL`` below: the same layers, kernels and strides with
fewer channels and tokens). Weights are seeded and scaled so that activations
stay O(1) (the Hugging Face initialisation, std 0.02, would make every layer
nearly the identity and leave the numerical checks blind).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .builder import GraphBuilder

FULL = {
    "bert": {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "seq": 128},
    "gpt2": {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "seq": 128},
    "vit": {"layers": 6, "hidden": 384, "heads": 6, "ffn": 1536, "image": 224, "patch": 16},
}
# Same layer count (the node list is the same), few channels and tokens; ViT keeps its 16x16 patch.
SMALL = {
    "bert": {"layers": 4, "hidden": 16, "heads": 2, "ffn": 32, "seq": 8},
    "gpt2": {"layers": 4, "hidden": 16, "heads": 2, "ffn": 64, "seq": 8},
    "vit": {"layers": 6, "hidden": 16, "heads": 2, "ffn": 64, "image": 48, "patch": 16},
}

# Hugging Face's LayerNorm epsilons: BERT and ViT 1e-12, GPT-2 1e-5.
BERT_EPS, GPT2_EPS, VIT_EPS = 1e-12, 1e-5, 1e-12


# -- what differs between the two exporters -------------------------------------------------
def _erf_gelu_torchscript(b: GraphBuilder, ex: Exporter, x: str) -> str:
    """``F.gelu`` as TorchScript writes it: ``Mul(Mul(x, Add(Erf(Div(x, sqrt2)), 1)), 0.5)``."""
    erf = b.op("Erf", [b.op("Div", [x, ex.scalar(b, math.sqrt(2.0))])])
    one_plus = b.op("Add", [erf, ex.scalar(b, 1.0)])
    return b.op("Mul", [b.op("Mul", [x, one_plus]), ex.scalar(b, 0.5)])


def _erf_gelu_dynamo(b: GraphBuilder, ex: Exporter, x: str) -> str:
    """``F.gelu`` as dynamo writes it: ``Mul(x, Mul(0.5, Add(Erf(Div(x, sqrt2)), 1)))``."""
    erf = b.op("Erf", [b.op("Div", [x, ex.scalar(b, math.sqrt(2.0))])])
    one_plus = b.op("Add", [erf, ex.scalar(b, 1.0)])
    return b.op("Mul", [x, b.op("Mul", [ex.scalar(b, 0.5), one_plus])])


@dataclasses.dataclass(frozen=True)
class Exporter:
    """The habits in which torch.onnx's TorchScript and dynamo exporters write the same module differently.

    Attributes
    ----------
    name : str
        The exporter, as the model docstrings name it.
    constant_nodes : bool
        TorchScript writes shapes and scalars as ``Constant`` nodes; dynamo folds them into initializers.
    bias_first : bool
        TorchScript writes ``nn.Linear`` as ``Add(bias, MatMul(x, W))``; dynamo as ``Add(MatMul(x, W), bias)``.
    allowzero : int
        The ``allowzero`` attribute of every Reshape (TorchScript 0, dynamo 1; no shape here holds a 0).
    layer_norm : dict
        Extra LayerNormalization attributes (dynamo writes the default ``stash_type=1``).
    erf_gelu : callable
        ``F.gelu`` (exact, erf form), whose Mul order differs.
    """

    name: str
    constant_nodes: bool
    bias_first: bool
    allowzero: int
    layer_norm: dict
    erf_gelu: Callable[[GraphBuilder, Exporter, str], str]

    def ints(self, b: GraphBuilder, values: Sequence[int]) -> str:
        """An int64 vector (a shape, split sizes) in this exporter's form."""
        return b.constant_node(values) if self.constant_nodes else b.ints("shape", values)

    def scalar(self, b: GraphBuilder, value: float) -> str:
        """A 0-d float32 constant in this exporter's form."""
        if self.constant_nodes:
            return self.tensor(b, "scalar", np.array(value, dtype=np.float32))
        return b.scalar("scalar", value)  # 0-d (GraphBuilder.const would store a 1-element vector)

    def tensor(self, b: GraphBuilder, base: str, value: np.ndarray) -> str:
        """A constant of any dtype (a mask) in this exporter's form."""
        if self.constant_nodes:
            return b.op("Constant", [], value=numpy_helper.from_array(value))
        return b.const(base, value)


TORCHSCRIPT = Exporter("TorchScript", True, True, 0, {}, _erf_gelu_torchscript)
DYNAMO = Exporter("dynamo", False, False, 1, {"stash_type": 1}, _erf_gelu_dynamo)


# -- layers ---------------------------------------------------------------------------------
def _linear(b: GraphBuilder, ex: Exporter, x: str, din: int, dout: int, gain: float = 1.0) -> str:
    """``nn.Linear``: MatMul with a [din, dout] weight (the exporters store it transposed) and a bias Add."""
    w = b.weight("weight", (din, dout), din, gain)
    bias = b.weight("bias", (dout,), 1.0, 0.1)
    mm = b.op("MatMul", [x, w])
    return b.op("Add", [bias, mm] if ex.bias_first else [mm, bias])


def _conv1d(
    b: GraphBuilder, ex: Exporter, x: str, lead: Sequence[int], din: int, dout: int, gain: float
) -> str:
    """GPT-2's ``Conv1D`` (``addmm(bias, x.view(-1, din), W)``): Reshape to 2-D, Gemm, Reshape back."""
    w = b.weight("weight", (din, dout), din, gain)
    bias = b.weight("bias", (dout,), 1.0, 0.1)
    flat = _reshape(b, ex, x, [-1, din])
    y = b.op("Gemm", [flat, w, bias], alpha=1.0, beta=1.0)
    return _reshape(b, ex, y, [*lead, dout])


def _reshape(b: GraphBuilder, ex: Exporter, x: str, shape: Sequence[int]) -> str:
    return b.op("Reshape", [x, ex.ints(b, shape)], allowzero=ex.allowzero)


def _layer_norm(b: GraphBuilder, ex: Exporter, x: str, hidden: int, eps: float) -> str:
    gamma = b.uniform("weight", (hidden,), 0.8, 1.2)
    beta = b.weight("bias", (hidden,), 1.0, 0.1)
    return b.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps, **ex.layer_norm)


def _split_heads(b: GraphBuilder, ex: Exporter, x: str, shape: Sequence[int], perm: Sequence[int]) -> str:
    """``x.view(shape)`` then a permutation: [bs, n, D] -> [bs, H, n, dh] (queries, values) or
    [bs, H, dh, n] (keys: the exporters merge ``transpose(1, 2)`` and ``transpose(-1, -2)`` into one)."""
    return b.op("Transpose", [_reshape(b, ex, x, shape)], perm=list(perm))


def _merge_heads(b: GraphBuilder, ex: Exporter, o: str, shape: Sequence[int]) -> str:
    """[bs, H, n, dh] -> [bs, n, H*dh]: ``o.transpose(1, 2).reshape(shape)``."""
    return _reshape(b, ex, b.op("Transpose", [o], perm=[0, 2, 1, 3]), shape)


def _new_gelu(b: GraphBuilder, ex: Exporter, x: str) -> str:
    """GPT-2's ``NewGELUActivation``, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, as exported."""
    half = b.op("Mul", [x, ex.scalar(b, 0.5)])
    cube = b.op("Mul", [b.op("Pow", [x, ex.scalar(b, 3.0)]), ex.scalar(b, 0.044715)])
    inner = b.op("Mul", [b.op("Add", [x, cube]), ex.scalar(b, math.sqrt(2.0 / math.pi))])
    return b.op("Mul", [half, b.op("Add", [b.op("Tanh", [inner]), ex.scalar(b, 1.0)])])


def _self_attention(
    b: GraphBuilder,
    ex: Exporter,
    x: str,
    hidden: int,
    dh: int,
    tokens: Sequence[int],
    mask: str | None = None,
) -> str:
    """BERT's and ViT's self-attention: query, key and value ``_linear`` projections, split into heads
    of ``dh`` (keys straight to [bs, H, dh, n]), scores scaled by ``dh ** -0.5``, plus the additive
    ``mask`` if any, Softmax on the last axis, heads merged to ``tokens + [-1]``."""
    projections = {}
    for name in ("query", "key", "value"):
        with b.scope(name):
            projections[name] = _linear(b, ex, x, hidden, hidden)
    shape = [*tokens, -1, dh]
    q = _split_heads(b, ex, projections["query"], shape, (0, 2, 1, 3))
    v = _split_heads(b, ex, projections["value"], shape, (0, 2, 1, 3))
    kt = _split_heads(b, ex, projections["key"], shape, (0, 2, 3, 1))
    scores = b.op("Mul", [b.op("MatMul", [q, kt]), ex.scalar(b, dh**-0.5)])
    if mask is not None:
        scores = b.op("Add", [scores, mask])
    p = b.op("Softmax", [scores], axis=-1)
    return _merge_heads(b, ex, b.op("MatMul", [p, v]), [*tokens, -1])


def _check_heads(hidden: int, heads: int) -> int:
    if heads < 1 or hidden % heads:
        raise ValueError(f"heads={heads} must divide hidden={hidden}")
    return hidden // heads


# -- BERT -------------------------------------------------------------------------------------
def _add_norm(b: GraphBuilder, ex: Exporter, y: str, x: str, din: int, hidden: int, scope: str) -> str:
    """BERT's ``BertSelfOutput`` / ``BertOutput``: ``LayerNorm(dense(y) + x)`` (post-LayerNorm)."""
    with b.scope(f"{scope}.dense"):
        y = _linear(b, ex, y, din, hidden)
    with b.scope(f"{scope}.LayerNorm"):
        return _layer_norm(b, ex, b.op("Add", [y, x]), hidden, BERT_EPS)


def build_bert(
    b: GraphBuilder, batch: int, layers: int, hidden: int, heads: int, ffn: int, seq: int
) -> onnx.ModelProto:
    """A BERT encoder stack (Hugging Face ``BertEncoder``, post-LayerNorm) as the TorchScript exporter writes it.

    The pattern is that of ``../shared/models/bert_tiny.onnx`` (transformers 5, ``BertSelfAttention``
    with ``scaling = dh ** -0.5``): per layer three ``Add(bias, MatMul)`` projections, Reshape to
    [bs, n, -1, dh] with Constant shapes, Transpose (keys straight to [bs, H, dh, n]), MatMul, Mul by
    the scale, Add of the attention mask, Softmax on the last axis, MatMul, Transpose, Reshape, the
    output projection, residual Add, LayerNormalization (epsilon 1e-12); then the intermediate
    projection, exact GELU as Div/Erf/Add/Mul/Mul, the output projection, residual Add, LayerNormalization.

    The attention mask is an input, the additive ``[bs, 1, 1, n]`` mask that ``BertModel`` computes
    from the tokenizer's padding mask and hands to the encoder: a server batches sequences of
    different lengths padded to ``seq``, and without it the batch would attend to padding.
    """
    dh = _check_heads(hidden, heads)
    ex, x = TORCHSCRIPT, "hidden_states"
    for i in range(layers):
        with b.scope(f"layer.{i}"):
            with b.scope("attention.self"):
                o = _self_attention(b, ex, x, hidden, dh, [batch, seq], "attention_mask")
            x = _add_norm(b, ex, o, x, hidden, hidden, "attention.output")
            with b.scope("intermediate.dense"):
                y = ex.erf_gelu(b, ex, _linear(b, ex, x, hidden, ffn, math.sqrt(2.0)))
            x = _add_norm(b, ex, y, x, ffn, hidden, "output")
    doc = (
        f"BERT encoder stack (Hugging Face BertEncoder, post-LayerNorm) as torch.onnx's {ex.name} exporter "
        f"writes it at opset 17: hidden_states [{batch},{seq},{hidden}] and the additive attention_mask "
        f"[{batch},1,1,{seq}] -> last_hidden_state [{batch},{seq},{hidden}]; {layers} layers, {heads} heads of "
        f"{dh}, FFN {ffn}, exact GELU (Erf), LayerNormalization epsilon 1e-12; embeddings left out. "
        "Batch: sequences padded to one length, masked by the attention_mask. Seeded random weights."
    )
    shape = (batch, seq, hidden)
    return b.model(
        [("hidden_states", shape), ("attention_mask", (batch, 1, 1, seq))],
        [(x, "last_hidden_state", shape)],
        doc,
    )


# -- GPT-2 ------------------------------------------------------------------------------------
def build_gpt2(
    b: GraphBuilder, batch: int, layers: int, hidden: int, heads: int, ffn: int, seq: int
) -> onnx.ModelProto:
    """A GPT-2 block stack and ``ln_f`` (Hugging Face ``GPT2Model`` without embeddings) as TorchScript writes it.

    The attention is transformers 4's ``GPT2Attention`` (eager): ``c_attn`` is one ``Conv1D`` to
    3*hidden (Reshape to 2-D, Gemm with bias, Reshape back), Split into q, k, v by a Constant of
    sizes, ``_split_heads`` as Reshape to [bs, n, H, dh] + Transpose, scores divided by sqrt(dh),
    the causal mask as ``Where(tril, Cast(scores), finfo(float32).min)`` with a constant boolean
    lower-triangular [1, 1, n, n] (the exporter folds the slice of the ``bias`` buffer; the Cast is
    ``attn_weights.to(dtype)``, a no-op the exporter keeps), Softmax on the last axis,
    ``_merge_heads`` as Transpose + Reshape to [bs, n, D], ``c_proj``, residual Add. The MLP is
    ``c_fc``, ``NewGELUActivation`` (Mul/Pow/Mul/Add/Mul/Tanh/Add/Mul), ``c_proj``. LayerNorm
    first in each block (epsilon 1e-5). torch 2.13 writes the divisor ``torch.full([], dh ** 0.5)``
    as a Pow/ConstantOfShape/Add of constants that ONNX Runtime folds at load; it is written folded.
    """
    dh = _check_heads(hidden, heads)
    ex, x, lead = TORCHSCRIPT, "hidden_states", [batch, seq]
    causal = np.tril(np.ones((seq, seq), dtype=bool)).reshape(1, 1, seq, seq)
    for i in range(layers):
        with b.scope(f"h.{i}"):
            with b.scope("ln_1"):
                h = _layer_norm(b, ex, x, hidden, GPT2_EPS)
            with b.scope("attn"):
                with b.scope("c_attn"):
                    qkv = _conv1d(b, ex, h, lead, hidden, 3 * hidden, 1.0)
                q, k, v = b.op("Split", [qkv, ex.ints(b, [hidden] * 3)], n_out=3, axis=2)
                shape = [batch, seq, heads, dh]
                q = _split_heads(b, ex, q, shape, (0, 2, 1, 3))
                kt = _split_heads(b, ex, k, shape, (0, 2, 3, 1))
                v = _split_heads(b, ex, v, shape, (0, 2, 1, 3))
                scores = b.op("Div", [b.op("MatMul", [q, kt]), ex.scalar(b, math.sqrt(dh))])
                mask = ex.tensor(b, "causal_mask", causal)
                finfo_min = ex.scalar(b, float(np.finfo(np.float32).min))
                scores = b.op("Where", [mask, b.op("Cast", [scores], to=TensorProto.FLOAT), finfo_min])
                p = b.op("Softmax", [scores], axis=-1)
                o = _merge_heads(b, ex, b.op("MatMul", [p, v]), [batch, seq, hidden])
                with b.scope("c_proj"):
                    o = _conv1d(b, ex, o, lead, hidden, hidden, 1.0)
            x = b.op("Add", [o, x])
            with b.scope("ln_2"):
                h = _layer_norm(b, ex, x, hidden, GPT2_EPS)
            with b.scope("mlp"):
                with b.scope("c_fc"):
                    h = _conv1d(b, ex, h, lead, hidden, ffn, math.sqrt(2.0))
                h = _new_gelu(b, ex, h)
                with b.scope("c_proj"):
                    h = _conv1d(b, ex, h, lead, ffn, hidden, 1.0)
            x = b.op("Add", [x, h])
    with b.scope("ln_f"):
        x = _layer_norm(b, ex, x, hidden, GPT2_EPS)
    doc = (
        f"GPT-2 decoder block stack and final LayerNorm (Hugging Face GPT2Model without embeddings, "
        f"transformers 4 eager attention) as torch.onnx's {ex.name} exporter writes it at opset 17: "
        f"hidden_states [{batch},{seq},{hidden}] -> last_hidden_state [{batch},{seq},{hidden}]; {layers} "
        f"pre-LayerNorm blocks, {heads} heads of {dh}, fused QKV Conv1D (Reshape/Gemm/Reshape, Split), "
        f"causal mask as Where on a constant lower-triangular mask, MLP {ffn} with GELU tanh form "
        "(Pow/Tanh). Batch: prompts of one length processed together (prefill, no KV cache). "
        "Seeded random weights."
    )
    shape = (batch, seq, hidden)
    return b.model([("hidden_states", shape)], [(x, "last_hidden_state", shape)], doc)


# -- ViT --------------------------------------------------------------------------------------
def build_vit(
    b: GraphBuilder, batch: int, layers: int, hidden: int, heads: int, ffn: int, image: int, patch: int
) -> onnx.ModelProto:
    """A ViT encoder (Hugging Face ``ViTModel`` without pooler) as the dynamo exporter writes it.

    The pattern is that of ``../shared/models/vit_tiny_dynamo.onnx``: patch embedding Conv with
    stride = kernel = patch, ``flatten(2).transpose(1, 2)`` as Reshape (an initializer shape,
    ``allowzero=1``) + Transpose, the class token expanded to the batch and Concat'ed in front, the
    position embedding Add; pre-LayerNorm blocks (epsilon 1e-12, ``stash_type=1``) with
    ``Add(MatMul, bias)`` projections, Mul by dh ** -0.5, Softmax on the last axis, exact GELU as
    Div/Erf/Add/Mul/Mul with the 0.5 first; the final LayerNorm. Two departures from that file: the
    class token is ``Expand(cls_token, [bs, 1, D])`` where dynamo folds it into a [bs, 1, D]
    initializer (so the weights do not depend on the batch), and the all-zero [1, 1, n, n] additive
    mask that transformers 5 makes dynamo write into every attention is left out.
    """
    dh = _check_heads(hidden, heads)
    if patch < 1 or image % patch:
        raise ValueError(f"patch={patch} must divide image={image}")
    ex, grid = DYNAMO, image // patch
    n = grid * grid + 1
    with b.scope("embeddings"):
        with b.scope("patch_embeddings.projection"):
            x = b.conv("pixel_values", 3, hidden, patch, stride=patch, pad=0, gain=1.0)
        x = b.op("Transpose", [_reshape(b, ex, x, [batch, hidden, grid * grid])], perm=[0, 2, 1])
        cls = b.op(
            "Expand", [b.weight("cls_token", (1, 1, hidden), 1.0, 1.0), ex.ints(b, [batch, 1, hidden])]
        )
        x = b.op("Concat", [cls, x], axis=1)
        x = b.op("Add", [x, b.weight("position_embeddings", (1, n, hidden), 1.0, 0.1)])
    for i in range(layers):
        with b.scope(f"encoder.layer.{i}"):
            with b.scope("layernorm_before"):
                h = _layer_norm(b, ex, x, hidden, VIT_EPS)
            with b.scope("attention"):
                o = _self_attention(b, ex, h, hidden, dh, [batch, n])
                with b.scope("output.dense"):
                    o = _linear(b, ex, o, hidden, hidden)
            x = b.op("Add", [o, x])
            with b.scope("layernorm_after"):
                h = _layer_norm(b, ex, x, hidden, VIT_EPS)
            with b.scope("intermediate.dense"):
                h = ex.erf_gelu(b, ex, _linear(b, ex, h, hidden, ffn, math.sqrt(2.0)))
            with b.scope("output.dense"):
                h = _linear(b, ex, h, ffn, hidden)
            x = b.op("Add", [h, x])
    with b.scope("layernorm"):
        x = _layer_norm(b, ex, x, hidden, VIT_EPS)
    doc = (
        f"ViT encoder (Hugging Face ViTModel without pooler) as torch.onnx's {ex.name} exporter writes it, at "
        f"opset 17: pixel_values [{batch},3,{image},{image}] -> last_hidden_state [{batch},{n},{hidden}]; "
        f"{patch}x{patch} patch embedding Conv (stride {patch}), Reshape + Transpose to {grid * grid} tokens, "
        f"class token Concat, position embedding Add, {layers} pre-LayerNorm blocks, {heads} heads of {dh}, "
        f"MLP {ffn} with exact GELU (Erf), final LayerNorm (epsilon 1e-12). Batch: images. "
        "Seeded random weights."
    )
    return b.model(
        [("pixel_values", (batch, 3, image, image))], [(x, "last_hidden_state", (batch, n, hidden))], doc
    )

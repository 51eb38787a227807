"""The transformer models (BERT, GPT-2, ViT): numpy references written from the math, the node patterns of
torch.onnx's exporters (checked against the real exports in ../shared/models where that folder exists)."""

from __future__ import annotations

import collections
import math

import numpy as np
import onnx
import pytest
import shared_models
from onnx import helper, numpy_helper

from einopt.models import MODELS, build, sample_inputs
from einopt.models.builder import GraphBuilder
from einopt.models.transformer import FULL, SMALL, build_bert, build_gpt2, build_vit
from einopt.runtime.modelio import run

NAMES = ("bert", "gpt2", "vit")
ERF = np.vectorize(math.erf)


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    nodes = {
        n.output[0]: numpy_helper.to_array(_attrs(n)["value"])
        for n in model.graph.node
        if n.op_type == "Constant"
    }
    return weights(model) | nodes


def _histogram(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in model.graph.node))


# -- numpy references, float64, from the definitions (weights by Hugging Face module name) -------------
def layer_norm(x, w, scope, eps):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w[f"{scope}.weight"] + w[f"{scope}.bias"]


def linear(x, w, scope):
    return x @ w[f"{scope}.weight"] + w[f"{scope}.bias"]


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def gelu_erf(x):
    return 0.5 * x * (1.0 + ERF(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def attention(q, k, v, heads, bias=None, causal=False):
    """Multi-head scaled dot-product attention of [bs, n, D] projections; ``bias`` is added to the scores."""
    bs, n, d = q.shape
    dh = d // heads
    q, k, v = (t.reshape(bs, n, heads, dh) for t in (q, k, v))
    s = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dh)
    if bias is not None:
        s = s + bias
    if causal:  # key j is visible from query i when j <= i
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    return np.einsum("bhij,bjhd->bihd", softmax(s), v).reshape(bs, n, d)


def bert_reference(w, x, mask, layers, heads):
    for i in range(layers):
        s = f"layer.{i}"
        q, k, v = (linear(x, w, f"{s}.attention.self.{t}") for t in ("query", "key", "value"))
        a = linear(attention(q, k, v, heads, bias=mask), w, f"{s}.attention.output.dense")
        x = layer_norm(a + x, w, f"{s}.attention.output.LayerNorm", 1e-12)
        y = linear(gelu_erf(linear(x, w, f"{s}.intermediate.dense")), w, f"{s}.output.dense")
        x = layer_norm(y + x, w, f"{s}.output.LayerNorm", 1e-12)
    return x


def gpt2_reference(w, x, layers, heads):
    d = x.shape[-1]
    for i in range(layers):
        s = f"h.{i}"
        qkv = linear(layer_norm(x, w, f"{s}.ln_1", 1e-5), w, f"{s}.attn.c_attn")
        q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
        x = x + linear(attention(q, k, v, heads, causal=True), w, f"{s}.attn.c_proj")
        h = gelu_tanh(linear(layer_norm(x, w, f"{s}.ln_2", 1e-5), w, f"{s}.mlp.c_fc"))
        x = x + linear(h, w, f"{s}.mlp.c_proj")
    return layer_norm(x, w, "ln_f", 1e-5)


def vit_reference(w, pixels, layers, heads, patch):
    bs, c, size, _ = pixels.shape
    g = size // patch
    # Patch (r, c) in row-major order, its pixels in (channel, y, x) order: the conv's weight layout.
    patches = pixels.reshape(bs, c, g, patch, g, patch).transpose(0, 2, 4, 1, 3, 5).reshape(bs, g * g, -1)
    conv = w["embeddings.patch_embeddings.projection.weight"]
    x = patches @ conv.reshape(conv.shape[0], -1).T + w["embeddings.patch_embeddings.projection.bias"]
    cls = np.broadcast_to(w["embeddings.cls_token"], (bs, 1, x.shape[-1]))
    x = np.concatenate([cls, x], axis=1) + w["embeddings.position_embeddings"]
    for i in range(layers):
        s = f"encoder.layer.{i}"
        h = layer_norm(x, w, f"{s}.layernorm_before", 1e-12)
        q, k, v = (linear(h, w, f"{s}.attention.{t}") for t in ("query", "key", "value"))
        x = x + linear(attention(q, k, v, heads), w, f"{s}.attention.output.dense")
        h = gelu_erf(linear(layer_norm(x, w, f"{s}.layernorm_after", 1e-12), w, f"{s}.intermediate.dense"))
        x = x + linear(h, w, f"{s}.output.dense")
    return layer_norm(x, w, "layernorm", 1e-12)


def reference(name, w, feeds):
    p = SMALL[name]
    if name == "bert":
        return bert_reference(w, feeds["hidden_states"], feeds["attention_mask"], p["layers"], p["heads"])
    if name == "gpt2":
        return gpt2_reference(w, feeds["hidden_states"], p["layers"], p["heads"])
    return vit_reference(w, feeds["pixel_values"], p["layers"], p["heads"], p["patch"])


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_small_equals_numpy_reference(name, batch):
    model = build(name, batch, size="small")
    feeds = sample_inputs(model, seed=5)
    w = {k: v.astype(np.float64) for k, v in weights(model).items() if v.dtype == np.float32}
    ref = reference(name, w, {k: v.astype(np.float64) for k, v in feeds.items()})
    got = run(model, feeds)["last_hidden_state"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert 0.5 < ref.std() < 2.0  # the LayerNorm output: neither vanished nor blown up


def test_bert_mask_and_gpt2_causality_change_the_output():
    """The references would miss a dropped mask at the seeded inputs' scale; these checks would not."""
    model = build("bert", 2, size="small")
    feeds = sample_inputs(model, seed=1)
    seq = SMALL["bert"]["seq"]
    masked = dict(feeds, attention_mask=np.zeros_like(feeds["attention_mask"]))
    masked["attention_mask"][0, ..., seq // 2 :] = np.finfo(np.float32).min  # pad the second half of row 0
    out = run(model, masked)["last_hidden_state"]
    tail = dict(masked, hidden_states=feeds["hidden_states"].copy())
    tail["hidden_states"][0, seq // 2 :] += 5.0  # changing the padding changes nothing in the kept tokens
    np.testing.assert_allclose(
        run(model, tail)["last_hidden_state"][0, : seq // 2], out[0, : seq // 2], atol=1e-5
    )
    unmasked = dict(masked, attention_mask=np.zeros_like(feeds["attention_mask"]))
    changed = run(model, dict(unmasked, hidden_states=tail["hidden_states"]))["last_hidden_state"]
    assert not np.allclose(changed[0, : seq // 2], run(model, unmasked)["last_hidden_state"][0, : seq // 2])
    gpt2 = build("gpt2", 1, size="small")
    x = sample_inputs(gpt2, seed=1)["hidden_states"]
    later = x.copy()
    later[0, -1] += np.random.default_rng(0).standard_normal(x.shape[-1])  # changes only its own output
    a, b = run(gpt2, {"hidden_states": x})["last_hidden_state"], run(gpt2, {"hidden_states": later})
    np.testing.assert_allclose(b["last_hidden_state"][0, :-1], a[0, :-1], atol=1e-5)
    assert not np.allclose(b["last_hidden_state"][0, -1], a[0, -1])


# -- structure -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch", [1, 16])
def test_checker_and_shapes(name, batch):
    for size in ("full", "small"):
        model = build(name, batch, size=size)
        onnx.checker.check_model(model, full_check=True)
        assert (model.opset_import[0].version, model.ir_version) == (17, 8)
        assert MODELS[name].title.split()[0] in model.graph.doc_string
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        (out,) = inferred.graph.output
        p = (FULL if size == "full" else SMALL)[name]
        tokens = p["seq"] if name != "vit" else (p["image"] // p["patch"]) ** 2 + 1
        assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [batch, tokens, p["hidden"]]
        names = [n.name for n in model.graph.node]
        assert all(names) and len(set(names)) == len(names)
    # The small size has the same nodes in the same order (the tests see every node of the full one).
    full, small = build(name, 1), build(name, 1, size="small")
    assert [(n.op_type, n.name) for n in full.graph.node] == [(n.op_type, n.name) for n in small.graph.node]


def test_histograms():
    """Per layer: LayerNormalization nodes, Softmax, the exporter's GELU decomposition; nothing else."""
    assert _histogram(build("bert", 1)) == {
        # per layer: 6 MatMul (q, k, v, scores, context, out) + 2 FFN; 10 Add (6 biases, mask, 2 residual, GELU)
        "MatMul": 8 * 4,
        "Add": 10 * 4,
        "Constant": 8 * 4,
        "Reshape": 4 * 4,
        "Transpose": 4 * 4,
        "Mul": 3 * 4,
        "LayerNormalization": 2 * 4,
        "Softmax": 4,
        "Div": 4,
        "Erf": 4,
    }
    assert _histogram(build("gpt2", 1)) == {
        "LayerNormalization": 2 * 4 + 1,
        "Reshape": 12 * 4,
        "Constant": 21 * 4,
        "Gemm": 4 * 4,
        "Split": 4,
        "Transpose": 4 * 4,
        "MatMul": 2 * 4,
        "Div": 4,
        "Cast": 4,
        "Where": 4,
        "Softmax": 4,
        "Add": 4 * 4,
        "Mul": 4 * 4,
        "Pow": 4,
        "Tanh": 4,
    }
    assert _histogram(build("vit", 1)) == {
        "Conv": 1,
        "Reshape": 1 + 4 * 6,
        "Transpose": 1 + 4 * 6,
        "Expand": 1,
        "Concat": 1,
        "Add": 1 + 9 * 6,
        "LayerNormalization": 2 * 6 + 1,
        "MatMul": 8 * 6,
        "Mul": 3 * 6,
        "Softmax": 6,
        "Div": 6,
        "Erf": 6,
    }


def _producer(model):
    return {o: n for n in model.graph.node for o in n.output}


@pytest.mark.parametrize("name", NAMES)
def test_softmax_and_layer_norm_attributes(name):
    model = build(name, 1)
    eps, dynamo = {"bert": 1e-12, "gpt2": 1e-5, "vit": 1e-12}[name], name == "vit"
    for node in model.graph.node:
        if node.op_type == "Softmax":
            assert _attrs(node) == {"axis": -1}
        if node.op_type == "LayerNormalization":
            want = {"axis": -1, "epsilon": pytest.approx(eps)} | ({"stash_type": 1} if dynamo else {})
            assert _attrs(node) == want
        if (
            node.op_type == "Reshape"
        ):  # TorchScript writes allowzero=0 and Constant shapes; dynamo 1, initializers
            assert _attrs(node) == {"allowzero": int(dynamo)}
            assert (node.input[1] in weights(model)) == dynamo
    assert any(n.op_type == "Constant" for n in model.graph.node) != dynamo
    # Scalars (the scale, GELU's constants, finfo.min) are 0-d tensors, as both exporters write them.
    assert all(a.ndim == 0 for a in _constants(model).values() if a.dtype == np.float32 and a.size == 1)


def test_bert_torchscript_pattern():
    model = build("bert", 1)
    producer, consts, w = _producer(model), _constants(model), weights(model)
    for add in (n for n in model.graph.node if n.op_type == "Add" and n.input[0] in w):
        assert producer[add.input[1]].op_type == "MatMul"  # Add(bias, MatMul(x, W)), bias first
    assert sum(n.op_type == "Add" and n.input[0] in w for n in model.graph.node) == 6 * 4
    for softmax_node in (n for n in model.graph.node if n.op_type == "Softmax"):
        mask = producer[softmax_node.input[0]]
        assert mask.op_type == "Add" and mask.input[1] == "attention_mask"
        scale = producer[mask.input[0]]
        assert scale.op_type == "Mul" and consts[scale.input[1]] == np.float32(1 / 8)
        kt = producer[producer[scale.input[0]].input[1]]
        assert kt.op_type == "Transpose" and _attrs(kt)["perm"] == [0, 2, 3, 1]
        assert consts[producer[kt.input[0]].input[1]].tolist() == [1, 128, -1, 64]
    for erf in (n for n in model.graph.node if n.op_type == "Erf"):
        div = producer[erf.input[0]]
        x = div.input[0]
        assert consts[div.input[1]] == np.float32(math.sqrt(2.0))
        (plus,) = [n for n in model.graph.node if erf.output[0] in n.input]
        (times,) = [n for n in model.graph.node if plus.output[0] in n.input]
        (half,) = [n for n in model.graph.node if times.output[0] in n.input]
        assert (plus.op_type, consts[plus.input[1]]) == ("Add", 1.0) and times.input[:] == [x, plus.output[0]]
        assert (half.op_type, consts[half.input[1]]) == ("Mul", 0.5)
    assert [i.name for i in model.graph.input] == ["hidden_states", "attention_mask"]


def test_gpt2_torchscript_pattern():
    model = build("gpt2", 2)
    producer, consts, w = _producer(model), _constants(model), weights(model)
    for split in (n for n in model.graph.node if n.op_type == "Split"):
        assert _attrs(split) == {"axis": 2} and consts[split.input[1]].tolist() == [256] * 3
        back = producer[split.input[0]]
        gemm = producer[back.input[0]]
        assert consts[back.input[1]].tolist() == [2, 128, 768]
        assert (
            gemm.op_type == "Gemm"
            and w[gemm.input[1]].shape == (256, 768)
            and w[gemm.input[2]].shape == (768,)
        )
        assert _attrs(gemm) == {"alpha": 1.0, "beta": 1.0}
        assert consts[producer[gemm.input[0]].input[1]].tolist() == [-1, 256]
    tril = np.tril(np.ones((128, 128), dtype=bool))[None, None]
    for where in (n for n in model.graph.node if n.op_type == "Where"):
        assert np.array_equal(consts[where.input[0]], tril)
        assert consts[where.input[2]] == np.finfo(np.float32).min
        cast = producer[where.input[1]]
        div = producer[cast.input[0]]
        assert _attrs(cast) == {"to": onnx.TensorProto.FLOAT} and consts[div.input[1]] == np.float32(8.0)
        assert [n.op_type for n in model.graph.node if where.output[0] in n.input] == ["Softmax"]
    for tanh in (n for n in model.graph.node if n.op_type == "Tanh"):
        inner = producer[tanh.input[0]]
        assert consts[inner.input[1]] == np.float32(math.sqrt(2 / math.pi))
        x_plus = producer[inner.input[0]]
        cube = producer[x_plus.input[1]]
        assert consts[cube.input[1]] == np.float32(0.044715)
        power = producer[cube.input[0]]
        assert power.op_type == "Pow" and consts[power.input[1]] == 3.0 and power.input[0] == x_plus.input[0]
    lns = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert lns[-1] is model.graph.node[-1] and lns[-1].name == "ln_f.layernormalization"


def test_vit_dynamo_pattern():
    model = build("vit", 2)
    nodes, w = list(model.graph.node), weights(model)
    conv, flat, tokens, cls, cat, pos = nodes[:6]
    assert _attrs(conv) == {
        "kernel_shape": [16, 16],
        "strides": [16, 16],
        "pads": [0] * 4,
        "dilations": [1, 1],
    }
    assert w[flat.input[1]].tolist() == [2, 384, 196] and _attrs(tokens)["perm"] == [0, 2, 1]
    assert (
        cls.op_type == "Expand"
        and w[cls.input[0]].shape == (1, 1, 384)
        and w[cls.input[1]].tolist() == [2, 1, 384]
    )
    assert (
        cat.op_type == "Concat"
        and cat.input[:] == [cls.output[0], tokens.output[0]]
        and _attrs(cat)["axis"] == 1
    )
    assert pos.op_type == "Add" and w[pos.input[1]].shape == (1, 197, 384)
    assert nodes[6].op_type == "LayerNormalization"  # pre-LayerNorm
    producer = _producer(model)
    for add in (n for n in nodes if n.op_type == "Add" and n.input[1] in w and w[n.input[1]].ndim == 1):
        assert producer[add.input[0]].op_type == "MatMul"  # Add(MatMul(x, W), bias), bias second
    for erf in (n for n in nodes if n.op_type == "Erf"):  # dynamo: Mul(x, Mul(0.5, Add(Erf(x / sqrt2), 1)))
        (plus,) = [n for n in nodes if erf.output[0] in n.input]
        (half,) = [n for n in nodes if plus.output[0] in n.input]
        (out,) = [n for n in nodes if half.output[0] in n.input]
        assert w[half.input[0]] == 0.5 and out.input[:] == [producer[erf.input[0]].input[0], half.output[0]]


@pytest.mark.parametrize(
    "builder, args, message",
    [
        (build_bert, (1, 1, 30, 4, 64, 8), "heads=4 must divide hidden=30"),
        (build_gpt2, (1, 1, 16, 0, 64, 8), "heads=0"),
        (build_vit, (1, 1, 16, 2, 64, 40, 16), "patch=16 must divide image=40"),
    ],
)
def test_bad_sizes(builder, args, message):
    with pytest.raises(ValueError, match=message):
        builder(GraphBuilder("m", 0), *args)


# -- against the real exports ----------------------------------------------------------------------
def _signatures(model: onnx.ModelProto, nodes) -> collections.Counter:
    """Op type, attributes (defaults dropped) and the values of its small constant inputs, as a multiset
    (weights are left out: the real exports drop zero biases and share equal ones)."""
    consts, defaults = _constants(model), {"group": 1, "auto_pad": b"NOTSET", "stash_type": 1}

    def value(name):
        a = consts.get(name)
        return None if a is None or a.size > 4 or a.dtype == bool else tuple(np.round(a.ravel(), 6).tolist())

    return collections.Counter(
        (
            n.op_type,
            tuple(sorted((k, str(v)) for k, v in _attrs(n).items() if defaults.get(k, object()) != v)),
            tuple(v for v in map(value, n.input) if v is not None),
        )
        for n in nodes
        if n.op_type not in ("Constant", "Identity")
    )


def _shared(name: str) -> onnx.ModelProto:
    path = shared_models.path(name)
    if not path.exists():
        pytest.skip(f"{path} is absent (the real exporter outputs live in ../shared/models)")
    return onnx.load(path)


def test_bert_layers_match_the_torchscript_export():
    """bert_tiny's encoder layers (TorchScript, 2 layers, hidden 128, 2 heads, sequence 64) are ours at its
    sizes, node for node, less the attention mask Add it has no input for."""
    real = _shared("bert_tiny")
    ours = build_bert(GraphBuilder("bert", 0), 1, layers=2, hidden=128, heads=2, ffn=512, seq=64)
    encoder = [n for n in real.graph.node if n.name.startswith("/m/encoder/")]
    want = _signatures(real, encoder)
    got = _signatures(ours, [n for n in ours.graph.node if "attention_mask" not in n.input])
    assert got == want


def test_vit_layers_match_the_dynamo_export():
    """vit_tiny_dynamo (2 layers, hidden 192, 3 heads, 64x64, patch 8) is ours at its sizes less its all-zero
    additive masks, with the class token as Expand where dynamo folded it."""
    real = _shared("vit_tiny_dynamo")
    zero_masks = {t.name for t in real.graph.initializer if t.name == "where"}
    ours = build_vit(GraphBuilder("vit", 0), 1, layers=2, hidden=192, heads=3, ffn=768, image=64, patch=8)
    want = _signatures(real, [n for n in real.graph.node if not zero_masks & set(n.input)])
    got = _signatures(ours, [n for n in ours.graph.node if n.op_type != "Expand"])
    assert got == want

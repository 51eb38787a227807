"""Loading, saving (atomic, external data, > 2 GB) and running ONNX models."""

import builtins
import os
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from einopt.errors import ModelError, UnsupportedModelError
from einopt.frontend import fold
from einopt.runtime import modelio


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    model.producer_name = "einopt-tests"
    helper.set_model_props(model, {"origin": "test_modelio"})
    return model


def mlp(seed=0, k=64, n=48):
    """x[N, k] @ W + b -> relu -> sum over a constant Shape: enough tensors to externalise."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["y"]),
        helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])
    outs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n]),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 1]),
    ]
    return make_model(nodes, [x], outs, [w, b, axes])


def reference(model, x):
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    y = np.maximum(x @ inits["W"] + inits["b"], 0)
    return {"y": y, "s": y.sum(axis=1, keepdims=True)}


def assert_runs_like_reference(model, seed=1):
    x = np.random.default_rng(seed).standard_normal((3, 64)).astype(np.float32)
    got = modelio.run(model, {"x": x})
    for name, want in reference(model, x).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)


def listing(path):
    return sorted(p.name for p in path.iterdir())


# ----------------------------------------------------------------------------- load


def test_load_path_roundtrip(tmp_path):
    model = mlp()
    path = tmp_path / "m.onnx"
    modelio.save_model(model, path)
    loaded = modelio.load_model(path)
    assert loaded.SerializeToString() == model.SerializeToString()
    assert listing(tmp_path) == ["m.onnx"]


def test_load_model_proto_is_copied_not_mutated():
    model = mlp()
    before = model.SerializeToString()
    loaded = modelio.load_model(model)
    assert loaded is not model
    loaded.graph.node[0].op_type = "Gemm"
    assert model.SerializeToString() == before


def _write(path, data):
    path.write_bytes(data)
    return path


BAD_FILES = [
    pytest.param(lambda p: p / "missing.onnx", "model file not found", id="missing"),
    pytest.param(lambda p: _write(p / "empty.onnx", b""), "is empty", id="empty"),
    pytest.param(
        lambda p: _write(p / "garbage.onnx", b"\xff\xfe garbage \x00\x01" * 7),
        "not an ONNX model",
        id="garbage",
    ),
    pytest.param(
        lambda p: _write(p / "nograph.onnx", b"\x08\x07"), "has no graph", id="protobuf-without-graph"
    ),
    pytest.param(lambda p: p, "not a file", id="directory"),
]


@pytest.mark.parametrize("make, message", BAD_FILES)
def test_load_bad_files(tmp_path, make, message):
    with pytest.raises(ModelError, match=message):
        modelio.load_model(make(tmp_path))


def test_load_checker_failure_is_one_line(tmp_path):
    model = mlp()
    model.graph.node[1].input[1] = "undefined_value"
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="fails the ONNX checker.*undefined_value") as info:
        modelio.load_model(path)
    assert "\n" not in str(info.value)
    with pytest.raises(ModelError, match="fails the ONNX checker.*undefined_value"):
        modelio.load_model(model)


def test_load_missing_external_data(tmp_path):
    path = tmp_path / "m.onnx"
    modelio.save_model(mlp(), path, external_data=True)
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"external data file 'm.onnx.data' of tensor 'W' not found"):
        modelio.load_model(path)


def test_load_truncated_external_data(tmp_path):
    path = tmp_path / "m.onnx"
    modelio.save_model(mlp(), path, external_data=True)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelError, match="is truncated"):
        modelio.load_model(path)


def _relocated(tmp_path, location, link=None):
    """m.onnx in tmp_path/model whose weight's external data is at ``location`` (``link``: a symbolic
    link model/w.data pointing there); tmp_path/outside/secret.data holds the right bytes, so a
    loader that reached it would load it."""
    folder, outside = tmp_path / "model", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    path = folder / "m.onnx"
    modelio.save_model(mlp(), path, external_data=True)
    (outside / "secret.data").write_bytes((folder / "m.onnx.data").read_bytes())
    if link is not None:
        (folder / "w.data").symlink_to(link)
    raw = onnx.load(str(path), load_external_data=False)
    for t in raw.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    path.write_bytes(raw.SerializeToString())
    return path, outside / "secret.data"


def _accesses(monkeypatch) -> list[tuple[str, str]]:
    """(function, path) of every stat, lstat and open from here on."""
    seen = []
    for module, name in ((os, "stat"), (os, "lstat"), (os, "open"), (builtins, "open")):
        real = getattr(module, name)

        def spy(p, *args, _real=real, _name=name, **kwargs):
            if isinstance(p, str | os.PathLike):
                seen.append((_name, os.path.abspath(p)))
            return _real(p, *args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return seen


@pytest.mark.parametrize(
    "where, link, why",
    [
        ("absolute", None, "an absolute path"),
        ("../outside/secret.data", None, r"a path that climbs out of its folder \('..'\)"),
        ("w.data", "absolute", "through the symbolic link 'w.data', which is not followed"),
        ("w.data", "../outside/secret.data", "through the symbolic link 'w.data', which is not followed"),
    ],
)
def test_load_refuses_external_data_outside_the_model_folder_before_touching_it(
    tmp_path, monkeypatch, where, link, why
):
    secret = str(tmp_path / "outside" / "secret.data")
    location = secret if where == "absolute" else where
    path, _ = _relocated(tmp_path, location, secret if link == "absolute" else link)
    seen = _accesses(monkeypatch)
    with pytest.raises(
        ModelError, match=f"tensor 'W' has its external data at '{re.escape(location)}', {why}"
    ):
        modelio.load_model(path)
    monkeypatch.undo()
    assert (path.parent / "m.onnx.data").exists()  # the real data was there all along
    assert not [(f, p) for f, p in seen if p == secret], seen
    # the link itself is read (lstat, readlink), never followed
    assert not [(f, p) for f, p in seen if p == str(path.parent / "w.data") and f != "lstat"], seen


def test_load_follows_no_symbolic_link_even_inside_the_model_folder(tmp_path):
    """ONNX opens external data through no link either: a link is one clear refusal, not its error."""
    path, _ = _relocated(tmp_path, "sub/m.onnx.data")
    (path.parent / "sub").symlink_to(".")
    with pytest.raises(ModelError, match="through the symbolic link 'sub', which is not followed"):
        modelio.load_model(path)


def test_load_refuses_external_data_that_is_no_regular_file(tmp_path):
    path, _ = _relocated(tmp_path, "fifo")
    os.mkfifo(path.parent / "fifo")  # opening it would wait for a writer
    with pytest.raises(ModelError, match="external data at 'fifo', not a regular file"):
        modelio.load_model(path)


def test_load_model_proto_with_unloaded_external_data(tmp_path):
    path = tmp_path / "m.onnx"
    modelio.save_model(mlp(), path, external_data=True)
    unloaded = onnx.load(str(path), load_external_data=False)
    with pytest.raises(ModelError, match="references external data .* not loaded"):
        modelio.load_model(unloaded)
    with pytest.raises(ModelError, match="not loaded"):
        modelio.session(unloaded)


def test_check_in_memory_over_the_inline_limit(monkeypatch):
    """Models over the protobuf limit are checked on a skeleton whose weights point to a sparse file."""
    monkeypatch.setattr(modelio, "_INLINE_LIMIT", 1000)
    model = mlp()
    assert modelio.load_model(model).SerializeToString() == model.SerializeToString()
    model.graph.node[1].input[1] = "undefined_value"
    with pytest.raises(ModelError, match="undefined_value"):
        modelio.load_model(model)


# ----------------------------------------------------------------------------- save


@pytest.mark.parametrize(
    "external_data, threshold, expect_external",
    [
        pytest.param(None, 1 << 30, False, id="auto-small"),
        pytest.param(None, 1000, True, id="auto-over-threshold"),
        pytest.param(True, 1 << 30, True, id="forced"),
        pytest.param(False, 1000, False, id="refused"),
    ],
)
def test_save_external_data_roundtrip(tmp_path, external_data, threshold, expect_external):
    model = mlp()
    path = tmp_path / "out.onnx"
    modelio.save_model(model, path, external_data=external_data, threshold=threshold)
    assert listing(tmp_path) == (["out.onnx", "out.onnx.data"] if expect_external else ["out.onnx"])
    raw = onnx.load(str(path), load_external_data=False)
    locations = {
        t.name: {e.key: e.value for e in t.external_data}["location"]
        for t in raw.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    }
    # Tensors of 1 KiB or more go out; the small shape-like ones stay inline.
    assert locations == ({"W": "out.onnx.data"} if expect_external else {})
    loaded = modelio.load_model(path)
    assert loaded.SerializeToString() == model.SerializeToString()
    onnx.checker.check_model(str(path), full_check=True)
    assert_runs_like_reference(loaded)


def test_save_does_not_mutate_and_overwrites(tmp_path):
    model = mlp()
    before = model.SerializeToString()
    path = tmp_path / "out.onnx"
    path.write_bytes(b"old")
    modelio.save_model(model, path, external_data=True)
    modelio.save_model(mlp(seed=5), path, external_data=True)
    assert model.SerializeToString() == before
    loaded = modelio.load_model(path)
    np.testing.assert_array_equal(
        numpy_helper.to_array(loaded.graph.initializer[0]),
        numpy_helper.to_array(mlp(seed=5).graph.initializer[0]),
    )
    assert listing(tmp_path) == ["out.onnx", "out.onnx.data"]


def test_save_external_data_aligns_large_tensors(tmp_path, monkeypatch):
    monkeypatch.setattr(modelio, "_ALIGN_FROM", 4096)
    model = mlp(k=128, n=64)  # W is 32 KiB; put a 12 KB tensor before it
    extra = numpy_helper.from_array(np.ones((3000,), np.float32), "extra")
    model.graph.initializer.insert(0, extra)
    path = tmp_path / "a.onnx"
    modelio.save_model(model, path, external_data=True)
    raw = onnx.load(str(path), load_external_data=False)
    offsets = {
        t.name: int({e.key: e.value for e in t.external_data}["offset"])
        for t in raw.graph.initializer
        if t.external_data
    }
    assert offsets["extra"] == 0 and offsets["W"] % modelio._ALIGN == 0 and offsets["W"] > 0


def test_load_model_saved_by_onnx_with_external_data(tmp_path):
    model = mlp()
    (tmp_path / "weights").mkdir()
    onnx.save_model(
        model,
        str(tmp_path / "m.onnx"),
        save_as_external_data=True,
        location="weights/w.bin",
        size_threshold=0,
    )
    loaded = modelio.load_model(tmp_path / "m.onnx")
    assert not any(t.data_location == TensorProto.EXTERNAL for t in loaded.graph.initializer)
    assert_runs_like_reference(loaded)


def test_external_data_for_attribute_and_subgraph_tensors(tmp_path):
    """Tensors in Constant nodes and in subgraphs go to the data file too, and come back."""
    big = np.arange(3000, dtype=np.float32).reshape(3, 1000)
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "inner"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, 1000])],
        initializer=[numpy_helper.from_array(big * 2, "inner")],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["k"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 1000])],
    )
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(big)),
        helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch),
    ]
    model = make_model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1000]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1000])],
    )
    path = tmp_path / "m.onnx"
    modelio.save_model(model, path, external_data=True)
    raw = onnx.load(str(path), load_external_data=False)
    assert raw.graph.node[0].attribute[0].t.data_location == TensorProto.EXTERNAL
    then_saved = next(a.g for a in raw.graph.node[1].attribute if a.name == "then_branch")
    assert then_saved.initializer[0].data_location == TensorProto.EXTERNAL
    assert path.stat().st_size < 2000
    loaded = modelio.load_model(path)
    assert loaded.SerializeToString() == model.SerializeToString()
    x = np.ones((3, 1000), np.float32)
    np.testing.assert_array_equal(modelio.run(loaded, {"x": x, "flag": np.array(True)})["y"], x + 2 * big)
    np.testing.assert_array_equal(modelio.run(loaded, {"x": x, "flag": np.array(False)})["y"], big)


def test_save_into_missing_directory(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        modelio.save_model(mlp(), tmp_path / "nope" / "m.onnx")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_save_into_read_only_directory(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        with pytest.raises(ModelError, match="cannot write .*Permission denied"):
            modelio.save_model(mlp(), out / "m.onnx", external_data=True)
        assert listing(out) == []
    finally:
        out.chmod(0o700)


def test_save_when_no_temporary_file_can_be_created(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(modelio.tempfile, "mkstemp", refuse)
    with pytest.raises(ModelError, match="cannot write .*Permission denied"):
        modelio.save_model(mlp(), tmp_path / "m.onnx")
    assert listing(tmp_path) == []


def _fail_on(nth):
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == nth:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    return replace


real_replace = os.replace


@pytest.mark.parametrize(
    "external_data, nth", [(False, 1), (True, 1), (True, 2)], ids=["inline", "data", "model"]
)
def test_save_failure_leaves_nothing(tmp_path, monkeypatch, external_data, nth):
    monkeypatch.setattr(modelio.os, "replace", _fail_on(nth))
    with pytest.raises(ModelError, match="cannot write .*No space left"):
        modelio.save_model(mlp(), tmp_path / "m.onnx", external_data=external_data)
    assert listing(tmp_path) == []


def test_save_failure_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    modelio.save_model(mlp(seed=1), path)
    before = path.read_bytes()
    monkeypatch.setattr(modelio.os, "replace", _fail_on(1))
    with pytest.raises(ModelError):
        modelio.save_model(mlp(seed=2), path)
    assert path.read_bytes() == before
    assert listing(tmp_path) == ["m.onnx"]


def test_save_exception_during_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(modelio, "_serialize", boom)
    with pytest.raises(KeyboardInterrupt):
        modelio.save_model(mlp(), tmp_path / "m.onnx", external_data=True)
    assert listing(tmp_path) == []


def test_save_inline_refused_over_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(modelio, "_INLINE_LIMIT", 1000)
    with pytest.raises(ModelError, match="without external data"):
        modelio.save_model(mlp(), tmp_path / "m.onnx", external_data=False)
    modelio.save_model(mlp(), tmp_path / "m.onnx", threshold=1 << 40)  # the limit wins over the threshold
    assert listing(tmp_path) == ["m.onnx", "m.onnx.data"]


def test_save_file_mode_follows_umask(tmp_path):
    path = tmp_path / "m.onnx"
    modelio.save_model(mlp(), path)
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


# ----------------------------------------------------------------------------- run


def test_session_and_run():
    model = mlp()
    assert_runs_like_reference(model)
    sess = modelio.session(model, threads=1)
    x = np.ones((2, 64), np.float32)
    got = modelio.run(sess, {"x": x}, outputs=["s"])
    assert list(got) == ["s"]
    np.testing.assert_allclose(got["s"], reference(model, x)["s"], rtol=1e-5)


def test_session_through_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(modelio, "LARGE_MODEL_BYTES", 0)
    monkeypatch.setattr(modelio.tempfile, "tempdir", str(tmp_path))
    model = mlp()
    before = model.SerializeToString()
    assert_runs_like_reference(model)
    assert model.SerializeToString() == before
    assert listing(tmp_path) == []  # the temporary directory is gone


def test_session_refuses_what_onnxruntime_cannot_load():
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")
    model = make_model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    with pytest.raises(
        UnsupportedModelError, match="onnxruntime cannot load the model: .*Frobnicate"
    ) as info:
        modelio.session(model)
    assert "\n" not in str(info.value) and "onnxruntime_src" not in str(info.value)


def test_run_with_bad_feeds():
    with pytest.raises(ModelError, match="onnxruntime failed to run the model"):
        modelio.run(mlp(), {"x": np.ones((2, 5), np.float32)})


# ----------------------------------------------------------------------------- inputs


def typed_inputs_model():
    vi = helper.make_tensor_value_info
    inputs = [
        vi("f32", TensorProto.FLOAT, ["N", 3]),
        vi("f16", TensorProto.FLOAT16, [2]),
        vi("f64", TensorProto.DOUBLE, ["N", "M"]),
        vi("idx", TensorProto.INT64, [4]),
        vi("flag", TensorProto.BOOL, [1]),
        vi("w", TensorProto.FLOAT, [2]),  # has an initializer: not fed
    ]
    nodes = [helper.make_node("Identity", [i.name], [f"o_{i.name}"]) for i in inputs]
    outputs = [vi(f"o_{i.name}", i.type.tensor_type.elem_type, None) for i in inputs]
    for o in outputs:
        o.type.tensor_type.ClearField("shape")
    w = numpy_helper.from_array(np.zeros(2, np.float32), "w")
    return make_model(nodes, inputs, outputs, [w])


def test_random_inputs_types_shapes_and_seed():
    model = typed_inputs_model()
    feeds = modelio.random_inputs(model, seed=3)
    assert {k: (v.dtype.name, v.shape) for k, v in feeds.items()} == {
        "f32": ("float32", (1, 3)),
        "f16": ("float16", (2,)),
        "f64": ("float64", (1, 1)),
        "idx": ("int64", (4,)),
        "flag": ("bool", (1,)),
    }
    assert not feeds["idx"].any() and not feeds["flag"].any()
    again = modelio.random_inputs(model, seed=3)
    other = modelio.random_inputs(model, seed=4)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert not np.array_equal(feeds["f32"], other["f32"])
    modelio.run(model, feeds)  # ORT accepts them


def test_random_inputs_given_shapes_bind_symbols():
    feeds = modelio.random_inputs(typed_inputs_model(), seed=0, shapes={"f32": (5, 3)})
    assert feeds["f32"].shape == (5, 3) and feeds["f64"].shape == (5, 1)
    assert "w" not in modelio.random_inputs(typed_inputs_model(), seed=0, shapes={"w": (2,)})
    big = modelio.random_inputs(typed_inputs_model(), seed=0, shapes={"f32": (4000, 3)})["f32"]
    assert abs(big.mean()) < 0.1 and abs(big.std() - 1) < 0.1


@pytest.mark.parametrize(
    "shapes, message",
    [
        ({"nope": (1,)}, "unknown inputs"),
        ({"f32": (2, 4)}, "does not match"),
        ({"f32": (2,)}, "has rank 1"),
        ({"f32": (2, 3), "f64": (3, 1)}, "dimension N is 3 here but 2"),
    ],
    ids=["unknown", "fixed-dim", "rank", "symbol-clash"],
)
def test_random_inputs_bad_shapes(shapes, message):
    with pytest.raises(ModelError, match=message):
        modelio.random_inputs(typed_inputs_model(), seed=0, shapes=shapes)


def test_random_inputs_unsupported_type():
    vi = helper.make_tensor_value_info("s", TensorProto.STRING, [1])
    model = make_model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [vi],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [1])],
    )
    with pytest.raises(UnsupportedModelError, match="cannot generate"):
        modelio.random_inputs(model, seed=0)


def test_load_inputs(tmp_path):
    model = typed_inputs_model()
    feeds = modelio.random_inputs(model, seed=0, shapes={"f32": (2, 3)})
    np.savez(tmp_path / "in.npz", **feeds)
    loaded = modelio.load_inputs(tmp_path / "in.npz", model)
    assert list(loaded) == list(feeds)
    assert all(np.array_equal(loaded[k], feeds[k]) for k in feeds)
    np.savez(tmp_path / "override.npz", **feeds, w=np.ones(2, np.float32))
    assert "w" in modelio.load_inputs(tmp_path / "override.npz", model)


def _npz_cases():
    good = modelio.random_inputs(typed_inputs_model(), seed=0)
    return [
        pytest.param(
            {k: v for k, v in good.items() if k != "idx"}, "missing inputs \\['idx'\\]", id="missing"
        ),
        pytest.param({**good, "bogus": np.zeros(1)}, "'bogus'.* not model inputs", id="unknown"),
        pytest.param(
            {**good, "f32": good["f32"].astype(np.float64)},
            "dtype float64, the model expects float32",
            id="dtype",
        ),
        pytest.param({**good, "idx": np.zeros(5, np.int64)}, "does not match", id="shape"),
        pytest.param({**good, "f64": np.zeros((2, 1))}, "dimension N is 2 here but 1", id="symbol"),
    ]


@pytest.mark.parametrize("arrays, message", _npz_cases())
def test_load_inputs_mismatch(tmp_path, arrays, message):
    np.savez(tmp_path / "in.npz", **arrays)
    with pytest.raises(ModelError, match=message):
        modelio.load_inputs(tmp_path / "in.npz", typed_inputs_model())


@pytest.mark.parametrize(
    "write, message",
    [
        pytest.param(None, "not found", id="missing"),
        pytest.param(lambda p: p.write_bytes(b"not a zip"), "cannot read .* as an .npz", id="garbage"),
        pytest.param(lambda p: np.save(open(p, "wb"), np.zeros(2)), "single .npy array", id="npy"),
    ],
)
def test_load_inputs_bad_files(tmp_path, write, message):
    path = tmp_path / "in.npz"
    if write:
        write(path)
    with pytest.raises(ModelError, match=message):
        modelio.load_inputs(path, typed_inputs_model())


# ----------------------------------------------------------------------------- > 2 GB


@pytest.mark.slow
@pytest.mark.bigmem
def test_model_over_2gb(tmp_path):
    """One MatMul with a 2.15 GB weight: load (external data), prepare, run, save; ~20 s.

    Needs 4.2 GB at least (loading and prepare each hold two copies of the
    weight) and peaks at 6.3 GB (running holds the model, the bytes written for
    ONNX Runtime and ONNX Runtime's own copy), so it runs with EINOPT_BIGMEM_TESTS=1.
    """
    n = 23200
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    with open(tmp_path / "big.onnx.data", "wb") as data:
        for lo in range(0, n, 2048):  # W[k, j] = a[k] + b[j], written in slabs (not mapped: no 2 GB resident)
            data.write((a[lo : lo + 2048, None] + b[None, :]).tobytes())
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[n, n])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "big.onnx.data"), ("offset", "0"), ("length", str(n * n * 4))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    skeleton = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])],
        [w],
    )
    (tmp_path / "big.onnx").write_bytes(skeleton.SerializeToString())

    prepared = fold.prepare(modelio.load_model(tmp_path / "big.onnx"), {"x": (1, n)})
    model = prepared.model
    assert modelio.total_tensor_bytes(model) > 2**31
    assert prepared.notes == (f"pinned input x to [1, {n}]",)
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, n]
    x = np.random.default_rng(2).standard_normal((1, n)).astype(np.float32)
    y = modelio.run(model, {"x": x})["y"]
    # y[j] = x . a + sum(x) * b[j]
    want = float(x[0].astype(np.float64) @ a) + float(x.sum(dtype=np.float64)) * b.astype(np.float64)
    np.testing.assert_allclose(y[0], want, rtol=1e-3, atol=1e-2 * np.abs(want).max())

    modelio.save_model(model, tmp_path / "copy.onnx")
    assert (tmp_path / "copy.onnx.data").stat().st_size >= n * n * 4
    assert (tmp_path / "copy.onnx").stat().st_size < 1 << 20

"""Generated kernels inside ONNX Runtime: einopt's custom-op library and the kernels it runs.

A model file is data: it carries no native code. Two native pieces, both built on the machine that
runs the model, into einopt's cache (``EINOPT_CACHE_DIR``, else the user cache directory; every
folder of it must be this user's and not writable by others, or einopt refuses it):

- **The custom-op library** (``einopt_ort.c``, einopt's own C source), registered into an ONNX
  Runtime session, runs the operator ``ai.einopt::TvmKernel``: a TVM-compiled function called on
  ORT's own buffers (DLPack, no copies, no Python). It is built with the system C compiler once per
  source, ONNX Runtime version and CPU, recorded with its SHA-256, checked against that record and
  its own version before it is loaded, and stays loaded for the process.
- **A kernel library** is one ``TvmKernel`` node's kernel: the node carries its description (the
  einopt program it computes, its shapes and schedule, and the SHA-256 of that text; see
  ``einopt.backends.tvm.ortkernel``), and :func:`prepare` compiles it with TVM for this CPU, or takes it
  from the cache where the same description was compiled before (checked against the SHA-256
  recorded when it was built), and hands its bytes to the custom-op library, which loads it once per
  process. A node whose kernel was not prepared fails when its session is made: nothing in a model
  file is ever loaded or run.

``einopt.runtime.session("out.onnx")`` does all of it, through :func:`prepare_session`, the session
hook einopt registers for the domain ``ai.einopt`` (see :mod:`einopt.runtime.sessions`). A plain ONNX
Runtime session runs such a model after one extra line::

    options = einopt.backends.tvm.kernels.prepare("out.onnx", onnxruntime.SessionOptions())
    session = onnxruntime.InferenceSession("out.onnx", options)

The first session of a model on a new machine compiles its kernels (a few seconds each, logged);
later ones, in this process or another, load them from the cache.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import onnx

from einopt.backends.tvm.build import (
    CFLAGS,
    LIBRARY_SOURCE,
    NativeBuildError,
    compiler,
    link_kernels,
    run_compiler,
)
from einopt.backends.tvm.ortkernel import KernelDescriptionError, is_cached, library, read_description
from einopt.errors import ModelError, UnsupportedModelError
from einopt.opsets import KERNEL_DOMAIN
from einopt.runtime.cache import cache_folder, read_recorded, write_recorded
from einopt.runtime.sessions import read_model

__all__ = [
    "DOMAIN",
    "OP_TYPE",
    "NativeBuildError",
    "described",
    "kernel_nodes",
    "library_path",
    "link_kernels",
    "prepare",
    "prepare_session",
    "register",
]

log = logging.getLogger(__name__)

DOMAIN = KERNEL_DOMAIN
"""The domain of einopt's generated-kernel nodes (:data:`einopt.opsets.KERNEL_DOMAIN`)."""
OP_TYPE = "TvmKernel"


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def _library_key(cc: str) -> str:
    return hashlib.sha256(
        b"\0".join(
            [
                LIBRARY_SOURCE.read_bytes(),
                _ort_version().encode(),
                platform.machine().encode(),
                cc.encode(),
                " ".join(CFLAGS).encode(),
            ]
        )
    ).hexdigest()[:16]


def library_path() -> Path:
    """The custom-op library for this ONNX Runtime and CPU, built into einopt's cache on first use.

    A library found in the cache is used only if its bytes hash to the SHA-256 recorded when einopt
    built it (else it is built again, with a warning).

    Raises
    ------
    NativeBuildError
        No C compiler, or the build failed.
    einopt.runtime.cache.CacheTrustError
        The cache folder is another user's, or others can write it.
    """
    cc = compiler()
    key = _library_key(cc)
    folder = cache_folder("native", key)
    path, record = folder / "libeinopt_ort.so", folder / "libeinopt_ort.sha256"
    if read_recorded(path, record, "einopt's cached ONNX Runtime library") is not None:
        return path
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        built = Path(tmp) / path.name
        run_compiler(
            [
                cc,
                *CFLAGS,
                f'-DEINOPT_SOURCE_HASH="{key}"',
                "-o",
                str(built),
                str(LIBRARY_SOURCE),
                "-ldl",
                "-lpthread",
            ],
            "einopt's ONNX Runtime library",
        )
        data = built.read_bytes()
    write_recorded(path, record, data)  # atomic: another process building the same key reads a whole file
    return path


_LOCK = threading.RLock()
_LOADED: list[tuple[Path, ctypes.CDLL]] = []  # the custom-op library, once loaded (never unloaded)
_PREPARED: set[str] = set()  # descriptions' SHA-256 whose kernel libraries the custom-op library holds


def _loaded() -> tuple[Path, ctypes.CDLL]:
    """The custom-op library, loaded into this process once (and never unloaded), its version checked
    then: later calls, one per session of a model with kernels, neither hash its source nor look for a
    compiler again."""
    with _LOCK:
        if not _LOADED:
            key = _library_key(compiler())
            path = library_path()
            lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL | getattr(os, "RTLD_NODELETE", 0))
            lib.einopt_ort_library_version.restype = ctypes.c_char_p
            version = lib.einopt_ort_library_version().decode()
            if version != key:
                raise NativeBuildError(
                    f"einopt's ONNX Runtime library {path} is version {version}, this einopt needs {key}: "
                    "remove it and try again"
                )
            lib.einopt_ort_add_kernels.argtypes = [
                ctypes.c_char_p,
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.c_char_p,
                ctypes.c_size_t,
            ]
            lib.einopt_ort_add_kernels.restype = ctypes.c_int
            _LOADED.append((path, lib))
        return _LOADED[0]


def register(options: Any = None) -> Any:
    """``options`` (a new ``onnxruntime.SessionOptions`` if None) with einopt's custom-op library
    registered. It runs only kernels :func:`prepare` built: prepare the model too (or call
    :func:`prepare`, which registers)."""
    import onnxruntime

    options = options if options is not None else onnxruntime.SessionOptions()
    path, _ = _loaded()
    options.register_custom_ops_library(str(path))
    return options


def kernel_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """The ``ai.einopt`` nodes of ``model``: in its graph, its subgraphs and its local functions."""

    def walk(nodes) -> Iterator[onnx.NodeProto]:
        for n in nodes:
            if n.domain == DOMAIN:
                yield n
            for a in n.attribute:
                for g in [a.g] if a.HasField("g") else a.graphs:
                    yield from walk(g.node)

    yield from walk(model.graph.node)
    for f in model.functions:
        yield from walk(f.node)


def described(model: onnx.ModelProto) -> list[Any]:
    """The kernel descriptions (``einopt.backends.tvm.ortkernel.KernelDescription``) of ``model``'s einopt
    nodes, each checked against its SHA-256 and against its node, one per distinct kernel; nothing is
    built or loaded.

    Raises
    ------
    UnsupportedModelError
        A node carries no description (a model written by einopt before kernels were described, which
        put native code in the file), or is not an operator einopt runs.
    ModelError
        A node's description is damaged or altered, or disagrees with the node.
    """

    found: dict[str, Any] = {}
    for node in kernel_nodes(model):
        label = f"einopt node {node.name or (node.output[0] if node.output else node.op_type)!r}"
        if node.op_type != OP_TYPE:
            raise UnsupportedModelError(f"{label}: {DOMAIN}::{node.op_type} is not an operator einopt runs")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if not isinstance(attrs.get("kernel"), bytes) or not isinstance(attrs.get("kernel_sha256"), bytes):
            raise UnsupportedModelError(
                f"{label} carries no kernel description (a model written by an earlier einopt, which put "
                "native code in the file): einopt never loads native code from a model file; optimize the "
                "original model again with this einopt"
            )
        text, sha = (attrs[k].decode(errors="replace") for k in ("kernel", "kernel_sha256"))
        try:
            d = found[sha] if sha in found and found[sha].text == text else read_description(text, sha)
        except KernelDescriptionError as e:
            raise ModelError(f"{label}: {e}") from None
        _check_node(label, node, attrs, d)
        found[d.sha256] = d
    return list(found.values())


def prepare(model: onnx.ModelProto | str | Path | bytes, options: Any = None) -> Any:
    """Make ``model``'s generated kernels runnable in this process: each ``TvmKernel`` node's
    description is checked (:func:`described`), compiled for this CPU (or taken from einopt's cache)
    and handed to the custom-op library; returns ``options`` (a new ``onnxruntime.SessionOptions`` if
    None) with that library registered. Nothing in the model is loaded or run: it is read as data.

    Raises
    ------
    UnsupportedModelError, ModelError
        As :func:`described`.
    NativeBuildError
        No C compiler, or a build failed.
    einopt.runtime.cache.CacheTrustError
        einopt's cache folder is another user's, or others can write it.
    """
    if not isinstance(model, onnx.ModelProto):
        model = read_model(model)
    descriptions = described(model)
    options = register(options)
    if not descriptions:
        return options

    _, lib = _loaded()
    todo = [d for d in descriptions if d.sha256 not in _PREPARED]
    built = _built_here(todo)
    if built:
        log.info("building %d generated kernel(s) for this CPU (first use of this model here)", len(built))
    start = time.monotonic()
    for d in todo:
        with _LOCK:
            if d.sha256 in _PREPARED:
                continue
            data = library(d)
            why = ctypes.create_string_buffer(512)
            if lib.einopt_ort_add_kernels(d.sha256.encode(), data, len(data), why, len(why)) != 0:
                raise NativeBuildError(f"cannot load kernel {d.symbol}: {why.value.decode(errors='replace')}")
            _PREPARED.add(d.sha256)
    if built:
        log.info(
            "built %d generated kernel(s) in %.1f s (cached for later sessions)",
            len(built),
            time.monotonic() - start,
        )
    return options


def prepare_session(model: onnx.ModelProto, options: Any) -> None:
    """The session hook of domain ``ai.einopt``: :func:`prepare` ``model``'s kernels into ``options``.

    einopt's ``pyproject.toml`` registers it as the entry point ``ai.einopt`` of the group
    ``einopt.session_domains``, by which :mod:`einopt.runtime.sessions` finds it.

    Raises
    ------
    UnsupportedModelError
        The kernels cannot be built here (no C compiler, a failed build), or as :func:`described`.
    ModelError
        As :func:`described`.
    """
    try:
        prepare(model, options)  # builds the kernels the nodes describe: runs nothing of the file
    except NativeBuildError as e:
        raise UnsupportedModelError(f"the model runs einopt's generated kernels, and {e}") from e


def _built_here(descriptions: Sequence[Any]) -> list[Any]:
    """Those of ``descriptions`` that no cache holds yet (compiling them is what takes time)."""

    return [d for d in descriptions if not is_cached(d)]


def _check_node(label: str, node: onnx.NodeProto, attrs: dict, d) -> None:
    """Raise ModelError unless ``node`` reads and writes what description ``d`` computes."""
    shapes = {
        "symbol": d.symbol.encode(),
        "input_ranks": [len(s) for s in d.inputs],
        "input_shapes": [x for s in d.inputs for x in s],
        "output_ranks": [len(s) for s in d.outputs],
        "output_shapes": [x for s in d.outputs for x in s],
    }
    for name, want in shapes.items():
        if attrs.get(name) != want:
            raise ModelError(f"{label}: its attribute {name} disagrees with its kernel's description")
    if len(node.input) != len(d.inputs) or len(node.output) != len(d.outputs):
        raise ModelError(
            f"{label}: it has {len(node.input)} inputs and {len(node.output)} outputs, its kernel "
            f"{len(d.inputs)} and {len(d.outputs)}"
        )

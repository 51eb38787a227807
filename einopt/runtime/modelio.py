"""Reading, writing and running ONNX models, including models over 2 GB.

Protobuf cannot serialise a message over 2 GB, so every operation that hands a
model to ONNX or ONNX Runtime works on a *skeleton*: a copy in which large
tensors are replaced by external-data references (:func:`strip_tensors`),
with their bytes streamed to a data file when they are needed at all. Models
are never mutated: every function returns a new ``ModelProto``.

The verification-input helpers (:func:`feed_inputs`, :func:`random_inputs`,
:func:`load_inputs`) live in :mod:`einopt.runtime.inputs` and are re-exported here.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError, EncodeError
from onnx import TensorProto, numpy_helper

from einopt.errors import ModelError, UnsupportedModelError
from einopt.opsets import KERNEL_DOMAIN
from einopt.runtime.inputs import feed_inputs, load_inputs, random_inputs
from einopt.runtime.sessions import prepare_options
from einopt.runtime.timing import thread_options

log = logging.getLogger(__name__)

# ORT logs a failing kernel on stderr through the run's logger; einopt reports the error itself.
_QUIET_RUN = ort.RunOptions()
_QUIET_RUN.log_severity_level = 4
ort.set_default_logger_severity(4)  # fatal only: einopt reports failures itself

__all__ = [
    "load_model",
    "save_model",
    "session",
    "run",
    "random_inputs",
    "load_inputs",
    "feed_inputs",
    "tensor_nbytes",
    "total_tensor_bytes",
    "strip_tensors",
    "map_tensors",
    "all_tensors",
    "copy_model",
    "missing_opsets",
]

# Above this many bytes of tensors a model goes to ONNX Runtime through a file
# with external data: the serialised message must stay under 2 GB, and below
# that the file saves a copy of the weights (no serialised bytes held while
# ONNX Runtime builds its own): a 548 MB model's session peaks 0.55 GB lower.
LARGE_MODEL_BYTES = 256_000_000
# Largest tensor payload written inline by save_model (the protobuf limit is 2 GiB).
_INLINE_LIMIT = 1_800_000_000
# Tensors smaller than this stay inline when weights go to an external file.
EXTERNAL_MIN_BYTES = 1024
# Large tensors start at multiples of this in data files, so runtimes can mmap them.
_ALIGN = 1 << 16
_ALIGN_FROM = 1 << 20
_STRIPPED = "__einopt_stripped__"

# Sub-byte element types are stored packed; their sizes are not computed here
# and such tensors always stay inline.
_SUB_BYTE = {
    getattr(TensorProto, name)
    for name in ("UINT4", "INT4", "FLOAT4E2M1", "UINT2", "INT2", "FLOAT6E2M3", "FLOAT6E3M2")
    if hasattr(TensorProto, name)
}
_TENSOR_DATA_FIELDS = frozenset(
    {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"}
    | {"external_data", "data_location"}
)


def _ort_errors() -> tuple[type[BaseException], ...]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException")
    names += ("InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail")
    return tuple(getattr(state, n) for n in names if hasattr(state, n)) + (RuntimeError,)


_ORT_ERRORS = _ort_errors()


# ----------------------------------------------------------------------------- tensors and copies


def missing_opsets(
    nodes: Iterable[onnx.NodeProto],
    present: Iterable[onnx.OperatorSetIdProto] = (),
    functions: Iterable[onnx.FunctionProto] = (),
) -> list[onnx.OperatorSetIdProto]:
    """Opset imports (version 1) for the non-default domains ``nodes`` (their subgraphs, and the
    bodies of ``functions``) use that ``present`` lacks.

    einopt adds nodes in three such domains, all at version 1: its eOperators' model-local
    functions, the functions that run a rewrite at the searched shape only, and ONNX Runtime's
    contrib operators (``com.microsoft``). A model holding them must import their domains, or ONNX
    Runtime refuses to load it.
    """
    have = {o.domain for o in present} | {"", "ai.onnx"}
    need = dict.fromkeys(
        n.domain for n in (*_all_nodes(nodes), *_all_nodes(n for f in functions for n in f.node))
    )
    return [onnx.helper.make_opsetid(d, 1) for d in need if d not in have]


def _all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    for n in nodes:
        yield n
        for a in n.attribute:
            for g in [a.g] if a.HasField("g") else a.graphs:
                yield from _all_nodes(g.node)


def tensor_nbytes(t: TensorProto) -> int | None:
    """Size in bytes of a tensor's data from its dims and type; ``None`` for strings and packed types."""
    if t.data_type in _SUB_BYTE or t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    return math.prod(t.dims) * itemsize


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _graph_tensors(a.g)
            for g in a.graphs:
                yield from _graph_tensors(g)


def all_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every tensor of the model: initializers and node attributes, in subgraphs too."""
    return _graph_tensors(model.graph)


def available_bytes() -> int | None:
    """Memory the system can still give this process (``MemAvailable``), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def total_tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor data in the model (computed from dims; nothing is serialised)."""
    return sum(tensor_nbytes(t) or 0 for t in all_tensors(model))


def _is_external(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL


def _is_repeated(fd: Any) -> bool:
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == fd.LABEL_REPEATED


def _copy_fields(src: Any, dst: Any, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Copy the set fields of ``src`` except ``skip``; messages one by one (never > 2 GB at once)."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        if _is_repeated(fd):
            target = getattr(dst, fd.name)
            if fd.message_type is not None:
                for v in value:
                    target.add().CopyFrom(v)
            else:
                target.extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


TensorMap = Callable[[TensorProto, TensorProto], None]


def _map_graph(src: onnx.GraphProto, dst: onnx.GraphProto, fn: TensorMap) -> None:
    _copy_fields(src, dst, {"initializer", "node"})
    for t in src.initializer:
        fn(t, dst.initializer.add())
    for node in src.node:
        dnode = dst.node.add()
        _copy_fields(node, dnode, {"attribute"})
        for a in node.attribute:
            da = dnode.attribute.add()
            _copy_fields(a, da, {"t", "tensors", "g", "graphs"})
            if a.HasField("t"):
                fn(a.t, da.t)
            for t in a.tensors:
                fn(t, da.tensors.add())
            if a.HasField("g"):
                _map_graph(a.g, da.g, fn)
            for g in a.graphs:
                _map_graph(g, da.graphs.add(), fn)


def map_tensors(model: onnx.ModelProto, fn: TensorMap) -> onnx.ModelProto:
    """A copy of ``model`` in which ``fn(src, dst)`` fills in each tensor (initializers, attributes, subgraphs)."""
    out = onnx.ModelProto()
    _copy_fields(model, out, {"graph"})
    if model.HasField("graph"):
        _map_graph(model.graph, out.graph, fn)
    return out


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy (works for messages over 2 GB)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _copy_meta(src: TensorProto, dst: TensorProto) -> None:
    """Copy a tensor's description but not its data (ListFields would copy raw_data)."""
    for fd in src.DESCRIPTOR.fields:
        if fd.name in _TENSOR_DATA_FIELDS:
            continue
        if _is_repeated(fd) and fd.message_type is not None:
            for v in getattr(src, fd.name):
                getattr(dst, fd.name).add().CopyFrom(v)
        elif _is_repeated(fd):
            getattr(dst, fd.name).extend(getattr(src, fd.name))
        elif src.HasField(fd.name):
            if fd.message_type is not None:
                getattr(dst, fd.name).CopyFrom(getattr(src, fd.name))
            else:
                setattr(dst, fd.name, getattr(src, fd.name))


def _set_external(
    dst: TensorProto, location: str, offset: int | None = None, length: int | None = None
) -> None:
    dst.data_location = TensorProto.EXTERNAL
    del dst.external_data[:]
    entries = [("location", location)]
    if offset is not None:
        entries += [("offset", str(offset)), ("length", str(length))]
    for key, value in entries:
        e = dst.external_data.add()
        e.key, e.value = key, value


def _large(t: TensorProto, min_bytes: int) -> bool:
    n = tensor_nbytes(t)
    return n is not None and n >= min_bytes and not _is_external(t)


def strip_tensors(model: onnx.ModelProto, min_bytes: int = 1 << 16) -> onnx.ModelProto:
    """A shapes-only copy: tensors of at least ``min_bytes`` bytes keep name, type and dims but no data.

    Their data is replaced by a reference to a nonexistent external file, so the
    copy is small enough to serialise, and fine for shape inference (which only
    reads the data of small, shape-like tensors). Not runnable.
    """

    def fn(src: TensorProto, dst: TensorProto) -> None:
        if _large(src, min_bytes):
            _copy_meta(src, dst)
            _set_external(dst, _STRIPPED)
        else:
            dst.CopyFrom(src)

    return map_tensors(model, fn)


def _raw_bytes(t: TensorProto) -> bytes | None:
    """The tensor's data in ONNX raw (little-endian) layout, or ``None`` if it has none."""
    if t.HasField("raw_data"):
        return t.raw_data
    converted = numpy_helper.from_array(numpy_helper.to_array(t))
    if converted.data_type != t.data_type or not converted.HasField("raw_data"):
        return None
    return converted.raw_data


def _externalize(model: onnx.ModelProto, data: IO[bytes], location: str) -> onnx.ModelProto:
    """Stream large tensors into ``data`` and return the skeleton that references them as ``location``."""

    def fn(src: TensorProto, dst: TensorProto) -> None:
        raw = _raw_bytes(src) if _large(src, EXTERNAL_MIN_BYTES) else None
        if raw is None:
            dst.CopyFrom(src)
            return
        if len(raw) >= _ALIGN_FROM:
            data.write(b"\0" * (-data.tell() % _ALIGN))
        offset = data.tell()
        data.write(raw)
        _copy_meta(src, dst)
        _set_external(dst, location, offset, len(raw))

    return map_tensors(model, fn)


def _serialize(model: onnx.ModelProto) -> bytes:
    try:
        return model.SerializeToString()
    except (EncodeError, ValueError) as e:
        raise UnsupportedModelError(f"cannot serialise the model (protobuf's limit is 2 GB): {e}") from e


def _require_loaded(model: onnx.ModelProto) -> None:
    for t in all_tensors(model):
        if _is_external(t):
            where = next((e.value for e in t.external_data if e.key == "location"), "?")
            raise ModelError(
                f"tensor {t.name!r} references external data ({where!r}) that is not loaded; "
                "load the model from its path (or with onnx.load) first"
            )


def _one_line(e: BaseException) -> str:
    return re.sub(r"\s+", " ", str(e)).strip()


# ----------------------------------------------------------------------------- load


def load_model(source: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    """Load and check an ONNX model.

    Parameters
    ----------
    source
        A path to a ``.onnx`` file (external data files are read from its
        directory; models over 2 GB always have them), or a ``ModelProto``,
        which is copied, never mutated, and must have its external data loaded.

    Returns
    -------
    onnx.ModelProto
        The model with all tensor data in memory, accepted by ``onnx.checker``.

    Raises
    ------
    ModelError
        Missing or empty file, not an ONNX protobuf, missing or short external
        data, external data named outside the model's folder (an absolute path,
        ``..``, a symbolic link: refused before anything there is looked at), or
        an ``onnx.checker`` failure (its message, on one line).
    """
    if isinstance(source, onnx.ModelProto):
        if not source.HasField("graph"):
            raise ModelError("not an ONNX model: it has no graph")
        _require_loaded(source)
        model = copy_model(source)
        _check_in_memory(model)
        return model
    return _load_path(Path(source))


def _load_path(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"not a file: {path}")
    if path.stat().st_size == 0:
        raise ModelError(f"{path} is empty, not an ONNX model")
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ModelError(f"{path} is not an ONNX model (protobuf parse error: {_one_line(e)})") from e
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror or e}") from e
    if not model.HasField("graph"):
        raise ModelError(f"{path} is not an ONNX model (it has no graph)")
    base = path.resolve().parent
    for t in all_tensors(model):
        if _is_external(t):
            _check_external_file(t, base, path)
    try:
        onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ModelError(f"{path} fails the ONNX checker: {_one_line(e)}") from e
    external = [t for t in all_tensors(model) if _is_external(t)]
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(base))
    except (OSError, ValueError, onnx.checker.ValidationError) as e:  # the last: a path it will not open
        raise ModelError(f"cannot read the external data of {path}: {_one_line(e)}") from e
    for t in external:  # as if the data had always been inline (onnx sets DEFAULT explicitly)
        t.ClearField("data_location")
    return model


def _check_external_file(t: TensorProto, base: Path, model_path: Path) -> None:
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location")
    if not location:
        raise ModelError(f"{model_path}: tensor {t.name!r} has external data without a location")
    st, why = _file_inside(base, location)
    if why:
        raise ModelError(
            f"{model_path}: tensor {t.name!r} has its external data at {location!r}, {why}; "
            "external data must be a file in the model's folder"
        )
    if st is None:
        raise ModelError(
            f"{model_path}: external data file {location!r} of tensor {t.name!r} not found in {base}"
        )
    offset = int(info.get("offset", 0))
    expected = tensor_nbytes(t)
    length = int(info["length"]) if "length" in info else None
    if length is not None and expected is not None and length != expected:
        raise ModelError(
            f"{model_path}: tensor {t.name!r} has {length} bytes of external data, its shape needs {expected}"
        )
    need = length if length is not None else expected
    size = st.st_size
    if need is not None and offset + need > size:
        raise ModelError(
            f"{model_path}: external data file {location!r} is truncated "
            f"(tensor {t.name!r} needs bytes {offset}..{offset + need}, the file has {size})"
        )


def _file_inside(base: Path, location: str) -> tuple[os.stat_result | None, str]:
    """The ``lstat`` of the regular file that ``location`` names in the folder ``base`` (None when
    nothing is there) and "", or None and why ``location`` names no file of that folder.

    A model file is data from anywhere: its locations may name system files, devices, or links out of
    its folder. They are walked one component at a time without following any symbolic link (ONNX
    reads external data through none either), so nothing outside ``base`` is looked at, let alone
    opened.
    """
    if os.path.isabs(location):
        return None, "an absolute path"
    parts = Path(location).parts
    if ".." in parts:
        return None, "a path that climbs out of its folder ('..')"
    here, st = base, None
    for part in parts:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return None, ""
        except OSError as e:  # a component that is a file, a folder without permission
            return None, f"unreadable ({e.strerror or e})"
        if stat.S_ISLNK(st.st_mode):
            return None, f"through the symbolic link {str(here.relative_to(base))!r}, which is not followed"
    if st is None or not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    return st, ""


def _check_in_memory(model: onnx.ModelProto) -> None:
    """Run onnx.checker; over the protobuf limit, on a skeleton whose weights point to a sparse file."""
    try:
        if total_tensor_bytes(model) < _INLINE_LIMIT:
            onnx.checker.check_model(model)
            return
        with tempfile.TemporaryDirectory(prefix="einopt-check-") as tmp:
            sizes: list[int] = []

            def fn(src: TensorProto, dst: TensorProto) -> None:
                if _large(src, EXTERNAL_MIN_BYTES):
                    _copy_meta(src, dst)
                    n = tensor_nbytes(src) or 0
                    _set_external(dst, "stub.data", sum(sizes), n)
                    sizes.append(n)
                else:
                    dst.CopyFrom(src)

            skeleton = map_tensors(model, fn)
            with open(os.path.join(tmp, "stub.data"), "wb") as f:
                f.truncate(sum(sizes))  # sparse: no disk space used
            path = os.path.join(tmp, "model.onnx")
            with open(path, "wb") as f:
                f.write(_serialize(skeleton))
            onnx.checker.check_model(path)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ModelError(f"the model fails the ONNX checker: {_one_line(e)}") from e


# ----------------------------------------------------------------------------- save


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _temp_file(directory: Path, name: str, temps: list[Path]) -> Iterator[IO[bytes]]:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    temps.append(Path(tmp))
    with os.fdopen(fd, "wb") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())


def write_atomic(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> None:
    """Write a file through ``write(binary_file)`` atomically, with the mode the umask gives.

    The bytes go to a temporary file in the target's directory, which is
    renamed over ``path`` once complete; on any failure it is removed, so no
    partial file is ever left.

    Raises
    ------
    OSError
        The file cannot be written (directory missing, no permission, disk full).
    """
    target = Path(path)
    temps: list[Path] = []
    try:
        with _temp_file(target.absolute().parent, target.name, temps) as f:
            write(f)
        os.replace(temps[0], target)
    except BaseException:
        for tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    external_data: bool | None = None,
    threshold: int = 1 << 30,
) -> None:
    """Write ``model`` to ``path`` atomically.

    Parameters
    ----------
    model
        The model (not modified).
    path
        The output ``.onnx`` file; its directory must exist.
    external_data
        Store tensors of 1 KiB or more in ``<file name>.data`` next to the
        output: ``True`` always, ``False`` never (refused over the 2 GB
        protobuf limit), ``None`` when the model's tensors exceed ``threshold``
        bytes (or the protobuf limit).
    threshold
        Tensor bytes above which ``external_data=None`` selects external data.

    Raises
    ------
    ModelError
        The file cannot be written (the message says why), or
        ``external_data=False`` for a model too large to store inline.

    Notes
    -----
    Each file is written to a temporary file in the output directory and
    renamed over the target, so a failure leaves neither partial output nor
    temporary files. With external data, the data file is renamed first and
    the model file second.
    """
    path = Path(path)
    directory = path.absolute().parent
    total = total_tensor_bytes(model)
    if external_data is False and total > _INLINE_LIMIT:
        raise ModelError(
            f"cannot save {path} without external data: its tensors take {total} bytes (over 2 GB)"
        )
    use_external = external_data if external_data is not None else total > min(threshold, _INLINE_LIMIT)
    if not directory.is_dir():
        raise ModelError(f"cannot write {path}: directory {directory} does not exist")
    _require_loaded(model)
    data_path = directory / f"{path.name}.data"
    temps: list[Path] = []
    data_existed = data_path.exists()
    data_replaced = False
    try:
        if use_external:
            with _temp_file(directory, data_path.name, temps) as f:
                payload = _serialize(_externalize(model, f, data_path.name))
        else:
            payload = _serialize(model)
        with _temp_file(directory, path.name, temps) as f:
            f.write(payload)
        if use_external:
            os.replace(temps[0], data_path)
            data_replaced = True
        os.replace(temps[-1], path)
    except BaseException as e:
        for tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if data_replaced and not data_existed:
            with contextlib.suppress(OSError):
                data_path.unlink()
        if isinstance(e, OSError):
            raise ModelError(f"cannot write {path}: {e.strerror or e}") from e
        raise
    log.debug("saved %s (%s)", path, f"external data {data_path.name}" if use_external else "inline")


# ----------------------------------------------------------------------------- run


def session(
    model: onnx.ModelProto,
    *,
    threads: int | None = None,
    profile_prefix: str | None = None,
    arena: bool = True,
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session for ``model`` (quiet logging).

    Small models are passed as bytes; models with more than ~1.5 GB of tensors
    go through a temporary directory with external data (removed once the
    session has loaded them). After :func:`einopt.runtime.timing.configure_threads`,
    sessions share the process's global thread pool (``threads`` is then
    ignored). ``profile_prefix`` turns on ONNX Runtime's profiler (its JSON
    trace goes to ``profile_prefix*.json``; ``end_profiling()`` names it).
    ``arena=False`` turns off ONNX Runtime's CPU memory arena, which keeps the
    peak memory of a run until the session is gone: right for sessions that
    run once (verification of big models at big batches), wrong for timed ones.
    A model with nodes of domains ONNX Runtime does not run by itself has their session hooks
    prepare the options (:func:`einopt.runtime.sessions.prepare_options`): einopt's generated kernels
    (domain :data:`einopt.opsets.KERNEL_DOMAIN`) get einopt's custom-op library registered and their
    kernels built from their descriptions (or taken from einopt's cache).

    Raises
    ------
    ModelError
        The model references external data that is not loaded, or its kernel nodes are damaged.
    UnsupportedModelError
        ONNX Runtime cannot load the model (its message), or a session hook cannot prepare it.
    """
    _require_loaded(model)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    shared = thread_options()
    threads = shared.get("threads", threads)
    if shared.get("global_pool"):
        options.use_per_session_threads = False
    elif threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if "threads" in shared:  # per-session pools while benchmarking: idle sessions must not spin
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_cpu_mem_arena = arena
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    prepare_options(model, options)  # installed hooks read the model as data: nothing of the file runs
    providers = ["CPUExecutionProvider"]
    try:
        if total_tensor_bytes(model) <= LARGE_MODEL_BYTES:
            return ort.InferenceSession(_serialize(model), options, providers=providers)
        with tempfile.TemporaryDirectory(prefix="einopt-ort-") as tmp:
            path = os.path.join(tmp, "model.onnx")
            with open(path + ".data", "wb") as data:
                skeleton = _externalize(model, data, "model.onnx.data")
            with open(path, "wb") as f:
                f.write(_serialize(skeleton))
            del skeleton
            return ort.InferenceSession(path, options, providers=providers)
    except _ORT_ERRORS as e:
        raise UnsupportedModelError(f"onnxruntime cannot load the model: {_ort_message(e)}") from e


def uses_generated_kernels(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has nodes of einopt's custom-op domain (``ai.einopt``: generated kernels)."""
    return any(o.domain == KERNEL_DOMAIN for o in model.opset_import) or any(
        n.domain == KERNEL_DOMAIN for n in model.graph.node
    )


def _ort_message(e: BaseException) -> str:
    # "[ONNXRuntimeError] : 1 : FAIL : /src/file.cc:256 Function(...) message" -> "FAIL: message"
    text = _one_line(e)
    m = re.match(r"\[ONNXRuntimeError\] : \d+ : (\w+) : (?:\S+:\d+ (?:[^()]*\([^)]*\))* ?)?(.*)", text)
    return f"{m.group(1)}: {m.group(2)}" if m else text


def run(
    model: onnx.ModelProto | ort.InferenceSession,
    feeds: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``model`` (or an existing session) on ``feeds``; return the named ``outputs`` (default: all).

    Raises
    ------
    ModelError
        ONNX Runtime fails while running (bad feeds, or the model fails on them).
    """
    sess = model if isinstance(model, ort.InferenceSession) else session(model, arena=False)
    names = list(outputs) if outputs is not None else [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, dict(feeds), _QUIET_RUN)
    except _ORT_ERRORS as e:
        raise ModelError(f"onnxruntime failed to run the model: {_ort_message(e)}") from e
    return dict(zip(names, values, strict=True))

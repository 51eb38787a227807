"""Verification inputs of an ONNX model: which graph inputs are fed, seeded random values, ``.npz`` files.

:func:`random_inputs` makes reproducible inputs from a seed and
:func:`load_inputs` reads user-given ones, both checked against the declared
element types and shapes of :func:`feed_inputs`. (Also importable from
:mod:`einopt.runtime.modelio`.)
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from einopt.errors import ModelError, UnsupportedModelError

__all__ = ["feed_inputs", "random_inputs", "load_inputs"]

_FLOAT_INPUTS = {TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE}
_ZERO_INPUTS = {
    TensorProto.BOOL,
    TensorProto.INT8,
    TensorProto.INT16,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.UINT8,
    TensorProto.UINT16,
    TensorProto.UINT32,
    TensorProto.UINT64,
}


def feed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller must feed (those without an initializer), in order."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _declared(vi: onnx.ValueInfoProto) -> tuple[int, list[int | str | None] | None]:
    """Element type and dims (int, dim_param or None) of a tensor input; dims None if rank unknown."""
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedModelError(f"input {vi.name!r} is not a tensor ({vi.type.WhichOneof('value')})")
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(int(d.dim_value) if kind == "dim_value" else (d.dim_param or None) if kind else None)
    return tt.elem_type, dims


def _np_dtype(elem_type: int, name: str) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError) as e:
        raise UnsupportedModelError(f"input {name!r} has unsupported element type {elem_type}") from e


def _fmt(dims: Sequence[Any] | None) -> str:
    return "[?]" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _check_shape(
    name: str, dims: list[int | str | None] | None, shape: Sequence[int], bound: dict[str, int]
) -> None:
    if dims is None:
        return
    if len(dims) != len(shape):
        raise ModelError(
            f"input {name!r}: shape {list(shape)} has rank {len(shape)}, the model expects {_fmt(dims)}"
        )
    for d, s in zip(dims, shape, strict=True):
        if isinstance(d, int) and d != s:
            raise ModelError(f"input {name!r}: shape {list(shape)} does not match the model's {_fmt(dims)}")
        if isinstance(d, str):
            if bound.setdefault(d, s) != s:
                raise ModelError(f"input {name!r}: dimension {d} is {s} here but {bound[d]} in another input")


def random_inputs(
    model: onnx.ModelProto, seed: int, shapes: Mapping[str, Sequence[int]] = {}
) -> dict[str, np.ndarray]:
    """Seeded inputs for every fed graph input, in order.

    Floating inputs (float16/32/64) are standard normal; integer and bool
    inputs are zeros (safe as indices). Symbolic or unknown dimensions are 1
    unless ``shapes`` gives the input's full shape (shapes of inputs that have
    an initializer are ignored: they are not fed).

    Raises
    ------
    ModelError
        ``shapes`` names an unknown input or disagrees with a declared shape,
        or an input of unknown rank has no shape in ``shapes``.
    UnsupportedModelError
        An input is not a float, integer or bool tensor.
    """
    inputs = feed_inputs(model)
    unknown = sorted(set(shapes) - {i.name for i in model.graph.input})
    if unknown:
        raise ModelError(
            f"shapes given for unknown inputs {unknown}; the model's inputs are {[i.name for i in inputs]}"
        )
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    bound: dict[str, int] = {}
    for vi in inputs:
        elem, dims = _declared(vi)
        if vi.name in shapes:
            shape = tuple(int(s) for s in shapes[vi.name])
            _check_shape(vi.name, dims, shape, bound)
        elif dims is None:
            raise ModelError(f"input {vi.name!r} has unknown rank: give its shape")
        else:
            shape = tuple(
                d if isinstance(d, int) else bound.get(d, 1) if isinstance(d, str) else 1 for d in dims
            )
            _check_shape(vi.name, dims, shape, bound)
        dtype = _np_dtype(elem, vi.name)
        if elem in _FLOAT_INPUTS:
            out[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif elem in _ZERO_INPUTS:
            out[vi.name] = np.zeros(shape, dtype)
        else:
            raise UnsupportedModelError(f"input {vi.name!r} has type {dtype}: cannot generate values for it")
    return out


def load_inputs(path_npz: str | os.PathLike[str], model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Read model inputs from an ``.npz`` archive and check them against the model's graph inputs.

    Every fed input must be present; inputs backed by an initializer may be
    given to override it. Arrays must have exactly the declared element type
    and a shape matching the declared dims (a symbolic dim takes one value
    across all inputs).

    Raises
    ------
    ModelError
        Missing or unreadable file, unknown or missing names, wrong dtype or shape.
    """
    path = Path(path_npz)
    if not path.is_file():
        raise ModelError(f"inputs file not found: {path}")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ModelError(f"{path} is a single .npy array, not an .npz archive of named inputs")
        with loaded as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, ModelError):
            raise
        raise ModelError(f"cannot read {path} as an .npz archive: {' '.join(str(e).split())}") from e
    all_inputs = {i.name: i for i in model.graph.input}
    required = [i.name for i in feed_inputs(model)]
    unknown = sorted(set(arrays) - set(all_inputs))
    if unknown:
        raise ModelError(f"{path}: arrays {unknown} are not model inputs (the inputs are {required})")
    missing = [n for n in required if n not in arrays]
    if missing:
        raise ModelError(f"{path}: missing inputs {missing}")
    out: dict[str, np.ndarray] = {}
    bound: dict[str, int] = {}
    for name, vi in all_inputs.items():
        if name not in arrays:
            continue
        elem, dims = _declared(vi)
        a = arrays[name]
        want = _np_dtype(elem, name)
        if a.dtype != want:
            raise ModelError(f"{path}: input {name!r} has dtype {a.dtype}, the model expects {want}")
        _check_shape(name, dims, a.shape, bound)
        out[name] = a
    return out

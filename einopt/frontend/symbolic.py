"""Symbolic dimensions: the values a model is searched at, the shapes its output is verified at, and
the output's declarations put back.

A model exported with symbolic dimensions (``batch``, ``sequence``, ``height``, ...) is searched at
one *representative* value of each (:func:`representative`: the user's ``--dim NAME=VALUE``, else a
value in the user's inputs (``--inputs``), else a default by the dimension's name,
:data:`DEFAULTS`), and its output declares the input's symbolic
dimensions again (:func:`keep_symbolic`). Whether a rewrite holds at other values is checked, not
assumed: the output is verified at every assignment of :func:`check_assignments`, and a rewrite that
fails at one (a Reshape written for the representative batch, say) is left out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import onnx

from einopt.errors import ModelError

__all__ = [
    "DEFAULTS",
    "Dims",
    "check_assignments",
    "keep_symbolic",
    "representative",
    "seen_values",
    "shapes_at",
    "symbolic_inputs",
]

DEFAULTS: tuple[tuple[str, int], ...] = (
    (r"(?i)^(n|b|bs|batch|batch_?size|.*batch.*)$", 1),
    (r"(?i)^(s|l|t|seq|seq_?len(gth)?|sequence(_?length)?|.*seq.*|tokens?|time|steps?|length)$", 128),
    (r"(?i)^(h|w|height|width|.*height.*|.*width.*|size|image_?size|spatial.*)$", 224),
)
"""Representative values by a symbolic dimension's name (a regular expression, first match wins):
batch 1, a sequence of 128, images of 224 x 224. A dimension none of them names needs ``--dim``."""


@dataclasses.dataclass(frozen=True)
class Dims:
    """The symbolic dimensions of a model's inputs, and the value each is searched at.

    Parameters
    ----------
    values : mapping
        Dimension name -> its representative value.
    inputs : mapping
        Input name -> its dims, a name for a symbolic one and an int for a fixed one.
    unresolved : tuple of str
        Symbolic dimensions without a value (no ``--dim``, no default): their inputs stay symbolic
        and the parts that depend on them pass through.
    """

    values: Mapping[str, int]
    inputs: Mapping[str, tuple[int | str, ...]]
    unresolved: tuple[str, ...] = ()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The inputs with every dimension resolved, at the representative values."""
        return shapes_at(self, self.values)


def symbolic_inputs(model: onnx.ModelProto, pinned: Mapping[str, Sequence[int]]) -> dict[str, tuple]:
    """Graph inputs (not initializers, not ``pinned``) with a symbolic dimension: name -> their dims
    (a name, ``"?"`` for an unnamed symbolic one, or an int)."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, tuple] = {}
    for vi in model.graph.input:
        if vi.name in inits or vi.name in pinned or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
        if any(isinstance(d, str) for d in dims):
            out[vi.name] = dims
    return out


def representative(
    model: onnx.ModelProto,
    given: Mapping[str, int],
    pinned: Mapping[str, Sequence[int]] = {},
    seen: Mapping[str, int] = {},
) -> Dims:
    """The representative value of every symbolic dimension of ``model``'s inputs that ``pinned``
    does not pin: ``given`` (``--dim``) first, then ``seen`` (their values in the user's inputs,
    :func:`seen_values`), else :data:`DEFAULTS` by name.

    Raises
    ------
    ModelError
        ``given`` names a dimension the model's inputs do not have, or a value below 1.
    """
    inputs = symbolic_inputs(model, pinned)
    names = {d for dims in inputs.values() for d in dims if isinstance(d, str) and d != "?"}
    unknown = sorted(set(given) - names)
    if unknown:
        have = ", ".join(sorted(names)) or "none"
        raise ModelError(f"--dim names {', '.join(unknown)}, not a symbolic dimension of the inputs ({have})")
    bad = sorted(n for n, v in given.items() if int(v) < 1)
    if bad:
        raise ModelError(f"--dim {bad[0]}={given[bad[0]]}: a dimension is at least 1")
    values: dict[str, int] = {}
    unresolved: list[str] = []
    for name in sorted(names):
        value = (
            given.get(name)
            or seen.get(name)
            or next((v for pattern, v in DEFAULTS if re.match(pattern, name)), None)
        )
        if value is None:
            unresolved.append(name)
        else:
            values[name] = int(value)
    if any(d == "?" for dims in inputs.values() for d in dims):
        unresolved.append("?")
    resolved = {
        n: dims for n, dims in inputs.items() if all(not isinstance(d, str) or d in values for d in dims)
    }
    return Dims(values, resolved, tuple(unresolved))


def seen_values(model: onnx.ModelProto, feeds: Mapping[str, object]) -> dict[str, int]:
    """The values of ``model``'s named symbolic dimensions in ``feeds`` (arrays by input name: the
    user's inputs, at the shape a deployment runs), where an input of that rank is given."""
    out: dict[str, int] = {}
    for name, dims in symbolic_inputs(model, {}).items():
        shape = getattr(feeds.get(name), "shape", None)
        if shape is None or len(shape) != len(dims):
            continue
        for d, v in zip(dims, shape, strict=True):
            if isinstance(d, str) and d != "?":
                out.setdefault(d, int(v))
    return out


def shapes_at(dims: Dims, values: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The inputs of ``dims`` with each symbolic dimension at ``values``."""
    return {n: tuple(values[d] if isinstance(d, str) else d for d in ds) for n, ds in dims.inputs.items()}


def check_assignments(dims: Dims) -> list[dict[str, int]]:
    """The values the output is verified at besides the representative ones: every dimension at 1,
    then every dimension at an odd value other than any representative one and each its own (a batch
    of 3, a sequence or an image side of about half the representative value, made odd; a width 2
    more than its height)."""
    ones = {n: 1 for n in dims.values}
    odd: dict[str, int] = {}
    for n, v in dims.values.items():  # each its own value: a height swapped for a width shows
        k = _odd(n, v)
        while k in odd.values() or k in dims.values.values():
            k += 2
        odd[n] = k
    out = [a for a in (ones, odd) if a != dims.values]
    return [a for k, a in enumerate(out) if a not in out[:k]]


def _odd(name: str, value: int) -> int:
    if re.match(DEFAULTS[0][0], name):
        return 3 if value != 3 else 5
    half = max(3, value // 2) | 1
    return half if half != value else half + 2


def keep_symbolic(out: onnx.ModelProto, original: onnx.ModelProto) -> onnx.ModelProto:
    """``out`` (searched and written at representative shapes) declaring ``original``'s graph inputs
    and outputs again, symbolic dimensions included, and no inferred shapes of intermediate values
    (they held at the representative values only)."""
    declared = {vi.name: vi for vi in (*original.graph.input, *original.graph.output)}
    m = onnx.ModelProto()
    m.CopyFrom(out)
    for vi in (*m.graph.input, *m.graph.output):
        if vi.name in declared:
            vi.type.CopyFrom(declared[vi.name].type)
    del m.graph.value_info[:]
    return m

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
    "DimRange",
    "Dims",
    "parse_dim",
    "check_assignments",
    "second_probe",
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
class DimRange:
    """The values a symbolic dimension is declared to take (``--dim sequence=1..512``, or
    ``--dim sequence=64..512/64`` for multiples of 64): its rewrites are kept only where they hold at
    such values, and it is verified at the smallest and the largest of them."""

    lo: int
    hi: int
    step: int = 1

    def __post_init__(self) -> None:
        if self.lo < 1 or self.step < 1 or self.hi < self.lo:
            raise ModelError(f"{self.text()}: need 1 <= LO <= HI and a STEP of at least 1")
        if self.low > self.hi:
            raise ModelError(f"{self.text()}: no multiple of {self.step} in {self.lo}..{self.hi}")

    def holds(self, value: int) -> bool:
        return self.lo <= value <= self.hi and value % self.step == 0

    @property
    def low(self) -> int:
        return -(-self.lo // self.step) * self.step

    @property
    def high(self) -> int:
        return self.hi // self.step * self.step

    def nearest(self, target: int, avoid: Sequence[int] = (), odd: bool = False) -> int | None:
        """The declared value nearest ``target`` (odd ones first with ``odd``) not in ``avoid``."""
        values = range(self.low, self.high + 1, self.step)
        allowed = [v for v in values if v not in avoid]
        if odd and any(v % 2 for v in allowed):
            allowed = [v for v in allowed if v % 2]
        return min(allowed, key=lambda v: (abs(v - target), v), default=None)

    def text(self) -> str:
        return f"{self.lo}..{self.hi}" + (f"/{self.step}" if self.step != 1 else "")


def parse_dim(spec: str) -> tuple[str, int | None, DimRange | None]:
    """``NAME=VALUE``, ``NAME=LO..HI`` or ``NAME=LO..HI/STEP`` (``--dim``): the name, the value and
    the declared range (either may be None).

    Raises
    ------
    ModelError
        Not one of those forms.
    """
    form = re.fullmatch(r"\s*([^=\s]+)\s*=\s*(?:(\d+)|(\d+)\s*\.\.\s*(\d+)(?:\s*/\s*(\d+))?)\s*", spec)
    if form is None:
        raise ModelError(f"{spec!r} is not NAME=VALUE, NAME=LO..HI or NAME=LO..HI/STEP")
    name, value, lo, hi, step = form.groups()
    if value is not None:
        if int(value) < 1:
            raise ModelError(f"{spec!r}: a dimension is at least 1")
        return name, int(value), None
    return name, None, DimRange(int(lo), int(hi), int(step or 1))


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
    ranges : mapping
        Dimension name -> the values it is declared to take (``--dim NAME=LO..HI[/STEP]``); a
        dimension not named takes any value of at least 1.
    """

    values: Mapping[str, int]
    inputs: Mapping[str, tuple[int | str, ...]]
    unresolved: tuple[str, ...] = ()
    ranges: Mapping[str, DimRange] = dataclasses.field(default_factory=dict)

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
    ranges: Mapping[str, DimRange] = {},
) -> Dims:
    """The representative value of every symbolic dimension of ``model``'s inputs that ``pinned``
    does not pin: ``given`` (``--dim``) first, then ``seen`` (their values in the user's inputs,
    :func:`seen_values`), else :data:`DEFAULTS` by name; with a declared range (``ranges``), the
    default's nearest declared value (the middle of the range for a name without a default).

    Raises
    ------
    ModelError
        ``given`` or ``ranges`` name a dimension the model's inputs do not have, a value below 1, or
        a value (given, or seen in the inputs) outside the dimension's declared range.
    """
    inputs = symbolic_inputs(model, pinned)
    names = {d for dims in inputs.values() for d in dims if isinstance(d, str) and d != "?"}
    unknown = sorted((set(given) | set(ranges)) - names)
    if unknown:
        have = ", ".join(sorted(names)) or "none"
        raise ModelError(f"--dim names {', '.join(unknown)}, not a symbolic dimension of the inputs ({have})")
    bad = sorted(n for n, v in given.items() if int(v) < 1)
    if bad:
        raise ModelError(f"--dim {bad[0]}={given[bad[0]]}: a dimension is at least 1")
    values: dict[str, int] = {}
    unresolved: list[str] = []
    for name in sorted(names):
        declared = ranges.get(name)
        for where, value in (("--dim", given.get(name)), ("--inputs", seen.get(name))):
            if value is not None and declared is not None and not declared.holds(int(value)):
                raise ModelError(
                    f"{where} runs {name} at {value}, outside its declared range {declared.text()}"
                )
        value = given.get(name) or seen.get(name)
        if value is None:
            default = next((v for pattern, v in DEFAULTS if re.match(pattern, name)), None)
            if declared is not None:
                value = declared.nearest(default or (declared.low + declared.high) // 2)
            else:
                value = default
        if value is None:
            unresolved.append(name)
        else:
            values[name] = int(value)
    if any(d == "?" for dims in inputs.values() for d in dims):
        unresolved.append("?")
    resolved = {
        n: dims for n, dims in inputs.items() if all(not isinstance(d, str) or d in values for d in dims)
    }
    return Dims(values, resolved, tuple(unresolved), {n: r for n, r in ranges.items() if n in values})


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
    more than its height). A dimension with a declared range (:class:`DimRange`) is at its smallest
    declared value first, at the declared value nearest that odd one next, and at its largest last."""
    low = {n: dims.ranges[n].low if n in dims.ranges else 1 for n in dims.values}
    other: dict[str, int] = {}
    for n, v in dims.values.items():  # each its own value: a height swapped for a width shows
        declared = dims.ranges.get(n)
        k = _own(declared, _odd(n, v), [*other.values(), *dims.values.values()])
        other[n] = k or declared.nearest(v, [v]) or v
    high = {n: dims.ranges[n].high if n in dims.ranges else v for n, v in dims.values.items()}
    out = [a for a in (low, other, *([high] if dims.ranges else [])) if a != dims.values]
    return [a for k, a in enumerate(out) if a not in out[:k]]


def second_probe(dims: Dims, first: Mapping[str, int]) -> list[dict[str, int]]:
    """Values of the dimensions besides the representative ones and ``first`` (the odd check values)
    at which the output's sizes are checked once more (:mod:`einopt.stages.generalize`), best
    first: as far above the representative value as ``first`` is below it (a batch: 4 more than
    ``first``), then half-way between ``first`` and the representative value (a model may take no
    longer sequence than the one it is searched at); odd and each its own, a declared range's
    nearest value. Two values of a dimension that are both small can agree by accident (a Slice of
    the last 3 rows of a batch of 1 and of 3 reads it whole); these are larger."""
    out = []
    for above in (True, False):
        values: dict[str, int] = {}
        for n, v in dims.values.items():
            f = first.get(n, v)
            if above:
                target = 2 * v - f if 2 * v - f > f + 1 else f + 4
            else:
                target = (f + v) // 2 if abs(v - f) > 3 else f + 2
            avoid = [*values.values(), *dims.values.values(), *first.values(), 1]
            values[n] = _own(dims.ranges.get(n), target, avoid) or f
        if values not in out:
            out.append(values)
    return out


def _own(declared: DimRange | None, target: int, avoid: Sequence[int]) -> int | None:
    """The value nearest ``target`` that is odd (where the declared values have odd ones) and not in
    ``avoid``: ``target`` made odd, and 2 more until free; among ``declared`` values, None when they
    are all taken."""
    if declared is not None:
        return declared.nearest(target, avoid, odd=True)
    k = target | 1
    while k in avoid:
        k += 2
    return k


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


def declared_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | str | None, ...]]:
    """The dims ONNX shape inference gives ``model``'s values from its graph inputs' symbolic ones, for
    the values that have one it cannot tell as a number: a name where it carries one through, None
    where it cannot say (what ONNX Runtime knows of them in the output)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):  # noqa: PERF203 - too large, or invalid
        return {}
    out: dict[str, tuple[int | str | None, ...]] = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        if not all(isinstance(d, int) for d in dims):
            out[vi.name] = dims
    return out

"""Compiled kernels: calling convention, input checks, device runs.

Nothing here imports TVM at module level; a ``CompiledKernel`` only exists
after ``einopt.codegen.build`` (which imports TVM) made one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np

from einopt.core.ir import Program, Scope, Tensor

__all__ = ["CompiledKernel", "PreparedCall", "DeviceUnavailableError", "OutputSpec"]

RESULT_DTYPE = "float32"


class DeviceUnavailableError(RuntimeError):
    """The kernel was compiled for a device this machine does not have."""


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output: its name (``None`` for a scope), the parameter holding it,
    the buffer's shape, and the slices that cut the result out of a padded buffer."""

    name: str | None
    param: int
    buffer_shape: tuple[int, ...]
    view: tuple[slice, ...] | None


class CompiledKernel:
    """A compiled scope or program, called with its inputs by name.

    ``kernel(A=a, K=k)`` returns a float32 numpy array for a scope, or a dict
    from output name to array for a program. Inputs are converted to each
    tensor's dtype; missing, unexpected or misshapen inputs raise
    ``TypeError`` / ``ValueError`` naming the tensor.

    Attributes
    ----------
    node : Scope or Program
        The expression compiled (the first one of its key, for cached kernels).
    target : str
        The target as passed to ``compile``.
    inputs : tuple of Tensor
        The input tensors in parameter order (sorted by name).
    source : str
        The scheduled TIR of the kernel (TVMScript text).
    device_source : str or None
        Device code (CUDA C for ``target="cuda"``), else ``None``.
    scheduled : bool
        False if the schedule failed and the kernel runs unscheduled loops.
    module
        The TVM runtime module.
    """

    def __init__(
        self,
        node: Scope | Program,
        target: str,
        inputs: tuple[Tensor, ...],
        outputs: tuple[OutputSpec, ...],
        module: Any,
        source: str,
        device_source: str | None = None,
        scheduled: bool = True,
    ) -> None:
        self.node = node
        self.target = target
        self.inputs = inputs
        self.outputs = outputs
        self.module = module
        self.source = source
        self.device_source = device_source
        self.scheduled = scheduled
        self.n_params = len(inputs) + len({o.param for o in outputs})

    @property
    def on_gpu(self) -> bool:
        return self.device_source is not None

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}{list(t.shape)}" for t in self.inputs)
        outs = ", ".join(f"{o.name or 'result'}{list(_result_shape(o))}" for o in self.outputs)
        return f"<CompiledKernel {self.target}: ({ins}) -> ({outs})>"

    def __call__(self, **inputs: Any) -> np.ndarray | dict[str, np.ndarray]:
        call = self.prepare(**inputs)
        call.run()
        return call.results()

    def check_inputs(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """The inputs as contiguous arrays of each tensor's dtype, in parameter order."""
        names = {t.name for t in self.inputs}
        missing = [t.name for t in self.inputs if t.name not in inputs]
        unexpected = sorted(set(inputs) - names)
        if missing or unexpected:
            wanted = ", ".join(f"{t.name}{list(t.shape)}" for t in self.inputs)
            parts = []
            if missing:
                parts.append(f"missing input(s) {', '.join(missing)}")
            if unexpected:
                parts.append(f"unexpected input(s) {', '.join(unexpected)}")
            raise TypeError(f"{'; '.join(parts)} (the kernel takes {wanted})")
        out = []
        for t in self.inputs:
            arr = np.asarray(inputs[t.name])
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"input {t.name} must be a real numeric array, got dtype {arr.dtype}")
            if arr.shape != t.shape:
                raise ValueError(f"input {t.name} must have shape {t.shape}, got {arr.shape}")
            out.append(np.ascontiguousarray(arr, dtype=t.dtype))
        return out

    def prepare(self, **inputs: Any) -> PreparedCall:
        """Check and copy the inputs to the device and allocate the outputs; ``.run()`` runs the kernel.

        Benchmarks time ``run()`` alone, without the copies.
        """
        arrays = self.check_inputs(inputs)
        import tvm  # noqa: PLC0415 - a kernel exists only once TVM is loaded

        dev = self._device(tvm)
        args = [tvm.runtime.tensor(a, dev) for a in arrays]
        shapes: dict[int, tuple[int, ...]] = {}
        for o in self.outputs:
            shapes.setdefault(o.param, o.buffer_shape)
        for p in sorted(shapes):
            args.append(tvm.runtime.empty(shapes[p], RESULT_DTYPE, dev))
        return PreparedCall(self, args, dev)

    def _device(self, tvm: Any) -> Any:
        if not self.on_gpu:
            return tvm.cpu()
        if not tvm.cuda().exist:
            cupy = "installed" if importlib.util.find_spec("cupy") is not None else "not installed"
            raise DeviceUnavailableError(
                "running CUDA kernels needs an NVIDIA GPU and cupy (pip install einopt[cuda]), "
                f"with a CUDA-enabled TVM runtime; no CUDA device was found (cupy: {cupy}). "
                "The generated CUDA source is in kernel.device_source."
            )
        return tvm.cuda()


class PreparedCall:
    """A kernel bound to device arrays: ``run()`` executes it, ``results()`` copies the outputs back."""

    def __init__(self, kernel: CompiledKernel, args: list, device: Any) -> None:
        self.kernel = kernel
        self.args = args
        self.device = device
        self._function = kernel.module["main"]

    def run(self) -> None:
        self._function(*self.args)
        if self.kernel.on_gpu:
            self.device.sync()

    def results(self) -> np.ndarray | dict[str, np.ndarray]:
        k = self.kernel
        out: dict[str | None, np.ndarray] = {}
        for o in k.outputs:
            arr = self.args[len(k.inputs) + o.param].numpy()  # a fresh copy per output
            out[o.name] = np.ascontiguousarray(arr[o.view]) if o.view is not None else arr
        if isinstance(k.node, Scope):
            return out[None]
        return {name: arr for name, arr in out.items() if name is not None}


def _result_shape(o: OutputSpec) -> tuple[int, ...]:
    if o.view is None:
        return o.buffer_shape
    return tuple(s.stop - s.start for s in o.view)

"""Code generation: einopt expressions to TVM kernels (CPU via LLVM, CUDA).

    kernel = einopt.codegen.compile(conv)     # LLVM, this CPU
    y = kernel(A=a, K=k)                      # numpy in, numpy out
    kernel.source                             # the scheduled TIR (TVMScript)
    einopt.codegen.cuda_source(conv)          # CUDA C; needs no GPU

Each scope becomes one TE stage (``einopt.codegen.te``), scheduled for memory
bandwidth (``einopt.codegen.schedule``) and built by TVM
(``einopt.codegen.build``). Kernels are cached per process by the
expression's canonical key, so expressions equal up to renaming share a build.

Importing this package does not import TVM (it takes over a second to load);
compiling does.
"""

from __future__ import annotations

import threading

from einopt.codegen.kernel import CompiledKernel, DeviceUnavailableError, PreparedCall
from einopt.core.ir import IRError, Program, Scope
from einopt.core.keys import key

__all__ = [
    "compile",
    "cuda_source",
    "CompiledKernel",
    "PreparedCall",
    "DeviceUnavailableError",
]

_CACHE: dict[tuple, CompiledKernel] = {}
_LOCK = threading.Lock()


def compile(node: Scope | Program, target: str = "llvm") -> CompiledKernel:  # noqa: A001 - the public name
    """Compile a scope or a program to a kernel callable with numpy arrays.

    Parameters
    ----------
    node : Scope or Program
        The expression.
    target : str
        ``"llvm"`` (this CPU, default) or ``"cuda"``; other strings are passed
        to ``tvm.target.Target``.

    Returns
    -------
    CompiledKernel
        ``kernel(A=a, ...)`` returns a float32 array (scope) or a dict of
        arrays by output name (program). The same object is returned for
        every expression with the same canonical key (``einopt.core.keys.key``).

    Raises
    ------
    IRError
        If ``node`` is not a scope or program, or two of its tensors share a name.
    ValueError
        On an unknown target.
    """
    if not isinstance(node, (Scope, Program)):
        raise IRError(f"can only compile a Scope or a Program, got {type(node).__name__}")
    if not isinstance(target, str):
        raise TypeError(f"target must be a string such as 'llvm' or 'cuda', got {target!r}")

    # A program's key ignores output names, which name the results here.
    cache_key = (key(node), target, node.outputs if isinstance(node, Program) else None)
    with _LOCK:
        kernel = _CACHE.get(cache_key)
        if kernel is None:
            # TVM: loaded only when a kernel is compiled
            from einopt.codegen.build import build

            kernel = _CACHE[cache_key] = build(node, target)
    return kernel


def cuda_source(node: Scope | Program) -> str:
    """CUDA C source of ``node`` (builds for target ``"cuda"``; needs no GPU)."""
    return compile(node, "cuda").device_source

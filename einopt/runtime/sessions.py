"""ONNX Runtime sessions of models whose nodes ONNX Runtime cannot run by itself.

ONNX Runtime runs the operators of ONNX and its own (:data:`BUILTIN_DOMAINS`). A node of another
domain runs only once something has registered its operator in the session's options: einopt's
generated kernels (domain ``ai.einopt``, :data:`einopt.opsets.KERNEL_DOMAIN`) need einopt's custom-op
library and the kernels their nodes describe, built by the TVM backend. The runtime names no backend:
it finds a domain's *session hook* among the installed Python entry points of the group
``einopt.session_domains`` (entry name: the domain; value: ``module:function``; einopt declares its
own in ``pyproject.toml``), and calls it with the model and the session's options.

A hook is installed code, chosen by the domain alone: a model file is data, and opening one never runs
code that came inside it (the hook reads the model as data, and refuses what it would have to run).

``session("out.onnx")`` opens a model written with ``--kernels tvm`` in ONNX Runtime::

    sess = einopt.runtime.session("out.onnx")
    outputs = sess.run(None, feeds)
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from einopt.errors import ModelError, UnsupportedModelError
from einopt.opsets import DEFAULT_DOMAINS, KERNEL_DOMAIN

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["BUILTIN_DOMAINS", "HOOK_GROUP", "prepare_options", "read_model", "session", "session_hook"]

HOOK_GROUP = "einopt.session_domains"
"""The entry-point group of session hooks: ``"<domain>" = "module:function"``."""

BUILTIN_DOMAINS = frozenset(
    {*DEFAULT_DOMAINS, "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training"}
    | {"com.microsoft", "com.microsoft.experimental", "com.microsoft.nchwc", "com.ms.internal.nhwc"}
    | {"org.pytorch.aten"}
)
"""The operator domains of ONNX and of ONNX Runtime's CPU build: no hook is looked up for them."""

SessionHook = Callable[[onnx.ModelProto, Any], None]


@functools.cache
def _entry_points() -> dict[str, EntryPoint]:
    """The installed session hooks by domain, read once per process."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=HOOK_GROUP)}


def session_hook(domain: str) -> SessionHook | None:
    """The session hook that installed code registers for ``domain``, or None.

    The hook is ``function(model, options)``: it prepares ``options`` (an
    ``onnxruntime.SessionOptions``) to run the ``domain`` nodes of ``model`` (an ``onnx.ModelProto``,
    read as data), and raises :class:`~einopt.errors.UnsupportedModelError` (or
    :class:`~einopt.errors.ModelError`) with a clear message where it cannot. Hooks are entry points
    of the group :data:`HOOK_GROUP` declared by installed packages, never anything of a model file.

    Raises
    ------
    UnsupportedModelError
        The hook's module cannot be imported.
    """
    found = _entry_points().get(domain)
    if found is None:
        return None
    try:
        return found.load()
    except (ImportError, AttributeError) as e:
        raise UnsupportedModelError(
            f"the session hook of domain {domain!r} ({found.value}) fails: {e}"
        ) from e


def foreign_domains(model: onnx.ModelProto) -> list[str]:
    """The domains ``model`` imports or its nodes use that ONNX Runtime does not run by itself, sorted."""
    used = {o.domain for o in model.opset_import} | {n.domain for n in model.graph.node}
    used |= {o.domain for f in model.functions for o in f.opset_import}
    return sorted(used - BUILTIN_DOMAINS)


def prepare_options(model: onnx.ModelProto, options: Any) -> None:
    """Prepare ``options`` (an ``onnxruntime.SessionOptions``) for ``model``'s foreign domains.

    Each domain of :func:`foreign_domains` with a session hook (:func:`session_hook`) has it called;
    a domain without one is left to ONNX Runtime (a model-local function's, or one ONNX Runtime
    refuses itself). A model of only ONNX's and ONNX Runtime's domains looks up nothing.

    Raises
    ------
    UnsupportedModelError
        A hook cannot prepare the model (its message: e.g. no C compiler to build einopt's
        kernels), or the model has einopt's generated kernels and einopt is not installed (run from
        a source tree, no hook is registered).
    ModelError
        A hook finds the model's nodes damaged.
    """
    for domain in foreign_domains(model):
        hook = session_hook(domain)
        if hook is not None:
            hook(model, options)
        elif domain == KERNEL_DOMAIN:
            raise UnsupportedModelError(
                f"the model runs einopt's generated kernels (domain {KERNEL_DOMAIN}), which need einopt "
                "installed (pip install einopt, or pip install -e . in its source tree): no session hook "
                f"is registered for them (entry points {HOOK_GROUP!r})"
            )


def read_model(model: str | Path | bytes) -> onnx.ModelProto:
    """The model of a file (without its external data) or of serialised bytes, as data.

    Raises
    ------
    ModelError
        The file cannot be read, or is no ONNX model.
    """
    try:
        if isinstance(model, bytes):
            return onnx.load_model_from_string(model)
        return onnx.load_model(str(model), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, OSError, onnx's own errors
        raise ModelError(f"cannot read the model: {e}") from None


_GLOBAL_POOL_ERROR = "use_per_session_threads must be false when using a global thread pool"


@functools.cache
def _global_pool() -> bool:
    """Whether this process runs ONNX Runtime with a global thread pool (``set_global_thread_pool_sizes``),
    where every session must say it uses it: asked once, of a one-node session (ORT's environment, made
    with the first session, cannot change afterwards)."""
    import onnxruntime
    from onnx import TensorProto, helper

    v = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [v],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # ORT prints its failed attempt and its retry
            onnxruntime.InferenceSession(probe, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own error types
        if _GLOBAL_POOL_ERROR in str(e):
            return True
        raise
    return False


def session(
    path: str | Path | bytes,
    options: Any = None,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    *,
    global_threads: bool | None = None,
) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``path`` that runs einopt's generated kernels.

    Parameters
    ----------
    path
        A model file (its external data is read by ONNX Runtime, from its folder) or model bytes.
    options
        The ``onnxruntime.SessionOptions`` to prepare and use (new ones if None).
    providers
        ONNX Runtime's execution providers, in order of preference.
    global_threads
        Whether the session uses the process's global thread pool (ONNX Runtime's
        ``use_per_session_threads = False``); None uses it where the process has one, as servers and
        benchmarks that call ``set_global_thread_pool_sizes`` do.

    Returns
    -------
    onnxruntime.InferenceSession
        The session, its options prepared by the session hooks of the model's domains
        (:func:`prepare_options`): for ``ai.einopt``, einopt's custom-op library registered and the
        kernels the nodes describe built for this CPU (or taken from einopt's cache).

    Raises
    ------
    ModelError
        The model cannot be read, or its kernel nodes are damaged or altered.
    UnsupportedModelError
        Its kernels cannot be built here (no C compiler), einopt is not installed, or a node carries
        no kernel description.
    einopt.runtime.cache.CacheTrustError
        einopt's cache folder is another user's, or others can write it.
    """
    import onnxruntime

    options = options if options is not None else onnxruntime.SessionOptions()
    prepare_options(read_model(path), options)
    if global_threads or (global_threads is None and _global_pool()):
        options.use_per_session_threads = False
    model = path if isinstance(path, bytes) else str(path)
    return onnxruntime.InferenceSession(model, options, providers=list(providers))

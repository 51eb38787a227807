"""The eOperator backends: the registry, the public names kept, and no stage that tests a name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import einopt
from einopt.backends import BACKENDS, backend
from einopt.backends.tvm import TVM
from einopt.instantiate.backend import PORTABLE
from einopt.runtime import modelio

EINOPT = Path(einopt.__file__).resolve().parent


def test_registry_names_each_backend_once():
    assert BACKENDS == {"onnx": PORTABLE, "tvm": TVM}
    assert all(backend(name).name == name for name in BACKENDS)


def test_an_unknown_backend_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="kernels must be one of onnx, tvm, not 'cuda'"):
        backend("cuda")
    with pytest.raises(ValueError, match="kernels must be one of onnx, tvm"):
        einopt.Options(kernels="cuda")


def test_the_portable_backend_leaves_every_stage_as_it_is():
    assert not (PORTABLE.fuse_activations or PORTABLE.generates_kernels or PORTABLE.fewer_nodes)
    assert PORTABLE.variants([]) == [] and PORTABLE.after_selection(None, {"p": 1}) == {"p": 1}


def test_the_documented_kernel_runtime_names_are_the_tvm_backends():
    import einopt.runtime.kernels as public
    from einopt.backends.tvm import kernels

    for name in public.__all__:
        assert getattr(public, name) is getattr(kernels, name), name
    assert public.DOMAIN == modelio.KERNEL_DOMAIN


def test_no_module_outside_the_registry_and_the_cli_names_a_backend():
    """A third backend is a new entry in the registry, not another round of ``if`` in the stages
    (a numpydoc type line, ``kernels : {"onnx", "tvm"}``, may name them)."""
    allowed = {EINOPT / "backends" / "tvm" / "__init__.py", EINOPT / "cli" / "model.py"}
    doc_type = re.compile(r"^\s*\w+ : \{")
    found = [
        f"{path.relative_to(EINOPT)}:{k}: {line.strip()}"
        for path in sorted(EINOPT.rglob("*.py"))
        if path not in allowed
        for k, line in enumerate(path.read_text().splitlines(), 1)
        if '"tvm"' in line and not doc_type.match(line)
    ]
    assert not found, "\n".join(found)

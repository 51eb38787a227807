"""The eOperator backends: the registry, the session hook the TVM backend registers, and no stage that
tests a name."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

import einopt
from einopt.backends import BACKENDS, backend
from einopt.backends.tvm import TVM
from einopt.errors import UnsupportedModelError
from einopt.instantiate.backend import PORTABLE
from einopt.opsets import KERNEL_DOMAIN
from einopt.runtime import modelio, sessions

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


def test_the_tvm_backend_registers_the_session_hook_of_its_domain():
    from importlib.metadata import entry_points

    from einopt.backends.tvm import kernels

    (found,) = [ep for ep in entry_points(group=sessions.HOOK_GROUP) if ep.name == KERNEL_DOMAIN]
    assert callable(found.load()) and found.load() is kernels.prepare_session
    assert sessions.session_hook(KERNEL_DOMAIN) is kernels.prepare_session
    assert kernels.DOMAIN == KERNEL_DOMAIN


def test_without_the_hook_a_model_with_generated_kernels_says_einopt_must_be_installed(monkeypatch):
    model = onnx.helper.make_model(
        onnx.helper.make_graph([], "g", [], []),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid(KERNEL_DOMAIN, 1)],
    )
    monkeypatch.setattr(sessions, "_entry_points", dict)
    with pytest.raises(UnsupportedModelError, match=r"need einopt installed \(pip install"):
        sessions.prepare_options(model, None)
    with pytest.raises(UnsupportedModelError, match="need einopt installed"):
        modelio.session(model)


def test_a_model_of_builtin_domains_looks_up_no_hook(monkeypatch):
    def refuse() -> dict:
        raise AssertionError("looked up the session hooks")

    model = onnx.helper.make_model(
        onnx.helper.make_graph([], "g", [], []),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.microsoft", 1)],
    )
    monkeypatch.setattr(sessions, "_entry_points", refuse)
    assert sessions.foreign_domains(model) == []
    sessions.prepare_options(model, None)


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

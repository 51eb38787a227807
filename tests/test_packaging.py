"""Packaging: rules/ and search/ install as einopt.rules and einopt.search only."""

import importlib
import importlib.metadata
from importlib import resources


def test_subpackages_are_mapped_under_einopt():
    for name in ("einopt.rules", "einopt.search", "einopt.codegen", "einopt.examples"):
        assert importlib.import_module(name).__name__ == name


def test_nothing_top_level_besides_einopt_is_installed():
    files = importlib.metadata.files("einopt") or []
    top = {f.parts[0] for f in files if f.suffix == ".py" and len(f.parts) > 1}
    assert "rules" not in top and "search" not in top, sorted(top)


def test_examples_are_installed_as_package_data():
    names = [p.name for p in resources.files("einopt.examples").iterdir()]
    assert "conv3x3.ein" in names

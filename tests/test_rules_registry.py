"""Every registered rule is numerically tested: examples it matches, near misses it refuses.

The tables come from the ``EXAMPLES`` and ``NEAR_MISSES`` of every
``tests/test_rules_*.py`` module (see ``rules_support``); a rule without an
example or a near miss fails here.
"""

from __future__ import annotations

import importlib
import pathlib

import pytest
from rules_support import apply_all, context, load

from einopt.rules import FAMILIES, REGISTRY, Match, Rule

_HERE = pathlib.Path(__file__).parent


def _tables() -> tuple[dict, dict]:
    examples: dict[str, list] = {}
    near: dict[str, list] = {}
    for path in sorted(_HERE.glob("test_rules_*.py")):
        if path.stem == "test_rules_registry":
            continue
        module = importlib.import_module(path.stem)
        for name, items in getattr(module, "EXAMPLES", {}).items():
            examples.setdefault(name, []).extend(items)
        for name, items in getattr(module, "NEAR_MISSES", {}).items():
            near.setdefault(name, []).extend(items)
    return examples, near


EXAMPLES, NEAR_MISSES = _tables()


def test_registry_is_well_formed():
    assert REGISTRY, "no rules registered"
    for name, rule in REGISTRY.items():
        assert isinstance(rule, Rule)
        assert rule.name == name
        assert rule.family in FAMILIES
        assert rule.math and "\n" not in rule.math
        assert type(rule).__doc__.strip()


def test_tables_name_only_registered_rules():
    unknown = (set(EXAMPLES) | set(NEAR_MISSES)) - set(REGISTRY)
    assert not unknown, f"examples for rules that are not registered: {sorted(unknown)}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_rule_examples_are_equivalent(name):
    examples = EXAMPLES.get(name)
    assert examples, f"rule {name} has no numeric example (add one to EXAMPLES in its test module)"
    for ex in examples:
        program = load(ex.text, ex.shapes)
        applied = apply_all(name, program, context(ex.constants, ex.assumed_finite))
        assert len(applied) >= ex.min_matches, f"{name} matched {len(applied)} times in:\n{program}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_rule_refuses_near_misses_with_reason(name):
    misses = NEAR_MISSES.get(name)
    assert misses, f"rule {name} has no near-miss case (add one to NEAR_MISSES in its test module)"
    rule = REGISTRY[name]
    for nm in misses:
        program = load(nm.text, nm.shapes)
        found = list(rule.match(program, context(nm.constants, nm.assumed_finite)))
        assert not [m for m in found if isinstance(m, Match)], f"{name} matched a near miss:\n{program}"
        reasons = [str(f) for f in found]
        assert any(nm.reason in r for r in reasons), f"{name}: no failure mentions {nm.reason!r}: {reasons}"

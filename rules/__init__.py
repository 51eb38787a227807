"""The derivation rules of method.md section 3 (installed as ``einopt.rules``).

Every rule is a small named object (:class:`~einopt.rules.base.Rule`) with a
``verb_noun`` name, a docstring stating its mathematics, a ``match`` that
yields each place and way it applies (or a near miss with a reason) and a
pure ``apply``. Rules are grouped in one module per family and collected in
:data:`REGISTRY`; the search only enumerates the registry, so adding a rule
means adding it to its module's ``RULES`` table (see the README).

Families:

* ``intra``: rewrite one expression (summation splitting, variable
  substitution, traversal merging, boundary relaxing/tightening, layout).
* ``constant``: rewrites that hold because of facts about constant tensors
  (PRelu slopes), computed from the weights in the :class:`Context`.
* ``inter``: split, merge and fuse expressions of a program.
"""

from __future__ import annotations

import re

from einopt.rules import (
    access,
    boundary,
    constant,
    contraction,
    fusion,
    layout,
    merge,
    split,
    substitution,
    summation,
    traversal,
)
from einopt.rules.base import (
    FAMILIES,
    NO_CONTEXT,
    PHASES,
    Context,
    Failure,
    Match,
    Rule,
    ScopeRule,
    TensorFacts,
)
from einopt.rules.derive import (
    Apply,
    DerivationError,
    NotEquivalentError,
    Trace,
    TraceStep,
    apply_rule,
    check_equivalent,
    derive,
)

__all__ = [
    "REGISTRY",
    "FAMILIES",
    "PHASES",
    "Rule",
    "ScopeRule",
    "Match",
    "Failure",
    "Context",
    "NO_CONTEXT",
    "TensorFacts",
    "get",
    "Apply",
    "Trace",
    "TraceStep",
    "DerivationError",
    "NotEquivalentError",
    "apply_rule",
    "check_equivalent",
    "derive",
]

_MODULES = (
    summation,
    substitution,
    traversal,
    boundary,
    layout,
    access,
    constant,
    split,
    merge,
    contraction,
    fusion,
)
_NAME = re.compile(r"^[a-z]+(_[a-z]+)+$")


def _collect() -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    for module in _MODULES:
        for rule in module.RULES:
            if not _NAME.match(rule.name):
                raise TypeError(f"rule name {rule.name!r} is not verb_noun")
            if rule.name in out:
                raise TypeError(f"two rules named {rule.name}")
            if rule.family not in FAMILIES:
                raise TypeError(f"rule {rule.name}: unknown family {rule.family!r}")
            if rule.phase not in PHASES:
                raise TypeError(f"rule {rule.name}: unknown phase {rule.phase!r}")
            unknown = [n for n in rule.undoes if not _NAME.match(n)]
            if unknown:
                raise TypeError(f"rule {rule.name}: undoes {unknown}, not rule names")
            if not (type(rule).__doc__ or "").strip() or not rule.math:
                raise TypeError(f"rule {rule.name} needs a docstring and a one-line math summary")
            out[rule.name] = rule
    return out


REGISTRY: dict[str, Rule] = _collect()
"""Every rule by name, family by family in module order."""


def get(name: str) -> Rule:
    """The rule called ``name``; ``KeyError`` names the known rules otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no rule named {name!r} (known: {', '.join(sorted(REGISTRY))})") from None

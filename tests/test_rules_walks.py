"""Random walks through the registry: rules applied in sequence stay equivalent.

The search applies rules to the results of rules; these walks start from
random contractions (and small two-scope programs), take a random match of a
random rule at every step, and check each program against the start with the
reference interpreter (float64 and exact integers), its canonical key and its
text round trip.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rules_support import contractions, random_walk

from einopt.core import ir
from einopt.rules import REGISTRY

RULES = list(REGISTRY.values())


@st.composite
def start_programs(draw) -> ir.Program:
    """A contraction, optionally followed by a second binding that reads it (scale, relu or sum)."""
    first = draw(contractions(max_sums=2))
    inputs = list(ir.input_tensors(first))
    bindings = [("P", first)]
    out = "P"
    kind = draw(st.sampled_from(["alone", "scale", "relu", "twice"]))
    if kind != "alone":
        idx = first.traversal
        read = first[idx]
        if kind == "scale":
            s = ir.Tensor("S", (first.traversal[-1].extent,))
            inputs.append(s)
            body = read * s[idx[-1] - first.traversal[-1].lo]
        elif kind == "relu":
            body = ir.Unary("relu", read)
        else:
            body = read + read
        bindings.append(("Q", ir.Scope(idx, (), body)))
        out = "Q"
    return ir.Program(tuple(inputs), tuple(bindings), (out,))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start_programs(),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=6),
)
def test_random_walks_stay_equivalent(start, choices):
    random_walk(start, choices, RULES)

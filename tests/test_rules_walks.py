"""Random walks through the registry: rules applied in sequence stay equivalent.

The search applies rules to the results of rules; these walks start from
random contractions (and small two-scope programs), take a random match of a
random rule at every step, and check each program against the start with the
reference interpreter (float64 and exact integers), its canonical key and its
text round trip.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rules_support import check_result, contractions

from einopt.core import ir
from einopt.rules import REGISTRY, Match

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
    program = start
    trail = [str(start)]
    for rule_pick, match_pick in choices:
        offered = []
        for k in range(len(RULES)):  # the first rule, from a random one on, that offers a match
            rule = RULES[(rule_pick + k) % len(RULES)]
            offered = [m for m in rule.match(program) if isinstance(m, Match)]
            if offered:
                break
        if not offered:
            break
        m = offered[match_pick % len(offered)]
        program = rule.apply(program, m)
        trail.append(f"-- {m}\n{program}")
        event(f"applied {rule.name}")
        try:
            check_result(start, program)
        except AssertionError as e:
            raise AssertionError("\n".join(trail) + f"\n{e}") from None

"""``einopt rules`` and ``einopt derive``."""

import numpy as np
from click.testing import CliRunner

from einopt.cli import EXIT_CODES, main
from einopt.rules import REGISTRY

CONV = "L[h:6, w:6, f:4] Sum[r:3, s:3, c:3] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [6, 6, 3], K: [3, 3, 4, 3]"


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_rules_lists_the_whole_registry_with_families():
    result = run("rules")
    assert result.exit_code == 0, result.output
    for rule in REGISTRY.values():
        assert rule.name in result.output
    assert "[s1, x]" in result.output  # math is printed literally, not as markup


def test_rules_family_filter():
    result = run("rules", "--family", "inter")
    assert result.exit_code == 0
    names = [r.name for r in REGISTRY.values() if r.family == "inter"]
    others = [r.name for r in REGISTRY.values() if r.family != "inter"]
    assert all(n in result.output for n in names)
    assert not any(f" {n} " in result.output for n in others)


def test_rules_shows_the_documentation_of_a_rule():
    result = run("rules", "split_summation")
    assert result.exit_code == 0
    assert "split_summation (intra)" in result.output
    assert "Fig. 5" in result.output


def test_unknown_rule_is_bad_input():
    result = run("rules", "split_everything")
    assert result.exit_code == EXIT_CODES["bad_input"]
    assert "no rule named 'split_everything'" in result.output


def test_derive_without_steps_lists_matches():
    result = run("derive", "-e", CONV)
    assert result.exit_code == 0, result.output
    assert "split_summation at Y: Sum[r, s] outside, Sum[c] inside" in result.output


def test_derive_applies_steps_and_prints_a_checked_trace():
    result = run("derive", "-e", CONV, "-s", "split_summation@Y:Sum[c] inside")
    assert result.exit_code == 0, result.output
    assert (
        "E2 = split_summation at Y: Sum[r, s] outside, Sum[c] inside [checked: float64, int]" in result.output
    )


def test_derive_ambiguous_step_lists_the_candidates():
    result = run("derive", "-e", CONV, "-s", "split_summation")
    assert result.exit_code == EXIT_CODES["bad_input"]
    assert "6 matches" in result.output and "Sum[c] inside" in result.output


def test_derive_reads_constants(tmp_path):
    np.savez(tmp_path / "c.npz", K=np.ones((3, 3, 4, 3)))
    result = run(
        "derive", "-e", CONV, "--constants", str(tmp_path / "c.npz"), "-s", "split_summation:Sum[c] inside"
    )
    assert result.exit_code == 0, result.output
    np.savez(tmp_path / "bad.npz", K=np.ones((3, 3)))
    result = run("derive", "-e", CONV, "--constants", str(tmp_path / "bad.npz"))
    assert result.exit_code == EXIT_CODES["bad_input"]
    assert "constant K has shape [3, 3], expected [3, 3, 4, 3]" in result.output


def test_derive_paper_lists_and_replays_the_paper_derivations():
    result = run("derive", "--paper", "list")
    assert result.exit_code == 0 and "fig5" in result.output and "Fig. 14" in result.output
    result = run("derive", "--paper", "fig5")
    assert result.exit_code == 0, result.output
    assert "tighten_boundary at Y.1: tighten t1 from" in result.output
    result = run("derive", "--paper", "fig5", "-e", CONV)
    assert result.exit_code == EXIT_CODES["bad_input"]
    result = run("derive", "--paper", "fig55")
    assert result.exit_code == EXIT_CODES["bad_input"] and "known: fig5" in result.output

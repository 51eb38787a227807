"""Costing beside the search (einopt.search.costprocess): the same candidates, costs and counts as
costing in the search's own process, whichever process costs which candidate, and when the second
process is gone."""

from __future__ import annotations

import io
import logging
import time

import pytest

from einopt.rules.paper import DERIVATIONS
from einopt.search import costprocess, search
from einopt.search.costprocess import CostProcess, candidate_cost


def _summary(result) -> list[tuple]:
    return [(c.key, c.cost, c.operators, c.work, c.flops, c.found_states) for c in result.candidates]


def _search(name: str):
    d = DERIVATIONS[name]
    return search(d.program(), ctx=d.context(), max_depth=2, converge_depth=3)


@pytest.mark.parametrize("name", ["fig5", "prelu_max"])
def test_costing_beside_the_search_finds_the_same_candidates(name, monkeypatch):
    monkeypatch.setenv("EINOPT_COST_PROCESS", "never")
    here = _search(name)
    monkeypatch.setenv("EINOPT_COST_PROCESS", "always")
    received = []
    receive = CostProcess.receive

    def spy(self):
        got = receive(self)
        if got is not None:
            received.append(got)
        return got

    monkeypatch.setattr(CostProcess, "receive", spy)
    beside = _search(name)
    assert _summary(beside) == _summary(here)
    assert beside.stats.candidates_costed == here.stats.candidates_costed
    assert beside.stats.generated == here.stats.generated
    assert not costprocess._BROKEN, "the second process failed: the search costed everything here"
    assert costprocess.shared() is not None
    # How many outcomes came back before this process had costed the rest itself depends on the
    # machine; that candidates went there at all does not.
    assert here.stats.candidates_costed > 1


def test_the_second_process_costs_a_program_as_this_one_does():
    d = DERIVATIONS["prelu_max"]
    program, constants = d.program(), dict(d.context().constants)
    process = CostProcess()
    try:
        process.begin(constants)
        process.submit(0, program)
        process.submit(1, program)  # the second time, every node goes by its number
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 2 and time.monotonic() < deadline:
            outcome = process.receive()
            if outcome is None:
                time.sleep(0.01)
            else:
                got.append(outcome)
    finally:
        process.close()
    want = candidate_cost(program, constants, {})
    assert not want.skipped
    assert got == [(1, 0, want), (1, 1, want)]


def test_nodes_already_sent_go_by_their_number():
    d = DERIVATIONS["fig5"]
    program = d.program()
    sent: dict = {}
    first, second = io.BytesIO(), io.BytesIO()
    costprocess._Sender(first, sent).dump(program)
    costprocess._Sender(second, sent).dump(program)
    assert len(second.getvalue()) < 16 < len(first.getvalue())
    costprocess._RECEIVED.clear()
    assert costprocess._Receiver(io.BytesIO(first.getvalue())).load() is program
    assert costprocess._Receiver(io.BytesIO(second.getvalue())).load() is program
    costprocess._RECEIVED.clear()


class _Gone:
    """A second process that took the requests and died before sending anything back."""

    def begin(self, constants):
        return 1

    def submit(self, number, program):
        pass

    def receive(self):
        raise EOFError

    def done(self):
        raise BrokenPipeError

    def close(self):
        pass


def test_a_second_process_that_dies_leaves_the_costing_here(monkeypatch, caplog):
    monkeypatch.setenv("EINOPT_COST_PROCESS", "never")
    here = _search("prelu_max")
    monkeypatch.setenv("EINOPT_COST_PROCESS", "always")
    monkeypatch.setattr(costprocess, "_SHARED", _Gone())
    monkeypatch.setattr(costprocess, "_BROKEN", False)
    monkeypatch.setattr(costprocess, "shared", lambda: costprocess._SHARED)
    with caplog.at_level(logging.WARNING, logger="einopt.search.costprocess"):
        beside = _search("prelu_max")
    assert _summary(beside) == _summary(here)
    assert beside.stats.candidates_costed == here.stats.candidates_costed
    assert "the costing process failed" in caplog.text
    assert costprocess._BROKEN and costprocess._SHARED is None  # not started again in this process


def test_a_second_process_that_cannot_start_leaves_the_costing_here(monkeypatch):
    monkeypatch.setenv("EINOPT_COST_PROCESS", "never")
    here = _search("prelu_max")
    monkeypatch.setenv("EINOPT_COST_PROCESS", "always")
    monkeypatch.setattr(costprocess, "_SHARED", None)
    monkeypatch.setattr(costprocess, "_BROKEN", False)
    monkeypatch.setattr(costprocess, "_COMMAND", "import sys; sys.exit(3)")
    beside = _search("prelu_max")  # however far it got before the process was found gone
    assert _summary(beside) == _summary(here)


def test_never_and_a_worker_of_another_process_cost_here(monkeypatch):
    monkeypatch.setenv("EINOPT_COST_PROCESS", "never")
    assert not costprocess.wanted()
    monkeypatch.setenv("EINOPT_COST_PROCESS", "auto")
    monkeypatch.setattr(costprocess.multiprocessing, "parent_process", lambda: object())
    assert not costprocess.wanted()

"""Costing a search's candidates in a second process, beside the search.

A candidate's analytic cost (instantiating its light model, then costing that
model's nodes) is about two thirds of a long search's time on one core, and
nothing the search does next depends on it: only the ranking at its end reads
the costs. So once a search has spent :data:`HANDOFF_S` seconds costing
candidates itself, it sends the rest to a second process and goes on
searching, settling the outcomes as they come back; at its end it costs what
is still waiting itself, from the last one found, while the second process
goes on from the first. The candidates and their costs are the same (the same
code on the same programs, and the ranking is by cost, depth and key, not by
when a cost arrived), only sooner on a machine with a core to spare.

Programs are sent with a memory of what was sent: an IR node the other side
already has (since the search began) goes as its number, so a state costs
the few scopes its rewrite made to send, not its whole program.

When it is used is :func:`wanted`: by default when this process is not itself
a worker of another (``--jobs``) and has at least two cores to run on; the
environment variable ``EINOPT_COST_PROCESS`` says ``never``, or ``always``
(every candidate but the input, from the first: what the tests use).
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import NamedTuple

import numpy as np

from einopt.core import ir
from einopt.instantiate.emit import InstantiationError
from einopt.instantiate.program import program_model, weight_names
from einopt.search.modelcost import analytic, estimate, operators

__all__ = [
    "HANDOFF_S",
    "Outcome",
    "CostProcess",
    "candidate_cost",
    "shared",
    "lost",
    "wanted",
    "handoff_after",
]

log = logging.getLogger(__name__)

HANDOFF_S = 0.1
"""Seconds of costing a search does itself before it hands its candidates to the second process (a
short search never starts one)."""

_ENV = "EINOPT_COST_PROCESS"


class Outcome(NamedTuple):
    """What costing one candidate gave: what it runs as, its analytic cost in seconds and its work
    (see :class:`~einopt.search.candidates.Costing`); ``skipped`` says why it could not be
    instantiated (the rest is then empty)."""

    operators: tuple[str, ...] = ()
    seconds: float = 0.0
    work: tuple[str, ...] = ()
    skipped: str = ""


def candidate_cost(
    program: ir.Program, constants: Mapping[str, np.ndarray], estimates: dict, cost: Callable | None = None
) -> Outcome:
    """``program`` instantiated and costed: its light instantiation analytically, or with ``cost``,
    ``cost(program, model, instantiated)`` of its runnable one. ``estimates`` keeps the analytic
    estimate per distinct model (about half of a search's candidates instantiate to a model byte for
    byte like an earlier one's)."""
    try:
        model, inst = program_model(program, constants, light=cost is None)
    except (InstantiationError, ValueError) as e:
        return Outcome(skipped=str(e))
    weights = weight_names(constants, inst)
    if cost is None:
        seconds, work = estimate(model, weights, estimates)
    else:  # a runnable model, with its weights: not hashed to be looked up
        _, work = analytic(model, weights)
        seconds = float(cost(program, model, inst))
    return Outcome(operators(model), seconds, work)


def wanted() -> bool:
    """Whether searches in this process may cost in a second one (see the module docstring)."""
    how = os.environ.get(_ENV, "auto")
    if how not in ("auto", "never", "always"):
        log.warning("%s=%s is not one of auto, never, always: taken as auto", _ENV, how)
    if how == "never":
        return False
    if how == "always":
        return True
    return multiprocessing.parent_process() is None and _cores() >= 2


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def handoff_after() -> float:
    """Seconds of costing before the handoff: none when ``EINOPT_COST_PROCESS=always``."""
    return 0.0 if os.environ.get(_ENV) == "always" else HANDOFF_S


# ---- the wire: IR nodes sent once per search, then by number ----------------------------------


class _Sender(pickle.Pickler):
    """Pickles a message, sending each IR node the other side already has as its number."""

    def __init__(self, file: io.BytesIO, sent: dict[ir.Node, int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.sent = sent

    def persistent_id(self, obj: object) -> int | None:
        return self.sent.get(obj) if isinstance(obj, ir.Node) else None

    def reducer_override(self, obj: object):
        if not isinstance(obj, ir.Node):
            return NotImplemented
        number = self.sent[obj] = len(self.sent)
        cls, fields = obj.__reduce__()
        return _received, (number, cls, fields)


_RECEIVED: dict[int, ir.Node] = {}
"""The second process's nodes of the current search, by number."""


def _received(number: int, cls: type, fields: tuple) -> ir.Node:
    node = _RECEIVED[number] = cls(*fields)
    return node


class _Receiver(pickle.Unpickler):
    def persistent_load(self, pid: int) -> ir.Node:
        return _RECEIVED[pid]


# ---- the second process ------------------------------------------------------------------------


def _serve(requests_fd: int, results_fd: int) -> None:
    """The second process: cost each candidate sent, in order, and send back its outcome. A thread
    reads the requests as they come (so the search never waits to send), and takes note of the
    searches that need no more outcomes: their requests left are skipped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    requests = Connection(requests_fd, writable=False)
    results = Connection(results_fd, readable=False)
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    done = [0]  # searches up to this number need no more outcomes

    def read() -> None:
        try:
            while True:
                data = requests.recv_bytes()
                search, kind = _HEADER.unpack_from(data)
                if kind == _DONE:
                    done[0] = max(done[0], search)
                else:
                    inbox.put(data)
        except (EOFError, OSError):
            inbox.put(None)

    threading.Thread(target=read, daemon=True).start()
    constants: Mapping[str, np.ndarray] = {}
    estimates: dict = {}
    while (data := inbox.get()) is not None:
        search, kind = _HEADER.unpack_from(data)
        if search <= done[0]:
            continue  # the next request begins a search, which forgets this one's nodes
        message = _Receiver(io.BytesIO(data[_HEADER.size :])).load()
        if kind == _BEGIN:
            constants = message
            _RECEIVED.clear()
            estimates = {}
            continue
        number, program = message
        try:
            outcome: object = candidate_cost(program, constants, estimates)
        except Exception as e:  # noqa: BLE001 - a bug: raised again in the search, which would have met it
            outcome = e
        try:
            results.send((search, number, outcome))
        except (EOFError, OSError):
            return


_COMMAND = "from einopt.search.costprocess import _serve; _serve({requests}, {results})"
"""What the second process runs (its pipes' descriptors filled in)."""

_HEADER = struct.Struct("<qc")  # the search's number, and what the message is
_BEGIN, _COST, _DONE = b"b", b"c", b"d"


class CostProcess:
    """The second process (a fresh interpreter: nothing of this one's ``__main__`` runs again), its
    two pipes, and a thread that writes the requests so that the search never waits on a full pipe."""

    def __init__(self) -> None:
        requests_in, requests_out = os.pipe()
        results_in, results_out = os.pipe()
        code = _COMMAND.format(requests=requests_in, results=results_out)
        try:
            self.process = subprocess.Popen(
                # This process's path, and not the working directory before it (-P): a checkout's
                # einopt/ would hide the installed package, whose einopt.search is mapped from search/.
                [sys.executable, "-P", "-c", code],
                pass_fds=(requests_in, results_out),
                stdout=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        finally:
            os.close(requests_in)
            os.close(results_out)
        self.requests = Connection(requests_out, readable=False)
        self.results = Connection(results_in, writable=False)
        self.pid = os.getpid()
        self.search = 0
        self.sent: dict[ir.Node, int] = {}
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.failed: BaseException | None = None
        threading.Thread(target=self._write, name="einopt-costing-writer", daemon=True).start()

    def _write(self) -> None:
        while (data := self.outbox.get()) is not None:
            try:
                self.requests.send_bytes(data)
            except OSError as e:
                self.failed = e
                return

    def begin(self, constants: Mapping[str, np.ndarray]) -> int:
        """Start a search's costing (its constants sent once); returns the search's number."""
        self.search += 1
        self.sent = {}
        self._send(_BEGIN, dict(constants))
        return self.search

    def submit(self, number: int, program: ir.Program) -> None:
        """Cost ``program`` as the current search's candidate ``number``."""
        self._send(_COST, (number, program))

    def done(self) -> None:
        """The current search needs no more outcomes: the requests it left are skipped."""
        self._send(_DONE, None)

    def _send(self, kind: bytes, message: object) -> None:
        if self.failed is not None:
            raise OSError(f"cannot send to the costing process: {self.failed}")
        buffer = io.BytesIO()
        buffer.write(_HEADER.pack(self.search, kind))
        _Sender(buffer, self.sent).dump(message)
        self.outbox.put(buffer.getvalue())

    def receive(self) -> tuple[int, int, Outcome | Exception] | None:
        """The next outcome sent back, as (search, number, outcome), or None when none is there yet.
        Raises EOFError or OSError when the process is gone."""
        return self.results.recv() if self.results.poll() else None

    def alive(self) -> bool:
        return self.failed is None and self.process.poll() is None

    def close(self) -> None:
        self.outbox.put(None)
        self.requests.close()
        self.results.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


_SHARED: CostProcess | None = None
_BROKEN = False


def shared() -> CostProcess | None:
    """This process's second process, started on first use (None when it could not be or died)."""
    global _SHARED, _BROKEN
    if _BROKEN:
        return None
    if _SHARED is not None and _SHARED.pid == os.getpid():
        if _SHARED.alive():
            return _SHARED
        _SHARED.close()  # gone while idle: its pipes go with it
    try:
        _SHARED = CostProcess()
    except OSError as e:
        log.info("costing stays in this process: cannot start a second one (%s)", e)
        _BROKEN = True
        return None
    return _SHARED


def lost(why: BaseException) -> None:
    """The second process failed: searches from now on cost in this process."""
    global _SHARED, _BROKEN
    log.warning("the costing process failed (%s): costing goes on in this process", why)
    _BROKEN = True
    if _SHARED is not None:
        try:
            _SHARED.close()
        except OSError:
            pass
    _SHARED = None

"""How a node's process tells its supervisor that it stopped in order.

A consensus module or a service container that exits with code 0 may have
stopped on purpose (``cluster-tool shutdown`` or ``abort``, the leader's
termination of the cluster, a stop signal to the module) or by accident (a
service that called ``sys.exit(0)``).  Only the process itself knows which.
``cluster-node start`` hands each of them the write end of a pipe (its number
in ``FULMAR_STOP_REPORT_FD``); a process that stopped in order writes one line
there as it exits: why, and at which log position.  The supervisor reads the
pipe once the process has exited: exit code 0 with a report is an orderly
stop, exit code 0 without one is a death.  A process started any other way
has no such descriptor and reports nothing.

The pipe, rather than a file in the cluster directory, ties the report to the
one process that wrote it: nothing is left behind for the next start to
mistake for its own, and no other process can write it.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

STOP_REPORT_FD_ENV = "FULMAR_STOP_REPORT_FD"
# A write of at most PIPE_BUF bytes to a pipe is atomic: the reader sees the
# whole report or none of it.
_MAX_REPORT_LENGTH = 512


class StopCause(enum.Enum):
    """Why a node's process stopped in order (the value: as the supervisor says it)."""

    CLUSTER_SHUTDOWN = "cluster shutdown"  # SHUTDOWN: a snapshot, then every member stops at one position
    CLUSTER_ABORT = "cluster abort"  # ABORT: every member stops at one position, no snapshot
    # A follower told by the leader to stop where it took no snapshot (an
    # ABORT; the leader's message does not say which it was).
    CLUSTER_TERMINATION = "the leader's termination of the cluster"
    STOP_SIGNAL = "a stop signal to its consensus module"  # the node's own stop (SIGTERM/SIGINT to the module)
    MODULE_TERMINATION = "its consensus module's termination"  # a service that its module told to stop


@dataclass(frozen=True)
class OrderlyStop:
    cause: StopCause
    log_position: int

    def describe(self) -> str:
        return f"{self.cause.value} at log position {self.log_position}"

    def encode(self) -> bytes:
        return (json.dumps({"cause": self.cause.name, "log_position": self.log_position}) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> OrderlyStop | None:
        """The report in ``data`` (all a process wrote), or None when it holds
        no report, or anything but exactly one well-formed one."""
        lines = data.splitlines()
        if len(lines) != 1 or not data.endswith(b"\n"):
            return None
        try:
            fields = json.loads(lines[0])
            cause = StopCause[fields["cause"]]
            log_position = fields["log_position"]
        except (ValueError, KeyError, TypeError):
            return None
        if type(log_position) is not int or log_position < 0:
            return None
        return cls(cause, log_position)


class StopOutcome(NamedTuple):
    """How a consensus module or a service container stopped."""

    reason: str  # for its log
    orderly: OrderlyStop | None  # None: not an orderly stop (or not one it may claim)


def report_orderly_stop(stop: OrderlyStop, environ: Mapping[str, str] = os.environ) -> str | None:
    """Tell the supervisor (if this process has one) that it stopped in
    order; why the report could not be written, or None."""
    text = environ.get(STOP_REPORT_FD_ENV)
    if not text:
        return None
    data = stop.encode()
    assert len(data) <= _MAX_REPORT_LENGTH
    try:
        fd = int(text)
    except ValueError:
        return f"${STOP_REPORT_FD_ENV} is {text!r}, not a file descriptor"
    try:
        os.write(fd, data)
        os.close(fd)
    except OSError as error:
        return f"cannot write the orderly stop report to descriptor {fd}: {error.strerror or error}"
    return None


def read_report(fd: int) -> OrderlyStop | None:
    """What the exited process wrote on the pipe whose read end is ``fd``
    (non-blocking), decoded; the descriptor is left open."""
    data = b""
    while len(data) <= _MAX_REPORT_LENGTH:
        try:
            chunk = os.read(fd, _MAX_REPORT_LENGTH + 1)
        except (BlockingIOError, InterruptedError):
            break  # nothing more (another process holds the write end too)
        except OSError:
            return None
        if not chunk:
            break  # the writer is gone: all it wrote is here
        data += chunk
    return OrderlyStop.decode(data)

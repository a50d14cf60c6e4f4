"""What a stop signal asks of a node's process, and a stop that waits its turn.

The processes of a node are often signalled together: a terminal's Ctrl-C
reaches its whole foreground process group, a service manager (systemd's
default ``KillMode=control-group``) sends SIGTERM to every process of the unit
at the same moment, and a supervisor or wrapper may forward the signal once
more on top.  So the same request can reach one process two or three times,
as SIGTERM, SIGINT or both, within milliseconds.  :class:`StopSignals` is the
one rule every process of a node applies:

* the first SIGTERM or SIGINT asks for an **orderly** stop (the consensus
  module: a snapshot, then the services and the module stop at one log
  position; the archive and the driver: after the processes that need them);
* a repeated SIGTERM, or a SIGINT on top of a SIGTERM, is the same request:
  nothing new;
* only a deliberate second Ctrl-C asks for an **immediate** stop (the consensus
  module: ABORT; the archive and the driver: without waiting): a SIGINT that
  comes at least ``repeat_interval_ns`` after an earlier SIGINT.  A SIGINT
  sooner than that is the same keypress delivered twice (to the group, and
  forwarded by a parent in that group).

:class:`StopGate` is the orderly stop of a process that others need: once
asked, it waits until nothing it names is still running (checked every
``check_interval_ns``), bounded by ``timeout_ns``, and says what it waits for
and why it stops.  Both are plain objects: the caller passes the time in.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable

# A person's second Ctrl-C comes a good fraction of a second after the first;
# a copy of the same one (the group's and a forwarding parent's) within
# milliseconds.
REPEAT_INTERVAL_NS_DEFAULT = 500_000_000


class StopKind(enum.IntEnum):
    ORDERLY = 1  # the consensus module's SHUTDOWN; after what needs this process
    IMMEDIATE = 2  # the consensus module's ABORT; at once


class StopSignals:
    """The stop each SIGINT/SIGTERM asks for (see the module's docstring).

    ``on_signal`` is called from the signal handler with the time of the
    signal; it returns the stop to ask for now, or None when the signal asks
    for nothing new.  Nothing here blocks or allocates much: safe in a
    Python-level signal handler.
    """

    def __init__(self, repeat_interval_ns: int = REPEAT_INTERVAL_NS_DEFAULT) -> None:
        self.repeat_interval_ns = repeat_interval_ns
        self.first_signum: int | None = None  # the signal that asked for the stop
        self.requested: StopKind | None = None  # the strongest stop asked for so far
        self._first_interrupt_ns: int | None = None

    @property
    def immediate(self) -> bool:
        return self.requested is StopKind.IMMEDIATE

    def on_signal(self, signum: int, now_ns: int) -> StopKind | None:
        if self.requested is StopKind.IMMEDIATE:
            return None
        if signum == signal.SIGINT:
            if self._first_interrupt_ns is None:
                self._first_interrupt_ns = now_ns
            elif now_ns - self._first_interrupt_ns >= self.repeat_interval_ns:
                self.requested = StopKind.IMMEDIATE
                return StopKind.IMMEDIATE
        if self.requested is None:
            self.first_signum = signum
            self.requested = StopKind.ORDERLY
            return StopKind.ORDERLY
        return None

    def describe(self, kind: StopKind | None, signum: int) -> str:
        """One line for the process's log: what ``signum`` asked for."""
        name = signal.Signals(signum).name
        if kind is StopKind.IMMEDIATE:
            return f"{name} again: stopping at once"
        if kind is StopKind.ORDERLY:
            return (
                f"{name}: stopping in order (a second Ctrl-C, {self.repeat_interval_ns / 1e9:g} s or more "
                "after the first, stops at once)"
            )
        return f"{name}: the stop already under way goes on"


class StopGate:
    """An orderly stop that waits for other processes to stop first.

    ``still_running()`` names what must stop before this process ("the
    consensus module (pid 123) of /var/node0/cluster"), or returns None once
    nothing is left.  After ``request()``, ``may_stop(now_ns)`` is False while
    something is named and the wait is within ``timeout_ns``; it says (through
    ``say``) what it waits for, once, and why it stops.  ``request(True)`` (an
    immediate stop) ends the wait.
    """

    def __init__(
        self,
        still_running: Callable[[], str | None],
        timeout_ns: int,
        say: Callable[[str], None],
        check_interval_ns: int = 100_000_000,
    ) -> None:
        self.still_running = still_running
        self.timeout_ns = timeout_ns
        self.say = say
        self.check_interval_ns = check_interval_ns
        self.requested = False
        self.immediate = False
        self._deadline_ns: int | None = None
        self._next_check_ns = 0
        self._waiting_for: str | None = None

    def request(self, immediate: bool = False) -> None:
        """Safe from a signal handler: only sets fields."""
        self.requested = True
        self.immediate = self.immediate or immediate

    def may_stop(self, now_ns: int) -> bool:
        if not self.requested:
            return False
        if self.immediate:
            if self._waiting_for is not None:
                self.say(f"stopping at once, without waiting for {self._waiting_for}")
                self._waiting_for = None
            return True
        if self._deadline_ns is None:
            self._deadline_ns = now_ns + self.timeout_ns
        elif now_ns < self._next_check_ns:
            return False
        self._next_check_ns = now_ns + self.check_interval_ns
        running = self.still_running()
        if running is None:
            if self._waiting_for is not None:
                self.say(f"{self._waiting_for} has stopped, and nothing else to wait for runs: stopping")
            return True
        if now_ns >= self._deadline_ns:
            self.say(
                f"{running} still running {self.timeout_ns / 1e9:g} s after the stop was asked for: stopping anyway"
            )
            return True
        if running != self._waiting_for:
            self.say(f"stop requested: waiting for {running} to stop first (up to {self.timeout_ns / 1e9:g} s)")
            self._waiting_for = running
        return False


def block_stop_signals() -> None:
    """Block SIGINT and SIGTERM (in a child between fork and exec: the mask
    outlives exec) until the process's ``StopSignalHandlers`` are in place,
    which unblock them: a stop signal to a process that is still importing is
    held for its handler, and so asks for an orderly stop, instead of killing
    it with the default action."""
    signal.pthread_sigmask(signal.SIG_BLOCK, StopSignalHandlers.SIGNALS)


class StopSignalHandlers:
    """SIGINT and SIGTERM handlers for the run of a node's process, by ``rule``.

    Each signal calls ``on_stop(kind, signum)`` (``kind`` None: nothing new).
    Once the run is over (the block ended without an exception, or a signal
    asked for the stop) the process is on its way out, and a stop signal then
    asks for what is already happening: a late copy of the request (a
    supervisor's SIGTERM after a service manager's), or the SIGTERM a
    supervisor sends a service that has just stopped by itself at its module's
    termination position, must not turn a clean exit into a death by SIGTERM.
    So SIGTERM is then ignored, at the C level (the interpreter resets
    Python-level handlers to the default while it finalizes, where a late
    SIGTERM would still kill it), and a deliberate second Ctrl-C still ends
    the process at once.  Only a run that failed without a stop being asked
    for (an exception, e.g. at launch) gets the previous handlers back.
    Installed before the launch, so that an early signal is not lost.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(
        self, rule: StopSignals, on_stop: Callable[[StopKind | None, int], None], clock_ns: Callable[[], int]
    ) -> None:
        self.rule = rule
        self.on_stop = on_stop
        self.clock_ns = clock_ns
        self._previous: dict[int, object] = {}

    def _on_signal(self, signum: int, frame: object) -> None:
        self.on_stop(self.rule.on_signal(signum, self.clock_ns()), signum)

    def _on_signal_while_exiting(self, signum: int, frame: object) -> None:
        if self.rule.on_signal(signum, self.clock_ns()) is StopKind.IMMEDIATE:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def __enter__(self) -> StopSignalHandlers:
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}
        # A supervisor starts its processes with these signals blocked
        # (block_stop_signals), so that one sent while the process is still
        # starting up waits for these handlers instead of killing it.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.SIGNALS)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        exiting = exc_type is None or self.rule.requested is not None
        for signum, handler in self._previous.items():
            if not exiting:
                signal.signal(signum, handler)  # type: ignore[arg-type]
            elif signum == signal.SIGTERM:
                signal.signal(signum, signal.SIG_IGN)
            else:
                signal.signal(signum, self._on_signal_while_exiting)

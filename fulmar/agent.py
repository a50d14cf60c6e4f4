"""Agents and the things that drive them (Agrona's Agent, AgentRunner, AgentInvoker).

An agent is a duty cycle: ``do_work(now_ns)`` does whatever is pending and
returns how much it did.  The clock is read once per cycle by whoever drives
the agent and passed in, so agent logic never reads time itself and the same
code runs under a simulated clock in tests.

- :class:`AgentRunner` drives one agent on its own thread with an idle strategy.
- :class:`AgentInvoker` lets the owning code drive the agent from its own loop
  (a client conductor run inside another agent's duty cycle).
- :class:`CompositeAgent` puts several agents on one thread.

An exception from ``do_work`` goes to the error handler and the error counter
and the loop carries on after a back-off (growing while cycles keep failing);
:class:`AgentTerminationException` stops it.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Protocol

from fulmar.errors import FulmarError
from fulmar.idle import IdleStrategy
from fulmar.retry import RetryBackoff

Clock = Callable[[], int]
# A duty cycle that raised waits before the next one, doubling from 1 ms while
# cycles keep failing, up to this: a broken agent costs ten cycles a second,
# and one that recovers has lost at most a tenth of a second.
DUTY_CYCLE_ERROR_MAX_BACKOFF_NS = 100_000_000
ErrorHandler = Callable[[BaseException], None]


class AgentTerminationException(FulmarError):
    """Raised by an agent to stop the runner or invoker driving it."""


class Agent(Protocol):
    """What an agent provides.  Subclass it explicitly to inherit the no-op hooks."""

    #: Names the agent's thread and its error reports.
    role_name: str

    def on_start(self) -> None:
        """Called once on the agent's thread before the first ``do_work``."""
        return None  # a real body: explicit subclasses inherit it as a no-op

    def do_work(self, now_ns: int) -> int:
        """Do pending work; return how much (0 means idle)."""
        ...

    def on_close(self) -> None:
        """Called once on the agent's thread after the last ``do_work``."""
        return None


class _ErrorReporter:
    """Sends an error to the handler and bumps the counter; never raises."""

    def __init__(self, error_handler: ErrorHandler, error_counter: Callable[[], None] | None) -> None:
        self._error_handler = error_handler
        self._error_counter = error_counter

    def __call__(self, error: BaseException) -> None:
        try:
            if self._error_counter is not None:
                self._error_counter()
            self._error_handler(error)
        except Exception:  # noqa: BLE001 - a broken handler must not kill the duty cycle
            print("error handler failed while handling:", file=sys.stderr)
            traceback.print_exception(error, file=sys.stderr)
            traceback.print_exc(file=sys.stderr)


class AgentRunner:
    """Runs an agent on a background thread: clock, ``do_work``, idle, repeat.

    ``close`` stops the loop, wakes the idle strategy, joins the thread, and
    the agent's ``on_close`` runs on the agent thread as the loop exits.
    """

    def __init__(
        self,
        agent: Agent,
        idle_strategy: IdleStrategy,
        error_handler: ErrorHandler,
        *,
        clock: Clock = time.monotonic_ns,
        error_counter: Callable[[], None] | None = None,
    ) -> None:
        self.agent = agent
        self.idle_strategy = idle_strategy
        self.clock = clock
        self._report = _ErrorReporter(error_handler, error_counter)
        self._thread: threading.Thread | None = None
        self._running = False
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def is_closed(self) -> bool:
        return self._closed

    def start(self) -> threading.Thread:
        if self._thread is not None or self._closed:
            raise RuntimeError(f"agent runner for {self.agent.role_name} was already started or closed")
        self._running = True
        # Daemon: a runner someone forgot to close must not hang interpreter exit.
        self._thread = threading.Thread(target=self._run, name=self.agent.role_name, daemon=True)
        self._thread.start()
        return self._thread

    def _run(self) -> None:
        agent, idle, clock, report = self.agent, self.idle_strategy, self.clock, self._report
        try:
            agent.on_start()
        except Exception as error:  # noqa: BLE001 - reported, then the agent is closed
            report(error)
            self._running = False
        failures = RetryBackoff(max_ns=DUTY_CYCLE_ERROR_MAX_BACKOFF_NS)
        try:
            while self._running:
                now_ns = clock()
                try:
                    work_count = agent.do_work(now_ns)
                except AgentTerminationException as error:
                    report(error)
                    self._running = False
                    break
                except Exception as error:  # noqa: BLE001 - reported; the duty cycle goes on
                    report(error)
                    # Not at once: idle() returns at once while work waits, and
                    # that work may be what fails, so a failing agent would spin.
                    idle.pause(failures.on_failure(now_ns))
                    continue
                failures.on_success()
                idle.idle(work_count)
        except Exception as error:  # noqa: BLE001 - the idle strategy failed: stop, loudly
            report(error)
        finally:
            self._running = False
            try:
                agent.on_close()
            except Exception as error:  # noqa: BLE001
                report(error)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the agent and wait up to ``timeout_s`` for its thread; TimeoutError if it will not stop."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        thread = self._thread
        if thread is None:
            # Never started: close the agent here, as Agrona does.
            try:
                self.agent.on_close()
            except Exception as error:  # noqa: BLE001
                self._report(error)
            return
        self._running = False
        if thread is threading.current_thread():
            return  # closed from inside do_work: the loop ends after this cycle
        self.idle_strategy.wake()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"agent {self.agent.role_name} did not stop within {timeout_s} s")


class AgentInvoker:
    """Drives an agent from the owner's own loop: call :meth:`invoke` each cycle.

    No thread, no idle strategy: the owner idles.  ``start`` runs ``on_start``,
    ``close`` runs ``on_close``; ``invoke`` before ``start`` or after the
    agent terminated does nothing and returns 0.
    """

    def __init__(
        self,
        agent: Agent,
        error_handler: ErrorHandler,
        *,
        clock: Clock = time.monotonic_ns,
        error_counter: Callable[[], None] | None = None,
    ) -> None:
        self.agent = agent
        self.clock = clock
        self._report = _ErrorReporter(error_handler, error_counter)
        self._started = False
        self._running = False
        self._closed = False

    @property
    def is_started(self) -> bool:
        return self._started

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def is_closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            self.agent.on_start()
            self._running = True
        except Exception as error:  # noqa: BLE001
            self._report(error)
            self.close()

    def invoke(self) -> int:
        """One duty cycle; returns the work count (0 when not running or on error)."""
        if not self._running:
            return 0
        try:
            return self.agent.do_work(self.clock())
        except AgentTerminationException as error:
            self._report(error)
            self.close()
        except Exception as error:  # noqa: BLE001
            self._report(error)
        return 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._running = False
        try:
            self.agent.on_close()
        except Exception as error:  # noqa: BLE001
            self._report(error)


class CompositeAgent(Agent):
    """Several agents on one thread; ``do_work`` returns the sum of their work.

    All get the same ``now_ns``.  When one raises, the exception goes to the
    runner at once and the next cycle resumes with the agent after it, so a
    failing agent cannot starve the ones behind it.
    """

    def __init__(self, *agents: Agent) -> None:
        if not agents:
            raise ValueError("a composite agent needs at least one agent")
        self.agents = agents
        self.role_name = "[" + ",".join(agent.role_name for agent in agents) + "]"
        self._next = 0

    def on_start(self) -> None:
        self._each("on_start")

    def do_work(self, now_ns: int) -> int:
        work_count = 0
        agents = self.agents
        while self._next < len(agents):
            agent = agents[self._next]
            self._next += 1
            work_count += agent.do_work(now_ns)
        self._next = 0
        return work_count

    def on_close(self) -> None:
        self._each("on_close")

    def _each(self, hook: str) -> None:
        # Every agent gets its hook even if an earlier one fails; the first
        # failure is raised afterwards with the others attached as notes.
        errors: list[Exception] = []
        for agent in self.agents:
            try:
                getattr(agent, hook)()
            except Exception as error:  # noqa: BLE001
                errors.append(error)
        if errors:
            first = errors[0]
            for other in errors[1:]:
                first.add_note(f"also failed in {hook}: {other!r}")
            raise first

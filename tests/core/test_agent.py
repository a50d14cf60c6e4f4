"""Agents driven by a runner thread, by an invoker, and several on one thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fulmar.agent import Agent, AgentInvoker, AgentRunner, AgentTerminationException, CompositeAgent
from fulmar.buffers import AtomicBuffer
from fulmar.idle import Doorbell, DoorbellIdleStrategy, NoOpIdleStrategy, SleepingIdleStrategy


def poll(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.001)


class StepClock:
    """A clock that advances by one step each read (time the test controls)."""

    def __init__(self, start: int = 1_000, step: int = 10) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


class RecordingAgent(Agent):
    """Records its lifecycle; ``behaviour(call_number)`` decides each do_work."""

    def __init__(self, name: str = "recorder", behaviour: Callable[[int], int] = lambda call: 1) -> None:
        self.role_name = name
        self.behaviour = behaviour
        self.events: list[str] = []
        self.times: list[int] = []
        self.threads: set[str] = set()

    def on_start(self) -> None:
        self.events.append("start")
        self.threads.add(threading.current_thread().name)

    def do_work(self, now_ns: int) -> int:
        self.times.append(now_ns)
        self.threads.add(threading.current_thread().name)
        return self.behaviour(len(self.times))

    def on_close(self) -> None:
        self.events.append("close")
        self.threads.add(threading.current_thread().name)


class Errors:
    """Error handler plus error counter, as a process would wire them."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.count = 0

    def handle(self, error: BaseException) -> None:
        self.errors.append(error)

    def increment(self) -> None:
        self.count += 1


@pytest.fixture
def errors() -> Errors:
    return Errors()


@pytest.fixture
def runners() -> Iterator[list[AgentRunner]]:
    """Runners the test starts; closed afterwards even if the test fails."""
    started: list[AgentRunner] = []
    yield started
    for runner in started:
        runner.close(5.0)


def test_runner_starts_runs_with_the_injected_clock_and_closes(errors: Errors, runners: list[AgentRunner]) -> None:
    agent = RecordingAgent()
    clock = StepClock()
    runner = AgentRunner(agent, SleepingIdleStrategy(1_000_000), errors.handle, clock=clock)
    runners.append(runner)
    thread = runner.start()
    assert thread.name == "recorder" and thread.daemon
    poll(lambda: len(agent.times) >= 5, what="five duty cycles")
    assert runner.is_running
    runner.close()
    assert not thread.is_alive() and not runner.is_running and runner.is_closed
    assert agent.events == ["start", "close"]
    assert agent.threads == {"recorder"}  # every hook on the agent thread
    # One clock read per cycle, handed to do_work.
    assert agent.times == [1_000 + 10 * (i + 1) for i in range(len(agent.times))]
    assert errors.errors == []
    runner.close()  # idempotent
    with pytest.raises(RuntimeError, match="already started or closed"):
        runner.start()


def test_runner_reports_and_counts_errors_and_keeps_going(errors: Errors, runners: list[AgentRunner]) -> None:
    def behaviour(call: int) -> int:
        if call % 2 == 0:
            raise ValueError(f"bad cycle {call}")
        return 1

    agent = RecordingAgent(behaviour=behaviour)
    runner = AgentRunner(agent, SleepingIdleStrategy(100_000), errors.handle, error_counter=errors.increment)
    runners.append(runner)
    runner.start()
    poll(lambda: len(agent.times) >= 9, what="cycles after errors")
    runner.close()
    assert runner.is_closed and agent.events == ["start", "close"]
    failed_calls = len(agent.times) // 2
    assert errors.count == len(errors.errors) == failed_calls >= 4
    assert [str(e) for e in errors.errors[:2]] == ["bad cycle 2", "bad cycle 4"]


def test_a_runner_backs_off_while_every_cycle_fails_and_resumes_at_once_after(
    errors: Errors, runners: list[AgentRunner]
) -> None:
    """A duty cycle that raises on every call (on work that keeps waiting, so
    the idle strategy would return at once) must not spin: the runner waits
    1, 2, 4 ... up to 100 ms between failing cycles (issue 18)."""
    failing = threading.Event()
    failing.set()

    def behaviour(call: int) -> int:
        if failing.is_set():
            raise ValueError("the same failure, every cycle")
        return 1

    agent = RecordingAgent(behaviour=behaviour)
    runner = AgentRunner(agent, NoOpIdleStrategy(), errors.handle, error_counter=errors.increment)
    runners.append(runner)
    runner.start()
    time.sleep(0.5)  # (a bounded look at the failing agent)
    failed = len(agent.times)
    assert 5 <= failed <= 15, f"{failed} failing cycles in half a second"
    failing.clear()
    poll(lambda: len(agent.times) >= failed + 1_000, what="cycles at full speed once it works again")
    runner.close()
    assert errors.count == len(errors.errors) >= failed - 1


def test_termination_stops_the_runner(errors: Errors, runners: list[AgentRunner]) -> None:
    def behaviour(call: int) -> int:
        if call == 3:
            raise AgentTerminationException("done")
        return 0

    agent = RecordingAgent(behaviour=behaviour)
    runner = AgentRunner(agent, SleepingIdleStrategy(100_000), errors.handle, error_counter=errors.increment)
    runners.append(runner)
    thread = runner.start()
    thread.join(5.0)
    assert not thread.is_alive() and not runner.is_running
    assert len(agent.times) == 3
    assert agent.events == ["start", "close"]
    assert [type(e) for e in errors.errors] == [AgentTerminationException] and errors.count == 1
    runner.close()


def test_failed_start_closes_without_working(errors: Errors, runners: list[AgentRunner]) -> None:
    class FailsToStart(RecordingAgent):
        def on_start(self) -> None:
            raise OSError("cannot map cnc.dat")

    agent = FailsToStart()
    runner = AgentRunner(agent, SleepingIdleStrategy(), errors.handle)
    runners.append(runner)
    runner.start().join(5.0)
    assert agent.times == [] and agent.events == ["close"]
    assert [str(e) for e in errors.errors] == ["cannot map cnc.dat"]


def test_close_without_start_closes_the_agent(errors: Errors) -> None:
    agent = RecordingAgent()
    runner = AgentRunner(agent, SleepingIdleStrategy(), errors.handle)
    runner.close()
    assert agent.events == ["close"] and runner.thread is None


def test_close_wakes_an_agent_waiting_on_its_doorbell(errors: Errors, runners: list[AgentRunner]) -> None:
    bell = Doorbell(AtomicBuffer(bytearray(8)))
    agent = RecordingAgent(behaviour=lambda call: 0)
    runner = AgentRunner(agent, DoorbellIdleStrategy(bell, max_wait_ns=60_000_000_000, spins=0), errors.handle)
    runners.append(runner)
    runner.start()
    poll(lambda: bell.waiters == 1, what="the agent to sleep on its doorbell")
    started = time.monotonic()
    runner.close(5.0)
    assert time.monotonic() - started < 2.0
    assert agent.events == ["start", "close"]


def test_close_times_out_on_a_stuck_agent(errors: Errors) -> None:
    release = threading.Event()
    entered = threading.Event()

    def stuck(call: int) -> int:
        entered.set()
        release.wait(10.0)
        return 0

    runner = AgentRunner(RecordingAgent(behaviour=stuck), SleepingIdleStrategy(), errors.handle)
    thread = runner.start()
    try:
        assert entered.wait(5.0)
        with pytest.raises(TimeoutError, match="agent recorder did not stop within 0.1 s"):
            runner.close(0.1)
    finally:
        release.set()
        thread.join(5.0)
    assert not thread.is_alive()


def test_a_failing_error_handler_does_not_stop_the_loop(
    runners: list[AgentRunner], capfd: pytest.CaptureFixture[str]
) -> None:
    def broken_handler(error: BaseException) -> None:
        raise RuntimeError("handler broke")

    def behaviour(call: int) -> int:
        raise ValueError("agent broke")

    agent = RecordingAgent(behaviour=behaviour)
    runner = AgentRunner(agent, SleepingIdleStrategy(100_000), broken_handler)
    runners.append(runner)
    runner.start()
    poll(lambda: len(agent.times) >= 3, what="cycles with a broken handler")
    runner.close()
    err = capfd.readouterr().err
    assert "agent broke" in err and "handler broke" in err


# --- composite -----------------------------------------------------------------------


def test_composite_sums_work_and_shares_the_cycle_time() -> None:
    a = RecordingAgent("a", behaviour=lambda call: 1)
    b = RecordingAgent("b", behaviour=lambda call: 2)
    composite = CompositeAgent(a, b)
    assert composite.role_name == "[a,b]"
    composite.on_start()
    assert composite.do_work(500) == 3
    assert composite.do_work(600) == 3
    composite.on_close()
    assert a.times == b.times == [500, 600]
    assert a.events == b.events == ["start", "close"]
    with pytest.raises(ValueError):
        CompositeAgent()


def test_composite_resumes_after_the_agent_that_failed() -> None:
    def fail_first(call: int) -> int:
        if call == 1:
            raise ValueError("a failed")
        return 1

    a = RecordingAgent("a", behaviour=fail_first)
    b = RecordingAgent("b", behaviour=lambda call: 2)
    c = RecordingAgent("c", behaviour=lambda call: 4)
    composite = CompositeAgent(a, b, c)
    with pytest.raises(ValueError, match="a failed"):
        composite.do_work(1)
    # The next cycle starts with b, so a failing agent cannot starve the rest.
    assert composite.do_work(2) == 6
    assert (a.times, b.times, c.times) == ([1], [2], [2])
    assert composite.do_work(3) == 7
    assert (a.times, b.times, c.times) == ([1, 3], [2, 3], [2, 3])


def test_composite_hooks_reach_every_agent_and_raise_the_first_failure() -> None:
    class Broken(RecordingAgent):
        def on_close(self) -> None:
            super().on_close()
            raise OSError(f"{self.role_name} close failed")

    a, b, c = Broken("a"), RecordingAgent("b"), Broken("c")
    composite = CompositeAgent(a, b, c)
    with pytest.raises(OSError, match="a close failed") as info:
        composite.on_close()
    assert a.events == b.events == c.events == ["close"]
    assert any("c close failed" in note for note in info.value.__notes__)


def test_composite_on_a_runner(errors: Errors, runners: list[AgentRunner]) -> None:
    a = RecordingAgent("a")
    b = RecordingAgent("b")
    runner = AgentRunner(CompositeAgent(a, b), SleepingIdleStrategy(), errors.handle, clock=StepClock())
    runners.append(runner)
    assert runner.start().name == "[a,b]"
    poll(lambda: len(b.times) >= 3, what="composite cycles")
    runner.close()
    assert a.times[: len(b.times)] == b.times[: len(a.times)]
    assert a.threads == b.threads == {"[a,b]"}


# --- invoker ------------------------------------------------------------------------------


def test_invoker_runs_the_agent_from_the_owners_loop(errors: Errors) -> None:
    def behaviour(call: int) -> int:
        if call == 2:
            raise ValueError("cycle 2")
        if call == 4:
            raise AgentTerminationException("finished")
        return 7

    agent = RecordingAgent(behaviour=behaviour)
    invoker = AgentInvoker(agent, errors.handle, clock=StepClock(0, 5), error_counter=errors.increment)
    assert invoker.invoke() == 0 and agent.times == []  # not started yet
    invoker.start()
    assert invoker.is_started and invoker.is_running and agent.events == ["start"]
    assert invoker.invoke() == 7
    assert invoker.invoke() == 0  # the error is reported, not raised
    assert invoker.invoke() == 7
    assert invoker.invoke() == 0  # terminated: closes the agent
    assert invoker.is_closed and not invoker.is_running
    assert invoker.invoke() == 0
    assert agent.times == [5, 10, 15, 20]
    assert agent.events == ["start", "close"]
    assert [str(e) for e in errors.errors] == ["cycle 2", "finished"] and errors.count == 2
    assert agent.threads == {threading.current_thread().name}
    invoker.close()
    assert agent.events == ["start", "close"]  # close is idempotent


def test_invoker_close_runs_on_close_once(errors: Errors) -> None:
    agent = RecordingAgent()
    invoker = AgentInvoker(agent, errors.handle)
    invoker.start()
    invoker.start()
    assert invoker.invoke() == 1
    invoker.close()
    invoker.close()
    assert agent.events == ["start", "close"]
    assert invoker.invoke() == 0


def test_runner_closed_from_its_own_agent(errors: Errors) -> None:
    runner: AgentRunner

    def close_self(call: int) -> int:
        runner.close()
        return 1

    agent = RecordingAgent(behaviour=close_self)
    runner = AgentRunner(agent, SleepingIdleStrategy(), errors.handle)
    thread = runner.start()
    thread.join(5.0)
    assert not thread.is_alive() and runner.is_closed
    assert len(agent.times) == 1 and agent.events == ["start", "close"]
    assert errors.errors == []

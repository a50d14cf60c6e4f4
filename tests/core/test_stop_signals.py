"""The stop rules of a node's processes, without processes: which stop a
signal asks for (``StopSignals``), the wait of the archive and the driver for
the processes that need them (``StopGate``), the supervisor's use of the rule,
what the consensus module's agent does with a stop request in each state, and
the module's run loop asking again until the agent takes it; and, in a small
child process, the handlers' hold on a process whose run is over."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

from fulmar.buffers import AtomicBuffer
from fulmar.cli import supervisor
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import (
    ClusterRole,
    ConsensusModuleAgent,
    ConsensusModuleState,
    ControlToggle,
    ElectionState,
)
from fulmar.consensus.consensus_module import ConsensusModule
from fulmar.counters import COUNTER_LENGTH, AtomicCounter
from fulmar.idle import Doorbell
from fulmar.stop_signals import StopGate, StopKind, StopSignals
from support.agents import new_agent

MS = 1_000_000
SIGINT, SIGTERM = signal.SIGINT, signal.SIGTERM


# ---------------------------------------------------------------------------- the signal rule


def test_sigterm_asks_once_and_a_repeat_is_the_same_request() -> None:
    rule = StopSignals()
    assert rule.on_signal(SIGTERM, 0) is StopKind.ORDERLY
    assert rule.on_signal(SIGTERM, 1 * MS) is None
    assert rule.on_signal(SIGTERM, 5_000 * MS) is None  # a supervisor's, long after a service manager's
    assert rule.first_signum == SIGTERM and rule.requested is StopKind.ORDERLY and not rule.immediate


def test_sigterm_with_a_ctrl_c_is_one_request() -> None:
    rule = StopSignals()
    assert rule.on_signal(SIGINT, 0) is StopKind.ORDERLY
    assert rule.on_signal(SIGTERM, 1 * MS) is None
    rule = StopSignals()
    assert rule.on_signal(SIGTERM, 0) is StopKind.ORDERLY
    assert rule.on_signal(SIGINT, 1 * MS) is None
    assert not rule.immediate


def test_only_a_deliberate_second_ctrl_c_stops_at_once() -> None:
    rule = StopSignals(repeat_interval_ns=500 * MS)
    assert rule.on_signal(SIGINT, 0) is StopKind.ORDERLY
    assert rule.on_signal(SIGINT, 20 * MS) is None  # the same keypress, forwarded by a parent
    assert rule.on_signal(SIGTERM, 100 * MS) is None
    assert rule.on_signal(SIGINT, 600 * MS) is StopKind.IMMEDIATE
    assert rule.immediate
    assert rule.on_signal(SIGINT, 2_000 * MS) is None  # nothing stronger left to ask for


def test_a_ctrl_c_after_a_sigterm_counts_as_the_first_ctrl_c() -> None:
    rule = StopSignals(repeat_interval_ns=500 * MS)
    assert rule.on_signal(SIGTERM, 0) is StopKind.ORDERLY
    assert rule.on_signal(SIGINT, 1_000 * MS) is None
    assert rule.on_signal(SIGINT, 1_600 * MS) is StopKind.IMMEDIATE


def test_the_rule_says_what_each_signal_did() -> None:
    rule = StopSignals()
    assert rule.describe(StopKind.ORDERLY, SIGTERM).startswith("SIGTERM: stopping in order")
    assert rule.describe(None, SIGTERM) == "SIGTERM: the stop already under way goes on"
    assert rule.describe(StopKind.IMMEDIATE, SIGINT) == "SIGINT again: stopping at once"


# ---------------------------------------------------------------------------- the gate


class Running:
    """What a gate waits for: a list of answers, the last one repeated."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self) -> str | None:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_gate_waits_for_what_it_names_then_stops() -> None:
    said: list[str] = []
    running = Running("the consensus module (pid 7)", "the consensus module (pid 7)", "the archive (pid 8)", None)
    gate = StopGate(running, timeout_ns=30_000 * MS, say=said.append, check_interval_ns=100 * MS)
    assert not gate.may_stop(0) and running.calls == 0  # nothing asked yet
    gate.request()
    assert not gate.may_stop(0)
    assert said == ["stop requested: waiting for the consensus module (pid 7) to stop first (up to 30 s)"]
    assert not gate.may_stop(50 * MS) and running.calls == 1  # checked once per interval, not every cycle
    assert not gate.may_stop(100 * MS) and len(said) == 1  # the same one: said once
    assert not gate.may_stop(200 * MS)
    assert said[-1] == "stop requested: waiting for the archive (pid 8) to stop first (up to 30 s)"
    assert gate.may_stop(300 * MS)
    assert said[-1] == "the archive (pid 8) has stopped, and nothing else to wait for runs: stopping"


def test_a_gate_with_nothing_running_stops_at_once_and_silently() -> None:
    said: list[str] = []
    gate = StopGate(Running(None), timeout_ns=30_000 * MS, say=said.append)
    gate.request()
    assert gate.may_stop(0) and said == []


def test_a_gate_stops_anyway_after_its_timeout_and_says_so() -> None:
    said: list[str] = []
    gate = StopGate(
        Running("the consensus module (pid 7)"), timeout_ns=1_000 * MS, say=said.append, check_interval_ns=100 * MS
    )
    gate.request()
    now = 0
    while not gate.may_stop(now):
        now += 10 * MS
        assert now <= 1_200 * MS
    assert now >= 1_000 * MS
    assert said[-1] == "the consensus module (pid 7) still running 1 s after the stop was asked for: stopping anyway"


def test_an_immediate_request_ends_the_wait() -> None:
    said: list[str] = []
    gate = StopGate(Running("the consensus module (pid 7)"), timeout_ns=30_000 * MS, say=said.append)
    gate.request()
    assert not gate.may_stop(0)
    gate.request(immediate=True)
    assert gate.may_stop(1 * MS)
    assert said[-1] == "stopping at once, without waiting for the consensus module (pid 7)"


# ---------------------------------------------------------------------------- the supervisor


def make_supervisor(tmp_path: Any, rule: StopSignals | None = None) -> supervisor.Supervisor:
    config = supervisor.NodeConfig(
        member_id=0,
        cluster_id=0,
        node_dir=tmp_path,
        driver_dir=tmp_path / "driver",
        archive_dir=tmp_path / "archive",
        cluster_dir=tmp_path / "cluster",
        log_dir=tmp_path / "logs",
        start_timeout_s=60,
        stop_timeout_s=30,
        service="fulmar.service.samples:KeyValueService",
        service_count=1,
        ingress_channel="aeron:udp?endpoint=x:1",
    )
    return supervisor.Supervisor(config, signals=rule)


def test_the_supervisor_is_not_forced_by_a_sigterm_on_top_of_a_ctrl_c(tmp_path: Any) -> None:
    node = make_supervisor(tmp_path)
    assert not node.stop_requested
    node._on_signal(SIGINT, None)
    node._on_signal(SIGTERM, None)  # a wrapper forwarding SIGTERM; a service manager's
    node._on_signal(SIGTERM, None)
    assert node.stop_requested and not node.forced


def test_the_supervisor_is_forced_by_a_second_ctrl_c(tmp_path: Any) -> None:
    node = make_supervisor(tmp_path, StopSignals(repeat_interval_ns=0))
    node._on_signal(SIGINT, None)
    assert not node.forced
    node._on_signal(SIGINT, None)
    assert node.forced


def test_the_supervisor_tells_the_archive_and_the_driver_what_to_wait_for(tmp_path: Any) -> None:
    driver, archive, *_ = make_supervisor(tmp_path).config.child_specs()
    assert driver.args[driver.args.index("--stop-after-timeout") + 1] == "60s"  # two steps of 30 s before it
    assert [driver.args[i + 1] for i, arg in enumerate(driver.args) if arg == "--stop-after"] == [
        str(tmp_path / "cluster"),
        str(tmp_path / "archive"),
    ]
    assert archive.args[archive.args.index("--stop-after-timeout") + 1] == "30s"
    assert [archive.args[i + 1] for i, arg in enumerate(archive.args) if arg == "--stop-after"] == [
        str(tmp_path / "cluster")
    ]


# ---------------------------------------------------------------------------- the consensus module's agent


def agent_in(
    state: ConsensusModuleState,
    *,
    election: ElectionState | None = None,
    termination_action: ControlToggle | None = None,
    toggle: ControlToggle = ControlToggle.NEUTRAL,
    multi_member: bool = False,
) -> Any:
    """The fields ``ConsensusModuleAgent.request_shutdown`` reads and writes, in the given state."""
    values = AtomicBuffer(bytearray(2 * COUNTER_LENGTH))
    agent = SimpleNamespace(
        is_multi_member=multi_member,
        role=ClusterRole.LEADER,
        commit_position=1280,
        log_position=1280,
        state=state,
        terminated=False,
        termination_reason="",
        election=None if election is None else SimpleNamespace(state=election),
        _termination_action=termination_action,
        control_toggle=AtomicCounter(values, 0),
        module_state_counter=AtomicCounter(values, 1),
    )
    agent._set_state = lambda new_state: ConsensusModuleAgent._set_state(agent, new_state)  # type: ignore[arg-type]
    agent.control_toggle.set(toggle)
    return agent


class ServiceStream:
    """The services' stream to the module, holding one ServiceAck not yet read."""

    def __init__(self, ack_id: int, log_position: int) -> None:
        self.buffer = bytearray(128)
        self.length = codecs.ServiceAckEncoder.encode(
            self.buffer, 0, log_position=log_position, timestamp=1, ack_id=ack_id, relevant_id=0, service_id=0
        )

    def poll(self, handler: Any, limit: int) -> int:
        if not self.length:
            return 0
        length, self.length = self.length, 0
        handler(memoryview(self.buffer), 0, length, SimpleNamespace(flags=0xC0, session_id=1))
        return 1

    def is_data_available(self) -> bool:
        return self.length > 0


def test_a_service_that_acked_its_termination_and_exited_is_not_taken_for_dead() -> None:
    # cluster-tool abort: the service acks the termination position and exits
    # at once; the module's check for dead services may run before it reads
    # that ack.  The ack counts: the module stops by ABORT, committing the log.
    agent = new_agent()
    committed = []
    agent.recording_log = SimpleNamespace(  # type: ignore[assignment]
        commit_log_position=lambda term, position: committed.append(position)
    )
    agent._termination_action = ControlToggle.ABORT
    agent._termination_position = 96
    agent._termination_ack_id = agent.next_ack_id()
    agent._set_state(ConsensusModuleState.TERMINATING)
    agent.from_services = ServiceStream(agent._termination_ack_id, 96)  # type: ignore[assignment]
    agent._dead_services = lambda: [0]  # type: ignore[method-assign]
    while not agent.terminated:
        agent._check_snapshot_and_termination(10**12)
    assert agent.termination_reason == "ABORT at log position 96" and committed == [96]


def request(agent: Any, action: ControlToggle) -> bool:
    return ConsensusModuleAgent.request_shutdown(agent, action)


@pytest.mark.parametrize("state", [ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED])
@pytest.mark.parametrize("action", [ControlToggle.SHUTDOWN, ControlToggle.ABORT])
def test_a_running_module_takes_the_stop_through_its_control_toggle(
    state: ConsensusModuleState, action: ControlToggle
) -> None:
    agent = agent_in(state)
    assert request(agent, action) is True
    assert agent.control_toggle.get() == action and not agent.terminated
    assert request(agent, action) is True  # asked again: the same toggle, taken


def test_a_toggle_an_operator_set_goes_first() -> None:
    agent = agent_in(ConsensusModuleState.ACTIVE, toggle=ControlToggle.SUSPEND)
    assert request(agent, ControlToggle.SHUTDOWN) is False
    assert agent.control_toggle.get() == ControlToggle.SUSPEND
    agent.control_toggle.set(ControlToggle.NEUTRAL)  # the agent acted on it
    assert request(agent, ControlToggle.SHUTDOWN) is True
    assert agent.control_toggle.get() == ControlToggle.SHUTDOWN


@pytest.mark.parametrize(
    "election", [ElectionState.LEADER_REPLAY, ElectionState.LEADER_INIT, ElectionState.LEADER_READY]
)
def test_a_shutdown_during_the_election_waits_for_it(election: ElectionState) -> None:
    agent = agent_in(ConsensusModuleState.INIT, election=election)
    assert request(agent, ControlToggle.SHUTDOWN) is False  # not dropped: the caller asks again
    assert not agent.terminated and agent.control_toggle.get() == ControlToggle.NEUTRAL
    agent.election, agent.state = None, ConsensusModuleState.ACTIVE  # the election completed
    assert request(agent, ControlToggle.SHUTDOWN) is True
    assert agent.control_toggle.get() == ControlToggle.SHUTDOWN


def test_a_stop_before_the_services_joined_or_an_abort_in_the_election_stops_at_once() -> None:
    agent = agent_in(ConsensusModuleState.INIT, election=ElectionState.INIT)
    assert request(agent, ControlToggle.SHUTDOWN) is True
    assert agent.terminated and agent.state is ConsensusModuleState.CLOSED
    assert agent.termination_reason == (
        "SHUTDOWN during the election (INIT): stopped at once at log position 1280, no snapshot"
    )
    agent = agent_in(ConsensusModuleState.INIT, election=ElectionState.LEADER_REPLAY)
    assert request(agent, ControlToggle.ABORT) is True and agent.terminated
    assert agent.termination_reason.startswith("ABORT during the election (LEADER_REPLAY)")


def test_during_a_snapshot() -> None:
    shutting_down = agent_in(ConsensusModuleState.SNAPSHOT, termination_action=ControlToggle.SHUTDOWN)
    assert request(shutting_down, ControlToggle.SHUTDOWN) is True  # its own snapshot ends in the stop
    assert request(shutting_down, ControlToggle.ABORT) is False  # the snapshot under way completes first
    plain = agent_in(ConsensusModuleState.SNAPSHOT)  # cluster-tool snapshot
    assert request(plain, ControlToggle.SHUTDOWN) is False
    assert plain.control_toggle.get() == ControlToggle.NEUTRAL  # (the snapshot's end resets the toggle)


@pytest.mark.parametrize("state", [ConsensusModuleState.TERMINATING, ConsensusModuleState.CLOSED])
def test_a_module_already_stopping_has_nothing_more_to_do(state: ConsensusModuleState) -> None:
    agent = agent_in(state)
    assert request(agent, ControlToggle.SHUTDOWN) is True and request(agent, ControlToggle.ABORT) is True
    assert agent.control_toggle.get() == ControlToggle.NEUTRAL


@pytest.mark.parametrize("state", [ConsensusModuleState.INIT, ConsensusModuleState.ACTIVE])
def test_a_member_of_several_stops_at_once(state: ConsensusModuleState) -> None:
    agent = agent_in(
        state, multi_member=True, election=ElectionState.INIT if state is ConsensusModuleState.INIT else None
    )
    assert request(agent, ControlToggle.SHUTDOWN) is True
    assert agent.terminated and agent.termination_reason == "stopped as leader at commit position 1280"


# ---------------------------------------------------------------------------- the module's run loop


class FakeAgent:
    """An agent that cannot take a stop for its first ``busy_cycles`` (an
    election), then takes it and terminates ``cycles_to_stop`` later."""

    def __init__(self, busy_cycles: int, cycles_to_stop: int) -> None:
        self.busy_cycles = busy_cycles
        self.cycles_to_stop = cycles_to_stop
        self.asked: list[ControlToggle] = []
        self.taken: list[ControlToggle] = []
        self.events: list[str] = []
        self.terminated = False
        self.termination_reason = ""
        self.election: Any = SimpleNamespace(state=ElectionState.LEADER_REPLAY)
        self.state = ConsensusModuleState.INIT
        self.cycles = 0
        self.ingress_armed = False
        # The run loop tells the stall tracker of its intended idle waits.
        self.duty_cycle_tracker = SimpleNamespace(on_idle_wait=lambda max_wait_ns: None)

    def request_shutdown(self, action: ControlToggle) -> bool:
        assert not self.ingress_armed, "a stop request with the ingress still the native thread's"
        self.asked.append(action)
        if self.cycles < self.busy_cycles:
            return False
        self.taken.append(action)
        return True

    def do_work(self, now_ns: int) -> int:
        self.cycles += 1
        if self.cycles == self.busy_cycles:
            self.election, self.state = None, ConsensusModuleState.ACTIVE
        if self.taken and self.cycles >= self.busy_cycles + self.cycles_to_stop:
            self.terminated = True
            self.termination_reason = f"{self.taken[-1].name} at log position 1280"
        return 1

    def has_work(self) -> bool:
        return True

    def is_steady(self) -> bool:
        return self.election is None and self.state is ConsensusModuleState.ACTIVE

    def idle_wait_ns(self, max_wait_ns: int) -> int:
        return max_wait_ns

    # (The leader's ingress thread: armed as the loop goes to sleep, taken back before a stop request.)
    def arm_leader_ingress(self) -> None:
        self.ingress_armed = True

    def take_leader_ingress(self) -> int:
        self.ingress_armed = False
        return 0

    def log_event(self, text: str) -> None:
        self.events.append(text)

    def record_error(self, text: str) -> None:
        self.events.append(f"error: {text}")


def module_with(agent: FakeAgent) -> ConsensusModule:
    aeron = SimpleNamespace(
        conductor=SimpleNamespace(data_doorbell=Doorbell(AtomicBuffer(bytearray(8)))),
        is_closed=False,
        ring_deferred=lambda: 0,
    )
    context = SimpleNamespace(idle_max_wait_ns=1_000_000)
    mark_file = SimpleNamespace(update_activity_timestamp=lambda now_ms: None)
    return ConsensusModule(context, aeron, None, mark_file, None, agent)  # type: ignore[arg-type]


def test_a_stop_asked_for_during_the_election_is_taken_once_it_completes() -> None:
    agent = FakeAgent(busy_cycles=5, cycles_to_stop=3)
    module = module_with(agent)
    module.request_stop(ControlToggle.SHUTDOWN, "SIGTERM: stopping in order")
    module.run()
    assert agent.asked == [ControlToggle.SHUTDOWN] * 6  # asked every cycle until taken, then not again
    assert agent.taken == [ControlToggle.SHUTDOWN] and agent.termination_reason == "SHUTDOWN at log position 1280"
    assert agent.events == [
        "SIGTERM: stopping in order",
        "SHUTDOWN requested in election LEADER_REPLAY: acted on once the module can (within 30 s)",
    ]


def test_a_later_abort_is_passed_on_and_never_weakened() -> None:
    agent = FakeAgent(busy_cycles=0, cycles_to_stop=1_000_000)
    module = module_with(agent)
    module.request_stop(ControlToggle.SHUTDOWN)
    original = agent.do_work

    def do_work(now_ns: int) -> int:
        if agent.cycles == 3:
            module.request_stop(ControlToggle.ABORT, "SIGINT again: stopping at once")
            module.request_stop(ControlToggle.SHUTDOWN)  # an ABORT stays one
        if agent.cycles == 6:
            agent.terminated = True
        return original(now_ns)

    agent.do_work = do_work  # type: ignore[method-assign]
    module.run()
    assert agent.taken == [ControlToggle.SHUTDOWN, ControlToggle.ABORT]
    assert "SIGINT again: stopping at once" in agent.events


# ---------------------------------------------------------------------------- the handlers at the exit

_RUN_THEN_EXIT = textwrap.dedent("""
    import sys, time
    from fulmar.stop_signals import StopSignalHandlers, StopSignals
    try:
        with StopSignalHandlers(StopSignals(), lambda kind, signum: None, time.monotonic_ns):
            if sys.argv[1] == "fails":
                raise RuntimeError("the launch failed")
    except RuntimeError:
        pass
    print("run over", flush=True)
    time.sleep(2)  # what a node's process does after its run: close its files, say why it stopped
""")


def _signal_after_the_run(outcome: str) -> int:
    """Run the child, SIGTERM it once its run is over, and return its exit code."""
    child = subprocess.Popen([sys.executable, "-c", _RUN_THEN_EXIT, outcome], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        readable, _, _ = select.select([child.stdout], [], [], 30)
        assert readable and child.stdout.readline().strip() == "run over", "the child's run did not end in 30 s"
        child.send_signal(signal.SIGTERM)
        return child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.system
@pytest.mark.system
def test_a_sigterm_after_a_run_that_ended_by_itself_does_not_kill_the_exiting_process() -> None:
    # A service stops by itself at its module's termination position; the
    # supervisor's SIGTERM, a moment later, asks for what is already happening.
    assert _signal_after_the_run("returns") == 0


@pytest.mark.system
@pytest.mark.system
def test_after_a_run_that_failed_the_previous_handlers_are_back() -> None:
    assert _signal_after_the_run("fails") == -signal.SIGTERM

"""An exception from the user's service (``cluster-node service
--on-service-error``): by default written with its traceback to the service's
log and error log, counted, and the message skipped on every member alike;
``stop`` keeps the fail-stop.

The handler on its own, the agent's dispatch over a real log (one driver, no
cluster), and clusters of real processes on 127.0.0.1."""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from fulmar.aeron import Aeron
from fulmar.cli import cluster_node, cluster_tool
from fulmar.cli.cluster_commands import ClusterOperationError, cluster_operate
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog
from fulmar.service.agent import ClusteredServiceAgent
from fulmar.service.clustered_service import ClientSession, CloseReason, ClusteredService, Role
from fulmar.service.context import ServiceContext
from fulmar.service.errors import ServiceErrorHandler, ServiceFailedError
from support import failing_service
from support.chaos import snapshot_state
from support.cluster import LocalCluster, SingleNodeCluster
from support.driver import wait_for
from support.multi_node import member_view, wait_for_leader
from support.service_log import join_log

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TESTS_DIR = Path(__file__).parents[1]
FAILING_KV = "support.failing_service:FailingKeyValueService"


def line_of(function: Callable[..., Any], text: str) -> int:
    """The line number of the first line of ``function`` that holds ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


# ------------------------------------------------------------------ the handler alone


def bad_handler(payload: bytes) -> None:
    raise ValueError(f"cannot handle {payload!r}")


def deliver(handler: ServiceErrorHandler, callback: str, position: int, function: Callable[[], None]) -> None:
    """What the agent does around each call of the service."""
    try:
        function()
    except Exception as error:
        handler.on_callback_error(callback, error, position)


def test_continue_records_every_occurrence_and_writes_the_traceback_once() -> None:
    """Each occurrence is recorded with the same text (the distinct error log
    counts it instead of storing it again: a text with the position in it
    would fill the log), the traceback is written once with the file and line
    of the raise and without the container's frame (so the text is the same
    whichever path delivered the message), and each occurrence gets one line
    with its log position and count."""
    recorded: list[str] = []
    written: list[str] = []
    handler = ServiceErrorHandler(3, "continue", recorded.append, written.append)
    for position in (416, 1088):
        deliver(handler, "on_session_message", position, lambda: bad_handler(b"boom"))
    raise_line = line_of(bad_handler, "raise ValueError")
    assert len(recorded) == 2 and recorded[0] == recorded[1]
    text = recorded[0]
    assert text.startswith("service 3: on_session_message raised; the container went on (on-service-error continue):")
    assert f'File "{__file__}", line {raise_line}, in bad_handler' in text
    assert "in deliver" not in text  # the container's frame is left out
    assert text.endswith("ValueError: cannot handle b'boom'")
    assert "416" not in text
    assert written == [
        text,
        "service 3: on_session_message raised at log position 416 (1 time so far): ValueError: cannot handle b'boom'",
        "service 3: on_session_message raised at log position 1088 (2 times so far): ValueError: cannot handle b'boom'",
    ]


def test_background_work_that_fails_every_cycle_is_noted_at_doublings_only() -> None:
    """do_background_work runs every duty cycle: a line per failing cycle
    would flood the service's log, so only the 1st, 2nd, 4th, 8th... get one
    (every occurrence is still recorded, and so counted)."""
    recorded: list[str] = []
    written: list[str] = []
    handler = ServiceErrorHandler(0, "continue", recorded.append, written.append)
    for cycle in range(9):
        deliver(handler, "do_background_work", 100 + cycle, lambda: bad_handler(b"tick"))
    assert len(recorded) == 9
    notes = [line for line in written if "raised at log position" in line]
    counts = [int(re.search(r"\((\d+) times? so far\)", line)[1]) for line in notes]  # type: ignore[index]
    assert counts == [1, 2, 4, 8]
    assert sum("Traceback" in line for line in written) == 1


def test_stop_fails_the_service_naming_the_position_and_the_error() -> None:
    recorded: list[str] = []
    written: list[str] = []
    handler = ServiceErrorHandler(0, "stop", recorded.append, written.append)
    with pytest.raises(ServiceFailedError) as caught:
        deliver(handler, "on_timer_event", 416, lambda: bad_handler(b"timer"))
    assert str(caught.value) == (
        "service 0 failed at log position 416: on_timer_event raised (on-service-error stop): "
        "ValueError: cannot handle b'timer'"
    )
    assert isinstance(caught.value.__cause__, ValueError)
    raise_line = line_of(bad_handler, "raise ValueError")
    assert len(recorded) == 1 and f"line {raise_line}, in bad_handler" in recorded[0]
    assert written == recorded


def test_an_unknown_setting_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"on_service_error 'ignore': expected one of continue, stop"):
        ServiceErrorHandler(0, "ignore", lambda text: None)
    result = CliRunner().invoke(
        cluster_node.service, ["--cluster-dir", "x", "--service", "m:C", "--on-service-error", "ignore"]
    )
    assert result.exit_code == 2
    assert "'ignore' is not one of 'continue', 'stop'" in result.output


# ---------------------------------------------------------------- the agent's dispatch


class RaisingService(ClusteredService):
    """Raises in every callback of the log (on_session_message for b"boom"
    only) and, if asked, in its first background work; keeps what it applied."""

    def __init__(self, raise_in_background: bool = True) -> None:
        self.applied: list[bytes] = []
        self.raise_in_background = raise_in_background
        self.background_calls = 0

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        payload = bytes(buffer[offset : offset + length])
        if payload == b"boom":
            raise ValueError("boom in on_session_message")
        self.applied.append(payload)

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        raise ValueError("boom in on_session_open")

    def on_session_close(self, session: ClientSession, timestamp: int, reason: CloseReason) -> None:
        raise ValueError("boom in on_session_close")

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        raise ValueError("boom in on_timer_event")

    def on_new_leadership_term_event(self, *event: int) -> None:
        raise ValueError("boom in on_new_leadership_term_event")

    def on_role_change(self, new_role: Role) -> None:
        raise ValueError("boom in on_role_change")

    def do_background_work(self, now_ns: int) -> int:
        self.background_calls += 1
        if self.raise_in_background and self.background_calls == 1:
            raise ValueError("boom in do_background_work")
        return 0


SESSION_ID = 7


def session_message(payload: bytes) -> bytes:
    header = bytearray(codecs.HEADER_LENGTH + codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH)
    codecs.SessionMessageHeaderEncoder.encode(
        header, 0, leadership_term_id=0, cluster_session_id=SESSION_ID, timestamp=5
    )
    return bytes(header) + payload


def encoded(encoder: Any, **fields: Any) -> bytes:
    buffer = bytearray(512)
    return bytes(buffer[: encoder.encode(buffer, 0, **fields)])


def followed_agent(aeron: Aeron, tmp_path: Path, on_service_error: str, service: RaisingService) -> tuple[Any, ...]:
    """A service agent following a log publication of this test's (as its
    consensus module would have it join), with the commit position the
    test's to move."""
    context = ServiceContext(cluster_dir=tmp_path, on_service_error=on_service_error)
    errors: list[str] = []
    agent = ClusteredServiceAgent(context, aeron, None, service, errors.append)  # type: ignore[arg-type]
    commit = aeron.add_counter(protocol.COMMIT_POSITION_TYPE_ID, "a test's commit position")
    agent._commit_counter_id = commit.id
    to_service = aeron.add_exclusive_publication(context.control_channel, context.service_stream_id)
    from_service = aeron.add_subscription(context.control_channel, context.consensus_module_stream_id)
    wait_for(lambda: to_service.is_connected, 10, "the service stream to connect")
    log = aeron.add_exclusive_publication("aeron:ipc?term-length=64k", 100)
    join_log(to_service, f"aeron:ipc?term-length=64k|session-id={log.session_id}", log.session_id)
    wait_for(
        lambda: agent.do_work(time.monotonic_ns()) >= 0 and agent._log_image is not None, 10, "the log to be joined"
    )
    return agent, errors, commit, log, from_service


def append(log: Any, message: bytes) -> int:
    return int(wait_for(lambda: max(log.offer(message), 0), 10, "the log to take a message"))


def test_every_callback_that_raises_costs_only_its_own_message(
    aeron: Aeron, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over a real log: a run of client messages with a bad one in the middle
    (the hot path hands the run over in one call), then each kind of log
    event whose callback raises.  Every message after a raise is applied,
    the container's own bookkeeping (sessions, the term) goes on as if the
    callback had returned, and each exception is recorded once, at the log
    position of its message."""
    service = RaisingService()
    agent, errors, commit, log, _ = followed_agent(aeron, tmp_path, "continue", service)
    try:
        append(log, encoded(codecs.SessionOpenEventEncoder, leadership_term_id=0, correlation_id=1,
                            cluster_session_id=SESSION_ID, timestamp=5, response_stream_id=102,
                            response_channel="aeron:udp?endpoint=127.0.0.1:9"))  # fmt: skip
        append(log, session_message(b"one"))
        boom_position = append(log, session_message(b"boom"))
        append(log, session_message(b"three"))
        timer_position = append(log, encoded(codecs.TimerEventEncoder, leadership_term_id=0, correlation_id=9,
                                             timestamp=6))  # fmt: skip
        append(log, encoded(codecs.NewLeadershipTermEventEncoder, leadership_term_id=4, log_position=0,
                            timestamp=7, term_base_log_position=0, leader_member_id=0, log_session_id=1))  # fmt: skip
        append(log, session_message(b"four"))
        end = append(log, encoded(codecs.SessionCloseEventEncoder, leadership_term_id=4,
                                  cluster_session_id=SESSION_ID, timestamp=8, close_reason=0))  # fmt: skip
        commit.set(end)
        wait_for(lambda: agent.do_work(time.monotonic_ns()) >= 0 and agent.log_position >= end, 10, "the log applied")
        agent._set_role(Role.LEADER)
    finally:
        agent.close()
    assert agent.log_position == end
    assert service.applied == [b"one", b"three", b"four"]  # not b"boom", nothing of the run after it lost
    assert agent.sessions == {} and agent.leadership_term_id == 4 and agent.role is Role.LEADER
    callbacks = [re.match(r"service 0: (\w+) raised; the container went on", text)[1] for text in errors]  # type: ignore[index]
    assert callbacks == [
        "do_background_work",
        "on_session_open",
        "on_session_message",
        "on_timer_event",
        "on_new_leadership_term_event",
        "on_session_close",
        "on_role_change",
    ]
    for text in errors:
        callback = text.split()[2]
        line = line_of(getattr(RaisingService, callback), "raise ValueError")
        assert f'File "{__file__}", line {line}, in {callback}' in text, text
        assert text.endswith(f"ValueError: boom in {callback}"), text
    stderr = capsys.readouterr().err
    assert f"on_session_message raised at log position {boom_position} (1 time so far)" in stderr
    assert f"on_timer_event raised at log position {timer_position} (1 time so far)" in stderr


def test_the_fallback_path_of_a_session_message_skips_it_too(aeron: Aeron, tmp_path: Path) -> None:
    """A session message that does not arrive in a run (e.g. reassembled from
    fragments) goes through the log message handler: the same rule."""
    service = RaisingService(raise_in_background=False)
    agent, errors, _commit, _log, _ = followed_agent(aeron, tmp_path, "continue", service)
    try:
        for position, payload in ((64, b"boom"), (128, b"two")):
            message = session_message(payload)
            agent._on_log_message(memoryview(message), 0, len(message), SimpleNamespace(position=position))
    finally:
        agent.close()
    assert service.applied == [b"two"]
    assert len(errors) == 1 and "on_session_message raised" in errors[0]
    assert agent.log_position == 128


def test_stop_fails_at_the_bad_message(aeron: Aeron, tmp_path: Path) -> None:
    """``stop``: the service fails at the log position of the message that
    raised, having applied what came before it."""
    service = RaisingService(raise_in_background=False)
    agent, errors, commit, log, _ = followed_agent(aeron, tmp_path, "stop", service)
    try:
        append(log, session_message(b"one"))
        boom_position = append(log, session_message(b"boom"))
        commit.set(append(log, session_message(b"three")))
        with pytest.raises(ServiceFailedError, match=rf"failed at log position {boom_position}: on_session_message"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                agent.do_work(time.monotonic_ns())
    finally:
        agent.close()
    assert service.applied == [b"one"]
    assert errors[-1].startswith(f"service 0 failed at log position {boom_position}: on_session_message raised")


# ---------------------------------------------------------------------- real clusters


def kv(client: ClusterClient, **request: Any) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(client.request(json.dumps(request).encode(), timeout_s=20))
    return reply


def tool_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cluster_tool.main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.output)
    return document


def service_errors(cluster: LocalCluster) -> dict[str, list[dict[str, Any]]]:
    """Each node's service 0 errors, as ``cluster-tool errors --dir BASE`` reads them."""
    document = tool_json("errors", "--dir", str(cluster.base))
    return {
        node["node"]: next(f["errors"] for f in node["files"] if f["component"] == "service 0")
        for node in document["nodes"]
    }


def service_error_counters(cluster: LocalCluster) -> dict[str, list[int]]:
    """Each node's service-errors counters, as ``cluster-tool counters --dir BASE`` reads them."""
    document = tool_json("counters", "--dir", str(cluster.base))
    return {
        node["node"]: [c["value"] for c in node["counters"] if c["type"] == "service-errors"]
        for node in document["nodes"]
    }


def snapshot_everywhere(cluster: LocalCluster) -> int:
    """A snapshot on every member (cluster-tool snapshot); its log position, the same on each."""
    commit = member_view(cluster, wait_for_leader(cluster, 30).member).commit_position or 0
    cluster_operate(cluster.base, "snapshot", 30)

    def positions() -> list[int]:
        found = []
        for member in range(cluster.size):
            with RecordingLog.open(cluster.cluster_dir(member), create=False) as log:
                entry = log.get_latest_snapshot(0)
            found.append(-1 if entry is None else entry.log_position)
        return found

    wait_for(lambda: min(positions()) > commit, 30, f"every member's service snapshot after {commit}")
    found = positions()
    assert len(set(found)) == 1, f"the members' snapshots are at different positions: {found}"
    return found[0]


def check_one_service_error(cluster: LocalCluster, logs: list[str], count: int) -> list[int]:
    """Every member: the service alive, the traceback of the raise (file and
    line) in its log once, ``count`` occurrences noted there at the same log
    positions as on the others, ``cluster-tool errors`` showing the one error
    with that count, and the errors counter equal to it.  The occurrences'
    log positions."""
    raise_line = line_of(failing_service.FailingKeyValueService.on_session_message, "raise ValueError")
    where = f'File "{failing_service.__file__}", line {raise_line}, in on_session_message'
    notes = re.compile(r"service 0: on_session_message raised at log position (\d+) \((\d+) times? so far\)")
    positions = []
    for member, text in enumerate(logs):
        assert cluster.is_running(member, "service"), f"member {member}'s service died:\n{text[-3000:]}"
        assert text.count(where) == 1, f"member {member}'s service log:\n{text[-3000:]}"
        assert "ValueError: a request this service cannot handle" in text
        found = [(int(p), int(n)) for p, n in notes.findall(text)]
        assert [n for _, n in found] == list(range(1, count + 1)), found
        positions.append([p for p, _ in found])
    assert all(p == positions[0] for p in positions), f"the members skipped different positions: {positions}"
    errors = service_errors(cluster)
    counters = service_error_counters(cluster)
    for node, listed in errors.items():
        # One distinct error, every occurrence counted on it (not one entry
        # each), with the file and line; nothing else went wrong.
        assert len(listed) == 1, f"{node}: {listed}"
        assert listed[0]["observation_count"] == count
        assert where in listed[0]["text"] and "on_session_message raised; the container went on" in listed[0]["text"]
        # The counter counts what the error log holds (every recorded error).
        assert counters[node] == [count], f"{node}: {counters[node]}"
    return positions[0]


def test_a_message_the_service_cannot_handle_costs_one_request_on_every_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three members; b"boom" raises in the service.  Every member skips it at
    the same log position and goes on: the requests after it are answered,
    each member's log and error log hold the traceback, the error counter
    counts it, and the members' states are equal at the same log position.
    A second b"boom" is one more occurrence of the same error (no second
    traceback).  Killed and restarted, the cluster replays it from the log,
    skips it again and serves on."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    with LocalCluster(3, FAILING_KV) as cluster:
        cluster.start()
        wait_for_leader(cluster, 30)
        client = cluster.connect_client()
        assert kv(client, op="put", key="a", value=1, id=1)["ok"]
        assert client.offer(b"boom") > 0
        # No reply to it: the next reply is the next request's.
        assert kv(client, op="put", key="b", value=2, id=2) == {"id": 2, "ok": True, "previous": None}
        assert kv(client, op="get", key="a", id=3) == {"id": 3, "ok": True, "value": 1}

        def service_logs() -> list[str]:
            processes = [cluster.process(m, "service") for m in range(cluster.size)]
            return [p.output() if p is not None else "" for p in processes]

        def noted(times: int) -> bool:
            return all(f"({times} time{'' if times == 1 else 's'} so far)" in text for text in service_logs())

        wait_for(lambda: noted(1), 30, "every member's service to note the exception")
        first = snapshot_everywhere(cluster)
        states = {m: snapshot_state(cluster, m, first) for m in range(cluster.size)}
        assert all(state == {"a": 1, "b": 2} for state in states.values()), states
        (boom,) = check_one_service_error(cluster, service_logs(), 1)
        assert boom < first

        # The same error again: counted, one more note, no second traceback.
        assert client.offer(b"boom") > 0
        assert kv(client, op="put", key="c", value=3, id=4)["ok"]
        wait_for(lambda: noted(2), 30, "every member's service to note the second exception")
        occurrences = check_one_service_error(cluster, service_logs(), 2)
        assert occurrences[0] == boom
        second_boom = occurrences[1]
        client.close()

        # Every process of every member killed: the restart loads the snapshot
        # and replays the log after it, the second b"boom" included.
        for member in range(cluster.size):
            cluster.kill_member(member)
        cluster.start()
        wait_for_leader(cluster, 60)
        client = cluster.connect_client()
        assert kv(client, op="get", key="c", id=5) == {"id": 5, "ok": True, "value": 3}
        assert kv(client, op="put", key="d", value=4, id=6)["ok"]
        wait_for(lambda: noted(1), 30, "every restarted service to note the replayed exception")
        # The second b"boom" (after the snapshot the members restarted from), at the same position.
        assert check_one_service_error(cluster, service_logs(), 1) == [second_boom]
        second = snapshot_everywhere(cluster)
        states = {m: snapshot_state(cluster, m, second) for m in range(cluster.size)}
        assert all(state == {"a": 1, "b": 2, "c": 3, "d": 4} for state in states.values()), states


def test_stop_keeps_the_fail_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--on-service-error stop``: the container stops at the message,
    naming the log position and the error, with the traceback in its log."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    cluster = SingleNodeCluster(
        "support.failing_service:FailingService", extra_service_args=("--on-service-error", "stop")
    )
    try:
        cluster.start()
        client = ClusterClient.connect(
            cluster.connect(),
            cluster.ingress_channel,
            egress_channel="aeron:udp?endpoint=127.0.0.1:0",
            message_timeout_ns=20_000_000_000,
        )
        assert client.request(b"fine", 10) == b"fine"
        client.offer(b"boom")
        assert cluster.service is not None
        cluster.service.process.wait(20)
        output = cluster.service.output()
        assert cluster.service.process.returncode == 1, output
        assert re.search(
            r"cluster-node service: ServiceFailedError: service 0 failed at log position \d+: "
            r"on_session_message raised \(on-service-error stop\): RuntimeError: the service was asked to fail",
            output,
        ), output
        raise_line = line_of(failing_service.FailingService.on_session_message, "raise RuntimeError")
        assert f'File "{failing_service.__file__}", line {raise_line}, in on_session_message' in output
        client.close()
    finally:
        cluster.close()


def test_a_service_that_cannot_start_stops_whatever_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception from on_start (which loads the snapshot) stops the
    service even with ``continue``: its state is not the one the log goes on
    from.  The traceback is in its log and its error log."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    cluster = SingleNodeCluster("support.failing_service:FailsToStart")
    try:
        with pytest.raises(AssertionError, match="service exited with 1"):
            cluster.start()
        output = (cluster.base / "service.log").read_text()
        assert (
            "cluster-node service: ServiceFailedError: service 0 failed at log position 0: on_start raised "
            "(a service that did not start cannot go on): RuntimeError: the service cannot start"
        ) in output, output
        raise_line = line_of(failing_service.FailsToStart.on_start, "raise RuntimeError")
        where = f'File "{failing_service.__file__}", line {raise_line}, in on_start'
        assert where in output
        document = tool_json("errors", "--dir", str(cluster.cluster_dir))
        (errors,) = [f["errors"] for f in document["nodes"][0]["files"] if f["component"] == "service 0"]
        assert len(errors) == 1 and where in errors[0]["text"], errors
    finally:
        cluster.close()


def test_a_service_that_cannot_write_its_snapshot_stops_whatever_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception from on_take_snapshot stops the service even with
    ``continue``: a snapshot without all of the state would be loaded later
    as if it were whole.  No snapshot is recorded, and the node stops."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    cluster = SingleNodeCluster("support.failing_service:FailsToSnapshot")
    try:
        cluster.start()
        client = ClusterClient.connect(
            cluster.connect(),
            cluster.ingress_channel,
            egress_channel="aeron:udp?endpoint=127.0.0.1:0",
            message_timeout_ns=20_000_000_000,
        )
        assert client.request(b"fine", 10) == b"fine"
        # The service fails instead of acknowledging it, and its module stops without it.
        with pytest.raises(ClusterOperationError, match="the consensus module of .* exited"):
            cluster_operate(cluster.cluster_dir, "snapshot", 30)
        assert cluster.consensus is not None
        assert "service(s) [0] died during the snapshot" in cluster.consensus.output()
        assert cluster.service is not None
        cluster.service.process.wait(20)
        output = cluster.service.output()
        assert cluster.service.process.returncode == 1, output
        assert re.search(
            r"ServiceFailedError: service 0 failed at log position \d+: on_take_snapshot raised "
            r"\(a snapshot must hold the whole state\): RuntimeError: the service cannot write its snapshot",
            output,
        ), output
        raise_line = line_of(failing_service.FailsToSnapshot.on_take_snapshot, "raise RuntimeError")
        assert f'File "{failing_service.__file__}", line {raise_line}, in on_take_snapshot' in output
        with RecordingLog.open(cluster.cluster_dir, create=False) as log:
            assert log.get_latest_snapshot(0) is None
        client.close()
    finally:
        cluster.close()

"""A one-member cluster of real processes (driver, archive, consensus module,
service container) serving sample services to real clients."""

from __future__ import annotations

import os
import signal
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.client import AuthenticationRejectedError, ClusterClient
from fulmar.consensus.mark_file import read_activity_timestamp
from fulmar.consensus.recording_log import RecordingLog, decode_entries
from support.cluster import SingleNodeCluster
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system


@pytest.fixture
def cluster_of() -> Iterator[Any]:
    clusters: list[SingleNodeCluster] = []

    def start(service: str, *args: str) -> SingleNodeCluster:
        cluster = SingleNodeCluster(service, extra_consensus_args=args)
        clusters.append(cluster)
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.close()


def connect(cluster: SingleNodeCluster, **options: Any) -> ClusterClient:
    return ClusterClient.connect(
        cluster.connect(),
        cluster.ingress_channel,
        egress_channel="aeron:udp?endpoint=127.0.0.1:0",
        message_timeout_ns=20_000_000_000,
        **options,
    )


def test_echo_every_message_in_order(cluster_of: Any) -> None:
    cluster = cluster_of("fulmar.service.samples:EchoService")
    replies: list[bytes] = []
    client = connect(cluster, on_message=lambda session_id, timestamp, payload: replies.append(bytes(payload)))
    total, window = 100_000, 500
    sent = 0
    deadline = time.monotonic() + 120
    while len(replies) < total:
        while sent < total and sent - len(replies) < window:
            if client.offer(struct.pack("<q", sent) * (1 + sent % 16)) > 0:
                sent += 1
            else:
                break
        if not client.poll_egress(100):
            assert time.monotonic() < deadline, f"{len(replies)} of {total} echoes in 120 s"
    assert replies == [struct.pack("<q", seq) * (1 + seq % 16) for seq in range(total)]
    client.close()


def test_snapshot_stop_and_restart_keeps_the_state(cluster_of: Any) -> None:
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    for expected in range(1, 51):
        value, _ = struct.unpack("<qq", client.request(b"+", 10))
        assert value == expected
    client.close()
    cluster.stop_node()  # SIGTERM: a snapshot, then an orderly stop at one log position
    assert "consensus module stopped: SHUTDOWN at log position" in cluster.consensus.output(), (
        f"consensus: {cluster.consensus.output()[-1500:]}\nservice: {cluster.service.output()[-1500:]}"
    )
    with RecordingLog.open(cluster.cluster_dir, create=False) as recording_log:
        assert recording_log.get_latest_snapshot(-1) is not None  # the module's
        assert recording_log.get_latest_snapshot(0) is not None  # the service's
    cluster.start_consensus()
    cluster.start_service()
    client = connect(cluster)
    value, _ = struct.unpack("<qq", client.request(b"?", 10))
    assert value == 50
    value, _ = struct.unpack("<qq", client.request(b"+", 10))
    assert value == 51
    client.close()


def assert_shutdown_with_snapshots(cluster: SingleNodeCluster) -> None:
    assert cluster.consensus is not None and cluster.service is not None, "the node was not started"
    assert "consensus module stopped: SHUTDOWN at log position" in cluster.consensus.output(), (
        f"consensus: {cluster.consensus.output()[-1500:]}\nservice: {cluster.service.output()[-1500:]}"
    )
    with RecordingLog.open(cluster.cluster_dir, create=False) as recording_log:
        assert recording_log.get_latest_snapshot(-1) is not None  # the module's
        assert recording_log.get_latest_snapshot(0) is not None  # the service's


def test_sigterm_and_sigint_together_are_one_shutdown(cluster_of: Any) -> None:
    """A terminal's Ctrl-C and a SIGTERM (a service manager's, a wrapper's)
    reach the module together: both are handled before its next duty cycle
    (it is held with SIGSTOP while they arrive, so this does not depend on
    timing).  One request: SHUTDOWN with a snapshot, not ABORT."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    for expected in range(1, 11):
        assert struct.unpack("<qq", client.request(b"+", 10))[0] == expected
    client.close()
    module, service = cluster.consensus.process, cluster.service.process
    os.kill(module.pid, signal.SIGSTOP)
    try:
        module.send_signal(signal.SIGTERM)
        service.send_signal(signal.SIGTERM)
        module.send_signal(signal.SIGINT)
    finally:
        os.kill(module.pid, signal.SIGCONT)
    assert cluster.consensus.stop() == 0 and cluster.service.stop() == 0
    assert_shutdown_with_snapshots(cluster)


def test_sigterm_again_while_the_snapshot_is_under_way_changes_nothing(cluster_of: Any) -> None:
    """The single-node pattern on purpose: SIGTERM to the module and the
    service, then SIGTERM again (and a SIGINT right behind it) while the stop
    is under way (the service held with SIGSTOP, so the snapshot cannot
    complete in between): the module says it saw each, and still stops with
    SHUTDOWN and a snapshot."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    for expected in range(1, 11):
        assert struct.unpack("<qq", client.request(b"+", 10))[0] == expected
    client.close()
    module, service = cluster.consensus, cluster.service.process
    os.kill(service.pid, signal.SIGSTOP)
    try:
        module.process.send_signal(signal.SIGTERM)
        service.send_signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM: stopping in order" in module.output(), 10, "the module to take the SIGTERM")
        module.process.send_signal(signal.SIGTERM)
        wait_for(
            lambda: "SIGTERM: the stop already under way goes on" in module.output(),
            10,
            "the module to take the second SIGTERM",
        )
        module.process.send_signal(signal.SIGINT)
        wait_for(
            lambda: "SIGINT: the stop already under way goes on" in module.output(), 10, "the module to take the SIGINT"
        )
        assert module.alive  # the stop waits for the service's snapshot
    finally:
        os.kill(service.pid, signal.SIGCONT)
    assert cluster.consensus.stop() == 0 and cluster.service.stop() == 0
    assert "ABORT" not in module.output()
    assert_shutdown_with_snapshots(cluster)


@pytest.mark.parametrize("victim", ["consensus", "service", "archive", "driver"])
def test_sigkill_while_a_client_writes_then_restart_replays_the_log(cluster_of: Any, victim: str) -> None:
    """SIGKILL one of the node's four processes while a client writes; the
    node goes down with it (as a supervisor would take it down) and comes
    back: every acknowledged increment is there, none applied twice."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    acknowledged = 0
    for expected in range(1, 41):
        value, _ = struct.unpack("<qq", client.request(b"+", 10))
        assert value == expected
        acknowledged = value
    client.offer(b"+")  # one more in flight when the process dies
    sent = acknowledged + 1
    getattr(cluster, victim).kill()
    client.close()
    cluster.kill_all()
    cluster.start()
    client = connect(cluster)
    value, _ = struct.unpack("<qq", client.request(b"?", 10))
    assert acknowledged <= value <= sent, (acknowledged, value, sent)
    value_after, _ = struct.unpack("<qq", client.request(b"+", 10))
    assert value_after == value + 1
    client.close()


def test_timers_fire_once_and_survive_a_restart(cluster_of: Any) -> None:
    """CounterService ticks once per second of cluster time while a session is
    open: the ticks replayed after a crash are the ones fired before it (none
    fired twice), and the timer carries on afterwards."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    opened_ms = time.time() * 1000
    deadline = time.monotonic() + 15
    ticks = 0
    while ticks < 2:
        _, ticks = struct.unpack("<qq", client.request(b"?", 10))
        assert time.monotonic() < deadline, "the timer did not fire twice in 15 s"
        time.sleep(0.05)  # paces the polling of a 1 s timer; not a synchronisation
    client.close()
    cluster.kill_all()
    cluster.start()
    client = connect(cluster)
    _, replayed_ticks = struct.unpack("<qq", client.request(b"?", 10))
    elapsed_periods = (time.time() * 1000 - opened_ms) // 1000
    assert ticks <= replayed_ticks <= elapsed_periods + 1, (ticks, replayed_ticks, elapsed_periods)
    deadline = time.monotonic() + 15
    later = replayed_ticks
    while later <= replayed_ticks:
        _, later = struct.unpack("<qq", client.request(b"?", 10))
        assert time.monotonic() < deadline, "the timer stopped after the restart"
        time.sleep(0.05)
    client.close()


def test_a_silent_session_times_out(cluster_of: Any) -> None:
    cluster = cluster_of("fulmar.service.samples:EchoService", "--session-timeout", "1s")
    client = connect(cluster, keepalive_interval_ns=0)  # no keepalives: silence
    assert client.request(b"ping", 10) == b"ping"
    deadline = time.monotonic() + 10
    while not client.is_closed:
        client.poll_egress(10)
        assert time.monotonic() < deadline, "the session was not closed for its silence"
        time.sleep(0.01)
    client.close()


def test_credentials_are_required_when_the_authenticator_is_on(cluster_of: Any) -> None:
    cluster = cluster_of("fulmar.service.samples:EchoService", "--authenticator-secret", "s3cret")
    aeron = cluster.connect()
    commit = _cluster_counter(aeron, "Cluster commit-pos")
    # The election's NewLeadershipTermEvent is the log's first entry: committed first.
    deadline = time.monotonic() + 10
    while aeron.counters_reader.counter_value(commit) <= 0:
        assert time.monotonic() < deadline, "the new term's event was not committed"
        time.sleep(0.005)
    before = aeron.counters_reader.counter_value(commit)
    with pytest.raises(AuthenticationRejectedError):
        connect(cluster)  # no credentials at all
    with pytest.raises(AuthenticationRejectedError):
        connect(cluster, credentials=b"wrong")
    with pytest.raises(AuthenticationRejectedError):
        connect(cluster, on_challenge=lambda challenge: b"still wrong")
    # A rejected session never reaches the log: no SessionOpenEvent was appended.
    assert aeron.counters_reader.counter_value(commit) == before
    good = connect(cluster, credentials=b"alice:s3cret")
    # An accepted one does (its SessionOpenEvent, committed soon after the client is told).
    deadline = time.monotonic() + 10
    while aeron.counters_reader.counter_value(commit) <= before:
        assert time.monotonic() < deadline, "the accepted session's open event was not committed"
        time.sleep(0.005)
    assert good.request(b"hello", 10) == b"hello"
    good.close()
    challenged = connect(cluster, on_challenge=lambda challenge: b"s3cret")
    assert challenged.request(b"again", 10) == b"again"
    challenged.close()


def test_bad_ingress_is_ignored_and_counted(cluster_of: Any) -> None:
    cluster = cluster_of("fulmar.service.samples:EchoService")
    client = connect(cluster)
    aeron = cluster.connect()
    raw = aeron.add_exclusive_publication(cluster.ingress_channel, 101)
    deadline = time.monotonic() + 10
    while not raw.is_connected:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    header = bytearray(32)
    bad = [
        b"garbage that is not SBE at all",
        bytes(8),  # a header of nothing
        struct.pack("<HHHH", 24, 1, 999, 1) + bytes(24),  # another schema
        struct.pack("<HHHH", 0, 4242, 111, 12),  # an unknown template
    ]
    codecs.SessionMessageHeaderEncoder.encode(
        header, 0, leadership_term_id=client.leadership_term_id, cluster_session_id=987654, timestamp=0
    )
    bad.append(bytes(header) + b"unknown session")
    codecs.SessionMessageHeaderEncoder.encode(
        header,
        0,
        leadership_term_id=client.leadership_term_id + 7,
        cluster_session_id=client.cluster_session_id,
        timestamp=0,
    )
    bad.append(bytes(header) + b"wrong term")
    for message in bad:
        while raw.offer(message) < 0:
            assert time.monotonic() < deadline
    counter = _cluster_counter(aeron, "Cluster invalid requests")
    while aeron.counters_reader.counter_value(counter) < len(bad):
        assert time.monotonic() < deadline, aeron.counters_reader.counter_value(counter)
        time.sleep(0.005)
    assert client.request(b"still serving", 10) == b"still serving"
    client.close()


def _cluster_counter(aeron: Any, label: str) -> int:
    for counter in aeron.counters_reader:
        if counter.label.startswith(label):
            return int(counter.counter_id)
    raise AssertionError(f"no counter labelled {label!r}")


def test_a_dead_service_does_not_hold_up_the_modules_stop(cluster_of: Any) -> None:
    """SIGTERM asks for a snapshot and a stop at one log position; with the
    service already dead the module must not wait for it for ever."""
    cluster = cluster_of("fulmar.service.samples:EchoService")
    client = connect(cluster)
    assert client.request(b"x", 10) == b"x"
    client.close()
    cluster.service.kill()
    started = time.monotonic()
    cluster.consensus.stop(timeout_s=30)
    assert time.monotonic() - started < 10
    output = cluster.consensus.output()
    assert "died during the snapshot" in output or "already gone" in output, output


def test_a_client_can_ask_for_a_snapshot(cluster_of: Any) -> None:
    """An AdminRequest SNAPSHOT from a client session: answered OK, and the
    snapshot lands in the recording log at one log position for all."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    responses: list[tuple[int, Any]] = []
    client = connect(
        cluster,
        on_admin_response=lambda correlation_id, session_id, request_type, code, message, payload: responses.append(
            (correlation_id, code)
        ),
    )
    client.request(b"+", 10)
    correlation_id = client.send_admin_request_to_take_snapshot()
    assert correlation_id is not None
    deadline = time.monotonic() + 10
    while not responses:
        client.poll_egress(10)
        assert time.monotonic() < deadline, "no AdminResponse"
        time.sleep(0.001)
    assert responses == [(correlation_id, codecs.AdminResponseCode.OK)]
    while True:
        # Read without opening for writing: the module is appending to it.
        entries = decode_entries((cluster.cluster_dir / "recording.log").read_bytes()).entries
        snapshots = {entry.service_id: entry for entry in entries if entry.entry_type == 1 and entry.is_valid}
        if -1 in snapshots and 0 in snapshots:
            break
        assert time.monotonic() < deadline, "the snapshot did not reach the recording log"
        time.sleep(0.01)
    assert snapshots[-1].log_position == snapshots[0].log_position > 0
    client.close()


def test_service_messages_are_applied_once_even_across_a_replay(cluster_of: Any) -> None:
    """A service offers messages into the log (CounterService's b"!"); after a
    crash the replay makes the service offer them again, and the consensus
    module must not append them twice."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    for _ in range(5):
        client.request(b"!", 10)
    deadline = time.monotonic() + 10
    value = 0
    while value < 5:
        value, _ = struct.unpack("<qq", client.request(b"?", 10))
        assert time.monotonic() < deadline, f"the service's messages were not applied: {value}"
    assert value == 5
    client.close()
    cluster.kill_all()
    cluster.start()
    client = connect(cluster)
    value, _ = struct.unpack("<qq", client.request(b"?", 10))
    assert value == 5  # replayed: the five service messages, each once
    client.request(b"!", 10)
    deadline = time.monotonic() + 10
    while value < 6:
        value, _ = struct.unpack("<qq", client.request(b"?", 10))
        assert time.monotonic() < deadline
    # A duplicate would be in the log before this request: the module appends
    # pending service messages before it sequences new ingress.
    value, _ = struct.unpack("<qq", client.request(b"?", 10))
    assert value == 6
    client.close()


def test_a_connected_client_keeps_its_session_across_a_module_restart(cluster_of: Any) -> None:
    """The module and service die and come back (driver and archive stay up):
    the session is known again from the log, the new term's leader sends it a
    NewLeaderEvent, and the client carries on in the same session."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    new_leaders: list[tuple[Any, ...]] = []
    client = connect(cluster, on_new_leader=lambda *event: new_leaders.append(event))
    for expected in range(1, 4):
        assert struct.unpack("<qq", client.request(b"+", 10))[0] == expected
    session_id, term = client.cluster_session_id, client.leadership_term_id
    cluster.consensus.kill()
    cluster.service.kill()
    cluster.start_consensus()
    cluster.start_service()
    deadline = time.monotonic() + 20
    while not new_leaders:
        client.poll_egress(10)
        assert time.monotonic() < deadline, "no NewLeaderEvent after the restart"
        time.sleep(0.005)
    endpoint = cluster.ingress_channel.split("endpoint=")[1]
    assert new_leaders == [(session_id, term + 1, 0, f"0={endpoint}")]
    assert client.cluster_session_id == session_id and client.leadership_term_id == term + 1
    assert struct.unpack("<qq", client.request(b"+", 10))[0] == 4
    client.close()


def test_a_dead_service_stops_its_consensus_module_after_the_heartbeat_timeout(cluster_of: Any) -> None:
    """As Aeron's checkServiceHeartbeats: a module whose service is gone stops
    (its node then fails over), rather than go on without ever answering."""
    cluster = cluster_of("fulmar.service.samples:EchoService", "--service-heartbeat-timeout", "2s")
    client = connect(cluster)
    assert client.request(b"alive", timeout_s=10) == b"alive"
    assert cluster.service is not None and cluster.consensus is not None
    killed_at = time.monotonic()
    cluster.service.kill()
    wait_for(lambda: not cluster.consensus.alive, 15, "the consensus module to stop without its service")
    assert time.monotonic() - killed_at > 1.9  # not before the timeout
    assert cluster.consensus.process.returncode != 0
    assert "no heartbeat from service 0" in cluster.consensus.output()


def test_a_node_paused_longer_than_the_service_heartbeat_timeout_goes_on(cluster_of: Any) -> None:
    """SIGSTOP of the module and its service together (a stopped VM, a long
    stall) is not a dead service: both resume, and the module keeps going."""
    cluster = cluster_of("fulmar.service.samples:EchoService", "--service-heartbeat-timeout", "2s")
    client = connect(cluster)
    assert client.request(b"before", timeout_s=10) == b"before"
    assert cluster.service is not None and cluster.consensus is not None
    processes = [cluster.consensus.process, cluster.service.process]
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(3.5)  # the fault itself: a pause longer than the timeout
    finally:
        # The module first, and until it has run again (its own mark file
        # shows new activity) the service stays stopped: the service's mark
        # file is over 3.5 s old when the module looks.
        consensus, service = processes
        resumed_ms = epoch_ms()
        consensus.send_signal(signal.SIGCONT)
        try:
            wait_for(
                lambda: (read_activity_timestamp(cluster.cluster_dir / "cluster-mark.dat") or 0) >= resumed_ms,
                10,
                "the consensus module to run after SIGCONT",
                poll_s=0.01,
            )
        finally:
            service.send_signal(signal.SIGCONT)
    assert client.request(b"after", timeout_s=10) == b"after"
    # A few heartbeat checks later the module is still there.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        assert cluster.consensus.alive, cluster.consensus.output()[-2000:]
        assert client.request(b"still", timeout_s=10) == b"still"

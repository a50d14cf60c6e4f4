"""Session egress publications are added asynchronously (Aeron's async add,
issue 18).  A thousand clients connecting at once: the consensus module's duty
cycle stays short (no driver round trip per session), no follower times out,
and every client gets its SessionEvent; a restart reconnects them all without
a stall either.  An egress the driver refuses drops that session alone.

The clients are one process: a raw SessionConnectRequest each on the ingress,
each with its own response stream (IPC on the leader's driver, so the test
does not load the machine with a thousand UDP streams).

The module's cycle time threshold is set to 500 ms, two and a half leader
heartbeat intervals (200 ms): a duty cycle that long misses heartbeats.  With
a driver round trip per session the module's cycles took 0.6-7 s here; with
the async add its cycles do 2-6 ms of work, and what remains in its max cycle
time is this 2-core machine's scheduling (with a dozen processes runnable, a
woken process can wait 100-300 ms for a CPU), which a threshold at the
heartbeat interval itself would count as the module's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.errors import CodecError
from support.cluster import FAST_ELECTION_ARGS, LocalCluster, SingleNodeCluster
from support.driver import wait_for
from support.multi_node import member_view, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

CLIENTS = 1000
RESPONSE_CHANNEL = "aeron:ipc?term-length=64k"
FIRST_RESPONSE_STREAM = 30_000
CYCLE_THRESHOLD = "500ms"
CYCLE_ARGS = ("--leader-heartbeat-interval", "200ms", "--cycle-threshold", CYCLE_THRESHOLD)
# A thousand sessions' publications and counters: the default cnc.dat sizes,
# but for the counters.  Across the restart the killed module's and service's
# egress publications linger (their clients are closed as soon as the driver
# sees their processes gone, and a closed publication keeps its counters for
# its linger time) while the new module adds a thousand new ones, each with its
# position counters and a subscriber position per response subscription: more
# than the 8,192 counters of 1 MiB.
BIG_CNC = {
    "to_driver_capacity": 1 << 20,
    "to_clients_capacity": 1 << 20,
    "counters_values_length": 4 << 20,
    "error_log_length": 256 * 1024,
}
BIG_CNC_ARGS = ("--to-driver-buffer", "1m", "--to-clients-buffer", "1m", "--counters-buffer", "1m")


class RawClients:
    """``count`` clients in this process: each a response subscription of its
    own and a SessionConnectRequest on one shared ingress publication."""

    def __init__(self, aeron: Aeron, ingress_channel: str, count: int) -> None:
        self.count = count
        self.subscriptions = [aeron.add_subscription(RESPONSE_CHANNEL, FIRST_RESPONSE_STREAM + i) for i in range(count)]
        self.ingress = aeron.add_publication(ingress_channel, protocol.INGRESS_STREAM_ID)
        self.events: list[list[Any]] = [[] for _ in range(count)]
        self._handlers = [self._handler(i) for i in range(count)]

    def _handler(self, index: int) -> Any:
        def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
            try:
                self.events[index].append(codecs.decode(buffer, offset, length))
            except CodecError as error:
                self.events[index].append(error)

        return on_fragment

    def send_connect_requests(self, timeout_s: float) -> None:
        wait_for(lambda: self.ingress.is_connected, timeout_s, "the ingress to connect")
        buffer = bytearray(512)
        deadline = time.monotonic() + timeout_s
        for index in range(self.count):
            length = codecs.SessionConnectRequestEncoder.encode(
                buffer,
                0,
                correlation_id=index + 1,
                response_stream_id=FIRST_RESPONSE_STREAM + index,
                version=protocol.PROTOCOL_SEMANTIC_VERSION,
                response_channel=RESPONSE_CHANNEL,
            )
            while self.ingress.offer(bytes(buffer[:length])) <= 0:
                assert time.monotonic() < deadline, f"ingress back pressured: {index} of {self.count} sent"
                time.sleep(0.0005)

    def poll(self) -> None:
        for subscription, handler in zip(self.subscriptions, self._handlers):
            subscription.poll(handler, 10)

    def wait_for_all(self, what: type, timeout_s: float) -> list[Any]:
        """Each client's first message of type ``what``, once every client has one."""

        def found() -> list[Any] | None:
            self.poll()
            firsts = [next((m for m in events if isinstance(m, what)), None) for events in self.events]
            return firsts if all(m is not None for m in firsts) else None

        try:
            # Polling a thousand subscriptions costs: not more often than needed.
            result: list[Any] = wait_for(found, timeout_s, f"{what.__name__} to every client", poll_s=0.05)
        except AssertionError:
            missing = sum(1 for events in self.events if not any(isinstance(m, what) for m in events))
            raise AssertionError(
                f"{missing} of {self.count} clients got no {what.__name__} in {timeout_s} s; "
                f"e.g. {[e for e in self.events if not any(isinstance(m, what) for m in e)][:3]}"
            ) from None
        return result


def module_counter(aeron: Aeron, type_id: int) -> int:
    """The consensus module's counter of ``type_id`` (the newest, should a dead module's linger)."""
    reader = aeron.counters_reader
    found = [c.counter_id for c in reader if c.type_id == type_id]
    assert found, f"no counter of type {type_id}"
    return max(found, key=reader.counter_registration_id)


def cycle_counters(aeron: Aeron) -> tuple[int, int]:
    """(max cycle time ns, cycles over the threshold) of the module on ``aeron``'s driver."""
    reader = aeron.counters_reader
    return (
        reader.counter_value(module_counter(aeron, protocol.CLUSTER_MAX_CYCLE_TIME_TYPE_ID)),
        reader.counter_value(module_counter(aeron, protocol.CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID)),
    )


def wait_for_active(aeron: Aeron) -> None:
    state = module_counter(aeron, protocol.CONSENSUS_MODULE_STATE_TYPE_ID)
    wait_for(lambda: aeron.counters_reader.counter_value(state) == 1, 30, "the module to be ACTIVE", poll_s=0.001)


def assert_all_opened(events: list[Any]) -> None:
    codes = [event.code for event in events]
    assert codes == [codecs.EventCode.OK] * len(events), {code for code in codes}
    assert [event.correlation_id for event in events] == list(range(1, len(events) + 1))
    assert len({event.cluster_session_id for event in events}) == len(events)


@pytest.fixture
def single_node() -> Iterator[SingleNodeCluster]:
    # Sessions outlive the test's restart (its clients send no keepalives).
    cluster = SingleNodeCluster(
        "fulmar.service.samples:EchoService",
        extra_consensus_args=(*CYCLE_ARGS, "--session-timeout", "60s"),
        driver_options={"layout": BIG_CNC},
    )
    try:
        yield cluster.start()
    finally:
        cluster.close()


def test_a_thousand_clients_connect_at_once_to_one_node(single_node: SingleNodeCluster) -> None:
    aeron = single_node.connect()
    wait_for_active(aeron)
    clients = RawClients(aeron, single_node.ingress_channel, CLIENTS)
    _, exceeded_before = cycle_counters(aeron)
    clients.send_connect_requests(10)
    assert_all_opened(clients.wait_for_all(codecs.SessionEventDecoder, 30))
    max_cycle_ns, exceeded = cycle_counters(aeron)
    print(f"connect: max cycle {max_cycle_ns / 1e6:.1f} ms, exceeded {exceeded - exceeded_before}")
    assert exceeded == exceeded_before, (
        f"{exceeded - exceeded_before} duty cycles over {CYCLE_THRESHOLD} (max {max_cycle_ns / 1e6:.0f} ms)"
    )

    # A restart reconnects every session (known from the log) in one go: its
    # election's last cycle must not stall either.
    assert single_node.consensus is not None and single_node.service is not None
    single_node.consensus.kill()
    single_node.service.kill()
    single_node.start_consensus()  # (ready once its counters exist: the newest of their types)
    single_node.start_service()
    # The module reconnects the sessions as its election completes, in the
    # cycle that makes it ACTIVE; that cycle is measured at the start of the next.
    wait_for_active(aeron)
    _, exceeded_before = cycle_counters(aeron)
    new_leader_events = clients.wait_for_all(codecs.NewLeaderEventDecoder, 30)
    assert {event.cluster_session_id for event in new_leader_events} == {
        event.cluster_session_id for event in clients.wait_for_all(codecs.SessionEventDecoder, 1)
    }
    max_cycle_ns, exceeded = cycle_counters(aeron)
    print(f"restart: max cycle {max_cycle_ns / 1e6:.1f} ms, exceeded {exceeded - exceeded_before}")
    assert exceeded == exceeded_before, (
        f"{exceeded - exceeded_before} duty cycles over {CYCLE_THRESHOLD} (max {max_cycle_ns / 1e6:.0f} ms)"
    )


def test_a_thousand_clients_connect_at_once_to_a_three_member_leader() -> None:
    with LocalCluster(
        3, extra_consensus_args=[*FAST_ELECTION_ARGS, *CYCLE_ARGS], extra_driver_args=BIG_CNC_ARGS
    ) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 30)
        aeron = cluster.connect(leader.member)
        clients = RawClients(aeron, cluster.ingress_channel(leader.member), CLIENTS)
        _, exceeded_before = cycle_counters(aeron)
        clients.send_connect_requests(10)
        assert_all_opened(clients.wait_for_all(codecs.SessionEventDecoder, 30))
        max_cycle_ns, exceeded = cycle_counters(aeron)
        print(f"leader: max cycle {max_cycle_ns / 1e6:.1f} ms, exceeded {exceeded - exceeded_before}")
        assert exceeded == exceeded_before, (
            f"{exceeded - exceeded_before} duty cycles over {CYCLE_THRESHOLD} (max {max_cycle_ns / 1e6:.0f} ms)"
        )
        # No follower timed out: the same leader in the same term on every member.
        views = [member_view(cluster, member) for member in range(cluster.size)]
        assert [(v.role == 2, v.leadership_term_id) for v in views] == [
            (v.member == leader.member, leader.leadership_term_id) for v in views
        ], views
        consensus_log = cluster.log_path(leader.member, "consensus").read_text()
        assert consensus_log.count("election:") == 0, consensus_log[-2000:]


def test_a_response_channel_the_driver_refuses_drops_that_session_alone(single_node: SingleNodeCluster) -> None:
    aeron = single_node.connect()
    wait_for_active(aeron)
    reader = aeron.counters_reader
    errors = module_counter(aeron, protocol.CLUSTER_ERROR_COUNT_TYPE_ID)
    invalid = module_counter(aeron, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID)
    errors_before, invalid_before = reader.counter_value(errors), reader.counter_value(invalid)
    ingress = aeron.add_publication(single_node.ingress_channel, protocol.INGRESS_STREAM_ID)
    wait_for(lambda: ingress.is_connected, 10, "the ingress to connect")
    buffer = bytearray(512)
    length = codecs.SessionConnectRequestEncoder.encode(
        buffer,
        0,
        correlation_id=1,
        response_stream_id=FIRST_RESPONSE_STREAM,
        version=protocol.PROTOCOL_SEMANTIC_VERSION,
        response_channel="aeron:ipc?term-length=3000",
    )
    wait_for(lambda: ingress.offer(bytes(buffer[:length])) > 0, 10, "the connect request to be sent")
    wait_for(lambda: reader.counter_value(invalid) == invalid_before + 1, 10, "the request to be dropped")
    assert reader.counter_value(errors) == errors_before + 1  # the driver's refusal, recorded once
    clients = RawClients(aeron, single_node.ingress_channel, 3)  # the module goes on serving
    clients.send_connect_requests(10)
    assert_all_opened(clients.wait_for_all(codecs.SessionEventDecoder, 20))

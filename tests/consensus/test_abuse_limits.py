"""Limits under abuse, against a real one-member cluster: the concurrent
session limit (sessions that never finish connecting included), the max
message length (from an honest client, and from a hostile ingress publisher
sending fragments of a message without end), and ingress fairness between a
greedy and a polite session."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import FORK

from fulmar.aeron import Aeron
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.client import SESSION_HEADER_LENGTH, ClusterClient, ClusterConnectError
from fulmar.errors import MessageTooLongError
from fulmar.frames import BEGIN_FLAG, END_FLAG, FRAME_ALIGNMENT, HEADER_LENGTH
from fulmar.log_writer import BufferClaim
from fulmar.publication import Publication
from support.cluster import SingleNodeCluster
from support.driver import free_udp_port, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

ECHO = "fulmar.service.samples:EchoService"
SECRET = b"s3cret"
KEEPALIVE_NS = 200_000_000  # well inside the short session timeouts used here


@pytest.fixture
def node_with() -> Iterator[Any]:
    clusters: list[SingleNodeCluster] = []

    def start(*consensus_args: str) -> SingleNodeCluster:
        cluster = SingleNodeCluster(ECHO, extra_consensus_args=consensus_args)
        clusters.append(cluster)  # before start: closed whatever happens
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.close()


def connect(cluster: SingleNodeCluster, aeron: Aeron | None = None, **options: Any) -> ClusterClient:
    options.setdefault("message_timeout_ns", 10_000_000_000)
    options.setdefault("keepalive_interval_ns", KEEPALIVE_NS)
    channel = options.pop("ingress_channel", cluster.ingress_channel)
    return ClusterClient.connect(
        aeron or cluster.connect(), channel, egress_channel="aeron:udp?endpoint=127.0.0.1:0", **options
    )


def counter(aeron: Aeron, type_id: int) -> int:
    """The value of the node's counter of ``type_id`` (one per node)."""
    reader = aeron.counters_reader
    ids = [c.counter_id for c in reader if c.type_id == type_id]
    assert len(ids) == 1, f"{len(ids)} counters of type {type_id}"
    return reader.counter_value(ids[0])


def log_frame_length(payload_length: int) -> int:
    """How far one client message of ``payload_length`` moves the log."""
    length = HEADER_LENGTH + SESSION_HEADER_LENGTH + payload_length
    return (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT


def raw_connect_request(
    publication: Publication, correlation_id: int, response_channel: str, credentials: bytes = b""
) -> None:
    """A SessionConnectRequest offered by hand, as a hostile client would."""
    message = bytearray(512)
    length = codecs.SessionConnectRequestEncoder.encode(
        message,
        0,
        correlation_id=correlation_id,
        response_stream_id=protocol.EGRESS_STREAM_ID,
        version=protocol.PROTOCOL_SEMANTIC_VERSION,
        response_channel=response_channel,
        encoded_credentials=credentials,
    )
    wait_for(lambda: publication.offer(bytes(message[:length])) > 0, 10, "the connect request to be offered")


def ingress_publication(aeron: Aeron, cluster: SingleNodeCluster, params: str = "") -> Publication:
    publication = aeron.add_publication(cluster.ingress_channel + params, protocol.INGRESS_STREAM_ID)
    wait_for(lambda: publication.is_connected, 10, "the raw ingress publication to connect")
    return publication


def connect_when_a_slot_frees(
    cluster: SingleNodeCluster, aeron: Aeron, timeout_s: float, **options: Any
) -> ClusterClient:
    """Connect, retrying while the cluster answers that its session limit is reached."""
    opened: list[ClusterClient] = []

    def attempt() -> bool:
        try:
            opened.append(connect(cluster, aeron, **options))
        except ClusterConnectError as error:
            assert "concurrent session limit" in str(error), error
            return False
        return True

    wait_for(attempt, timeout_s, "a session slot to free", poll_s=0.1)
    return opened[0]


# ------------------------------------------------------------------ sessions


def test_a_session_over_the_limit_is_rejected_until_one_closes(node_with: Any) -> None:
    cluster = node_with("--max-concurrent-sessions", "2")
    aeron = cluster.connect()
    first, second = connect(cluster, aeron), connect(cluster, aeron)
    assert first.request(b"one", 10) == b"one" and second.request(b"two", 10) == b"two"
    assert counter(aeron, protocol.CLUSTER_SESSIONS_TYPE_ID) == 2
    log_before = counter(aeron, protocol.COMMIT_POSITION_TYPE_ID)

    with pytest.raises(
        ClusterConnectError, match="the cluster refused the session: concurrent session limit 2 reached"
    ):
        connect(cluster, aeron)

    # The open sessions carry on, and the rejected one appended nothing: the
    # log grew by exactly their two messages (no SessionOpenEvent).
    assert first.request(b"three", 10) == b"three"
    assert second.request(b"four!", 10) == b"four!"
    expected = log_before + 2 * log_frame_length(5)
    wait_for(lambda: counter(aeron, protocol.COMMIT_POSITION_TYPE_ID) >= expected, 10, "the two messages to commit")
    assert counter(aeron, protocol.COMMIT_POSITION_TYPE_ID) == expected
    assert counter(aeron, protocol.CLUSTER_SESSIONS_TYPE_ID) == 2

    first.close()
    wait_for(lambda: counter(aeron, protocol.CLUSTER_SESSIONS_TYPE_ID) == 1, 10, "the closed session to go")
    third = connect(cluster, aeron)
    assert third.request(b"five", 10) == b"five"
    assert second.request(b"six", 10) == b"six"
    third.close()
    second.close()


def test_connect_requests_that_never_connect_hold_a_slot_only_until_they_time_out(node_with: Any) -> None:
    """A flood of SessionConnectRequests, fresh correlation ids, whose egress
    goes nowhere: the first ones are pending (and count against the limit)
    until the session timeout, the rest are rejected; then slots free up."""
    cluster = node_with("--max-concurrent-sessions", "2", "--session-timeout", "2s")
    aeron = cluster.connect()
    hostile = ingress_publication(aeron, cluster)
    nowhere = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"  # nobody subscribes there
    flood_started = time.monotonic()
    invalid_before = counter(aeron, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID)
    for correlation_id in range(1, 201):
        raw_connect_request(hostile, 1_000_000 + correlation_id, nowhere)
    # The module reads each publication in order, but different ones in any
    # order: a junk message after the flood tells when the flood was read.
    wait_for(lambda: hostile.offer(b"not a request") > 0, 10, "the junk message to be offered")
    wait_for(
        lambda: counter(aeron, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID) > invalid_before,
        10,
        "the module to read the flood",
    )

    with pytest.raises(ClusterConnectError, match="concurrent session limit 2 reached"):
        connect(cluster, aeron)
    client = connect_when_a_slot_frees(cluster, aeron, 20)
    assert time.monotonic() - flood_started > 1.5, "a pending session's slot freed before its timeout"
    assert client.request(b"in at last", 10) == b"in at last"
    # Only the honest session was ever opened.
    assert counter(aeron, protocol.CLUSTER_SESSIONS_TYPE_ID) == 1
    assert cluster.consensus is not None and cluster.consensus.alive
    client.close()


def test_a_challenge_never_answered_holds_its_slot_only_until_the_timeout(node_with: Any) -> None:
    cluster = node_with(
        "--max-concurrent-sessions", "1", "--session-timeout", "2s", "--authenticator-secret", SECRET.decode()
    )
    aeron = cluster.connect()
    # The hostile client listens on its egress (so it is challenged) but never answers.
    egress = aeron.add_subscription("aeron:udp?endpoint=127.0.0.1:0", protocol.EGRESS_STREAM_ID)
    response_channel = wait_for(lambda: _resolved_channel(egress), 10, "the egress port")
    hostile = ingress_publication(aeron, cluster)
    challenged_at = time.monotonic()
    raw_connect_request(hostile, 4242, response_channel)
    challenges: list[Any] = []

    def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
        message = codecs.decode(buffer, offset, length)
        if isinstance(message, codecs.ChallengeDecoder) and message.correlation_id == 4242:
            challenges.append(message.cluster_session_id)

    wait_for(lambda: egress.poll(on_fragment, 10) >= 0 and challenges, 10, "the challenge")

    with pytest.raises(ClusterConnectError, match="concurrent session limit 1 reached"):
        connect(cluster, aeron, credentials=SECRET)
    client = connect_when_a_slot_frees(cluster, aeron, 20, credentials=SECRET)
    assert time.monotonic() - challenged_at > 1.5, "the challenged session's slot freed before its timeout"
    assert client.request(b"authenticated", 10) == b"authenticated"
    client.close()
    egress.close()


def _resolved_channel(subscription: Any) -> str | None:
    """The subscription's channel with the port the driver bound (for a port-0 endpoint)."""
    endpoint = subscription.resolved_endpoint
    return f"aeron:udp?endpoint={endpoint}" if endpoint else None


# ----------------------------------------------------------- message length


def test_a_message_longer_than_the_ingress_max_is_refused_by_the_client(node_with: Any) -> None:
    cluster = node_with()
    client = connect(cluster, ingress_channel=cluster.ingress_channel + "|term-length=64k")
    longest = client.publication.max_message_length - SESSION_HEADER_LENGTH
    assert longest == 64 * 1024 // 8 - SESSION_HEADER_LENGTH
    started = time.monotonic()
    with pytest.raises(MessageTooLongError, match=f"exceeds the max message length {64 * 1024 // 8}"):
        client.offer(b"x" * (longest + 1))
    with pytest.raises(MessageTooLongError):
        client.request(b"x" * (longest + 1), 10)
    assert time.monotonic() - started < 1, "the client waited before refusing"
    assert client.request(b"y" * longest, 10) == b"y" * longest  # the longest does go through
    client.close()


class RssSampler:
    """Samples a process's RSS in the background; ``peak`` is the largest seen."""

    def __init__(self, pid: int, interval_s: float = 0.01) -> None:
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.NoSuchProcess:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.peak


def offer_fragment(publication: Publication, claim: BufferClaim, payload: bytes, flags: int) -> None:
    """One frame with the given fragment flags, as a hostile publisher writes it."""

    def claimed() -> bool:
        return publication.try_claim(len(payload), claim) > 0

    wait_for(claimed, 30, "room in the hostile publication")
    claim.buffer[: len(payload)] = payload
    publication.log.view[claim._claim.frame_offset + 5] = flags  # the frame header's flags byte
    claim.commit()


def test_a_message_without_end_is_dropped_at_the_max_length_and_memory_stays_bounded(node_with: Any) -> None:
    """A hostile publisher on the ingress stream sends a BEGIN fragment and
    then 64 MiB of middle fragments (term length 1m: max message 128 KiB),
    then an END.  The module drops the message once it passes 128 KiB, its
    RSS stays flat, and it serves an honest client all along."""
    cluster = node_with()
    assert cluster.consensus is not None
    aeron = cluster.connect()
    honest = connect(cluster, aeron)
    assert honest.request(b"before", 10) == b"before"
    hostile = ingress_publication(aeron, cluster, "|term-length=1m|mtu=8k")
    claim = BufferClaim(hostile.log)
    fragment = b"\x00" * hostile.max_payload_length
    invalid_before = counter(aeron, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID)
    errors_before = counter(aeron, protocol.CLUSTER_ERROR_COUNT_TYPE_ID)
    total = 64 << 20

    sampler = RssSampler(cluster.consensus.process.pid)
    baseline = sampler.peak
    offer_fragment(hostile, claim, fragment, BEGIN_FLAG)
    sent = len(fragment)
    replies = 0
    while sent < total:
        offer_fragment(hostile, claim, fragment, 0)
        sent += len(fragment)
        if sent % (4 << 20) < len(fragment):  # every 4 MiB: the honest client is still served
            assert honest.request(b"during %d" % replies, 10) == b"during %d" % replies
            replies += 1
    offer_fragment(hostile, claim, fragment, END_FLAG)
    # An unfragmented message that is no request: once it is counted, all before it was read.
    offer_fragment(hostile, claim, b"not a request", BEGIN_FLAG | END_FLAG)
    wait_for(
        lambda: counter(aeron, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID) >= invalid_before + 2,
        60,
        "the module to read the hostile stream",
    )
    peak = sampler.stop()

    assert peak - baseline < 24 << 20, f"RSS grew by {(peak - baseline) >> 20} MiB while {total >> 20} MiB came in"
    assert counter(aeron, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID) == invalid_before + 2  # one drop, one junk
    assert counter(aeron, protocol.CLUSTER_ERROR_COUNT_TYPE_ID) == errors_before + 1
    assert cluster.consensus.alive
    assert honest.request(b"after", 10) == b"after"
    # A well-formed message from the same publisher afterwards is not mistaken
    # for the rest of the dropped one: it is read (and refused: no session).
    offer_fragment(hostile, claim, b"\x01" * 100, BEGIN_FLAG)
    offer_fragment(hostile, claim, b"\x02" * 100, END_FLAG)
    wait_for(
        lambda: counter(aeron, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID) >= invalid_before + 3,
        10,
        "the next message to be read",
    )
    assert counter(aeron, protocol.CLUSTER_ERROR_COUNT_TYPE_ID) == errors_before + 1  # not a drop
    honest.close()


# ---------------------------------------------------------------- fairness


def _greedy_session(driver_dir: str, ingress_channel: str, replies: Any, stop: Any, ready: Any) -> None:
    """A session that keeps 1000 messages in flight for as long as it may."""
    aeron = Aeron.connect(Path(driver_dir))
    count = 0

    def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
        nonlocal count
        count += 1

    client = ClusterClient.connect(
        aeron,
        ingress_channel,
        egress_channel="aeron:udp?endpoint=127.0.0.1:0",
        message_timeout_ns=10_000_000_000,
        keepalive_interval_ns=KEEPALIVE_NS,
        on_message=on_message,
    )
    ready.set()
    sent = 0
    payload = b"g" * 100
    while not stop.is_set():
        while sent - count < 1000 and client.offer(payload) > 0:
            sent += 1
        client.poll_egress(256)
        replies.value = count
    client.close()
    aeron.close()


def test_a_polite_session_is_served_while_a_greedy_one_floods(node_with: Any, child_processes: list[Any]) -> None:
    cluster = node_with()
    replies = FORK.Value("q", 0)
    stop, ready = FORK.Event(), FORK.Event()
    # Forked before this process opens any client of its own.
    greedy = FORK.Process(
        target=_greedy_session, args=(str(cluster.driver_dir), cluster.ingress_channel, replies, stop, ready)
    )
    child_processes.append(greedy)
    greedy.start()
    wait_for(ready.is_set, 20, "the greedy session to connect")
    wait_for(lambda: replies.value > 2000, 30, "the greedy session to get going")

    polite = connect(cluster)
    latencies = []
    deadline = time.monotonic() + 60
    greedy_before = replies.value
    for index in range(50):
        started = time.monotonic()
        assert polite.request(b"polite %d" % index, 10) == b"polite %d" % index
        latencies.append(time.monotonic() - started)
        assert time.monotonic() < deadline, f"only {index + 1} polite requests in 60 s"
    greedy_during = replies.value - greedy_before
    stop.set()
    greedy.join(20)
    assert greedy.exitcode == 0
    assert max(latencies) < 2.0, f"slowest polite request {max(latencies):.3f} s (all: {latencies})"
    assert greedy_during > 1000, f"the greedy session got only {greedy_during} replies meanwhile"
    polite.close()

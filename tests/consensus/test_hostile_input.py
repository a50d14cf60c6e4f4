"""Hostile input against a running 3-member cluster (issue 9, "Fuzzing and
bad input"): garbage, truncated, oversized and well-formed-but-hostile UDP
datagrams sent to every UDP port each member's media driver has bound (found
with psutil, so the senders' control sockets, where NAKs and status messages
go, are hit as well as the configured endpoints); garbage records written into
each driver's to-driver ring buffer with the writer a client uses; and garbage
offered on the ingress and consensus streams through a real publication.

Each test checks that the node keeps serving (an echo client gets answers
before, during and after; no process of any member exits; every member's
commit position advances; the members' logs stay identical) and that what was
dropped was counted or logged where an operator looks: the driver's system
counters (``Invalid packets``, flow control over/under-runs), the driver's
distinct error log, and the consensus module's counters and mark file errors.

One cluster serves the whole module (starting one costs seconds on a two-core
machine); every test leaves it healthy, which is what each test asserts.
"""

from __future__ import annotations

import functools
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from fulmar.aeron import Aeron
from fulmar.cli import archive_tool, cluster_commands
from fulmar.cli.cnc_reader import read_errors
from fulmar.cnc import CncFile
from fulmar.codecs.generated import archive as archive_codecs
from fulmar.codecs.generated import cluster as cluster_codecs
from fulmar.codecs.generated import driver as driver_codecs
from fulmar.consensus import protocol as cluster_protocol
from fulmar.consensus.client import ClusterClient
from fulmar.counters import CountersReader
from fulmar.driver.counters import (
    LOCAL_SOCKADDR_TYPE_ID,
    RECEIVER_HWM_TYPE_ID,
    SENDER_POSITION_TYPE_ID,
    SystemCounter,
)
from fulmar.errors import FulmarError
from fulmar.logbuffer import LogBuffers
from fulmar.ring_buffer import ManyToOneRingBuffer
from support.cluster import LocalCluster
from support.driver import wait_for
from support.multi_node import assert_same_logs, member_view, wait_for_elections_closed, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

ECHO_SERVICE = "fulmar.service.samples:EchoService"
LOG_STREAM_ID = 100
INGRESS_STREAM_ID = 101
CONSENSUS_STREAM_ID = 108
ARCHIVE_CONTROL_STREAM_ID = 10

# UDP frame layouts (PROTOCOL.md section 2).
_HEADER = struct.Struct("<iBBh")  # frame length, version, flags, type
_DATA = struct.Struct("<iBBhiiiiq")  # + term offset, session id, stream id, term id, reserved value
_SETUP = struct.Struct(
    "<iBBhiiiiiiii"
)  # + term offset, session, stream, initial term, active term, term length, mtu, ttl
_SM = struct.Struct("<iBBhiiiiiq")  # + session, stream, consumption term id, term offset, receiver window, receiver id
_NAK = struct.Struct("<iBBhiiiii")  # + session, stream, term id, term offset, length
_RTTM = struct.Struct("<iBBhiiqqq")  # + session, stream, echo timestamp, reception delta, receiver id
DATA, NAK, SM, SETUP, RTTM = 0x01, 0x02, 0x03, 0x05, 0x06
UNFRAGMENTED = 0xC0
_REGISTRATION_KEY = struct.Struct("<qii")  # a driver counter's key: registration id, session id, stream id


# ----------------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, ECHO_SERVICE) as local:
        local.start()
        wait_for_leader(local, 30)
        wait_for_elections_closed(local, 30)  # every member's ingress is open
        yield local


def process_ids(cluster: LocalCluster) -> dict[tuple[int, str], int]:
    return {
        (member, kind): process.process.pid
        for member in range(cluster.size)
        for kind, process in cluster.processes[member].items()
    }


@dataclass
class EchoWorkload:
    """One client asking the echo service, one request at a time; each answer
    must be the request.  A failed request is recorded, not retried."""

    cluster: LocalCluster
    answer_times: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="echo-workload", daemon=True)
        self.client: ClusterClient = self.cluster.connect_client()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            request = f"echo {number}".encode()
            try:
                answer = self.client.request(request, timeout_s=10)
            except FulmarError as error:
                self.failures.append(f"request {number}: {type(error).__name__}: {error}")
                return
            if answer != request:
                self.failures.append(f"request {number} answered with {answer!r}")
                return
            self.answer_times.append(time.monotonic())

    def answers_since(self, moment: float) -> int:
        return sum(1 for t in self.answer_times if t >= moment)

    def wait_for_answers(self, count: int, since: float, timeout_s: float) -> None:
        wait_for(lambda: self.failures or self.answers_since(since) >= count, timeout_s, f"{count} echo answers")
        assert not self.failures, self.failures

    def start(self) -> EchoWorkload:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the echo workload did not stop"
        self.client.close()
        self.cluster.clients.remove(self.client)


@contextmanager
def keeps_serving(cluster: LocalCluster) -> Iterator[EchoWorkload]:
    """Around the hostile input: a client gets answers before, during and
    after it; no process of any member exits (nor is replaced); every member's
    commit position goes beyond where the leader's was before; the logs stay
    identical across the members."""
    pids = process_ids(cluster)
    leader = wait_for_leader(cluster, 10)
    commit_before = member_view(cluster, leader.member).commit_position or 0
    workload = EchoWorkload(cluster).start()
    try:
        workload.wait_for_answers(5, 0.0, 30)  # before
        started = time.monotonic()
        yield workload
        ended = time.monotonic()
        assert not workload.failures, workload.failures
        during = sum(1 for t in workload.answer_times if started <= t <= ended)
        assert during > 0, f"no echo answer during the {ended - started:.1f} s of hostile input"
        workload.wait_for_answers(20, ended, 30)  # after
    finally:
        workload.stop()
    assert process_ids(cluster) == pids
    dead = [key for key in pids if not cluster.is_running(*key)]
    assert not dead, f"processes exited: {dead}"
    assert wait_for_leader(cluster, 10).member == leader.member, "the hostile input caused an election"

    def all_committed_past() -> bool:
        return all((member_view(cluster, m).commit_position or 0) > commit_before for m in range(cluster.size))

    wait_for(all_committed_past, 30, f"every member to commit past {commit_before}")
    position = min(member_view(cluster, m).commit_position or 0 for m in range(cluster.size))
    assert_same_logs(cluster, list(range(cluster.size)), position)


# ----------------------------------------------------------------------------- what the drivers show


@dataclass(frozen=True)
class Stream:
    """One network publication (sender side) or image (receiver side) of a driver."""

    registration_id: int
    session_id: int
    stream_id: int
    channel: str


def counters_reader(cnc: CncFile) -> CountersReader:
    return CountersReader(cnc.counters_metadata, cnc.counters_values)


def system_counter(directory: Path, counter: SystemCounter) -> int:
    with CncFile.open(directory) as cnc:
        return counters_reader(cnc).counter_value(int(counter))


def counter_values(directory: Path, type_id: int) -> list[int]:
    """The values of every counter of ``type_id`` in the driver's cnc.dat."""
    with CncFile.open(directory) as cnc:
        reader = counters_reader(cnc)
        return [reader.counter_value(c.counter_id) for c in reader if c.type_id == type_id]


def driver_streams(directory: Path, type_id: int) -> list[Stream]:
    """The driver's network publications (SENDER_POSITION_TYPE_ID) or images
    (RECEIVER_HWM_TYPE_ID), from their counters' keys and labels."""
    with CncFile.open(directory) as cnc:
        found = []
        for counter in counters_reader(cnc):
            if counter.type_id == type_id:
                registration_id, session_id, stream_id = _REGISTRATION_KEY.unpack_from(counter.key, 0)
                found.append(Stream(registration_id, session_id, stream_id, counter.label.split()[-1]))
        return found


def driver_errors(directory: Path) -> list[str]:
    with CncFile.open(directory) as cnc:
        return [error["text"] for error in read_errors(cnc)]


def driver_udp_ports(cluster: LocalCluster, member: int) -> list[int]:
    """Every UDP port the member's driver has bound on loopback: configured
    endpoints and the ephemeral ports of its send channels' sockets."""
    process = cluster.process(member, "driver")
    assert process is not None
    connections = psutil.Process(process.process.pid).net_connections(kind="udp")
    ports = sorted({c.laddr.port for c in connections if c.laddr and c.laddr.ip in ("127.0.0.1", "0.0.0.0")})
    assert ports, f"member {member}'s driver has no UDP socket"
    return ports


def always_bound_ports(cluster: LocalCluster, member: int) -> set[int]:
    """The configured endpoints every member binds whatever its role (a
    follower binds its log endpoint, and any member its catchup endpoint,
    only while it receives the log there)."""
    ports = cluster.ports[member]
    return {ports.ingress, ports.consensus, ports.archive}


# ----------------------------------------------------------------------------- hostile datagrams


def invalid_datagrams(rnd: random.Random) -> list[tuple[str, bytes]]:
    """Datagrams no endpoint of a driver may accept, whatever it receives on:
    each must be counted as an invalid packet."""

    def header(frame_length: int, frame_type: int, flags: int = 0, version: int = 0) -> bytes:
        return _HEADER.pack(frame_length, version, flags, frame_type)

    return [
        ("empty", b""),
        ("one byte", b"\x01"),
        ("seven random bytes", rnd.randbytes(7)),
        ("unknown version", header(64, DATA, version=7) + rnd.randbytes(56)),
        ("unknown frame type", header(8, 0x7FFF)),
        ("garbage of an unknown type", header(1000, 0x0F0F) + rnd.randbytes(992)),
        ("oversized garbage", header(65_000, 0x0F0F) + rnd.randbytes(64_992)),
        ("truncated DATA", header(32, DATA, UNFRAGMENTED) + rnd.randbytes(12)),
        ("truncated SETUP", header(40, SETUP) + rnd.randbytes(22)),
        ("truncated SM", header(36, SM) + rnd.randbytes(12)),
        ("truncated NAK", header(28, NAK) + rnd.randbytes(12)),
        ("truncated RTTM", header(40, RTTM) + rnd.randbytes(20)),
        (
            "SETUP whose length lies (past the end)",
            _SETUP.pack(4096, 0, 0, SETUP, 0, 77, LOG_STREAM_ID, 0, 0, 65536, 1408, 0),
        ),
        ("SETUP whose length lies (short)", _SETUP.pack(12, 0, 0, SETUP, 0, 77, LOG_STREAM_ID, 0, 0, 65536, 1408, 0)),
        (
            "SETUP with a negative term length",
            _SETUP.pack(40, 0, 0, SETUP, 0, 78, LOG_STREAM_ID, 0, 0, -65536, 1408, 0),
        ),
        ("SM whose length lies", _SM.pack(1 << 20, 0, 0, SM, 5, LOG_STREAM_ID, 0, 0, 1 << 20, 9)),
        ("NAK with a negative length", _NAK.pack(28, 0, 0, NAK, 5, LOG_STREAM_ID, 0, 0, -1)),
        ("NAK whose length lies", _NAK.pack(2**31 - 1, 0, 0, NAK, 5, LOG_STREAM_ID, 0, 0, 1408)),
        ("RTTM whose length lies", _RTTM.pack(-40, 0, 0, RTTM, 5, LOG_STREAM_ID, 1, 2, 3)),
        ("DATA of a stream nobody subscribes", _DATA.pack(64, 0, UNFRAGMENTED, DATA, 0, 5, 4242, 0, 0) + bytes(32)),
        ("SETUP of a stream nobody subscribes", _SETUP.pack(40, 0, 0, SETUP, 0, 5, 4242, 0, 0, 65536, 1408, 0)),
        ("SM of a publication that does not exist", _SM.pack(36, 0, 0, SM, 0x5EED, 4242, 0, 0, 1 << 16, 9)),
        ("NAK of a publication that does not exist", _NAK.pack(28, 0, 0, NAK, 0x5EED, 4242, 0, 0, 1408)),
    ]


def port_is_bound(cluster: LocalCluster, member: int, port: int) -> bool:
    return port in driver_udp_ports(cluster, member)


def send_each_counted(
    directory: Path,
    port: int,
    datagrams: list[tuple[str, bytes]],
    counter: SystemCounter = SystemCounter.INVALID_PACKETS,
    is_bound: Callable[[], bool] | None = None,
) -> bool:
    """Send the datagrams one at a time to ``port`` and wait for the driver to
    count each (one at a time: none is lost to a full socket buffer, and the
    one that was not counted is named).  With ``is_bound``, a port that the
    driver closes meanwhile (a short-lived publication's socket: a datagram
    to it is counted nowhere) ends the sending: False."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
        for name, datagram in datagrams:
            before = system_counter(directory, counter)
            attacker.sendto(datagram, ("127.0.0.1", port))
            outcome = wait_for(
                lambda: (
                    "counted"
                    if system_counter(directory, counter) > before
                    else "closed"
                    if is_bound is not None and not is_bound()
                    else None
                ),
                10,
                f"'{name}' sent to port {port} to be counted in {counter.name}",
            )
            if outcome == "closed":
                return False
    return True


def test_garbage_datagrams_on_every_bound_port_are_counted(cluster: LocalCluster) -> None:
    rnd = random.Random(9)
    datagrams = invalid_datagrams(rnd)
    with keeps_serving(cluster):
        for member in range(cluster.size):
            # psutil finds the configured endpoints and the send channels'
            # own sockets (one per consensus publication to another member).
            # A member binds its ingress as its election closes (a driver
            # round trip after its election state counter says CLOSED).
            wait_for(
                lambda member=member: always_bound_ports(cluster, member) <= set(driver_udp_ports(cluster, member)),
                10,
                f"member {member}'s driver to have bound its ingress, consensus and archive endpoints",
            )
            ports = driver_udp_ports(cluster, member)
            assert len(send_control_ports(cluster, member)) >= cluster.size - 1, (member, ports)
            directory = cluster.driver_dir(member)
            before = system_counter(directory, SystemCounter.INVALID_PACKETS)
            # A short-lived publication's socket may close while it is sent to
            # (an archive client's, a redirect's egress): it counts nothing after.
            closed = [
                port
                for port in ports
                if not send_each_counted(
                    directory,
                    port,
                    datagrams,
                    is_bound=functools.partial(port_is_bound, cluster, member, port),
                )
            ]
            assert not set(closed) & always_bound_ports(cluster, member), closed
            stayed = len(ports) - len(closed)
            assert system_counter(directory, SystemCounter.INVALID_PACKETS) >= before + stayed * len(datagrams)


def unfilled_position(directory: Path, image: Stream, initial_term_id: int, term_length: int) -> tuple[int, int]:
    """(term id, term offset) a quarter of a term past the image's receive
    high-water mark: inside the receiver window, and not yet filled by the
    real sender (a frame where the term is already filled is a duplicate and
    is skipped unread, as in Aeron, so a lie there would prove nothing)."""
    with CncFile.open(directory) as cnc:
        reader = counters_reader(cnc)
        hwm = reader.counter_value(reader.find_by_type_and_registration(RECEIVER_HWM_TYPE_ID, image.registration_id))
    position = (hwm + term_length // 4) & ~31
    return initial_term_id + position // term_length, position % term_length


def image_port(image: Stream) -> int | None:
    """The port of the endpoint named in an image's channel, if it names one."""
    for param in image.channel.partition("?")[2].split("|"):
        if param.startswith("endpoint="):
            return int(param.rpartition(":")[2])
    return None


def int32(value: int) -> int:
    """``value`` wrapped to a signed 32-bit integer, as term ids wrap."""
    return (value + 2**31) % 2**32 - 2**31


def _log_image_state(image: Stream, directory: Path) -> tuple[int, int]:
    """(initial term id, term length) of an image, from its log buffer's metadata."""
    log = LogBuffers.open(directory / "images" / f"{image.registration_id}.logbuffer")
    try:
        return log.initial_term_id, log.term_length
    finally:
        log.close()


def test_forged_frames_for_the_real_sessions_are_dropped_and_counted(cluster: LocalCluster) -> None:
    """DATA for the sessions each driver really receives, with term offsets
    outside the term and term ids far ahead and behind; NAK storms, bogus
    status messages and RTTMs for the sessions each driver really sends, to
    its send channels' control sockets."""
    with keeps_serving(cluster):
        leader = wait_for_leader(cluster, 10).member
        for member in range(cluster.size):
            directory = cluster.driver_dir(member)
            if member != leader:
                wait_for(
                    lambda: any(i.stream_id == LOG_STREAM_ID for i in driver_streams(directory, RECEIVER_HWM_TYPE_ID)),
                    10,
                    f"follower {member}'s log image",
                )
            images = driver_streams(directory, RECEIVER_HWM_TYPE_ID)
            publications = driver_streams(directory, SENDER_POSITION_TYPE_ID)
            assert images and publications, (member, images, publications)
            # The log and consensus images live as long as the leadership
            # term; a client's ingress image may be lingering after its
            # close, when DATA for its session rightly asks for a SETUP.
            for image in [i for i in images if i.stream_id in (LOG_STREAM_ID, CONSENSUS_STREAM_ID)]:
                initial_term_id, term_length = _log_image_state(image, directory)
                payload = bytes(range(32))

                def data(term_offset: int, term_id: int) -> bytes:
                    return (
                        _DATA.pack(
                            64, 0, UNFRAGMENTED, DATA, term_offset, image.session_id, image.stream_id, int32(term_id), 0
                        )
                        + payload
                    )

                # A follower's log image is on a multi-destination
                # subscription (no endpoint in its channel): its destination
                # is the member's log endpoint.
                target = image_port(image) or cluster.ports[member].log
                # Inside the receiver window, where the term is still empty:
                # frames whose length lies must be refused there, or the
                # member's log would take garbage.
                term_id, term_offset = unfilled_position(directory, image, initial_term_id, term_length)
                send_each_counted(
                    directory,
                    target,
                    [
                        (
                            "DATA whose length runs past the datagram",
                            _DATA.pack(
                                1 << 20,
                                0,
                                UNFRAGMENTED,
                                DATA,
                                term_offset,
                                image.session_id,
                                image.stream_id,
                                int32(term_id),
                                0,
                            )
                            + payload,
                        ),
                        (
                            "DATA with a negative length",
                            _DATA.pack(
                                -64,
                                0,
                                UNFRAGMENTED,
                                DATA,
                                term_offset,
                                image.session_id,
                                image.stream_id,
                                int32(term_id),
                                0,
                            )
                            + payload,
                        ),
                        (
                            "DATA shorter than its header",
                            _DATA.pack(
                                16,
                                0,
                                UNFRAGMENTED,
                                DATA,
                                term_offset,
                                image.session_id,
                                image.stream_id,
                                int32(term_id),
                                0,
                            )
                            + payload,
                        ),
                    ],
                )
                send_each_counted(
                    directory,
                    target,
                    [
                        (f"DATA at a negative term offset for {image}", data(-64, initial_term_id)),
                        ("DATA past the end of the term", data(term_length, initial_term_id)),
                        ("DATA at a huge term offset", data(2**31 - 64, initial_term_id)),
                    ],
                )
                send_each_counted(
                    directory,
                    target,
                    [
                        ("DATA a million terms ahead", data(0, initial_term_id + 1_000_000)),
                        ("DATA at the last term id", data(0, initial_term_id + 2**31 - 1)),
                    ],
                    SystemCounter.FLOW_CONTROL_OVER_RUNS,
                )
                send_each_counted(
                    directory,
                    target,
                    [
                        ("DATA before the initial term", data(0, initial_term_id - 5)),
                    ],
                    SystemCounter.FLOW_CONTROL_UNDER_RUNS,
                )
            send_ports = send_control_ports(cluster, member)
            # The consensus publications and the leader's log publication
            # live as long as the term (a catchup publication lingers after
            # its follower caught up, and may have no socket left).
            for publication in [
                p for p in publications if p.stream_id == CONSENSUS_STREAM_ID or "control-mode=manual" in p.channel
            ]:
                hit_own_socket = False
                for port in send_ports:
                    if probe_publication_socket(cluster, member, port, publication):
                        hit_own_socket = True
                        storm_publication_socket(directory, port, publication)
                assert hit_own_socket, f"no send socket of member {member} takes NAKs for {publication}"


def send_control_ports(cluster: LocalCluster, member: int) -> list[int]:
    """The ports of the member's send channel sockets (where NAKs, status
    messages and RTTMs for its publications arrive): every bound UDP port
    that is not a receive endpoint's (those have rcv-local-sockaddr counters)."""
    with CncFile.open(cluster.driver_dir(member)) as cnc:
        receive_ports = {
            int(c.label.rpartition(":")[2]) for c in counters_reader(cnc) if c.type_id == LOCAL_SOCKADDR_TYPE_ID
        }
    ports = [port for port in driver_udp_ports(cluster, member) if port not in receive_ports]
    assert ports, f"member {member}'s driver has no send socket"
    return ports


def send_all_counted(
    directory: Path, port: int, what: str, datagrams: list[bytes], expected: dict[SystemCounter, int]
) -> None:
    """Send the datagrams to ``port`` and wait until each counter went up by at least its expected amount."""
    before = {counter: system_counter(directory, counter) for counter in expected}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
        for datagram in datagrams:
            attacker.sendto(datagram, ("127.0.0.1", port))

    def counted() -> bool:
        return all(system_counter(directory, c) >= before[c] + n for c, n in expected.items())

    wait_for(counted, 10, f"{what} sent to port {port} to be counted: expected {expected} more than {before}")


def probe_publication_socket(cluster: LocalCluster, member: int, port: int, publication: Stream) -> bool:
    """Whether ``port`` is the socket of ``publication``'s send channel: a
    valid NAK for it is taken there and counted as invalid on any other.

    The ports were listed a moment before: a short-lived publication of the
    driver (an archive client's control requests, a redirect's egress) may
    close its socket before the probe lands, and a datagram to a closed port
    is counted nowhere.  Such a port is not the publication's; a port still
    bound must count the probe."""
    directory = cluster.driver_dir(member)
    nak = _NAK.pack(28, 0, 0, NAK, publication.session_id, publication.stream_id, 0, 0, 32)
    naks = system_counter(directory, SystemCounter.NAK_MESSAGES_RECEIVED)
    invalid = system_counter(directory, SystemCounter.INVALID_PACKETS)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
        attacker.sendto(nak, ("127.0.0.1", port))

    def counted() -> str | None:
        if system_counter(directory, SystemCounter.NAK_MESSAGES_RECEIVED) > naks:
            return "own"
        if system_counter(directory, SystemCounter.INVALID_PACKETS) > invalid:
            return "other"
        if port not in driver_udp_ports(cluster, member):
            return "closed"
        return None

    return bool(wait_for(counted, 10, f"the probe NAK for {publication} on port {port} to be counted") == "own")


def storm_publication_socket(directory: Path, port: int, publication: Stream) -> None:
    """A NAK storm, bogus status messages and RTTMs for a real publication,
    on its own send socket: each is counted where Aeron counts it, and what
    the sender cannot act on is counted as invalid."""
    session_id, stream_id = publication.session_id, publication.stream_id
    valid_naks = [
        _NAK.pack(28, 0, 0, NAK, session_id, stream_id, term_id, offset, length)
        for term_id in (0, 1, -1, 2**31 - 1, -(2**31))
        for offset, length in ((0, 1408), (4096, 1 << 20), (32, 2**31 - 1))
    ]
    send_all_counted(
        directory, port, "a storm of NAKs", valid_naks * 10, {SystemCounter.NAK_MESSAGES_RECEIVED: len(valid_naks) * 10}
    )
    naks_outside_the_term = [
        _NAK.pack(28, 0, 0, NAK, session_id, stream_id, term_id, offset, 64)
        for term_id in (0, 2**31 - 1)
        for offset in (1 << 30, 2**31 - 32)
    ]
    send_all_counted(
        directory,
        port,
        "NAKs outside the term",
        naks_outside_the_term * 5,
        {
            SystemCounter.NAK_MESSAGES_RECEIVED: len(naks_outside_the_term) * 5,
            SystemCounter.INVALID_PACKETS: len(naks_outside_the_term) * 5,
        },
    )
    bogus_sms = [
        _SM.pack(36, 0, flags, SM, session_id, stream_id, term_id, offset, window, receiver_id)
        for flags, term_id, offset, window, receiver_id in (
            (0, 2**31 - 1, 1 << 30, 2**31 - 1, 0x5EED),
            (0, -(2**31), 0, 1 << 16, 0x5EEE),
            (0x80, 0, 4096, 0, 0x5EEF),
        )
    ]  # SEND_SETUP
    send_all_counted(
        directory, port, "bogus status messages", bogus_sms, {SystemCounter.STATUS_MESSAGES_RECEIVED: len(bogus_sms)}
    )
    unsolicited_rttm_reply = _RTTM.pack(40, 0, 0x80, RTTM, session_id, stream_id, 2**63 - 1, -1, 7)
    send_all_counted(
        directory, port, "an unsolicited RTTM reply", [unsolicited_rttm_reply], {SystemCounter.INVALID_PACKETS: 1}
    )


# ----------------------------------------------------------------------------- forged SETUPs


def setup_frame(
    session_id: int,
    stream_id: int,
    *,
    initial_term_id: int = 1000,
    active_term_id: int = 1000,
    term_offset: int = 0,
    term_length: int = 65536,
    mtu: int = 1408,
) -> bytes:
    return _SETUP.pack(
        40, 0, 0, SETUP, term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu, 0
    )


def data_frames(session_id: int, stream_id: int, term_id: int, messages: list[bytes]) -> list[bytes]:
    """One unfragmented DATA frame per message, laid out from term offset 0 as a publisher would."""
    frames = []
    offset = 0
    for message in messages:
        length = 32 + len(message)
        frames.append(_DATA.pack(length, 0, UNFRAGMENTED, DATA, offset, session_id, stream_id, term_id, 0) + message)
        offset += (length + 31) & ~31
    return frames


def connect_as_sender(
    attacker: socket.socket, port: int, session_id: int, stream_id: int, what: str, timeout_s: float = 10
) -> None:
    """Open an image as an Aeron sender does: SETUP, again every 100 ms,
    until the receiver's first status message for the session answers.  The
    driver's image counters appear before its receiver takes data for the
    image (as in Aeron, where the conductor makes the image and then hands it
    to the receiver): DATA sent in between is not lost to a real sender,
    which is asked for a SETUP and NAKed, but this one never sends it again."""
    deadline = time.monotonic() + timeout_s
    setup = setup_frame(session_id, stream_id)
    attacker.sendto(setup, ("127.0.0.1", port))
    next_setup = time.monotonic() + 0.1
    while True:
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (no status message)")
        if now >= next_setup:
            attacker.sendto(setup, ("127.0.0.1", port))
            next_setup = now + 0.1
        attacker.settimeout(max(0.001, min(next_setup, deadline) - now))
        try:
            reply = attacker.recv(2048)
        except TimeoutError:
            continue
        if len(reply) >= _SM.size:
            _length, _version, flags, frame_type, sm_session, sm_stream = _SM.unpack_from(reply)[:6]
            # A status message asking for a SETUP (flag 0x80) comes before the image is made.
            if frame_type == SM and (sm_session, sm_stream) == (session_id, stream_id) and not flags & 0x80:
                return


def image_files(directory: Path) -> set[str]:
    images = directory / "images"
    return {p.name for p in images.iterdir()} if images.exists() else set()


def cluster_counter(cluster: LocalCluster, member: int, type_id: int) -> int:
    """A consensus module counter of the member (in its driver's cnc.dat)."""
    values = counter_values(cluster.driver_dir(member), type_id)
    assert len(values) == 1, f"member {member}: {len(values)} counters of type {type_id}"
    return values[0]


def module_errors(cluster: LocalCluster, member: int) -> list[str]:
    """The consensus module's distinct errors, as ``cluster-tool errors --dir <node dir>`` reads them."""
    node = cluster_commands.ClusterNode(f"node{member}", cluster.cluster_dir(member))
    document = cluster_commands.cluster_errors_node(node)
    return [
        error["text"]
        for file in document["files"]
        if file["component"] == "consensus module"
        for error in file["errors"]
    ]


def sbe(block_length: int, template_id: int, schema_id: int = cluster_codecs.SCHEMA_ID, version: int = 1) -> bytes:
    return struct.pack("<HHHH", block_length, template_id, schema_id, version)


def hostile_cluster_messages(rnd: random.Random) -> list[tuple[str, bytes]]:
    """Messages no consensus module may act on; each is rejected on the
    ingress and on the consensus stream alike."""
    return [
        ("four bytes", b"\x01\x02\x03\x04"),
        ("random bytes", rnd.randbytes(57)),
        ("archive schema", sbe(8, 52, schema_id=101) + bytes(36)),
        ("unknown schema", sbe(8, 1, schema_id=999) + bytes(8)),
        ("unknown template", sbe(16, 999) + bytes(16)),
        ("truncated CommitPosition", sbe(20, cluster_codecs.CommitPositionDecoder.TEMPLATE_ID) + bytes(6)),
        ("truncated NewLeadershipTerm", sbe(88, cluster_codecs.NewLeadershipTermDecoder.TEMPLATE_ID) + bytes(30)),
        ("block length past the end", sbe(60_000, cluster_codecs.AppendPositionDecoder.TEMPLATE_ID) + bytes(21)),
        (
            "truncated SessionConnectRequest",
            sbe(16, cluster_codecs.SessionConnectRequestEncoder.TEMPLATE_ID) + bytes(9),
        ),
        (
            "SessionConnectRequest whose channel length lies",
            sbe(16, cluster_codecs.SessionConnectRequestEncoder.TEMPLATE_ID)
            + struct.pack("<qii", 1, 102, 1)
            + struct.pack("<I", 100_000)
            + b"aeron:udp",
        ),
    ]


def test_forged_setups_get_no_image_where_no_subscription_takes_them(cluster: LocalCluster) -> None:
    """SETUPs from a stranger, with new session ids, for the cluster's
    streams on every bound port of every member: hostile parameters are
    counted and leave no log buffer behind; a stranger's session on a
    follower's log (subscribed for the leader's session only) gets no image;
    where a stranger's image is taken (the consensus stream takes any
    session, as in Aeron), its garbage is rejected and logged by the module."""
    rnd = random.Random(11)
    with keeps_serving(cluster):
        leader = wait_for_leader(cluster, 10).member
        for member in range(cluster.size):
            directory = cluster.driver_dir(member)
            ports = cluster.ports[member]
            files_before = image_files(directory)
            hostile_setups = [
                ("term length not a power of two", setup_frame(0xBAD1, CONSENSUS_STREAM_ID, term_length=100_000)),
                ("term length of 2 GiB - 1", setup_frame(0xBAD2, CONSENSUS_STREAM_ID, term_length=2**31 - 1)),
                ("MTU of zero", setup_frame(0xBAD3, CONSENSUS_STREAM_ID, mtu=0)),
                ("MTU above the term length", setup_frame(0xBAD4, CONSENSUS_STREAM_ID, mtu=1 << 20)),
                ("unaligned term offset", setup_frame(0xBAD5, CONSENSUS_STREAM_ID, term_offset=33)),
                ("term offset past the term", setup_frame(0xBAD6, CONSENSUS_STREAM_ID, term_offset=1 << 20)),
                (
                    "active term before the initial term",
                    setup_frame(0xBAD7, CONSENSUS_STREAM_ID, initial_term_id=5, active_term_id=4),
                ),
            ]
            send_each_counted(directory, ports.consensus, hostile_setups)
            if member != leader:
                send_each_counted(
                    directory,
                    ports.log,
                    [
                        ("a stranger's SETUP on the follower's log", setup_frame(0x5EED, LOG_STREAM_ID)),
                    ],
                )
            assert image_files(directory) == files_before, "a rejected SETUP left a log buffer behind"

            # A stranger's image on the consensus stream: its garbage is
            # counted and logged by the consensus module.
            stranger = 0x5EED00 + member
            errors_before = cluster_counter(cluster, member, cluster_protocol.CLUSTER_ERROR_COUNT_TYPE_ID)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
                connect_as_sender(
                    attacker,
                    ports.consensus,
                    stranger,
                    CONSENSUS_STREAM_ID,
                    f"member {member}'s driver to take the stranger's consensus image",
                )
                messages = hostile_cluster_messages(rnd)
                for frame in data_frames(stranger, CONSENSUS_STREAM_ID, 1000, [m for _, m in messages]):
                    attacker.sendto(frame, ("127.0.0.1", ports.consensus))
            wait_for(
                lambda: (
                    cluster_counter(cluster, member, cluster_protocol.CLUSTER_ERROR_COUNT_TYPE_ID)
                    >= errors_before + len(messages)
                ),
                10,
                f"member {member}'s consensus module to count {len(messages)} garbage consensus messages",
            )
            texts = module_errors(cluster, member)
            assert any("consensus stream: unknown consensus template id 999" in t for t in texts), texts
            assert any("consensus stream: consensus fragment of schema 101" in t for t in texts), texts

            # A stranger's images on the ingress and the archive control
            # channel (both take any session): garbage counted and logged.
            invalid_before = cluster_counter(cluster, member, cluster_protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
                for port, stream_id in ((ports.ingress, INGRESS_STREAM_ID), (ports.archive, ARCHIVE_CONTROL_STREAM_ID)):
                    connect_as_sender(
                        attacker,
                        port,
                        stranger,
                        stream_id,
                        f"member {member}'s driver to take the stranger's image of stream {stream_id}",
                    )
                    for frame in data_frames(stranger, stream_id, 1000, [sbe(16, 999) + bytes(16)]):
                        attacker.sendto(frame, ("127.0.0.1", port))
            wait_for(
                lambda: (
                    cluster_counter(cluster, member, cluster_protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID) > invalid_before
                ),
                10,
                f"member {member}'s consensus module to count the stranger's ingress garbage",
            )
            wait_for(
                lambda: any(
                    e["text"].startswith("archive: malformed control request ignored")
                    for e in archive_tool.archive_errors_document(cluster.archive_dir(member))["errors"]
                ),
                10,
                f"member {member}'s archive to log the stranger's garbage",
            )


# ----------------------------------------------------------------------------- the to-driver ring buffer


def test_garbage_commands_on_every_drivers_ring_are_answered_and_logged(cluster: LocalCluster) -> None:
    """Records a client could write (the client's own ring writer, so the
    ring stays consistent for the real clients): unknown type ids, truncated
    bodies, length fields pointing past the end, invalid channels, unknown
    client and registration ids, a terminate with a wrong token.  Each is
    counted in ERRORS and logged with a specific text; the driver goes on.

    A record whose *ring* header lies about its length cannot be written
    without breaking the ring for the real clients: the length is the only
    thing that tells the driver where the next record starts, so a lie
    either makes it read a client's later record from the wrong offset or
    (impossible lengths) makes the ring unreadable for everyone.  Lying
    lengths are therefore tested inside the bodies, where the codecs must
    catch them."""

    def channel(text: str) -> bytes:
        encoded = text.encode()
        return struct.pack("<i", len(encoded)) + encoded

    with keeps_serving(cluster):
        for member in range(cluster.size):
            directory = cluster.driver_dir(member)
            correlation = 9_000_000_000 + member * 1000  # far from any real client's correlation ids
            client_id = 7_000_000 + member
            unknown_id = 123_456_789_000 + member
            commands: list[tuple[int, bytes, str]] = [
                (0x77, struct.pack("<qq", client_id, correlation + 1), "unknown command type id 0x77"),
                (0x7FFFFFFF, b"", "unknown command type id 0x7fffffff"),
                (
                    driver_codecs.TemplateId.ADD_PUBLICATION,
                    struct.pack("<qh", client_id, 1),
                    "malformed command 0x1: driver.AddPublication(1).correlationId: truncated root block",
                ),
                (
                    driver_codecs.TemplateId.ADD_PUBLICATION,
                    struct.pack("<qqii", client_id, correlation + 2, 10, 10_000) + b"aeron:udp",
                    "malformed command 0x1: driver.AddPublication(1).channel: length 10000 exceeds the 9 bytes left",
                ),
                (
                    driver_codecs.TemplateId.ADD_SUBSCRIPTION,
                    struct.pack("<qqqii", client_id, correlation + 3, -1, 10, -5) + b"aeron:ipc",
                    "malformed command 0x4: driver.AddSubscription(4).channel: negative length -5",
                ),
                (
                    driver_codecs.TemplateId.ADD_PUBLICATION,
                    struct.pack("<qqi", client_id, correlation + 4, 10) + channel("not-a-uri"),
                    "invalid channel 'not-a-uri'",
                ),
                (
                    driver_codecs.TemplateId.ADD_PUBLICATION,
                    struct.pack("<qqi", client_id, correlation + 5, 10) + channel("aeron:udp?endpoint=300.1.1.1:9"),
                    "invalid channel 'aeron:udp?endpoint=300.1.1.1:9'",
                ),
                (
                    driver_codecs.TemplateId.ADD_SUBSCRIPTION,
                    struct.pack("<qqqi", client_id, correlation + 6, -1, 10)
                    + channel("aeron:udp?endpoint=127.0.0.1:0|control-mode=bogus"),
                    "invalid channel 'aeron:udp?endpoint=127.0.0.1:0|control-mode=bogus': bad value for 'control-mode'",
                ),
                (
                    driver_codecs.TemplateId.REMOVE_PUBLICATION,
                    struct.pack("<qqq", client_id, correlation + 7, unknown_id),
                    f"unknown publication registration id {unknown_id}",
                ),
                (
                    driver_codecs.TemplateId.REMOVE_SUBSCRIPTION,
                    struct.pack("<qqq", client_id, correlation + 8, unknown_id),
                    f"unknown subscription registration id {unknown_id}",
                ),
                (
                    driver_codecs.TemplateId.REMOVE_COUNTER,
                    struct.pack("<qqq", client_id, correlation + 9, unknown_id),
                    f"unknown counter registration id {unknown_id}",
                ),
                (
                    driver_codecs.TemplateId.ADD_DESTINATION,
                    struct.pack("<qqq", client_id, correlation + 10, unknown_id + 1)
                    + channel("aeron:udp?endpoint=127.0.0.1:9"),
                    f"unknown publication registration id {unknown_id + 1}",
                ),
                (
                    driver_codecs.TemplateId.CLIENT_CLOSE,
                    struct.pack("<qq", unknown_id, correlation + 11),
                    f"client close from unknown client {unknown_id}",
                ),
                (
                    driver_codecs.TemplateId.TERMINATE_DRIVER,
                    struct.pack("<qqi", client_id, correlation + 12, 4) + b"nope",
                    f"terminate driver request from client {client_id} refused",
                ),
                (
                    driver_codecs.TemplateId.ADD_COUNTER,
                    struct.pack("<qqii", client_id, correlation + 13, 1000, 100_000) + b"k",
                    "malformed command 0x9: driver.AddCounter(9).key: length 100000 exceeds the 1 bytes left",
                ),
            ]
            with CncFile.open(directory) as cnc:
                ring = ManyToOneRingBuffer(cnc.to_driver)
                doorbell = cnc.driver_doorbell()
                for type_id, body, expected_error in commands:
                    before = system_counter(directory, SystemCounter.ERRORS)
                    assert ring.write(type_id, body), "the to-driver ring is full"
                    doorbell.ring()
                    wait_for(
                        lambda: system_counter(directory, SystemCounter.ERRORS) > before,
                        10,
                        f"member {member}'s driver to count the command {type_id:#x} as an error",
                    )
                    texts = driver_errors(directory)
                    assert any(text.startswith(expected_error) for text in texts), (expected_error, texts)
            # The driver still serves its own node's clients: a new one gets a publication.
            aeron = cluster.connect(member)
            try:
                publication = aeron.add_publication("aeron:ipc", 4242)
                assert publication.registration_id > 0
            finally:
                aeron.close()
                cluster.aerons.remove(aeron)


# ----------------------------------------------------------------------------- real publications


def test_garbage_offered_on_ingress_and_consensus_streams_is_rejected(cluster: LocalCluster) -> None:
    """A real Aeron publication (on the clients' driver) to each member's
    ingress and consensus endpoints offers random bytes and SBE messages with
    valid headers but wrong schema ids, unknown template ids and lengths that
    lie: the ingress counts them as invalid requests, the consensus stream as
    errors that cluster-tool lists; the members go on serving."""
    rnd = random.Random(12)
    aeron = cluster.connect()
    with keeps_serving(cluster):
        for member in range(cluster.size):
            ports = cluster.ports[member]
            ingress = aeron.add_publication(f"aeron:udp?endpoint={ports.endpoint('ingress')}", INGRESS_STREAM_ID)
            consensus = aeron.add_publication(
                f"aeron:udp?term-length=64k|endpoint={ports.endpoint('consensus')}", CONSENSUS_STREAM_ID
            )
            wait_for(
                lambda: ingress.is_connected and consensus.is_connected,
                10,
                f"publications to member {member}'s ingress and consensus endpoints",
            )
            messages = hostile_cluster_messages(rnd)
            invalid_before = cluster_counter(cluster, member, cluster_protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID)
            errors_before = cluster_counter(cluster, member, cluster_protocol.CLUSTER_ERROR_COUNT_TYPE_ID)
            for publication in (ingress, consensus):
                for _, message in messages:
                    wait_for(lambda: publication.offer(message) > 0, 10, f"an offer to member {member}")
            wait_for(
                lambda: (
                    cluster_counter(cluster, member, cluster_protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID)
                    >= invalid_before + len(messages)
                ),
                10,
                f"member {member}'s consensus module to count {len(messages)} invalid ingress requests",
            )
            wait_for(
                lambda: (
                    cluster_counter(cluster, member, cluster_protocol.CLUSTER_ERROR_COUNT_TYPE_ID)
                    >= errors_before + len(messages)
                ),
                10,
                f"member {member}'s consensus module to count {len(messages)} garbage consensus messages",
            )
            texts = module_errors(cluster, member)
            assert any("consensus stream: corrupt consensus message (template 55)" in t for t in texts), texts
            assert any(
                "consensus stream: consensus fragment of 4 bytes is shorter than a message header" in t for t in texts
            ), texts
            ingress.close()
            consensus.close()
            archive_control_garbage(cluster, aeron, member, rnd)


def archive_control_garbage(cluster: LocalCluster, aeron: Aeron, member: int, rnd: random.Random) -> None:
    """Garbage on the member's archive control channel: the archive logs
    each in its mark file's error log (``cluster-tool archive errors``)."""
    control = aeron.add_publication(cluster.archive_control_channel(member), ARCHIVE_CONTROL_STREAM_ID)
    try:
        wait_for(lambda: control.is_connected, 10, f"a publication to member {member}'s archive control channel")
        unknown_session = 0x5EED_0000 + member
        list_recordings = bytearray(64)  # a well-formed request, for a control session that does not exist
        length = archive_codecs.ListRecordingsRequestEncoder.encode(
            list_recordings,
            0,
            control_session_id=unknown_session,
            correlation_id=1,
            from_recording_id=0,
            record_count=10,
        )
        connect = archive_codecs.ConnectRequestEncoder
        messages = [
            (rnd.randbytes(40), "archive: malformed control request ignored"),
            (
                sbe(16, cluster_codecs.SessionConnectRequestEncoder.TEMPLATE_ID) + bytes(24),
                "archive: malformed control request ignored",
            ),
            (sbe(8, 999, schema_id=archive_codecs.SCHEMA_ID) + bytes(8), "archive: malformed control request ignored"),
            (
                sbe(connect.BLOCK_LENGTH, connect.TEMPLATE_ID, schema_id=archive_codecs.SCHEMA_ID)
                + struct.pack("<qii", 1, 20, 0)
                + struct.pack("<I", 1 << 20)
                + b"aeron:udp",
                "archive: malformed control request ignored",
            ),
            (
                bytes(list_recordings[:length]),
                f"archive: ListRecordingsRequest for unknown control session {unknown_session}",
            ),
        ]
        archive_dir = cluster.archive_dir(member)

        def observations(prefix: str) -> int:
            errors = archive_tool.archive_errors_document(archive_dir)["errors"]
            return sum(e["observation_count"] for e in errors if e["text"].startswith(prefix))

        for message, expected in messages:
            before = observations(expected)
            wait_for(lambda: control.offer(message) > 0, 10, f"an offer to member {member}'s archive")
            wait_for(
                lambda: observations(expected) > before,
                10,
                f"member {member}'s archive to log '{expected}' for {message[:16]!r}",
            )
    finally:
        control.close()

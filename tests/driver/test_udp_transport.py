"""Batched UDP transport over loopback: datagrams of every size, batches
moved in one system call, IPv6, multi-destination sends and the errors of
unusable endpoints.  Only 127.0.0.1 and ::1 are ever sent to."""

from __future__ import annotations

import errno
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from fulmar.driver.udp_transport import ChannelEndpointError, ReceivedBatch, UdpAddress, UdpTransport

SO_MEMINFO = 55  # Linux: getsockopt(SOL_SOCKET, SO_MEMINFO) -> u32[9], [0] is the receive queue's memory
TIMEOUT_S = 5.0

OpenTransport = Callable[..., UdpTransport]


@pytest.fixture
def open_transport() -> Iterator[OpenTransport]:
    """Open transports; every one is closed afterwards, even when a test fails."""
    opened: list[UdpTransport] = []

    def open_(*args: object, **kwargs: object) -> UdpTransport:
        transport = UdpTransport.open(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(transport)
        return transport

    yield open_
    for transport in opened:
        transport.close()


def ipv6_loopback_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def receive_all(transport: UdpTransport, count: int) -> list[tuple[bytes, tuple[str, int]]]:
    """Receive until ``count`` datagrams arrived (bounded by a deadline)."""
    received: list[tuple[bytes, tuple[str, int]]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(received) < count:
        batch = transport.receive()
        received.extend((bytes(batch.datagram(i)), batch.source(i)) for i in range(len(batch)))
        if not batch:
            assert time.monotonic() < deadline, f"received {len(received)} of {count} datagrams"
            select.select([transport], [], [], 0.05)
    return received


def queued_bytes(transport: UdpTransport) -> int:
    raw = transport.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 36)
    assert isinstance(raw, bytes)
    return int(struct.unpack("9I", raw)[0])


def wait_queued(transport: UdpTransport, at_least: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while queued_bytes(transport) < at_least:
        assert time.monotonic() < deadline, f"only {queued_bytes(transport)} of {at_least} bytes queued"
        select.select([transport], [], [], 0.01)


def payload(index: int, size: int) -> bytes:
    return (index.to_bytes(4, "little") + bytes(range(256)) * (size // 256 + 1))[:size]


SIZES = [0, 1, 8, 31, 32, 33, 1408, 8192, 65504]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_datagrams_of_every_size_cross_loopback(open_transport: OpenTransport, host: str) -> None:
    if host == "::1" and not ipv6_loopback_available():
        pytest.skip("no IPv6 loopback on this host")
    receiver = open_transport((host, 0), so_rcvbuf=4 * 1024 * 1024)
    sender = open_transport((host, 0))
    assert receiver.local_address[0] == host and receiver.local_address[1] != 0

    datagrams = [payload(i, size) for i, size in enumerate(SIZES)]
    # Regions of one buffer, as the sender sends a term.
    buffer = b"".join(datagrams)
    regions, offset = [], 0
    for datagram in datagrams:
        regions.append((offset, len(datagram)))
        offset += len(datagram)
    assert sender.send(buffer, regions, receiver.local_address) == len(SIZES)

    received = receive_all(receiver, len(SIZES))
    assert [data for data, _ in received] == datagrams
    assert {source for _, source in received} == {sender.local_address}


def test_a_batch_of_64_moves_with_one_receive_call(open_transport: OpenTransport) -> None:
    receiver = open_transport(("127.0.0.1", 0), so_rcvbuf=4 * 1024 * 1024, receive_batch=64)
    sender = open_transport(("127.0.0.1", 0))
    datagrams = [payload(i, 1408) for i in range(64)]

    # Learn what one datagram costs in the receive queue, so that the test
    # can wait until all 64 are queued before it receives (loopback delivers
    # in a softirq, usually but not always before sendmmsg returns).
    assert sender.send_datagrams([datagrams[0]], receiver.local_address) == 1
    wait_queued(receiver, 1)
    one = queued_bytes(receiver)
    assert len(receive_all(receiver, 1)) == 1

    assert sender.send_datagrams(datagrams, receiver.local_address) == 64
    wait_queued(receiver, 64 * one)
    batch = receiver.receive()
    assert len(batch) == 64
    assert list(map(bytes, batch)) == datagrams
    assert all(batch.source(i) == sender.local_address for i in range(64))
    assert len(receiver.receive()) == 0


def test_receive_takes_at_most_max_datagrams(open_transport: OpenTransport) -> None:
    receiver = open_transport(("127.0.0.1", 0))
    sender = open_transport(("127.0.0.1", 0))
    sender.send_datagrams([payload(i, 100) for i in range(5)], receiver.local_address)
    received: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(received) < 5:
        batch = receiver.receive(2)
        assert len(batch) <= 2
        received.extend(map(bytes, batch))
        assert time.monotonic() < deadline
    assert received == [payload(i, 100) for i in range(5)]
    assert len(receiver.receive(0)) == 0


def test_batch_describes_each_datagram(open_transport: OpenTransport) -> None:
    receiver = open_transport(("127.0.0.1", 0), receive_batch=4, slot_length=2048)
    sender = open_transport(("127.0.0.1", 0))
    sender.send_datagrams([b"abc", b"defgh"], receiver.local_address)
    receive_all_into: list[ReceivedBatch] = []
    deadline = time.monotonic() + TIMEOUT_S
    while not receive_all_into:
        batch = receiver.receive()
        if len(batch) == 2:
            receive_all_into.append(batch)
        else:
            assert len(batch) == 0 and time.monotonic() < deadline  # both came or none yet
            select.select([receiver], [], [], 0.05)
    batch = receive_all_into[0]
    assert [batch.offset(0), batch.offset(1)] == [0, 2048]  # one slot each
    assert [batch.length(0), batch.length(1)] == [3, 5]
    assert bytes(batch.view[batch.offset(1) : batch.offset(1) + 5]) == b"defgh"
    reply_to = batch.source_address(0)
    assert reply_to == UdpAddress.resolve(*sender.local_address)
    assert not batch.truncated(0)
    with pytest.raises(IndexError):
        batch.datagram(2)


def test_a_datagram_longer_than_its_slot_is_marked_truncated(open_transport: OpenTransport) -> None:
    receiver = open_transport(("127.0.0.1", 0), slot_length=64)
    sender = open_transport(("127.0.0.1", 0))
    sender.send_datagrams([payload(1, 100)], receiver.local_address)
    deadline = time.monotonic() + TIMEOUT_S
    while not (batch := receiver.receive()):
        assert time.monotonic() < deadline
        select.select([receiver], [], [], 0.05)
    assert batch.truncated(0) and batch.length(0) == 64
    assert bytes(batch.datagram(0)) == payload(1, 100)[:64]


def test_send_to_many_sends_the_same_datagrams_to_each(open_transport: OpenTransport) -> None:
    first = open_transport(("127.0.0.1", 0))
    second = open_transport(("127.0.0.1", 0))
    sender = open_transport(("127.0.0.1", 0))
    datagrams = [payload(i, 300) for i in range(3)]
    buffer = b"".join(datagrams)
    regions = [(0, 300), (300, 300), (600, 300)]
    # Port 0 cannot be sent to (EINVAL, and nothing leaves the host): that
    # destination fails, the others still get their datagrams.
    results = sender.send_to_many(buffer, regions, [first.local_address, ("127.0.0.1", 0), second.local_address])
    assert results[0] == 3 and results[2] == 3
    error = results[1]
    assert isinstance(error, ChannelEndpointError) and error.errno == errno.EINVAL
    assert "127.0.0.1:0" in str(error)
    assert [data for data, _ in receive_all(first, 3)] == datagrams
    assert [data for data, _ in receive_all(second, 3)] == datagrams


def test_send_reports_partial_progress_then_the_error(open_transport: OpenTransport) -> None:
    receiver = open_transport(("127.0.0.1", 0))
    sender = open_transport(("127.0.0.1", 0))
    too_long = 65508  # over IPv4's 65507-byte UDP payload: refused locally with EMSGSIZE
    buffer = bytes(too_long + 20)
    regions = [(0, 10), (10, too_long), (10, 10)]
    assert sender.send(buffer, regions, receiver.local_address) == 1
    with pytest.raises(ChannelEndpointError, match="Message too long") as caught:
        sender.send(buffer, regions[1:], receiver.local_address)
    assert caught.value.errno == errno.EMSGSIZE
    assert len(receive_all(receiver, 1)) == 1


def test_regions_outside_the_buffer_are_refused(open_transport: OpenTransport) -> None:
    sender = open_transport(("127.0.0.1", 0))
    for bad in [(0, 11), (-1, 2), (5, -1), (11, 0)]:
        with pytest.raises(ValueError, match="outside the 10-byte buffer"):
            sender.send(bytes(10), [(0, 1), bad], ("127.0.0.1", 9))
        with pytest.raises(ValueError, match="outside the 10-byte buffer"):
            sender.send_to_many(bytes(10), [bad], [("127.0.0.1", 9)])


def test_unbound_transport_gets_an_ephemeral_port_on_first_send(open_transport: OpenTransport) -> None:
    receiver = open_transport(("127.0.0.1", 0))
    sender = open_transport()
    assert sender.local_address[1] == 0
    sender.send_datagrams([b"hi"], receiver.local_address)
    ((data, source),) = receive_all(receiver, 1)
    assert data == b"hi" and source[1] == sender.local_address[1] != 0


def test_fileno_signals_readiness(open_transport: OpenTransport) -> None:
    receiver = open_transport(("127.0.0.1", 0))
    sender = open_transport(("127.0.0.1", 0))
    assert select.select([receiver], [], [], 0) == ([], [], [])
    sender.send_datagrams([b"x"], receiver.local_address)
    assert select.select([receiver], [], [], TIMEOUT_S)[0] == [receiver]


def test_port_in_use_is_a_channel_endpoint_error(open_transport: OpenTransport) -> None:
    first = open_transport(("127.0.0.1", 0))
    port = first.local_address[1]
    with pytest.raises(ChannelEndpointError, match=f"127.0.0.1:{port}.*Address already in use") as caught:
        open_transport(("127.0.0.1", port))
    assert caught.value.errno == errno.EADDRINUSE


def test_reuse_address_lets_two_sockets_share_a_port(open_transport: OpenTransport) -> None:
    first = open_transport(("127.0.0.1", 0), reuse_address=True)
    second = open_transport(("127.0.0.1", first.local_address[1]), reuse_address=True)
    assert second.local_address == first.local_address


def test_an_address_not_on_this_host_is_a_channel_endpoint_error(open_transport: OpenTransport) -> None:
    # 192.0.2.1 is TEST-NET-1: never a local address, so bind fails at once.
    with pytest.raises(ChannelEndpointError, match="192.0.2.1:40123.*Cannot assign requested address") as caught:
        open_transport(("192.0.2.1", 40123))
    assert caught.value.errno == errno.EADDRNOTAVAIL


def test_unresolvable_addresses_are_channel_endpoint_errors(open_transport: OpenTransport) -> None:
    with pytest.raises(ChannelEndpointError, match="cannot resolve UDP address"):
        open_transport(("no such host.invalid", 0))
    ipv4 = open_transport(("127.0.0.1", 0))
    with pytest.raises(ChannelEndpointError, match=r"cannot resolve UDP address \[::1\]:9"):
        ipv4.send_datagrams([b"x"], ("::1", 9))


def test_closed_transport_refuses_io(open_transport: OpenTransport) -> None:
    transport = open_transport(("127.0.0.1", 0))
    transport.close()
    transport.close()  # idempotent
    assert transport.closed
    with pytest.raises(ChannelEndpointError, match="closed"):
        transport.receive()
    with pytest.raises(ChannelEndpointError, match="closed"):
        transport.send_datagrams([b"x"], ("127.0.0.1", 9))


def test_socket_buffer_sizes_are_settable(open_transport: OpenTransport) -> None:
    transport = open_transport(("127.0.0.1", 0), so_rcvbuf=256 * 1024, so_sndbuf=128 * 1024)
    # Linux books twice what was asked (its own overhead included).
    assert transport.so_rcvbuf == 2 * 256 * 1024
    assert transport.so_sndbuf == 2 * 128 * 1024
    transport.so_rcvbuf = 512 * 1024
    assert transport.so_rcvbuf == 2 * 512 * 1024


def test_multicast_options_that_send_nothing(open_transport: OpenTransport) -> None:
    # Joining a group would emit an IGMP report, so only the outgoing
    # interface, TTL and loop are checked here.
    transport = open_transport(family=socket.AF_INET, interface="127.0.0.1", multicast_ttl=0, multicast_loop=False)
    assert transport.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == 0
    assert transport.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP) == 0
    assert transport.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, 4) == socket.inet_aton("127.0.0.1")
    with pytest.raises(ChannelEndpointError, match="multicast interface 192.0.2.1: no local interface"):
        open_transport(family=socket.AF_INET, interface="192.0.2.1")
    with pytest.raises(ChannelEndpointError, match="cannot set multicast TTL 300"):
        open_transport(family=socket.AF_INET, multicast_ttl=300)


def test_ipv6_transport_sends_to_ipv4_mapped_addresses(open_transport: OpenTransport) -> None:
    if not ipv6_loopback_available():
        pytest.skip("no IPv6 loopback on this host")
    receiver = open_transport(("::", 0), family=socket.AF_INET6)  # dual-stack wildcard
    sender = open_transport(("127.0.0.1", 0))
    sender.send_datagrams([b"v4"], ("127.0.0.1", receiver.local_address[1]))
    ((data, source),) = receive_all(receiver, 1)
    assert data == b"v4" and source == ("::ffff:127.0.0.1", sender.local_address[1])
    # Replying from the IPv6 socket to the mapped address reaches the IPv4 one.
    receiver.send_datagrams([b"back"], receiver.address("127.0.0.1", sender.local_address[1]))
    assert receive_all(sender, 1)[0][0] == b"back"

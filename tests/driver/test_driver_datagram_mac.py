"""datagram-mac=true: every datagram of a channel authenticated between two
fulmar drivers that share a member secret, and a stranger's refused unread."""

from __future__ import annotations

import hashlib
import hmac
import random
import socket
import struct
import time
from pathlib import Path

import pytest

from fulmar.aeron import RegistrationError
from fulmar.cnc import CncFile
from fulmar.counters import CountersReader
from fulmar.driver.context import DATAGRAM_KEY_LABEL, MEMBER_SECRET_ENV
from fulmar.driver.counters import SystemCounter
from fulmar.error_log import read_error_log
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.publication import Publication
from fulmar.subscription import Subscription
from support.driver import DriverProcess, free_udp_port, new_driver_dir, remove_driver_dir, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SECRET = "the members' secret"
STREAM = 3001
MAC_LENGTH = 16
DATA_HEADER = struct.Struct(
    "<iBBhiiiiq"
)  # length, version, flags, type, term offset, session, stream, term id, reserved
SETUP = struct.Struct(
    "<iBBhiiiiiiii"
)  # ... term offset, session, stream, initial term id, active term id, term length, mtu, ttl
STATUS = struct.Struct("<iBBhiiiiiq")  # ... session, stream, term id, term offset, window, receiver id
NAK = struct.Struct("<iBBhiiiii")  # ... session, stream, term id, term offset, length
RTTM = struct.Struct("<iBBhiiqqq")  # ... session, stream, echo timestamp, reception delta, receiver id
TYPE_DATA, TYPE_NAK, TYPE_SM, TYPE_SETUP, TYPE_RTTM = 1, 2, 3, 5, 6
REFUSAL = "datagram refused: no valid MAC (datagram-mac=true)"


def datagram_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), DATAGRAM_KEY_LABEL, hashlib.sha256).digest()


def mac(secret: str, frames: bytes) -> bytes:
    return hmac.new(datagram_key(secret), frames, hashlib.sha256).digest()[:MAC_LENGTH]


def counter(driver: DriverProcess, which: SystemCounter) -> int:
    with CncFile.open(driver.directory) as cnc:
        return CountersReader(cnc.counters_metadata, cnc.counters_values).counter_value(int(which))


def counter_label(driver: DriverProcess, which: SystemCounter) -> str:
    with CncFile.open(driver.directory) as cnc:
        return CountersReader(cnc.counters_metadata, cnc.counters_values).counter_label(int(which))


def refusals_logged(driver: DriverProcess) -> list[tuple[str, int]]:
    with CncFile.open(driver.directory) as cnc:
        return [(o.text, o.observation_count) for o in read_error_log(cnc.error_log) if REFUSAL in o.text]


def set_loss(driver: DriverProcess, receive_ppm: int, send_ppm: int) -> None:
    with CncFile.open(driver.directory) as cnc:
        cnc.counters_values.put_int64_ordered(SystemCounter.LOSS_RECEIVE_RATE_PPM * 128, receive_ppm)
        cnc.counters_values.put_int64_ordered(SystemCounter.LOSS_SEND_RATE_PPM * 128, send_ppm)


@pytest.fixture
def driver_pair(start_driver):
    """Start two drivers, the second in a directory of its own, with the secrets given."""
    directories: list[Path] = []

    def start(first_secret: str, second_secret: str) -> tuple[DriverProcess, DriverProcess]:
        directories.append(new_driver_dir())
        first = start_driver(member_secret=first_secret)
        second = start_driver(directories[-1], member_secret=second_secret, image_liveness_timeout_ns=2_000_000_000)
        return first, second

    yield start
    for directory in directories:
        remove_driver_dir(directory)


def poll_into(subscription: Subscription, got: list[bytes]) -> bool:
    subscription.poll(lambda b, o, n, h: got.append(bytes(b[o : o + n])), 100)
    return True


def forge_data_to(port: int) -> None:
    """A stranger's DATA frame (session 1, the test's stream) to a receiver's port."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        stranger.sendto(DATA_HEADER.pack(64, 0, 0xC0, TYPE_DATA, 0, 1, STREAM, 0, 0) + bytes(32), ("127.0.0.1", port))


def stream_messages(publication: Publication, subscription: Subscription, count: int) -> None:
    """Offer ``count`` messages of mixed sizes (some fragmented) and check they arrive in order, whole."""
    rnd = random.Random(5)
    sent = [
        rnd.randbytes(rnd.randint(1, 1400) if rnd.random() < 0.8 else rnd.randint(1400, 6000)) for _ in range(count)
    ]
    received: list[bytes] = []

    def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        received.append(bytes(buffer[offset : offset + length]))

    assembler = FragmentAssembler(on_message)
    deadline = time.monotonic() + 120
    index = 0
    while len(received) < count:
        assert time.monotonic() < deadline, f"only {len(received)} of {count} messages arrived"
        if index < count and publication.offer(sent[index]) > 0:
            index += 1
        subscription.poll(assembler, 64)
    assert received == sent


def test_a_stream_crosses_a_datagram_mac_channel_with_loss_and_retransmission(driver_pair) -> None:
    sender, receiver = driver_pair(SECRET, SECRET)
    # 5% of datagrams lost each way on each driver: NAKs, retransmits and
    # status messages all carry MACs, and every repair is accepted.
    set_loss(sender, 50_000, 50_000)
    set_loss(receiver, 50_000, 50_000)
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k|datagram-mac=true"
    with sender.connect() as pub_client, receiver.connect() as sub_client:
        subscription = sub_client.add_subscription(channel, STREAM)
        publication = pub_client.add_publication(channel, STREAM)
        wait_for(lambda: publication.is_connected and subscription.image_count, 10, "a connection")
        stream_messages(publication, subscription, 4_000)
        assert counter(receiver, SystemCounter.NAK_MESSAGES_SENT) > 0
        assert counter(sender, SystemCounter.RETRANSMITS_SENT) > 0
        assert counter(sender, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 0
        assert counter(receiver, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 0
        # The channel really is authenticated: a datagram without a MAC is not taken.
        set_loss(receiver, 0, 0)
        forge_data_to(port)
        wait_for(lambda: counter(receiver, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 1, 10, "the refusal")


def test_the_secret_comes_from_the_environment(start_driver, monkeypatch) -> None:
    monkeypatch.setenv(MEMBER_SECRET_ENV, SECRET)
    # No member_secret option: each driver process reads $FULMAR_MEMBER_SECRET.
    directory = new_driver_dir()
    try:
        first, second = start_driver(), start_driver(directory)
        with first.connect() as pub_client, second.connect() as sub_client:
            channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|datagram-mac=true"
            subscription = sub_client.add_subscription(channel, STREAM)
            publication = pub_client.add_publication(channel, STREAM)
            wait_for(lambda: publication.is_connected and subscription.image_count, 10, "a connection")
            stream_messages(publication, subscription, 100)
            assert counter(second, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 0
    finally:
        second.stop()
        remove_driver_dir(directory)


def test_the_cluster_log_pattern_multi_destination_both_ways(driver_pair) -> None:
    """As a cluster's log: a manual multi-destination publication (each
    follower a destination) and manual multi-destination subscriptions."""
    leader, follower = driver_pair(SECRET, SECRET)
    ports = [free_udp_port(), free_udp_port()]
    with leader.connect() as leader_client, follower.connect() as follower_client:
        subscriptions = []
        for port in ports:  # two followers' subscriptions, in one driver
            subscription = follower_client.add_subscription("aeron:udp?control-mode=manual|datagram-mac=true", STREAM)
            subscription.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
            subscriptions.append(subscription)
        publication = leader_client.add_exclusive_publication(
            "aeron:udp?control-mode=manual|term-length=64k|datagram-mac=true|fc=min", STREAM
        )
        for port in ports:
            publication.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
        wait_for(lambda: publication.is_connected and all(s.image_count for s in subscriptions), 10, "both images")
        got: list[list[bytes]] = [[], []]
        for seq in range(500):
            message = struct.pack("<q", seq) * (1 + seq % 50)
            wait_for(lambda: all(poll_into(s, g) for s, g in zip(subscriptions, got)) and publication.offer(message) > 0,
                     10, "an offer")  # fmt: skip
        wait_for(lambda: all(poll_into(s, g) for s, g in zip(subscriptions, got)) and min(map(len, got)) == 500, 10,
                 "every message at both")  # fmt: skip
        expected = [struct.pack("<q", seq) * (1 + seq % 50) for seq in range(500)]
        assert got == [expected, expected]
        assert counter(follower, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 0
        # Each destination's transport authenticates.
        for port in ports:
            forge_data_to(port)
        wait_for(lambda: counter(follower, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 2, 10, "the refusals")


def sniffed(sniffer: socket.socket, duration_s: float) -> list[bytes]:
    """Every datagram the sniffer is sent for ``duration_s``."""
    datagrams: list[bytes] = []
    deadline = time.monotonic() + duration_s
    while (left := deadline - time.monotonic()) > 0:
        sniffer.settimeout(left)
        try:
            datagrams.append(sniffer.recv(65536))
        except TimeoutError:
            break
    return datagrams


@pytest.mark.parametrize("with_mac", [False, True], ids=["plain", "datagram-mac"])
def test_what_goes_on_the_wire(driver_pair, with_mac: bool) -> None:
    """A channel without the param sends the bytes it always did (a DATA
    frame's datagram is the frame, no trailer); with it, each datagram is the
    same frames then HMAC-SHA256(HMAC-SHA256(secret, label), frames)[:16]."""
    sender, receiver = driver_pair(SECRET, SECRET)
    port, sniffer_port = free_udp_port(), free_udp_port()
    mac_param = "|datagram-mac=true" if with_mac else ""
    trailer = MAC_LENGTH if with_mac else 0
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sniffer,
        sender.connect() as pub_client,
        receiver.connect() as sub_client,
    ):
        sniffer.bind(("127.0.0.1", sniffer_port))
        subscription = sub_client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}{mac_param}", STREAM)
        # The sniffer is a second destination: it gets every datagram the subscriber does.
        publication = pub_client.add_publication(f"aeron:udp?control-mode=manual|term-length=64k{mac_param}", STREAM)
        publication.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
        publication.add_destination(f"aeron:udp?endpoint=127.0.0.1:{sniffer_port}")
        wait_for(lambda: publication.is_connected and subscription.image_count, 10, "a connection")
        sniffed(sniffer, 0.3)  # what came before the message
        message = b"m" * 96  # a 128-byte frame, aligned as it is
        wait_for(lambda: publication.offer(message) > 0, 10, "an offer")
        data = [
            d for d in sniffed(sniffer, 1.0) if DATA_HEADER.unpack_from(d)[0] > 0 and DATA_HEADER.unpack_from(d)[3] == 1
        ]
    assert len(data) == 1
    datagram = data[0]
    assert len(datagram) == 128 + trailer
    frame_length, _, _, frame_type, _, session_id, stream_id, _, _ = DATA_HEADER.unpack_from(datagram)
    assert (frame_length, frame_type, session_id, stream_id) == (128, TYPE_DATA, publication.session_id, STREAM)
    assert datagram[32:128] == message
    if with_mac:
        assert datagram[128:] == mac(SECRET, datagram[:128])


def test_a_strangers_data_and_setup_are_refused_unread(driver_pair) -> None:
    sender, receiver = driver_pair(SECRET, SECRET)
    port = free_udp_port()
    session_id, initial_term_id = 4242, 17
    start = f"|session-id={session_id}|init-term-id={initial_term_id}|term-id={initial_term_id}|term-offset=0"
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k|datagram-mac=true"
    images: list[object] = []
    with sender.connect() as pub_client, receiver.connect() as sub_client:
        subscription = sub_client.add_subscription(channel, STREAM, on_available_image=images.append)
        publication = pub_client.add_exclusive_publication(channel + start, STREAM)
        wait_for(lambda: publication.is_connected and subscription.image_count, 10, "a connection")
        got: list[bytes] = []
        wait_for(lambda: poll_into(subscription, got) and publication.offer(b"genuine 1" * 4) > 0, 10, "an offer")
        wait_for(lambda: poll_into(subscription, got) and got, 10, "the first message")
        position = subscription.images[0].position
        naks_before = counter(receiver, SystemCounter.NAK_MESSAGES_SENT)
        forged_payload = b"FORGED!!" * 8
        forged_data = [
            # The next frame the image expects, and one ahead (which, taken, would leave a gap to NAK).
            DATA_HEADER.pack(32 + len(forged_payload), 0, 0xC0, TYPE_DATA, offset, session_id, STREAM,
                             initial_term_id, 0) + forged_payload
            for offset in (position, position + 4096)
        ]  # fmt: skip
        forged = [
            *forged_data,
            *(d + bytes(MAC_LENGTH) for d in forged_data),  # a trailer, but not the MAC
            *(d + mac("another secret", d) for d in forged_data),  # the MAC under another secret
            # A SETUP for a new session: no image may come of it.
            SETUP.pack(40, 0, 0, TYPE_SETUP, 0, 999, STREAM, 5, 5, 64 * 1024, 1408, 0),
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            for datagram in forged:
                stranger.sendto(datagram, ("127.0.0.1", port))
        wait_for(lambda: counter(receiver, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == len(forged), 10, "every refusal")
        time.sleep(0.2)  # time for anything the forgeries might have started
        assert subscription.image_count == 1 and len(images) == 1, "an image from a forged SETUP"
        assert subscription.images[0].position == position
        assert counter(receiver, SystemCounter.NAK_MESSAGES_SENT) == naks_before, "the forged DATA opened a gap"
        # The genuine stream goes on where it was, the forged bytes nowhere in it.
        for n in (2, 3):
            wait_for(lambda: poll_into(subscription, got) and publication.offer(b"genuine %d" % n * 4) > 0, 10, "offer")
        wait_for(lambda: poll_into(subscription, got) and len(got) == 3, 10, "the genuine messages")
        assert got == [b"genuine %d" % n * 4 for n in (1, 2, 3)]
        assert counter(receiver, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == len(forged)
    # A flood of one kind is one entry of the distinct error log.
    logged = refusals_logged(receiver)
    assert len(logged) == 1 and logged[0][0].startswith("receive channel "), logged
    assert counter_label(receiver, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == "Datagrams refused (no valid MAC)"


def test_a_strangers_status_messages_naks_and_rttms_move_nothing(start_driver) -> None:
    """The stranger owns the publication's endpoint (its receiver's port):
    it hears the SETUPs and answers them, without the secret, then with it."""
    sender = start_driver(member_secret=SECRET)
    port = free_udp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger, sender.connect() as client:
        stranger.bind(("127.0.0.1", port))
        publication = client.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|datagram-mac=true", STREAM)
        stranger.settimeout(5)
        setup, source = stranger.recvfrom(65536)
        assert len(setup) == 40 + MAC_LENGTH and setup[40:] == mac(SECRET, setup[:40])
        _, _, _, frame_type, term_offset, session_id, stream_id, _, term_id, _, _, _ = SETUP.unpack_from(setup)
        assert (frame_type, session_id, stream_id) == (TYPE_SETUP, publication.session_id, STREAM)
        forged = [
            STATUS.pack(36, 0, 0, TYPE_SM, session_id, stream_id, term_id, term_offset, 1 << 20, 42),
            NAK.pack(28, 0, 0, TYPE_NAK, session_id, stream_id, term_id, 0, 1408),
            RTTM.pack(40, 0, 0, TYPE_RTTM, session_id, stream_id, 123, 0, 42),
        ]
        before = {
            c: counter(sender, c) for c in (SystemCounter.STATUS_MESSAGES_RECEIVED, SystemCounter.NAK_MESSAGES_RECEIVED)
        }
        for datagram in forged:
            stranger.sendto(datagram, source)
        wait_for(lambda: counter(sender, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 3, 10, "the refusals")
        time.sleep(0.3)
        assert not publication.is_connected
        assert {c: counter(sender, c) for c in before} == before
        # Nothing answered the RTTM: the stranger hears SETUPs only.
        assert all(SETUP.unpack_from(d)[3] == TYPE_SETUP for d in sniffed(stranger, 0.2))
        assert refusals_logged(sender)[0][0].startswith("send channel ")
        # With the secret the same status message is a receiver's: the driver
        # derives the key as the brief says.
        stranger.sendto(forged[0] + mac(SECRET, forged[0]), source)
        wait_for(lambda: publication.is_connected, 10, "a status message with a valid MAC to connect it")
        assert counter(sender, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) == 3


def test_drivers_with_different_secrets_never_connect(driver_pair) -> None:
    sender, receiver = driver_pair(SECRET, "not the members' secret")
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|datagram-mac=true"
    with sender.connect() as pub_client, receiver.connect() as sub_client:
        subscription = sub_client.add_subscription(channel, STREAM)
        publication = pub_client.add_publication(channel, STREAM)
        wait_for(lambda: counter(receiver, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) >= 3, 10, "SETUPs refused")
        time.sleep(0.5)
        assert not publication.is_connected and subscription.image_count == 0
        assert publication.offer(b"x") < 0
    assert refusals_logged(receiver)


def test_a_datagram_mac_channel_on_a_driver_without_a_secret_is_a_clear_error(start_driver) -> None:
    driver = start_driver(member_secret="")
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|datagram-mac=true"
    with driver.connect() as client:
        with pytest.raises(RegistrationError, match="datagram-mac=true needs a member secret"):
            client.add_publication(channel, STREAM)
        with pytest.raises(RegistrationError, match="datagram-mac=true needs a member secret"):
            client.add_subscription(channel, STREAM)
        # The driver goes on serving.
        client.add_subscription(channel.replace("|datagram-mac=true", ""), STREAM)


def test_channels_with_and_without_the_mac_never_share_an_endpoint(start_driver) -> None:
    driver = start_driver(member_secret=SECRET)
    port = free_udp_port()
    with driver.connect() as client:
        client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
        with pytest.raises(RegistrationError, match="without datagram-mac"):
            client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|datagram-mac=true", STREAM)
        tagged_port = free_udp_port()
        client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{tagged_port}|tags=77|datagram-mac=true", STREAM)
        with pytest.raises(RegistrationError, match="datagram-mac differs"):
            client.add_subscription("aeron:udp?tags=77|datagram-mac=false", STREAM)
        # Naming the tag alone takes the endpoint as it is (a follower's log is subscribed so).
        client.add_subscription("aeron:udp?tags=77", STREAM + 1)
        with pytest.raises(RegistrationError, match="must be true or false|datagram-mac"):
            client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|datagram-mac=yes", STREAM)
        # The largest mtu leaves no room for the MAC.
        with pytest.raises(RegistrationError, match="no room for the 16-byte MAC"):
            client.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|mtu=65504|datagram-mac=true", STREAM)


def test_a_spy_reads_a_datagram_mac_publication(start_driver) -> None:
    driver = start_driver(member_secret=SECRET)
    with driver.connect() as client:
        # As a cluster's recording of its log: the spy's channel need not say datagram-mac.
        spy = client.add_subscription("aeron-spy:aeron:udp?control-mode=manual", STREAM)
        publication = client.add_publication("aeron:udp?control-mode=manual|datagram-mac=true|ssc=true", STREAM)
        wait_for(lambda: publication.is_connected and spy.image_count, 10, "the spy")
        got: list[bytes] = []
        wait_for(lambda: poll_into(spy, got) and publication.offer(b"spied") > 0, 10, "an offer")
        wait_for(lambda: poll_into(spy, got) and got, 10, "the message")
        assert got == [b"spied"]


def test_the_context_derives_the_key_and_keeps_the_secret_out_of_its_repr() -> None:
    from fulmar.driver.context import DriverContext

    assert SECRET not in repr(DriverContext(member_secret=SECRET.encode()))
    assert DriverContext(member_secret=None).datagram_key() is None
    assert DriverContext(member_secret=SECRET.encode()).datagram_key() == datagram_key(SECRET)

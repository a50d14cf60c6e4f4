"""UDP sockets' buffers and the receiver window: the driver's defaults
(--socket-rcvbuf, --socket-sndbuf, --rcv-initial-window-length) and a
channel's so-rcvbuf, so-sndbuf and rcv-wnd reach the sockets, the status
messages a sender is sent and the log buffer's metadata; settings the
sockets could not honour are refused with the reason."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fulmar.aeron import Aeron, RegistrationError
from fulmar.cnc import CncFile
from fulmar.counters import CountersReader
from fulmar.driver.context import DriverContext
from fulmar.driver.counters import SystemCounter
from fulmar.driver.media_driver import DriverConfigurationError, MediaDriver
from fulmar.error_log import read_error_log
from fulmar.frames import FrameType, decode_status_message, encode_setup, frame_type_of
from fulmar.logbuffer import (
    OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET,
    OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET,
    OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET,
    RECEIVER_WINDOW_LENGTH_OFFSET,
    SOCKET_RCVBUF_LENGTH_OFFSET,
    SOCKET_SNDBUF_LENGTH_OFFSET,
)
from support.cli_driver import running_driver, stop
from support.driver import free_udp_port, new_driver_dir, remove_driver_dir, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

STREAM = 4101
SESSION = 77
TERM_LENGTH = 1024 * 1024


def granted(rcvbuf: int) -> int:
    """What this machine's kernel reports for a socket asked for ``rcvbuf`` (Linux doubles it, up to rmem_max)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        return probe.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def os_default(option: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        return probe.getsockopt(socket.SOL_SOCKET, option)


def socket_rcvbuf_of_port(port: int) -> int:
    """SO_RCVBUF of whatever socket is bound to the loopback UDP ``port``, as ``ss`` reads it."""
    output = subprocess.run(
        ["ss", "-H", "-u", "-a", "-m", "-n", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"\brb(\d+)", output)
    assert found, f"no socket on UDP port {port}: {output!r}"
    return int(found.group(1))


def system_counter(directory: Path, counter: SystemCounter) -> int:
    with CncFile.open(directory) as cnc:
        return CountersReader(cnc.counters_metadata, cnc.counters_values).counter_value(int(counter))


def setup_and_read_status(port: int, mtu: int = 1408) -> tuple[socket.socket, int]:
    """Be a sender: SETUP to ``port`` until a status message comes back; the
    socket (still open, for more) and the SM's receiver window."""
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(("127.0.0.1", 0))
    sender.settimeout(0.05)
    setup = bytearray(64)
    length = encode_setup(
        setup, 0, term_offset=0, session_id=SESSION, stream_id=STREAM, initial_term_id=5, active_term_id=5,
        term_length=TERM_LENGTH, mtu_length=mtu,
    )  # fmt: skip
    windows: list[int] = []

    def answered() -> bool:
        sender.sendto(setup[:length], ("127.0.0.1", port))
        try:
            while True:
                datagram = sender.recv(2048)
                if frame_type_of(datagram) == FrameType.SM:
                    windows.append(decode_status_message(datagram).receiver_window)
                    return True
        except TimeoutError:
            return False

    try:
        wait_for(answered, 10, f"a status message from the receiver on port {port}")
    except BaseException:
        sender.close()
        raise
    return sender, windows[0]


def test_a_channels_so_rcvbuf_and_rcv_wnd_reach_the_socket_the_status_messages_and_the_image(aeron: Aeron) -> None:
    port = free_udp_port()
    subscription = aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=512k|rcv-wnd=64k", STREAM)
    if shutil.which("ss"):
        assert socket_rcvbuf_of_port(port) == granted(512 * 1024)
    sender, window = setup_and_read_status(port)
    with sender:
        assert window == 64 * 1024
        wait_for(lambda: subscription.image_count == 1, 10, "the image")
        metadata = subscription.images[0].log.metadata
        assert metadata.get_int32(RECEIVER_WINDOW_LENGTH_OFFSET) == 64 * 1024
        assert metadata.get_int32(SOCKET_RCVBUF_LENGTH_OFFSET) == 512 * 1024
        assert metadata.get_int32(SOCKET_SNDBUF_LENGTH_OFFSET) == 0  # the channel names none
        assert metadata.get_int32(OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET) == os_default(socket.SO_RCVBUF)
        assert metadata.get_int32(OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET) == os_default(socket.SO_SNDBUF)
        assert metadata.get_int32(OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET) == granted(DriverContext().socket_rcvbuf)


def test_the_drivers_own_lengths_apply_where_a_channel_names_none(start_driver) -> None:
    driver = start_driver(socket_rcvbuf=768 * 1024, initial_window_length=96 * 1024)
    port = free_udp_port()
    with driver.connect() as aeron:
        aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
        if shutil.which("ss"):
            assert socket_rcvbuf_of_port(port) == granted(768 * 1024)
        sender, window = setup_and_read_status(port)
        sender.close()
        assert window == 96 * 1024


def test_the_window_is_at_most_half_a_term(aeron: Aeron) -> None:
    port = free_udp_port()
    aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|rcv-wnd=1m", STREAM)
    sender, window = setup_and_read_status(port)
    sender.close()
    assert window == TERM_LENGTH // 2


def test_a_window_larger_than_the_sockets_buffer_is_refused(aeron: Aeron) -> None:
    port = free_udp_port()
    with pytest.raises(RegistrationError, match=r"receiver window \(rcv-wnd\) 262144 is larger than so-rcvbuf 131072"):
        aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=128k|rcv-wnd=256k", STREAM)
    # Nothing was bound: the port is still free for a subscription that fits.
    aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=256k|rcv-wnd=256k", STREAM)


def test_a_channel_sharing_an_endpoint_cannot_ask_for_other_buffers(aeron: Aeron) -> None:
    port = free_udp_port()
    aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=512k", STREAM)
    with pytest.raises(RegistrationError, match="so-rcvbuf=1048576 does not match the 524288 of the open endpoint"):
        aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=1m", STREAM + 1)
    # The same length, or none, shares it.
    aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=512k", STREAM + 1)
    aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM + 2)

    destination = free_udp_port()
    aeron.add_publication(f"aeron:udp?endpoint=127.0.0.1:{destination}|so-sndbuf=256k", STREAM)
    with pytest.raises(RegistrationError, match="so-sndbuf=131072 does not match the 262144"):
        aeron.add_publication(f"aeron:udp?endpoint=127.0.0.1:{destination}|so-sndbuf=128k", STREAM + 1)


def test_an_mtu_larger_than_the_send_buffer_is_refused(aeron: Aeron) -> None:
    destination = free_udp_port()
    with pytest.raises(RegistrationError, match="mtu 8192 is larger than so-sndbuf 4096"):
        aeron.add_publication(f"aeron:udp?endpoint=127.0.0.1:{destination}|mtu=8k|so-sndbuf=4k", STREAM)


def test_a_sender_whose_mtu_exceeds_the_window_gets_no_image(start_driver) -> None:
    driver = start_driver()
    port = free_udp_port()
    with driver.connect() as aeron:
        subscription = aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|rcv-wnd=4k", STREAM)
        before = system_counter(driver.directory, SystemCounter.INVALID_PACKETS)
        setup = bytearray(64)
        length = encode_setup(
            setup, 0, term_offset=0, session_id=SESSION, stream_id=STREAM, initial_term_id=5, active_term_id=5,
            term_length=TERM_LENGTH, mtu_length=8192,
        )  # fmt: skip
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(setup[:length], ("127.0.0.1", port))
            wait_for(
                lambda: system_counter(driver.directory, SystemCounter.INVALID_PACKETS) > before,
                10,
                "the SETUP counted as invalid",
            )
        assert subscription.image_count == 0
        # A sender whose datagrams fit is served.
        sender, window = setup_and_read_status(port, mtu=4096)
        sender.close()
        assert window == 4096
        wait_for(lambda: subscription.image_count == 1, 10, "the image")


def test_a_driver_whose_window_its_sockets_cannot_hold_does_not_start() -> None:
    directory = new_driver_dir()
    try:
        # The OS grants at least what is asked up to rmem_max: 64 KiB asked
        # gives at most 128 KiB (doubled), never 16 MiB.
        context = DriverContext(directory=directory, socket_rcvbuf=64 * 1024, initial_window_length=16 * 1024 * 1024)
        with pytest.raises(DriverConfigurationError, match="receiver window 16777216 is larger than"):
            MediaDriver.launch(context)
        assert not (directory / "cnc.dat").exists()
        result = subprocess.run(
            [sys.executable, "-m", "fulmar.cli.cluster_node", "driver", "--dir", str(directory),
             "--socket-rcvbuf", "64k", "--rcv-initial-window-length", "16m"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 1, result
        assert "receiver window 16777216 is larger than" in result.stderr
    finally:
        remove_driver_dir(directory)


def test_the_cli_takes_the_drivers_lengths() -> None:
    port = free_udp_port()
    directory = new_driver_dir()
    try:
        with running_driver(directory, "--socket-rcvbuf", "640k", "--rcv-initial-window-length", "80k"):
            with Aeron.connect(directory) as aeron:
                aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
                if shutil.which("ss"):
                    assert socket_rcvbuf_of_port(port) == granted(640 * 1024)
                sender, window = setup_and_read_status(port)
                sender.close()
                assert window == 80 * 1024
    finally:
        remove_driver_dir(directory)


def beyond_the_os_cap() -> int:
    """A buffer length the OS will not grant: more than twice net.core.rmem_max
    (Linux grants at most rmem_max, reported doubled)."""
    cap = granted(2**31 - 1)  # what the largest request gets
    wanted = 2 * cap
    if wanted > 2**31 - 1:
        pytest.skip(f"the OS grants {cap} bytes: no channel length is beyond its cap")
    return wanted


def test_a_channel_length_the_os_does_not_grant_is_named_in_the_error_log(start_driver) -> None:
    wanted = beyond_the_os_cap()
    driver = start_driver()
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf={wanted}"
    with driver.connect() as aeron:
        aeron.add_subscription(channel, STREAM)

        def logged() -> list[str]:
            with CncFile.open(driver.directory) as cnc:
                return [e.text for e in read_error_log(cnc.error_log) if "SO_RCVBUF" in e.text]

        texts = wait_for(logged, 10, "the error log to name the short buffer")
        assert texts == [
            f"channel '{channel}': SO_RCVBUF {wanted} asked for, the OS granted {granted(wanted)}; "
            "raise net.core.rmem_max"
        ]


def test_a_driver_the_os_grants_less_than_it_asks_says_so_and_starts() -> None:
    wanted = beyond_the_os_cap()
    directory = new_driver_dir()
    try:
        with running_driver(directory, "--socket-rcvbuf", str(wanted)) as process:  # it serves
            _, _, stderr = stop(process)
    finally:
        remove_driver_dir(directory)
    warning = f"WARNING: SO_RCVBUF {wanted} asked for, the OS granted {granted(wanted)}; raise net.core.rmem_max"
    assert warning in stderr

"""cluster-node driver and cluster-tool against real driver processes.

Every driver runs as a subprocess in its own directory under /dev/shm; every
process is reaped and every directory removed even when a test fails, and
every wait polls a condition against a deadline.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from fulmar.aeron import Aeron, RegistrationError
from fulmar.cli import aeron_stat, cluster_tool
from fulmar.cli.cnc_reader import iso_utc
from fulmar.cli.options import Duration, Size, format_duration, format_size
from fulmar.cli.tool_common import format_counters
from fulmar.cnc import BROADCAST_TRAILER_LENGTH, RING_BUFFER_TRAILER_LENGTH, CncFile
from fulmar.codecs.generated import driver as protocol
from fulmar.driver.counters import CLIENT_HEARTBEAT_TYPE_ID, SYSTEM_COUNTER_TYPE_ID, SystemCounter
from fulmar.ring_buffer import ManyToOneRingBuffer
from support.cli_driver import DEADLINE_S, SMALL_CNC, reap, running_driver, stop, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


# ---------------------------------------------------------------------- helpers


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A private directory under /dev/shm; drivers use subdirectories of it."""
    path = Path(tempfile.mkdtemp(prefix="fulmar-test-cli-", dir=SHM))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tool(*args: str) -> click.testing.Result:
    """Run cluster-tool in this process (the read commands need no process of their own)."""
    return CliRunner().invoke(cluster_tool.main, list(args))


def tool_json(*args: str) -> Any:
    result = tool(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def provoke_registration_error(aeron: Aeron) -> None:
    with pytest.raises(RegistrationError):
        aeron.add_publication("aeron:bogus", 1)


def by_label(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {counter["label"]: counter for counter in document["counters"]}


def send_terminate(directory: Path, token: bytes) -> None:
    """Write a TERMINATE_DRIVER command to the driver, as a client would."""
    cnc = CncFile.open(directory)
    try:
        to_driver = ManyToOneRingBuffer(cnc.to_driver)
        message = bytearray(256)
        length = protocol.TerminateDriverEncoder.encode(
            message, 0, client_id=to_driver.next_correlation_id(), correlation_id=to_driver.next_correlation_id(),
            token=token,
        )  # fmt: skip
        assert to_driver.write(protocol.TerminateDriverEncoder.TEMPLATE_ID, bytes(message[:length]))
        cnc.driver_doorbell().ring()
    finally:
        cnc.close()


@contextmanager
def children_interruptible() -> Iterator[None]:
    """Let children started in the block see SIGINT as Ctrl-C.

    A shell without job control starts background jobs with SIGINT ignored,
    children inherit that, and Python then installs no KeyboardInterrupt
    handler.  A handler set here is reset to the default by exec instead.
    """
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def read_lines(process: subprocess.Popen[str], count: int, matching: Callable[[str], bool]) -> list[str]:
    """Read stdout lines until ``count`` of them match, with a deadline (no blocking readline)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    pending = b""
    found: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(found) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out: {len(found)} of {count} matching lines, last bytes {pending[-200:]!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        assert chunk, f"stdout closed after {len(found)} matching lines (exit code {process.poll()})"
        pending += chunk
        *lines, pending = pending.split(b"\n")
        found.extend(text for text in (line.decode() for line in lines) if matching(text))
    return found


# ---------------------------------------------------------------------- a live driver


def test_counters_errors_and_status_of_a_live_driver(workspace: Path) -> None:
    directory = workspace / "node0"
    with running_driver(directory) as driver, Aeron.connect(directory) as aeron:
        provoke_registration_error(aeron)

        document = tool_json("counters", "--dir", str(directory))
        assert document["driver_pid"] == driver.pid
        counters = by_label(document)
        errors_counter = counters["Errors"]
        assert errors_counter["id"] == SystemCounter.ERRORS
        assert (errors_counter["type_id"], errors_counter["type"]) == (SYSTEM_COUNTER_TYPE_ID, "system")
        assert errors_counter["value"] == 1
        assert counters["Active clients"]["value"] == 1
        # (A fulmar client appends its process to the label: see fulmar.client_liveness.)
        heartbeat = next(
            c for label, c in counters.items() if label.split(" pid=")[0] == f"client-heartbeat: {aeron.client_id}"
        )
        assert (heartbeat["type_id"], heartbeat["type"]) == (CLIENT_HEARTBEAT_TYPE_ID, "client-heartbeat")
        assert heartbeat["registration_id"] == aeron.client_id
        assert abs(heartbeat["value"] - time.time() * 1000) < 60_000  # a recent keepalive, epoch ms

        text = tool("counters", "--dir", str(directory))
        assert text.exit_code == 0
        assert f"driver pid {driver.pid}" in text.stdout
        assert any(line.split()[0] == "15" and line.endswith("Errors") for line in text.stdout.splitlines()[2:])

        errors = tool_json("errors", "--dir", str(directory))["errors"]
        assert len(errors) == 1
        assert errors[0]["observation_count"] == 1
        assert "aeron:bogus" in errors[0]["text"]
        assert errors[0]["first_observation"] == iso_utc(errors[0]["first_observation_timestamp_ms"])
        text = tool("errors", "--dir", str(directory))
        assert text.exit_code == 0
        assert text.stdout.startswith(f"1 distinct error in {directory}")
        assert "1 observation from 20" in text.stdout and "aeron:bogus" in text.stdout

        status = tool_json("driver", "--dir", str(directory))
        assert status["pid"] == driver.pid and status["pid_exists"] and status["alive"]
        assert 0 <= status["heartbeat_age_ms"] < status["client_liveness_timeout_ms"] == 10_000
        assert status["buffers"]["to_driver"] == 64 * 1024 + RING_BUFFER_TRAILER_LENGTH
        assert status["buffers"]["to_clients"] == 64 * 1024 + BROADCAST_TRAILER_LENGTH
        assert status["buffers"]["counters_values"] == 64 * 1024
        assert status["buffers"]["error_log"] == 64 * 1024
        text = tool("driver", "--dir", str(directory))
        assert text.exit_code == 0 and ": alive" in text.stdout.splitlines()[0]


def test_no_errors_is_reported_as_such(workspace: Path) -> None:
    directory = workspace / "node0"
    with running_driver(directory):
        result = tool("errors", "--dir", str(directory))
        assert result.exit_code == 0
        assert result.stdout.strip() == f"no errors in {directory}"
        assert tool_json("errors", "--dir", str(directory))["errors"] == []


def test_dir_comes_from_the_environment(workspace: Path) -> None:
    directory = workspace / "node0"
    with running_driver(directory) as driver:
        result = CliRunner(env={"FULMAR_DRIVER_DIR": str(directory)}).invoke(cluster_tool.main, ["driver", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["pid"] == driver.pid


def test_second_driver_on_the_same_dir_exits_2_naming_the_first(workspace: Path) -> None:
    directory = workspace / "node0"
    with running_driver(directory) as first:
        second = subprocess.run(
            [sys.executable, "-m", "fulmar.cli.cluster_node", "driver", "--dir", str(directory), *SMALL_CNC],
            capture_output=True, text=True, timeout=DEADLINE_S,
        )  # fmt: skip
        assert second.returncode == 2
        assert f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        # The first driver keeps its directory and keeps serving.
        assert first.poll() is None
        assert tool_json("driver", "--dir", str(directory))["pid"] == first.pid


# ---------------------------------------------------------------------- stopping


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_driver_and_removes_its_dir(workspace: Path, signum: int) -> None:
    directory = workspace / "node0"
    with running_driver(directory) as driver:
        # Signalled as soon as cnc.dat is ready, possibly before the driver
        # prints its line: a supervisor does not wait for output either.
        code, stdout, stderr = stop(driver, signum)
        assert code == 0, stderr
        assert stdout.strip() == f"media driver pid {driver.pid} serving {directory}"
        assert "Traceback" not in stderr
        assert not directory.exists()


def test_keep_files_leaves_a_stopped_driver_readable(workspace: Path) -> None:
    directory = workspace / "node0"
    with running_driver(directory, "--keep-files") as driver:
        with Aeron.connect(directory) as aeron:
            provoke_registration_error(aeron)
        code, _, stderr = stop(driver)
        assert code == 0, stderr
    assert (directory / "cnc.dat").exists()

    # Shown whole, and exit 3: the driver is not alive.
    result = tool("counters", "--dir", str(directory), "--json")
    assert result.exit_code == 3, result.output
    document = json.loads(result.stdout)
    assert document["driver_pid"] == driver.pid and document["driver_alive"] is False
    assert by_label(document)["Errors"]["value"] == 1
    result = tool("errors", "--dir", str(directory), "--json")
    assert result.exit_code == 3, result.output
    errors = json.loads(result.stdout)["errors"]
    assert [error["observation_count"] for error in errors] == [1]

    result = tool("driver", "--dir", str(directory), "--json")
    assert result.exit_code == 3  # files present, driver not alive
    status = json.loads(result.stdout)
    assert (status["pid"], status["pid_exists"], status["alive"]) == (driver.pid, False, False)

    # A new driver reclaims the dead one's directory.
    with running_driver(directory) as successor:
        assert tool_json("counters", "--dir", str(directory))["driver_pid"] == successor.pid


def test_terminate_token_enables_terminate_driver(workspace: Path) -> None:
    directory = workspace / "node0"
    with running_driver(directory, "--terminate-token", "let-me-stop-you") as driver:
        send_terminate(directory, b"wrong token")
        wait_for(
            lambda: any("refused: invalid token" in error["text"] for error in tool_json("errors", "--dir", str(directory))["errors"]),
            "the refused termination in the error log",
        )  # fmt: skip
        assert driver.poll() is None

        send_terminate(directory, b"let-me-stop-you")
        assert driver.wait(timeout=DEADLINE_S) == 0
        assert not directory.exists()


def test_member_secret_enables_datagram_mac_channels(workspace: Path) -> None:
    channel = "aeron:udp?endpoint=127.0.0.1:0|datagram-mac=true"
    with running_driver(workspace / "with", "--member-secret", "s3cret") as driver:
        with Aeron.connect(workspace / "with") as aeron:
            aeron.add_subscription(channel, 1)
        # Its refusals are a system counter the tools list.
        counters = by_label(tool_json("counters", "--dir", str(workspace / "with")))
        assert counters["Datagrams refused (no valid MAC)"]["id"] == SystemCounter.DATAGRAMS_REFUSED_NO_MAC
        assert driver.poll() is None
    with running_driver(workspace / "without"), Aeron.connect(workspace / "without") as aeron:
        with pytest.raises(RegistrationError, match="needs a member secret"):
            aeron.add_subscription(channel, 1)


# ---------------------------------------------------------------------- no driver, bad input


def test_tool_without_driver_files_exits_4_with_a_message(workspace: Path) -> None:
    empty = workspace / "empty"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "fulmar.cli.cluster_tool", "counters", "--dir", str(empty)],
        capture_output=True, text=True, timeout=DEADLINE_S,
    )  # fmt: skip
    assert result.returncode == 4
    assert result.stdout == ""
    assert f"no media driver in {empty}" in result.stderr
    assert "Traceback" not in result.stderr
    for command in ("errors", "driver"):
        for extra in ([], ["--json"]):
            outcome = tool(command, "--dir", str(workspace / "missing"), *extra)
            assert outcome.exit_code == 4
            assert "no media driver in" in outcome.stderr


@pytest.mark.parametrize(
    ("options", "option_name"),
    [
        (["--client-liveness-timeout", "10"], "--client-liveness-timeout"),  # no unit
        (["--publication-linger", "soon"], "--publication-linger"),
        (["--timer-interval", "0s"], "--timer-interval"),
        (["--ipc-term-length", "100k"], "--ipc-term-length"),
        (["--ipc-mtu", "100"], "--ipc-mtu"),
        (["--idle-strategy", "nap"], "--idle-strategy"),
        (["--idle-strategy", "yield:1ms"], "--idle-strategy"),
        (["--to-driver-buffer", "1000"], "--to-driver-buffer"),
        (["--counters-buffer", "100"], "--counters-buffer"),
        (["--terminate-token", ""], "--terminate-token"),
    ],
)
def test_bad_option_values_are_usage_errors(workspace: Path, options: list[str], option_name: str) -> None:
    directory = workspace / "node0"
    result = subprocess.run(
        [sys.executable, "-m", "fulmar.cli.cluster_node", "driver", "--dir", str(directory), *options],
        capture_output=True, text=True, timeout=DEADLINE_S,
    )  # fmt: skip
    assert result.returncode == 2
    assert "Usage:" in result.stderr and f"'{option_name}'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not directory.exists()


def test_driver_refuses_a_directory_with_foreign_files(workspace: Path) -> None:
    precious = workspace / "notes.txt"
    precious.write_text("keep me")
    result = subprocess.run(
        [sys.executable, "-m", "fulmar.cli.cluster_node", "driver", "--dir", str(workspace)],
        capture_output=True, text=True, timeout=DEADLINE_S,
    )  # fmt: skip
    assert result.returncode == 2
    assert "'--dir'" in result.stderr and "notes.txt" in result.stderr
    assert precious.read_text() == "keep me"


# ---------------------------------------------------------------------- --watch


@pytest.mark.parametrize("as_json", [True, False])
def test_watch_refreshes_until_interrupted(workspace: Path, as_json: bool) -> None:
    directory = workspace / "node0"
    with running_driver(directory) as driver:
        command = [
            sys.executable,
            "-m",
            "fulmar.cli.cluster_tool",
            "counters",
            "--dir",
            str(directory),
            "--watch",
            "0.1",
        ]
        with children_interruptible():
            watcher = subprocess.Popen(command + (["--json"] if as_json else []), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            if as_json:
                refreshes = [json.loads(line) for line in read_lines(watcher, 2, lambda line: line.startswith("{"))]
                assert all(refresh["driver_pid"] == driver.pid for refresh in refreshes)
                assert all(any(c["label"] == "Errors" for c in refresh["counters"]) for refresh in refreshes)
                # The driver goes away: the watch says so and keeps going.
                code, _, _ = stop(driver)
                assert code == 0
                gone = json.loads(read_lines(watcher, 1, lambda line: '"error"' in line)[0])
                assert "no media driver" in gone["error"]
            else:
                read_lines(watcher, 2, lambda line: line.startswith(f"driver pid {driver.pid} in {directory}"))
            watcher.send_signal(signal.SIGINT)
            _, stderr = watcher.communicate(timeout=DEADLINE_S)
            assert watcher.returncode == 0
            assert "Traceback" not in stderr
        finally:
            reap(watcher)


def test_watch_shows_each_counters_change_per_second_between_two_reads(workspace: Path) -> None:
    """counters --watch: a counter moved by 1000 between two refreshes has the
    rate 1000 / the seconds between those reads; the first refresh has none."""
    directory = workspace / "node0"
    label = "test rate counter"
    with running_driver(directory), Aeron.connect(directory) as aeron:
        counter = aeron.add_counter(1001, label)
        command = [
            sys.executable,
            "-m",
            "fulmar.cli.cluster_tool",
            "counters",
            "--dir",
            str(directory),
            "--watch",
            "0.1",
            "--json",
        ]
        with children_interruptible():
            watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:

            def ours(line: str) -> dict[str, Any]:
                return by_label(json.loads(line))[label]

            first = json.loads(read_lines(watcher, 1, lambda line: line.startswith("{"))[0])
            assert first["interval_s"] is None
            assert all(c["rate_per_s"] is None for c in first["counters"])
            # Two refreshes see the same value: its rate is 0 and interval_s is the time between the reads.
            still = json.loads(
                read_lines(watcher, 1, lambda line: line.startswith("{") and ours(line)["value"] == 0)[0]
            )
            assert still["interval_s"] >= 0.1 and ours(json.dumps(still))["rate_per_s"] == 0
            counter.set(1000)
            moved = json.loads(
                read_lines(watcher, 1, lambda line: line.startswith("{") and ours(line)["value"] == 1000)[0]
            )
            assert by_label(moved)[label]["rate_per_s"] == pytest.approx(1000 / moved["interval_s"])
            assert moved["interval_s"] >= 0.1
            watcher.send_signal(signal.SIGINT)
            _, stderr = watcher.communicate(timeout=DEADLINE_S)
            assert watcher.returncode == 0 and "Traceback" not in stderr
        finally:
            reap(watcher)


def test_rates_keep_to_the_same_counter_and_show_in_a_column() -> None:
    """A freed counter id taken by a new counter (another registration id), or
    another driver, gives no rate; the text has a rate/s column only when watching."""

    def read(pid: int, *counters: tuple[int, int, int]) -> dict[str, Any]:
        return {
            "dir": "/d",
            "driver_pid": pid,
            "counters": [
                {"id": cid, "type_id": 0, "type": "system", "label": f"c{cid}", "value": value, "registration_id": reg}
                for cid, reg, value in counters
            ],
        }

    first = aeron_stat.add_rates(read(7, (0, 10, 100), (1, 11, 5)), None, None)
    assert first["interval_s"] is None and [c["rate_per_s"] for c in first["counters"]] == [None, None]
    second = aeron_stat.add_rates(read(7, (0, 10, 350), (1, 12, 9)), first, 0.5)
    assert second["interval_s"] == 0.5
    assert [c["rate_per_s"] for c in second["counters"]] == [500.0, None]
    restarted = aeron_stat.add_rates(read(8, (0, 10, 400)), second, 0.5)
    assert restarted["interval_s"] is None and restarted["counters"][0]["rate_per_s"] is None
    text = format_counters(second).splitlines()
    assert text[0] == "driver pid 7 in /d: 2 counters, rates per second over the last 0.50 s"
    assert text[1].split() == ["id", "type", "value", "rate/s", "label"]
    assert text[2].split() == ["0", "0", "system", "350", "500", "c0"]
    assert text[3].split() == ["1", "0", "system", "9", "-", "c1"]
    plain = format_counters(read(7, (0, 10, 350))).splitlines()
    assert plain[0] == "driver pid 7 in /d: 1 counters" and "rate/s" not in plain[1]


# ---------------------------------------------------------------------- option types and formatting


def test_duration_and_size_round_trip_through_their_text() -> None:
    assert [format_duration(ns) for ns in (10_000_000_000, 1_500_000_000, 1_000, 7)] == ["10s", "1500ms", "1us", "7ns"]
    assert [format_size(n) for n in (64 << 20, 1 << 30, 1408, 0)] == ["64m", "1g", "1408", "0"]
    duration, size = Duration(), Size(1, 1 << 40)
    for text in ("10s", "500ms", "100us", "7ns"):
        assert format_duration(duration.convert(text, None, None)) == text
    for text in ("64k", "16m", "1g", "1408"):
        assert format_size(size.convert(text, None, None)) == text
    with pytest.raises(click.BadParameter):
        duration.convert("10", None, None)
    with pytest.raises(click.BadParameter):
        Size(1024, 4096, power_of_two=True).convert("3k", None, None)


def test_iso_utc() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert "invalid" in iso_utc(2**62)


def test_loss_sets_shows_and_heals_a_running_drivers_loss_injection(workspace: Path) -> None:
    """cluster-tool loss writes the driver's loss-injection counters (rates in
    % or ppm, a frame-type filter), shows them back, and --heal clears them."""
    directory = workspace / "node0"
    with running_driver(directory):
        document = tool_json(
            "loss", "--dir", str(directory), "--receive", "100%", "--send", "2500", "--frame-types", "data,sm"
        )
        assert (document["receive_ppm"], document["send_ppm"], document["frame_types"]) == (
            1_000_000,
            2500,
            ["data", "sm"],
        )
        counters = by_label(tool_json("counters", "--dir", str(directory)))
        assert counters["Loss injection: incoming datagrams dropped per million"]["value"] == 1_000_000
        shown = tool("loss", "--dir", str(directory))
        assert "receive   100% (1000000 ppm)" in shown.output and "frames    data, sm" in shown.output
        healed = tool_json("loss", "--dir", str(directory), "--heal")
        assert (healed["receive_ppm"], healed["send_ppm"], healed["frame_types"]) == (0, 0, "all")
        refused = tool("loss", "--dir", str(directory), "--send", "150%")
        assert refused.exit_code == 2 and "outside 0%..100%" in refused.output
        refused = tool("loss", "--dir", str(directory), "--frame-types", "bogus")
        assert refused.exit_code == 2 and "unknown frame type 'bogus'" in refused.output

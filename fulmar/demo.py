"""``make run`` (until the cluster exists): a media driver and two client
processes exchange messages over ``aeron:ipc`` while an archive process
records the stream; the recording is then replayed and checked.

Three processes: the media driver (cnc.dat, the conductor that owns the log
buffer and moves the publisher's flow-control limit), a subscriber and a
publisher, each a client of the driver.  The publisher sends messages of
mixed sizes (some longer than an MTU, sent as fragments); the subscriber
reassembles them and checks every byte and their order.  At the end the
publisher closes its publication, the subscriber sees the end of the
stream, and the driver's counters tell how often the publisher was held
back.  The archive (``cluster-node archive``) records the same stream to
segment files from the first message; once the stream has ended the demo
replays the recording and checks that it holds every message again.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from fulmar.aeron import Aeron
from fulmar.archive.client import AeronArchive, RecordingSignal
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED

CHANNEL = "aeron:ipc?term-length=1m"
STREAM_ID = 1001
POOL = random.Random(7).randbytes(1 << 20)
MAX_SIZE = 5000
DEADLINE_S = 120
SUBSCRIBER_READY = "subscriber.ready"


def payload_of(seq: int, rnd: random.Random) -> bytes:
    size = rnd.randint(1, 1376) if rnd.random() < 0.9 else rnd.randint(1377, MAX_SIZE)
    start = (seq * 7919) % (len(POOL) - MAX_SIZE)
    return POOL[start : start + size]


def run_publisher(directory: Path, messages: int) -> None:
    with Aeron.connect(directory) as aeron:
        publication = aeron.add_publication(CHANNEL, STREAM_ID)
        deadline = time.monotonic() + DEADLINE_S
        rnd = random.Random(1)
        crc = 0
        for seq in range(messages):
            payload = payload_of(seq, rnd)
            while True:
                result = publication.offer(payload, reserved_value=seq)
                if result > 0:
                    break
                if result not in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION):
                    raise SystemExit(f"publisher: offer failed with {result}")
                if time.monotonic() > deadline:
                    raise SystemExit("publisher: the subscriber made no progress")
                if result != ADMIN_ACTION:
                    os.sched_yield()
            crc = zlib.crc32(payload, crc)
        print(f"publisher pid {os.getpid()}: {messages:,} messages sent on session {publication.session_id}, "
              f"checksum {crc:08x}", flush=True)


def run_subscriber(directory: Path, messages: int) -> None:
    with Aeron.connect(directory) as aeron:
        subscription = aeron.add_subscription(CHANNEL, STREAM_ID)
        # The archive's subscription already makes the publication connected:
        # say when this one exists, so the publisher starts after it.
        (directory.parent / SUBSCRIBER_READY).touch()
        rnd = random.Random(1)
        stats = {"messages": 0, "bytes": 0, "fragmented": 0, "crc": 0}

        def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            seq = stats["messages"]
            expected = payload_of(seq, rnd)
            if header.reserved_value != seq or buffer[offset : offset + length] != expected:
                raise SystemExit(f"subscriber: message {seq} arrived wrong or out of order")
            stats["messages"] += 1
            stats["bytes"] += length
            stats["fragmented"] += length > 1376
            stats["crc"] = zlib.crc32(expected, stats["crc"])

        assembler = FragmentAssembler(on_message)
        deadline = time.monotonic() + DEADLINE_S
        start = 0.0
        while stats["messages"] < messages:
            if subscription.poll(assembler, 512) == 0:
                if time.monotonic() > deadline:
                    raise SystemExit("subscriber: timed out")
                os.sched_yield()
            elif not start:
                start = time.perf_counter()
        elapsed = time.perf_counter() - start
        image = subscription.images[0]
        # The publisher closes its publication when done: wait for the end of stream.
        while not image.is_end_of_stream and time.monotonic() < deadline:
            subscription.poll(assembler, 512)
            time.sleep(0.001)
        print(
            f"subscriber pid {os.getpid()}: {stats['messages']:,} messages ({stats['fragmented']:,} longer than "
            f"one MTU, reassembled from fragments), {stats['bytes'] / 1e6:.1f} MB in {elapsed:.2f} s: "
            f"{stats['messages'] / elapsed:,.0f} msgs/s, {stats['bytes'] / 1e6 / elapsed:.0f} MB/s; "
            f"checksum {stats['crc']:08x}; end of stream at position {image.position:,}",
            flush=True,
        )


def run_driver(directory: Path) -> None:
    from fulmar.driver.context import DriverContext
    from fulmar.driver.media_driver import run_driver as serve

    serve(
        DriverContext(directory=directory),
        on_ready=lambda driver: print(f"media driver pid {os.getpid()} serving {directory}", flush=True),
    )


def check_recording(recorder: AeronArchive, messages: int) -> None:
    """The publisher closed its publication: the recording stops at the end
    of the stream.  Replay it and check every message against what was sent."""
    stop = recorder.wait_for_signal(lambda s: s.signal == RecordingSignal.STOP, DEADLINE_S * 1_000_000_000)
    descriptor = recorder.list_recording(stop.recording_id)
    assert descriptor is not None
    print(f"archive: recording {stop.recording_id} of stream {descriptor.stream_id} ({descriptor.stripped_channel}) "
          f"stopped at position {stop.position:,}", flush=True)
    replay = recorder.replay(stop.recording_id, "aeron:ipc?term-length=1m", STREAM_ID + 1, 0, stop.position)
    rnd = random.Random(1)
    state = {"messages": 0, "crc": 0}

    def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        expected = payload_of(state["messages"], rnd)
        if buffer[offset : offset + length] != expected:
            raise SystemExit(f"replay: message {state['messages']} differs from what was sent")
        state["messages"] += 1
        state["crc"] = zlib.crc32(expected, state["crc"])

    assembler = FragmentAssembler(on_message)
    deadline = time.monotonic() + DEADLINE_S
    started = time.perf_counter()
    while state["messages"] < messages:
        if replay.poll(assembler, 512) == 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"replay: only {state['messages']:,} of {messages:,} messages came back")
            time.sleep(0.0005)
    elapsed = time.perf_counter() - started
    replay.close()
    print(f"archive: replayed {state['messages']:,} messages ({stop.position / 1e6:.1f} MB) in {elapsed:.2f} s, "
          f"all as sent; checksum {state['crc']:08x}", flush=True)


def counters_summary(directory: Path) -> list[str]:
    from fulmar.cnc import CncFile
    from fulmar.counters import CountersReader

    wanted = ("Errors", "Client liveness timeouts", "Active clients", "Commands received", "snd-bpe", "pub-pos")
    lines = []
    with CncFile.open(directory) as cnc:
        reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        for counter in reader:
            if counter.label.startswith(wanted):
                lines.append(f"  {counter.counter_id:>3}  {counter.label:<60} {reader.counter_value(counter.counter_id):>14,}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m fulmar.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--role", choices=["driver", "publisher", "subscriber"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "driver":
        run_driver(args.dir)
        return
    if args.role == "publisher":
        run_publisher(args.dir, args.messages)
        return
    if args.role == "subscriber":
        run_subscriber(args.dir, args.messages)
        return

    base = Path(tempfile.mkdtemp(prefix=f"fulmar-demo-{os.getpid()}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    directory = base / "driver"
    processes: list[subprocess.Popen[str]] = []

    def start(role: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "fulmar.demo", "--role", role, "--dir", str(directory), "--messages", str(args.messages)],
            text=True,
        )
        processes.append(process)
        return process

    try:
        driver = start("driver")
        deadline = time.monotonic() + 30
        while not (directory / "cnc.dat").exists():
            if driver.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the media driver did not start")
            time.sleep(0.01)
        archive = subprocess.Popen(
            [sys.executable, "-m", "fulmar.cli.cluster_node", "archive", "--dir", str(base / "archive"),
             "--driver-dir", str(directory), "--control-channel", "none", "--segment-length", "16m"],
            text=True,
        )
        processes.append(archive)
        with Aeron.connect(directory) as aeron:
            with AeronArchive.connect(aeron) as recorder:
                recorder.start_recording(CHANNEL, STREAM_ID)
                subscriber = start("subscriber")
                deadline = time.monotonic() + 30
                while not (base / SUBSCRIBER_READY).exists():
                    if subscriber.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("the subscriber did not start")
                    time.sleep(0.01)
                publisher = start("publisher")
                for process in (publisher, subscriber):
                    if process.wait(DEADLINE_S) != 0:
                        raise SystemExit(f"a client process failed with exit code {process.returncode}")
                check_recording(recorder, args.messages)
        archive.send_signal(signal.SIGTERM)
        if archive.wait(30) != 0:
            raise SystemExit(f"the archive stopped with exit code {archive.returncode}")
        print("driver counters:")
        print("\n".join(counters_summary(directory)))
        driver.send_signal(signal.SIGTERM)
        driver.wait(30)
        removed = not directory.exists()
        print(f"driver stopped with exit code {driver.returncode}; its directory {'was removed' if removed else 'remains'}")
        if driver.returncode != 0 or not removed:
            raise SystemExit(1)
        print("every message arrived once, in order, intact")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

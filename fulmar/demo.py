"""``make run`` (until the cluster exists): two processes exchange messages
through one shared, memory-mapped log buffer and say what happened.

The parent creates the log buffer and a flow-control word in /dev/shm,
starts a publisher process, and reads.  The publisher appends messages of
mixed sizes (some longer than an MTU, so they travel as several fragments)
and stops when the reader's window is full; the reader reassembles them,
checks every byte and its order, zeroes what it consumed and moves the
publisher's limit on, as the media driver will do for a real publication.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from fulmar.buffers import MappedFile
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header, LogReader
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, ConcurrentLogWriter
from fulmar.logbuffer import LogBuffers

TERM_LENGTH = 1024 * 1024
WINDOW = TERM_LENGTH // 2
POOL = random.Random(7).randbytes(1 << 20)
MAX_SIZE = 5000


def payload_of(seq: int, rnd: random.Random) -> bytes:
    size = rnd.randint(1, 1376) if rnd.random() < 0.9 else rnd.randint(1377, MAX_SIZE)
    start = (seq * 7919) % (len(POOL) - MAX_SIZE)
    return POOL[start : start + size]


def publish(directory: Path, messages: int) -> None:
    log = LogBuffers.open(directory / "demo.logbuffer")
    limit = MappedFile.open(directory / "limit").buffer()
    publication = ConcurrentLogWriter(log, limit, 0)
    rnd = random.Random(1)
    back_pressured = 0
    crc = 0
    deadline = time.monotonic() + 120
    for seq in range(messages):
        payload = payload_of(seq, rnd)
        while True:
            result = publication.offer(payload, reserved_value=seq)
            if result > 0:
                break
            if result == BACK_PRESSURED:
                back_pressured += 1
                if time.monotonic() > deadline:
                    raise SystemExit("publisher: reader made no progress for too long")
                os.sched_yield()
            elif result != ADMIN_ACTION:
                raise SystemExit(f"publisher: offer failed with {result}")
        crc = zlib.crc32(payload, crc)
    print(json.dumps({"pid": os.getpid(), "back_pressured": back_pressured, "crc": crc}), flush=True)


def subscribe(directory: Path, messages: int, publisher: subprocess.Popen[str]) -> dict[str, int]:
    log = LogBuffers.open(directory / "demo.logbuffer")
    limit = MappedFile.open(directory / "limit").buffer()
    reader = LogReader(log)
    rnd = random.Random(1)
    stats = {"messages": 0, "bytes": 0, "fragmented": 0, "crc": 0}

    def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        seq = stats["messages"]
        expected = payload_of(seq, rnd)
        if header.reserved_value != seq or buffer[offset : offset + length] != expected:
            raise SystemExit(f"subscriber: message {seq} arrived wrong or out of order")
        stats["messages"] += 1
        stats["bytes"] += length
        stats["fragmented"] += length > log.max_payload_length
        stats["crc"] = zlib.crc32(expected, stats["crc"])

    assembler = FragmentAssembler(on_message)
    clean_position = 0
    deadline = time.monotonic() + 120
    while stats["messages"] < messages:
        if reader.poll(assembler, 512) == 0:
            if publisher.poll() not in (None, 0):
                raise SystemExit(f"publisher exited with {publisher.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit("subscriber: timed out")
            os.sched_yield()
        if reader.position > clean_position:
            log.clean(clean_position, reader.position)
            clean_position = reader.position
            limit.put_int64_ordered(0, clean_position + WINDOW)
    stats["position"] = reader.position
    stats["terms"] = reader.position // TERM_LENGTH
    log.close()
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m fulmar.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--publish", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        publish(Path(args.publish), args.messages)
        return

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = Path(tempfile.mkdtemp(prefix=f"fulmar-demo-{os.getpid()}-", dir=shm))
    publisher: subprocess.Popen[str] | None = None
    try:
        log = LogBuffers.create(directory / "demo.logbuffer", TERM_LENGTH, session_id=42, stream_id=1001)
        log.is_connected = True
        log.close()
        with MappedFile.create(directory / "limit", 4096) as limit_file:
            limit_file.buffer().put_int64_ordered(0, WINDOW)
        print(f"log buffer {directory / 'demo.logbuffer'}: 3 terms of {TERM_LENGTH // 1024} KiB, MTU 1408")
        start = time.perf_counter()
        publisher = subprocess.Popen(
            [sys.executable, "-m", "fulmar.demo", "--publish", str(directory), "--messages", str(args.messages)],
            stdout=subprocess.PIPE,
            text=True,
        )
        stats = subscribe(directory, args.messages, publisher)
        out, _ = publisher.communicate(timeout=60)
        elapsed = time.perf_counter() - start
        report = json.loads(out.strip().splitlines()[-1])
        print(f"publisher pid {report['pid']} -> subscriber pid {os.getpid()}")
        print(
            f"{stats['messages']:,} messages ({stats['fragmented']:,} longer than one MTU, sent as fragments), "
            f"{stats['bytes'] / 1e6:.1f} MB in {elapsed:.2f} s: {stats['messages'] / elapsed:,.0f} msgs/s, "
            f"{stats['bytes'] / 1e6 / elapsed:.0f} MB/s"
        )
        print(
            f"stream position {stats['position']:,}: {stats['terms']:,} term rotations; "
            f"the publisher was back-pressured {report['back_pressured']:,} times"
        )
        same = report["crc"] == stats["crc"]
        print(f"checksum publisher {report['crc']:08x} subscriber {stats['crc']:08x}: {'match' if same else 'DIFFER'}")
        if not same:
            raise SystemExit(1)
        print("every message arrived once, in order, intact")
    finally:
        if publisher is not None and publisher.poll() is None:
            publisher.kill()
            publisher.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()

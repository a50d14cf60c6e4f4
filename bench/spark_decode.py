"""Decoding a recorded cluster log: the C decoder read sequentially, a plain
pure-Python read, and the Spark data source ``fulmar-log`` on 1 and 2 cores.

The log is real: a one-node cluster (``bench.cluster.Node``, EchoService)
sequences N messages of 32 bytes sent by ``bench.cluster.throughput``
(window 1000; N = 5,000,000, quick 200,000), then stops in order, so the
archive's catalog holds the recording's stop position.  The archive
directory is the bench's own (under /var/tmp), kept past the node's close
for the reads and removed at the end.

Segment length: the cluster's default archive segment (128 MiB) would hold
the full run's log (about 96 bytes a message: 32-byte frame header, 8-byte
SBE header, 24-byte session header, 32-byte payload; 480 MB) in 4 files,
the quick run's in 1, and one file is one Spark partition.  The archive is
given 64 MiB segments in full runs (8 files: 4 tasks per core with
``local[2]``, so one late task leaves little idle) and 16 MiB in quick runs
(the least possible: the log's term length; 2 files).

Each read is of the same recording, after an untimed sequential read that
counts its messages (at least N, or the bench fails) and warms the page
cache.  Rows per second count the log's messages (the N session messages
plus the cluster's own: session open, new leadership term...); MB/s counts
the log's bytes (recording stop position minus start), 10^6 bytes per MB.

- sequential: ``read_log(archive_dir)``, every Arrow batch consumed;
- pure Python: the segment files' frames walked with ``struct``, each
  message's SBE header read and its fields decoded by the generated codecs
  (``fulmar.codecs.generated.cluster``), a session message's payload copied
  out: every message, as the other reads (at about 1M messages a second it
  takes seconds even in full runs);
- Spark: a fresh ``spark_session("local[1]")`` (then ``local[2]``), the
  whole log read into the ``noop`` sink (every column of every row goes
  through the source) once untimed, then timed; the session is stopped
  after.  Its reference is the sequential read (``local[2]``'s is
  ``local[1]``: the ratio is the scaling from 1 to 2 cores).  The machine
  has 2 cores, shared by the JVM and its Python workers.
"""

from __future__ import annotations

import mmap
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster import DISK_PARENT, Node, throughput
from fulmar.aeron import Aeron
from fulmar.analytics.log_decoder import LogSegment, find_log_segments, read_log
from fulmar.archive.catalog import NULL_POSITION, Catalog
from fulmar.codecs.generated import cluster as cluster_codecs
from fulmar.consensus.protocol import LOG_STREAM_ID
from fulmar.frames import BEGIN_FLAG, END_FLAG, FRAME_ALIGNMENT, HEADER_LENGTH, UNFRAGMENTED, FrameType

FULL_MESSAGES = 5_000_000
QUICK_MESSAGES = 200_000
PAYLOAD_SIZE = 32
WINDOW = 1000
FULL_SEGMENT_LENGTH = 64 * 1024 * 1024
QUICK_SEGMENT_LENGTH = 16 * 1024 * 1024  # the cluster log's term length: the least an archive accepts
MB = 1e6

_FRAME_START = struct.Struct("<iBBH")  # frame length, version, flags, type
_SBE_HEADER = struct.Struct("<HHHH")  # block length, template id, schema id, version
_SESSION_HEADER_LENGTH = cluster_codecs.HEADER_LENGTH + cluster_codecs.SessionMessageHeaderDecoder.BLOCK_LENGTH


@dataclass(frozen=True)
class RecordedLog:
    recording_s: float
    segments: list[LogSegment]
    log_bytes: int  # stop minus start position of every log recording


def _record(archive_dir: Path, count: int, segment_length: int) -> float:
    """Seconds to send ``count`` messages through a one-node cluster whose archive records into ``archive_dir``."""
    node = Node(archive_dir=archive_dir, archive_segment_length=segment_length)
    try:
        with Aeron.connect(node.driver_dir) as aeron:
            return throughput(aeron, node, PAYLOAD_SIZE, WINDOW, count)
    except Exception as error:
        raise RuntimeError(f"bench.spark_decode: recording failed: {error}\n{node.log_tails()}") from error
    finally:
        node.close()


def _recorded_log(archive_dir: Path, recording_s: float) -> RecordedLog:
    catalog = Catalog.open_read_only(str(archive_dir))
    try:
        recordings = [d for d in catalog.recordings() if d.stream_id == LOG_STREAM_ID]
    finally:
        catalog.close()
    if not recordings:
        raise AssertionError(f"bench.spark_decode: no log recording (stream {LOG_STREAM_ID}) in {archive_dir}")
    unstopped = [d.recording_id for d in recordings if d.stop_position == NULL_POSITION]
    if unstopped:
        raise AssertionError(
            f"bench.spark_decode: log recording(s) {unstopped} have no stop position after the node's orderly stop"
        )
    segments = find_log_segments([archive_dir])
    log_bytes = sum(d.stop_position - d.start_position for d in recordings)
    return RecordedLog(recording_s, segments, log_bytes)


def _sequential_read(archive_dir: Path) -> tuple[int, float]:
    """(messages, seconds) of ``read_log``, every batch consumed."""
    rows = 0
    start = time.perf_counter()
    for batch in read_log(str(archive_dir)):
        rows += batch.num_rows
    return rows, time.perf_counter() - start


def _pure_python_read(segments: Sequence[LogSegment]) -> tuple[int, float]:
    """(messages, seconds) decoding every message with struct and the generated codecs."""
    decoders = {template_id: decoder_class() for template_id, decoder_class in cluster_codecs.DECODERS.items()}
    schema_id = cluster_codecs.SCHEMA_ID
    data_type = FrameType.DATA
    alignment_mask = FRAME_ALIGNMENT - 1
    payloads = 0

    def decode(buffer: Any, offset: int, length: int) -> None:
        nonlocal payloads
        block_length, template_id, message_schema, version = _SBE_HEADER.unpack_from(buffer, offset)
        decoder = decoders.get(template_id) if message_schema == schema_id else None
        if decoder is None:
            return  # another schema or an unknown template: counted, not decoded (as the C decoder does)
        body = offset + cluster_codecs.HEADER_LENGTH
        decoder.wrap(buffer, body, block_length, version, length - cluster_codecs.HEADER_LENGTH)
        if template_id == 1:
            payloads += len(buffer[offset + _SESSION_HEADER_LENGTH : offset + length])

    messages = 0
    start = time.perf_counter()
    for segment in segments:
        with open(segment.path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as memory:
            offset, end = segment.start_offset, segment.end_offset
            fragments: bytearray | None = None
            while offset < end:
                frame_length, _, flags, frame_type = _FRAME_START.unpack_from(memory, offset)
                if frame_length < HEADER_LENGTH:
                    raise AssertionError(
                        f"bench.spark_decode: {segment.path}: frame length {frame_length} at file "
                        f"offset {offset}, below the recording's stop"
                    )
                if frame_type == data_type:
                    data = offset + HEADER_LENGTH
                    if flags & UNFRAGMENTED == UNFRAGMENTED:
                        decode(memory, data, frame_length - HEADER_LENGTH)
                        messages += 1
                    elif flags & BEGIN_FLAG:
                        fragments = bytearray(memory[data : offset + frame_length])
                    elif fragments is not None:
                        fragments += memory[data : offset + frame_length]
                        if flags & END_FLAG:
                            decode(fragments, 0, len(fragments))
                            messages += 1
                            fragments = None
                offset += (frame_length + alignment_mask) & ~alignment_mask
    elapsed = time.perf_counter() - start
    if payloads == 0:
        raise AssertionError("bench.spark_decode: the pure-Python read decoded no session message")
    return messages, elapsed


def _spark_read_s(master: str, archive_dir: Path, messages: int) -> float:
    """Seconds of the whole log into Spark's ``noop`` sink, in a fresh session (after one untimed run)."""
    from fulmar.analytics.session import spark_session, stop_spark

    spark = spark_session(master, "fulmar-bench-spark-decode")
    try:

        def read_all() -> float:
            start = time.perf_counter()
            spark.read.format("fulmar-log").load(str(archive_dir)).write.format("noop").mode("overwrite").save()
            return time.perf_counter() - start

        read_all()
        elapsed = read_all()
        # Untimed: Spark saw the same messages as the sequential read.
        rows = spark.read.format("fulmar-log").load(str(archive_dir)).count()
        if rows != messages:
            raise AssertionError(
                f"bench.spark_decode: Spark ({master}) read {rows} rows, the sequential read {messages}"
            )
        return elapsed
    finally:
        stop_spark(spark)


def _row(name: str, value: float, unit: str, reference: float | None = None) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "reference": reference, "reference_kind": "read"}


def run(quick: bool) -> list[dict[str, Any]]:
    count = QUICK_MESSAGES if quick else FULL_MESSAGES
    segment_length = QUICK_SEGMENT_LENGTH if quick else FULL_SEGMENT_LENGTH
    work = Path(tempfile.mkdtemp(prefix="fulmar-bench-spark-", dir=DISK_PARENT))
    try:
        archive_dir = work / "archive"
        log = _recorded_log(archive_dir, _record(archive_dir, count, segment_length))
        messages, _ = _sequential_read(archive_dir)  # untimed: the count, and the page cache warmed
        if messages < count:
            raise AssertionError(f"bench.spark_decode: the log holds {messages} messages, {count} were sent")
        print(
            f"bench.spark_decode: log of {messages:,} messages ({count:,} of {PAYLOAD_SIZE} B sent), "
            f"{log.log_bytes:,} bytes in {len(log.segments)} segment files of {segment_length // (1 << 20)} MiB; "
            f"recorded in {log.recording_s:.1f} s ({count / log.recording_s:,.0f} msgs/s); {archive_dir}",
            flush=True,
        )

        rows, sequential_s = _sequential_read(archive_dir)
        if rows != messages:
            raise AssertionError(f"bench.spark_decode: sequential reads gave {messages} then {rows} messages")
        sequential = messages / sequential_s

        python_rows, python_s = _pure_python_read(log.segments)
        if python_rows != messages:
            raise AssertionError(
                f"bench.spark_decode: the pure-Python read found {python_rows} messages, the C decoder {messages}"
            )

        local1_s = _spark_read_s("local[1]", archive_dir, messages)
        local2_s = _spark_read_s("local[2]", archive_dir, messages)
        local1 = messages / local1_s
        local2 = messages / local2_s
        return [
            _row("spark_decode sequential read_log (C decoder)", sequential, "rows/s"),
            _row(
                "spark_decode pure-Python read (struct + codecs; vs sequential)",
                messages / python_s,
                "rows/s",
                sequential,
            ),
            _row("spark_decode Spark local[1] (vs sequential)", local1, "rows/s", sequential),
            _row("spark_decode Spark local[2] (vs local[1])", local2, "rows/s", local1),
            _row("spark_decode sequential read_log MB/s", log.log_bytes / sequential_s / MB, "MB/s"),
            _row(
                "spark_decode Spark local[2] MB/s (vs sequential)",
                log.log_bytes / local2_s / MB,
                "MB/s",
                log.log_bytes / sequential_s / MB,
            ),
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    for result in run("--quick" in sys.argv):
        print(f"{result['name']}: {result['value']:,.2f} {result['unit']}")

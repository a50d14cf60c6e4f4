#!/usr/bin/env python3
"""Regenerate the seed files of every fuzz target: ``tests/fuzz/corpus/<target>/seed-*``.

Each seed is a valid input built by encoding real messages or writing real
files with fulmar's own writers, so the fuzzers start from deep inside the
parsers.  Deterministic: running it twice writes the same bytes.  Files the
fuzzers found (named by their SHA-1) are left alone; stale ``seed-*`` files
are removed first.

Run: .venv/bin/python tests/fuzz/make_seed_corpus.py
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fulmar import frames
from fulmar.archive.catalog import CATALOG_FILE_NAME, Catalog
from fulmar.codecs.generate import GroupDef, MessageDef, load_all
from fulmar.consensus.recording_log import RECORDING_LOG_FILE_NAME, RecordingLog
from fulmar.log_writer import ExclusiveLogWriter
from fulmar.logbuffer import LogBuffers

CORPUS = Path(__file__).resolve().parent / "corpus"


def _fields(owner: MessageDef | GroupDef, rich: bool, depth: int = 0) -> dict[str, Any]:
    """Every member present: non-trivial values (``rich``) or zeros and empty groups/var data."""
    fields: dict[str, Any] = {}
    for i, f in enumerate(owner.fields):
        if f.is_array:
            fields[f.py] = bytes(range(1, f.size + 1)) if rich else bytes(f.size)
        elif f.enum:
            fields[f.py] = f.enum.values[-1][1] if rich else f.enum.values[0][1]
        else:
            fields[f.py] = min(f.primitive.hi, 1000 + i) if rich else max(f.primitive.lo, 0)
    for g in owner.groups:
        fields[g.py] = [_fields(g, rich, depth + 1), _fields(g, rich, depth + 1)] if rich else []
    for j, v in enumerate(owner.var_data):
        if not rich:
            fields[v.py] = "" if v.ascii else b""
        else:
            fields[v.py] = (
                "aeron:udp?endpoint=x:1"[: 3 + (j + depth) % 20] if v.ascii else bytes(range(1 + (j + depth) % 7))
            )
    return fields


def codec_seeds(schema_module: str) -> dict[str, bytes]:
    schema = next(s for s in load_all() if s.module == schema_module)
    module: Any = importlib.import_module(f"fulmar.codecs.generated.{schema_module}")
    ids = sorted(module.DECODERS)
    seeds: dict[str, bytes] = {}
    variants = (True,) if len(schema.messages) > 10 else (True, False)
    for message in schema.messages:
        for rich in variants:
            buf = bytearray(8192)
            length = module.ENCODERS[message.id].encode_fields(buf, 0, _fields(message, rich))
            # first byte: the harness's template selector
            seeds[f"{message.name}-{'rich' if rich else 'empty'}"] = bytes([ids.index(message.id)]) + bytes(
                buf[:length]
            )
    return seeds


def frame_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}

    def make(name: str, encode: Callable[..., int], **kwargs: Any) -> None:
        buf = bytearray(1024)
        length = encode(buf, 0, **kwargs)
        seeds[name] = bytes(buf[:length])

    make(
        "setup",
        frames.encode_setup,
        term_offset=64,
        session_id=7,
        stream_id=1001,
        initial_term_id=3,
        active_term_id=5,
        term_length=65536,
        mtu_length=1408,
        ttl=4,
    )
    make(
        "sm",
        frames.encode_status_message,
        session_id=7,
        stream_id=1001,
        consumption_term_id=5,
        consumption_term_offset=4096,
        receiver_window=131072,
        receiver_id=99,
    )
    make(
        "sm-group-tag",
        frames.encode_status_message,
        session_id=7,
        stream_id=1001,
        consumption_term_id=5,
        consumption_term_offset=4096,
        receiver_window=131072,
        receiver_id=99,
        group_tag=12,
    )
    make("nak", frames.encode_nak, session_id=7, stream_id=1001, term_id=5, term_offset=1024, length=4096)
    make(
        "rttm",
        frames.encode_rttm,
        session_id=7,
        stream_id=1001,
        echo_timestamp_ns=123456789,
        reception_delta_ns=1000,
        receiver_id=99,
    )
    make(
        "err",
        frames.encode_error,
        session_id=7,
        stream_id=1001,
        receiver_id=99,
        error_code=1,
        error_message="no such stream",
        group_tag=3,
    )
    make("rsp-setup", frames.encode_response_setup, session_id=7, stream_id=1001, response_session_id=8)
    make("heartbeat", frames.encode_heartbeat, session_id=7, stream_id=1001, term_id=5, term_offset=2048)
    datagram = bytearray()
    for i, size in enumerate((1, 40, 100)):
        frame_length = frames.HEADER_LENGTH + size
        datagram += frames.DataHeader(
            frame_length, frames.CURRENT_VERSION, 0xC0, int(frames.FrameType.DATA), len(datagram), 7, 1001, 5
        ).encode()
        datagram += bytes([i]) * size + bytes(frames.align(frame_length, frames.FRAME_ALIGNMENT) - frame_length)
    seeds["data-3-frames"] = bytes(datagram)
    return seeds


def log_scanner_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in (
            ("small", [0, 1, 31, 32, 33, 100]),
            ("fragmented", [3000, 5000]),
            ("many", list(range(0, 400, 13))),
        ):
            log = LogBuffers.create(Path(tmp) / f"{name}.logbuffer", 64 * 1024, session_id=1, stream_id=2)
            try:
                writer = ExclusiveLogWriter(log)
                for i, size in enumerate(sizes):
                    writer.offer(bytes([i & 0xFF]) * size)
                view = log.view
                end = len(bytes(view[: 64 * 1024]).rstrip(b"\0")) + 32
                seeds[name] = bytes(view[:end])
            finally:
                log.close()
    # a padding frame to the end of a term, then data in the next
    pad = frames.DataHeader(64 * 1024 - 64, frames.CURRENT_VERSION, 0xC0, int(frames.FrameType.PAD), 64, 1, 2, 0)
    data = frames.DataHeader(40, frames.CURRENT_VERSION, 0xC0, int(frames.FrameType.DATA), 0, 1, 2, 0)
    first = frames.DataHeader(64, frames.CURRENT_VERSION, 0xC0, int(frames.FrameType.DATA), 0, 1, 2, 0)
    seeds["pad-then-next-term"] = (
        first.encode() + bytes(32) + pad.encode() + bytes(64 * 1024 - 96) + data.encode() + b"x" * 8
    )
    return seeds


def log_decode_seeds() -> dict[str, bytes]:
    """Terms of a cluster log: the six log messages, one fragmented, then a pad."""
    from fulmar.codecs.generated import cluster as codecs

    def encoded(encoder: Any, tail: bytes = b"", **fields: Any) -> bytes:
        buf = bytearray(512)
        return bytes(buf[: encoder.encode(buf, 0, **fields)]) + tail

    messages = [
        encoded(
            codecs.NewLeadershipTermEventEncoder,
            leadership_term_id=0,
            log_position=0,
            timestamp=1,
            term_base_log_position=0,
            leader_member_id=1,
            log_session_id=7,
            time_unit=0,
        ),
        encoded(
            codecs.SessionOpenEventEncoder,
            leadership_term_id=0,
            correlation_id=3,
            cluster_session_id=1,
            timestamp=2,
            response_stream_id=102,
            response_channel="aeron:udp?endpoint=127.0.0.1:0",
        ),
        encoded(codecs.SessionMessageHeaderEncoder, b"+", leadership_term_id=0, cluster_session_id=1, timestamp=3),
        encoded(
            codecs.SessionMessageHeaderEncoder, b"x" * 3000, leadership_term_id=0, cluster_session_id=1, timestamp=4
        ),
        encoded(codecs.TimerEventEncoder, leadership_term_id=0, correlation_id=1, timestamp=5),
        encoded(
            codecs.ClusterActionRequestEncoder, leadership_term_id=0, log_position=4096, timestamp=6, action=2, flags=0
        ),
        encoded(
            codecs.SessionCloseEventEncoder, leadership_term_id=0, cluster_session_id=1, timestamp=7, close_reason=0
        ),
    ]
    seeds: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log = LogBuffers.create(Path(tmp) / "log.logbuffer", 64 * 1024, session_id=1, stream_id=100)
        try:
            writer = ExclusiveLogWriter(log)
            for message in messages:
                writer.offer(message)
            view = log.view
            end = len(bytes(view[: 64 * 1024]).rstrip(b"\0"))
            seeds["messages"] = bytes(view[: (end + 31) & ~31])
        finally:
            log.close()
    return seeds


def channel_uri_seeds() -> dict[str, bytes]:
    uris = {
        "ipc": "aeron:ipc",
        "ipc-params": "aeron:ipc?term-length=64k|mtu=8k|alias=log|sparse=true|tether=false",
        "udp-unicast": "aeron:udp?endpoint=localhost:40123|interface=127.0.0.1/8|ttl=4|reliable=true",
        "udp-mdc": "aeron:udp?control=10.0.0.1:40456|control-mode=dynamic|fc=tagged,g:7/3,t:5s|gtag=7",
        "udp-ipv6": "aeron:udp?endpoint=[::1]:40123|session-id=tag:5|linger=10ms|so-sndbuf=2m",
        "spy": "aeron-spy:aeron:udp?endpoint=239.1.1.1:40124|eos=false|rejoin=true|group=true",
        "initial-position": "aeron:udp?endpoint=host-1.example:1|init-term-id=3|term-id=5|term-offset=64|term-length=65536",
        "misc": "aeron:udp?endpoint=a:1|cc=cubic|rcv-wnd=128k|response-correlation-id=42|max-resend=3|ssc=true|tags=1,2",
        "response": "aeron:udp?control-mode=response|control=127.0.0.1:10001",
    }
    return {name: text.encode() for name, text in uris.items()}


def recording_log_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with RecordingLog.open(directory, fsync=False) as log:
            log.append_term(1, 0, 0, 1000)
            seeds["one-open-term"] = (directory / RECORDING_LOG_FILE_NAME).read_bytes()
            log.append_snapshot(2, 0, 0, 4096, 1100, 0)
            log.append_snapshot(3, 0, 0, 4096, 1100, -1)
            log.commit_log_position(0, 8192)
            log.append_term(1, 1, 8192, 2000)
            log.append_snapshot(4, 1, 8192, 9216, 2100, -1)
            seeds["terms-and-snapshots"] = (directory / RECORDING_LOG_FILE_NAME).read_bytes()
            log.append_standby_snapshot(5, 1, 8192, 10240, 2200, -1, "node-2:8010")
            log.invalidate_latest_snapshot()
            seeds["standby-and-invalid"] = (directory / RECORDING_LOG_FILE_NAME).read_bytes()
    return seeds


def catalog_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with Catalog.open(directory, capacity_bytes=32) as catalog:
            seeds["empty"] = (directory / CATALOG_FILE_NAME).read_bytes()
        with Catalog.open(directory, capacity_bytes=32) as catalog:
            for i in range(3):
                catalog.add_recording(
                    0,
                    1000 + i,
                    5,
                    128 * 1024 * 1024,
                    64 * 1024,
                    1408,
                    7 + i,
                    1001,
                    "aeron:udp?endpoint=localhost:40123",
                    "aeron:udp?endpoint=localhost:40123|alias=rec",
                    "127.0.0.1:40123",
                )
            catalog.update_stop(0, 4096, 2000)
            catalog.update_recorded_position(1, 2048)
            catalog.invalidate(2)
        data = (directory / CATALOG_FILE_NAME).read_bytes()
        end = 32  # past the header, then entry by entry up to the zero length that ends the list
        while int.from_bytes(data[end : end + 4], "little"):
            end += 32 + int.from_bytes(data[end : end + 4], "little")
        seeds["three-recordings"] = data[: end + 32]
    return seeds


def _codec_target(schema_module: str) -> Callable[[], dict[str, bytes]]:
    return lambda: codec_seeds(schema_module)


TARGETS: dict[str, Callable[[], dict[str, bytes]]] = {
    **{f"codec_{m}": _codec_target(m) for m in ("cluster", "archive", "driver", "cluster_mark", "archive_mark")},
    "frames": frame_seeds,
    "log_scanner": log_scanner_seeds,
    "log_decode": log_decode_seeds,
    "channel_uri": channel_uri_seeds,
    "recording_log": recording_log_seeds,
    "catalog": catalog_seeds,
}


def main() -> None:
    for target, make in TARGETS.items():
        directory = CORPUS / target
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("seed-*"):
            stale.unlink()
        seeds = make()
        for name, data in seeds.items():
            (directory / f"seed-{name}").write_bytes(data)
        print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()

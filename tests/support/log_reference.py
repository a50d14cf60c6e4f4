"""A plain-Python decoder of a recorded cluster log, the oracle for the C one
(``fulmar.analytics.log_decoder``), and a writer of synthetic segments.

The reference walks frames one by one with ``struct``, reassembles
fragments in a ``bytearray`` and decodes each message with the generated
codecs (``wrap_and_apply_header``): none of the C decoder's code.
"""

from __future__ import annotations

import struct
from typing import Any

from fulmar.codecs.generated import cluster as codecs

FRAME = struct.Struct("<iBBHiiiiq")  # length, version, flags, type, term offset, session, stream, term id, reserved
HEADER_LENGTH = 32
BEGIN, END = 0x80, 0x40
PAD, DATA = 0, 1

_DECODERS = {
    d.TEMPLATE_ID: d
    for d in (
        codecs.SessionMessageHeaderDecoder,
        codecs.SessionOpenEventDecoder,
        codecs.SessionCloseEventDecoder,
        codecs.TimerEventDecoder,
        codecs.ClusterActionRequestDecoder,
        codecs.NewLeadershipTermEventDecoder,
    )
}
_NAMES = {template_id: d.NAME for template_id, d in codecs.DECODERS.items()}


def _enum_name(enum: Any, raw: int) -> str:
    try:
        return str(enum(raw).name)
    except ValueError:
        return f"UNKNOWN_{raw}"


def decode_message(message: bytes) -> dict[str, Any]:
    """The columns of one whole message (no positions)."""
    row: dict[str, Any] = {
        "template_id": -1,
        "message_type": "Unknown",
        "leadership_term_id": None,
        "cluster_session_id": None,
        "correlation_id": None,
        "timestamp": None,
        "leader_member_id": None,
        "time_unit": None,
        "cluster_action": None,
        "close_reason": None,
        "payload": message,
    }
    if len(message) < 8:
        return row
    block_length, template_id, schema_id, _version = struct.unpack_from("<HHHH", message)
    row["template_id"] = template_id
    if schema_id != codecs.SCHEMA_ID:
        return row
    row["message_type"] = _NAMES.get(template_id, "Unknown")
    decoder_class = _DECODERS.get(template_id)
    if decoder_class is None:
        return row
    # Each template's decoder has its own fields: the branches below read those of theirs.
    d: Any = decoder_class().wrap_and_apply_header(message, 0, len(message))
    row["leadership_term_id"] = d.leadership_term_id
    row["timestamp"] = d.timestamp
    if template_id == codecs.SessionMessageHeaderDecoder.TEMPLATE_ID:
        row["cluster_session_id"] = d.cluster_session_id
        row["payload"] = message[32:]
    elif template_id == codecs.TimerEventDecoder.TEMPLATE_ID:
        row["correlation_id"] = d.correlation_id
    elif template_id == codecs.SessionOpenEventDecoder.TEMPLATE_ID:
        row["correlation_id"] = d.correlation_id
        row["cluster_session_id"] = d.cluster_session_id
    elif template_id == codecs.SessionCloseEventDecoder.TEMPLATE_ID:
        row["cluster_session_id"] = d.cluster_session_id
        row["close_reason"] = _enum_name(codecs.CloseReason, struct.unpack_from("<i", message, 8 + 24)[0])
    elif template_id == codecs.ClusterActionRequestDecoder.TEMPLATE_ID:
        row["cluster_action"] = _enum_name(codecs.ClusterAction, struct.unpack_from("<i", message, 8 + 24)[0])
    elif template_id == codecs.NewLeadershipTermEventDecoder.TEMPLATE_ID:
        row["leader_member_id"] = d.leader_member_id
        row["time_unit"] = _enum_name(codecs.ClusterTimeUnit, struct.unpack_from("<i", message, 8 + 40)[0])
    return row


def reference_rows(data: bytes, segment_base: int, start: int, end: int) -> list[dict[str, Any]]:
    """Every whole message of ``data[start:end]`` (a segment file), frame by frame."""
    rows = []
    offset = start
    pending: bytearray | None = None
    first = 0
    fragments = 0
    while offset < end:
        length, _version, flags, frame_type = struct.unpack_from("<iBBH", data, offset)
        if length == 0:
            break
        aligned = (length + 31) & ~31
        if frame_type == PAD:
            offset += aligned
            continue
        body = data[offset + HEADER_LENGTH : offset + length]
        if flags & BEGIN:
            pending, first, fragments = bytearray(), offset, 0
        assert pending is not None, f"a fragment without a begin at {offset}"
        pending += body
        fragments += 1
        offset += aligned
        if flags & END:
            row = decode_message(bytes(pending))
            row.update(
                log_position=segment_base + first,
                next_position=segment_base + offset,
                fragments=fragments,
                payload_length=len(row["payload"]),
            )
            rows.append(row)
            pending = None
    return rows


# ----------------------------------------------------------------------------- synthetic segments


def frame(flags: int, payload: bytes, term_offset: int, frame_type: int = DATA) -> bytes:
    header = FRAME.pack(HEADER_LENGTH + len(payload), 0, flags, frame_type, term_offset, 7, 100, 0, 0)
    raw = header + payload
    return raw + bytes(((len(raw) + 31) & ~31) - len(raw))


def write_messages(messages: list[bytes], term_length: int, max_payload: int, terms: int) -> bytes:
    """A segment of ``terms`` terms holding ``messages``, fragmented to ``max_payload``
    bytes, a PAD frame where a message does not fit in what is left of a term
    (as a log appender does); the rest zeros."""
    out = bytearray(term_length * terms)
    position = 0
    for message in messages:
        chunks = [message[i : i + max_payload] for i in range(0, len(message), max_payload)] or [b""]
        needed = sum((HEADER_LENGTH + len(c) + 31) & ~31 for c in chunks)
        term_offset = position % term_length
        if term_offset + needed > term_length:
            pad_length = term_length - term_offset
            out[position : position + HEADER_LENGTH] = FRAME.pack(
                pad_length, 0, BEGIN | END, PAD, term_offset, 7, 100, 0, 0
            )
            position += pad_length
        if position + needed > len(out):
            raise ValueError("the messages do not fit in the segment")
        for index, chunk in enumerate(chunks):
            flags = (BEGIN if index == 0 else 0) | (END if index == len(chunks) - 1 else 0)
            raw = frame(flags, chunk, position % term_length)
            out[position : position + len(raw)] = raw
            position += len(raw)
    return bytes(out)

"""A service container told to join a log (``join_log``), over a real media driver."""

from __future__ import annotations

from fulmar.codecs.generated import cluster as codecs
from support.driver import wait_for

LOG_STREAM_ID = 100


def join_log(publication: object, channel: str, session_id: int) -> None:
    buffer = bytearray(1024)
    length = codecs.JoinLogEncoder.encode(
        buffer,
        0,
        log_position=0,
        max_log_position=-1,
        member_id=0,
        log_session_id=session_id,
        log_stream_id=LOG_STREAM_ID,
        is_startup=codecs.BooleanType.FALSE,
        role=0,
        log_channel=channel,
    )
    wait_for(lambda: publication.offer(bytes(buffer[:length])) > 0, 10, "the JoinLog to be sent")  # type: ignore[attr-defined]

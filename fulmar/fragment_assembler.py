"""Reassembles messages that were split into fragments (BEGIN ... END)."""

from __future__ import annotations

from fulmar.frames import BEGIN_FLAG, END_FLAG, UNFRAGMENTED
from fulmar.log_reader import FragmentHandler, Header


class FragmentAssembler:
    """Wraps a fragment handler so it only ever sees whole messages.

    Unfragmented messages pass straight through (no copy).  Fragments of a
    larger message are copied into a per-session buffer and the handler is
    called once with the whole message when the END fragment arrives; the
    header passed then is the END fragment's.
    """

    def __init__(self, handler: FragmentHandler, initial_capacity: int = 4096) -> None:
        self._handler = handler
        self._initial_capacity = initial_capacity
        self._builders: dict[int, bytearray] = {}

    def on_fragment(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        flags = header.flags
        if flags & UNFRAGMENTED == UNFRAGMENTED:
            self._handler(buffer, offset, length, header)
            return
        session_id = header.session_id
        if flags & BEGIN_FLAG:
            builder = self._builders.get(session_id)
            if builder is None:
                builder = self._builders[session_id] = bytearray()
            builder.clear()
            builder += buffer[offset : offset + length]
            return
        builder = self._builders.get(session_id)
        if builder is None or not builder:
            return  # a middle or end without its beginning (joined mid-message): drop it
        builder += buffer[offset : offset + length]
        if flags & END_FLAG:
            message = memoryview(builder)
            try:
                self._handler(message, 0, len(builder), header)
            finally:
                message.release()
                builder.clear()

    __call__ = on_fragment

    def free_session_buffer(self, session_id: int) -> None:
        """Forget a session's partial message (its image went away)."""
        self._builders.pop(session_id, None)

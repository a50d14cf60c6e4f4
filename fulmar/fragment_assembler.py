"""Reassembles messages that were split into fragments (BEGIN ... END)."""

from __future__ import annotations

from collections.abc import Callable

from fulmar.frames import BEGIN_FLAG, END_FLAG, UNFRAGMENTED
from fulmar.log_reader import FragmentHandler, Header
from fulmar.logbuffer import compute_max_message_length

# (publication session id, bytes gathered when dropped, the limit it passed)
DroppedMessageHandler = Callable[[int, int, int], None]


class FragmentAssembler:
    """Wraps a fragment handler so it only ever sees whole messages.

    Unfragmented messages pass straight through (no copy).  Fragments of a
    larger message are copied into a per-session buffer and the handler is
    called once with the whole message when the END fragment arrives; the
    header passed then is the END fragment's.

    A message may be no longer than the max message length of its image's
    term length (term length / 8, at most 16 MiB), as no honest publisher can
    offer a longer one.  A message that grows past it (a hostile or broken
    publisher sending a BEGIN and then middle fragments without end) is
    dropped as soon as it does, with the rest of its fragments, so that the
    memory it takes stays bounded; ``dropped_messages`` counts them and
    ``on_dropped`` (if given) hears of each.
    """

    def __init__(
        self, handler: FragmentHandler, initial_capacity: int = 4096, on_dropped: DroppedMessageHandler | None = None
    ) -> None:
        self._handler = handler
        self._initial_capacity = initial_capacity
        self._on_dropped = on_dropped
        self._builders: dict[int, bytearray] = {}
        self.dropped_messages = 0

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
            return  # a middle or end without its beginning (joined mid-message, or dropped): drop it
        max_length = compute_max_message_length(header.term_length)
        if len(builder) + length > max_length:
            gathered = len(builder) + length
            # A new bytearray, not clear(): the oversized buffer's memory goes back now.
            self._builders[session_id] = bytearray()
            self.dropped_messages += 1
            if self._on_dropped is not None:
                self._on_dropped(session_id, gathered, max_length)
            return
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

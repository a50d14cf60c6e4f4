"""Loss injection: drop a seeded fraction of the datagrams a driver sends and
receives, per frame type, switchable while the driver runs.

Aeron does this with loss generators wrapped around its channel endpoints
(``DebugSendChannelEndpoint`` / ``DebugReceiveChannelEndpoint`` in Java, the
``loss`` interceptor with ``rate``, ``seed`` and ``recv-msg-mask`` in C).
fulmar keeps the knobs in driver counters instead of configuration, so that a
tool or a test partitions a running node by writing counter values in its
cnc.dat: no restart, no command protocol.

* ``receive_rate`` and ``send_rate``: parts per million of the selected
  datagrams to drop; 0 drops nothing, 1_000_000 drops everything (a
  partition).
* ``frame_type_mask``: bit ``1 << frame_type`` selects a frame type (DATA is
  bit 1, SM bit 3, ...); 0 selects every datagram.  Datagrams whose type has
  no bit (EXT, or bytes that are not an Aeron frame) are selected only by 0.

Decisions come from ``random.Random`` seeded from ``seed``, one generator per
direction, so the receiving and sending sides (different agents, perhaps
different threads) never perturb each other's sequence: the same seed and the
same traffic drop the same datagrams.  A rate of 0 costs one counter read.
"""

from __future__ import annotations

import random
from typing import Protocol

PARTS_PER_MILLION = 1_000_000
# Bits a mask can hold for frame types 0..62 (an int64 counter, sign bit unused).
_MAX_MASKED_TYPE = 62


class CounterValue(Protocol):
    """What the injector reads its settings from: an ``AtomicCounter`` in
    the driver, a small stand-in in unit tests."""

    def get(self) -> int: ...


class LossInjector:
    """Decides, datagram by datagram, whether to drop it, and counts drops."""

    __slots__ = (
        "_receive_rate",
        "_send_rate",
        "_frame_type_mask",
        "_incoming_random",
        "_outgoing_random",
        "dropped_incoming",
        "dropped_outgoing",
    )

    def __init__(
        self, receive_rate: CounterValue, send_rate: CounterValue, frame_type_mask: CounterValue, seed: int
    ) -> None:
        self._receive_rate = receive_rate
        self._send_rate = send_rate
        self._frame_type_mask = frame_type_mask
        # String seeds are hashed with SHA-512 by random.Random: the same in
        # every process, whatever PYTHONHASHSEED says.
        self._incoming_random = random.Random(f"{seed}/incoming")
        self._outgoing_random = random.Random(f"{seed}/outgoing")
        self.dropped_incoming = 0
        self.dropped_outgoing = 0

    def dropping_incoming(self) -> bool:
        """Whether any received datagram may be dropped now: lets a batch skip
        the per-datagram checks when loss is off."""
        return self._receive_rate.get() > 0

    def dropping_outgoing(self) -> bool:
        return self._send_rate.get() > 0

    def drop_incoming(self, frame_type: int | None) -> bool:
        """Whether to drop a received datagram whose first frame has this type
        (None: not an Aeron frame)."""
        rate = self._receive_rate.get()
        if rate <= 0 or not self._selects(frame_type):
            return False
        if rate < PARTS_PER_MILLION and self._incoming_random.random() * PARTS_PER_MILLION >= rate:
            return False
        self.dropped_incoming += 1
        return True

    def drop_outgoing(self, frame_type: int | None) -> bool:
        """Whether to drop a datagram about to be sent (the network lost it)."""
        rate = self._send_rate.get()
        if rate <= 0 or not self._selects(frame_type):
            return False
        if rate < PARTS_PER_MILLION and self._outgoing_random.random() * PARTS_PER_MILLION >= rate:
            return False
        self.dropped_outgoing += 1
        return True

    def _selects(self, frame_type: int | None) -> bool:
        mask = self._frame_type_mask.get()
        if mask == 0:
            return True
        if frame_type is None or not 0 <= frame_type <= _MAX_MASKED_TYPE:
            return False
        return bool(mask & (1 << frame_type))


def frame_type_mask(*frame_types: int) -> int:
    """The mask value selecting these frame types (``FrameType.DATA``, ...)."""
    mask = 0
    for frame_type in frame_types:
        if not 0 <= frame_type <= _MAX_MASKED_TYPE:
            raise ValueError(f"frame type {frame_type} has no bit in a loss mask (0..{_MAX_MASKED_TYPE})")
        mask |= 1 << frame_type
    return mask

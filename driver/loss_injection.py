"""Loss injection's knobs: drop a seeded fraction of the datagrams a driver
sends and receives, per frame type, switchable while the driver runs.

Aeron does this with loss generators wrapped around its channel endpoints
(``DebugSendChannelEndpoint`` / ``DebugReceiveChannelEndpoint`` in Java, the
``loss`` interceptor with ``rate``, ``seed`` and ``recv-msg-mask`` in C).
fulmar keeps the knobs in driver counters instead of configuration, so that a
tool or a test partitions a running node by writing counter values in its
cnc.dat: no restart, no command protocol.  The driver's data plane reads them
on every datagram (``driver/native/loss.h``).

* ``LOSS_RECEIVE_RATE_PPM`` and ``LOSS_SEND_RATE_PPM``: parts per million of
  the selected datagrams to drop; 0 drops nothing, 1_000_000 drops
  everything (a partition).
* ``LOSS_FRAME_TYPE_MASK``: bit ``1 << frame_type`` selects a frame type
  (DATA is bit 1, SM bit 3, ...); 0 selects every datagram.  Datagrams whose
  type has no bit (EXT, or bytes that are not an Aeron frame) are selected
  only by 0.

Decisions come from one seeded generator per direction (the driver's
``loss_seed``), so one direction never perturbs the other's sequence: the
same seed and the same traffic drop the same datagrams.
"""

from __future__ import annotations

from fulmar._native import lib

PARTS_PER_MILLION = int(lib.FULMAR_LOSS_PARTS_PER_MILLION)
# Bits a mask can hold for frame types 0..62 (an int64 counter, sign bit unused).
_MAX_MASKED_TYPE = 62


def frame_type_mask(*frame_types: int) -> int:
    """The mask value selecting these frame types (``FrameType.DATA``, ...)."""
    mask = 0
    for frame_type in frame_types:
        if not 0 <= frame_type <= _MAX_MASKED_TYPE:
            raise ValueError(f"frame type {frame_type} has no bit in a loss mask (0..{_MAX_MASKED_TYPE})")
        mask |= 1 << frame_type
    return mask

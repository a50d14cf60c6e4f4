"""The leader's ingress thread (``consensus/native/leader_ingress.h``).

Every request starts with the leader's module: a client's message lands in
the ingress and the module appends it to the log behind a session header
(this term, the session, the cluster time).  Done by the agent, that is a
wake-up of the Python module at the head of every round trip.  The thread
sleeps on a doorbell that the ingress subscription names (``doorbell-id``)
and appends the open sessions' messages itself, while the agent sleeps: the
agent arms it as it goes to sleep, a steady active leader with nothing of
the ingress left over, and halts it first thing in its next cycle, taking
back the images' positions and the sessions' activity.  So the log's
exclusive writer has one writer at a time.  While not armed the thread
passes each ring of its doorbell on to the agent's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fulmar._native import ffi, lib
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.protocol import field_offset
from fulmar.reader_doorbells import THREAD_DOORBELL_TYPE_ID

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.publication import ExclusivePublication
    from fulmar.subscription import Image

IDLE = int(lib.FULMAR_LEADER_INGRESS_IDLE)
RUNNING = int(lib.FULMAR_LEADER_INGRESS_RUNNING)
NEEDS_AGENT = int(lib.FULMAR_LEADER_INGRESS_NEEDS_AGENT)
OTHER_MESSAGE = int(lib.FULMAR_LEADER_INGRESS_OTHER_MESSAGE)
BACK_PRESSURE = int(lib.FULMAR_LEADER_INGRESS_BACK_PRESSURE)
REASONS = {
    OTHER_MESSAGE: "an ingress message other than a session message or keep-alive of an open session",
    int(lib.FULMAR_LEADER_INGRESS_BAD_FRAME): "a malformed frame in the ingress",
    BACK_PRESSURE: "the log refused an append for now",
    int(lib.FULMAR_LEADER_INGRESS_PUBLICATION): "the log publication closed or reached its maximum position",
}

_TERM_OFFSET = field_offset(codecs._SESSION_MESSAGE_HEADER_LAYOUT, "leadershipTermId")
_SESSION_OFFSET = field_offset(codecs._SESSION_MESSAGE_HEADER_LAYOUT, "clusterSessionId")
_TIMESTAMP_OFFSET = field_offset(codecs._SESSION_MESSAGE_HEADER_LAYOUT, "timestamp")
# The thread reads a keep-alive's term and session where a session message has them.
assert field_offset(codecs._SESSION_KEEP_ALIVE_LAYOUT, "leadershipTermId") == _TERM_OFFSET
assert field_offset(codecs._SESSION_KEEP_ALIVE_LAYOUT, "clusterSessionId") == _SESSION_OFFSET


@dataclass(frozen=True)
class IngressState:
    status: int
    reason: int
    image_positions: tuple[int, ...]
    activity_ns: tuple[int, ...]  # each armed session's last activity, 0 for none


class LeaderIngressThread:
    """The thread, and the doorbell it sleeps on (a counter of the module's
    client, which the ingress subscription names)."""

    def __init__(self, aeron: Aeron, agent_doorbell_id: int) -> None:
        self._counter = aeron.add_counter(THREAD_DOORBELL_TYPE_ID, f"consensus-ingress-doorbell: {aeron.client_id}")
        self.doorbell_id = self._counter.id
        values = aeron.conductor.cnc.counters_values
        handle = lib.fulmar_leader_ingress_start(
            ffi.cast("char *", values.address), values.capacity, self.doorbell_id, agent_doorbell_id
        )
        if handle == ffi.NULL:
            self._counter.close()
            raise OSError(ffi.errno, f"cannot start the leader's ingress thread: errno {ffi.errno}")
        self._handle = handle
        arm = ffi.new("fulmar_leader_ingress_arm_t *")
        arm.schema_id = codecs.SCHEMA_ID
        arm.session_message_template_id = codecs.SessionMessageHeaderEncoder.TEMPLATE_ID
        arm.session_message_block_length = codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH
        arm.session_header_length = codecs.HEADER_LENGTH + codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH
        arm.leadership_term_id_offset = _TERM_OFFSET
        arm.cluster_session_id_offset = _SESSION_OFFSET
        arm.timestamp_offset = _TIMESTAMP_OFFSET
        arm.keep_alive_template_id = codecs.SessionKeepAliveEncoder.TEMPLATE_ID
        arm.keep_alive_block_length = codecs.SessionKeepAliveEncoder.BLOCK_LENGTH
        arm.keep_alive_length = codecs.HEADER_LENGTH + codecs.SessionKeepAliveEncoder.BLOCK_LENGTH
        self._arm = arm
        self._state = ffi.new("fulmar_leader_ingress_state_t *")
        self._images_buffer = ffi.new("fulmar_leader_ingress_image_t[]", 1)
        self._sessions_buffer = ffi.new("int64_t[]", 1)
        self._positions_buffer = ffi.new("int64_t[]", 1)
        self._activity_buffer = ffi.new("int64_t[]", 1)
        # While armed: what the thread reads and appends to (kept mapped).
        self.images: tuple[Image, ...] = ()
        self.session_ids: tuple[int, ...] = ()
        self._publication: ExclusivePublication | None = None

    @property
    def is_armed(self) -> bool:
        return self._publication is not None

    def arm(
        self,
        images: Sequence[Image],
        session_ids: Sequence[int],
        log_publication: ExclusivePublication,
        *,
        leadership_term_id: int,
        invalid_requests_id: int,
    ) -> None:
        """Take the ingress from now on: the images from their positions now,
        the open sessions' messages appended to ``log_publication``.  Until
        :meth:`halt` the agent must neither poll the images nor append to
        the log."""
        self.halt()
        ids = sorted(session_ids)
        if len(images) > len(self._images_buffer):
            self._images_buffer = ffi.new("fulmar_leader_ingress_image_t[]", len(images))
            self._positions_buffer = ffi.new("int64_t[]", len(images))
        if len(ids) > len(self._sessions_buffer):
            self._sessions_buffer = ffi.new("int64_t[]", len(ids))
            self._activity_buffer = ffi.new("int64_t[]", len(ids))
        for i, image in enumerate(images):
            slot = self._images_buffer[i]
            slot.log = ffi.cast("char *", image.log.address)
            slot.term_length = image.term_buffer_length
            slot.subscriber_position_id = image.subscriber_position_id
            slot.position = image.position
        self._sessions_buffer[0 : len(ids)] = ids
        arm = self._arm
        arm.log_writer = log_publication.native_writer
        arm.leadership_term_id = leadership_term_id
        arm.invalid_requests_id = invalid_requests_id
        if (
            lib.fulmar_leader_ingress_arm(
                self._handle, arm, self._images_buffer, len(images), self._sessions_buffer, len(ids)
            )
            < 0
        ):
            raise ValueError(
                f"the ingress thread refused its arming ({len(images)} images, {len(ids)} sessions, "
                f"invalid-requests counter {invalid_requests_id})"
            )
        self.images = tuple(images)
        self.session_ids = tuple(ids)
        self._publication = log_publication

    def halt(self) -> IngressState | None:
        """Halt the thread; what it reached (None if it was not armed).  The
        images' readers take the positions the thread reached."""
        if self._handle is None or self._publication is None:
            return None
        images, sessions = len(self.images), len(self.session_ids)
        lib.fulmar_leader_ingress_halt(
            self._handle, self._state, self._positions_buffer, images, self._activity_buffer, sessions
        )
        state = IngressState(
            status=int(self._state.status),
            reason=int(self._state.reason),
            image_positions=tuple(self._positions_buffer[0:images]),
            activity_ns=tuple(self._activity_buffer[0:sessions]),
        )
        for image, position in zip(self.images, state.image_positions):
            if position > image.position:
                image.adopt_position(position)
        self.images = ()
        self.session_ids = ()
        self._publication = None
        return state

    def status(self) -> int:
        """IDLE, RUNNING or NEEDS_AGENT (cheaper than :meth:`counts`)."""
        return int(lib.fulmar_leader_ingress_status(self._handle))

    def counts(self) -> dict[str, int]:
        """What the thread did, all in all (and the last refusal's code)."""
        state = self._state
        lib.fulmar_leader_ingress_state(self._handle, state)
        return {
            "messages": int(state.messages),
            "keep_alives": int(state.keep_alives),
            "invalid": int(state.invalid),
            "refused": int(state.refused),
            "relayed": int(state.relayed),
            "armings": int(state.armings),
            "last_failure": int(state.last_failure),
        }

    def close(self) -> None:
        if self._handle is not None:
            self.halt()
            lib.fulmar_leader_ingress_stop(self._handle)
            self._handle = None
            self._counter.close()

"""The follower's AppendPosition thread (``consensus/native/append_position.h``).

A follower reports to its leader how far its archive has recorded the log;
the leader commits on those reports, so each one is a hop of every round
trip.  The agent's own report meant a wake-up of the Python module after the
archive's recording, the longest module hop of the round trip.  The thread
sleeps on a doorbell of its own that watches the log recording's rec-pos
counter, and appends the AppendPosition itself.  The agent arms it once it
is a steady follower, asks it for the heartbeat, and halts it before it
sends anything of the term's end (an election, a step down, the close).
In a cluster with a secret it is armed with the process's member auth
context, and signs each report for the leader.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fulmar._native import ffi, lib
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.protocol import field_offset
from fulmar.reader_doorbells import THREAD_DOORBELL_TYPE_ID, CounterWatch

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.consensus.member_auth import MemberAuth
    from fulmar.publication import Publication

IDLE = int(lib.FULMAR_APPEND_POSITION_IDLE)
RUNNING = int(lib.FULMAR_APPEND_POSITION_RUNNING)
NEEDS_AGENT = int(lib.FULMAR_APPEND_POSITION_NEEDS_AGENT)

# The AppendPosition encoded by the agent: the thread writes the position at
# the logPosition field (after the message header) of each copy it sends.
_POSITION_OFFSET = field_offset(codecs._APPEND_POSITION_LAYOUT, "logPosition")


class AppendPositionSender:
    """The thread, and the doorbell it sleeps on (a counter of the module's
    client, which the rec-pos counter's watchers name while it is armed)."""

    def __init__(self, aeron: Aeron, agent_doorbell_id: int, retry_wait_ns: int) -> None:
        self._counter = aeron.add_counter(
            THREAD_DOORBELL_TYPE_ID, f"consensus-append-position-doorbell: {aeron.client_id}"
        )
        self.doorbell_id = self._counter.id
        values = aeron.conductor.cnc.counters_values
        self._watch = CounterWatch(values, self.doorbell_id)
        handle = lib.fulmar_append_position_start(
            ffi.cast("char *", values.address), values.capacity, self.doorbell_id, agent_doorbell_id, retry_wait_ns
        )
        if handle == ffi.NULL:
            self._counter.close()
            raise OSError(ffi.errno, f"cannot start the AppendPosition thread: errno {ffi.errno}")
        self._handle = handle
        self._arm = ffi.new("fulmar_append_position_arm_t *")
        self._state = ffi.new("fulmar_append_position_state_t *")
        self._encoded = bytearray(codecs.HEADER_LENGTH + codecs.AppendPositionEncoder.BLOCK_LENGTH)
        # While armed: the publication whose log the thread appends to (kept
        # open and mapped), and the counter its doorbell watches.
        self._publication: Publication | None = None
        self._watched_counter_id: int | None = None
        # The auth context the thread signs with, kept alive while it may.
        self._auth: MemberAuth | None = None

    @property
    def is_armed(self) -> bool:
        return self._publication is not None

    def arm(
        self,
        publication: Publication,
        recording_position_id: int,
        recording_position_registration_id: int,
        *,
        leadership_term_id: int,
        follower_member_id: int,
        sent_position: int,
        sent_time_ns: int,
        auth: MemberAuth | None = None,
        leader_member_id: int | None = None,
    ) -> bool:
        """Report rec-pos to the leader from now on, on ``publication`` (a
        concurrent one: the agent offers on it too), each report signed for
        ``leader_member_id`` with ``auth`` when given.  False when the
        counter has no free watcher slot: the thread would not be woken, the
        agent goes on reporting."""
        if auth is not None and leader_member_id is None:
            raise ValueError("a signed AppendPosition needs the leader's member id (its trailer's receiver)")
        self.halt()
        if not self._watch.watch(recording_position_id):
            return False
        self._watched_counter_id = recording_position_id
        length = codecs.AppendPositionEncoder.encode(
            self._encoded,
            0,
            leadership_term_id=leadership_term_id,
            log_position=0,
            follower_member_id=follower_member_id,
            flags=0,
        )
        arm = self._arm
        arm.writer = publication.native_writer[0]
        arm.recording_position_id = recording_position_id
        arm.recording_position_registration_id = recording_position_registration_id
        arm.sent_position = sent_position
        arm.sent_time_ns = sent_time_ns
        arm.message_length = length
        arm.position_offset = _POSITION_OFFSET
        ffi.memmove(arm.message, bytes(self._encoded[:length]), length)
        arm.auth = auth.handle if auth is not None else ffi.NULL
        arm.leader_member_id = leader_member_id if leader_member_id is not None else -1
        if lib.fulmar_append_position_arm(self._handle, arm) < 0:
            raise ValueError(
                f"the AppendPosition thread refused its arming (message of {length} bytes, "
                f"rec-pos counter {recording_position_id})"
            )
        self._publication = publication
        self._auth = auth
        return True

    def halt(self) -> None:
        """The thread sends nothing more (and is done with the publication
        and the counter) once this returns."""
        if self._handle is None:
            return
        lib.fulmar_append_position_halt(self._handle)
        self._publication = None
        self._auth = None
        if self._watched_counter_id is not None:
            self._watch.unwatch(self._watched_counter_id)
            self._watched_counter_id = None

    def send_now(self, unless_sent_since_ns: int | None = None) -> None:
        """An AppendPosition of the recorded position, even if sent before (a
        heartbeat), unless the thread sends one at or after
        ``unless_sent_since_ns`` (time.monotonic_ns; default: now): the
        agent passes the time it looked, so a report the thread made while
        the agent decided is not followed by a second of the same position."""
        since_ns = time.monotonic_ns() if unless_sent_since_ns is None else unless_sent_since_ns
        lib.fulmar_append_position_send_now(self._handle, since_ns)

    def state(self) -> tuple[int, int, int]:
        """(status, the position last sent, when: time.monotonic_ns)."""
        state = self._state
        lib.fulmar_append_position_state(self._handle, state)
        return int(state.status), int(state.sent_position), int(state.sent_time_ns)

    def status(self) -> int:
        """IDLE, RUNNING or NEEDS_AGENT (cheaper than :meth:`state`)."""
        return int(lib.fulmar_append_position_status(self._handle))

    def counts(self) -> tuple[int, int, int]:
        """(AppendPositions sent, offers refused, the last refusal's code or 0)."""
        state = self._state
        lib.fulmar_append_position_state(self._handle, state)
        return int(state.sent), int(state.refused), int(state.last_failure)

    def close(self) -> None:
        if self._handle is not None:
            self.halt()
            lib.fulmar_append_position_stop(self._handle)
            self._handle = None
            self._counter.close()

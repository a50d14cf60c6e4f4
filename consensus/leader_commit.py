"""The consensus module's commit thread (``consensus/native/leader_commit.h``),
a leader's or a follower's.

A leader commits when a quorum of its members has recorded the log: on the
followers' AppendPositions.  The agent's own commit meant a wake-up of the
Python module for each report, in the middle of every round trip.  The
thread sleeps on a doorbell that the module's consensus subscription names
(``doorbell-id``), reads the AppendPositions from the subscription's images,
stores commit-pos (rung to the services) and sends the followers their
CommitPosition.  The agent arms it once it is a steady leader, syncs its own
view from the thread's state on each of its cycles, asks it for the
heartbeat, and halts it before anything else reads the consensus stream
(an election, a message that is not an AppendPosition, a new image).  While
not armed, the thread passes each ring of its doorbell on to the agent's.

A follower commits what its leader says is committed, once its own archive
has recorded it and its module has read it from the log: on each of the
leader's CommitPositions, a wake-up of the relay and of the Python module on
each follower per commit, on the cores the leader's service and driver need
to answer the client.  Armed as a follower's (``arm_follower``), the thread
reads the CommitPositions and the log's client messages, and moves
commit-pos; anything else in either stream it hands back.

In a cluster with a secret both arms take the process's member auth context:
the thread checks the trailer of each AppendPosition (a leader's) or
CommitPosition (a follower's) before it reads it, and hands back one that
fails (the agent's guard refuses it, counts it and logs it); a leader's
signs each CommitPosition for its follower.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fulmar._native import ffi, lib
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.protocol import field_offset
from fulmar.reader_doorbells import THREAD_DOORBELL_TYPE_ID

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.consensus.member_auth import MemberAuth
    from fulmar.publication import Publication
    from fulmar.subscription import Image

IDLE = int(lib.FULMAR_LEADER_COMMIT_IDLE)
RUNNING = int(lib.FULMAR_LEADER_COMMIT_RUNNING)
NEEDS_AGENT = int(lib.FULMAR_LEADER_COMMIT_NEEDS_AGENT)
OTHER_MESSAGE = int(lib.FULMAR_LEADER_COMMIT_OTHER_MESSAGE)
MAX_IMAGES = int(lib.FULMAR_LEADER_COMMIT_MAX_IMAGES)
MAX_FOLLOWERS = int(lib.FULMAR_LEADER_COMMIT_MAX_FOLLOWERS)
REASONS = {
    int(lib.FULMAR_LEADER_COMMIT_OTHER_MESSAGE): "a consensus message other than AppendPosition",
    int(lib.FULMAR_LEADER_COMMIT_BAD_FRAME): "a malformed frame in the consensus stream",
    int(lib.FULMAR_LEADER_COMMIT_RECORDING_GONE): "the log recording's rec-pos counter went",
    int(lib.FULMAR_LEADER_COMMIT_PUBLICATION): "a publication to a follower closed",
    int(lib.FULMAR_LEADER_COMMIT_LOG_MESSAGE): "a log entry other than a client's message",
}
LOG_MESSAGE = int(lib.FULMAR_LEADER_COMMIT_LOG_MESSAGE)


_TERM_OFFSET = field_offset(codecs._APPEND_POSITION_LAYOUT, "leadershipTermId")
_APPEND_POSITION_OFFSET = field_offset(codecs._APPEND_POSITION_LAYOUT, "logPosition")
_MEMBER_OFFSET = field_offset(codecs._APPEND_POSITION_LAYOUT, "followerMemberId")
_APPEND_POSITION_LENGTH = _MEMBER_OFFSET + 4  # flags (since version 8) is not read
_COMMIT_POSITION_OFFSET = field_offset(codecs._COMMIT_POSITION_LAYOUT, "logPosition")
_COMMIT_TERM_OFFSET = field_offset(codecs._COMMIT_POSITION_LAYOUT, "leadershipTermId")
_COMMIT_LEADER_OFFSET = field_offset(codecs._COMMIT_POSITION_LAYOUT, "leaderMemberId")
_COMMIT_POSITION_LENGTH = _COMMIT_LEADER_OFFSET + 4
_SESSION_ID_OFFSET = field_offset(codecs._SESSION_MESSAGE_HEADER_LAYOUT, "clusterSessionId")


@dataclass
class ArmedFollower:
    member_id: int
    publication: Publication
    log_position: int
    time_ns: int


@dataclass(frozen=True)
class CommitState:
    status: int
    reason: int
    commit_position: int
    sent_position: int
    sent_time_ns: int
    follower_positions: tuple[int, ...]
    follower_times_ns: tuple[int, ...]
    image_positions: tuple[int, ...]


@dataclass(frozen=True)
class FollowerCommitState:
    status: int
    reason: int
    notified_commit_position: int
    commit_position: int
    leader_time_ns: int
    log_position: int
    image_positions: tuple[int, ...]


class CommitThread:
    """The thread, and the doorbell it sleeps on (a counter of the module's
    client, which the consensus subscription names)."""

    def __init__(self, aeron: Aeron, agent_doorbell_id: int) -> None:
        self._counter = aeron.add_counter(THREAD_DOORBELL_TYPE_ID, f"consensus-commit-doorbell: {aeron.client_id}")
        self.doorbell_id = self._counter.id
        values = aeron.conductor.cnc.counters_values
        handle = lib.fulmar_leader_commit_start(
            ffi.cast("char *", values.address), values.capacity, self.doorbell_id, agent_doorbell_id
        )
        if handle == ffi.NULL:
            self._counter.close()
            raise OSError(ffi.errno, f"cannot start the leader's commit thread: errno {ffi.errno}")
        self._handle = handle
        self._arm = ffi.new("fulmar_leader_commit_arm_t *")
        self._state = ffi.new("fulmar_leader_commit_state_t *")
        self._encoded = bytearray(codecs.HEADER_LENGTH + codecs.CommitPositionEncoder.BLOCK_LENGTH)
        self._follower_arm = ffi.new("fulmar_follower_commit_arm_t *")
        # While armed: what the thread reads and appends to (kept mapped).
        self.images: tuple[Image, ...] = ()
        self.follower_ids: tuple[int, ...] = ()
        self._publications: tuple[Publication, ...] = ()
        self.log_image: Image | None = None  # a follower's
        self._armed_as_leader = False
        self._auth: MemberAuth | None = None  # kept alive while the thread may use it

    @property
    def is_armed(self) -> bool:
        return self._armed_as_leader or self.log_image is not None

    @property
    def is_armed_as_follower(self) -> bool:
        return self.log_image is not None

    def arm(
        self,
        images: Sequence[Image],
        followers: Sequence[ArmedFollower],
        *,
        leadership_term_id: int,
        leader_member_id: int,
        term_base_log_position: int,
        commit_position: int,
        sent_position: int,
        sent_time_ns: int,
        recording_position_id: int,
        recording_position_registration_id: int,
        commit_position_id: int,
        auth: MemberAuth | None = None,
    ) -> None:
        """Commit from now on.  The images are read from their positions now:
        the agent must not poll them until it halts the thread.  With no
        followers (and no images) it is a single member's: its own
        recording is committed as it is made.  With ``auth`` the
        AppendPositions are checked and the CommitPositions signed."""
        self.halt()
        if len(followers) > MAX_FOLLOWERS or len(images) > MAX_IMAGES:
            raise ValueError(
                f"the commit thread takes up to {MAX_FOLLOWERS} followers and {MAX_IMAGES} images, "
                f"not {len(followers)} and {len(images)}"
            )
        length = codecs.CommitPositionEncoder.encode(
            self._encoded,
            0,
            leadership_term_id=leadership_term_id,
            log_position=0,
            leader_member_id=leader_member_id,
        )
        arm = self._arm
        arm.image_count = len(images)
        arm.follower_count = len(followers)
        for i, image in enumerate(images):
            _image_slot(arm.images[i], image)
        for i, follower in enumerate(followers):
            slot = arm.followers[i]
            slot.writer = follower.publication.native_writer[0]
            slot.member_id = follower.member_id
            slot.log_position = follower.log_position
            slot.time_ns = follower.time_ns
        arm.leadership_term_id = leadership_term_id
        arm.term_base_log_position = term_base_log_position
        arm.commit_position = commit_position
        arm.sent_position = sent_position
        arm.sent_time_ns = sent_time_ns
        arm.recording_position_id = recording_position_id
        arm.recording_position_registration_id = recording_position_registration_id
        arm.commit_position_id = commit_position_id
        arm.schema_id = codecs.SCHEMA_ID
        arm.append_position_template_id = codecs.AppendPositionDecoder.TEMPLATE_ID
        arm.append_position_length = _APPEND_POSITION_LENGTH
        arm.append_position_block_length = codecs.AppendPositionDecoder.BLOCK_LENGTH
        arm.leadership_term_id_offset = _TERM_OFFSET
        arm.log_position_offset = _APPEND_POSITION_OFFSET
        arm.follower_member_id_offset = _MEMBER_OFFSET
        arm.message_length = length
        arm.position_offset = _COMMIT_POSITION_OFFSET
        ffi.memmove(arm.message, bytes(self._encoded[:length]), length)
        arm.auth = auth.handle if auth is not None else ffi.NULL
        if lib.fulmar_leader_commit_arm(self._handle, arm) < 0:
            raise ValueError(
                f"the commit thread refused its arming (rec-pos counter {recording_position_id}, "
                f"commit-pos counter {commit_position_id}, {len(images)} images)"
            )
        self.images = tuple(images)
        self.follower_ids = tuple(follower.member_id for follower in followers)
        self._armed_as_leader = True
        self._publications = tuple(follower.publication for follower in followers)
        self._auth = auth

    def arm_follower(
        self,
        images: Sequence[Image],
        log_image: Image,
        *,
        leadership_term_id: int,
        leader_member_id: int,
        notified_commit_position: int,
        commit_position: int,
        leader_time_ns: int,
        recording_position_id: int,
        recording_position_registration_id: int,
        commit_position_id: int,
        auth: MemberAuth | None = None,
    ) -> None:
        """Commit as a follower from now on.  The consensus images and the log
        image are read from their positions now: the agent must not poll them
        until it halts the thread.  With ``auth`` the CommitPositions are
        checked."""
        self.halt()
        if len(images) > MAX_IMAGES:
            raise ValueError(f"the commit thread takes up to {MAX_IMAGES} images, not {len(images)}")
        arm = self._follower_arm
        arm.image_count = len(images)
        for i, image in enumerate(images):
            _image_slot(arm.images[i], image)
        _image_slot(arm.log, log_image)
        arm.leadership_term_id = leadership_term_id
        arm.leader_member_id = leader_member_id
        arm.notified_commit_position = notified_commit_position
        arm.commit_position = commit_position
        arm.leader_time_ns = leader_time_ns
        arm.recording_position_id = recording_position_id
        arm.recording_position_registration_id = recording_position_registration_id
        arm.commit_position_id = commit_position_id
        arm.schema_id = codecs.SCHEMA_ID
        arm.commit_position_template_id = codecs.CommitPositionDecoder.TEMPLATE_ID
        arm.commit_position_length = _COMMIT_POSITION_LENGTH
        arm.commit_position_block_length = codecs.CommitPositionDecoder.BLOCK_LENGTH
        arm.leadership_term_id_offset = _COMMIT_TERM_OFFSET
        arm.log_position_offset = _COMMIT_POSITION_OFFSET
        arm.leader_member_id_offset = _COMMIT_LEADER_OFFSET
        arm.session_message_template_id = codecs.SessionMessageHeaderDecoder.TEMPLATE_ID
        arm.session_message_block_length = codecs.SessionMessageHeaderDecoder.BLOCK_LENGTH
        arm.cluster_session_id_offset = _SESSION_ID_OFFSET
        arm.auth = auth.handle if auth is not None else ffi.NULL
        if lib.fulmar_leader_commit_arm_follower(self._handle, arm) < 0:
            raise ValueError(
                f"the commit thread refused its arming as a follower's (rec-pos counter {recording_position_id}, "
                f"commit-pos counter {commit_position_id}, {len(images)} images)"
            )
        self.images = tuple(images)
        self.log_image = log_image
        self._auth = auth

    def halt(self) -> CommitState | None:
        """Halt the thread; its final state (None if it was not armed as a
        leader's).  The images' readers take the positions the thread reached."""
        if self._handle is None or not self._armed_as_leader:
            self.halt_follower()
            return None
        lib.fulmar_leader_commit_halt(self._handle)
        state = self.state()
        _adopt(self.images, state.image_positions)
        self.images = ()
        self.follower_ids = ()
        self._publications = ()
        self._armed_as_leader = False
        self._auth = None
        return state

    def halt_follower(self) -> FollowerCommitState | None:
        """Halt a follower's thread; its final state (None if it was not armed
        as a follower's).  The images' readers, the log's too, take the
        positions the thread reached."""
        log_image = self.log_image
        if self._handle is None or log_image is None:
            return None
        lib.fulmar_leader_commit_halt(self._handle)
        state = self.follower_state()
        _adopt(self.images, state.image_positions)
        _adopt((log_image,), (state.log_position,))
        self.images = ()
        self.log_image = None
        self._auth = None
        return state

    def send_now(self, unless_sent_since_ns: int | None = None) -> None:
        """A CommitPosition to every follower, even if sent before (a
        heartbeat), unless the thread sends one at or after
        ``unless_sent_since_ns`` (time.monotonic_ns; default: now)."""
        since_ns = time.monotonic_ns() if unless_sent_since_ns is None else unless_sent_since_ns
        lib.fulmar_leader_commit_send_now(self._handle, since_ns)

    def state(self) -> CommitState:
        state = self._state
        lib.fulmar_leader_commit_state(self._handle, state)
        followers = int(state.follower_count)
        images = int(state.image_count)
        return CommitState(
            status=int(state.status),
            reason=int(state.reason),
            commit_position=int(state.commit_position),
            sent_position=int(state.sent_position),
            sent_time_ns=int(state.sent_time_ns),
            follower_positions=tuple(state.follower_positions[0:followers]),
            follower_times_ns=tuple(state.follower_times_ns[0:followers]),
            image_positions=tuple(state.image_positions[0:images]),
        )

    def follower_state(self) -> FollowerCommitState:
        state = self._state
        lib.fulmar_leader_commit_state(self._handle, state)
        return FollowerCommitState(
            status=int(state.status),
            reason=int(state.reason),
            notified_commit_position=int(state.notified_commit_position),
            commit_position=int(state.commit_position),
            leader_time_ns=int(state.leader_time_ns),
            log_position=int(state.log_position),
            image_positions=tuple(state.image_positions[0 : int(state.image_count)]),
        )

    def status(self) -> int:
        """IDLE, RUNNING or NEEDS_AGENT (cheaper than :meth:`state`)."""
        return int(lib.fulmar_leader_commit_status(self._handle))

    def counts(self) -> dict[str, int]:
        """What the thread did, all in all (and the last refusal's code)."""
        state = self._state
        lib.fulmar_leader_commit_state(self._handle, state)
        return {
            "append_positions": int(state.append_positions),
            "commits": int(state.commits),
            "commit_positions_sent": int(state.commit_positions_sent),
            "refused": int(state.refused),
            "relayed": int(state.relayed),
            "commit_positions_read": int(state.commit_positions_read),
            "log_messages": int(state.log_messages),
            "unauthenticated": int(state.unauthenticated),
            "last_failure": int(state.last_failure),
        }

    def close(self) -> None:
        if self._handle is not None:
            self.halt()
            lib.fulmar_leader_commit_stop(self._handle)
            self._handle = None
            self._counter.close()


def _image_slot(slot: Any, image: Image) -> None:
    """An image as the thread reads it (a fulmar_leader_commit_image_t): its mapped log, from its position now."""
    slot.log = ffi.cast("char *", image.log.address)
    slot.term_length = image.term_buffer_length
    slot.subscriber_position_id = image.subscriber_position_id
    slot.position = image.position


def _adopt(images: Sequence[Image], positions: Sequence[int]) -> None:
    for image, position in zip(images, positions):
        if position > image.position:
            image.adopt_position(position)

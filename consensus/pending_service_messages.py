"""The messages the services offer to the cluster (Aeron's
PendingServiceMessageTracker): each gets the next service session id and
waits here until the leader appends it to the log; the log's own service
messages (a replay, a follower's live log) tell which of them it already
holds, so a service's re-offer is not appended twice.  A leader that steps
down before a quorum has them puts those it appended back in front."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

# Service session ids (for messages a service offers to the cluster) count up
# from here, far below any client session id.
SERVICE_SESSION_ID_BASE = -(2**63) + 1


class PendingServiceMessageTracker:
    def __init__(self) -> None:
        # The id the next offered message gets, less one; both ids are in the
        # module's snapshot (snapshot.py, consensus_module.py).
        self.next_service_session_id = SERVICE_SESSION_ID_BASE
        # The newest service session id the log holds.
        self.log_service_session_id = SERVICE_SESSION_ID_BASE - 1
        self.pending: deque[tuple[int, bytes]] = deque()  # (service session id, payload)
        # What a leader of several members appended and a quorum may not have yet.
        self.uncommitted: deque[tuple[int, int, bytes]] = deque()  # (log position, session id, payload)

    def __len__(self) -> int:
        return len(self.pending)

    def enqueue(self, payload: bytes) -> None:
        """A service offered a message to the cluster: it gets the next service
        session id.  During a replay the same messages come again; those the
        log already holds are dropped when the log shows them."""
        self.next_service_session_id += 1
        session_id = self.next_service_session_id
        if session_id > self.log_service_session_id:
            self.pending.append((session_id, payload))

    def append(self, append_message: Callable[[int, bytes], int], track_uncommitted: bool) -> int:
        """Append what waits to the log through ``append_message(session_id,
        payload)`` (the log position, or <= 0 when back pressured) until it
        refuses one; the messages appended."""
        work = 0
        pending = self.pending
        while pending:
            session_id, payload = pending[0]
            if session_id <= self.log_service_session_id:
                pending.popleft()
                continue
            position = append_message(session_id, payload)
            if position <= 0:
                break
            if track_uncommitted:
                self.uncommitted.append((position, session_id, payload))
            self.log_service_session_id = session_id
            pending.popleft()
            work += 1
        return work

    def on_log_service_message(self, cluster_session_id: int) -> None:
        """The log holds this service message (Aeron's sweepFollowerMessages)."""
        if cluster_session_id > self.log_service_session_id:
            self.log_service_session_id = cluster_session_id
        pending = self.pending
        while pending and pending[0][0] <= cluster_session_id:
            pending.popleft()

    def restore_uncommitted(self, commit_position: int) -> None:
        """A leader stepping down: what it appended beyond ``commit_position``
        waits again, in front, to be appended by whoever leads next (Aeron's
        restoreUncommittedMessages).  The caller clears ``uncommitted``."""
        restored = [
            (session_id, payload) for position, session_id, payload in self.uncommitted if position > commit_position
        ]
        if restored:
            self.pending.extendleft(reversed(restored))
            self.log_service_session_id = restored[0][0] - 1

"""What must hold in every simulated run, checked against the production
agents' own state and their archives' recordings.

``Invariants.after_member(sim, node)`` runs after every duty cycle of a
member's module (cheap, incremental); ``checkpoint`` (every simulated second
and at the end) re-checks the whole committed prefix and the logs' terms;
``on_applied`` runs for every log entry a service applies.  Each check says
in its comment what production bug it would catch.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import ClusterRole
from sim_cluster import REQUEST, SESSION_HEADER_LENGTH, SimulationFailure

if TYPE_CHECKING:
    from sim_cluster import SimNode, Simulation

_FRAME_LENGTH = struct.Struct("<i")
_SESSION_TEMPLATE = codecs.SessionMessageHeaderEncoder.TEMPLATE_ID
_TERM_TEMPLATE = codecs.NewLeadershipTermEventEncoder.TEMPLATE_ID


def frames(data: bytes | bytearray, start: int, end: int, base: int = 0) -> Any:
    """(position after the frame, payload offset, payload length) of each whole frame in [start, end)."""
    offset = start - base
    limit = end - base
    while offset + 32 <= limit:
        (length,) = _FRAME_LENGTH.unpack_from(data, offset)
        if length <= 0:
            return
        aligned = (length + 31) & ~31
        if offset + aligned > limit:
            return
        yield base + offset + aligned, offset + 32, length - 32
        offset += aligned


def quorum(count: int) -> int:
    return count // 2 + 1


class Invariants:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        # Who led each term (one at most).
        self.leaders: dict[int, int] = {}
        # The committed log as the members committed it, in bytes: every
        # member's committed prefix must be a prefix of it, and it only grows.
        self.committed = bytearray()
        self._parsed = 0  # how far ``committed`` has been scanned for client messages
        self.committed_requests: dict[tuple[int, int], int] = {}  # (client, number) -> count
        self.verified: dict[int, int] = {}  # member -> committed bytes verified incrementally
        self.last_commit: dict[int, int] = {}  # member -> commit-pos of this run of its module
        self.states: dict[int, int] = {}  # log position -> service state there
        self.failures: list[str] = []

    def fail(self, text: str) -> None:
        self.sim.trace(f"INVARIANT {text}")
        raise SimulationFailure(text)

    # -- helpers

    def log_data(self, node: SimNode) -> tuple[bytearray, int, int] | None:
        """The member's log recording: (bytes, start position, recorded end)."""
        module = node.module
        recording_id = module.agent.log_recording_id if module is not None else node.last_log_recording_id
        if recording_id is None or recording_id < 0:
            return None
        recording = node.store.recordings.get(recording_id)
        if recording is None:
            return None
        return recording.data, recording.start_position, recording.recorded_position

    # -- after each duty cycle of a member's module

    def after_member(self, sim: Simulation, node: SimNode) -> None:
        module = node.module
        if module is None:
            return
        agent = module.agent
        member = node.member_id
        node.last_log_recording_id = agent.log_recording_id
        term = agent.leadership_term_id
        if agent.role is ClusterRole.LEADER and agent.election is None and term >= 0:
            # Split brain: two members leading the same term (a vote counted
            # twice, a candidate term not kept across a restart, a stale
            # NewLeadershipTerm taken as this term's).  (Once its election is
            # over: while a new leader replays its log, its term field holds
            # each replayed term in turn.)
            leader = self.leaders.setdefault(term, member)
            if leader != member:
                self.fail(f"two leaders of term {term}: members {leader} and {member}")
        commit = agent.commit_position
        previous = self.last_commit.get(member, 0)
        if commit < previous:
            # A module that moves commit-pos back: its services (which read up
            # to it) would have applied what is no longer committed.
            self.fail(f"member {member} commit-pos went back from {previous} to {commit}")
        self.last_commit[member] = commit
        verified = self.verified.get(member, 0)
        if commit <= verified:
            return
        log = self.log_data(node)
        if log is None:
            if commit > 0:
                self.fail(f"member {member} commits {commit} without a log recording")
            return
        data, start, end = log
        if commit > end:
            # A member that commits (and lets its services apply) what its own
            # archive has not recorded: a crash then loses a committed entry.
            self.fail(f"member {member} commit-pos {commit} beyond its recorded log {end}")
        if agent.role is ClusterRole.LEADER and agent.election is None:
            self._check_quorum(member, commit)
        self._extend_committed(member, data, start, verified, commit)
        self.verified[member] = commit

    def _check_quorum(self, leader: int, commit: int) -> None:
        """A leader's commit-pos: a quorum of members (itself among them) has
        recorded that far.  Catches a commit rule that counts reports of
        another term, of a member twice, or commits past the leader's own
        recording (Aeron's min(quorum position, append position))."""
        if commit <= self.verified.get(leader, 0):
            return
        recorded = 0
        for node in self.sim.nodes:
            log = self.log_data(node)
            if log is not None and log[2] >= commit:
                recorded += 1
        if recorded < quorum(len(self.sim.nodes)):
            self.fail(f"leader {leader} committed {commit}, recorded that far by {recorded} members only")

    def _extend_committed(self, member: int, data: bytearray, start: int, verified: int, commit: int) -> None:
        """The member's committed bytes [verified, commit) agree with what any
        member committed there before.  Catches a follower that kept an
        entry the leader does not have (a missed truncation), a new leader
        without a committed entry, a log rewritten under commit-pos."""
        if start > verified:
            return  # (the prefix before a purge is not held)
        committed = self.committed
        common = min(len(committed), commit)
        if common > verified and data[verified - start : common - start] != committed[verified:common]:
            self.fail(f"member {member} committed log differs from the committed log in [{verified}, {common})")
        if commit > len(committed):
            committed += data[len(committed) - start : commit - start]
            self._scan_requests()

    def _scan_requests(self) -> None:
        committed = self.committed
        counts = self.committed_requests
        position = self._parsed
        for end, offset, length in frames(committed, position, len(committed)):
            position = end
            if length >= SESSION_HEADER_LENGTH + REQUEST.size:
                template = struct.unpack_from("<H", committed, offset + 2)[0]
                if template == _SESSION_TEMPLATE:
                    key = REQUEST.unpack_from(committed, offset + SESSION_HEADER_LENGTH)
                    counts[key] = counts.get(key, 0) + 1
                    if counts[key] > 1:
                        # A client message appended twice (the leader re-read
                        # its ingress, a pending message kept across a term).
                        self.fail(f"client {key[0]} request {key[1]} is in the committed log {counts[key]} times")
        self._parsed = position

    # -- services

    def on_applied(self, member: int, position: int, state: int) -> None:
        """Services at the same log position hold the same state: catches a
        service fed a different (or uncommitted) log, or one that skipped or
        repeated an entry after a replay or a new term."""
        known = self.states.setdefault(position, state)
        if known != state:
            self.fail(f"member {member} service state {state:#x} at {position}, another had {known:#x}")

    # -- checkpoints

    def checkpoint(self) -> None:
        sim = self.sim
        for node in sim.nodes:
            log = self.log_data(node)
            if log is None:
                continue
            data, start, end = log
            commit = self.verified.get(node.member_id, 0)
            if start == 0:
                # The whole committed prefix again: nothing below commit-pos
                # ever changes (a truncation below the commit position, a
                # replication that overwrote committed entries).
                held = min(commit, end)
                if held < commit:
                    self.fail(f"member {node.member_id} log recording {end} is shorter than its commit {commit}")
                if data[:held] != self.committed[:held]:
                    self.fail(f"member {node.member_id} committed prefix changed below {held}")
            self._check_terms(node, data, start, end)
        self.check_acknowledged()

    def _check_terms(self, node: SimNode, data: bytearray, start: int, end: int) -> None:
        """Every NewLeadershipTermEvent in a member's log: terms only grow
        along the log, and each event says its own term's base position
        (where the recording log has that term start).  Catches a log that
        holds an old term after a newer one (a missed truncation), a term
        appended at the wrong position, a recording log out of step with
        the log it describes."""
        module = node.module
        last_term = -1
        for end_position, offset, length in frames(data, start, end, start):
            if length < codecs.HEADER_LENGTH:
                continue
            template = struct.unpack_from("<H", data, offset + 2)[0]
            if template != _TERM_TEMPLATE:
                continue
            message = codecs.decode(data, offset, length)
            assert isinstance(message, codecs.NewLeadershipTermEventDecoder)
            term = message.leadership_term_id
            if term <= last_term:
                self.fail(f"member {node.member_id} log: term {term} after term {last_term} at {end_position}")
            last_term = term
            frame_start = end_position - ((length + 32 + 31) & ~31)
            if message.log_position != end_position or message.term_base_log_position != frame_start:
                # (The event opens its term: its base is where it starts, its
                # log position where it ends, as Aeron's LogPublisher writes it.)
                self.fail(
                    f"member {node.member_id} log: term {term}'s event at [{frame_start}, {end_position}) says "
                    f"base {message.term_base_log_position}, position {message.log_position}"
                )
            if module is not None:
                entry = module.recording_log.find_term_entry(term)
                if entry is not None and entry.term_base_log_position != frame_start:
                    self.fail(
                        f"member {node.member_id}: recording log has term {term} at "
                        f"{entry.term_base_log_position}, the log at {frame_start}"
                    )

    def check_acknowledged(self) -> None:
        """Each request a client had acknowledged is in the committed log
        exactly once (the service only answers what it applied, and it
        applies only the committed log: an acknowledged request missing
        from it was lost after its acknowledgement)."""
        counts = self.committed_requests
        for client in self.sim.clients:
            for request in client.acknowledged:
                if counts.get((client.client_id, request), 0) != 1:
                    self.fail(
                        f"client {client.client_id} request {request} acknowledged, "
                        f"in the committed log {counts.get((client.client_id, request), 0)} times"
                    )

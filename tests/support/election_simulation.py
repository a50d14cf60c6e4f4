"""Deterministic simulation of a cluster's elections and consensus work.

N members, each an ``Election`` (the production code) around a simulated
node: an in-memory log (a list of ``(leadership term, entry)``, 64 bytes per
entry), a recording log of term bases, a persisted candidate term id, and a
small leader/follower "consensus work" loop in the manner of seed 000 (the
leader appends client writes and publishes the commit position, followers
report their append position; leader heartbeat timeout and inactive follower
quorum start new elections).  Consensus messages go through the real
``ConsensusPublisher`` / ``ConsensusAdapter`` codecs over a simulated network
with seeded drop, delay, duplicate, reorder, partition and heal; members
crash and restart with their durable state, and a restarted member may find
its log endpoints still held by its dead predecessor for a while (the driver
refuses its catchup and live destinations until then, as a real driver does
until it lets the dead process's registrations go).  Time is simulated: one seed is
one reproducible run.

Safety checks, all the time: at most one leader per leadership term; a
member never truncates its log below its commit position; every member's
committed prefix is a prefix of one sequence.  Liveness check: once the
network heals and every member is up, a leader with a committed entry of
its term appears within a bound.

Reproduce a seed:  ``python -m tests.election_simulation --seed 123 --members 3 -v``
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fulmar.consensus.agent import ClusterRole
from fulmar.consensus.consensus_adapter import ConsensusAdapter
from fulmar.consensus.consensus_publisher import APPEND_POSITION_FLAG_CATCHUP, ConsensusPublisher
from fulmar.consensus.election import Election, ElectionTimeouts, TermEntry, next_term_for, quorum_threshold
from fulmar.consensus.protocol import NULL_MEMBER_ID, NULL_POSITION, NULL_VALUE

ENTRY_LENGTH = 64
MS = 1_000_000
SECOND = 1_000 * MS

SIM_TIMEOUTS = ElectionTimeouts(
    election_timeout_ns=1 * SECOND,
    election_status_interval_ns=100 * MS,
    startup_canvass_timeout_ns=2 * SECOND,
    leader_heartbeat_timeout_ns=2 * SECOND,
    leader_heartbeat_interval_ns=200 * MS,
)


class SimulationFailure(AssertionError):
    pass


def reproduce_hint(seed: int, members: int) -> str:
    return f"reproduce: python -m tests.election_simulation --seed {seed} --members {members} -v"


# ---------------------------------------------------------------------------- network


class Link:
    """The publication from one member to another's consensus endpoint."""

    def __init__(self, network: Network, src: int, dst: int) -> None:
        self.network = network
        self.src = src
        self.dst = dst

    def offer(self, buffer: bytes) -> int:
        self.network.send(self.src, self.dst, buffer)
        return 1  # UDP: the sender never learns of loss


class Network:
    def __init__(self, sim: Simulation, rng: random.Random) -> None:
        self.sim = sim
        self.rng = rng
        self.queue: list[tuple[int, int, int, int, bytes]] = []
        self.seq = 0
        self.drop = 0.0
        self.duplicate = 0.0
        self.delay_min_ns = 1 * MS
        self.delay_max_ns = 5 * MS
        self.side = [0] * sim.member_count
        self.sent = 0
        self.delivered = 0

    def connected(self, a: int, b: int) -> bool:
        return self.side[a] == self.side[b]

    def send(self, src: int, dst: int, data: bytes) -> None:
        self.sent += 1
        if not self.connected(src, dst) or self.rng.random() < self.drop:
            return
        copies = 2 if self.rng.random() < self.duplicate else 1
        for _ in range(copies):
            at = self.sim.now_ns + self.rng.randint(self.delay_min_ns, self.delay_max_ns)
            self.seq += 1
            heapq.heappush(self.queue, (at, self.seq, src, dst, data))

    def deliver(self, now_ns: int) -> None:
        queue = self.queue
        while queue and queue[0][0] <= now_ns:
            _, _, src, dst, data = heapq.heappop(queue)
            node = self.sim.nodes[dst]
            if node.alive and self.connected(src, dst):
                self.delivered += 1
                node.adapter.on_fragment(data, 0, len(data))


# ---------------------------------------------------------------------------- archive work


class SimReplication:
    """Copies the leader's log into the follower's, a few entries per tick,
    while the source is still the leader of the term the follower joined."""

    def __init__(self, node: SimNode, source_id: int, leadership_term_id: int, stop_position: int) -> None:
        self.node = node
        self.source_id = source_id
        self.leadership_term_id = leadership_term_id
        self.stop_position = stop_position
        self._failed = False
        self.closed = False

    def step(self) -> None:
        if self.closed or self._failed or self.is_done():
            return
        sim = self.node.sim
        source = sim.nodes[self.source_id]
        if not source.is_leader_of(self.leadership_term_id):
            self._failed = True
            return
        if not sim.network.connected(self.node.member_id, self.source_id) or sim.rng.random() < sim.network.drop:
            return
        self.node.copy_from(source, self.stop_position, sim.entries_per_tick)

    def is_done(self) -> bool:
        return self.node.append_position() >= self.stop_position

    def failed(self) -> bool:
        return self._failed

    def close(self) -> None:
        self.closed = True


# ---------------------------------------------------------------------------- node


class SimNode:
    """One member: the ElectionHost and the consensus work around its election."""

    def __init__(self, sim: Simulation, member_id: int) -> None:
        self.sim = sim
        self.member_id = member_id
        self.others = [m for m in range(sim.member_count) if m != member_id]
        self.publisher = ConsensusPublisher({m: Link(sim.network, member_id, m) for m in self.others})
        self.adapter = ConsensusAdapter(self, error_handler=self._codec_error)  # type: ignore[arg-type]  # the simulated node takes the callbacks of the adapter it uses
        # durable
        self.log: list[tuple[int, str]] = []
        self.terms: list[tuple[int, int]] = []  # (leadership term id, term base log position)
        self.candidate_term_id = NULL_VALUE
        self.alive = True
        self.writes = 0
        # Until then the driver refuses this member's live and catchup log destinations.
        self.live_endpoint_free_at_ns = 0
        self.catchup_endpoint_free_at_ns = 0
        self._reset_volatile()

    def _codec_error(self, text: str) -> None:
        raise SimulationFailure(f"member {self.member_id}: {text}")

    def _reset_volatile(self) -> None:
        self.election: Election | None = None
        self.role = ClusterRole.FOLLOWER
        self.leadership_term_id = self.terms[-1][0] if self.terms else NULL_VALUE
        self.leader_id = NULL_MEMBER_ID
        self.last_leader_update_ns = 0  # any leader of this term or a newer one (the canvass deadline)
        self.commit = 0
        self.notified_commit = 0
        self.processed = 0
        self.term_base = NULL_POSITION
        self.log_session_id = NULL_VALUE
        self.publication_term = NULL_VALUE
        self.subscribed: tuple[int, int] | None = None  # (leader, term)
        self.catching_up = False
        self.catchups: set[int] = set()
        self.follower_positions: dict[int, tuple[int, int]] = {}
        self.last_leader_message_ns = 0
        self.last_commit_sent = (NULL_POSITION, -(1 << 62))
        self.last_append_sent = (NULL_POSITION, -(1 << 62))
        self.replication: SimReplication | None = None
        self.replay_ready_ns = 0

    # -------------------------------------------------------------- helpers

    def log_term(self) -> int:
        return self.terms[-1][0] if self.terms else NULL_VALUE

    def is_leader_of(self, leadership_term_id: int) -> bool:
        return self.alive and self.publication_term == leadership_term_id

    def copy_from(self, source: SimNode, stop_position: int, limit: int) -> None:
        start = len(self.log)
        stop = min(stop_position // ENTRY_LENGTH, len(source.log), start + limit)
        if stop > start:
            self.log.extend(source.log[start:stop])

    def _set_commit(self, position: int) -> None:
        position = min(position, self.append_position())
        if position <= self.commit:
            return
        committed = self.sim.committed
        for index in range(self.commit // ENTRY_LENGTH, position // ENTRY_LENGTH):
            entry = self.log[index]
            if index < len(committed):
                if committed[index] != entry:
                    raise SimulationFailure(
                        f"member {self.member_id} commits {entry} at position {index * ENTRY_LENGTH} where "
                        f"{committed[index]} was committed"
                    )
            else:
                committed.append(entry)
        self.commit = position

    def start_election(self, now_ns: int, reason: str) -> None:
        self.sim.trace(f"member {self.member_id} starts an election: {reason}")
        self.election = Election(
            self.member_id,
            list(range(self.sim.member_count)),
            self,
            self.publisher,
            self.sim.rng,
            self.sim.timeouts,
            False,
            self.log_term(),
            self.append_position(),
            leadership_term_id=self.leadership_term_id,
            candidate_term_id=self.candidate_term_id,
        )
        self.election.do_work(now_ns)

    def crash(self) -> None:
        self.sim.trace(f"member {self.member_id} crashes")
        self.alive = False
        self._reset_volatile()

    def restart(self, now_ns: int) -> None:
        self.sim.trace(f"member {self.member_id} restarts")
        self.alive = True
        if now_ns > 0 and self.sim.held_endpoint_max_ms:
            self.live_endpoint_free_at_ns = now_ns + self.sim.rng.randint(0, self.sim.held_endpoint_max_ms) * MS
            self.catchup_endpoint_free_at_ns = self.sim.rng.randint(now_ns, self.live_endpoint_free_at_ns)
        self._reset_volatile()
        self.election = Election(
            self.member_id,
            list(range(self.sim.member_count)),
            self,
            self.publisher,
            self.sim.rng,
            self.sim.timeouts,
            True,
            self.log_term(),
            self.append_position(),
            leadership_term_id=max(self.log_term(), NULL_VALUE),
            candidate_term_id=self.candidate_term_id,
        )

    # -------------------------------------------------------------- duty cycle

    def do_work(self, now_ns: int) -> None:
        if not self.alive:
            return
        if self.replication is not None:
            self.replication.step()
        self._pull_log()
        election = self.election
        if election is not None:
            election.do_work(now_ns)
            if election.is_closed:
                self.election = None
        else:
            self.consensus_work(now_ns)

    def _pull_log(self) -> None:
        if self.subscribed is None:
            return
        leader_id, term = self.subscribed
        leader = self.sim.nodes[leader_id]
        if not leader.is_leader_of(term) or (self.catching_up and self.member_id not in leader.catchups):
            return
        if not self.sim.network.connected(leader_id, self.member_id) or self.sim.rng.random() < self.sim.network.drop:
            return
        self.copy_from(leader, 1 << 62, self.sim.entries_per_tick)

    def consensus_work(self, now_ns: int) -> None:
        timeouts = self.sim.timeouts
        if self.role == ClusterRole.LEADER:
            if self.sim.rng.random() < self.sim.write_probability:
                self.writes += 1
                self.log.append(
                    (self.leadership_term_id, f"m{self.member_id}-t{self.leadership_term_id}-w{self.writes}")
                )
            positions = sorted(
                [self.append_position()] + [p for m, (p, _) in self.follower_positions.items()], reverse=True
            )
            quorum = quorum_threshold(self.sim.member_count)
            if len(positions) >= quorum:
                quorum_position = positions[quorum - 1]
                if quorum_position > self.term_base:  # only entries of this term commit by counting
                    self._set_commit(quorum_position)
            if (
                self.commit != self.last_commit_sent[0]
                or now_ns >= self.last_commit_sent[1] + timeouts.leader_heartbeat_interval_ns
            ):
                self.last_commit_sent = (self.commit, now_ns)
                for m in self.others:
                    self.publisher.commit_position(
                        m,
                        leadership_term_id=self.leadership_term_id,
                        log_position=self.commit,
                        leader_member_id=self.member_id,
                    )
            active = 1 + sum(
                1 for _, t in self.follower_positions.values() if now_ns - t < timeouts.leader_heartbeat_timeout_ns
            )
            if active < quorum_threshold(self.sim.member_count):
                self.start_election(now_ns, "inactive follower quorum")
        else:
            self._set_commit(self.notified_commit)
            position = self.append_position()
            if (
                position != self.last_append_sent[0]
                or now_ns >= self.last_append_sent[1] + timeouts.leader_heartbeat_interval_ns
            ):
                self.last_append_sent = (position, now_ns)
                self.publisher.append_position(
                    self.leader_id,
                    leadership_term_id=self.leadership_term_id,
                    log_position=position,
                    follower_member_id=self.member_id,
                )
            if now_ns - self.last_leader_message_ns >= timeouts.leader_heartbeat_timeout_ns:
                self.start_election(now_ns, "leader heartbeat timeout")

    # -------------------------------------------------------------- ElectionHost

    def term_entries(self) -> Sequence[TermEntry]:
        entries = []
        for i, (term_id, base) in enumerate(self.terms):
            end = self.terms[i + 1][1] if i + 1 < len(self.terms) else NULL_POSITION
            entries.append(TermEntry(term_id, base, end))
        return entries

    def append_position(self) -> int:
        return len(self.log) * ENTRY_LENGTH

    def log_recording_id(self) -> int:
        return 0

    def time_of_last_leader_update_ns(self) -> int:
        return self.last_leader_update_ns

    def commit_position(self) -> int:
        return self.commit

    def processed_position(self) -> int:
        return self.processed

    def truncate_log_to(self, position: int) -> None:
        if position < self.commit:
            raise SimulationFailure(
                f"member {self.member_id} truncates to {position} below its commit position {self.commit}"
            )
        self.sim.trace(f"member {self.member_id} truncates {self.append_position()} -> {position}")
        del self.log[position // ENTRY_LENGTH :]
        self.terms = [t for t in self.terms if t[1] <= position]
        self.processed = min(self.processed, position)

    def drop_term(self, leadership_term_id: int) -> None:
        if self.terms and self.terms[-1][0] == leadership_term_id and self.terms[-1][1] >= self.append_position():
            self.terms.pop()

    def append_term(self, leadership_term_id: int, term_base_log_position: int) -> None:
        if any(t == leadership_term_id for t, _ in self.terms):
            return
        if self.terms and (self.terms[-1][0] > leadership_term_id or self.terms[-1][1] > term_base_log_position):
            raise SimulationFailure(
                f"member {self.member_id} records term {leadership_term_id} at "
                f"{term_base_log_position} after {self.terms[-1]}"
            )
        if term_base_log_position > self.append_position():
            raise SimulationFailure(
                f"member {self.member_id} records term {leadership_term_id} at "
                f"{term_base_log_position} beyond its log {self.append_position()}"
            )
        self.terms.append((leadership_term_id, term_base_log_position))

    def replicate(self, leader_member_id: int, leader_recording_id: int, stop_position: int) -> SimReplication:
        assert self.election is not None
        self.sim.replications.append((self.member_id, leader_member_id, self.append_position(), stop_position))
        self.replication = SimReplication(self, leader_member_id, self.election.leadership_term_id, stop_position)
        return self.replication

    def start_replay(self, from_position: int, to_position: int) -> None:
        self.replay_ready_ns = self.sim.now_ns + self.sim.rng.randint(0, 50) * MS
        self.processed = to_position

    def replay_done(self) -> bool:
        return self.sim.now_ns >= self.replay_ready_ns

    def close_ingress_and_egress(self) -> None:
        pass  # no clients in the simulation

    def prepare_for_election(self) -> None:
        self.publication_term = NULL_VALUE
        self.subscribed = None
        self.catching_up = False
        self.catchups.clear()
        self.follower_positions.clear()
        if self.replication is not None:
            self.replication.close()
            self.replication = None

    def create_log_publication(self, leadership_term_id: int, log_position: int) -> int:
        leaders = self.sim.leaders
        if leaders.setdefault(leadership_term_id, self.member_id) != self.member_id:
            raise SimulationFailure(
                f"two leaders in term {leadership_term_id}: members {leaders[leadership_term_id]} and {self.member_id}"
            )
        self.sim.trace(f"member {self.member_id} leads term {leadership_term_id} from {log_position}")
        self.prepare_for_election()
        self.publication_term = leadership_term_id
        self.term_base = log_position
        self.log_session_id = leadership_term_id * 100 + self.member_id
        return self.log_session_id

    def join_log_as_leader(self, leadership_term_id: int, term_base_log_position: int) -> None:
        self.append_term(leadership_term_id, term_base_log_position)

    def append_new_leadership_term_event(self, leadership_term_id: int, log_position: int, timestamp: int) -> bool:
        assert log_position == self.append_position()
        self.log.append((leadership_term_id, f"new-leadership-term-{leadership_term_id}"))
        return True

    def join_log_as_follower(
        self, leader_member_id: int, leadership_term_id: int, term_base_log_position: int, log_session_id: int
    ) -> bool:
        self.subscribed = (leader_member_id, leadership_term_id)
        self.term_base = term_base_log_position
        self.append_term(leadership_term_id, term_base_log_position)
        return True

    def add_live_destination(self) -> bool:
        return self.sim.now_ns >= self.live_endpoint_free_at_ns

    def is_catchup_near_live(self, leader_log_position: int) -> bool:
        return True

    def is_log_connected(self) -> bool:
        if self.subscribed is None:
            return False
        leader_id, term = self.subscribed
        leader = self.sim.nodes[leader_id]
        if not leader.is_leader_of(term) or not self.sim.network.connected(leader_id, self.member_id):
            return False
        return not self.catching_up or self.member_id in leader.catchups

    def catchup(self, leader_member_id: int, from_position: int) -> str | None:
        if self.sim.now_ns < self.catchup_endpoint_free_at_ns:
            return None
        self.catching_up = True
        return f"sim-member-{self.member_id}:catchup"

    def stop_catchup(self) -> None:
        self.catching_up = False

    def persist_candidate_term_id(self, candidate_term_id: int) -> None:
        self.candidate_term_id = max(self.candidate_term_id, candidate_term_id)

    def on_role_change(self, role: ClusterRole) -> None:
        self.role = role

    def on_leadership_term_change(self, leadership_term_id: int) -> None:
        self.leadership_term_id = leadership_term_id

    def notify_commit_position(self, commit_position: int) -> None:
        self._set_commit(commit_position)

    def election_complete(self, role: ClusterRole, leader_member_id: int, leadership_term_id: int) -> None:
        now_ns = self.sim.now_ns
        self.role = role
        self.leader_id = leader_member_id
        self.leadership_term_id = leadership_term_id
        self.last_leader_message_ns = now_ns
        assert self.election is not None
        self.notified_commit = max(self.notified_commit, self.election.notified_commit_position)
        if role == ClusterRole.LEADER:
            self.term_base = self.election.term_base_log_position
            self.follower_positions = {m: (0, now_ns) for m in self.others}
        self.sim.trace(
            f"member {self.member_id} completes its election as {role.name} of term "
            f"{leadership_term_id} (leader {leader_member_id})"
        )

    # -------------------------------------------------------------- consensus messages

    def on_canvass_position(
        self,
        log_leadership_term_id: int,
        log_position: int,
        leadership_term_id: int,
        follower_member_id: int,
        protocol_version: int,
    ) -> None:
        if self.election is not None:
            self.election.on_canvass_position(
                log_leadership_term_id, log_position, leadership_term_id, follower_member_id, protocol_version
            )
        elif leadership_term_id > self.leadership_term_id:
            self.start_election(self.sim.now_ns, "a member canvasses in a newer term")
        elif self.role == ClusterRole.LEADER:
            next_id, next_base, next_position = next_term_for(
                self.term_entries(), log_leadership_term_id, self.leadership_term_id, self.term_base
            )
            self.publisher.new_leadership_term(
                follower_member_id,
                log_leadership_term_id=log_leadership_term_id,
                next_leadership_term_id=next_id,
                next_term_base_log_position=next_base,
                next_log_position=next_position,
                leadership_term_id=self.leadership_term_id,
                term_base_log_position=self.term_base,
                log_position=self.append_position(),
                leader_recording_id=0,
                timestamp=self.sim.now_ns // MS,
                leader_member_id=self.member_id,
                log_session_id=self.log_session_id,
                app_version=0,
                is_startup=False,
            )

    def on_request_vote(
        self,
        log_leadership_term_id: int,
        log_position: int,
        candidate_term_id: int,
        candidate_member_id: int,
        protocol_version: int,
    ) -> None:
        if self.election is None and candidate_term_id > self.leadership_term_id:
            self.start_election(self.sim.now_ns, "RequestVote for a newer term")
        if self.election is not None:
            self.election.on_request_vote(
                log_leadership_term_id, log_position, candidate_term_id, candidate_member_id, protocol_version
            )

    def on_vote(
        self,
        candidate_term_id: int,
        log_leadership_term_id: int,
        log_position: int,
        candidate_member_id: int,
        follower_member_id: int,
        vote: bool,
    ) -> None:
        if self.election is not None:
            self.election.on_vote(
                candidate_term_id, log_leadership_term_id, log_position, candidate_member_id, follower_member_id, vote
            )

    def on_new_leadership_term(
        self,
        log_leadership_term_id: int,
        next_leadership_term_id: int,
        next_term_base_log_position: int,
        next_log_position: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        leader_recording_id: int,
        timestamp: int,
        leader_member_id: int,
        log_session_id: int,
        app_version: int,
        is_startup: bool,
    ) -> None:
        if leadership_term_id >= self.leadership_term_id:
            self.last_leader_update_ns = self.sim.now_ns
        if self.election is None:
            if leadership_term_id > self.leadership_term_id:
                self.start_election(self.sim.now_ns, "NewLeadershipTerm for a newer term")
            elif leadership_term_id == self.leadership_term_id and leader_member_id == self.leader_id:
                self.last_leader_message_ns = self.sim.now_ns
        if self.election is not None:
            self.election.on_new_leadership_term(
                log_leadership_term_id,
                next_leadership_term_id,
                next_term_base_log_position,
                next_log_position,
                leadership_term_id,
                term_base_log_position,
                log_position,
                leader_recording_id,
                timestamp,
                leader_member_id,
                log_session_id,
                app_version,
                is_startup,
            )

    def on_append_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, flags: int
    ) -> None:
        if self.election is not None:
            self.election.on_append_position(leadership_term_id, log_position, follower_member_id, flags)
        elif self.role == ClusterRole.LEADER and leadership_term_id == self.leadership_term_id:
            previous = self.follower_positions.get(follower_member_id, (0, 0))[0]
            self.follower_positions[follower_member_id] = (max(previous, log_position), self.sim.now_ns)
            if (
                flags & APPEND_POSITION_FLAG_CATCHUP
                and follower_member_id in self.catchups
                and log_position >= self.append_position() - 2 * ENTRY_LENGTH
            ):
                self.catchups.discard(follower_member_id)
                self.publisher.stop_catchup(
                    follower_member_id,
                    leadership_term_id=self.leadership_term_id,
                    follower_member_id=follower_member_id,
                )

    def on_commit_position(self, leadership_term_id: int, log_position: int, leader_member_id: int) -> None:
        if leadership_term_id >= self.leadership_term_id:
            self.last_leader_update_ns = self.sim.now_ns
        if self.election is not None:
            self.election.on_commit_position(leadership_term_id, log_position, leader_member_id)
        elif leadership_term_id > self.leadership_term_id:
            self.start_election(self.sim.now_ns, "CommitPosition of a newer term")
            assert self.election is not None
            self.election.on_commit_position(leadership_term_id, log_position, leader_member_id)
        elif (
            self.role == ClusterRole.FOLLOWER
            and leadership_term_id == self.leadership_term_id
            and leader_member_id == self.leader_id
        ):
            self.notified_commit = max(self.notified_commit, log_position)
            self.last_leader_message_ns = self.sim.now_ns

    def on_catchup_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, catchup_endpoint: str
    ) -> None:
        if self.election is None and self.role == ClusterRole.LEADER and leadership_term_id == self.leadership_term_id:
            self.catchups.add(follower_member_id)

    def on_stop_catchup(self, leadership_term_id: int, follower_member_id: int) -> None:
        if self.election is not None:
            self.election.on_stop_catchup(leadership_term_id, follower_member_id)

    def on_termination_position(self, leadership_term_id: int, log_position: int) -> None:
        pass

    def on_termination_ack(self, leadership_term_id: int, log_position: int, member_id: int) -> None:
        pass


# ---------------------------------------------------------------------------- the simulation


@dataclass
class Result:
    seed: int
    members: int
    leader_after_heal_ns: int
    sim_ns: int
    committed: int
    max_term: int
    messages: int


class Simulation:
    """One seeded run: a chaos phase with faults, then a liveness phase after healing."""

    def __init__(
        self,
        seed: int,
        member_count: int = 3,
        *,
        timeouts: ElectionTimeouts = SIM_TIMEOUTS,
        tick_ns: int = 10 * MS,
        chaos_ns: int = 10 * SECOND,
        verbose: bool = False,
    ) -> None:
        self.seed = seed
        self.member_count = member_count
        self.rng = random.Random(seed)
        self.timeouts = timeouts
        self.tick_ns = tick_ns
        self.chaos_ns = chaos_ns
        self.verbose = verbose
        self.now_ns = 0
        self.network = Network(self, self.rng)
        self.nodes = [SimNode(self, m) for m in range(member_count)]
        self.leaders: dict[int, int] = {}
        self.committed: list[tuple[int, str]] = []
        self.replications: list[tuple[int, int, int, int]] = []
        self.entries_per_tick = 4
        self.write_probability = 0.2
        self.restart_at: dict[int, int] = {}
        # this seed's fault profile
        rng = self.rng
        self.drop = rng.choice([0.0, 0.01, 0.05, 0.2])
        self.duplicate = rng.choice([0.0, 0.02, 0.1])
        self.delay_max_ns = rng.choice([2, 10, 50, 200]) * MS
        self.partition_rate = rng.choice([0.0, 0.002, 0.01, 0.03])
        self.crash_rate = rng.choice([0.0, 0.0005, 0.002, 0.005])
        # How long a restarted member's endpoints may stay held (up to two heartbeat timeouts).
        self.held_endpoint_max_ms = rng.choice([0, 1000, 4000])
        # the liveness bound after healing: stale roles time out, then a few election rounds
        self.liveness_bound_ns = (
            timeouts.startup_canvass_timeout_ns
            + timeouts.leader_heartbeat_timeout_ns
            + 20 * timeouts.election_timeout_ns
        )

    def trace(self, text: str) -> None:
        if self.verbose:
            print(f"{self.now_ns / SECOND:9.3f}s {text}")

    def _chaos(self) -> None:
        rng = self.rng
        network = self.network
        if rng.random() < self.partition_rate:
            if rng.random() < 0.5:
                side = [0] * self.member_count
                side[rng.randrange(self.member_count)] = 1
            else:
                side = [rng.randrange(2) for _ in range(self.member_count)]
            network.side = side
            self.trace(f"partition {side}")
        elif rng.random() < self.partition_rate:
            network.side = [0] * self.member_count
            self.trace("heal")
        for node in self.nodes:
            if node.alive and rng.random() < self.crash_rate:
                down = sum(1 for n in self.nodes if not n.alive)
                if down + 1 < quorum_threshold(self.member_count) or rng.random() < 0.3:
                    node.crash()
                    self.restart_at[node.member_id] = self.now_ns + rng.randint(100, 3000) * MS
        for member_id, at in list(self.restart_at.items()):
            if self.now_ns >= at:
                del self.restart_at[member_id]
                self.nodes[member_id].restart(self.now_ns)

    def _tick(self) -> None:
        self.now_ns += self.tick_ns
        self.network.deliver(self.now_ns)
        order = list(self.nodes)
        self.rng.shuffle(order)
        for node in order:
            node.do_work(self.now_ns)

    def stable_leader(self) -> SimNode | None:
        for node in self.nodes:
            if (
                node.alive
                and node.election is None
                and node.role == ClusterRole.LEADER
                and node.commit > node.term_base
            ):
                followers = sum(
                    1
                    for n in self.nodes
                    if n.alive
                    and n.election is None
                    and n.role == ClusterRole.FOLLOWER
                    and n.leader_id == node.member_id
                    and n.leadership_term_id == node.leadership_term_id
                )
                if followers + 1 >= quorum_threshold(self.member_count):
                    return node
        return None

    def run(self) -> Result:
        network = self.network
        for node in self.nodes:
            node.restart(0)
        try:
            network.drop = self.drop
            network.duplicate = self.duplicate
            network.delay_max_ns = self.delay_max_ns
            while self.now_ns < self.chaos_ns:
                self._chaos()
                self._tick()
            # heal: every member up, no loss, small delays
            network.side = [0] * self.member_count
            network.drop = 0.0
            network.duplicate = 0.0
            network.delay_max_ns = 5 * MS
            for member_id in list(self.restart_at):
                del self.restart_at[member_id]
                self.nodes[member_id].restart(self.now_ns)
            self.trace("heal all")
            healed_ns = self.now_ns
            while True:
                self._tick()
                leader = self.stable_leader()
                if leader is not None:
                    commit = leader.commit
                    break
                if self.now_ns - healed_ns > self.liveness_bound_ns:
                    raise SimulationFailure(
                        f"no leader {self.liveness_bound_ns / SECOND:.1f}s after healing: "
                        + "; ".join(
                            f"m{n.member_id}:{n.election!r}"
                            if n.election
                            else f"m{n.member_id}:{n.role.name} term {n.leadership_term_id}"
                            for n in self.nodes
                        )
                    )
            elected_ns = self.now_ns - healed_ns
            # a write after healing commits on the leader
            deadline = self.now_ns + 10 * self.timeouts.election_timeout_ns
            target = leader.append_position() + ENTRY_LENGTH
            while self.stable_leader() is leader and leader.commit < target and self.now_ns < deadline:
                self._tick()
            if leader.commit < target and self.stable_leader() is leader:
                raise SimulationFailure(
                    f"leader {leader.member_id} does not commit after healing (commit {commit}, target {target})"
                )
        except SimulationFailure as failure:
            raise SimulationFailure(
                f"seed {self.seed} ({self.member_count} members) at "
                f"{self.now_ns / SECOND:.3f}s: {failure}\n{reproduce_hint(self.seed, self.member_count)}"
            ) from None
        return Result(
            self.seed,
            self.member_count,
            elected_ns,
            self.now_ns,
            len(self.committed),
            max(self.leaders, default=NULL_VALUE),
            network.delivered,
        )


def run_seed(seed: int, members: int = 3, verbose: bool = False) -> Result:
    return Simulation(seed, members, verbose=verbose).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", type=int, default=100, help="without --seed: run seeds 0..N-1")
    parser.add_argument("--first", type=int, default=0, help="the first seed of a range")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("-v", "--verbose", action="store_true", help="trace every election event")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))
    started = time.perf_counter()
    failures = 0
    worst = 0
    for seed in seeds:
        try:
            result = run_seed(seed, args.members, args.verbose)
            worst = max(worst, result.leader_after_heal_ns)
            if args.verbose or args.seed is not None:
                print(result)
        except SimulationFailure as failure:
            failures += 1
            print(failure, file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(
        f"{len(seeds)} seeds x {args.members} members: {failures} failed, slowest election after healing "
        f"{worst / SECOND:.2f}s simulated, {elapsed:.1f}s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

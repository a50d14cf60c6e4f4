"""Replaying the local log recording into the module and its services
(seed 002): the single-member election's LEADER_REPLAY and the election
host's replays run it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fulmar.consensus.errors import ClusterTerminationError
from fulmar.consensus.protocol import NULL_VALUE
from fulmar.consensus.states import ClusterRole

if TYPE_CHECKING:
    from fulmar.consensus.agent import ConsensusModuleAgent


class LogReplay:
    """Seed 002: replay the local log recording from ``from_position`` to
    ``to_position`` through the module and its services.  ``do_work`` is
    called every duty cycle until ``is_done``."""

    def __init__(self, agent: ConsensusModuleAgent, from_position: int, to_position: int, now_ns: int) -> None:
        self.agent = agent
        self.from_position = from_position
        self.to_position = to_position
        self._ack_id = NULL_VALUE
        self._services_ready = False
        self._deadline_ns = now_ns + agent.context.service_ack_timeout_ns
        self.is_done = from_position >= to_position

    def do_work(self, now_ns: int) -> int:
        if self.is_done:
            return 0
        agent = self.agent
        if self._ack_id == NULL_VALUE:
            session_id = agent.start_log_replay(self.from_position, self.to_position)
            self._ack_id = agent.next_ack_id(join_log=True)
            agent.service_proxy.join_log(
                self.from_position,
                self.to_position,
                agent.member_id,
                session_id,
                agent.context.replay_stream_id,
                False,
                int(ClusterRole.FOLLOWER),
                agent.context.replay_channel,
            )
            return 1
        if not self._services_ready:
            if agent.services_acked(self._ack_id, self.from_position) is None:
                self._check_deadline(now_ns, "waiting for the services to join the log replay")
                return 0
            self._services_ready = True
        work = agent.poll_log(self.to_position)
        if agent.log_position >= self.to_position:
            agent.close_log_replay()
            self.is_done = True
            return 1
        if work:
            self._deadline_ns = now_ns + agent.context.service_ack_timeout_ns
        else:
            self._check_deadline(now_ns, f"replaying the log (at {agent.log_position} of {self.to_position})")
        return work

    def _check_deadline(self, now_ns: int, what: str) -> None:
        if now_ns > self._deadline_ns:
            raise ClusterTerminationError(f"log replay: timed out {what}")

    def close(self) -> None:
        if not self.is_done:
            self.agent.close_log_replay()

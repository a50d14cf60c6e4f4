"""The consensus module's states and roles: the values its counters hold
(Aeron's ConsensusModule.State, Cluster.Role, ClusterControl.ToggleState and
ElectionState).  A module of their own so that the agent, the election and
the tools that read the counters import them without importing each other."""

from __future__ import annotations

from enum import IntEnum


class ConsensusModuleState(IntEnum):
    INIT = 0
    ACTIVE = 1
    SUSPENDED = 2
    SNAPSHOT = 3
    QUITTING = 4
    TERMINATING = 5
    CLOSED = 6


class ClusterRole(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


class ControlToggle(IntEnum):
    """The cluster control toggle counter's values (Aeron's ClusterControl.ToggleState)."""

    INACTIVE = 0
    NEUTRAL = 1
    SUSPEND = 2
    RESUME = 3
    SNAPSHOT = 4
    SHUTDOWN = 5
    ABORT = 6
    STANDBY_SNAPSHOT = 7


class ElectionState(IntEnum):
    INIT = 0
    CANVASS = 1
    NOMINATE = 2
    CANDIDATE_BALLOT = 3
    FOLLOWER_BALLOT = 4
    LEADER_LOG_REPLICATION = 5
    LEADER_REPLAY = 6
    LEADER_INIT = 7
    LEADER_READY = 8
    FOLLOWER_LOG_REPLICATION = 9
    FOLLOWER_REPLAY = 10
    FOLLOWER_CATCHUP_INIT = 11
    FOLLOWER_CATCHUP_AWAIT = 12
    FOLLOWER_CATCHUP = 13
    FOLLOWER_LOG_INIT = 14
    FOLLOWER_LOG_AWAIT = 15
    FOLLOWER_READY = 16
    CLOSED = 17

"""The members of a cluster: who they are, where they listen, and how far
their logs have come.

The static membership is written as Aeron's cluster members string: one
entry per member separated by ``|``, each entry
``id,ingress,consensus,log,catchup,archive`` with ``host:port`` endpoints::

    0,localhost:20110,localhost:20220,localhost:20330,localhost:20440,localhost:8010|1,...

Positions are what the leader knows of each member (its append position,
from AppendPosition messages); the quorum position is the highest position
a majority has reached, the commit position of seed 000.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fulmar.channel_uri import parse_socket_address
from fulmar.consensus.protocol import NULL_POSITION
from fulmar.errors import FulmarError

_ENDPOINT_NAMES = ("ingress", "consensus", "log", "catchup", "archive")


class ClusterMembersError(FulmarError, ValueError):
    """A cluster members string that cannot be used, with what is wrong where."""


@dataclass
class ClusterMember:
    id: int
    ingress_endpoint: str
    consensus_endpoint: str
    log_endpoint: str
    catchup_endpoint: str
    archive_endpoint: str
    # What the leader has learnt of it (reset at each election).
    log_position: int = field(default=NULL_POSITION, compare=False)
    leadership_term_id: int = field(default=-1, compare=False)
    time_of_last_append_position_ns: int = field(default=0, compare=False)
    # The leader's archive replay feeding this member's catchup, if one runs.
    catchup_replay_session_id: int = field(default=-1, compare=False)

    def encode(self) -> str:
        return ",".join(
            (
                str(self.id),
                self.ingress_endpoint,
                self.consensus_endpoint,
                self.log_endpoint,
                self.catchup_endpoint,
                self.archive_endpoint,
            )
        )


def parse_cluster_members(text: str) -> list[ClusterMember]:
    """The members of a cluster members string, in the order given."""
    if not text.strip():
        raise ClusterMembersError("the cluster members string is empty")
    members: list[ClusterMember] = []
    for index, entry in enumerate(text.strip().split("|")):
        parts = [part.strip() for part in entry.split(",")]
        if len(parts) != 1 + len(_ENDPOINT_NAMES):
            raise ClusterMembersError(
                f"cluster member entry {index} ({entry!r}) has {len(parts)} fields; expected "
                f"id,{','.join(_ENDPOINT_NAMES)}"
            )
        try:
            member_id = int(parts[0])
        except ValueError:
            raise ClusterMembersError(f"cluster member entry {index}: id {parts[0]!r} is not an integer") from None
        if member_id < 0:
            raise ClusterMembersError(f"cluster member entry {index}: id {member_id} is negative")
        for name, endpoint in zip(_ENDPOINT_NAMES, parts[1:]):
            try:
                address = parse_socket_address(endpoint)
            except ValueError as error:  # (InvalidChannelError is one)
                raise ClusterMembersError(
                    f"cluster member {member_id}: {name} endpoint {endpoint!r}: {error}"
                ) from None
            if address.port == 0:
                raise ClusterMembersError(f"cluster member {member_id}: {name} endpoint {endpoint!r} needs a port")
        ingress, consensus, log, catchup, archive = parts[1:]
        members.append(ClusterMember(member_id, ingress, consensus, log, catchup, archive))
    ids = [member.id for member in members]
    duplicates = sorted({member_id for member_id in ids if ids.count(member_id) > 1})
    if duplicates:
        raise ClusterMembersError(f"cluster member ids {duplicates} appear more than once")
    return members


def encode_cluster_members(members: Iterable[ClusterMember]) -> str:
    return "|".join(member.encode() for member in members)


def ingress_endpoints(members: Iterable[ClusterMember]) -> str:
    """``id=host:port,...``: what clients are given (REDIRECT, NewLeaderEvent)."""
    return ",".join(f"{member.id}={member.ingress_endpoint}" for member in members)


def quorum_threshold(member_count: int) -> int:
    """How many members make a majority."""
    if member_count <= 0:
        raise ValueError(f"a cluster has at least one member, not {member_count}")
    return member_count // 2 + 1


def quorum_position(positions: Sequence[int]) -> int:
    """The highest position a majority of the members has reached (members
    not heard from count as NULL_POSITION, so a quorum must be heard)."""
    ranked = sorted(positions, reverse=True)
    return ranked[quorum_threshold(len(ranked)) - 1]


def find_member(members: Iterable[ClusterMember], member_id: int) -> ClusterMember:
    for member in members:
        if member.id == member_id:
            return member
    raise ClusterMembersError(f"member id {member_id} is not a member of the cluster")

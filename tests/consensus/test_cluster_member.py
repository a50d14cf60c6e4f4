"""Cluster members: Aeron's members string, and the quorum position."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fulmar.consensus.cluster_member import (
    ClusterMembersError,
    encode_cluster_members,
    find_member,
    ingress_endpoints,
    parse_cluster_members,
    quorum_position,
    quorum_threshold,
)

THREE = "|".join(
    f"{i},localhost:2{i}110,localhost:2{i}220,localhost:2{i}330,localhost:2{i}440,localhost:80{i}0" for i in range(3)
)


def test_members_round_trip_and_endpoints() -> None:
    members = parse_cluster_members(THREE)
    assert [member.id for member in members] == [0, 1, 2]
    assert members[1].consensus_endpoint == "localhost:21220" and members[2].archive_endpoint == "localhost:8020"
    assert encode_cluster_members(members) == THREE
    assert ingress_endpoints(members) == "0=localhost:20110,1=localhost:21110,2=localhost:22110"
    assert find_member(members, 2) is members[2]
    with pytest.raises(ClusterMembersError, match="member id 7 is not a member"):
        find_member(members, 7)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ("0,localhost:1,localhost:2,localhost:3,localhost:4", "has 5 fields"),
        ("x,localhost:1,localhost:2,localhost:3,localhost:4,localhost:5", "id 'x' is not an integer"),
        ("-1,localhost:1,localhost:2,localhost:3,localhost:4,localhost:5", "negative"),
        ("0,localhost,localhost:2,localhost:3,localhost:4,localhost:5", "ingress endpoint 'localhost'"),
        (
            "0,localhost:1,localhost:0,localhost:3,localhost:4,localhost:5",
            "consensus endpoint 'localhost:0' needs a port",
        ),
        ("0,a:1,a:2,a:3,a:4,a:5|0,b:1,b:2,b:3,b:4,b:5", r"ids \[0\] appear more than once"),
    ],
)
def test_bad_members_strings_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ClusterMembersError, match=problem):
        parse_cluster_members(text)


def test_quorum_position_is_what_a_majority_has() -> None:
    assert quorum_threshold(1) == 1 and quorum_threshold(3) == 2 and quorum_threshold(4) == 3
    assert quorum_threshold(5) == 3
    assert quorum_position([100]) == 100
    assert quorum_position([100, 50, 70]) == 70
    assert quorum_position([100, -1, -1]) == -1  # only the leader heard from: nothing committed
    assert quorum_position([100, 90, -1, 80, -1]) == 80
    with pytest.raises(ValueError):
        quorum_threshold(0)


@given(st.lists(st.integers(min_value=-1, max_value=10**12), min_size=1, max_size=9))
def test_a_majority_is_at_or_beyond_the_quorum_position(positions: list[int]) -> None:
    position = quorum_position(positions)
    at_or_beyond = sum(1 for p in positions if p >= position)
    assert at_or_beyond >= quorum_threshold(len(positions))
    # and it is the highest such position
    assert sum(1 for p in positions if p > position) < quorum_threshold(len(positions))

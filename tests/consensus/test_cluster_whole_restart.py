"""A whole cluster stopped and started again from its files (issue "Trusted
on every path", item 1).

Three members take writes, the leader's consensus module is killed (a new
leader in term 1), the killed module comes back, more writes, then every
process of every member stops with SIGTERM (a member of several takes no
snapshot on its own stop) and the whole cluster starts again.  The new
leader replays the old terms' NewLeadershipTermEvents in LEADER_REPLAY
before it appends its own; that replay must not leave the old term in the
agent, or the event appended for the new term carries the old one and every
follower that applies it drops back to it (a spurious second election).

What is checked, and what each check catches:
- every member ends in the elected term and ran exactly one election since
  the restart (a follower dragged back to the old term starts another);
- in every member's log, each NewLeadershipTermEvent carries the term whose
  range of the recording log holds it, and terms rise along the log (the
  old term written into the new term's log);
- the members' logs are the same up to the commit position, and every
  acknowledged write reads back.
"""

from __future__ import annotations

import json
import re

import pytest

from fulmar.cli.verify_log_commands import verify_log
from support.cluster import KEY_VALUE_SERVICE, LocalCluster
from support.multi_node import (
    assert_same_logs,
    member_view,
    next_term,
    wait_for_commit,
    wait_for_elections_closed,
    wait_for_leader,
)

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

ELECTION_COMPLETE = re.compile(r"election complete: (LEADER|FOLLOWER) of term (\d+)")


def put_all(cluster: LocalCluster, keys: range) -> None:
    client = cluster.connect_client()
    try:
        for key in keys:
            reply = json.loads(client.request(json.dumps({"op": "put", "key": f"k{key}", "value": key}).encode(), 20))
            assert reply["ok"], reply
    finally:
        client.close()
        cluster.clients.remove(client)


def elections_completed(cluster: LocalCluster, member: int, since: int) -> list[tuple[str, int]]:
    text = cluster.log_path(member, "consensus").read_text(errors="replace")[since:]
    return [(role, int(term)) for role, term in ELECTION_COMPLETE.findall(text)]


def test_a_whole_cluster_restarted_stays_in_its_new_term_with_one_election() -> None:
    with LocalCluster(3, KEY_VALUE_SERVICE) as cluster:
        cluster.start()
        first = wait_for_leader(cluster, 60)
        put_all(cluster, range(0, 100))
        cluster.kill_process(first.member, "consensus")
        second = wait_for_leader(cluster, 30, not_member=first.member, min_term=next_term(first))
        # Its node restarts the rest of it with it (its service followed the dead module).
        cluster.kill_process(first.member, "service")
        cluster.start_member(first.member)
        put_all(cluster, range(100, 200))
        position = member_view(cluster, second.member).commit_position
        assert position is not None
        wait_for_commit(cluster, [0, 1, 2], position, 60)

        # Every process of every member stops (SIGTERM: no snapshot), the
        # modules first, then their services, as a node's supervisor stops them.
        for kind in ("consensus", "service", "archive", "driver"):
            for member in range(3):
                cluster.stop_process(member, kind)
        log_sizes = [cluster.log_path(m, "consensus").stat().st_size for m in range(3)]
        cluster.start()
        third = wait_for_leader(cluster, 60, min_term=next_term(second))
        wait_for_elections_closed(cluster, 60)
        put_all(cluster, range(200, 210))  # the new term serves (and its event is committed)
        final = member_view(cluster, third.member).commit_position
        assert final is not None
        wait_for_commit(cluster, [0, 1, 2], final, 60)

        for member in range(3):
            view = member_view(cluster, member)
            assert view.leadership_term_id == third.leadership_term_id, view
            completed = elections_completed(cluster, member, log_sizes[member])
            assert [term for _, term in completed] == [third.leadership_term_id], (
                f"member {member} after the restart: {completed}"
            )
        # Each term's NewLeadershipTermEvent carries that term, terms rise along
        # every member's log, the recording logs match it, and the members agree.
        verification = verify_log(cluster.base)
        assert verification.ok, [str(v) for v in verification.violations]
        assert_same_logs(cluster, [0, 1, 2], final)

        client = cluster.connect_client()
        for key in (0, 99, 100, 199, 209):
            reply = json.loads(client.request(json.dumps({"op": "get", "key": f"k{key}"}).encode(), 20))
            assert reply["value"] == key, reply

"""A leader that stops in order (SIGTERM to its consensus module) closes its
log with an end of stream: the followers elect one of themselves at once,
not after the leader heartbeat timeout (Aeron's gracefulClosedLeaderId).

The heartbeat timeout here is 10 s (Aeron's default): a failover that waited
for it, or for the election timeout on the missing member's vote, would take
over 10 s; this one must take a fraction of that."""

from __future__ import annotations

import time

import pytest

from support.cluster import FAST_ELECTION_ARGS, LocalCluster
from support.multi_node import COUNTER_SERVICE, CounterWorkload, next_term, read_counter, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

HEARTBEAT_TIMEOUT_ARGS = (*FAST_ELECTION_ARGS, "--leader-heartbeat-timeout", "10s", "--election-timeout", "1s")


def test_the_followers_of_a_leader_stopped_in_order_elect_at_once() -> None:
    with LocalCluster(3, COUNTER_SERVICE, extra_consensus_args=HEARTBEAT_TIMEOUT_ARGS) as cluster:
        cluster.start()
        old = wait_for_leader(cluster, 60)
        workload = CounterWorkload(cluster).start()
        try:
            workload.wait_for_acks(50, 30)
            stopped_at = time.monotonic()
            assert cluster.stop_process(old.member, "consensus") == 0
            new = wait_for_leader(cluster, 30, not_member=old.member, min_term=next_term(old))
            elected_s = time.monotonic() - stopped_at
            workload.wait_for_acks(50, 30)
        finally:
            workload.stop()
        workload.check(read_counter(cluster.connect_client()))
        for member in range(3):
            if member != old.member:
                text = cluster.log_path(member, "consensus").read_text(errors="replace")
                assert "log disconnected from leader (end of stream: yes)" in text, text[-2000:]
        # Well under the 10 s heartbeat timeout (the election timeout, 1 s, plus the
        # nomination delay and the new leader's replay, on a loaded two-core machine).
        assert elected_s < 5.0, f"member {new.member} led {elected_s:.1f} s after the leader stopped"

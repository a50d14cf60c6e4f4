"""A follower whose archive dies, restarted with the processes that cannot live
without it (issue 18): the chaos nemesis's ``kill`` of a follower's archive and
its heal, as real processes on 127.0.0.1.

The dead module's registrations (its log subscription and the receive
endpoint it bound) stay in the member's media driver until the driver learns
that the module is gone.  The restarted module must take its endpoints back,
follow the leader and commit again within a bounded time, without a hot retry
loop or a flood of repeated lines in its consensus.log.

The driver runs with Aeron's default client liveness timeout (10 s), once as
fulmar's driver does by default (it closes a client whose declared process
died about a second after its last keepalive) and once without that check,
as Aeron's own driver: then the restarted member retries its endpoints with
back-off, goes back to CANVASS when the heartbeat timeout passes without
them, and joins once the driver has timed the dead module out."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from support.cluster import LocalCluster
from support.driver import wait_for
from support.multi_node import COUNTER_SERVICE, CounterWorkload, member_view, read_counter, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

# From the restart of the follower's processes until it has committed what the
# leader had committed after the restart, twice (it follows, not just catches up).
COMMITTING_AGAIN_BOUND_S = 20.0
# The same error line, or any other line, repeated more often than this is a flood.
MAX_REPEATS = 5
_STAMP = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} ")


def repeated_lines(text: str) -> list[tuple[str, int]]:
    """The most repeated lines of a consensus.log, timestamps left out."""
    return Counter(_STAMP.sub("", line) for line in text.splitlines() if line.strip()).most_common(3)


@pytest.mark.parametrize("driver_args", [(), ("--no-client-process-check",)], ids=["driver-notices", "liveness-only"])
def test_a_follower_restarted_after_its_archive_died_commits_again_within_a_bound(driver_args) -> None:
    with LocalCluster(3, COUNTER_SERVICE, extra_driver_args=driver_args) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 30)
        follower = next(m for m in range(3) if m != leader.member)
        workload = CounterWorkload(cluster).start()
        try:
            workload.wait_for_acks(100, 60)
            # The chaos nemesis's kill of the archive, then its heal: the module and
            # the service cannot live without the archive, so they go too, and all
            # three start again while the driver still holds the dead ones' registrations.
            cluster.kill_process(follower, "archive")
            cluster.kill_process(follower, "consensus")
            cluster.kill_process(follower, "service")
            log = cluster.log_path(follower, "consensus")
            restart_offset = log.stat().st_size
            restarted_at = time.monotonic()
            cluster.start_member(follower)
            deadline = restarted_at + COMMITTING_AGAIN_BOUND_S
            for _ in range(2):
                target = member_view(cluster, leader.member).commit_position or 0
                wait_for(
                    lambda: (member_view(cluster, follower).commit_position or -1) >= target,
                    max(0.0, deadline - time.monotonic()),
                    f"member {follower} to commit {target} (leader {leader.member}): "
                    f"{member_view(cluster, follower)}; log: {log.read_text()[restart_offset:][-3000:]}",
                )
                workload.wait_for_acks(10, max(1.0, deadline - time.monotonic()))
            took_s = time.monotonic() - restarted_at
            print(f"member {follower} committing again {took_s:.1f} s after its restart")
            assert took_s <= COMMITTING_AGAIN_BOUND_S
        finally:
            workload.stop()
        workload.check(read_counter(cluster.connect_client()))
        text = log.read_text()[restart_offset:]
        most = repeated_lines(text)
        assert most and most[0][1] <= MAX_REPEATS, f"member {follower}'s consensus.log repeats itself: {most}"

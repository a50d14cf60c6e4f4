"""A service that does not lead, while commits come faster than its follower
apply interval (``cluster-node service --follower-apply-interval``, 2 ms by
default), applies what is committed once per interval: no client waits on a
follower's service, and on a few shared cores its wake-up at every commit
takes a core from the leader's service and driver, which answer the client
at that moment.  Commits that come slower are applied as each comes, with
one wake-up each, as the leader's service applies all of them.  (The rest
of the suite, chaos included, runs with the default interval.)"""

from __future__ import annotations

import time

import pytest

from support.cluster import LocalCluster
from support.driver import main_thread_wakes
from support.multi_node import wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

ECHO_SERVICE = "fulmar.service.samples:EchoService"
INTERVAL_MS = 20  # long, so that a follower's pace stands apart from the commits'
WINDOW_S = 2.0


def test_a_followers_service_takes_the_commits_together_and_the_leaders_each_as_it_comes() -> None:
    with LocalCluster(3, ECHO_SERVICE, extra_service_args=["--follower-apply-interval", f"{INTERVAL_MS}ms"]) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 30).member
        client = cluster.connect_client()
        for sequence in range(20):  # warm-up: the sessions and images in place
            payload = b"warm-up %d" % sequence
            assert client.request(payload, 20) == payload
        pids = {}
        for member in range(cluster.size):
            service = cluster.process(member, "service")
            assert service is not None
            pids[member] = service.process.pid

        # Commits slower than the interval: each applied as it comes, one
        # wake-up each (a pause after each would be a second).
        time.sleep(2 * INTERVAL_MS / 1000)  # (the one fixed sleep: past any interval from the warm-up)
        before = {member: main_thread_wakes(pid) for member, pid in pids.items()}
        spaced = 25
        for sequence in range(spaced):
            payload = b"spaced %d" % sequence
            assert client.request(payload, 20) == payload
            time.sleep(2 * INTERVAL_MS / 1000)
        wakes = {member: main_thread_wakes(pid) - before[member] for member, pid in pids.items()}
        for member in pids:
            if member != leader:
                assert spaced / 2 <= wakes[member] <= 1.5 * spaced, (member, wakes, spaced)

        # Commits faster than the interval.
        before = {member: main_thread_wakes(pid) for member, pid in pids.items()}
        started = time.monotonic()
        round_trips = 0
        while time.monotonic() - started < WINDOW_S:
            payload = b"ping %d" % round_trips
            assert client.request(payload, 20) == payload
            round_trips += 1
        elapsed = time.monotonic() - started
        wakes = {member: main_thread_wakes(pid) - before[member] for member, pid in pids.items()}

        commits_per_interval = round_trips / elapsed * INTERVAL_MS / 1000
        assert commits_per_interval >= 3, f"{round_trips} round trips in {elapsed:.1f} s: too few to tell paces apart"
        # The leader's service is woken by each commit (one at a time here).
        assert wakes[leader] >= round_trips / 2, (wakes, round_trips)
        # A follower's once per interval (at the interval's end), and once by
        # a ring when a commit finds it asleep on its doorbell.
        most = 2 * elapsed * 1000 / INTERVAL_MS + 10
        for member in pids:
            if member != leader:
                assert wakes[member] <= most, (member, wakes, round_trips, most)

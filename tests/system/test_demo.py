"""`make run`'s demo: a three-member cluster started with ``cluster-node start
--local 3``, a verified key-value workload, the leader's consensus module
killed (a new leader elected while the client re-sends unanswered requests),
the killed node restarted and caught up, and nothing left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system


def test_demo_fails_over_and_rejoins_a_killed_leader() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "fulmar.cli.demo", "--requests", "6000", "--after-failover", "50"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    out = completed.stdout
    assert out.count(" ready: ingress aeron:udp?endpoint=127.0.0.1:") == 4  # three nodes, one restart
    assert "local cluster ready: 3 of 3 nodes running" in out
    # The first term is usually 0, but two members whose nomination deadlines fall within a message's
    # delay of each other split the vote (each votes for itself and against the other), and Aeron's
    # rules then start another ballot in the next term: only the order of the terms is certain.
    first = re.search(r"cluster ready: member (\d) leads \(term (\d+)\)", out)
    assert first is not None, out
    first_term = int(first.group(2))
    assert re.search(r"client connected: session \d+ with leader member \d, its driver pid \d+ in /", out), out
    assert "workload: 6,000 calls (3,000 puts, 3,000 gets over 1,000 keys, 64 in flight) -> 6,000 results" in out
    killed = re.search(rf"SIGKILL to the leader's consensus module \(member (\d), pid \d+, term {first_term}\)", out)
    assert killed is not None and killed.group(1) == first.group(1), out
    new = re.search(r"new leader: member (\d) \(term (\d+)\); first result from it ([\d.]+) s after the kill", out)
    assert new is not None and new.group(1) != killed.group(1) and int(new.group(2)) > first_term, out
    # Each put returns the value before it, checked against the model: a call the client sent again
    # after the kill and applied twice would return its own value and fail the demo.
    resent = re.search(
        r"from the kill on: (\d+) calls, each answered once and applied once .* sent (\d+) unanswered", out
    )
    assert resent is not None and int(resent.group(1)) >= 50, out
    assert "start it again on its own with: cluster-node start --config" in out
    assert re.search(rf"member {killed.group(1)} rejoined as a follower of term {new.group(2)} .*the leader's", out)
    assert "final read: 1,000 keys, every value as the model says" in out
    assert "stopped: exit codes 1 (the cluster supervisor: a node had failed), 0 (node" in out
    assert "into a new KeyValueStore in Spark (replay_state_machine): 1,000 keys, every value as the model says" in out
    assert out.count("stopped cleanly") == 3  # the two nodes of the local cluster and the restarted one
    # This run's own directories (other runs may be going on at the same time).
    base = re.search(r"cluster under (\S+) \(", out)
    assert base is not None and f"nothing left behind: {base.group(1)} and 4 driver directories removed" in out
    assert "was left behind" not in out
    assert not os.path.exists(base.group(1))
    for driver_dir in re.findall(r"driver directory (\S+?)[;,\s]", out):
        assert not os.path.exists(driver_dir), f"the demo left {driver_dir} behind"

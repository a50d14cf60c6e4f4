"""`make run`'s demo: a one-node cluster started with ``cluster-node start
--local 1``, a verified key-value workload, a snapshot on SIGTERM, a restart
that recovers the state, and nothing left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_runs_a_cluster_snapshots_restarts_and_recovers_the_state() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "fulmar.demo", "--requests", "20000"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    out = completed.stdout
    # The node came up through the supervisor, twice (the start and the restart).
    assert out.count("node 0 ready: ingress aeron:udp?endpoint=127.0.0.1:") == 2
    assert "workload: 20,000 requests (10,000 puts, 10,000 gets over 1,000 keys" in out
    assert "20,000 requests answered, every reply verified against the model" in out
    assert re.search(r"request/response, one at a time: 1,000 gets, every reply verified", out)
    # SIGTERM: the consensus module snapshots first, then everything stops in order.
    stops = re.findall(r"cluster stopped cleanly \(exit 0\): snapshot taken at log position ([\d,]+)", out)
    assert len(stops) == 2
    assert out.count("consensus module stopped: SHUTDOWN at log position") == 2
    assert out.count("node 0 stopped cleanly") == 2
    assert "the service's snapshot is recording" in out
    assert "state recovered after restart: 1,000 of 1,000 keys read back, every value as before the stop" in out
    assert "the restarted cluster takes new writes" in out
    assert "nothing left behind:" in out and "was left behind" not in out
    # This run's own directories (other runs may be going on at the same time).
    base = re.search(r"starting a one-node cluster under (\S+)", out)
    gone = re.search(r"nothing left behind: (\S+) and (\S+) removed", out)
    assert base is not None and gone is not None, out
    for path in (base.group(1), gone.group(1), gone.group(2)):
        assert not os.path.exists(path), f"the demo left {path} behind"

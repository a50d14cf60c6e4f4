"""`make run`'s demo runs two real processes and reports success."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_exchanges_messages_between_two_processes() -> None:
    before = {name for name in os.listdir("/dev/shm") if name.startswith("fulmar-demo-")}
    completed = subprocess.run(
        [sys.executable, "-m", "fulmar.demo", "--messages", "20000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "20,000 messages" in completed.stdout
    assert "match" in completed.stdout and "every message arrived once, in order, intact" in completed.stdout
    after = {name for name in os.listdir("/dev/shm") if name.startswith("fulmar-demo-")}
    assert after == before, "the demo left its directory behind"

"""`make run`'s demo: a media driver, two client processes and an archive, end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_exchanges_messages_through_a_media_driver() -> None:
    before = {name for name in os.listdir("/dev/shm") if name.startswith("fulmar-demo-")}
    completed = subprocess.run(
        [sys.executable, "-m", "fulmar.demo", "--messages", "20000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "20,000 messages sent" in out and "20,000 messages (" in out
    checksums = re.findall(r"checksum ([0-9a-f]{8})", out)
    # publisher, subscriber and the archive's replay agree
    assert len(checksums) == 3 and len(set(checksums)) == 1
    assert "archive: replayed 20,000 messages" in out and "all as sent" in out
    assert "driver stopped with exit code 0; its directory was removed" in out
    assert "every message arrived once, in order, intact" in out
    after = {name for name in os.listdir("/dev/shm") if name.startswith("fulmar-demo-")}
    assert after == before, "the demo left its directory behind"

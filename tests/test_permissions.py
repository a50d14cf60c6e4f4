"""What a node writes is its owner's alone: every file owner read-write,
every directory owner-only, and another user cannot attach to its driver."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_support import LocalCluster
from multi_node_support import wait_for_leader

from fulmar.permissions import DIRECTORY_MODE, FILE_MODE, make_directory

ECHO = "fulmar.service.samples:EchoService"


def _too_open(root: Path) -> list[str]:
    """Everything under ``root`` (itself included) that its group or others may use."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{path} {oct(mode)}")
    return found


def test_a_running_nodes_files_and_directories_are_owner_only() -> None:
    with LocalCluster(3, ECHO) as cluster:
        cluster.start()
        wait_for_leader(cluster, 30)
        client = cluster.connect_client()
        for index in range(20):
            assert client.request(b"ping %d" % index, timeout_s=10) == b"ping %d" % index
        # The driver's cnc.dat and log buffers, the archive's catalog, segments and
        # mark file, the cluster's recording log and mark files: all there by now.
        for member in range(3):
            assert any(cluster.archive_dir(member).glob("*.rec")), f"no archive segment on member {member}"
            assert (cluster.cluster_dir(member) / "recording.log").exists()
            for root in (cluster.driver_dir(member), cluster.archive_dir(member), cluster.cluster_dir(member)):
                assert _too_open(root) == [], root


def test_make_directory_creates_missing_parents_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = make_directory(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert made.is_dir()
    for path in (tmp_path / "a", made):
        assert stat.S_IMODE(path.stat().st_mode) == DIRECTORY_MODE
    assert FILE_MODE == 0o600


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run a process as another user")
def test_another_user_cannot_attach_to_the_driver() -> None:
    with LocalCluster(3, ECHO) as cluster:
        cluster.start()
        wait_for_leader(cluster, 30)
        cnc = cluster.driver_dir(0) / "cnc.dat"
        probe = ("import sys\n"
                 "from fulmar.aeron import Aeron\n"
                 "try:\n"
                 f"    Aeron.connect({str(cluster.driver_dir(0))!r}, driver_timeout_ms=2000)\n"
                 "except Exception as error:\n"
                 "    print(type(error).__name__, error)\n"
                 "    sys.exit(3)\n"
                 f"open({str(cnc)!r}, 'rb').read(8)\n"
                 "sys.exit(0)\n")
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", probe],
            capture_output=True, text=True, timeout=60, cwd="/")
        assert result.returncode == 3, (result.returncode, result.stdout, result.stderr)
        assert "Permission denied" in result.stdout or "PermissionError" in result.stdout, result.stdout

"""What a node writes is its owner's alone: every file owner read-write,
every directory owner-only, and another user cannot attach to its driver.
With a file group, the group's members may use them too (and only they)."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fulmar.permissions import (
    DIRECTORY_MODE,
    FILE_GROUP_ENV,
    FILE_MODE,
    GROUP_DIRECTORY_MODE,
    GROUP_FILE_MODE,
    make_directory,
    open_new_file,
)
from support.cluster import LocalCluster
from support.multi_node import wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

ECHO = "fulmar.service.samples:EchoService"


def _too_open(root: Path) -> list[str]:
    """Everything under ``root`` (itself included) that its group or others may use."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{path} {oct(mode)}")
    return found


def serve_until_every_file_exists(cluster: LocalCluster) -> None:
    """Start the cluster and serve a few requests: by then the driver's cnc.dat
    and log buffers, the archive's catalog, segments and mark file, and the
    cluster's recording log and mark files all exist."""
    cluster.start()
    wait_for_leader(cluster, 30)
    client = cluster.connect_client()
    for index in range(20):
        assert client.request(b"ping %d" % index, timeout_s=10) == b"ping %d" % index
    for member in range(cluster.size):
        assert any(cluster.archive_dir(member).glob("*.rec")), f"no archive segment on member {member}"
        assert (cluster.cluster_dir(member) / "recording.log").exists()


def test_a_running_nodes_files_and_directories_are_owner_only() -> None:
    with LocalCluster(3, ECHO) as cluster:
        serve_until_every_file_exists(cluster)
        for member in range(3):
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


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run a process as another user",
)
def test_another_user_cannot_attach_to_the_driver() -> None:
    with LocalCluster(3, ECHO) as cluster:
        cluster.start()
        wait_for_leader(cluster, 30)
        cnc = cluster.driver_dir(0) / "cnc.dat"
        probe = (
            "import sys\n"
            "from fulmar.aeron import Aeron\n"
            "try:\n"
            f"    Aeron.connect({str(cluster.driver_dir(0))!r}, driver_timeout_ms=2000)\n"
            "except Exception as error:\n"
            "    print(type(error).__name__, error)\n"
            "    sys.exit(3)\n"
            f"open({str(cnc)!r}, 'rb').read(8)\n"
            "sys.exit(0)\n"
        )
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert result.returncode == 3, (result.returncode, result.stdout, result.stderr)
        assert "Permission denied" in result.stdout or "PermissionError" in result.stdout, result.stdout


# ------------------------------------------------------------ a file group


def _not_group_shared(root: Path, gid: int) -> list[str]:
    """Everything under ``root`` (itself included) not owned by group ``gid``
    with group read-write (directories: 2770, files: 0660)."""
    found = []
    for path in [root, *root.rglob("*")]:
        status = path.lstat()
        mode = stat.S_IMODE(status.st_mode)
        expected = GROUP_DIRECTORY_MODE if path.is_dir() else GROUP_FILE_MODE
        if status.st_gid != gid or mode != expected:
            found.append(f"{path} gid {status.st_gid} {oct(mode)}")
    return found


def test_a_file_group_gives_new_files_and_directories_to_the_group_past_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gid = os.getgid()  # a group this user may give files to, root or not
    monkeypatch.setenv(FILE_GROUP_ENV, grp.getgrgid(gid).gr_name)
    old = os.umask(0o077)  # the strictest umask: the group's access must survive it
    try:
        made = make_directory(tmp_path / "a" / "b")
        fd = open_new_file(made / "file", os.O_RDWR | os.O_CREAT)
        os.close(fd)
    finally:
        os.umask(old)
    assert _not_group_shared(tmp_path / "a", gid) == []


def test_an_unknown_file_group_is_a_clear_error_at_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "fulmar.cli.cluster_node"]
    directory = str(tmp_path / "driver")
    for args, env in (
        ([*command, "--file-group", "no-such-group-f7", "driver", "--dir", directory], {}),
        ([*command, "driver", "--dir", directory], {FILE_GROUP_ENV: "no-such-group-f7"}),
    ):
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
        assert "file group 'no-such-group-f7' does not exist on this machine" in result.stderr, result.stderr
        assert not Path(directory).exists()


def _as_user(user: str) -> list[str]:
    """The command prefix that runs as ``user`` with its primary and
    supplementary groups (and no other)."""
    gid = pwd.getpwnam(user).pw_gid
    return ["setpriv", f"--reuid={user}", f"--regid={gid}", "--init-groups"]


def _attach_and_request(cluster: LocalCluster, user: str) -> subprocess.CompletedProcess[str]:
    """As ``user``, attach a client to member 0's driver and send one request through it."""
    probe = (
        "import sys\n"
        "from fulmar.aeron import Aeron\n"
        "from fulmar.consensus.client import ClusterClient\n"
        "try:\n"
        f"    aeron = Aeron.connect({str(cluster.driver_dir(0))!r}, driver_timeout_ms=2000)\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
        "    sys.exit(3)\n"
        f"client = ClusterClient.connect(aeron, 'aeron:udp', {cluster.ingress_endpoints!r},\n"
        "                               egress_channel='aeron:udp?endpoint=127.0.0.1:0',\n"
        "                               message_timeout_ns=20_000_000_000)\n"
        "assert client.request(b'from the group', 20) == b'from the group'\n"
        "client.close()\n"
        "aeron.close()\n"
        "sys.exit(0)\n"
    )
    return subprocess.run(
        [*_as_user(user), sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/"
    )


@pytest.fixture
def group_and_users() -> Iterator[tuple[str, str, str]]:
    """A new group, a user in it and a user outside it (removed afterwards)."""
    suffix = os.getpid() % 100_000
    group, member, outsider = f"fulmar-g{suffix}", f"fulmar-m{suffix}", f"fulmar-o{suffix}"
    subprocess.run(["groupadd", group], check=True, timeout=30)
    try:
        subprocess.run(["useradd", "-M", "-N", "-G", group, "-s", "/usr/sbin/nologin", member], check=True, timeout=30)
        try:
            subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", outsider], check=True, timeout=30)
            try:
                yield group, member, outsider
            finally:
                subprocess.run(["userdel", outsider], check=False, timeout=30)
        finally:
            subprocess.run(["userdel", member], check=False, timeout=30)
    finally:
        subprocess.run(["groupdel", group], check=False, timeout=30)


@pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("setpriv", "groupadd", "useradd")),
    reason="needs root, setpriv, groupadd and useradd to create a group and users to run as",
)
def test_with_a_file_group_its_members_attach_to_the_driver_and_others_still_cannot(
    group_and_users: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    group, member, outsider = group_and_users
    gid = grp.getgrnam(group).gr_gid
    monkeypatch.setenv(FILE_GROUP_ENV, group)  # the node's processes inherit it
    with LocalCluster(3, ECHO) as cluster:
        # The test's own temporary directories above the nodes' are root's
        # 0700: let anyone through them (not list them), so that what is
        # checked is the nodes' own directories.
        for above in {
            cluster.base,
            *(cluster.member_dir(m) for m in range(3)),
            *(cluster.driver_dir(m).parent for m in range(3)),
        }:
            os.chmod(above, 0o711)
        serve_until_every_file_exists(cluster)
        for m in range(3):
            assert any((cluster.driver_dir(m) / "publications").iterdir()), f"no log buffer on member {m}"
            for root in (cluster.driver_dir(m), cluster.archive_dir(m), cluster.cluster_dir(m)):
                assert _not_group_shared(root, gid) == [], root

        inside = _attach_and_request(cluster, member)
        assert inside.returncode == 0, (inside.returncode, inside.stdout, inside.stderr)
        # The archive's files are readable by the group.
        segment = next(cluster.archive_dir(0).glob("*.rec"))
        read = subprocess.run(
            [*_as_user(member), sys.executable, "-c", f"open({str(segment)!r}, 'rb').read(64)"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert read.returncode == 0, read.stderr

        outside = _attach_and_request(cluster, outsider)
        assert outside.returncode == 3, (outside.returncode, outside.stdout, outside.stderr)
        assert "Permission denied" in outside.stdout or "PermissionError" in outside.stdout, outside.stdout

"""What a user installs: ``pip install .`` without any extra gives working
``cluster-node`` and ``cluster-tool`` commands and the core imports, and the
commands that need an extra say which one; ``pip install -e .`` (what
``make install`` runs) is quiet and keeps the repository root off the path;
and the sdist, what an index gets, holds what its build needs.

The two installs go into one virtual environment made for this module from
one copy of the repository (its tracked sources, not the build's leftovers,
so that the builds write nothing into the working tree).  Each install test
does its own install over whatever the other left, so either runs alone or
first; sharing saves a second venv and a second installation of the
dependencies.  The module takes about a minute on a 2-core machine (each
install test 20 to 30 s), most of it pip building the cffi extension, once
for each install.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from support.driver import wait_for

# Every test here starts processes (pip, a venv's commands, a node).
pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", ".docs-venv", "build", "*.egg-info", "__pycache__", "*.so", "*.o", ".mypy_cache",
    ".pytest_cache", ".hypothesis", "site", "chaos-artifacts", "fulmar-analysis",
)  # fmt: skip
CORE_IMPORTS = """
import fulmar
from fulmar.aeron import Aeron
from fulmar.consensus.client import ClusterClient
from fulmar.service.clustered_service import ClusteredService
from fulmar.service.samples import KeyValueService
from fulmar._native import _fulmar_native
import importlib.util
# The wheel's copy, not the source tree an editable install of the other test pointed at.
assert "site-packages" in fulmar.__file__ and "site-packages" in _fulmar_native.__file__, fulmar.__file__
missing = [name for name in ("pyspark", "numpy", "pytest", "mkdocs", "hdrh") if importlib.util.find_spec(name)]
assert not missing, f"extras installed: {missing}"
print("core imports ok")
"""
STARTED = re.compile(r"driver directory (\S+), logs in")
READY = re.compile(r"node 0 ready: .*; pids (.*?);")


@dataclass
class Installation:
    source: Path
    python: Path
    work: Path  # a directory outside the source: nothing of the repository on the path

    def run(self, *command: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        # The test's own environment (PYTHONPATH, VIRTUAL_ENV) must not help the installed commands.
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(command, cwd=self.work, env=env, capture_output=True, text=True, timeout=timeout_s)

    def pip_install(self, *args: str) -> subprocess.CompletedProcess[str]:
        installed = self.run(str(self.python), "-m", "pip", "install", "--quiet", *args, timeout_s=600)
        assert installed.returncode == 0, installed.stdout + installed.stderr[-5000:]
        return installed


@pytest.fixture(scope="module")
def installation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    base = tmp_path_factory.mktemp("install")
    try:
        source = base / "fulmar-src"
        shutil.copytree(REPO, source, symlinks=True, ignore=IGNORED)
        work = base / "work"
        work.mkdir()
        result = Installation(source, base / "venv" / "bin" / "python", work)
        created = result.run(sys.executable, "-m", "venv", str(base / "venv"))
        assert created.returncode == 0, created.stderr
        yield result
    finally:
        # A venv and the builds' files: not left for the end of the session.
        shutil.rmtree(base, ignore_errors=True)


def test_pip_install_without_extras_gives_working_commands(installation: Installation) -> None:
    installation.pip_install(str(installation.source))
    bin_dir = installation.python.parent
    imports = installation.run(str(installation.python), "-c", CORE_IMPORTS)
    assert imports.returncode == 0 and "core imports ok" in imports.stdout, imports.stdout + imports.stderr
    for command, word in (("cluster-node", "start"), ("cluster-tool", "describe")):
        helped = installation.run(str(bin_dir / command), "--help")
        assert helped.returncode == 0 and word in helped.stdout, helped.stdout + helped.stderr

    # The commands that need the spark extra say so (exit 2: it is not installed).
    work = installation.work / "lean"
    archive = work / "archive"
    archive.mkdir(parents=True)
    analyze = installation.run(str(bin_dir / "cluster-tool"), "analyze", "--archive-dir", str(archive))
    assert analyze.returncode == 2, analyze.stdout + analyze.stderr
    assert "the Spark jobs need the spark extra: pip install 'fulmar[spark]'" in analyze.stderr
    verify = installation.run(str(bin_dir / "cluster-tool"), "verify-log", "--dir", str(work))
    assert verify.returncode == 2 and "pip install 'fulmar[spark]'" in verify.stderr, verify.stderr

    # A node of the lean install starts, serves its readiness and stops in order.
    out_path = work / "start.out"
    with open(out_path, "w") as out:
        node = subprocess.Popen(
            [str(bin_dir / "cluster-node"), "start", "--local", "1", "--dir", str(work / "base")],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    children: list[psutil.Process] = []
    try:
        ready = wait_for(lambda: READY.search(out_path.read_text()) or node.poll() is not None, 60, "the node")
        assert node.poll() is None, out_path.read_text()
        children = [psutil.Process(int(entry.split()[-1])) for entry in ready.group(1).split(", ")]
        node.send_signal(signal.SIGINT)
        assert node.wait(60) == 0, out_path.read_text()
        assert "node 0 stopped cleanly" in out_path.read_text()
    finally:
        if node.poll() is None:
            # Whatever went wrong: the supervisor stops its children in order on SIGTERM; those it
            # started are known even if it never said it was ready.
            children += psutil.Process(node.pid).children(recursive=True)
            node.terminate()
            try:
                node.wait(45)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait(10)
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=10)
        # A driver killed above cannot remove its directory (in /dev/shm, outside the test's).
        started = STARTED.search(out_path.read_text())
        if started:
            shutil.rmtree(started.group(1), ignore_errors=True)


def test_an_editable_install_is_quiet_and_keeps_the_repository_root_off_the_path(
    installation: Installation,
) -> None:
    """``pip install -e`` puts src/ on the path with a plain .pth file: no
    "Editable installation" warning from setuptools' import-hook fallback,
    and the component folders of the root (codecs/, cli/, driver/...) are
    not top-level import names."""
    # As make install does: a pip new enough to show what the build backend warns (the venv's
    # own pip 23 keeps it quiet under --quiet).
    installation.pip_install("--upgrade", "pip")
    installed = installation.pip_install("-e", str(installation.source))
    assert "Editable installation" not in installed.stderr, installed.stderr
    assert "meta path finder" not in installed.stderr, installed.stderr
    source = str(installation.source)
    probe = (
        "import importlib.util, codecs, fulmar.codecs, fulmar.cli.cluster_node\n"
        "from fulmar._native import _fulmar_native\n"
        f"assert fulmar.codecs.__file__.startswith({source!r}), fulmar.codecs.__file__\n"
        f"assert _fulmar_native.__file__.startswith({source!r}), _fulmar_native.__file__\n"
        "assert 'site-packages' not in fulmar.__file__\n"
        # The root's codecs/ stays the package's: the standard library's codecs is untouched.
        "import sysconfig; assert codecs.__file__.startswith(sysconfig.get_path('stdlib')), codecs.__file__\n"
        "assert [n for n in ('cli', 'driver', 'consensus', 'service', 'archive', 'analytics', 'tests', 'bench')"
        " if importlib.util.find_spec(n)] == []\n"
        "print('ok')"
    )
    checked = installation.run(str(installation.python), "-c", probe)
    assert checked.returncode == 0 and "ok" in checked.stdout, checked.stdout + checked.stderr


def test_the_sdist_holds_what_its_build_needs(installation: Installation, tmp_path: Path) -> None:
    """What an index gets is an sdist, which holds the packages under src/ and
    not the root's fulmar/: its build finds the cffi build script (setup.py
    names it) and runs it, up to the compile, which the other tests do.  With
    the test's own setuptools and cffi: this is packaging, not the install."""

    def backend(call: str, cwd: Path) -> str:
        done = subprocess.run(
            [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.{call})"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        return done.stdout.split()[-1]

    dist = tmp_path / "dist"
    name = backend(f"build_sdist({str(dist)!r})", installation.source)  # its egg-info goes into the copy
    with tarfile.open(dist / name) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    backend("get_requires_for_build_wheel()", unpacked)

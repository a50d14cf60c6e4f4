"""``cluster-node backup``: a cluster backup's three processes, configured and supervised.

A backup runs like a node: its own media driver, its own archive and the
backup itself (``cluster-node cluster-backup``), each its own process, started
in that order, each once the one before it printed its readiness line, and
stopped in the reverse order on SIGINT, SIGTERM or SIGHUP.  If one dies, the
supervisor says which and how, shows the end of its log and stops the others.

Configuration (``--config backup.toml``)::

    [backup]   dir (archive/, cluster/, logs/ below it), driver_dir, cluster_id,
               cluster_consensus_endpoints, consensus_endpoint, catchup_endpoint,
               and any other option of ``cluster-node cluster-backup``
               (log_source, backup_interval = "5s", ...); start_timeout, stop_timeout
    [driver]   options of ``cluster-node driver`` (as in a node's file)
    [archive]  options of ``cluster-node archive`` (control_channel, ...)

Keys are the commands' option names with underscores; relative paths are
relative to the file.  ``--local BASE`` backs up the local cluster under BASE
(``cluster-node start --local 3 --dir BASE``): the members' consensus
endpoints come from ``BASE/node0/node.toml``, the backup lives in
``BASE/backup`` with free UDP ports on 127.0.0.1, and the configuration it ran
with is written to ``BASE/backup/backup.toml``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from fulmar.cli.supervisor import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_UNCLEAN_STOP,
    LOCAL_HOST,
    SECRET_ENV,
    Child,
    ChildSpec,
    ConfigError,
    _parent_death_signal,
    _toml_value,
    _write_line,
    describe_exit,
    free_udp_ports,
    local_driver_dir,
    remove_left_driver_dir,
    wait_all,
)
from fulmar.consensus.cluster_member import parse_cluster_members
from fulmar.stop_signals import StopSignals

DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 30.0
_LAUNCHER = "cluster-node backup"


@dataclass
class BackupConfig:
    backup_dir: Path
    driver_dir: Path
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    backup: dict[str, Any] = field(default_factory=dict)  # cluster-backup's options
    driver: dict[str, Any] = field(default_factory=dict)
    archive: dict[str, Any] = field(default_factory=dict)

    @property
    def archive_dir(self) -> Path:
        return self.backup_dir / "archive"

    @property
    def cluster_dir(self) -> Path:
        return self.backup_dir / "cluster"

    @property
    def log_dir(self) -> Path:
        return self.backup_dir / "logs"

    def child_specs(self) -> list[ChildSpec]:
        env = {key: value for key, value in os.environ.items() if key != SECRET_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        backup_env = dict(env)
        archive_env = dict(env)
        credentials = self.backup.get("credentials")
        if credentials:
            backup_env[SECRET_ENV] = str(credentials)  # never on a command line
        # The backup's archive (a copy of the cluster's log, its control
        # channel on UDP) asks for the same secret the members' do: its own
        # [archive] authenticator_secret, else the secret part of the
        # backup's credentials (``user:secret`` or ``secret``).
        archive_secret = self.archive.get("authenticator_secret") or (
            str(credentials).rpartition(":")[2] if credentials else ""
        )
        if archive_secret:
            archive_env[SECRET_ENV] = str(archive_secret)
        driver_dir = str(self.driver_dir)
        step = f"{round(self.stop_timeout_s * 1000)}ms"
        return [
            ChildSpec(
                "media driver",
                "driver",
                [
                    "driver",
                    "--dir",
                    driver_dir,
                    "--stop-after",
                    str(self.cluster_dir),
                    "--stop-after",
                    str(self.archive_dir),
                    "--stop-after-timeout",
                    step,
                    *_flags(self.driver),
                ],
                "media driver pid",
                env,
                _LAUNCHER,
            ),
            ChildSpec(
                "archive",
                "archive",
                [
                    "archive",
                    "--dir",
                    str(self.archive_dir),
                    "--driver-dir",
                    driver_dir,
                    "--stop-after",
                    str(self.cluster_dir),
                    "--stop-after-timeout",
                    step,
                    *_flags({k: v for k, v in self.archive.items() if k != "authenticator_secret"}),
                ],
                "archive pid",
                archive_env,
                _LAUNCHER,
            ),
            ChildSpec(
                "cluster backup",
                "backup",
                [
                    "cluster-backup",
                    "--cluster-dir",
                    str(self.cluster_dir),
                    "--driver-dir",
                    driver_dir,
                    *_flags({k: v for k, v in self.backup.items() if k != "credentials"}),
                ],
                "cluster backup pid",
                backup_env,
                _LAUNCHER,
            ),
        ]

    def to_toml(self) -> str:
        lines = [
            "# written by cluster-node backup",
            "[backup]",
            f"dir = {_toml_value(str(self.backup_dir))}",
            f"driver_dir = {_toml_value(str(self.driver_dir))}",
        ]
        lines += [f"{key} = {_toml_value(value)}" for key, value in self.backup.items() if key != "credentials"]
        archive = {key: value for key, value in self.archive.items() if key != "authenticator_secret"}
        for section, values in (("driver", self.driver), ("archive", archive)):
            if values:
                lines += ["", f"[{section}]"] + [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        return "\n".join(lines) + "\n"


def _flags(values: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            continue
        else:
            args += [flag, str(value)]
    return args


def read_backup_config(path: Path) -> BackupConfig:
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: {error}") from None
    unknown = set(document) - {"backup", "driver", "archive"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(unknown))} (expected backup, driver, archive)")
    backup = dict(document.get("backup", {}))
    here = path.parent

    def resolved(value: Any) -> Path:
        candidate = Path(str(value)).expanduser()
        return candidate if candidate.is_absolute() else (here / candidate).absolute()

    if "dir" not in backup:
        raise ConfigError(f"{path}: [backup] dir is required (the backup's archive/, cluster/ and logs/ go there)")
    if "cluster_consensus_endpoints" not in backup:
        raise ConfigError(f"{path}: [backup] cluster_consensus_endpoints is required (host:port,...)")
    if "catchup_endpoint" not in backup:
        raise ConfigError(f"{path}: [backup] catchup_endpoint is required (host:port)")
    backup_dir = resolved(backup.pop("dir"))
    driver_dir = resolved(backup.pop("driver_dir")) if "driver_dir" in backup else default_backup_driver_dir(backup_dir)
    start = float(backup.pop("start_timeout", DEFAULT_START_TIMEOUT_S))
    stop = float(backup.pop("stop_timeout", DEFAULT_STOP_TIMEOUT_S))
    return BackupConfig(
        backup_dir, driver_dir, start, stop, backup, dict(document.get("driver", {})), dict(document.get("archive", {}))
    )


def default_backup_driver_dir(backup_dir: Path) -> Path:
    return local_driver_dir(backup_dir.parent, backup_dir.name)


def local_backup_config(base: Path) -> BackupConfig:
    """The configuration of a backup of the local cluster under ``base``."""
    node_file = base / "node0" / "node.toml"
    try:
        node = tomllib.loads(node_file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"--local {base}: no local cluster's configuration in {node_file}: {error}") from None
    members_text = node.get("consensus", {}).get("cluster_members", "")
    if not members_text:
        raise ConfigError(
            f"--local {base}: {node_file} names no cluster members (a cluster of one has no "
            "consensus endpoints to back up from)"
        )
    members = parse_cluster_members(members_text)
    archive_port, consensus_port, catchup_port = free_udp_ports(3)
    backup_dir = base / "backup"
    return BackupConfig(
        backup_dir,
        default_backup_driver_dir(backup_dir),
        backup={
            "cluster_id": int(node.get("node", {}).get("cluster_id", 0)),
            "cluster_consensus_endpoints": ",".join(m.consensus_endpoint for m in members),
            "consensus_endpoint": f"{LOCAL_HOST}:{consensus_port}",
            "catchup_endpoint": f"{LOCAL_HOST}:{catchup_port}",
        },
        archive={
            "control_channel": f"aeron:udp?endpoint={LOCAL_HOST}:{archive_port}",
            "replication_channel": f"aeron:udp?endpoint={LOCAL_HOST}:0",
        },
    )


class BackupSupervisor:
    """Start the backup's processes in order, supervise them, stop them in reverse order."""

    def __init__(self, config: BackupConfig) -> None:
        self.config = config
        for directory in (config.backup_dir, config.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.children = [Child(spec, config.log_dir) for spec in config.child_specs()]
        self._signals = StopSignals()
        self._preexec = _parent_death_signal()

    def say(self, text: str) -> None:
        _write_line(sys.stdout, text)

    def warn(self, text: str) -> None:
        _write_line(sys.stderr, f"cluster-node backup: {text}")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.on_signal(signum, time.monotonic_ns())

    def run(self) -> int:
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {signum: signal.signal(signum, self._on_signal) for signum in handled}
        try:
            return self._run()
        finally:
            try:
                for child in self.children:
                    child.kill()
                wait_all(self.children, 10)
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    def _run(self) -> int:
        config = self.config
        self.say(
            f"cluster backup: directory {config.backup_dir}, driver directory {config.driver_dir}, "
            f"logs in {config.log_dir}; members {config.backup.get('cluster_consensus_endpoints')}"
        )
        for child in self.children:
            if self._signals.requested is not None:
                return self._stop(clean_request=True)
            try:
                child.start(self._preexec)
            except OSError as error:
                self.warn(f"cannot start the {child.name}: {error}")
                self._stop(clean_request=False)
                return EXIT_FAILURE
            deadline = time.monotonic() + config.start_timeout_s
            while not child.is_ready():
                dead = next((c for c in self.children if c.started and c.poll() is not None), None)
                if dead is not None:
                    self._report_death(dead, "while starting")
                    self._stop(clean_request=False)
                    return EXIT_FAILURE
                if time.monotonic() > deadline:
                    self.warn(
                        f"the {child.name} (pid {child.pid}) printed no readiness line within "
                        f"{config.start_timeout_s:g} s"
                    )
                    self._stop(clean_request=False)
                    return EXIT_FAILURE
                if self._signals.requested is not None:
                    return self._stop(clean_request=True)
                time.sleep(0.02)
            line = next((line for line in child.output().splitlines() if child.spec.ready_text in line), "")
            self.say(f"{line.strip()}  [log {child.log_path}]")
        pids = ", ".join(f"{child.spec.log_name} {child.pid}" for child in self.children)
        self.say(f"cluster backup ready: pids {pids}; SIGTERM or Ctrl-C stops it")
        while True:
            if self._signals.requested is not None:
                return self._stop(clean_request=True)
            alive = wait_all(self.children, 0.1, lambda: self._signals.requested is not None)
            dead = next((c for c in self.children if c not in alive and c.poll() is not None), None)
            if dead is not None and self._signals.requested is None:
                self._report_death(dead)
                self._stop(clean_request=False)
                return EXIT_FAILURE

    def _report_death(self, child: Child, when: str = "") -> None:
        assert child.returncode is not None
        tail = "\n".join(f"    {line}" for line in child.tail())
        self.warn(
            f"{child.name} (pid {child.pid}) died{' ' + when if when else ''}: "
            f"{describe_exit(child.returncode)}\n  last lines of {child.log_path}:\n{tail}"
        )

    def _stop(self, clean_request: bool) -> int:
        """The backup, then the archive, then the driver, each given the stop timeout."""
        clean = True
        for child in reversed(self.children):
            if not child.started:
                continue
            if child.alive:
                child.send(signal.SIGTERM)
                alive = wait_all([child], self.config.stop_timeout_s, lambda: self._signals.immediate)
                if alive:
                    self.warn(f"{child.name} (pid {child.pid}) still running: killing it (SIGKILL)")
                    child.kill()
                    wait_all([child], 10)
            code = child.returncode
            how = (
                "killed by the supervisor (SIGKILL)"
                if child.killed
                else describe_exit(code if code is not None else -1)
            )
            self.say(f"{child.name} (pid {child.pid}) {how}")
            clean &= code == 0 and not child.killed
        done = remove_left_driver_dir(self.config.driver_dir, self.children[0], self.children)
        if done is not None:
            self.say(done)
        if not clean_request:
            return EXIT_FAILURE
        if clean:
            self.say("cluster backup stopped cleanly")
            return EXIT_OK
        self.warn("cluster backup stopped, but not cleanly (see above)")
        return EXIT_UNCLEAN_STOP


def run_backup(config: BackupConfig) -> int:
    return BackupSupervisor(config).run()

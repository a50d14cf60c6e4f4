"""``cluster-node start``: one node's four processes, configured and supervised.

A node is a media driver, an archive, a consensus module and one or more
clustered service containers, each its own ``cluster-node <command>``
process.  This module turns a configuration (TOML file, command-line flags,
environment, defaults) into those four command lines, starts them in order,
each once the one before it printed its readiness line, supervises them, and
stops them in order.

Configuration
-------------

A TOML file has up to five tables::

    [node]       member_id, cluster_id, dir, driver_dir, archive_dir, cluster_dir, log_dir,
                 start_timeout, stop_timeout
    [driver]     the options of ``cluster-node driver`` (ipc_term_length = "16m", ...)
    [archive]    the options of ``cluster-node archive`` (control_channel, segment_length, ...)
    [consensus]  the options of ``cluster-node consensus`` (ingress_channel, session_timeout, ...)
    [service]    service = "module:Class", count = 1, path (where the module is looked for
                 first: default the file's directory, or the current one without a file)

Keys are the commands' option names with underscores (``--ipc-term-length``
is ``ipc_term_length``); sizes and durations take the commands' notation
("64k", "10s") or a plain integer (bytes, nanoseconds).  Relative paths are
relative to the file's directory.  Each value is taken from, in order: the
start command's flag (``--driver-ipc-term-length``), the file, the
environment (``FULMAR_DRIVER_DIR``, ``FULMAR_CLUSTER_SECRET``), the default.
The options of the processes are derived from the commands themselves, so
they cannot drift apart: a value is checked here with the very type the
process will parse it with, and handed to it on its command line (the
secrets through the environment, never on a command line).

A node has one secret: ``[consensus] authenticator_secret`` (or
``FULMAR_CLUSTER_SECRET``) makes the cluster's clients present it, and the
archive takes the same one for its control sessions from the network unless
``[archive] authenticator_secret`` names another; the consensus module (and
the services, when they reach the archive over UDP) are handed the archive's
secret to present to it and to the other members' archives.  The members
prove to each other that they are members with ``[consensus] member_secret``
(``FULMAR_MEMBER_SECRET``), else with the cluster's secret: the consensus
module signs its consensus messages with it and the driver the datagrams of
the channels between members.

Supervision
-----------

Each process writes its output to ``<log_dir>/<name>.log``.  The supervisor
waits for their exits on pidfds, waking at least once per duty cycle (100 ms).
When one dies unexpectedly it says which, how (exit code or signal) and the
last lines of its log, stops the others in order and exits 1.  The cluster
may stop the node itself (``cluster-tool shutdown`` or ``abort``, the leader
stopping its followers), and so may a stop signal to the consensus module
alone: the module and the services then stop by themselves, each saying so on
a pipe of its own (``fulmar.orderly_stop``: exit code 0 without that is a
death), and the supervisor stops the archive and the driver, says once why and
at which log position the node stopped, and exits 0.  SIGINT,
SIGTERM or SIGHUP stop the node in order: SIGTERM to the consensus module
(it takes a snapshot and stops the services at one log position), then the
archive, then the driver; whatever does not stop within the stop timeout is
killed, and said so.  A second Ctrl-C (a SIGINT half a second or more after
the first) kills what is left at once; a repeated SIGTERM, or a SIGTERM with
the Ctrl-C, is the same request (``fulmar.stop_signals``).  Children run in
their own process group (a Ctrl-C in the terminal reaches only the
supervisor, which stops them in order) and get SIGTERM if the supervisor
itself dies.  A service manager may signal every process of the node at once
(systemd's KillMode=control-group): the consensus module takes its snapshot
and stops as on the supervisor's SIGTERM, the archive waits for the module
and services of its cluster directory to stop, and the driver for them and
the archive (each bounded; ``--stop-after`` of ``cluster-node archive`` and
``driver``), so the node still stops in order.

Local clusters
--------------

``--local N`` (N = 1, 3 or 5) generates the configuration of every member
under one base directory (``node<i>/``, each with the ``node.toml`` it ran
with, which ``--config`` starts again on its own).  Each member gets five free
UDP ports on 127.0.0.1 (ingress, consensus, log, catch-up, archive control;
with ``--ingress-port P`` member i's ingress is P + i), from which the cluster
members string is built.  A base that holds them already starts again on
them (``reuse_local_cluster``): the same ports and settings, flags that
contradict them refused.  The N nodes run from one command, each supervised as
above, side by side: a node whose process dies is reported and stopped while
the others keep running; a signal stops all nodes in parallel, each in order;
the command ends when no node is left.  ``--local 1`` is a single node without
a members string, as before.
"""

from __future__ import annotations

import ctypes
import difflib
import functools
import getpass
import hashlib
import math
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import click
import psutil

from fulmar import log_lines
from fulmar.channel_uri import ChannelUri
from fulmar.cli.options import ARCHIVE_SECRET_ENV, MEMBER_SECRET_ENV, Duration, Size, format_duration, format_size
from fulmar.consensus.cluster_member import ClusterMember, ClusterMembersError, parse_cluster_members
from fulmar.consensus.protocol import NULL_VALUE as NULL_MEMBER_ID
from fulmar.cpu_policy import CPU_POLICIES, CPU_POLICY_ENV, DEFAULT_CPU_POLICY
from fulmar.orderly_stop import STOP_REPORT_FD_ENV, OrderlyStop, read_report
from fulmar.permissions import make_directory
from fulmar.stop_signals import StopSignals, block_stop_signals

EXIT_OK = 0
EXIT_FAILURE = 1  # a process died, or could not start
EXIT_CONFIG = 2  # the configuration is wrong (click's usage errors exit 2 too)
EXIT_UNCLEAN_STOP = 3  # stopped on request, but something had to be killed or failed to stop

SECTIONS = ("node", "driver", "archive", "consensus", "service")
DUTY_CYCLE_S = 0.1
# After a process died the node cannot stop in order (a consensus module
# waits for a dead service's acknowledgement; a service for a dead module's
# counters to go): the others get this long after SIGTERM before SIGKILL.
FAILURE_STOP_TIMEOUT_S = 5.0
LOG_TAIL_LINES = 12
DEFAULT_LOCAL_SERVICE = "fulmar.service.samples:KeyValueService"
SECRET_ENV = "FULMAR_CLUSTER_SECRET"

# Options of the process commands that the node configuration sets itself
# (directories, identity, the service list) rather than mirroring.
_DERIVED = {
    # The driver's member secret is the node's [consensus] member_secret (or its
    # cluster secret), handed to it in its environment: one place to set it.
    "driver": {"directory", "stop_after", "stop_after_timeout", "member_secret"},
    "archive": {"archive_dir", "driver_dir", "stop_after", "stop_after_timeout"},
    "consensus": {"cluster_dir", "driver_dir", "member_id", "cluster_id", "service_count", "archive_secret"},
    "service": {
        "cluster_dir",
        "driver_dir",
        "service_name",
        "service_id",
        "member_id",
        "cluster_id",
        "archive_control_channel",
        "archive_secret",
    },
}


class ConfigError(click.ClickException):
    """A configuration that cannot start a node; exits 2 with the message."""

    exit_code = EXIT_CONFIG


def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def shm_root() -> Path | None:
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else None


def default_node_dir(member_id: int) -> Path:
    return Path(f"/var/tmp/fulmar-{user_name()}/node{member_id}")


def default_driver_dir(member_id: int, node_dir: Path) -> Path:
    """``/dev/shm/fulmar-<user>-node<N>``, or ``<node dir>/driver`` without /dev/shm."""
    root = shm_root()
    return root / f"fulmar-{user_name()}-node{member_id}" if root else node_dir / "driver"


def default_local_base() -> Path:
    return Path(f"/var/tmp/fulmar-{user_name()}/local-cluster")


# A directory name (and so its part of it) must stay within NAME_MAX (255 bytes).
_LOCAL_NAME_CHARS = 40


def local_driver_dir(base: Path, part: str) -> Path:
    """``/dev/shm/fulmar-<user>-<basename>-<hash>-<part>`` for the ``part``
    (``node<i>``, ``backup``) of the local cluster under ``base``
    (``base/<part>/driver`` without /dev/shm).  The hash, of the resolved base
    path, keeps two bases of the same name (/tmp/a/c3 and /tmp/b/c3) apart;
    the base's name keeps it readable."""
    root = shm_root()
    if root is None:
        return base / part / "driver"
    resolved = base.resolve()
    digest = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:8]
    name = resolved.name[:_LOCAL_NAME_CHARS] or "root"
    return root / f"fulmar-{user_name()[:_LOCAL_NAME_CHARS]}-{name}-{digest}-{part}"


# ---------------------------------------------------------------------------- options


@dataclass
class Option:
    """One configurable value: its TOML place, its start flag, how to check it
    and how to hand it to the process that uses it."""

    section: str
    key: str
    param_type: click.ParamType
    help: str
    default_text: str | None = None  # shown in --help (None: the process's own default, not shown)
    is_flag: bool = False
    envvar: str | None = None
    secret: bool = False  # passed to the process in its environment, never on a command line
    child_opts: tuple[str, ...] = ()  # the process's flag (and its --no- form for booleans)
    flag: str = ""  # the start command's flag

    def __post_init__(self) -> None:
        if not self.flag:
            self.flag = f"--{self.section}-{self.key.replace('_', '-')}"

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def place(self) -> str:
        return f"[{self.section}] {self.key}"

    def convert(self, value: Any, where: str) -> Any:
        """The value checked with the process's own option type; ``where`` names its source."""
        if self.is_flag:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {self.place} must be true or false, not {value!r}")
            return value
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{where}: {self.place} must be a single value, not {value!r}")
        if isinstance(value, bool):
            raise ConfigError(f"{where}: {self.place} must not be a boolean ({value!r})")
        try:
            return self.param_type.convert(value, None, None)
        except click.BadParameter as error:
            raise ConfigError(f"{where}: {self.place} = {value!r}: {error.message}") from None

    def child_args(self, value: Any) -> list[str]:
        """The process's command-line arguments for ``value``."""
        if self.secret or not self.child_opts:
            return []
        if self.is_flag:
            if value:
                return [self.child_opts[0]]
            return [self.child_opts[1]] if len(self.child_opts) > 1 else []
        return [self.child_opts[0], self.text(value)]

    def text(self, value: Any) -> str:
        """The value as its command would read it (sizes and durations with units)."""
        if isinstance(self.param_type, Duration):
            return format_duration(int(value))
        if isinstance(self.param_type, Size):
            return format_size(int(value))
        return str(value)


def _node_options() -> list[Option]:
    path = click.Path(file_okay=False, dir_okay=True)
    return [
        Option("node", "member_id", click.IntRange(0, 2**31 - 1), "This node's member id.", "0", flag="--member-id"),
        Option("node", "cluster_id", click.INT, "The cluster's id (shared by its members).", "0", flag="--cluster-id"),
        Option(
            "node",
            "dir",
            path,
            "The node's directory: logs/, archive/, cluster/ (with --local: the "
            "base directory of the whole cluster, node<i>/ under it).",
            "/var/tmp/fulmar-<user>/node<member_id>",
            flag="--dir",
        ),
        Option(
            "node",
            "driver_dir",
            path,
            "The media driver's directory (cnc.dat, log buffers).",
            "/dev/shm/fulmar-<user>-node<member_id>",
            envvar="FULMAR_DRIVER_DIR",
            flag="--driver-dir",
        ),
        Option("node", "archive_dir", path, "The archive's directory.", "<dir>/archive", flag="--archive-dir"),
        Option(
            "node",
            "cluster_dir",
            path,
            "The cluster directory (recording.log, mark files).",
            "<dir>/cluster",
            flag="--cluster-dir",
        ),
        Option(
            "node",
            "log_dir",
            path,
            "Where each process's output goes (driver.log, archive.log, consensus.log, service<i>.log).",
            "<dir>/logs",
            flag="--log-dir",
        ),
        Option(
            "node",
            "start_timeout",
            Duration(min_ns=1_000_000),
            "How long each process may take to print its readiness line.",
            "60s",
            flag="--start-timeout",
        ),
        Option(
            "node",
            "stop_timeout",
            Duration(min_ns=1_000_000),
            "How long each step of an orderly stop may take before what is left is killed.",
            "30s",
            flag="--stop-timeout",
        ),
        Option(
            "node",
            "metrics_port",
            click.IntRange(0, 65535),
            "Serve the node's metrics for Prometheus "
            "(/metrics), /health and /leader over HTTP on this TCP port, from the supervisor (0: any free "
            "port; with --local: member i's is this + i).  Default: not served.",
            None,
            flag="--metrics-port",
        ),
        Option(
            "node",
            "metrics_host",
            click.STRING,
            "The address the metrics are served on (0.0.0.0: every interface).",
            "127.0.0.1",
            flag="--metrics-host",
        ),
        Option(
            "node",
            "log_format",
            click.Choice(log_lines.LOG_FORMATS),
            "The form of the node's log lines: "
            "plain text, or JSON, one object per line (time, process, member, level, event, fields); "
            "passed to every process of the node.",
            log_lines.PLAIN,
            flag="--log-format",
        ),
        Option(
            "node",
            "cpu_policy",
            click.Choice(CPU_POLICIES),
            "How Linux schedules the node's processes: batch (SCHED_BATCH: no wake-up preemption, so a "
            "woken process does not take the core from the one that woke it) or normal (Linux's default).",
            DEFAULT_CPU_POLICY,
            envvar=CPU_POLICY_ENV,
            flag="--cpu-policy",
        ),
    ]


# The [service] keys the node itself reads (the rest mirror ``cluster-node service``).
_SERVICE_PLACES = {("service", "service"), ("service", "count"), ("service", "path")}


def _service_options() -> list[Option]:
    return [
        Option(
            "service", "service", click.STRING, "The clustered service to run, as module:Class.", None, flag="--service"
        ),
        Option(
            "service",
            "count",
            click.IntRange(1, 64),
            "How many service containers (service ids 0..count-1), each running the service.",
            "1",
            flag="--service-count",
        ),
        Option(
            "service",
            "path",
            click.Path(file_okay=False, dir_okay=True),
            "The directory the service's module is looked for in first (before Python's path): it goes "
            "first on the service containers' PYTHONPATH.",
            "the directory of the --config file; else the current directory",
            flag="--service-path",
        ),
    ]


def _mirrored_options(section: str, command: click.Command) -> list[Option]:
    """The options of ``cluster-node <section>`` the node configuration passes through."""
    options = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.name is None or param.name in _DERIVED[section]:
            continue
        if param.name in ("help",):
            continue
        default = param.default
        if param.is_flag:
            default_text = "true" if default is True else "false"
        elif default is None or callable(default) or not isinstance(default, (str, int, float)):
            default_text = None  # unset (click's sentinel) or computed: the process's own default
        else:
            default_text = str(default)
        envvar = param.envvar if isinstance(param.envvar, str) else None
        options.append(
            Option(
                section,
                param.name,
                param.type,
                param.help or "",
                default_text,
                is_flag=bool(param.is_flag),
                envvar=envvar,
                # Secrets reach a process through its environment only (never a
                # command line or the resolved node.toml).
                secret=envvar in (SECRET_ENV, MEMBER_SECRET_ENV),
                child_opts=(*param.opts, *param.secondary_opts),
            )
        )
    return options


def build_options(commands: Mapping[str, click.Command]) -> list[Option]:
    """Every configurable value of ``cluster-node start``, mirroring the process commands."""
    options = _node_options()
    for section in ("driver", "archive", "consensus"):
        options.extend(_mirrored_options(section, commands[section]))
    options.extend(_service_options())
    options.extend(_mirrored_options("service", commands["service"]))
    return options


def click_options(options: list[Option]) -> Callable[[Any], Any]:
    """Decorate the start command with one flag per option (default None: unset)."""

    def decorate(function: Any) -> Any:
        for option in reversed(options):
            where = f"{option.place}"
            extra = f" [config: {where}]"
            if option.envvar:
                extra += f" [env: {option.envvar}]"
            if option.default_text is not None:
                shown = option.default_text or '""'  # an empty default, visibly
                extra += f" [default: {shown}]"
            text = option.help.strip()
            help_text = (text if text.endswith((".", "]")) else text + ".") + extra if text else extra.strip()
            # default None: the flag was not given (shown defaults are in the help text).
            if option.is_flag:
                name = option.flag.lstrip("-")
                decls = [f"--{name}/--no-{name}", option.dest]
                function = click.option(*decls, default=None, help=help_text, show_default=False)(function)
            else:
                function = click.option(
                    option.flag, option.dest, type=option.param_type, default=None, help=help_text, show_default=False
                )(function)
        return function

    return decorate


# ---------------------------------------------------------------------------- configuration


@dataclass
class ChildSpec:
    name: str  # "media driver", "archive", "consensus module", "service 0"
    log_name: str  # driver, archive, consensus, service0
    args: list[str]
    ready_text: str
    env: dict[str, str]
    launcher: str = "cluster-node start"  # who started it, in the log's header line
    # The form of its log (its header line's too); by default what this process was told.
    log_format: str = field(default_factory=lambda: os.environ.get(log_lines.LOG_FORMAT_ENV, log_lines.PLAIN))
    member: int | None = None  # the member it belongs to, in JSON log lines
    # It says on a pipe of its own when it stopped in order (fulmar.orderly_stop):
    # the consensus module and the services, which a cluster stops.
    reports_stop: bool = False


@dataclass
class NodeConfig:
    member_id: int
    cluster_id: int
    node_dir: Path
    driver_dir: Path
    archive_dir: Path
    cluster_dir: Path
    log_dir: Path
    start_timeout_s: float
    stop_timeout_s: float
    service: str
    service_count: int
    ingress_channel: str
    service_path: Path = field(default_factory=Path.cwd)  # where the service's module is looked for first
    metrics_port: int | None = None  # None: no metrics served
    metrics_host: str = "127.0.0.1"
    log_format: str = log_lines.PLAIN
    cpu_policy: str = DEFAULT_CPU_POLICY
    values: dict[tuple[str, str], Any] = field(default_factory=dict)  # set values of the mirrored options
    # Every value that was set (flag, file, environment), by place: [node] and [service] ones too.
    settings: dict[tuple[str, str], Any] = field(default_factory=dict)
    # Where each of them came from: a flag, a file's path, an environment variable, "--local".
    sources: dict[tuple[str, str], str] = field(default_factory=dict)
    options: dict[tuple[str, str], Option] = field(default_factory=dict)

    def child_specs(self) -> list[ChildSpec]:
        base_env = {
            key: value
            for key, value in os.environ.items()
            if key not in (SECRET_ENV, ARCHIVE_SECRET_ENV, MEMBER_SECRET_ENV)
        }
        base_env["PYTHONUNBUFFERED"] = "1"
        base_env[log_lines.LOG_FORMAT_ENV] = self.log_format
        base_env[CPU_POLICY_ENV] = self.cpu_policy
        base_env[log_lines.LOG_MEMBER_ENV] = str(self.member_id)

        def mirrored(section: str) -> list[str]:
            args: list[str] = []
            for (value_section, key), value in self.values.items():
                if value_section == section:
                    args += self.options[(section, key)].child_args(value)
            return args

        driver_dir = str(self.driver_dir)
        identity = ["--member-id", str(self.member_id), "--cluster-id", str(self.cluster_id)]
        consensus_env = dict(base_env)
        secret = self.values.get(("consensus", "authenticator_secret"))
        if secret:
            consensus_env[SECRET_ENV] = str(secret)
        # One secret for the node: the archive's is the cluster's unless set
        # apart; whoever talks to the archive is handed it (never on a command line).
        archive_env = dict(base_env)
        archive_secret = self.values.get(("archive", "authenticator_secret")) or secret
        if archive_secret:
            archive_env[SECRET_ENV] = str(archive_secret)
            consensus_env[ARCHIVE_SECRET_ENV] = str(archive_secret)
        # The members' secret (its own, else the cluster's) signs the consensus
        # messages and, in the driver, the MACs of the datagrams of the log and
        # replay channels between members (``datagram-mac=true``).
        driver_env = dict(base_env)
        member_secret = self.values.get(("consensus", "member_secret"))
        if member_secret:
            consensus_env[MEMBER_SECRET_ENV] = str(member_secret)
        if self.values.get(("consensus", "authenticate_members"), True) and (member_secret or secret):
            driver_env[MEMBER_SECRET_ENV] = str(member_secret or secret)
        # A signal to every process of the node at once (a service manager's
        # stop) must still stop it in order: the archive outlasts the consensus
        # module and services (their snapshots go to it), the driver all of
        # them.  Each waits at most as long as the steps before it may take.
        cluster_dir, archive_dir = str(self.cluster_dir), str(self.archive_dir)
        step_ns = round(self.stop_timeout_s * 1e9)
        driver_stop = [
            "--stop-after",
            cluster_dir,
            "--stop-after",
            archive_dir,
            "--stop-after-timeout",
            format_duration(2 * step_ns),
        ]
        archive_stop = ["--stop-after", cluster_dir, "--stop-after-timeout", format_duration(step_ns)]
        specs = [
            ChildSpec(
                "media driver",
                "driver",
                ["driver", "--dir", driver_dir, *driver_stop, *mirrored("driver")],
                "media driver pid",
                driver_env,
            ),
            ChildSpec(
                "archive",
                "archive",
                ["archive", "--dir", archive_dir, "--driver-dir", driver_dir, *archive_stop, *mirrored("archive")],
                "archive pid",
                archive_env,
            ),
            ChildSpec(
                "consensus module",
                "consensus",
                [
                    "consensus",
                    "--cluster-dir",
                    str(self.cluster_dir),
                    "--driver-dir",
                    driver_dir,
                    *identity,
                    "--service-count",
                    str(self.service_count),
                    *mirrored("consensus"),
                ],
                "consensus module pid",
                consensus_env,
                reports_stop=True,
            ),
        ]
        archive_control = self.values.get(("consensus", "archive_control_channel"))
        service_env = dict(base_env)
        python_path = [str(self.service_path), *filter(None, base_env.get("PYTHONPATH", "").split(os.pathsep))]
        service_env["PYTHONPATH"] = os.pathsep.join(python_path)
        if archive_secret and archive_control is not None and not str(archive_control).startswith("aeron:ipc"):
            # A service that reaches its archive over UDP presents the secret
            # (over IPC, the default, it needs none and is not given it).
            service_env[ARCHIVE_SECRET_ENV] = str(archive_secret)
        for service_id in range(self.service_count):
            args = [
                "service",
                "--cluster-dir",
                str(self.cluster_dir),
                "--driver-dir",
                driver_dir,
                "--service",
                self.service,
                "--service-id",
                str(service_id),
                *identity,
                *mirrored("service"),
            ]
            if archive_control is not None:
                args += ["--archive-control-channel", str(archive_control)]
            specs.append(
                ChildSpec(
                    f"service {service_id}",
                    f"service{service_id}",
                    args,
                    f"service {service_id} (",
                    service_env,
                    reports_stop=True,
                )
            )
        for spec in specs:
            spec.log_format, spec.member = self.log_format, self.member_id
            if self.log_format != log_lines.PLAIN:  # on the command line too, where the header line shows it
                spec.args = ["--log-format", self.log_format, *spec.args]
        return specs

    def to_toml(self) -> str:
        """The configuration as a file ``cluster-node start --config`` reads back."""
        lines = ["# written by cluster-node start", "[node]"]
        node: dict[str, Any] = {
            "member_id": self.member_id,
            "cluster_id": self.cluster_id,
            "dir": str(self.node_dir),
            "driver_dir": str(self.driver_dir),
            "archive_dir": str(self.archive_dir),
            "cluster_dir": str(self.cluster_dir),
            "log_dir": str(self.log_dir),
        }
        if self.metrics_port is not None:
            node.update(metrics_port=self.metrics_port, metrics_host=self.metrics_host)
        if self.log_format != log_lines.PLAIN:
            node["log_format"] = self.log_format
        if self.cpu_policy != DEFAULT_CPU_POLICY:
            node["cpu_policy"] = self.cpu_policy
        lines += [f"{key} = {_toml_value(value)}" for key, value in node.items()]
        for section in ("driver", "archive", "consensus", "service"):
            entries = [
                (key, value)
                for (s, key), value in self.values.items()
                if s == section and not self.options[(s, key)].secret
            ]
            if section == "service":
                lines += ["", "[service]", f"service = {_toml_value(self.service)}", f"count = {self.service_count}"]
                lines.append(f"path = {_toml_value(str(self.service_path))}")
            elif entries:
                lines += ["", f"[{section}]"]
            for key, value in entries:
                option = self.options[(section, key)]
                shown = value if option.is_flag or isinstance(value, str) else option.text(value)
                lines.append(f"{key} = {_toml_value(shown)}")
        lines.append("")
        return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def read_toml(path: Path) -> dict[str, dict[str, Any]]:
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    for name, table in document.items():
        if name not in SECTIONS:
            raise ConfigError(
                f"{path}: unknown table [{name}]{_did_you_mean(name, SECTIONS, '[{}]')} (known: {', '.join(SECTIONS)})"
                if isinstance(table, dict)
                else f"{path}: unknown key {name!r} at the top level: every key belongs in a table "
                f"({', '.join(f'[{s}]' for s in SECTIONS)})"
            )
    return document


def _did_you_mean(name: str, known: Iterable[str], form: str = "{!r}") -> str:
    """``; did you mean 'x'?`` (or 'x' or 'y') for the known names closest to ``name``, else ''."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(form.format(c) for c in close)}?" if close else ""


def resolve_config(
    options: list[Option],
    flags: Mapping[str, Any],
    config_path: Path | None = None,
    generated: Mapping[tuple[str, str], Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> NodeConfig:
    """The node's configuration: each value from the flag, else the file (or
    the generated --local layer), else the environment, else the default."""
    env = os.environ if env is None else env
    by_place = {(option.section, option.key): option for option in options}
    layer: dict[tuple[str, str], tuple[Any, str]] = {}  # value, where it came from
    base_dir = Path.cwd()
    if config_path is not None:
        base_dir = config_path.resolve().parent
        document = read_toml(config_path)
        for section, table in document.items():
            known = sorted(key for s, key in by_place if s == section)
            for key, value in table.items():
                if (section, key) not in by_place:
                    elsewhere = [s for s, k in by_place if k == key and s != section]
                    hint = f"; it is a key of [{elsewhere[0]}]" if elsewhere else _did_you_mean(key, known)
                    raise ConfigError(
                        f"{config_path}: unknown key {key!r} in [{section}]{hint} (known: {', '.join(known)})"
                    )
                layer[(section, key)] = (value, str(config_path))
    for place, value in (generated or {}).items():
        layer[place] = (value, "--local")

    resolved: dict[tuple[str, str], Any] = {}
    sources: dict[tuple[str, str], str] = {}
    for option in options:
        place = (option.section, option.key)
        flag_value = flags.get(option.dest)
        if flag_value is not None:
            resolved[place] = flag_value  # click already checked it
            sources[place] = option.flag
        elif place in layer:
            value, where = layer[place]
            resolved[place] = option.convert(value, where)
            sources[place] = where
        elif option.envvar and env.get(option.envvar):
            sources[place] = f"${option.envvar}"
            text: Any = env[option.envvar]
            if option.is_flag:
                # The environment holds text: a flag's variable reads as click
                # reads it for the process itself (true/false, 1/0, yes/no, on/off).
                try:
                    text = click.BOOL.convert(text, None, None)
                except click.BadParameter:
                    raise ConfigError(
                        f"${option.envvar}: {option.place} must be true or false (or 1/0, yes/no, on/off), not {text!r}"
                    ) from None
            resolved[place] = option.convert(text, f"${option.envvar}")

    def path_of(key: str, default: Path, section: str = "node") -> Path:
        value = resolved.get((section, key))
        if value is None:
            return default
        path = Path(os.path.expanduser(str(value)))
        return path if path.is_absolute() else (base_dir / path)

    member_id = int(resolved.get(("node", "member_id"), 0))
    node_dir = path_of("dir", default_node_dir(member_id))
    service = resolved.get(("service", "service"))
    if not service:
        where = f" in {config_path}" if config_path else ""
        raise ConfigError(f'no service to run: set [service] service = "module:Class"{where} or pass --service')
    ingress = resolved.get(("consensus", "ingress_channel"), by_place[("consensus", "ingress_channel")].default_text)
    # What the processes take on their command lines: all but [node] and the service to run.
    values = {place: value for place, value in resolved.items() if place[0] != "node" and place not in _SERVICE_PLACES}
    return NodeConfig(
        member_id=member_id,
        cluster_id=int(resolved.get(("node", "cluster_id"), 0)),
        node_dir=node_dir,
        driver_dir=path_of("driver_dir", default_driver_dir(member_id, node_dir)),
        archive_dir=path_of("archive_dir", node_dir / "archive"),
        cluster_dir=path_of("cluster_dir", node_dir / "cluster"),
        log_dir=path_of("log_dir", node_dir / "logs"),
        start_timeout_s=int(resolved.get(("node", "start_timeout"), 60_000_000_000)) / 1e9,
        stop_timeout_s=int(resolved.get(("node", "stop_timeout"), 30_000_000_000)) / 1e9,
        service=str(service),
        service_count=int(resolved.get(("service", "count"), 1)),
        ingress_channel=str(ingress),
        service_path=path_of("path", base_dir, "service"),
        metrics_port=resolved.get(("node", "metrics_port")),
        metrics_host=str(resolved.get(("node", "metrics_host"), "127.0.0.1")),
        log_format=str(resolved.get(("node", "log_format"), log_lines.PLAIN)),
        cpu_policy=str(resolved.get(("node", "cpu_policy"), DEFAULT_CPU_POLICY)),
        values=values,
        settings=resolved,
        sources=sources,
        options=by_place,
    )


LOCAL_SIZES = (1, 3, 5)  # odd: a majority survives (N - 1) / 2 failed members
# A local cluster's log goes over UDP from the leader to each follower's log
# endpoint; 4m terms (not the 16m of IPC) keep N nodes' log buffers on one
# machine's /dev/shm small.
LOCAL_LOG_CHANNEL = "aeron:udp?term-length=4m"
LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class LocalPorts:
    """The UDP ports of one member of a local cluster (all on 127.0.0.1)."""

    ingress: int
    consensus: int
    log: int
    catchup: int
    archive: int

    def endpoint(self, name: str) -> str:
        return f"{LOCAL_HOST}:{getattr(self, name)}"


# The kernel hands out ports of this range to every bind to port 0 (a driver's
# send endpoints, a replication channel's port 0, any other program's client
# sockets).  A port chosen now and bound later by a node's process (an
# ingress, consensus or log endpoint) must not be in it: between the choice and
# the bind, such a bind elsewhere can take it ("Address already in use").
_EPHEMERAL_RANGE_PATH = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_CHOSEN_PORT = 10_000  # below: well-known and registered services' ports are commoner


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for port-0 binds (Linux's default when unreadable)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE_PATH.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _candidate_ports() -> list[int]:
    """Ports outside the ephemeral range, in random order; empty when none is left."""
    low, high = ephemeral_port_range()
    candidates = [*range(_LOWEST_CHOSEN_PORT, max(_LOWEST_CHOSEN_PORT, low)), *range(high + 1, 65536)]
    random.shuffle(candidates)
    return candidates


def free_udp_port(host: str = LOCAL_HOST) -> int:
    """A UDP port free now on ``host``, outside the ephemeral range (see above)."""
    return free_udp_ports(1, host=host)[0]


def free_udp_ports(count: int, exclude: Iterable[int] = (), host: str = LOCAL_HOST) -> list[int]:
    """``count`` distinct free UDP ports, outside the ephemeral range when the
    range leaves room (else the kernel's choice): the probes stay bound until
    all are chosen, so no port is offered twice."""
    excluded = set(exclude)
    probes: list[socket.socket] = []
    ports: list[int] = []
    candidates = iter(_candidate_ports())
    try:
        while len(ports) < count:
            candidate = next(candidates, 0)
            if candidate in excluded:
                continue
            probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            probes.append(probe)  # an excluded port stays bound too, so it is not offered again
            try:
                probe.bind((host, candidate))
            except OSError:
                if candidate == 0:
                    raise  # the kernel has no port to give either
                continue  # in use: the next one
            port = int(probe.getsockname()[1])
            if port not in excluded:
                ports.append(port)
    finally:
        for probe in probes:
            probe.close()
    return ports


def allocate_local_ports(count: int, first_ingress_port: int | None = None) -> list[LocalPorts]:
    """The ports of each member of a local cluster of ``count``: member i's
    ingress is ``first_ingress_port + i`` when given, every other port a free one."""
    if first_ingress_port:
        last = first_ingress_port + count - 1
        if last > 65535:
            raise ConfigError(
                f"--ingress-port {first_ingress_port}: members 0..{count - 1} take ports "
                f"{first_ingress_port}..{last}, beyond 65535"
            )
        ingress = [first_ingress_port + i for i in range(count)]
        others = free_udp_ports(4 * count, exclude=ingress)
    else:
        ports = free_udp_ports(5 * count)
        ingress, others = ports[:count], ports[count:]
    return [LocalPorts(ingress[i], *others[4 * i : 4 * i + 4]) for i in range(count)]


def local_metrics_ports(first_port: int | None, count: int) -> list[int] | None:
    """Each member's metrics port of a local cluster of ``count``: member i's
    is ``first_port + i`` (0: each a free port; None: no metrics served)."""
    if first_port is None:
        return None
    if first_port == 0:
        return [0] * count
    if first_port + count - 1 > 65535:
        raise ConfigError(
            f"--metrics-port {first_port}: members 0..{count - 1} take ports "
            f"{first_port}..{first_port + count - 1}, beyond 65535"
        )
    return [first_port + i for i in range(count)]


def local_members_string(ports: list[LocalPorts]) -> str:
    """Aeron's cluster members string of a local cluster (member i has id i)."""
    names = ("ingress", "consensus", "log", "catchup", "archive")
    return "|".join(",".join([str(i), *(member.endpoint(name) for name in names)]) for i, member in enumerate(ports))


def local_ingress_endpoints(ports: list[LocalPorts]) -> str:
    """``0=127.0.0.1:p0,1=...``: what a client of a local cluster is given."""
    return ",".join(f"{i}={member.endpoint('ingress')}" for i, member in enumerate(ports))


def local_layer(
    base: Path, member_id: int, ingress_port: int, *, members: str = "", archive_port: int | None = None
) -> dict[tuple[str, str], Any]:
    """The generated configuration of member ``member_id`` of a --local cluster
    under ``base``; with ``members`` (several), also its membership, a UDP log
    and its archive's control endpoint (``archive_port``)."""
    node_dir = base / f"node{member_id}"
    driver_dir = local_driver_dir(base, f"node{member_id}")
    layer: dict[tuple[str, str], Any] = {
        ("node", "member_id"): member_id,
        ("node", "dir"): str(node_dir),
        ("node", "driver_dir"): str(driver_dir),
        ("node", "archive_dir"): str(node_dir / "archive"),
        ("node", "cluster_dir"): str(node_dir / "cluster"),
        ("consensus", "ingress_channel"): f"aeron:udp?endpoint={LOCAL_HOST}:{ingress_port}",
        ("archive", "control_channel"): "none",  # one node: the consensus module uses the local (IPC) channel
        ("archive", "replication_channel"): f"aeron:udp?endpoint={LOCAL_HOST}:0",
    }
    if members:
        assert archive_port is not None
        layer[("consensus", "cluster_members")] = members
        layer[("consensus", "log_channel")] = LOCAL_LOG_CHANNEL
        # The other members reach this archive here (replication, catch-up);
        # its own consensus module still uses the local IPC channel.
        layer[("archive", "control_channel")] = f"aeron:udp?endpoint={LOCAL_HOST}:{archive_port}"
    return layer


def local_cluster_layers(base: Path, ports: list[LocalPorts]) -> list[dict[tuple[str, str], Any]]:
    """The generated configuration of every member of a local cluster (one
    member: the single-node layout, no members string)."""
    if len(ports) == 1:
        return [local_layer(base, 0, ports[0].ingress)]
    members = local_members_string(ports)
    return [
        local_layer(base, i, member.ingress, members=members, archive_port=member.archive)
        for i, member in enumerate(ports)
    ]


# Start flags that would give every member of a --local cluster of several the
# same value where each member needs its own.
LOCAL_PER_MEMBER = (
    ("node", "member_id"),
    ("node", "driver_dir"),
    ("node", "archive_dir"),
    ("node", "cluster_dir"),
    ("node", "log_dir"),
    ("consensus", "ingress_channel"),
    ("consensus", "cluster_members"),
    ("archive", "control_channel"),
)


_NODE_FILE = re.compile(r"node(\d+)")


def local_cluster_files(base: Path) -> dict[int, Path]:
    """The node.toml of each member of a local cluster ``base`` already holds
    (``base/node<i>/node.toml``, which ``cluster-node start --local`` wrote), by member id."""
    files = {}
    if base.is_dir():
        for entry in base.iterdir():
            match = _NODE_FILE.fullmatch(entry.name)
            if match and (entry / "node.toml").is_file():
                files[int(match.group(1))] = entry / "node.toml"
    return dict(sorted(files.items()))


def reuse_local_cluster(
    options: list[Option],
    flags: Mapping[str, Any],
    base: Path,
    files: Mapping[int, Path],
    count: int,
    ingress_port: int | None,
    metrics_ports: list[int] | None,
) -> list[NodeConfig]:
    """The configuration of each member of the local cluster ``base`` holds
    already, read back from its node.toml (its ports and settings kept, so
    that its clients' endpoints still hold); flags that say otherwise are refused."""
    held = len(files)
    ids = list(files)
    fresh = f"choose another --dir for a new cluster (or remove {base})"
    if ids != list(range(held)):
        missing = ", ".join(f"node{i}" for i in range(max(ids) + 1) if i not in files)
        raise ConfigError(
            f"{base} holds a local cluster's configuration, but not every member's: {missing} has no node.toml; "
            f"put it back, or {fresh}"
        )
    if held != count:
        raise ConfigError(
            f"--local {count}: {base} holds a local cluster of {held} member{'s' if held != 1 else ''} "
            f"(node0..node{held - 1}/node.toml), which starts again on its own configuration: run --local {held}, "
            f"or {fresh}"
        )
    configs = [resolve_config(options, {}, files[i]) for i in ids]
    for option in options:
        value = flags.get(option.dest)
        if value is None:
            continue
        for config, path in zip(configs, files.values()):
            stored = config.settings.get((option.section, option.key))
            if stored is None and option.default_text is not None:
                stored = option.convert(option.default_text, "default")
            if isinstance(option.param_type, click.Path) and stored is not None:
                # A flag's path is relative to the current directory, the file's to the file.
                same = Path(str(value)).expanduser().absolute() == path.parent / Path(str(stored)).expanduser()
            else:
                same = value == stored
            if not same:
                shown = "unset" if stored is None else option.text(stored)
                raise ConfigError(
                    f"{option.flag} {option.text(value)}: the local cluster under {base} runs with "
                    f"{option.place} = {shown} ({path}); drop the flag to start it again as it is, edit its "
                    f"node<i>/node.toml files, or {fresh}"
                )
    for i, config in enumerate(configs):
        wanted = {
            "--ingress-port": (
                f"aeron:udp?endpoint={LOCAL_HOST}:{ingress_port + i}" if ingress_port else None,
                config.ingress_channel,
            ),
            "--metrics-port": (metrics_ports[i] if metrics_ports else None, config.metrics_port),
        }
        for flag, (asked, stored) in wanted.items():
            # --metrics-port 0 (any free port) asks only that metrics be served.
            if asked is not None and (stored is None if asked == 0 else asked != stored):
                raise ConfigError(
                    f"{flag}: member {i} of the local cluster under {base} runs with {stored} ({files[i]}); drop "
                    f"the flag to start it again as it is, or {fresh}"
                )
    return configs


def ingress_endpoint(config: NodeConfig) -> str:
    """The endpoint (host:port) of a node's ingress channel, as its clients are given it."""
    return str(ChannelUri.parse(config.ingress_channel).get("endpoint") or config.ingress_channel)


def check_local_flags(options: list[Option], flags: Mapping[str, Any], count: int) -> None:
    if count == 1:
        return  # one member: any flag may override the generated value, as before
    by_place = {(option.section, option.key): option for option in options}
    for place in LOCAL_PER_MEMBER:
        option = by_place[place]
        if flags.get(option.dest) is not None:
            raise ConfigError(
                f"{option.flag} cannot be used with --local {count}: the generated configuration "
                "sets it for each member (see node<i>/node.toml under --dir)"
            )


# ---------------------------------------------------------------------------- membership


class ClusterSettingError(ValueError):
    """Cluster members or election timing that cannot work; ``key`` names the
    ``cluster-node consensus`` option at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message

    @property
    def option(self) -> str:
        return "--" + self.key.replace("_", "-")


def check_membership(members: str, member_id: int, appointed_leader_id: int) -> list[ClusterMember]:
    """The parsed members (empty: a cluster of one), with ``member_id`` and the
    appointed leader among them."""
    if not members.strip():
        if appointed_leader_id not in (NULL_MEMBER_ID, member_id):
            raise ClusterSettingError(
                "appointed_leader_id",
                f"{appointed_leader_id} is not a member: without cluster members this member is the whole cluster",
            )
        return []
    try:
        parsed = parse_cluster_members(members)
    except ClusterMembersError as error:
        raise ClusterSettingError("cluster_members", str(error)) from None
    ids = [member.id for member in parsed]
    known = ", ".join(str(i) for i in ids)
    if member_id not in ids:
        raise ClusterSettingError("member_id", f"{member_id} is not among the cluster members (ids {known})")
    if appointed_leader_id != NULL_MEMBER_ID and appointed_leader_id not in ids:
        raise ClusterSettingError(
            "appointed_leader_id", f"{appointed_leader_id} is not among the cluster members (ids {known})"
        )
    return parsed


def check_timing(
    election_timeout_ns: int,
    election_status_interval_ns: int,
    leader_heartbeat_timeout_ns: int,
    leader_heartbeat_interval_ns: int,
) -> None:
    """Intervals must be shorter than the timeouts they keep from expiring."""
    if leader_heartbeat_interval_ns >= leader_heartbeat_timeout_ns:
        raise ClusterSettingError(
            "leader_heartbeat_interval",
            f"{format_duration(leader_heartbeat_interval_ns)} is not below the leader "
            f"heartbeat timeout ({format_duration(leader_heartbeat_timeout_ns)}): followers would start elections "
            "between two heartbeats of a live leader",
        )
    if election_status_interval_ns >= election_timeout_ns:
        raise ClusterSettingError(
            "election_status_interval",
            f"{format_duration(election_status_interval_ns)} is not below the election "
            f"timeout ({format_duration(election_timeout_ns)}): an election would time out before it heard the others",
        )


# ---------------------------------------------------------------------------- validation


def check_service_spec(spec: str, service_path: Path) -> None:
    """``module:Class`` names an importable ClusteredService subclass (not
    instantiated here), its module looked for in ``service_path`` first, as
    the service containers will."""
    from fulmar.service.container import ServiceLoadError, service_class

    if not service_path.is_dir():
        raise ConfigError(f"[service] path = {str(service_path)!r}: no such directory")
    try:
        service_class(spec, [service_path])
    except ServiceLoadError as error:
        raise ConfigError(str(error)) from None


def _check_channel(option: str, channel: str) -> ChannelUri:
    try:
        return ChannelUri.parse(channel)
    except (ValueError, Exception) as error:  # noqa: BLE001 - the parser's own error type varies
        raise ConfigError(f"{option}: {channel!r} is not a valid channel: {error}") from None


def _check_port_free(option: str, channel: str, fixed: bool = False) -> None:
    uri = _check_channel(option, channel)
    endpoint = uri.get("endpoint") if uri.is_udp else None
    if not endpoint:
        return
    host, _, port_text = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{option}: {channel!r}: endpoint {endpoint!r} has no port") from None
    if port == 0:
        if fixed:
            raise ConfigError(
                f"{option}: {channel!r}: port 0 would be a port nobody knows; clients need a "
                "fixed one (cluster-node start --local picks a free port for you)"
            )
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as error:
        raise ConfigError(f"{option}: {channel!r}: cannot resolve {host!r}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind(address)
        except OSError as error:
            raise ConfigError(
                f"{option}: UDP port {port} on {host} is in use ({error.strerror}); "
                "stop what uses it or choose another port"
            ) from None


def _check_tcp_port_free(place: str, host: str, port: int) -> None:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise ConfigError(f"{place}: cannot resolve {host!r}: {error.strerror}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            probe.bind(address)
        except OSError as error:
            raise ConfigError(
                f"{place}: TCP port {port} on {host} is in use ({error.strerror}); "
                "stop what uses it or choose another port"
            ) from None


def _ensure_dir(what: str, path: Path) -> None:
    try:
        make_directory(path)
    except OSError as error:
        raise ConfigError(f"{what} {path}: cannot create it: {error.strerror or error}") from None
    if not path.is_dir():
        raise ConfigError(f"{what} {path}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path}: not writable")


def _consensus_value(config: NodeConfig, key: str) -> Any:
    """The value the consensus module will run with: set, else its command's default."""
    if ("consensus", key) in config.values:
        return config.values[("consensus", key)]
    option = config.options[("consensus", key)]
    return None if option.default_text is None else option.convert(option.default_text, "default")


def _check_cluster_settings(config: NodeConfig) -> None:
    """The membership and timing checks the consensus module makes at start-up,
    made before anything starts; and this member's own ports free."""
    value = functools.partial(_consensus_value, config)
    try:
        members = check_membership(str(value("cluster_members")), config.member_id, int(value("appointed_leader_id")))
        check_timing(
            value("election_timeout"),
            value("election_status_interval"),
            value("leader_heartbeat_timeout"),
            value("leader_heartbeat_interval"),
        )
    except ClusterSettingError as error:
        place = "[node] member_id" if error.key == "member_id" else f"[consensus] {error.key}"
        raise ConfigError(f"{place}: {error.message}") from None
    own = next((member for member in members if member.id == config.member_id), None)
    if own is None:
        return
    endpoints = [("consensus", own.consensus_endpoint), ("log", own.log_endpoint), ("catchup", own.catchup_endpoint)]
    if not (_check_channel("[consensus] ingress_channel", config.ingress_channel).get("endpoint")):
        endpoints.insert(0, ("ingress", own.ingress_endpoint))  # no endpoint of its own: the member's is bound
    members_origin = origin(config, ("consensus", "cluster_members"))
    for name, endpoint in endpoints:
        _check_port_free(f"{members_origin} (member {own.id}'s {name} endpoint)", f"aeron:udp?endpoint={endpoint}")


def origin(config: NodeConfig, place: tuple[str, str]) -> str:
    """``[section] key``, with where its value came from when it was set: the
    file (``path: [consensus] ingress_channel``), a flag or a variable."""
    text = f"[{place[0]}] {place[1]}"
    source = config.sources.get(place)
    if source is None or source == "--local":
        return text  # the default, or the generated configuration
    if source.startswith(("-", "$")):
        return f"{text} (from {source})"
    return f"{source}: {text}"


def validate(config: NodeConfig) -> None:
    """Check what can be checked before starting anything; create the directories."""
    from fulmar.driver.media_driver import DriverDirectoryError, active_driver_pid, check_reclaimable

    check_service_spec(config.service, config.service_path)
    for (section, key), value in config.values.items():
        if key.endswith("_channel") and isinstance(value, str) and value.lower() != "none":
            _check_channel(f"[{section}] {key}", value)
    _check_port_free(origin(config, ("consensus", "ingress_channel")), config.ingress_channel, fixed=True)
    _check_cluster_settings(config)
    control = config.values.get(
        ("archive", "control_channel"), config.options[("archive", "control_channel")].default_text
    )
    if control and str(control).lower() != "none":
        _check_port_free(origin(config, ("archive", "control_channel")), str(control))
    if config.metrics_port:
        _check_tcp_port_free(origin(config, ("node", "metrics_port")), config.metrics_host, config.metrics_port)
    for what, path in (
        ("node directory", config.node_dir),
        ("archive directory", config.archive_dir),
        ("cluster directory", config.cluster_dir),
        ("log directory", config.log_dir),
    ):
        _ensure_dir(what, path)
    parent = config.driver_dir.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"driver directory {config.driver_dir}: its parent {parent} is missing or not writable")
    try:
        check_reclaimable(config.driver_dir)
    except DriverDirectoryError as error:
        raise ConfigError(f"driver directory: {error}") from None
    pid = active_driver_pid(config.driver_dir, 10_000)
    if pid is not None:
        raise ConfigError(_driver_dir_taken(config, pid))


def _driver_dir_taken(config: NodeConfig, pid: int) -> str:
    """Why the driver directory is not this node's to use: whose node runs the live driver ``pid``."""
    where = f"driver directory {config.driver_dir}: in use by a live media driver (pid {pid})"
    # A driver cluster-node start launched names its node's cluster directory (--stop-after).
    try:
        process = psutil.Process(pid)
        args = process.cmdline()
        parent = process.parent()
        supervisor_pid = parent.pid if parent is not None and "start" in parent.cmdline() else None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        args, supervisor_pid = [], None
    stop_after = [Path(args[i + 1]) for i, arg in enumerate(args[:-1]) if arg == "--stop-after"]
    started_by = f", started by cluster-node start (pid {supervisor_pid})" if supervisor_pid else ""
    if not stop_after:
        return f"{where}, not one of a node's; stop it, or give this node another --driver-dir ([node] driver_dir)"
    owner = stop_after[0]
    if owner.resolve() == config.cluster_dir.resolve():
        return f"{where}{started_by}: this node (cluster directory {owner}) is already running; stop it first"
    return (
        f"{where}{started_by}: the node of {owner.parent} (cluster directory {owner}); stop that node, or "
        "give this one another --driver-dir ([node] driver_dir)"
    )


# ---------------------------------------------------------------------------- processes


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec function: the child gets SIGTERM when the supervisor dies
    (Linux), and starts with SIGINT and SIGTERM blocked until its stop signal
    handlers are in place (``block_stop_signals``), so that a stop in its first
    moments (a Ctrl-C just after the start) is an orderly one."""
    if not sys.platform.startswith("linux"):
        return block_stop_signals
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return block_stop_signals
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        block_stop_signals()
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return preexec


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


class Child:
    """One process of the node, its output going to its log file."""

    def __init__(self, spec: ChildSpec, log_dir: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.log_path = log_dir / f"{spec.log_name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.process: psutil.Process | None = None
        self.returncode: int | None = None
        self.exit_fd: int | None = None  # a pidfd, readable once it exits (None: polled instead)
        self.killed = False  # the supervisor had to SIGKILL it
        self._start_offset = 0
        self._report_fd: int | None = None  # the read end of its orderly stop report's pipe
        # Set once it exited with code 0 having said it stopped in order.
        self.orderly_stop: OrderlyStop | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def started(self) -> bool:
        return self.popen is not None

    def start(self, preexec: Callable[[], None] | None) -> None:
        spec = self.spec
        if spec.log_format == log_lines.JSON:
            header = log_lines.record(
                f"started by {spec.launcher} (pid {os.getpid()})",
                process=spec.name,
                member=spec.member,
                launcher=spec.launcher,
                launcher_pid=os.getpid(),
                args=spec.args,
            )
        else:
            header = (
                f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {spec.launcher} (pid {os.getpid()}): {' '.join(spec.args)}"
            )
        env = self.spec.env
        pass_fds: tuple[int, ...] = ()
        write_fd = None
        if spec.reports_stop:
            self._report_fd, write_fd = os.pipe()
            os.set_blocking(self._report_fd, False)
            env, pass_fds = {**env, STOP_REPORT_FD_ENV: str(write_fd)}, (write_fd,)
        try:
            with open(self.log_path, "ab") as log:
                log.write(f"{header}\n".encode())
                log.flush()
                self._start_offset = log.tell()
                self.popen = subprocess.Popen(
                    [sys.executable, "-m", "fulmar.cli.cluster_node", *self.spec.args],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    process_group=0,
                    preexec_fn=preexec,
                    close_fds=True,
                    pass_fds=pass_fds,
                )
        except BaseException:
            self._close_report_fd()
            raise
        finally:
            if write_fd is not None:
                os.close(write_fd)  # the child's alone: its exit ends the pipe
        self.process = psutil.Process(self.popen.pid)
        self.exit_fd = _exit_fd(self.popen.pid)

    def output(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._start_offset)
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last lines of its output, as text (a JSON line's event)."""
        return [log_lines.event_text(line) for line in self.output().splitlines() if line.strip()][-lines:]

    def is_ready(self) -> bool:
        return self.spec.ready_text in self.output()

    def poll(self) -> int | None:
        """The exit code once it exited (reaped here), else None.  One waitpid
        through the Popen: psutil's wait(timeout=0) costs a pidfd, a poll and
        an exception per call, and the idle supervisor asks each child every cycle."""
        if self.returncode is not None or self.popen is None:
            return self.returncode
        code = self.popen.poll()
        if code is not None:
            self._exited(code)
        return self.returncode

    def _exited(self, code: int | None) -> None:
        # Reaped (by the Popen, or by psutil's wait_procs where there is no
        # pidfd): the Popen object must know, or it would try again.
        self.returncode = int(code) if code is not None else 0
        if self.popen is not None:
            self.popen.returncode = self.returncode
        if self.exit_fd is not None:
            fd, self.exit_fd = self.exit_fd, None
            os.close(fd)
        if self._report_fd is not None:
            # Exited: whatever it wrote is in the pipe.  A report counts only
            # with exit code 0 (a failure after it is a failure).
            report = read_report(self._report_fd)
            self._close_report_fd()
            if self.returncode == 0:
                self.orderly_stop = report

    def _close_report_fd(self) -> None:
        if self._report_fd is not None:
            fd, self._report_fd = self._report_fd, None
            os.close(fd)

    @property
    def alive(self) -> bool:
        return self.started and self.poll() is None

    def send(self, signum: signal.Signals) -> None:
        if self.alive:
            assert self.process is not None
            try:
                self.process.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    def kill(self) -> None:
        if self.alive:
            self.killed = True
            self.send(signal.SIGKILL)


def _exit_fd(pid: int) -> int | None:
    """A pidfd for the child ``pid``, or None where the system has none (not
    Linux, or a kernel before 5.3): its exit is then polled for."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    return fd


def wait_for_exit(children: Iterable[Child], timeout_s: float) -> None:
    """Sleep up to ``timeout_s`` or until one of ``children`` exits, and reap
    the ones that did.  One poll() over all their pidfds (Python's descriptors
    are close-on-exec: no child inherits another's): any child's exit wakes it
    at once, and an idle supervisor wakes once per duty cycle.  (psutil's
    wait_procs waits on one child at a time: the local cluster's supervisor
    woke twice as often, for three times the CPU.)"""
    alive = [child for child in children if child.alive]
    if not alive:
        return
    by_fd = {fd: child for child in alive if (fd := child.exit_fd) is not None}
    if len(by_fd) < len(alive):
        processes = {child.process: child for child in alive if child.process is not None}
        gone, _ = psutil.wait_procs(list(processes), timeout=timeout_s)
        for process in gone:
            processes[process]._exited(getattr(process, "returncode", None))
        return
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    for fd, _ in poller.poll(max(0, math.ceil(timeout_s * 1000))):
        by_fd[fd].poll()


def wait_all(
    children: Iterable[Child], timeout_s: float, interrupted: Callable[[], bool] = lambda: False
) -> list[Child]:
    """Wait (bounded) until every child exited; the ones still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [child for child in children if child.alive]
        if not alive or time.monotonic() >= deadline or interrupted():
            return alive
        wait_for_exit(alive, min(DUTY_CYCLE_S, max(0.0, deadline - time.monotonic())))


def remove_left_driver_dir(directory: Path, driver: Child, children: Iterable[Child]) -> str | None:
    """Remove the driver directory a supervisor configured (``directory``)
    and whose driver it started, when that driver left it behind (killed, it
    could not remove it) and no process of the node is left; what was done, or None.

    Only a directory that holds nothing but a driver's files and that no live
    driver uses (another may have taken it meanwhile) is removed."""
    from fulmar.driver.media_driver import DriverDirectoryError, active_driver_pid, check_reclaimable

    if not driver.started or driver.returncode is None or any(child.alive for child in children):
        return None
    if not directory.is_dir():
        return None  # the driver removed it itself, as it does when it stops in order
    try:
        check_reclaimable(directory)
    except DriverDirectoryError:
        return None  # other files in it: not the driver's to lose
    if active_driver_pid(directory, 10_000) is not None:
        return None
    how = "killed by the supervisor (SIGKILL)" if driver.killed else describe_exit(driver.returncode)
    try:
        shutil.rmtree(directory)
    except OSError as error:
        return (
            f"the media driver (pid {driver.pid}, {how}) left its directory {directory} behind, which could not be "
            f"removed: {error.strerror or error}; remove it by hand"
        )
    return f"removed the driver directory {directory}, which the media driver (pid {driver.pid}, {how}) left behind"


def _write_line(stream: TextIO, line: str) -> None:
    # One write per line: the nodes of a local cluster stop in threads, and
    # print() writes the text and its newline separately.
    stream.write(line + "\n")
    stream.flush()


class Supervisor:
    """Start, supervise and stop one node's processes.

    ``run`` does it all for a node on its own.  The start is also available
    one step at a time (``advance_start``, ``dead_child``, ``_stop``) so that
    ``LocalClusterSupervisor`` can drive several nodes from one loop.
    """

    def __init__(
        self,
        config: NodeConfig,
        out: TextIO | None = None,
        err: TextIO | None = None,
        *,
        prefix: str = "",
        signals: StopSignals | None = None,
    ) -> None:
        self.config = config
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.prefix = prefix  # "[node 1] " when several nodes share one terminal
        self.children = [Child(spec, config.log_dir) for spec in config.child_specs()]
        self.driver, self.archive, self.consensus, *self.services = self.children
        # The nodes of a local cluster share one rule: one Ctrl-C stops them all.
        self._signals = StopSignals() if signals is None else signals
        self._preexec = _parent_death_signal()
        self._next_child = 0  # the start: the next child to launch ...
        self._starting: Child | None = None  # ... and the one launched, not yet ready
        self._start_deadline = 0.0
        self._metrics: Any = None  # the node's MetricsServer, with a metrics port
        # When the first of the consensus module and services was seen to have
        # stopped in order (the cluster stops the node: cluster_stop_done).
        self._cluster_stop_since: float | None = None

    def say(self, text: str) -> None:
        _write_line(self.out, f"{self.prefix}{text}")

    def warn(self, text: str) -> None:
        _write_line(self.err, f"cluster-node start: {self.prefix}{text}")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.on_signal(signum, time.monotonic_ns())

    @property
    def stop_requested(self) -> bool:
        return self._signals.requested is not None

    @property
    def forced(self) -> bool:
        """A second Ctrl-C: a repeated SIGTERM, or a SIGINT with it, is the same request."""
        return self._signals.immediate

    def run(self) -> int:
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {signum: signal.signal(signum, self._on_signal) for signum in handled}
        try:
            return self._run()
        finally:
            try:
                for child in self.children:  # every path reaps every child
                    child.kill()
                wait_all(self.children, 10)
            finally:
                self.remove_left_driver_dir()
                self.stop_metrics()
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    def remove_left_driver_dir(self) -> None:
        """Once no process of the node is left: its driver directory, if its driver left it behind."""
        done = remove_left_driver_dir(self.config.driver_dir, self.driver, self.children)
        if done is not None:
            self.say(done)

    def start_metrics(self) -> str | None:
        """Serve the node's metrics, /health and /leader (with a metrics port)
        from this process, before its processes start (meanwhile /health says
        what is not running); why it cannot, or None."""
        config = self.config
        if config.metrics_port is None:
            return None
        # Imported here: every process of the node imports this module, and
        # only the supervisor serves metrics.
        from fulmar.cli.metrics_server import MetricsServer
        from fulmar.cli.node_metrics import MetricsNode

        node = MetricsNode(f"node{config.member_id}", config.cluster_dir, config.archive_dir, config.driver_dir)
        try:
            self._metrics = MetricsServer(node, config.metrics_host, config.metrics_port).start()
        except OSError as error:
            return f"cannot serve the metrics on {config.metrics_host}:{config.metrics_port}: {error.strerror or error}"
        url = self._metrics.url
        self.say(f"metrics of node {config.member_id}: {url}/metrics, {url}/health, {url}/leader")
        return None

    def stop_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def _run(self) -> int:
        failure = self.start_metrics()
        if failure is not None:
            self.warn(failure)
            return EXIT_FAILURE
        self.announce_start()
        while not self.all_started and not self.stop_requested:
            failure = self.advance_start()
            if failure is not None:
                self.warn(failure)
                self._stop(after_failure=True)
                return EXIT_FAILURE
            if not self.all_started:
                time.sleep(0.02)
        if self.stop_requested:
            return self._stop_on_request()
        self.announce_ready()
        while True:
            if self.stop_requested:
                return self._stop_on_request()
            dead = self._first_dead(DUTY_CYCLE_S)
            if dead is not None and self.stop_requested:
                # The signal reached the node's processes too (a service
                # manager signals every process at once): an exit after it is
                # that stop, not a failure.
                return self._stop_on_request()
            if dead is not None:
                self._report_death(dead)
                self._stop(after_failure=True)
                return EXIT_FAILURE
            if self.cluster_stop_done():
                return self.finish_cluster_stop()

    def announce_start(self) -> None:
        config = self.config
        self.say(
            f"node {config.member_id} of cluster {config.cluster_id}: directory {config.node_dir}, "
            f"driver directory {config.driver_dir}, logs in {config.log_dir}"
        )

    def announce_ready(self) -> None:
        config = self.config
        pids = ", ".join(f"{child.spec.log_name} {child.pid}" for child in self.children)
        self.say(
            f"node {config.member_id} ready: ingress {config.ingress_channel}; driver directory "
            f"{config.driver_dir}; pids {pids}; SIGTERM or Ctrl-C stops it in order (snapshot first)"
        )

    @property
    def all_started(self) -> bool:
        return self._starting is None and self._next_child >= len(self.children)

    def advance_start(self) -> str | None:
        """Launch the next process once the one before it printed its readiness
        line, without waiting: why the start failed, or None (see all_started)."""
        while True:
            child = self._starting
            if child is None:
                if self._next_child >= len(self.children):
                    return None
                child = self.children[self._next_child]
                self._next_child += 1
                try:
                    child.start(self._preexec)
                except OSError as error:
                    return f"cannot start the {child.name}: {error}"
                self._starting = child
                self._start_deadline = time.monotonic() + self.config.start_timeout_s
            if not child.is_ready():
                return self._start_problem(child)
            line = next((line for line in child.output().splitlines() if child.spec.ready_text in line), "")
            self.say(f"{log_lines.event_text(line).strip()}  [log {child.log_path}]")
            self._starting = None

    def _start_problem(self, child: Child) -> str | None:
        """Why ``child``, launched and not ready yet, will never be: a death or the timeout."""
        if child.poll() is not None:
            return self._death_text(child, "while starting") + self._tail_text(child)
        for other in self.children:
            if other is not child and other.started and other.poll() is not None:
                return self._death_text(other, f"while the {child.name} was starting") + self._tail_text(other)
        if time.monotonic() > self._start_deadline:
            return (
                f"the {child.name} (pid {child.pid}) printed no readiness line within "
                f"{self.config.start_timeout_s:g} s" + self._tail_text(child)
            )
        return None

    def dead_child(self) -> Child | None:
        """The first process in node order that has died (the one to report
        when several went together), or None.  A process that exited as part
        of an orderly stop of the cluster or of its module did not die (see
        _exited_in_order; cluster_stop_done tells when that stop is over)."""
        for child in self.children:
            if child.started and child.poll() is not None and not self._exited_in_order(child):
                return child
        return None

    def _exited_in_order(self, child: Child) -> bool:
        """Whether ``child``, which has exited, stopped in order: it said so
        with exit code 0 (the consensus module: a cluster shutdown or abort,
        the leader's termination, a stop signal to it; a service: its module
        told it to stop), or it is a service that exited with code 0 after its
        consensus module had stopped in order (a member of several stopped by
        a signal to its module leaves its services to see it go).  Exit code 0
        alone is not enough: a service's own sys.exit(0) is a death.  The
        archive and the driver never stop on their own in order: this
        supervisor stops them."""
        if child.orderly_stop is not None:
            return True
        return child in self.services and child.returncode == 0 and self.consensus.orderly_stop is not None

    def cluster_stop_done(self) -> bool:
        """Whether the orderly stop of this node's consensus module and
        services that one of them announced is over: every one of them has
        exited, or the stop timeout has passed since the first did.  Asked
        once dead_child found no death (each exit so far was in order)."""
        cluster = [self.consensus, *self.services]
        exited = [child for child in cluster if child.started and child.poll() is not None]
        if not exited:
            return False
        now = time.monotonic()
        if self._cluster_stop_since is None:
            self._cluster_stop_since = now
        return len(exited) == len(cluster) or now - self._cluster_stop_since >= self.config.stop_timeout_s

    def finish_cluster_stop(self) -> int:
        """The cluster stopped this node (cluster_stop_done): kill what of its
        consensus module and services is still running after the stop timeout,
        stop the archive, then the driver, and say once why the node stopped.
        EXIT_OK, or EXIT_UNCLEAN_STOP if something had to be killed or failed to stop."""
        node = self.config.member_id
        cluster = [self.consensus, *self.services]
        stragglers = [child for child in cluster if child.alive]
        for child in stragglers:
            self.warn(
                f"{child.name} (pid {child.pid}) still running {self.config.stop_timeout_s:g} s after the "
                f"cluster began to stop node {node}: killing it (SIGKILL)"
            )
            child.kill()
        wait_all(stragglers, 10)
        clean = self._report_exits(cluster)
        for child in (self.archive, self.driver):
            if child.alive:
                child.send(signal.SIGTERM)
                clean &= self._await([child], self.config.stop_timeout_s, "SIGTERM")
            else:  # it exited meanwhile, by itself: said how, and not clean
                self._report_exits([child])
                clean = False
        self.remove_left_driver_dir()
        # The module's word, else a service's (a module killed above said nothing).
        stop = next(child.orderly_stop for child in cluster if child.orderly_stop is not None)
        if clean:
            self.say(f"node {node} stopped by {stop.describe()}")
            return EXIT_OK
        self.warn(f"node {node} stopped by {stop.describe()}, but not cleanly (see above)")
        return EXIT_UNCLEAN_STOP

    def _first_dead(self, timeout_s: float) -> Child | None:
        wait_for_exit([child for child in self.children if child.started], timeout_s)
        return self.dead_child()

    def _death_text(self, child: Child, when: str = "") -> str:
        assert child.returncode is not None
        suffix = f" {when}" if when else ""
        return f"{child.name} (pid {child.pid}) died{suffix}: {describe_exit(child.returncode)}"

    def _tail_text(self, child: Child) -> str:
        tail = child.tail()
        if not tail:
            return f"\n  ({child.log_path} is empty)"
        return f"\n  last lines of {child.log_path}:\n" + "\n".join(f"    {line}" for line in tail)

    def _is_multi_member(self) -> bool:
        members = self.config.values.get(("consensus", "cluster_members"), "")
        return bool(str(members or "").strip())

    def _report_death(self, child: Child) -> None:
        self.warn(self._death_text(child) + self._tail_text(child))

    def _stop_on_request(self) -> int:
        name = signal.Signals(self._signals.first_signum or signal.SIGTERM).name
        module = (
            "consensus module (a member of several stops at once)"
            if self._is_multi_member()
            else "consensus module (snapshot)"
        )
        self.say(f"{name}: stopping node {self.config.member_id} in order: {module}, services, archive, media driver")
        clean = self._stop(after_failure=False)
        if clean:
            self.say(f"node {self.config.member_id} stopped cleanly")
            return EXIT_OK
        self.warn(f"node {self.config.member_id} stopped, but not cleanly (see above)")
        return EXIT_UNCLEAN_STOP

    def _stop(self, after_failure: bool) -> bool:
        """Stop whatever runs, in order; whether every process stopped by itself with exit code 0."""
        clean = True
        limit_s = (
            min(self.config.stop_timeout_s, FAILURE_STOP_TIMEOUT_S) if after_failure else self.config.stop_timeout_s
        )
        # After a failure the dead one was reported; on request, a process the
        # signal reached too (a service manager signals every process of the
        # node) may stop by itself before its turn: said when its turn comes.
        exited_before = (
            {id(child) for child in self.children if child.started and not child.alive} if after_failure else set()
        )
        if after_failure:
            self.say(f"stopping the rest of node {self.config.member_id} in order")
        cluster = [self.consensus, *self.services]
        running = [child for child in cluster if child.alive]
        if not after_failure:
            clean &= self._report_exits([child for child in cluster if child.started and not child.alive])
        if running:
            if self.consensus.alive:
                self.consensus.send(signal.SIGTERM)
                # A service still starting has not joined the log: it stops by
                # itself once its module is gone, unless the module stops it in order.
                for service in self.services:
                    if service.alive and not service.is_ready():
                        service.send(signal.SIGTERM)
                what = "SIGTERM to the consensus module"
            else:  # no module to stop them in order: each stops on its own
                for service in self.services:
                    service.send(signal.SIGTERM)
                what = "SIGTERM (no consensus module to stop it in order)"
            clean &= self._await(cluster, limit_s, what)
        for child in (self.archive, self.driver):
            if child.alive:
                child.send(signal.SIGTERM)
                clean &= self._await([child], limit_s, "SIGTERM")
            elif child.started and id(child) not in exited_before:
                clean &= self._report_exits([child])
        self.remove_left_driver_dir()
        return clean

    def _await(self, children: list[Child], limit_s: float, what: str) -> bool:
        """Wait for ``children`` to exit after ``what``; kill stragglers and say so."""
        watched = [child for child in children if child.alive]
        deadline = time.monotonic() + limit_s
        services_signalled = False
        consensus_gone_at: float | None = None
        while True:
            alive = wait_all(watched, DUTY_CYCLE_S)
            if not alive:
                break
            now = time.monotonic()
            if self.consensus in watched and not self.consensus.alive and not services_signalled:
                # The module is gone but a service is not: it stops once it sees that.
                # (A service checks for its module every second; under load it
                # may need a few more to exit by itself.)
                consensus_gone_at = consensus_gone_at or now
                if now - consensus_gone_at > 5.0:
                    for child in alive:
                        child.send(signal.SIGTERM)
                    services_signalled = True
            if self.forced or now >= deadline:
                reason = "a second signal" if self.forced else f"{limit_s:g} s after {what}"
                for child in alive:
                    self.warn(f"{child.name} (pid {child.pid}) still running {reason}: killing it (SIGKILL)")
                    child.kill()
                wait_all(alive, 10)
                break
        return self._report_exits(watched)

    def _report_exits(self, children: list[Child]) -> bool:
        """Say how each of ``children`` ended; whether all stopped by themselves with code 0."""
        clean = True
        for child in children:
            code = child.returncode
            last = child.tail(1)
            detail = f": {last[0]}" if last and child.spec.ready_text not in last[0] else ""
            if code is None:
                self.warn(f"{child.name} (pid {child.pid}) could not be reaped")
                clean = False
                continue
            how = "killed by the supervisor (SIGKILL)" if child.killed else describe_exit(code)
            self.say(f"{child.name} (pid {child.pid}) {how}{detail}")
            if code != 0 or child.killed:
                clean = False
        return clean


def run_node(config: NodeConfig) -> int:
    return Supervisor(config).run()


class LocalClusterSupervisor:
    """The nodes of a ``--local`` cluster of several members, from one command.

    Each node is its own ``Supervisor``: its processes start in order, each
    once the one before it is ready, and the nodes start side by side (a
    consensus module may wait for the other members before it is ready).  A
    node one of whose processes dies is reported and stopped; the other nodes
    keep running, since surviving that is what a cluster is for.  A signal
    stops every node, in parallel, each in order; the command also ends once
    every node has stopped.
    """

    def __init__(
        self, configs: list[NodeConfig], ingress_endpoints: str, out: TextIO | None = None, err: TextIO | None = None
    ) -> None:
        self.out = out or sys.stdout
        self.ingress_endpoints = ingress_endpoints
        self._signals = StopSignals()
        self.nodes = [
            Supervisor(config, out, err, prefix=f"[node {config.member_id}] ", signals=self._signals)
            for config in configs
        ]
        self.running = list(self.nodes)
        self.failed: list[Supervisor] = []
        # The exit codes of the nodes the cluster stopped (cluster-tool shutdown or abort, ...).
        self.stopped_by_cluster: list[int] = []

    def say(self, text: str) -> None:
        _write_line(self.out, text)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.on_signal(signum, time.monotonic_ns())

    def run(self) -> int:
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {signum: signal.signal(signum, self._on_signal) for signum in handled}
        try:
            return self._run()
        finally:
            children = [child for node in self.nodes for child in node.children]
            try:
                for child in children:  # every path reaps every child of every node
                    child.kill()
                wait_all(children, 10)
            finally:
                for node in self.nodes:
                    node.remove_left_driver_dir()
                    node.stop_metrics()
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    def _run(self) -> int:
        for node in self.nodes:
            failure = node.start_metrics()
            if failure is not None:
                node.warn(failure)
                return EXIT_FAILURE
        for node in self.nodes:
            node.announce_start()
        announced = False
        while True:
            if self._signals.requested is not None:
                return self._stop_on_request()
            for node in list(self.running):
                if not node.all_started:
                    failure = node.advance_start()
                    if failure is not None:
                        node.warn(failure)
                        self._fail(node)
                    elif node.all_started:
                        node.announce_ready()
                    continue
                dead = node.dead_child()
                if dead is not None:
                    node._report_death(dead)
                    self._fail(node)
                elif node.cluster_stop_done():
                    self.stopped_by_cluster.append(node.finish_cluster_stop())
                    node.stop_metrics()
                    self.running.remove(node)
            if not self.running:
                return self._every_node_stopped()
            starting = any(not node.all_started for node in self.running)
            if not starting and not announced:
                announced = True
                self.say(
                    f"local cluster ready: {len(self.running)} of {len(self.nodes)} nodes running; ingress "
                    f"endpoints {self.ingress_endpoints}; SIGTERM or Ctrl-C stops every node"
                )
            self._wait(0.02 if starting else DUTY_CYCLE_S)

    def _every_node_stopped(self) -> int:
        """No node is left, none stopped by a signal to this command: a
        failure if any node failed, else the cluster stopped them all."""
        if self.failed:
            self.say("every node has stopped")
            return EXIT_FAILURE
        if all(code == EXIT_OK for code in self.stopped_by_cluster):
            self.say("local cluster stopped: every node stopped in order by the cluster")
            return EXIT_OK
        self.say("local cluster stopped by the cluster, but not cleanly (see above)")
        return EXIT_UNCLEAN_STOP

    def _fail(self, node: Supervisor) -> None:
        """Stop what is left of ``node`` (the others keep running), and its
        metrics: their port is the restarted node's (its node.toml names it)."""
        node._stop(after_failure=True)
        node.stop_metrics()
        self.running.remove(node)
        self.failed.append(node)
        others = ", ".join(str(other.config.member_id) for other in self.running) or "none"
        node.warn(
            f"node {node.config.member_id} stopped; nodes still running: {others} (start it again on its "
            f"own with: cluster-node start --config {node.config.node_dir / 'node.toml'})"
        )

    def _wait(self, timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, waking when any process of a running node exits."""
        watched = [child for node in self.running for child in node.children if child.started]
        if not any(child.returncode is None for child in watched):
            time.sleep(timeout_s)
            return
        wait_for_exit(watched, timeout_s)

    def _stop_on_request(self) -> int:
        name = signal.Signals(self._signals.first_signum or signal.SIGTERM).name
        self.say(
            f"{name}: stopping nodes {', '.join(str(n.config.member_id) for n in self.running) or '(none)'} "
            "in parallel, each in order"
        )
        # One thread per node: each waits for its own processes, and a node
        # that takes long to stop does not hold up the others.  (No process is
        # launched from these threads, so the parent-death preexec is safe.)
        codes = []
        if self.running:
            with ThreadPoolExecutor(max_workers=len(self.running)) as pool:
                codes = list(pool.map(lambda node: node._stop_on_request(), self.running))
        self.running = []
        if self.failed:
            dead = ", ".join(str(node.config.member_id) for node in self.failed)
            self.say(f"local cluster stopped; node(s) {dead} had failed before (see above)")
            return EXIT_FAILURE
        if all(code == EXIT_OK for code in [*self.stopped_by_cluster, *codes]):
            self.say("local cluster stopped cleanly")
            return EXIT_OK
        self.say("local cluster stopped, but not cleanly (see above)")
        return EXIT_UNCLEAN_STOP


def run_local_cluster(configs: list[NodeConfig], ingress_endpoints: str) -> int:
    return LocalClusterSupervisor(configs, ingress_endpoints).run()

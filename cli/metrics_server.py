"""A node's metrics over HTTP: ``/metrics`` for Prometheus, ``/health`` and
``/leader`` for load balancers and service managers.

``cluster-node start --metrics-port P`` serves its node (a local cluster's
member i on P + i) from the supervisor's process; ``cluster-tool metrics
serve --dir DIR --port P`` serves the node(s) under a directory from its own.
Either way nothing joins the cluster: every answer is read from the node's
files (``cli/node_metrics.py``) when it is asked for.

- ``/metrics``: every counter of every process of the node, and what is
  derived from them, in Prometheus' text format (OpenMetrics when the scraper
  asks for it), through ``prometheus_client``'s own exposition.
- ``/health``: 200 when every process of the node runs (driver, archive,
  consensus module, services; judged as ``cluster-tool describe`` judges
  them) and the consensus module is ACTIVE, SUSPENDED or taking a snapshot,
  as leader or follower, with no election running; else 503, the body saying
  why (which process is not running and how, or the module's state or
  election state).
- ``/leader``: 200 on a healthy leader only; 503 otherwise, saying why.

Both answer in plain text, one line.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

import click
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from fulmar.cli.cluster_commands import (
    BACKUP_DIR_NAME,
    ClusterNode,
    ClusterReadError,
    archive_dir_beside,
    cluster_describe_node,
    resolve_cluster_nodes,
)
from fulmar.cli.node_metrics import MetricsNode, NodeCollector, NodeFiles
from fulmar.cli.tool_common import EXIT_PROBLEM, EXIT_UNREADABLE, fail
from fulmar.clock import epoch_ms
from fulmar.consensus.states import ClusterRole, ConsensusModuleState, ElectionState

DEFAULT_PORT = 9464  # Prometheus' registry of exporter ports: the one most exporters' examples use
DEFAULT_HOST = "127.0.0.1"
# A module in these states serves its role: SUSPENDED is an operator's
# choice (cluster-tool suspend), SNAPSHOT lasts a moment.
_SERVING_STATES = {
    ConsensusModuleState.ACTIVE.name,
    ConsensusModuleState.SUSPENDED.name,
    ConsensusModuleState.SNAPSHOT.name,
}
_SERVING_ROLES = {ClusterRole.LEADER.name, ClusterRole.FOLLOWER.name}


@dataclass(frozen=True)
class Health:
    """Whether the node is healthy and leads, and the one line that says so or why not."""

    healthy: bool
    leader: bool
    reason: str


def node_health(node: MetricsNode, files: NodeFiles, now_ms: int) -> Health:
    """The node's health, from the tools' own readers: each process's liveness
    (``files``, as ``read_node_files`` read them at ``now_ms``), the module's
    state, role and election state (``cluster_describe_node``, the counters
    ``cluster-tool describe`` shows)."""
    processes = files.processes
    down = [process for process in processes if not process.running]
    if down:
        return Health(False, False, "; ".join(f"{process.name}: {process.state}" for process in down))
    try:
        described = cluster_describe_node(ClusterNode(node.name, node.cluster_dir), now_ms)
    except ClusterReadError as error:
        return Health(False, False, str(error))
    counters = described["counters"]
    if counters is None:
        return Health(False, False, f"consensus module: no counters: {described['counters_note']}")
    member = f"member {described['mark_file']['member_id']}"
    state, role, election = counters["module_state_name"], counters["role_name"], counters["election_state_name"]
    if state not in _SERVING_STATES:
        return Health(False, False, f"{member}: consensus module state {state}")
    if election != ElectionState.CLOSED.name or role not in _SERVING_ROLES:
        return Health(False, False, f"{member}: election state {election}, role {role}")
    running = ", ".join(process.name for process in processes)
    return Health(
        True,
        role == ClusterRole.LEADER.name,
        f"{member} {role}, consensus module {state}, leadership term {counters['leadership_term_id']}, "
        f"commit position {counters['commit_position']}; running: {running}",
    )


class NodeMetricsApp:
    """What one node answers: /metrics, /health, /leader."""

    def __init__(self, node: MetricsNode, clock_ms: Callable[[], int] = epoch_ms) -> None:
        self.node = node
        self._clock_ms = clock_ms
        self.collector = NodeCollector(node, clock_ms)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    def close(self) -> None:
        self.collector.close()

    def respond(self, path: str, accept: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``path``."""
        path = path.partition("?")[0] or "/"
        if path in ("/metrics", "/"):
            # prometheus_client's own exposition, in the format the scraper asks for
            # (its text format, or OpenMetrics); never compressed: on the node's
            # machine the CPU a gzip costs is what a scrape must not take.
            encoder, content_type = choose_encoder(accept)
            return 200, content_type, encoder(self.registry)
        if path in ("/health", "/leader"):
            now_ms = self._clock_ms()
            health = node_health(self.node, self.collector.read_files(now_ms), now_ms)
            if path == "/health":
                ok, text = health.healthy, ("ok: " if health.healthy else "unhealthy: ") + health.reason
            else:
                ok = health.leader
                text = (
                    f"leader: {health.reason}"
                    if ok
                    else f"not the leader: {health.reason}"
                    if health.healthy
                    else f"not the leader (unhealthy): {health.reason}"
                )
            return (200 if ok else 503), _TEXT, (text + "\n").encode()
        return 404, _TEXT, f"no {path} here: /metrics, /health, /leader\n".encode()


_TEXT = "text/plain; charset=utf-8"


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, as Prometheus scrapes: one connection (and one
    thread) serves a scraper's requests one after another, rather than a new
    connection and a new thread for each."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes: without TCP_NODELAY the body
    # waits for the scraper's delayed ACK of the headers (tens of ms) on a
    # kept connection.
    disable_nagle_algorithm = True
    app: NodeMetricsApp  # set on the subclass a server makes

    def do_GET(self) -> None:
        status, content_type, body = self.app.respond(self.path, self.headers.get("Accept", ""))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged: a scrape every few seconds would fill the log."""


def lowest_cpu_priority() -> None:
    """Put the calling thread, and the threads it starts, at the lowest CPU
    priority there is, so that on a busy machine a scrape waits and the
    node's processes do not.

    Linux's SCHED_IDLE runs a thread only on CPU time no other thread wants,
    and a waking thread of the node preempts it at once; a nice value of 19
    (where SCHED_IDLE is refused) still takes a small share.  Both are per
    thread on Linux and inherited by new threads (a connection's thread is
    started by this one)."""
    thread = threading.get_native_id()
    try:
        os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass  # not on this system
    try:
        os.setpriority(os.PRIO_PROCESS, thread, 19)
    except (AttributeError, OSError):
        pass  # served at the process's priority


class MetricsServer:
    """One node's HTTP server, on a thread of its own (and one per connection)."""

    def __init__(self, node: MetricsNode, host: str, port: int) -> None:
        self.node = node
        self.app = NodeMetricsApp(node)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        handler = type("NodeHandler", (_Handler,), {"app": self.app})
        try:
            self._httpd = Server((host, port), handler)
        except BaseException:
            self.app.close()
            raise
        self._thread = threading.Thread(target=self._serve, name=f"metrics {node.name}", daemon=True)

    def _serve(self) -> None:
        lowest_cpu_priority()
        self._httpd.serve_forever()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._httpd.server_address[0])
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=10)
        self._httpd.server_close()
        self.app.close()


# ---------------------------------------------------------------------------- cluster-tool metrics


def metrics_nodes(directory: Path, archive_dir: Path | None, driver_dir: Path | None) -> list[tuple[int, MetricsNode]]:
    """(port offset, node) of each member under ``directory``: a cluster
    directory, a node directory, or a local cluster's base (member i at
    offset i).  The archive is ``archive/`` beside ``cluster/``, as
    ``cluster-node start`` lays a node out, unless given."""
    layout, nodes = resolve_cluster_nodes(directory)
    members = [node for node in nodes if node.name != BACKUP_DIR_NAME]
    if not members:
        raise ClusterReadError(f"{directory}: a cluster backup, not a member: its metrics are not served")
    if (archive_dir is not None or driver_dir is not None) and len(members) > 1:
        raise ClusterReadError(f"{directory} holds {len(members)} nodes: --archive-dir and --driver-dir are for one")
    found = []
    for index, node in enumerate(members):
        offset = int(node.name[4:]) if layout == "base" and node.name[4:].isdigit() else index
        cluster_dir = node.cluster_dir
        archive = archive_dir if archive_dir is not None else archive_dir_beside(cluster_dir)
        found.append((offset, MetricsNode(node.name, cluster_dir, archive, driver_dir)))
    return found


def serve_until_signalled(servers: list[MetricsServer]) -> None:
    """Serve until SIGINT or SIGTERM, then close every server."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        for server in servers:
            server.start()
        while not stop.wait(1.0):
            pass
    finally:
        for server in servers:
            server.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@click.group(name="metrics")
def metrics_group() -> None:
    """Serve a node's metrics to Prometheus, with /health and /leader.

    \b
    /metrics  every counter of every process of the node (the driver's
              cnc.dat holds them all) in Prometheus' text format, and what
              operators alert on, derived from them
    /health   200 when every process of the node runs and the consensus
              module is ACTIVE (or SUSPENDED, or taking a snapshot) as leader
              or follower with no election running; else 503 and why
    /leader   200 on a healthy leader only; else 503 and why
    """


@metrics_group.command(name="serve", short_help="Serve a node's /metrics, /health and /leader over HTTP.")
@click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(path_type=Path),
    help="A node's cluster directory, a node directory (holding cluster/ and archive/), or the base of "
    "a local cluster (node0/, node1/, ...: member i is served on PORT + i).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    help="The TCP port (of member 0, for a local cluster's base; 0: any free port).",
)
@click.option("--host", default=DEFAULT_HOST, help="The address to serve on (0.0.0.0: every interface).")
@click.option(
    "--archive-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The node's archive directory.  [default: archive/ beside the cluster directory]",
)
@click.option(
    "--driver-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The node's media driver directory.  [default: the one its consensus module's mark file names]",
)
def metrics_serve(directory: Path, port: int, host: str, archive_dir: Path | None, driver_dir: Path | None) -> None:
    """Serve the metrics of the node(s) under --dir until SIGINT or SIGTERM.

    Every answer is read from the node's files when it is asked for: nothing
    joins the cluster, and the server may start before the node does (it
    then answers 503).  Exit codes: 0 stopped by a signal; 1 a port that
    cannot be bound; 4 no cluster files under --dir.
    """
    try:
        nodes = metrics_nodes(directory, archive_dir, driver_dir)
    except ClusterReadError as error:
        fail(str(error), EXIT_UNREADABLE)
    servers: list[MetricsServer] = []
    try:
        for offset, node in nodes:
            node_port = port + offset if port else 0
            servers.append(MetricsServer(node, host, node_port))
    except (OSError, OverflowError) as error:
        for server in servers:
            server.close()
        fail(f"cannot serve on {host}:{node_port}: {getattr(error, 'strerror', None) or error}", EXIT_PROBLEM)
    for server in servers:
        click.echo(f"{server.node.name}: {server.url}/metrics (and /health, /leader) from {server.node.cluster_dir}")
    sys.stdout.flush()
    serve_until_signalled(servers)

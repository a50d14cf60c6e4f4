"""``cluster-node``: run the processes of a cluster node.

``cluster-node driver`` runs a media driver in the foreground until SIGINT
or SIGTERM (or an authorised TERMINATE_DRIVER), then removes its directory.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from fulmar import cpu_policy, log_lines
from fulmar.archive.archive import Archive, run_archive
from fulmar.archive.context import ArchiveContext
from fulmar.archive.errors import ArchiveAlreadyActiveError
from fulmar.archive.mark_file import live_owner_pid as live_archive_pid
from fulmar.channel_uri import INT32_MAX
from fulmar.cli.options import (
    ARCHIVE_SECRET_ENV,
    CLUSTER_SECRET_ENV,
    DRIVER_DIR_ENV,
    MEMBER_SECRET_ENV,
    Duration,
    IdleStrategyName,
    Size,
    driver_dir_option,
    format_duration,
    format_size,
    resolve_driver_dir,
)
from fulmar.clock import epoch_ms
from fulmar.cnc import (
    BROADCAST_TRAILER_LENGTH,
    DEFAULT_TO_CLIENTS_CAPACITY,
    DEFAULT_TO_DRIVER_CAPACITY,
    RING_BUFFER_TRAILER_LENGTH,
    CncLayout,
)
from fulmar.consensus.backup import LOG_SOURCES, ClusterBackup, ClusterBackupContext, run_cluster_backup
from fulmar.consensus.consensus_module import ConsensusModule, run_consensus_module
from fulmar.consensus.context import (
    NATIVE_APPEND_POSITION_ENV,
    NATIVE_COMMIT_ENV,
    NATIVE_FOLLOWER_COMMIT_ENV,
    NATIVE_INGRESS_ENV,
    ConsensusModuleContext,
)
from fulmar.consensus.mark_file import FILENAME as CLUSTER_MARK_FILE
from fulmar.consensus.mark_file import SERVICE_FILENAME_PREFIX as SERVICE_MARK_FILE_PREFIX
from fulmar.consensus.mark_file import ClusterMarkFileActiveError
from fulmar.consensus.mark_file import live_owner_pid as live_cluster_component_pid
from fulmar.counters import COUNTER_LENGTH
from fulmar.driver.context import DriverContext
from fulmar.driver.counters import SystemCounter
from fulmar.driver.media_driver import (
    DriverAlreadyActiveError,
    DriverDirectoryError,
    MediaDriver,
    check_reclaimable,
    run_driver,
)
from fulmar.errors import FulmarError
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH
from fulmar.logbuffer import MAX_UDP_PAYLOAD_LENGTH, TERM_MAX_LENGTH, TERM_MIN_LENGTH
from fulmar.orderly_stop import StopOutcome, report_orderly_stop
from fulmar.permissions import FILE_GROUP_ENV, FileGroupError, check_file_group
from fulmar.ring_buffer import MAX_CAPACITY
from fulmar.security import CredentialsAuthenticator
from fulmar.service.container import ServiceContainer, run_service_container
from fulmar.service.context import ServiceContext
from fulmar.service.errors import ON_SERVICE_ERROR_CHOICES
from fulmar.stop_signals import StopGate

EXIT_FAILURE = 1
EXIT_DRIVER_ACTIVE = 2  # also: an archive is already active in the directory

# The defaults shown are the driver's own (class attributes of the dataclass;
# an instance would resolve the default directory, hence the user, at import).
_DEFAULTS = DriverContext
_DEFAULT_LAYOUT = CncLayout()

# Command and response buffers hold messages of up to an eighth of their
# capacity; 16k leaves room for a channel URI or a 1024-character error.
_MIN_CNC_RING = 16 * 1024
# The system counters alone take one counter each; leave room for clients.
_MIN_COUNTERS_BUFFER = 2 * len(SystemCounter) * COUNTER_LENGTH
# The header stores each section's length as an int32 (metadata is 4x values).
_MAX_COUNTERS_BUFFER = 256 * 1024 * 1024


# The name a process's log lines carry, by subcommand (refined by the command: a service's id, a member).
_PROCESS_NAMES = {
    "driver": "media driver",
    "archive": "archive",
    "consensus": "consensus module",
    "service": "service",
    "cluster-backup": "cluster backup",
    "start": "cluster-node start",
    "backup": "cluster-node backup",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--file-group",
    envvar=FILE_GROUP_ENV,
    show_envvar=True,
    default=None,
    metavar="GROUP",
    help="Let the members of this group use the node's files too: files group read-write (0660), "
    "directories 2770, owned by the group (so that its members can attach clients to the driver "
    "and read the archive).  Default: owner-only (0600 files, 0700 directories).  Goes before the "
    "subcommand: cluster-node --file-group G start ...",
)
@click.option(
    "--log-format",
    type=click.Choice(log_lines.LOG_FORMATS),
    envvar=log_lines.LOG_FORMAT_ENV,
    show_envvar=True,
    default=log_lines.PLAIN,
    help="The form of this process's log lines (and of the processes it starts): plain text, or "
    "JSON, one object per line (time, process, member, level, event, fields).  Goes before the "
    "subcommand: cluster-node --log-format json archive ...  (cluster-node start takes it as the "
    "node key [node] log_format too, for the node's processes.)",
)
@click.option(
    "--cpu-policy",
    "cpu_policy_name",
    type=click.Choice(cpu_policy.CPU_POLICIES),
    envvar=cpu_policy.CPU_POLICY_ENV,
    show_envvar=True,
    default=cpu_policy.DEFAULT_CPU_POLICY,
    help="How Linux schedules this process (and the processes it starts): batch is SCHED_BATCH, which "
    "is the default policy without wake-up preemption (a woken process does not take the core from the one "
    "that woke it, so a burst of datagrams is read whole rather than one wake-up each); normal is Linux's "
    "default.  Goes before the subcommand: cluster-node --cpu-policy normal start ...  (cluster-node start "
    "takes it as the node key [node] cpu_policy too.)",
)
@click.pass_context
def main(ctx: click.Context, file_group: str | None, log_format: str, cpu_policy_name: str) -> None:
    """Run the processes of a fulmar cluster node."""
    # Before anything is printed; the processes this one starts inherit it.
    log_lines.configure(log_format, _PROCESS_NAMES.get(ctx.invoked_subcommand or ""))
    os.environ[log_lines.LOG_FORMAT_ENV] = log_format
    # Before any thread starts: threads and child processes inherit the policy.
    try:
        cpu_policy.apply_cpu_policy(cpu_policy_name)
    except cpu_policy.CpuPolicyError as error:
        # The node works under Linux's default policy, only slower under load.
        click.echo(f"cluster-node: {error}; running under the normal policy", err=True)
    os.environ[cpu_policy.CPU_POLICY_ENV] = cpu_policy_name
    # SIGUSR1 prints every thread's stack to stderr: how to see what a stuck
    # node process is doing without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if file_group:
        try:
            check_file_group(file_group)
        except FileGroupError as error:
            raise click.BadParameter(str(error), param_hint="'--file-group'") from None
        # The files are created deep inside each component, which reads the
        # setting from the environment; the supervisor's children inherit it.
        os.environ[FILE_GROUP_ENV] = file_group


_STOP_AFTER_HELP = (
    "On SIGINT/SIGTERM, first wait until the node's processes that own a mark file in DIR have stopped: the "
    "consensus module and services of a cluster directory, the archive of an archive directory (repeatable).  "
    "cluster-node start passes its node's directories, so that a signal to every process of the node at once "
    "(a service manager's stop) still stops it in order.  A second Ctrl-C stops at once."
)


def stop_after_options(default_timeout: str) -> Callable[[Any], Any]:
    """--stop-after DIR (repeatable) and --stop-after-timeout, for the driver and the archive."""

    def decorate(function: Any) -> Any:
        function = click.option(
            "--stop-after-timeout",
            type=Duration(min_ns=1_000_000),
            default=default_timeout,
            help="The longest the --stop-after wait lasts before the process stops anyway.",
        )(function)
        return click.option(
            "--stop-after",
            "stop_after",
            multiple=True,
            metavar="DIR",
            type=click.Path(file_okay=False, dir_okay=True),
            help=_STOP_AFTER_HELP,
        )(function)

    return decorate


def node_processes_running(directories: Sequence[Path]) -> Callable[[], str | None]:
    """What still runs of the node's processes that own a mark file in
    ``directories`` (this process excepted), first found first; None once none does."""
    own_pid = os.getpid()

    def still_running() -> str | None:
        now_ms = epoch_ms()
        for directory in directories:
            found = [("the consensus module", directory / CLUSTER_MARK_FILE)]
            found += [
                (f"service {path.stem.rsplit('-', 1)[-1]}", path)
                for path in sorted(directory.glob(f"{SERVICE_MARK_FILE_PREFIX}*.dat"))
            ]
            for what, path in found:
                pid = live_cluster_component_pid(path, now_ms)
                if pid is not None and pid != own_pid:
                    return f"{what} (pid {pid}) of {directory}"
            pid = live_archive_pid(directory, now_ms)
            if pid is not None and pid != own_pid:
                return f"the archive (pid {pid}) of {directory}"
        return None

    return still_running


def stop_gate(directories: Sequence[str], timeout_ns: int, name: str) -> StopGate | None:
    """The gate of an orderly stop after the processes of ``directories``; None without any."""
    if not directories:
        return None

    def say(text: str) -> None:
        click.echo(f"{name}: {text}")
        sys.stdout.flush()

    return StopGate(node_processes_running([Path(directory) for directory in directories]), timeout_ns, say)


@main.command()
@driver_dir_option
@click.option(
    "--client-liveness-timeout",
    type=Duration(min_ns=1_000_000),
    default=format_duration(_DEFAULTS.client_liveness_timeout_ns),
    help="A client without a keepalive for this long is closed; also how stale the "
    "driver's own heartbeat may get before clients and tools consider it dead.",
)
@click.option(
    "--client-process-check/--no-client-process-check",
    default=_DEFAULTS.client_process_check,
    show_default=True,
    help="Close a client whose process has died (fulmar clients name their process in their "
    "heartbeat counter) about a second after its last keepalive, instead of after the liveness "
    "timeout, so a restarted process can bind its ports again at once.  Off: the liveness "
    "timeout only, as Aeron's own driver.",
)
@click.option(
    "--ipc-term-length",
    type=Size(TERM_MIN_LENGTH, TERM_MAX_LENGTH, power_of_two=True),
    default=format_size(_DEFAULTS.ipc_term_length),
    help="Term length of IPC publications (a channel's term-length overrides it).",
)
@click.option(
    "--ipc-mtu",
    # The largest MTU is below the smallest term length, so any pair is valid.
    type=Size(HEADER_LENGTH + FRAME_ALIGNMENT, MAX_UDP_PAYLOAD_LENGTH, multiple_of=FRAME_ALIGNMENT),
    default=format_size(_DEFAULTS.ipc_mtu),
    help="Maximum frame length of IPC publications (a channel's mtu overrides it).",
)
@click.option(
    "--socket-rcvbuf",
    type=Size(0, INT32_MAX),
    default=format_size(_DEFAULTS.socket_rcvbuf),
    help="SO_RCVBUF of UDP sockets (a channel's so-rcvbuf overrides it; 0: the OS default). "
    "It must hold the receiver window; the OS grants at most net.core.rmem_max.",
)
@click.option(
    "--socket-sndbuf",
    type=Size(0, INT32_MAX),
    default=format_size(_DEFAULTS.socket_sndbuf),
    help="SO_SNDBUF of UDP sockets (a channel's so-sndbuf overrides it; 0: the OS default).",
)
@click.option(
    "--rcv-initial-window-length",
    type=Size(HEADER_LENGTH + FRAME_ALIGNMENT, INT32_MAX),
    default=format_size(_DEFAULTS.initial_window_length),
    help="How far a sender may run ahead of this driver's subscribers on a UDP stream (a channel's "
    "rcv-wnd overrides it; at most half a term).",
)
@click.option(
    "--publication-linger",
    type=Duration(),
    default=format_duration(_DEFAULTS.publication_linger_timeout_ns),
    help="How long a closed publication's log stays for subscribers still reading it.",
)
@click.option(
    "--timer-interval",
    type=Duration(min_ns=1_000),
    default=format_duration(_DEFAULTS.timer_interval_ns),
    help="Interval of the driver's slow work (liveness checks, lingering resources); "
    "also the longest an idle driver sleeps while data is in flight.",
)
@click.option(
    "--idle-max-wait",
    type=Duration(min_ns=1_000),
    default=format_duration(_DEFAULTS.idle_max_wait_ns),
    help="The longest an idle driver's data plane sleeps with nothing in flight (unless a client or a "
    "datagram wakes it); its conductor sleeps up to 100 ms.",
)
@click.option(
    "--data-plane-spin",
    type=Duration(),
    default=format_duration(_DEFAULTS.data_plane_spin_ns),
    help="After work, how long the driver's data plane keeps polling before it sleeps: a reply that "
    "comes meanwhile costs no wake-up, but the poll holds a core (for machines with cores to spare). "
    "0s: it sleeps at once.",
)
@click.option(
    "--idle-strategy",
    type=IdleStrategyName(),
    default=_DEFAULTS.idle_strategy,
    help="How the driver waits when idle: doorbell sleeps until a client rings it "
    "(no CPU while idle); the others poll.",
)
@click.option(
    "--terminate-token",
    default=None,
    help="Accept TERMINATE_DRIVER requests carrying this token (refused by default).",
)
@click.option(
    "--member-secret",
    envvar=MEMBER_SECRET_ENV,
    default=None,
    help="The secret the members' drivers share: channels with datagram-mac=true put a MAC of it "
    "(HMAC-SHA256) on every datagram and refuse datagrams without a valid one.  Without it such "
    "channels are refused.",
)
@click.option("--keep-files", is_flag=True, help="Keep the directory when the driver stops.")
@click.option(
    "--to-driver-buffer",
    type=Size(_MIN_CNC_RING, MAX_CAPACITY, power_of_two=True),
    default=format_size(DEFAULT_TO_DRIVER_CAPACITY),
    help="Capacity of the clients-to-driver command buffer in cnc.dat.",
)
@click.option(
    "--to-clients-buffer",
    type=Size(_MIN_CNC_RING, MAX_CAPACITY, power_of_two=True),
    default=format_size(DEFAULT_TO_CLIENTS_CAPACITY),
    help="Capacity of the driver-to-clients broadcast buffer in cnc.dat.",
)
@click.option(
    "--counters-buffer",
    type=Size(_MIN_COUNTERS_BUFFER, _MAX_COUNTERS_BUFFER, multiple_of=COUNTER_LENGTH),
    default=format_size(_DEFAULT_LAYOUT.counters_values_length),
    help=f"Length of the counters values buffer ({COUNTER_LENGTH} bytes per counter; "
    "the metadata buffer is four times as long).",
)
@click.option(
    "--error-buffer",
    type=Size(1024, MAX_CAPACITY),
    default=format_size(_DEFAULT_LAYOUT.error_log_length),
    help="Length of the distinct error log in cnc.dat.",
)
@stop_after_options("60s")
def driver(
    directory: str | None,
    client_liveness_timeout: int,
    client_process_check: bool,
    ipc_term_length: int,
    ipc_mtu: int,
    socket_rcvbuf: int,
    socket_sndbuf: int,
    rcv_initial_window_length: int,
    publication_linger: int,
    timer_interval: int,
    idle_max_wait: int,
    data_plane_spin: int,
    idle_strategy: str,
    terminate_token: str | None,
    member_secret: str | None,
    keep_files: bool,
    to_driver_buffer: int,
    to_clients_buffer: int,
    counters_buffer: int,
    error_buffer: int,
    stop_after: tuple[str, ...],
    stop_after_timeout: int,
) -> None:
    """Run a media driver in the foreground.

    Prints one line with the driver's pid and directory once it serves, and
    exits 0 after SIGINT or SIGTERM, having removed the directory (unless
    --keep-files).  Exits 2 if a live driver already uses the directory.
    """
    path = resolve_driver_dir(directory)
    try:
        check_reclaimable(path)
    except DriverDirectoryError as error:
        raise click.BadParameter(str(error), param_hint="'--dir'") from None
    if terminate_token == "":
        raise click.BadParameter(
            "must not be empty: any client could stop the driver", param_hint="'--terminate-token'"
        )

    context = DriverContext(
        directory=path,
        cnc_layout=CncLayout(
            to_driver_buffer + RING_BUFFER_TRAILER_LENGTH,
            to_clients_buffer + BROADCAST_TRAILER_LENGTH,
            counters_buffer,
            error_buffer,
        ),
        client_liveness_timeout_ns=client_liveness_timeout,
        client_process_check=client_process_check,
        ipc_term_length=ipc_term_length,
        ipc_mtu=ipc_mtu,
        socket_rcvbuf=socket_rcvbuf,
        socket_sndbuf=socket_sndbuf,
        initial_window_length=rcv_initial_window_length,
        publication_linger_timeout_ns=publication_linger,
        timer_interval_ns=timer_interval,
        idle_max_wait_ns=idle_max_wait,
        data_plane_spin_ns=data_plane_spin,
        idle_strategy=idle_strategy,
        terminate_token=None if terminate_token is None else terminate_token.encode("utf-8"),
        member_secret=member_secret.encode("utf-8") if member_secret else None,
        delete_dir_on_shutdown=not keep_files,
    )
    sys.exit(run_driver_until_signalled(context, stop_gate(stop_after, stop_after_timeout, "media driver")))


def run_driver_until_signalled(context: DriverContext, gate: StopGate | None = None) -> int:
    """Serve until SIGINT/SIGTERM or TERMINATE_DRIVER; the process exit code."""

    def announce(driver: MediaDriver) -> None:
        click.echo(f"media driver pid {os.getpid()} serving {context.directory}")
        sys.stdout.flush()

    try:
        run_driver(context, on_ready=announce, stop_gate=gate)
    except DriverAlreadyActiveError as error:
        click.echo(f"cluster-node driver: {error}", err=True)
        return EXIT_DRIVER_ACTIVE
    except (FulmarError, OSError) as error:
        click.echo(f"cluster-node driver: cannot start a media driver in {context.directory}: {error}", err=True)
        return EXIT_FAILURE
    return 0


_ARCHIVE_DEFAULTS = ArchiveContext


@main.command()
@click.option(
    "--dir",
    "archive_dir",
    required=True,
    type=click.Path(file_okay=False, dir_okay=True),
    help="The archive directory: archive.catalog, segment files, archive-mark.dat.",
)
@click.option(
    "--driver-dir",
    type=click.Path(file_okay=False, dir_okay=True),
    envvar=DRIVER_DIR_ENV,
    default=None,
    help="The directory of the media driver the archive is a client of.  [default: the driver's default]",
)
@click.option(
    "--control-channel",
    default=_ARCHIVE_DEFAULTS.control_channel,
    help="Channel of control requests from remote clients (UDP); 'none' for local control only.",
)
@click.option("--control-stream-id", type=int, default=_ARCHIVE_DEFAULTS.control_stream_id)
@click.option(
    "--local-control-channel",
    default=_ARCHIVE_DEFAULTS.local_control_channel,
    help="Channel of control requests from clients of the same driver (IPC).",
)
@click.option("--local-control-stream-id", type=int, default=_ARCHIVE_DEFAULTS.local_control_stream_id)
@click.option(
    "--replication-channel",
    default=_ARCHIVE_DEFAULTS.replication_channel,
    help="Where this archive receives replicated recordings (port 0: any free port).",
)
@click.option(
    "--recording-events-channel",
    default=None,
    help="Publish RecordingStarted/Progress/Stopped events here (off by default).",
)
@click.option(
    "--segment-length",
    type=Size(64 * 1024, 1 << 30, power_of_two=True),
    default=format_size(_ARCHIVE_DEFAULTS.segment_file_length),
    help="Length of each segment file (at least the term length of what is recorded).",
)
@click.option(
    "--file-sync-level",
    type=click.IntRange(0, 2),
    default=0,
    help="0: leave writes to the OS; 1: fdatasync each segment write; 2: fsync (data and metadata).",
)
@click.option(
    "--catalog-file-sync-level",
    type=click.IntRange(0, 2),
    default=None,
    help="Sync level of catalog updates (at least --file-sync-level).  [default: --file-sync-level]",
)
@click.option(
    "--record-checksum/--no-record-checksum",
    default=True,
    help="Store a CRC-32 of each recorded frame's payload in the frame's session id field of the "
    "recorded copy (Aeron's aeron.archive.record.checksum); crash recovery checks it.  On by "
    "default: a cluster's log is recorded with it, so a flipped byte in a segment is found "
    "rather than replayed into the services.",
)
@click.option(
    "--replay-checksum/--no-replay-checksum",
    default=True,
    help="Check each frame's recorded CRC-32 before it is replayed (Aeron's "
    "aeron.archive.replay.checksum): a mismatch ends the replay with an error naming the "
    "recording and position.  Needs recordings made with --record-checksum.",
)
@click.option("--archive-id", type=int, default=-1, help="This archive's id (default: its driver client id).")
@click.option(
    "--authenticator-secret",
    envvar=CLUSTER_SECRET_ENV,
    default=None,
    help="Require control sessions from the network (the UDP control channel) to present this secret, "
    "and present it to the archives this one replicates from; the local IPC channel, which only the "
    "node's user can reach, stays open.  cluster-node start gives the archive the node's "
    "[consensus] authenticator_secret unless [archive] authenticator_secret is set.  Default: allow all.",
)
@stop_after_options("30s")
def archive(
    archive_dir: str,
    driver_dir: str | None,
    control_channel: str,
    control_stream_id: int,
    local_control_channel: str,
    local_control_stream_id: int,
    replication_channel: str,
    recording_events_channel: str | None,
    segment_length: int,
    file_sync_level: int,
    catalog_file_sync_level: int | None,
    record_checksum: bool,
    replay_checksum: bool,
    archive_id: int,
    authenticator_secret: str | None,
    stop_after: tuple[str, ...],
    stop_after_timeout: int,
) -> None:
    """Run an archive in the foreground until SIGINT or SIGTERM.

    It records streams to ARCHIVE_DIR, replays and replicates them, serving
    the archive control protocol on the control channels.
    """
    context = ArchiveContext(
        archive_dir=Path(archive_dir),
        driver_dir=resolve_driver_dir(driver_dir),
        control_channel=None if control_channel.lower() == "none" else control_channel,
        control_stream_id=control_stream_id,
        local_control_channel=local_control_channel,
        local_control_stream_id=local_control_stream_id,
        replication_channel=replication_channel,
        recording_events_channel=recording_events_channel,
        segment_file_length=segment_length,
        file_sync_level=file_sync_level,
        catalog_file_sync_level=file_sync_level if catalog_file_sync_level is None else catalog_file_sync_level,
        record_checksum=record_checksum,
        replay_checksum=replay_checksum,
        archive_id=archive_id,
    )
    if authenticator_secret:
        context.authenticator = CredentialsAuthenticator(authenticator_secret.encode())
        context.replication_credentials = authenticator_secret.encode()
    try:
        context.validate()
    except ValueError as error:
        raise click.UsageError(str(error)) from None

    def announce(running: Archive) -> None:
        recovered = f"; recovered recordings {running.recovered}" if running.recovered else ""
        click.echo(
            f"archive pid {os.getpid()} serving {context.archive_dir} (driver {context.driver_dir}, "
            f"archive id {running.conductor.archive_id}){recovered}"
        )
        sys.stdout.flush()

    try:
        run_archive(context, on_ready=announce, stop_gate=stop_gate(stop_after, stop_after_timeout, "archive"))
    except ArchiveAlreadyActiveError as error:
        click.echo(f"cluster-node archive: {error}", err=True)
        sys.exit(EXIT_DRIVER_ACTIVE)
    except (FulmarError, OSError) as error:
        click.echo(f"cluster-node archive: cannot start an archive in {context.archive_dir}: {error}", err=True)
        sys.exit(EXIT_FAILURE)


_CM_DEFAULTS = ConsensusModuleContext


@main.command()
@click.option(
    "--cluster-dir",
    required=True,
    type=click.Path(file_okay=False, dir_okay=True),
    help="The node's cluster directory: recording.log, cluster-mark.dat.",
)
@click.option(
    "--driver-dir",
    type=click.Path(file_okay=False, dir_okay=True),
    envvar=DRIVER_DIR_ENV,
    default=None,
    help="The node's media driver directory.  [default: the driver's default]",
)
@click.option("--member-id", type=int, default=0)
@click.option("--cluster-id", type=int, default=0)
@click.option("--ingress-channel", default=_CM_DEFAULTS.ingress_channel, help="Where clients send requests.")
@click.option("--log-channel", default=_CM_DEFAULTS.log_channel, help="The log publication's channel.")
@click.option(
    "--archive-control-channel",
    default=_CM_DEFAULTS.archive_control_channel,
    help="The node's archive, for the log and snapshot recordings.",
)
@click.option("--service-count", type=click.IntRange(0, 64), default=1)
@click.option(
    "--session-timeout",
    type=Duration(min_ns=1_000_000),
    default=format_duration(_CM_DEFAULTS.session_timeout_ns),
    help="A silent client session is closed.",
)
@click.option(
    "--max-concurrent-sessions",
    type=click.IntRange(min=1),
    default=_CM_DEFAULTS.max_concurrent_sessions,
    help="Most client sessions open or being connected at once; a connect request beyond it is "
    "rejected (SessionEvent ERROR) until one closes or times out.",
)
@click.option(
    "--authenticator-secret",
    envvar=CLUSTER_SECRET_ENV,
    default=None,
    help="Require clients to present this secret (credentials authenticator); default: allow all.",
)
@click.option(
    "--archive-secret",
    envvar=ARCHIVE_SECRET_ENV,
    default=None,
    help="The secret this module presents to archives (its own, the other members' it replicates the "
    "log from); default: --authenticator-secret.  cluster-node start sets it from the archive's secret.",
)
@click.option(
    "--member-secret",
    envvar=MEMBER_SECRET_ENV,
    default=None,
    help="The secret the members sign their consensus messages and log datagrams with (every member the "
    "same); default: derived from --authenticator-secret, which the clients hold too, so a client could "
    "sign as a member.  Set it apart to keep the members' key from the clients.",
)
@click.option("--app-version", type=int, default=0)
@click.option(
    "--cluster-members",
    default=_CM_DEFAULTS.cluster_members,
    help="The cluster's members as id,ingress,consensus,log,catchup,archive|... (host:port "
    "endpoints); empty: this member alone.",
)
@click.option(
    "--appointed-leader-id",
    type=click.IntRange(min=-1),
    default=_CM_DEFAULTS.appointed_leader_id,
    help="The member that is to lead the first election (-1: elect one).",
)
@click.option(
    "--election-timeout",
    type=Duration(min_ns=1_000_000),
    default=format_duration(_CM_DEFAULTS.election_timeout_ns),
    help="How long an election waits in a state (canvass, nomination, ...) before moving on.",
)
@click.option(
    "--election-status-interval",
    type=Duration(min_ns=1_000_000),
    default=format_duration(_CM_DEFAULTS.election_status_interval_ns),
    help="How often a member repeats its election messages to the others.",
)
@click.option(
    "--startup-canvass-timeout",
    type=Duration(min_ns=1_000_000),
    default=format_duration(_CM_DEFAULTS.startup_canvass_timeout_ns),
    help="At start-up, how long to wait for every member before electing from a majority.",
)
@click.option(
    "--leader-heartbeat-timeout",
    type=Duration(min_ns=1_000_000),
    default=format_duration(_CM_DEFAULTS.leader_heartbeat_timeout_ns),
    help="A follower that hears nothing from the leader for this long starts an election.",
)
@click.option(
    "--leader-heartbeat-interval",
    type=Duration(min_ns=1_000_000),
    default=format_duration(_CM_DEFAULTS.leader_heartbeat_interval_ns),
    help="How often an idle leader tells the followers it is alive (below the heartbeat timeout).",
)
@click.option(
    "--service-heartbeat-timeout",
    type=Duration(min_ns=2_000_000_000),
    default=format_duration(_CM_DEFAULTS.service_heartbeat_timeout_ns),
    help="A service whose mark file shows no activity for this long is taken for dead and the module "
    "stops, so that the node fails over rather than lead without answering.  At least 2s: a "
    "service marks its file once a second.",
)
@click.option(
    "--consensus-channel",
    default=_CM_DEFAULTS.consensus_channel,
    help="Channel of the messages between members (each member's consensus endpoint is added).",
)
@click.option(
    "--replication-channel",
    default=_CM_DEFAULTS.replication_channel,
    help="Where this member's archive receives a log replicated from the leader's (port 0: any).",
)
@click.option(
    "--cycle-threshold",
    type=Duration(min_ns=1_000),
    default=format_duration(_CM_DEFAULTS.cycle_threshold_ns),
    help="A duty cycle longer than this (from one cycle's start to the next's, intended idle "
    "sleeps left out) counts in the cycle-time-exceeded counter.",
)
@click.option(
    "--accept-standby-snapshots/--refuse-standby-snapshots",
    default=_CM_DEFAULTS.accept_standby_snapshots,
    help="Record the snapshots another node announces with a StandbySnapshot on the consensus stream "
    "in this member's recording log (STANDBY_SNAPSHOT entries).",
)
@click.option(
    "--log-retention-snapshots",
    type=click.IntRange(min=0),
    default=_CM_DEFAULTS.log_retention_snapshots,
    metavar="N",
    help="After each snapshot, keep the newest N snapshot sets and purge the older ones and the log "
    "before them (0: keep everything, as Aeron does; cluster-tool purge-log does it on demand).",
)
@click.option(
    "--authenticate-members/--no-authenticate-members",
    default=_CM_DEFAULTS.authenticate_members,
    help="With a secret (--authenticator-secret), sign every message this member sends on the consensus "
    "stream and drop member messages that no member signed (forged, or replayed).  Aeron's members do "
    "not sign: turn it off in a cluster with Aeron members; members then take consensus messages from "
    "the members' hosts only, as without a secret.  The native consensus threads (--native-commit, "
    "--native-follower-commit, --native-append-position) sign and check too, and stay on.",
)
@click.option(
    "--check-consensus-sources/--no-check-consensus-sources",
    default=_CM_DEFAULTS.check_consensus_sources,
    help="Without member authentication (no secret, or --no-authenticate-members), take member messages "
    "on the consensus stream only from the hosts of the cluster members (the image's source address).  "
    "Off: from anyone, for hosts that send from an address the members string does not name.",
)
@click.option(
    "--native-append-position/--agent-append-position",
    envvar=NATIVE_APPEND_POSITION_ENV,
    show_envvar=True,
    default=_CM_DEFAULTS.native_append_position,
    help="As a steady follower, report the archive's recording to the leader (AppendPosition) from a "
    "native thread that the recording wakes, rather than from the module's duty cycle (a Python wake-up "
    "in every round trip).  The environment variable reaches the modules cluster-node start starts.",
)
@click.option(
    "--native-commit/--agent-commit",
    envvar=NATIVE_COMMIT_ENV,
    show_envvar=True,
    default=_CM_DEFAULTS.native_commit,
    help="As a steady leader, read the followers' AppendPositions, move the commit position and send "
    "CommitPosition from a native thread that their arrival wakes, rather than from the module's duty "
    "cycle (a Python wake-up in every round trip).  The environment variable reaches the modules "
    "cluster-node start starts.",
)
@click.option(
    "--native-follower-commit/--agent-follower-commit",
    envvar=NATIVE_FOLLOWER_COMMIT_ENV,
    show_envvar=True,
    default=_CM_DEFAULTS.native_follower_commit,
    help="As a steady follower, read the leader's CommitPositions and the log's client messages and move "
    "the commit position from a native thread that their arrival wakes, rather than from the module's "
    "duty cycle (two wake-ups on each follower per commit, beside the leader's answer to the client).  "
    "The environment variable reaches the modules cluster-node start starts.",
)
@click.option(
    "--native-ingress/--agent-ingress",
    envvar=NATIVE_INGRESS_ENV,
    show_envvar=True,
    default=_CM_DEFAULTS.native_ingress,
    help="As a steady leader, append the clients' session messages to the log from a native thread that "
    "their arrival wakes while the module sleeps, rather than from the module's duty cycle (a Python "
    "wake-up at the head of every round trip).  The environment variable reaches the modules "
    "cluster-node start starts.",
)
def consensus(
    cluster_dir: str,
    driver_dir: str | None,
    member_id: int,
    cluster_id: int,
    ingress_channel: str,
    log_channel: str,
    archive_control_channel: str,
    service_count: int,
    session_timeout: int,
    max_concurrent_sessions: int,
    authenticator_secret: str | None,
    archive_secret: str | None,
    member_secret: str | None,
    app_version: int,
    cluster_members: str,
    appointed_leader_id: int,
    election_timeout: int,
    election_status_interval: int,
    startup_canvass_timeout: int,
    leader_heartbeat_timeout: int,
    leader_heartbeat_interval: int,
    service_heartbeat_timeout: int,
    consensus_channel: str,
    replication_channel: str,
    cycle_threshold: int,
    accept_standby_snapshots: bool,
    log_retention_snapshots: int,
    authenticate_members: bool,
    check_consensus_sources: bool,
    native_append_position: bool,
    native_commit: bool,
    native_follower_commit: bool,
    native_ingress: bool,
) -> None:
    """Run a consensus module in the foreground until SIGTERM or SIGINT (a
    snapshot and an orderly stop of the services at one log position).  A
    repeated SIGTERM, or a SIGINT with it, is the same request; a second
    Ctrl-C, half a second or more after the first, aborts (no snapshot).

    Without --cluster-members it is a cluster of one; with them, --member-id
    must be one of the members.
    """
    try:
        _supervisor.check_membership(cluster_members, member_id, appointed_leader_id)
        _supervisor.check_timing(
            election_timeout, election_status_interval, leader_heartbeat_timeout, leader_heartbeat_interval
        )
    except _supervisor.ClusterSettingError as error:
        raise click.BadParameter(error.message, param_hint=f"'{error.option}'") from None
    log_lines.identify("consensus module", member_id)
    context = ConsensusModuleContext(
        cluster_dir=Path(cluster_dir),
        driver_dir=resolve_driver_dir(driver_dir),
        member_id=member_id,
        cluster_id=cluster_id,
        ingress_channel=ingress_channel,
        log_channel=log_channel,
        archive_control_channel=archive_control_channel,
        service_count=service_count,
        session_timeout_ns=session_timeout,
        max_concurrent_sessions=max_concurrent_sessions,
        app_version=app_version,
        cluster_members=cluster_members.strip(),
        appointed_leader_id=appointed_leader_id,
        election_timeout_ns=election_timeout,
        election_status_interval_ns=election_status_interval,
        startup_canvass_timeout_ns=startup_canvass_timeout,
        leader_heartbeat_timeout_ns=leader_heartbeat_timeout,
        leader_heartbeat_interval_ns=leader_heartbeat_interval,
        consensus_channel=consensus_channel,
        replication_channel=replication_channel,
        service_heartbeat_timeout_ns=service_heartbeat_timeout,
        cycle_threshold_ns=cycle_threshold,
        accept_standby_snapshots=accept_standby_snapshots,
        log_retention_snapshots=log_retention_snapshots,
        authenticate_members=authenticate_members,
        check_consensus_sources=check_consensus_sources,
        native_append_position=native_append_position,
        native_commit=native_commit,
        native_follower_commit=native_follower_commit,
        native_ingress=native_ingress,
    )
    if authenticator_secret:
        context.authenticator = CredentialsAuthenticator(authenticator_secret.encode())
    context.archive_credentials = (archive_secret or authenticator_secret or "").encode()
    context.member_secret = (member_secret or "").encode()

    def announce(module: ConsensusModule) -> None:
        click.echo(
            f"consensus module pid {os.getpid()} member {member_id} serving {cluster_dir} (ingress {ingress_channel})"
        )
        sys.stdout.flush()

    try:
        outcome = run_consensus_module(context, on_ready=announce)
    except ClusterMarkFileActiveError as error:
        click.echo(f"cluster-node consensus: {error}", err=True)
        sys.exit(EXIT_DRIVER_ACTIVE)
    except (FulmarError, OSError) as error:
        click.echo(f"cluster-node consensus: {type(error).__name__}: {error}", err=True)
        sys.exit(EXIT_FAILURE)
    click.echo(f"consensus module stopped: {outcome.reason}")
    _report_orderly_stop("consensus", outcome)


@main.command()
@click.option("--cluster-dir", required=True, type=click.Path(file_okay=False, dir_okay=True))
@click.option("--driver-dir", type=click.Path(file_okay=False, dir_okay=True), envvar=DRIVER_DIR_ENV, default=None)
@click.option("--service", "service_name", required=True, help="The service to run, as module:Class.")
@click.option("--service-id", type=click.IntRange(0, 63), default=0)
@click.option("--member-id", type=int, default=0)
@click.option("--cluster-id", type=int, default=0)
@click.option("--archive-control-channel", default=_CM_DEFAULTS.archive_control_channel)
@click.option(
    "--archive-secret",
    envvar=ARCHIVE_SECRET_ENV,
    default=None,
    help="The secret the container presents to its archive (needed when --archive-control-channel is UDP "
    "and the archive authenticates; cluster-node start sets it then).",
)
@click.option(
    "--follower-apply-interval",
    type=Duration(),
    default=format_duration(ServiceContext.follower_apply_interval_ns),
    help="While this member does not lead and commits come faster than this, apply what is committed once "
    "per interval (each pass takes all of it): a follower's service answers no client, and its wake-up at "
    "every commit takes a core from the leader's service.  0s: at every commit.",
)
@click.option(
    "--on-service-error",
    type=click.Choice(ON_SERVICE_ERROR_CHOICES),
    default=ServiceContext.on_service_error,
    help="What an exception from the service's callbacks does: continue (its traceback goes to the service's "
    "log and error log (cluster-tool errors), it is counted, and the container goes on with the next message, "
    "as every member does: the request that raised gets no reply) or stop (the service fails at that log "
    "position).  An exception from on_start or on_take_snapshot always stops the service.",
)
def service(
    cluster_dir: str,
    driver_dir: str | None,
    service_name: str,
    service_id: int,
    member_id: int,
    cluster_id: int,
    archive_control_channel: str,
    archive_secret: str | None,
    follower_apply_interval: int,
    on_service_error: str,
) -> None:
    """Run a clustered service container with the given service in the foreground."""
    log_lines.identify(f"service {service_id}", member_id)
    context = ServiceContext(
        cluster_dir=Path(cluster_dir),
        driver_dir=resolve_driver_dir(driver_dir),
        service_id=service_id,
        member_id=member_id,
        cluster_id=cluster_id,
        service_name=service_name,
        archive_control_channel=archive_control_channel,
        archive_credentials=(archive_secret or "").encode(),
        follower_apply_interval_ns=follower_apply_interval,
        on_service_error=on_service_error,
    )

    def announce(container: ServiceContainer) -> None:
        agent = container.agent
        if agent.snapshot_recording_id is None:
            origin = "started from the log's start"
        else:
            origin = (
                f"started from snapshot recording {agent.snapshot_recording_id} at log position "
                f"{agent.log_position} (term {agent.leadership_term_id})"
            )
        click.echo(f"service {service_id} ({service_name}) pid {os.getpid()} serving {cluster_dir}; {origin}")
        sys.stdout.flush()

    try:
        outcome = run_service_container(context, on_ready=announce)
    except ClusterMarkFileActiveError as error:
        click.echo(f"cluster-node service: {error}", err=True)
        sys.exit(EXIT_DRIVER_ACTIVE)
    except (FulmarError, OSError) as error:
        click.echo(f"cluster-node service: {type(error).__name__}: {error}", err=True)
        sys.exit(EXIT_FAILURE)
    click.echo(f"service {service_id} stopped: {outcome.reason}")
    _report_orderly_stop("service", outcome)


def _report_orderly_stop(command: str, outcome: StopOutcome) -> None:
    """Tell ``cluster-node start`` (when it started this process) that the
    stop was an orderly one: otherwise it reports exit code 0 as a death."""
    if outcome.orderly is not None:
        problem = report_orderly_stop(outcome.orderly)
        if problem is not None:
            click.echo(f"cluster-node {command}: {problem}", err=True)


_BACKUP_DEFAULTS = ClusterBackupContext(cluster_dir=Path("."))


@main.command(name="cluster-backup")
@click.option(
    "--cluster-dir",
    required=True,
    type=click.Path(file_okay=False, dir_okay=True),
    help="The backup's cluster directory: its recording.log and cluster-mark.dat.",
)
@click.option(
    "--driver-dir",
    type=click.Path(file_okay=False, dir_okay=True),
    envvar=DRIVER_DIR_ENV,
    default=None,
    help="The backup's own media driver's directory.",
)
@click.option("--cluster-id", type=int, default=0)
@click.option(
    "--cluster-consensus-endpoints",
    required=True,
    help="The members' consensus endpoints to query, host:port,host:port,...",
)
@click.option(
    "--consensus-endpoint",
    default=_BACKUP_DEFAULTS.consensus_endpoint,
    help="Where the members answer this backup (host:port; port 0: any free one).",
)
@click.option(
    "--catchup-endpoint",
    required=True,
    help="Where the log source's archive replays the log to this backup's archive (host:port).",
)
@click.option(
    "--archive-control-channel", default=_BACKUP_DEFAULTS.archive_control_channel, help="This backup's own archive."
)
@click.option(
    "--replication-channel",
    default=_BACKUP_DEFAULTS.replication_channel,
    help="Where this backup's archive receives snapshots replicated from a member's (port 0: any).",
)
@click.option(
    "--log-source",
    type=click.Choice(list(LOG_SOURCES)),
    default=_BACKUP_DEFAULTS.log_source,
    help="Which member's log to follow.",
)
@click.option(
    "--backup-interval",
    type=Duration(min_ns=10_000_000),
    default=format_duration(_BACKUP_DEFAULTS.backup_interval_ns),
    help="How often to ask again (new snapshots, a new leader).",
)
@click.option(
    "--backup-response-timeout",
    type=Duration(min_ns=10_000_000),
    default=format_duration(_BACKUP_DEFAULTS.backup_response_timeout_ns),
    help="A member that does not answer within this is passed over for the next.",
)
@click.option(
    "--backup-progress-timeout",
    type=Duration(min_ns=10_000_000),
    default=format_duration(_BACKUP_DEFAULTS.backup_progress_timeout_ns),
    help="Without a live log for this long, the backup starts over.",
)
@click.option(
    "--cool-down-interval",
    type=Duration(min_ns=0),
    default=format_duration(_BACKUP_DEFAULTS.cool_down_interval_ns),
    help="The pause before starting over after an error or a change of log source.",
)
@click.option(
    "--credentials",
    envvar=CLUSTER_SECRET_ENV,
    default=None,
    help="Credentials for the members' authenticators (default: none): presented to their consensus "
    "modules and to their archives (snapshot retrieval, the live log's replay).",
)
def cluster_backup(
    cluster_dir: str,
    driver_dir: str | None,
    cluster_id: int,
    cluster_consensus_endpoints: str,
    consensus_endpoint: str,
    catchup_endpoint: str,
    archive_control_channel: str,
    replication_channel: str,
    log_source: str,
    backup_interval: int,
    backup_response_timeout: int,
    backup_progress_timeout: int,
    cool_down_interval: int,
    credentials: str | None,
) -> None:
    """Run a cluster backup in the foreground until SIGTERM or SIGINT: a copy of
    a cluster's log and latest snapshots in this backup's own archive (its
    own media driver and archive run beside it), kept up to date."""
    context = ClusterBackupContext(
        cluster_dir=Path(cluster_dir),
        driver_dir=resolve_driver_dir(driver_dir),
        cluster_id=cluster_id,
        cluster_consensus_endpoints=cluster_consensus_endpoints,
        consensus_endpoint=consensus_endpoint,
        catchup_endpoint=catchup_endpoint,
        archive_control_channel=archive_control_channel,
        replication_channel=replication_channel,
        log_source=log_source,
        backup_interval_ns=backup_interval,
        backup_response_timeout_ns=backup_response_timeout,
        backup_progress_timeout_ns=backup_progress_timeout,
        cool_down_interval_ns=cool_down_interval,
        encoded_credentials=(credentials or "").encode(),
    )

    def announce(backup: ClusterBackup) -> None:
        click.echo(f"cluster backup pid {os.getpid()} backing up {cluster_consensus_endpoints} into {cluster_dir}")
        sys.stdout.flush()

    try:
        reason = run_cluster_backup(context, on_ready=announce)
    except ClusterMarkFileActiveError as error:
        click.echo(f"cluster-node cluster-backup: {error}", err=True)
        sys.exit(EXIT_DRIVER_ACTIVE)
    except (FulmarError, OSError, ValueError) as error:
        click.echo(f"cluster-node cluster-backup: {type(error).__name__}: {error}", err=True)
        sys.exit(EXIT_FAILURE)
    click.echo(f"cluster backup stopped: {reason}")


# ---------------------------------------------------------------------------- start

from fulmar.cli import supervisor as _supervisor  # noqa: E402 - needs the commands above

_START_OPTIONS = _supervisor.build_options(
    {"driver": driver, "archive": archive, "consensus": consensus, "service": service}
)


@main.command(context_settings={"max_content_width": 110})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The node's TOML configuration: tables [node], [driver], [archive], [consensus], [service]; "
    "every flag below names its key.",
)
@click.option(
    "--local",
    "local_members",
    type=int,
    default=None,
    help="Run a whole cluster of 1, 3 or 5 members on this machine with a generated configuration "
    "under --dir (default /var/tmp/fulmar-<user>/local-cluster): node<i>/ holds each member's "
    "archive/, cluster/, logs/ and node.toml.  Every port is a free UDP port on 127.0.0.1.  If --dir "
    "already holds a local cluster (node<i>/node.toml), it starts again on that configuration: the same "
    "ports and settings (flags that contradict them are refused).",
)
@click.option(
    "--ingress-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="With --local: the UDP port of member 0's ingress on 127.0.0.1; member i's is this + i "
    "(0 or absent: free ports).",
)
@_supervisor.click_options(_START_OPTIONS)
def start(config_path: Path | None, local_members: int | None, ingress_port: int | None, **flags: object) -> None:
    """Start one node: media driver, archive, consensus module and service
    container(s), each its own process, in that order, each once the one
    before it is ready; then supervise them.

    \b
    cluster-node start --config node.toml
    cluster-node start --local 1 [--dir BASE] [--service module:Class]
    cluster-node start --local 3 [--dir BASE] [--ingress-port P]

    Each value comes from its flag, else the config file (--local: the
    generated configuration), else the environment (FULMAR_DRIVER_DIR,
    FULMAR_CLUSTER_SECRET), else the default.  Relative paths in the file are
    relative to the file.  The processes write their output to
    <log_dir>/{driver,archive,consensus,service<i>}.log.

    SIGINT, SIGTERM or SIGHUP stop the node in order: the consensus module
    first (it takes a snapshot and stops the services at one log position),
    then the archive, then the driver; what does not stop within
    --stop-timeout is killed.  A second Ctrl-C (half a second or more after
    the first) kills what is left at once; a repeated SIGTERM is the same
    request.  A signal to every process of the node at once (a service
    manager's stop) stops it in the same order: the archive and the driver
    wait for the processes that use them.
    If a process dies, the supervisor names it, its pid and how it ended, shows
    the end of its log, and stops the rest.  A stop by the cluster
    (cluster-tool shutdown or abort, the leader stopping its followers) or a
    stop signal to the consensus module alone is no death: the module and the
    services stop by themselves and say so, the supervisor stops the archive
    and the driver and says "node N stopped by cluster shutdown at log
    position P".  A process that exits with code 0 any other way has died.

    With --local 3 or 5 every member is such a node, all run by this one
    command: each member's ingress, consensus, log, catch-up and archive
    endpoints are free UDP ports on 127.0.0.1 (the members string is in each
    node<i>/node.toml), the log goes over UDP (aeron:udp?term-length=4m) and
    each archive takes control requests on its member's archive endpoint.  A
    member whose process dies is reported and stopped, the others keep
    running; a signal stops every member (in parallel); the command also ends
    when no member is left.  Flags other than the per-member ones apply to
    every member.

    \b
    Exit codes: 0 stopped cleanly on request or by the cluster; 1 a process
    died or could not start; 2 a configuration error; 3 stopped on request or
    by the cluster, but something had to be killed or exited with an error.
    """
    if local_members is None:
        if ingress_port is not None:
            raise _supervisor.ConfigError(
                "--ingress-port is for --local; otherwise set [consensus] ingress_channel "
                "in the config or pass --consensus-ingress-channel"
            )
        config = _supervisor.resolve_config(_START_OPTIONS, flags, config_path)
        _supervisor.validate(config)
        sys.exit(_supervisor.run_node(config))

    if config_path is not None:
        raise _supervisor.ConfigError("--local generates the configuration: give --config or --local, not both")
    if local_members not in _supervisor.LOCAL_SIZES:
        raise _supervisor.ConfigError(
            f"--local {local_members}: a local cluster has 1, 3 or 5 members (an odd number, so that a majority "
            "survives the loss of the others)"
        )
    _supervisor.check_local_flags(_START_OPTIONS, flags, local_members)
    base_flag = flags.get("dir")
    base = Path(str(base_flag)).absolute() if base_flag else _supervisor.default_local_base()
    flags["dir"] = None  # --dir is the cluster's base here; member i's node directory is base/node<i>
    # --metrics-port P: member i serves on P + i, as with --ingress-port (0: each a free port).
    metrics_flag = flags.pop("metrics_port", None)
    metrics_ports = _supervisor.local_metrics_ports(
        metrics_flag if isinstance(metrics_flag, int) else None, local_members
    )
    existing = _supervisor.local_cluster_files(base)
    if existing:
        # An existing local cluster starts again on its own configuration: same ports, same settings.
        configs = _supervisor.reuse_local_cluster(
            _START_OPTIONS, flags, base, existing, local_members, ingress_port, metrics_ports
        )
        _validate_members(configs)
    else:
        configs = _new_local_cluster(base, local_members, ingress_port, metrics_ports, flags)
    ingress = [_supervisor.ingress_endpoint(config) for config in configs]
    again = " (again, on its configuration in node<i>/node.toml)" if existing else ""
    if local_members == 1:
        click.echo(f"local cluster of 1 member under {base}{again} (ingress {ingress[0]})")
        sys.exit(_supervisor.run_node(configs[0]))
    click.echo(f"local cluster of {local_members} members under {base}{again}")
    for config, endpoint in zip(configs, ingress):
        click.echo(
            f"member {config.member_id}: ingress {endpoint}, node directory "
            f"{config.node_dir}, driver directory {config.driver_dir}"
        )
    endpoints = ",".join(f"{config.member_id}={endpoint}" for config, endpoint in zip(configs, ingress))
    click.echo(f"ingress endpoints: {endpoints}")
    sys.exit(_supervisor.run_local_cluster(configs, endpoints))


def _new_local_cluster(
    base: Path, count: int, ingress_port: int | None, metrics_ports: list[int] | None, flags: dict[str, object]
) -> list[_supervisor.NodeConfig]:
    """The generated configuration of a new local cluster of ``count`` under
    ``base``, checked, each member's written to its node<i>/node.toml."""
    ports = _supervisor.allocate_local_ports(count, ingress_port)
    configs = []
    for member_id, layer in enumerate(_supervisor.local_cluster_layers(base, ports)):
        layer[("service", "service")] = _supervisor.DEFAULT_LOCAL_SERVICE
        if metrics_ports is not None:
            layer[("node", "metrics_port")] = metrics_ports[member_id]
        configs.append(_supervisor.resolve_config(_START_OPTIONS, flags, None, layer))
    _validate_members(configs)
    for config in configs:
        (config.node_dir / "node.toml").write_text(config.to_toml())
    return configs


def _validate_members(configs: list[_supervisor.NodeConfig]) -> None:
    """Check each member's configuration before anything starts; an error names the member (of several)."""
    for config in configs:
        try:
            _supervisor.validate(config)
        except _supervisor.ConfigError as error:
            if len(configs) == 1:
                raise
            raise _supervisor.ConfigError(f"member {config.member_id}: {error.message}") from None


# ---------------------------------------------------------------------------- backup

from fulmar.cli import backup_node as _backup_node  # noqa: E402 - beside start, which it resembles


@main.command(context_settings={"max_content_width": 110})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The backup's TOML configuration: tables [backup], [driver], [archive].",
)
@click.option(
    "--local",
    "local_base",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Back up the local cluster under this base directory (cluster-node start --local 3 --dir "
    "BASE): the backup lives in BASE/backup.",
)
def backup(config_path: Path | None, local_base: Path | None) -> None:
    """Start a cluster backup: its own media driver, its own archive and the
    backup (cluster-node cluster-backup), each its own process, in that order;
    then supervise them.  The backup keeps a copy of the cluster's log and
    latest snapshots, and a recording.log a member can be restored from.

    \b
    cluster-node backup --config backup.toml
    cluster-node backup --local BASE

    SIGINT, SIGTERM or SIGHUP stop the backup, then its archive, then its
    driver.  If a process dies, the supervisor names it, shows the end of its
    log and stops the rest.  Exit codes as for start: 0 stopped cleanly on
    request, 1 a process died or could not start, 2 a configuration error,
    3 stopped on request, but something had to be killed.
    """
    if (config_path is None) == (local_base is None):
        raise _supervisor.ConfigError("give --config FILE or --local BASE")
    if config_path is not None:
        config = _backup_node.read_backup_config(config_path)
    else:
        assert local_base is not None
        config = _backup_node.local_backup_config(local_base.absolute())
        config.backup_dir.mkdir(parents=True, exist_ok=True)
        (config.backup_dir / "backup.toml").write_text(config.to_toml())
    sys.exit(_backup_node.run_backup(config))


if __name__ == "__main__":
    main()

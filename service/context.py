"""Configuration of a clustered service container process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fulmar.archive import protocol as archive_protocol
from fulmar.consensus import protocol
from fulmar.service.errors import ON_SERVICE_ERROR_CONTINUE


@dataclass
class ServiceContext:
    cluster_dir: Path = Path("cluster")
    driver_dir: Path | None = None
    service_id: int = 0
    member_id: int = 0
    cluster_id: int = 0
    service_name: str = ""  # module:Class
    control_channel: str = protocol.CONTROL_CHANNEL
    service_stream_id: int = protocol.SERVICE_STREAM_ID
    consensus_module_stream_id: int = protocol.CONSENSUS_MODULE_STREAM_ID
    replay_channel: str = protocol.REPLAY_CHANNEL
    replay_stream_id: int = protocol.REPLAY_STREAM_ID + 100  # snapshot loads: apart from the module's replays
    snapshot_channel: str = protocol.SNAPSHOT_CHANNEL
    snapshot_stream_id: int = protocol.SNAPSHOT_STREAM_ID
    archive_control_channel: str = archive_protocol.LOCAL_CONTROL_CHANNEL
    archive_control_stream_id: int = archive_protocol.CONTROL_STREAM_ID
    archive_response_stream_id: int = 130  # plus the service id
    archive_credentials: bytes = b""  # what the container presents to its archive
    # Longest idle sleep once the service follows its log: the consensus
    # module rings the data doorbell when the commit position moves, and the
    # driver when control messages or an image arrive.  The container's own
    # periodic work (the driver's keepalive, the mark file, the module's
    # liveness) is in seconds; a service's do_background_work runs on every
    # duty cycle, so at least this often.  While a log is being joined, a
    # termination awaited or commits are not rung, the container keeps its
    # slow tick's pace (ClusteredServiceAgent.idle_wait_ns).
    idle_max_wait_ns: int = 100_000_000
    slow_tick_interval_ns: int = 10_000_000
    # A service that does not lead, while commits come faster than this,
    # applies what is committed once per interval (ClusteredServiceAgent.
    # pause_ns): no client waits on a follower's service, and on a few shared
    # cores its wake-up at every commit takes a core from the leader's service
    # and driver, which answer the client at that moment.  Each pass takes all
    # that is committed, so it never falls behind; commits that come slower
    # are applied as each comes; its module's control messages (a new log, a
    # snapshot, the termination) wait at most this long.  0: at every commit.
    follower_apply_interval_ns: int = 2_000_000
    mark_file_liveness_timeout_ms: int = 10_000
    # What an exception from the service's callbacks does (service/errors.py):
    # "continue" (recorded, counted, and the container goes on with the next
    # message, on every member alike) or "stop" (the service fails there);
    # the container's ServiceErrorHandler refuses any other value.
    on_service_error: str = ON_SERVICE_ERROR_CONTINUE

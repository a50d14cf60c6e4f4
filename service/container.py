"""The clustered service container process: runs one user service.

``load_service("package.module:Class")`` imports the user's class (it must
subclass ``ClusteredService`` and take no arguments).  The container claims
``cluster-mark-service-<id>.dat``, connects to the node's driver (invoker
mode) and archive, starts the service from its snapshot, and runs the agent
until the consensus module tells it to terminate, or SIGTERM (which leaves
the orderly stop to the consensus module, and exits only if it is gone).
"""

from __future__ import annotations

import importlib
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fulmar.aeron import Aeron, Counter
from fulmar.archive.client import AeronArchive
from fulmar.clock import epoch_ms
from fulmar.codecs.generated.cluster_mark import ClusterComponentType
from fulmar.consensus.mark_file import ClusterMarkFile
from fulmar.consensus.protocol import CLUSTERED_SERVICE_ERROR_COUNT_TYPE_ID
from fulmar.errors import FulmarError
from fulmar.idle import DoorbellIdleStrategy
from fulmar.orderly_stop import OrderlyStop, StopCause, StopOutcome
from fulmar.permissions import make_directory
from fulmar.service.agent import ClusteredServiceAgent, StoppedBeforeStart
from fulmar.service.clustered_service import ClusteredService
from fulmar.service.context import ServiceContext
from fulmar.stop_signals import StopKind, StopSignalHandlers, StopSignals


class ServiceLoadError(FulmarError):
    """The service named as module:Class cannot be loaded."""


# How a user names the directory of a service's module to ``cluster-node start``.
SERVICE_PATH_HINT = 'cluster-node start --service-path DIR ([service] path = "DIR" in node.toml), or PYTHONPATH=DIR'


def service_class(name: str, search_path: Sequence[Path] = ()) -> type[ClusteredService]:
    """The ClusteredService subclass ``module:Class`` names (not instantiated),
    its module looked for in ``search_path`` first, then on Python's path."""
    module_name, colon, class_name = name.partition(":")
    if not colon or not module_name or not class_name:
        raise ServiceLoadError(f"service {name!r}: expected module:Class, e.g. fulmar.service.samples:EchoService")
    added = [str(path) for path in search_path if str(path) not in sys.path]
    sys.path[:0] = added
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        top = module_name.split(".")[0]
        if error.name != top:  # the module's package was found; something below it, or that it imports, was not
            raise ServiceLoadError(f"service {name!r}: cannot import {module_name}: {error}") from None
        looked = [str(Path(entry or ".").absolute()) for entry in sys.path]
        places = ", ".join(dict.fromkeys(entry for entry in looked if os.path.isdir(entry)))
        raise ServiceLoadError(
            f"service {name!r}: cannot import {module_name}: no module named {top!r} in any of {places}; put "
            f"{top}.py (or the package {top}/) in one of them, or name the directory that holds it: "
            f"{SERVICE_PATH_HINT}"
        ) from None
    except Exception as error:  # noqa: BLE001 - any failure to import is the user's to see
        raise ServiceLoadError(
            f"service {name!r}: cannot import {module_name}: {type(error).__name__}: {error}"
        ) from None
    finally:
        for entry in added:
            sys.path.remove(entry)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ServiceLoadError(f"service {name!r}: module {module_name} has no {class_name}")
    if not isinstance(cls, type) or not issubclass(cls, ClusteredService):
        raise ServiceLoadError(f"service {name!r}: {class_name} is not a ClusteredService subclass")
    return cls


def load_service(name: str) -> ClusteredService:
    cls = service_class(name)
    try:
        return cls()
    except Exception as error:
        raise ServiceLoadError(f"service {name!r}: {cls.__name__}() failed: {type(error).__name__}: {error}") from None


class ServiceContainer:
    def __init__(
        self,
        context: ServiceContext,
        aeron: Aeron,
        archive: AeronArchive,
        mark_file: ClusterMarkFile,
        error_counter: Counter,
        agent: ClusteredServiceAgent,
    ) -> None:
        self.context = context
        self.aeron = aeron
        self.archive = archive
        self.mark_file = mark_file
        self.error_counter = error_counter
        self.agent = agent
        self._stop = threading.Event()
        self._closed = False
        self.orderly_stop: OrderlyStop | None = None  # set when its consensus module told it to stop

    @classmethod
    def launch(
        cls,
        context: ServiceContext,
        service: ClusteredService | None = None,
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> ServiceContainer:
        service = service if service is not None else load_service(context.service_name)
        cluster_dir = Path(context.cluster_dir)
        make_directory(cluster_dir)
        aeron = Aeron.connect(context.driver_dir, use_conductor_thread=False)
        mark_file = archive = error_counter = None
        try:
            mark_file = ClusterMarkFile.create(
                cluster_dir,
                ClusterComponentType.CONTAINER,
                service_id=context.service_id,
                pid=os.getpid(),
                member_id=context.member_id,
                cluster_id=context.cluster_id,
                now_ms=epoch_ms(),
                aeron_directory=str(aeron.directory),
                control_channel=context.control_channel,
                service_name=context.service_name or type(service).__name__,
                service_stream_id=context.service_stream_id,
                consensus_module_stream_id=context.consensus_module_stream_id,
                liveness_timeout_ms=context.mark_file_liveness_timeout_ms,
            )
            archive = AeronArchive.connect(
                aeron,
                control_request_channel=context.archive_control_channel,
                control_request_stream_id=context.archive_control_stream_id,
                control_response_channel="aeron:ipc?term-length=64k",
                control_response_stream_id=context.archive_response_stream_id + context.service_id,
                credentials=context.archive_credentials,
            )
            # Aeron's "Cluster Container Errors" counter (keyed by cluster and service id).
            error_counter = aeron.add_counter(
                CLUSTERED_SERVICE_ERROR_COUNT_TYPE_ID,
                f"Cluster Container Errors - clusterId={context.cluster_id} serviceId={context.service_id}",
                struct.pack("<ii", context.cluster_id, context.service_id),
            )
            agent = ClusteredServiceAgent(
                context, aeron, archive, service, _counted(mark_file.error_log(epoch_ms).record, error_counter)
            )
            agent.start(stop_requested=stop_requested)
            mark_file.signal_ready()
        except BaseException:
            for resource in (error_counter, archive, mark_file):
                if resource is not None:
                    resource.close()
            aeron.close()
            raise
        return cls(context, aeron, archive, mark_file, error_counter, agent)

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> str:
        agent = self.agent
        ring_deferred = self.aeron.ring_deferred
        max_wait_ns = self.context.idle_max_wait_ns
        idle = DoorbellIdleStrategy(self.aeron.conductor.data_doorbell, max_wait_ns, has_work=agent.has_work)
        agent.idle_strategy = idle
        next_slow_ns = 0
        next_mark_ms = 0
        next_module_check_ns = time.monotonic_ns() + 1_000_000_000
        while not agent.terminated:
            now_ns = time.monotonic_ns()
            try:
                work = agent.do_work(now_ns)
            except FulmarError:
                raise
            except Exception as error:
                # The service's own exceptions are handled where it is called
                # (agent.errors): this is a fault of the container itself, which
                # cannot know what it left undone of the log; it stops, saying where.
                agent.errors.fail("the container's duty cycle", error, agent.log_position, "a fault of the container")
            ring_deferred()  # the egress readers, once for all the replies of this cycle
            if now_ns < next_slow_ns and self.aeron.conductor.has_driver_news():
                # A new image (the log to join) now, not at the next slow tick.
                work += self.aeron.do_work(now_ns)
            if now_ns >= next_slow_ns:
                next_slow_ns = now_ns + self.context.slow_tick_interval_ns
                work += self.aeron.do_work(now_ns)
                now_ms = epoch_ms()
                if now_ms >= next_mark_ms:
                    self.mark_file.update_activity_timestamp(now_ms)
                    next_mark_ms = now_ms + 1000
                if self.aeron.is_closed:
                    return "the media driver went away"
                if self._stop.is_set() and not _consensus_module_alive(Path(self.context.cluster_dir)):
                    return "stopped (no consensus module to stop it in order)"
                if now_ns >= next_module_check_ns:
                    # As Aeron's service: without its consensus module (dead, or
                    # replaced by a restarted one) the service has no log to
                    # follow; it exits and starts again with the module.
                    next_module_check_ns = now_ns + 1_000_000_000
                    if not _consensus_module_alive(Path(self.context.cluster_dir), agent.consensus_module_pid):
                        return "the consensus module went away"
            if not work:
                pause_ns = agent.pause_ns(now_ns)
                if pause_ns:
                    idle.pause(pause_ns)  # a follower's: the commits meanwhile are taken together
                    continue
                idle.max_wait_ns = agent.idle_wait_ns(max_wait_ns)
            idle.idle(work)
        self.orderly_stop = OrderlyStop(StopCause.MODULE_TERMINATION, agent.log_position)
        return f"terminated at log position {agent.log_position}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.agent.close()
            self.error_counter.close()
            self.archive.close()
        finally:
            self.mark_file.close()
            self.aeron.close()


def _counted(record_error: Callable[[str], bool], counter: Counter) -> Callable[[str], bool]:
    """``record_error`` that also counts each error, as Aeron's CountedErrorHandler
    does: every error the container records, its service's exceptions included."""

    def record(text: str) -> bool:
        counter.increment()
        return record_error(text)

    return record


def _consensus_module_alive(cluster_dir: Path, pid: int | None = None) -> bool:
    """Whether this node's consensus module (process ``pid``, if given) is up:
    its mark file fresh and its process alive.  A service stopped by a signal
    waits for the module's orderly stop, but not for a module that is gone."""
    from fulmar.consensus.mark_file import read_liveness

    liveness = read_liveness(cluster_dir / "cluster-mark.dat")
    if liveness is None or (pid is not None and liveness.pid != pid):
        return False
    return liveness.is_active(epoch_ms())


def run_service_container(
    context: ServiceContext,
    service: ClusteredService | None = None,
    on_ready: Callable[[ServiceContainer], None] | None = None,
) -> StopOutcome:
    """Launch, serve until told to stop, close.  Returns why it stopped, and
    whether that was an orderly stop (its module's termination)."""
    running: list[ServiceContainer] = []

    def on_stop(kind: StopKind | None, signum: int) -> None:
        # Any stop signal: the service waits for its module's orderly stop
        # (it stops at the module's termination position), or stops once the
        # module is gone.
        if kind is not None:
            for container in running:
                container.request_stop()

    rule = StopSignals()
    with StopSignalHandlers(rule, on_stop, time.monotonic_ns):
        try:
            container = ServiceContainer.launch(context, service, stop_requested=lambda: rule.requested is not None)
        except StoppedBeforeStart as stopped:
            return StopOutcome(str(stopped), None)
        try:
            running.append(container)
            if rule.requested is not None:
                container.request_stop()
            if on_ready is not None:
                on_ready(container)
            reason = container.run()
        finally:
            running.clear()
            container.close()
        return StopOutcome(reason, container.orderly_stop)

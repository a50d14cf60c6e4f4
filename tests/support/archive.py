"""Archive processes for tests: started with ``cluster-node archive``, reaped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fulmar.aeron import Aeron
from fulmar.archive.client import AeronArchive
from support.driver import (
    DriverProcess,
    free_udp_port,
    kill_process,
    new_driver_dir,
    remove_driver_dir,
    stop_process,
    wait_for,
)


class ArchiveProcess:
    """``cluster-node archive`` in a child process; ready once it printed its banner."""

    def __init__(self, archive_dir: Path, driver_dir: Path, *extra: str, control_port: int | None = None) -> None:
        self.archive_dir = archive_dir
        self.driver_dir = driver_dir
        self.control_port = control_port
        control = f"aeron:udp?endpoint=127.0.0.1:{control_port}" if control_port else "none"
        args = [
            sys.executable,
            "-m",
            "fulmar.cli.cluster_node",
            "archive",
            "--dir",
            str(archive_dir),
            "--driver-dir",
            str(driver_dir),
            "--control-channel",
            control,
            "--replication-channel",
            "aeron:udp?endpoint=127.0.0.1:0",
            *extra,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        self.banner = ""
        wait_for(self._ready, 30, f"the archive in {archive_dir} to start")

    def _ready(self) -> bool:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line:
            self.banner += line
        if self.process.poll() is not None:
            raise AssertionError(f"archive exited with {self.process.returncode}: {self.stderr()}")
        return "serving" in self.banner

    def stderr(self) -> str:
        assert self.process.stderr is not None
        try:
            return self.process.stderr.read() or ""
        except (OSError, ValueError):
            return ""

    @property
    def control_channel(self) -> str:
        assert self.control_port is not None
        return f"aeron:udp?endpoint=127.0.0.1:{self.control_port}"

    def kill(self) -> None:
        kill_process(self.process)

    def stop(self) -> int:
        return stop_process(self.process, 15)


class ArchiveNode:
    """A media driver and an archive in child processes, with this process's
    client of both; ``close`` reaps them and removes their directories."""

    def __init__(self, name: str) -> None:
        self.driver_dir = new_driver_dir()
        self.archive_dir = Path(tempfile.mkdtemp(prefix=f"fulmar-archive-{name}-"))
        self.driver: DriverProcess | None = None
        self.archive: ArchiveProcess | None = None
        self.aeron: Aeron | None = None
        self.client: AeronArchive | None = None

    def start(self) -> ArchiveNode:
        self.driver = DriverProcess(self.driver_dir)
        self.archive = ArchiveProcess(
            self.archive_dir, self.driver_dir, "--segment-length", "1m", control_port=free_udp_port()
        )
        self.aeron = self.driver.connect()
        self.client = AeronArchive.connect(self.aeron)
        return self

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.close()
            if self.aeron is not None:
                self.aeron.close()
        finally:
            if self.archive is not None:
                self.archive.stop()
            if self.driver is not None:
                self.driver.stop()
            remove_driver_dir(self.driver_dir)
            shutil.rmtree(self.archive_dir, ignore_errors=True)


class RawControlClient:
    """A client of an archive's control channel that sends what it is told,
    request by request, and reads what comes back: a stranger's view (it may
    name any control session, answer a challenge or not).  ``close`` releases
    its publication and subscription."""

    def __init__(
        self,
        aeron: Aeron,
        control_channel: str,
        response_channel: str = "aeron:udp?endpoint=127.0.0.1:0",
        response_stream_id: int = 21,
        timeout_s: float = 10,
    ) -> None:
        from fulmar.archive.client import ArchiveProxy, ControlResponsePoller
        from fulmar.channel_uri import ChannelUri

        self.aeron = aeron
        self.response_stream_id = response_stream_id
        self.subscription = aeron.add_subscription(response_channel, response_stream_id)
        self.publication = aeron.add_exclusive_publication(control_channel, 10)
        uri = ChannelUri.parse(response_channel)
        if uri.is_udp:
            endpoint = wait_for(lambda: self.subscription.resolved_endpoint, timeout_s, "the response endpoint")
            uri = uri.with_param("endpoint", endpoint)
        self.response_channel = str(uri)
        wait_for(lambda: self.publication.is_connected, timeout_s, f"a publication to {control_channel}")
        self.proxy = ArchiveProxy(self.publication)
        self.poller = ControlResponsePoller(self.subscription)
        self.received: list[tuple[str, object]] = []

    def send(self, encoder: object, **fields: object) -> None:
        wait_for(lambda: self.proxy.send(encoder, **fields), 10, f"an offer of {getattr(encoder, 'NAME', encoder)}")

    def connect(self, credentials: bytes | None, correlation_id: int = 1) -> None:
        """An AuthConnectRequest with ``credentials``, or (None) the old ConnectRequest."""
        from fulmar.archive import protocol
        from fulmar.codecs.generated import archive as codecs

        common = dict(
            correlation_id=correlation_id,
            response_stream_id=self.response_stream_id,
            version=protocol.PROTOCOL_SEMANTIC_VERSION,
            response_channel=self.response_channel,
        )
        if credentials is None:
            self.send(codecs.ConnectRequestEncoder, **common)
        else:
            self.send(codecs.AuthConnectRequestEncoder, encoded_credentials=credentials, **common)

    def poll(self) -> list[tuple[str, object]]:
        batch = self.poller.poll()
        self.received.extend(batch)
        return batch

    def next(self, timeout_s: float, what: str, kinds: tuple[str, ...] = ("response", "challenge")) -> object:
        """The next message of ``kinds`` (others are kept in ``received``)."""
        found: list[object] = []

        def arrived() -> bool:
            for kind, message in self.poll():
                if kind in kinds and not found:
                    found.append(message)
            return bool(found)

        wait_for(arrived, timeout_s, what)
        return found[0]

    def quiet_for(self, duration_s: float) -> list[tuple[str, object]]:
        """Everything that arrives within ``duration_s`` (a bounded wait for nothing)."""
        end = time.monotonic() + duration_s
        got: list[tuple[str, object]] = []
        while time.monotonic() < end:
            got.extend(self.poll())
            time.sleep(0.01)
        return got

    def close(self) -> None:
        self.publication.close()
        self.subscription.close()

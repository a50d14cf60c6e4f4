"""A cluster backup beside a ``LocalCluster`` for tests: its own media driver,
its own archive and ``cluster-node cluster-backup``, each its own process on
127.0.0.1; and its log read back from its archive's segment files."""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

from fulmar.archive.segment import segment_base_of_file
from fulmar.cli.supervisor import free_udp_ports
from fulmar.cnc import CncFile
from fulmar.consensus.recording_log import RecordingLog
from fulmar.counters import CountersReader
from support.cluster import _DRIVER_ARGS, LocalCluster, NodeProcess
from support.driver import new_driver_dir, remove_driver_dir

_FRAME = struct.Struct("<iBBHii")


class Backup:
    """A backup's three processes and directories.  ``credentials``: what the
    backup presents to the members (their consensus modules and archives),
    and the secret its own archive asks for."""

    def __init__(self, cluster: LocalCluster, credentials: str | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="fulmar-backup-"))
        self.driver_dir = new_driver_dir()
        self.cluster_dir = self.base / "cluster"
        self.archive_dir = self.base / "archive"
        archive_port, consensus_port, catchup_port = free_udp_ports(3)
        self.catchup_endpoint = f"127.0.0.1:{catchup_port}"
        endpoints = ",".join(cluster.ports[m].endpoint("consensus") for m in range(cluster.size))
        self.processes: list[NodeProcess] = []
        try:
            self.processes.append(
                NodeProcess(
                    ["driver", "--dir", str(self.driver_dir), *_DRIVER_ARGS],
                    "media driver pid",
                    self.base / "driver.log",
                )
            )
            self.processes.append(
                NodeProcess(
                    [
                        "archive",
                        "--dir",
                        str(self.archive_dir),
                        "--driver-dir",
                        str(self.driver_dir),
                        "--control-channel",
                        f"aeron:udp?endpoint=127.0.0.1:{archive_port}",
                        "--replication-channel",
                        "aeron:udp?endpoint=127.0.0.1:0",
                        *(["--authenticator-secret", credentials.rpartition(":")[2]] if credentials else []),
                    ],
                    "archive pid",
                    self.base / "archive.log",
                )
            )
            self.processes.append(
                NodeProcess(
                    [
                        "cluster-backup",
                        "--cluster-dir",
                        str(self.cluster_dir),
                        "--driver-dir",
                        str(self.driver_dir),
                        "--cluster-consensus-endpoints",
                        endpoints,
                        "--consensus-endpoint",
                        f"127.0.0.1:{consensus_port}",
                        "--catchup-endpoint",
                        self.catchup_endpoint,
                        "--backup-interval",
                        "1s",
                        "--backup-response-timeout",
                        "1s",
                        "--cool-down-interval",
                        "200ms",
                        *(["--credentials", credentials] if credentials else []),
                    ],
                    "cluster backup pid",
                    self.base / "backup.log",
                )
            )
        except BaseException:
            self.close()
            raise

    def counters(self, type_id: int) -> list[int]:
        """The values of the counters of ``type_id`` on the backup's driver
        (its own and its archive's)."""
        with CncFile.open(self.driver_dir) as cnc:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            return [reader.counter_value(c.counter_id) for c in reader if c.type_id == type_id]

    def counter(self, type_id: int) -> int:
        values = self.counters(type_id)
        assert len(values) == 1, f"{len(values)} backup counters of type {type_id}"
        return values[0]

    def output(self) -> str:
        return self.processes[-1].output() if self.processes else ""

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.alive:
                process.stop(15)
            else:
                process.kill()
        self.processes.clear()
        remove_driver_dir(self.driver_dir)
        shutil.rmtree(self.base, ignore_errors=True)


def backup_log(backup: Backup, limit: int) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of each frame of the backup's log recording up to ``limit``."""
    log = RecordingLog.open(backup.cluster_dir, create=False)
    try:
        recording_id = log.find_last_term_recording_id()
    finally:
        log.close()
    segments = sorted(backup.archive_dir.glob(f"{recording_id}-*.rec"), key=lambda p: segment_base_of_file(p.name))
    assert segments and segment_base_of_file(segments[0].name) == 0, "the backup holds no log from position 0"
    data = b"".join(p.read_bytes() for p in segments)
    frames = []
    offset = 0
    while offset < limit:
        length, _, flags, frame_type, _, _ = _FRAME.unpack_from(data, offset)
        assert length > 0, f"the backup's log has no frame at {offset} (limit {limit})"
        frames.append((frame_type, flags, data[offset + 32 : offset + length]))
        offset += (length + 31) & ~31
    return frames

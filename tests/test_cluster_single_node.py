"""A one-member cluster of real processes (driver, archive, consensus module,
service container) serving sample services to real clients."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cluster_support import SingleNodeCluster
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog


@pytest.fixture
def cluster_of() -> Iterator[Any]:
    clusters: list[SingleNodeCluster] = []

    def start(service: str, *args: str) -> SingleNodeCluster:
        cluster = SingleNodeCluster(service, extra_consensus_args=args)
        clusters.append(cluster)
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.close()


def connect(cluster: SingleNodeCluster, **options: Any) -> ClusterClient:
    return ClusterClient.connect(cluster.connect(), cluster.ingress_channel,
                                 egress_channel="aeron:udp?endpoint=127.0.0.1:0",
                                 message_timeout_ns=20_000_000_000, **options)


def test_echo_every_message_in_order(cluster_of: Any) -> None:
    cluster = cluster_of("fulmar.service.samples:EchoService")
    replies: list[bytes] = []
    client = connect(cluster, on_message=lambda session_id, timestamp, payload: replies.append(bytes(payload)))
    total, window = 5000, 200
    sent = 0
    deadline = time.monotonic() + 120
    while len(replies) < total:
        while sent < total and sent - len(replies) < window:
            if client.offer(struct.pack("<q", sent) * (1 + sent % 16)) > 0:
                sent += 1
            else:
                break
        if not client.poll_egress(100):
            assert time.monotonic() < deadline, f"{len(replies)} of {total} echoes in 120 s"
    assert replies == [struct.pack("<q", seq) * (1 + seq % 16) for seq in range(total)]
    client.close()


def test_snapshot_stop_and_restart_keeps_the_state(cluster_of: Any) -> None:
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    for expected in range(1, 51):
        value, _ = struct.unpack("<qq", client.request(b"+", 10))
        assert value == expected
    client.close()
    cluster.stop_node()  # SIGTERM: a snapshot, then an orderly stop at one log position
    assert "consensus module stopped: SHUTDOWN at log position" in cluster.consensus.output()
    with RecordingLog.open(cluster.cluster_dir, create=False) as recording_log:
        assert recording_log.get_latest_snapshot(-1) is not None  # the module's
        assert recording_log.get_latest_snapshot(0) is not None  # the service's
    cluster.start_consensus()
    cluster.start_service()
    client = connect(cluster)
    value, _ = struct.unpack("<qq", client.request(b"?", 10))
    assert value == 50
    value, _ = struct.unpack("<qq", client.request(b"+", 10))
    assert value == 51
    client.close()


@pytest.mark.parametrize("victim", ["consensus", "service"])
def test_sigkill_while_a_client_writes_then_restart_replays_the_log(cluster_of: Any, victim: str) -> None:
    """Every acknowledged increment is there after the restart, none twice."""
    cluster = cluster_of("fulmar.service.samples:CounterService")
    client = connect(cluster)
    acknowledged = 0
    sent = 0
    for _ in range(40):
        sent += 1
        value, _ = struct.unpack("<qq", client.request(b"+", 10))
        acknowledged = value
    # Kill mid-stream: one more increment is in flight.
    client.offer(b"+")
    sent += 1
    getattr(cluster, victim).kill()
    # The rest of the node goes down with it (the survivor cannot carry on alone).
    for process in (cluster.consensus, cluster.service):
        if process is not None:
            process.kill()
    client.close()
    cluster.start_consensus()
    cluster.start_service()
    client = connect(cluster)
    value, _ = struct.unpack("<qq", client.request(b"?", 10))
    assert acknowledged <= value <= sent, (acknowledged, value, sent)
    assert acknowledged == 40
    client.close()

"""A StateMachine's snapshot through the real container and archive: one
member serving ``support.state_machine_services:Journal`` stops with a snapshot
(SIGTERM) and starts from it, with a state larger than a snapshot message
(so split across many) and the record of a call that a resend after the
restart must be answered from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fulmar
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog
from fulmar.service.call_protocol import RequestKind, encode_request, pack
from fulmar.service.state_machine import SNAPSHOT_CHUNK_LENGTH
from support.cluster import SingleNodeCluster

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TESTS_DIR = Path(__file__).parents[1]
BIG_ENTRY_LENGTH = 100_000


def raw_client(cluster: SingleNodeCluster) -> ClusterClient:
    """An Aeron-shaped client, to send requests byte for byte."""
    return ClusterClient.connect(
        cluster.connect(),
        cluster.ingress_channel,
        egress_channel="aeron:udp?endpoint=127.0.0.1:0",
        message_timeout_ns=20_000_000_000,
    )


def test_a_restart_from_the_snapshot_keeps_the_state_and_the_call_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    cluster = SingleNodeCluster("support.state_machine_services:Journal")
    try:
        cluster.start()
        assert cluster.service is not None
        assert "started from the log's start" in cluster.service.output()
        endpoint = cluster.ingress_channel.partition("endpoint=")[2]
        expected: list[object] = []
        with fulmar.connect(endpoint) as client:
            for n in range(3):
                expected.append(["big", n, "x" * BIG_ENTRY_LENGTH])
                client.call("append", expected[-1])
            for n in range(100):
                expected.append(n)
                client.call("append", n)
        assert 3 * BIG_ENTRY_LENGTH > 4 * SNAPSHOT_CHUNK_LENGTH  # many snapshot messages

        client_id = os.urandom(16)
        call = encode_request(RequestKind.CALL, client_id, 1, 1, pack(["append", ["marker"]]))
        raw = raw_client(cluster)
        raw.request(encode_request(RequestKind.REGISTER, client_id, 0, 0), timeout_s=10)
        answer = raw.request(call, timeout_s=10)
        expected.append("marker")
        raw.close()

        cluster.stop_node()  # SIGTERM: a snapshot, then an orderly stop
        with RecordingLog.open(cluster.cluster_dir, create=False) as recording_log:
            snapshot = recording_log.get_latest_snapshot(0)
            assert snapshot is not None, "the service took no snapshot"
        cluster.start_consensus()
        service = cluster.start_service()
        # The service says what it started from: the snapshot the recording log names, at its position.
        assert (
            f"started from snapshot recording {snapshot.recording_id} at log position {snapshot.log_position} "
            f"(term {snapshot.leadership_term_id})"
        ) in service.output(), service.output()

        # The record came back with the snapshot: the resend gets the same
        # answer, byte for byte, and is not applied again (forgotten, it
        # would get EXPIRED; applied again, another index and entry).
        raw = raw_client(cluster)
        assert raw.request(call, timeout_s=10) == answer
        raw.close()
        with fulmar.connect(endpoint) as client:
            assert client.call("read")["entries"] == expected
    finally:
        cluster.close()

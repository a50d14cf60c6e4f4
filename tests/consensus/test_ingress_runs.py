"""The leader's hot path for client messages on the ingress
(``ConsensusModuleAgent._on_ingress_session_messages``): a run of them goes
to the log in one append, each with the header the per-message path gives it;
invalid ones are counted; what back pressure turns away waits, in order."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fulmar.consensus.agent import ClusterRole, ConsensusModuleAgent
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionState
from fulmar.consensus.protocol import CLUSTER_SCHEMA_VERSION
from fulmar.log_reader import LogReader, SessionMessages
from fulmar.log_writer import ExclusiveLogWriter
from fulmar.logbuffer import LogBuffers

HEADER = struct.Struct("<HHHHqqq")
TERM = 3
NOW_MS = 1_700_000_000_123


def ingress_message(session_id: int, payload: bytes, term: int = TERM, version: int = 99) -> bytes:
    return HEADER.pack(24, 1, 111, version, term, session_id, 5) + payload


class FakeLogPublisher:
    def __init__(self, accept: int) -> None:
        self.accept = accept
        self.appended: list[bytes] = []

    def append_block(self, block: bytes, lengths: Any) -> int:
        taken = min(self.accept, len(lengths))
        at = 0
        for length in lengths[:taken]:
            self.appended.append(block[at : at + length])
            at += length
        return taken


def fake_leader(accept: int) -> Any:
    sessions = {}
    for session_id, state in ((5, ClusterSessionState.OPEN), (6, ClusterSessionState.CLOSING)):
        session = ClusterSession(session_id, 102, "aeron:udp?endpoint=127.0.0.1:1", 0, 0)
        session.state = state
        sessions[session_id] = session
    leader = SimpleNamespace(
        sessions=sessions,
        leadership_term_id=TERM,
        role=ClusterRole.LEADER,
        _pending_ingress=deque(),
        cluster_time=lambda: NOW_MS,
        invalid_requests_counter=SimpleNamespace(value=0),
        log_publisher=FakeLogPublisher(accept),
        _now_ns=424242,
        taken_one_by_one=[],
    )
    leader.invalid_requests_counter.increment = lambda: setattr(
        leader.invalid_requests_counter, "value", leader.invalid_requests_counter.value + 1
    )
    leader._take_ingress = lambda buffer, offset, length: leader.taken_one_by_one.append(
        bytes(buffer[offset : offset + length])
    )
    return leader


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogBuffers]:
    buffers = LogBuffers.create(
        tmp_path / "ingress.logbuffer", 64 * 1024, session_id=1, stream_id=101, initial_term_id=0
    )
    yield buffers
    buffers.close()


def run_of(log: LogBuffers, messages: list[bytes]) -> list[SessionMessages]:
    writer = ExclusiveLogWriter(log)
    for message in messages:
        assert writer.offer(message) > 0
    runs: list[SessionMessages] = []
    LogReader(log).bounded_poll_session_runs(lambda *a: None, runs.append, writer.position, 100)
    assert len(runs) == 1 and runs[0].count == len(messages)
    return runs


INGRESS = [
    ingress_message(5, b"first"),
    ingress_message(6, b"a closing session's"),
    ingress_message(5, b"an old term's", term=TERM - 1),
    ingress_message(7, b"an unknown session's"),
    ingress_message(5, b"second"),
    ingress_message(5, b"third"),
]


@pytest.mark.parametrize("accept", [3, 2, 0])
def test_a_run_goes_to_the_log_in_order_and_back_pressure_keeps_the_rest(log: LogBuffers, accept: int) -> None:
    leader = fake_leader(accept)
    (run,) = run_of(log, INGRESS)
    ConsensusModuleAgent._on_ingress_session_messages(leader, run)
    assert leader.invalid_requests_counter.value == 3
    valid = [b"first", b"second", b"third"]
    # Each appended message: this term, its session, the cluster time, the cluster's schema version.
    assert leader.log_publisher.appended == [
        HEADER.pack(24, 1, 111, CLUSTER_SCHEMA_VERSION, TERM, 5, NOW_MS) + payload for payload in valid[:accept]
    ]
    assert list(leader._pending_ingress) == [ingress_message(5, payload) for payload in valid[accept:]]
    assert leader.sessions[5].time_of_last_activity_ns == (424242 if accept else 0)
    assert leader.taken_one_by_one == []


@pytest.mark.parametrize(
    "change",
    [
        {"_pending_ingress": deque([b"waiting"])},
        {"role": ClusterRole.FOLLOWER},
    ],
    # (A suspended leader does not read its ingress at all: test_agent_states.)
    ids=["messages already waiting", "a follower"],
)
def test_otherwise_each_message_takes_the_per_message_path(log: LogBuffers, change: dict[str, Any]) -> None:
    leader = fake_leader(10)
    for name, value in change.items():
        setattr(leader, name, value)
    (run,) = run_of(log, INGRESS)
    ConsensusModuleAgent._on_ingress_session_messages(leader, run)
    assert leader.taken_one_by_one == INGRESS
    assert leader.log_publisher.appended == [] and leader.invalid_requests_counter.value == 0

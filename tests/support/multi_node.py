"""What the multi-member tests look at: each member's role, term and commit
position (its consensus module's counters, as cluster-tool reads them), the
log each member's archive holds, and a client workload that records what the
cluster acknowledged."""

from __future__ import annotations

import signal
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fulmar.archive.segment import segment_base_of_file
from fulmar.cli.cluster_commands import ClusterNode, cluster_member_node
from fulmar.clock import epoch_ms
from fulmar.cnc import CncFile
from fulmar.consensus.agent import ElectionState
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.protocol import ELECTION_STATE_TYPE_ID
from fulmar.consensus.recording_log import RecordingLog
from fulmar.counters import CountersReader
from fulmar.errors import FulmarError
from support.cluster import LocalCluster
from support.driver import wait_for

COUNTER_SERVICE = "fulmar.service.samples:CounterService"
LEADER = 2
_FRAME = struct.Struct("<iBBHii")  # frame length, version, flags, type, term offset, session id


@dataclass
class MemberView:
    member: int
    running: bool
    role: int | None
    leadership_term_id: int | None
    commit_position: int | None


def member_view(cluster: LocalCluster, member: int) -> MemberView:
    try:
        node = cluster_member_node(ClusterNode(f"node{member}", cluster.cluster_dir(member)), epoch_ms())
    except FulmarError:
        return MemberView(member, False, None, None, None)
    return MemberView(
        member,
        bool(node["running"]) and node["role"] is not None,
        node["role"],
        node["leadership_term_id"],
        node["commit_position"],
    )


def leaders(cluster: LocalCluster) -> list[MemberView]:
    views = [member_view(cluster, m) for m in range(cluster.size) if cluster.is_running(m, "consensus")]
    return [v for v in views if v.running and v.role == LEADER]


def next_term(view: MemberView) -> int:
    """The term after the one a member (a leader, say) is in."""
    assert view.leadership_term_id is not None, f"member {view.member} is in no term"
    return view.leadership_term_id + 1


def wait_for_leader(
    cluster: LocalCluster, timeout_s: float, *, not_member: int | None = None, min_term: int = 0
) -> MemberView:
    """The one leader (a member other than ``not_member``, in a term >= ``min_term``);
    two leaders of one term fail the test at once."""
    found: list[MemberView] = []

    def one() -> bool:
        current = leaders(cluster)
        terms = [v.leadership_term_id for v in current]
        assert len(terms) == len(set(terms)), f"two leaders in one term: {current}"
        current = [v for v in current if v.member != not_member and (v.leadership_term_id or 0) >= min_term]
        if len(current) == 1:
            found[:] = current
            return True
        return False

    wait_for(one, timeout_s, f"one leader (not {not_member}, term >= {min_term})")
    return found[0]


def election_closed(cluster: LocalCluster, member: int) -> bool:
    """Whether the member's consensus module runs with its election over: a
    leader has a quorum for its term before every follower is done, and a
    member still in its election has no ingress (seed 001)."""
    try:
        with CncFile.open(cluster.driver_dir(member)) as cnc:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            states = [reader.counter_value(c.counter_id) for c in reader if c.type_id == ELECTION_STATE_TYPE_ID]
    except FulmarError:
        return False  # no driver (yet)
    return states == [ElectionState.CLOSED]


def wait_for_elections_closed(cluster: LocalCluster, timeout_s: float) -> None:
    """Every member's consensus module has finished its election."""
    wait_for(
        lambda: all(election_closed(cluster, m) for m in range(cluster.size)),
        timeout_s,
        "every member's election to close",
    )


def wait_for_commit(cluster: LocalCluster, members: list[int], position: int, timeout_s: float) -> None:
    def reached() -> bool:
        return all((member_view(cluster, m).commit_position or -1) >= position for m in members)

    wait_for(
        reached, timeout_s, f"members {members} to commit {position}: {[member_view(cluster, m) for m in members]}"
    )


# ----------------------------------------------------------------------------- logs


def _recorded_frames(cluster: LocalCluster, member: int, limit: int, start: int) -> list[tuple[int, int, int, bytes]]:
    """(log position, flags, type, payload) of each frame of the member's log
    recording from ``start`` (a frame boundary) up to ``limit``."""
    log = RecordingLog.open(cluster.cluster_dir(member), create=False)
    try:
        recording_id = log.find_last_term_recording_id()
    finally:
        log.close()
    segments = sorted(
        cluster.archive_dir(member).glob(f"{recording_id}-*.rec"), key=lambda p: segment_base_of_file(p.name)
    )
    first = segment_base_of_file(segments[0].name) if segments else None
    assert first is not None and first <= start, (
        f"member {member}: no log from position {start} (first segment {first})"
    )
    data = b"".join(p.read_bytes() for p in segments)
    frames = []
    position = start
    while position < limit:
        length, _, flags, frame_type, _, _ = _FRAME.unpack_from(data, position - first)
        assert length > 0, f"member {member}: no frame at {position} (limit {limit})"
        frames.append((position, flags, frame_type, data[position - first + 32 : position - first + length]))
        position += (length + 31) & ~31
    return frames


def log_frames(cluster: LocalCluster, member: int, limit: int, start: int = 0) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of each frame of the member's log recording from
    ``start`` (a frame boundary) up to ``limit``: what every member must hold
    alike (session ids differ where a term was replicated or caught up from a
    replay)."""
    return [
        (frame_type, flags, payload)
        for _, flags, frame_type, payload in _recorded_frames(cluster, member, limit, start)
    ]


def assert_same_logs(cluster: LocalCluster, members: list[int], limit: int) -> None:
    reference = log_frames(cluster, members[0], limit)
    for member in members[1:]:
        frames = log_frames(cluster, member, limit)
        assert len(frames) == len(reference), (
            f"member {member} holds {len(frames)} frames, member {members[0]} {len(reference)}"
        )
        for index, (mine, theirs) in enumerate(zip(frames, reference)):
            assert mine == theirs, f"frame {index} differs between members {member} and {members[0]}"


# ----------------------------------------------------------------------------- workload


@dataclass
class CounterWorkload:
    """One client adding one at a time (b"+"), no retries: each answer is the
    counter's value.  An answer is an acknowledged write; a request without an
    answer (the leader died with it, or it waited out a lost quorum) may or may
    not have been applied, at any time later; its answer may then arrive late
    and be taken for the next request's (``ClusterClient.request`` takes the
    next message), which ``check`` allows for."""

    cluster: LocalCluster
    request_timeout_s: float = 2.0
    acked: list[int] = field(default_factory=list)
    unknown_before: list[int] = field(default_factory=list)  # requests without answer before each ack
    unknown: int = 0
    errors: list[str] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        self.client: ClusterClient | None = None

    def start(self) -> CounterWorkload:
        self.client = self.cluster.connect_client()
        self._thread.start()
        return self

    def _run(self) -> None:
        pending_unknown = 0
        while not self._stop.is_set():
            client = self.client
            assert client is not None
            try:
                reply = client.request(b"+", timeout_s=self.request_timeout_s)
            except FulmarError as error:
                pending_unknown += 1
                self.unknown += 1
                self.errors.append(f"{type(error).__name__}: {error}")
                if client.is_closed:
                    try:
                        self.client = self.cluster.connect_client()
                    except FulmarError as connect_error:
                        self.errors.append(f"reconnect: {connect_error}")
                        time.sleep(0.2)
                continue
            self.acked.append(struct.unpack_from("<q", reply, 0)[0])
            self.unknown_before.append(pending_unknown)
            self.ack_times.append(time.monotonic())
            pending_unknown = 0

    def wait_for_acks(self, count: int, timeout_s: float) -> None:
        target = len(self.acked) + count
        wait_for(
            lambda: len(self.acked) >= target,
            timeout_s,
            f"{count} more acknowledged writes (errors: {self.errors[-3:]})",
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the workload did not stop"

    def check(self, final_value: int) -> None:
        """No acknowledged write lost, none applied twice.  Each answer is the
        value after a distinct write and answers come in log order, so the i-th
        answer (from 1) is at least i, and at most the number of requests sent
        by then (one at a time: no later one existed).  An unanswered request
        may be applied later and its late answer taken for a later request's,
        so the climb may lag, never exceed: the final value is at least the
        last answer and at most the number of requests sent."""
        assert self.acked, "no write was acknowledged"
        previous = 0
        sent = 0
        for index, (value, unknown) in enumerate(zip(self.acked, self.unknown_before), start=1):
            sent += unknown + 1
            assert previous < value, f"the counter went back from {previous} to {value}"
            assert index <= value <= sent, (
                f"answer {index} was {value}, with {sent} requests sent by then: a write lost or applied twice"
            )
            previous = value
        assert self.acked[-1] <= final_value <= len(self.acked) + self.unknown, (
            f"final value {final_value} after last answer {self.acked[-1]}, {len(self.acked)} answered and "
            f"{self.unknown} unanswered requests"
        )


def read_counter(client: ClusterClient) -> int:
    return struct.unpack_from("<q", client.request(b"?", timeout_s=10), 0)[0]


def member_log_path(cluster: LocalCluster, member: int) -> Path:
    return cluster.log_path(member, "consensus")


def calls_across_a_leader_kill(
    cluster: LocalCluster,
    leader: int,
    call: Callable[[int, int], Future[Any]],
    threads: int,
    per_thread: int,
    window: int,
    join_timeout_s: float,
) -> tuple[dict[tuple[int, int], Any], int]:
    """``threads`` threads each make ``per_thread`` calls (``call(thread, i)``
    -> a future), ``window`` in flight; once a quarter are answered the
    leader's service is stopped (SIGSTOP: the calls sent meanwhile are
    committed, and applied by the followers, but nobody answers them) and,
    when the commit position has moved on, the leader's member is killed.
    Returns every call's outcome (its result, or the exception it raised) by
    (thread, i), and how many were answered before the kill."""
    answers: dict[tuple[int, int], Any] = {}
    lock = threading.Lock()

    def settle(key: tuple[int, int], future: Future[Any]) -> None:
        try:
            outcome: Any = future.result()
        except Exception as error:  # noqa: BLE001 - every outcome is the caller's to check
            outcome = error
        with lock:
            answers[key] = outcome

    def work(thread: int) -> None:
        in_flight: deque[tuple[tuple[int, int], Future[Any]]] = deque()
        for i in range(per_thread):
            in_flight.append(((thread, i), call(thread, i)))
            if len(in_flight) >= window:
                settle(*in_flight.popleft())
        while in_flight:
            settle(*in_flight.popleft())

    workers = [threading.Thread(target=work, args=(t,), name=f"caller-{t}") for t in range(threads)]
    for worker in workers:
        worker.start()
    wait_for(lambda: len(answers) >= threads * per_thread // 4, 60, "a quarter of the calls answered")
    service = cluster.process(leader, "service")
    assert service is not None
    committed_at_stop = member_view(cluster, leader).commit_position or 0
    service.process.send_signal(signal.SIGSTOP)
    wait_for(
        lambda: (member_view(cluster, leader).commit_position or 0) > committed_at_stop,
        30,
        "calls committed while the leader's service is stopped",
    )
    answered_at_kill = len(answers)
    cluster.kill_member(leader)
    for worker in workers:
        worker.join(join_timeout_s)
    assert not any(worker.is_alive() for worker in workers), "a caller thread is still waiting"
    return answers, answered_at_kill

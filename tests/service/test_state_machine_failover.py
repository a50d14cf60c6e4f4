"""Exactly once across a failover: three members serving
``support.state_machine_services:Journal``, several client threads keeping calls in
flight, and the leader killed meanwhile (SIGKILL of all its processes).

Before the kill the leader's service is stopped (SIGSTOP) while its
consensus module goes on: the calls sent meanwhile are committed, and
applied by the followers' services, but nobody answers them.  The client
resends them to the new leader, whose service must answer them from its
record of the calls instead of applying them again.

``append`` is not idempotent: applied twice, an entry would be twice in the
journal.  So the checks are against a model of exactly-once: every call is
answered (no error), the journal holds each entry once and nothing else, and
each answer is the index its entry holds."""

from __future__ import annotations

from pathlib import Path

import pytest

import fulmar
from support.cluster import LocalCluster
from support.multi_node import calls_across_a_leader_kill, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TESTS_DIR = Path(__file__).parents[1]
THREADS = 4
CALLS_PER_THREAD = 300
IN_FLIGHT_PER_THREAD = 25
# A failover here: the 3 s leader heartbeat timeout of FAST_ELECTION_ARGS and an election.
CALL_TIMEOUT_S = 60


def test_calls_in_flight_from_several_threads_are_answered_once_across_a_leader_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    with LocalCluster(3, service="support.state_machine_services:Journal") as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 30)
        client = fulmar.connect(cluster.ingress_endpoints, timeout=CALL_TIMEOUT_S)
        try:
            answers, answered_at_kill = calls_across_a_leader_kill(
                cluster,
                leader.member,
                lambda thread, i: client.call_async("append", [thread, i]),
                THREADS,
                CALLS_PER_THREAD,
                IN_FLIGHT_PER_THREAD,
                CALL_TIMEOUT_S + 30,
            )
            total = THREADS * CALLS_PER_THREAD

            # The kill happened with calls in flight, and the client resent them to the new leader.
            new_leader = wait_for_leader(cluster, 30, not_member=leader.member)
            assert answered_at_kill < total, "every call was answered before the kill: the test proved nothing"
            assert client.calls_resent > 0, "nothing was resent after the failover"
            failed = {key: outcome for key, outcome in answers.items() if isinstance(outcome, BaseException)}
            assert not failed, f"{len(failed)} calls failed, e.g. {list(failed.items())[:3]}"

            entries = [tuple(entry) for entry in client.call("read")["entries"]]
            expected = {(t, i) for t in range(THREADS) for i in range(CALLS_PER_THREAD)}
            # None lost, none applied twice, nothing else.
            assert len(entries) == total, f"{len(entries)} entries for {total} calls"
            assert set(entries) == expected
            # Each answer is its own call's: where its entry is (a resend answered
            # from another call's record, or a fresh application, would differ).
            wrong = {key: index for key, index in answers.items() if entries[index] != key}
            assert not wrong, f"answers that are not where their entries are: {list(wrong.items())[:3]}"
            # Each thread's calls went in its order, in one session (answers rise per thread).
            for t in range(THREADS):
                indexes = [answers[t, i] for i in range(CALLS_PER_THREAD)]
                assert indexes == sorted(indexes), f"thread {t}'s calls were applied out of order"
            assert client.sessions_opened == 1, "the failover should not have needed a new session"
            assert new_leader.member != leader.member
        finally:
            client.close()

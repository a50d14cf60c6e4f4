"""bench.stages' bookkeeping: which counter a stage reads, and when it moved;
a process's figures per ping, and their sums per role."""

from __future__ import annotations

import os
import time

from bench.stages import STAGES, _first_move, _per_role, _stream_of, _thread_figures


def test_the_stream_id_is_read_from_a_position_counters_label() -> None:
    assert _stream_of("snd-pos: 38 1720661527 100 aeron:udp?term-length=4m|control-mode=manual") == 100
    assert _stream_of("sub-pos: 25 -1499316464 108 aeron:udp?endpoint=127.0.0.1:1234 @0") == 108
    assert _stream_of("rec-pos: 0 1720661527") is None
    assert _stream_of("Cluster commit-pos: - clusterId=0") is None


def test_a_stage_moves_at_the_first_sample_that_differs_from_the_one_before_the_send() -> None:
    times = [100, 200, 300, 400, 500]
    values = [[7, 1], [7, 1], [8, 1], [9, 2], [9, 2]]
    assert _first_move(times, values, 0, 150, 1_000) == 300  # 7 before the send, 8 at 300
    assert _first_move(times, values, 1, 150, 1_000) == 400
    assert _first_move(times, values, 1, 150, 350) is None  # not within the window
    assert _first_move(times, values, 0, 50, 1_000) is None  # no sample before the send to compare with
    assert _first_move(times, values, 0, 600, 1_000) is None  # no sample after it


def test_the_stages_follow_the_requests_path_from_client_to_client() -> None:
    assert STAGES[0].where == "client" and STAGES[-1].where == "client"
    assert [stage.where for stage in STAGES].count("follower") == 3
    names = [stage.name for stage in STAGES]
    assert names.index("leader consensus module committed it") < names.index("leader service applied it")


def test_a_process_threads_cpu_and_run_queue_wait_are_read_from_schedstat() -> None:
    before = _thread_figures(os.getpid())
    spent_until = time.thread_time() + 0.05
    while time.thread_time() < spent_until:
        pass  # 50 ms of this thread's CPU, however long a busy machine makes that take
    time.sleep(0.01)  # at least one voluntary switch
    after = _thread_figures(os.getpid())
    switches, cpu_ns, _wait_ns = (later - earlier for later, earlier in zip(after, before))
    assert switches >= 1
    assert 50_000_000 <= cpu_ns <= 5_000_000_000


def test_a_follower_role_is_the_mean_of_the_followers_and_a_leader_role_its_own() -> None:
    per_role = _per_role(
        {
            "leader consensus#0": (3.0, 200.0, 100.0),
            "follower consensus#1": (2.0, 100.0, 50.0),
            "follower consensus#2": (4.0, 140.0, 70.0),
        }
    )
    assert per_role == {"leader consensus": (3.0, 200.0, 100.0), "follower consensus": (3.0, 120.0, 60.0)}

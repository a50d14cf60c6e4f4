"""bench.stages' bookkeeping: which counter a stage reads, and when it moved."""

from __future__ import annotations

from bench.stages import STAGES, _first_move, _stream_of


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

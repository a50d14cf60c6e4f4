"""The Spark pipeline on a log recorded by a real 3-member cluster in this
test module (tests/support/analytics.py): the fulmar-log source, the analyze
job and the replay audit, in Spark local mode, and the cluster-tool commands
on the module's Spark session."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result

from fulmar.analytics.analyze import analyze
from fulmar.analytics.log_decoder import find_log_segments, read_log
from fulmar.analytics.replay import ReplayError, audit_snapshot, replay_state
from fulmar.analytics.session import spark_session, stop_spark
from fulmar.cli import cluster_tool
from fulmar.service import samples
from support.analytics import FRAGMENTED_LENGTH, RecordedLog, record_counter_cluster
from support.log_reference import reference_rows

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

CLI_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedLog]:
    base = tmp_path_factory.mktemp("recorded")
    try:
        yield record_counter_cluster(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]", "fulmar tests")
    try:
        yield session
    finally:
        stop_spark(session)


def archives(recorded: RecordedLog) -> list[str]:
    return [str(recorded.archive_dir(m)) for m in range(recorded.members)]


def test_the_source_decodes_what_the_cluster_was_sent(recorded: RecordedLog, spark: Any) -> None:
    df = spark.read.format("fulmar-log").load(str(recorded.archive_dir(0)))
    rows = df.orderBy("log_position").collect()
    # Partitioned by segment file.
    assert df.rdd.getNumPartitions() == len(find_log_segments([recorded.archive_dir(0)]))
    client = recorded.client_session_id
    own = [r for r in rows if r.message_type == "SessionMessageHeader" and r.cluster_session_id == client]
    offered = [r for r in rows if r.message_type == "SessionMessageHeader" and r.cluster_session_id != client]
    plus = sum(1 for r in own if bytes(r.payload) == b"+")
    assert plus == recorded.increments
    assert sum(1 for r in own if bytes(r.payload) == b"!") == recorded.offered_increments
    # The service offered one b"+" per b"!", each with a service session id.
    assert [bytes(r.payload) for r in offered] == [b"+"] * recorded.offered_increments
    assert all(r.cluster_session_id < 0 for r in offered)
    big = [r for r in own if r.payload_length == FRAGMENTED_LENGTH]
    assert [bytes(r.payload) for r in big] == recorded.fragmented
    assert all(r.fragments > 1 for r in big) and all(r.fragments == 1 for r in own if r.payload_length < 100)
    terms = [
        (r.leadership_term_id, r.leader_member_id, r.time_unit)
        for r in rows
        if r.message_type == "NewLeadershipTermEvent"
    ]
    assert terms == [(term, leader, "MILLIS") for term, leader in recorded.terms]
    # The log opens with its first term, and each later term has a higher id.
    # The first id is the first election's, not always 0: a split vote there
    # spends term 0 without a leader, as any failed candidacy spends its term.
    assert len(terms) >= 2 and rows[0].message_type == "NewLeadershipTermEvent" and rows[0].log_position == 0
    assert [term for term, _, _ in terms] == sorted({term for term, _, _ in terms})
    opens = [r for r in rows if r.message_type == "SessionOpenEvent"]
    closes = [r for r in rows if r.message_type == "SessionCloseEvent"]
    assert [r.cluster_session_id for r in opens] == [client] and opens[0].correlation_id is not None
    assert [(r.cluster_session_id, r.close_reason) for r in closes] == [(client, "CLIENT_ACTION")]
    timers = [r for r in rows if r.message_type == "TimerEvent"]
    assert len(timers) >= 2 and {r.correlation_id for r in timers} == {samples.CounterService.TIMER_ID}
    snapshots = [r for r in rows if r.message_type == "ClusterActionRequest" and r.cluster_action == "SNAPSHOT"]
    assert [r.next_position for r in snapshots] == recorded.snapshot_positions(0)
    # Whole messages, in order, back to back; every row's term is the one it was appended in.
    assert [r.log_position for r in rows[1:]] == [r.next_position for r in rows[:-1]]
    assert rows[-1].next_position == recorded.commit_position
    term_starts = {r.leadership_term_id: r.log_position for r in rows if r.message_type == "NewLeadershipTermEvent"}
    for r in rows:
        assert r.log_position >= term_starts[r.leadership_term_id]
    assert all(r.corrupt_record is None for r in rows)


def test_every_member_holds_the_same_log_and_the_reference_decoder_agrees(recorded: RecordedLog, spark: Any) -> None:
    df = spark.read.format("fulmar-log").load(archives(recorded))
    # (A member's log recording id depends on what its archive recorded first.)
    columns = [c for c in df.columns if c not in ("archive_dir", "recording_id")]
    per_member = [
        sorted(tuple(r) for r in df.filter(df.archive_dir == a).select(*columns).collect()) for a in archives(recorded)
    ]
    assert per_member[0] == per_member[1] == per_member[2] and len(per_member[0]) > 100
    # The same, read without Spark, and by the plain-Python reference.
    for archive in archives(recorded):
        table = pa.Table.from_batches(list(read_log(archive)))
        (segment,) = find_log_segments([archive])
        data = (Path(archive) / segment.file_name).read_bytes()
        expected = reference_rows(data, segment.segment_base, segment.start_offset, segment.end_offset)
        got = table.to_pylist()
        keys = [k for k in expected[0] if k in got[0]]
        assert [{k: r[k] for k in keys} for r in got] == [{k: r[k] for k in keys} for r in expected]


def test_the_options_and_several_directories(recorded: RecordedLog, spark: Any) -> None:
    archive = str(recorded.archive_dir(1))
    everything = spark.read.format("fulmar-log").load(archive)
    snapshot = recorded.snapshot_positions(1)[0]
    timers = (
        spark.read.format("fulmar-log")
        .option("messageTypes", "TimerEvent,SessionCloseEvent")
        .option("fromPosition", str(snapshot))
        .load(archive)
    )
    expected = everything.filter(
        everything.message_type.isin("TimerEvent", "SessionCloseEvent") & (everything.log_position >= snapshot)
    )
    assert sorted(timers.collect()) == sorted(expected.collect()) and timers.count() >= 3
    below = spark.read.format("fulmar-log").option("toPosition", str(snapshot)).load(archive)
    assert below.count() == everything.filter(everything.log_position < snapshot).count()
    comma = spark.read.format("fulmar-log").load(",".join(archives(recorded)[:2]))
    assert comma.select("archive_dir").distinct().count() == 2 and comma.count() == 2 * everything.count()
    # recordingIds picks any recording: the service's snapshot, markers and all.
    snapshot_recording = [e for e in _snapshot_entries(recorded, 1) if e.service_id == 0][0].recording_id
    snap = spark.read.format("fulmar-log").option("recordingIds", str(snapshot_recording)).load(archive).collect()
    assert [r.message_type for r in snap][0] == "SnapshotMarker" and [r.message_type for r in snap][
        -1
    ] == "SnapshotMarker"
    assert sum(1 for r in snap if r.message_type == "Unknown") == 1  # CounterService's one record
    with pytest.raises(Exception, match="no valid recording with id 99"):
        spark.read.format("fulmar-log").option("recordingIds", "99").load(archive).collect()
    with pytest.raises(Exception, match="unknown option"):
        spark.read.format("fulmar-log").option("fromPos", "1").load(archive).collect()


def _snapshot_entries(recorded: RecordedLog, member: int) -> list[Any]:
    from fulmar.consensus.recording_log import RecordingLog

    log = RecordingLog.open(recorded.cluster_dir(member), create=False)
    try:
        return [e for e in log.entries if e.is_valid_snapshot]
    finally:
        log.close()


def test_analyze_writes_parquet_a_report_and_a_plot(recorded: RecordedLog, spark: Any, tmp_path: Path) -> None:
    report = analyze(spark, archives(recorded), tmp_path / "out")
    total = spark.read.format("fulmar-log").load(str(recorded.archive_dir(0))).count()
    assert [a["messages"] for a in report.archives] == [total] * 3
    assert spark.read.parquet(str(tmp_path / "out" / "log.parquet")).count() == 3 * total
    assert [(t["leadership_term_id"], t["leader_member_id"]) for t in report.terms] == recorded.terms
    assert sum(t["messages"] for t in report.terms) == total
    (client,) = report.sessions
    assert client["cluster_session_id"] == recorded.client_session_id and client["close_reason"] == "CLIENT_ACTION"
    assert client["messages"] == recorded.increments + recorded.offered_increments + len(recorded.fragmented) + 1
    assert 0 < client["lifetime_s"] < 120
    assert report.service_messages["messages"] == recorded.offered_increments
    assert report.timers["total"] >= 2 and [
        s["next_position"] for s in report.snapshots
    ] == recorded.snapshot_positions(0)
    assert sum(s["messages"] for s in report.per_second) == total
    text = report.text()
    assert "leadership terms:" in text and "snapshot points: 1" in text and "throughput over cluster time" in text
    png = (tmp_path / "out" / "throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert (tmp_path / "out" / "report.txt").read_text().strip() == text.strip()


def _a_worse_counter(state: dict[str, Any], message: Any) -> dict[str, Any]:
    """counter_apply that forgets the increments a service offers through the log."""
    if message.message_type == "SessionMessageHeader" and message.cluster_session_id < 0:
        return state
    return samples.counter_apply(state, message)


def test_replay_reaches_the_final_state_and_every_snapshot_matches(recorded: RecordedLog, spark: Any) -> None:
    final = replay_state(spark, recorded.archive_dir(2), samples.counter_apply, samples.counter_initial())
    assert final.state["value"] == recorded.final_value and final.state["sessions"] == frozenset()
    assert final.position == recorded.commit_position
    for member in range(recorded.members):
        audit = audit_snapshot(
            spark,
            recorded.archive_dir(member),
            recorded.cluster_dir(member),
            samples.counter_apply,
            samples.counter_initial(),
            samples.counter_snapshot_state,
            view=samples.counter_view,
        )
        assert audit.matches, audit.describe()
        assert audit.snapshot.log_position == recorded.snapshot_positions(member)[0]
    # The audit catches a replay that is wrong.
    wrong = audit_snapshot(
        spark,
        recorded.archive_dir(0),
        recorded.cluster_dir(0),
        _a_worse_counter,
        samples.counter_initial(),
        samples.counter_snapshot_state,
        view=samples.counter_view,
    )
    assert not wrong.matches and "DIFFER" in wrong.describe()
    with pytest.raises(ReplayError, match="no snapshot of service 0 at or below position 64"):
        audit_snapshot(
            spark,
            recorded.archive_dir(0),
            recorded.cluster_dir(0),
            samples.counter_apply,
            samples.counter_initial(),
            samples.counter_snapshot_state,
            max_position=64,
        )


PLAIN_SESSION = """
import os, sys
from pyspark.sql import SparkSession
os.environ["PYSPARK_PYTHON"] = sys.executable
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.extraJavaOptions", "-Djava.io.tmpdir=" + sys.argv[2]).getOrCreate())
try:
    print("rows", spark.read.format("fulmar-log").load(sys.argv[1]).count())
finally:
    spark.stop()
"""


def test_any_session_finds_the_source_once_fulmar_is_installed(recorded: RecordedLog, tmp_path: Path) -> None:
    """Spark imports top-level pyspark_* modules and registers their
    DefaultSource: with pyspark_fulmar on the path (where pip puts it), a
    plain SparkSession reads format("fulmar-log") with no register()."""
    import pyspark_fulmar

    site = tmp_path / "site"
    site.mkdir()
    (site / "pyspark_fulmar").symlink_to(Path(pyspark_fulmar.__file__).parent)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_SESSION, str(recorded.archive_dir(0)), str(scratch)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site), "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = pa.Table.from_batches(list(read_log(str(recorded.archive_dir(0))))).num_rows
    assert f"rows {expected}" in done.stdout


def _cli(*args: str) -> Result:
    """cluster-tool in this process: its Spark job runs on the module's session
    (the command uses a running one and leaves it running), which saves a JVM
    start per command; test_install runs the installed command itself."""
    return CliRunner().invoke(cluster_tool.main, list(args))


def test_cluster_tool_analyze_and_replay(recorded: RecordedLog, spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "analysis"
    done = _cli("analyze", "--archive-dir", str(recorded.archive_dir(0)), "--master", "local[2]", "--out", str(out))
    assert done.exit_code == 0, done.output[-3000:]
    assert "leadership terms:" in done.stdout and "written to" in done.stdout
    assert {p.name for p in out.iterdir()} >= {
        "log.parquet",
        "throughput.parquet",
        "report.txt",
        "report.json",
        "throughput.png",
    }
    audit = _cli(
        "replay",
        "--archive-dir",
        str(recorded.archive_dir(1)),
        "--cluster-dir",
        str(recorded.cluster_dir(1)),
        "--apply",
        "fulmar.service.samples:counter_apply",
        "--initial",
        "fulmar.service.samples:counter_initial",
        "--load-snapshot",
        "fulmar.service.samples:counter_snapshot_state",
        "--view",
        "fulmar.service.samples:counter_view",
        "--master",
        "local[2]",
    )
    assert audit.exit_code == 0, audit.output[-3000:]
    assert "the states match" in audit.stdout
    # The module's session is still there for the tests after (the command did not stop it).
    assert spark.range(3).count() == 3


def test_a_corrupt_segment_is_named_by_cluster_tool_or_skipped_and_counted(
    recorded: RecordedLog, spark: Any, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    shutil.copytree(recorded.archive_dir(0), archive)
    (segment,) = find_log_segments([archive])
    rows = pa.Table.from_batches(list(read_log(str(archive)))).to_pylist()
    victim = rows[len(rows) // 2]["log_position"]
    with open(archive / segment.file_name, "r+b") as file:
        file.seek(victim - segment.segment_base)
        file.write(struct.pack("<i", 3))  # a frame length below the header
    failed = _cli("analyze", "--archive-dir", str(archive), "--master", "local[1]", "--out", str(tmp_path / "a"))
    assert failed.exit_code == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cluster-tool: LogCorruptError: {archive / segment.file_name}: a frame length")
    assert f"at log position {victim}" in last
    # PERMISSIVE: the rest of the term is skipped (its frames cannot be found
    # past a broken length), one Corrupt row says so, the report warns.
    report = analyze(spark, [str(archive)], tmp_path / "b", {"mode": "PERMISSIVE"})
    assert len(report.corrupt) == 1 and report.corrupt[0]["log_position"] == victim
    assert report.archives[0]["messages"] == len([r for r in rows if r["log_position"] < victim])
    assert "WARNING: 1 corrupt region(s) skipped" in report.text()

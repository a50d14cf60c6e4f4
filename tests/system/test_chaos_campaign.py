"""The chaos campaign (tests/support/chaos_campaign.py, make chaos): how it runs each
seed and what it counts, with small stand-ins for chaos.py so that the runner
itself is tested in seconds (the real chaos runs are in test_chaos.py)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from support import chaos_campaign
from support.chaos_campaign import SeedResult, run_seed, summarize

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

# A stand-in for chaos.py: reads the arguments it is given and writes the
# report chaos.py would write, its verdict chosen by the seed.
_FAKE_CHAOS = """
import json, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
seed = int(args["--seed"])
if seed == 3:
    open(args["--artifacts"] + "/pid", "w").write(str(__import__("os").getpid()))
    time.sleep(3600)
if seed == 4:
    print("Traceback: something broke before the report"); sys.exit(2)
report = {"anomalies": [], "converged": True, "linearizable": True,
          "operations": {"ok": 100 + seed, "unknown": 2}, "events": [{}] * 7, "artifacts": None,
          "log_violations": 0}
if seed == 1:
    report["anomalies"] = ["the members' logs differ: at position 4096"]
    report["artifacts"] = "chaos-artifacts/x"
if seed == 2:
    report["anomalies"] = ["the run failed: NotConvergedError: timed out"]
    report["converged"] = False
    report["linearizable"] = None
open(args["--report-json"], "w").write(json.dumps(report))
sys.exit(1 if report["anomalies"] else 0)
"""


@pytest.fixture
def fake_chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake_chaos.py"
    script.write_text(_FAKE_CHAOS)
    monkeypatch.setattr(chaos_campaign, "CHAOS", script)
    return tmp_path


def test_a_clean_run_and_each_kind_of_failure_are_told_apart(fake_chaos: Path) -> None:
    clean = run_seed(3, 0, 5, 4, fake_chaos)
    assert clean.ok and clean.operations["ok"] == 100 and clean.faults == 7
    anomaly = run_seed(3, 1, 5, 4, fake_chaos)
    assert not anomaly.ok and anomaly.converged is True and "logs differ" in anomaly.anomalies[0]
    assert "ANOMALY" in anomaly.line() and "chaos-artifacts/x" in anomaly.line()
    stuck = run_seed(5, 2, 5, 5, fake_chaos)
    assert not stuck.ok and stuck.converged is False and "NOT CONVERGED" in stuck.line()
    crashed = run_seed(3, 4, 5, 4, fake_chaos)
    assert not crashed.ok and "exited 2 without a report" in crashed.anomalies[0]
    assert "something broke" in crashed.anomalies[0]


def test_a_run_that_overstays_is_killed_with_its_process_group(
    fake_chaos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chaos_campaign, "_OVERHEAD_S", 2)
    result = run_seed(3, 3, 5, 4, fake_chaos)
    assert result.converged is False and "overstayed" in result.anomalies[0]
    pid = int((fake_chaos / "pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert result.seconds_taken < 30


def test_the_totals_count_each_member_count_apart() -> None:
    results = [
        SeedResult(3, 10, 60.0, [], True, True, {"ok": 50}, 7, log_violations=0),
        SeedResult(3, 11, 60.0, ["the history is not linearizable"], True, False, {"ok": 40}, 7, log_violations=0),
        SeedResult(5, 10, 60.0, ["the run failed: NotConvergedError"], False, None, {"ok": 30}, 9),
        SeedResult(5, 11, 60.0, [], True, True, {"ok": 20}, 9, log_violations=0),
        SeedResult(5, 12, 60.0, ["verify-log: term-event ..."], True, True, {"ok": 10}, 9, log_violations=2),
    ]
    lines = summarize(results)
    assert lines[0] == (
        "total 3 members: 2 runs, 1 clean, 1 with anomalies, 0 not converged; 14 faults, 90 acknowledged operations; "
        "0 verify-log violations"
    )
    assert lines[1] == "  failed seeds: 11"
    assert lines[2] == (
        "total 5 members: 3 runs, 1 clean, 1 with anomalies, 1 not converged; 27 faults, 60 acknowledged operations; "
        "2 verify-log violations (1 runs not checked)"
    )
    assert lines[3] == "  failed seeds: 12, 10"
    # A run whose logs were never checked is not clean, nor one with a violation.
    assert [r.ok for r in results] == [True, False, False, True, False]


def test_the_command_runs_every_seed_of_every_member_count_and_fails_on_any(
    fake_chaos: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        chaos_campaign.main(
            [
                "--seeds",
                "2",
                "--members",
                "3",
                "--members",
                "5",
                "--seed",
                "0",
                "--seconds",
                "5",
                "--artifacts",
                str(fake_chaos),
            ]
        )
    out = capsys.readouterr().out
    assert exit_info.value.code == 1  # seed 1 has an anomaly
    assert out.count("3 members  seed ") == 2 and out.count("5 members  seed ") == 2
    assert "total 3 members: 2 runs, 1 clean, 1 with anomalies" in out
    with pytest.raises(SystemExit) as exit_info:
        chaos_campaign.main(
            ["--seeds", "1", "--members", "3", "--seed", "0", "--seconds", "5", "--artifacts", str(fake_chaos)]
        )
    assert exit_info.value.code == 0

"""``bench.pysyncobj_peer``: without pysyncobj installed, one line saying how
to install it, no rows, no error; the best rows of both settings, from
synthetic aggregated rows; the setting on a process's command line."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from bench import pysyncobj_peer


def test_no_rows_without_pysyncobj(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pysyncobj", None)  # import pysyncobj: ImportError
    assert pysyncobj_peer.run(quick=True) == []
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "pip install .[bench]" in out


def _aggregated(name: str, median: float | None, unit: str) -> dict[str, Any]:
    """A row as ``python -m bench`` hands it to ``derived_rows``: median and min-max over the repetitions."""
    return {
        "module": "pysyncobj_peer",
        "name": name,
        "unit": unit,
        "median": median,
        "min": None if median is None else median - 1,
        "max": None if median is None else median + 1,
        "reference": None,
        "reference_kind": None,
        "ratio": None,
        "runs": 3,
    }


def _per_setting(figures: dict[str, tuple[float | None, float | None]], unit: str) -> list[dict[str, Any]]:
    """Rows of both settings from {name after the prefix: (no batch's median, batch's)}."""
    return [
        _aggregated(f"pysyncobj[{setting}] {rest}", medians[index], unit)
        for index, setting in enumerate(("no batch", "batch"))
        for rest, medians in figures.items()
    ]


def test_best_rows() -> None:
    rows = (
        _per_setting(
            {
                "echo 32 B, window 1000": (3500, 3900),
                "echo 32 B, window 10000": (3000, 12000),
                "echo 288 B, window 1000": (2000, 1900),
                "echo 288 B, window 10000": (1000, 1800),
                "echo RTT at 1,000/s, achieved": (1000, 990),
            },
            "msgs/s",
        )
        + _per_setting(
            {
                "echo 32 B, window 1000 MB/s": (0.11, 0.12),
                "echo 32 B, window 10000 MB/s": (0.1, 0.38),
                "echo 288 B, window 1000 MB/s": (0.58, 0.55),
            },
            "MB/s",
        )
        + _per_setting(
            {
                "echo ping 32 B p50": (700, 90_000),
                "echo RTT at 1,000/s p50": (1200, 60_000),
                "echo RTT at 50,000/s p50": (None, 400_000),
                "echo RTT at 50,000/s p99": (None, None),
            },
            "us",
        )
        + _per_setting({"echo ping 32 B, round trips": (2000, 100), "echo RTT at 1,000/s, unanswered": (0, 3)}, "msgs")
        + _per_setting({"node CPU cores idle (median)": (0.02, 0.01)}, "cores")
        + [
            _aggregated("pysyncobj[no batch] failover, kill to first answer", 2400, "ms"),
            _aggregated("pysyncobj[batch] echo 32 B, window 10000, unanswered", 5, "msgs"),
        ]
    )
    best = {row["name"]: row for row in pysyncobj_peer.derived_rows(rows)}
    # Throughput: the highest of both settings and both windows, MB/s from the same run; no plain window 10000.
    assert best["pysyncobj echo 32 B, window 1000"]["median"] == 12000
    assert best["pysyncobj echo 32 B, window 1000"]["note"] == "batch, window 10000"
    assert best["pysyncobj echo 32 B, window 1000"]["throughput_plot"] == {"size": 32}
    assert (best["pysyncobj echo 32 B, window 1000"]["min"], best["pysyncobj echo 32 B, window 1000"]["max"]) == (
        11999,
        12001,
    )  # the setting's own min-max
    assert best["pysyncobj echo 32 B, window 1000 MB/s"]["median"] == 0.38
    assert best["pysyncobj echo 32 B, window 1000, unanswered"]["median"] == 5
    assert best["pysyncobj echo 288 B, window 1000"]["note"] == "no batch, window 1000"
    assert best["pysyncobj echo 288 B, window 1000 MB/s"]["median"] == 0.58
    assert "pysyncobj echo 288 B, window 1000, unanswered" not in best  # none lost in that run
    assert not any("window 10000" in name for name in best)
    # Latency: the lowest; a setting without a figure passed over; none in either: no figure, said.
    assert (best["pysyncobj echo ping 32 B p50"]["median"], best["pysyncobj echo ping 32 B p50"]["note"]) == (
        700,
        "no batch",
    )
    assert best["pysyncobj echo ping 32 B, round trips"]["median"] == 2000
    assert best["pysyncobj echo RTT at 50,000/s p50"]["note"] == "batch"
    assert best["pysyncobj echo RTT at 50,000/s p99"]["median"] is None
    assert best["pysyncobj echo RTT at 50,000/s p99"]["note"] == "no figure in any setting"
    # Counts follow the achieved rate of their run; resource use the setting of the best p50 at 1,000/s.
    assert best["pysyncobj echo RTT at 1,000/s, achieved"]["note"] == "no batch"
    assert best["pysyncobj echo RTT at 1,000/s, unanswered"]["median"] == 0
    assert best["pysyncobj node CPU cores idle (median)"]["median"] == 0.02
    assert best["pysyncobj node CPU cores idle (median)"]["note"] == "no batch"
    assert best["pysyncobj failover, kill to first answer"]["note"] == "no batch (the only setting measured)"
    # The throughput bars: the best msgs/s of each size, nothing else.
    assert sorted(name for name, row in best.items() if row.get("throughput_plot")) == [
        "pysyncobj echo 288 B, window 1000",
        "pysyncobj echo 32 B, window 1000",
    ]


def test_best_rows_are_what_cluster3_compares_with() -> None:
    from bench import cluster3

    rows = _per_setting({"echo 1344 B, window 1000": (1500, 1400), "echo 1344 B, window 10000": (1000, 1600)}, "msgs/s")
    names = {row["name"] for row in pysyncobj_peer.derived_rows(rows)}
    assert cluster3.reference_name("cluster3 echo 1344 B, window 1000", "pysyncobj_peer") in names


def test_setting_on_the_command_line() -> None:
    for use_batch in (False, True):
        assert pysyncobj_peer._parse_batch_argument(pysyncobj_peer._batch_argument(use_batch)) is use_batch
    with pytest.raises(SystemExit):
        pysyncobj_peer._parse_batch_argument("127.0.0.1:1234")
    for policy in ("batch", "normal"):
        assert pysyncobj_peer._parse_policy_argument(pysyncobj_peer._policy_argument(policy)) == policy
    with pytest.raises(SystemExit):
        pysyncobj_peer._parse_policy_argument("127.0.0.1:1234")


def test_a_cpu_policy_setting_is_one_more_candidate() -> None:
    """Each setting of appendEntriesUseBatch runs under both CPU policies: the
    best row is whichever of the four measured best, named in the note."""
    settings = list(pysyncobj_peer.SETTINGS)
    assert settings == ["no batch", "batch", "no batch, SCHED_BATCH", "batch, SCHED_BATCH"]
    assert set(pysyncobj_peer.HISTOGRAM_SYSTEMS) == set(settings)
    rows = [
        _aggregated(f"pysyncobj[{setting}] echo ping 32 B p50", median, "us")
        for setting, median in zip(settings, (610, 202_000, 570, 202_100))
    ] + [
        _aggregated(f"pysyncobj[{setting}] echo 32 B, window 10000", rate, "msgs/s")
        for setting, rate in zip(settings, (5_000, 8_100, 6_000, 10_200))
    ]
    best = {row["name"]: row for row in pysyncobj_peer.derived_rows(rows)}
    assert (best["pysyncobj echo ping 32 B p50"]["median"], best["pysyncobj echo ping 32 B p50"]["note"]) == (
        570,
        "no batch, SCHED_BATCH",
    )
    assert best["pysyncobj echo 32 B, window 1000"]["note"] == "batch, SCHED_BATCH, window 10000"


class _FakeCluster:
    """A setting's cluster whose client fails the first 32 B run at 10,000 in flight (as PySyncObj's can)."""

    started: list[_FakeCluster] = []
    failed = False

    def __init__(self, use_batch: bool, cpu_policy: str = "normal") -> None:
        self.use_batch = use_batch
        self.cpu_policy = cpu_policy
        self.closed = False
        _FakeCluster.started.append(self)

    def command(self, cmd: str, **args: Any) -> dict[str, Any]:
        from bench.openloop import new_histogram

        if cmd == "throughput":
            if args["window"] == pysyncobj_peer.PEER_WINDOW and args["size"] == 32 and not _FakeCluster.failed:
                _FakeCluster.failed = True
                raise RuntimeError("the client: IndexError: list index out of range")
            return {"good": args["count"], "elapsed": 1.0, "lost": 0, "failed": 0}
        histogram = new_histogram()
        histogram.record_value(1_000_000)
        encoded = histogram.encode().decode("ascii")
        if cmd == "ping":
            return {"histogram": encoded, "lost": 0}
        return {"histogram": encoded, "achieved_rate": args["rate"], "late_sends": 0, "unanswered": 0}

    def wait_settled(self, what: str) -> None:
        pass

    def log_tails(self) -> str:
        return "--- client.log: Traceback ..."

    def close(self) -> None:
        self.closed = True


def test_a_failed_run_has_no_figure_and_the_next_runs_go_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.openloop import EchoSettings

    monkeypatch.setattr(pysyncobj_peer, "PeerCluster", _FakeCluster)
    monkeypatch.setattr(_FakeCluster, "started", [])
    monkeypatch.setattr(_FakeCluster, "failed", False)
    first = _FakeCluster(True)
    command = pysyncobj_peer.EchoCommands(first, "bench.pysyncobj_peer[batch]")  # type: ignore[arg-type]
    rows = {row["name"]: row["value"] for row in pysyncobj_peer._rows(command, EchoSettings(True, 2_000), "batch")}
    assert rows["pysyncobj[batch] echo 32 B, window 10000"] is None
    assert rows["pysyncobj[batch] echo 288 B, window 10000"] == 20_000  # on the cluster started again
    assert rows["pysyncobj[batch] echo ping 32 B p50"] is not None
    assert first.closed and len(_FakeCluster.started) == 2 and command.cluster is _FakeCluster.started[1]
    assert "32 B, window 10000: no figure, the run failed: the client: IndexError" in capsys.readouterr().out

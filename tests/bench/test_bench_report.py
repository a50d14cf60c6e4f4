"""``bench.report``: the Markdown table, the .hgrm files and the plots, from
synthetic rows and histograms written into a temporary directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hdrh.histogram import HdrHistogram

from bench import report
from bench.openloop import new_histogram


def _row(
    module: str, name: str, median: float | None, unit: str = "us", reference: float | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "module": module,
        "name": name,
        "unit": unit,
        "median": median,
        "min": None if median is None else median * 0.9,
        "max": None if median is None else median * 1.2,
        "reference": reference,
        "reference_kind": "pysyncobj_peer" if reference else None,
        "ratio": median / reference if reference and median is not None else None,
        "runs": 3,
        **extra,
    }


def _histogram(values_us: list[int]) -> HdrHistogram:
    histogram = new_histogram()
    for value in values_us:
        histogram.record_value(value * 1000)  # recorded in ns, as the benchmarks do
    return histogram


def test_markdown_table() -> None:
    rows = [
        _row("cluster3", "cluster3 echo RTT at 1,000/s p50", 1234.5, reference=617.25, reference_note="no batch"),
        _row("cluster3", "cluster3 echo RTT at 50,000/s p50", None),
        _row("cluster", "cluster a|b", 12.345, unit="msgs/s"),
        _row("pysyncobj_peer", "pysyncobj echo 32 B, window 1000", 4000, unit="msgs/s", note="batch, window 10000"),
    ]
    lines = report.markdown_table(rows).splitlines()
    assert lines[0] == "| benchmark | median | min-max | unit | reference | ratio | note |"
    assert lines[1].startswith("|---|")
    assert lines[2] == (
        "| cluster3 echo RTT at 1,000/s p50 | 1,234 | 1,111-1,481 | us | 617 | 2.000 | reference: no batch |"
    )
    assert lines[3] == "| cluster3 echo RTT at 50,000/s p50 | n/a | n/a | us | - | - |  |"
    assert lines[4] == "| cluster a\\|b | 12.35 | 11.11-14.81 | msgs/s | - | - |  |"
    assert lines[5] == (
        "| pysyncobj echo 32 B, window 1000 | 4,000 | 3,600-4,800 | msgs/s | - | - | batch, window 10000 |"
    )
    assert len(lines) == 6


def test_a_ratio_row_is_printed_to_three_decimals() -> None:
    """0.954 and 0.946 are a loss under and over 5 %: two decimals print both as 0.95."""
    line = report.markdown_table([_row("metrics", "metrics throughput ratio, per round", 0.954, unit="ratio")])
    assert line.splitlines()[2] == "| metrics throughput ratio, per round | 0.954 | 0.859-1.145 | ratio | - | - |  |"
    assert report.format_value(0.946, "ratio") == "0.946"
    assert report.format_value(0.946) == "0.95"


def test_write_markdown(tmp_path: Path) -> None:
    rows = [_row("cluster3", "cluster3 echo ping 32 B p50", 800.0, reference=400.0)]
    path = report.write_markdown(tmp_path / "bench-x.md", rows, "heading")
    text = path.read_text()
    assert text.startswith("# heading\n\n| benchmark |")
    assert "| cluster3 echo ping 32 B p50 | 800 | 720-960 | us | 400 | 2.000 |  |" in text
    assert "fulmar / PySyncObj" in text


def test_hgrm_files_in_microseconds(tmp_path: Path) -> None:
    values = list(range(100, 10_100, 100))  # 100 .. 10,000 us
    histograms = {("cluster3", "rtt-1000"): _histogram(values), ("pysyncobj_peer", "ping"): _histogram([50] * 10)}
    paths = report.write_hgrm(tmp_path, "STAMP", histograms)
    assert sorted(p.name for p in paths) == [
        "bench-STAMP-cluster3-rtt-1000.hgrm",
        "bench-STAMP-pysyncobj_peer-ping.hgrm",
    ]
    lines = (tmp_path / "bench-STAMP-cluster3-rtt-1000.hgrm").read_text().splitlines()
    assert lines[0].split() == ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"]
    table = [line.split() for line in lines[2:] if line and not line.startswith("#")]
    assert len(table) > 10
    first, last = table[0], table[-1]
    assert float(first[0]) == pytest.approx(100, rel=1e-3) and float(first[1]) == 0.0
    assert float(last[0]) == pytest.approx(10_000, rel=1e-3) and float(last[1]) == 1.0 and int(last[2]) == 100
    percentiles = [float(row[1]) for row in table]
    assert percentiles == sorted(percentiles)
    median = next(float(row[0]) for row in table if float(row[1]) >= 0.5)
    assert 5_000 <= median <= 5_600  # the first line at or past the 50th percentile
    footer = next(line for line in lines if line.startswith("#[Max"))
    assert float(footer.split("=")[1].split(",")[0]) == pytest.approx(10_000, rel=1e-3)
    # Mean and standard deviation in us too (100..10,000 us evenly: sd about 2,887 us).
    mean_line = next(line for line in lines if line.startswith("#[Mean"))
    mean, deviation = (float(part.split("=")[1].strip(" ]")) for part in mean_line[2:].split(","))
    assert mean == pytest.approx(5_050, rel=1e-2) and deviation == pytest.approx(2_887, rel=2e-2)


def test_percentile_curve() -> None:
    xs, ys = report.percentile_curve(_histogram(list(range(1, 1001))))
    assert xs[0] == 1.0 and xs == sorted(xs) and 100 < xs[-1] < float("inf")
    assert ys[0] == pytest.approx(1, rel=1e-2) and ys == sorted(ys) and ys[-1] <= 1001


@pytest.mark.system
@pytest.mark.system
def test_plots_are_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    histograms = {
        (module, hid): _histogram([i * scale for i in range(1, 500)])
        for scale, module in ((1, "cluster"), (2, "cluster3"), (5, "pysyncobj_peer"))
        for hid in ("rtt-1000", "ping")
    }
    histograms[("pysyncobj_peer", "rtt-50000")] = new_histogram()  # nothing answered: no curve, no file
    rows = [
        _row(
            module,
            f"{module} echo {size} B, window 1000",
            1000.0 * size / scale,
            unit="msgs/s",
            throughput_plot={"size": size},
        )
        for scale, module in ((1, "cluster"), (2, "cluster3"), (5, "pysyncobj_peer"))
        for size in (32, 288, 1344)
    ]
    paths = report.write_plots(tmp_path, "S", rows, histograms)
    assert sorted(p.name for p in paths) == ["bench-S-ping.png", "bench-S-rtt-1000.png", "bench-S-throughput.png"]
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_no_plots_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    rows = [_row("cluster", "cluster echo 32 B, window 1000", 10.0, unit="msgs/s", throughput_plot={"size": 32})]
    assert report.write_plots(tmp_path, "S", rows, {("cluster", "ping"): _histogram([1, 2, 3])}) == []
    assert list(tmp_path.iterdir()) == []
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_merge_histograms_of_repeats() -> None:
    first, second = _histogram([100] * 3), _histogram([300] * 1)
    runs = [
        {"name": "x p50", "value": 0.1, "histogram": first, "histogram_id": "ping"},
        {"name": "x p50", "value": 0.3, "histogram": second, "histogram_id": "ping"},
        {"name": "x p50", "value": 1},
    ]
    merged: dict[tuple[str, str], HdrHistogram] = {}
    report.merge_histograms(merged, "cluster3", runs)
    assert list(merged) == [("cluster3", "ping")]
    histogram = merged[("cluster3", "ping")]
    assert histogram.get_total_count() == 4 and histogram.get_max_value() == pytest.approx(300_000, rel=1e-3)
    assert first.get_total_count() == 3  # the runs' own histograms untouched


def test_histograms_of_each_system_apart() -> None:
    """The peer's two settings: one module, a histogram (a file, a curve) per setting."""
    runs = [
        {
            "name": f"pysyncobj[{setting}] echo ping 32 B p50",
            "value": 1.0,
            "histogram": _histogram([value]),
            "histogram_id": "ping",
            "histogram_system": f"pysyncobj_peer-{setting}",
        }
        for setting, value in (("no-batch", 100), ("batch", 100_000))
    ]
    merged: dict[tuple[str, str], HdrHistogram] = {}
    for run in runs:
        report.merge_histograms(merged, "pysyncobj_peer", [run])
    assert sorted(merged) == [("pysyncobj_peer-batch", "ping"), ("pysyncobj_peer-no-batch", "ping")]
    assert all(h.get_total_count() == 1 for h in merged.values())

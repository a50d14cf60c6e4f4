"""The files ``python -m bench`` leaves in ``bench/results/`` besides its
JSON: the table in Markdown, one HdrHistogram percentile file (``.hgrm``)
per latency histogram, and PNG plots (latency percentile curves per offered
rate and for ping, one curve per system; throughput bars per payload size).

Everything here works on the aggregated rows of ``__main__`` and on
histograms keyed by (system, histogram id), the system being the module's
name unless a row says otherwise (``"histogram_system"``: each setting of
the PySyncObj peer), so it can be exercised with synthetic figures
(``tests/bench/test_bench_report.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from bench.openloop import WINDOW

# The systems of the cluster modules, in the order they are drawn.  The peer's latency
# curves are per setting (histogram_system); its throughput bars are its best rows'.
SYSTEMS = {
    "cluster": "fulmar 1-node",
    "cluster3": "fulmar 3-node",
    "pysyncobj_peer": "PySyncObj 3-node, its best setting and window",
    "pysyncobj_peer-no-batch": "PySyncObj 3-node, no batch",
    "pysyncobj_peer-batch": "PySyncObj 3-node, batch",
    "pysyncobj_peer-no-batch-sched-batch": "PySyncObj 3-node, no batch, SCHED_BATCH",
    "pysyncobj_peer-batch-sched-batch": "PySyncObj 3-node, batch, SCHED_BATCH",
}
NS_PER_US = 1000  # histograms hold nanoseconds; files and plots show microseconds
REFERENCE_NOTES = {
    "C": "the same loop in C, measured in this run",
    "pysyncobj_peer": "cluster3 rows: PySyncObj's 3-node cluster doing the same work in this run, its best "
    "of its settings for each figure (no batch / batch: appendEntriesUseBatch False / True; each also with "
    "the nodes under SCHED_BATCH, as fulmar's; "
    "throughput at window 1000 or 10000, whichever was higher), named in the note column "
    "(ratio = fulmar / PySyncObj: above 1 is better for fulmar in msgs/s and MB/s, "
    "below 1 in us, ms, cores, MiB and msgs)",
    "cluster": "cluster3 rows without a PySyncObj figure in this run: the 1-node cluster's median "
    "for the same work (ratio = 3-node / 1-node)",
    "unscraped": "metrics rows: the same echo run without scraping, alternated with the scraped one in this run "
    "(ratio = scraped / not scraped)",
    "whole_log": "restore rows: the same restore from the backup's whole log, its snapshot left out, in this "
    "run (ratio = from the snapshot / from the whole log)",
    "no_mac": "udp_stream datagram-mac rows: the same stream or round trip on a channel without "
    "datagram-mac, between the same two drivers, alternated with it in this run (ratio = with / without)",
    "no_secret": "cluster3 secret rows: the same work on a fresh 3-node cluster without a secret, just "
    "before, in this run (ratio = with / without)",
    "read": "spark_decode rows: the read named in the row's parentheses, of the same log in this run "
    "(ratio = this / that; local[2] vs local[1] is the scaling from 1 to 2 cores)",
}


def format_value(value: float | None, unit: str = "") -> str:
    """A figure as the tables print it; a ratio to three decimals (0.954 and
    0.946 are a loss under and over 5 %: two decimals print both as 0.95)."""
    if value is None:
        return "n/a"
    if unit == "ratio":
        return f"{value:,.3f}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def spread(row: Mapping[str, Any]) -> str:
    if row["min"] is None:
        return "n/a"
    return f"{format_value(row['min'], row['unit'])}-{format_value(row['max'], row['unit'])}"


def note(row: Mapping[str, Any]) -> str:
    """The note column: the row's own note (the peer's best rows: the setting and window it came
    from), then its reference's (cluster3's rows: the peer's setting and window behind the ratio)."""
    parts = []
    if row.get("note"):
        parts.append(str(row["note"]))
    if row.get("reference_note"):
        parts.append(f"reference: {row['reference_note']}")
    return "; ".join(parts)


def reference_notes(kinds: Iterable[str]) -> str:
    return "; ".join(
        REFERENCE_NOTES.get(kind, f"the {kind} module's median for the same work in this run (ratio = this / that)")
        for kind in sorted(set(kinds))
    )


def markdown_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """benchmark | median | min-max | unit | reference | ratio | note, one line per row."""
    lines = ["| benchmark | median | min-max | unit | reference | ratio | note |", "|---|---:|---:|---|---:|---:|---|"]
    for row in rows:
        reference = format_value(row["reference"]) if row["reference"] is not None else "-"
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        name = str(row["name"]).replace("|", "\\|")
        remark = note(row).replace("|", "\\|")
        lines.append(
            f"| {name} | {format_value(row['median'], row['unit'])} | {spread(row)} | {row['unit']} | {reference} "
            f"| {ratio} | {remark} |"
        )
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, rows: Sequence[Mapping[str, Any]], heading: str) -> Path:
    kinds = [row["reference_kind"] for row in rows if row.get("reference_kind")]
    text = f"# {heading}\n\n" + markdown_table(rows)
    if kinds:
        text += f"\nreference: {reference_notes(kinds)}\n"
    path.write_text(text)
    return path


def merge_histograms(into: dict[tuple[str, str], HdrHistogram], module: str, runs: Iterable[Mapping[str, Any]]) -> None:
    """The histograms the repeats of one row carry (``"histogram"``, ``"histogram_id"``),
    added into ``into[(system, id)]``, the system ``"histogram_system"`` or else ``module``:
    a new histogram, the rows' own are left as they are."""
    for run in runs:
        histogram = run.get("histogram")
        if histogram is None:
            continue
        key = (str(run.get("histogram_system", module)), str(run["histogram_id"]))
        if key not in into:
            into[key] = HdrHistogram(
                histogram.lowest_trackable_value, histogram.highest_trackable_value, histogram.significant_figures
            )
        into[key].add(histogram)


def write_hgrm(directory: Path, stamp: str, histograms: Mapping[tuple[str, str], HdrHistogram]) -> list[Path]:
    """HdrHistogram's percentile distribution of each histogram, values in us,
    as ``bench-STAMP-MODULE-ID.hgrm``."""
    written = []
    for (module, histogram_id), histogram in sorted(histograms.items()):
        path = directory / f"bench-{stamp}-{module}-{histogram_id}.hgrm"
        with open(path, "wb") as out:  # the package writes bytes
            histogram.output_percentile_distribution(out, NS_PER_US)
        # hdrhistogram 0.10 scales every value of the file but the footer's
        # standard deviation (left in ns): write that one in us as well.
        text = path.read_text()
        wrong = f"StdDeviation   = {histogram.get_stddev():12.3f}"
        if wrong in text:
            path.write_text(text.replace(wrong, f"StdDeviation   = {histogram.get_stddev() / NS_PER_US:12.3f}"))
        written.append(path)
    return written


def percentile_curve(histogram: HdrHistogram) -> tuple[list[float], list[float]]:
    """x = 1/(1-p) (p the percentile as a fraction; the 100th percentile left out:
    it has no finite x) and y = the value in us, from HdrHistogram's percentile iterator."""
    xs: list[float] = []
    ys: list[float] = []
    for item in histogram.get_percentile_iterator(5):
        percentile = item.percentile_level_iterated_to
        if percentile >= 100:
            break
        xs.append(1 / (1 - percentile / 100))
        ys.append(item.value_iterated_to / NS_PER_US)
    return xs, ys


def _title(histogram_id: str) -> str:
    if histogram_id == "ping":
        return "echo round trip, one at a time (ping), 32 B"
    if histogram_id.startswith("rtt-"):
        return f"echo round trip at {int(histogram_id[4:]):,} msgs/s offered (open loop, from intended send), 32 B"
    return histogram_id


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None (with a note) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print(
            "bench: matplotlib is not installed, no plots (install the bench extra: pip install .[bench])", flush=True
        )
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency(directory: Path, stamp: str, histograms: Mapping[tuple[str, str], HdrHistogram]) -> list[Path]:
    """One PNG per histogram id (each rate, and ping): a percentile curve per system."""
    plt = _pyplot()
    if plt is None:
        return []
    written = []
    for histogram_id in sorted({hid for _, hid in histograms}):
        curves = [
            (label, histograms[(module, histogram_id)])
            for module, label in SYSTEMS.items()
            if (module, histogram_id) in histograms and histograms[(module, histogram_id)].get_total_count()
        ]
        curves += [
            (module, h)
            for (module, hid), h in sorted(histograms.items())
            if hid == histogram_id and module not in SYSTEMS and h.get_total_count()
        ]
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(9, 5.5))
        top = 10.0
        for label, histogram in curves:
            xs, ys = percentile_curve(histogram)
            ax.plot(xs, ys, label=f"{label} (max {histogram.get_max_value() / NS_PER_US:,.0f} us)")
            top = max(top, xs[-1] if xs else top)
        ax.set_xscale("log")
        ax.set_yscale("log")
        decades = max(1, math.ceil(math.log10(top)))
        ticks = [10.0**k for k in range(decades + 1)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{100 - 100 / t:g}%" for t in ticks])
        ax.set_xlabel("percentile")
        ax.set_ylabel("round trip (us)")
        ax.set_title(_title(histogram_id))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        path = directory / f"bench-{stamp}-{histogram_id}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def plot_throughput(directory: Path, stamp: str, rows: Iterable[Mapping[str, Any]]) -> list[Path]:
    """Bars of the windowed echo throughput (msgs/s, median, min-max as error bars),
    grouped by payload size, one bar per system."""
    bars: dict[str, dict[int, Mapping[str, Any]]] = {}
    for row in rows:
        plot = row.get("throughput_plot")
        if plot and row["median"] is not None:
            bars.setdefault(row["module"], {})[int(plot["size"])] = row
    if not bars:
        return []
    plt = _pyplot()
    if plt is None:
        return []
    modules = [m for m in SYSTEMS if m in bars] + sorted(m for m in bars if m not in SYSTEMS)
    sizes = sorted({size for per_size in bars.values() for size in per_size})
    width = 0.8 / len(modules)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for index, module in enumerate(modules):
        xs, heights, low, high = [], [], [], []
        for position, size in enumerate(sizes):
            bar = bars[module].get(size)
            if bar is None:
                continue
            xs.append(position + (index - (len(modules) - 1) / 2) * width)
            heights.append(bar["median"])
            low.append(bar["median"] - bar["min"])
            high.append(bar["max"] - bar["median"])
        ax.bar(xs, heights, width, yerr=[low, high], capsize=3, label=SYSTEMS.get(module, module))
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([f"{size} B" for size in sizes])
    ax.set_ylabel("echoes per second (median; bars: min-max)")
    ax.set_title(f"windowed echo throughput ({WINDOW} in flight unless the legend says otherwise)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    path = directory / f"bench-{stamp}-throughput.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return [path]


def write_plots(
    directory: Path, stamp: str, rows: Sequence[Mapping[str, Any]], histograms: Mapping[tuple[str, str], HdrHistogram]
) -> list[Path]:
    """Every plot; a failure is printed, never raised (the figures are in the other files)."""
    try:
        return plot_latency(directory, stamp, histograms) + plot_throughput(directory, stamp, rows)
    except Exception as error:  # a plot is not worth the run
        print(f"bench: plots not written: {type(error).__name__}: {error}", flush=True)
        return []

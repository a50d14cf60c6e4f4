"""The ``cluster-tool analyze`` job: the decoded log to Parquet, a report, a plot.

Reads the log recordings of one or more archive directories through the
``fulmar-log`` source, writes them to ``OUT/log.parquet`` (one row per
message, the source's columns), then works from the Parquet copy, with
each timestamp in seconds (the recording's time unit is in its
NewLeadershipTermEvents):

- per archive: messages, bytes, leadership terms, the log's last position;
- for the archive with the longest log (members' logs are replicas):
  messages and bytes per leadership term, per session and per second of
  cluster time, session lifetimes, timer events, snapshot points and
  throughput over time;
- ``OUT/report.txt`` and ``OUT/report.json`` hold the report,
  ``OUT/throughput.parquet`` the per-second series and ``OUT/throughput.png``
  its plot, with each leadership term's start and each snapshot marked.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .log_decoder import CORRUPT_TYPE

_UNIT_PER_SECOND = {"MILLIS": 1e3, "MICROS": 1e6, "NANOS": 1e9}


@dataclass
class AnalysisReport:
    archives: list[dict[str, Any]]
    detail_archive: str | None
    terms: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)  # client sessions; times from start_s
    service_messages: dict[str, int] = field(default_factory=dict)  # messages services offered to the log
    start_s: float = 0.0  # cluster time of the detail log's first message, in seconds
    timers: dict[str, Any] = field(default_factory=dict)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    throughput: dict[str, Any] = field(default_factory=dict)
    per_second: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[dict[str, Any]] = field(default_factory=list)
    out_dir: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)

    def text(self) -> str:
        lines = [f"fulmar log analysis ({len(self.archives)} archive(s))", ""]
        lines.append(f"{'archive':<50} {'messages':>10} {'bytes':>12} {'terms':>6} {'last position':>14}")
        for a in self.archives:
            lines.append(
                f"{_short(a['archive_dir']):<50} {a['messages']:>10} {a['bytes']:>12} {a['terms']:>6} "
                f"{a['last_position']:>14}"
            )
        if self.corrupt:
            lines += ["", f"WARNING: {len(self.corrupt)} corrupt region(s) skipped (PERMISSIVE mode):"]
            lines += [
                f"  {c['archive_dir']} position {c['log_position']}: {c['corrupt_record']}" for c in self.corrupt[:20]
            ]
        if self.detail_archive is None:
            return "\n".join(lines + ["", "no messages"])
        lines += ["", f"details of {self.detail_archive} (the longest log)", "", "leadership terms:"]
        lines.append(
            f"  {'term':>5} {'leader':>6} {'messages':>10} {'bytes':>12} {'from':>12} {'to':>12} {'duration s':>10}"
        )
        for t in self.terms:
            leader = "?" if t["leader_member_id"] is None else t["leader_member_id"]
            lines.append(
                f"  {t['leadership_term_id']:>5} {leader:>6} {t['messages']:>10} {t['bytes']:>12} "
                f"{t['first_position']:>12} {t['last_position']:>12} {t['duration_s']:>10.3f}"
            )
        lines += [
            "",
            "client sessions (messages and bytes: the session's own; times: seconds from the log's first message):",
        ]
        lines.append(
            f"  {'session':>8} {'messages':>10} {'bytes':>12} {'opened':>10} {'closed':>10} "
            f"{'lifetime s':>10}  close reason"
        )
        for s in self.sessions[:50]:
            lines.append(
                f"  {s['cluster_session_id']:>8} {s['messages']:>10} {s['bytes']:>12} "
                f"{_num(s['opened_s']):>10} {_num(s['closed_s']):>10} {_num(s['lifetime_s']):>10}  "
                f"{s['close_reason'] or ('open at the end' if s['opened_s'] is not None else '-')}"
            )
        if len(self.sessions) > 50:
            lines.append(f"  ... and {len(self.sessions) - 50} more")
        service = self.service_messages
        lines.append(f"  messages offered by services: {service.get('messages', 0)} ({service.get('bytes', 0)} bytes)")
        t = self.timers
        if t.get("total"):
            lines += [
                "",
                f"timer events: {t['total']} ("
                + ", ".join(f"term {k}: {v}" for k, v in sorted(t["per_term"].items()))
                + ")",
            ]
            lines.append(
                "  by correlation id: "
                + ", ".join(f"{k}: {v}" for k, v in sorted(t["per_correlation_id"].items())[:20])
            )
        else:
            lines += ["", "timer events: none"]
        lines += ["", f"snapshot points: {len(self.snapshots)}"]
        for s in self.snapshots:
            lines.append(
                f"  position {s['next_position']} (term {s['leadership_term_id']}, at "
                f"{s['time_s'] - self.start_s:.3f} s)"
            )
        tp = self.throughput
        if tp:
            lines += [
                "",
                "throughput over cluster time:",
                f"  {tp['seconds']} s from {tp['start_s']:.3f} s; messages/s mean {tp['mean_messages_per_s']:.1f}, "
                f"peak {tp['peak_messages_per_s']} at {tp['peak_second']}; bytes/s mean {tp['mean_bytes_per_s']:.0f}, "
                f"peak {tp['peak_bytes_per_s']}; idle seconds {tp['idle_seconds']}",
            ]
            lines.append(f"  {'second':>8} {'messages':>10} {'bytes':>12}")
            for row in self.per_second[:30]:
                lines.append(f"  {row['second']:>8} {row['messages']:>10} {row['bytes']:>12}")
            if len(self.per_second) > 30:
                lines.append(f"  ... {len(self.per_second) - 30} more seconds in throughput.parquet")
        if self.out_dir:
            lines += [
                "",
                f"written to {self.out_dir}: log.parquet, throughput.parquet, report.txt, report.json, throughput.png",
            ]
        return "\n".join(lines)


def _short(path: str) -> str:
    return path if len(path) <= 50 else "..." + path[-47:]


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def analyze(
    spark: Any, archive_dirs: list[str], out_dir: str | os.PathLike[str], options: dict[str, str] | None = None
) -> AnalysisReport:
    """Run the job (see the module doc); returns the report, also written to ``out_dir``."""
    from pyspark.sql import functions as F

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = spark.read.format("fulmar-log")
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    decoded = reader.load([os.path.abspath(d) for d in archive_dirs])
    # The log is decoded once, into Parquet; everything else reads that.
    parquet = str(out / "log.parquet")
    decoded.write.mode("overwrite").parquet(parquet)
    stored = spark.read.parquet(parquet)
    # Each recording's time unit, from its NewLeadershipTermEvents (MILLIS when none is read).
    units = (
        stored.filter(F.col("message_type") == "NewLeadershipTermEvent")
        .groupBy("archive_dir", "recording_id")
        .agg(F.first("time_unit").alias("unit"))
    )
    per_second_factor = F.coalesce(
        *(F.when(F.col("unit") == name, F.lit(factor)) for name, factor in _UNIT_PER_SECOND.items()), F.lit(1e3)
    )
    log = (
        stored.join(F.broadcast(units), ["archive_dir", "recording_id"], "left")
        .withColumn("time_s", F.col("timestamp") / per_second_factor)
        .drop("unit")
    )

    corrupt = [
        row.asDict()
        for row in log.filter(F.col("message_type") == CORRUPT_TYPE)
        .select("archive_dir", "recording_id", "log_position", "corrupt_record")
        .orderBy("log_position")
        .collect()
    ]
    messages = log.filter(F.col("message_type") != CORRUPT_TYPE)
    archives = [
        row.asDict()
        for row in messages.groupBy("archive_dir")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("payload_length").alias("bytes"),
            F.countDistinct("leadership_term_id").alias("terms"),
            F.max("next_position").alias("last_position"),
        )
        .orderBy("archive_dir")
        .collect()
    ]
    report = AnalysisReport(archives=archives, detail_archive=None, corrupt=corrupt, out_dir=str(out))
    if not archives:
        _write(report, out)
        return report
    detail = max(archives, key=lambda a: (a["last_position"], a["archive_dir"]))["archive_dir"]
    report.detail_archive = detail
    one = messages.filter(F.col("archive_dir") == detail).cache()

    report.terms = [
        row.asDict()
        for row in one.groupBy("leadership_term_id")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("payload_length").alias("bytes"),
            F.min("log_position").alias("first_position"),
            F.max("next_position").alias("last_position"),
            F.max("leader_member_id").alias("leader_member_id"),
            (F.max("time_s") - F.min("time_s")).alias("duration_s"),
        )
        .orderBy("leadership_term_id")
        .collect()
    ]

    own = (
        one.filter(F.col("message_type") == "SessionMessageHeader")
        .groupBy("cluster_session_id")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("payload_length").alias("bytes"))
    )
    opened = (
        one.filter(F.col("message_type") == "SessionOpenEvent")
        .groupBy("cluster_session_id")
        .agg(F.min("time_s").alias("opened_s"))
    )
    closed = (
        one.filter(F.col("message_type") == "SessionCloseEvent")
        .groupBy("cluster_session_id")
        .agg(F.max("time_s").alias("closed_s"), F.first("close_reason").alias("close_reason"))
    )
    start_s = one.agg(F.min("time_s")).first()[0] or 0.0
    report.start_s = float(start_s)
    sessions = (
        own.join(opened, "cluster_session_id", "full")
        .join(closed, "cluster_session_id", "full")
        .fillna(0, ["messages", "bytes"])
        .withColumn("opened_s", F.col("opened_s") - F.lit(start_s))
        .withColumn("closed_s", F.col("closed_s") - F.lit(start_s))
        .withColumn("lifetime_s", F.col("closed_s") - F.col("opened_s"))
        .orderBy("cluster_session_id")
    )

    # A message a service offers to the cluster carries no client session:
    # the consensus module gives it an id counted up from Long.MIN_VALUE + 1
    # (Aeron's service session ids), which never opens or closes.
    def offered_by_a_service(r: dict[str, Any]) -> bool:
        return r["opened_s"] is None and r["closed_s"] is None and r["cluster_session_id"] < 0

    rows = [row.asDict() for row in sessions.collect()]
    offered = [r for r in rows if offered_by_a_service(r)]
    report.sessions = [r for r in rows if not offered_by_a_service(r)]
    report.service_messages = {
        "messages": sum(r["messages"] for r in offered),
        "bytes": int(sum(r["bytes"] or 0 for r in offered)),
    }

    timers = one.filter(F.col("message_type") == "TimerEvent")
    per_term = {
        str(r["leadership_term_id"]): r["count"] for r in timers.groupBy("leadership_term_id").count().collect()
    }
    report.timers = {
        "total": sum(per_term.values()),
        "per_term": per_term,
        "per_correlation_id": {
            str(r["correlation_id"]): r["count"] for r in timers.groupBy("correlation_id").count().collect()
        },
    }
    report.snapshots = [
        row.asDict()
        for row in one.filter(
            (F.col("message_type") == "ClusterActionRequest") & (F.col("cluster_action") == "SNAPSHOT")
        )
        .select("leadership_term_id", "log_position", "next_position", "time_s")
        .orderBy("log_position")
        .collect()
    ]

    per_second = (
        one.filter(F.col("time_s").isNotNull())
        .groupBy(F.floor("time_s").alias("epoch_second"))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("payload_length").alias("bytes"))
        .orderBy("epoch_second")
    )
    per_second.write.mode("overwrite").parquet(str(out / "throughput.parquet"))
    rows = [row.asDict() for row in per_second.collect()]
    terms_started = [
        row.asDict()
        for row in one.filter(F.col("message_type") == "NewLeadershipTermEvent")
        .select("leadership_term_id", "time_s")
        .orderBy("log_position")
        .collect()
    ]
    one.unpersist()
    if rows:
        start = rows[0]["epoch_second"]
        span = rows[-1]["epoch_second"] - start + 1
        counts = {r["epoch_second"]: r for r in rows}
        report.per_second = [
            {
                "second": s,
                "messages": counts[start + s]["messages"] if start + s in counts else 0,
                "bytes": int(counts[start + s]["bytes"] or 0) if start + s in counts else 0,
            }
            for s in range(span)
        ]
        peak = max(report.per_second, key=lambda r: r["messages"])
        report.throughput = {
            "start_s": float(start),
            "seconds": span,
            "mean_messages_per_s": sum(r["messages"] for r in report.per_second) / span,
            "peak_messages_per_s": peak["messages"],
            "peak_second": peak["second"],
            "mean_bytes_per_s": sum(r["bytes"] for r in report.per_second) / span,
            "peak_bytes_per_s": max(r["bytes"] for r in report.per_second),
            "idle_seconds": sum(1 for r in report.per_second if r["messages"] == 0),
        }
        _plot(report, terms_started, float(start), out / "throughput.png")
    _write(report, out)
    return report


def _write(report: AnalysisReport, out: Path) -> None:
    (out / "report.txt").write_text(report.text() + "\n")
    (out / "report.json").write_text(report.to_json() + "\n")


def _plot(report: AnalysisReport, terms_started: list[dict[str, Any]], start_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    seconds = [r["second"] for r in report.per_second]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    top.step(seconds, [r["messages"] for r in report.per_second], where="post", color="tab:blue")
    top.set_ylabel("messages / s")
    bottom.step(seconds, [r["bytes"] for r in report.per_second], where="post", color="tab:green")
    bottom.set_ylabel("payload bytes / s")
    bottom.set_xlabel(f"cluster time, seconds from {start_s:.0f} (Unix time)")
    for axis in (top, bottom):
        for term in terms_started:
            if term["time_s"] is not None and not math.isnan(term["time_s"]):
                axis.axvline(term["time_s"] - start_s, color="tab:red", linestyle="--", linewidth=1)
        for snap in report.snapshots:
            axis.axvline(snap["time_s"] - start_s, color="tab:purple", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    top.set_title(
        f"fulmar log throughput: {_short(report.detail_archive or '')}\n"
        "(red dashed: a leadership term starts; purple dotted: a snapshot)",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)

"""``make bench``: run every benchmark, repeat each, print a table with the
ratio to its physical reference (the same loop in C, measured in the same
run), and save the figures as JSON under ``bench/results/``.

Each benchmark module exposes ``run(quick: bool) -> list[dict]``; a dict is
``{"name", "value", "unit", "reference"}`` where ``reference`` (or None) is
the figure of the physical reference for the same work; a row whose
reference is something else says what in ``"reference_kind"`` (a key of
``report.REFERENCE_NOTES``).

A module may instead compare itself with modules that ran before it in the
same run: it names them in ``REFERENCE_MODULES``, in order of preference, and
maps its row names to theirs with ``reference_name(name, module) -> str |
None``; a row's reference is the first of those modules that ran and has the
row (``cluster3``: PySyncObj's 3-node figure for the same work, ratio
fulmar/PySyncObj; without ``pysyncobj_peer`` in the run, the 1-node cluster's,
ratio 3-node/1-node).  Rows given no reference either way show none.

A module may also add rows made from its own rows once the medians over the
repetitions are taken: ``derived_rows(rows) -> list[dict]``, given the
module's aggregated rows (``median``, ``min``, ``max``, ...) and returning
more with every key of theirs (``pysyncobj_peer``: its best figure of both
settings under the name ``cluster3`` maps to, a copy of one setting's row).
Such a row may carry a ``"note"`` (which setting and window it is), shown in
the table's note column; a row whose reference is a row with a note shows
that note too (``reference: ...``).

A row's value may be None (no figure in that run: shown as n/a).  A latency
row may carry ``"histogram"`` (an HdrHistogram of nanoseconds) and
``"histogram_id"`` (``rtt-RATE``, ``ping``), and ``"histogram_system"``
when the module measures more than one system (``pysyncobj_peer``: one per
setting; the module's name otherwise); a throughput row may carry
``"throughput_plot": {"size": B}``.  Besides the JSON, each run writes
(``bench.report``) ``bench-STAMP.md`` (the table in Markdown, also printed),
``bench-STAMP-SYSTEM-ID.hgrm`` per histogram (SYSTEM: the module, or the
row's ``histogram_system``; repeats merged; HdrHistogram's
percentile distribution in us) and PNG plots (latency percentiles per rate
and for ping, one curve per system; throughput bars per payload size).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from bench import machine, report

MODULES = [
    "log_buffer",
    "ring_buffer",
    "idle",
    "ipc",
    "udp",
    "udp_stream",
    "archive",
    "cluster",
    "pysyncobj_peer",
    "cluster3",
    "cluster3_secret",
    "stages",
    "metrics",
    "restore",
    "spark_decode",
]
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short measurements, one repetition")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each benchmark (median reported)")
    parser.add_argument("--only", action="append", choices=MODULES, help="run only these benchmark modules")
    args = parser.parse_args()
    repeat = 1 if args.quick else max(1, args.repeat)

    machine_before, machine_before_text = machine.describe()
    print(f"machine speed before: {machine_before_text}", flush=True)
    rows: list[dict[str, Any]] = []
    histograms: dict[tuple[str, str], Any] = {}  # (module, histogram id) -> HdrHistogram, repeats merged
    for module_name in sorted(args.only or MODULES, key=MODULES.index):
        module = importlib.import_module(f"bench.{module_name}")
        reference_modules: tuple[str, ...] = getattr(module, "REFERENCE_MODULES", ())
        earlier = {(row["module"], row["name"]): row for row in rows if row["module"] in reference_modules}
        samples: dict[str, list[dict[str, Any]]] = {}
        module_rows: list[dict[str, Any]] = []
        for _ in range(repeat):
            for result in module.run(args.quick):
                samples.setdefault(result["name"], []).append(result)
        for name, runs in samples.items():
            report.merge_histograms(histograms, module_name, runs)
            # None: no figure in that run (e.g. percentiles of an open-loop run with no answer after its warm-up).
            values = [r["value"] for r in runs if r["value"] is not None]
            references = [r["reference"] for r in runs if r.get("reference")]
            reference = statistics.median(references) if references else None
            # A row names what its reference is ("reference_kind"); by default the same loop in C.
            reference_kind = runs[0].get("reference_kind", "C") if reference else None
            reference_note = None
            for reference_module in reference_modules if reference is None else ():
                other = earlier.get((reference_module, module.reference_name(name, reference_module) or ""))
                if other is not None:
                    # The first module that has the row decides, even when its row has no figure
                    # (PySyncObj's percentiles when it answered nothing): no ratio then, rather
                    # than one against the next module's figure in a column of fulmar / PySyncObj.
                    if other["median"] is not None:
                        reference, reference_kind = other["median"], reference_module
                        reference_note = other.get("note")  # e.g. the peer's setting behind its best figure
                    break
            median = statistics.median(values) if values else None
            module_rows.append(
                {
                    "module": module_name,
                    "name": name,
                    "unit": runs[0]["unit"],
                    "median": median,
                    "min": min(values) if values else None,
                    "max": max(values) if values else None,
                    "reference": reference,
                    "reference_kind": reference_kind,
                    "ratio": median / reference if reference and median is not None else None,
                    "runs": len(values),
                    **({"reference_note": reference_note} if reference_note else {}),
                    **({"throughput_plot": runs[0]["throughput_plot"]} if runs[0].get("throughput_plot") else {}),
                }
            )
        # After the medians: a derived row is made of whole aggregated rows (pysyncobj_peer: one
        # setting's median and min-max), not of one repetition's figures.
        derived = getattr(module, "derived_rows", None)
        rows += module_rows + (derived(module_rows) if derived else [])

    machine_after, machine_after_text = machine.describe()
    speed = f"machine speed (bench.machine): before, {machine_before_text}; after, {machine_after_text}"
    print(speed, flush=True)
    header = f"{'benchmark':<52} {'median':>14} {'min-max':>25} {'unit':<8} {'reference':>14} {'ratio':>7}  note"
    print(header)
    print("-" * len(header))
    for row in rows:
        reference = report.format_value(row["reference"]) if row["reference"] else "-"
        ratio = f"{row['ratio']:.3f}" if row["ratio"] else "-"
        print(
            f"{row['name']:<52} {report.format_value(row['median'], row['unit']):>14} {report.spread(row):>25} "
            f"{row['unit']:<8} {reference:>14} {ratio:>7}  {report.note(row)}".rstrip()
        )

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS_DIR / f"bench-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "machine": platform.uname()._asdict(),
                "machine_speed": {"before": machine_before, "after": machine_after},
                "quick": args.quick,
                "repeat": repeat,
                "results": rows,
            },
            indent=2,
        )
    )
    kinds = sorted({row["reference_kind"] for row in rows if row["reference_kind"]})
    if kinds:
        print("reference: " + report.reference_notes(kinds))

    heading = (
        f"python -m bench{' --quick' if args.quick else ''}, {stamp}: {repeat} repetition(s), median and "
        f"min-max; {platform.node()}, {os.cpu_count()} cores; {speed}"
    )
    markdown = report.write_markdown(RESULTS_DIR / f"bench-{stamp}.md", rows, heading)
    print("\n" + markdown.read_text())
    files = [out, markdown]
    files += report.write_hgrm(RESULTS_DIR, stamp, histograms)
    files += report.write_plots(RESULTS_DIR, stamp, rows, histograms)
    print("results:\n" + "\n".join(f"  {path}" for path in files))


if __name__ == "__main__":
    main()

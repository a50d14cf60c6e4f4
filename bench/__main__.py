"""``make bench``: run every benchmark, repeat each, print a table with the
ratio to its physical reference (the same loop in C, measured in the same
run), and save the figures as JSON under ``bench/results/``.

Each benchmark module exposes ``run(quick: bool) -> list[dict]``; a dict is
``{"name", "value", "unit", "reference"}`` where ``reference`` (or None) is
the figure of the physical reference for the same work.

A module may instead compare itself with modules that ran before it in the
same run: it names them in ``REFERENCE_MODULES``, in order of preference, and
maps its row names to theirs with ``reference_name(name, module) -> str |
None``; a row's reference is the first of those modules that ran and has the
row (``cluster3``: PySyncObj's 3-node figure for the same work, ratio
fulmar/PySyncObj; without ``pysyncobj_peer`` in the run, the 1-node cluster's,
ratio 3-node/1-node).  Rows given no reference either way show none.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

MODULES = ["log_buffer", "ring_buffer", "idle", "ipc", "udp", "udp_stream", "archive", "cluster", "pysyncobj_peer",
           "cluster3"]
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _format(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short measurements, one repetition")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each benchmark (median reported)")
    parser.add_argument("--only", action="append", choices=MODULES, help="run only these benchmark modules")
    args = parser.parse_args()
    repeat = 1 if args.quick else max(1, args.repeat)

    rows: list[dict[str, Any]] = []
    for module_name in sorted(args.only or MODULES, key=MODULES.index):
        module = importlib.import_module(f"bench.{module_name}")
        reference_modules: tuple[str, ...] = getattr(module, "REFERENCE_MODULES", ())
        earlier = {(row["module"], row["name"]): row for row in rows if row["module"] in reference_modules}
        samples: dict[str, list[dict[str, Any]]] = {}
        for _ in range(repeat):
            for result in module.run(args.quick):
                samples.setdefault(result["name"], []).append(result)
        for name, runs in samples.items():
            values = [r["value"] for r in runs]
            references = [r["reference"] for r in runs if r.get("reference")]
            reference = statistics.median(references) if references else None
            reference_kind = "C" if reference else None
            for reference_module in reference_modules if reference is None else ():
                other = earlier.get((reference_module, module.reference_name(name, reference_module) or ""))
                if other is not None:
                    reference, reference_kind = other["median"], reference_module
                    break
            median = statistics.median(values)
            rows.append(
                {
                    "module": module_name,
                    "name": name,
                    "unit": runs[0]["unit"],
                    "median": median,
                    "min": min(values),
                    "max": max(values),
                    "reference": reference,
                    "reference_kind": reference_kind,
                    "ratio": median / reference if reference else None,
                    "runs": len(values),
                }
            )

    header = f"{'benchmark':<52} {'median':>14} {'min-max':>25} {'unit':<8} {'reference':>14} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for row in rows:
        spread = f"{_format(row['min'])}-{_format(row['max'])}"
        reference = _format(row["reference"]) if row["reference"] else "-"
        ratio = f"{row['ratio']:.3f}" if row["ratio"] else "-"
        print(
            f"{row['name']:<52} {_format(row['median']):>14} {spread:>25} {row['unit']:<8} {reference:>14} {ratio:>7}"
        )

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS_DIR / f"bench-{stamp}.json"
    out.write_text(
        json.dumps(
            {"machine": platform.uname()._asdict(), "quick": args.quick, "repeat": repeat, "results": rows},
            indent=2,
        )
    )
    kinds = sorted({row["reference_kind"] for row in rows if row["reference_kind"]})
    if kinds:
        notes = {"C": "the same loop in C, measured in this run",
                 "pysyncobj_peer": "cluster3 rows: PySyncObj's 3-node cluster doing the same work in this run "
                                   "(ratio = fulmar / PySyncObj: above 1 is better for fulmar in msgs/s and MB/s, "
                                   "below 1 in us, ms, cores and MiB)",
                 "cluster": "cluster3 rows without a PySyncObj figure in this run: the 1-node cluster's median "
                            "for the same work (ratio = 3-node / 1-node)"}
        print("reference: " + "; ".join(notes.get(kind, f"the {kind} module's median for the same work in this run "
                                                   f"(ratio = this / that)") for kind in kinds))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()

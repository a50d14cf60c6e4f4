"""``make bench``: run every benchmark, repeat each, print a table with the
ratio to its physical reference (the same loop in C, measured in the same
run), and save the figures as JSON under ``bench/results/``.

Each benchmark module exposes ``run(quick: bool) -> list[dict]``; a dict is
``{"name", "value", "unit", "reference"}`` where ``reference`` (or None) is
the figure of the physical reference for the same work.
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

MODULES = ["log_buffer", "ring_buffer", "idle", "ipc", "udp", "udp_stream", "archive", "cluster"]
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
    for module_name in args.only or MODULES:
        module = importlib.import_module(f"bench.{module_name}")
        samples: dict[str, list[dict[str, Any]]] = {}
        for _ in range(repeat):
            for result in module.run(args.quick):
                samples.setdefault(result["name"], []).append(result)
        for name, runs in samples.items():
            values = [r["value"] for r in runs]
            references = [r["reference"] for r in runs if r.get("reference")]
            reference = statistics.median(references) if references else None
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
                    "ratio": median / reference if reference else None,
                    "runs": len(values),
                }
            )

    header = f"{'benchmark':<52} {'median':>14} {'min-max':>25} {'unit':<8} {'C reference':>14} {'ratio':>7}"
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
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()

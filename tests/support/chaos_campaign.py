"""A chaos campaign: many seeds of ``tests/support/chaos.py`` one after another, on 3
and/or 5 members, with one line per seed and the totals at the end.

One run can pass by luck; a bug that shows once in twenty runs shows in a
campaign.  Each seed runs in a process of its own (a run that hangs or leaks
cannot spoil the next one), bounded by a hard deadline: a run that overstays
it is killed, with its whole process group, and counted as not converged.

    python tests/support/chaos_campaign.py --seeds 40 --members 3 --seconds 60
    make chaos CHAOS_SEEDS=40 CHAOS_SECONDS=60

Seeds are drawn at random unless ``--seed`` gives the first (the campaign then
runs seed, seed+1, ...), so a campaign, like a single run, can be replayed.
Exit status 1 when any run had an anomaly or did not converge.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

CHAOS = Path(__file__).resolve().parent / "chaos.py"
# Beyond the faults' own time: the start, the convergence waits (up to three
# of chaos.py's two minutes each), the snapshot and the checks.
_OVERHEAD_S = 600


@dataclass
class SeedResult:
    members: int
    seed: int
    seconds_taken: float
    anomalies: list[str] = field(default_factory=list)
    converged: bool | None = None
    linearizable: bool | None = None
    operations: dict[str, int] = field(default_factory=dict)
    faults: int = 0
    artifacts: str | None = None
    backup_matches: bool | None = None
    log_violations: int | None = None  # what verify-log found (None: not reached)

    @property
    def ok(self) -> bool:
        return (
            not self.anomalies
            and self.converged is True
            and self.linearizable is True
            and self.backup_matches is not False
            and self.log_violations == 0
        )

    def line(self) -> str:
        ops = self.operations
        verdict = "ok" if self.ok else ("NOT CONVERGED" if self.converged is False else "ANOMALY")
        linearizable = {True: "yes", False: "NO", None: "undecided"}[self.linearizable]
        text = (
            f"{self.members} members  seed {self.seed:<10d}  {verdict:<13}  "
            f"{ops.get('ok', 0):6d} ok {ops.get('unknown', 0):4d} unknown {ops.get('fail', 0):4d} fail  "
            f"{self.faults:3d} faults  linearizable {linearizable:<9}  "
            f"backup {({True: 'same log', False: 'DIFFERS', None: '-'})[self.backup_matches]:<8}  "
            f"verify-log {'-' if self.log_violations is None else self.log_violations}  "
            f"{len(self.anomalies)} anomalies  {self.seconds_taken:4.0f} s"
        )
        if not self.ok:
            first = self.anomalies[0].splitlines()[0] if self.anomalies else "no report"
            text += f"\n    {first[:300]}"
            if self.artifacts:
                text += f"\n    artifacts: {self.artifacts}"
        return text


def run_seed(
    members: int, seed: int, seconds: float, clients: int, artifacts: Path, secret: str | None = None
) -> SeedResult:
    """One chaos run in its own process group; its report, or what went wrong."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fulmar-campaign-") as scratch:
        report_path = Path(scratch) / "report.json"
        output_path = Path(scratch) / "output.txt"
        command = [
            sys.executable,
            str(CHAOS),
            "--members",
            str(members),
            "--seconds",
            f"{seconds:g}",
            "--clients",
            str(clients),
            "--seed",
            str(seed),
            "--artifacts",
            str(artifacts),
            "--report-json",
            str(report_path),
            *(["--secret", secret] if secret is not None else []),
        ]
        with open(output_path, "w") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                process.wait(timeout=seconds + _OVERHEAD_S)
                overstayed = False
            except subprocess.TimeoutExpired:
                overstayed = True
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
        taken = time.monotonic() - began
        if overstayed:
            return SeedResult(
                members,
                seed,
                taken,
                [f"the run overstayed {seconds + _OVERHEAD_S:.0f} s and was killed"],
                converged=False,
            )
        if not report_path.exists():
            tail = output_path.read_text(errors="replace")[-2000:]
            return SeedResult(
                members, seed, taken, [f"chaos.py exited {process.returncode} without a report: {tail.strip()[-300:]}"]
            )
        report: dict[str, Any] = json.loads(report_path.read_text())
    return SeedResult(
        members,
        seed,
        taken,
        anomalies=list(report["anomalies"]),
        converged=report.get("converged"),
        linearizable=report.get("linearizable"),
        operations=dict(report.get("operations", {})),
        faults=len(report.get("events", [])),
        artifacts=report.get("artifacts"),
        backup_matches=report.get("backup_matches"),
        log_violations=report.get("log_violations"),
    )


def summarize(results: list[SeedResult]) -> list[str]:
    lines = []
    for members in sorted({r.members for r in results}):
        runs = [r for r in results if r.members == members]
        unconverged = [r for r in runs if r.converged is False]
        anomalous = [r for r in runs if not r.ok and r.converged is not False]
        ops = sum(r.operations.get("ok", 0) for r in runs)
        faults = sum(r.faults for r in runs)
        violations = sum(r.log_violations or 0 for r in runs)
        unchecked = sum(1 for r in runs if r.log_violations is None)
        lines.append(
            f"total {members} members: {len(runs)} runs, {sum(1 for r in runs if r.ok)} "
            f"clean, {len(anomalous)} with anomalies, {len(unconverged)} not converged; "
            f"{faults} faults, {ops} acknowledged operations; {violations} verify-log violations"
            + (f" ({unchecked} runs not checked)" if unchecked else "")
        )
        failed = anomalous + unconverged
        if failed:
            lines.append("  failed seeds: " + ", ".join(str(r.seed) for r in failed))
    return lines


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--seeds", type=click.IntRange(min=1), default=10, help="Runs per member count.")
@click.option(
    "--members",
    "member_counts",
    type=click.IntRange(3, 7),
    multiple=True,
    default=(3, 5),
    help="Member counts (repeatable); each gets --seeds runs.",
)
@click.option("--seconds", type=click.FloatRange(min=5), default=60.0, help="How long the faults go on, each run.")
@click.option("--seed", type=int, default=None, help="The first seed (then +1 each run); default random.")
@click.option(
    "--clients",
    type=click.IntRange(1, 32),
    default=None,
    help="Client threads per run (default 4 on 3 members, 5 on 5 or more).",
)
@click.option(
    "--artifacts",
    type=click.Path(path_type=Path),
    default=Path("chaos-artifacts"),
    help="Where a failed run leaves its history, schedule and logs.",
)
@click.option("--secret", default=None, help="Every run's cluster has this secret (chaos.py --secret).")
def main(
    seeds: int,
    member_counts: tuple[int, ...],
    seconds: float,
    seed: int | None,
    clients: int | None,
    artifacts: Path,
    secret: str | None,
) -> None:
    """Run SEEDS chaos runs per member count, one after another; one line per run, then the totals."""
    first = seed if seed is not None else random.SystemRandom().randrange(1 << 30)
    results: list[SeedResult] = []
    began = time.monotonic()
    for members in member_counts:
        for index in range(seeds):
            run_clients = clients if clients is not None else (4 if members < 5 else 5)
            result = run_seed(members, first + index, seconds, run_clients, artifacts, secret)
            results.append(result)
            click.echo(result.line(), nl=True)
            sys.stdout.flush()
    for line in summarize(results):
        click.echo(line)
    click.echo(f"campaign took {time.monotonic() - began:.0f} s")
    sys.exit(0 if all(r.ok for r in results) else 1)


if __name__ == "__main__":
    main()

"""``cluster-tool analyze`` and ``cluster-tool replay``: Spark jobs over archived logs.

They need the ``spark`` extra (``pip install fulmar[spark]``) and a Java
runtime; without them they say so and exit 2.  Errors in the data (a corrupt
segment in FAILFAST mode, an unknown recording id...) are raised in Spark's
Python workers; the first line of fulmar's own error is pulled out of
Spark's report and printed alone, exit 1.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from fulmar.cli.tool_common import EXIT_PROBLEM, EXIT_USAGE

EXIT_NOT_INSTALLED = EXIT_USAGE

# The exception lines of fulmar's errors inside a Spark error's text.
_OWN_ERROR = re.compile(
    r"^(?:\S+\.)?(LogCorruptError|CatalogError|SegmentError|ReplayError|CorruptRecordingLogError|ValueError|"
    r"FileNotFoundError): (.+)$",
    re.MULTILINE,
)


def spark_error_message(error: BaseException) -> str:
    """fulmar's own message from a Spark error, else the error's first line."""
    text = str(error)
    found = _OWN_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        return f"{kind}: {message.strip()}"
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def _fail(message: str, code: int = EXIT_PROBLEM) -> NoReturn:
    click.echo(f"cluster-tool: {message}", err=True)
    sys.exit(code)


@contextmanager
def _spark(master: str, app_name: str) -> Iterator[Any]:
    """A session for one command, stopped after it; or, when this process
    has one running already (a notebook or a program that invokes the
    command), that one, left running (``--master`` then does not apply)."""
    try:
        import pyspark  # noqa: F401 - the session module imports it only when a session starts
        from pyspark.sql import SparkSession

        from fulmar.analytics.session import spark_session, stop_spark
    except ImportError as error:
        _fail(f"the Spark jobs need the spark extra: pip install 'fulmar[spark]' ({error})", EXIT_NOT_INSTALLED)
    running = SparkSession.getActiveSession()
    try:
        spark = running if running is not None else spark_session(master, app_name)
    except Exception as error:  # noqa: BLE001 - no JVM, a bad master URL...
        _fail(f"cannot start Spark (master {master}): {spark_error_message(error)}", EXIT_NOT_INSTALLED)
    try:
        yield spark
    except (click.exceptions.Exit, click.ClickException):  # click's own: a bad --view, an exit
        raise
    except Exception as error:  # noqa: BLE001 - Spark wraps what the workers raised
        _fail(spark_error_message(error))
    finally:
        if running is None:
            stop_spark(spark)


def _load(spec: str, what: str) -> Callable[..., Any]:
    """``module:attribute`` -> the callable."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r}: expected module:function", param_hint=what)
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise click.BadParameter(f"cannot load {spec}: {error}", param_hint=what) from None
    if not callable(target):
        raise click.BadParameter(f"{spec} is not callable", param_hint=what)
    return target


archive_dirs_option = click.option(
    "--archive-dir",
    "archive_dirs",
    multiple=True,
    required=True,
    type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path),
    help="An archive directory (a node's archive/); repeat for several nodes.",
)
master_option = click.option(
    "--master", default="local[*]", help="Spark master URL: local[*] (embedded), local[N], spark://host:port ..."
)


@click.command(short_help="Spark job: the archived log to Parquet, a report and a throughput plot.")
@archive_dirs_option
@master_option
@click.option(
    "--out",
    "out_dir",
    default="fulmar-analysis",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where log.parquet, throughput.parquet, report.txt, report.json and throughput.png go.",
)
@click.option(
    "--mode",
    type=click.Choice(["FAILFAST", "PERMISSIVE"], case_sensitive=False),
    default="FAILFAST",
    help="Corrupt data: fail naming the file and position, or skip it with a counted warning.",
)
@click.option("--recording-ids", default=None, help="Comma-separated recording ids (default: the log stream's).")
@click.option("--from-position", type=click.IntRange(min=0), default=None)
@click.option("--to-position", type=click.IntRange(min=0), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def analyze(
    archive_dirs: tuple[Path, ...],
    master: str,
    out_dir: Path,
    mode: str,
    recording_ids: str | None,
    from_position: int | None,
    to_position: int | None,
    as_json: bool,
) -> None:
    """Decode the cluster log recorded in ARCHIVE_DIR(s) with Spark (the
    fulmar-log data source), write it to OUT/log.parquet and report messages
    and bytes per leadership term, per session and per second, session
    lifetimes, timer events, snapshot points and throughput over time;
    OUT/throughput.png plots the throughput.  Exit 1 on corrupt data (in
    FAILFAST mode) or unreadable files, 2 without the spark extra."""
    options = {"mode": mode.upper()}
    if recording_ids:
        options["recordingIds"] = recording_ids
    if from_position is not None:
        options["fromPosition"] = str(from_position)
    if to_position is not None:
        options["toPosition"] = str(to_position)
    with _spark(master, "fulmar analyze") as spark:
        from fulmar.analytics.analyze import analyze as run_analysis

        report = run_analysis(spark, [str(d) for d in archive_dirs], out_dir, options)
    click.echo(report.to_json() if as_json else report.text())


@click.command(short_help="Spark job: replay the log through a pure apply(); audit a snapshot.")
@click.option(
    "--archive-dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The node's archive directory.",
)
@click.option(
    "--apply",
    "apply_spec",
    required=True,
    help="module:function, apply(state, message) -> state (e.g. fulmar.service.samples:counter_apply).",
)
@click.option(
    "--initial",
    "initial_spec",
    required=True,
    help="module:function returning the initial state (e.g. fulmar.service.samples:counter_initial).",
)
@click.option(
    "--position",
    type=click.IntRange(min=0),
    default=None,
    help="Replay the messages that end at or below this log position (default: the whole log).",
)
@click.option(
    "--cluster-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Audit instead: replay up to the node's latest service snapshot (its recording.log) and "
    "compare; needs --load-snapshot.",
)
@click.option(
    "--load-snapshot",
    "load_spec",
    default=None,
    help="module:function, load(records: list[bytes]) -> state, from the service's snapshot records.",
)
@click.option(
    "--view",
    "view_spec",
    default=None,
    help="module:function, view(state) -> what a snapshot holds of it (default: the state itself).",
)
@click.option(
    "--resume",
    "resume_spec",
    default=None,
    help="module:function, resume(snapshot_state, sessions) -> apply's state at a snapshot (e.g. "
    "fulmar.service.samples:counter_resume): replays start from a snapshot once the log before it "
    "was purged.",
)
@click.option(
    "--from-snapshot",
    is_flag=True,
    help="Replay from the node's newest snapshot at or below --position instead of from the start "
    "(needs --cluster-dir, --load-snapshot and --resume): the state, not an audit.",
)
@click.option("--service-id", type=int, default=0, show_default=True)
@master_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def replay(
    archive_dir: Path,
    apply_spec: str,
    initial_spec: str,
    position: int | None,
    cluster_dir: Path | None,
    load_spec: str | None,
    view_spec: str | None,
    resume_spec: str | None,
    from_snapshot: bool,
    service_id: int,
    master: str,
    as_json: bool,
) -> None:
    """Replay the log recorded in ARCHIVE_DIR through a pure apply function,
    in Spark, and print the state at the end (or at --position).  With
    --cluster-dir and --load-snapshot, audit the node's latest snapshot: the
    state it holds must equal the replay up to its log position (exit 1 if
    they differ).  A log whose start was purged replays from a snapshot
    (--from-snapshot; an audit starts from the snapshot before the one it
    checks): give --resume."""
    # Every callable is loaded before Spark starts: a bad spec fails at once.
    apply = _load(apply_spec, "--apply")
    initial = _load(initial_spec, "--initial")()
    view = _load(view_spec, "--view") if view_spec else (lambda state: state)
    if cluster_dir is not None and load_spec is None:
        raise click.BadParameter("an audit (--cluster-dir) needs --load-snapshot", param_hint="--load-snapshot")
    if from_snapshot and (cluster_dir is None or load_spec is None or resume_spec is None):
        raise click.BadParameter(
            "a replay from a snapshot needs --cluster-dir, --load-snapshot and --resume", param_hint="--from-snapshot"
        )
    load_snapshot = _load(load_spec, "--load-snapshot") if load_spec else None
    resume = _load(resume_spec, "--resume") if resume_spec else None
    with _spark(master, "fulmar replay") as spark:
        from fulmar.analytics import replay as replay_job

        if from_snapshot or cluster_dir is None or load_snapshot is None:
            if from_snapshot:
                assert cluster_dir is not None and load_snapshot is not None and resume is not None
                result = replay_job.replay_from_snapshot(
                    spark, archive_dir, cluster_dir, apply, load_snapshot, resume, position, service_id=service_id
                )
            else:
                result = replay_job.replay_state(spark, archive_dir, apply, initial, position)
            document = {"position": result.position, "messages": result.messages, "state": view(result.state)}
            click.echo(
                json.dumps(document, default=_jsonable)
                if as_json
                else f"replayed {result.messages} messages up to log position {result.position}: {document['state']!r}"
            )
            return
        audit = replay_job.audit_snapshot(
            spark,
            archive_dir,
            cluster_dir,
            apply,
            initial,
            load_snapshot,
            view=view,
            service_id=service_id,
            max_position=position,
            resume=resume,
        )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "matches": audit.matches,
                    "snapshot_recording_id": audit.snapshot.recording_id,
                    "log_position": audit.snapshot.log_position,
                    "messages": audit.messages,
                    "snapshot_state": audit.snapshot_state,
                    "replayed_state": audit.replayed_state,
                },
                default=_jsonable,
            )
        )
    else:
        click.echo(audit.describe())
    if not audit.matches:
        sys.exit(EXIT_PROBLEM)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return repr(value)

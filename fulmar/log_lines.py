"""How a node's processes write their log lines: plain text (the default) or
JSON, one object per line.

A process's log is what it writes to stdout and stderr (``cluster-node
start`` sends both to ``<log_dir>/<process>.log``): its readiness line, the
consensus module's and the backup's events (``stamped``), errors, a
traceback.  The plain form is what the call sites print, unchanged.  The JSON
form is made here and nowhere else: ``configure("json")`` replaces
``sys.stdout`` and ``sys.stderr`` with writers that turn each line into one
object::

    {"time": "2026-11-27T06:52:29.190Z", "process": "consensus module", "member": 0,
     "level": "info", "event": "election CANDIDATE_BALLOT -> LEADER_LOG_REPLICATION: unanimous vote",
     "fields": {"pid": 24497}}

``level`` is ``error`` for what goes to stderr and for events that report
an error, else ``info``; ``fields`` holds the writing process's pid, the
stream for stderr, and what a caller adds (the supervisor's header line: who
started the process and with which arguments).  A stack dump asked for with
SIGUSR1 is the exception: faulthandler writes it to the file descriptor as
it is.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

PLAIN = "plain"
JSON = "json"
LOG_FORMATS = (PLAIN, JSON)
LOG_FORMAT_ENV = "FULMAR_LOG_FORMAT"
# The member a node's process belongs to, for the processes that are not told
# by an option of their own (the driver, the archive); set by cluster-node start.
LOG_MEMBER_ENV = "FULMAR_LOG_MEMBER"
_ERROR_PREFIX = "error: "


class _Identity:
    """Who writes: the process's name and member, the same for every line."""

    def __init__(self) -> None:
        self.process = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        member = os.environ.get(LOG_MEMBER_ENV, "")
        self.member: int | None = int(member) if member.lstrip("-").isdigit() else None


_identity = _Identity()
_format = PLAIN


def iso_time(epoch_s: float) -> str:
    """UTC, to the millisecond: ``2026-11-27T06:52:29.190Z``."""
    moment = datetime.fromtimestamp(epoch_s, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def record(
    event: str, *, process: str, member: int | None, level: str = "info", epoch_s: float | None = None, **fields: Any
) -> str:
    """One JSON log line (without its newline)."""
    return json.dumps(
        {
            "time": iso_time(time.time() if epoch_s is None else epoch_s),
            "process": process,
            "member": member,
            "level": level,
            "event": event,
            "fields": fields,
        }
    )


class JsonLineWriter(io.TextIOBase):
    """A text stream that writes each complete line it is given as a JSON object
    to ``target``; a line in progress waits for its end (print writes the text
    and its newline apart)."""

    def __init__(self, target: TextIO, level: str, stream: str) -> None:
        self.target = target
        self.level = level
        self.stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            *lines, self._pending = self._pending.split("\n")
            self.target.write("".join(self._line(line) + "\n" for line in lines))
            self.target.flush()
        return len(text)

    def _line(self, text: str) -> str:
        level = self.level
        if text.startswith(_ERROR_PREFIX):
            level, text = "error", text[len(_ERROR_PREFIX) :]
        fields: dict[str, Any] = {"pid": os.getpid()}
        if self.stream != "stdout":
            fields["stream"] = self.stream
        return record(text, process=_identity.process, member=_identity.member, level=level, **fields)

    def flush(self) -> None:
        self.target.flush()

    def finish(self) -> None:
        """Write a last line that never got its newline (at exit)."""
        if self._pending:
            self.write("\n")

    def fileno(self) -> int:
        return self.target.fileno()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", None) or "utf-8"


def configure(log_format: str, process: str | None = None) -> None:
    """Set this process's log form; ``json`` replaces stdout and stderr with
    JSON line writers (once).  ``process``: its name until ``identify``."""
    global _format
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: one of {', '.join(LOG_FORMATS)}")
    if process is not None:
        _identity.process = process
    if log_format == JSON and _format != JSON:
        out, err = JsonLineWriter(sys.stdout, "info", "stdout"), JsonLineWriter(sys.stderr, "error", "stderr")
        sys.stdout, sys.stderr = out, err
        atexit.register(out.finish)
        atexit.register(err.finish)
    _format = log_format


def identify(process: str, member: int | None = None) -> None:
    """The name and member this process's lines carry (from its options)."""
    _identity.process = process
    if member is not None:
        _identity.member = member


def log_format() -> str:
    return _format


def event_text(line: str) -> str:
    """The text of a log line: a JSON line's event, any other line as it is."""
    if line.startswith("{"):
        try:
            event = json.loads(line).get("event")
        except (ValueError, AttributeError):
            return line
        if isinstance(event, str):
            return event
    return line


def stamped(who: str, text: str) -> None:
    """An event of a long-running process (the consensus module's elections,
    the backup's steps).  Plain: ``HH:MM:SS.mmm who: text``, local time to the
    millisecond (a failover's steps take tens of them); JSON: the event alone,
    the time in its own key."""
    now = time.time()
    if _format == JSON:
        print(text, flush=True)  # the writer adds the time, the process and its member
        return
    stamp = f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"
    print(f"{stamp} {who}: {text}", file=sys.stdout, flush=True)

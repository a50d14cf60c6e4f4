"""What the service container does when the user's service raises.

Every member applies the same committed log, so a message whose handler
raises raises on every member, at the same log position.  By default
(``on_service_error = "continue"``) the container does what Aeron's does: the
exception goes to its error handler, which writes the whole traceback to the
service's log (stderr) and the distinct error log of its mark file (which
``cluster-tool errors`` reads), counts it in the container's error counter,
and the container goes on with the next message.  Every member then skips
the same message, so one bad request costs one request, not the cluster.

``stop`` keeps the fail-stop: the service fails at that log position (its
node then stops, and a restart replays the message and fails again).

Some failures stop the service whatever the setting, since going on would
leave this member different from the others: ``on_start`` (the service did
not start, or did not load its snapshot: its state is not the one the log
continues from) and ``on_take_snapshot`` (a snapshot without all of the state
would be loaded later as if it were whole).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from fulmar.errors import FulmarError
from fulmar.retry import DistinctErrorPrinter

ON_SERVICE_ERROR_CONTINUE = "continue"
ON_SERVICE_ERROR_STOP = "stop"
ON_SERVICE_ERROR_CHOICES = (ON_SERVICE_ERROR_CONTINUE, ON_SERVICE_ERROR_STOP)


class ServiceFailedError(FulmarError):
    """The user's service raised where the container cannot go on, or was told not to."""


def service_traceback(error: BaseException) -> str:
    """The exception's traceback from the service's callback down.

    The container's own frame, where it was caught, is left out: the text is
    then the same whichever of the container's paths delivered the message,
    so the distinct error log counts a repeat as the same error."""
    frames = error.__traceback__
    return "".join(
        traceback.format_exception(type(error), error, frames.tb_next if frames is not None else None)
    ).rstrip("\n")


def _write_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # sys.stderr at the time: log_lines may have replaced it


class ServiceErrorHandler:
    """Takes every exception of the user's service's callbacks.

    ``record_error`` records a text in the distinct error log (counted by the
    container); ``write`` is the service's log.  The log gets each distinct
    error's traceback once, and a line for every occurrence (the log position
    it happened at and how often so far), or, for ``do_background_work``,
    which runs every duty cycle, for the 1st, 2nd, 4th, 8th, ... occurrence.
    """

    def __init__(
        self,
        service_id: int,
        on_service_error: str,
        record_error: Callable[[str], object],
        write: Callable[[str], object] = _write_stderr,
    ) -> None:
        if on_service_error not in ON_SERVICE_ERROR_CHOICES:
            raise ValueError(
                f"on_service_error {on_service_error!r}: expected one of {', '.join(ON_SERVICE_ERROR_CHOICES)}"
            )
        self.service_id = service_id
        self.on_service_error = on_service_error
        self._record_error = record_error
        self._write = write
        # Writes each distinct error's traceback once and counts its repeats
        # (memory bounded: a stream of ever-different errors forgets the oldest).
        self._tracebacks = DistinctErrorPrinter(write)

    def on_callback_error(self, callback: str, error: Exception, log_position: int) -> None:
        """``callback`` of the service raised while the container was at
        ``log_position``: with ``continue``, written, counted and returned
        from (the caller goes on); with ``stop``, ``ServiceFailedError``."""
        if self.on_service_error == ON_SERVICE_ERROR_STOP:
            self.fail(callback, error, log_position, f"on-service-error {ON_SERVICE_ERROR_STOP}")
        # No log position in the recorded text: a repeat is the same text, which
        # the distinct error log counts (and dates) instead of storing it again.
        text = (
            f"service {self.service_id}: {callback} raised; the container went on "
            f"(on-service-error {ON_SERVICE_ERROR_CONTINUE}):\n{service_traceback(error)}"
        )
        self._record_error(text)
        self._tracebacks(text)
        count = self._tracebacks.count(text)
        if callback != "do_background_work" or count & (count - 1) == 0:
            self._write(
                f"service {self.service_id}: {callback} raised at log position {log_position} "
                f"({count} time{'' if count == 1 else 's'} so far): {_one_line(error)}"
            )

    def fail(self, callback: str, error: Exception, log_position: int, why: str) -> NoReturn:
        """Stop the service: the traceback written and recorded, then ``ServiceFailedError``."""
        text = f"service {self.service_id} failed at log position {log_position}: {callback} raised ({why})"
        self._record_error(f"{text}:\n{service_traceback(error)}")
        self._write(f"{text}:\n{service_traceback(error)}")
        raise ServiceFailedError(f"{text}: {_one_line(error)}") from error


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"

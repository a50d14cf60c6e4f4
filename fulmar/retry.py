"""Trying again what failed, without a hot loop or a flood of log lines.

A request to the media driver or the archive can fail for a while and then
succeed: a UDP port still held by a dead process's registration until the
driver lets it go, an archive that is restarting.  A duty cycle that retries
such a request on every cycle spins (thousands of tries a second) and, if it
prints each failure, floods its log.  Three small pieces, used together or
alone:

* :class:`RetryBackoff`: when the next try is due, exponential with a cap,
  on the caller's clock (``now_ns`` is passed in: no hidden clock, no sleep);
* :class:`DistinctErrorPrinter`: says each distinct error text once and
  counts the repeats (the cnc/mark-file distinct error log keeps the counts
  and timestamps of every occurrence; a console line per repeat says nothing
  more);
* :class:`Retry`: one request tried again with a back-off, its failures
  reported through a printer, and one line when it finally succeeds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from fulmar.errors import FulmarError

T = TypeVar("T")

DEFAULT_INITIAL_BACKOFF_NS = 1_000_000  # 1 ms: a port freed a moment later is taken at once
DEFAULT_MAX_BACKOFF_NS = 1_000_000_000  # 1 s: a request failing for long costs one try a second


class RetryBackoff:
    """When a failed request may be tried again: after ``initial_ns``, then
    doubling after each further failure up to ``max_ns``; back to immediate
    after a success.  Time is the caller's (``now_ns`` of its duty cycle)."""

    __slots__ = ("initial_ns", "max_ns", "failures", "first_failure_ns", "next_attempt_ns")

    def __init__(self, initial_ns: int = DEFAULT_INITIAL_BACKOFF_NS, max_ns: int = DEFAULT_MAX_BACKOFF_NS) -> None:
        if initial_ns <= 0 or max_ns < initial_ns:
            raise ValueError(f"back-off needs 0 < initial_ns <= max_ns, not {initial_ns} and {max_ns}")
        self.initial_ns = initial_ns
        self.max_ns = max_ns
        self.failures = 0
        self.first_failure_ns = 0
        self.next_attempt_ns = 0

    @property
    def is_failing(self) -> bool:
        return self.failures > 0

    def may_attempt(self, now_ns: int) -> bool:
        """True when no back-off is running at ``now_ns``."""
        return self.failures == 0 or now_ns >= self.next_attempt_ns

    def delay_ns(self) -> int:
        """The wait that follows the next failure."""
        # Shift, capped before it grows: a request failing for days does not
        # build a huge integer.
        if self.failures >= 62 or self.initial_ns << self.failures >= self.max_ns:
            return self.max_ns
        return self.initial_ns << self.failures

    def on_failure(self, now_ns: int) -> int:
        """A try failed at ``now_ns``: the next one waits; returns the wait in ns."""
        delay = self.delay_ns()
        if self.failures == 0:
            self.first_failure_ns = now_ns
        self.failures += 1
        self.next_attempt_ns = now_ns + delay
        return delay

    def on_success(self) -> None:
        self.failures = 0
        self.first_failure_ns = 0
        self.next_attempt_ns = 0

    def __repr__(self) -> str:
        return f"RetryBackoff(failures={self.failures}, next_attempt_ns={self.next_attempt_ns})"


class DistinctErrorPrinter:
    """Passes each distinct text to ``emit`` once; later occurrences of the
    same text are only counted (``count``).  At most ``max_distinct`` texts
    are remembered, the least recently seen forgotten first, so a stream of
    ever-different texts costs bounded memory (each is said once, as new)."""

    def __init__(self, emit: Callable[[str], object], max_distinct: int = 1024) -> None:
        if max_distinct <= 0:
            raise ValueError(f"max_distinct must be positive, not {max_distinct}")
        self._emit = emit
        self._max_distinct = max_distinct
        self._counts: OrderedDict[str, int] = OrderedDict()

    def __call__(self, text: str) -> bool:
        """Report ``text``; True when it was emitted (its first occurrence)."""
        counts = self._counts
        seen = counts.get(text)
        if seen is not None:
            counts[text] = seen + 1
            counts.move_to_end(text)
            return False
        if len(counts) >= self._max_distinct:
            counts.popitem(last=False)
        counts[text] = 1
        self._emit(text)
        return True

    def count(self, text: str) -> int:
        """How often ``text`` was reported (0 if never, or forgotten)."""
        return self._counts.get(text, 0)

    def forget(self, text: str) -> None:
        """The condition behind ``text`` is over: say it again if it comes back."""
        self._counts.pop(text, None)


class Retry:
    """A request that may fail (a ``FulmarError``) and is tried again later.

    ``attempt(now_ns, action)`` runs ``action`` unless a back-off is running
    and returns its result, or None when it was not due or failed.  A failure
    goes to ``report_error`` as ``"<what>: <ErrorType>: <message>"`` (a
    stable text, so a distinct-error printer says it once) and starts or
    lengthens the back-off; the first success after failures goes to
    ``report_recovery`` with how many tries it took.  ``action`` must return
    something other than None when it succeeds (``True`` will do).
    """

    __slots__ = ("what", "backoff", "_report_error", "_report_recovery", "last_error")

    def __init__(
        self,
        what: str,
        report_error: Callable[[str], object],
        report_recovery: Callable[[str], object] | None = None,
        backoff: RetryBackoff | None = None,
    ) -> None:
        self.what = what
        self.backoff = backoff if backoff is not None else RetryBackoff()
        self._report_error = report_error
        self._report_recovery = report_recovery
        self.last_error: str | None = None

    @property
    def is_failing(self) -> bool:
        return self.backoff.is_failing

    @property
    def failures(self) -> int:
        return self.backoff.failures

    def failing_for_ns(self, now_ns: int) -> int:
        """How long the request has been failing (0 when it is not)."""
        return now_ns - self.backoff.first_failure_ns if self.backoff.is_failing else 0

    def attempt(self, now_ns: int, action: Callable[[], T]) -> T | None:
        backoff = self.backoff
        if not backoff.may_attempt(now_ns):
            return None
        try:
            result = action()
        except FulmarError as error:
            backoff.on_failure(now_ns)
            self.last_error = f"{self.what}: {type(error).__name__}: {error}"
            self._report_error(self.last_error)
            return None
        if backoff.is_failing:
            if self._report_recovery is not None:
                tries = backoff.failures + 1
                seconds = (now_ns - backoff.first_failure_ns) / 1e9
                self._report_recovery(f"{self.what}: done at try {tries}, {seconds:.1f} s after the first failure")
            backoff.on_success()
        self.last_error = None
        return result

    def reset(self) -> None:
        """Start afresh (a new request of the same kind): no back-off, no failure."""
        self.backoff.on_success()
        self.last_error = None

"""The retry pieces (fulmar.retry): exponential back-off with a cap on an
injected clock, one console line per distinct error, and a request retried
with both (issue 18: no hot retry loop, no log flood)."""

from __future__ import annotations

import pytest

from fulmar.archive.client import ArchiveResponseError
from fulmar.archive.protocol import ArchiveErrorCode
from fulmar.errors import FulmarError
from fulmar.retry import DistinctErrorPrinter, Retry, RetryBackoff

MS = 1_000_000


def test_backoff_doubles_from_the_initial_wait_up_to_the_cap_and_resets_on_success() -> None:
    backoff = RetryBackoff(initial_ns=1 * MS, max_ns=10 * MS)
    assert backoff.may_attempt(0) and not backoff.is_failing
    waits = [backoff.on_failure(100 * MS) for _ in range(6)]
    assert waits == [1 * MS, 2 * MS, 4 * MS, 8 * MS, 10 * MS, 10 * MS]
    assert backoff.first_failure_ns == 100 * MS
    assert not backoff.may_attempt(109 * MS) and backoff.may_attempt(110 * MS)
    backoff.on_success()
    assert backoff.may_attempt(0) and backoff.failures == 0
    assert backoff.on_failure(200 * MS) == 1 * MS


def test_backoff_of_a_request_failing_for_ages_stays_at_the_cap() -> None:
    backoff = RetryBackoff(initial_ns=1, max_ns=1_000)
    for now in range(10_000):
        backoff.on_failure(now)
    assert backoff.delay_ns() == 1_000


@pytest.mark.parametrize("initial, cap", [(0, 10), (-1, 10), (10, 5)])
def test_backoff_refuses_impossible_settings(initial: int, cap: int) -> None:
    with pytest.raises(ValueError):
        RetryBackoff(initial, cap)


def test_printer_says_each_distinct_text_once_and_counts_repeats() -> None:
    said: list[str] = []
    printer = DistinctErrorPrinter(said.append)
    assert printer("port in use") is True
    for _ in range(10_000):
        assert printer("port in use") is False
    assert printer("archive gone") is True
    assert said == ["port in use", "archive gone"]
    assert printer.count("port in use") == 10_001
    printer.forget("port in use")
    assert printer("port in use") is True
    assert said[-1] == "port in use"


def test_printer_memory_is_bounded_by_forgetting_the_least_recently_seen() -> None:
    said: list[str] = []
    printer = DistinctErrorPrinter(said.append, max_distinct=2)
    for text in ["a", "b", "a", "c", "a", "b"]:
        printer(text)
    # "b" was the least recently seen when "c" came, so it is said again.
    assert said == ["a", "b", "c", "b"]


def test_retry_tries_only_when_due_reports_once_per_text_and_says_when_it_recovers() -> None:
    errors: list[str] = []
    recoveries: list[str] = []
    printer = DistinctErrorPrinter(errors.append)
    retry = Retry(
        "adding the live log destination", printer, recoveries.append, RetryBackoff(initial_ns=1 * MS, max_ns=100 * MS)
    )
    calls: list[int] = []
    free_at_ns = 500 * MS

    def bind(now_ns: int) -> bool:
        calls.append(now_ns)
        if now_ns < free_at_ns:
            raise FulmarError("cannot bind UDP socket to 127.0.0.1:9000: [Errno 98] Address already in use")
        return True

    done_at_ns = None
    for now_ns in range(0, 1_000 * MS, 100_000):  # a duty cycle every 100 us for a second
        if retry.attempt(now_ns, lambda: bind(now_ns)):
            done_at_ns = now_ns
            break  # (a caller stops asking once it has what it asked for)
    # Not five thousand tries: 1, 2, 4, ... ms apart, at most 100 ms apart.
    assert len(calls) <= 15, calls
    assert done_at_ns is not None and free_at_ns <= done_at_ns <= free_at_ns + 100 * MS
    assert calls[1] - calls[0] >= 1 * MS
    assert errors == [
        "adding the live log destination: FulmarError: cannot bind UDP socket to 127.0.0.1:9000: "
        "[Errno 98] Address already in use"
    ]
    assert printer.count(errors[0]) == len(calls) - 1
    assert len(recoveries) == 1 and recoveries[0].startswith("adding the live log destination: done at try ")
    assert not retry.is_failing and retry.last_error is None


def test_retry_lets_other_exceptions_through_and_reset_forgets_the_backoff() -> None:
    retry = Retry("x", lambda text: None)

    def broken() -> bool:
        raise KeyError("a bug, not a refused request")

    with pytest.raises(KeyError):
        retry.attempt(0, broken)

    def refused() -> bool:
        raise FulmarError("no")

    assert retry.attempt(0, refused) is None
    assert retry.is_failing and retry.failing_for_ns(5 * MS) == 5 * MS
    assert retry.attempt(0, lambda: True) is None  # backing off
    retry.reset()
    assert retry.attempt(0, lambda: True) is True


def test_an_archive_refusal_retried_is_one_distinct_error() -> None:
    """The archive's answer to each retry has its own correlation id: kept on
    the error, not in its text, so the printer says the refusal once (a
    truncate retried while a replay held the recording flooded the log)."""
    said: list[str] = []
    printer = DistinctErrorPrinter(said.append)
    for correlation_id in range(261, 361):
        error = ArchiveResponseError(
            ArchiveErrorCode.ACTIVE_RECORDING, correlation_id, "cannot truncate recording with active replay 1"
        )
        assert error.correlation_id == correlation_id
        printer(f"{type(error).__name__}: {error}")
    assert said == [
        "ArchiveResponseError: archive error ACTIVE_RECORDING: cannot truncate recording with active replay 1"
    ]

"""Aeron's async add of a publication in the transport client: the same
AddPublication command, but the caller does not wait for the driver (the
consensus module adds every session's egress this way)."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from fulmar.aeron import Aeron, ClientClosedError, RegistrationError, UnknownRegistrationError
from fulmar.codecs.generated import driver as protocol
from fulmar.driver.counters import SystemCounter
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.publication import Publication
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

CHANNEL = "aeron:ipc?term-length=64k"
STREAM = 1001
MS = 1_000_000
ACTIVE_PUBLICATIONS = int(SystemCounter.ACTIVE_PUBLICATIONS)


def collect(aeron: Aeron, registration_id: int, timeout_s: float = 10) -> Publication:
    def ready() -> Publication | None:
        aeron.do_work()
        return aeron.get_publication(registration_id)

    publication: Publication = wait_for(ready, timeout_s, f"publication {registration_id}")
    return publication


def test_async_add_returns_at_once_and_the_publication_comes_later(start_driver: Any) -> None:
    driver = start_driver()
    with driver.connect(use_conductor_thread=False) as aeron:
        subscription = aeron.add_subscription(CHANNEL, STREAM)
        registration_id = aeron.async_add_publication(CHANNEL, STREAM)
        publication = collect(aeron, registration_id)
        assert publication.registration_id == registration_id and publication.stream_id == STREAM
        assert aeron.get_publication(registration_id) is publication  # asked again: the same one
        wait_for(lambda: publication.offer(b"hello") > 0, 10, "the offer")
        received: list[bytes] = []
        assembler = FragmentAssembler(
            lambda buffer, offset, length, header: received.append(bytes(buffer[offset : offset + length]))
        )
        wait_for(lambda: subscription.poll(assembler.on_fragment, 10) or received, 10, "the message")
        assert received == [b"hello"]


def test_async_add_does_not_wait_for_a_stalled_driver(start_driver: Any) -> None:
    driver = start_driver()
    with driver.connect(use_conductor_thread=False) as aeron:
        driver.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            registration_id = aeron.async_add_publication(CHANNEL, STREAM)
            assert aeron.get_publication(registration_id) is None  # pending: no answer yet
            assert time.monotonic() - started < 0.5
        finally:
            driver.process.send_signal(signal.SIGCONT)
        assert isinstance(collect(aeron, registration_id), Publication)


def test_the_drivers_refusal_is_raised_once_by_get_publication(start_driver: Any) -> None:
    driver = start_driver()
    with driver.connect(use_conductor_thread=False) as aeron:
        registration_id = aeron.async_add_publication("aeron:ipc?term-length=3000", STREAM)
        deadline = time.monotonic() + 10
        with pytest.raises(RegistrationError, match="term-length") as caught:
            while aeron.get_publication(registration_id) is None:
                assert time.monotonic() < deadline, "no answer from the driver"
                aeron.do_work()  # invoker mode: the answer is received here
                time.sleep(0.001)
        assert caught.value.code == protocol.ErrorCode.INVALID_CHANNEL
        with pytest.raises(UnknownRegistrationError):
            aeron.get_publication(registration_id)  # the failure was handed over: the id is gone
        with pytest.raises(UnknownRegistrationError):
            aeron.get_publication(123456789)  # never asked for


def test_a_closed_client_refuses_async_adds(start_driver: Any) -> None:
    driver = start_driver()
    aeron = driver.connect(use_conductor_thread=False)
    registration_id = aeron.async_add_publication(CHANNEL, STREAM)
    aeron.close()
    with pytest.raises(ClientClosedError):
        aeron.async_add_publication(CHANNEL, STREAM)
    with pytest.raises(ClientClosedError):
        aeron.get_publication(registration_id)
    aeron.async_remove_publication(registration_id)  # cleanup after close: nothing to do, no error


def test_async_remove_before_and_after_the_driver_answered(start_driver: Any) -> None:
    driver = start_driver(publication_linger_timeout_ns=50 * MS)
    with driver.connect(use_conductor_thread=False) as aeron:
        reader = aeron.counters_reader
        baseline = reader.counter_value(ACTIVE_PUBLICATIONS)

        # Let go before the driver answered: its answer removes it again, nothing is mapped.
        early = aeron.async_add_publication(CHANNEL, STREAM)
        aeron.async_remove_publication(early)
        with pytest.raises(UnknownRegistrationError):
            aeron.get_publication(early)

        def driver_has(count: int) -> bool:
            aeron.do_work()  # the driver's answer to the early one arrives here
            return not aeron.conductor._pending and bool(reader.counter_value(ACTIVE_PUBLICATIONS) == count)

        wait_for(lambda: driver_has(baseline), 10, "the driver to drop the publication let go early")
        assert not aeron.conductor._log_buffers  # its log was never mapped

        # Let go once added: closed here at once, removed by the driver soon after.
        late = aeron.async_add_publication(CHANNEL, STREAM)
        publication = collect(aeron, late)
        assert reader.counter_value(ACTIVE_PUBLICATIONS) == baseline + 1
        aeron.async_remove_publication(late)
        assert publication.is_closed
        wait_for(lambda: driver_has(baseline), 10, "the driver to drop the publication")
        assert not aeron.conductor._log_buffers

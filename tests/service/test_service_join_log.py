"""A service container told to join a log its consensus module has already
closed (an election began between the JoinLog and the service's
subscription) survives it: the driver's refusal is recorded, the join is
tried again after a back-off, and the module's next JoinLog is joined; so is
a JoinLog that follows one whose log ended before its image came.

Before, the RegistrationError ended the service process, and with it the node.
A real media driver and this process as both the module (sending JoinLog on
the service stream) and the service's agent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fulmar.aeron import Aeron
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.service.agent import ClusteredServiceAgent
from fulmar.service.context import ServiceContext
from fulmar.service.samples import EchoService
from support.driver import DriverProcess, new_driver_dir, remove_driver_dir, wait_for
from support.service_log import LOG_STREAM_ID, join_log

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system


@pytest.fixture
def aeron() -> Iterator[Aeron]:
    directory = new_driver_dir()
    driver = DriverProcess(directory)
    try:
        client = driver.connect()
        try:
            yield client
        finally:
            client.close()
    finally:
        driver.stop()
        remove_driver_dir(directory)


def test_a_join_refused_by_the_driver_is_retried_and_the_next_join_log_is_followed(
    aeron: Aeron, tmp_path: Path
) -> None:
    context = ServiceContext(cluster_dir=tmp_path)
    errors: list[str] = []
    agent = ClusteredServiceAgent(context, aeron, None, EchoService(), errors.append)  # type: ignore[arg-type]
    commit = aeron.add_counter(protocol.COMMIT_POSITION_TYPE_ID, "a test's commit position")
    agent._commit_counter_id = commit.id
    to_service = aeron.add_exclusive_publication(context.control_channel, context.service_stream_id)
    from_service = aeron.add_subscription(context.control_channel, context.consensus_module_stream_id)
    wait_for(lambda: to_service.is_connected, 10, "the service stream to connect")

    # The module's log subscription (tag 9999) is gone already.
    join_log(to_service, "aeron:udp?tags=9999", 77)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # several duty cycles: every try is refused
        agent.do_work(time.monotonic_ns())
    assert errors and all("joining the log at position 0" in e and "tag" in e for e in errors), errors
    tries = len(errors)
    assert 1 <= tries <= 12, f"{tries} tries in 0.5 s: not backing off"  # 1, 2, 4, ... ms, not every cycle
    assert agent._log_image is None

    # A JoinLog whose subscription is added but whose image never comes (that
    # log ended first), then the next one: the pending subscription is let go.
    join_log(to_service, "aeron:ipc?term-length=64k|session-id=5", 5)
    wait_for(
        lambda: agent.do_work(time.monotonic_ns()) >= 0 and agent._log_subscription is not None,
        10,
        "the service to subscribe to the log that never comes",
    )

    # The module's next JoinLog names a log that exists: it is joined.
    log = aeron.add_exclusive_publication("aeron:ipc?term-length=64k", LOG_STREAM_ID)
    join_log(to_service, f"aeron:ipc?term-length=64k|session-id={log.session_id}", log.session_id)
    wait_for(
        lambda: agent.do_work(time.monotonic_ns()) >= 0 and agent._log_image is not None,
        10,
        "the service to join the next log",
    )
    assert agent._log_image is not None and agent._log_image.session_id == log.session_id
    acks: list[object] = []
    wait_for(
        lambda: (
            from_service.poll(lambda b, o, n, h: acks.append(codecs.decode(b, o, n)), 10) >= 0
            and any(isinstance(a, codecs.ServiceAckDecoder) for a in acks)
        ),
        10,
        "the service's ack of the join",
    )


def test_a_service_sees_the_drivers_news_before_it_sleeps(tmp_path: Path) -> None:
    """The container runs the service's client conductor itself: what the
    driver broadcast (the log's image to join) shows in ``has_work``, so the
    container reads it in its next cycle rather than at its next slow tick."""
    directory = new_driver_dir()
    driver = DriverProcess(directory)
    try:
        with Aeron.connect(directory, use_conductor_thread=False) as aeron, Aeron.connect(directory) as other:
            errors: list[str] = []
            agent = ClusteredServiceAgent(
                ServiceContext(cluster_dir=tmp_path),
                aeron,
                None,  # type: ignore[arg-type]  # no archive: this service takes no snapshot
                EchoService(),
                errors.append,
            )
            while aeron.do_work() > 0:
                pass
            assert not agent.has_work()
            other.add_publication("aeron:ipc", 4243)  # its response goes out on the broadcast to every client
            wait_for(agent.has_work, 10, "the service to see the driver's news")
            while aeron.conductor.has_driver_news():
                aeron.do_work()
            assert not agent.has_work()
            assert not errors, errors
    finally:
        driver.stop()
        remove_driver_dir(directory)

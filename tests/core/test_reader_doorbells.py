"""Reader doorbells (fulmar.reader_doorbells): a writer wakes the processes
that read what it wrote, and nobody else.

A doorbell "has a sleeper" here when its waiter count is raised by
``prepare()``: a ring then bumps its sequence (and makes the futex call);
a doorbell nobody prepared is left alone.  So "woken" is "sequence moved".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fulmar._native import ffi
from fulmar.aeron import Aeron
from fulmar.buffers import AtomicBuffer
from fulmar.counters import COUNTER_LENGTH, CountersManager
from fulmar.idle import Doorbell
from fulmar.log_writer import BufferClaim, ExclusiveLogWriter
from fulmar.logbuffer import LogBuffers
from fulmar.reader_doorbells import (
    CLIENT_DOORBELL_TYPE_ID,
    COUNTER_WATCHERS_CAPACITY,
    LOG_READERS_CAPACITY,
    CounterWatch,
    LogReaders,
    client_doorbell,
    log_readers_in_table,
    ring_counter_watchers,
    ring_doorbells,
    ring_log_readers,
)
from support.doorbells import doorbell_of, free_udp_port, offer, wait_for_table
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

COUNTERS = 64


def counters_values() -> AtomicBuffer:
    return AtomicBuffer(bytearray(COUNTERS * COUNTER_LENGTH))


def sleeping(values: AtomicBuffer, ids: list[int]) -> dict[int, int]:
    """Register a waiter on each doorbell (as an agent about to sleep); their sequences now."""
    tokens = {}
    for doorbell_id in ids:
        tokens[doorbell_id] = client_doorbell(values, doorbell_id).prepare()
    return tokens


def woken(values: AtomicBuffer, tokens: dict[int, int]) -> set[int]:
    return {
        doorbell_id for doorbell_id, token in tokens.items() if client_doorbell(values, doorbell_id).sequence != token
    }


def new_log(tmp_path: Path) -> LogBuffers:
    return LogBuffers.create(tmp_path / "1.logbuffer", 64 * 1024, session_id=7, stream_id=9)


def test_a_log_ring_wakes_the_readers_its_table_names_and_no_one_else(tmp_path: Path) -> None:
    values = counters_values()
    log = new_log(tmp_path)
    try:
        readers = LogReaders(log, values)
        readers.update([3, 5, 3])  # one client with two subscriptions counts once
        assert log_readers_in_table(log) == ([3, 5], False)
        tokens = sleeping(values, [3, 4, 5])
        assert not ring_log_readers(log, values)
        assert woken(values, tokens) == {3, 5}
        readers.update([4])
        tokens = sleeping(values, [3, 4, 5])
        ring_log_readers(log, values)
        assert woken(values, tokens) == {4}
    finally:
        log.close()


def test_more_readers_than_the_table_holds_are_relayed_by_the_driver(tmp_path: Path) -> None:
    values = counters_values()
    log = new_log(tmp_path)
    try:
        readers = LogReaders(log, values)
        ids = list(range(1, LOG_READERS_CAPACITY + 4))
        readers.update(ids)
        table, relay = log_readers_in_table(log)
        assert table == ids[:LOG_READERS_CAPACITY] and relay
        tokens = sleeping(values, ids)
        assert ring_log_readers(log, values)  # the writer must ring the driver too
        assert woken(values, tokens) == set(ids[:LOG_READERS_CAPACITY])
        beyond = readers.beyond_table
        assert beyond == ids[LOG_READERS_CAPACITY:]
        ring_doorbells(values, ffi.new("int32_t[]", beyond), len(beyond))  # what the driver's data plane does
        assert woken(values, tokens) == set(ids)
        readers.update(ids[:2])
        assert log_readers_in_table(log) == (ids[:2], False) and not readers.relay
    finally:
        log.close()


def test_ids_outside_the_counters_are_skipped(tmp_path: Path) -> None:
    # The table is in memory other processes write: a bad id must not ring
    # (or write) outside the counters buffer.
    values = counters_values()
    log = new_log(tmp_path)
    try:
        LogReaders(log, values).update([-1, COUNTERS, 2**30, 2])
        tokens = sleeping(values, [2])
        ring_log_readers(log, values)
        assert woken(values, tokens) == {2}
    finally:
        log.close()


def test_a_counter_rings_its_watchers_and_a_watch_is_taken_back() -> None:
    values = counters_values()
    first, second = CounterWatch(values, 3), CounterWatch(values, 4)
    assert first.watch(10) and first.watch(10) and second.watch(10)  # a repeated watch takes one slot
    assert first.watchers(10) == [3, 4]
    tokens = sleeping(values, [3, 4, 5])
    assert ring_counter_watchers(values, 10) == 2
    assert woken(values, tokens) == {3, 4}
    first.unwatch(10)
    tokens = sleeping(values, [3, 4])
    ring_counter_watchers(values, 10)
    assert woken(values, tokens) == {4}
    assert ring_counter_watchers(values, 11) == 0  # nobody watches it


def test_a_counter_has_a_bounded_number_of_watchers() -> None:
    values = counters_values()
    for doorbell_id in range(COUNTER_WATCHERS_CAPACITY):
        assert CounterWatch(values, doorbell_id).watch(20)
    assert not CounterWatch(values, 40).watch(20)  # full: that watcher falls back on its idle timeout
    CounterWatch(values, 0).unwatch(20)
    assert CounterWatch(values, 40).watch(20)


def test_a_reused_counter_starts_with_no_watchers() -> None:
    values = counters_values()
    metadata = AtomicBuffer(bytearray(COUNTERS * 512))
    counters = CountersManager(metadata, values, 0, lambda: 0)
    counter_id = counters.allocate("rec-pos: 1", 100)
    CounterWatch(values, 5).watch(counter_id)
    counters.free(counter_id)
    assert counters.allocate("commit-pos", 203) == counter_id
    assert CounterWatch(values, 5).watchers(counter_id) == []


def test_each_append_and_each_claim_ring_the_readers_and_the_relay(tmp_path: Path) -> None:
    values = counters_values()
    log = new_log(tmp_path)
    relay = Doorbell(AtomicBuffer(bytearray(8)))
    try:
        readers = LogReaders(log, values)
        readers.update([1, 2])
        writer = ExclusiveLogWriter(log, readers=values, relay_doorbell=relay)
        tokens = sleeping(values, [1, 2, 3])
        relay_token = relay.prepare()
        assert writer.offer(b"hello") > 0
        assert woken(values, tokens) == {1, 2}
        assert relay.sequence == relay_token  # no relay while the table holds every reader
        readers.update(list(range(1, LOG_READERS_CAPACITY + 2)))
        tokens = sleeping(values, [3])
        claim = BufferClaim(log)
        assert writer.try_claim(8, claim) > 0
        assert woken(values, tokens) == set()  # nothing is published until the commit
        claim.commit()
        assert woken(values, tokens) == {3}
        assert relay.sequence != relay_token
    finally:
        log.close()


# ------------------------------------------------------------------ through a media driver


def test_a_publication_wakes_its_subscribers_clients_only(start_driver) -> None:
    driver = start_driver()
    with (
        Aeron.connect(driver.directory) as reader,
        Aeron.connect(driver.directory) as bystander,
        Aeron.connect(driver.directory) as writer,
    ):
        for client in (reader, bystander, writer):
            doorbell_id = client.conductor.doorbell_id
            assert doorbell_id is not None
            assert client.counters_reader.counter_type_id(doorbell_id) == CLIENT_DOORBELL_TYPE_ID
        subscription = reader.add_subscription("aeron:ipc", 11)
        bystander.add_subscription("aeron:ipc", 12)
        publication = writer.add_publication("aeron:ipc", 11)
        wait_for(lambda: subscription.images and publication.is_connected, 10, "the IPC image")
        wait_for_table(subscription.images[0].log, [doorbell_of(reader)])
        reader_doorbell, bystander_doorbell = reader.conductor.data_doorbell, bystander.conductor.data_doorbell
        reader_token, bystander_token = reader_doorbell.prepare(), bystander_doorbell.prepare()
        try:
            offer(publication, b"ping")
            assert reader_doorbell.sequence != reader_token
            assert bystander_doorbell.sequence == bystander_token
        finally:
            reader_doorbell.cancel()
            bystander_doorbell.cancel()


def test_udp_data_wakes_the_images_subscribers_only(start_driver) -> None:
    driver = start_driver()
    channel, elsewhere = (f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}" for _ in range(2))
    with (
        Aeron.connect(driver.directory) as reader,
        Aeron.connect(driver.directory) as bystander,
        Aeron.connect(driver.directory) as writer,
    ):
        subscription = reader.add_subscription(channel, 21)
        bystander.add_subscription(elsewhere, 22)
        publication = writer.add_publication(channel, 21)
        wait_for(lambda: subscription.images and publication.is_connected, 10, "the UDP image")
        reader_doorbell, bystander_doorbell = reader.conductor.data_doorbell, bystander.conductor.data_doorbell
        reader_token, bystander_token = reader_doorbell.prepare(), bystander_doorbell.prepare()
        try:
            offer(publication, b"ping")
            wait_for(lambda: reader_doorbell.sequence != reader_token, 10, "the reader's doorbell to ring")
            assert bystander_doorbell.sequence == bystander_token
        finally:
            reader_doorbell.cancel()
            bystander_doorbell.cancel()


def test_a_closed_client_leaves_the_reader_tables(start_driver) -> None:
    driver = start_driver()
    with Aeron.connect(driver.directory) as writer, Aeron.connect(driver.directory) as stays:
        writer.add_publication("aeron:ipc", 31)
        staying = stays.add_subscription("aeron:ipc", 31)
        leaving_client = Aeron.connect(driver.directory)
        leaving = leaving_client.add_subscription("aeron:ipc", 31)
        wait_for(lambda: staying.images and leaving.images, 10, "the IPC images")
        log = staying.images[0].log
        wait_for_table(log, [doorbell_of(stays), doorbell_of(leaving_client)])
        leaving_client.close()
        wait_for_table(log, [doorbell_of(stays)])


def test_a_subscription_with_wake_on_data_false_is_read_but_not_rung(start_driver) -> None:
    """wake-on-data=false (a cluster service on its log, woken by commit-pos
    instead): its client is left out of the log's reader table, over IPC and
    for a UDP image, and still reads everything; the other reader is rung."""
    driver = start_driver()
    udp = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with (
        Aeron.connect(driver.directory) as rung,
        Aeron.connect(driver.directory) as quiet,
        Aeron.connect(driver.directory) as writer,
    ):
        for channel, stream_id in (("aeron:ipc", 41), (udp, 42)):
            woken = rung.add_subscription(channel, stream_id)
            not_woken = quiet.add_subscription(
                f"{channel}{'|' if '?' in channel else '?'}wake-on-data=false", stream_id
            )
            publication = writer.add_publication(channel, stream_id)
            wait_for(
                lambda: woken.images and not_woken.images and publication.is_connected, 10, f"the images of {channel}"
            )
            # One log for both over IPC; over UDP the image's log is shared in the driver.
            wait_for_table(woken.images[0].log, [doorbell_of(rung)])
            rung_doorbell, quiet_doorbell = rung.conductor.data_doorbell, quiet.conductor.data_doorbell
            rung_token, quiet_token = rung_doorbell.prepare(), quiet_doorbell.prepare()
            try:
                offer(publication, b"ping")
                wait_for(lambda: rung_doorbell.sequence != rung_token, 10, "the woken reader's doorbell to ring")
                got: list[bytes] = []
                wait_for(
                    lambda: not_woken.poll(lambda b, o, n, h: got.append(bytes(b[o : o + n])), 10) >= 0 and got,
                    10,
                    f"the quiet reader to read the message of {channel}",
                )
                assert got == [b"ping"]
                assert quiet_doorbell.sequence == quiet_token, f"{channel}: the quiet reader was rung"
            finally:
                rung_doorbell.cancel()
                quiet_doorbell.cancel()


def test_a_deferring_publication_rings_its_readers_once_when_told(start_driver) -> None:
    """Publication.defer_rings (an agent's log and egress): appends wake
    nobody until the client's ring_deferred(), which rings once for all of
    them and then has nothing more to ring; the client's do_work rings too,
    and so does closing the publication, so no append is left unrung."""
    driver = start_driver()
    with Aeron.connect(driver.directory) as reader, Aeron.connect(driver.directory) as writer:
        subscription = reader.add_subscription("aeron:ipc", 41)
        publication = writer.add_publication("aeron:ipc", 41)
        wait_for(lambda: subscription.images and publication.is_connected, 10, "the IPC image")
        wait_for_table(subscription.images[0].log, [doorbell_of(reader)])
        publication.defer_rings()
        doorbell = reader.conductor.data_doorbell
        token = doorbell.prepare()
        try:
            for payload in (b"one", b"two", b"three"):
                offer(publication, payload)
            assert doorbell.sequence == token  # appended, nobody woken yet
            assert writer.ring_deferred() == 1
            assert doorbell.sequence != token
            assert writer.ring_deferred() == 0  # nothing appended since
        finally:
            doorbell.cancel()
        for ring in (writer.do_work, publication.close):
            token = doorbell.prepare()
            try:
                if not publication.is_closed:
                    offer(publication, b"more")
                    assert doorbell.sequence == token
                ring()
                assert doorbell.sequence != token, f"{ring.__name__} did not ring"
            finally:
                doorbell.cancel()
        received: list[bytes] = []
        wait_for(
            lambda: (
                subscription.poll(lambda b, o, n, h: received.append(bytes(b[o : o + n])), 10) >= 0
                and len(received) >= 5
            ),
            10,
            "the five messages",
        )
        assert received == [b"one", b"two", b"three", b"more", b"more"]


def test_an_image_added_by_the_client_conductor_rings_the_clients_own_doorbell(start_driver) -> None:
    """The driver rings a subscriber's doorbell when it sends the image notice;
    with a conductor thread that ring can wake the agent before the image is
    added, and it went back to sleep for its longest wait with the first
    message already there.  Adding the image rings again.  (An invoker-mode
    client makes the order deterministic: the driver's ring is seen, then a
    fresh sleeper, then the conductor's work that adds the image.)"""
    driver = start_driver()
    with (
        Aeron.connect(driver.directory, use_conductor_thread=False) as reader,
        Aeron.connect(driver.directory) as writer,
    ):
        subscription = reader.add_subscription("aeron:ipc", 13)
        doorbell = reader.conductor.data_doorbell
        token = doorbell.prepare()
        try:
            publication = writer.add_publication("aeron:ipc", 13)
            wait_for(lambda: doorbell.sequence != token, 10, "the driver's ring with the image notice")
        finally:
            doorbell.cancel()
        assert not subscription.images  # not yet: this client's conductor has not run
        token = doorbell.prepare()
        try:
            wait_for(lambda: reader.do_work() >= 0 and bool(subscription.images), 10, "the image")
            assert doorbell.sequence != token, "adding the image did not ring the client's doorbell"
        finally:
            doorbell.cancel()
        assert publication.is_connected


def test_an_invoker_client_sees_the_drivers_news_before_it_sleeps(start_driver) -> None:
    """A client without a conductor thread (the consensus module's, the
    services') runs its conductor itself: ``has_driver_news`` tells its agent,
    in its check before sleeping, that the driver broadcast something unread
    (here another client's publication, which links to this one's
    subscription), so the image is added now rather than at the next slow tick."""
    driver = start_driver()
    with (
        Aeron.connect(driver.directory, use_conductor_thread=False) as reader,
        Aeron.connect(driver.directory) as writer,
    ):
        subscription = reader.add_subscription("aeron:ipc", 14)
        while reader.do_work() > 0:
            pass
        assert not reader.conductor.has_driver_news()
        writer.add_publication("aeron:ipc", 14)
        wait_for(reader.conductor.has_driver_news, 10, "the driver's broadcast of the new image")
        assert not subscription.images
        while reader.conductor.has_driver_news():
            reader.do_work()
        assert subscription.images  # read with the news

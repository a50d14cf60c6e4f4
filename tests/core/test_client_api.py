"""The transport client's API against a real media driver process."""

from __future__ import annotations

import time

import pytest

from fulmar.aeron import Aeron, RegistrationError
from fulmar.codecs.generated import driver as protocol
from fulmar.driver.counters import SUBSCRIBER_POSITION_TYPE_ID
from fulmar.log_reader import Header
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, BufferClaim
from fulmar.subscription import ControlledAction
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

CHANNEL = "aeron:ipc?term-length=64k"


def collect(subscription, count: int, timeout_s: float = 10) -> list[bytes]:
    got: list[bytes] = []

    def on_fragment(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        got.append(bytes(buffer[offset : offset + length]))

    wait_for(lambda: subscription.poll(on_fragment, 100) >= 0 and len(got) >= count, timeout_s, f"{count} messages")
    return got


def connected(publication, subscription) -> None:
    """Both ends see each other: the driver linked them and the client has the image."""
    wait_for(lambda: publication.is_connected and subscription.image_count > 0, 5, "the connection")


def offer(publication, data: bytes) -> int:
    deadline = time.monotonic() + 10
    while True:
        result = publication.offer(data)
        if result > 0:
            return result
        assert result in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION), result
        assert time.monotonic() < deadline, "offer kept failing"


def test_concurrent_publications_on_one_stream_share_a_session(aeron: Aeron) -> None:
    first = aeron.add_publication(CHANNEL, 7)
    second = aeron.add_publication(CHANNEL, 7)
    exclusive = aeron.add_exclusive_publication(CHANNEL, 7)
    assert first.session_id == second.session_id != exclusive.session_id
    assert first.original_registration_id == second.original_registration_id
    subscription = aeron.add_subscription(CHANNEL, 7)
    wait_for(lambda: subscription.image_count == 2, 5, "two images (one per session)")
    offer(first, b"one")
    offer(second, b"two")
    offer(exclusive, b"three")
    assert sorted(collect(subscription, 3)) == [b"one", b"three", b"two"]
    # Closing one of the shared pair keeps the stream open for the other.
    first.close()
    assert first.is_closed and offer(second, b"four") > 0
    assert collect(subscription, 1) == [b"four"]


def test_session_id_filter_and_explicit_session(aeron: Aeron) -> None:
    chosen = aeron.add_publication(CHANNEL + "|session-id=4242", 8)
    shared = aeron.add_publication(CHANNEL, 8)  # as in Aeron: shares the stream's concurrent publication
    other = aeron.add_exclusive_publication(CHANNEL, 8)
    assert chosen.session_id == shared.session_id == 4242 and other.session_id != 4242
    everything = aeron.add_subscription(CHANNEL, 8)
    wait_for(lambda: everything.image_count == 2, 5, "both sessions' images")
    only_chosen = aeron.add_subscription(CHANNEL + "|session-id=4242", 8)
    wait_for(lambda: only_chosen.image_count == 1, 5, "the one matching image")
    assert only_chosen.images[0].session_id == 4242


def test_try_claim_offer_parts_and_views(aeron: Aeron) -> None:
    publication = aeron.add_exclusive_publication(CHANNEL, 9)
    subscription = aeron.add_subscription(CHANNEL, 9)
    connected(publication, subscription)
    claim = BufferClaim(publication.log)
    assert publication.try_claim(5, claim) > 0
    claim.buffer[:] = b"claim"
    claim.commit()
    assert publication.try_claim(3, claim) > 0
    claim.abort()
    offer(publication, b"")
    assert publication.offer_parts([b"ab", memoryview(b"cd"), bytearray(b"ef")]) > 0
    assert publication.offer(memoryview(b"xxmiddlexx"), offset=2, length=6) > 0
    appended, _ = publication.offer_batch([b"b1", b"b2", b"b3"])
    assert appended == 3
    assert collect(subscription, 7) == [b"claim", b"", b"abcdef", b"middle", b"b1", b"b2", b"b3"]
    # Every append is counted, the aborted claim too (it was claimed).
    reader = aeron.counters_reader
    counters = [c for c in reader if c.label.startswith(f"pub-msgs: {publication.registration_id} ")]
    assert [reader.counter_value(c.counter_id) for c in counters] == [8]


def test_controlled_poll_abort_break_commit(aeron: Aeron) -> None:
    publication = aeron.add_publication(CHANNEL, 10)
    subscription = aeron.add_subscription(CHANNEL, 10)
    connected(publication, subscription)
    for i in range(6):
        offer(publication, bytes([i]))
    image = subscription.images[0]
    seen: list[int] = []

    def abort_at_3(buffer: memoryview, offset: int, length: int, header: Header) -> ControlledAction:
        if buffer[offset] == 3:
            return ControlledAction.ABORT
        seen.append(buffer[offset])
        return ControlledAction.BREAK if buffer[offset] == 1 else ControlledAction.CONTINUE

    assert image.controlled_poll(abort_at_3, 10) == 2  # 0, then 1 with BREAK
    assert seen == [0, 1] and image.position == 2 * 64
    assert image.controlled_poll(abort_at_3, 10) == 1  # 2, then 3 aborts
    assert seen == [0, 1, 2] and image.position == 3 * 64
    committed: list[int] = []

    def commit_each(buffer: memoryview, offset: int, length: int, header: Header) -> ControlledAction:
        committed.append(image.position)
        return ControlledAction.COMMIT

    assert image.controlled_poll(commit_each, 10) == 3
    assert committed == [3 * 64, 4 * 64, 5 * 64] and image.position == 6 * 64


def test_bounded_poll_through_an_image(aeron: Aeron) -> None:
    publication = aeron.add_publication(CHANNEL, 11)
    subscription = aeron.add_subscription(CHANNEL, 11)
    connected(publication, subscription)
    for i in range(5):
        offer(publication, bytes([i]))
    image = subscription.images[0]
    seen: list[int] = []
    image.bounded_poll(lambda b, o, n, h: seen.append(b[o]), 3 * 64, 10)
    assert seen == [0, 1, 2]


def test_counters_lifecycle(aeron: Aeron) -> None:
    counter = aeron.add_counter(1001, "my app counter", b"key")
    counter.set(42)
    reader = aeron.counters_reader
    assert reader.counter_label(counter.id) == "my app counter"
    assert reader.counter_value(counter.id) == 42 and reader.counter_type_id(counter.id) == 1001
    counter_id = counter.id
    counter.close()
    wait_for(lambda: reader.counter_state(counter_id) != 1, 5, "the counter to be freed")


def test_closing_a_subscription_frees_its_position_counter(aeron: Aeron) -> None:
    publication = aeron.add_publication(CHANNEL, 12)
    subscription = aeron.add_subscription(CHANNEL, 12)
    connected(publication, subscription)
    reader = aeron.counters_reader
    sub_positions = lambda: [c for c in reader if c.type_id == SUBSCRIBER_POSITION_TYPE_ID]
    assert len(sub_positions()) == 1
    subscription.close()
    assert subscription.is_closed and not sub_positions()
    wait_for(lambda: not publication.is_connected, 5, "the publication to see no subscriber")
    # Removing the same subscription again is refused.
    with pytest.raises(RegistrationError, match="unknown subscription"):
        aeron.conductor._request(
            "remove subscription", protocol.RemoveSubscriptionEncoder, registration_id=subscription.registration_id
        )


def test_invoker_mode_runs_the_conductor_from_the_callers_loop(start_driver) -> None:
    driver = start_driver()
    with Aeron.connect(driver.directory, use_conductor_thread=False) as aeron:
        publication = aeron.add_publication(CHANNEL, 13)
        images: list[object] = []
        subscription = aeron.add_subscription(CHANNEL, 13, on_available_image=images.append)
        # Images arrive only when the owner runs the conductor.
        wait_for(lambda: aeron.do_work() >= 0 and images, 5, "the image via do_work")
        offer(publication, b"invoked")
        assert collect(subscription, 1) == [b"invoked"]
        import threading

        assert not any(t.name.startswith("aeron-client-conductor") for t in threading.enumerate())


def test_an_exclusive_publication_can_start_mid_stream(aeron: Aeron) -> None:
    from fulmar.logbuffer import compute_position

    channel = CHANNEL + "|init-term-id=100|term-id=103|term-offset=4096"
    publication = aeron.add_exclusive_publication(channel, 14)
    start = compute_position(103, 4096, 16, 100)
    assert publication.initial_term_id == 100 and publication.position == start
    subscription = aeron.add_subscription(CHANNEL, 14)
    connected(publication, subscription)
    assert subscription.images[0].join_position == start
    assert offer(publication, b"later") == start + 64
    assert collect(subscription, 1) == [b"later"]
    with pytest.raises(RegistrationError, match="exclusive publications only"):
        aeron.add_publication(channel, 15)

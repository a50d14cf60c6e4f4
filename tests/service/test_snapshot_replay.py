"""Reading a snapshot back from the archive (``read_snapshot``), as a service
or a consensus module does when it starts from one: a real driver and archive."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import snapshot
from fulmar.consensus.snapshot import SnapshotWriter, decode_snapshot, read_snapshot
from fulmar.subscription import Subscription
from support.archive import ArchiveNode
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TYPE_ID = 2  # a service's snapshot


@pytest.fixture
def node() -> Iterator[ArchiveNode]:
    started = ArchiveNode("snapshot-replay")
    try:
        yield started.start()
    finally:
        started.close()


def write_snapshot(node: ArchiveNode, count: int) -> tuple[int, list[bytes]]:
    """A recorded snapshot of ``count`` application messages between its markers; its recording id."""
    assert node.aeron is not None and node.client is not None
    writer = SnapshotWriter(node.aeron, node.client)
    messages = [f"entry {i:05d}".encode() * 20 for i in range(count)]
    writer.marker(TYPE_ID, 4096, 3, codecs.SnapshotMark.BEGIN)
    for message in messages:
        writer.offer(message)
    writer.marker(TYPE_ID, 4096, 3, codecs.SnapshotMark.END)
    recording_id = writer.close()
    archive = node.client
    wait_for(lambda: archive.get_stop_position(recording_id) >= 0, 10, "the snapshot recording to stop")
    return recording_id, messages


def application_messages(read: list[bytes]) -> list[bytes]:
    records = list(decode_snapshot(read, TYPE_ID))  # the BEGIN marker, then what lies before END
    assert len(records) == len(read) - 1
    return [record for record in records[1:] if isinstance(record, bytes)]


def test_a_snapshot_reads_back_whole(node: ArchiveNode) -> None:
    recording_id, messages = write_snapshot(node, 300)
    assert node.aeron is not None and node.client is not None
    assert application_messages(read_snapshot(node.aeron, node.client, recording_id)) == messages


def test_a_replay_whose_image_is_gone_once_read_is_complete(node: ArchiveNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """The archive ends the replay when it has sent the last message, and the
    driver takes the drained image away: a reader descheduled right after
    reading the last fragment finds no image any more.  The snapshot is still
    whole; before, the reader waited for an image position it could no longer
    see and failed after the timeout (a blank member's service, under load)."""
    recording_id, messages = write_snapshot(node, 300)
    assert node.aeron is not None and node.client is not None
    aeron = node.aeron
    replay = node.client.replay
    removed: list[bool] = []

    def replay_then_lose_the_image(*args: Any, **kwargs: Any) -> Subscription:
        subscription = replay(*args, **kwargs)
        poll = subscription.poll

        def poll_then_wait_for_removal(handler: Any, fragment_limit: int) -> int:
            read = poll(handler, fragment_limit)
            images = subscription.images
            stop = node.client.get_stop_position(recording_id) if node.client is not None else 0
            if read and images and images[0].position >= stop:
                deadline = time.monotonic() + 10
                while subscription.images:  # as if descheduled until the driver removed it
                    if not aeron.context.use_conductor_thread:
                        aeron.do_work()
                    assert time.monotonic() < deadline, "the driver kept the finished replay's image"
                    time.sleep(0.001)
                removed.append(True)
            return read

        subscription.poll = poll_then_wait_for_removal  # type: ignore[method-assign]
        return subscription

    monkeypatch.setattr(node.client, "replay", replay_then_lose_the_image)
    monkeypatch.setattr(snapshot, "SNAPSHOT_TIMEOUT_S", 3.0)  # the failure it guards against, quickly
    assert application_messages(read_snapshot(aeron, node.client, recording_id)) == messages
    assert removed == [True]  # the image really went before the reader looked again


def test_a_replay_the_archive_ends_short_fails_at_once_naming_where(
    node: ArchiveNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive that ends the replay before the snapshot's stop position (the
    replay stopped, the archive going down) closes the image short: the reader
    says where it stopped at once instead of waiting out its timeout."""
    recording_id, _ = write_snapshot(node, 300)
    assert node.aeron is not None and node.client is not None
    replay = node.client.replay
    stop = node.client.get_stop_position(recording_id)
    short = stop // 2 // 32 * 32  # a frame boundary or not: the archive ends the replay there or before

    def replay_short(recording: int, channel: str, stream_id: int, position: int, length: int) -> Subscription:
        return replay(recording, channel, stream_id, position, short - position)

    monkeypatch.setattr(node.client, "replay", replay_short)
    monkeypatch.setattr(snapshot, "SNAPSHOT_TIMEOUT_S", 20.0)
    started = time.monotonic()
    with pytest.raises(
        snapshot.SnapshotError, match=rf"ended at position (\d+), before its stop position {stop}"
    ) as raised:
        read_snapshot(node.aeron, node.client, recording_id)
    assert time.monotonic() - started < 10  # the image's end, not the timeout
    ended = int(str(raised.value).split("ended at position ")[1].split(",")[0])
    assert 0 < ended <= short

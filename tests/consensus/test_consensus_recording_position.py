"""Where a member's log recording reaches: its archive's rec-pos counter
(issue 18).  A restarted archive records the same recording and image
session as its dead predecessor, whose counter lingers in the driver until
the driver closes the dead client: the module must read its own archive's
counter (Aeron's RecordingPos by archive id), the newest if several match,
and look again once the counter it read is freed or its id reused."""

from __future__ import annotations

from types import SimpleNamespace

from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID, recording_position_ids, recording_position_key
from fulmar.buffers import AtomicBuffer
from fulmar.consensus.agent import ClusterRole, ConsensusModuleAgent
from fulmar.consensus.native_handovers import NativeHandovers
from fulmar.consensus.protocol import NULL_VALUE
from fulmar.counters import CountersManager

RECORDING_ID = 0
SESSION_ID = -1558646221
DEAD_ARCHIVE_ID, LIVE_ARCHIVE_ID = 0, 134


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


def counters() -> tuple[CountersManager, Clock]:
    clock = Clock()
    return CountersManager(AtomicBuffer(bytearray(64 * 512)), AtomicBuffer(bytearray(64 * 128)), 1_000, clock), clock


def rec_pos(
    manager: CountersManager, archive_id: int, value: int, registration_id: int, recording_id: int = RECORDING_ID
) -> int:
    counter_id = manager.allocate(
        f"rec-pos: {recording_id} {SESSION_ID} 100 aeron:udp - archiveId={archive_id}",
        RECORDING_POSITION_TYPE_ID,
        recording_position_key(recording_id, SESSION_ID, "127.0.0.1:40000", archive_id),
        registration_id,
    )
    manager.set_counter_value(counter_id, value)
    return counter_id


class Watch:
    """The client's counter watch (fulmar.reader_doorbells.CounterWatch): which counters it watches."""

    def __init__(self) -> None:
        self.watched: set[int] = set()

    def watch(self, counter_id: int) -> bool:
        self.watched.add(counter_id)
        return True

    def unwatch(self, counter_id: int) -> None:
        self.watched.discard(counter_id)


def follower(manager: CountersManager, archive_id: int = LIVE_ARCHIVE_ID) -> ConsensusModuleAgent:
    """The agent's state that reading the append position uses, nothing more."""
    agent = ConsensusModuleAgent.__new__(ConsensusModuleAgent)
    watch = Watch()
    agent.aeron = SimpleNamespace(  # type: ignore[assignment]
        counters_reader=manager,
        conductor=SimpleNamespace(counter_watch=lambda: watch, has_driver_news=lambda: False),
        watch=watch,
    )
    agent._watched_recording_counter_id = NULL_VALUE
    agent._own_recording_watched = True
    agent.handovers = NativeHandovers(agent)  # no native threads armed
    agent.role = ClusterRole.FOLLOWER
    agent._counter_watch = None
    agent.log_recording_id = RECORDING_ID
    agent.log_session_id = SESSION_ID
    agent.append_position = 1024
    agent._archive_id = archive_id
    agent._recording_position_counter_id = NULL_VALUE
    agent._recording_position_registration_id = NULL_VALUE
    return agent


def test_the_key_names_the_archive() -> None:
    key = recording_position_key(7, SESSION_ID, "127.0.0.1:40000", LIVE_ARCHIVE_ID)
    assert recording_position_ids(key) == (7, SESSION_ID, LIVE_ARCHIVE_ID)
    assert recording_position_ids(key[:12] + b"\x00" * 100) == (7, SESSION_ID, 0)


def test_a_dead_archives_lingering_counter_is_not_read() -> None:
    manager, _ = counters()
    rec_pos(manager, DEAD_ARCHIVE_ID, 359_552, registration_id=50)  # first: the lowest counter id
    live = rec_pos(manager, LIVE_ARCHIVE_ID, 1_200_960, registration_id=900)
    agent = follower(manager)
    assert agent.read_append_position() == 1_200_960
    assert agent._recording_position_counter_id == live
    # Woken when the live archive records more (the fake Aeron records what is watched).
    assert agent.aeron.watch.watched == {live}  # type: ignore[attr-defined]
    manager.set_counter_value(live, 1_300_000)
    assert agent.read_append_position() == 1_300_000


def test_of_two_counters_of_one_archive_id_the_newest_is_read() -> None:
    """An archive given a fixed --archive-id keeps it across a restart."""
    manager, _ = counters()
    rec_pos(manager, LIVE_ARCHIVE_ID, 359_552, registration_id=50)
    rec_pos(manager, LIVE_ARCHIVE_ID, 700_000, registration_id=900)
    assert follower(manager).read_append_position() == 700_000


def test_a_freed_counter_is_looked_up_again_and_a_reused_id_is_not_read() -> None:
    manager, clock = counters()
    first = rec_pos(manager, LIVE_ARCHIVE_ID, 5_000, registration_id=50)
    agent = follower(manager)
    assert agent.read_append_position() == 5_000
    manager.free(first)  # the recording stopped (its image went)
    clock.now_ms += 2_000  # past the reuse timeout: the id may serve another counter
    other = manager.allocate("some other counter", 1, b"", registration_id=77)
    assert other == first
    manager.set_counter_value(other, 99_999_999)
    assert agent.read_append_position() == 5_000  # not the stranger's value
    assert agent._recording_position_counter_id == NULL_VALUE
    again = rec_pos(manager, LIVE_ARCHIVE_ID, 6_000, registration_id=1_000)  # the recording extended
    assert agent.read_append_position() == 6_000
    assert agent._recording_position_counter_id == again


def test_has_work_only_for_more_recorded_on_the_counter_found() -> None:
    """The idle check says "work" when the archive recorded more of the log;
    a freed counter whose id serves another counter is no work (it would keep
    an idle module from ever sleeping)."""
    manager, clock = counters()
    quiet = SimpleNamespace(is_data_available=lambda: False)
    agent = follower(manager)
    agent.ingress = agent.from_services = agent._consensus_subscription = quiet  # type: ignore[assignment]
    agent._log_image = None
    agent.is_multi_member = True
    counter_id = rec_pos(manager, LIVE_ARCHIVE_ID, 5_000, registration_id=50)
    assert agent.read_append_position() == 5_000
    assert not agent.has_work()
    manager.set_counter_value(counter_id, 6_000)
    assert agent.has_work()
    assert agent.read_append_position() == 6_000 and not agent.has_work()
    manager.free(counter_id)
    clock.now_ms += 2_000
    assert manager.allocate("some other counter", 1, b"", registration_id=77) == counter_id
    manager.set_counter_value(counter_id, 99_999_999)
    assert not agent.has_work()

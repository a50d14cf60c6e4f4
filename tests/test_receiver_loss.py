"""Loss detection with an injected clock: NAK after the delay, retries, a
gap that fills is forgotten, a gap that moves is a new gap; the delay
generators."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from fulmar.driver.loss_detector import (
    NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS,
    Gap,
    LossDetector,
    OptimalMulticastDelayGenerator,
    StaticDelayGenerator,
)
from fulmar.driver.term_rebuilder import insert_packet
from fulmar.frames import DATA_HEADER, FrameType
from fulmar.logbuffer import LogBuffers, to_int32

TERM = 64 * 1024
INITIAL_TERM_ID = 40
DELAY_NS = 1_000
RETRY_NS = 5_000


def put(log: LogBuffers, position: int, length: int = 64, frame_type: int = FrameType.DATA) -> None:
    """Receive one frame (64 bytes unless told) at a stream position."""
    term_count, term_offset = divmod(position, TERM)
    term_id = to_int32(log.initial_term_id + term_count)
    header = DATA_HEADER.pack(length, 0, 0xC0, frame_type, term_offset, 1, 2, term_id, 0)
    body = b"" if frame_type == FrameType.PAD else b"x" * (length - 32)
    assert insert_packet(log, term_count % 3, term_offset, header + body) == 1


class Naks:
    def __init__(self) -> None:
        self.sent: list[tuple[int, int, int]] = []

    def __call__(self, term_id: int, term_offset: int, length: int) -> None:
        self.sent.append((term_id, term_offset, length))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogBuffers]:
    with LogBuffers.create(tmp_path / "image.logbuffer", TERM, initial_term_id=INITIAL_TERM_ID) as buffers:
        yield buffers


@pytest.fixture
def naks() -> Naks:
    return Naks()


@pytest.fixture
def detector(log: LogBuffers, naks: Naks) -> LossDetector:
    return LossDetector(log, StaticDelayGenerator(DELAY_NS, RETRY_NS), naks)


def test_contiguous_data_advances_without_naks(log: LogBuffers, naks: Naks, detector: LossDetector) -> None:
    for position in range(0, 320, 64):
        put(log, position)
    assert detector.scan(0, 320, 0) == (0, 320)
    assert detector.scan(320, 320, 10**9) == (0, 320)
    assert detector.active_gap is None and naks.sent == []


def test_nak_after_the_delay_then_retries_at_the_retry_delay(
    log: LogBuffers, naks: Naks, detector: LossDetector
) -> None:
    put(log, 0)
    put(log, 192)  # 64..192 missing
    assert detector.scan(0, 256, 0) == (1, 64)  # a new gap: the timer starts
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 64, 128)
    assert naks.sent == []
    assert detector.scan(64, 256, DELAY_NS - 1) == (0, 64)
    assert naks.sent == []
    assert detector.scan(64, 256, DELAY_NS) == (1, 64)
    assert naks.sent == [(INITIAL_TERM_ID, 64, 128)]
    for now in (DELAY_NS + 1, DELAY_NS + RETRY_NS - 1):
        assert detector.scan(64, 256, now) == (0, 64)
    assert len(naks.sent) == 1
    assert detector.scan(64, 256, DELAY_NS + RETRY_NS) == (1, 64)
    assert detector.scan(64, 256, DELAY_NS + 2 * RETRY_NS + 7) == (1, 64)
    assert naks.sent == [(INITIAL_TERM_ID, 64, 128)] * 3


def test_a_gap_filled_before_its_deadline_is_never_naked(log: LogBuffers, naks: Naks, detector: LossDetector) -> None:
    put(log, 0)
    put(log, 192)
    detector.scan(0, 256, 0)
    put(log, 64)
    put(log, 128)
    assert detector.scan(64, 256, DELAY_NS) == (0, 256)
    assert detector.active_gap is None
    assert detector.scan(256, 256, 10 * DELAY_NS) == (0, 256)
    assert naks.sent == []


def test_a_gap_partly_filled_at_its_start_is_a_new_gap(log: LogBuffers, naks: Naks, detector: LossDetector) -> None:
    put(log, 0)
    put(log, 256)  # 64..256 missing
    detector.scan(0, 320, 0)
    put(log, 64)  # now 128..256 missing
    assert detector.scan(64, 320, 600) == (1, 128)
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 128, 128)
    assert detector.scan(128, 320, DELAY_NS) == (0, 128)  # the old deadline no longer applies
    assert naks.sent == []
    assert detector.scan(128, 320, 600 + DELAY_NS) == (1, 128)
    assert naks.sent == [(INITIAL_TERM_ID, 128, 128)]


def test_a_gap_partly_filled_at_its_end_is_a_new_gap(log: LogBuffers, naks: Naks, detector: LossDetector) -> None:
    put(log, 0)
    put(log, 256)
    detector.scan(0, 320, 0)
    assert detector.scan(64, 320, DELAY_NS) == (1, 64)
    assert naks.sent == [(INITIAL_TERM_ID, 64, 192)]
    put(log, 192)  # the resend's last frame arrived first: 64..192 missing
    assert detector.scan(64, 320, DELAY_NS + 10) == (1, 64)
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 64, 128)
    # Asked again after the initial delay, for what is still missing, not
    # after the retry delay.
    assert detector.scan(64, 320, 2 * DELAY_NS + 10) == (1, 64)
    assert naks.sent[-1] == (INITIAL_TERM_ID, 64, 128)


def test_the_next_gap_is_chased_once_the_first_fills(log: LogBuffers, naks: Naks, detector: LossDetector) -> None:
    for position in (0, 128, 256):
        put(log, position)  # 64 and 192 missing
    detector.scan(0, 320, 0)
    detector.scan(64, 320, DELAY_NS)
    put(log, 64)
    assert detector.scan(64, 320, DELAY_NS + 1) == (1, 192)
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 192, 64)
    detector.scan(192, 320, 2 * DELAY_NS + 1)
    assert naks.sent == [(INITIAL_TERM_ID, 64, 64), (INITIAL_TERM_ID, 192, 64)]


def test_a_gap_at_the_end_of_a_term_runs_to_the_term_end(log: LogBuffers, naks: Naks, detector: LossDetector) -> None:
    # Padding from 0 makes the first term complete up to TERM - 128; the
    # high-water mark is already in the next term.
    put(log, 0, TERM - 128, FrameType.PAD)
    put(log, TERM)
    assert detector.scan(0, TERM + 64, 0) == (1, TERM - 128)
    assert detector.active_gap == Gap(INITIAL_TERM_ID, TERM - 128, 128)
    put(log, TERM - 128, 128)
    # The term is complete: the position moves to the next term's start and
    # the next scan carries on there.
    assert detector.scan(TERM - 128, TERM + 64, 1) == (0, TERM)
    assert detector.scan(TERM, TERM + 64, 2) == (0, TERM + 64)
    assert naks.sent == []


def test_a_padding_frame_takes_the_rebuild_past_the_high_water_mark(log: LogBuffers, detector: LossDetector) -> None:
    # The sender sends padding as its header alone: the high-water mark is
    # 32 bytes past the frame's start, the term is complete to its end.
    put(log, 0)
    put(log, 64, TERM - 64, FrameType.PAD)
    assert detector.scan(0, 96, 0) == (0, TERM)


def test_term_ids_wrap(tmp_path: Path, naks: Naks) -> None:
    with LogBuffers.create(tmp_path / "wrap.logbuffer", TERM, initial_term_id=2**31 - 2) as log:
        detector = LossDetector(log, StaticDelayGenerator(0, RETRY_NS), naks)
        base = 2 * TERM  # the third term: its id wraps to -2**31
        put(log, base)
        put(log, base + 128)
        assert detector.scan(base, base + 192, 5) == (1, base + 64)
        assert naks.sent == [(-(2**31), 64, 64)]  # no delay: NAKed on the first scan


def test_nothing_to_scan_forgets_the_gap(log: LogBuffers, detector: LossDetector) -> None:
    put(log, 0)
    put(log, 128)
    detector.scan(0, 192, 0)
    assert detector.active_gap is not None
    assert detector.scan(192, 192, 1) == (0, 192)
    assert detector.active_gap is None


def test_static_delay_defaults_are_aerons_unicast_delays() -> None:
    generator = StaticDelayGenerator()
    assert (generator.generate_delay_ns(), generator.retry_delay_ns()) == (100_000, 10_000_000)
    with pytest.raises(ValueError):
        StaticDelayGenerator(-1)


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_multicast_delays_span_zero_to_the_max_backoff() -> None:
    backoff = 10_000_000
    assert OptimalMulticastDelayGenerator(backoff, 10, FixedRandom(0.0)).generate_delay_ns() == 0
    near_max = OptimalMulticastDelayGenerator(backoff, 10, FixedRandom(1 - 1e-12)).generate_delay_ns()
    assert backoff - 10 <= near_max < backoff
    # In between the delay follows T/lambda * ln(1 + u (e^lambda - 1)).
    lam = math.log(10) + 1
    expected = backoff / lam * math.log(1 + 0.5 * (math.exp(lam) - 1))
    assert OptimalMulticastDelayGenerator(backoff, 10, FixedRandom(0.5)).generate_delay_ns() == pytest.approx(
        expected, abs=1
    )


def test_multicast_delays_are_random_bounded_and_reproducible_by_seed() -> None:
    first = OptimalMulticastDelayGenerator(rng=random.Random(42))
    second = OptimalMulticastDelayGenerator(rng=random.Random(42))
    delays = [first.generate_delay_ns() for _ in range(2000)] + [first.retry_delay_ns() for _ in range(10)]
    assert delays == [second.generate_delay_ns() for _ in range(2000)] + [second.retry_delay_ns() for _ in range(10)]
    assert all(0 <= delay < NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS for delay in delays)
    assert len(set(delays)) > 1900
    # Weighted towards long waits: only a few receivers NAK early.
    assert sum(delay < NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS // 2 for delay in delays) < len(delays) // 4
    with pytest.raises(ValueError):
        OptimalMulticastDelayGenerator(0)


def test_a_multicast_detector_naks_at_its_drawn_delays(log: LogBuffers, naks: Naks) -> None:
    detector = LossDetector(log, OptimalMulticastDelayGenerator(rng=random.Random(7)), naks)
    shadow = OptimalMulticastDelayGenerator(rng=random.Random(7))
    first, retry = shadow.generate_delay_ns(), shadow.retry_delay_ns()
    put(log, 0)
    put(log, 128)
    detector.scan(0, 192, 0)
    detector.scan(64, 192, first - 1)
    assert naks.sent == []
    detector.scan(64, 192, first)
    detector.scan(64, 192, first + retry - 1)
    assert len(naks.sent) == 1
    detector.scan(64, 192, first + retry)
    assert naks.sent == [(INITIAL_TERM_ID, 64, 64)] * 2

"""The native loss detector (image_state.c), driven through cffi, with an
injected clock: NAK after the delay, retries, a gap that fills is forgotten,
a gap that moves is a new gap; the static delays, and the multicast delays
from its own seeded PRNG (bounds, the distribution's shape, and the formula
for any uniform draw)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from fulmar._native import ffi, lib
from fulmar.driver.term_rebuilder import insert_packet
from fulmar.frames import DATA_HEADER, FrameType
from fulmar.logbuffer import LogBuffers, to_int32

TERM = 64 * 1024
INITIAL_TERM_ID = 40
DELAY_NS = 1_000
RETRY_NS = 5_000
NAK_MULTICAST_GROUP_SIZE_DEFAULT = lib.FULMAR_NAK_MULTICAST_GROUP_SIZE_DEFAULT
NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS = lib.FULMAR_NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS


def put(log: LogBuffers, position: int, length: int = 64, frame_type: int = FrameType.DATA) -> None:
    """Receive one frame (64 bytes unless told) at a stream position."""
    term_count, term_offset = divmod(position, TERM)
    term_id = to_int32(log.initial_term_id + term_count)
    header = DATA_HEADER.pack(length, 0, 0xC0, frame_type, term_offset, 1, 2, term_id, 0)
    body = b"" if frame_type == FrameType.PAD else b"x" * (length - 32)
    assert insert_packet(log, term_count % 3, term_offset, header + body) == 1


class Gap(NamedTuple):
    term_id: int
    term_offset: int
    length: int


class Detector:
    """A native loss detector over a log; ``scan`` answers ``(work_count,
    rebuild_position)`` and collects the NAKs due in ``naks``."""

    def __init__(self, log: LogBuffers) -> None:
        self.log = log
        self.d = ffi.new("fulmar_loss_detector_t *")
        self.naks: list[tuple[int, int, int]] = []
        self._position = ffi.new("int64_t *")
        self._nak = ffi.new("fulmar_nak_t *")

    @classmethod
    def static(cls, log: LogBuffers, delay_ns: int = DELAY_NS, retry_ns: int = RETRY_NS) -> Detector:
        detector = cls(log)
        assert lib.fulmar_loss_detector_init_static(detector.d, delay_ns, retry_ns) == 0
        return detector

    @classmethod
    def multicast(cls, log: LogBuffers, seed: int) -> Detector:
        detector = cls(log)
        assert (
            lib.fulmar_loss_detector_init_multicast(
                detector.d, NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS, NAK_MULTICAST_GROUP_SIZE_DEFAULT, seed
            )
            == 0
        )
        return detector

    def raw_scan(self, rebuild_position: int, hwm_position: int, now_ns: int) -> tuple[int, int]:
        log = self.log
        result = lib.fulmar_loss_detector_scan(
            self.d,
            log.address,
            log.term_length,
            log.position_bits_to_shift,
            log.initial_term_id,
            rebuild_position,
            hwm_position,
            now_ns,
            self._position,
            self._nak,
        )
        return int(result), int(self._position[0])

    def scan(self, rebuild_position: int, hwm_position: int, now_ns: int) -> tuple[int, int]:
        result, position = self.raw_scan(rebuild_position, hwm_position, now_ns)
        assert result >= 0
        if result & lib.FULMAR_LOSS_NAK_DUE:
            self.naks.append((self._nak.term_id, self._nak.term_offset, self._nak.length))
        return (1 if result else 0), position

    @property
    def active_gap(self) -> Gap | None:
        d = self.d
        return Gap(d.gap_term_id, d.gap_term_offset, d.gap_length) if d.gap_active else None


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogBuffers]:
    with LogBuffers.create(tmp_path / "image.logbuffer", TERM, initial_term_id=INITIAL_TERM_ID) as buffers:
        yield buffers


@pytest.fixture
def detector(log: LogBuffers) -> Detector:
    return Detector.static(log)


def test_contiguous_data_advances_without_naks(log: LogBuffers, detector: Detector) -> None:
    for position in range(0, 320, 64):
        put(log, position)
    assert detector.scan(0, 320, 0) == (0, 320)
    assert detector.scan(320, 320, 10**9) == (0, 320)
    assert detector.active_gap is None and detector.naks == []


def test_nak_after_the_delay_then_retries_at_the_retry_delay(log: LogBuffers, detector: Detector) -> None:
    put(log, 0)
    put(log, 192)  # 64..192 missing
    assert detector.scan(0, 256, 0) == (1, 64)  # a new gap: the timer starts
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 64, 128)
    assert detector.naks == []
    assert detector.scan(64, 256, DELAY_NS - 1) == (0, 64)
    assert detector.naks == []
    assert detector.scan(64, 256, DELAY_NS) == (1, 64)
    assert detector.naks == [(INITIAL_TERM_ID, 64, 128)]
    for now in (DELAY_NS + 1, DELAY_NS + RETRY_NS - 1):
        assert detector.scan(64, 256, now) == (0, 64)
    assert len(detector.naks) == 1
    assert detector.scan(64, 256, DELAY_NS + RETRY_NS) == (1, 64)
    assert detector.scan(64, 256, DELAY_NS + 2 * RETRY_NS + 7) == (1, 64)
    assert detector.naks == [(INITIAL_TERM_ID, 64, 128)] * 3


def test_the_scan_result_bits(log: LogBuffers, detector: Detector) -> None:
    put(log, 0)
    put(log, 128)
    assert detector.raw_scan(0, 192, 0) == (lib.FULMAR_LOSS_GAP_FOUND, 64)
    assert detector.d.deadline_ns == DELAY_NS
    assert detector.raw_scan(64, 192, DELAY_NS - 1) == (0, 64)  # the same gap, not due
    assert detector.raw_scan(64, 192, DELAY_NS) == (lib.FULMAR_LOSS_NAK_DUE, 64)
    assert (detector._nak.term_id, detector._nak.term_offset, detector._nak.length) == (INITIAL_TERM_ID, 64, 64)
    assert detector.d.deadline_ns == DELAY_NS + RETRY_NS
    # A new gap due at once (no delay) sets both.
    immediate = Detector.static(log, 0, RETRY_NS)
    assert immediate.raw_scan(0, 192, 5) == (lib.FULMAR_LOSS_GAP_FOUND | lib.FULMAR_LOSS_NAK_DUE, 64)
    assert immediate.d.deadline_ns == 5 + RETRY_NS


def test_a_gap_filled_before_its_deadline_is_never_naked(log: LogBuffers, detector: Detector) -> None:
    put(log, 0)
    put(log, 192)
    detector.scan(0, 256, 0)
    put(log, 64)
    put(log, 128)
    assert detector.scan(64, 256, DELAY_NS) == (0, 256)
    assert detector.active_gap is None
    assert detector.scan(256, 256, 10 * DELAY_NS) == (0, 256)
    assert detector.naks == []


def test_a_gap_partly_filled_at_its_start_is_a_new_gap(log: LogBuffers, detector: Detector) -> None:
    put(log, 0)
    put(log, 256)  # 64..256 missing
    detector.scan(0, 320, 0)
    put(log, 64)  # now 128..256 missing
    assert detector.scan(64, 320, 600) == (1, 128)
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 128, 128)
    assert detector.scan(128, 320, DELAY_NS) == (0, 128)  # the old deadline no longer applies
    assert detector.naks == []
    assert detector.scan(128, 320, 600 + DELAY_NS) == (1, 128)
    assert detector.naks == [(INITIAL_TERM_ID, 128, 128)]


def test_a_gap_partly_filled_at_its_end_is_a_new_gap(log: LogBuffers, detector: Detector) -> None:
    put(log, 0)
    put(log, 256)
    detector.scan(0, 320, 0)
    assert detector.scan(64, 320, DELAY_NS) == (1, 64)
    assert detector.naks == [(INITIAL_TERM_ID, 64, 192)]
    put(log, 192)  # the resend's last frame arrived first: 64..192 missing
    assert detector.scan(64, 320, DELAY_NS + 10) == (1, 64)
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 64, 128)
    # Asked again after the initial delay, for what is still missing, not
    # after the retry delay.
    assert detector.scan(64, 320, 2 * DELAY_NS + 10) == (1, 64)
    assert detector.naks[-1] == (INITIAL_TERM_ID, 64, 128)


def test_the_next_gap_is_chased_once_the_first_fills(log: LogBuffers, detector: Detector) -> None:
    for position in (0, 128, 256):
        put(log, position)  # 64 and 192 missing
    detector.scan(0, 320, 0)
    detector.scan(64, 320, DELAY_NS)
    put(log, 64)
    assert detector.scan(64, 320, DELAY_NS + 1) == (1, 192)
    assert detector.active_gap == Gap(INITIAL_TERM_ID, 192, 64)
    detector.scan(192, 320, 2 * DELAY_NS + 1)
    assert detector.naks == [(INITIAL_TERM_ID, 64, 64), (INITIAL_TERM_ID, 192, 64)]


def test_a_gap_at_the_end_of_a_term_runs_to_the_term_end(log: LogBuffers, detector: Detector) -> None:
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
    assert detector.naks == []


def test_a_padding_frame_takes_the_rebuild_past_the_high_water_mark(log: LogBuffers, detector: Detector) -> None:
    # The sender sends padding as its header alone: the high-water mark is
    # 32 bytes past the frame's start, the term is complete to its end.
    put(log, 0)
    put(log, 64, TERM - 64, FrameType.PAD)
    assert detector.scan(0, 96, 0) == (0, TERM)


def test_term_ids_wrap(tmp_path: Path) -> None:
    with LogBuffers.create(tmp_path / "wrap.logbuffer", TERM, initial_term_id=2**31 - 2) as log:
        detector = Detector.static(log, 0, RETRY_NS)
        base = 2 * TERM  # the third term: its id wraps to -2**31
        put(log, base)
        put(log, base + 128)
        assert detector.scan(base, base + 192, 5) == (1, base + 64)
        assert detector.naks == [(-(2**31), 64, 64)]  # no delay: NAKed on the first scan


def test_nothing_to_scan_forgets_the_gap(log: LogBuffers, detector: Detector) -> None:
    put(log, 0)
    put(log, 128)
    detector.scan(0, 192, 0)
    assert detector.active_gap is not None
    assert detector.scan(192, 192, 1) == (0, 192)
    assert detector.active_gap is None


def test_a_rebuild_position_off_the_frame_alignment_is_refused(log: LogBuffers, detector: Detector) -> None:
    put(log, 0)
    put(log, 128)
    detector.scan(0, 192, 0)
    before = (detector.active_gap, detector.d.deadline_ns)
    assert detector.raw_scan(70, 192, DELAY_NS) == (lib.FULMAR_REBUILD_BAD_TERM_OFFSET, 70)
    assert (detector.active_gap, detector.d.deadline_ns) == before and detector.naks == []


def test_static_delay_defaults_are_aerons_unicast_delays(tmp_path: Path, log: LogBuffers) -> None:
    assert lib.FULMAR_NAK_UNICAST_DELAY_DEFAULT_NS == 100_000
    assert lib.FULMAR_NAK_UNICAST_RETRY_DELAY_RATIO_DEFAULT == 100
    assert NAK_MULTICAST_GROUP_SIZE_DEFAULT == 10
    assert NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS == 10_000_000
    # An image's detector starts with them.
    state = ffi.new("fulmar_image_state_t *")
    assert (
        lib.fulmar_image_state_init(
            state,
            log.address,
            TERM,
            INITIAL_TERM_ID,
            1,
            2,
            INITIAL_TERM_ID,
            0,
            0,
            lib.FULMAR_INITIAL_WINDOW_LENGTH_DEFAULT,
            lib.FULMAR_STATUS_MESSAGE_TIMEOUT_DEFAULT_NS,
            lib.FULMAR_IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS,
        )
        == 0
    )
    d = ffi.addressof(state[0], "loss_detector")
    assert d.kind == lib.FULMAR_DELAY_STATIC
    assert (lib.fulmar_loss_detector_generate_delay_ns(d), lib.fulmar_loss_detector_retry_delay_ns(d)) == (
        100_000,
        10_000_000,
    )
    fresh = ffi.new("fulmar_loss_detector_t *")
    assert lib.fulmar_loss_detector_init_static(fresh, -1, 10_000_000) == lib.FULMAR_IMAGE_BAD_DELAY
    assert lib.fulmar_loss_detector_init_static(fresh, 100_000, -1) == lib.FULMAR_IMAGE_BAD_DELAY
    assert lib.fulmar_image_state_use_static_delays(state, -1, 0) == lib.FULMAR_IMAGE_BAD_DELAY


def multicast(
    max_backoff_ns: int = NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS, group_size: int = 10, seed: int = 0
) -> object:
    d = ffi.new("fulmar_loss_detector_t *")
    assert lib.fulmar_loss_detector_init_multicast(d, max_backoff_ns, group_size, seed) == 0
    return d


def test_multicast_delays_span_zero_to_the_max_backoff() -> None:
    backoff = 10_000_000
    d = multicast(backoff, 10)
    assert lib.fulmar_loss_detector_multicast_delay_ns(d, 0.0) == 0
    near_max = lib.fulmar_loss_detector_multicast_delay_ns(d, 1 - 1e-12)
    assert backoff - 10 <= near_max < backoff
    # In between the delay follows T/lambda * ln(1 + u (e^lambda - 1)).
    lam = math.log(10) + 1
    expected = backoff / lam * math.log(1 + 0.5 * (math.exp(lam) - 1))
    assert lib.fulmar_loss_detector_multicast_delay_ns(d, 0.5) == pytest.approx(expected, abs=1)


def test_the_multicast_formula_holds_for_any_draw() -> None:
    """For a uniform draw u: T/lambda * ln(1 + u (e^lambda - 1)), lambda = ln(group size) + 1,
    truncated to whole nanoseconds (within 1 ns: the C computes it another, equal, way)."""
    rng = random.Random(3)
    for backoff, group in [(10_000_000, 10), (1_000, 1), (60_000_000, 100), (7, 3)]:
        d = multicast(backoff, group)
        lam = math.log(group) + 1
        for u in [0.0, 0.25, 0.5, 0.999] + [rng.random() for _ in range(200)]:
            delay = lib.fulmar_loss_detector_multicast_delay_ns(d, u)
            expected = backoff / lam * math.log(1 + u * (math.exp(lam) - 1))
            assert 0 <= delay < backoff and abs(delay - expected) <= 1, (backoff, group, u)


def test_multicast_delays_are_random_bounded_and_reproducible_by_seed() -> None:
    first, second = multicast(seed=42), multicast(seed=42)

    def draw(d: object) -> list[int]:
        return [lib.fulmar_loss_detector_generate_delay_ns(d) for _ in range(2000)] + [
            lib.fulmar_loss_detector_retry_delay_ns(d) for _ in range(10)
        ]

    delays = draw(first)
    assert delays == draw(second)
    assert delays != draw(multicast(seed=43))
    assert all(0 <= delay < NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS for delay in delays)
    assert len(set(delays)) > 1900
    # Weighted towards long waits: only a few receivers NAK early.
    assert sum(delay < NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS // 2 for delay in delays) < len(delays) // 4
    d = ffi.new("fulmar_loss_detector_t *")
    assert lib.fulmar_loss_detector_init_multicast(d, 0, 10, 1) == lib.FULMAR_IMAGE_BAD_DELAY
    assert lib.fulmar_loss_detector_init_multicast(d, -5, 10, 1) == lib.FULMAR_IMAGE_BAD_DELAY
    assert lib.fulmar_loss_detector_init_multicast(d, 1000, 0, 1) == lib.FULMAR_IMAGE_BAD_DELAY


@pytest.mark.parametrize("group_size", [1, 10, 100])
def test_multicast_delays_follow_the_optimal_feedback_distribution(group_size: int) -> None:
    """The delays' distribution is P(delay <= t) = (e^(lambda t/T) - 1) / (e^lambda - 1),
    lambda = ln(group size) + 1: a Kolmogorov-Smirnov distance far below
    what a wrong shape (uniform, or a lambda off by one) gives."""
    backoff = 10_000_000
    d = multicast(backoff, group_size, seed=group_size)
    count = 20_000
    delays = sorted(lib.fulmar_loss_detector_generate_delay_ns(d) for _ in range(count))
    lam = math.log(group_size) + 1

    def cdf(t: float, lam: float) -> float:
        return (math.exp(lam * t / backoff) - 1) / (math.exp(lam) - 1)

    def distance(lam: float) -> float:
        return max(max(abs((i + 1) / count - cdf(t, lam)), abs(i / count - cdf(t, lam))) for i, t in enumerate(delays))

    assert distance(lam) < 0.015  # about 1.63 / sqrt(20000) is the 1% critical value
    assert distance(lam + 1) > 0.05 and distance(lam - 0.9) > 0.05
    assert max(abs((i + 1) / count - t / backoff) for i, t in enumerate(delays)) > 0.1  # not uniform


def test_a_multicast_detector_naks_at_its_drawn_delays(log: LogBuffers) -> None:
    detector = Detector.multicast(log, seed=7)
    shadow = multicast(seed=7)
    first, retry = lib.fulmar_loss_detector_generate_delay_ns(shadow), lib.fulmar_loss_detector_retry_delay_ns(shadow)
    put(log, 0)
    put(log, 128)
    detector.scan(0, 192, 0)
    detector.scan(64, 192, first - 1)
    assert detector.naks == []
    detector.scan(64, 192, first)
    detector.scan(64, 192, first + retry - 1)
    assert len(detector.naks) == 1
    detector.scan(64, 192, first + retry)
    assert detector.naks == [(INITIAL_TERM_ID, 64, 64)] * 2

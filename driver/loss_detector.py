"""Loss detection on a network image (Aeron's ``LossDetector`` and its
feedback delay generators).

Each duty cycle the image asks the detector to scan its log from the rebuild
position towards the high-water mark.  The first gap found is the *active*
gap: when it is new, a timer starts with the generator's initial delay; when
the timer expires and the scan still finds that same gap, the detector calls
``on_gap_detected(term_id, term_offset, length)`` (the image sends a NAK) and
re-arms the timer with the retry delay.  A gap that fills is forgotten; a gap
that changes (partly filled, so it starts or ends elsewhere) is a new gap
with a fresh initial delay.  Only one gap is chased at a time: once it fills,
the scan moves on to the next.

Delays are why a receiver does not NAK at once: on unicast a short delay lets
reordered packets arrive first; on multicast each receiver draws a random
delay so that one NAK, not one per receiver, reaches the sender (receivers
hear the resend and their own timers find the gap filled).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import NamedTuple, Protocol

from fulmar.driver.term_rebuilder import scan_term
from fulmar.logbuffer import LogBuffers, to_int32

# Aeron's defaults (Configuration.NAK_UNICAST_DELAY_DEFAULT_NS,
# NAK_UNICAST_RETRY_DELAY_RATIO_DEFAULT, NAK_MULTICAST_GROUP_SIZE_DEFAULT,
# NAK_MAX_BACKOFF_DEFAULT_NS; the same in the C driver's context).
NAK_UNICAST_DELAY_DEFAULT_NS = 100_000
NAK_UNICAST_RETRY_DELAY_RATIO_DEFAULT = 100
NAK_MULTICAST_GROUP_SIZE_DEFAULT = 10
NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS = 10_000_000

GapHandler = Callable[[int, int, int], None]


class FeedbackDelayGenerator(Protocol):
    """How long to wait before the first NAK of a gap, and between retries."""

    def generate_delay_ns(self) -> int: ...

    def retry_delay_ns(self) -> int: ...


class StaticDelayGenerator:
    """Fixed delays: Aeron's unicast NAK delay (100 us) and, for retries,
    that delay times the retry ratio (100, so 10 ms): long enough for the
    sender's resend to arrive before asking again."""

    def __init__(
        self,
        delay_ns: int = NAK_UNICAST_DELAY_DEFAULT_NS,
        retry_delay_ns: int = NAK_UNICAST_DELAY_DEFAULT_NS * NAK_UNICAST_RETRY_DELAY_RATIO_DEFAULT,
    ) -> None:
        if delay_ns < 0 or retry_delay_ns < 0:
            raise ValueError(f"NAK delays must not be negative: {delay_ns}, {retry_delay_ns}")
        self._delay_ns = delay_ns
        self._retry_delay_ns = retry_delay_ns

    def generate_delay_ns(self) -> int:
        return self._delay_ns

    def retry_delay_ns(self) -> int:
        return self._retry_delay_ns


class OptimalMulticastDelayGenerator:
    """Random delays in [0, max_backoff) with the exponentially weighted
    distribution of Nonnenmacher and Biersack ("Optimal multicast feedback",
    as Aeron uses it): most receivers wait long, a few wait little, so the
    first NAK usually suppresses the rest.  Retries draw a fresh delay.

    ``rng`` makes it reproducible (tests, simulation); by default each
    generator has its own randomly seeded ``random.Random``.
    """

    def __init__(
        self,
        max_backoff_ns: int = NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS,
        group_size: int = NAK_MULTICAST_GROUP_SIZE_DEFAULT,
        rng: random.Random | None = None,
    ) -> None:
        if max_backoff_ns <= 0 or group_size < 1:
            raise ValueError(f"need max_backoff_ns > 0 and group_size >= 1, got {max_backoff_ns}, {group_size}")
        self.max_backoff_ns = max_backoff_ns
        self.group_size = group_size
        self._rng = rng if rng is not None else random.Random()
        # delay = T/lambda * ln(x * (e^lambda - 1) * T/lambda), x uniform in
        # [lambda / (T (e^lambda - 1)), that + lambda/T): the logarithm's
        # argument runs from 1 to e^lambda, so the delay from 0 to T.
        lam = math.log(group_size) + 1.0
        backoff = float(max_backoff_ns)
        self._rand_max = lam / backoff
        self._base_x = lam / (backoff * (math.exp(lam) - 1.0))
        self._constant_t = backoff / lam
        self._factor_t = (math.exp(lam) - 1.0) * self._constant_t

    def generate_delay_ns(self) -> int:
        x = self._rng.random() * self._rand_max + self._base_x
        return int(self._constant_t * math.log(x * self._factor_t))

    def retry_delay_ns(self) -> int:
        return self.generate_delay_ns()


class Gap(NamedTuple):
    term_id: int
    term_offset: int
    length: int


class LossDetector:
    """Finds the first gap in an image's log and decides when to NAK it.

    ``scan(rebuild_position, hwm_position, now_ns)`` returns
    ``(work_count, rebuild_position)``: the work count is 1 when a new gap
    was found or a NAK was due, and the position is where the contiguous
    data now ends.  One call scans at most the rest of the rebuild
    position's term (as Aeron does); a rebuild position at the end of a term
    is the start of the next, so the next call carries on there.
    """

    def __init__(self, log: LogBuffers, delay_generator: FeedbackDelayGenerator, on_gap_detected: GapHandler) -> None:
        self._log = log
        self._term_length = log.term_length
        self._bits = log.position_bits_to_shift
        self._initial_term_id = log.initial_term_id
        self._delay_generator = delay_generator
        self._on_gap_detected = on_gap_detected
        self.active_gap: Gap | None = None
        self.deadline_ns = 0

    def scan(self, rebuild_position: int, hwm_position: int, now_ns: int) -> tuple[int, int]:
        if rebuild_position >= hwm_position:
            self.active_gap = None
            return 0, rebuild_position

        term_count = rebuild_position >> self._bits
        term_begin = term_count << self._bits
        rebuild_offset = rebuild_position - term_begin
        # Within the high-water mark's term, scan up to it; in an earlier
        # term everything up to the term's end was sent.
        same_term = term_count == hwm_position >> self._bits
        limit_offset = hwm_position - term_begin if same_term else self._term_length

        rebuild_offset, gap_length = scan_term(self._log, term_count % 3, rebuild_offset, limit_offset)
        if gap_length == 0:
            self.active_gap = None
            return 0, term_begin + rebuild_offset

        work_count = 0
        gap = Gap(to_int32(self._initial_term_id + term_count), rebuild_offset, gap_length)
        if gap != self.active_gap:
            # A new gap, or the old one partly filled at either end.  (Aeron's
            # Java driver compares the length too, as here; its C driver only
            # where the gap starts, so a gap filled from its far end keeps
            # its timer and is NAKed with its old length.)
            self.active_gap = gap
            self.deadline_ns = now_ns + self._delay_generator.generate_delay_ns()
            work_count = 1
        if now_ns >= self.deadline_ns:
            self._on_gap_detected(gap.term_id, gap.term_offset, gap.length)
            self.deadline_ns = now_ns + self._delay_generator.retry_delay_ns()
            work_count = 1
        return work_count, term_begin + rebuild_offset

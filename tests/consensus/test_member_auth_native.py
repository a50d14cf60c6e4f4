"""The native member auth context (``consensus/native/member_auth.h``, through
``fulmar.consensus.member_auth.MemberAuth``): the trailer it writes, checked
byte for byte against a pure-Python reference of the format (hmac.digest),
each refusal, the anti-replay window, that a refused check changes nothing,
and the one send counter its signers share."""

from __future__ import annotations

import hmac
import struct

import pytest

from fulmar._native import lib
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.member_auth import (
    REPLAY_WINDOW,
    TRAILER_LENGTH,
    MemberAuth,
    MemberSigner,
    MemberVerifier,
    Refusal,
    derive_key,
)
from fulmar.consensus.protocol import field_offset

KEY = derive_key(b"cluster-secret")
NOW_MS = 1_700_000_000_000
WINDOW_MS = 10_000
MEMBER_FIELD = (field_offset(codecs._APPEND_POSITION_LAYOUT, "followerMemberId"), True)

NO_TRAILER = int(lib.FULMAR_MEMBER_AUTH_NO_TRAILER)
WRONG_MAC = int(lib.FULMAR_MEMBER_AUTH_WRONG_MAC)
OTHER_RECEIVER = int(lib.FULMAR_MEMBER_AUTH_OTHER_RECEIVER)
NOT_A_MEMBER = int(lib.FULMAR_MEMBER_AUTH_NOT_A_MEMBER)
TOO_SHORT = int(lib.FULMAR_MEMBER_AUTH_TOO_SHORT_FOR_MEMBER_ID)
MISMATCH = int(lib.FULMAR_MEMBER_AUTH_MEMBER_ID_MISMATCH)
OUTSIDE_WINDOW = int(lib.FULMAR_MEMBER_AUTH_OUTSIDE_WINDOW)
BEFORE_START = int(lib.FULMAR_MEMBER_AUTH_BEFORE_START)
REPLAYED = int(lib.FULMAR_MEMBER_AUTH_REPLAYED)


def reference_trailer(
    message: bytes, key: bytes, sender: int, receiver: int, boot_id: int, counter: int, timestamp_ms: int
) -> bytes:
    """The trailer as fulmar.consensus.member_auth's docstring defines it,
    made here without the native code."""
    fields = struct.pack("<4siiIQQq", b"FMC1", sender, receiver, 0, boot_id, counter, timestamp_ms)
    return fields + hmac.digest(key, message + fields, "sha256")[:16]


def append_position(follower_member_id: int = 1, log_position: int = 4096) -> bytes:
    buffer = bytearray(64)
    length = codecs.AppendPositionEncoder.encode(
        buffer, 0, leadership_term_id=3, log_position=log_position, follower_member_id=follower_member_id, flags=0
    )
    return bytes(buffer[:length])


def receiver(member_id: int = 0) -> MemberAuth:
    return MemberAuth(member_id, KEY, [0, 1, 2], WINDOW_MS)


def signed_with_counter(counter: int, boot_id: int = 9, sender: int = 1, to: int = 0, now_ms: int = NOW_MS) -> bytes:
    """A message of sender's boot boot_id carrying counter (the context's
    next after counter - 1)."""
    return MemberAuth(sender, KEY, [0, 1, 2], WINDOW_MS, boot_id=boot_id, counter=(counter - 1) % (1 << 64)).sign(
        append_position(sender), to, now_ms
    )


def check(auth: MemberAuth, message: bytes, now_ms: int = NOW_MS, member_field: object = MEMBER_FIELD) -> int:
    return auth.check(message, len(message), now_ms, member_field)  # type: ignore[arg-type]


def test_a_signed_message_round_trips_and_its_bytes_are_the_reference_trailer() -> None:
    sender = MemberAuth(1, KEY, [0, 1, 2], WINDOW_MS, boot_id=0x1122334455667788)
    message = append_position()
    signed = sender.sign(message, 0, NOW_MS)
    assert signed == message + reference_trailer(message, KEY, 1, 0, 0x1122334455667788, 1, NOW_MS)
    assert len(signed) == len(message) + TRAILER_LENGTH == len(message) + 56
    assert check(receiver(), signed) == len(message)
    # The next one: the next counter, the same boot.
    again = sender.sign(message, 2, NOW_MS + 5)
    assert again == message + reference_trailer(message, KEY, 1, 2, 0x1122334455667788, 2, NOW_MS + 5)
    assert check(receiver(2), again) == len(message)


def test_a_boot_id_is_random_unless_given() -> None:
    drawn = {MemberAuth(1, KEY, [0, 1], WINDOW_MS).boot_id for _ in range(4)}
    assert len(drawn) == 4
    assert MemberAuth(1, KEY, [0, 1], WINDOW_MS, boot_id=42).boot_id == 42


def test_what_the_check_refuses() -> None:
    message = append_position()
    good = signed_with_counter(1)
    wrong_magic = bytearray(good)
    wrong_magic[len(message)] ^= 1
    flipped = bytearray(good)
    flipped[16] ^= 1  # in the logPosition field
    forged_mac = bytearray(good)
    forged_mac[-1] ^= 1
    cases = [
        (message, NO_TRAILER),  # unsigned
        (good[: TRAILER_LENGTH + 4], NO_TRAILER),  # too short for a body and a trailer
        (bytes(wrong_magic), NO_TRAILER),
        (bytes(flipped), WRONG_MAC),
        (bytes(forged_mac), WRONG_MAC),
        (MemberAuth(1, derive_key(b"guess"), [0, 1, 2], WINDOW_MS).sign(message, 0, NOW_MS), WRONG_MAC),
        (signed_with_counter(1, to=2), OTHER_RECEIVER),
        (MemberAuth(7, KEY, [7], WINDOW_MS).sign(append_position(7), 0, NOW_MS), NOT_A_MEMBER),
        (MemberAuth(0, KEY, [0], WINDOW_MS).sign(append_position(0), 0, NOW_MS), NOT_A_MEMBER),  # itself
        (MemberAuth(2, KEY, [0, 1, 2], WINDOW_MS).sign(append_position(1), 0, NOW_MS), MISMATCH),
        (signed_with_counter(1, now_ms=NOW_MS - WINDOW_MS - 1), BEFORE_START),
        (signed_with_counter(1, now_ms=NOW_MS + WINDOW_MS + 1), OUTSIDE_WINDOW),
    ]
    for one, code in cases:
        assert check(receiver(), one) == code, (one.hex(), code)
    # At the window's edges: taken.
    assert check(receiver(), signed_with_counter(1, now_ms=NOW_MS - WINDOW_MS)) > 0
    assert check(receiver(), signed_with_counter(1, now_ms=NOW_MS + WINDOW_MS)) > 0
    # A member id field past the body: too short for it.
    assert check(receiver(), good, member_field=(len(message) - 2, True)) == TOO_SHORT
    # StopCatchup's names the receiver.
    assert check(receiver(), good, member_field=(MEMBER_FIELD[0], False)) == MISMATCH
    assert check(receiver(1), MemberAuth(0, KEY, [0, 1], WINDOW_MS).sign(append_position(1), 1, NOW_MS),
                 member_field=(MEMBER_FIELD[0], False)) > 0  # fmt: skip
    # Counter 0 is never signed: taken as a replay.
    assert check(receiver(), signed_with_counter(0)) == REPLAYED


def test_the_refusals_keep_the_python_reasons() -> None:
    verifier = MemberVerifier(0, KEY, [0, 1, 2], WINDOW_MS, lambda: NOW_MS)
    message = append_position()
    with pytest.raises(Refusal, match="^member message without a member trailer$"):
        verifier.check(codecs.AppendPositionDecoder.TEMPLATE_ID, message, 0, len(message))
    signed = signed_with_counter(3)
    framed = b"\xee" * 32 + signed  # a message at an offset in a larger buffer
    assert verifier.check(codecs.AppendPositionDecoder.TEMPLATE_ID, framed, 32, len(signed)) == len(message)
    with pytest.raises(Refusal, match="^member message replayed"):
        verifier.check(codecs.AppendPositionDecoder.TEMPLATE_ID, memoryview(framed), 32, len(signed))


def test_counters_reordered_within_the_window_are_taken_once() -> None:
    auth = receiver()
    for counter in (10, 3, 7, 1, 11, 9):
        assert check(auth, signed_with_counter(counter)) > 0, counter
    for counter in (10, 3, 7, 1, 11, 9):
        assert check(auth, signed_with_counter(counter)) == REPLAYED, counter
    assert check(auth, signed_with_counter(2)) > 0  # never taken, within the window


def test_duplicates_and_counters_older_than_the_window_are_refused() -> None:
    auth = receiver()
    assert check(auth, signed_with_counter(100)) > 0
    assert check(auth, signed_with_counter(100)) == REPLAYED
    assert check(auth, signed_with_counter(100 - REPLAY_WINDOW)) == REPLAYED  # just out of the window
    assert check(auth, signed_with_counter(100 - REPLAY_WINDOW + 1)) > 0  # the oldest in it
    # A jump past the window forgets what was below it: all of it is now too old.
    assert check(auth, signed_with_counter(100 + 2 * REPLAY_WINDOW)) > 0
    assert check(auth, signed_with_counter(150)) == REPLAYED
    assert check(auth, signed_with_counter(100 + 2 * REPLAY_WINDOW - 1)) > 0
    # Another sender, another boot: counters of their own.
    assert check(auth, signed_with_counter(100, sender=2)) > 0
    assert check(auth, signed_with_counter(100, boot_id=10)) > 0


def test_a_refused_check_leaves_the_replay_state_as_it_was() -> None:
    auth = receiver()
    message = signed_with_counter(5)
    # Refused for its timestamp (signed before this receiver took anything), then for its
    # member id field: its counter is not taken.
    assert check(auth, message, now_ms=NOW_MS + WINDOW_MS + 1) == BEFORE_START
    assert check(auth, message, member_field=(MEMBER_FIELD[0], False)) == MISMATCH
    assert check(auth, message) > 0
    # A replay refused changes nothing either: the counters around it are still free.
    assert check(auth, message) == REPLAYED
    assert check(auth, signed_with_counter(4)) > 0
    assert check(auth, signed_with_counter(6)) > 0
    # A new boot's message refused (counter 0) takes no slot from the boots kept.
    for boot in (1, 2, 3):
        assert check(auth, signed_with_counter(1, boot_id=boot)) > 0
    assert check(auth, signed_with_counter(0, boot_id=99)) == REPLAYED
    assert check(auth, signed_with_counter(5)) == REPLAYED  # boot 9 (the least recent) still remembered


def test_the_last_boots_are_kept_the_least_recent_forgotten() -> None:
    auth = receiver()
    for boot in (1, 2, 3, 4):
        assert check(auth, signed_with_counter(1, boot_id=boot)) > 0
    assert check(auth, signed_with_counter(2, boot_id=1)) > 0  # boot 1 used again: boot 2 is now the oldest
    assert check(auth, signed_with_counter(1, boot_id=5)) > 0  # a fifth: boot 2 goes
    assert check(auth, signed_with_counter(1, boot_id=2)) > 0  # forgotten (the timestamp window bounds this)
    assert check(auth, signed_with_counter(1, boot_id=1)) == REPLAYED
    assert check(auth, signed_with_counter(1, boot_id=5)) == REPLAYED


def test_the_signers_of_a_process_share_one_counter() -> None:
    auth = MemberAuth(1, KEY, [0, 1, 2], WINDOW_MS)
    publisher = MemberSigner(1, KEY, lambda: NOW_MS, auth=auth)
    other = MemberSigner(1, KEY, lambda: NOW_MS, auth=auth)
    counters = []
    for signer, to in ((publisher, 0), (other, 0), (publisher, 2), (other, 0)):
        signed = signer.sign(append_position(), to)
        counters.append(struct.unpack_from("<Q", signed, len(signed) - TRAILER_LENGTH + 24)[0])
    assert counters == [1, 2, 3, 4]
    assert auth.counter == publisher.counter == other.counter == 4
    with pytest.raises(ValueError, match="auth context of member 1"):
        MemberSigner(2, KEY, lambda: NOW_MS, auth=auth)


def test_a_context_it_cannot_make_is_refused() -> None:
    with pytest.raises(ValueError, match="up to 16 members"):
        MemberAuth(0, KEY, range(17), WINDOW_MS)
    with pytest.raises(ValueError, match="must not be negative"):
        MemberAuth(0, KEY, [0, 1], -1)


def test_a_known_boots_message_read_late_is_taken_and_a_new_boots_only_if_sent_while_checking() -> None:
    """A receiver paused past the window (or reading what a paused sender's
    socket held) takes a known boot's next messages however old their
    timestamps: their counters guard them.  A boot it does not know must have
    signed within the window before the first message it took: one signed
    since is taken however late, one from before is refused (a recording
    made before this member restarted)."""
    auth = MemberAuth(0, KEY, [0, 1, 2], WINDOW_MS)
    first = MemberAuth(1, KEY, [0, 1, 2], WINDOW_MS, boot_id=5)
    assert check(auth, first.sign(append_position(1), 0, NOW_MS), NOW_MS) > 0
    late = NOW_MS + 10 * WINDOW_MS  # this member paused for ten windows
    signed_before_the_pause = first.sign(append_position(1), 0, NOW_MS + 1)
    assert check(auth, signed_before_the_pause, late) > 0
    new_boot = MemberAuth(2, KEY, [0, 1, 2], WINDOW_MS, boot_id=6)
    assert check(auth, new_boot.sign(append_position(2), 0, NOW_MS + 2), late) > 0
    recorded_before = MemberAuth(2, KEY, [0, 1, 2], WINDOW_MS, boot_id=7)
    old = recorded_before.sign(append_position(2), 0, NOW_MS - WINDOW_MS - 1)
    assert check(auth, old, late) == BEFORE_START
    assert check(auth, old, NOW_MS) == BEFORE_START

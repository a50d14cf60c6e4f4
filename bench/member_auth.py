"""The cost of the consensus stream's member trailer (issue 48): signing and
checking one AppendPosition, next to encoding it alone.

The trailer is made and checked in C (``consensus/native/member_auth.c``, one
context per process): the native consensus threads call it directly, the
agent through ``MemberSigner`` and ``MemberVerifier`` (cffi calls, a copy of
the message into and out of the C buffer).  Both are timed, and the
pure-Python HMAC (``hmac.digest``) of the same bytes for comparison.  One
process; run it with ``python -m bench.member_auth``.  Not part of ``make
bench``: it times a few microseconds.
"""

from __future__ import annotations

import hmac
import time

from fulmar._native import ffi, lib
from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.member_auth import (
    REPLAY_WINDOW,
    TRAILER_LENGTH,
    MemberAuth,
    MemberSigner,
    MemberVerifier,
    derive_key,
)
from fulmar.consensus.protocol import field_offset

TEMPLATE_ID = codecs.AppendPositionDecoder.TEMPLATE_ID
_MEMBER_FIELD_OFFSET = field_offset(codecs._APPEND_POSITION_LAYOUT, "followerMemberId")


def measure(count: int = 100_000) -> dict[str, float]:
    """Microseconds per message: encode; sign and check through the Python
    wrappers; sign and check as the threads do (a C call each, timed in a
    Python loop, so with cffi's call overhead); the Python HMAC alone."""
    key = derive_key(b"bench-secret")
    now_ms = epoch_ms()
    signer = MemberSigner(1, key, epoch_ms)
    verifier = MemberVerifier(0, key, [0, 1, 2], 10_000, epoch_ms)
    buffer = bytearray(64)
    encode = codecs.AppendPositionEncoder.encode

    start = time.perf_counter()
    for i in range(count):
        length = encode(buffer, 0, leadership_term_id=1, log_position=i, follower_member_id=1, flags=0)
        message = bytes(buffer[:length])
    encoded_s = time.perf_counter() - start

    signed = []
    start = time.perf_counter()
    for _ in range(count):
        signed.append(signer.sign(message, 0))
    sign_s = time.perf_counter() - start

    start = time.perf_counter()
    for one in signed:
        verifier.check(TEMPLATE_ID, one, 0, len(one))
    check_s = time.perf_counter() - start

    # As a thread: the trailer written into its own message buffer, a check
    # of a fragment in place.  Each message is checked right after it is
    # signed (its counter within the window).
    thread_sender = MemberAuth(1, key, [0, 1, 2], 10_000)
    thread_receiver = MemberAuth(0, key, [0, 1, 2], 10_000)
    native = ffi.new("char[]", 128)
    ffi.memmove(native, message, length)
    sign, check = lib.fulmar_member_auth_sign, lib.fulmar_member_auth_check
    sender_handle, receiver_handle = thread_sender.handle, thread_receiver.handle
    names_sender = int(lib.FULMAR_MEMBER_AUTH_FIELD_NAMES_SENDER)
    start = time.perf_counter()
    for _ in range(count):
        sign(sender_handle, native, length, 0, now_ms)
    native_sign_s = time.perf_counter() - start
    signed_native = [thread_sender.sign(message, 0, now_ms) for _ in range(REPLAY_WINDOW)]
    views = [ffi.from_buffer("char[]", one) for one in signed_native]
    start = time.perf_counter()
    for i in range(count):
        # Every check after the first REPLAY_WINDOW is refused as a replay, but
        # only after the MAC and the replay lookup: the same work as an accepted one.
        check(receiver_handle, views[i % REPLAY_WINDOW], length + TRAILER_LENGTH, now_ms, _MEMBER_FIELD_OFFSET,
              names_sender, ffi.NULL)  # fmt: skip
    native_check_s = time.perf_counter() - start

    fields = signed[0][length : length + 40]
    start = time.perf_counter()
    for _ in range(count):
        hmac.digest(key, message + fields, "sha256")
    python_hmac_s = time.perf_counter() - start
    return {
        "encode_us": encoded_s / count * 1e6,
        "sign_us": sign_s / count * 1e6,
        "check_us": check_s / count * 1e6,
        "native_sign_us": native_sign_s / count * 1e6,
        "native_check_us": native_check_s / count * 1e6,
        "python_hmac_us": python_hmac_s / count * 1e6,
    }


def main() -> None:
    result = measure()
    print(
        f"AppendPosition (trailer {TRAILER_LENGTH} bytes): encode {result['encode_us']:.2f} us; "
        f"the agent's MemberSigner.sign {result['sign_us']:.2f} us, MemberVerifier.check "
        f"{result['check_us']:.2f} us; a thread's C sign {result['native_sign_us']:.2f} us, C check "
        f"{result['native_check_us']:.2f} us (each with a cffi call's overhead); Python's hmac.digest alone "
        f"{result['python_hmac_us']:.2f} us per message"
    )


if __name__ == "__main__":
    main()

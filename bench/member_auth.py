"""The cost of the consensus stream's member trailer (issue 48): signing and
checking one AppendPosition (fulmar.consensus.member_auth), next to encoding
it alone.  One process; run it with ``python -m bench.member_auth``.  Not part
of ``make bench``: it times a few microseconds of pure Python.
"""

from __future__ import annotations

import time

from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.member_auth import MemberSigner, MemberVerifier, derive_key

TEMPLATE_ID = codecs.AppendPositionDecoder.TEMPLATE_ID


def measure(count: int = 100_000) -> dict[str, float]:
    """Microseconds per message: encode, sign, check."""
    key = derive_key(b"bench-secret")
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
    return {
        "encode_us": encoded_s / count * 1e6,
        "sign_us": sign_s / count * 1e6,
        "check_us": check_s / count * 1e6,
    }


def main() -> None:
    result = measure()
    print(
        f"AppendPosition: encode {result['encode_us']:.2f} us, sign {result['sign_us']:.2f} us, "
        f"check {result['check_us']:.2f} us per message (trailer 56 bytes)"
    )


if __name__ == "__main__":
    main()

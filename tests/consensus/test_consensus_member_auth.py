"""Unit tests of the consensus stream's member guard (fulmar.consensus.member_auth):
the trailer a member signs its messages with, the checks a receiver makes,
and the source-host filter of a cluster without a secret."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.consensus_adapter import ConsensusAdapter
from fulmar.consensus.consensus_publisher import ConsensusPublisher
from fulmar.consensus.member_auth import (
    TRAILER_LENGTH,
    ConsensusGuard,
    MemberSigner,
    MemberVerifier,
    Refusal,
    SourceFilter,
    derive_key,
    is_loopback,
    source_host,
)

KEY = derive_key(b"cluster-secret")
NOW_MS = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = NOW_MS

    def __call__(self) -> int:
        return self.now_ms


def append_position(follower_member_id: int = 1, log_position: int = 1 << 40) -> bytes:
    buffer = bytearray(64)
    length = codecs.AppendPositionEncoder.encode(
        buffer, 0, leadership_term_id=3, log_position=log_position, follower_member_id=follower_member_id, flags=0
    )
    return bytes(buffer[:length])


def verifier(clock: Clock, member_id: int = 0) -> MemberVerifier:
    return MemberVerifier(member_id, KEY, [0, 1, 2], 10_000, clock)


def check(v: MemberVerifier, message: bytes) -> int:
    return v.check(codecs.AppendPositionDecoder.TEMPLATE_ID, message, 0, len(message))


def test_the_key_is_derived_from_the_secret_not_the_secret_itself() -> None:
    assert derive_key(b"cluster-secret") == KEY != b"cluster-secret"
    assert derive_key(b"other") != KEY
    with pytest.raises(ValueError):
        derive_key(b"")


def test_a_signed_message_is_accepted_once_and_its_replay_refused() -> None:
    clock = Clock()
    signer = MemberSigner(1, KEY, clock)
    message = append_position()
    signed = signer.sign(message, 0)
    assert len(signed) == len(message) + TRAILER_LENGTH
    v = verifier(clock)
    assert check(v, signed) == len(message)
    with pytest.raises(Refusal, match="replayed"):
        check(v, signed)
    assert check(v, signer.sign(message, 0)) == len(message)  # the next one is fine


def test_an_aeron_decoder_reads_a_signed_message_by_its_block_length() -> None:
    signed = MemberSigner(1, KEY, Clock()).sign(append_position(log_position=4096), 0)
    decoded = codecs.AppendPositionDecoder().wrap_and_apply_header(signed, 0, len(signed))
    assert (decoded.leadership_term_id, decoded.log_position, decoded.follower_member_id) == (3, 4096, 1)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda clock: append_position(), "without a member trailer"),
        (lambda clock: MemberSigner(1, derive_key(b"guess"), clock).sign(append_position(), 0), "wrong MAC"),
        (lambda clock: MemberSigner(1, KEY, clock).sign(append_position(), 2), "addressed to another member"),
        (lambda clock: MemberSigner(7, KEY, clock).sign(append_position(7), 0), "not another member"),
        (lambda clock: MemberSigner(0, KEY, clock).sign(append_position(0), 0), "not another member"),
        (lambda clock: MemberSigner(2, KEY, clock).sign(append_position(1), 0), "not its sender's"),
    ],
)
def test_what_a_receiver_refuses(make: Any, reason: str) -> None:
    clock = Clock()
    with pytest.raises(Refusal, match=reason):
        check(verifier(clock), make(clock))


def test_a_changed_byte_breaks_the_mac() -> None:
    clock = Clock()
    signed = bytearray(MemberSigner(1, KEY, clock).sign(append_position(log_position=4096), 0))
    struct.pack_into("<q", signed, 16, 1 << 40)  # the logPosition field
    with pytest.raises(Refusal, match="wrong MAC"):
        check(verifier(clock), bytes(signed))


def test_a_timestamp_outside_the_window_is_refused_a_new_boot_is_taken() -> None:
    clock = Clock()
    old = MemberSigner(1, KEY, clock, boot_id=1).sign(append_position(), 0)
    clock.now_ms += 10_001
    v = verifier(clock)
    with pytest.raises(Refusal, match="signed before this member began"):
        check(v, old)
    # The sender restarted (a new boot, its counter from 1 again): taken.
    assert check(v, MemberSigner(1, KEY, clock, boot_id=2).sign(append_position(), 0)) > 0
    # A replay within the window of the earlier boot's last message is not.
    first = MemberSigner(1, KEY, clock, boot_id=3)
    message = first.sign(append_position(), 0)
    assert check(v, message) > 0
    with pytest.raises(Refusal, match="replayed"):
        check(v, message)


def test_the_publisher_signs_every_message_for_its_destination() -> None:
    class Link:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def offer(self, buffer: bytes) -> int:
            self.sent.append(buffer)
            return len(buffer)

    clock = Clock()
    links = {0: Link(), 2: Link()}
    publisher = ConsensusPublisher(links, signer=MemberSigner(1, KEY, clock))
    publisher.request_vote(0, log_leadership_term_id=1, log_position=0, candidate_term_id=2, candidate_member_id=1)
    publisher.append_position(2, leadership_term_id=1, log_position=64, follower_member_id=1)

    calls: list[tuple[Any, ...]] = []

    class Listener:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: calls.append((name, *args))

    refused: list[str] = []
    adapter = ConsensusAdapter(
        Listener(),
        guard=ConsensusGuard(lambda reason, source: refused.append(reason), verifier=verifier(clock, 0)),
    )
    vote_request = links[0].sent[0]
    adapter.on_fragment(vote_request, 0, len(vote_request))
    assert calls == [("on_request_vote", 1, 0, 2, 1, calls[0][5])]
    # The AppendPosition was signed for member 2: member 0 refuses it.
    misdirected = links[2].sent[0]
    adapter.on_fragment(misdirected, 0, len(misdirected))
    assert refused == ["member message addressed to another member"] and len(calls) == 1
    # Tools' messages carry their own credentials: not a member message.
    buffer = bytearray(256)
    length = codecs.HeartbeatRequestEncoder.encode(
        buffer, 0, correlation_id=5, response_stream_id=9, response_channel="aeron:udp", encoded_credentials=b""
    )
    adapter.on_fragment(bytes(buffer[:length]), 0, length)
    assert calls[-1][0] == "on_heartbeat_request" and len(refused) == 1


def test_the_source_filter_takes_the_members_hosts_only() -> None:
    members = SourceFilter(["127.0.0.1", "10.0.0.2", "localhost"])
    assert members.admits("127.0.0.1:40123")
    assert members.admits("10.0.0.2:1")
    assert not members.admits("10.0.0.3:1")
    assert not members.admits("[::2]:5")
    assert source_host("[::1]:20110") == "::1" and source_host("node1:20110") == "node1"
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("10.0.0.2")

    refused: list[tuple[str, str | None]] = []
    guard = ConsensusGuard(
        lambda reason, source: refused.append((reason, source)),
        source_filter=SourceFilter(["127.0.0.1"]),
        source_of=lambda header: header,
    )
    message = append_position()
    template = codecs.AppendPositionDecoder.TEMPLATE_ID
    assert guard.admit(template, message, 0, len(message), "127.0.0.1:5") == len(message)
    assert guard.admit(template, message, 0, len(message), "192.168.1.9:5") == -1
    assert refused == [("member message from a host that is not a member's", "192.168.1.9:5")]

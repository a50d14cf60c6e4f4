"""Who may speak on the consensus stream (stream 108, issue 48).

A member's consensus endpoint is a UDP port: without a check, anyone who can
reach it can send an AppendPosition in a follower's name and make the leader
commit what one member holds, or a RequestVote, a NewLeadershipTerm, a
CommitPosition.  Two guards, applied where the consensus adapter decodes
(``ConsensusAdapter.guard``), once for every message type:

* With a secret (the node's ``[consensus] authenticator_secret``), each
  member message a member sends carries a *trailer* after its SBE body, and a
  receiver drops a member message without a valid one.  Aeron's decoders read
  a message by its block length and var-data lengths and ignore what follows,
  so an Aeron member still reads fulmar's messages; Aeron's carry no trailer,
  so a mixed cluster turns the check off (``authenticate_members = false``).

  Trailer (``TRAILER_LENGTH`` = 56 bytes, little-endian, at the end of the
  fragment)::

      @0  magic       4 bytes  b"FMC1"
      @4  sender      i32      the sending member's id
      @8  receiver    i32      the member it is addressed to
      @12 key_id      u32      0 (room for a key rotation)
      @16 boot_id     u64      random, drawn once per process start
      @24 counter     u64      per boot, +1 for each message sent (to anyone)
      @32 timestamp   i64      the sender's epoch milliseconds
      @40 mac         16 bytes HMAC-SHA256(key, message || trailer[0:40])[:16]

  ``key = HMAC-SHA256(secret, b"fulmar consensus v1")``: the clients'
  credential is never itself the key.  A receiver accepts a member message
  only if the MAC is right, the receiver is itself, the sender is another
  member, the message's own member id field (where it has one) names the
  sender (StopCatchup's names the receiver), the timestamp is within
  ``window_ms`` of its own clock (bounding a replay across restarts: its
  memory of counters goes with it), and the counter is above the last it took
  from that sender's boot (a replay within a boot).

* Without a secret, a member takes consensus messages only from images whose
  source address (the image's source identity, its host part) is one of the
  hosts of its cluster members (``SourceFilter``).

Both leave alone what the stream carries for tools that are not members
(BackupQuery, HeartbeatRequest, StandbySnapshot, ChallengeResponse): those
present their own credentials to the module's authenticator.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
import struct
from collections.abc import Callable, Iterable
from typing import Any

from fulmar.codecs.generated import cluster as codecs
from fulmar.codecs.runtime import HEADER_LENGTH
from fulmar.consensus.protocol import field_offset

KEY_INFO = b"fulmar consensus v1"
MAGIC = b"FMC1"
MAC_LENGTH = 16
_FIELDS = struct.Struct("<4siiIQQq")
TRAILER_LENGTH = _FIELDS.size + MAC_LENGTH  # 56
_SIGNED_FIELDS_LENGTH = _FIELDS.size  # 40
# How many boots of one sender a receiver remembers the counters of.
_BOOTS_KEPT = 4
_INT32 = struct.Struct("<i")

# The member messages: what members send each other (seeds 000, 001).  For
# each, where its own member id field is, and whether it names the sender
# (True) or the receiver (False); None: it has none.
_MEMBER_FIELD: dict[int, tuple[int, bool] | None] = {
    codecs.CanvassPositionDecoder.TEMPLATE_ID: (
        field_offset(codecs._CANVASS_POSITION_LAYOUT, "followerMemberId"),
        True,
    ),
    codecs.RequestVoteDecoder.TEMPLATE_ID: (field_offset(codecs._REQUEST_VOTE_LAYOUT, "candidateMemberId"), True),
    codecs.VoteDecoder.TEMPLATE_ID: (field_offset(codecs._VOTE_LAYOUT, "followerMemberId"), True),
    codecs.NewLeadershipTermDecoder.TEMPLATE_ID: (
        field_offset(codecs._NEW_LEADERSHIP_TERM_LAYOUT, "leaderMemberId"),
        True,
    ),
    codecs.AppendPositionDecoder.TEMPLATE_ID: (field_offset(codecs._APPEND_POSITION_LAYOUT, "followerMemberId"), True),
    codecs.CommitPositionDecoder.TEMPLATE_ID: (field_offset(codecs._COMMIT_POSITION_LAYOUT, "leaderMemberId"), True),
    codecs.CatchupPositionDecoder.TEMPLATE_ID: (
        field_offset(codecs._CATCHUP_POSITION_LAYOUT, "followerMemberId"),
        True,
    ),
    # The leader tells a follower to stop catching up: the id is the follower's.
    codecs.StopCatchupDecoder.TEMPLATE_ID: (field_offset(codecs._STOP_CATCHUP_LAYOUT, "followerMemberId"), False),
    codecs.TerminationPositionDecoder.TEMPLATE_ID: None,
    codecs.TerminationAckDecoder.TEMPLATE_ID: (field_offset(codecs._TERMINATION_ACK_LAYOUT, "memberId"), True),
}
MEMBER_TEMPLATE_IDS = frozenset(_MEMBER_FIELD)


def derive_key(secret: bytes) -> bytes:
    """The key the members sign consensus messages with: derived from the
    node's secret for this purpose only."""
    if not secret:
        raise ValueError("member authentication needs a non-empty secret")
    return hmac.new(secret, KEY_INFO, hashlib.sha256).digest()


def _mac(key: bytes, signed: bytes | memoryview) -> bytes:
    return hmac.digest(key, signed, "sha256")[:MAC_LENGTH]


class MemberSigner:
    """Appends the trailer to each message this member sends."""

    def __init__(
        self, member_id: int, key: bytes, epoch_ms: Callable[[], int], boot_id: int | None = None, counter: int = 0
    ) -> None:
        self.member_id = member_id
        self._key = key
        self._epoch_ms = epoch_ms
        self.boot_id = int.from_bytes(os.urandom(8), "little") if boot_id is None else boot_id
        self.counter = counter

    def sign(self, message: bytes, to_member_id: int) -> bytes:
        self.counter += 1
        fields = _FIELDS.pack(MAGIC, self.member_id, to_member_id, 0, self.boot_id, self.counter, self._epoch_ms())
        signed = message + fields
        return signed + _mac(self._key, signed)


class Refusal(Exception):
    """Why a consensus message was dropped (its text goes to the error log,
    the same for every refusal of a kind)."""


class MemberVerifier:
    """Checks the trailer of the member messages this member receives."""

    def __init__(
        self,
        member_id: int,
        key: bytes,
        member_ids: Iterable[int],
        window_ms: int,
        epoch_ms: Callable[[], int],
    ) -> None:
        self.member_id = member_id
        self._key = key
        self._others = frozenset(member_ids) - {member_id}
        self.window_ms = window_ms
        self._epoch_ms = epoch_ms
        # Per sender: boot id -> the highest counter taken, most recent boot last.
        self._counters: dict[int, dict[int, int]] = {}

    def check(self, template_id: int, buffer: Any, offset: int, length: int) -> int:
        """The length of the message without its trailer, once accepted;
        raises ``Refusal`` otherwise."""
        body_length = length - TRAILER_LENGTH
        if body_length < HEADER_LENGTH:
            raise Refusal("member message without a member trailer")
        trailer_at = offset + body_length
        magic, sender, receiver, _key_id, boot_id, counter, timestamp_ms = _FIELDS.unpack_from(buffer, trailer_at)
        if magic != MAGIC:
            raise Refusal("member message without a member trailer")
        view = memoryview(buffer)
        signed_end = trailer_at + _SIGNED_FIELDS_LENGTH
        expected = _mac(self._key, view[offset:signed_end])
        if not hmac.compare_digest(expected, bytes(view[signed_end : signed_end + MAC_LENGTH])):
            raise Refusal("member message with a wrong MAC")
        if receiver != self.member_id:
            raise Refusal("member message addressed to another member")
        if sender not in self._others:
            raise Refusal("member message from a sender that is not another member")
        member_field = _MEMBER_FIELD.get(template_id)
        if member_field is not None:
            field_at, names_sender = member_field
            if offset + field_at + 4 > trailer_at:
                raise Refusal("member message too short for its member id")
            (named,) = _INT32.unpack_from(buffer, offset + field_at)
            if named != (sender if names_sender else self.member_id):
                raise Refusal("member message whose member id is not its sender's")
        now_ms = self._epoch_ms()
        if abs(now_ms - timestamp_ms) > self.window_ms:
            raise Refusal("member message with a timestamp outside the window (a replay, or clocks apart)")
        boots = self._counters.setdefault(sender, {})
        last = boots.pop(boot_id, 0)
        if counter <= last:
            boots[boot_id] = last
            raise Refusal("member message replayed (its counter is not above the last taken)")
        boots[boot_id] = counter  # re-inserted last: the most recent boot
        while len(boots) > _BOOTS_KEPT:
            del boots[next(iter(boots))]
        return body_length


def source_host(source_identity: str) -> str:
    """The host part of an image's source identity (``host:port``, ``[v6]:port``)."""
    if source_identity.startswith("["):
        return source_identity[1 : source_identity.find("]")]
    return source_identity.rpartition(":")[0] or source_identity


def _addresses(host: str) -> set[str]:
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return set()


class SourceFilter:
    """Consensus messages only from the members' hosts (a cluster without a
    secret): an image's source must be one of their addresses."""

    def __init__(self, member_hosts: Iterable[str]) -> None:
        self.addresses: set[str] = set()
        for host in member_hosts:
            self.addresses |= _addresses(host)

    def admits(self, source_identity: str) -> bool:
        host = source_host(source_identity)
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            return False
        return host in self.addresses


def is_loopback(host: str) -> bool:
    addresses = _addresses(host)
    return bool(addresses) and all(ipaddress.ip_address(address).is_loopback for address in addresses)


class ConsensusGuard:
    """What the consensus adapter asks before it decodes a fragment:
    ``admit`` returns the length to decode, or -1 when it is dropped (then
    ``on_refused(reason, source)`` has been called: the reason is the same
    for every refusal of a kind, the source identity is the image's if known)."""

    def __init__(
        self,
        on_refused: Callable[[str, str | None], None],
        verifier: MemberVerifier | None = None,
        source_filter: SourceFilter | None = None,
        source_of: Callable[[Any], str | None] | None = None,
    ) -> None:
        self.on_refused = on_refused
        self.verifier = verifier
        self.source_filter = source_filter
        self.source_of = source_of
        self.refused = 0

    def admit(self, template_id: int, buffer: Any, offset: int, length: int, header: Any) -> int:
        if template_id not in MEMBER_TEMPLATE_IDS:
            return length
        if self.source_filter is not None and self.source_of is not None:
            source = self.source_of(header)
            if source is None or not self.source_filter.admits(source):
                self._refuse("member message from a host that is not a member's", source)
                return -1
        if self.verifier is not None:
            try:
                return self.verifier.check(template_id, buffer, offset, length)
            except Refusal as refusal:
                self._refuse(str(refusal), self.source_of(header) if self.source_of is not None else None)
                return -1
        return length

    def _refuse(self, reason: str, source: str | None) -> None:
        self.refused += 1
        self.on_refused(reason, source)

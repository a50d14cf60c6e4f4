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
  sender (StopCatchup's names the receiver), the timestamp is not more than
  ``window_ms`` ahead of its own clock, and the counter was not taken before
  from that sender's boot (a replay within a boot).  A boot the receiver does
  not know yet (it restarted and forgot its counters, or the sender is new)
  must also have signed no earlier than ``window_ms`` before the first
  message the receiver took (a message recorded before the receiver restarted, sent
  again, is refused); a known boot's message is taken however late it is
  read (a member, or its peer, paused: what its socket buffer held).

  The trailer is made and checked in C (``consensus/native/member_auth.h``), in one
  context per process (``MemberAuth``) that the agent's publisher and
  guard and the native consensus threads share: one send counter for all of
  them, and, per sender, for the last few boots, the highest counter taken
  and a 64-counter window below it (IPsec's anti-replay window).  Two
  signers (the agent and a thread) may offer to the same member out of
  counter order, so a counter below the highest is taken once if it is
  within the window; a counter taken, or older than the window, is refused.
  A check that fails changes nothing: a thread that hands a message back to
  the agent leaves the agent's check to find the same fault.

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
import socket
from collections.abc import Callable, Iterable
from typing import Any

from fulmar._native import ffi, lib
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.protocol import field_offset

KEY_INFO = b"fulmar consensus v1"
MAGIC = b"FMC1"
MAC_LENGTH = int(lib.FULMAR_MAC_LENGTH)
TRAILER_LENGTH = int(lib.FULMAR_MEMBER_AUTH_TRAILER_LENGTH)  # 56
# How many boots of one sender a receiver remembers the counters of, and how
# far below the highest counter taken a counter may still be taken once.
BOOTS_KEPT = int(lib.FULMAR_MEMBER_AUTH_BOOTS_KEPT)
REPLAY_WINDOW = int(lib.FULMAR_MEMBER_AUTH_REPLAY_WINDOW)
MAX_MEMBERS = int(lib.FULMAR_MEMBER_AUTH_MAX_MEMBERS)

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

# A member that has just started may be handed what its driver held for its
# previous run (the image outlives the subscription that died): those
# messages, and replays of recorded ones, are dropped with this reason.
BEFORE_START_REASON = (
    "member message signed before this member began taking messages (one to its previous run, or a replay)"
)
# What each refusal of the native check is called (the same text for every
# refusal of a kind: the error log keeps one entry per text).
_REASONS = {
    int(lib.FULMAR_MEMBER_AUTH_NO_TRAILER): "member message without a member trailer",
    int(lib.FULMAR_MEMBER_AUTH_WRONG_MAC): "member message with a wrong MAC",
    int(lib.FULMAR_MEMBER_AUTH_OTHER_RECEIVER): "member message addressed to another member",
    int(lib.FULMAR_MEMBER_AUTH_NOT_A_MEMBER): "member message from a sender that is not another member",
    int(lib.FULMAR_MEMBER_AUTH_TOO_SHORT_FOR_MEMBER_ID): "member message too short for its member id",
    int(lib.FULMAR_MEMBER_AUTH_MEMBER_ID_MISMATCH): "member message whose member id is not its sender's",
    int(lib.FULMAR_MEMBER_AUTH_OUTSIDE_WINDOW): (
        "member message with a timestamp outside the window (a replay, or clocks apart)"
    ),
    int(lib.FULMAR_MEMBER_AUTH_BEFORE_START): BEFORE_START_REASON,
    int(lib.FULMAR_MEMBER_AUTH_REPLAYED): (
        "member message replayed (its counter was taken already, or is older than the replay window)"
    ),
}


def derive_key(secret: bytes) -> bytes:
    """The key the members sign consensus messages with: derived from the
    node's secret for this purpose only."""
    if not secret:
        raise ValueError("member authentication needs a non-empty secret")
    return hmac.new(secret, KEY_INFO, hashlib.sha256).digest()


class MemberAuth:
    """The native context (``consensus/native/member_auth.h``) that signs and
    checks the trailers of one process: its key, its member id and the
    members', its boot id and its one send counter, and what it has taken
    from each sender.  The agent's publisher and guard and the native
    consensus threads all use the same one (``handle``), which must outlive
    the threads armed with it."""

    def __init__(
        self,
        member_id: int,
        key: bytes,
        member_ids: Iterable[int],
        window_ms: int,
        boot_id: int | None = None,
        counter: int = 0,
    ) -> None:
        ids = sorted(set(member_ids) | {member_id})
        if len(ids) > MAX_MEMBERS:
            raise ValueError(f"member authentication takes up to {MAX_MEMBERS} members, not {len(ids)}")
        if window_ms < 0:
            raise ValueError(f"the member trailer's window must not be negative, not {window_ms} ms")
        boot = ffi.NULL if boot_id is None else ffi.new("uint64_t *", boot_id)
        handle = lib.fulmar_member_auth_new(key, len(key), member_id, ids, len(ids), boot, counter, window_ms)
        if handle == ffi.NULL:
            raise OSError(ffi.errno, f"cannot make the member auth context: errno {ffi.errno}")
        self.handle = ffi.gc(handle, lib.fulmar_member_auth_free)
        self.member_id = member_id
        self.member_ids = frozenset(ids)
        self.window_ms = window_ms
        self.boot_id = int(lib.fulmar_member_auth_boot_id(handle))
        self._sender = ffi.new("int32_t *")
        self._buffer = ffi.new("char[]", 4096)

    @property
    def counter(self) -> int:
        """The last counter signed with, by any signer of this context."""
        return int(lib.fulmar_member_auth_counter(self.handle))

    def sign(self, message: bytes, to_member_id: int, now_ms: int) -> bytes:
        length = len(message)
        buffer = self._buffer if length + TRAILER_LENGTH <= len(self._buffer) else ffi.new("char[]", length + 64)
        ffi.memmove(buffer, message, length)
        signed = lib.fulmar_member_auth_sign(self.handle, buffer, length, to_member_id, now_ms)
        return bytes(ffi.buffer(buffer, signed))

    def check(self, message: Any, length: int, now_ms: int, member_field: tuple[int, bool] | None = None) -> int:
        """The body's length once accepted, else a negative refusal code
        (``reason`` names it).  ``message`` starts at the message's first
        byte; ``member_field``: where its own member id field is, and
        whether it names the sender (True) or the receiver (False)."""
        if member_field is None:
            field_at, field = 0, int(lib.FULMAR_MEMBER_AUTH_FIELD_NONE)
        else:
            field_at = member_field[0]
            field = int(
                lib.FULMAR_MEMBER_AUTH_FIELD_NAMES_SENDER
                if member_field[1]
                else lib.FULMAR_MEMBER_AUTH_FIELD_NAMES_RECEIVER
            )
        return int(lib.fulmar_member_auth_check(self.handle, message, length, now_ms, field_at, field, self._sender))

    @staticmethod
    def reason(code: int) -> str:
        return _REASONS.get(code, f"member message refused (code {code})")


def _message_view(buffer: Any, offset: int, length: int) -> Any:
    """The message as the native check reads it, without a copy where the
    buffer allows (bytes, bytearray, a memoryview, a mapped buffer)."""
    try:
        return ffi.from_buffer("char[]", buffer)[offset : offset + length]
    except TypeError:
        return bytes(memoryview(buffer)[offset : offset + length])


class MemberSigner:
    """Appends the trailer to each message this member sends (through the
    process's ``MemberAuth``: its counter is the threads' too)."""

    def __init__(
        self,
        member_id: int,
        key: bytes,
        epoch_ms: Callable[[], int],
        boot_id: int | None = None,
        counter: int = 0,
        *,
        auth: MemberAuth | None = None,
    ) -> None:
        self.member_id = member_id
        self._epoch_ms = epoch_ms
        if auth is None:
            auth = MemberAuth(member_id, key, (member_id,), 0, boot_id=boot_id, counter=counter)
        elif auth.member_id != member_id:
            raise ValueError(f"a signer of member {member_id} given the auth context of member {auth.member_id}")
        self.auth = auth
        self.boot_id = auth.boot_id

    @property
    def counter(self) -> int:
        return self.auth.counter

    def sign(self, message: bytes, to_member_id: int) -> bytes:
        return self.auth.sign(message, to_member_id, self._epoch_ms())


class Refusal(Exception):
    """Why a consensus message was dropped (its text goes to the error log,
    the same for every refusal of a kind)."""


class MemberVerifier:
    """Checks the trailer of the member messages this member receives
    (through the process's ``MemberAuth``, which holds what was taken)."""

    def __init__(
        self,
        member_id: int,
        key: bytes,
        member_ids: Iterable[int],
        window_ms: int,
        epoch_ms: Callable[[], int],
        *,
        auth: MemberAuth | None = None,
    ) -> None:
        self.member_id = member_id
        self.window_ms = window_ms
        self._epoch_ms = epoch_ms
        if auth is None:
            auth = MemberAuth(member_id, key, member_ids, window_ms)
        elif auth.member_id != member_id or auth.window_ms != window_ms:
            raise ValueError(
                f"a verifier of member {member_id} ({window_ms} ms) given the auth context of member "
                f"{auth.member_id} ({auth.window_ms} ms)"
            )
        self.auth = auth

    def check(self, template_id: int, buffer: Any, offset: int, length: int) -> int:
        """The length of the message without its trailer, once accepted;
        raises ``Refusal`` otherwise."""
        result = self.auth.check(
            _message_view(buffer, offset, length), length, self._epoch_ms(), _MEMBER_FIELD.get(template_id)
        )
        if result < 0:
            raise Refusal(MemberAuth.reason(result))
        return result


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

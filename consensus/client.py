"""The cluster client: a session with a cluster (Aeron's ``AeronCluster``).

A client publishes on the *ingress* (to the consensus module of the leader)
and subscribes to the *egress* (answers from the consensus module and the
clustered service).  ``ClusterClient.connect`` opens a session::

    client = ClusterClient.connect(aeron, ingress_endpoints="0=10.0.0.1:9010,1=10.0.0.2:9010",
                                   ingress_channel="aeron:udp", on_message=handle)
    client.offer(b"deposit 10")          # position, or a negative back-pressure code
    client.poll_egress()                 # replies arrive in ``handle``
    client.close()

Connecting follows Aeron's sequence.  With ``ingress_endpoints`` (``"id=host:port,..."``)
the client adds one ingress publication per member, sends a SessionConnectRequest
through the first one that connects, and follows a REDIRECT from a follower to the
leader it names (the event's ``detail`` is the cluster's ingress endpoint list in the
same ``id=host:port`` form and ``leader_member_id`` picks the entry).  A request left
unanswered for ``CONNECT_ATTEMPT_TIMEOUT_NS`` (sent to a leader that died, or to a
member whose election closed its ingress) is sent again, after a short back-off, to
the next member; an answer to any attempt counts.  A Challenge is
answered with the credentials the ``on_challenge`` supplier returns; SessionEvent OK
completes the connect, ERROR and AUTHENTICATION_REJECTED fail it with the event's
detail.  Once connected only the leader's publication is kept.  After an election the
new leader sends NewLeaderEvent; the client then points its ingress at the new leader
(``ingress_endpoints`` in the event, leader first) and stamps its messages with the
new leadership term.

Every application message on ingress and egress is one message made of the 32-byte
SessionMessageHeader (8-byte SBE header plus leadershipTermId, clusterSessionId,
timestamp) followed directly by the user's payload.

``ClusterClient`` is not thread safe: use it from one thread (``AsyncClusterClient``
runs one on a dedicated thread for asyncio programs).
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fulmar.channel_uri import ChannelUri
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.errors import CodecError, FulmarError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header, SessionMessages
from fulmar.log_writer import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    BufferClaim,
)

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.publication import Publication
    from fulmar.subscription import Subscription

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "CONNECT_ATTEMPT_TIMEOUT_MAX_NS",
    "CONNECT_ATTEMPT_TIMEOUT_NS",
    "CONNECT_RETRY_BACKOFF_NS",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "SESSION_HEADER_LENGTH",
    "AsyncClusterClient",
    "AuthenticationRejectedError",
    "ClusterClient",
    "ClusterClientError",
    "ClusterConnectError",
    "ClusterSessionClosedError",
    "ClusterTimeoutError",
    "EgressMessage",
    "MediaDriverLostError",
    "parse_ingress_endpoints",
]

SBE_HEADER_LENGTH = 8
SESSION_HEADER_LENGTH = SBE_HEADER_LENGTH + codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH  # 32

SEND_ATTEMPTS = 3
DEFAULT_FRAGMENT_LIMIT = 10
DEFAULT_KEEPALIVE_INTERVAL_NS = protocol.SESSION_TIMEOUT_NS // 4
# Longest sleep on the data doorbell while waiting: connection state changes
# (a publication becoming connected) ring no doorbell, so waits are short.
_MAX_WAIT_NS = 1_000_000
# A connect request the cluster has not answered within this is asked again,
# of the next member (it may have gone to a leader that died, or to a member
# whose election closed its ingress: seed 001); each later attempt waits twice
# as long, up to the max, so a cluster that is merely slow is not flooded.  A
# healthy cluster answers in milliseconds.
CONNECT_ATTEMPT_TIMEOUT_NS = 1_000_000_000
CONNECT_ATTEMPT_TIMEOUT_MAX_NS = 2_000_000_000
# The pause before asking again (the cluster is likely between leaders).
CONNECT_RETRY_BACKOFF_NS = 100_000_000

# The SBE message header and the session message header block, read straight
# from the term buffer on the hot path (no decoder object per message).
_SBE_HEADER = struct.Struct("<HHHH")
_SESSION_BLOCK = struct.Struct("<qqq")
_SESSION_TEMPLATE_ID = codecs.SessionMessageHeaderDecoder.TEMPLATE_ID
_SESSION_BLOCK_LENGTH = codecs.SessionMessageHeaderDecoder.BLOCK_LENGTH


class ClusterClientError(FulmarError):
    """Base class of the cluster client's errors."""


class ClusterConnectError(ClusterClientError):
    """The cluster refused the session (SessionEvent ERROR), or no ingress could be set up."""


class AuthenticationRejectedError(ClusterConnectError):
    """The cluster's authenticator rejected the credentials (SessionEvent AUTHENTICATION_REJECTED)."""


class ClusterTimeoutError(ClusterClientError):
    """No answer from the cluster within the message timeout."""


class ClusterSessionClosedError(ClusterClientError):
    """The session is closed: by ``close()``, or by the cluster (SessionEvent CLOSED)."""


class MediaDriverLostError(ClusterSessionClosedError):
    """The session is closed because the Aeron client it runs on is: its media
    driver is gone (its process died, a new driver took its directory, its
    heartbeat stopped), the driver timed the client out, or its owner closed
    it.  The message names the driver's directory and the Aeron client's error
    (also the ``__cause__``)."""


MessageHandler = Callable[[int, int, memoryview], None]
NewLeaderHandler = Callable[[int, int, int, str], None]
SessionEventHandler = Callable[[int, int, int, int, "codecs.EventCode", str], None]
AdminResponseHandler = Callable[[int, int, "codecs.AdminRequestType", "codecs.AdminResponseCode", str, bytes], None]
ChallengeHandler = Callable[[bytes], bytes]


def parse_ingress_endpoints(endpoints: str) -> dict[int, str]:
    """``"0=host:port,1=host:port"`` as ``{member_id: "host:port"}``."""
    members: dict[int, str] = {}
    for entry in endpoints.split(","):
        entry = entry.strip()
        if not entry:
            continue
        member, separator, endpoint = entry.partition("=")
        if not separator:
            raise ValueError(f"ingress endpoint {entry!r} in {endpoints!r} lacks the 'member_id=' prefix")
        try:
            member_id = int(member)
        except ValueError:
            raise ValueError(
                f"ingress endpoint {entry!r} in {endpoints!r}: member id {member!r} is not an integer"
            ) from None
        if not endpoint:
            raise ValueError(f"ingress endpoint {entry!r} in {endpoints!r} has no address")
        members[member_id] = endpoint
    return members


def _member_channel(ingress_channel: str, endpoint: str | None) -> str:
    """The ingress channel aimed at one member (UDP only: IPC and others are used as given)."""
    uri = ChannelUri.parse(ingress_channel)
    if endpoint is None or not uri.is_udp:
        return ingress_channel
    return str(uri.with_param("endpoint", endpoint))


def _response_channel(subscription: Subscription, egress_channel: str) -> str | None:
    """The egress channel as the cluster must use it: a UDP endpoint's port 0
    replaced by the port the driver bound (None until it is bound)."""
    uri = ChannelUri.parse(egress_channel)
    endpoint = uri.get("endpoint")
    if not uri.is_udp or endpoint is None or not endpoint.endswith(":0"):
        return egress_channel
    resolved = subscription.resolved_endpoint
    if resolved is None:
        return None
    return str(uri.with_param("endpoint", resolved))


def _wait_for_data(aeron: Aeron, ready: Callable[[], bool], timeout_ns: int) -> None:
    """Sleep on the driver's data doorbell (rung when data lands in any log)
    for at most ``timeout_ns``, unless ``ready()`` already holds."""
    doorbell = aeron.conductor.data_doorbell
    token = doorbell.prepare()
    if ready():
        doorbell.cancel()
        return
    doorbell.wait(token, max(1, timeout_ns))


@dataclass
class _Member:
    member_id: int
    endpoint: str | None
    publication: Publication | None = None
    error: BaseException | None = None

    def close(self) -> None:
        if self.publication is not None:
            publication, self.publication = self.publication, None
            publication.close()


@dataclass(frozen=True)
class EgressMessage:
    """An application message from the cluster (a copy: safe to keep)."""

    cluster_session_id: int
    timestamp: int
    payload: bytes


# ---------------------------------------------------------------------------- connect


class _Connector:
    """Aeron's AsyncConnect: one step per ``poll(now_ns)``, no sleeping inside.

    States: AWAIT_PUBLICATION_CONNECTED -> SEND_MESSAGE -> POLL_RESPONSE -> DONE,
    back to AWAIT_PUBLICATION_CONNECTED after a REDIRECT and to SEND_MESSAGE after
    a Challenge.

    Beyond Aeron's: a request left unanswered for the attempt timeout goes to
    BACKOFF, then is sent again (a new correlation id) through the next member
    whose publication is connected.  During an election every member's ingress
    is closed (seed 001 INIT), so a request sent into one, or to a leader that
    died, would otherwise be waited on until the connect deadline.  An answer to
    any earlier attempt still counts (the cluster may only have been slow).
    """

    def __init__(
        self,
        aeron: Aeron,
        subscription: Subscription,
        ingress_channel: str,
        ingress_stream_id: int,
        ingress_endpoints: str | None,
        egress_channel: str,
        egress_stream_id: int,
        credentials: bytes,
        on_challenge: ChallengeHandler | None,
        exclusive: bool,
        deadline_ns: int,
        message_timeout_ns: int,
    ) -> None:
        self.aeron = aeron
        self.subscription = subscription
        self.ingress_channel = ingress_channel
        self.ingress_stream_id = ingress_stream_id
        self.ingress_endpoints = ingress_endpoints
        self.egress_channel = egress_channel
        self.egress_stream_id = egress_stream_id
        self.credentials = credentials
        self.on_challenge = on_challenge
        self.exclusive = exclusive
        self.deadline_ns = deadline_ns
        self.message_timeout_ns = message_timeout_ns
        self.state = "AWAIT_PUBLICATION_CONNECTED"
        self.members: dict[int, _Member] = {}
        self.publication: Publication | None = None
        self.response_channel: str | None = None
        self.correlation_id = protocol.NULL_VALUE
        self.cluster_session_id = protocol.NULL_SESSION_ID
        self.leadership_term_id = protocol.NULL_VALUE
        self.leader_member_id = protocol.NULL_MEMBER_ID
        self.cluster_version = 0
        self.malformed = 0
        self.redirects = 0
        self.attempts = 0
        # Each connect request sent: its correlation id -> the member it went to
        # (None without ingress endpoints).  Answers to any of them count.
        self._attempt_members: dict[int, int | None] = {}
        self._last_member_id: int | None = None
        self._attempt_timeout_ns = CONNECT_ATTEMPT_TIMEOUT_NS
        self._attempt_deadline_ns = 0
        self._retry_at_ns = 0
        self._message = bytearray(256)
        self._message_length = 0
        self._answer: Any = None
        self._assembler = FragmentAssembler(self._on_message)
        self._create_publications()

    # ------------------------------------------------------------ publications

    def _add_publication(self, channel: str) -> Publication:
        if self.exclusive:
            return self.aeron.add_exclusive_publication(channel, self.ingress_stream_id)
        return self.aeron.add_publication(channel, self.ingress_stream_id)

    def _create_publications(self) -> None:
        if self.ingress_endpoints is None:
            self.publication = self._add_publication(self.ingress_channel)
            return
        endpoints = parse_ingress_endpoints(self.ingress_endpoints)
        if not endpoints:
            raise ValueError(f"no ingress endpoints in {self.ingress_endpoints!r}")
        for member_id, endpoint in endpoints.items():
            member = self.members[member_id] = _Member(member_id, endpoint)
            try:
                member.publication = self._add_publication(_member_channel(self.ingress_channel, endpoint))
            except FulmarError as error:  # e.g. an endpoint the driver cannot resolve
                member.error = error
        if all(member.publication is None for member in self.members.values()):
            failures = "; ".join(f"member {m.member_id} ({m.endpoint}): {m.error}" for m in self.members.values())
            raise ClusterConnectError(f"could not add an ingress publication to any member: {failures}")

    def close(self) -> None:
        """Release what the connect holds (on failure, or the leftovers on success)."""
        for member in self.members.values():
            if member.publication is not self.publication:
                member.close()
        self.members.clear()

    # ------------------------------------------------------------ steps

    def poll(self, now_ns: int) -> bool:
        """Advance; True once the session is open."""
        if now_ns - self.deadline_ns >= 0:
            raise self._timeout()
        if self.state == "AWAIT_PUBLICATION_CONNECTED":
            self._await_publication_connected(now_ns)
        elif self.state == "SEND_MESSAGE":
            self._send_message(now_ns)
        elif self.state == "POLL_RESPONSE":
            self._poll_response(now_ns)
        elif self.state == "BACKOFF":
            self._backoff(now_ns)
        return self.state == "DONE"

    def _await_publication_connected(self, now_ns: int) -> None:
        if self.response_channel is None:
            self.response_channel = _response_channel(self.subscription, self.egress_channel)
            if self.response_channel is None:
                return
        if (
            self.publication is not None
            and not self.publication.is_connected
            and self.members
            and now_ns - self._attempt_deadline_ns >= 0
        ):
            # The member a REDIRECT named does not connect (it may be the leader
            # that died): any member will do.
            self._restore_member_publications()
            self.publication = None
        if self.publication is None:
            member = self._next_connected_member()
            if member is None:
                return
            self.publication = member.publication
            self._last_member_id = member.member_id
        elif not self.publication.is_connected:
            return
        self.correlation_id = self.aeron.next_correlation_id()
        self._encode(
            codecs.SessionConnectRequestEncoder,
            correlation_id=self.correlation_id,
            response_stream_id=self.egress_stream_id,
            version=protocol.PROTOCOL_SEMANTIC_VERSION,
            response_channel=self.response_channel,
            encoded_credentials=self.credentials,
        )
        self.state = "SEND_MESSAGE"

    def _encode(self, encoder: Any, **fields: Any) -> None:
        while True:
            try:
                self._message_length = encoder.encode(self._message, 0, **fields)
                return
            except CodecError:
                if len(self._message) > 1 << 24:
                    raise
                self._message = bytearray(len(self._message) * 4)

    def _next_connected_member(self) -> _Member | None:
        """The first member with a connected publication, starting after the one
        asked last (a retry goes elsewhere first)."""
        members = list(self.members.values())
        if self._last_member_id is not None:
            ids = [m.member_id for m in members]
            if self._last_member_id in ids:
                start = ids.index(self._last_member_id) + 1
                members = members[start:] + members[:start]
        for member in members:
            if member.publication is not None and member.publication.is_connected:
                return member
        return None

    def _send_message(self, now_ns: int) -> None:
        assert self.publication is not None
        result = self.publication.offer(bytes(self._message[: self._message_length]))
        if result > 0:
            self.attempts += 1
            self._attempt_members[self.correlation_id] = self._last_member_id if self.members else None
            self._attempt_deadline_ns = now_ns + self._attempt_timeout_ns
            self.state = "POLL_RESPONSE"
        elif result == NOT_CONNECTED:
            if self.members:
                self.publication = None  # any member that is connected will do
            self.state = "AWAIT_PUBLICATION_CONNECTED"
        elif result in (CLOSED, MAX_POSITION_EXCEEDED):
            raise ClusterConnectError(f"the ingress publication failed ({_result_name(result)}) while connecting")

    def _poll_response(self, now_ns: int) -> None:
        self._answer = None
        self.subscription.poll(self._assembler.on_fragment, 1)
        answer, self._answer = self._answer, None
        if answer is None:
            if now_ns - self._attempt_deadline_ns >= 0:
                # Silence: the member may be gone, or between leaders with its
                # ingress closed.  Ask again shortly, of another member (whose
                # publications, made again now, may connect meanwhile).
                self._attempt_timeout_ns = min(2 * self._attempt_timeout_ns, CONNECT_ATTEMPT_TIMEOUT_MAX_NS)
                self._retry_at_ns = now_ns + CONNECT_RETRY_BACKOFF_NS
                if self.members:
                    self._restore_member_publications()
                self.state = "BACKOFF"
            return
        answered_member = self._attempt_members.get(answer.correlation_id)
        if isinstance(answer, codecs.ChallengeDecoder):
            if self.members and answered_member is not None:
                # The response goes to the leader that challenged this attempt.
                self.publication = self._publication_to(answered_member, None)
                self._last_member_id = answered_member
            self.cluster_session_id = answer.cluster_session_id
            challenge = bytes(answer.encoded_challenge)
            response = self.on_challenge(challenge) if self.on_challenge is not None else b""
            self.correlation_id = self.aeron.next_correlation_id()
            self._encode(
                codecs.ChallengeResponseEncoder,
                correlation_id=self.correlation_id,
                cluster_session_id=self.cluster_session_id,
                encoded_credentials=bytes(response),
            )
            self.state = "SEND_MESSAGE"
            return
        code = answer.code_raw
        if code == codecs.EventCode.OK:
            self.cluster_session_id = answer.cluster_session_id
            self.leadership_term_id = answer.leadership_term_id
            self.leader_member_id = answer.leader_member_id
            self.cluster_version = answer.version
            if self.members:
                # The session is the leader's: its ingress is the one kept (an
                # earlier attempt's answer may come while a later one went elsewhere).
                self.publication = self._publication_to(answer.leader_member_id, answered_member)
            self.state = "DONE"
        elif code == codecs.EventCode.ERROR:
            raise ClusterConnectError(f"the cluster refused the session: {answer.detail}")
        elif code == codecs.EventCode.AUTHENTICATION_REJECTED:
            raise AuthenticationRejectedError(f"authentication rejected: {answer.detail}")
        elif code == codecs.EventCode.REDIRECT:
            self._redirect(answer.leader_member_id, answer.detail, now_ns)
        # CLOSED and unknown codes for a connect request: keep waiting (as Aeron does).

    def _backoff(self, now_ns: int) -> None:
        if now_ns - self._retry_at_ns < 0:
            return
        if self.members:
            self.publication = None  # the next connected member after the silent one
        self.state = "AWAIT_PUBLICATION_CONNECTED"

    def _restore_member_publications(self) -> None:
        """A publication to every known member again (a REDIRECT kept only the
        leader's, and that leader may be the one that went silent)."""
        for member in self.members.values():
            if member.publication is None and member.error is None:
                try:
                    member.publication = self._add_publication(_member_channel(self.ingress_channel, member.endpoint))
                except FulmarError as error:
                    member.error = error

    def _publication_to(self, member_id: int, fallback_member_id: int | None) -> Publication:
        for candidate in (member_id, fallback_member_id):
            member = self.members.get(candidate) if candidate is not None else None
            if member is not None and member.publication is not None:
                return member.publication
        leader = self.members.get(member_id)
        if leader is None:
            raise ClusterConnectError(
                f"the session was opened by member {member_id}, which is not among the "
                f"ingress endpoints {self.ingress_endpoints!r}"
            )
        leader.publication = self._add_publication(_member_channel(self.ingress_channel, leader.endpoint))
        return leader.publication

    def _on_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError:
            self.malformed += 1
            return
        if isinstance(message, (codecs.SessionEventDecoder, codecs.ChallengeDecoder)):
            if message.correlation_id in self._attempt_members:
                self._answer = message

    def _redirect(self, leader_member_id: int, detail: str, now_ns: int) -> None:
        """A follower answered: keep (or make) a publication to the leader it names only."""
        self.redirects += 1
        try:
            endpoints = parse_ingress_endpoints(detail)
        except ValueError as error:
            raise ClusterConnectError(f"REDIRECT with unusable ingress endpoints: {error}") from None
        uri = ChannelUri.parse(self.ingress_channel)
        endpoint = endpoints.get(leader_member_id)
        if endpoint is None and uri.is_udp:
            raise ClusterConnectError(
                f"REDIRECT to member {leader_member_id}, which is not in the endpoints it gave: {detail!r}"
            )
        previous = self.members.get(leader_member_id)
        kept: Publication | None = None
        if previous is not None and previous.endpoint == endpoint and previous.publication is not None:
            kept, previous.publication = previous.publication, None
        for member in self.members.values():
            member.close()
        if self.publication is not None and self.publication is not kept:
            self.publication.close()
        self.members = {member_id: _Member(member_id, ep) for member_id, ep in endpoints.items()}
        if kept is None:
            kept = self._add_publication(_member_channel(self.ingress_channel, endpoint))
        leader = self.members.get(leader_member_id)
        if leader is not None:
            leader.publication = kept
        self.publication = kept
        self.leader_member_id = leader_member_id
        self._last_member_id = leader_member_id
        self._attempt_deadline_ns = now_ns + self._attempt_timeout_ns  # for its publication to connect
        self.ingress_endpoints = detail
        self.state = "AWAIT_PUBLICATION_CONNECTED"

    def _timeout(self) -> ClusterTimeoutError:
        publication = self.publication
        if publication is not None:
            ingress = f"{publication.channel} connected={publication.is_connected}"
        else:
            described = []
            for m in self.members.values():
                text = f"{m.member_id}={m.endpoint} connected={bool(m.publication and m.publication.is_connected)}"
                described.append(text + (f" error={m.error}" if m.error else ""))
            ingress = ", ".join(described)
        waiting_for = {
            "AWAIT_PUBLICATION_CONNECTED": "an ingress publication to connect (is a cluster member listening?)"
            if self.response_channel is not None
            else "the driver to bind the egress endpoint",
            "SEND_MESSAGE": "the ingress publication to take the request (back pressure)",
            "POLL_RESPONSE": "the cluster's answer on the egress",
            "BACKOFF": "the cluster's answer on the egress (asking again shortly)",
        }.get(self.state, self.state)
        return ClusterTimeoutError(
            f"cluster connect timed out after {self.message_timeout_ns / 1e9:g} s waiting for {waiting_for}: "
            f"state={self.state} ingress_channel={self.ingress_channel} stream={self.ingress_stream_id} "
            f"ingress_endpoints={self.ingress_endpoints} ingress=[{ingress}] "
            f"egress_channel={self.egress_channel} response_channel={self.response_channel} "
            f"egress_connected={self.subscription.is_connected} redirects={self.redirects} "
            f"connect_attempts={self.attempts}"
        )


def _aeron_lost(aeron: Aeron, what: str) -> MediaDriverLostError:
    """The error of ``what`` whose Aeron client has closed: why, naming its driver's directory."""
    cause = aeron.terminal_error
    if cause is None:
        error = MediaDriverLostError(f"{what}: its Aeron client (of the media driver in {aeron.directory}) was closed")
    else:
        error = MediaDriverLostError(
            f"{what}: the media driver in {aeron.directory} is lost ({type(cause).__name__}: {cause})"
        )
    error.__cause__ = cause
    return error


def _result_name(result: int) -> str:
    return {
        NOT_CONNECTED: "NOT_CONNECTED",
        BACK_PRESSURED: "BACK_PRESSURED",
        ADMIN_ACTION: "ADMIN_ACTION",
        CLOSED: "CLOSED",
        MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
    }.get(result, str(result))


# ---------------------------------------------------------------------------- client


class ClusterClient:
    """An open session with a cluster.  Create it with :meth:`connect`."""

    def __init__(
        self,
        aeron: Aeron,
        publication: Publication,
        subscription: Subscription,
        *,
        cluster_session_id: int,
        leadership_term_id: int,
        leader_member_id: int,
        cluster_version: int,
        ingress_channel: str,
        ingress_stream_id: int,
        ingress_endpoints: str | None,
        exclusive: bool,
        message_timeout_ns: int,
        keepalive_interval_ns: int,
        on_message: MessageHandler | None,
        on_new_leader: NewLeaderHandler | None,
        on_session_event: SessionEventHandler | None,
        on_admin_response: AdminResponseHandler | None,
        malformed: int = 0,
    ) -> None:
        self.aeron = aeron
        self.publication = publication
        self.subscription = subscription
        self._cluster_session_id = cluster_session_id
        self._leadership_term_id = leadership_term_id
        self._leader_member_id = leader_member_id
        self.cluster_version = cluster_version
        self.ingress_channel = ingress_channel
        self.ingress_stream_id = ingress_stream_id
        self.ingress_endpoints = ingress_endpoints
        self.exclusive = exclusive
        self.message_timeout_ns = message_timeout_ns
        self.keepalive_interval_ns = keepalive_interval_ns
        self.on_message = on_message
        self.on_new_leader = on_new_leader
        self.on_session_event = on_session_event
        self.on_admin_response = on_admin_response
        self.malformed_count = malformed
        """Egress messages that did not decode (wrong schema, truncated, unknown template)."""
        self.foreign_count = 0
        """Well-formed egress messages addressed to other sessions (ignored)."""
        self._closed = False
        self._resources_released = False
        self._header = b""
        self._keepalive = b""
        self._encode_headers()
        self._claim: BufferClaim | None = None
        self._assembler = FragmentAssembler(self._on_fragment)
        self._last_ingress_ns = time.monotonic_ns()
        self._reply: bytes | None = None
        self._capturing = False
        # Why the Aeron client closed under this open session (its driver is
        # gone, ...), once a call noticed: every call then raises it.
        self._aeron_error: MediaDriverLostError | None = None

    # ------------------------------------------------------------ connect

    @classmethod
    def connect(
        cls,
        aeron: Aeron,
        ingress_channel: str = protocol.INGRESS_CHANNEL,
        ingress_endpoints: str | None = None,
        egress_channel: str = protocol.EGRESS_CHANNEL,
        *,
        ingress_stream_id: int = protocol.INGRESS_STREAM_ID,
        egress_stream_id: int = protocol.EGRESS_STREAM_ID,
        credentials: bytes = b"",
        on_challenge: ChallengeHandler | None = None,
        on_message: MessageHandler | None = None,
        on_new_leader: NewLeaderHandler | None = None,
        on_session_event: SessionEventHandler | None = None,
        on_admin_response: AdminResponseHandler | None = None,
        message_timeout_ns: int = protocol.MESSAGE_TIMEOUT_NS,
        keepalive_interval_ns: int = DEFAULT_KEEPALIVE_INTERVAL_NS,
        ingress_exclusive: bool = True,
    ) -> ClusterClient:
        """Open a session, waiting at most ``message_timeout_ns`` in all.

        ``ingress_endpoints`` (``"0=host:port,1=host:port"``) substitutes each
        member's endpoint into a UDP ``ingress_channel``.  A UDP
        ``egress_channel`` may use port 0: the cluster is told the bound port.
        ``on_challenge(challenge) -> credentials`` answers an authenticator's
        Challenge (without it an empty answer is sent, as Aeron's null supplier
        does).  ``on_message(cluster_session_id, timestamp, payload)`` gets
        each application reply; ``payload`` is a view valid only during the call.
        ``keepalive_interval_ns`` > 0: ``poll_egress`` sends a SessionKeepAlive
        when nothing went to the cluster for that long (0 disables).

        A request nobody answers within ``CONNECT_ATTEMPT_TIMEOUT_NS`` (doubling
        up to ``CONNECT_ATTEMPT_TIMEOUT_MAX_NS``) is sent again, after
        ``CONNECT_RETRY_BACKOFF_NS``, to the next member: during an election
        no member takes requests, and a dead leader's driver may still take
        them.  So the connect ends on the new leader, or with an error.

        Raises ClusterTimeoutError, ClusterConnectError (the cluster's ERROR,
        or no usable ingress), AuthenticationRejectedError.
        """
        deadline_ns = time.monotonic_ns() + message_timeout_ns
        subscription = aeron.add_subscription(egress_channel, egress_stream_id)
        connector: _Connector | None = None
        try:
            connector = _Connector(
                aeron,
                subscription,
                ingress_channel,
                ingress_stream_id,
                ingress_endpoints,
                egress_channel,
                egress_stream_id,
                bytes(credentials),
                on_challenge,
                ingress_exclusive,
                deadline_ns,
                message_timeout_ns,
            )
            step = connector.state
            while not connector.poll(time.monotonic_ns()):
                if aeron.is_closed:
                    raise _aeron_lost(aeron, "the cluster connect")
                if connector.state != step:
                    step = connector.state  # progress: go again at once
                    continue
                remaining = deadline_ns - time.monotonic_ns()
                _wait_for_data(aeron, subscription.is_data_available, min(_MAX_WAIT_NS, remaining))
            assert connector.publication is not None
            client = cls(
                aeron,
                connector.publication,
                subscription,
                cluster_session_id=connector.cluster_session_id,
                leadership_term_id=connector.leadership_term_id,
                leader_member_id=connector.leader_member_id,
                cluster_version=connector.cluster_version,
                ingress_channel=ingress_channel,
                ingress_stream_id=ingress_stream_id,
                ingress_endpoints=connector.ingress_endpoints,
                exclusive=ingress_exclusive,
                message_timeout_ns=message_timeout_ns,
                keepalive_interval_ns=keepalive_interval_ns,
                on_message=on_message,
                on_new_leader=on_new_leader,
                on_session_event=on_session_event,
                on_admin_response=on_admin_response,
                malformed=connector.malformed,
            )
            connector.close()  # the other members' publications
            return client
        except BaseException:
            if connector is not None:
                connector.close()
                if connector.publication is not None:
                    connector.publication.close()
            subscription.close()
            raise

    # ------------------------------------------------------------ state

    @property
    def cluster_session_id(self) -> int:
        return self._cluster_session_id

    @property
    def leadership_term_id(self) -> int:
        """The term stamped on ingress messages; advances with each new leader."""
        return self._leadership_term_id

    @property
    def leader_member_id(self) -> int:
        return self._leader_member_id

    @property
    def is_closed(self) -> bool:
        """True after ``close()``, once the cluster closed the session, or
        once the Aeron client under it closed (its media driver gone: noticed
        within the Aeron client's driver timeout; then every call raises
        MediaDriverLostError)."""
        return self._closed or self.aeron.is_closed

    def _encode_headers(self) -> None:
        header = bytearray(SESSION_HEADER_LENGTH)
        codecs.SessionMessageHeaderEncoder.encode(
            header,
            0,
            leadership_term_id=self._leadership_term_id,
            cluster_session_id=self._cluster_session_id,
            timestamp=0,
        )
        self._header = bytes(header)
        keepalive = bytearray(SBE_HEADER_LENGTH + codecs.SessionKeepAliveEncoder.BLOCK_LENGTH)
        codecs.SessionKeepAliveEncoder.encode(
            keepalive, 0, leadership_term_id=self._leadership_term_id, cluster_session_id=self._cluster_session_id
        )
        self._keepalive = bytes(keepalive)

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> ClusterSessionClosedError:
        """What a call on this closed session raises: why it is closed."""
        self._note_aeron_closed()
        if self._aeron_error is not None:
            error = MediaDriverLostError(str(self._aeron_error))
            error.__cause__ = self._aeron_error.__cause__
            return error
        return ClusterSessionClosedError(f"cluster session {self._cluster_session_id} is closed")

    def _note_aeron_closed(self) -> None:
        """An open session whose Aeron client has closed is closed too, with its error."""
        if not self._closed and self.aeron.is_closed:
            self._aeron_error = _aeron_lost(self.aeron, f"cluster session {self._cluster_session_id}")
            self._closed = True
            self._release()

    def _check_aeron(self) -> None:
        """Raise MediaDriverLostError if the Aeron client closed: what closes
        the session's publication and subscription under it.  Asked when one
        of them answers as closed, never per message."""
        self._note_aeron_closed()
        if self._aeron_error is not None:
            raise self._closed_error()

    # ------------------------------------------------------------ ingress

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        """Send one application message (header + payload, fragmented if long).

        Returns the new ingress position, or a negative code (NOT_CONNECTED,
        BACK_PRESSURED, ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED) to retry
        on: back pressure never raises.  Raises ClusterSessionClosedError once
        the session is closed (MediaDriverLostError: its media driver is gone).
        """
        if self._closed:
            self._check_open()
        if type(payload) is bytes:
            result = self.publication.offer(self._header + payload)
        else:
            result = self.publication.offer(b"".join((self._header, payload)))
        if result > 0:
            self._last_ingress_ns = time.monotonic_ns()
        elif result == CLOSED:
            self._check_aeron()
        return result

    def offer_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> int:
        """Send one message gathered from ``parts`` (the session header goes first)."""
        self._check_open()
        result = self.publication.offer(b"".join((self._header, *parts)))
        if result > 0:
            self._last_ingress_ns = time.monotonic_ns()
        elif result == CLOSED:
            self._check_aeron()
        return result

    def try_claim(self, length: int) -> tuple[int, BufferClaim | None]:
        """Claim room for a ``length``-byte payload (at most one MTU) to write in place.

        Returns ``(position, claim)``; write the payload at
        ``claim.buffer[SESSION_HEADER_LENGTH:]`` (the session header is already
        written), then ``claim.commit()`` or ``claim.abort()``.  On failure
        ``(code, None)`` with one of the back-pressure codes.
        """
        self._check_open()
        claim = self._claim
        if claim is None or claim._log is not self.publication.log:
            claim = self._claim = BufferClaim(self.publication.log)
        result = self.publication.try_claim(SESSION_HEADER_LENGTH + length, claim)
        if result <= 0:
            if result == CLOSED:
                self._check_aeron()
            return result, None
        claim.buffer[:SESSION_HEADER_LENGTH] = self._header
        self._last_ingress_ns = time.monotonic_ns()
        return result, claim

    def _send_control(self, message: bytes) -> bool:
        """Offer a session control message, a few attempts; False if back pressured."""
        for attempt in range(SEND_ATTEMPTS):
            result = self.publication.offer(message)
            if result > 0:
                self._last_ingress_ns = time.monotonic_ns()
                return True
            if result == MAX_POSITION_EXCEEDED:
                raise ClusterClientError(
                    f"ingress publication reached its maximum position (term length {self.publication.term_buffer_length})"
                )
            if result == CLOSED:
                self._check_aeron()
            if attempt + 1 < SEND_ATTEMPTS:
                time.sleep(0)
        return False

    def send_keepalive(self) -> bool:
        """Tell the cluster this session is alive; False if back pressured (or
        between leaders: keep polling the egress to learn the new leader)."""
        self._check_open()
        return self._send_control(self._keepalive)

    def send_admin_request_to_take_snapshot(self, correlation_id: int | None = None) -> int | None:
        """Ask the cluster to take a snapshot (needs the authorisation to).

        Returns the request's correlation id (the AdminResponse carries it to
        ``on_admin_response``), or None if it could not be sent.
        """
        self._check_open()
        if correlation_id is None:
            correlation_id = self.aeron.next_correlation_id()
        message = bytearray(64)
        length = codecs.AdminRequestEncoder.encode(
            message,
            0,
            leadership_term_id=self._leadership_term_id,
            cluster_session_id=self._cluster_session_id,
            correlation_id=correlation_id,
            request_type=codecs.AdminRequestType.SNAPSHOT,
            payload=b"",
        )
        return correlation_id if self._send_control(bytes(message[:length])) else None

    # ------------------------------------------------------------ egress

    def poll_egress(self, fragment_limit: int = DEFAULT_FRAGMENT_LIMIT) -> int:
        """Read up to ``fragment_limit`` egress fragments; returns how many.

        Application messages go to ``on_message``; NewLeaderEvent switches the
        ingress; SessionEvent CLOSED closes the client.  Also sends the
        periodic keepalive.  Poll often: that is how leader changes are seen.
        Returns 0 once the session is closed, but raises MediaDriverLostError
        once its media driver is gone.
        """
        if self._closed:
            if self._aeron_error is not None:
                raise self._closed_error()
            return 0
        fragments = self.subscription.poll_session_runs(
            self._assembler.on_fragment, self._on_session_messages, fragment_limit
        )
        if self._closed:
            self._release()
        elif fragments == 0 and self.subscription.is_closed:
            self._check_aeron()  # (the Aeron client closed it)
        elif self.keepalive_interval_ns > 0:
            now_ns = time.monotonic_ns()
            if now_ns - self._last_ingress_ns >= self.keepalive_interval_ns:
                if not self._send_control(self._keepalive):
                    # Back pressured or between leaders: try again on the next poll.
                    self._last_ingress_ns = now_ns - self.keepalive_interval_ns // 2
        return fragments

    def request(self, payload: bytes | bytearray | memoryview, timeout_s: float | None = None) -> bytes:
        """Send ``payload`` and return the next application message for this session.

        For simple request/response services whose replies come back in the
        order the requests were sent, one reply per request: whatever message
        arrives next is taken as the reply (an unsolicited or late message
        would be mistaken for it).  Retries back pressure until the deadline
        (``timeout_s``, default the message timeout) while polling the egress,
        so a leader change on the way is followed.  Raises ClusterTimeoutError,
        or ClusterSessionClosedError if the session closes meanwhile.
        """
        self._check_open()
        timeout_ns = self.message_timeout_ns if timeout_s is None else int(timeout_s * 1e9)
        deadline_ns = time.monotonic_ns() + timeout_ns
        subscription = self.subscription
        while True:
            result = self.offer(payload)
            if result > 0:
                break
            if result == MAX_POSITION_EXCEEDED:
                raise ClusterClientError("ingress publication reached its maximum position")
            self.poll_egress()
            self._check_open()
            remaining = deadline_ns - time.monotonic_ns()
            if remaining <= 0:
                raise ClusterTimeoutError(
                    f"could not send the request within {timeout_ns / 1e9:g} s: ingress {_result_name(result)}"
                )
            _wait_for_data(self.aeron, subscription.is_data_available, min(_MAX_WAIT_NS, remaining))
        self._reply = None
        self._capturing = True
        try:
            while True:
                # One fragment at a time: nothing after the reply is consumed here.
                self.poll_egress(1)
                reply = self._reply
                if reply is not None:
                    return reply
                self._check_open()
                remaining = deadline_ns - time.monotonic_ns()
                if remaining <= 0:
                    raise ClusterTimeoutError(
                        f"no reply from the cluster within {timeout_ns / 1e9:g} s "
                        f"(session {self._cluster_session_id}, leader {self._leader_member_id})"
                    )
                _wait_for_data(self.aeron, subscription.is_data_available, min(10 * _MAX_WAIT_NS, remaining))
        finally:
            self._capturing = False
            self._reply = None

    def _on_session_messages(self, messages: SessionMessages) -> None:
        """The hot path: a run of application messages, found without a call
        per fragment."""
        view = messages.view
        timestamps = messages.timestamps
        offsets = messages.message_offsets
        lengths = messages.message_lengths
        for i, session_id in enumerate(messages.session_ids):
            start = offsets[i]
            self._on_application_message(
                session_id, timestamps[i], view[start + SESSION_HEADER_LENGTH : start + lengths[i]]
            )

    def _on_application_message(self, session_id: int, timestamp: int, payload: memoryview) -> None:
        if session_id != self._cluster_session_id:
            self.foreign_count += 1
        elif self._capturing and self._reply is None:
            self._reply = bytes(payload)
        elif self.on_message is not None:
            self.on_message(session_id, timestamp, payload)

    def _on_fragment(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        if length >= SESSION_HEADER_LENGTH:
            block_length, template_id, schema_id, _version = _SBE_HEADER.unpack_from(buffer, offset)
            if (
                template_id == _SESSION_TEMPLATE_ID
                and schema_id == codecs.SCHEMA_ID
                and block_length == _SESSION_BLOCK_LENGTH
            ):
                _term, session_id, timestamp = _SESSION_BLOCK.unpack_from(buffer, offset + SBE_HEADER_LENGTH)
                self._on_application_message(
                    session_id, timestamp, buffer[offset + SESSION_HEADER_LENGTH : offset + length]
                )
                return
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError:
            self.malformed_count += 1
            return
        if isinstance(message, codecs.SessionMessageHeaderDecoder):
            # A header with an unusual block length (a newer schema): honour it.
            start = offset + SBE_HEADER_LENGTH + message.sbe_acting_block_length
            self._on_application_message(message.cluster_session_id, message.timestamp, buffer[start : offset + length])
        elif isinstance(message, codecs.SessionEventDecoder):
            self._on_session_event(message)
        elif isinstance(message, codecs.NewLeaderEventDecoder):
            if message.cluster_session_id == self._cluster_session_id:
                self._on_new_leader(message.leadership_term_id, message.leader_member_id, message.ingress_endpoints)
            else:
                self.foreign_count += 1
        elif isinstance(message, codecs.AdminResponseDecoder):
            if message.cluster_session_id == self._cluster_session_id:
                if self.on_admin_response is not None:
                    self.on_admin_response(
                        message.correlation_id,
                        message.cluster_session_id,
                        message.request_type,
                        message.response_code,
                        message.message,
                        bytes(message.payload),
                    )
            else:
                self.foreign_count += 1
        # Other templates (a Challenge after connecting, ...) are not for an open session.

    def _on_session_event(self, event: Any) -> None:
        if event.cluster_session_id != self._cluster_session_id:
            self.foreign_count += 1
            return
        if event.code_raw == codecs.EventCode.CLOSED:
            self._closed = True
        if self.on_session_event is not None:
            self.on_session_event(
                event.correlation_id,
                event.cluster_session_id,
                event.leadership_term_id,
                event.leader_member_id,
                event.code,
                event.detail,
            )

    def _on_new_leader(self, leadership_term_id: int, leader_member_id: int, ingress_endpoints: str) -> None:
        """Point the ingress at the new leader and stamp messages with its term."""
        self._leadership_term_id = leadership_term_id
        self._leader_member_id = leader_member_id
        self._encode_headers()
        old = self.publication
        old.close()
        if self.ingress_endpoints is not None:
            endpoints = parse_ingress_endpoints(ingress_endpoints) if ingress_endpoints else {}
            endpoint = endpoints.get(leader_member_id)
            if endpoint is None and ChannelUri.parse(self.ingress_channel).is_udp:
                raise ClusterClientError(
                    f"NewLeaderEvent names leader {leader_member_id}, absent from its endpoints {ingress_endpoints!r}"
                )
            self.ingress_endpoints = ingress_endpoints
            channel = _member_channel(self.ingress_channel, endpoint)
        else:
            channel = self.ingress_channel
        if self.exclusive:
            self.publication = self.aeron.add_exclusive_publication(channel, self.ingress_stream_id)
        else:
            self.publication = self.aeron.add_publication(channel, self.ingress_stream_id)
        self._claim = None
        if self.on_new_leader is not None:
            self.on_new_leader(self._cluster_session_id, leadership_term_id, leader_member_id, ingress_endpoints)

    # ------------------------------------------------------------ close

    def close(self) -> None:
        """Close the session (SessionCloseRequest, if the ingress is up) and
        release the publication and subscription.  The Aeron client stays open."""
        if not self._closed:
            self._closed = True
            if self.publication.is_connected:
                message = bytearray(SBE_HEADER_LENGTH + codecs.SessionCloseRequestEncoder.BLOCK_LENGTH)
                codecs.SessionCloseRequestEncoder.encode(
                    message,
                    0,
                    leadership_term_id=self._leadership_term_id,
                    cluster_session_id=self._cluster_session_id,
                )
                try:
                    self._send_control(bytes(message))
                except ClusterClientError:
                    pass
        self._release()

    def _release(self) -> None:
        if self._resources_released:
            return
        self._resources_released = True
        try:
            self.publication.close()
        finally:
            self.subscription.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ClusterClient(session={self._cluster_session_id}, term={self._leadership_term_id}, "
            f"leader={self._leader_member_id}, closed={self._closed})"
        )


# ---------------------------------------------------------------------------- asyncio


class AsyncClusterClient:
    """An asyncio front to :class:`ClusterClient`.

    The blocking client lives on one dedicated thread: every call to it (connect,
    send, egress polling) runs there, one at a time, so it is never used from
    two threads at once.  A poll task keeps polling the egress (sleeping on the
    driver's data doorbell when idle, woken early when a send is queued).
    Replies resolve pending ``request`` calls first-in first-out; other messages
    go to the ``messages()`` iterator.
    """

    def __init__(
        self, client: ClusterClient, executor: ThreadPoolExecutor, loop: asyncio.AbstractEventLoop, idle_wait_ns: int
    ) -> None:
        self.client = client
        self._executor = executor
        self._loop = loop
        self._idle_wait_ns = idle_wait_ns
        self._requests: deque[asyncio.Future[bytes]] = deque()
        self._messages: asyncio.Queue[EgressMessage | None] = asyncio.Queue()
        self._user_new_leader: NewLeaderHandler | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._poll_error: BaseException | None = None
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls, aeron: Aeron, *args: Any, idle_wait_ns: int = 50_000_000, **kwargs: Any
    ) -> AsyncClusterClient:
        """Takes :meth:`ClusterClient.connect`'s arguments (``on_message`` excepted:
        use ``messages()``; ``on_new_leader`` is called on the event loop)."""
        if "on_message" in kwargs:
            raise TypeError("AsyncClusterClient delivers messages through messages() and request(), not on_message")
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fulmar-cluster-client")
        user_new_leader = kwargs.pop("on_new_leader", None)
        holder: list[AsyncClusterClient] = []

        def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
            message = EgressMessage(session_id, timestamp, bytes(payload))
            loop.call_soon_threadsafe(holder[0]._deliver, message)

        def on_new_leader(session_id: int, term: int, leader: int, endpoints: str) -> None:
            if user_new_leader is not None:
                loop.call_soon_threadsafe(user_new_leader, session_id, term, leader, endpoints)

        def open_session() -> ClusterClient:
            return ClusterClient.connect(aeron, *args, on_message=on_message, on_new_leader=on_new_leader, **kwargs)

        try:
            client = await loop.run_in_executor(executor, open_session)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self = cls(client, executor, loop, idle_wait_ns)
        holder.append(self)
        self._poller = loop.create_task(self._poll_loop())
        return self

    # ------------------------------------------------------------ state

    @property
    def cluster_session_id(self) -> int:
        return self.client.cluster_session_id

    @property
    def leadership_term_id(self) -> int:
        return self.client.leadership_term_id

    @property
    def leader_member_id(self) -> int:
        return self.client.leader_member_id

    @property
    def is_closed(self) -> bool:
        return self.client.is_closed

    # ------------------------------------------------------------ polling

    def _poll_once(self) -> bool:
        """On the client thread: poll; idle on the doorbell if there was nothing.
        Returns False once the session is closed."""
        client = self.client
        if client.is_closed:
            return False
        if client.poll_egress() == 0 and not self._wake.is_set():
            aeron = client.aeron
            doorbell = aeron.conductor.data_doorbell
            token = doorbell.prepare()
            if self._wake.is_set() or client.subscription.is_data_available():
                doorbell.cancel()
            else:
                doorbell.wait(token, self._idle_wait_ns)
        return not client.is_closed

    async def _poll_loop(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()
                if not await self._loop.run_in_executor(self._executor, self._poll_once):
                    break
        except BaseException as error:  # noqa: BLE001 - handed to the waiters
            self._poll_error = error
        finally:
            self._finish()

    def _finish(self) -> None:
        error: BaseException = self._poll_error or self.client._closed_error()
        while self._requests:
            future = self._requests.popleft()
            if not future.done():
                future.set_exception(error)
        self._messages.put_nowait(None)

    def _deliver(self, message: EgressMessage) -> None:
        while self._requests:
            future = self._requests.popleft()
            if not future.done():  # skip requests that timed out or were cancelled
                future.set_result(message.payload)
                return
        self._messages.put_nowait(message)

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        self._wake.set()
        self.client.aeron.conductor.data_doorbell.ring()  # cut the poller's idle wait short
        return await self._loop.run_in_executor(self._executor, function, *args)

    # ------------------------------------------------------------ API

    async def send(self, payload: bytes, timeout_s: float | None = None) -> int:
        """Send one message, retrying back pressure until the timeout; returns the position."""
        timeout_ns = self.client.message_timeout_ns if timeout_s is None else int(timeout_s * 1e9)
        deadline_ns = time.monotonic_ns() + timeout_ns
        while True:
            result: int = await self._call(self.client.offer, payload)
            if result > 0:
                return result
            if result == MAX_POSITION_EXCEEDED:
                raise ClusterClientError("ingress publication reached its maximum position")
            if time.monotonic_ns() >= deadline_ns:
                raise ClusterTimeoutError(
                    f"could not send within {timeout_ns / 1e9:g} s: ingress {_result_name(result)}"
                )
            await asyncio.sleep(0.001)

    async def request(self, payload: bytes, timeout_s: float | None = None) -> bytes:
        """Send and await the next reply (same in-order contract as ``ClusterClient.request``)."""
        if self._poller is None or self._poller.done():
            raise self.client._closed_error()
        timeout = self.client.message_timeout_ns / 1e9 if timeout_s is None else timeout_s
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._requests.append(future)  # before sending: the reply cannot overtake it
        try:
            await self.send(payload, timeout)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise ClusterTimeoutError(f"no reply from the cluster within {timeout:g} s") from None
        finally:
            if not future.done():
                future.cancel()

    async def messages(self) -> AsyncIterator[EgressMessage]:
        """Messages not taken by ``request``, until the session closes."""
        while True:
            message = await self._messages.get()
            if message is None:
                self._messages.put_nowait(None)  # other iterators end too
                return
            yield message

    async def send_keepalive(self) -> bool:
        result: bool = await self._call(self.client.send_keepalive)
        return result

    async def close(self) -> None:
        self._stopping = True
        if self._poller is not None:
            self._wake.set()
            self.client.aeron.conductor.data_doorbell.ring()
            await self._poller
        try:
            await self._loop.run_in_executor(self._executor, self.client.close)
        finally:
            self._executor.shutdown(wait=True)

    async def __aenter__(self) -> AsyncClusterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

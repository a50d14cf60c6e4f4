"""Aeron channel URIs: one parser for the driver and every client.

Grammar (Aeron's ``ChannelUri.java`` and ``aeron_uri.c``)::

    channel = [ "aeron-spy:" ] "aeron:" media [ "?" param *( "|" param ) ]
    media   = "udp" / "ipc"
    param   = key "=" value          ; key has no '=' or '|', value has no '|'

Parsing only splits the text; the meaning of each parameter is checked by its
typed accessor (``uri.mtu()``, ``uri.endpoint()``, ...), by ``validate()``
(every known parameter present), and by ``validate_for_publication()`` /
``validate_for_subscription()`` (what each side additionally needs).
Unknown parameter names are kept and round-trip, as Aeron tolerates them.

Where Aeron's Java and C parsers disagree we take the stricter reading, so a
channel fulmar accepts means the same thing to both:

- a repeated key is an error (Java keeps the last value, C's lookup finds the
  first);
- an empty key, an empty value, a parameter without '=' and a stray or
  trailing '|' are errors (C rejects the first three, Java the last);
- ``"aeron:ipc?"`` (a '?' with nothing after it) is an error;
- numbers are decimal (C's ``strtol(.., 0)`` would read ``010`` as octal);
- booleans are ``true`` or ``false`` (Java silently reads anything else as
  false).

Every failure raises :class:`InvalidChannelError`, whose message quotes the
channel and names what is wrong.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from fulmar.errors import FulmarError
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH
from fulmar.logbuffer import (
    MAX_UDP_PAYLOAD_LENGTH,
    TERM_MAX_LENGTH,
    TERM_MIN_LENGTH,
    compute_max_message_length,
)

AERON_SCHEME = "aeron"
AERON_PREFIX = "aeron:"
SPY_QUALIFIER = "aeron-spy"
SPY_PREFIX = "aeron-spy:"
UDP_MEDIA = "udp"
IPC_MEDIA = "ipc"
IPC_CHANNEL = "aeron:ipc"
UDP_CHANNEL = "aeron:udp"
TAG_PREFIX = "tag:"

# Parameter names (CommonContext.java / aeron_uri.h).
ENDPOINT_PARAM = "endpoint"
INTERFACE_PARAM = "interface"
CONTROL_PARAM = "control"
CONTROL_MODE_PARAM = "control-mode"
TTL_PARAM = "ttl"
INITIAL_TERM_ID_PARAM = "init-term-id"
TERM_ID_PARAM = "term-id"
TERM_OFFSET_PARAM = "term-offset"
TERM_LENGTH_PARAM = "term-length"
MTU_LENGTH_PARAM = "mtu"
SESSION_ID_PARAM = "session-id"
LINGER_PARAM = "linger"
RELIABLE_PARAM = "reliable"
TAGS_PARAM = "tags"
SPARSE_PARAM = "sparse"
ALIAS_PARAM = "alias"
EOS_PARAM = "eos"
TETHER_PARAM = "tether"
GROUP_PARAM = "group"
REJOIN_PARAM = "rejoin"
CONGESTION_CONTROL_PARAM = "cc"
FLOW_CONTROL_PARAM = "fc"
GROUP_TAG_PARAM = "gtag"
SPIES_SIMULATE_CONNECTION_PARAM = "ssc"
SOCKET_SNDBUF_PARAM = "so-sndbuf"
SOCKET_RCVBUF_PARAM = "so-rcvbuf"
RECEIVER_WINDOW_PARAM = "rcv-wnd"
NAK_DELAY_PARAM = "nak-delay"
UNTETHERED_WINDOW_LIMIT_TIMEOUT_PARAM = "untethered-window-limit-timeout"
UNTETHERED_RESTING_TIMEOUT_PARAM = "untethered-resting-timeout"
RESPONSE_CORRELATION_ID_PARAM = "response-correlation-id"
MAX_RESEND_PARAM = "max-resend"
# fulmar's own (an Aeron driver has no reader doorbells): a subscription with
# wake-on-data=false is not woken by data landing in its images, only by what
# else its client waits on (a counter it watches, the driver's news).  A
# cluster service reads the log only up to the commit position, whose moves
# ring it; a ring for every uncommitted append woke it for nothing.
WAKE_ON_DATA_PARAM = "wake-on-data"
# fulmar's own as well: data landing in the subscription's images rings the
# doorbell with this counter id (a thread doorbell its client added) instead
# of the client's.  The archive's recorder thread sleeps on one, so a block
# to record does not wake the archive's agent too.
DOORBELL_ID_PARAM = "doorbell-id"
# fulmar's own, between fulmar drivers only (an Aeron peer neither sends nor
# accepts it): datagram-mac=true puts a MAC, under a key derived from the
# drivers' shared member secret, after the frames of every datagram of the
# channel, both ways, and the receiving driver refuses any datagram without
# a valid one before it reads a frame.  A stranger who can reach the
# channel's ports cannot inject data or control frames into its streams.
# The MAC is on top of the mtu: a datagram is up to mtu + 16 bytes.
DATAGRAM_MAC_PARAM = "datagram-mac"
DATAGRAM_MAC_LENGTH = 16

CONTROL_MODE_MANUAL = "manual"
CONTROL_MODE_DYNAMIC = "dynamic"
CONTROL_MODE_RESPONSE = "response"
CONTROL_MODES = (CONTROL_MODE_MANUAL, CONTROL_MODE_DYNAMIC, CONTROL_MODE_RESPONSE)

FLOW_CONTROL_MAX = "max"
FLOW_CONTROL_MIN = "min"
FLOW_CONTROL_TAGGED = "tagged"
CONGESTION_CONTROL_STATIC = "static"
CONGESTION_CONTROL_CUBIC = "cubic"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_MEDIA = (UDP_MEDIA, IPC_MEDIA)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_SIZE = re.compile(r"([0-9]+)([kKmMgG]?)")
_DURATION = re.compile(r"([0-9]+)(ns|us|ms|s)?", re.IGNORECASE)
_SIZE_MULTIPLIERS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_DURATION_MULTIPLIERS = {"": 1, "ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_HOSTNAME_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

T = TypeVar("T")


class InvalidChannelError(FulmarError, ValueError):
    """A channel URI that is malformed or has a bad parameter value."""

    def __init__(self, channel: str, reason: str) -> None:
        # Both parts are the exception's args, so it pickles across processes.
        super().__init__(channel, reason)
        self.channel = channel
        self.reason = reason

    def __str__(self) -> str:
        return f"invalid channel '{self.channel}': {self.reason}"


# --- values -------------------------------------------------------------------


@dataclass(frozen=True)
class Tag:
    """A ``tag:N`` reference to another entity (``session-id=tag:7``)."""

    value: int

    def __str__(self) -> str:
        return f"{TAG_PREFIX}{self.value}"


@dataclass(frozen=True)
class SocketAddress:
    """``host:port`` of an endpoint or control address, as written (not resolved).

    ``host`` is an IPv4 address, an IPv6 address without its brackets (maybe
    with a ``%scope``), or a host name.  Port 0 asks for an ephemeral port.
    """

    host: str
    port: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.host

    def resolve(self) -> tuple[str, int]:
        """The numeric ``(ip, port)`` to bind or send to; ``OSError`` if the name does not resolve.

        Names resolve to IPv4 when they can (``localhost`` is 127.0.0.1), as
        Aeron's default name resolver prefers IPv4 unless the address is bracketed.
        """
        if self.is_ipv6:
            return self.host, self.port
        infos = socket.getaddrinfo(self.host, self.port, socket.AF_INET, socket.SOCK_DGRAM)
        return str(infos[0][4][0]), self.port

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if self.is_ipv6 else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class InterfaceAddress:
    """``interface=host[:port][/prefix-length]``: the local address to route through."""

    host: str
    port: int | None = None
    prefix_length: int | None = None

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.host

    def __str__(self) -> str:
        text = f"[{self.host}]" if self.is_ipv6 else self.host
        if self.port is not None:
            text += f":{self.port}"
        if self.prefix_length is not None:
            text += f"/{self.prefix_length}"
        return text


@dataclass(frozen=True)
class FlowControl:
    """``fc=max`` | ``fc=min[,g:tag[/min-size]][,t:timeout]`` | ``fc=tagged[,...]``."""

    strategy: str
    group_tag: int | None = None
    group_min_size: int | None = None
    timeout_ns: int | None = None


@dataclass(frozen=True)
class InitialPosition:
    """``init-term-id``, ``term-id`` and ``term-offset``: where an exclusive publication starts."""

    initial_term_id: int
    term_id: int
    term_offset: int


# --- value parsers: raise ValueError with the reason, callers add the channel ----


def parse_int(text: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """A decimal integer in ``[low, high]``."""
    if not _INTEGER.fullmatch(text):
        raise ValueError("not a decimal integer")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"out of range {low}..{high}")
    return value


def parse_size(text: str) -> int:
    """A byte count with an optional binary suffix: ``64k``, ``16m``, ``1g`` (Aeron's parseSize)."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError("not a size (digits with an optional k, m or g suffix)")
    value = int(match.group(1)) * _SIZE_MULTIPLIERS[match.group(2).lower()]
    if value > INT64_MAX:
        raise ValueError("size out of range")
    return value


def parse_duration_ns(text: str) -> int:
    """A duration in nanoseconds with an optional suffix: ``10s``, ``5ms``, ``100us``, ``7ns``, ``7``."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise ValueError("not a duration (digits with an optional ns, us, ms or s suffix)")
    value = int(match.group(1)) * _DURATION_MULTIPLIERS[(match.group(2) or "").lower()]
    if value > INT64_MAX:
        raise ValueError("duration out of range")
    return value


def parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError("expected true or false")


def _parse_port(text: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"port {text!r} is not a number")
    port = int(text)
    if port > 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    return port


def _check_host(host: str) -> str:
    """Validate an IPv4 address or host name; return it unchanged."""
    if not host:
        raise ValueError("no host")
    if all(c.isdigit() or c == "." for c in host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not a valid IPv4 address") from None
        return host
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOSTNAME_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{host!r} is not a valid host name or IPv4 address")
    return host


def _check_ipv6(host: str) -> str:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"[{host}] is not a valid IPv6 address") from None
    return host


def _split_host_port(text: str) -> tuple[str, str | None]:
    """``[v6]:port``, ``[v6]``, ``host:port`` or ``host`` -> (host, port text or None)."""
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError("'[' without a closing ']'")
        host, rest = _check_ipv6(text[1:close]), text[close + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"unexpected {rest!r} after ']'")
        return host, rest[1:]
    if text.count(":") > 1:
        raise ValueError("an IPv6 address must be in brackets, e.g. [::1]:40123")
    host, colon, port = text.partition(":")
    return _check_host(host), port if colon else None


def parse_socket_address(text: str) -> SocketAddress:
    """``host:port``, ``[ipv6]:port``; the port is required (0 = ephemeral)."""
    host, port = _split_host_port(text)
    if port is None:
        raise ValueError("no port (expected host:port)")
    return SocketAddress(host, _parse_port(port))


def parse_interface(text: str) -> InterfaceAddress:
    """``host[:port][/prefix-length]`` (IPv6 hosts in brackets)."""
    address, slash, prefix_text = text.partition("/")
    host, port = _split_host_port(address)
    prefix_length = None
    if slash:
        bits = 128 if ":" in host else 32
        try:
            prefix_length = parse_int(prefix_text, 0, bits)
        except ValueError:
            raise ValueError(f"prefix length {prefix_text!r} is not a number in 0..{bits}") from None
    return InterfaceAddress(host, None if port is None else _parse_port(port), prefix_length)


def _parse_term_length(text: str) -> int:
    value = parse_size(text)
    if not TERM_MIN_LENGTH <= value <= TERM_MAX_LENGTH or value & (value - 1):
        raise ValueError(f"must be a power of two from {TERM_MIN_LENGTH} (64k) to {TERM_MAX_LENGTH} (1g)")
    return value


def _parse_mtu(text: str) -> int:
    value = parse_size(text)
    # The driver needs room for a data header plus payload: more than one
    # header, at most the largest UDP payload, in whole frames.
    if not HEADER_LENGTH < value <= MAX_UDP_PAYLOAD_LENGTH or value % FRAME_ALIGNMENT:
        raise ValueError(
            f"must be a multiple of {FRAME_ALIGNMENT} from {HEADER_LENGTH + FRAME_ALIGNMENT} to {MAX_UDP_PAYLOAD_LENGTH}"
        )
    return value


# The largest mtu of a datagram-mac channel: frames and MAC within the
# largest UDP payload, in whole frames.
MAX_DATAGRAM_MAC_MTU_LENGTH = (MAX_UDP_PAYLOAD_LENGTH - DATAGRAM_MAC_LENGTH) // FRAME_ALIGNMENT * FRAME_ALIGNMENT


def datagram_mac_mtu_reason(mtu: int) -> str:
    return (
        f"mtu {mtu} leaves no room for the {DATAGRAM_MAC_LENGTH}-byte MAC of {DATAGRAM_MAC_PARAM}=true "
        f"(at most {MAX_DATAGRAM_MAC_MTU_LENGTH})"
    )


def _parse_session_id(text: str) -> int | Tag:
    if text.startswith(TAG_PREFIX):
        return Tag(parse_int(text[len(TAG_PREFIX) :]))
    return parse_int(text, INT32_MIN, INT32_MAX)


def _parse_control_mode(text: str) -> str:
    if text not in CONTROL_MODES:
        raise ValueError(f"expected one of {', '.join(CONTROL_MODES)}")
    return text


def _parse_group(text: str) -> bool | None:
    # An inferable boolean: "infer" leaves the choice to the driver, like absence.
    return None if text.lower() == "infer" else parse_bool(text)


def _parse_tags(text: str) -> tuple[int | None, int | None]:
    """``channel-tag[,entity-tag]``; either may be empty."""
    parts = text.split(",")
    if len(parts) > 2:
        raise ValueError("expected at most two tags: channel-tag,entity-tag")
    tags = [parse_int(part) if part else None for part in parts]
    return tags[0], tags[1] if len(tags) > 1 else None


def _parse_flow_control(text: str) -> FlowControl:
    strategy, *options = text.split(",")
    if strategy not in (FLOW_CONTROL_MAX, FLOW_CONTROL_MIN, FLOW_CONTROL_TAGGED):
        raise ValueError(f"unknown strategy {strategy!r} (expected max, min or tagged)")
    if strategy == FLOW_CONTROL_MAX and options:
        raise ValueError("the max strategy takes no options")
    group_tag = group_min_size = timeout_ns = None
    for option in options:
        kind, colon, value = option.partition(":")
        if not colon or not value or kind not in ("g", "t"):
            raise ValueError(f"unrecognised option {option!r} (expected g:tag[/min-size] or t:timeout)")
        if kind == "t":
            timeout_ns = parse_duration_ns(value)
            continue
        # g:tag, g:tag/min-size or g:/min-size
        tag_text, slash, size_text = value.partition("/")
        if tag_text:
            group_tag = parse_int(tag_text)
        if slash:
            group_min_size = parse_int(size_text, 0, INT32_MAX)
    return FlowControl(strategy, group_tag, group_min_size, timeout_ns)


def _parse_congestion_control(text: str) -> str:
    if text not in (CONGESTION_CONTROL_STATIC, CONGESTION_CONTROL_CUBIC):
        raise ValueError("expected static or cubic")
    return text


def _parse_socket_buffer(text: str) -> int:
    value = parse_size(text)
    if not 0 < value <= INT32_MAX:
        raise ValueError(f"must be from 1 to {INT32_MAX} bytes")
    return value


def _parse_ttl(text: str) -> int:
    return parse_int(text, 0, 255)


def _parse_int32(text: str) -> int:
    return parse_int(text, INT32_MIN, INT32_MAX)


def _parse_term_offset(text: str) -> int:
    value = parse_int(text, 0, TERM_MAX_LENGTH)
    if value % FRAME_ALIGNMENT:
        raise ValueError(f"not a multiple of {FRAME_ALIGNMENT} (FRAME_ALIGNMENT)")
    return value


def _format_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, Tag, SocketAddress, InterfaceAddress)):
        return str(value)
    raise TypeError(f"cannot put a {type(value).__name__} into a channel URI")


# --- the URI --------------------------------------------------------------------


class ChannelUri:
    """An immutable parsed channel: ``prefix`` ('' or 'aeron-spy'), ``media``, ordered ``params``.

    ``str(uri)`` gives the channel text back; for a parsed channel it is the
    original text.  ``with_param`` / ``without_param`` build new channels.
    """

    __slots__ = ("_prefix", "_media", "_params", "_text")

    def __init__(self, media: str, params: Mapping[str, str] | None = None, prefix: str = "") -> None:
        params = dict(params or {})
        text = _render(prefix, media, params)
        if prefix not in ("", SPY_QUALIFIER):
            raise InvalidChannelError(text, f"unknown prefix '{prefix}' (only '{SPY_QUALIFIER}')")
        _check_media(text, media)
        for key, value in params.items():
            _check_param(text, key, value)
        self._prefix = prefix
        self._media = media
        self._params = params
        self._text = text

    @classmethod
    def parse(cls, text: str) -> ChannelUri:
        if not isinstance(text, str):
            raise TypeError(f"a channel URI is a str, not {type(text).__name__}")
        rest, prefix = text, ""
        if rest.startswith(SPY_PREFIX):
            rest, prefix = rest[len(SPY_PREFIX) :], SPY_QUALIFIER
        if not rest.startswith(AERON_PREFIX):
            raise InvalidChannelError(text, f"must start with '{AERON_PREFIX}' (or '{SPY_PREFIX}{AERON_PREFIX}')")
        media, question, query = rest[len(AERON_PREFIX) :].partition("?")
        _check_media(text, media)
        params: dict[str, str] = {}
        if question:
            if not query:
                raise InvalidChannelError(text, "'?' must be followed by key=value parameters")
            for part in query.split("|"):
                if not part:
                    raise InvalidChannelError(text, "empty parameter (a stray or trailing '|')")
                key, equals, value = part.partition("=")
                if not equals:
                    raise InvalidChannelError(text, f"parameter '{part}' is missing '='")
                if not key:
                    raise InvalidChannelError(text, f"empty key in parameter '{part}'")
                if not value:
                    raise InvalidChannelError(text, f"empty value for '{key}'")
                if key in params:
                    raise InvalidChannelError(text, f"duplicate key '{key}'")
                params[key] = value
        return cls(media, params, prefix)

    @classmethod
    def ipc(cls) -> ChannelUri:
        return cls(IPC_MEDIA)

    @classmethod
    def udp(cls, endpoint: str | SocketAddress | None = None, control: str | SocketAddress | None = None) -> ChannelUri:
        uri = cls(UDP_MEDIA)
        if endpoint is not None:
            uri = uri.with_param(ENDPOINT_PARAM, endpoint)
        if control is not None:
            uri = uri.with_param(CONTROL_PARAM, control)
        return uri

    # --- structure ---
    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def media(self) -> str:
        return self._media

    @property
    def params(self) -> Mapping[str, str]:
        return MappingProxyType(self._params)

    @property
    def is_spy(self) -> bool:
        return self._prefix == SPY_QUALIFIER

    @property
    def is_udp(self) -> bool:
        return self._media == UDP_MEDIA

    @property
    def is_ipc(self) -> bool:
        return self._media == IPC_MEDIA

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._params.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._params

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"ChannelUri.parse({self._text!r})"

    def __eq__(self, other: object) -> bool:
        # Parameter order carries no meaning.
        if not isinstance(other, ChannelUri):
            return NotImplemented
        return (self._prefix, self._media, self._params) == (other._prefix, other._media, other._params)

    def __hash__(self) -> int:
        return hash((self._prefix, self._media, frozenset(self._params.items())))

    # --- building ---
    def with_param(self, key: str, value: object) -> ChannelUri:
        """A copy with ``key`` set (replaced in place if present, else appended).

        ``value`` is a str, int, bool (written true/false), :class:`Tag`,
        :class:`SocketAddress` or :class:`InterfaceAddress`.  A known
        parameter's value is checked now, so a bad build fails where it is made.
        """
        params = dict(self._params)
        params[key] = _format_value(value)
        uri = ChannelUri(self._media, params, self._prefix)
        check = _CHECKS.get(key)
        if check is not None:
            check(uri)
        return uri

    def without_param(self, key: str) -> ChannelUri:
        params = dict(self._params)
        params.pop(key, None)
        return ChannelUri(self._media, params, self._prefix)

    def with_initial_position(self, initial_term_id: int, term_id: int, term_offset: int) -> ChannelUri:
        """A copy with ``init-term-id``, ``term-id`` and ``term-offset`` set, checked together."""
        uri = self.with_param(INITIAL_TERM_ID_PARAM, initial_term_id)
        uri = uri.with_param(TERM_ID_PARAM, term_id).with_param(TERM_OFFSET_PARAM, term_offset)
        uri.initial_position()
        return uri

    def with_prefix(self, prefix: str) -> ChannelUri:
        return ChannelUri(self._media, self._params, prefix)

    # --- typed accessors: None when the parameter is absent ---
    def _value(self, key: str, parse: Callable[[str], T]) -> T | None:
        text = self._params.get(key)
        if text is None:
            return None
        try:
            return parse(text)
        except ValueError as exc:
            raise InvalidChannelError(self._text, f"bad value for '{key}' ({text!r}): {exc}") from None

    def term_length(self) -> int | None:
        return self._value(TERM_LENGTH_PARAM, _parse_term_length)

    def mtu(self) -> int | None:
        return self._value(MTU_LENGTH_PARAM, _parse_mtu)

    def session_id(self) -> int | Tag | None:
        """An int32, or a :class:`Tag` naming the publication whose session to share."""
        return self._value(SESSION_ID_PARAM, _parse_session_id)

    def alias(self) -> str | None:
        return self._params.get(ALIAS_PARAM)

    def endpoint(self) -> SocketAddress | None:
        return self._value(ENDPOINT_PARAM, parse_socket_address)

    def control(self) -> SocketAddress | None:
        return self._value(CONTROL_PARAM, parse_socket_address)

    def resolve_endpoint(self) -> tuple[str, int] | None:
        return self._resolve(ENDPOINT_PARAM, self.endpoint())

    def resolve_control(self) -> tuple[str, int] | None:
        return self._resolve(CONTROL_PARAM, self.control())

    def _resolve(self, key: str, address: SocketAddress | None) -> tuple[str, int] | None:
        if address is None:
            return None
        try:
            return address.resolve()
        except OSError as exc:
            raise InvalidChannelError(self._text, f"cannot resolve '{key}' host '{address.host}': {exc}") from None

    def control_mode(self) -> str | None:
        return self._value(CONTROL_MODE_PARAM, _parse_control_mode)

    def interface(self) -> InterfaceAddress | None:
        return self._value(INTERFACE_PARAM, parse_interface)

    def ttl(self) -> int | None:
        return self._value(TTL_PARAM, _parse_ttl)

    def reliable(self) -> bool | None:
        return self._value(RELIABLE_PARAM, parse_bool)

    def sparse(self) -> bool | None:
        return self._value(SPARSE_PARAM, parse_bool)

    def eos(self) -> bool | None:
        return self._value(EOS_PARAM, parse_bool)

    def tether(self) -> bool | None:
        return self._value(TETHER_PARAM, parse_bool)

    def rejoin(self) -> bool | None:
        return self._value(REJOIN_PARAM, parse_bool)

    def wake_on_data(self) -> bool | None:
        return self._value(WAKE_ON_DATA_PARAM, parse_bool)

    def doorbell_id(self) -> int | None:
        return self._value(DOORBELL_ID_PARAM, lambda text: parse_int(text, 0, INT32_MAX))

    def datagram_mac(self) -> bool:
        """Whether the channel's datagrams carry a MAC (``datagram-mac=true``); absent: no."""
        return bool(self._value(DATAGRAM_MAC_PARAM, parse_bool))

    def spies_simulate_connection(self) -> bool | None:
        return self._value(SPIES_SIMULATE_CONNECTION_PARAM, parse_bool)

    def group(self) -> bool | None:
        """True/False, or None when absent or ``infer`` (the driver decides)."""
        return self._value(GROUP_PARAM, _parse_group)

    def duration_ns(self, key: str) -> int | None:
        """Any duration parameter (``linger``, ``nak-delay``, the untethered timeouts) in nanoseconds."""
        return self._value(key, parse_duration_ns)

    def linger_ns(self) -> int | None:
        return self.duration_ns(LINGER_PARAM)

    def initial_position(self, default_term_length: int | None = None) -> InitialPosition | None:
        """The start position of an exclusive publication: all three parameters or none.

        The term offset is checked against ``term-length`` from the channel, or
        ``default_term_length`` (the driver's default) when the channel has none.
        """
        keys = (INITIAL_TERM_ID_PARAM, TERM_ID_PARAM, TERM_OFFSET_PARAM)
        present = [key for key in keys if key in self._params]
        if not present:
            return None
        if len(present) < len(keys):
            raise InvalidChannelError(
                self._text,
                f"'{INITIAL_TERM_ID_PARAM}', '{TERM_ID_PARAM}' and '{TERM_OFFSET_PARAM}' must be used together",
            )
        initial_term_id = self._value(INITIAL_TERM_ID_PARAM, _parse_int32)
        term_id = self._value(TERM_ID_PARAM, _parse_int32)
        term_offset = self._value(TERM_OFFSET_PARAM, _parse_term_offset)
        assert initial_term_id is not None and term_id is not None and term_offset is not None
        term_length = self.term_length() or default_term_length
        # Aeron allows an offset equal to the term length (a full term).
        if term_length is not None and term_offset > term_length:
            raise InvalidChannelError(
                self._text, f"'{TERM_OFFSET_PARAM}' {term_offset} is beyond the term length {term_length}"
            )
        # Term ids wrap as int32; the current term may not be behind the initial one.
        if ((term_id - initial_term_id + 2**31) % 2**32) - 2**31 < 0:
            raise InvalidChannelError(
                self._text, f"'{TERM_ID_PARAM}' {term_id} is behind '{INITIAL_TERM_ID_PARAM}' {initial_term_id}"
            )
        return InitialPosition(initial_term_id, term_id, term_offset)

    def flow_control(self) -> FlowControl | None:
        return self._value(FLOW_CONTROL_PARAM, _parse_flow_control)

    def group_tag(self) -> int | None:
        return self._value(GROUP_TAG_PARAM, parse_int)

    def channel_tag(self) -> int | None:
        tags = self._value(TAGS_PARAM, _parse_tags)
        return None if tags is None else tags[0]

    def entity_tag(self) -> int | None:
        tags = self._value(TAGS_PARAM, _parse_tags)
        return None if tags is None else tags[1]

    def socket_sndbuf_length(self) -> int | None:
        return self._value(SOCKET_SNDBUF_PARAM, _parse_socket_buffer)

    def socket_rcvbuf_length(self) -> int | None:
        return self._value(SOCKET_RCVBUF_PARAM, _parse_socket_buffer)

    def receiver_window_length(self) -> int | None:
        return self._value(RECEIVER_WINDOW_PARAM, _parse_socket_buffer)

    def congestion_control(self) -> str | None:
        return self._value(CONGESTION_CONTROL_PARAM, _parse_congestion_control)

    def response_correlation_id(self) -> int | None:
        return self._value(RESPONSE_CORRELATION_ID_PARAM, parse_int)

    def max_resend(self) -> int | None:
        return self._value(MAX_RESEND_PARAM, lambda text: parse_int(text, 1, INT32_MAX))

    # --- validation ---
    def validate(self) -> ChannelUri:
        """Check the value of every known parameter present; unknown ones pass. Returns self."""
        for key in self._params:
            check = _CHECKS.get(key)
            if check is not None:
                check(self)
        self.initial_position()
        if self.control_mode() == CONTROL_MODE_DYNAMIC and CONTROL_PARAM not in self._params:
            raise InvalidChannelError(self._text, "control-mode=dynamic needs a 'control' address")
        return self

    def _check_udp_addressing(self) -> None:
        # As the C driver: a UDP channel must say where it sends or listens,
        # unless it names a tagged channel or its destinations come later
        # (manual control) or from a response setup.
        if not self.is_udp:
            return
        if ENDPOINT_PARAM in self or CONTROL_PARAM in self or self.channel_tag() is not None:
            return
        if self.control_mode() in (CONTROL_MODE_MANUAL, CONTROL_MODE_RESPONSE):
            return
        raise InvalidChannelError(
            self._text, "a UDP channel needs 'endpoint' or 'control' (or 'tags', or control-mode=manual)"
        )

    def validate_for_publication(self, default_term_length: int | None = None) -> ChannelUri:
        """Everything a publication needs; returns self."""
        self.validate()
        if self.is_spy:
            raise InvalidChannelError(self._text, f"a publication cannot use the '{SPY_PREFIX}' prefix")
        self._check_udp_addressing()
        self.initial_position(default_term_length)
        term_length, mtu = self.term_length(), self.mtu()
        if mtu is not None and self.datagram_mac() and mtu > MAX_DATAGRAM_MAC_MTU_LENGTH:
            raise InvalidChannelError(self._text, datagram_mac_mtu_reason(mtu))
        if term_length is not None and mtu is not None and mtu > compute_max_message_length(term_length):
            raise InvalidChannelError(
                self._text,
                f"mtu {mtu} is larger than the maximum message length "
                f"{compute_max_message_length(term_length)} of term-length {term_length}",
            )
        return self

    def validate_for_subscription(self) -> ChannelUri:
        """Everything a subscription needs; returns self."""
        self.validate()
        if self.is_spy and not self.is_udp:
            raise InvalidChannelError(self._text, f"'{SPY_PREFIX}' only spies on UDP publications")
        if isinstance(self.session_id(), Tag):
            raise InvalidChannelError(self._text, "a subscription's 'session-id' must be a number, not a tag")
        self._check_udp_addressing()
        return self


def _render(prefix: str, media: str, params: Mapping[str, str]) -> str:
    text = f"{prefix}:" if prefix else ""
    text += AERON_PREFIX + media
    if params:
        text += "?" + "|".join(f"{key}={value}" for key, value in params.items())
    return text


def _check_media(text: str, media: str) -> None:
    if not media:
        raise InvalidChannelError(text, "missing media after 'aeron:' (expected 'udp' or 'ipc')")
    if ":" in media:
        raise InvalidChannelError(text, f"':' inside the media '{media}' (expected 'udp' or 'ipc')")
    if media not in _MEDIA:
        raise InvalidChannelError(text, f"unknown media '{media}' (expected 'udp' or 'ipc')")


def _check_param(text: str, key: str, value: str) -> None:
    if not isinstance(key, str) or not isinstance(value, str):
        raise TypeError("channel parameter keys and values are str")
    if not key:
        raise InvalidChannelError(text, "empty key")
    if "=" in key or "|" in key:
        raise InvalidChannelError(text, f"key '{key}' contains '=' or '|'")
    if not value:
        raise InvalidChannelError(text, f"empty value for '{key}'")
    if "|" in value:
        raise InvalidChannelError(text, f"value of '{key}' contains '|'")


# The accessor that checks each known parameter (validate() and with_param()).
_CHECKS: dict[str, Callable[[ChannelUri], object]] = {
    TERM_LENGTH_PARAM: ChannelUri.term_length,
    MTU_LENGTH_PARAM: ChannelUri.mtu,
    SESSION_ID_PARAM: ChannelUri.session_id,
    ENDPOINT_PARAM: ChannelUri.endpoint,
    CONTROL_PARAM: ChannelUri.control,
    CONTROL_MODE_PARAM: ChannelUri.control_mode,
    INTERFACE_PARAM: ChannelUri.interface,
    TTL_PARAM: ChannelUri.ttl,
    RELIABLE_PARAM: ChannelUri.reliable,
    SPARSE_PARAM: ChannelUri.sparse,
    EOS_PARAM: ChannelUri.eos,
    TETHER_PARAM: ChannelUri.tether,
    REJOIN_PARAM: ChannelUri.rejoin,
    SPIES_SIMULATE_CONNECTION_PARAM: ChannelUri.spies_simulate_connection,
    WAKE_ON_DATA_PARAM: ChannelUri.wake_on_data,
    DOORBELL_ID_PARAM: ChannelUri.doorbell_id,
    DATAGRAM_MAC_PARAM: ChannelUri.datagram_mac,
    GROUP_PARAM: ChannelUri.group,
    LINGER_PARAM: ChannelUri.linger_ns,
    NAK_DELAY_PARAM: lambda uri: uri.duration_ns(NAK_DELAY_PARAM),
    UNTETHERED_WINDOW_LIMIT_TIMEOUT_PARAM: lambda uri: uri.duration_ns(UNTETHERED_WINDOW_LIMIT_TIMEOUT_PARAM),
    UNTETHERED_RESTING_TIMEOUT_PARAM: lambda uri: uri.duration_ns(UNTETHERED_RESTING_TIMEOUT_PARAM),
    # Each of the three alone (so a builder can add them one by one);
    # validate() checks them together.
    INITIAL_TERM_ID_PARAM: lambda uri: uri._value(INITIAL_TERM_ID_PARAM, _parse_int32),
    TERM_ID_PARAM: lambda uri: uri._value(TERM_ID_PARAM, _parse_int32),
    TERM_OFFSET_PARAM: lambda uri: uri._value(TERM_OFFSET_PARAM, _parse_term_offset),
    FLOW_CONTROL_PARAM: ChannelUri.flow_control,
    GROUP_TAG_PARAM: ChannelUri.group_tag,
    TAGS_PARAM: ChannelUri.channel_tag,
    SOCKET_SNDBUF_PARAM: ChannelUri.socket_sndbuf_length,
    SOCKET_RCVBUF_PARAM: ChannelUri.socket_rcvbuf_length,
    RECEIVER_WINDOW_PARAM: ChannelUri.receiver_window_length,
    CONGESTION_CONTROL_PARAM: ChannelUri.congestion_control,
    RESPONSE_CORRELATION_ID_PARAM: ChannelUri.response_correlation_id,
    MAX_RESEND_PARAM: ChannelUri.max_resend,
}

# The parameters whose values validate() and with_param() check; any other key is kept as it is.
CHECKED_PARAMS: frozenset[str] = frozenset(_CHECKS)

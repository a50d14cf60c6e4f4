"""Channel URI parsing, typed parameters, validation and building."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fulmar.channel_uri import (
    CHECKED_PARAMS,
    ChannelUri,
    FlowControl,
    InitialPosition,
    InterfaceAddress,
    InvalidChannelError,
    SocketAddress,
    Tag,
    parse_duration_ns,
    parse_size,
)
from fulmar.errors import FulmarError


def error_of(channel: str, check: str = "validate") -> str:
    """The message of the InvalidChannelError that parsing (then ``check``) raises."""
    with pytest.raises(InvalidChannelError) as info:
        getattr(ChannelUri.parse(channel), check)()
    message = str(info.value)
    assert message.startswith(f"invalid channel '{channel}': "), message
    return message


# --- structure ---------------------------------------------------------------


def test_ipc_without_params() -> None:
    uri = ChannelUri.parse("aeron:ipc")
    assert (uri.media, uri.prefix, uri.is_spy, dict(uri.params)) == ("ipc", "", False, {})
    assert uri.is_ipc and not uri.is_udp
    assert str(uri) == "aeron:ipc"


def test_udp_params_keep_their_order_and_round_trip() -> None:
    text = "aeron:udp?term-length=64k|endpoint=localhost:40123|alias=log|mtu=1408"
    uri = ChannelUri.parse(text)
    assert list(uri.params) == ["term-length", "endpoint", "alias", "mtu"]
    assert uri.get("alias") == "log" and uri.get("missing") is None
    assert "mtu" in uri and "ttl" not in uri
    assert str(uri) == text


def test_spy_prefix() -> None:
    uri = ChannelUri.parse("aeron-spy:aeron:udp?endpoint=127.0.0.1:40456")
    assert uri.is_spy and uri.prefix == "aeron-spy" and uri.media == "udp"
    assert str(uri) == "aeron-spy:aeron:udp?endpoint=127.0.0.1:40456"
    assert str(uri.with_prefix("")) == "aeron:udp?endpoint=127.0.0.1:40456"


def test_unknown_params_are_kept_and_pass_validation() -> None:
    uri = ChannelUri.parse("aeron:ipc?future-thing=1,2|x=y=z")
    assert uri.validate() is uri
    assert dict(uri.params) == {"future-thing": "1,2", "x": "y=z"}


def test_params_mapping_is_read_only() -> None:
    uri = ChannelUri.parse("aeron:ipc?alias=a")
    with pytest.raises(TypeError):
        uri.params["alias"] = "b"  # type: ignore[index]


def test_equality_ignores_parameter_order() -> None:
    a = ChannelUri.parse("aeron:udp?endpoint=h:1|mtu=1408")
    b = ChannelUri.parse("aeron:udp?mtu=1408|endpoint=h:1")
    assert a == b and hash(a) == hash(b)
    assert a != ChannelUri.parse("aeron-spy:aeron:udp?endpoint=h:1|mtu=1408")


@pytest.mark.parametrize(
    ("channel", "reason"),
    [
        ("udp?endpoint=h:1", "must start with 'aeron:'"),
        ("", "must start with 'aeron:'"),
        ("aeron-spy:udp?endpoint=h:1", "must start with 'aeron:'"),
        ("Aeron:ipc", "must start with 'aeron:'"),
        ("aeron:", "missing media"),
        ("aeron:?alias=a", "missing media"),
        ("aeron:tcp?endpoint=h:1", "unknown media 'tcp'"),
        ("aeron:IPC", "unknown media 'IPC'"),
        ("aeron:udp:x?alias=a", "':' inside the media 'udp:x'"),
        ("aeron:ipc?", "'?' must be followed by key=value parameters"),
        ("aeron:udp?=1", "empty key in parameter '=1'"),
        ("aeron:udp?endpoint=", "empty value for 'endpoint'"),
        ("aeron:udp?endpoint", "parameter 'endpoint' is missing '='"),
        ("aeron:udp?alias=a|alias=b", "duplicate key 'alias'"),
        ("aeron:udp?alias=a|", "empty parameter (a stray or trailing '|')"),
        ("aeron:udp?alias=a||mtu=64", "empty parameter"),
        ("aeron:udp?|alias=a", "empty parameter"),
    ],
)
def test_malformed_uris(channel: str, reason: str) -> None:
    with pytest.raises(InvalidChannelError) as info:
        ChannelUri.parse(channel)
    assert str(info.value) == f"invalid channel '{channel}': " + str(info.value).split(": ", 1)[1]
    assert reason in info.value.reason
    assert info.value.channel == channel


def test_error_is_a_fulmar_value_error_and_pickles() -> None:
    with pytest.raises(InvalidChannelError) as info:
        ChannelUri.parse("aeron:tcp")
    error = info.value
    assert isinstance(error, FulmarError) and isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.reason == error.reason


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(TypeError):
        ChannelUri.parse(b"aeron:ipc")  # type: ignore[arg-type]


# --- round trips (hypothesis) --------------------------------------------------

_KEY = st.text(st.characters(exclude_characters="=|"), min_size=1, max_size=12)
_VALUE = st.text(st.characters(exclude_characters="|"), min_size=1, max_size=16)


@given(
    prefix=st.sampled_from(["", "aeron-spy"]),
    media=st.sampled_from(["udp", "ipc"]),
    params=st.dictionaries(_KEY, _VALUE, max_size=6),
)
def test_built_uri_round_trips_through_text(prefix: str, media: str, params: dict[str, str]) -> None:
    uri = ChannelUri(media, params, prefix)
    parsed = ChannelUri.parse(str(uri))
    assert parsed == uri
    assert list(parsed.params.items()) == list(params.items())
    assert str(parsed) == str(uri)


# The parameters with_param checks (a value drawn at random is not one of
# theirs): the module's own table, so that a parameter added there is left out
# here too (Hypothesis draws keys from the strings in the code it tests).
_KNOWN = CHECKED_PARAMS


@given(params=st.dictionaries(_KEY.filter(lambda key: key not in _KNOWN), _VALUE, min_size=1, max_size=6))
def test_with_param_chain_builds_the_same_uri(params: dict[str, str]) -> None:
    uri = ChannelUri.ipc()
    for key, value in params.items():
        uri = uri.with_param(key, value)
    assert uri == ChannelUri("ipc", params)
    assert str(uri) == "aeron:ipc?" + "|".join(f"{key}={value}" for key, value in params.items())
    assert ChannelUri.parse(str(uri)) == uri


@given(
    session_id=st.one_of(st.integers(-(2**31), 2**31 - 1), st.builds(Tag, st.integers(-(2**63), 2**63 - 1))),
    term_shift=st.integers(16, 30),
    mtu_frames=st.integers(2, 2047),
    endpoint=st.one_of(
        st.builds(SocketAddress, st.sampled_from(["localhost", "127.0.0.1", "node-1.example"]), st.integers(0, 65535)),
        st.builds(SocketAddress, st.sampled_from(["::1", "fe80::1%eth0", "2001:db8::7"]), st.integers(0, 65535)),
    ),
    linger_ms=st.integers(0, 10**6),
    reliable=st.booleans(),
)
def test_typed_values_survive_build_and_parse(
    session_id: int | Tag, term_shift: int, mtu_frames: int, endpoint: SocketAddress, linger_ms: int, reliable: bool
) -> None:
    uri = (
        ChannelUri.udp(endpoint=endpoint)
        .with_param("session-id", session_id)
        .with_param("term-length", 1 << term_shift)
        .with_param("mtu", mtu_frames * 32)
        .with_param("linger", f"{linger_ms}ms")
        .with_param("reliable", reliable)
    )
    parsed = ChannelUri.parse(str(uri)).validate()
    assert parsed.session_id() == session_id
    assert parsed.term_length() == 1 << term_shift
    assert parsed.mtu() == mtu_frames * 32
    assert parsed.endpoint() == endpoint
    assert parsed.linger_ns() == linger_ms * 1_000_000
    assert parsed.reliable() is reliable


# --- building ------------------------------------------------------------------


def test_with_param_replaces_in_place_and_formats_values() -> None:
    uri = ChannelUri.parse("aeron:udp?endpoint=h:1|alias=a|mtu=64")
    uri = uri.with_param("alias", "b").with_param("sparse", False).with_param("session-id", Tag(7))
    assert str(uri) == "aeron:udp?endpoint=h:1|alias=b|mtu=64|sparse=false|session-id=tag:7"
    assert str(uri.without_param("alias").without_param("absent")) == (
        "aeron:udp?endpoint=h:1|mtu=64|sparse=false|session-id=tag:7"
    )


def test_with_param_checks_known_values_at_once() -> None:
    with pytest.raises(InvalidChannelError, match=r"bad value for 'mtu' \('100'\): must be a multiple of 32"):
        ChannelUri.ipc().with_param("mtu", 100)
    with pytest.raises(InvalidChannelError, match="contains '|'"):
        ChannelUri.ipc().with_param("alias", "a|b")
    with pytest.raises(InvalidChannelError, match="empty value for 'alias'"):
        ChannelUri.ipc().with_param("alias", "")
    with pytest.raises(TypeError):
        ChannelUri.ipc().with_param("alias", 1.5)


def test_udp_and_initial_position_builders() -> None:
    uri = ChannelUri.udp(endpoint="localhost:0", control=SocketAddress("::1", 40001))
    assert str(uri) == "aeron:udp?endpoint=localhost:0|control=[::1]:40001"
    uri = ChannelUri.ipc().with_param("term-length", "64k").with_initial_position(5, 7, 1024)
    assert uri.initial_position() == InitialPosition(5, 7, 1024)
    with pytest.raises(InvalidChannelError, match="beyond the term length 65536"):
        ChannelUri.ipc().with_param("term-length", "64k").with_initial_position(5, 7, 131072)


# --- typed parameters ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("65536", 65536), ("64k", 65536), ("64K", 65536), ("1m", 1 << 20), ("16M", 16 << 20), ("1g", 1 << 30), ("0", 0)],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "k", "64kb", "-1", "1.5m", " 64k", "64 k", "0x10", "1t"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [("7", 7), ("7ns", 7), ("100us", 100_000), ("5ms", 5_000_000), ("5MS", 5_000_000), ("10s", 10_000_000_000)],
)
def test_durations(text: str, value: int) -> None:
    assert parse_duration_ns(text) == value


@pytest.mark.parametrize("text", ["", "s", "5m", "5 ms", "-1s", "1.5s", "5sec", "ms5"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ns(text)


def test_duration_overflow() -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_duration_ns(f"{2**63}ns")
    assert "out of range" in error_of(f"aeron:ipc?linger={2**62}s")


def test_term_length() -> None:
    assert ChannelUri.parse("aeron:ipc?term-length=64k").term_length() == 65536
    assert ChannelUri.parse("aeron:ipc?term-length=1g").term_length() == 1 << 30
    assert ChannelUri.parse("aeron:ipc").term_length() is None
    for bad in ("32k", "96k", "2g", "abc"):
        message = error_of(f"aeron:ipc?term-length={bad}", "term_length")
        assert f"bad value for 'term-length' ('{bad}')" in message


def test_mtu() -> None:
    assert ChannelUri.parse("aeron:ipc?mtu=64").mtu() == 64
    assert ChannelUri.parse("aeron:ipc?mtu=65504").mtu() == 65504
    assert ChannelUri.parse("aeron:ipc?mtu=8k").mtu() == 8192
    for bad in ("32", "1400", "65536", "0"):
        assert "must be a multiple of 32 from 64 to 65504" in error_of(f"aeron:ipc?mtu={bad}", "mtu")


def test_datagram_mac() -> None:
    assert ChannelUri.parse("aeron:udp?endpoint=h:1|datagram-mac=true").datagram_mac() is True
    assert ChannelUri.parse("aeron:udp?endpoint=h:1|datagram-mac=false").datagram_mac() is False
    assert ChannelUri.parse("aeron:udp?endpoint=h:1").datagram_mac() is False
    assert "datagram-mac" in CHECKED_PARAMS
    assert "bad value for 'datagram-mac'" in error_of("aeron:udp?endpoint=h:1|datagram-mac=yes")
    # The MAC is on top of the mtu, and the datagram must still fit a UDP payload.
    ChannelUri.parse("aeron:udp?endpoint=h:1|mtu=65472|datagram-mac=true").validate_for_publication()
    ChannelUri.parse("aeron:udp?endpoint=h:1|mtu=65504").validate_for_publication()
    assert "no room for the 16-byte MAC" in error_of(
        "aeron:udp?endpoint=h:1|mtu=65504|datagram-mac=true", "validate_for_publication"
    )


def test_session_id() -> None:
    assert ChannelUri.parse("aeron:ipc?session-id=-5").session_id() == -5
    assert ChannelUri.parse("aeron:ipc?session-id=2147483647").session_id() == 2**31 - 1
    assert ChannelUri.parse("aeron:ipc?session-id=tag:77").session_id() == Tag(77)
    assert "out of range" in error_of("aeron:ipc?session-id=2147483648", "session_id")
    assert "not a decimal integer" in error_of("aeron:ipc?session-id=tag:x", "session_id")
    assert "not a decimal integer" in error_of("aeron:ipc?session-id=0x10", "session_id")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("localhost:40123", SocketAddress("localhost", 40123)),
        ("127.0.0.1:0", SocketAddress("127.0.0.1", 0)),
        ("node-1.example.com:65535", SocketAddress("node-1.example.com", 65535)),
        ("[::1]:40123", SocketAddress("::1", 40123)),
        ("[fe80::1%eth0]:5", SocketAddress("fe80::1%eth0", 5)),
        ("[2001:db8::7]:0", SocketAddress("2001:db8::7", 0)),
    ],
)
def test_endpoints(value: str, expected: SocketAddress) -> None:
    uri = ChannelUri.parse(f"aeron:udp?endpoint={value}|control={value}")
    assert uri.endpoint() == expected and uri.control() == expected
    assert str(expected) == value
    assert expected.is_ipv6 == value.startswith("[")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("localhost", "no port (expected host:port)"),
        ("[::1]", "no port"),
        (":40123", "no host"),
        ("localhost:", "port '' is not a number"),
        ("localhost:http", "port 'http' is not a number"),
        ("localhost:65536", "port 65536 is out of range 0..65535"),
        ("::1:40123", "an IPv6 address must be in brackets"),
        ("[::1:40123", "'[' without a closing ']'"),
        ("[zz::1]:5", "[zz::1] is not a valid IPv6 address"),
        ("[::1]x:5", "unexpected 'x:5' after ']'"),
        ("256.1.1.1:5", "'256.1.1.1' is not a valid IPv4 address"),
        ("1.2.3:5", "'1.2.3' is not a valid IPv4 address"),
        ("bad_host:5", "'bad_host' is not a valid host name"),
    ],
)
def test_bad_endpoints(value: str, reason: str) -> None:
    channel = f"aeron:udp?endpoint={value}"
    message = error_of(channel, "endpoint")
    assert message.startswith(f"invalid channel '{channel}': bad value for 'endpoint' ('{value}'): ")
    assert reason in message


def test_resolve_endpoint_and_control() -> None:
    uri = ChannelUri.parse("aeron:udp?endpoint=localhost:40123|control=[::1]:0")
    assert uri.resolve_endpoint() == ("127.0.0.1", 40123)
    assert uri.resolve_control() == ("::1", 0)
    assert ChannelUri.parse("aeron:ipc").resolve_endpoint() is None
    # .invalid is reserved (RFC 2606): it never resolves.
    message = error_of("aeron:udp?endpoint=nowhere.invalid:5", "resolve_endpoint")
    assert "cannot resolve 'endpoint' host 'nowhere.invalid'" in message


def test_interface() -> None:
    assert ChannelUri.parse("aeron:udp?interface=192.168.1.0/24").interface() == InterfaceAddress(
        "192.168.1.0", None, 24
    )
    assert ChannelUri.parse("aeron:udp?interface=10.0.0.1:4000/8").interface() == InterfaceAddress("10.0.0.1", 4000, 8)
    assert ChannelUri.parse("aeron:udp?interface=localhost").interface() == InterfaceAddress("localhost")
    assert ChannelUri.parse("aeron:udp?interface=[::1]/64").interface() == InterfaceAddress("::1", None, 64)
    assert str(InterfaceAddress("::1", 5, 64)) == "[::1]:5/64"
    assert "no host" in error_of("aeron:udp?interface=/24", "interface")
    assert "prefix length '33' is not a number in 0..32" in error_of("aeron:udp?interface=1.2.3.4/33", "interface")
    assert "prefix length 'x' is not a number in 0..128" in error_of("aeron:udp?interface=[::1]/x", "interface")


def test_control_mode_ttl_booleans_group() -> None:
    for mode in ("manual", "dynamic", "response"):
        assert ChannelUri.parse(f"aeron:udp?control-mode={mode}").control_mode() == mode
    assert "expected one of manual, dynamic, response" in error_of("aeron:udp?control-mode=auto", "control_mode")
    assert ChannelUri.parse("aeron:udp?ttl=0").ttl() == 0
    assert ChannelUri.parse("aeron:udp?ttl=255").ttl() == 255
    assert "out of range 0..255" in error_of("aeron:udp?ttl=256", "ttl")
    uri = ChannelUri.parse("aeron:udp?reliable=false|sparse=TRUE|eos=true|tether=false|rejoin=true|ssc=false")
    assert (uri.reliable(), uri.sparse(), uri.eos(), uri.tether(), uri.rejoin(), uri.spies_simulate_connection()) == (
        False, True, True, False, True, False,
    )  # fmt: skip
    assert "expected true or false" in error_of("aeron:udp?reliable=yes", "reliable")
    assert ChannelUri.parse("aeron:udp?group=infer").group() is None
    assert ChannelUri.parse("aeron:udp?group=true").group() is True
    assert "expected true or false" in error_of("aeron:udp?group=maybe", "group")


def test_timeouts() -> None:
    uri = ChannelUri.parse("aeron:udp?linger=5s|nak-delay=100us|untethered-resting-timeout=10ms")
    assert uri.linger_ns() == 5_000_000_000
    assert uri.duration_ns("nak-delay") == 100_000
    assert uri.duration_ns("untethered-resting-timeout") == 10_000_000
    assert "bad value for 'linger' ('5 s')" in error_of("aeron:udp?linger=5 s")


def test_initial_position() -> None:
    uri = ChannelUri.parse("aeron:ipc?init-term-id=3|term-id=9|term-offset=4096|term-length=64k")
    assert uri.initial_position() == InitialPosition(3, 9, 4096)
    assert ChannelUri.parse("aeron:ipc").initial_position() is None
    # Term ids wrap as int32: INT32_MIN is one term after INT32_MAX.
    wrapped = ChannelUri.parse("aeron:ipc?init-term-id=2147483647|term-id=-2147483648|term-offset=0")
    assert wrapped.initial_position() == InitialPosition(2**31 - 1, -(2**31), 0)
    # Aeron accepts an offset equal to the term length (a full term).
    assert ChannelUri.parse("aeron:ipc?init-term-id=0|term-id=0|term-offset=65536|term-length=64k").initial_position()

    assert "'init-term-id', 'term-id' and 'term-offset' must be used together" in error_of(
        "aeron:ipc?init-term-id=3|term-id=9"
    )
    assert "bad value for 'term-offset' ('100'): not a multiple of 32" in error_of(
        "aeron:ipc?init-term-id=3|term-id=9|term-offset=100"
    )
    assert "'term-offset' 131072 is beyond the term length 65536" in error_of(
        "aeron:ipc?init-term-id=3|term-id=9|term-offset=131072|term-length=64k"
    )
    assert "'term-id' 2 is behind 'init-term-id' 3" in error_of("aeron:ipc?init-term-id=3|term-id=2|term-offset=0")
    # Checked against the driver's default term length when the channel has none.
    uri = ChannelUri.parse("aeron:ipc?init-term-id=0|term-id=0|term-offset=131072")
    with pytest.raises(InvalidChannelError, match="beyond the term length 65536"):
        uri.initial_position(default_term_length=65536)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("max", FlowControl("max")),
        ("min", FlowControl("min")),
        ("min,t:10s", FlowControl("min", timeout_ns=10_000_000_000)),
        ("min,g:5/3,t:1ms", FlowControl("min", 5, 3, 1_000_000)),
        ("tagged,g:123", FlowControl("tagged", group_tag=123)),
        ("tagged,g:/2", FlowControl("tagged", group_min_size=2)),
    ],
)
def test_flow_control(value: str, expected: FlowControl) -> None:
    assert ChannelUri.parse(f"aeron:udp?fc={value}").flow_control() == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("pref", "unknown strategy 'pref' (expected max, min or tagged)"),
        ("max,g:1", "the max strategy takes no options"),
        ("min,x:1", "unrecognised option 'x:1'"),
        ("min,g:", "unrecognised option 'g:'"),
        ("min,g:a", "not a decimal integer"),
        ("min,g:1/-2", "out of range"),
        ("min,t:5x", "not a duration"),
    ],
)
def test_bad_flow_control(value: str, reason: str) -> None:
    assert reason in error_of(f"aeron:udp?fc={value}", "flow_control")


def test_tags_gtag_buffers_cc() -> None:
    uri = ChannelUri.parse("aeron:udp?tags=1,2|gtag=-9|so-sndbuf=2m|so-rcvbuf=128k|rcv-wnd=64k|cc=cubic")
    assert (uri.channel_tag(), uri.entity_tag(), uri.group_tag()) == (1, 2, -9)
    assert (uri.socket_sndbuf_length(), uri.socket_rcvbuf_length(), uri.receiver_window_length()) == (
        2 << 20, 128 << 10, 64 << 10,
    )  # fmt: skip
    assert uri.congestion_control() == "cubic"
    assert ChannelUri.parse("aeron:udp?tags=,2").channel_tag() is None
    assert ChannelUri.parse("aeron:udp?tags=5").entity_tag() is None
    assert "at most two tags" in error_of("aeron:udp?tags=1,2,3")
    assert "not a decimal integer" in error_of("aeron:udp?tags=a")
    assert "must be from 1 to 2147483647 bytes" in error_of("aeron:udp?so-sndbuf=0")
    assert "expected static or cubic" in error_of("aeron:udp?cc=reno")


# --- what each side needs ------------------------------------------------------------


def test_publication_and_subscription_requirements() -> None:
    for ok in (
        "aeron:ipc",
        "aeron:udp?endpoint=localhost:40123",
        "aeron:udp?control=localhost:40124|control-mode=dynamic",
        "aeron:udp?control-mode=manual",
        "aeron:udp?tags=7",
    ):
        ChannelUri.parse(ok).validate_for_publication()
        ChannelUri.parse(ok).validate_for_subscription()
    ChannelUri.parse("aeron-spy:aeron:udp?endpoint=localhost:40123").validate_for_subscription()

    needs = "a UDP channel needs 'endpoint' or 'control' (or 'tags', or control-mode=manual)"
    assert needs in error_of("aeron:udp", "validate_for_publication")
    assert needs in error_of("aeron:udp?alias=x", "validate_for_subscription")
    assert "control-mode=dynamic needs a 'control' address" in error_of("aeron:udp?endpoint=h:1|control-mode=dynamic")
    assert "a publication cannot use the 'aeron-spy:' prefix" in error_of(
        "aeron-spy:aeron:udp?endpoint=h:1", "validate_for_publication"
    )
    assert "'aeron-spy:' only spies on UDP publications" in error_of("aeron-spy:aeron:ipc", "validate_for_subscription")
    assert "a subscription's 'session-id' must be a number, not a tag" in error_of(
        "aeron:ipc?session-id=tag:1", "validate_for_subscription"
    )
    assert "mtu 65504 is larger than the maximum message length 8192 of term-length 65536" in error_of(
        "aeron:ipc?term-length=64k|mtu=65504", "validate_for_publication"
    )
    # validate_* check every known value too.
    assert "bad value for 'ttl'" in error_of("aeron:udp?endpoint=h:1|ttl=-1", "validate_for_publication")

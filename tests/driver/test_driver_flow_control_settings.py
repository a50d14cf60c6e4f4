"""Which flow control a network publication's channel gets (data_plane.flow_control_settings):
the strategy, Aeron's defaults, the driver's defaults and the channel's overrides, and the errors.

What each strategy then does is tests/driver/test_native_flow_control.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from fulmar._native import lib
from fulmar.channel_uri import ChannelUri, InvalidChannelError
from fulmar.driver.data_plane import FlowControlSettings, flow_control_settings, has_group_semantics

UNICAST = int(lib.FULMAR_FC_UNICAST)
MAX = int(lib.FULMAR_FC_MAX)
MIN = int(lib.FULMAR_FC_MIN)
TAGGED = int(lib.FULMAR_FC_TAGGED)
TIMEOUT = 5_000_000_000  # Aeron's flow control receiver timeout
MDC = "aeron:udp?control=10.0.0.1:40457|control-mode=dynamic"


def settings_of(channel: str, **kwargs: Any) -> FlowControlSettings:
    return flow_control_settings(ChannelUri.parse(channel), **kwargs)


@pytest.mark.parametrize(
    ("channel", "expected"),
    [
        ("aeron:udp?endpoint=localhost:40456", UNICAST),
        ("aeron:udp?endpoint=10.0.0.1:40456", UNICAST),
        ("aeron:udp?endpoint=224.0.1.1:40456", MAX),
        ("aeron:udp?endpoint=[ff02::1]:40456", MAX),
        ("aeron:udp?control=10.0.0.1:40457|control-mode=dynamic", MAX),
        ("aeron:udp?control-mode=manual", MAX),
        ("aeron:udp?endpoint=224.0.1.1:40456|fc=max", MAX),
        ("aeron:udp?control-mode=manual|fc=min", MIN),
        ("aeron:udp?endpoint=224.0.1.1:40456|fc=tagged", TAGGED),
    ],
)
def test_each_channel_gets_aerons_strategy_and_defaults(channel: str, expected: int) -> None:
    assert settings_of(channel) == FlowControlSettings(expected, TIMEOUT, -1, 0)
    # The defaults are the C's.
    assert (TIMEOUT, -1, 0) == (
        lib.FULMAR_FC_RECEIVER_TIMEOUT_DEFAULT_NS,
        lib.FULMAR_FC_GROUP_TAG_DEFAULT,
        lib.FULMAR_FC_GROUP_MIN_SIZE_DEFAULT,
    )


@pytest.mark.parametrize(
    ("channel", "group"),
    [
        ("aeron:udp?endpoint=localhost:40456", False),  # a host name is not resolved: unicast
        ("aeron:udp?endpoint=10.0.0.1:40456", False),
        ("aeron:udp?endpoint=239.255.0.1:40456", True),
        ("aeron:udp?endpoint=224.0.1.1:40456|interface=127.0.0.1", True),
        ("aeron:udp?endpoint=[ff02::1]:40456", True),
        ("aeron:udp?endpoint=[::1]:40456", False),
        ("aeron:udp?control=10.0.0.1:40457", True),  # an explicit control address
        ("aeron:udp?control=10.0.0.1:40457|control-mode=dynamic", True),
        ("aeron:udp?control-mode=manual", True),
        ("aeron:udp?control-mode=response|endpoint=10.0.0.1:40456", False),
    ],
)
def test_group_semantics_are_multicast_and_multi_destination(channel: str, group: bool) -> None:
    assert has_group_semantics(ChannelUri.parse(channel)) is group
    # Group semantics are what puts a channel on max (or its fc) rather than unicast.
    assert (settings_of(channel).strategy != UNICAST) is group


def test_the_receiver_timeout_comes_from_the_t_option() -> None:
    assert settings_of("aeron:udp?endpoint=224.0.1.1:40456|fc=min,t:20ms") == FlowControlSettings(
        MIN, 20_000_000, -1, 0
    )


def test_the_group_size_comes_from_the_g_option() -> None:
    assert settings_of("aeron:udp?endpoint=224.0.1.1:40456|fc=min,g:/2") == FlowControlSettings(MIN, TIMEOUT, -1, 2)
    assert settings_of("aeron:udp?endpoint=224.0.1.1:40456|fc=tagged,g:99/2") == FlowControlSettings(
        TAGGED, TIMEOUT, 99, 2
    )


def test_driver_defaults_and_uri_overrides() -> None:
    assert settings_of(MDC + "|fc=tagged").group_tag == -1
    # The driver's defaults fill what the channel leaves out ...
    assert settings_of(MDC + "|fc=tagged", group_tag=5, group_min_size=3, receiver_timeout_ns=7) == FlowControlSettings(
        TAGGED, 7, 5, 3
    )
    # ... and the channel's options win over them.
    assert settings_of(MDC + "|fc=tagged,g:11/1,t:3s", group_tag=5, group_min_size=3) == FlowControlSettings(
        TAGGED, 3_000_000_000, 11, 1
    )
    # A unicast channel takes the driver's receiver timeout too.
    assert settings_of("aeron:udp?endpoint=10.0.0.1:40456", receiver_timeout_ns=7) == FlowControlSettings(UNICAST, 7)
    # The driver may choose min as the multicast default; a channel's fc still wins.
    assert settings_of(MDC, multicast_default="min").strategy == MIN
    assert settings_of(MDC + "|fc=max", multicast_default="min").strategy == MAX
    assert settings_of("aeron:udp?endpoint=10.0.0.1:40456", multicast_default="min").strategy == UNICAST


def test_only_tagged_takes_a_group_tag_and_only_min_and_tagged_a_group_size() -> None:
    # min ignores a group tag: it counts every receiver.
    assert settings_of("aeron:udp?endpoint=224.0.1.1:40456|fc=min,g:5/0") == FlowControlSettings(MIN, TIMEOUT, -1, 0)
    assert settings_of(MDC + "|fc=min", group_tag=5).group_tag == -1
    assert settings_of(MDC, group_tag=5, group_min_size=3) == FlowControlSettings(MAX, TIMEOUT, -1, 0)


def test_fc_on_a_unicast_channel_is_rejected() -> None:
    with pytest.raises(InvalidChannelError, match="fc"):
        settings_of("aeron:udp?endpoint=10.0.0.1:40456|fc=min")


def test_an_unknown_multicast_default_is_rejected() -> None:
    with pytest.raises(InvalidChannelError, match="unknown flow control strategy 'fastest'"):
        settings_of(MDC, multicast_default="fastest")
    # A unicast channel never asks for it.
    assert settings_of("aeron:udp?endpoint=10.0.0.1:40456", multicast_default="fastest").strategy == UNICAST


@pytest.mark.parametrize(
    "fc",
    [
        "fastest",  # an unknown strategy
        "min,g:/-1",  # a negative group size (the C refuses it)
        "min,t:-5ms",  # a negative receiver timeout (the C refuses it)
        "max,t:1s",  # max takes no options
    ],
)
def test_a_channel_cannot_ask_for_what_the_c_refuses(fc: str) -> None:
    with pytest.raises(InvalidChannelError):
        settings_of(f"{MDC}|fc={fc}")

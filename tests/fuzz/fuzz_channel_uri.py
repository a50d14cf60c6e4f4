#!/usr/bin/env python3
"""Fuzz the channel-URI parser: ``ChannelUri.parse`` on the input (UTF-8,
undecodable bytes replaced), then every typed accessor and validator of a
channel that parsed (name resolution excepted: no network from a fuzzer).

The only clean failure is ``InvalidChannelError``.

Run: .venv/bin/python tests/fuzz/fuzz_channel_uri.py tests/fuzz/corpus/channel_uri -max_total_time=60
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_support import fuzz, instrumented  # noqa: E402  (the directory is on the path only now)

with instrumented(__name__ == "__main__"):  # coverage of everything imported below
    from fulmar.channel_uri import ChannelUri, InvalidChannelError

ACCESSORS = (
    "term_length",
    "mtu",
    "session_id",
    "alias",
    "endpoint",
    "control",
    "control_mode",
    "interface",
    "ttl",
    "reliable",
    "sparse",
    "eos",
    "tether",
    "rejoin",
    "spies_simulate_connection",
    "group",
    "linger_ns",
    "flow_control",
    "group_tag",
    "channel_tag",
    "entity_tag",
    "socket_sndbuf_length",
    "socket_rcvbuf_length",
    "receiver_window_length",
    "congestion_control",
    "response_correlation_id",
    "max_resend",
)


def _value(uri: ChannelUri, name: str) -> object:
    member = getattr(uri, name)
    return member() if callable(member) else member


def test_one_input(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        uri = ChannelUri.parse(text)
    except InvalidChannelError:
        return
    assert str(uri) == text
    assert ChannelUri.parse(str(uri)) == uri
    for key in uri:
        uri.get(key)
        uri.without_param(key)
    for name in ACCESSORS:
        try:
            _value(uri, name)
        except InvalidChannelError:
            pass
    for validate in (uri.validate, uri.validate_for_subscription, uri.validate_for_publication):
        try:
            validate()
        except InvalidChannelError:
            pass
    try:
        uri.initial_position()
    except InvalidChannelError:
        pass


if __name__ == "__main__":
    fuzz(test_one_input)

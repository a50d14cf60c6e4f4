"""A free loopback UDP port, an offer that retries, and a wait for a reader doorbell table, for the tests of the reader doorbells and the archive recorder."""

from __future__ import annotations

import socket
import time

from fulmar.aeron import Aeron
from fulmar.logbuffer import LogBuffers
from fulmar.reader_doorbells import (
    log_readers_in_table,
)
from support.driver import wait_for


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def doorbell_of(client: Aeron) -> int:
    """The id of a connected client's doorbell counter (every client has one once connected)."""
    doorbell_id = client.conductor.doorbell_id
    assert doorbell_id is not None, "the client has no doorbell"
    return doorbell_id


def wait_for_table(log: LogBuffers, expected: list[int]) -> None:
    wait_for(
        lambda: sorted(log_readers_in_table(log)[0]) == sorted(expected),
        10,
        f"the driver to name {expected} in the log's reader table",
    )


def offer(publication: object, payload: bytes) -> None:
    deadline = time.monotonic() + 10
    while publication.offer(payload) < 0:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the offer was never taken"

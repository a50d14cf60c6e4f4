"""Services that fail on purpose (loaded by a test's service container
through PYTHONPATH): b"boom" raises, b"exit" exits the process with code 0
(unasked: no orderly stop).  ``FailingService`` echoes anything else;
``FailingKeyValueService`` is the key-value sample otherwise;
``FailsToStart`` and ``FailsToSnapshot`` raise in on_start and
on_take_snapshot."""

from __future__ import annotations

import sys

from fulmar.service.clustered_service import (
    ClientSession,
    Cluster,
    ClusteredService,
    SnapshotImage,
    SnapshotPublication,
)
from fulmar.service.samples import KeyValueService


class FailingService(ClusteredService):
    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        payload = bytes(buffer[offset : offset + length])
        if payload == b"boom":
            raise RuntimeError("the service was asked to fail")
        if payload == b"exit":
            sys.exit(0)
        if session is not None:
            session.offer(payload)


class FailingKeyValueService(KeyValueService):
    """Raises on b"boom" before it changes anything, as a handler that raises
    must: every member skips that message alike, and their stores stay equal."""

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        if bytes(buffer[offset : offset + length]) == b"boom":
            raise ValueError("a request this service cannot handle")
        super().on_session_message(session, timestamp, buffer, offset, length)


class FailsToStart(ClusteredService):
    def on_start(self, cluster: Cluster, snapshot: SnapshotImage | None) -> None:
        raise RuntimeError("the service cannot start")


class FailsToSnapshot(FailingService):
    def on_take_snapshot(self, publication: SnapshotPublication) -> None:
        raise RuntimeError("the service cannot write its snapshot")

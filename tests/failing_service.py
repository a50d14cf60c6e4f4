"""A service that fails on purpose (loaded by a test's service container
through PYTHONPATH): b"boom" raises, b"exit" exits its process with code 0
(unasked: no orderly stop), anything else is echoed."""

from __future__ import annotations

import sys

from fulmar.service.clustered_service import ClientSession, ClusteredService


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

"""A service that fails on purpose (loaded by a test's service container
through PYTHONPATH): b"boom" raises, anything else is echoed."""

from __future__ import annotations

from fulmar.service.clustered_service import ClientSession, ClusteredService


class FailingService(ClusteredService):
    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        payload = bytes(buffer[offset : offset + length])
        if payload == b"boom":
            raise RuntimeError("the service was asked to fail")
        if session is not None:
            session.offer(payload)

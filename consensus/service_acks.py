"""The services' acknowledgements (Aeron's ServiceAck queues): the consensus
module asks its services to act at a log position (a snapshot, a stop, a
join of the log) under an ack id, and waits until each service has
acknowledged it.

One member alone trusts the ids: each request's acks are kept by id until
every service's has come, at the position asked for (else the module
stops: a service that acknowledged elsewhere applied another log).  Several
members do not: elections start and abandon replays and joins, so a service
may never acknowledge a request the module sent (its next ack then carries
that id), or acknowledge one the module gave up on.  What answers a request
there is an ack of each service that arrived after the request and names
its position."""

from __future__ import annotations

from collections import deque
from typing import Any

from fulmar.consensus.errors import ClusterTerminationError


class ServiceAcks:
    def __init__(self, service_count: int) -> None:
        self._service_count = service_count
        self._by_id: dict[int, dict[int, Any]] = {}  # ack id -> service id -> its ack
        self._arrivals = 0  # acks received so far (several members: acks matched by arrival)
        self._issued_at: dict[int, int] = {}  # ack id -> the arrivals before it was asked for
        self._recent: deque[tuple[int, Any]] = deque(maxlen=256)  # (arrival, ack)
        self._next_id = 0

    def next_ack_id(self, *, any_arrival: bool = False) -> int:
        """The id of a request about to be sent.  ``any_arrival``: an ack that
        arrived before the request answers it too (the services may have
        acted on their own, as on a snapshot in the log: the position tells
        the acks apart)."""
        ack_id = self._next_id
        self._next_id += 1
        self._issued_at[ack_id] = 0 if any_arrival else self._arrivals
        return ack_id

    def on_service_ack(self, ack: Any) -> None:
        """A decoded ServiceAck."""
        self._by_id.setdefault(ack.ack_id, {})[ack.service_id] = ack
        self._arrivals += 1
        self._recent.append((self._arrivals, ack))

    def received(self, ack_id: int) -> dict[int, Any]:
        """The acks of ``ack_id`` so far, by service id."""
        return self._by_id.get(ack_id, {})

    def acked_partially(self, ack_id: int, missing: list[int]) -> bool:
        """Whether a service other than ``missing`` has yet to acknowledge ``ack_id``."""
        acks = self._by_id.get(ack_id, {})
        return any(service_id not in acks and service_id not in missing for service_id in range(self._service_count))

    def acked(self, ack_id: int, log_position: int | None, multi_member: bool) -> list[Any] | None:
        """The acks of every service for ``ack_id`` (at ``log_position``, if
        given), once all came; taken, so asked for once."""
        if multi_member:
            return self._acked_since(ack_id, log_position)
        acks = self._by_id.get(ack_id, {})
        if len(acks) < self._service_count:
            return None
        if log_position is not None:
            for ack in acks.values():
                if ack.log_position != log_position:
                    raise ClusterTerminationError(
                        f"service {ack.service_id} acknowledged position {ack.log_position}, expected {log_position}"
                    )
        del self._by_id[ack_id]
        return list(acks.values())

    def _acked_since(self, ack_id: int, log_position: int | None) -> list[Any] | None:
        """An ack of each service that arrived after the request and names its
        position (the ids are not trusted)."""
        issued = self._issued_at.get(ack_id)
        if issued is None:
            return None
        found: dict[int, tuple[int, Any]] = {}
        for arrival, ack in self._recent:
            if (
                arrival > issued
                and (log_position is None or ack.log_position == log_position)
                and ack.service_id not in found
            ):
                found[ack.service_id] = (arrival, ack)
        if len(found) < self._service_count:
            return None
        newest = max(arrival for arrival, _ in found.values())
        while self._recent and self._recent[0][0] <= newest:
            self._recent.popleft()
        del self._issued_at[ack_id]
        self._by_id.clear()
        return [ack for _, ack in found.values()]

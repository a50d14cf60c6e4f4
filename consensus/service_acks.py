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
its position, given in the order the requests were made (a service
acknowledges in the order it was asked)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from fulmar.consensus.errors import ClusterTerminationError


class ServiceAcks:
    def __init__(self, service_count: int, report_error: Callable[[str], None]) -> None:
        self._service_count = service_count
        self._report_error = report_error  # (the module's error log)
        self._by_id: dict[int, dict[int, Any]] = {}  # ack id -> service id -> its ack
        self._arrivals = 0  # acks received so far (several members: acks matched by arrival)
        self._issued_at: dict[int, int] = {}  # ack id -> the arrivals before it was asked for
        self._recent: deque[tuple[int, Any]] = deque(maxlen=256)  # (arrival, ack)
        self._positions: dict[int, int] = {}  # (several members) the position each request waits for
        self._joins: set[int] = set()  # (several members) the requests that are JoinLogs
        self._last_service_ack_id: dict[int, int] = {}  # each service's ack id, last seen
        self._next_id = 0

    def next_ack_id(self, *, any_arrival: bool = False, join_log: bool = False, log_position: int | None = None) -> int:
        """The id of a request about to be sent.  ``any_arrival``: an ack that
        arrived before the request answers it too (the services may have
        acted on their own, as on a snapshot in the log: the position tells
        the acks apart).  ``join_log``: the request is a JoinLog, which
        supersedes one still unanswered (a service joins only the newest log
        it was sent: it never answers the older).  ``log_position``: the
        position it waits for, known now (it comes first in the order from
        now)."""
        ack_id = self._next_id
        self._next_id += 1
        if join_log:
            for older in [other for other in self._joins if other in self._issued_at]:
                del self._issued_at[older]
                self._positions.pop(older, None)
            self._joins = {ack_id}
        self._issued_at[ack_id] = 0 if any_arrival else self._arrivals
        if log_position is not None:
            self._positions[ack_id] = log_position
        return ack_id

    def give_up(self, ack_id: int) -> None:
        """A request whose acks will never be asked for (several members)."""
        self._issued_at.pop(ack_id, None)
        self._positions.pop(ack_id, None)

    def on_service_ack(self, ack: Any) -> None:
        """A decoded ServiceAck."""
        self._by_id.setdefault(ack.ack_id, {})[ack.service_id] = ack
        last = self._last_service_ack_id.get(ack.service_id)
        if last is not None and ack.ack_id <= last and ack.ack_id != 0:
            # (0: a service that restarted counts afresh)
            self._report_error(
                f"service {ack.service_id}: ack out of sequence: ack id {ack.ack_id} after {last} "
                f"(log position {ack.log_position})"
            )
        self._last_service_ack_id[ack.service_id] = ack.ack_id
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
        """Several members: elections start and abandon replays and joins, so a
        service may never acknowledge a JoinLog the module sent (its next ack then
        carries that id) or acknowledge one the module gave up on: the ids of the
        two sides do not stay equal.  What answers is an ack of each service that
        arrived after the request and names its position.

        The order still holds (Aeron's per-service queue of acks, each expected
        with the next ack id): a service acknowledges in the order it was asked,
        so of two requests waiting on the same position the older takes each
        service's first ack, the younger the next (BUG-1, simulator seed 109 of
        3 members: a new leader's last replayed entry was a SNAPSHOT, its
        services acknowledged the snapshot and then its JoinLog at the same
        position, and the JoinLog took the snapshot's ack, the snapshot the
        JoinLog's).  Each ack answers one request."""
        if ack_id not in self._issued_at:
            return None
        if log_position is not None:
            self._positions[ack_id] = log_position
        claims = self._claim_acks(ack_id)
        found = claims.get(ack_id, {})
        if len(found) < self._service_count:
            return None
        taken = {arrival for arrival, _ in found.values()}
        newest = max(taken)
        # What came before this request's newest ack and no older request waits
        # for is spent (an abandoned join's, a request's that gave up).
        kept = {arrival for request, acks in claims.items() if request != ack_id for arrival, _ in acks.values()}
        self._recent = deque(
            (
                (arrival, ack)
                for arrival, ack in self._recent
                if arrival not in taken and (arrival > newest or arrival in kept or self._older_waits_for(ack_id, ack))
            ),
            maxlen=self._recent.maxlen,
        )
        del self._issued_at[ack_id]
        self._positions.pop(ack_id, None)
        self._by_id.clear()
        return [ack for _, ack in sorted(found.values(), key=lambda pair: pair[1].service_id)]

    def _older_waits_for(self, ack_id: int, ack: Any) -> bool:
        """Whether a request older than ``ack_id`` still waits on ``ack``'s position."""
        return any(request < ack_id and self._positions.get(request) == ack.log_position for request in self._issued_at)

    def _claim_acks(self, up_to: int) -> dict[int, dict[int, tuple[int, Any]]]:
        """Each service's acks (in the order they came, that is of their ack ids)
        given to the requests waiting, oldest request first: a request takes a
        service's first ack that came after it was made, names its position (if
        it names one), and no older request took."""
        claims: dict[int, dict[int, tuple[int, Any]]] = {}
        taken: set[int] = set()
        for request in sorted(self._issued_at):
            if request > up_to:
                break
            position = self._positions.get(request)
            if position is None and request != up_to:
                continue  # (not yet asked after: its position is not known)
            issued = self._issued_at[request]
            found: dict[int, tuple[int, Any]] = {}
            for arrival, ack in self._recent:
                if (
                    arrival > issued
                    and arrival not in taken
                    and (position is None or ack.log_position == position)
                    and ack.service_id not in found
                ):
                    found[ack.service_id] = (arrival, ack)
            taken.update(arrival for arrival, _ in found.values())
            claims[request] = found
        return claims

"""Leases (locks that expire), replicated: at most one holder per name at a time.

Time is the log's (``self.cluster_time``, ms since the epoch), never the wall
clock: every member applies each call at the same log time, so every member
agrees on who holds what.  Each grant gets a fencing token, one more than the
last: what a lease guards can refuse a holder whose token is older than one
it has seen.
"""

from typing import Any

from fulmar import StateMachine, command


class NotHolder(Exception):
    pass


class LeaseService(StateMachine):
    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}  # name -> {"holder", "token", "expires_ms"}
        self.last_token = 0

    @command
    def acquire(self, name: str, holder: str, ttl_ms: int) -> dict[str, Any]:
        """The lease of ``name`` after the call: ``holder``'s if it was free (a
        new token) or ``holder``'s already (extended); else the other holder's."""
        expires_ms = self._expiry(ttl_ms)
        lease = self.lease(name)
        if lease is None:
            self.last_token += 1
            lease = self.leases[name] = {"holder": holder, "token": self.last_token}
        if lease["holder"] == holder:
            lease["expires_ms"] = expires_ms
        return lease

    @command
    def renew(self, name: str, holder: str, ttl_ms: int) -> int:
        """Extend ``holder``'s lease, if it has not expired; its new expiry."""
        expires_ms = self._expiry(ttl_ms)
        self._held_by(name, holder)["expires_ms"] = expires_ms
        return expires_ms

    @command
    def release(self, name: str, holder: str) -> None:
        self._held_by(name, holder)
        del self.leases[name]

    @command(read_only=True)
    def lease(self, name: str) -> dict[str, Any] | None:
        """The live lease of ``name``; None if it is free."""
        lease = self.leases.get(name)
        return lease if lease is not None and lease["expires_ms"] > self.cluster_time else None

    def _expiry(self, ttl_ms: int) -> int:
        if not isinstance(ttl_ms, int) or ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be a positive whole number, not {ttl_ms!r}")
        return self.cluster_time + ttl_ms

    def _held_by(self, name: str, holder: str) -> dict[str, Any]:
        lease = self.lease(name)
        if lease is None or lease["holder"] != holder:
            raise NotHolder(f"{holder} does not hold {name!r} (held by {lease['holder'] if lease else 'nobody'})")
        return lease

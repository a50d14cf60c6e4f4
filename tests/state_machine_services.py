"""StateMachine services of the tests (loaded by a test's service containers
through PYTHONPATH, and used in-process by the unit tests)."""

from __future__ import annotations

from typing import Any

from fulmar.service.state_machine import StateMachine, command
from fulmar.service.clustered_service import ClientSession


class Overdraft(Exception):
    pass


class Bank(StateMachine):
    """The README's example: accounts, deposits, transfers that must not overdraw."""

    def __init__(self) -> None:
        self.balances: dict[str, int] = {}

    @command
    def deposit(self, account: str, amount: int) -> int:
        if amount <= 0:
            raise ValueError(f"a deposit must be positive, not {amount}")
        self.balances[account] = self.balances.get(account, 0) + amount
        return self.balances[account]

    @command
    def transfer(self, source: str, target: str, amount: int) -> None:
        if amount > self.balances.get(source, 0):
            raise Overdraft(f"{source} has {self.balances.get(source, 0)}, cannot send {amount}")
        self.balances[source] -= amount
        self.balances[target] = self.balances.get(target, 0) + amount

    @command(read_only=True)
    def balance(self, account: str) -> int:
        return self.balances.get(account, 0)


class Journal(StateMachine):
    """Non-idempotent commands for the exactly-once tests: ``append`` puts an
    entry at the end and answers its index (applied twice, an entry would
    appear twice and answers would not match the final list); ``increment``
    adds to a counter and answers the new value."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.counter = 0

    @command
    def append(self, entry: Any) -> int:
        self.entries.append(entry)
        return len(self.entries) - 1

    @command
    def increment(self) -> int:
        self.counter += 1
        return self.counter

    @command(read_only=True)
    def read(self) -> dict[str, Any]:
        return {"entries": self.entries, "counter": self.counter}


class ClosingJournal(Journal):
    """``close_my_session`` asks the cluster to close the calling client's
    session (a session the cluster closes, as a long pause or a restart
    would): the calls the client sent after it, which the cluster then drops,
    must be resent on the client's next session and applied once."""

    _caller: ClientSession | None = None

    def on_message(self, session: ClientSession | None, timestamp: int, payload: bytes) -> None:
        self._caller = session
        super().on_message(session, timestamp, payload)

    def snapshot_state(self) -> Any:
        return {"entries": self.entries, "counter": self.counter}

    @command
    def close_my_session(self) -> int:
        assert self._caller is not None
        self._caller.close()
        return self._caller.id


class ShortExpiryJournal(Journal):
    """A Journal that forgets a client heard from for no more than 3 s of cluster time."""

    client_expiry_ms = 3_000

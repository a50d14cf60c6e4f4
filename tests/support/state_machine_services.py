"""StateMachine services of the tests (loaded by a test's service containers
through PYTHONPATH, and used in-process by the unit tests)."""

from __future__ import annotations

from typing import Any

from fulmar import StateMachine, command
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

    @command
    def refuse(self, why: str) -> None:
        raise PermissionError(why)


class _HeldReplies:
    """The caller's session, but for the reply of a call that asked to hold it."""

    def __init__(self, session: ClientSession, machine: ClosingJournal) -> None:
        self.session = session
        self.machine = machine

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        return 1 if self.machine.holding_reply else self.session.offer(payload)


class ClosingJournal(Journal):
    """``close_my_session`` asks the cluster to close the calling client's
    session (as the cluster does after a long pause) and holds back its
    reply, so the client sees its session closed with that call unanswered:
    it must open a new session and resend it, and be answered from the
    record (a second application would close the new session too, and count
    two in ``sessions_closed``).  The calls sent after it, which the cluster
    drops once the session is closed, must be resent and applied once."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions_closed = 0
        self.caller: ClientSession | None = None
        self.holding_reply = False

    def on_message(self, session: ClientSession | None, timestamp: int, payload: bytes) -> None:
        self.caller, self.holding_reply = session, False
        super().on_message(None if session is None else _HeldReplies(session, self), timestamp, payload)  # type: ignore[arg-type]

    def snapshot_state(self) -> Any:
        return {"entries": self.entries, "counter": self.counter, "sessions_closed": self.sessions_closed}

    @command
    def close_my_session(self) -> int:
        assert self.caller is not None
        self.sessions_closed += 1
        self.caller.close()  # at a later position of the log
        self.holding_reply = True
        return self.caller.id

    @command(read_only=True)
    def closed(self) -> int:
        return self.sessions_closed


class ShortExpiryJournal(Journal):
    """A Journal that forgets a client heard from for no more than 3 s of cluster time."""

    client_expiry_ms = 3_000

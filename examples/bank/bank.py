"""A bank ledger, replicated: every member of the cluster holds every balance."""

from fulmar import StateMachine, command


class Overdraft(Exception):
    pass


class Bank(StateMachine):
    def __init__(self) -> None:
        self.accounts: dict[str, int] = {}  # account -> balance; an account opens with its first deposit

    @command
    def deposit(self, account: str, amount: int) -> int:
        """Add ``amount`` to ``account``; its new balance."""
        check_amount(amount)
        self.accounts[account] = self.accounts.get(account, 0) + amount
        return self.accounts[account]

    @command
    def transfer(self, source: str, target: str, amount: int) -> int:
        """Move ``amount`` from ``source`` to ``target``; what ``source`` has left."""
        check_amount(amount)
        if self.accounts.get(source, 0) < amount:
            raise Overdraft(f"{source} has {self.accounts.get(source, 0)}, cannot send {amount}")
        # Every check has passed: only now change anything (nothing is rolled back).
        self.accounts[source] -= amount
        self.accounts[target] = self.accounts.get(target, 0) + amount
        return self.accounts[source]

    @command(read_only=True)
    def balances(self) -> dict[str, int]:
        return self.accounts


def check_amount(amount: int) -> None:
    # Whole units (cents, say): floats round (0.1 + 0.2 != 0.3).  And a negative
    # transfer would take money from its target.  (True is an int to Python, not an amount.)
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise ValueError(f"the amount must be a positive whole number, not {amount!r}")

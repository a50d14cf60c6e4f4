"""The examples of examples/ (the bank, the lease service, the order book).

First each service on its own, in this process, against a model of what it
should do: many random calls, the test holding the clock.  Then each on
three members, through real ``cluster-node`` processes and its client:

- each example's README commands as they are written (``cluster-node start
  --local 3 ... --service module:Class`` from the example's directory, which
  finds the module there, then ``python <client>.py``): the client prints what
  the README shows;
- the bank: a shutdown (every member snapshots) and a start from the same
  directories keep every balance; on a cluster with a 3 s leader heartbeat
  timeout, a refused call changes nothing, and transfers from two threads
  while the leader's member is killed are each applied exactly once,
  conserving money;
- the leases: two holders contending never hold one lease at the same log
  time, and an unrenewed lease expires by the log's time;
- the order book: crossing orders trade at prices both sides accept, by
  price then time, conserving quantities, as a model book would.

Each cluster's members must end in the same state: their snapshots, taken
at one log position, are the same bytes."""

from __future__ import annotations

import copy
import importlib
import os
import pickle
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import psutil
import pytest

import fulmar
from fulmar import CommandError
from fulmar.analytics.replay import ReplayError, latest_service_snapshot, snapshot_records
from fulmar.cli.cluster_commands import cluster_operate
from fulmar.service.state_machine import SNAPSHOT_CHUNK_MAGIC, StateMachine
from support.cluster import LocalCluster
from support.driver import wait_for
from support.multi_node import calls_across_a_leader_kill, member_view, wait_for_commit, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# The console scripts a user runs: `cluster-node` (not `python -m`, which would
# put the current directory on the path and hide a failure to look there).
BIN = Path(sys.executable).parent
CALL_TIMEOUT_S = 60  # a failover here: the 3 s leader heartbeat timeout of FAST_ELECTION_ARGS and an election
SCRIPT_TIMEOUT_S = 120
START_S = 90
STOP_S = 60


def example(name: str, module: str) -> ModuleType:
    """``examples/<name>/<module>.py``, imported by its own name (as the
    service containers import it, so its classes pickle the same way)."""
    directory = str(EXAMPLES / name)
    if directory not in sys.path:
        sys.path.append(directory)
    return importlib.import_module(module)


bank = example("bank", "bank")
lease = example("lease", "lease")
orderbook = example("orderbook", "orderbook")


# ---------------------------------------------------------------------------- in one process


@dataclass
class FakeCluster:
    time: int = 1_700_000_000_000


@dataclass
class FakeSnapshotPublication:
    max_message_length: int = 4096
    messages: list[bytes] = field(default_factory=list)

    def offer(self, message: bytes | bytearray | memoryview) -> None:
        self.messages.append(bytes(message))


class FakeSnapshotImage:
    def __init__(self, messages: list[bytes]) -> None:
        self._messages = messages

    def messages(self) -> Iterator[bytes]:
        return iter(self._messages)


def started(machine: StateMachine, snapshot: list[bytes] | None = None) -> FakeCluster:
    cluster = FakeCluster()
    machine.on_start(cluster, None if snapshot is None else FakeSnapshotImage(snapshot))  # type: ignore[arg-type]
    return cluster


def restarted(machine: StateMachine) -> StateMachine:
    """A new instance started from ``machine``'s snapshot."""
    publication = FakeSnapshotPublication()
    machine.on_take_snapshot(publication)
    restored = type(machine)()
    started(restored, publication.messages)
    return restored


def outcome(function: Any, *args: Any) -> Any:
    """A call's result, or ("raised", the exception's type name) as a caller would see it."""
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 - compared with the model's
        return ("raised", type(error).__name__)


def test_the_bank_against_a_model_of_its_ledger() -> None:
    """Random deposits and transfers, among them overdrafts, accounts never
    deposited into and amounts that are no positive whole number: every
    answer is the model's (catches a wrong balance or a wrong refusal), a
    refused call changes nothing (catches a change made before a check),
    and the money in the bank is always what was deposited, no balance
    below 0 (catches money made or lost by a transfer)."""
    machine = bank.Bank()
    started(machine)
    model: dict[str, int] = {}
    rng = random.Random(47)
    deposited = 0
    seen: set[Any] = set()
    for _ in range(3000):
        before = dict(machine.accounts)
        op = rng.choice(["deposit", "transfer", "transfer", "transfer"])
        source, target = rng.choice("abcde"), rng.choice("abcd")
        amount: Any = rng.randint(-2, 40) if rng.random() < 0.95 else rng.choice([2.5, True])
        expected: Any
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            expected = ("raised", "ValueError")
        elif op == "deposit":
            model[source] = model.get(source, 0) + amount
            deposited += amount
            expected = model[source]
        elif model.get(source, 0) < amount:
            expected = ("raised", "Overdraft")
        else:
            model[source] -= amount
            model[target] = model.get(target, 0) + amount
            expected = model[source]
        got = (
            outcome(machine.deposit, source, amount)
            if op == "deposit"
            else outcome(machine.transfer, source, target, amount)
        )
        assert got == expected, (op, source, target, amount)
        seen.add(got[1] if isinstance(got, tuple) else op)
        if isinstance(got, tuple):
            assert machine.accounts == before, f"{op} raised {got[1]} and changed the state"
        assert machine.balances() == model
        assert all(balance >= 0 for balance in model.values())
        assert sum(model.values()) == deposited
    assert seen == {"deposit", "transfer", "Overdraft", "ValueError"}
    assert restarted(machine).balances() == model  # type: ignore[attr-defined]


@dataclass
class ModelLease:
    holder: str
    token: int
    expires_ms: int


def test_the_lease_service_against_a_model_with_the_clock_in_hand() -> None:
    """Random calls of three holders on two names at random log times: every
    answer is the model's (catches a lease given while held, or refused
    while free), a refused call changes nothing (catches a token taken
    before the ttl is checked), and at every log time at most one holder's
    lease is live, each expiring exactly at its expiry (catches an expiry
    off by one, or read from the wall clock)."""
    machine = lease.LeaseService()
    cluster = started(machine)
    model: dict[str, ModelLease] = {}
    tokens = 0
    rng = random.Random(48)
    outcomes: set[str] = set()
    for _ in range(4000):
        cluster.time += rng.choice([0, 1, 5, 20, 100])
        now = cluster.time
        name, holder, ttl = rng.choice(["x", "y"]), rng.choice(["p", "q", "r"]), rng.choice([-1, 10, 50, 200])
        live = model.get(name)
        if live is not None and live.expires_ms <= now:
            live = None
        op = rng.choice(["acquire", "acquire", "renew", "release", "lease"])
        expected: Any
        if op == "lease":
            expected = None if live is None else vars(live)
        elif op != "release" and ttl <= 0:
            expected = ("raised", "ValueError")
        elif op == "acquire":
            if live is None:
                tokens += 1
                live = model[name] = ModelLease(holder, tokens, now + ttl)
                outcomes.add("granted")
            elif live.holder == holder:
                live.expires_ms = now + ttl
                outcomes.add("extended")
            else:
                outcomes.add("refused")
            expected = vars(live)
        elif live is None or live.holder != holder:
            expected = ("raised", "NotHolder")
        elif op == "renew":
            live.expires_ms = now + ttl
            expected = live.expires_ms
        else:
            del model[name]
            expected = None
        args = (name,) if op == "lease" else (name, holder) if op == "release" else (name, holder, ttl)
        before = copy.deepcopy((machine.leases, machine.last_token))
        got = outcome(getattr(machine, op), *args)
        assert got == expected, (now, op, args)
        outcomes.add(op if not isinstance(got, tuple) else got[1])
        if isinstance(got, tuple):
            assert (machine.leases, machine.last_token) == before, f"{op}{args} raised and changed the state"
        # At this log time, and at each ms until the next step: the one live
        # holder the model says, up to its expiry and not a ms beyond.
        for name in ("x", "y"):
            truth = model.get(name)
            if truth is not None and truth.expires_ms > now:
                assert machine.lease(name)["holder"] == truth.holder
                cluster.time = truth.expires_ms - 1
                assert machine.lease(name)["holder"] == truth.holder
                cluster.time = truth.expires_ms
                assert machine.lease(name) is None, "a lease outlived its expiry"
                cluster.time = now
            else:
                assert machine.lease(name) is None
    assert {"granted", "extended", "refused", "renew", "release", "NotHolder", "ValueError"} <= outcomes
    # The leases come back from a snapshot as they were.
    restored = restarted(machine)
    started_cluster = restored._fulmar.cluster
    assert isinstance(started_cluster, FakeCluster)
    started_cluster.time = cluster.time
    for name in ("x", "y"):
        assert restored.lease(name) == machine.lease(name)
    assert restored.last_token == tokens


class ModelBook:
    """Price-time priority the slow way: every resting order in a list, the
    best eligible one found by a scan."""

    def __init__(self) -> None:
        self.resting: list[dict[str, Any]] = []  # in arrival order
        self.next_id = 1
        self.limits: dict[int, tuple[str, int, int]] = {}  # id -> side, price, quantity placed

    def place(self, trader: str, side: str, price: int, quantity: int) -> dict[str, Any]:
        order_id, self.next_id = self.next_id, self.next_id + 1
        self.limits[order_id] = (side, price, quantity)
        fills = []
        while quantity:
            eligible = [
                o
                for o in self.resting
                if o["side"] != side and (o["price"] <= price if side == "buy" else o["price"] >= price)
            ]
            if not eligible:
                break
            best = min(eligible, key=lambda o: (o["price"] if side == "buy" else -o["price"], o["id"]))
            traded = min(quantity, best["quantity"])
            buy, sell = (order_id, best["id"]) if side == "buy" else (best["id"], order_id)
            fills.append({"buy": buy, "sell": sell, "price": best["price"], "quantity": traded})
            quantity -= traded
            best["quantity"] -= traded
            if best["quantity"] == 0:
                self.resting.remove(best)
        if quantity:
            self.resting.append({"id": order_id, "trader": trader, "side": side, "price": price, "quantity": quantity})
        return {"id": order_id, "fills": fills, "resting": quantity}

    def cancel(self, order_id: int) -> Any:
        for order in self.resting:
            if order["id"] == order_id:
                self.resting.remove(order)
                return order["quantity"]
        return ("raised", "UnknownOrder")

    def book(self, depth: int = 5) -> dict[str, list[list[int]]]:
        levels: dict[str, list[list[int]]] = {}
        for side, best_first in (("buy", True), ("sell", False)):
            totals: dict[int, int] = {}
            for order in self.resting:
                if order["side"] == side:
                    totals[order["price"]] = totals.get(order["price"], 0) + order["quantity"]
            levels[side] = [[price, totals[price]] for price in sorted(totals, reverse=best_first)][:depth]
        return levels


def random_orders(rng: random.Random, count: int) -> list[tuple[Any, ...]]:
    """Places around a price of 100 that often cross, and cancels of earlier ids (some long filled)."""
    operations: list[tuple[Any, ...]] = []
    placed = 0
    for _ in range(count):
        if placed and rng.random() < 0.2:
            operations.append(("cancel", rng.randint(1, placed)))
        else:
            placed += 1
            side = rng.choice(["buy", "sell"])
            price = rng.randint(95, 105)
            operations.append(("place", f"trader{rng.randint(1, 4)}", side, price, rng.randint(1, 20)))
    return operations


def check_trades(model: ModelBook, results: list[tuple[tuple[Any, ...], Any]]) -> None:
    """The invariants of the answers, beyond being the model's: each trade at a
    price both orders accept (the resting order's limit), the resting order
    always the earlier one; each place's fills best first; every order's
    quantity accounted for (filled + resting + cancelled)."""
    filled: dict[int, int] = {}
    cancelled: dict[int, int] = {}
    trades = 0
    for operation, answer in results:
        if operation[0] == "cancel":
            if not isinstance(answer, tuple):
                cancelled[operation[1]] = answer
            continue
        taker = answer["id"]
        side = operation[2]
        priorities = []
        for fill in answer["fills"]:
            trades += 1
            buy_side, buy_price, _ = model.limits[fill["buy"]]
            sell_side, sell_price, _ = model.limits[fill["sell"]]
            assert (buy_side, sell_side) == ("buy", "sell")
            assert sell_price <= fill["price"] <= buy_price, f"trade {fill} outside the limits"
            maker = fill["sell"] if side == "buy" else fill["buy"]
            assert maker < taker, f"trade {fill}: the resting order is not the earlier one"
            assert fill["price"] == model.limits[maker][1], f"trade {fill} not at the resting order's price"
            priorities.append((fill["price"] if side == "buy" else -fill["price"], maker))
            for order_id in (fill["buy"], fill["sell"]):
                filled[order_id] = filled.get(order_id, 0) + fill["quantity"]
        assert priorities == sorted(priorities), f"order {taker} filled out of price-time priority"
    resting = {order["id"]: order["quantity"] for order in model.resting}
    for order_id, (_, _, quantity) in model.limits.items():
        accounted = filled.get(order_id, 0) + resting.get(order_id, 0) + cancelled.get(order_id, 0)
        assert accounted == quantity, f"order {order_id}: {quantity} placed, {accounted} accounted for"
    assert trades > 0, "no order crossed: the workload proved nothing"


def test_the_order_book_against_a_model_book() -> None:
    """Random crossing places and cancels: every answer is the slow model
    book's (catches a trade out of price-time priority, or at the wrong
    price), the book is never crossed (catches a resting order that should
    have traded), every order's quantity is accounted for (catches
    quantity made or lost), and a bad order is refused before it takes an id."""
    machine = orderbook.OrderBook()
    started(machine)
    model = ModelBook()
    results = []
    for operation in random_orders(random.Random(49), 3000):
        if operation[0] == "place":
            _, trader, side, price, quantity = operation
            expected: Any = model.place(trader, side, price, quantity)
            got = outcome(machine.place, trader, side, price, quantity)
        else:
            expected, got = model.cancel(operation[1]), outcome(machine.cancel, operation[1])
        assert got == expected, operation
        results.append((operation, got))
        book = machine.book(depth=3)
        assert book == model.book(depth=3)
        if book["buy"] and book["sell"]:
            assert book["buy"][0][0] < book["sell"][0][0], f"a crossed book: {book}"
    check_trades(model, results)
    assert restarted(machine).book(depth=100) == model.book(depth=100)  # type: ignore[attr-defined]
    for bad in [("t", "hold", 100, 1), ("t", "buy", 0, 1), ("t", "buy", 100, 0), ("t", "buy", 1.5, 1)]:
        assert outcome(machine.place, *bad) == ("raised", "ValueError")
    assert machine.book(depth=100) == model.book(depth=100) and machine.next_id == model.next_id


def test_every_example_module_is_type_checked() -> None:
    """mypy takes packages and modules or files, not both: the examples are
    listed file by file in pyproject.toml, their folders on mypy_path.
    Catches a new example's module left out of the type check."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    files = {str(path.relative_to(ROOT)) for path in EXAMPLES.glob("*/*.py")}
    assert files and files == {name for name in config["files"] if name.startswith("examples/")}
    assert {f"examples/{path.parent.name}" for path in EXAMPLES.glob("*/*.py")} <= set(config["mypy_path"])


# ---------------------------------------------------------------------------- on three members


class Members(Protocol):
    """What the checks below need of a cluster: ``LocalCluster``, or ``ReadmeCluster``."""

    size: int
    base: Path

    def cluster_dir(self, member: int) -> Path: ...
    def archive_dir(self, member: int) -> Path: ...
    def is_running(self, member: int, kind: str) -> bool: ...


def readme(name: str) -> str:
    return (EXAMPLES / name / "README.md").read_text()


def readme_start_command(name: str) -> list[str]:
    """The README's ``cluster-node start`` command, as written (nothing
    before it: it finds the service's module in the directory it runs in)."""
    lines = [line for line in readme(name).splitlines() if "cluster-node start --" in line]
    assert len(lines) == 1, f"{name}'s README: {len(lines)} cluster-node start commands"
    words = shlex.split(lines[0])
    assert words[:2] == ["cluster-node", "start"], lines[0]
    return words


def readme_output(name: str) -> list[str]:
    """The output the README shows: its one code block without a language."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", readme(name), re.MULTILINE | re.DOTALL)
    plain = [body for language, body in blocks if not language]
    assert len(plain) == 1, f"{name}'s README: {len(plain)} output blocks"
    return plain[0].splitlines()


READY = re.compile(r"local cluster ready: 3 of 3 nodes running; ingress endpoints (\S+);")
NODE_READY = re.compile(r"node (\d+) ready: ingress \S+; driver directory (\S+); pids (.*?);")


class ReadmeCluster:
    """An example's three members started the way its README says: the
    README's own ``cluster-node start --local 3 ...`` command,
    run from the example's directory, with a fresh ``--dir`` and free ports
    for ``--ingress-port`` (other tests may run meanwhile).  ``close`` stops
    it and reaps every process it started, whatever state it is in, and
    removes every directory."""

    size = 3

    def __init__(self, name: str, command: list[str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.cwd = cwd or EXAMPLES / name
        self.work = Path(tempfile.mkdtemp(prefix=f"fulmar-example-{name}-"))
        # The driver directories are named after the base's name: a unique one.
        self.base = self.work / self.work.name
        command = command or readme_start_command(name)
        command[command.index("--dir") + 1] = str(self.base)
        command[command.index("--ingress-port") + 1] = "0"
        self.command = [str(BIN / command[0]), *command[1:]]
        self.process: subprocess.Popen[bytes] | None = None
        self.output_path = self.work / "start-0.out"
        self.ingress_endpoints = ""
        self.pids: dict[tuple[int, str], psutil.Process] = {}  # (member, kind): of the latest start
        self.every_pid: list[psutil.Process] = []  # of every start
        self.driver_dirs: set[Path] = set()

    def __enter__(self) -> ReadmeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cluster_dir(self, member: int) -> Path:
        return self.base / f"node{member}" / "cluster"

    def archive_dir(self, member: int) -> Path:
        return self.base / f"node{member}" / "archive"

    def is_running(self, member: int, kind: str) -> bool:
        process = self.pids.get((member, kind))
        try:
            return process is not None and process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    @property
    def output(self) -> str:
        return self.output_path.read_text()

    def start(self) -> None:
        """Start it (again), wait until every member is ready and one leads."""
        assert self.process is None or self.process.poll() is not None, "it runs already"
        self.output_path = self.work / f"start-{len(list(self.work.glob('start-*.out')))}.out"
        with open(self.output_path, "wb") as out:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,  # killpg of this group if it does not stop
            )
        process = self.process

        def ready() -> re.Match[str] | None:
            text = self.output
            if process.poll() is not None:
                raise AssertionError(f"{shlex.join(self.command)} exited with {process.returncode}:\n{text}")
            # Every member's processes are named before the cluster says it is ready.
            for member, driver_dir, pids in NODE_READY.findall(text):
                self.driver_dirs.add(Path(driver_dir))
                for entry in pids.split(", "):
                    kind, pid = entry.split()
                    if (int(member), kind) not in self.pids or self.pids[int(member), kind].pid != int(pid):
                        self.pids[int(member), kind] = psutil.Process(int(pid))
                        self.every_pid.append(self.pids[int(member), kind])
            return READY.search(text)

        self.pids = {}
        match = wait_for(ready, START_S, f"{self.name}'s local cluster to be ready", poll_s=0.05)
        self.ingress_endpoints = match[1]
        assert {member for member, _ in self.pids} == {0, 1, 2}
        wait_for_leader(self, 30)  # type: ignore[arg-type]

    def shutdown(self) -> None:
        """``cluster-tool shutdown --dir`` as the README says: every member
        takes a snapshot and stops in order, and so does ``cluster-node start``."""
        readme_command = readme_start_command(self.name)
        readme_dir = readme_command[readme_command.index("--dir") + 1]
        assert f"cluster-tool shutdown --dir {readme_dir}" in " ".join(readme(self.name).split())
        assert self.process is not None
        result = subprocess.run(
            [str(BIN / "cluster-tool"), "shutdown", "--dir", str(self.base)],
            capture_output=True,
            text=True,
            timeout=STOP_S,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert self.process.wait(STOP_S) == 0, self.output
        assert "local cluster stopped: every node stopped in order by the cluster" in self.output, self.output

    def stop(self) -> None:
        """SIGTERM (as Ctrl-C): every member stops in order, exit code 0."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(STOP_S) == 0, self.output
        assert "local cluster stopped cleanly" in self.output, self.output

    def close(self) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(STOP_S)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(10)
            for child in self.every_pid:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(self.every_pid, timeout=10)
        finally:
            for directory in self.driver_dirs:
                shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(self.work, ignore_errors=True)


def run_client(name: str, script: str, endpoints: str) -> list[str]:
    """``python <script> ENDPOINTS`` from the example's directory, as its
    README runs it; the lines it printed."""
    result = subprocess.run(
        [sys.executable, script, endpoints],
        cwd=EXAMPLES / name,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert result.returncode == 0, f"{script} exited with {result.returncode}: {result.stdout}{result.stderr}"
    return result.stdout.splitlines()


def commit_position(cluster: Members) -> int:
    leader = wait_for_leader(cluster, 30)  # type: ignore[arg-type]
    return member_view(cluster, leader.member).commit_position or 0  # type: ignore[arg-type]


def member_snapshots(cluster: Members, at_least: int) -> list[tuple[int, bytes]]:
    """Each member's newest snapshot of the service (its log position, the
    StateMachine's pickled data), every one at or after ``at_least``."""
    snapshots = []
    for member in range(cluster.size):
        entry = latest_service_snapshot(cluster.cluster_dir(member))
        assert entry.log_position >= at_least, f"member {member}'s snapshot at {entry.log_position} < {at_least}"
        records = snapshot_records(cluster.archive_dir(member), entry.recording_id)
        assert records and all(record.startswith(SNAPSHOT_CHUNK_MAGIC) for record in records)
        snapshots.append((entry.log_position, b"".join(record[len(SNAPSHOT_CHUNK_MAGIC) :] for record in records)))
    return snapshots


def agreed_state(cluster: Members, at_least: int) -> Any:
    """The state in the members' newest snapshots, which must be at one log
    position (at or after ``at_least``) and the same bytes: the same state
    and the same call records on every member.  Catches a member that
    applied a call twice, missed one, or applied them in another order."""
    snapshots = member_snapshots(cluster, at_least)
    assert len({position for position, _ in snapshots}) == 1, f"snapshots at different positions: {snapshots}"
    assert len({data for _, data in snapshots}) == 1, "the members' states differ at the same log position"
    _, _, state = pickle.loads(snapshots[0][1])
    return state


def latest_snapshot_position(cluster: Members, member: int) -> int:
    try:
        return latest_service_snapshot(cluster.cluster_dir(member)).log_position
    except ReplayError:  # none yet
        return -1


def snapshot_everywhere(cluster: Members) -> Any:
    """Take a snapshot (every member, at one log position) after everything
    committed so far (``cluster-tool snapshot``); the state in it, which
    must be every member's alike."""
    position = commit_position(cluster)
    cluster_operate(cluster.base, "snapshot", 60)
    wait_for(
        lambda: all(latest_snapshot_position(cluster, m) >= position for m in range(cluster.size)),
        30,
        "every member's snapshot",
        poll_s=0.05,
    )
    return agreed_state(cluster, position)


@pytest.fixture(scope="class")
def readme_cluster(request: pytest.FixtureRequest) -> Iterator[ReadmeCluster]:
    """The class's example (``example``) on three members, started by its
    README's command.  Its tests run in their order, the client script's
    first: the README's output is that of a fresh cluster."""
    with ReadmeCluster(request.cls.example) as cluster:
        cluster.start()
        yield cluster
        cluster.stop()


# ---------------------------------------------------------------------------- the bank


def test_the_bank_runs_as_its_readme_says() -> None:
    """The README's commands: start, the client, ``cluster-tool shutdown``,
    start again, the client again.  Catches a README command that does not
    work, a client that does not print what the README shows, a shutdown
    whose members' snapshots differ or miss a balance, and a start from the
    snapshots that does not go on from the balances they hold."""
    with ReadmeCluster("bank") as cluster:
        cluster.start()
        assert run_client("bank", "bank_client.py", cluster.ingress_endpoints) == readme_output("bank")
        position = commit_position(cluster)
        cluster.shutdown()
        assert agreed_state(cluster, position) == {"accounts": {"alice": 70, "bob": 30}}

        # From the same directories: every member loads its snapshot (with
        # StateMachine.restore_state made a no-op, the run below starts from
        # 100 again: the balances come from the snapshot, not a replay).
        cluster.start()
        assert run_client("bank", "bank_client.py", cluster.ingress_endpoints) == [
            "alice has 170",
            "after sending bob 30, alice has 140",
            "refused: bank.Overdraft: bob has 60, cannot send 1000",
            "balances: {'alice': 140, 'bob': 60}",
        ]
        assert "(alice has 170, then 140; bob 60)" in " ".join(readme("bank").split())
        cluster.stop()


@pytest.fixture(scope="class")
def bank_cluster() -> Iterator[LocalCluster]:
    """Three members serving the bank, each process started on its own (so
    one member can be killed and started again), with a 3 s leader
    heartbeat timeout; examples/bank on the containers' PYTHONPATH."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(EXAMPLES / "bank")
    try:
        with LocalCluster(3, service="bank:Bank") as cluster:
            cluster.start()
            wait_for_leader(cluster, 60)
            yield cluster
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


class TestBank:
    def test_a_refused_call_raises_the_services_exception_and_changes_nothing(self, bank_cluster: LocalCluster) -> None:
        """Catches a refusal that reaches the caller as something else than
        the service's exception (type and message), or one whose command
        changed a balance before it raised."""
        with fulmar.connect(bank_cluster.ingress_endpoints, timeout=CALL_TIMEOUT_S) as client:
            assert client.call("deposit", "erin", 50) == 50
            before = client.call("balances")
            refusals: list[tuple[tuple[Any, ...], str, str]] = [
                (("transfer", "erin", "frank", 51), "bank.Overdraft", "erin has 50, cannot send 51"),
                (("transfer", "nobody", "erin", 5), "bank.Overdraft", "nobody has 0, cannot send 5"),
                (("transfer", "erin", "frank", -5), "ValueError", "the amount must be a positive whole number, not -5"),
                (("deposit", "frank", 0), "ValueError", "the amount must be a positive whole number, not 0"),
                (("deposit", "frank", 2.5), "ValueError", "the amount must be a positive whole number, not 2.5"),
            ]
            for call, remote_type, message in refusals:
                with pytest.raises(CommandError) as raised:
                    client.call(*call)
                assert (raised.value.remote_type, raised.value.remote_message) == (remote_type, message)
                assert client.call("balances") == before, f"{call} raised and changed the state"
            assert client.call("transfer", "erin", "frank", 50) == 0  # all of it: allowed
            assert {k: client.call("balances")[k] for k in ("erin", "frank")} == {"erin": 0, "frank": 50}

    def test_transfers_in_flight_across_a_leader_kill_are_each_applied_once(self, bank_cluster: LocalCluster) -> None:
        """Two threads each send transfers of 1 from one pool to an account of
        their own, 20 in flight each, more than the pool holds.  The leader's
        service is stopped (SIGSTOP: the calls go on being committed, and
        applied by the followers, unanswered) and then the leader's member
        is killed: the client sends them again to the new leader, which must
        answer the applied ones from its record.  Each answer is the pool's
        balance after that transfer, so the answers of the applied transfers
        must be every value from the pool's size down to 0, each once: a
        transfer applied twice or lost would repeat or skip a value."""
        cluster = bank_cluster
        pool, threads, transfers, window = 300, 2, 200, 20
        leader = wait_for_leader(cluster, 30)
        client = fulmar.connect(cluster.ingress_endpoints, timeout=CALL_TIMEOUT_S)
        try:
            client.call("deposit", "pool", pool)
            answers, answered_at_kill = calls_across_a_leader_kill(
                cluster,
                leader.member,
                lambda thread, i: client.call_async("transfer", "pool", f"t{thread}", 1),
                threads,
                transfers,
                window,
                CALL_TIMEOUT_S + 30,
            )
            total = threads * transfers
            # Without these the test would prove nothing: calls in flight at the kill, and resent.
            assert answered_at_kill < total, "every transfer was answered before the kill"
            assert client.calls_resent > 0, "nothing was resent after the failover"

            applied = {key: value for key, value in answers.items() if isinstance(value, int)}
            refused = {key: value for key, value in answers.items() if isinstance(value, CommandError)}
            other = {key: value for key, value in answers.items() if key not in applied and key not in refused}
            assert not other, f"{len(other)} transfers failed otherwise, e.g. {list(other.items())[:3]}"
            # Exactly once: the pool went down by one per applied transfer, none twice, none lost.
            assert sorted(applied.values()) == list(range(pool)), "a transfer applied twice, or one lost"
            assert all(
                (e.remote_type, e.remote_message) == ("bank.Overdraft", "pool has 0, cannot send 1")
                for e in refused.values()
            ), list(refused.values())[:3]
            assert len(refused) == total - pool
            for t in range(threads):  # each thread's transfers went in its order
                mine = [applied[t, i] for i in range(transfers) if (t, i) in applied]
                assert mine == sorted(mine, reverse=True), f"thread {t}'s transfers were applied out of order"
            balances = client.call("balances")
            # Money conserved: what left the pool is in t0 and t1, a unit per applied transfer of each.
            received = {f"t{t}": sum(1 for key in applied if key[0] == t) for t in range(threads)}
            assert {k: balances[k] for k in ("pool", "t0", "t1")} == {"pool": 0, **received}
            assert balances["t0"] + balances["t1"] == pool
            assert all(balance >= 0 for balance in balances.values())
        finally:
            client.close()
        # The killed member comes back and catches up from the others: then
        # every member, the new one too, holds those balances at one log position.
        cluster.start_member(leader.member)
        wait_for_commit(cluster, [0, 1, 2], commit_position(cluster), 60)
        assert snapshot_everywhere(cluster)["accounts"] == balances


# ---------------------------------------------------------------------------- the leases


class TestLease:
    example = "lease"

    def test_the_client_script_prints_what_the_readme_shows(self, readme_cluster: ReadmeCluster) -> None:
        """Catches a client or a service whose behaviour (who gets the lease,
        its tokens, the expiry, the refusal) is not what the README shows."""
        assert run_client("lease", "lease_client.py", readme_cluster.ingress_endpoints) == readme_output("lease")

    def test_two_holders_contending_never_hold_a_lease_at_once(self, readme_cluster: ReadmeCluster) -> None:
        """Two clients contending for a lease with a short ttl (some rounds
        end with the lease expired under its holder), then a lease left to
        expire.  Catches two holders at one log time, a lease given before
        the last one expired or was released, a renewal of an expired lease,
        and an expiry judged by anything but the log's time."""
        ttl_ms, rounds = 300, 4
        history = contend(readme_cluster.ingress_endpoints, "door", rounds, ttl_ms)
        check_leases(history)
        assert sum(1 for _, op, _, _ in history if op == "release") >= rounds, "hardly any round ended in a release"
        with fulmar.connect(readme_cluster.ingress_endpoints, timeout=CALL_TIMEOUT_S) as client:
            assert client.call("lease", "door") is None
            # alice takes a lease and stops renewing it; bob asks until he has it.
            alice = client.call("acquire", "gate", "alice", ttl_ms)
            deadline = time.monotonic() + 30
            while (bob := client.call("acquire", "gate", "bob", ttl_ms))["holder"] != "bob":
                assert bob == alice, "the lease changed while alice held it"
                assert time.monotonic() < deadline, f"alice's lease did not expire: {bob}"
                time.sleep(ttl_ms / 10_000)
            # Expiry honoured by the log's time: bob's grant (its expiry less
            # its ttl) no earlier than alice's expiry, and a new token.
            assert bob["token"] == alice["token"] + 1
            assert bob["expires_ms"] - ttl_ms >= alice["expires_ms"]
            with pytest.raises(CommandError) as raised:
                client.call("renew", "gate", "alice", ttl_ms)
            assert raised.value.remote_type == "lease.NotHolder"
            client.call("release", "gate", "bob")
        # Every member holds the same leases at the same log position: none
        # live (each was released or expired), bob's the last token given.
        state = snapshot_everywhere(readme_cluster)
        assert state["last_token"] == bob["token"]
        # What is left: at most door's lease of a round that ended in "lost",
        # expired before alice's acquire (the lease call above said so).
        assert set(state["leases"]) <= {"door"}, state
        assert all(lease["expires_ms"] <= alice["expires_ms"] - ttl_ms for lease in state["leases"].values())


def contend(endpoints: str, name: str, rounds: int, ttl_ms: int) -> list[tuple[Any, ...]]:
    """alice and bob, each with a client of their own, each taking the lease
    ``rounds`` times, renewing it twice while working, then releasing it.
    Every call and its answer, in the order each holder made them."""
    history: list[tuple[Any, ...]] = []

    def work(holder: str) -> None:
        give_up = time.monotonic() + 60
        with fulmar.connect(endpoints, timeout=CALL_TIMEOUT_S) as client:
            taken = 0
            while taken < rounds:
                assert time.monotonic() < give_up, f"{holder} took {name} only {taken} times in 60 s"
                lease = client.call("acquire", name, holder, ttl_ms)
                history.append((holder, "acquire", ttl_ms, lease))
                if lease["holder"] != holder:
                    time.sleep(ttl_ms / 4000)  # someone else holds it: try again soon
                    continue
                taken += 1
                try:
                    for _ in range(2):
                        time.sleep(ttl_ms / 4000)  # the work the lease guards
                        history.append((holder, "renew", ttl_ms, client.call("renew", name, holder, ttl_ms)))
                    client.call("release", name, holder)
                    history.append((holder, "release", ttl_ms, None))
                except CommandError as error:  # too slow (a loaded machine): the lease expired
                    history.append((holder, "lost", ttl_ms, error.remote_message))
                time.sleep(ttl_ms / 4000)  # other things, and the other holder's turn

    with ThreadPoolExecutor() as pool:
        workers = [pool.submit(work, holder) for holder in ("alice", "bob")]
        for worker in workers:
            worker.result()  # what a worker raised, raised here
    return history


def check_leases(history: list[tuple[Any, ...]]) -> None:
    """At most one holder of the lease at any log time, from what the holders
    were told.  A grant's log time is its expiry less its ttl (the service
    computes it from the log's time), and so is a renewal's; a lease's tokens
    rise with each new grant.  So per token: the holder, the log times it
    was seen to hold the lease (granted, renewed), its latest expiry, and
    whether it released the lease.  The next token's grant must come no
    earlier than any of those log times, and no earlier than the expiry
    unless the lease was released.  Also: tokens given out one after the
    other, both holders among them, some lease released."""
    holders: dict[int, str] = {}
    held_at: dict[int, list[int]] = {}
    expiries: dict[int, list[int]] = {}
    released: set[int] = set()
    current: dict[str, int] = {}  # holder -> the token it holds now (its calls are in order)
    own_expiry: dict[int, int] = {}  # token -> the expiry its holder was last told
    for holder, op, ttl_ms, answer in history:
        if op == "acquire":
            token = answer["token"]
            assert holders.setdefault(token, answer["holder"]) == answer["holder"], f"token {token}: two holders"
            expiries.setdefault(token, []).append(answer["expires_ms"])
            if answer["holder"] == holder:
                current[holder] = token
                held_at.setdefault(token, []).append(answer["expires_ms"] - ttl_ms)
                own_expiry[token] = answer["expires_ms"]
        elif op == "renew":
            token = current[holder]
            renewed = answer - ttl_ms
            assert renewed < own_expiry[token], (
                f"token {token} renewed at {renewed}, once expired at {own_expiry[token]}"
            )
            held_at[token].append(renewed)
            expiries[token].append(answer)
            own_expiry[token] = answer
        elif op == "release":
            released.add(current.pop(holder))
        else:
            assert op == "lost" and "does not hold" in answer, (holder, op, answer)
            current.pop(holder)
    granted = sorted(held_at)
    assert granted == list(range(granted[0], granted[0] + len(granted))), f"tokens given out: {granted}"
    assert set(expiries) == set(held_at), "a token seen that no holder was granted"
    assert set(holders.values()) == {"alice", "bob"}, "no contention: one holder had it every time"
    for token, after in zip(granted, granted[1:]):
        grant = held_at[after][0]
        assert grant >= max(held_at[token]), f"token {after} granted at {grant} while token {token} was held"
        if token not in released:
            assert grant >= max(expiries[token]), f"token {after} granted at {grant} before token {token} expired"
    assert released, "no lease was released"


class TestOrderBook:
    example = "orderbook"

    def test_the_client_script_prints_what_the_readme_shows(self, readme_cluster: ReadmeCluster) -> None:
        """Catches trades out of price-time priority, or a client whose
        output is not the README's."""
        lines = run_client("orderbook", "orderbook_client.py", readme_cluster.ingress_endpoints)
        assert lines == readme_output("orderbook")

    def test_random_crossing_orders_trade_as_a_model_book_would(self, readme_cluster: ReadmeCluster) -> None:
        """One client's calls, many in flight, are applied in its order (one
        session, nothing resent): the model replays them in that order, from
        an empty book.  Catches the replicated service answering otherwise
        than it does in one process (a state that does not survive the
        calls' encoding, say), and members that disagree on the book."""
        with fulmar.connect(readme_cluster.ingress_endpoints, timeout=CALL_TIMEOUT_S) as client:
            model = ModelBook()
            model.next_id = sweep(client) + 1
            base = model.next_id - 1  # the workload's order n is order base + n
            operations = [
                (op[0], op[1] + base) if op[0] == "cancel" else op for op in random_orders(random.Random(50), 400)
            ]
            futures = [client.call_async(*operation) for operation in operations]
            results: list[tuple[tuple[Any, ...], Any]] = []
            for operation, future in zip(operations, futures):
                try:
                    results.append((operation, future.result()))
                except CommandError as error:
                    results.append((operation, ("raised", error.remote_type.rpartition(".")[2])))
            assert client.calls_resent == 0
            for operation, answer in results:
                if operation[0] == "place":
                    assert answer == model.place(*operation[1:]), operation
                else:
                    assert answer == model.cancel(operation[1]), operation
            check_trades(model, results)
            book = client.call("book", 10)
            assert book == model.book(10)
            assert book["buy"][0][0] < book["sell"][0][0], f"a crossed book: {book}"
            # Every member holds the model's resting orders at the same log position.
            state = snapshot_everywhere(readme_cluster)
            assert {i: (o.trader, o.side, o.price, o.quantity) for i, o in state["orders"].items()} == {
                o["id"]: (o["trader"], o["side"], o["price"], o["quantity"]) for o in model.resting
            }
            assert state["next_id"] == model.next_id
            sweep(client)  # an empty book for whatever runs next


def sweep(client: fulmar.Client) -> int:
    """Empty the book: a buy above every offer takes them all, a sell below
    every bid takes every bid, and what is left of each is cancelled.  The
    id of the last order."""
    for side, price in (("buy", 10**9), ("sell", 1)):
        placed = client.call("place", "sweeper", side, price, 10**9)
        assert client.call("cancel", placed["id"]) == placed["resting"]
    assert client.call("book", 1) == {"buy": [], "sell": []}
    return placed["id"]


def test_the_readme_quick_start_works_as_written(tmp_path: Path) -> None:
    """The top README's quick start, block by block: its bank.py written to a
    folder, its cluster-node start command run from there (fresh --dir, free
    ports), its client code run with the cluster's endpoints, printing what
    its comments say, and its cluster-tool commands each exiting 0, the last
    (shutdown) stopping the cluster in order.  Catches a README whose first
    five minutes no longer work as written."""
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("## Quick start") : text.index("## Your own service")]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", quick, re.MULTILINE | re.DOTALL)
    service, client = [body for language, body in blocks if language == "python"]
    start, tools = [body for language, body in blocks if language == "sh"]
    (tmp_path / "bank.py").write_text(service)
    [start_line] = [line for line in start.splitlines() if "cluster-node start --local 3" in line]
    words = shlex.split(start_line)
    assert words[0] == ".venv/bin/cluster-node", start_line
    readme_base = words[words.index("--dir") + 1]
    written_endpoints = re.search(r"fulmar\.connect\(\"([^\"]+)\"\)", client)
    assert written_endpoints is not None, client
    expected = [line.split("# ", 1)[1].strip() for line in client.splitlines() if line.strip().startswith("print(")]
    assert expected, "the client block shows no output"
    with ReadmeCluster("quick-start", ["cluster-node", *words[1:]], cwd=tmp_path) as cluster:
        cluster.start()
        code = client.replace(written_endpoints[1], cluster.ingress_endpoints)
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines() == expected
        commands = [shlex.split(line) for line in tools.splitlines() if line.startswith(".venv/bin/cluster-tool")]
        assert [c[1] for c in commands][-1] == "shutdown", tools
        for command in commands:
            assert command[command.index("--dir") + 1] == readme_base, command
            command[command.index("--dir") + 1] = str(cluster.base)
            done = subprocess.run(
                [str(BIN / "cluster-tool"), *command[1:]], capture_output=True, text=True, timeout=STOP_S
            )
            assert done.returncode == 0, f"{shlex.join(command)}: {done.stdout}{done.stderr}"
        assert cluster.process is not None and cluster.process.wait(STOP_S) == 0, cluster.output

"""A client's process declared in its heartbeat label (fulmar.client_liveness):
the driver closes a client whose process died as soon as it is quiet, instead
of after the whole client liveness timeout, so a restarted process can bind its
UDP endpoints again (issue 18).  Clients that declare nothing (Aeron's own)
and clients whose process lives keep the liveness timeout."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection

import pytest

from fulmar.aeron import Aeron, RegistrationError
from fulmar.cli.supervisor import free_udp_port
from fulmar.client_liveness import declared_process, is_process_gone, pid_namespace, process_declaration
from fulmar.cnc import CncFile
from fulmar.counters import CountersReader
from fulmar.driver.counters import CLIENT_HEARTBEAT_TYPE_ID, SystemCounter
from fulmar.error_log import read_error_log
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")
STREAM = 1001
LIVENESS_TIMEOUT_NS = 10_000_000_000  # Aeron's default: what a restarted process would wait for


def manual_subscription_channel() -> str:
    return "aeron:udp?control-mode=manual"


def endpoint_holder_main(directory: str, port: int, ready: Connection) -> None:
    """A client that binds ``port`` as a receive destination and then lives on."""
    aeron = Aeron.connect(directory)
    subscription = aeron.add_subscription(manual_subscription_channel(), STREAM)
    subscription.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
    # Declared once the driver has allocated the heartbeat counter (a keepalive later).
    wait_for(lambda: aeron.conductor._process_declared, 10, "the client to declare its process")
    ready.send(aeron.client_id)
    while True:
        time.sleep(0.05)


def try_bind(subscription, port: int) -> bool:
    try:
        subscription.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
    except RegistrationError as error:
        assert "Address already in use" in str(error), error
        return False
    return True


def heartbeat_labels(directory) -> dict[int, str]:
    with CncFile.open(directory) as cnc:
        counters = CountersReader(cnc.counters_metadata, cnc.counters_values)
        return {
            int.from_bytes(c.key[:8], "little", signed=True): c.label
            for c in counters
            if c.type_id == CLIENT_HEARTBEAT_TYPE_ID
        }


def test_a_client_declares_its_process_in_its_heartbeat_label(start_driver, monkeypatch) -> None:
    def slow_declaration() -> str | None:
        # The conductor thread gives up the GIL here (an os.stat): a reader of
        # the flag must not find it set before the label holds the declaration.
        time.sleep(0.2)
        return process_declaration()

    monkeypatch.setattr("fulmar.aeron.process_declaration", slow_declaration)
    driver = start_driver()
    with driver.connect() as aeron:
        wait_for(lambda: aeron.conductor._process_declared, 10, "the client to declare its process")
        label = heartbeat_labels(driver.directory)[aeron.client_id]
    assert label.startswith(f"client-heartbeat: {aeron.client_id} ")
    assert declared_process(label) == (os.getpid(), pid_namespace())


def test_a_sigkilled_clients_endpoint_is_free_long_before_the_liveness_timeout(start_driver) -> None:
    driver = start_driver(client_liveness_timeout_ns=LIVENESS_TIMEOUT_NS)
    port = free_udp_port()
    end, ready = SPAWN.Pipe()
    holder = SPAWN.Process(target=endpoint_holder_main, args=(str(driver.directory), port, ready))
    aeron = driver.connect()
    try:
        holder.start()
        assert holder.pid is not None
        assert end.poll(30), "the endpoint holder did not start"
        holder_client_id = end.recv()
        subscription = aeron.add_subscription(manual_subscription_channel(), STREAM)
        assert not try_bind(subscription, port)  # held by the other client's subscription
        holder.kill()
        holder.join(10)  # reaped: a zombie would count as gone too, but this is the usual case
        killed_at = time.monotonic()
        wait_for(
            lambda: try_bind(subscription, port),
            LIVENESS_TIMEOUT_NS / 1e9 - 5,
            f"port {port} to be free again after its client's process died",
        )
        took_s = time.monotonic() - killed_at
        assert took_s < 3.0, f"the dead client's endpoint was freed only after {took_s:.1f} s"
        with CncFile.open(driver.directory) as cnc:
            texts = [e.text for e in read_error_log(cnc.error_log)]
            timeouts = CountersReader(cnc.counters_metadata, cnc.counters_values).counter_value(
                SystemCounter.CLIENT_TIMEOUTS
            )
        assert any(f"client {holder_client_id} timed out: its process {holder.pid} is gone" in t for t in texts), texts
        assert timeouts == 1
        assert holder_client_id not in heartbeat_labels(driver.directory)
    finally:
        aeron.close()
        if holder.is_alive():
            holder.kill()
        holder.join(10)


def test_a_stopped_clients_endpoint_stays_held(start_driver) -> None:
    """A client that is quiet because its process is stopped (SIGSTOP, a debugger,
    a long pause) is alive: it keeps what it registered until the liveness timeout."""
    driver = start_driver(client_liveness_timeout_ns=LIVENESS_TIMEOUT_NS)
    port = free_udp_port()
    end, ready = SPAWN.Pipe()
    holder = SPAWN.Process(target=endpoint_holder_main, args=(str(driver.directory), port, ready))
    aeron = driver.connect()
    try:
        holder.start()
        assert holder.pid is not None
        assert end.poll(30), "the endpoint holder did not start"
        holder_client_id = end.recv()
        subscription = aeron.add_subscription(manual_subscription_channel(), STREAM)
        os.kill(holder.pid, signal.SIGSTOP)
        # Quiet for well over the 1 s after which the driver looks at its process.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert not try_bind(subscription, port)
            time.sleep(0.25)
        assert holder_client_id in heartbeat_labels(driver.directory)
        os.kill(holder.pid, signal.SIGCONT)
    finally:
        aeron.close()
        if holder.is_alive():
            holder.kill()
        holder.join(10)


# ----------------------------------------------------------------------------- unit


def test_declared_process_reads_the_last_declaration_and_nothing_else() -> None:
    assert declared_process("client-heartbeat: 7") is None
    assert declared_process("client-heartbeat: 7 name=x version=1.44.0") is None  # a real Aeron client
    assert declared_process("client-heartbeat: 7 pid=12 pidns=4026531836") == (12, 4026531836)
    assert declared_process("client-heartbeat: 7 name=pid=3 pidns=4 pid=12 pidns=99") == (12, 99)
    assert declared_process("client-heartbeat: 7 pid=12") is None
    assert declared_process("client-heartbeat: 7 pid=12 pidns=9x") is None
    assert process_declaration(pid=5, namespace=77) == " pid=5 pidns=77"


def sleeper_main() -> None:
    time.sleep(60)


def test_is_process_gone_for_dead_zombie_reused_and_stopped_processes() -> None:
    now_ms = int(time.time() * 1000)
    assert not is_process_gone(os.getpid(), now_ms)
    # A pid whose process started after the client registered was reused.
    assert is_process_gone(os.getpid(), now_ms - 3_600_000)
    child = FORK.Process(target=sleeper_main)
    child.start()
    pid = child.pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)
        assert not is_process_gone(pid, now_ms)  # stopped is alive
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: is_process_gone(pid, now_ms), 10, "the killed child to count as gone (a zombie)")
        child.join(10)
        assert is_process_gone(pid, now_ms)  # reaped
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)


def test_only_a_quiet_client_whose_declared_process_is_gone_is_closed_early() -> None:
    """The driver's own decision, with a fake clock: a quiet client without a
    declaration (an Aeron client) or in another pid namespace is never closed
    early; one whose declared process is gone is."""
    from fulmar.buffers import AtomicBuffer
    from fulmar.counters import CountersManager
    from fulmar.driver.conductor import AeronClient, DriverConductor
    from fulmar.driver.context import DriverContext

    clock = [int(time.time() * 1000)]
    metadata = AtomicBuffer(bytearray(64 * 512))
    values = AtomicBuffer(bytearray(64 * 128))
    counters = CountersManager(metadata, values, 0, lambda: clock[0])
    conductor = DriverConductor.__new__(DriverConductor)
    conductor.context = DriverContext(client_liveness_timeout_ns=LIVENESS_TIMEOUT_NS)
    conductor.counters = counters
    conductor.clients = {}
    conductor._pid_namespace = pid_namespace()
    closed: list[tuple[int, str]] = []
    conductor._on_client_timeout = lambda client, reason="": closed.append((client.client_id, reason))  # type: ignore[method-assign]
    child = FORK.Process(target=sleeper_main)
    child.start()
    child.kill()
    child.join(10)
    dead_pid = child.pid
    for client_id, suffix in [
        (1, ""),
        (2, f" pid={dead_pid} pidns={(pid_namespace() or 0) + 1}"),
        (3, f" pid={dead_pid} pidns={pid_namespace()}"),
        (4, f" pid={os.getpid()} pidns={pid_namespace()}"),
    ]:
        heartbeat = counters.new_counter(
            f"client-heartbeat: {client_id}{suffix}",
            CLIENT_HEARTBEAT_TYPE_ID,
            client_id.to_bytes(8, "little"),
            registration_id=client_id,
        )
        heartbeat.set(clock[0])
        conductor.clients[client_id] = AeronClient(client_id, heartbeat, clock[0])
    assert conductor._check_client_processes(clock[0] + 500) == 0  # nobody is quiet yet
    assert conductor._check_client_processes(clock[0] + 1_500) == 1
    assert [client_id for client_id, _ in closed] == [3]
    assert closed[0][1] == f"its process {dead_pid} is gone"

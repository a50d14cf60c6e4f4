"""fulmar.connect / Client / AsyncClient against a real one-member cluster
serving ``support.state_machine_services:ClosingJournal`` (with a 2 s session
timeout), each client with its embedded media driver: results and errors,
sessions kept through idle periods and replaced when the cluster closes
them, the driver's life, and asyncio."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import fulmar
from fulmar import (
    AsyncClient,
    CallTimeoutError,
    Client,
    ClientClosedError,
    ClusterUnavailableError,
    CommandArgumentsError,
    CommandError,
    UnknownCommandError,
)
from fulmar.consensus import call_client
from support.cluster import LocalCluster
from support.driver import kill_process, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TESTS_DIR = Path(__file__).parents[1]
SESSION_TIMEOUT_S = 2.0
KEEPALIVE_S = 0.5  # a quarter of the session timeout
DRIVER_GONE_WITHIN_S = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    os.environ["PYTHONPATH"] = str(TESTS_DIR)  # the service containers import state_machine_services
    local = LocalCluster(1, service="support.state_machine_services:ClosingJournal")
    try:
        local.extra_consensus_args += ["--session-timeout", f"{SESSION_TIMEOUT_S:g}s"]
        local.start()
        yield local
    finally:
        local.close()
        del os.environ["PYTHONPATH"]


def connect(cluster: LocalCluster, **options: Any) -> Client:
    options.setdefault("keepalive_interval", KEEPALIVE_S)
    options.setdefault("timeout", 20)
    return fulmar.connect(cluster.ingress_endpoints, **options)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_calls_return_results_and_raise_the_remote_errors(cluster: LocalCluster) -> None:
    with connect(cluster) as client:
        first = client.call("append", ["results", 1])
        assert client.call("append", ["results", 2]) == first + 1
        assert client.call("read")["entries"][first] == ["results", 1]  # a tuple would come back as a list too
        with pytest.raises(CommandError) as raised:
            client.call("refuse", "not today")
        assert type(raised.value) is CommandError
        assert (raised.value.remote_type, raised.value.remote_message) == ("PermissionError", "not today")
        with pytest.raises(UnknownCommandError, match="no command 'nope'"):
            client.call("nope")
        with pytest.raises(CommandArgumentsError, match="append()"):
            client.call("append")
        with pytest.raises(TypeError):
            client.call("append", {1, 2})  # msgpack cannot carry a set: refused in the caller's thread
        assert client.call("append", ["results", 3]) == first + 2  # none of that stopped the service
        assert client.sessions_opened == 1


def test_a_client_idle_longer_than_the_session_timeout_keeps_its_session(cluster: LocalCluster) -> None:
    with connect(cluster) as client:
        client.call("increment")
        session = client.cluster_session_id
        time.sleep(2.5 * SESSION_TIMEOUT_S)  # the script does something else; no call meanwhile
        client.call("increment")
        # The client's thread kept the session alive: the same one, never reopened.
        assert client.cluster_session_id == session and client.sessions_opened == 1


def test_a_session_the_cluster_timed_out_is_replaced_at_the_next_call(cluster: LocalCluster) -> None:
    # Keepalives slower than the session timeout: the cluster closes the idle session.
    with connect(cluster, keepalive_interval=4 * SESSION_TIMEOUT_S) as client:
        before = client.call("increment")
        session = client.cluster_session_id
        wait_for(lambda: client.cluster_session_id is None, 5 * SESSION_TIMEOUT_S, "the cluster to close the session")
        assert client.call("increment") == before + 1
        assert client.sessions_opened == 2 and client.cluster_session_id != session


def test_calls_fail_saying_why_when_no_new_session_can_be_opened(cluster: LocalCluster) -> None:
    client = connect(cluster, keepalive_interval=4 * SESSION_TIMEOUT_S, connect_timeout=1.0)
    consensus = cluster.process(0, "consensus")
    assert consensus is not None
    try:
        client.call("increment")
        session = client.cluster_session_id
        wait_for(lambda: client.cluster_session_id is None, 5 * SESSION_TIMEOUT_S, "the cluster to close the session")
        consensus.process.send_signal(signal.SIGSTOP)  # no member answers a connect now
        with pytest.raises(ClusterUnavailableError) as raised:
            client.call("increment")
        assert f"the cluster closed session {session}" in str(raised.value)
        assert "no new session could be opened within 1 s" in str(raised.value)
        consensus.process.send_signal(signal.SIGCONT)
        client.call("increment")  # the client stays usable: the next call opens a session
        assert client.sessions_opened == 2
    finally:
        consensus.process.send_signal(signal.SIGCONT)
        client.close()


def test_a_session_closed_with_calls_unanswered_is_replaced_and_each_call_applied_once(
    cluster: LocalCluster,
) -> None:
    with connect(cluster) as client:
        closed_before = client.call("closed")
        session = client.cluster_session_id
        # Its reply is held back: unanswered when the cluster closes the session.
        closing = client.call_async("close_my_session")
        # Sent on the same session right after: those the cluster drops once
        # the session is closed must be resent on the next one.
        appends = {n: client.call_async("append", ["closed", n]) for n in range(100)}
        assert closing.result() == session  # answered from the record of its one application
        indexes = {n: future.result() for n, future in appends.items()}
        assert client.sessions_opened == 2 and client.cluster_session_id != session
        assert client.calls_resent > 0, "no call was unanswered when the session closed: the test proved nothing"
        # Applied once each: the close ran once (a second run would have closed
        # the new session too), and each entry is once in the journal, where
        # its answer says.
        assert client.call("closed") == closed_before + 1
        entries = client.call("read")["entries"]
        mine = [entry for entry in entries if entry[0] == "closed"]
        assert sorted(entry[1] for entry in mine) == list(range(100))
        assert all(entries[index] == ["closed", n] for n, index in indexes.items())


def test_touches_keep_an_idle_client_remembered_and_a_forgotten_one_registers_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    with LocalCluster(1, service="support.state_machine_services:ShortExpiryJournal") as short:  # 3 s expiry
        short.start()
        with fulmar.connect(short.ingress_endpoints) as client:
            first_id = client.client_id
            client.call("increment")
            # Idle for twice the expiry: its touches (every quarter of it) keep the record.
            time.sleep(6)
            assert client.call("increment") == 2
            assert client.client_id == first_id, "the service forgot an idle client that kept touching"
            # Cut off for longer than the expiry (its cluster stopped) with a call on its way:
            # the service has forgotten it by the time that call arrives.
            consensus = short.process(0, "consensus")
            assert consensus is not None
            # Nothing of the client's may wait unread when the module stops: a
            # touch read only after SIGCONT would be stamped then, just before
            # the call, and keep the record.  The client touches only after a
            # quarter of the expiry without a request; so stop the module within
            # that of sending a read whose answer says all before it was read.
            touch_interval_s = 3.0 / 4
            for _ in range(20):
                asked = time.monotonic()
                client.call("read")
                consensus.process.send_signal(signal.SIGSTOP)
                if time.monotonic() - asked < touch_interval_s:
                    break
                consensus.process.send_signal(signal.SIGCONT)
            else:
                raise AssertionError(
                    f"no read answered within {touch_interval_s} s of its send to stop the module after"
                )
            try:
                waiting = client.call_async("increment")
                time.sleep(4)
            finally:
                consensus.process.send_signal(signal.SIGCONT)
            # Its only copy got EXPIRED, so it was not applied: it went again, once, under a new registration.
            assert waiting.result() == 3
            assert client.client_id != first_id
            assert client.call("read")["counter"] == 3


def test_calls_from_several_threads_at_once(cluster: LocalCluster) -> None:
    with connect(cluster) as client:
        results: dict[tuple[int, int], int] = {}
        lock = threading.Lock()

        def work(thread: int) -> None:
            futures = [(i, client.call_async("append", ["threads", thread, i])) for i in range(200)]
            for i, future in futures:
                index = future.result()
                with lock:
                    results[thread, i] = index

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        entries = client.call("read")["entries"]
        assert len(results) == 800 and len(set(results.values())) == 800
        assert all(entries[index] == ["threads", t, i] for (t, i), index in results.items())
        # The answered calls do not stay in the client until their deadlines (30 s): without the
        # pruning all 801 would still be there, with their messages and futures.  (At most twice the
        # live calls, the read alone when it was queued, and the slack.)
        assert len(client._deadlines) <= 2 * 1 + call_client._DEADLINES_SLACK, len(client._deadlines)


def test_a_call_unanswered_within_its_timeout_raises_and_close_fails_the_rest(cluster: LocalCluster) -> None:
    client = connect(cluster)
    consensus = cluster.process(0, "consensus")
    assert consensus is not None
    consensus.process.send_signal(signal.SIGSTOP)  # the cluster takes nothing meanwhile
    try:
        with pytest.raises(CallTimeoutError, match=r"no answer within 0.5 s; it may or may not have been applied"):
            client.call("increment", timeout=0.5)
        waiting = client.call_async("increment", timeout=60)
        client.close()
        with pytest.raises(ClientClosedError):
            waiting.result(0)  # closing completed it
        with pytest.raises(ClientClosedError):
            client.call("increment")
    finally:
        consensus.process.send_signal(signal.SIGCONT)
        client.close()


def test_close_stops_the_embedded_driver_and_removes_its_directory(cluster: LocalCluster) -> None:
    client = connect(cluster)
    driver = client.driver
    assert driver is not None and driver.directory.exists()
    assert psutil.Process(driver.pid).ppid() == os.getpid()
    client.call("increment")
    client.close()
    assert driver.process.returncode == 0, "the driver did not stop in order"
    assert not driver.base.exists()


def test_a_client_process_killed_with_sigkill_leaves_no_driver_behind(cluster: LocalCluster) -> None:
    script = textwrap.dedent(
        """
        import json, sys, threading
        import fulmar
        client = fulmar.connect(sys.argv[1])
        client.call("increment")
        print(json.dumps({"pid": client.driver.pid, "base": str(client.driver.base)}), flush=True)
        threading.Event().wait()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, cluster.ingress_endpoints], stdout=subprocess.PIPE, text=True
    )
    driver_pid, base = None, None
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"the client process exited with {process.wait(10)} before its first call"
        started = json.loads(line)
        driver_pid, base = started["pid"], Path(started["base"])
        assert psutil.Process(driver_pid).ppid() == process.pid
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        wait_for(lambda: gone(driver_pid), DRIVER_GONE_WITHIN_S, f"the dead client's driver {driver_pid} to stop")
        wait_for(lambda: not base.exists(), DRIVER_GONE_WITHIN_S, f"the dead client's driver's {base} to go")
    finally:
        kill_process(process)
        if driver_pid is not None and not gone(driver_pid):
            os.kill(driver_pid, signal.SIGKILL)
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


def test_a_client_left_open_at_interpreter_exit_stops_its_driver(cluster: LocalCluster) -> None:
    script = textwrap.dedent(
        """
        import json, sys
        import fulmar
        client = fulmar.connect(sys.argv[1])
        client.call("increment")
        print(json.dumps({"pid": client.driver.pid, "base": str(client.driver.base)}), flush=True)
        # No close(): the interpreter's exit closes the client.
        """
    )
    process = subprocess.run(
        [sys.executable, "-c", script, cluster.ingress_endpoints], capture_output=True, text=True, timeout=60
    )
    assert process.returncode == 0, process.stderr
    started = json.loads(process.stdout)
    driver_pid, base = started["pid"], Path(started["base"])
    try:
        # Stopped by close() at exit, before the process ended: not left for the parent-death signal.
        assert gone(driver_pid) and not base.exists()
    finally:
        if not gone(driver_pid):
            os.kill(driver_pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def test_the_asyncio_client_awaits_many_calls_at_once(cluster: LocalCluster) -> None:
    async def main() -> tuple[list[Any], Any]:
        async with await AsyncClient.connect(cluster.ingress_endpoints, keepalive_interval=KEEPALIVE_S) as client:
            calls = [client.call("append", ["async", n]) for n in range(300)]
            calls.append(client.call("refuse", "async no"))
            results = await asyncio.gather(*calls, return_exceptions=True)
            return results, await client.call("read")

    results, state = asyncio.run(main())
    *indexes, refused = results
    assert isinstance(refused, CommandError) and refused.remote_message == "async no"
    assert all(isinstance(index, int) for index in indexes), [r for r in indexes if not isinstance(r, int)][:3]
    assert len(set(indexes)) == 300
    assert all(state["entries"][index] == ["async", n] for n, index in enumerate(indexes))

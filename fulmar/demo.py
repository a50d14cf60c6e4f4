"""``make run``: a one-node cluster serving a replicated key-value store.

1. ``cluster-node start --local 1`` starts a node (media driver, archive,
   consensus module, clustered service container running
   ``fulmar.service.samples:KeyValueService``) under a temporary directory,
   each a process of its own, supervised.
2. A ``ClusterClient`` opens a session over UDP on loopback and sends a
   workload of puts and gets, a window of requests in flight; every reply is
   checked against a local model of the store (ids, previous values, values).
3. SIGTERM to the supervisor stops the node in order: the consensus module
   takes a snapshot (its own and the service's) and stops the service at one
   log position, then the archive and the driver stop.
4. The node starts again on the same directory: the service loads the
   snapshot (and would replay any log after it), and the client reads every
   key back.  A last orderly stop, and the temporary directories are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fulmar.aeron import Aeron
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog

SERVICE = "fulmar.service.samples:KeyValueService"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60
REPLY_TIMEOUT_S = 30
READY = re.compile(r"node (\d+) ready: ingress (\S+); driver directory (\S+);")


class Node:
    """``cluster-node start --local 1`` as a child process; its output echoed, indented."""

    def __init__(self, base: Path, label: str) -> None:
        self.label = label
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fulmar.cli.cluster_node", "start", "--local", "1", "--dir", str(base),
             "--service", SERVICE],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ingress, self.driver_dir = self._await_ready()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _next_line(self, deadline: float) -> str | None:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise SystemExit(f"{self.label}: no output from cluster-node start for {START_TIMEOUT_S} s") from None
        if line is not None:
            self.output.append(line)
            print(f"  | {line}", flush=True)
        return line

    def _await_ready(self) -> tuple[str, Path]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            line = self._next_line(deadline)
            if line is None:
                raise SystemExit(f"{self.label}: cluster-node start exited with {self.process.wait(10)} before "
                                 "the node was ready")
            match = READY.search(line)
            if match:
                return match.group(2), Path(match.group(3))

    def stop(self) -> int:
        """SIGTERM: the supervisor stops the node in order (snapshot first); its exit code."""
        self.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._next_line(deadline) is not None:
            pass
        return self.process.wait(10)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()  # its children get SIGTERM from the kernel (parent-death signal)
                self.process.wait(10)


class Workload:
    """Pipelined requests over one session; each reply checked against the model."""

    def __init__(self, model: dict[str, Any]) -> None:
        self.client: ClusterClient | None = None
        self.model = model
        self.pending: list[tuple[int, dict[str, Any]]] = []  # (id, expected reply), in send order
        self.head = 0
        self.replies = 0
        self.next_id = 1

    def on_message(self, session_id: int, timestamp: int, payload: memoryview) -> None:
        reply = json.loads(bytes(payload))
        if self.head >= len(self.pending):
            raise SystemExit(f"an unexpected reply: {reply}")
        request_id, expected = self.pending[self.head]
        self.head += 1
        if reply != expected:
            raise SystemExit(f"request {request_id}: expected {expected}, got {reply}")
        self.replies += 1

    def request_for(self, op: str, key: str, value: Any = None) -> tuple[bytes, dict[str, Any]]:
        request_id = self.next_id
        self.next_id += 1
        if op == "put":
            request = {"op": "put", "key": key, "value": value, "id": request_id}
            expected = {"id": request_id, "ok": True, "previous": self.model.get(key)}
            self.model[key] = value
        else:
            request = {"op": "get", "key": key, "id": request_id}
            expected = {"id": request_id, "ok": True, "value": self.model.get(key)}
        return json.dumps(request, separators=(",", ":")).encode(), expected

    def run(self, operations: list[tuple[str, str, Any]], window: int) -> float:
        """Send every operation, at most ``window`` unanswered; the elapsed seconds."""
        client = self.client
        assert client is not None
        started = time.perf_counter()
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        sent = 0
        prepared: tuple[bytes, dict[str, Any]] | None = None
        target = self.replies + len(operations)
        while self.replies < target:
            while sent < len(operations) and len(self.pending) - self.head < window:
                if prepared is None:
                    op, key, value = operations[sent]
                    payload, expected = self.request_for(op, key, value)
                    prepared = (payload, expected)
                if client.offer(prepared[0]) > 0:
                    self.pending.append((self.next_id - 1, prepared[1]))
                    prepared = None
                    sent += 1
                    deadline = time.monotonic() + REPLY_TIMEOUT_S
                else:
                    break
            if client.poll_egress(window):
                deadline = time.monotonic() + REPLY_TIMEOUT_S
            elif time.monotonic() > deadline:
                raise SystemExit(f"no reply for {REPLY_TIMEOUT_S} s: {self.replies:,} of {target:,} replies")
            else:
                time.sleep(0)  # let the node's processes run (2 cores)
        return time.perf_counter() - started


def connect(node: Node, workload: Workload) -> tuple[Aeron, ClusterClient]:
    """A session whose replies go to ``workload`` (``request`` still takes the next one itself)."""
    aeron = Aeron.connect(node.driver_dir)
    try:
        client = ClusterClient.connect(aeron, node.ingress, egress_channel="aeron:udp?endpoint=127.0.0.1:0",
                                       on_message=workload.on_message,
                                       message_timeout_ns=REPLY_TIMEOUT_S * 1_000_000_000)
    except BaseException:
        aeron.close()
        raise
    workload.client = client
    return aeron, client


def stop_node(node: Node, what: str) -> None:
    print(f"{what}: SIGTERM to cluster-node start (pid {node.process.pid})", flush=True)
    code = node.stop()
    stopped = next((line for line in node.output if "consensus module stopped:" in line), "")
    position = re.search(r"SHUTDOWN at log position (\d+)", stopped)
    if code != 0 or position is None:
        raise SystemExit(f"the node did not stop cleanly (exit code {code})")
    print(f"cluster stopped cleanly (exit {code}): snapshot taken at log position {int(position.group(1)):,}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m fulmar.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="puts and gets in the workload")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys")
    parser.add_argument("--window", type=int, default=64, help="requests in flight")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="fulmar-demo-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    nodes: list[Node] = []
    driver_dirs: set[Path] = set()
    model: dict[str, Any] = {}
    try:
        print(f"starting a one-node cluster under {base}", flush=True)
        node = Node(base, "first start")
        nodes.append(node)
        driver_dirs.add(node.driver_dir)
        workload = Workload(model)
        aeron, client = connect(node, workload)
        try:
            first = client.request(json.dumps({"op": "get", "key": "greeting", "id": 0}).encode(), REPLY_TIMEOUT_S)
            print(f"session {client.cluster_session_id} open; a first request answered: {first.decode()}", flush=True)
            keys = [f"key-{k:05d}" for k in range(args.keys)]
            operations: list[tuple[str, str, Any]] = []
            for i in range(args.requests):  # every key written, reads of written and unwritten keys
                if i % 2 == 0:
                    operations.append(("put", keys[(i // 2 * 7919) % len(keys)], i))
                else:
                    operations.append(("get", keys[(i * 104729) % len(keys)], None))
            elapsed = workload.run(operations, args.window)
            puts = sum(1 for op in operations if op[0] == "put")
            print(f"workload: {args.requests:,} requests ({puts:,} puts, {args.requests - puts:,} gets over "
                  f"{len(keys):,} keys, {args.window} in flight) -> {workload.replies:,} replies in {elapsed:.2f} s: "
                  f"{workload.replies / elapsed:,.0f} requests/s", flush=True)
            print(f"{workload.replies:,} requests answered, every reply verified against the model", flush=True)
            latencies = []
            for i in range(args.keys):
                key = keys[i]
                started = time.perf_counter()
                reply = json.loads(client.request(json.dumps({"op": "get", "key": key, "id": -i}).encode(),
                                                  REPLY_TIMEOUT_S))
                latencies.append(time.perf_counter() - started)
                if reply != {"id": -i, "ok": True, "value": model.get(key)}:
                    raise SystemExit(f"get {key}: expected {model.get(key)!r}, got {reply}")
            latencies.sort()
            print(f"request/response, one at a time: {len(latencies):,} gets, every reply verified; round trip "
                  f"median {latencies[len(latencies) // 2] * 1e6:,.0f} us, "
                  f"p99 {latencies[len(latencies) * 99 // 100] * 1e6:,.0f} us", flush=True)
        finally:
            client.close()
            aeron.close()

        stop_node(node, "snapshot and orderly stop")
        cluster_dir = base / "node0" / "cluster"
        with RecordingLog.open(cluster_dir, create=False) as recording_log:
            snapshot = recording_log.get_latest_snapshot(0)
        if snapshot is None:
            raise SystemExit("no service snapshot in recording.log")
        print(f"recording.log: the service's snapshot is recording {snapshot.recording_id} at log position "
              f"{snapshot.log_position:,}", flush=True)

        print("starting the cluster again on the same directory", flush=True)
        node = Node(base, "restart")
        nodes.append(node)
        driver_dirs.add(node.driver_dir)
        workload = Workload(model)
        aeron, client = connect(node, workload)
        try:
            started = time.perf_counter()
            elapsed = workload.run([("get", key, None) for key in sorted(model)], args.window)
            print(f"state recovered after restart: {workload.replies:,} of {len(model):,} keys read back, every value "
                  f"as before the stop ({elapsed:.2f} s)", flush=True)
            workload.run([("put", "restarts", 1), ("get", "restarts", None)], 2)
            print(f"the restarted cluster takes new writes (elapsed {time.perf_counter() - started:.2f} s)", flush=True)
        finally:
            client.close()
            aeron.close()
        stop_node(node, "final stop")
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(base, ignore_errors=True)
        for directory in driver_dirs:
            if directory.exists():
                print(f"the driver directory {directory} was left behind: removing it", flush=True)
                shutil.rmtree(directory, ignore_errors=True)
    left = [str(path) for path in (base, *driver_dirs) if path.exists()]
    if left:
        raise SystemExit(f"left behind: {', '.join(left)}")
    print(f"nothing left behind: {base} and {', '.join(str(d) for d in sorted(driver_dirs))} removed", flush=True)


if __name__ == "__main__":
    main()

"""Raw loopback datagram throughput: the batched transport (one sendmmsg and
one recvmmsg per 64 datagrams) against a plain Python ``sendto``/``recvfrom``
loop doing the same work, both between two sockets of this process on
127.0.0.1.  The plain loop is the reference, so the ratio is the batching's
gain.  Each round sends a batch, then receives until the batch is in (or the
queue is empty: a datagram the kernel dropped is not counted)."""

from __future__ import annotations

import itertools
import socket
import time
from array import array
from typing import Any

from fulmar.driver.udp_transport import UdpTransport

BATCH = 64
RCVBUF = 4 * 1024 * 1024


def _batched(size: int, seconds: float) -> float:
    receiver = UdpTransport.open(("127.0.0.1", 0), so_rcvbuf=RCVBUF, receive_batch=BATCH)
    sender = UdpTransport.open(("127.0.0.1", 0), so_sndbuf=RCVBUF)
    try:
        buffer = bytes(size * BATCH)
        # Flattened (offset, length) pairs: the form the sender keeps, so no
        # conversion per send.
        regions = array("i", itertools.chain.from_iterable((i * size, size) for i in range(BATCH)))
        destination = receiver.address(*receiver.local_address)
        received = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            sent = sender.send(buffer, regions, destination)
            pending = sent
            while pending > 0:
                got = len(receiver.receive())
                if got == 0:
                    break
                pending -= got
                received += got
        return received / (time.perf_counter() - start)
    finally:
        sender.close()
        receiver.close()


def _plain(size: int, seconds: float) -> float:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RCVBUF)
        receiver.bind(("127.0.0.1", 0))
        sender.bind(("127.0.0.1", 0))
        receiver.setblocking(False)
        sender.setblocking(False)
        destination = receiver.getsockname()
        payload = bytes(size)
        received = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            sent = 0
            for _ in range(BATCH):
                try:
                    sender.sendto(payload, destination)
                except BlockingIOError:
                    break
                sent += 1
            for _ in range(sent):
                try:
                    receiver.recvfrom(65536)
                except BlockingIOError:
                    break
                received += 1
        return received / (time.perf_counter() - start)
    finally:
        sender.close()
        receiver.close()


def run(quick: bool) -> list[dict[str, Any]]:
    seconds = 0.2 if quick else 1.0
    results = []
    for size in (1408, 64):
        plain = _plain(size, seconds)
        batched = _batched(size, seconds)
        results.append(
            {
                "name": f"udp loopback {size} B datagrams, batches of {BATCH}",
                "value": batched,
                "unit": "dgram/s",
                "reference": plain,
            }
        )
    return results


if __name__ == "__main__":
    for row in run(quick=False):
        print(f"{row['name']:<48} {row['value']:>12,.0f} {row['unit']}  plain loop {row['reference']:>12,.0f}"
              f"  ratio {row['value'] / row['reference']:.2f}")  # fmt: skip

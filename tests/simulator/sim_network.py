"""The simulated network between nodes and clients, and the event queue.

Models:

* datagrams (the consensus stream): each message on each destination is
  lost, duplicated, delayed and so reordered with the seeded probabilities
  in ``Faults``; a partition drops it;
* reliable ordered streams (the log, catchup replays, ingress, egress), one
  flow per (publication, destination endpoint): what the publication has
  appended is sent as chunks of bytes with a seeded delay; a lost chunk is
  sent again after a retransmit delay (Aeron's NAK and retransmit), a
  duplicated one arrives twice, chunks may overtake each other (the
  receiver reassembles them); a partition stalls the flow (nothing is sent,
  nothing is lost); a flow that could not reach its receiver for the image
  liveness timeout (a partition, or a dead sender) loses its connection: the
  receiver's image closes and a later chunk makes a new image that joins
  where that chunk starts (as a receiver joins at the sender's position);
* symmetric and one-way partitions between any two hosts (member nodes and
  clients are hosts).

Not modelled: bandwidth and receiver windows (a stalled flow sends
everything once it heals), a subscription that binds an endpoint another
already holds (the last bind wins), address resolution.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

MS = 1_000_000


@dataclass
class Faults:
    """What the network does to traffic now (the simulator changes it per phase)."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay_min_ns: int = 200_000
    delay_max_ns: int = 2 * MS
    retransmit_ns: int = 5 * MS


class EventQueue:
    """Simulated time and the events due in it (a heap; ties in insertion order)."""

    def __init__(self) -> None:
        self.now_ns = 0
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, when_ns: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when_ns, self._seq, action))

    def next_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run_due(self, now_ns: int) -> int:
        heap = self._heap
        count = 0
        while heap and heap[0][0] <= now_ns:
            _, _, action = heapq.heappop(heap)
            action()
            count += 1
        return count


class _Flow:
    __slots__ = (
        "publication",
        "endpoint",
        "sent",
        "last_up_ns",
        "lost",
        "eos_sent",
        "last_delivery_ns",
        "setup_due_ns",
    )

    def __init__(self, publication: Any, endpoint: str, now_ns: int) -> None:
        self.publication = publication
        self.endpoint = endpoint
        self.sent = publication.log.end
        self.last_up_ns = now_ns
        self.lost = False
        self.eos_sent = False
        self.last_delivery_ns = 0
        self.setup_due_ns = 0


class SimNetwork:
    def __init__(self, events: EventQueue, rng: random.Random, image_liveness_timeout_ns: int = 10_000 * MS) -> None:
        self.events = events
        self.rng = rng
        self.faults = Faults()
        self.image_liveness_timeout_ns = image_liveness_timeout_ns
        self.bindings: dict[str, Any] = {}  # endpoint -> subscription
        self.endpoint_host: dict[str, int] = {}  # endpoint -> host (known from the member string)
        self.blocked: set[tuple[int, int]] = set()  # (from host, to host)
        self._flows: dict[tuple[int, str], _Flow] = {}
        self.datagrams_sent = 0
        self.datagrams_delivered = 0
        self.chunks_delivered = 0

    # -- partitions

    def reachable(self, src: int, dst: int) -> bool:
        return (src, dst) not in self.blocked

    def partition(self, side_a: list[int], side_b: list[int], one_way: bool = False) -> None:
        for a in side_a:
            for b in side_b:
                self.blocked.add((a, b))
                if not one_way:
                    self.blocked.add((b, a))

    def heal(self) -> None:
        self.blocked.clear()

    # -- endpoints

    def bind(self, endpoint: str, subscription: Any) -> None:
        self.bindings[endpoint] = subscription
        self.endpoint_host[endpoint] = subscription.client.driver.node_id

    def unbind(self, endpoint: str, subscription: Any) -> None:
        if self.bindings.get(endpoint) is subscription:
            del self.bindings[endpoint]

    def _host_of(self, endpoint: str) -> int | None:
        return self.endpoint_host.get(endpoint)

    def _link_up(self, src: int, endpoint: str) -> bool:
        dst = self._host_of(endpoint)
        return dst is not None and (src, dst) not in self.blocked

    def is_connected(self, publication: Any) -> bool:
        """Aeron's connected publication: a receiver has made an image of it
        (answered its SETUP) and is reachable now."""
        src = publication.driver.node_id
        for endpoint in publication.destinations:
            subscription = self.bindings.get(endpoint)
            if subscription is None or not self._link_up(src, endpoint):
                continue
            log = subscription.received.get(publication.session_id)
            if log is not None and not log.closed:
                return True
        return False

    # -- datagrams

    def send_datagram(self, publication: Any, message: bytes) -> None:
        src = publication.driver.node_id
        host = f"{publication.driver.host}:40000"
        faults = self.faults
        rng = self.rng
        for endpoint in publication.destinations:
            self.datagrams_sent += 1
            if not self._link_up(src, endpoint) or rng.random() < faults.drop:
                continue
            copies = 2 if rng.random() < faults.duplicate else 1
            for _ in range(copies):
                delay = rng.randint(faults.delay_min_ns, faults.delay_max_ns)
                self.events.at(
                    self.events.now_ns + delay,
                    partial(self._deliver_datagram, src, endpoint, publication.session_id, message, host),
                )

    def _deliver_datagram(self, src: int, endpoint: str, session_id: int, message: bytes, host: str) -> None:
        subscription = self.bindings.get(endpoint)
        if subscription is None or subscription.is_closed or not self._link_up(src, endpoint):
            return
        from sim_aeron import SimDatagramImage

        key = (src, session_id)
        image = subscription.received.get(key)
        if image is None:
            image = SimDatagramImage(subscription, session_id, host)
            subscription.received[key] = image
            subscription.client.tell("add", subscription, image)
        image.messages.append(message)
        subscription.client.wake()
        self.datagrams_delivered += 1

    # -- reliable streams

    def on_appended(self, publication: Any) -> None:
        for endpoint in publication.destinations:
            self._pump(self._flow(publication, endpoint))

    def _flow(self, publication: Any, endpoint: str) -> _Flow:
        key = (id(publication), endpoint)
        flow = self._flows.get(key)
        if flow is None:
            flow = self._flows[key] = _Flow(publication, endpoint, self.events.now_ns)
        return flow

    def _pump(self, flow: _Flow) -> None:
        publication = flow.publication
        now_ns = self.events.now_ns
        src = publication.driver.node_id
        up = self._link_up(src, flow.endpoint) and not publication.crashed
        if up:
            flow.last_up_ns = now_ns
            # (A connection lost before: the sender's next frames make a new
            # image at the receiver, where they start.)
            flow.lost = False
        elif now_ns - flow.last_up_ns >= self.image_liveness_timeout_ns and not flow.lost:
            flow.lost = True
            self._lose(flow)
            return
        if not up:
            return
        end = publication.log.end
        if not publication.is_closed and now_ns >= flow.setup_due_ns:
            # Aeron's SETUP and heartbeat frames: a receiver that has no image
            # of this stream makes one at the sender's position, data or not.
            subscription = self.bindings.get(flow.endpoint)
            if subscription is not None:
                log = subscription.received.get(publication.session_id)
                if log is None or log.closed:
                    flow.setup_due_ns = now_ns + 50 * MS
                    position = flow.sent
                    delay = self.rng.randint(self.faults.delay_min_ns, self.faults.delay_max_ns)
                    self.events.at(now_ns + delay, lambda: self._deliver_setup(flow, position))
        if flow.sent < end:
            chunk = publication.log.chunk(flow.sent, end)
            position = flow.sent
            flow.sent = end
            faults = self.faults
            rng = self.rng
            delay = rng.randint(faults.delay_min_ns, faults.delay_max_ns)
            if rng.random() < faults.drop:
                delay += faults.retransmit_ns
            at = now_ns + delay
            self.events.at(at, lambda: self._deliver_chunk(flow, position, chunk))
            if rng.random() < faults.duplicate:
                self.events.at(
                    at + rng.randint(0, faults.delay_max_ns), lambda: self._deliver_chunk(flow, position, chunk)
                )
        elif publication.is_closed and not publication.crashed and not flow.eos_sent:
            flow.eos_sent = True
            at = now_ns + self.faults.delay_max_ns
            self.events.at(at, lambda: self._deliver_eos(flow, end))

    def _receiver_log(self, flow: _Flow) -> Any:
        subscription = self.bindings.get(flow.endpoint)
        if subscription is None or subscription.is_closed:
            return None
        log = subscription.received.get(flow.publication.session_id)
        return None if log is None or log.closed else log

    def _deliver_setup(self, flow: _Flow, position: int) -> None:
        """A SETUP reached the receiver: it makes the image at the position the
        SETUP carries, and the sender sends again what the image lacks from
        there (what it sent meanwhile was dropped: there was no image)."""
        if flow.lost or self._receiver_log(flow) is not None:
            return
        subscription = self.bindings.get(flow.endpoint)
        if subscription is None or subscription.is_closed:
            return
        from sim_aeron import SimLogBuffer

        source = flow.publication.log
        log = SimLogBuffer(
            position, source.session_id, source.stream_id, source.term_length, source.initial_term_id, source.mtu
        )
        subscription.received[source.session_id] = log
        subscription.client.driver.on_received(subscription, log, True)
        if flow.sent > position:
            flow.sent = position
        self._pump(flow)

    def _deliver_chunk(self, flow: _Flow, position: int, chunk: bytes) -> None:
        if flow.lost:
            return
        log = self._receiver_log(flow)
        if log is None:
            flow.setup_due_ns = 0  # (data for no image: dropped; the sender's SETUP comes next)
            return
        log.receive(position, chunk)
        self.chunks_delivered += 1

    def _deliver_eos(self, flow: _Flow, end: int) -> None:
        subscription = self.bindings.get(flow.endpoint)
        if subscription is None or flow.lost:
            return
        log = subscription.received.get(flow.publication.session_id)
        if log is not None and not log.closed:
            log.end_of_stream_position = min(log.end_of_stream_position, end)

    def _lose(self, flow: _Flow) -> None:
        subscription = self.bindings.get(flow.endpoint)
        if subscription is None:
            return
        log = subscription.received.get(flow.publication.session_id)
        if log is not None and not log.closed:
            subscription.client.driver.on_received_lost(subscription, log)

    def tick(self) -> None:
        """Retry stalled flows and time out lost connections; forget finished flows."""
        done = []
        for key, flow in self._flows.items():
            publication = flow.publication
            if publication.is_closed and (flow.lost or flow.eos_sent or publication.crashed and flow.lost):
                done.append(key)
                continue
            self._pump(flow)
        for key in done:
            del self._flows[key]

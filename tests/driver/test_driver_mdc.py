"""Multi-destination-cast: one UDP publication, several receivers."""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import Connection

import pytest

from fulmar.aeron import Aeron
from fulmar.cli.supervisor import free_udp_ports
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from support.driver import DriverProcess, free_udp_port, new_driver_dir, remove_driver_dir, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SPAWN = multiprocessing.get_context("spawn")
STREAM = 3001


def subscriber_main(directory: str, channel: str, control: Connection) -> None:
    """Count messages (reserved value = sequence) until told to report; pause on request."""
    with Aeron.connect(directory) as aeron:
        subscription = aeron.add_subscription(channel, STREAM)
        seqs: list[int] = []
        handler = lambda b, o, n, h: seqs.append(h.reserved_value)
        control.send("subscribed")
        paused = False
        while True:
            if control.poll():
                command = control.recv()
                if command == "report":
                    control.send((len(seqs), seqs == list(range(len(seqs))), subscription.image_count))
                elif command == "pause":
                    paused = True
                    control.send("paused")
                elif command == "resume":
                    paused = False
                elif command == "stop":
                    return
            if paused or subscription.poll(handler, 256) == 0:
                time.sleep(0.0005)


class Receivers:
    """Receiver driver processes, each with a subscriber process."""

    def __init__(self, count: int, exclude: tuple[int, ...] = ()) -> None:
        self.dirs = [new_driver_dir() for _ in range(count)]
        self.drivers: list[DriverProcess] = []
        self.subscribers: list[multiprocessing.process.BaseProcess] = []
        self.controls: list[Connection] = []
        # Chosen together, and none of them the publication's control port: ports
        # chosen one call at a time may be offered twice.
        self.ports = free_udp_ports(count, exclude=exclude)

    def start(self, channel_of) -> None:
        for directory, port in zip(self.dirs, self.ports):
            self.drivers.append(DriverProcess(directory))
            end, control = SPAWN.Pipe()
            process = SPAWN.Process(target=subscriber_main, args=(str(directory), channel_of(port), control))
            process.start()
            self.subscribers.append(process)
            self.controls.append(end)
        for end in self.controls:
            assert end.poll(30) and end.recv() == "subscribed"

    def report(self, index: int) -> tuple[int, bool, int]:
        self.controls[index].send("report")
        assert self.controls[index].poll(30)
        return self.controls[index].recv()

    def close(self) -> None:
        for end, process in zip(self.controls, self.subscribers):
            if process.is_alive():
                try:
                    end.send("stop")
                except OSError:
                    pass
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        for driver in self.drivers:
            driver.stop()
        for directory in self.dirs:
            remove_driver_dir(directory)


def publish(publication, start: int, count: int) -> None:
    deadline = time.monotonic() + 60
    for seq in range(start, start + count):
        while True:
            result = publication.offer(bytes(100), reserved_value=seq)
            if result > 0:
                break
            assert result in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION), result
            assert time.monotonic() < deadline, f"stuck at message {seq}"
            os.sched_yield()


@pytest.mark.parametrize("mode", ["dynamic", "manual"])
def test_three_receivers_get_the_stream_and_survive_one_dying(start_driver, mode: str) -> None:
    sender = start_driver()
    control = free_udp_port()
    receivers = Receivers(3, exclude=(control,))
    try:
        # Min flow control: the sender waits for every live receiver, so all
        # get everything; a receiver silent for 1 s stops holding it back.
        # (With max, the default, a receiver that falls more than half a term
        # behind is left behind, as in Aeron: the cluster catches such
        # followers up from the archive instead.)
        if mode == "dynamic":
            pub_channel = f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic|term-length=64k|fc=min,t:1s"
            receivers.start(lambda port: f"aeron:udp?endpoint=127.0.0.1:{port}|control=127.0.0.1:{control}")
        else:
            pub_channel = "aeron:udp?control-mode=manual|term-length=64k|fc=min,t:1s"
            receivers.start(lambda port: f"aeron:udp?endpoint=127.0.0.1:{port}")
        with sender.connect() as aeron:
            publication = aeron.add_publication(pub_channel, STREAM)
            if mode == "manual":
                for port in receivers.ports:
                    publication.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
            wait_for(lambda: all(receivers.report(i)[2] == 1 for i in range(3)), 20, "an image on each receiver")
            publish(publication, 0, 5_000)
            wait_for(lambda: all(receivers.report(i)[0] == 5_000 for i in range(3)), 30, "everyone to get 5,000")
            assert all(receivers.report(i)[1] for i in range(3)), "a receiver saw a gap or a duplicate"
            # One receiver's whole node dies; the others carry on.
            receivers.subscribers[2].kill()
            receivers.drivers[2].kill()
            if mode == "manual":
                publication.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{receivers.ports[2]}")
            publish(publication, 5_000, 5_000)
            wait_for(lambda: all(receivers.report(i)[0] == 10_000 for i in range(2)), 30, "the survivors to get 10,000")
            assert all(receivers.report(i)[1] for i in range(2))
    finally:
        receivers.close()


@pytest.mark.parametrize("strategy", ["min", "max", "tagged-member-paused", "tagged-outsider-paused"])
def test_flow_control_follows_the_slowest_or_the_fastest_receiver(start_driver, strategy: str) -> None:
    """Receiver 1 pauses.  min and tagged (receiver 1 in the group) hold the
    sender within its window; max and tagged (receiver 1 outside the group)
    let receiver 0 run ahead."""
    sender = start_driver()
    control = free_udp_port()
    receivers = Receivers(2, exclude=(control,))
    try:
        fc = {"min": "min,t:10s", "max": "max"}.get(strategy, "tagged,g:7,t:10s")
        pub_channel = f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic|term-length=64k|fc={fc}"
        tags = {"tagged-member-paused": ["", "|gtag=7"], "tagged-outsider-paused": ["|gtag=7", ""]}.get(
            strategy, ["", ""]
        )
        ports = iter(range(2))
        receivers.start(
            lambda port: f"aeron:udp?endpoint=127.0.0.1:{port}|control=127.0.0.1:{control}{tags[next(ports)]}"
        )
        with sender.connect() as aeron:
            publication = aeron.add_publication(pub_channel, STREAM)
            wait_for(lambda: all(receivers.report(i)[2] == 1 for i in range(2)), 20, "an image on each receiver")
            receivers.controls[1].send("pause")  # receiver 1 stops reading
            assert receivers.controls[1].poll(10) and receivers.controls[1].recv() == "paused"
            paused_at = receivers.report(1)[0]
            # Offer for a while without waiting on back-pressure.
            sent = 0
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                if publication.offer(bytes(100), reserved_value=sent) > 0:
                    sent += 1
                else:
                    time.sleep(0.001)
            fast = receivers.report(0)[0]
            frame = 160  # 100 bytes + 32 header, aligned to 32
            window = 32 * 1024 + 32 * 1024  # receiver window + publication term window
            if strategy in ("min", "tagged-member-paused"):
                # The sender stays within the paused receiver's window.
                assert (sent - paused_at) * frame <= window + 4 * frame
                assert fast - paused_at <= window // frame + 4
            else:
                # The fast receiver keeps going; the paused one is left behind.
                assert fast - paused_at > 2 * window // frame
    finally:
        receivers.close()

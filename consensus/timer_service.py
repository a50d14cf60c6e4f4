"""The consensus module's timers: deadlines by correlation id.

Services schedule and cancel timers through the consensus module.  Only the
leader fires them, by appending a TimerEvent to the log, so every member and
service sees the timer at the same log position; followers (and a leader
replaying its log) cancel a timer when they read its TimerEvent.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator


class TimerService:
    def __init__(self) -> None:
        self._deadlines: dict[int, int] = {}  # correlation id -> deadline
        self._heap: list[tuple[int, int]] = []  # (deadline, correlation id); stale entries skipped

    def __len__(self) -> int:
        return len(self._deadlines)

    def __contains__(self, correlation_id: object) -> bool:
        return correlation_id in self._deadlines

    def schedule(self, correlation_id: int, deadline: int) -> None:
        """Add a timer, or move an existing one to a new deadline."""
        self._deadlines[correlation_id] = deadline
        heapq.heappush(self._heap, (deadline, correlation_id))

    def cancel(self, correlation_id: int) -> bool:
        return self._deadlines.pop(correlation_id, None) is not None

    def deadline(self, correlation_id: int) -> int | None:
        return self._deadlines.get(correlation_id)

    def next_deadline(self) -> int | None:
        """The earliest deadline of a live timer (None without timers): how
        long the module may sleep.  Drops cancelled and moved entries on the way."""
        heap = self._heap
        while heap and self._deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def poll(self, now: int, on_expiry: Callable[[int], bool], limit: int = 64) -> int:
        """Fire timers whose deadline has passed, oldest first.  ``on_expiry``
        returns False when it could not act (e.g. the log is back pressured):
        the timer stays and the poll stops."""
        fired = 0
        heap = self._heap
        while heap and fired < limit:
            deadline, correlation_id = heap[0]
            if self._deadlines.get(correlation_id) != deadline:
                heapq.heappop(heap)  # cancelled or rescheduled
                continue
            if deadline > now:
                break
            if not on_expiry(correlation_id):
                break
            heapq.heappop(heap)
            del self._deadlines[correlation_id]
            fired += 1
        return fired

    def timers(self) -> Iterator[tuple[int, int]]:
        """(correlation id, deadline) of every timer, for a snapshot."""
        return iter(sorted(self._deadlines.items(), key=lambda item: (item[1], item[0])))

    def clear(self) -> None:
        self._deadlines.clear()
        self._heap.clear()

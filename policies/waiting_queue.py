"""The waiting queue under priority scheduling: a heap with the deque operations policies use.

vLLM's priority policy orders waiting requests by (priority, arrival time); a preempted request
goes back in at its own place rather than at the front. FCFS uses a plain `collections.deque`.
"""
from __future__ import annotations

import heapq
from collections import deque


class PriorityWaitingQueue:
    """Waiting requests ordered by (priority, arrival_time, arrival index); lower comes first."""

    def __init__(self):
        self._heap: list = []

    @staticmethod
    def _entry(req):
        return (req.priority, req.arrival_time, req.index, req)

    def append(self, req) -> None:
        heapq.heappush(self._heap, self._entry(req))

    appendleft = append  # a preempted request returns to its priority's place

    def popleft(self):
        return heapq.heappop(self._heap)[3]

    def __getitem__(self, i: int):
        if i != 0:
            raise IndexError("only the head of a priority queue can be read")
        return self._heap[0][3]

    def remove(self, req) -> None:
        self._heap = [e for e in self._heap if e[3] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))


def make_waiting_queue(scheduling: str):
    """A deque for FCFS, a priority heap for "priority"."""
    return PriorityWaitingQueue() if scheduling == "priority" else deque()

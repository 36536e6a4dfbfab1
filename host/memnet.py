"""The in-memory transport: workers and a switch in one process, in virtual time.

A discrete-event loop carries frames between sans-IO endpoints (one per
switch port, normally :class:`~inagg.host.worker.AllReduce`) and a switch's
:class:`~inagg.models.backend.DataPlane` (``receive(port, frame) -> [(port,
frame), ...]``, normally the :class:`~inagg.models.switch.ModelSwitch`).
Each hop takes ``latency`` of virtual time, and a
:class:`~inagg.host.link.LossyLink` sits on both directions. Time is
virtual, so a run is reproducible for a seed and timeouts cost nothing in
wall-clock time.

:class:`Traffic` is that loop's events without the clock: frames on the
link both ways, the endpoints' timers, what the switch sends.
:class:`MemoryNetwork` drives it in virtual time; the RTL's memory
transport (``inagg.testbench.bridge.memory``) drives the same events on the
simulator's clock.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from inagg.host.link import Faults, LossyLink
from inagg.models.backend import DataPlane

__all__ = ["Endpoint", "Traffic", "MemoryNetwork", "RunStats"]

_TO_SWITCH, _TO_HOST, _TIMER = 0, 1, 2


class Endpoint(Protocol):
    """What the network drives: a sans-IO protocol object."""

    @property
    def done(self) -> bool: ...

    @property
    def deadline(self) -> float | None: ...

    def start(self, now: float) -> list[bytes]: ...

    def receive(self, now: float, frame: bytes) -> list[bytes]: ...

    def on_timer(self, now: float) -> list[bytes]: ...


class Traffic:
    """The events of one run between ``endpoints`` (keyed by switch port) and ``switch``, whoever keeps the time.

    Every frame put on the link passes ``capture(time, frame)`` (before
    faults) and ``link``; it arrives ``latency`` plus the link's delay
    later, or at once when that is no time at all. A driver calls
    :meth:`start`, then hands every event its turn with :meth:`pop` (the
    earliest is due at :attr:`next_time`) and the switch's later frames to
    :meth:`from_switch`, until :attr:`pending` is zero.
    """

    def __init__(self, switch: DataPlane, endpoints: Mapping[int, Endpoint], link: LossyLink, *, latency: float,
                 capture: Callable[[float, bytes], None] | None = None):
        self.switch, self.endpoints, self.link, self.latency, self.capture = switch, endpoints, link, latency, capture
        self.to_switch = 0   # frames delivered to the switch
        self.to_hosts = 0    # frames delivered to an endpoint
        self.in_flight = 0   # frames on the link, not delivered yet
        self.pending = 0     # endpoints not done
        self._heap: list = []
        self._seq = 0
        self._timers: dict[int, float | None] = {}

    @property
    def next_time(self) -> float:
        """When the earliest event is due; ``math.inf`` when none is scheduled."""
        return self._heap[0][0] if self._heap else math.inf

    def start(self, now: float) -> None:
        """Start every endpoint."""
        for port, ep in self.endpoints.items():
            self._put(now, _TO_SWITCH, port, ep.start(now))
            self._arm(port, ep)
        self.pending = sum(not ep.done for ep in self.endpoints.values())

    def pop(self, now: float | None = None) -> None:
        """Handle the earliest event at ``now`` (by default its own time)."""
        due, _, kind, port, frame = heapq.heappop(self._heap)
        now = due if now is None else now
        if kind != _TIMER:
            self.in_flight -= 1
            self._deliver(now, kind, port, frame)
            return
        ep = self.endpoints[port]
        if self._timers.get(port) != due:
            return  # a timer that was re-armed since
        self._timers[port] = None
        self._answer(now, port, ep, ep.on_timer)

    def from_switch(self, now: float, frames: list[tuple[int, bytes]]) -> None:
        """Put frames the switch sent outside :meth:`~inagg.models.backend.DataPlane.receive` on the link."""
        for port, frame in frames:
            self._put(now, _TO_HOST, port, [frame])

    def _put(self, now: float, kind: int, port: int, frames: list[bytes]) -> None:
        for f in frames:
            if self.capture is not None:
                self.capture(now, f)
            for extra, g in self.link.transmit(f):
                at = now + self.latency + extra
                if at <= now:
                    self._deliver(now, kind, port, g)
                else:
                    self._seq += 1
                    self.in_flight += 1
                    heapq.heappush(self._heap, (at, self._seq, kind, port, g))

    def _arm(self, port: int, ep: Endpoint) -> None:
        d = ep.deadline
        if d != self._timers.get(port):
            self._timers[port] = d
            if d is not None:
                self._seq += 1
                heapq.heappush(self._heap, (d, self._seq, _TIMER, port, None))

    def _deliver(self, now: float, kind: int, port: int, frame: bytes) -> None:
        if kind == _TO_SWITCH:
            self.to_switch += 1
            self.from_switch(now, self.switch.receive(port, frame))
            return
        ep = self.endpoints.get(port)
        if ep is not None:
            self.to_hosts += 1
            self._answer(now, port, ep, lambda t: ep.receive(t, frame))

    def _answer(self, now: float, port: int, ep: Endpoint, call: Callable[[float], list[bytes]]) -> None:
        """Let ``ep`` react with ``call(now)``; send what it sends, re-arm its timer, count it when it finishes."""
        was_done = ep.done
        self._put(now, _TO_SWITCH, port, call(now))
        self._arm(port, ep)
        if ep.done and not was_done:
            self.pending -= 1


@dataclass
class RunStats:
    """What one run moved: frames each way, virtual and wall-clock time."""

    to_switch: int = 0
    to_hosts: int = 0
    virtual_time: float = 0.0
    wall_time: float = 0.0
    link: dict = field(default_factory=dict)


class MemoryNetwork:
    """Connects endpoints to a switch through a lossy link, in virtual time.

    Parameters
    ----------
    switch:
        The switch's :class:`~inagg.models.backend.DataPlane` (a
        :class:`~inagg.models.switch.ModelSwitch`); what it sends from
        ``poll`` leaves at the time of the event before.
    latency:
        Virtual time of one hop, host to switch or switch to host.
    faults, seed:
        The faults of the link (both directions) and the seed of its random source.
    capture:
        Called as ``capture(time, frame)`` for every frame put on the link
        (before faults), e.g. a pcap writer.
    """

    def __init__(self, switch: DataPlane, *, latency: float = 1e-6, faults: Faults | None = None,
                 seed: int = 0, capture: Callable[[float, bytes], None] | None = None):
        if not isinstance(latency, (int, float)) or not latency > 0:
            raise ValueError(f"latency must be a positive number, not {latency!r}")
        self.switch = switch
        self.latency = latency
        self.link = LossyLink(faults, seed)
        self.capture = capture

    def run(self, endpoints: Mapping[int, Endpoint], *, progress: Callable[[float], None] | None = None,
            max_time: float = 3600.0) -> RunStats:
        """Start every endpoint (keyed by switch port) and run until all are done.

        Raises whatever an endpoint raises (a timeout names its chunk and
        worker), and ``RuntimeError`` when nothing is left to happen but an
        endpoint is not done, or virtual time passes ``max_time``.
        ``progress(now)`` is called every few thousand events.
        """
        traffic = Traffic(self.switch, endpoints, self.link, latency=self.latency, capture=self.capture)
        wall = time.perf_counter()
        now = 0.0
        traffic.start(now)
        events = 0
        while traffic.pending:
            now = traffic.next_time
            if now == math.inf:
                raise RuntimeError("the network is idle but not every endpoint is done")
            if now > max_time:
                raise RuntimeError(f"virtual time passed {max_time} s before every endpoint was done")
            events += 1
            if progress is not None and not events & 0xFFF:
                progress(now)
            traffic.pop()
            traffic.from_switch(now, self.switch.poll())
        return RunStats(traffic.to_switch, traffic.to_hosts, now, time.perf_counter() - wall, dict(self.link.stats))

"""The in-memory transport: workers and the model switch in one process, in virtual time.

A discrete-event loop carries frames between sans-IO endpoints (one per
switch port, normally :class:`~inagg.host.worker.AllReduce`) and a switch
with the :class:`~inagg.models.switch.ModelSwitch` data-plane interface
(``receive(port, frame) -> [(port, frame), ...]``). Each hop takes
``latency`` of virtual time, and a :class:`~inagg.host.link.LossyLink` sits on
both directions. Time is virtual, so a run is reproducible for a seed and
timeouts cost nothing in wall-clock time.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from inagg.host.link import Faults, LossyLink

__all__ = ["Endpoint", "SwitchPlane", "MemoryNetwork", "RunStats"]

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


class SwitchPlane(Protocol):
    """The data plane of a switch."""

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]: ...


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
        The switch data plane (a :class:`~inagg.models.switch.ModelSwitch`).
    latency:
        Virtual time of one hop, host to switch or switch to host.
    faults, seed:
        The faults of the link (both directions) and the seed of its random source.
    capture:
        Called as ``capture(time, frame)`` for every frame put on the link
        (before faults), e.g. a pcap writer.
    """

    def __init__(self, switch: SwitchPlane, *, latency: float = 1e-6, faults: Faults | None = None,
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
        stats = RunStats()
        heap: list = []
        seq = 0
        timers: dict[int, float | None] = {}
        lat, link, capture, switch = self.latency, self.link, self.capture, self.switch

        def put(now: float, kind: int, port: int, frames: list[bytes]) -> None:
            nonlocal seq
            for f in frames:
                if capture is not None:
                    capture(now, f)
                for extra, g in link.transmit(f):
                    seq += 1
                    heapq.heappush(heap, (now + lat + extra, seq, kind, port, g))

        def arm(port: int, ep: Endpoint) -> None:
            nonlocal seq
            d = ep.deadline
            if d != timers.get(port):
                timers[port] = d
                if d is not None:
                    seq += 1
                    heapq.heappush(heap, (d, seq, _TIMER, port, None))

        wall = time.perf_counter()
        now = 0.0
        for port, ep in endpoints.items():
            put(now, _TO_SWITCH, port, ep.start(now))
            arm(port, ep)
        pending = sum(not ep.done for ep in endpoints.values())
        events = 0
        while pending:
            if not heap:
                raise RuntimeError("the network is idle but not every endpoint is done")
            now, _, kind, port, frame = heapq.heappop(heap)
            if now > max_time:
                raise RuntimeError(f"virtual time passed {max_time} s before every endpoint was done")
            events += 1
            if progress is not None and not events & 0xFFF:
                progress(now)
            if kind == _TO_SWITCH:
                stats.to_switch += 1
                for out_port, out in switch.receive(port, frame):
                    put(now, _TO_HOST, out_port, [out])
                continue
            ep = endpoints.get(port)
            if ep is None:
                continue
            was_done = ep.done
            if kind == _TO_HOST:
                stats.to_hosts += 1
                out = ep.receive(now, frame)
            elif timers.get(port) == now:
                timers[port] = None
                out = ep.on_timer(now)
            else:
                continue  # a timer that was re-armed since
            put(now, _TO_SWITCH, port, out)
            arm(port, ep)
            if ep.done and not was_done:
                pending -= 1
        stats.virtual_time = now
        stats.wall_time = time.perf_counter() - wall
        stats.link = dict(link.stats)
        return stats

"""The memory transport on the RTL: sans-IO endpoints and the Verilated switch, in simulated time.

:func:`serve_memory` is :class:`inagg.host.memnet.MemoryNetwork` with the
model switch replaced by a :class:`~inagg.testbench.bridge.bridge.FrameBridge`:
the same endpoints (normally :class:`~inagg.host.worker.AllReduce`), the
same :class:`~inagg.host.link.LossyLink` on both directions, and the
simulator's clock as the endpoints' clock, so timeouts are in simulated
seconds and a run is reproducible for a seed. Python runs only at the
harness's alarm (:meth:`~inagg.testbench.bridge.bridge.FrameBridge.wait`):
half a ring of results, an empty ingress ring with frames waiting, a timer
falling due or a held-back frame's release; in between Verilator runs alone.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cocotb.simtime import get_sim_time

from inagg.host.link import Faults, LossyLink
from inagg.host.memnet import Endpoint
from inagg.testbench.bridge.bridge import CLOCK_NS, FrameBridge
from inagg.testbench.bridge.compare import LiveCompare

__all__ = ["serve_memory", "MemoryRun", "MAX_SLEEP"]

# Longest sleep (cycles) while nothing is due: the order log and the idle check are looked at this often.
MAX_SLEEP = 4096
# Consecutive idle sleeps with nothing due and no frame anywhere before the run counts as hung.
_IDLE_LIMIT = 64
# Wakes without a frame anywhere after the last endpoint is done before the run ends (each at most
# FrameBridge.flush_cycles): longer than a frame takes from an ingress ring to the egress rings.
_SETTLE_WAKES = 4
_TO_SWITCH, _TO_HOST = 0, 1


@dataclass
class MemoryRun:
    """What one run moved, and how many cycles and wakes the workers took (until the last was done)."""

    to_switch: int = 0
    to_hosts: int = 0
    cycles: int = 0
    wakes: int = 0
    python_time: float = 0.0  # CPU seconds in Python between wakes; the rest is the simulator's
    link: dict = field(default_factory=dict)


def _now() -> float:
    return get_sim_time("ns") * 1e-9


async def serve_memory(bridge: FrameBridge, endpoints: Mapping[int, Endpoint], *, faults: Faults | None = None,
                       seed: int = 0, capture: Callable[[float, bytes], None] | None = None,
                       compare: LiveCompare | None = None, progress: Callable[[], None] | None = None,
                       max_time: float = 60.0) -> MemoryRun:
    """Start every endpoint (keyed by switch port) and run until all are done and the switch is quiet.

    Raises whatever an endpoint raises (a timeout names its chunk and
    worker), and ``RuntimeError`` when nothing is left to happen but an
    endpoint is not done, or simulated time passes ``max_time`` seconds.
    ``progress()`` is called after every wake that delivered results.
    """
    run = MemoryRun()
    link = LossyLink(faults, seed)
    held: list[tuple[float, int, int, int, bytes]] = []
    seq = 0
    bridge.record_order = compare is not None
    start_cycles = round(get_sim_time("ns")) // CLOCK_NS

    def cross(now: float, direction: int, port: int, frames: list[bytes]) -> None:
        nonlocal seq
        for f in frames:
            if capture is not None:
                capture(now, f)
            for extra, g in link.transmit(f):
                if extra:
                    seq += 1
                    heapq.heappush(held, (now + extra, seq, direction, port, g))
                else:
                    arrive(now, direction, port, g)

    def arrive(now: float, direction: int, port: int, frame: bytes) -> None:
        if direction == _TO_SWITCH:
            run.to_switch += 1
            if bridge.send(port, frame) and compare is not None:
                compare.sent(port, frame)
            return
        ep = endpoints.get(port)
        if ep is None:
            return
        run.to_hosts += 1
        cross(now, _TO_SWITCH, port, ep.receive(now, frame))

    now = _now()
    for port, ep in endpoints.items():
        cross(now, _TO_SWITCH, port, ep.start(now))
    idle = quiet = 0
    working = True
    # After the last endpoint is done the run goes on until every frame still on its way reached the switch
    # and every answer came out, so that the switch's counters (and the comparison) cover all the traffic.
    while working or held or not bridge.idle or quiet < _SETTLE_WAKES:
        awake = time.process_time()
        now = _now()
        if now > max_time:
            raise RuntimeError(f"simulated time passed {max_time} s before every endpoint was done")
        got = bridge.pull()
        if compare is not None and bridge.order:
            compare.taken(bridge.order)
            bridge.order.clear()
        for port, frame in got:
            if compare is not None:
                compare.received(port, frame)
            cross(now, _TO_HOST, port, [frame])
        while held and held[0][0] <= now:
            _, _, direction, port, frame = heapq.heappop(held)
            arrive(now, direction, port, frame)
        due = math.inf
        for port, ep in endpoints.items():
            if ep.done:
                continue
            d = ep.deadline
            if d is not None and d <= now:
                cross(now, _TO_SWITCH, port, ep.on_timer(now))
                d = ep.deadline
            if d is not None:
                due = min(due, d)
        bridge.push()
        if held:
            due = min(due, held[0][0])
        if got and progress is not None:
            progress()
        working = not all(ep.done for ep in endpoints.values())
        if working:
            idle = idle + 1 if due == math.inf and not got and not bridge.backlog else 0
            if idle > _IDLE_LIMIT:
                raise RuntimeError("the network is idle but not every endpoint is done")
            run.wakes += 1
            run.python_time += time.process_time() - awake
            run.cycles = round(get_sim_time("ns")) // CLOCK_NS - start_cycles
        else:
            quiet = 0 if got or held or not bridge.idle else quiet + 1
        cycles = MAX_SLEEP if due == math.inf else min(MAX_SLEEP, math.ceil((due - now) * 1e9 / CLOCK_NS))
        await bridge.wait(cycles)
    run.link = dict(link.stats)
    return run

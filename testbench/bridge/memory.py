"""The memory transport on the RTL: sans-IO endpoints and the Verilated switch, in simulated time.

:func:`serve_memory` drives the events of :class:`inagg.host.memnet.Traffic`,
as :class:`~inagg.host.memnet.MemoryNetwork` does, with the model switch
replaced by the harness's rings (a :class:`~inagg.testbench.bridge.bridge.FrameBridge`
seen as a :class:`~inagg.models.backend.DataPlane`): the same endpoints
(normally :class:`~inagg.host.worker.AllReduce`), the same
:class:`~inagg.host.link.LossyLink` on both directions, and the
simulator's clock as the endpoints' clock, so timeouts are in simulated
seconds and a run is reproducible for a seed. A hop takes no time of its
own here: the RTL's cycles are the latency. Python runs only at the
harness's alarm (:meth:`~inagg.testbench.bridge.bridge.FrameBridge.wait`):
half a ring of results, an empty ingress ring with frames waiting, a timer
falling due or a held-back frame's release; in between Verilator runs alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cocotb.simtime import get_sim_time

from inagg.host.link import Faults, LossyLink
from inagg.host.memnet import Endpoint, Traffic
from inagg.models.backend import DataPlane
from inagg.testbench.bridge.bridge import CLOCK_NS, FrameBridge
from inagg.testbench.bridge.compare import LiveCompare

__all__ = ["serve_memory", "MemoryRun", "BridgePlane", "MAX_SLEEP"]

# Longest sleep (cycles) while nothing is due: the order log and the idle check are looked at this often.
MAX_SLEEP = 4096
# Consecutive idle sleeps with nothing due and no frame anywhere before the run counts as hung.
_IDLE_LIMIT = 64
# Wakes without a frame anywhere after the last endpoint is done before the run ends (each at most
# FrameBridge.flush_cycles): longer than a frame takes from an ingress ring to the egress rings.
_SETTLE_WAKES = 4


@dataclass
class MemoryRun:
    """What one run moved, and how many cycles and wakes the workers took (until the last was done)."""

    to_switch: int = 0
    to_hosts: int = 0
    cycles: int = 0
    wakes: int = 0
    python_time: float = 0.0  # CPU seconds in Python between wakes; the rest is the simulator's
    link: dict = field(default_factory=dict)


class BridgePlane(DataPlane):
    """The harness's rings as a :class:`~inagg.models.backend.DataPlane`: a frame waits for the next
    :meth:`~FrameBridge.push`, results come out of :meth:`poll`; ``compare``, when given, sees every frame both ways.
    """

    def __init__(self, bridge: FrameBridge, compare: LiveCompare | None = None):
        self.bridge, self.compare = bridge, compare
        bridge.record_order = compare is not None

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Queue ``frame`` for port ``port``; nothing comes out at once."""
        if self.bridge.send(port, frame) and self.compare is not None:
            self.compare.sent(port, frame)
        return []

    def poll(self) -> list[tuple[int, bytes]]:
        """The frames the switch sent since the last call (:meth:`FrameBridge.pull`)."""
        got = self.bridge.pull()
        if self.compare is not None:
            if self.bridge.order:
                self.compare.taken(self.bridge.order)
                self.bridge.order.clear()
            for port, frame in got:
                self.compare.received(port, frame)
        return got


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
    plane = BridgePlane(bridge, compare)
    traffic = Traffic(plane, endpoints, link, latency=0.0, capture=capture)
    start_cycles = round(get_sim_time("ns")) // CLOCK_NS
    traffic.start(_now())
    idle = quiet = 0
    # After the last endpoint is done the run goes on until every frame still on its way reached the switch
    # and every answer came out, so that the switch's counters (and the comparison) cover all the traffic.
    while traffic.pending or traffic.in_flight or not bridge.idle or quiet < _SETTLE_WAKES:
        awake = time.process_time()
        now = _now()
        if now > max_time:
            raise RuntimeError(f"simulated time passed {max_time} s before every endpoint was done")
        got = plane.poll()
        traffic.from_switch(now, got)
        while traffic.next_time <= now:
            traffic.pop(now)
        bridge.push()
        due = traffic.next_time
        if got and progress is not None:
            progress()
        if traffic.pending:
            idle = idle + 1 if due == math.inf and not got and not bridge.backlog else 0
            if idle > _IDLE_LIMIT:
                raise RuntimeError("the network is idle but not every endpoint is done")
            run.wakes += 1
            run.python_time += time.process_time() - awake
            run.cycles = round(get_sim_time("ns")) // CLOCK_NS - start_cycles
        else:
            quiet = 0 if got or traffic.in_flight or not bridge.idle else quiet + 1
        cycles = MAX_SLEEP if due == math.inf else min(MAX_SLEEP, math.ceil((due - now) * 1e9 / CLOCK_NS))
        await bridge.wait(cycles)
    run.to_switch, run.to_hosts, run.link = traffic.to_switch, traffic.to_hosts, dict(link.stats)
    return run

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
link both ways, the endpoints' timers, what the switch sends, and the
switch's own timer when it has one (``deadline`` and ``on_timer(now)``:
the model switch's Mode III result timers).
:class:`MemoryNetwork` drives it in virtual time; the RTL's memory
transport (``inagg.testbench.bridge.memory``) drives the same events on the
simulator's clock.

:class:`TreeNetwork` does the same for a tree of switches
(:class:`~inagg.models.tree.Tree`): endpoints are the ranks, every hop
(rank to leaf switch, switch to parent) is a link of its own with the same
faults, and a frame a switch sends on a port goes to what
:meth:`~inagg.models.tree.Tree.peer` names there. :class:`RankMux` puts a
rank's endpoints of several jobs behind its one port.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter as Tally
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inagg.host.link import Faults, LossyLink
from inagg.models.backend import DataPlane
from inagg.models.frame import RESULT
from inagg.models.tree import Tree

__all__ = ["Endpoint", "Traffic", "MemoryNetwork", "RunStats", "TreeNetwork", "TreeTraffic", "RankMux"]

_TO_SWITCH, _TO_HOST, _TIMER, _SWITCH_TIMER = 0, 1, 2, 3
# The BTH sits at the same offset in every frame a rank receives, so any layout's reader finds the destination QPN.
_DQPN = RESULT.reader("bth.dqpn")
_DQPN_END = sum(RESULT.span("bth.dqpn"))


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
        # A switch with timers of its own (the model's Modes I and III, DataPlane.deadline) runs on this
        # clock: per switch (the one switch is -1, a tree's by index) its timer event on the heap.
        self._switch_due: dict[int, float] = {}

    @property
    def next_time(self) -> float:
        """When the earliest event is due; ``math.inf`` when none is scheduled."""
        return self._heap[0][0] if self._heap else math.inf

    def start(self, now: float) -> None:
        """Start every endpoint."""
        for port, ep in self.endpoints.items():
            self._send(now, _TO_SWITCH, [(port, f) for f in ep.start(now)])
            self._arm(port, ep)
        self.pending = sum(not ep.done for ep in self.endpoints.values())

    def pop(self, now: float | None = None) -> None:
        """Handle the earliest event at ``now`` (by default its own time).

        Frames due at the switch at the same time, one after the other, reach it in one
        :meth:`~inagg.models.backend.DataPlane.receive_batch`: what it sends is put on the link
        in the same order as frame by frame, so a run is the same either way. Frames due at the
        endpoints at the same time reach each endpoint that has a ``receive_batch(now, frames)``
        in one call (:meth:`~inagg.host.worker.AllReduce.receive_batch`), the others one by one.
        """
        due, _, kind, port, frame = heapq.heappop(self._heap)
        now = due if now is None else now
        if kind == _SWITCH_TIMER:
            self._switch_timer(now, due, port)
            return
        if kind != _TIMER:  # frames: those going the same way at the same time go as one batch
            batch = [(port, frame)]
            while self._heap and self._heap[0][0] == due and self._heap[0][2] == kind:
                batch.append(heapq.heappop(self._heap)[3:])
            self.in_flight -= len(batch)
            (self._to_switch if kind == _TO_SWITCH else self._to_hosts)(now, batch)
            return
        ep = self.endpoints[port]
        if self._timers.get(port) != due:
            return  # a timer that was re-armed since
        self._timers[port] = None
        self._answer(now, port, ep, ep.on_timer)

    def from_switch(self, now: float, frames: list[tuple[int, bytes]]) -> None:
        """Put frames the switch sent outside :meth:`~inagg.models.backend.DataPlane.receive` on the link."""
        self._send(now, _TO_HOST, frames)

    def _send(self, now: float, kind: int, frames: list[tuple]) -> None:
        """Put ``(port, frame)`` pairs going ``kind`` on the link; hand over at once, together, those that
        arrive at once."""
        at_once: list[tuple] = []
        for port, frame in frames:
            self._launch(now, kind, port, frame, at_once)
        if at_once:
            (self._to_switch if kind == _TO_SWITCH else self._to_hosts)(now, at_once)

    def _launch(self, now: float, kind: int, port, frame: bytes, at_once: list[tuple[int, bytes]]) -> None:
        """Put ``frame`` on the link: what the link delivers later goes on the heap, what arrives at once (a
        network of no latency) onto ``at_once``, so that frames arriving together are handed over together,
        as :meth:`pop` hands over frames due at the same time."""
        if self.capture is not None:
            self.capture(now, frame)
        for extra, g in self._link(kind, port).transmit(frame):
            at = now + self.latency + extra
            if at <= now:
                at_once.append((port, g))
            else:
                self._seq += 1
                self.in_flight += 1
                heapq.heappush(self._heap, (at, self._seq, kind, port, g))

    def _link(self, kind: int, port) -> LossyLink:
        """The link a frame going ``kind`` to ``port`` crosses."""
        return self.link

    def _arm(self, port: int, ep: Endpoint) -> None:
        d = ep.deadline
        if d != self._timers.get(port):
            self._timers[port] = d
            if d is not None:
                self._seq += 1
                heapq.heappush(self._heap, (d, self._seq, _TIMER, port, None))

    def _switch_of(self, key: int) -> DataPlane:
        """The switch a timer key names: the one switch here (-1)."""
        return self.switch

    def _emit(self, now: float, key: int, frames: list[tuple[int, bytes]]) -> None:
        """Put what the switch ``key`` sent on the link."""
        self.from_switch(now, frames)

    def _switch_timer(self, now: float, due: float, key: int) -> None:
        """Switch ``key``'s timer event due at ``due``, unless it was re-armed since."""
        if due == self._switch_due.get(key):
            del self._switch_due[key]
            self._emit(now, key, self._switch_of(key).on_timer(now))
            self._arm_switch(key)

    def _arm_switch(self, key: int = -1) -> None:
        d = self._switch_of(key).deadline
        if d is not None and d != self._switch_due.get(key):
            self._switch_due[key] = d
            self._seq += 1
            heapq.heappush(self._heap, (d, self._seq, _SWITCH_TIMER, key, None))

    def _to_switch(self, now: float, batch: list[tuple[int, bytes]]) -> None:
        """Hand the switch ``batch``, frames due at ``now``; a switch with a clock sees it first."""
        self.to_switch += len(batch)
        self.from_switch(now, self.switch.on_timer(now))
        self.from_switch(now, self.switch.receive_batch(batch))
        self._arm_switch()

    def _to_hosts(self, now: float, batch: list[tuple[int, bytes]]) -> None:
        """Hand every endpoint its frames of ``batch``, frames due at ``now``: in one call where it takes a batch."""
        frames: dict[int, list[bytes]] = {}
        for port, frame in batch:
            frames.setdefault(port, []).append(frame)
        for port, mine in frames.items():
            ep = self.endpoints.get(port)
            take = getattr(ep, "receive_batch", None)
            if take is None:
                for frame in mine:
                    self._deliver(now, port, frame)
            else:
                self.to_hosts += len(mine)
                self._answer(now, port, ep, lambda t: take(t, mine))

    def _deliver(self, now: float, port: int, frame: bytes) -> None:
        """Hand the endpoint at ``port`` (if any) the one frame ``frame``."""
        ep = self.endpoints.get(port)
        if ep is not None:
            self.to_hosts += 1
            self._answer(now, port, ep, lambda t: ep.receive(t, frame))

    def _answer(self, now: float, port: int, ep: Endpoint, call: Callable[[float], list[bytes]]) -> None:
        """Let ``ep`` react with ``call(now)``; send what it sends, re-arm its timer, count it when it finishes."""
        was_done = ep.done
        self._send(now, _TO_SWITCH, [(port, f) for f in call(now)])
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
        return _drive(traffic, progress, max_time, lambda now: traffic.from_switch(now, self.switch.poll()),
                      self.link.stats)


def _drive(traffic: Traffic, progress: Callable[[float], None] | None, max_time: float,
           poll: Callable[[float], None] | None, link_stats: Mapping) -> RunStats:
    """Run ``traffic`` in virtual time until every endpoint is done (see :meth:`MemoryNetwork.run`)."""
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
        if poll is not None:
            poll(now)
    return RunStats(traffic.to_switch, traffic.to_hosts, now, time.perf_counter() - wall, dict(link_stats))


class TreeTraffic(Traffic):
    """The events of one run on a tree: ``endpoints`` keyed by rank, ``switches`` in tree order.

    A frame going to a switch is addressed ``(switch, port)`` (an endpoint's
    frames go to its leaf switch); each hop of the tree has its own link in
    ``links``, keyed by the (switch, port) of its upper end.
    """

    def __init__(self, tree: Tree, switches: Sequence[DataPlane], endpoints: Mapping[int, Endpoint],
                 links: Mapping[tuple[int, int], LossyLink], *, latency: float,
                 capture: Callable[[float, bytes], None] | None = None):
        super().__init__(None, endpoints, None, latency=latency, capture=capture)
        self.tree, self.switches, self.links = tree, switches, links

    def _link(self, kind: int, port) -> LossyLink:
        if kind != _TO_SWITCH or isinstance(port, int):  # a rank's hop: to it, or from it to its leaf switch
            return self.links[self.tree.leaf_of(port)]
        s, p = port
        if p == self.tree.switches[s].uplink_port:
            return self.links[(self.tree.switches[s].parent, self.tree.switches[s].position)]
        return self.links[port]

    def _to_switch(self, now: float, batch: list) -> None:
        """Each frame to the switch it is addressed to, one at a time: the switches of a tree differ.

        A switch with timers of its own (Mode III) sees its clock first, as :class:`Traffic`'s switch does."""
        self.to_switch += len(batch)
        for port, frame in batch:
            s, p = self.tree.leaf_of(port) if isinstance(port, int) else port
            sw = self.switches[s]
            self._emit(now, s, sw.on_timer(now))
            self._emit(now, s, sw.receive(p, frame))
            self._arm_switch(s)

    def _switch_of(self, key: int) -> DataPlane:
        return self.switches[key]

    def _emit(self, now: float, s: int, frames: list[tuple[int, bytes]]) -> None:
        """Put what switch ``s`` sent on the links of its ports."""
        for q, g in frames:
            node, far = self.tree.peer(s, q)
            if node.switch:
                self._send(now, _TO_SWITCH, [((node.index, far), g)])
            else:
                self._send(now, _TO_HOST, [(node.index, g)])



class TreeNetwork:
    """Model switches of a tree and its ranks in one process, in virtual time; faults on every hop.

    Parameters
    ----------
    tree:
        The :class:`~inagg.models.tree.Tree`.
    switches:
        One :class:`~inagg.models.backend.DataPlane` per switch of the tree,
        in tree order, each answering in ``receive`` (the model switch).
    latency, faults, seed, capture:
        As for :class:`MemoryNetwork`; each hop's link draws its faults from
        a random source of its own, seeded from ``seed`` and the hop.
        ``faults`` may also map a hop, the (switch, port) of its upper end,
        to that hop's faults (a hop not named has none).
    """

    def __init__(self, tree: Tree, switches: Sequence[DataPlane], *, latency: float = 1e-6,
                 faults: Faults | Mapping[tuple[int, int], Faults] | None = None, seed: int = 0,
                 capture: Callable[[float, bytes], None] | None = None):
        if len(switches) != len(tree.switches):
            raise ValueError(f"the tree has {len(tree.switches)} switches, not {len(switches)}")
        if not isinstance(latency, (int, float)) or not latency > 0:
            raise ValueError(f"latency must be a positive number, not {latency!r}")
        self.tree, self.switches, self.latency, self.capture = tree, list(switches), latency, capture
        hops = [(s.index, p) for s in tree.switches for p in range(len(s.children))]
        per_hop = faults if isinstance(faults, Mapping) else dict.fromkeys(hops, faults)
        if unknown := set(per_hop) - set(hops):
            raise ValueError(f"faults name hops the tree does not have: {sorted(unknown)}")
        self.links = {hop: LossyLink(per_hop.get(hop), [seed, *hop]) for hop in hops}

    @property
    def link_stats(self) -> Tally:
        """What the faults did, summed over every hop."""
        return sum((link.stats for link in self.links.values()), Tally())

    def run(self, endpoints: Mapping[int, Endpoint], *, progress: Callable[[float], None] | None = None,
            max_time: float = 3600.0) -> RunStats:
        """Start every endpoint (keyed by rank) and run until all are done (as :meth:`MemoryNetwork.run`)."""
        traffic = TreeTraffic(self.tree, self.switches, endpoints, self.links, latency=self.latency,
                              capture=self.capture)
        stats = _drive(traffic, progress, max_time, None, {})
        stats.link = dict(self.link_stats)
        return stats


class RankMux:
    """The endpoints of one rank, one per job, behind its one port: a frame goes to the job whose QP it names.

    ``ops`` maps each of the rank's QPNs to that job's :class:`Endpoint`
    (the plan of :func:`~inagg.host.controller.plan_tree_jobs` gives the
    rank one QPN per job). The mux is itself an :class:`Endpoint`: done when
    every job is, due at its earliest job's deadline. A frame naming no QP
    of this rank, or too short to name one, is dropped and counted in
    ``dropped``.
    """

    def __init__(self, ops: Mapping[int, Endpoint]):
        self.ops, self.dropped = dict(ops), 0

    @property
    def done(self) -> bool:
        return all(op.done for op in self.ops.values())

    @property
    def deadline(self) -> float | None:
        return min((d for op in self.ops.values() if (d := op.deadline) is not None), default=None)

    def start(self, now: float) -> list[bytes]:
        return [f for op in self.ops.values() for f in op.start(now)]

    def receive(self, now: float, frame: bytes) -> list[bytes]:
        op = self.ops.get(_DQPN(frame)[0]) if len(frame) >= _DQPN_END else None
        if op is None:
            self.dropped += 1
            return []
        return op.receive(now, frame)

    def receive_batch(self, now: float, frames: Sequence[bytes]) -> list[bytes]:
        """Frames that arrived together: each job's in one batch (in arrival order), for the jobs in the
        order their first frame came; an endpoint without ``receive_batch`` takes its frames one by one."""
        by_op: dict[int, list[bytes]] = {}
        for frame in frames:
            qpn = _DQPN(frame)[0] if len(frame) >= _DQPN_END else None
            if qpn not in self.ops:
                self.dropped += 1
                continue
            by_op.setdefault(qpn, []).append(frame)
        out = []
        for qpn, batch in by_op.items():
            op = self.ops[qpn]
            take = getattr(op, "receive_batch", None)
            out += take(now, batch) if take is not None else [f for frame in batch for f in op.receive(now, frame)]
        return out

    def on_timer(self, now: float) -> list[bytes]:
        # Only the jobs whose timer is due: another job's timer firing early would resend before its time.
        return [f for op in self.ops.values() if (d := op.deadline) is not None and d <= now
                for f in op.on_timer(now)]

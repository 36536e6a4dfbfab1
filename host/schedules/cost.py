"""Congestion-aware alpha-beta cost of a schedule on a topology.

A schedule's communication steps run one after the other. In a step every
transfer follows its route (:mod:`inagg.host.schedules.topology`); a link's
*load* is the bytes of all transfers of the step that cross it. A transfer
takes

    endpoint_alpha + sum(alpha of its links) + max over its links (beta * load)

and the step takes as long as its slowest transfer: the busiest link on a
path sets the byte term, so two messages that share a link each see half
its bandwidth. Local copies and reduces are free.

*Congestion deficiency* Xi (Swing, NSDI 2024): the byte term the schedule
pays, divided by the byte term it would pay if every message crossed only
its first link (the load each node puts on each of its own ports). 1 means
no message ever waits for another one; a ring algorithm on a ring has
Xi = 1, recursive doubling on a 2-D torus about 1.5.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from inagg.host.schedules.ir import Schedule, group_steps
from inagg.host.schedules.topology import Topology

__all__ = ["Cost", "evaluate", "allreduce_lower_bound", "ina_lower_bound"]


@dataclasses.dataclass
class Cost:
    """What :func:`evaluate` reports for one schedule, topology and size."""

    algo: str
    collective: str
    ranks: int
    topology: str
    size_bytes: float
    steps: int
    bytes_per_rank: float
    time_s: float
    xi: float
    step_time_s: np.ndarray
    byte_term_s: float
    latency_term_s: float

    def as_dict(self) -> dict:
        """JSON-friendly summary (the CLI's ``--json``)."""
        return {"algo": self.algo, "collective": self.collective, "ranks": self.ranks, "topology": self.topology,
                "size_bytes": self.size_bytes, "steps": self.steps, "bytes_per_rank": self.bytes_per_rank,
                "time_s": self.time_s, "xi": self.xi, "byte_term_s": self.byte_term_s,
                "latency_term_s": self.latency_term_s}


def _nodes(schedule: Schedule, topo: Topology) -> np.ndarray:
    """Topology node of every schedule node."""
    if schedule.nranks > topo.nhosts:
        raise ValueError(f"schedule has {schedule.nranks} ranks but {topo.spec} has {topo.nhosts} hosts")
    nodes = np.arange(schedule.nnodes, dtype=np.int64)
    if schedule.nswitches:
        if schedule.placement is None:
            raise ValueError(f"schedule {schedule.name!r} has switch nodes but no placement on a topology")
        nodes[schedule.nranks:] = schedule.placement
    return nodes


def evaluate(schedule: Schedule, topo: Topology, size_bytes: float, *, repeat: int = 1) -> Cost:
    """Cost of ``schedule`` on ``topo`` when the collective's size is ``size_bytes``.

    ``repeat``: the schedule runs that many times in a row (a schedule in
    closed form such as :func:`~inagg.host.schedules.allreduce.ring_round`);
    steps, bytes and times are multiplied, Xi is unchanged.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"evaluate needs a Schedule, not {type(schedule).__name__}")
    if not isinstance(topo, Topology):
        raise TypeError(f"evaluate needs a Topology, not {type(topo).__name__}")
    if not np.isscalar(size_bytes) or size_bytes < 0:
        raise ValueError(f"size_bytes must be a non-negative number, not {size_bytes!r}")
    if not isinstance(repeat, (int, np.integer)) or isinstance(repeat, bool) or repeat < 1:
        raise ValueError(f"repeat must be a positive integer, not {repeat!r}")
    nodes = _nodes(schedule, topo)
    per_chunk = float(size_bytes) / schedule.size_chunks if schedule.size_chunks else 0.0
    if schedule.nswitches == 0 and schedule.only_transfers:
        # GPU ranks only, all transfers (the large schedules): the schedule's own grouping, which
        # check_symbolic shares, and no copy of the columns
        groups = [rows for _, rows in schedule.rows_by_step()]
        # chunks sent per node, summed step by step while the step's rows are at hand (exact: integers)
        sent_chunks = np.zeros(schedule.nnodes)
    else:
        xfer = np.flatnonzero(schedule.is_transfer)
        # transfers between two nodes mapped onto the same topology node (none in practice) are free
        xfer = xfer[nodes[schedule.src[xfer]] != nodes[schedule.dst[xfer]]]
        # one step at a time: memory stays at one step's transfers, whatever the schedule's length
        order, _, bounds = group_steps(schedule.step[xfer])
        order = xfer[order]
        groups = [order[a:b] for a, b in zip(bounds.tolist(), bounds[1:].tolist())]
        sent_chunks = None
    steps = len(groups)
    times = np.zeros(steps)
    byte_terms = np.zeros(steps)
    ideal_terms = np.zeros(steps)
    for i, rows in enumerate(groups):
        src, count = schedule.src[rows], schedule.count[rows]
        if sent_chunks is not None:
            sent_chunks += np.bincount(src, weights=count, minlength=schedule.nnodes)
        c = topo.step_cost(nodes[src], nodes[schedule.dst[rows]], count * per_chunk)
        times[i] = (topo.endpoint_alpha + c.alpha_path + c.wait).max()
        byte_terms[i] = c.byte_term
        ideal_terms[i] = c.ideal_term
    if repeat > 1:
        times, byte_terms, ideal_terms = (np.tile(x, repeat) for x in (times, byte_terms, ideal_terms))
    sent = schedule.bytes_sent(size_bytes) if sent_chunks is None else sent_chunks * per_chunk
    sent = sent[:schedule.nranks] * repeat
    byte_total = float(byte_terms.sum())
    ideal = float(ideal_terms.sum())
    return Cost(
        algo=schedule.name, collective=schedule.collective.value, ranks=schedule.nranks, topology=topo.spec,
        size_bytes=float(size_bytes), steps=int(schedule.num_steps) * repeat,
        bytes_per_rank=float(sent.max()) if len(sent) else 0.0,
        time_s=float(times.sum()), xi=byte_total / ideal if ideal > 0 else 1.0, step_time_s=times,
        byte_term_s=byte_total, latency_term_s=float(times.sum()) - byte_total,
    )


def allreduce_lower_bound(nranks: int, size_bytes: float) -> float:
    """Bytes every rank must send (and receive) in an endpoint all-reduce: 2 (n-1)/n S."""
    return 2.0 * (nranks - 1) / nranks * size_bytes


def ina_lower_bound(nranks: int, size_bytes: float) -> float:
    """With in-network aggregation a rank sends its vector once and receives the sum once: S per direction
    (the (n-1)/n factor of the endpoint bound disappears with the second pass)."""
    return float(size_bytes)

"""Replay what the RTL saw into the model switch, in the order the RTL's slot engine took it.

Frames travel from each port to the slot engine in order, but the engine
merges the ports in an order that depends on timing. The RTL reports that
order (the port of every contribution its engine takes); :func:`replay`
feeds each port's frames to :class:`~inagg.models.switch.ModelSwitch` in
that merged order. Which frames the engine takes is the model's own
decision: a frame reached the engine when one of the slot-rule counters
moved.
"""

from __future__ import annotations

from collections import deque

from ..models.protocol import Counter
from ..models.switch import ModelSwitch

__all__ = ["ENGINE_COUNTERS", "replay"]

ENGINE_COUNTERS = (Counter.RX_CONTRIB, Counter.DUP_CONTRIB, Counter.DROP_STALE, Counter.DROP_WINDOW,
                   Counter.DROP_COLLISION, Counter.EXC_REFUSED)


def _reached_engine(model: ModelSwitch, port: int, frame: bytes, out: dict[int, list[bytes]]) -> bool:
    before = [model.counters[c] for c in ENGINE_COUNTERS]
    for p, f in model.receive(port, frame):
        out[p].append(f)
    return [model.counters[c] for c in ENGINE_COUNTERS] != before


def replay(model: ModelSwitch, sent: dict[int, list[bytes]], order: list[int]) -> dict[int, list[bytes]]:
    """Feed ``sent`` (frames per port, in sending order) to ``model`` as the RTL's ``order`` merged them.

    Returns the frames the model sends, per port. Raises ``AssertionError``
    when the order cannot be the RTL's: it names a port that has no frame
    left the model would take, or frames that the model would take are left
    over.
    """
    queues = {p: deque(frames) for p, frames in sent.items()}
    out: dict[int, list[bytes]] = {p: [] for p in range(model.spec.ports)}
    for n, port in enumerate(order):
        q = queues.get(port, deque())
        while True:
            if not q:
                raise AssertionError(f"the RTL's contribution #{n} came from port {port}, "
                                     "where the model finds none left")
            if _reached_engine(model, port, q.popleft(), out):
                break
    for port, q in queues.items():
        for frame in q:
            if _reached_engine(model, port, frame, out):
                raise AssertionError(f"the model takes a frame of port {port} that the RTL's engine never took")
    return out

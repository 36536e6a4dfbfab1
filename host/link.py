"""A lossy link: loss, duplication, reordering and bit corruption at given rates, seeded.

Every transport puts one between the workers and the switch (the kernel here
has no netem), so the same faults -- and, for a seed and a frame sequence,
the same fault pattern -- hit the in-memory network and the namespaces.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["Faults", "LossyLink", "HeldFrames", "idle_wait", "clocked_receive"]

_DRAWS = 4096


def _rate(name: str, x: object) -> None:
    if not isinstance(x, (int, float)) or not 0.0 <= x < 1.0:
        raise ValueError(f"{name} rate must be a number in [0, 1), not {x!r}")


@dataclass(frozen=True)
class Faults:
    """Per-frame probabilities of each fault, and how long a reordered frame is held back.

    A frame is lost with probability ``loss``; a frame that survives is
    corrupted (one random bit flipped) with probability ``corrupt``,
    held back by ``reorder_delay`` (so later frames overtake it) with
    probability ``reorder``, and sent twice with probability ``dup``.
    """

    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    reorder_delay: float = 50e-6

    def __post_init__(self) -> None:
        for name in ("loss", "dup", "reorder", "corrupt"):
            _rate(name, getattr(self, name))
        if not isinstance(self.reorder_delay, (int, float)) or not self.reorder_delay > 0:
            raise ValueError(f"reorder_delay must be a positive number, not {self.reorder_delay!r}")

    @property
    def clean(self) -> bool:
        """True when the link never touches a frame."""
        return not (self.loss or self.dup or self.reorder or self.corrupt)


class LossyLink:
    """Applies :class:`Faults` to a stream of frames; ``stats`` counts what it did."""

    def __init__(self, faults: Faults | None = None, seed: int = 0):
        self.faults = faults or Faults()
        self.stats: Tally = Tally()
        self._rng = np.random.default_rng(seed)
        self._u = np.empty((0, 4))
        self._i = 0

    def transmit(self, frame: bytes) -> list[tuple[float, bytes]]:
        """What comes out of the link for ``frame``: (extra delay, frame) pairs, possibly none."""
        f = self.faults
        if f.clean:
            return [(0.0, frame)]
        if self._i == len(self._u):
            self._u, self._i = self._rng.random((_DRAWS, 4)), 0
        u = self._u[self._i]
        self._i += 1
        if u[0] < f.loss:
            self.stats["lost"] += 1
            return []
        if u[1] < f.corrupt:
            self.stats["corrupted"] += 1
            b = bytearray(frame)
            bit = int(self._rng.integers(8 * len(b)))
            b[bit >> 3] ^= 1 << (bit & 7)
            frame = bytes(b)
        delay = 0.0
        if u[2] < f.reorder:
            self.stats["reordered"] += 1
            delay = f.reorder_delay
        if u[3] < f.dup:
            self.stats["duplicated"] += 1
            return [(delay, frame), (delay, frame)]
        return [(delay, frame)]


class HeldFrames:
    """Frames a lossy link holds back in real time, until their delay has passed.

    The real-time transports (threads, the switch service, the switch
    process in a namespace, the RTL bridge's TAP ports) put here what
    :meth:`LossyLink.transmit` delays, and release what is due between polls;
    the in-memory network keeps virtual time instead.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, bytes]] = []
        self._seq = 0  # equal deadlines leave in the order they were held

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, delay: float, direction: int, port: int, frame: bytes) -> None:
        """Keep ``frame`` (going ``direction`` on ``port``) for ``delay`` seconds."""
        self._seq += 1
        heapq.heappush(self._heap, (time.monotonic() + delay, self._seq, direction, port, frame))

    def cross(self, link: LossyLink, direction: int, port: int, frame: bytes,
              arrive: Callable[[int, int, bytes], None]) -> None:
        """Send ``frame`` through ``link``: hold the copies it delays, hand the others to ``arrive`` now.

        ``arrive(direction, port, frame)`` is what the transport does with a
        frame that reached the far end; the held copies reach it later
        through :meth:`due`.
        """
        for delay, f in link.transmit(frame):
            if delay:
                self.hold(delay, direction, port, f)
            else:
                arrive(direction, port, f)

    def wait(self, cap: float, now: float | None = None) -> float:
        """Seconds until the next frame is due (0 when one is), at most ``cap``."""
        if not self._heap:
            return cap
        now = time.monotonic() if now is None else now
        return max(0.0, min(cap, self._heap[0][0] - now))

    def due(self, now: float | None = None) -> Iterator[tuple[int, int, bytes]]:
        """Pop (direction, port, frame) of every frame due at ``now``, in due order.

        Frames held while the iteration runs are released by it too when they
        are due already.
        """
        now = time.monotonic() if now is None else now
        while self._heap and self._heap[0][0] <= now:
            _, _, direction, port, frame = heapq.heappop(self._heap)
            yield direction, port, frame


def idle_wait(held: HeldFrames, switch, cap: float, now: float) -> float:
    """Seconds a real-time transport may sleep at ``now``: until ``held``'s next frame is due or ``switch``'s
    own timer runs out (:attr:`~inagg.models.backend.DataPlane.deadline`: Mode III's hop timers, Mode I's
    result retransmission), at most ``cap``; then it calls ``switch.on_timer``."""
    d = switch.deadline
    return held.wait(cap if d is None else max(0.0, min(cap, d - now)), now)


def clocked_receive(switch, port: int, frame: bytes) -> list[tuple[int, bytes]]:
    """What ``switch`` sends when ``frame`` reaches ``port`` now, on :func:`time.monotonic`: first what its
    own timers due by now send (a switch with a clock is told the time before every frame), then its
    answer to the frame."""
    return switch.on_timer(time.monotonic()) + switch.receive(port, frame)

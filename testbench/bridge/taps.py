"""The netns transport on the RTL: each switch port a TAP device in a worker's namespace.

:func:`serve_taps` is :func:`inagg.host.netns.serve_switch` with the model
switch replaced by a :class:`~inagg.testbench.bridge.bridge.FrameBridge`:
frames that workers send into their ``eth0`` come out of the port's
:class:`~inagg.host.tap.TapPort` and go into the RTL, the RTL's results go
back the same way, and the :class:`~inagg.host.link.LossyLink` sits on both
directions (frames it holds back are released in real time). The workers
are unmodified :mod:`inagg.host` processes on the real clock; simulated
time only advances while frames are in the switch: with nothing to do the
loop waits for the TAP devices instead of simulating idle cycles.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Mapping

from inagg.host.link import Faults, HeldFrames, LossyLink
from inagg.host.tap import TapPort
from inagg.testbench.bridge.bridge import FrameBridge
from inagg.testbench.bridge.compare import LiveCompare

__all__ = ["serve_taps"]

# Simulated wakes without a frame anywhere before the loop waits on the TAP devices instead.
_QUIET_WAKES = 4
_POLL = 0.05  # seconds of the longest wait on the TAP devices (the stop check runs this often)


async def serve_taps(bridge: FrameBridge, taps: Mapping[int, TapPort], *, stop: Callable[[], bool],
                     faults: Faults | None = None, seed: int = 0,
                     capture: Callable[[float, bytes], None] | None = None,
                     compare: LiveCompare | None = None, progress: Callable[[int], None] | None = None) -> dict:
    """Serve the RTL on ``taps`` (by switch port) until ``stop()`` is true; returns the link's fault counts.

    ``stop`` is looked at whenever the switch has nothing to do;
    ``progress(n)`` is called after every wake that brought frames out of
    the switch, with the number of frames it sent so far.
    """
    link = LossyLink(faults, seed)
    held = HeldFrames()
    bridge.record_order = compare is not None
    fds = {tap.fileno(): port for port, tap in taps.items()}

    def cross(direction: int, port: int, frame: bytes) -> None:
        if capture is not None:
            capture(time.time(), frame)
        held.cross(link, direction, port, frame, arrive)

    def arrive(direction: int, port: int, frame: bytes) -> None:
        if direction == 1:
            taps[port].send(frame)
        elif bridge.send(port, frame) and compare is not None:
            compare.sent(port, frame)

    def take(port: int) -> None:
        while (frame := taps[port].recv_nowait()) is not None:
            cross(0, port, frame)

    quiet = sent = 0
    while True:
        got = bridge.pull()
        if got and progress is not None:
            sent += len(got)
            progress(sent)
        if compare is not None and bridge.order:
            compare.taken(bridge.order)
            bridge.order.clear()
        for port, frame in got:
            if compare is not None:
                compare.received(port, frame)
            cross(1, port, frame)
        for port in taps:
            take(port)
        now = time.monotonic()
        for direction, port, frame in held.due(now):
            arrive(direction, port, frame)
        bridge.push()
        quiet = 0 if got or not bridge.idle else quiet + 1
        if quiet < _QUIET_WAKES:
            await bridge.wait(bridge.flush_cycles)
            continue
        if stop():
            return dict(link.stats)
        wait = held.wait(_POLL, now)
        for fd in select.select(list(fds), [], [], wait)[0]:
            take(fds[fd])

"""Ingress arbiter: the ports' accepted contributions, whole frames at a time, into one slot pipeline."""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from inagg.hdl.axis import check_width
from inagg.hdl.ingress import frame_signature

__all__ = ["FrameArbiter"]


class FrameArbiter(wiring.Component):
    """Round-robin merge of frame streams that switches ports without an idle cycle.

    The choice among the waiting ports is combinational when no frame is in
    progress, so the cycle after a frame's last beat already carries the
    next port's first beat. Once a beat is offered the choice holds until
    the frame's last beat is taken, as the stream rules require.

    Parameters
    ----------
    width, slots:
        Of the frame streams (:func:`~inagg.hdl.ingress.frame_signature`): ``slots``
        slot numbers, 2 to 131072 (the direct-mapped slots and any overflow slots).
    ports:
        Number of inputs.

    Members
    -------
    i : In(frame_signature(width, slots)).array(ports)
    o : Out(frame_signature(width, slots))
    grant : Out(range(ports))
        The input ``o`` carries (observability for testbenches: the order in
        which frames reach the slot engine).
    """

    def __init__(self, width: int, slots: int, ports: int):
        check_width(width)
        if not isinstance(slots, int) or isinstance(slots, bool) or not 2 <= slots <= 1 << 17:
            raise ValueError(f"Slot numbers must be an integer in 2..131072, not {slots!r}")
        if not isinstance(ports, int) or not 1 <= ports <= 256:
            raise ValueError(f"Port count must be an integer in 1..256, not {ports!r}")
        self._ports = ports
        sig = frame_signature(width, slots)
        super().__init__({"i": In(sig).array(ports), "o": Out(sig), "grant": Out(range(ports))})

    def elaborate(self, platform):
        m = Module()
        n = self._ports
        held = Signal()
        grant = Signal(range(n))
        after = Signal(range(n))  # round-robin: the search starts here
        choice = Signal(range(n))
        for start in range(n):
            with m.If(after == start):
                for k in reversed(range(n)):
                    with m.If(self.i[(start + k) % n].valid):
                        m.d.comb += choice.eq((start + k) % n)
        sel = Signal(range(n))
        m.d.comb += [sel.eq(choice), self.grant.eq(sel)]
        with m.If(held):
            m.d.comb += sel.eq(grant)
        with m.Switch(sel):
            for k, port in enumerate(self.i):
                with m.Case(k):
                    m.d.comb += [self.o.valid.eq(port.valid), self.o.p.eq(port.p), port.ready.eq(self.o.ready)]
        with m.If(self.o.valid):
            done = self.o.ready & self.o.p.last
            m.d.sync += [held.eq(~done), grant.eq(sel)]
            with m.If(done):
                m.d.sync += after.eq(Mux(sel == n - 1, 0, sel + 1))
        return m

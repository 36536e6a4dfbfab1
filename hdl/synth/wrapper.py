"""A synthesis top that keeps every port of a core alive with three pins.

Synthesis removes logic whose outputs reach no pin, and it simplifies logic
whose inputs are constants. A core such as the switch has thousands of port
bits and no board to wire them to, so :class:`ScanWrapper` gives it:

* a **scan chain** on the inputs: one flip-flop per input bit, shifted one
  place per cycle from the pin ``scan_in``, so every input bit is a distinct
  register that synthesis cannot predict;
* a **MISR** (multiple-input signature register) on the outputs: one
  flip-flop per output bit, ``misr <= rotate(misr) ^ outputs``, whose last
  bit drives the pin ``signature``. Every output bit reaches the pin within
  as many cycles as there are output bits, so nothing can be optimized away,
  and each output bit costs one 2-input XOR, which adds no logic level of
  note behind the core's own output registers.

The wrapper thus costs ``inputs + outputs`` flip-flops (a few fewer when
the last bits of the scan chain feed inputs the core ignores, which
synthesis then removes) and about ``outputs`` LUTs; :func:`wrapper_cost`
says how many for a given core, and the flow also reports each module's
share from a hierarchical synthesis.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Elaboratable, Module, Signal, Value
from amaranth.lib import wiring

__all__ = ["ScanWrapper", "port_bits", "wrapper_cost"]


def port_bits(core: wiring.Component) -> tuple[list, list]:
    """(input values, output values) of every flattened port member of ``core``."""
    ins, outs = [], []
    for _path, member, value in core.signature.flatten(core):
        # Stream payloads are data views; their bits are what the pins see.
        value = Value.cast(value)
        if isinstance(value, Const):  # e.g. the ready of an always-ready stream: not a port at all
            continue
        (ins if member.flow == wiring.In else outs).append(value)
    return ins, outs


def wrapper_cost(core: wiring.Component) -> dict[str, int]:
    """Flip-flops the wrapper adds around ``core``: one per input and one per output bit."""
    ins, outs = port_bits(core)
    n_in = sum(len(v) for v in ins)
    n_out = sum(len(v) for v in outs)
    return {"input_bits": n_in, "output_bits": n_out, "ffs": n_in + n_out}


class ScanWrapper(Elaboratable):
    """Wraps ``core`` (a ``wiring.Component`` in the ``sync`` domain) for a board-free synthesis.

    Parameters
    ----------
    core:
        The component to synthesize.
    scan_in, signature:
        The two data pins (an input and an output ``Signal(1)``); the
        platform build passes its pins here.
    """

    def __init__(self, core: wiring.Component, scan_in: Signal, signature: Signal):
        if not isinstance(core, wiring.Component):
            raise TypeError(f"Core must be a wiring.Component, not {core!r}")
        self.core = core
        self.scan_in = scan_in
        self.signature = signature

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.core = self.core
        ins, outs = port_bits(self.core)
        in_bits = sum(len(v) for v in ins)
        out_bits = sum(len(v) for v in outs)
        if in_bits:
            chain = Signal(in_bits)
            m.d.sync += chain.eq(Cat(self.scan_in, chain[:-1]))
            m.d.comb += Cat(*ins).eq(chain)
        if out_bits:
            misr = Signal(out_bits)
            m.d.sync += misr.eq(Cat(misr[-1], misr[:-1]) ^ Cat(*outs))
            m.d.comb += self.signature.eq(misr[-1])
        return m

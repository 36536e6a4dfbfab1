"""The Mode II aggregation switch: ports, slot engine, result emitters and registers, and its Verilog top.

Data path, one beat of ``width`` bits per cycle on every port::

    s[p] -> IngressPort[p] --\\                          /--> ResultEmitter[p] -> m[p]
                              FrameArbiter -> SlotEngine
    s[q] -> IngressPort[q] --/                          \\--> ResultEmitter[q] -> m[q]

Every port checks and buffers its own frames at line rate; the slot engine
behind the arbiter takes one beat per cycle in total (one ``width``-bit
beat per clock is the switch's aggregate throughput; banking the slots by
index would multiply it). ``docs/rtl.md`` describes each block and the
Verilog ports of :class:`SwitchTop`.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.back import verilog
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..models.protocol import CHUNK_BYTES_DEFAULT, MAX_WORKERS
from .arbiter import FrameArbiter
from .axis import beat_signature, check_chunk_bytes, check_slots, check_width
from .control import AXILiteSignature, Control
from .emitter import ResultEmitter
from .engine import SlotEngine
from .ingress import IngressPort

__all__ = ["check_parameters", "Switch", "SwitchTop", "generate_verilog"]


def check_parameters(*, ports, width, slots, chunk_bytes=CHUNK_BYTES_DEFAULT, jobs=4, workers=8) -> None:
    """Raise ``ValueError`` naming the first parameter of :class:`Switch` that is out of range."""
    if not isinstance(ports, int) or isinstance(ports, bool) or not 1 <= ports <= 64:
        raise ValueError(f"Port count must be an integer in 1..64, not {ports!r}")
    check_width(width)
    check_slots(slots)
    check_chunk_bytes(chunk_bytes)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs <= 64:
        raise ValueError(f"Job count must be an integer in 1..64, not {jobs!r}")
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"Workers per job must be an integer in 1..{MAX_WORKERS}, not {workers!r}")


class Switch(wiring.Component):
    """The Mode II switch (fast path, INT32 lanes).

    Parameters
    ----------
    ports:
        Ethernet ports, 1..64.
    width:
        Beat width in bits: 64, 256 or 512.
    slots:
        Direct-mapped slots, a power of two.
    chunk_bytes:
        Payload bytes of a contribution (``SwitchSpec.chunk_bytes``).
    jobs:
        Jobs the tables hold (job numbers 0..jobs-1), 1..64.
    workers:
        Most workers per job, 1..64.

    Members
    -------
    s : In(beat_signature(width)).array(ports)
        Frames in, per port.
    m : Out(beat_signature(width)).array(ports)
        Result frames out, per port.
    axil : In(AXILiteSignature(addr_width))
        Registers (:mod:`inagg.models.regmap`).
    order : Out(stream.Signature(port_bits, always_ready=True))
        The port of every contribution the slot engine takes, at its first
        beat: the arrival order that decides the switch's behaviour, so a
        testbench can replay it into :class:`~inagg.models.switch.ModelSwitch`.
    """

    def __init__(self, *, ports: int, width: int, slots: int, chunk_bytes: int = CHUNK_BYTES_DEFAULT,
                 jobs: int = 4, workers: int = 8):
        check_parameters(ports=ports, width=width, slots=slots, chunk_bytes=chunk_bytes, jobs=jobs, workers=workers)
        self.ports, self.width, self.slots, self.chunk_bytes = ports, width, slots, chunk_bytes
        self.jobs, self.workers = jobs, workers
        self.control = Control(ports=ports, width=width, slots=slots, chunk_bytes=chunk_bytes, jobs=jobs,
                               workers=workers, job_readers=ports, event_sources=2 * ports + 1)
        self.arbiter = FrameArbiter(width, slots, ports)
        self.engine = SlotEngine(width, chunk_bytes, slots, workers)
        super().__init__({
            "s": In(beat_signature(width)).array(ports),
            "m": Out(beat_signature(width)).array(ports),
            "axil": In(AXILiteSignature(self.control.regmap.addr_width)),
            "order": Out(stream.Signature(self.control.port_bits, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        ctl, arb, eng = self.control, self.arbiter, self.engine
        m.submodules.control = ctl
        m.submodules.arbiter = arb
        m.submodules.engine = eng
        wiring.connect(m, wiring.flipped(self.axil), ctl.axil)
        wiring.connect(m, arb.o, eng.i)
        starting = Signal(init=1)
        with m.If(arb.o.valid & arb.o.ready):
            m.d.sync += starting.eq(arb.o.p.last)
        m.d.comb += [self.order.valid.eq(arb.o.valid & arb.o.ready & starting), self.order.p.eq(arb.grant)]
        m.d.comb += ctl.events[2 * self.ports].eq(eng.events)
        space = []
        for p in range(self.ports):
            ing = IngressPort(self.width, self.chunk_bytes, self.slots)
            emi = ResultEmitter(width=self.width, chunk_bytes=self.chunk_bytes, slots=self.slots, jobs=self.jobs,
                                workers=self.workers, port=p, port_bits=ctl.port_bits)
            m.submodules[f"ingress{p}"] = ing
            m.submodules[f"emitter{p}"] = emi
            wiring.connect(m, wiring.flipped(self.s[p]), ing.i)
            wiring.connect(m, ing.o, arb.i[p])
            wiring.connect(m, ing.job, ctl.job_rd[p])
            wiring.connect(m, emi.o, wiring.flipped(self.m[p]))
            wiring.connect(m, emi.worker, ctl.worker_rd[p])
            m.d.comb += [
                ing.pkey.eq(ctl.switch.pkey), emi.switch.eq(ctl.switch), emi.ports.eq(ctl.ports),
                emi.i.valid.eq(eng.o.valid), emi.i.p.eq(eng.o.p),
                ctl.events[p].eq(ing.events), ctl.events[self.ports + p].eq(emi.events),
            ]
            space.append(emi.space)
        m.d.comb += eng.can_start.eq(Cat(*space).all())
        return m


class SwitchTop(wiring.Component):
    """:class:`Switch` with AXI-Stream and AXI4-Lite port names, for Verilog users.

    Ports ``s{i}_axis_tdata/tkeep/tlast/tvalid/tready`` (frames in),
    ``m{i}_axis_*`` (results out) and ``s_axil_*`` (registers), plus ``clk``
    and the synchronous active-high ``rst``, so that cocotbext-axi's
    ``AxiStreamBus.from_prefix(dut, "s0_axis")`` and
    ``AxiLiteBus.from_prefix(dut, "s_axil")`` connect as is, and
    ``order_valid``/``order_port`` (:attr:`Switch.order`). Takes the
    parameters of :class:`Switch`.
    """

    def __init__(self, **params):
        self.switch = Switch(**params)
        sw = self.switch
        members = {}
        for p in range(sw.ports):
            for d, prefix in ((In, f"s{p}_axis"), (Out, f"m{p}_axis")):
                back = Out if d is In else In
                members.update({f"{prefix}_tdata": d(sw.width), f"{prefix}_tkeep": d(sw.width // 8),
                                f"{prefix}_tlast": d(1), f"{prefix}_tvalid": d(1), f"{prefix}_tready": back(1)})
        for name, member in sw.axil.signature.members.items():
            members[f"s_axil_{name}"] = member
        members.update({"order_valid": Out(1), "order_port": Out(sw.control.port_bits)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = sw = self.switch
        for p in range(sw.ports):
            s, o = sw.s[p], sw.m[p]
            m.d.comb += [
                s.p.data.eq(getattr(self, f"s{p}_axis_tdata")), s.p.keep.eq(getattr(self, f"s{p}_axis_tkeep")),
                s.p.last.eq(getattr(self, f"s{p}_axis_tlast")), s.valid.eq(getattr(self, f"s{p}_axis_tvalid")),
                getattr(self, f"s{p}_axis_tready").eq(s.ready),
                getattr(self, f"m{p}_axis_tdata").eq(o.p.data), getattr(self, f"m{p}_axis_tkeep").eq(o.p.keep),
                getattr(self, f"m{p}_axis_tlast").eq(o.p.last), getattr(self, f"m{p}_axis_tvalid").eq(o.valid),
                o.ready.eq(getattr(self, f"m{p}_axis_tready")),
            ]
        m.d.comb += [self.order_valid.eq(sw.order.valid), self.order_port.eq(sw.order.p)]
        for name, member in sw.axil.signature.members.items():
            mine, theirs = getattr(self, f"s_axil_{name}"), getattr(sw.axil, name)
            if member.flow == Out:
                m.d.comb += mine.eq(theirs)
            else:
                m.d.comb += theirs.eq(mine)
        return m


def generate_verilog(name: str = "inagg_switch", **params) -> str:
    """Verilog of :class:`SwitchTop` with ``params``, as module ``name``."""
    check_parameters(**params)
    return verilog.convert(SwitchTop(**params), name=name, emit_src=False)

"""The aggregation switch: ports, slot engine, result emitters, ACK reflection and registers, and its Verilog top.

Data path, one beat of ``width`` bits per cycle on every port::

    s[p] -> IngressPort[p] --\\                          /--> ResultEmitter[p] --> FrameMux[p] -> m[p]
                              FrameArbiter -> SlotEngine                       AckReflector[p] -/
    s[q] -> IngressPort[q] --/                          \\--> ResultEmitter[q] --> FrameMux[q] -> m[q]
                                                                               AckReflector[q] -/
    IngressPort[p].ack, IngressPort[q].ack -> AckRouter -> AckReflector[p], AckReflector[q]

With a management port ``k`` (``mgmt_port``)::

    s[k] -> IngressPort[k] ...    FrameMux[k] --\\
        \\-> MgmtBridge --------------------------> FrameMux (whole frames) -> m[k]
    axil --> AXILiteArbiter (a) --> Control
             MgmtBridge.bus (b) -/

Every port checks and buffers its own frames at line rate; the slot engine
behind the arbiter takes one beat per cycle in total (one ``width``-bit
beat per clock is the switch's aggregate throughput; banking the slots by
index would multiply it). With an exception path (``exc_table``), a
contribution whose slot another job holds goes through
:class:`~inagg.hdl.divert.Divert` and back into the arbiter, as one more
input, to an overflow slot. A job is UC or Mode II (``docs/protocol.md``
section 6.2, its ``JOB.CTRL`` mode): a Mode II contribution takes the slot
engine's PSN rules, and a host's ACK of a Mode II result leaves its port
for the :class:`~inagg.hdl.reflect.AckRouter`, which takes it to the
reflector of the worker's port; that port's egress merges the reflected
ACKs with the results, whole frames each. A build with Mode III
(``augmented``, section 7) takes Mode III jobs too: the router takes their
hosts' ACKs to the slot engine and the engine's own ACKs and NAKs to the
reflectors, and the results a NAK or a timer asks for come back in through
one more arbiter input (:class:`~inagg.hdl.augmented.ResendFrames`). With a management port, a
:class:`~inagg.hdl.mgmt.MgmtBridge` taps that port's ingress, reaches the
registers beside the external AXI4-Lite manager, and sends its responses
out of the same port between the other frames; the port's ingress still
drops and counts each management frame as not RoCEv2 (``DROP_NON_ROCE``,
``docs/protocol.md`` section 12), as the model switch does. ``docs/rtl.md``
describes each block and the Verilog ports of :class:`SwitchTop`.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.back import verilog
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from inagg.models import regmap as rm
from inagg.models.geometry import SwitchGeometry
from inagg.models.protocol import QPN_JOB_BITS, QPN_WORKER_BITS, Counter
from inagg.hdl.arbiter import FrameArbiter
from inagg.hdl.augmented import ResendFrames
from inagg.hdl.axis import beat_signature
from inagg.hdl.control import AXILiteSignature, Control, MacStats, check_mac_ports, event_vector
from inagg.hdl.divert import Divert
from inagg.hdl.emitter import ResultEmitter
from inagg.hdl.engine import SlotEngine, _delay_line, check_fp32_latencies
from inagg.hdl.ingress import IngressPort
from inagg.hdl.mgmt import AXILiteArbiter, MgmtBridge, check_key
from inagg.hdl.reflect import AckReflector, AckRouter, FrameMux

__all__ = ["check_parameters", "Switch", "SwitchTop", "generate_verilog"]


def check_parameters(*, divert_frames=4, convert_latency=1, add_latency=2, mgmt_port=None, mgmt_key=None,
                     mac_ports=0, **geometry) -> SwitchGeometry:
    """Raise ``ValueError`` naming the first parameter of :class:`Switch` that is out of range.

    ``geometry`` are :meth:`SwitchGeometry.from_params`'s keywords; returns the geometry they make.
    """
    g = SwitchGeometry.from_params(**geometry)
    _check_pipeline(g, divert_frames, convert_latency, add_latency)
    _check_mgmt(g, mgmt_port, mgmt_key)
    check_mac_ports(mac_ports, g.ports)
    return g


def _check_pipeline(geometry: SwitchGeometry, divert_frames, convert_latency, add_latency) -> None:
    """The parameters of the pipeline, not of the geometry: FP32 latencies and the divert queue."""
    check_fp32_latencies(convert_latency, add_latency)
    if geometry.exception is not None and (not isinstance(divert_frames, int) or isinstance(divert_frames, bool)
                                           or not 1 <= divert_frames <= 64):
        raise ValueError(f"Divert queue frames must be an integer from 1 to 64, not {divert_frames!r}")


def _check_mgmt(geometry: SwitchGeometry, mgmt_port, mgmt_key) -> None:
    """The management bridge's port and key: both or neither."""
    if mgmt_port is None:
        if mgmt_key is not None:
            raise ValueError("A management key needs a management port (mgmt_port)")
        return
    if not isinstance(mgmt_port, int) or isinstance(mgmt_port, bool) or not 0 <= mgmt_port < geometry.ports:
        raise ValueError(f"Management port must be an integer in 0..{geometry.ports - 1}, not {mgmt_port!r}")
    check_key(mgmt_key)


class Switch(wiring.Component):
    """The switch of UC and Mode II jobs: INT32 lanes promoted to FP32 on overflow, with an optional cuckoo
    exception path.

    Parameters
    ----------
    geometry : SwitchGeometry
        Ports, beat width, slots, chunk size, job and worker tables and the
        exception path (:class:`~inagg.models.geometry.SwitchGeometry`).
        Instead of one, its fields may be given as keywords
        (:meth:`SwitchGeometry.from_params <inagg.models.geometry.SwitchGeometry.from_params>`:
        ``ports``, ``width``, ``slots``, ``chunk_bytes``, ``jobs``,
        ``workers``, and ``exc_table`` (0: no exception path),
        ``exc_max_kicks``, ``exc_stash``).
    divert_frames:
        Frames the exception path's queue holds, 1..64.
    convert_latency, add_latency:
        Cycles of each lane's INT32 -> FP32 converter (1..4) and FP32 adder
        (1..6) in the slot engine (:class:`~inagg.hdl.engine.SlotEngine`).
    mgmt_port:
        The port whose management frames (``docs/protocol.md`` section 12)
        reach the registers through a :class:`~inagg.hdl.mgmt.MgmtBridge`;
        None (the default): no bridge, the registers on :attr:`axil` alone.
    mgmt_key:
        The bridge's 16-byte key, a constant of the bitstream; given exactly
        when ``mgmt_port`` is.
    mac_ports:
        Ports ``0 .. mac_ports - 1`` are behind an Ethernet MAC
        (:class:`~inagg.hdl.mac.MAC`) whose counters :attr:`mac_stats` takes
        into the register map (``MAC_BASE``); 0 (the default): none.

    Members
    -------
    s : In(beat_signature(width)).array(ports)
        Frames in, per port.
    m : Out(beat_signature(width)).array(ports)
        Result frames out, per port.
    axil : In(AXILiteSignature(addr_width))
        Registers (:mod:`inagg.models.regmap`).
    order : Out(stream.Signature(order_layout, always_ready=True))
        Every contribution the slot engine takes, in step with its slot-rule
        strobes (:attr:`~inagg.hdl.engine.SlotEngine.strobe_lag` cycles after
        its first beat): ``port`` it came from (``ports``: the exception path, sending
        back the oldest diverted frame; after it, with Mode III, :class:`~inagg.hdl.augmented.ResendFrames`,
        a result sent again) and whether it ``diverted``. With
        :attr:`refused` this is the order that decides the switch's
        behaviour, so a testbench can replay it into
        :class:`~inagg.models.switch.ModelSwitch` (``testbench.replay``).
        ``gone``: its job was torn down after the frame passed its port's
        checks, and the engine dropped it as the model's port checks then do
        (``DROP_UNKNOWN_QPN``; a Mode II or III frame ``DROP_BAD_OPCODE``).
    refused : Out(1)
        The oldest diverted frame was refused (``EXC_REFUSED``) and dropped;
        in a cycle that also reports :attr:`order`, after it.
    torn : Out(1)
        A teardown (the ``TEARDOWN`` register) takes effect: every contribution
        :attr:`order` reported before is the job's last, every later one finds
        the job gone. Strobes in a cycle with no :attr:`order`.
    hop : Out(stream.Signature(hop layout, always_ready=True))
        With Mode III: where an ACK of results from ``port`` (``ack``) or a
        child's ACK timer (``timer``: of ``job``, ``worker``) took effect, on
        the clock of :attr:`order`, before the contribution :attr:`order`
        reports in the same cycle; ``gone``: the ACK's job was torn down after
        its port's checks, and it was dropped (``DROP_BAD_OPCODE``). A frame of
        :class:`~inagg.hdl.augmented.ResendFrames` on :attr:`order` is
        ``gone`` when it sent nothing (every child had ACKed that result by
        then, or its job was torn down).
    mac_stats : In(MacStats).array(mac_ports)
        With ``mac_ports`` only: the counters of the MAC on each of those ports, in the ``sync`` domain.

    Attributes
    ----------
    geometry : SwitchGeometry
    exception : ExceptionSpec or None
        The exception path.
    mgmt : MgmtBridge or None
        The management bridge (``mgmt_port``).
    augmented : bool
        The build takes Mode III jobs (``geometry.augmented``).
    resend : ResendFrames or None
        With Mode III: the results a NAK or a timer asks for, as frames for the arbiter.
    space : int
        Slot numbers of the slot engine: ``slots`` direct-mapped ones, then
        ``exception.capacity`` overflow slots.
    """

    def __init__(self, geometry: SwitchGeometry | None = None, *, divert_frames: int = 4, convert_latency: int = 1,
                 add_latency: int = 2, mgmt_port: int | None = None, mgmt_key: bytes | None = None, mac_ports: int = 0,
                 **params):
        if geometry is None:
            geometry = SwitchGeometry.from_params(**params)
        elif params or not isinstance(geometry, SwitchGeometry):
            raise TypeError(f"Switch takes a SwitchGeometry or its keywords, not {geometry!r} and {sorted(params)}")
        _check_pipeline(geometry, divert_frames, convert_latency, add_latency)
        _check_mgmt(geometry, mgmt_port, mgmt_key)
        check_mac_ports(mac_ports, geometry.ports)
        self.mgmt_port = mgmt_port
        self.geometry = geometry
        self.ports, self.width, self.slots, self.chunk_bytes = ports, width, slots, chunk_bytes = (
            geometry.ports, geometry.width, geometry.slots, geometry.chunk_bytes)
        self.jobs, self.workers = jobs, workers = geometry.jobs, geometry.workers
        self.exception = geometry.exception
        self.space = space = geometry.space
        self.augmented = geometry.augmented
        # The arbiter's inputs: the ports, the exception path's way back, Mode III's results sent again.
        self._resend_input = ports + (self.exception is not None)
        inputs = self._resend_input + self.augmented
        # Event sources: the ingress ports, the emitters, the engine, the exception path, the reflectors,
        # Mode III's ACKs of a job torn down on their way.
        self._reflect_events = 2 * ports + 1 + (self.exception is not None)
        self.control = Control(geometry, job_readers=ports, event_sources=self._reflect_events + ports + self.augmented,
                               worker_readers=2 * ports, mgmt=mgmt_port is not None, mac_ports=mac_ports)
        addr_width = self.control.regmap.addr_width
        self.mgmt = None if mgmt_port is None else MgmtBridge(width=width, key=mgmt_key, addr_width=addr_width)
        self.arbiter = FrameArbiter(width, space, inputs)
        self.engine = SlotEngine(width, chunk_bytes, slots, workers, overflow=space - slots,
                                 convert_latency=convert_latency, add_latency=add_latency, psn_jobs=jobs,
                                 augmented=self.augmented)
        self.resend = ResendFrames(width, chunk_bytes, space) if self.augmented else None
        self.divert = None if self.exception is None else Divert(
            width=width, chunk_bytes=chunk_bytes, slots=slots, space=space, jobs=jobs, exception=self.exception,
            frames=divert_frames)
        order = data.StructLayout({"port": range(inputs), "diverted": 1, "gone": 1})
        hop = data.StructLayout({"ack": 1, "timer": 1, "port": range(ports), "job": QPN_JOB_BITS,
                                 "worker": QPN_WORKER_BITS, "gone": 1})
        super().__init__({
            **({"hop": Out(stream.Signature(hop, always_ready=True))} if self.augmented else {}),
            "s": In(beat_signature(width)).array(ports),
            "m": Out(beat_signature(width)).array(ports),
            "axil": In(AXILiteSignature(addr_width)),
            "order": Out(stream.Signature(order, always_ready=True)),
            "refused": Out(1),
            "torn": Out(1),
            **({"mac_stats": In(MacStats).array(mac_ports)} if mac_ports else {}),
        })

    def elaborate(self, platform):
        m = Module()
        ctl, arb, eng = self.control, self.arbiter, self.engine
        m.submodules.control = ctl
        m.submodules.arbiter = arb
        m.submodules.engine = eng
        if self.mgmt is None:
            wiring.connect(m, wiring.flipped(self.axil), ctl.axil)
        else:
            # The external manager first: the bridge serves one request at a time, a host waits for each.
            m.submodules.mgmt = bridge = self.mgmt
            m.submodules.mgmt_bus = bus = AXILiteArbiter(ctl.regmap.addr_width)
            wiring.connect(m, wiring.flipped(self.axil), bus.a)
            wiring.connect(m, bridge.bus, bus.b)
            wiring.connect(m, bus.o, ctl.axil)
            m.d.comb += [bridge.mac.eq(ctl.switch.mac), ctl.mgmt_stats.eq(bridge.stats)]
        if ctl.mac_ports:
            m.d.comb += [mine.eq(theirs) for mine, theirs in zip(ctl.mac_stats, self.mac_stats)]
        wiring.connect(m, arb.o, eng.i)
        taken = arb.o.valid & arb.o.ready
        starting = Signal(init=1)
        with m.If(taken):
            m.d.sync += starting.eq(arb.o.p.last)
        gone = ~ctl.enabled.bit_select(arb.o.p.desc.job, 1)
        m.d.comb += eng.gone.eq(gone)
        # Reported in step with the engine's slot-rule strobes, where the collision strobe is.
        layout = data.StructLayout({"valid": 1, "port": len(arb.grant), "gone": 1})
        order = Signal(layout)
        m.d.comb += [order.valid.eq(taken & starting), order.port.eq(arb.grant), order.gone.eq(gone)]
        order = _delay_line(m, order, layout, eng.strobe_lag, "order", reset_less=False)[-1]
        order_gone = order.gone
        if self.augmented:
            # A frame of ResendFrames is ``gone`` when it sent nothing: every child, the one it was for too,
            # had ACKed the result by then and the slot holds another one.
            again = eng.events[list(Counter).index(Counter.HOP_RESENDS)]
            order_gone = Mux(order.port == self._resend_input, ~again, order.gone)
        m.d.comb += [self.order.valid.eq(order.valid), self.order.p.port.eq(order.port),
                     self.order.p.gone.eq(order_gone)]
        collide = eng.events[list(Counter).index(Counter.DROP_COLLISION)]
        events = eng.events
        room = Signal(init=1)
        if self.divert is not None:
            m.submodules.divert = div = self.divert
            wiring.connect(m, div.o, arb.i[self.ports])
            m.d.comb += [div.taken.eq(eng.passing_valid), div.beat.eq(eng.passing), div.collide.eq(collide),
                         self.order.p.diverted.eq(collide), self.refused.eq(div.refused), ctl.exc_stats.eq(div.stats),
                         ctl.events[2 * self.ports + 1].eq(event_vector({Counter.EXC_INSERTS: div.inserted,
                                                                          Counter.EXC_REFUSED: div.refused}))]
            # A diverted frame is not dropped: the model counts no collision when it has an exception path.
            events = Cat(*[0 if c is Counter.DROP_COLLISION else eng.events[i] for i, c in enumerate(Counter)])
            # Admission is at the arbiter's inputs, not at the engine: the arbiter holds a frame it has
            # offered until it is taken, so a port's frame held back in front of a full queue would keep
            # the way back (another input) out for good. A port offers a first beat only while the queue
            # has room, which cannot fall before that frame starts (only a frame that started diverts);
            # the rest of a started frame always goes on.
            m.d.comb += room.eq(div.room)
        m.d.comb += ctl.events[2 * self.ports].eq(events)
        ports_idle = Signal()  # no port is inside a frame at the arbiter's input
        # Mode III: no ACK or timer of results is taking effect, so none can straddle the teardown.
        hops_idle = eng.acks.idle if self.augmented else Const(1)
        stop = self._teardown(m, taken, starting, ports_idle & hops_idle)
        m.submodules.acks = router = AckRouter(ports=self.ports, jobs=self.jobs, workers=self.workers,
                                               port_bits=ctl.port_bits, engine=self.augmented)
        m.d.comb += router.ports_of.eq(ctl.ports)
        if self.augmented:
            # Mode III: the children's ACKs of results to the engine, its answers to the children's ports, and
            # the results a NAK or a timer asks for back in through the arbiter. A teardown holds the ACKs
            # and timers once none is taking effect (the resends asked for until then go in first); the
            # results asked for and not yet sent are held like a port's frames, and an ACK whose job it
            # removed is dropped as the model's port checks drop it.
            m.submodules.resend = again = self.resend
            wiring.connect(m, eng.reply, router.own)
            ra = eng.result_ack
            m.d.comb += [ra.valid.eq(router.engine.valid), router.engine.ready.eq(ra.ready),
                         *[getattr(ra.p, f).eq(getattr(router.engine.p, f)) for f in ("job", "worker", "psn", "syndrome")],
                         ra.p.gone.eq(~ctl.enabled.bit_select(router.engine.p.job, 1)),
                         eng.hop_timeout.eq(ctl.hop_timeout), eng.acks.hold.eq(stop),
                         ctl.events[self._reflect_events + self.ports].eq(
                             event_vector({Counter.DROP_BAD_OPCODE: eng.acks.took & eng.acks.dropped}))]
            wiring.connect(m, eng.resend, again.i)
            acks, ack_port = eng.acks, Signal.like(router.engine_from)
            with m.If(router.engine.valid & router.engine.ready):
                m.d.sync += ack_port.eq(router.engine_from)
            m.d.comb += [self.hop.valid.eq(acks.took | acks.expired), self.hop.p.ack.eq(acks.took),
                         self.hop.p.gone.eq(acks.dropped),
                         self.hop.p.timer.eq(acks.expired), self.hop.p.port.eq(ack_port),
                         self.hop.p.job.eq(acks.expired_job), self.hop.p.worker.eq(acks.expired_worker)]
            src, dst = again.o, arb.i[self._resend_input]
            resending = Signal()  # inside a frame of ResendFrames
            with m.If(src.valid & src.ready):
                m.d.sync += resending.eq(~src.p.last)
            admit = resending | ~stop | ~hops_idle
            m.d.comb += [dst.valid.eq(src.valid & admit), src.ready.eq(dst.ready & admit), dst.p.eq(src.p)]
        space, insides = [], []
        for p in range(self.ports):
            ing = IngressPort(self.width, self.chunk_bytes, self.slots, p)
            emi = ResultEmitter(width=self.width, chunk_bytes=self.chunk_bytes, slots=self.slots, jobs=self.jobs,
                                workers=self.workers, port=p, port_bits=ctl.port_bits)
            m.submodules[f"ingress{p}"] = ing
            m.submodules[f"emitter{p}"] = emi
            wiring.connect(m, wiring.flipped(self.s[p]), ing.i)
            # Field by field: the arbiter's slot numbers include the overflow slots.
            src, dst = ing.o, arb.i[p]
            inside = Signal(name=f"inside{p}")
            with m.If(src.valid & src.ready):
                m.d.sync += inside.eq(~src.p.last)
            admit = inside | (room & ~stop)
            insides.append(inside)
            m.d.comb += [dst.valid.eq(src.valid & admit), src.ready.eq(dst.ready & admit), dst.p.data.eq(src.p.data),
                         dst.p.last.eq(src.p.last)]
            m.d.comb += [getattr(dst.p.desc, name).eq(getattr(src.p.desc, name))
                         for name in src.p.desc.shape().members]
            wiring.connect(m, ing.job, ctl.job_rd[p])
            wiring.connect(m, ing.worker, ctl.contrib_rd[p])
            wiring.connect(m, emi.worker, ctl.worker_rd[p])
            # Mode II: the port's checked ACKs to the router, its workers' ACKs back out between its results.
            ref = AckReflector(width=self.width, workers=self.workers)
            mux = FrameMux(self.width)
            m.submodules[f"reflector{p}"] = ref
            m.submodules[f"egress{p}"] = mux
            wiring.connect(m, ing.ack, router.i[p])
            wiring.connect(m, router.o[p], ref.i)
            wiring.connect(m, ref.worker, ctl.worker_rd[self.ports + p])
            wiring.connect(m, emi.o, mux.a)
            wiring.connect(m, ref.o, mux.b)
            if p == self.mgmt_port:
                # A tap: the bridge sees every beat the port takes and never holds the port back, so a
                # data frame beside management frames goes on as on any port.
                m.d.comb += [self.mgmt.i.valid.eq(self.s[p].valid & self.s[p].ready), self.mgmt.i.p.eq(self.s[p].p)]
                out = FrameMux(self.width)
                m.submodules[f"mgmt_egress{p}"] = out
                wiring.connect(m, mux.o, out.a)
                wiring.connect(m, self.mgmt.o, out.b)
                mux = out
            wiring.connect(m, mux.o, wiring.flipped(self.m[p]))
            m.d.comb += [ing.ack_room.eq(router.room[p]), ref.switch.eq(ctl.switch),
                         ctl.events[self._reflect_events + p].eq(ref.events)]
            m.d.comb += [
                ing.pkey.eq(ctl.switch.pkey), emi.switch.eq(ctl.switch), emi.ports.eq(ctl.ports),
                emi.i.valid.eq(eng.o.valid), emi.i.p.eq(eng.o.p),
                ctl.events[p].eq(ing.events), ctl.events[self.ports + p].eq(emi.events),
            ]
            space.append(emi.space)
        if self.augmented:
            insides.append(resending)
        m.d.comb += [eng.can_start.eq(Cat(*space).all()), ports_idle.eq(~Cat(*insides).any())]
        return m

    def _teardown(self, m, taken, starting, ports_idle):
        """The teardown sequencer; returns the signal that holds new frames at the ports.

        ``ModelSwitch.remove_job`` is one step between two frames, so the
        switch makes it one: new frames wait at the ports, every frame
        inside the switch (diverted ones included) finishes as if the job
        were still there, and then, with nothing in the pipeline before
        stage W, the job's slots are checked, its enable bit cleared, its
        fast slots and overflow slots cleared and its keys deleted.
        """
        ctl, eng, div = self.control, self.engine, self.divert
        td = ctl.teardown
        stop = Signal()
        # From registers only (the sweep's start lowers the engine's ready, which `taken` depends
        # on). With the ports held, none inside a frame and the divert queue empty, nothing can be
        # offered to the arbiter, so nothing is taken this cycle either.
        was_taken = Signal()
        m.d.sync += was_taken.eq(taken)
        quiet = ~was_taken & starting & ports_idle
        if div is not None:
            quiet &= div.idle
            m.d.comb += [div.teardown_job.eq(td.job), div.teardown_slots.eq(td.slots)]
        engine_done = Signal()  # the exception engine answered the TEARDOWN
        if div is not None:
            with m.If(div.teardown_done):
                m.d.sync += engine_done.eq(1)
        m.d.comb += [eng.sweep.job.eq(td.job), eng.sweep.first.eq(td.slot_base), eng.sweep.count.eq(td.slots)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(td.start):
                    m.next = "STOP"
            with m.State("STOP"):
                # Only while no port's first beat waits at the arbiter: one held back there
                # would keep the arbiter, and with it the diverted frames' way back, for good.
                arb = self.arbiter
                with m.If(~(arb.o.valid & ~arb.o.ready)):
                    m.d.sync += [stop.eq(1), engine_done.eq(div is None)]
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(quiet):
                    m.d.comb += [eng.sweep.start.eq(1), eng.sweep.check.eq(1)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(~eng.sweep_busy & eng.sweep_hazard):
                    m.d.comb += [ctl.teardown_done.eq(1), ctl.teardown_refused.eq(1)]
                    m.d.sync += stop.eq(0)
                    m.next = "IDLE"
                with m.Elif(~eng.sweep_busy):
                    m.d.comb += [ctl.teardown_disable.eq(1), self.torn.eq(1), eng.sweep.start.eq(1),
                                 eng.psn_clear.eq(1)]
                    if div is not None:
                        m.d.comb += div.teardown.eq(1)
                    m.next = "FAST"
            with m.State("FAST"):
                with m.If(~eng.sweep_busy):
                    if div is not None:
                        m.d.comb += [eng.sweep.start.eq(1), eng.sweep.first.eq(self.slots),
                                     eng.sweep.count.eq(self.space - self.slots)]
                    m.next = "OVERFLOW"
            with m.State("OVERFLOW"):
                with m.If(~eng.sweep_busy & engine_done):
                    m.d.comb += ctl.teardown_done.eq(1)
                    m.d.sync += stop.eq(0)
                    m.next = "IDLE"
        return stop


class SwitchTop(wiring.Component):
    """:class:`Switch` with AXI-Stream and AXI4-Lite port names, for Verilog users.

    Ports ``s{i}_axis_tdata/tkeep/tlast/tvalid/tready`` (frames in),
    ``m{i}_axis_*`` (results out) and ``s_axil_*`` (registers), plus ``clk``
    and the synchronous active-high ``rst``, so that cocotbext-axi's
    ``AxiStreamBus.from_prefix(dut, "s0_axis")`` and
    ``AxiLiteBus.from_prefix(dut, "s_axil")`` connect as is, and
    ``order_valid``/``order_port``/``order_diverted``/``order_gone``
    (:attr:`Switch.order`), ``order_refused`` (:attr:`Switch.refused`) and
    ``order_teardown`` (:attr:`Switch.torn`); with Mode III ``hop_valid``,
    ``hop_<field>`` for each field of :attr:`Switch.hop`
    (ack, timer, port, job, worker, gone); with ``mac_ports``, inputs
    ``mac{p}_<counter>`` (32 bits, :data:`~inagg.models.regmap.MAC_STATS`) for
    each of those ports (:attr:`Switch.mac_stats`). Takes the parameters of
    :class:`Switch` (a geometry or its keywords).
    """

    def __init__(self, geometry: SwitchGeometry | None = None, **params):
        self.switch = Switch(geometry, **params)
        sw = self.switch
        members = {}
        for p in range(sw.ports):
            for d, prefix in ((In, f"s{p}_axis"), (Out, f"m{p}_axis")):
                back = Out if d is In else In
                members.update({f"{prefix}_tdata": d(sw.width), f"{prefix}_tkeep": d(sw.width // 8),
                                f"{prefix}_tlast": d(1), f"{prefix}_tvalid": d(1), f"{prefix}_tready": back(1)})
        for name, member in sw.axil.signature.members.items():
            members[f"s_axil_{name}"] = member
        members.update({"order_valid": Out(1), "order_port": Out(len(sw.order.p.port)), "order_diverted": Out(1),
                        "order_gone": Out(1), "order_refused": Out(1), "order_teardown": Out(1)})
        if sw.augmented:
            members.update({"hop_valid": Out(1), **{f"hop_{name}": Out(len(getattr(sw.hop.p, name)))
                                                    for name in sw.hop.p.shape().members}})
        for p in range(sw.control.mac_ports):
            members.update({f"mac{p}_{name}": In(32) for name in rm.MAC_STATS})
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
        if sw.augmented:
            m.d.comb += [self.hop_valid.eq(sw.hop.valid),
                         *[getattr(self, f"hop_{name}").eq(getattr(sw.hop.p, name))
                           for name in sw.hop.p.shape().members]]
        m.d.comb += [self.order_valid.eq(sw.order.valid), self.order_port.eq(sw.order.p.port),
                     self.order_diverted.eq(sw.order.p.diverted), self.order_gone.eq(sw.order.p.gone),
                     self.order_refused.eq(sw.refused), self.order_teardown.eq(sw.torn)]
        for p in range(sw.control.mac_ports):
            m.d.comb += [getattr(sw.mac_stats[p], name).eq(getattr(self, f"mac{p}_{name}")) for name in rm.MAC_STATS]
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

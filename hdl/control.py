"""Control and status: the AXI4-Lite register interface, the job and worker tables, the counters.

The register map is :mod:`inagg.models.regmap`; this block decodes it, its
storage and field slices sized by the declared fields
(:func:`register_layout`). The tables are read combinationally by the data path (ingress checks, result
emitters); the controller writes a job's fields and its workers' before it
sets the job's enable bit, and leaves them alone while the job has traffic.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from inagg.models import regmap as rm
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import Mode
from inagg.models.protocol import DEFAULT_PKEY, MAX_WORKERS, QPN_JOB_BITS, QPN_WORKER_BITS, Counter
from inagg.hdl.exception import STATS, stats_layout

__all__ = ["register_layout", "register_view", "AXILiteSignature", "JobEntry", "JobRead", "WorkerEntry", "WorkerRead",
           "ContribEntry", "ContribRead",
           "SwitchConfig", "TeardownRequest", "MgmtStats", "MacStats", "check_mac_ports", "TableAccess", "JobTable",
           "WorkerTable", "Counters", "Control", "N_COUNTERS", "event_vector"]

N_COUNTERS = len(Counter)
_OKAY, _SLVERR = 0b00, 0b10


def register_layout(reg: rm.Register, access: str = "RW") -> data.FlexibleLayout:
    """The fields of ``reg`` as a layout of ``reg.width`` bits, each at its declared bits.

    ``access`` "RO" keeps the fields a read returns, "WO" those a write
    sets, "RW" all of them (for a register whose read and write fields do
    not share bits).
    """
    kept = [f for f in reg.fields if access == "RW" or f.access in (access, "RW")]
    return data.FlexibleLayout(reg.width, {f.name: data.Field(unsigned(f.width), f.offset) for f in kept})


def register_view(reg: rm.Register, value, access: str = "RW") -> data.View:
    """``value`` (``reg.width`` bits, a register's storage) seen field by field."""
    return data.View(register_layout(reg, access), value)


def _width(block: dict, name: str) -> int:
    return block[name].width


def event_vector(strobes: dict) -> Value:
    """Counter strobes as the N_COUNTERS-bit vector of :attr:`Control.events`, other counters 0.

    Driving the whole vector at once keeps the Verilog free of constant
    ``always @*`` blocks, which event-driven simulators never run.
    """
    return Cat(*[strobes.get(c, Const(0, 1)) for c in Counter])


class AXILiteSignature(wiring.Signature):
    """AXI4-Lite, from the manager's side (the register block takes it flipped)."""

    def __init__(self, addr_width: int):
        super().__init__({
            "awaddr": Out(addr_width), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(32), "wstrb": Out(4), "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arvalid": Out(1), "arready": In(1),
            "rdata": In(32), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })


JobEntry = data.StructLayout({"valid": 1, "workers": range(MAX_WORKERS + 1),
                              "slot_base": _width(rm.JOB_REGISTERS, "SLOT_BASE"),
                              "slots": _width(rm.JOB_REGISTERS, "SLOTS"),
                              "mode": register_layout(rm.JOB_CTRL)["mode"].shape})
"""A job as the data path sees it; ``mode`` is its ``regmap.MODE_CODES`` code."""

WorkerEntry = data.StructLayout({
    "mac": _width(rm.WORKER_REGISTERS, "MAC_HI") + _width(rm.WORKER_REGISTERS, "MAC_LO"),
    "ip": _width(rm.WORKER_REGISTERS, "IP"), "qpn": _width(rm.WORKER_REGISTERS, "QPN"),
    "rkey": _width(rm.WORKER_REGISTERS, "RKEY"),
    "va": _width(rm.WORKER_REGISTERS, "VA_HI") + _width(rm.WORKER_REGISTERS, "VA_LO"),
    "psn": _width(rm.WORKER_REGISTERS, "PSN")})
"""Where one worker's results go (its port is in :attr:`Control.ports`)."""

ContribEntry = data.StructLayout({"rkey": _width(rm.WORKER_REGISTERS, "CONTRIB_RKEY"),
                                  "port": _width(rm.WORKER_REGISTERS, "PORT")})
"""What the ingress checks of one worker's contributions: their R_Key (check 15) and the port they must come in on."""

SwitchConfig = data.StructLayout({
    "mac": _width(rm.SWITCH_REGISTERS, "MAC_HI") + _width(rm.SWITCH_REGISTERS, "MAC_LO"),
    "ip": _width(rm.SWITCH_REGISTERS, "IP"), "pkey": _width(rm.SWITCH_REGISTERS, "PKEY")})

TeardownRequest = data.StructLayout({"start": 1, "job": QPN_JOB_BITS, "slot_base": JobEntry.members["slot_base"],
                                     "slots": JobEntry.members["slots"]})
"""A teardown the controller asked for, and the region of the job."""


MgmtStats = data.StructLayout({name: 32 for name in rm.MGMT_STATS})
"""The management bridge's counters (:data:`~inagg.models.regmap.MGMT_STATS`), read at ``MGMT_BASE``."""

MacStats = data.StructLayout({name: 32 for name in rm.MAC_STATS})
"""An Ethernet MAC's counters (:data:`~inagg.models.regmap.MAC_STATS`), its port's read at ``MAC_BASE``."""


def check_mac_ports(mac_ports, ports: int) -> None:
    """``ValueError`` unless ``mac_ports`` (:class:`Control`'s) is a count of ports from 0 to ``ports``."""
    if not isinstance(mac_ports, int) or isinstance(mac_ports, bool) or not 0 <= mac_ports <= ports:
        raise ValueError(f"MAC ports must be an integer in 0..{ports}, not {mac_ports!r}")


class JobRead(wiring.Signature):
    """A combinational read of the job table, from the reader's side."""

    def __init__(self):
        super().__init__({"index": Out(QPN_JOB_BITS), "entry": In(JobEntry)})


class WorkerRead(wiring.Signature):
    """A combinational read of the worker table and a result-PSN increment, from the reader's side."""

    def __init__(self):
        super().__init__({"index": Out(QPN_JOB_BITS + QPN_WORKER_BITS), "entry": In(WorkerEntry),
                          "psn_inc": Out(1)})


class ContribRead(wiring.Signature):
    """A combinational read of the worker table's :data:`ContribEntry` of (``job``, ``worker``), from the reader's side.

    ``entry`` is meaningless where the pair names no worker of the table.
    """

    def __init__(self):
        super().__init__({"job": Out(QPN_JOB_BITS), "worker": Out(QPN_WORKER_BITS), "entry": In(ContribEntry)})


class TableAccess(wiring.Signature):
    """The register bus decoder's access to one register block of a table, from the decoder's side.

    ``w_en`` writes ``w_data`` to the register at ``w_offset`` of entry
    ``w_index`` (at the clock edge); ``w_ok`` says the offset is a register
    of the block (combinationally, whether or not ``w_en`` is high). ``r_data``
    is the register at ``r_offset`` of entry ``r_index``, 0 where ``r_ok`` is
    low.
    """

    def __init__(self, index_bits: int, offset_bits: int):
        super().__init__({
            "w_en": Out(1), "w_index": Out(index_bits), "w_offset": Out(offset_bits), "w_data": Out(32),
            "w_ok": In(1),
            "r_index": Out(index_bits), "r_offset": Out(offset_bits), "r_data": In(32), "r_ok": In(1),
        })


class JobTable(wiring.Component):
    """The job table: a register per job and :data:`~inagg.models.regmap.JOB_REGISTERS` entry.

    Every ingress port reads it at once, combinationally; the data path sees
    a job as a :data:`JobEntry`.

    Parameters
    ----------
    jobs:
        Jobs the table holds.
    readers:
        Number of read ports.
    modes:
        The ``MODE_CODES`` codes a ``CTRL`` write may set; a write of any
        other is refused (``w_ok`` low) and leaves the register as it was.
        So is a write that enables a job whose region (its ``SLOT_BASE``
        and ``SLOTS``, written before) shares a slot with an enabled job's
        when either is a Mode II job (``RegMap.check_gateware``).

    Members
    -------
    job_rd : In(JobRead()).array(readers)
    bus : In(TableAccess(job bits, 5))
        Register reads and writes (offsets within ``JOB_STRIDE``).
    enabled : Out(jobs)
        Bit ``j``: job ``j``'s ``CTRL`` enable bit.
    disable : In(1)
        Clear the enable bit of job ``disable_job`` (after a write in the same cycle).
    disable_job : In(QPN_JOB_BITS)
    region_job : In(job bits)
    region_base, region_slots : Out
        The region (``SLOT_BASE``, ``SLOTS``) of job ``region_job``.
    """

    def __init__(self, jobs: int, readers: int, modes: frozenset[int]):
        self._jobs, self._modes = jobs, modes
        self.index_bits = max(1, (jobs - 1).bit_length())
        super().__init__({
            "job_rd": In(JobRead()).array(readers),
            "bus": In(TableAccess(self.index_bits, (rm.JOB_STRIDE - 1).bit_length())),
            "enabled": Out(jobs),
            "disable": In(1), "disable_job": In(QPN_JOB_BITS),
            "region_job": In(self.index_bits),
            "region_base": Out(JobEntry.members["slot_base"]), "region_slots": Out(JobEntry.members["slots"]),
        })

    def elaborate(self, platform):
        m = Module()
        jobs, bus = self._jobs, self.bus
        regs = {name: Array(Signal(reg.width, name=f"job{j}_{name.lower()}") for j in range(jobs))
                for name, reg in rm.JOB_REGISTERS.items()}
        ctrl_of = [register_view(rm.JOB_CTRL, c) for c in regs["CTRL"]]
        m.d.comb += self.enabled.eq(Cat(c.enable for c in ctrl_of))
        for rd in self.job_rd:
            idx = rd.index[:self.index_bits]
            ctrl = register_view(rm.JOB_CTRL, regs["CTRL"][idx])
            m.d.comb += [
                rd.entry.valid.eq((rd.index < jobs) & ctrl.enable),
                rd.entry.workers.eq(ctrl.workers),
                rd.entry.slot_base.eq(regs["SLOT_BASE"][idx]),
                rd.entry.slots.eq(regs["SLOTS"][idx]),
                rd.entry.mode.eq(ctrl.mode),
            ]
        m.d.comb += [self.region_base.eq(regs["SLOT_BASE"][self.region_job]),
                     self.region_slots.eq(regs["SLOTS"][self.region_job])]
        # A job of a mode this build does not implement is never enabled: its CTRL write is refused.
        new = register_view(rm.JOB_CTRL, bus.w_data[:rm.JOB_CTRL.width])
        mode_ok = new.mode.matches(*self._modes)
        # Nor is a job that would share a slot with an enabled job, either of them Mode II or III: their
        # slot rules read a slot without its job. Regions are aligned powers of two, so two overlap when
        # one's base falls inside the other.
        by_psn = (rm.MODE_CODES[Mode.TRANSLATED], rm.MODE_CODES[Mode.AUGMENTED])
        base, size = regs["SLOT_BASE"][bus.w_index], regs["SLOTS"][bus.w_index]
        shared = Cat(
            (bus.w_index != k) & ctrl_of[k].enable & (new.mode.matches(*by_psn) | ctrl_of[k].mode.matches(*by_psn))
            & (base < regs["SLOT_BASE"][k] + regs["SLOTS"][k]) & (regs["SLOT_BASE"][k] < base + size)
            for k in range(jobs))
        ctrl_ok = mode_ok & ~(new.enable & shared.any())
        with m.Switch(bus.w_offset):
            for name, reg in regs.items():
                with m.Case(rm.JOB_REGISTERS[name].offset):
                    ok = ctrl_ok if name == "CTRL" else Const(1, 1)
                    m.d.comb += bus.w_ok.eq(ok)
                    with m.If(bus.w_en & ok):
                        m.d.sync += reg[bus.w_index].eq(bus.w_data)
        with m.Switch(bus.r_offset):
            for name, reg in regs.items():
                with m.Case(rm.JOB_REGISTERS[name].offset):
                    m.d.comb += [bus.r_ok.eq(1), bus.r_data.eq(reg[bus.r_index])]
        # After the bus write: a teardown's disable wins over a write of the same cycle.
        with m.If(self.disable):
            m.d.sync += register_view(rm.JOB_CTRL, regs["CTRL"][self.disable_job]).enable.eq(0)
        return m


class WorkerTable(wiring.Component):
    """The worker table: where each worker's results go and what its contributions must be, per (job, worker).

    One memory per 32-bit register of :data:`~inagg.models.regmap.WORKER_REGISTERS`
    with a combinational read port per reader (result emitter); the ports
    are registers (:attr:`ports`), and the result PSNs a memory per reader
    that sends results (see :class:`Control`'s ``worker_rd``). ``CONTRIB_RKEY``
    and a copy of the ports are memories of their own, read combinationally
    by each ingress port's checks (``contrib_rd``) in the cycle they read the
    job table, so the checks take no cycle more.

    Parameters
    ----------
    entries:
        ``jobs * workers``.
    readers:
        Number of read ports (the result emitters' and the ACK reflectors').
    port_bits:
        Bits of a port number.
    counting:
        The first ``counting`` readers send results and keep result PSNs (``readers`` when not given); the
        others read no PSN (``entry.psn`` is 0) and must keep ``psn_inc`` low.
    checkers:
        Number of contribution read ports (the ingress ports'; ``readers`` when not given).

    Members
    -------
    worker_rd : In(WorkerRead()).array(readers)
    contrib_rd : In(index, ContribEntry).array(checkers)
        The ingress checks' reads, by entry ``index``.
    bus : In(TableAccess(entry bits, 6))
        Register writes (offsets within ``WORKER_STRIDE``); the registers are write-only.
    psn_busy : Out(1)
        A write to ``w_offset`` must wait this cycle: it is a ``PSN`` write and a
        reader increments a PSN (they share the PSN memories' write ports).
    ports : Out(entries * port_bits)
        The switch port of every worker.
    """

    def __init__(self, entries: int, readers: int, port_bits: int, counting: int | None = None,
                 checkers: int | None = None):
        self._entries, self._port_bits = entries, port_bits
        self._counting = readers if counting is None else counting
        super().__init__({
            "worker_rd": In(WorkerRead()).array(readers),
            "contrib_rd": In(wiring.Signature({"index": Out(range(entries)), "entry": In(ContribEntry)})).array(
                readers if checkers is None else checkers),
            "bus": In(TableAccess(max(1, (entries - 1).bit_length()), (rm.WORKER_STRIDE - 1).bit_length())),
            "psn_busy": Out(1),
            "ports": Out(entries * port_bits),
        })

    def elaborate(self, platform):
        m = Module()
        entries, bus = self._entries, self.bus
        # The result PSNs are a memory per reader: one write port each (the reader's increment, or a
        # register write) maps to distributed RAM, where one memory with a write port per reader
        # became flip-flops and write-enable logic, 3,300 LUT4 at 2 ports x 32 workers.
        w_port = Array(Signal(self._port_bits, name=f"worker{i}_port") for i in range(entries))
        m.d.comb += self.ports.eq(Cat(*w_port))
        fields = {name: memory.Memory(shape=reg.width, depth=entries, init=[])
                  for name, reg in rm.WORKER_REGISTERS.items() if name not in ("PORT", "PSN", "CONTRIB_RKEY")}
        contrib = {"CONTRIB_RKEY": memory.Memory(shape=rm.WORKER_REGISTERS["CONTRIB_RKEY"].width, depth=entries,
                                                 init=[]),
                   "PORT": memory.Memory(shape=self._port_bits, depth=entries, init=[])}
        for name, mem in {**fields, "CONTRIB_RKEY": contrib["CONTRIB_RKEY"]}.items():
            m.submodules[f"worker_{name.lower()}"] = mem
        m.submodules.worker_port_copy = contrib["PORT"]
        wr = {name: mem.write_port() for name, mem in {**fields, **contrib}.items()}
        for rd in self.contrib_rd:
            r = {name: mem.read_port(domain="comb") for name, mem in contrib.items()}
            m.d.comb += [p.addr.eq(rd.index) for p in r.values()]
            m.d.comb += [rd.entry.rkey.eq(r["CONTRIB_RKEY"].data), rd.entry.port.eq(r["PORT"].data)]
        psn_wr = []
        for i, rd in enumerate(self.worker_rd):
            r = {name: mem.read_port(domain="comb") for name, mem in fields.items()}
            for p in r.values():
                m.d.comb += p.addr.eq(rd.index)
            m.d.comb += [
                rd.entry.mac.eq(Cat(r["MAC_LO"].data, r["MAC_HI"].data)),
                rd.entry.ip.eq(r["IP"].data), rd.entry.qpn.eq(r["QPN"].data), rd.entry.rkey.eq(r["RKEY"].data),
                rd.entry.va.eq(Cat(r["VA_LO"].data, r["VA_HI"].data)),
            ]
            if i >= self._counting:
                continue
            m.submodules[f"worker_psn{i}"] = psn = memory.Memory(shape=rm.WORKER_REGISTERS["PSN"].width,
                                                                 depth=entries, init=[])
            psn_rd = psn.read_port(domain="comb")
            m.d.comb += [psn_rd.addr.eq(rd.index), rd.entry.psn.eq(psn_rd.data)]
            psn_wr.append((psn.write_port(), rd, psn_rd.data + 1))

        psn_hit = bus.w_offset == rm.WORKER_REGISTERS["PSN"].offset
        m.d.comb += self.psn_busy.eq(psn_hit & Cat(rd.psn_inc for rd in self.worker_rd[:self._counting]).any())
        for name, port in wr.items():
            m.d.comb += [port.addr.eq(bus.w_index), port.data.eq(bus.w_data),
                         port.en.eq(bus.w_en & (bus.w_offset == rm.WORKER_REGISTERS[name].offset))]
        for port, rd, next_psn in psn_wr:
            m.d.comb += [port.addr.eq(Mux(rd.psn_inc, rd.index, bus.w_index)),
                         port.data.eq(Mux(rd.psn_inc, next_psn, bus.w_data)),
                         port.en.eq(rd.psn_inc | (bus.w_en & psn_hit))]
        with m.Switch(bus.w_offset):
            with m.Case(rm.WORKER_REGISTERS["PORT"].offset):
                m.d.comb += bus.w_ok.eq(1)
                with m.If(bus.w_en):
                    m.d.sync += w_port[bus.w_index].eq(bus.w_data)
            with m.Case(*[reg.offset for name, reg in rm.WORKER_REGISTERS.items() if name != "PORT"]):
                m.d.comb += bus.w_ok.eq(1)  # the field memories' write ports take it
        return m


class Counters(wiring.Component):
    """The event counters of :class:`~inagg.models.protocol.Counter`, 32 bits each, wrapping.

    Every source may strobe any counter in the same cycle. The strobes are
    registered before the adders: a source's strobe (the slot engine's
    decision on its metadata read, the exception path's insert) would
    otherwise end its own long path in a 32-bit carry chain here. A counter
    then counts one cycle after its event.

    Members
    -------
    events : In(N_COUNTERS).array(sources)
        Bit ``c`` of a source adds one to counter ``c``.
    counts : Out(32).array(N_COUNTERS)
    """

    def __init__(self, sources: int):
        super().__init__({"events": In(N_COUNTERS).array(sources), "counts": Out(32).array(N_COUNTERS)})

    def elaborate(self, platform):
        m = Module()
        events = [Signal(N_COUNTERS, name=f"events{i}") for i in range(len(self.events))]
        m.d.sync += [reg.eq(src) for reg, src in zip(events, self.events)]
        counters = [Signal(32, name=f"count_{c.name.lower()}") for c in Counter]
        for c, reg in zip(Counter, counters):
            m.d.sync += reg.eq(reg + sum(src[c] for src in events))
        m.d.comb += [out.eq(reg) for out, reg in zip(self.counts, counters)]
        return m


class Control(wiring.Component):
    """Register block of the switch.

    Parameters
    ----------
    geometry : SwitchGeometry
        The switch's geometry, reported in ``GEOMETRY``, ``JOBS`` and
        ``EXCEPTION``, and its register map's modes in ``MODES`` (a ``CTRL``
        write of another is refused); the tables hold ``jobs`` jobs of ``workers`` workers,
        and with an exception path its engine's counters are read at
        ``EXC_BASE``.
    mgmt:
        A management bridge's counters are read at ``MGMT_BASE`` (SLVERR without).
    mac_ports:
        Ports ``0 .. mac_ports - 1`` have an Ethernet MAC whose counters are read at ``MAC_BASE``
        (SLVERR for the other ports' addresses).
    job_readers:
        Number of job-table read ports.
    worker_readers:
        Number of worker-table read ports (``ports`` when not given): the
        first ``ports`` send results, the others read no result PSN.
    event_sources:
        Number of counter event inputs.

    Members
    -------
    axil : In(AXILiteSignature(addr_width))
        The register interface.
    switch : Out(SwitchConfig)
        The switch's own MAC, IP and P_Key.
    hop_timeout : Out(32)
        ``HOP_TIMEOUT``: Mode III's ACK timeout of results, in cycles.
    job_rd : In(JobRead()).array(job_readers)
    worker_rd : In(WorkerRead()).array(worker_readers)
        Worker-table reads: the result emitters', then the ACK reflectors'
        (which leave ``psn_inc`` low and read ``entry.psn`` as 0). ``index`` is
        ``job * workers + worker``; ``psn_inc`` advances that worker's
        result PSN by one. Reader ``p`` must serve only the workers whose
        port is ``p`` (as the emitter of port ``p`` does): each reader keeps
        the result PSNs in a copy of its own, which a ``PSN`` register write
        sets in every copy, so a worker moved to another port continues from
        that port's copy unless its ``PSN`` is written again after the move
        (:meth:`~inagg.models.regmap.RegMap.job_writes` writes ``PORT``
        before ``PSN``).
    contrib_rd : In(ContribRead()).array(ports)
        The ingress checks' reads of the worker table, one per port.
    ports : Out(jobs * workers * port_bits)
        The switch port of every worker, at ``(job * workers + worker) * port_bits``.
    events : In(N_COUNTERS).array(event_sources)
        Counter strobes: bit ``c`` of a source adds one to ``protocol.Counter`` ``c``.
    exc_stats : In(stats_layout())
        The exception engine's counters (with an exception path only).
    mgmt_stats : In(MgmtStats)
        The management bridge's counters (with ``mgmt`` only).
    mac_stats : In(MacStats).array(mac_ports)
        Each MAC's counters (with ``mac_ports`` only).
    enabled : Out(jobs)
        Bit ``j``: job ``j``'s ``CTRL`` enable bit.
    teardown : Out(TeardownRequest)
        A ``TEARDOWN`` write that was taken: ``start`` strobes for one cycle
        with the job and its region as the job table held them.
    teardown_done : In(1)
        The teardown has finished (``teardown_refused``: without a change);
        ``TEARDOWN`` reads busy from ``start`` to this strobe.
    teardown_refused : In(1)
    teardown_disable : In(1)
        Clear the enable bit of the job being torn down.
    """

    def __init__(self, geometry: SwitchGeometry, *, job_readers: int, event_sources: int,
                 worker_readers: int | None = None, mgmt: bool = False, mac_ports: int = 0):
        if not isinstance(geometry, SwitchGeometry):
            raise TypeError(f"Geometry must be a SwitchGeometry, not {geometry!r}")
        self.geometry = geometry
        self.regmap = geometry.regmap
        self.port_bits = geometry.port_bits
        ports, jobs, workers = geometry.ports, geometry.jobs, geometry.workers
        check_mac_ports(mac_ports, ports)
        self.mgmt, self.mac_ports = mgmt, mac_ports
        members = {} if geometry.exception is None else {"exc_stats": In(stats_layout())}
        if mgmt:
            members["mgmt_stats"] = In(MgmtStats)
        if mac_ports:
            members["mac_stats"] = In(MacStats).array(mac_ports)
        super().__init__({
            **members,
            "axil": In(AXILiteSignature(self.regmap.addr_width)),
            "switch": Out(SwitchConfig),
            "hop_timeout": Out(32),
            "job_rd": In(JobRead()).array(job_readers),
            "worker_rd": In(WorkerRead()).array(ports if worker_readers is None else worker_readers),
            "contrib_rd": In(ContribRead()).array(ports),
            "ports": Out(jobs * workers * self.port_bits),
            "events": In(N_COUNTERS).array(event_sources),
            "enabled": Out(jobs),
            "teardown": Out(TeardownRequest),
            "teardown_done": In(1), "teardown_refused": In(1), "teardown_disable": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.axil
        g = self.geometry
        jobs, entries = g.jobs, g.jobs * g.workers

        mac = Signal(SwitchConfig.members["mac"])
        ip = Signal(SwitchConfig.members["ip"])
        pkey = Signal(SwitchConfig.members["pkey"], init=DEFAULT_PKEY)
        hop_timeout = Signal(32, init=rm.HOP_TIMEOUT_RESET)
        m.d.comb += [self.switch.mac.eq(mac), self.switch.ip.eq(ip), self.switch.pkey.eq(pkey),
                     self.hop_timeout.eq(hop_timeout)]

        m.submodules.jobs = job_table = JobTable(jobs, len(self.job_rd),
                                                 frozenset(rm.MODE_CODES[mode] for mode in self.regmap.modes))
        m.submodules.workers = worker_table = WorkerTable(entries, len(self.worker_rd), self.port_bits, g.ports,
                                                         len(self.contrib_rd))
        m.submodules.counters = counters = Counters(len(self.events))
        for rd, port in zip(self.job_rd, job_table.job_rd):
            wiring.connect(m, wiring.flipped(rd), port)
        for rd, port in zip(self.worker_rd, worker_table.worker_rd):
            wiring.connect(m, wiring.flipped(rd), port)
        for rd, port in zip(self.contrib_rd, worker_table.contrib_rd):
            m.d.comb += [port.index.eq(rd.job * g.workers + rd.worker), rd.entry.eq(port.entry)]
        m.d.comb += [self.enabled.eq(job_table.enabled), self.ports.eq(worker_table.ports)]
        m.d.comb += [port.eq(src) for port, src in zip(counters.events, self.events)]

        # AXI4-Lite writes: address and data together, one at a time.
        bvalid, bresp = Signal(), Signal(2)
        m.d.comb += [bus.bvalid.eq(bvalid), bus.bresp.eq(bresp)]
        addr, wdata = bus.awaddr, bus.wdata
        job_hit = (addr >= rm.JOB_BASE) & (addr < rm.JOB_BASE + rm.JOB_STRIDE * jobs)
        wk_hit = (addr >= rm.WORKER_BASE) & (addr < rm.WORKER_BASE + rm.WORKER_STRIDE * entries)
        jw, ww = job_table.bus, worker_table.bus
        m.d.comb += [jw.w_index.eq((addr - rm.JOB_BASE)[5:]), jw.w_offset.eq(addr[:5]), jw.w_data.eq(wdata),
                     ww.w_index.eq((addr - rm.WORKER_BASE)[6:]), ww.w_offset.eq(addr[:6]), ww.w_data.eq(wdata)]
        # A PSN write waits out the cycles in which a reader increments: it shares their write ports.
        do_write = bus.awvalid & bus.wvalid & ~bvalid & ~(wk_hit & worker_table.psn_busy)
        m.d.comb += [bus.awready.eq(do_write), bus.wready.eq(do_write),
                     jw.w_en.eq(do_write & job_hit), ww.w_en.eq(do_write & wk_hit)]
        with m.If(bvalid & bus.bready):
            m.d.sync += bvalid.eq(0)
        # Teardown: busy from an accepted TEARDOWN write until the switch says it is done.
        td, td_busy, td_refused = self.teardown, Signal(), Signal()
        td_status = Signal(register_layout(rm.TEARDOWN, "RO"))
        m.d.comb += [td_status.busy.eq(td_busy), td_status.refused.eq(td_refused)]
        m.d.sync += td.start.eq(0)
        with m.If(self.teardown_done):
            m.d.sync += [td_busy.eq(0), td_refused.eq(self.teardown_refused)]
        td_job = wdata[:job_table.index_bits]
        td_ok = ~td_busy & (wdata < jobs) & self.enabled.bit_select(td_job, 1)
        m.d.comb += [job_table.region_job.eq(td_job), job_table.disable.eq(self.teardown_disable),
                     job_table.disable_job.eq(td.job)]
        with m.If(do_write):
            m.d.sync += [bvalid.eq(1), bresp.eq(_OKAY)]
            sw = {name: reg.offset for name, reg in rm.SWITCH_REGISTERS.items()}
            with m.If(job_hit):
                with m.If(~jw.w_ok):
                    m.d.sync += bresp.eq(_SLVERR)
            with m.Elif(wk_hit):
                with m.If(~ww.w_ok):
                    m.d.sync += bresp.eq(_SLVERR)
            with m.Elif(addr == sw["MAC_HI"]):
                m.d.sync += mac[32:].eq(wdata)
            with m.Elif(addr == sw["MAC_LO"]):
                m.d.sync += mac[:32].eq(wdata)
            with m.Elif(addr == sw["IP"]):
                m.d.sync += ip.eq(wdata)
            with m.Elif(addr == sw["PKEY"]):
                m.d.sync += pkey.eq(wdata)
            with m.Elif(addr == sw["HOP_TIMEOUT"]):
                m.d.sync += hop_timeout.eq(wdata)
            with m.Elif(addr == sw["TEARDOWN"]):
                with m.If(td_ok):
                    m.d.sync += [td.start.eq(1), td.job.eq(wdata), td.slot_base.eq(job_table.region_base),
                                 td.slots.eq(job_table.region_slots), td_busy.eq(1)]
                with m.Else():
                    m.d.sync += bresp.eq(_SLVERR)
            with m.Else():
                m.d.sync += bresp.eq(_SLVERR)

        # AXI4-Lite reads: one at a time, answered the next cycle.
        rvalid, rdata, rresp = Signal(), Signal(32), Signal(2)
        m.d.comb += [bus.rvalid.eq(rvalid), bus.rdata.eq(rdata), bus.rresp.eq(rresp),
                     bus.arready.eq(~rvalid)]
        with m.If(rvalid & bus.rready):
            m.d.sync += rvalid.eq(0)
        raddr = bus.araddr
        m.d.comb += [jw.r_index.eq((raddr - rm.JOB_BASE)[5:]), jw.r_offset.eq(raddr[:5])]
        cidx = (raddr - rm.COUNTER_BASE)[2:]
        assert tuple(rm.EXC_STATS) == STATS, "the register map lists the engine's counters in their order"
        exc_hit = (raddr >= rm.EXC_BASE) & (raddr < rm.EXC_BASE + 4 * len(STATS)) & (raddr[:2] == 0)
        with m.If(bus.arvalid & ~rvalid):
            m.d.sync += [rvalid.eq(1), rresp.eq(_OKAY), rdata.eq(0)]
            with m.If((raddr >= rm.COUNTER_BASE) & (raddr < rm.COUNTER_BASE + 4 * N_COUNTERS) & (raddr[:2] == 0)):
                m.d.sync += rdata.eq(Array(counters.counts)[cidx])
            if g.exception is not None:
                with m.Elif(exc_hit):
                    stats = Array(getattr(self.exc_stats, name) for name in STATS)
                    m.d.sync += rdata.eq(stats[(raddr - rm.EXC_BASE)[2:]])
            if self.mgmt:
                with m.Elif((raddr >= rm.MGMT_BASE) & (raddr < rm.MGMT_BASE + 4 * len(rm.MGMT_STATS))
                            & (raddr[:2] == 0)):
                    stats = Array(getattr(self.mgmt_stats, name) for name in rm.MGMT_STATS)
                    m.d.sync += rdata.eq(stats[(raddr - rm.MGMT_BASE)[2:]])
            if self.mac_ports:
                # A port's block has a word to spare (MAC_STRIDE): it is absent, as the ports without a MAC are.
                mac_off = raddr - rm.MAC_BASE
                lsb = (rm.MAC_STRIDE - 1).bit_length()  # the port's number starts at this address bit
                with m.Elif((raddr >= rm.MAC_BASE) & (raddr < rm.MAC_BASE + rm.MAC_STRIDE * self.mac_ports)
                            & (raddr[:2] == 0) & (mac_off[2:lsb] < len(rm.MAC_STATS))):
                    stats = Array(Array(getattr(s, name) for name in rm.MAC_STATS) for s in self.mac_stats)
                    m.d.sync += rdata.eq(stats[mac_off[lsb:]][mac_off[2:lsb]])
            with m.Elif((raddr >= rm.JOB_BASE) & (raddr < rm.JOB_BASE + rm.JOB_STRIDE * jobs)):
                m.d.sync += rdata.eq(jw.r_data)
                with m.If(~jw.r_ok):
                    m.d.sync += rresp.eq(_SLVERR)
            with m.Else():
                with m.Switch(raddr):
                    for name, value in (("ID", Const(rm.ID_VALUE, 32)), ("GEOMETRY", Const(g.geometry_value, 32)),
                                        ("JOBS", Const(self.regmap.jobs_value(), 32)), ("MAC_HI", mac[32:]),
                                        ("MAC_LO", mac[:32]), ("IP", ip), ("PKEY", pkey),
                                        ("EXCEPTION", Const(rm.RegMap.exception(g.exception), 32)),
                                        ("TEARDOWN", td_status), ("MODES", Const(self.regmap.modes_value(), 32)),
                                        ("HOP_TIMEOUT", hop_timeout)):
                        with m.Case(rm.SWITCH_REGISTERS[name].offset):
                            m.d.sync += rdata.eq(value)
                    with m.Default():
                        m.d.sync += rresp.eq(_SLVERR)
        return m

"""The AXI4-Lite register map of the RTL switch, described once.

Every register is declared here as a :class:`Register` of :class:`Field` objects
(name, bit range, access, meaning), as amaranth-soc declares its CSRs: the
model's packing (:meth:`Register.encode`), the testbenches' and the host's
reads (:meth:`Register.decode`), the gateware's field slices
(``inagg.hdl.control.register_layout``) and the table of ``docs/rtl.md``
(:meth:`RegMap.markdown`; a test keeps the document in step) all come from
these declarations. Every register is 32 bits wide and word-aligned.

The map depends on the switch's geometry (``jobs`` and ``workers`` per job
are build parameters), read back from ``JOBS``::

    0x0000  ID          RO  "inAG" (0x696E4147)
    0x0004  GEOMETRY    RO  ports, width/64, log2 slots, log2 chunk bytes
    0x0008  JOBS        RO  jobs, workers per job
    0x0010  MAC_HI      RW  switch MAC bytes 0-1
    0x0014  MAC_LO      RW  switch MAC bytes 2-5
    0x0018  IP          RW  switch IPv4 address
    0x001C  PKEY        RW  P_Key contributions must carry (resets to 0xFFFF)
    0x0020  EXCEPTION   RO  log2 table (0: no exception path), stash, max_kicks
    0x0024  TEARDOWN    RW  write a job number: tear the job down; read busy, refused
    0x0028  MODES       RO  the transport modes the switch takes, one bit per MODE_CODES code
    0x002C  HOP_TIMEOUT RW  Mode III: the ACK timeout of results on the hop, in switch clock cycles
    0x0100  counter c   RO  protocol.Counter c at 0x100 + 4 c
    0x0200  exc stat i  RO  the exception engine's counters (EXC_STATS) at 0x200 + 4 i
    0x0300  mgmt stat i RO  the management bridge's counters (MGMT_STATS) at 0x300 + 4 i
    0x0400  mac stat    RO  port p's Ethernet MAC counters (MAC_STATS) at 0x400 + 0x20 p + 4 i
    0x1000  job j       RW  registers at 0x1000 + 0x20 j   (JOB_REGISTERS)
    0x8000  worker      WO  registers at 0x8000 + 0x40 (j * workers + w)   (WORKER_REGISTERS)

A job's ``CTRL`` register enables it and sets its worker count and its
transport mode (:data:`MODE_CODES`): the controller writes the other
registers of a job and of its workers first and ``CTRL`` last. The switch
refuses (SLVERR, the register unchanged) a ``CTRL`` write whose mode it does
not implement (``MODES``), so a job of such a mode is never enabled. Writing a job
number to ``TEARDOWN`` removes the job as ``ModelSwitch.remove_job`` does
(its ``CTRL`` enable bit clears, its slots and overflow slots are freed);
the controller polls ``TEARDOWN`` until its ``busy`` field clears
(``docs/exception.md`` "Teardown").

Adding a field: declare it in its register below (bits must not overlap
another field the same side reads or writes), then use it by name:
``JOB_CTRL.encode(enable=1, workers=n)`` in Python, ``register_layout`` in
the gateware; regenerate the table of ``docs/rtl.md`` from
:meth:`RegMap.markdown`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inagg.models.job import Collective, ExceptionSpec, JobSpec, Mode, SwitchSpec
from inagg.models.protocol import MAX_JOBS, MAX_WORKERS, Counter
from inagg.models.wire import ip_bytes, mac_bytes

__all__ = ["HOP_TIMEOUT", "HOP_TIMEOUT_RESET", "Field", "Register", "ID_VALUE", "TEARDOWN_BUSY", "TEARDOWN_REFUSED",
           "SWITCH_REGISTERS", "JOB_REGISTERS", "WORKER_REGISTERS", "GEOMETRY", "JOBS", "EXCEPTION", "TEARDOWN",
           "MODES", "MODE_CODES", "JOB_CTRL", "COUNTER_BASE", "EXC_BASE", "EXC_STATS", "MGMT_BASE", "MGMT_STATS",
           "MAC_BASE", "MAC_STRIDE", "MAC_STATS", "MAC_PORTS", "JOB_BASE", "JOB_STRIDE", "WORKER_BASE",
           "WORKER_STRIDE", "RegMap"]

_ACCESS = ("RO", "WO", "RW")


@dataclass(frozen=True)
class Field:
    """A bit field of a register: ``width`` bits from bit ``offset``.

    ``access`` is "RO" (read only), "WO" (write only) or "RW"; a field
    written and one read may share bits (``TEARDOWN``: a job number goes
    in, the status comes out).
    """

    name: str
    offset: int
    width: int
    access: str = "RW"
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TypeError(f"Field name must be an identifier, not {self.name!r}")
        if not isinstance(self.width, int) or not isinstance(self.offset, int) or self.width < 1 \
                or self.offset < 0 or self.offset + self.width > 32:
            raise ValueError(f"Field {self.name} must lie within bits 31:0, not {self.offset}+{self.width!r}")
        if self.access not in _ACCESS:
            raise ValueError(f"Field access must be one of {_ACCESS}, not {self.access!r}")

    @property
    def mask(self) -> int:
        """The field's bits in the register word."""
        return ((1 << self.width) - 1) << self.offset

    @property
    def bits(self) -> str:
        """The bit range as the documentation writes it: ``[11:8]``, ``[0]``."""
        hi = self.offset + self.width - 1
        return f"[{hi}:{self.offset}]" if hi != self.offset else f"[{hi}]"

    def encode(self, value: int) -> int:
        """``value`` placed in the field's bits; ``ValueError`` when it does not fit."""
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << self.width:
            raise ValueError(f"{self.name} must be an integer in 0..{(1 << self.width) - 1}, not {value!r}")
        return value << self.offset

    def decode(self, word: int) -> int:
        """The field's value in register word ``word``."""
        return word >> self.offset & ((1 << self.width) - 1)


@dataclass(frozen=True)
class Register:
    """A 32-bit register at ``offset`` in its block, made of ``fields``.

    A register of one field that fills it has that field named ``value``.
    ``access`` is the register's as the bus sees it: reads answer SLVERR on
    a "WO" register, writes on a "RO" one.
    """

    name: str
    offset: int
    access: str
    doc: str
    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        if self.access not in _ACCESS:
            raise ValueError(f"Register access must be one of {_ACCESS}, not {self.access!r}")
        if self.offset % 4:
            raise ValueError(f"Register {self.name} must be word-aligned, not at 0x{self.offset:X}")
        for side in ("RO", "WO"):
            seen = 0
            for f in self.fields:
                if f.access in (side, "RW"):
                    if seen & f.mask:
                        raise ValueError(f"Field {f.name} of register {self.name} overlaps another field")
                    seen |= f.mask

    def field(self, name: str) -> Field:
        """The field called ``name``."""
        for f in self.fields:
            if f.name == name:
                return f
        raise ValueError(f"register {self.name} has no field {name!r}; it has {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def width(self) -> int:
        """Bits the register stores: up to its highest field bit."""
        return max(f.offset + f.width for f in self.fields)

    def encode(self, **values: int) -> int:
        """The word holding ``values`` by field name (fields not given are 0)."""
        for name in values:
            self.field(name)
        return sum(self.field(name).encode(v) for name, v in values.items())

    def decode(self, word: int) -> dict[str, int]:
        """Every field's value in ``word``, by name."""
        return {f.name: f.decode(word) for f in self.fields}

    def meaning(self) -> str:
        """The register's line of the documentation: its meaning, then each field's bits."""
        if len(self.fields) == 1 and self.fields[0].name == "value":
            return self.doc if self.width == 32 else f"{self.doc} {self.fields[0].bits}"
        side = {"RO": " (read)", "WO": " (write)"}
        return self.doc + ": " + ", ".join(
            f"{f.doc or f.name} {f.bits}{side[f.access] if f.access != self.access else ''}" for f in self.fields)


def _reg(name: str, offset: int, access: str, doc: str, *fields: Field, bits: int = 32) -> Register:
    """A register of ``fields``, or of one ``value`` field of ``bits`` bits."""
    return Register(name, offset, access, doc, fields or (Field("value", 0, bits, access),))


ID_VALUE = 0x696E4147
GEOMETRY = _reg("GEOMETRY", 0x04, "RO", "the switch's build",
                Field("ports", 0, 8, "RO", "ports"), Field("width64", 8, 4, "RO", "width/64"),
                Field("log2_slots", 16, 5, "RO", "log2 slots"), Field("log2_chunk", 24, 4, "RO", "log2 chunk bytes"))
JOBS = _reg("JOBS", 0x08, "RO", "the job tables",
            Field("jobs", 0, 16, "RO", "jobs"), Field("workers", 16, 8, "RO", "workers per job"))
EXCEPTION = _reg("EXCEPTION", 0x20, "RO", "exception path",
                 Field("log2_table", 0, 5, "RO", "log2 table (0: none)"), Field("stash", 8, 7, "RO", "stash"),
                 Field("max_kicks", 16, 11, "RO", "max_kicks"))
TEARDOWN = _reg("TEARDOWN", 0x24, "RW", "tear a job down (SLVERR while busy, or for a job that is not enabled; "
                                        "refused: a slot of the job hosts overflow keys of other jobs)",
                Field("job", 0, 32, "WO", "job number"), Field("busy", 0, 1, "RO", "busy"),
                Field("refused", 1, 1, "RO", "last teardown refused"))
MODE_CODES = {Mode.UC: 0, Mode.TERMINATED: 1, Mode.TRANSLATED: 2, Mode.AUGMENTED: 3}
"""The code of each transport mode in ``JOB.CTRL``'s ``mode`` field and its bit in ``MODES``."""
MODES = _reg("MODES", 0x28, "RO", "transport modes the switch takes (bit c: MODE_CODES code c)", bits=len(MODE_CODES))
HOP_TIMEOUT_RESET = 1 << 14
"""``HOP_TIMEOUT`` after reset: 16,384 cycles (164 us at 100 MHz, the order of the model's 100 us)."""
HOP_TIMEOUT = _reg("HOP_TIMEOUT", 0x2C, "RW", "Mode III: cycles of the switch clock before a child that has not "
                   f"ACKed a result gets its unACKed results again (0: no timer; resets to {HOP_TIMEOUT_RESET})")
SWITCH_REGISTERS = {r.name: r for r in (
    _reg("ID", 0x00, "RO", 'identifies the register map: "inAG"'),
    GEOMETRY,
    JOBS,
    _reg("MAC_HI", 0x10, "RW", "switch MAC bytes 0-1 (byte 0 in 15:8)", bits=16),
    _reg("MAC_LO", 0x14, "RW", "switch MAC bytes 2-5 (byte 2 in 31:24)"),
    _reg("IP", 0x18, "RW", "switch IPv4 address (first byte in 31:24)"),
    _reg("PKEY", 0x1C, "RW", "P_Key that contributions must carry; resets to 0xFFFF", bits=16),
    EXCEPTION,
    TEARDOWN,
    MODES,
    HOP_TIMEOUT,
)}
TEARDOWN_BUSY = TEARDOWN.field("busy").mask
"""``TEARDOWN`` read: a teardown is running; frames wait at the ports meanwhile."""
TEARDOWN_REFUSED = TEARDOWN.field("refused").mask
"""``TEARDOWN`` read: the last teardown changed nothing: another job's key diverted from a slot the job holds."""

COUNTER_BASE = 0x100
EXC_BASE = 0x200
# name: description; at EXC_BASE + 4 i in this order (the gateware's ExceptionEngine.stats)
EXC_STATS = {
    "inserts": "keys placed in table 0 or 1 (CuckooStats.inserts)",
    "kicks": "displacements of successful kick-out chains (CuckooStats.kicks)",
    "stashed": "keys placed in the stash (CuckooStats.stashed)",
    "refused": "inserts refused: chain failed, stash full (CuckooStats.refused)",
    "full": "inserts refused before the walk: every overflow slot in use",
    "deletes": "keys deleted (CuckooStats.deletes)",
    "stalls": "cycles a request waited for the engine's request queue",
}

MGMT_BASE = 0x300
# name: description; at MGMT_BASE + 4 i in this order (models.mgmt.MgmtBridge.counters, hdl.mgmt.MgmtBridge.stats)
MGMT_STATS = {
    "accepted": "management requests performed (tag and sequence number good)",
    "malformed": "management frames refused: shorter than a request",
    "bad_op": "management frames refused: not a request's op",
    "bad_tag": "management requests refused: wrong tag (wrong key, or altered)",
    "replayed": "management requests refused: sequence number not above the last accepted one",
    "busy": "management frames dropped: they came while the bridge served another",
}

MAC_BASE, MAC_STRIDE = 0x400, 0x20
# name: description; port p's at MAC_BASE + MAC_STRIDE p + 4 i in this order. The gateware's MAC takes its
# counters' names from here (hdl.mac.COUNTERS).
MAC_STATS = {
    "rx_good": "frames the MAC passed to the switch",
    "rx_fcs_errors": "frames of 64 bytes up to the longest dropped for a bad FCS or an RX_ER",
    "rx_runts": "frames dropped for being shorter than 64 bytes, FCS included",
    "rx_long": "frames dropped for being longer than the longest (1,522 bytes by default)",
    "rx_overflow": "good frames dropped because the MAC's receive buffer was full",
    "tx_frames": "frames the MAC sent",
    "tx_long": "frames from the switch dropped for being longer than the longest less the FCS",
}

JOB_BASE, JOB_STRIDE = 0x1000, 0x20
MAC_PORTS = (JOB_BASE - MAC_BASE) // MAC_STRIDE
"""Ports whose MAC counters fit the region below the job registers."""

JOB_CTRL = _reg("CTRL", 0x00, "RW", "the job's state (SLVERR, unchanged, for a write of a mode the switch lacks, "
                                    "or one that enables a job sharing a slot with an enabled job, either Mode II)",
                Field("enable", 0, 1, "RW", "job enabled"), Field("workers", 8, 7, "RW", "worker count"),
                Field("mode", 16, 2, "RW", "transport mode (MODE_CODES)"))
JOB_REGISTERS = {r.name: r for r in (
    JOB_CTRL,
    _reg("SLOT_BASE", 0x08, "RW", "first slot of the job's region", bits=16),
    _reg("SLOTS", 0x0C, "RW", "slots in the region (a power of two)", bits=17),
)}

WORKER_BASE, WORKER_STRIDE = 0x8000, 0x40
WORKER_REGISTERS = {r.name: r for r in (
    _reg("PORT", 0x00, "WO", "switch port of the worker", bits=8),
    _reg("MAC_HI", 0x04, "WO", "worker MAC bytes 0-1", bits=16),
    _reg("MAC_LO", 0x08, "WO", "worker MAC bytes 2-5"),
    _reg("IP", 0x0C, "WO", "worker IPv4 address"),
    _reg("QPN", 0x10, "WO", "worker QPN", bits=24),
    _reg("RKEY", 0x14, "WO", "R_Key of the worker's result ring"),
    _reg("VA_HI", 0x18, "WO", "result ring address bits 63:32"),
    _reg("VA_LO", 0x1C, "WO", "result ring address bits 31:0"),
    _reg("PSN", 0x20, "WO", "PSN of the next result to this worker", bits=24),
    _reg("CONTRIB_RKEY", 0x24, "WO", "R_Key the worker's contributions must carry (check 15)"),
)}


def _mac_words(mac: str) -> tuple[int, int]:
    b = mac_bytes(mac)
    return int.from_bytes(b[:2], "big"), int.from_bytes(b[2:], "big")


@dataclass(frozen=True)
class RegMap:
    """Addresses of one switch geometry: ``jobs`` jobs of up to ``workers`` workers each.

    ``modes``: the transport modes the switch implements (``MODES``; the
    RTL's are ``Mode.UC`` and Mode II, ``Mode.TRANSLATED``, and in a build with Mode III
    ``Mode.AUGMENTED``); :meth:`job_writes` refuses a job of any other, and what else the gateware does not
    run (:meth:`check_gateware`).
    """

    jobs: int
    workers: int
    modes: frozenset[Mode] = frozenset({Mode.UC, Mode.TRANSLATED})

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, int) or not 1 <= self.jobs <= MAX_JOBS:
            raise ValueError(f"jobs must be an integer in 1..{MAX_JOBS}, not {self.jobs!r}")
        if not isinstance(self.workers, int) or not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be an integer in 1..{MAX_WORKERS}, not {self.workers!r}")
        if JOB_BASE + self.jobs * JOB_STRIDE > WORKER_BASE:
            raise ValueError(f"{self.jobs} jobs do not fit the job register block")
        if not isinstance(self.modes, frozenset) or not self.modes or not self.modes <= set(MODE_CODES):
            raise ValueError(f"modes must be a non-empty frozenset of Mode, not {self.modes!r}")

    @classmethod
    def from_jobs(cls, value: int) -> "RegMap":
        """The register map of a switch whose ``JOBS`` register reads ``value``."""
        return cls(**JOBS.decode(value))

    @property
    def addr_width(self) -> int:
        """Bits of the AXI4-Lite byte address."""
        return (WORKER_BASE + self.jobs * self.workers * WORKER_STRIDE - 1).bit_length()

    @staticmethod
    def switch(register: str) -> int:
        """Address of switch register ``register`` (:data:`SWITCH_REGISTERS`)."""
        return SWITCH_REGISTERS[register].offset

    @staticmethod
    def counter(c: Counter) -> int:
        return COUNTER_BASE + 4 * Counter(c)

    @staticmethod
    def exc_stat(name: str) -> int:
        """Address of the exception engine's counter ``name`` (:data:`EXC_STATS`)."""
        if name not in EXC_STATS:
            raise ValueError(f"exception counter must be one of {', '.join(EXC_STATS)}, not {name!r}")
        return EXC_BASE + 4 * list(EXC_STATS).index(name)

    @staticmethod
    def mgmt_stat(name: str) -> int:
        """Address of the management bridge's counter ``name`` (:data:`MGMT_STATS`)."""
        if name not in MGMT_STATS:
            raise ValueError(f"management counter must be one of {', '.join(MGMT_STATS)}, not {name!r}")
        return MGMT_BASE + 4 * list(MGMT_STATS).index(name)

    @staticmethod
    def mac_stat(port: int, name: str) -> int:
        """Address of counter ``name`` (:data:`MAC_STATS`) of the Ethernet MAC on switch port ``port``."""
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < MAC_PORTS:
            raise ValueError(f"MAC port must be an integer in 0..{MAC_PORTS - 1}, not {port!r}")
        if name not in MAC_STATS:
            raise ValueError(f"MAC counter must be one of {', '.join(MAC_STATS)}, not {name!r}")
        return MAC_BASE + MAC_STRIDE * port + 4 * list(MAC_STATS).index(name)

    @staticmethod
    def exception(exc: ExceptionSpec | None) -> int:
        """The EXCEPTION value of a switch built with exception path ``exc``."""
        if exc is None:
            return 0
        return EXCEPTION.encode(log2_table=exc.table.bit_length() - 1, stash=exc.stash, max_kicks=exc.max_kicks)

    @staticmethod
    def decode_exception(value: int) -> ExceptionSpec | None:
        """The exception path an EXCEPTION value describes (:meth:`exception` inverted)."""
        f = EXCEPTION.decode(value)
        if not f["log2_table"]:
            return None
        return ExceptionSpec(1 << f["log2_table"], f["max_kicks"], f["stash"])

    def jobs_value(self) -> int:
        """The JOBS value of a switch with this map (:meth:`from_jobs` inverted)."""
        return JOBS.encode(jobs=self.jobs, workers=self.workers)

    def modes_value(self) -> int:
        """The MODES value of a switch with this map (:meth:`decode_modes` inverted)."""
        return MODES.encode(value=sum(1 << MODE_CODES[m] for m in self.modes))

    @staticmethod
    def decode_modes(value: int) -> frozenset[Mode]:
        """The modes a MODES value names."""
        bits = MODES.decode(value)["value"]
        return frozenset(m for m, code in MODE_CODES.items() if bits >> code & 1)

    def job(self, job: int, register: str) -> int:
        if not 0 <= job < self.jobs:
            raise ValueError(f"job must be in 0..{self.jobs - 1}, not {job!r}")
        return JOB_BASE + JOB_STRIDE * job + JOB_REGISTERS[register].offset

    def worker(self, job: int, worker: int, register: str) -> int:
        if not 0 <= job < self.jobs:
            raise ValueError(f"job must be in 0..{self.jobs - 1}, not {job!r}")
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker must be in 0..{self.workers - 1}, not {worker!r}")
        return WORKER_BASE + WORKER_STRIDE * (job * self.workers + worker) + WORKER_REGISTERS[register].offset

    @staticmethod
    def geometry(spec: SwitchSpec, width: int) -> int:
        """The GEOMETRY value of a switch built for ``spec`` at ``width`` bits.

        ``spec`` may be any description with ``ports``, ``slots`` and
        ``chunk_bytes`` (a :class:`~inagg.models.geometry.SwitchGeometry`).
        """
        return GEOMETRY.encode(ports=spec.ports, width64=width // 64, log2_slots=spec.slots.bit_length() - 1,
                               log2_chunk=spec.chunk_bytes.bit_length() - 1)

    @staticmethod
    def check_geometry(word: int, spec: SwitchSpec, jobs: Iterable[JobSpec]) -> None:
        """Raise ``ValueError`` saying why a switch whose ``GEOMETRY`` reads ``word`` cannot take ``jobs``
        planned for ``spec``: another chunk size, a job's slot region beyond its slots, a worker on a port it
        lacks."""
        g = GEOMETRY.decode(word)
        ports, slots, chunk = g["ports"], 1 << g["log2_slots"], 1 << g["log2_chunk"]
        built = f"{ports} ports, {slots} slots of {chunk}-byte chunks, {64 * g['width64']}-bit beats"
        if chunk != spec.chunk_bytes:
            raise ValueError(f"it is built for {built}; the plan's chunks are {spec.chunk_bytes} bytes")
        for job in jobs:
            if job.slot_base + job.slots > slots:
                raise ValueError(f"it is built for {built}; job {job.job} needs slots {job.slot_base}.."
                                 f"{job.slot_base + job.slots - 1}")
            if (port := max(w.port for w in job.workers)) >= ports:
                raise ValueError(f"it is built for {built}; job {job.job} has a worker on port {port}")

    def switch_writes(self, spec: SwitchSpec) -> list[tuple[int, int]]:
        """(address, value) writes that set a switch's addresses and P_Key."""
        hi, lo = _mac_words(spec.mac)
        values = {"MAC_HI": hi, "MAC_LO": lo, "IP": int.from_bytes(ip_bytes(spec.ip), "big"), "PKEY": spec.pkey}
        return [(self.switch(name), SWITCH_REGISTERS[name].encode(value=v)) for name, v in values.items()]

    @staticmethod
    def check_gateware(job: JobSpec, installed: Iterable[JobSpec] = ()) -> None:
        """Raise ``ValueError`` for a job the models run but the RTL switch does not (``docs/rtl.md``).

        The gateware runs a job on a switch alone or at the root of a tree
        of ordinary hosts: no ``parent`` (it sends no partial upward), no
        ``subswitches`` (it takes no child's partial with promoted lanes, a
        0x2B frame), AllReduce only (it has no collective's ``flow``: every
        worker sends and receives). A Mode II job shares no slot with a job
        of ``installed`` (nor a job with an installed Mode II job's), even
        with an exception path: ``TranslatedRules`` reads a slot without
        comparing its job, and a Mode II frame is never diverted.
        """
        if job.parent is not None:
            raise ValueError(f"job {job.job} is below the root of a tree (port {job.parent.port} faces its parent "
                             "switch): the RTL switch sends no partial upward; it runs a job alone or at the root")
        if job.subswitches:
            raise ValueError(f"job {job.job} has child switches (workers {', '.join(map(str, sorted(job.subswitches)))}"
                             "): the RTL switch takes no partial with promoted lanes from a child")
        if job.collective is not Collective.ALLREDUCE:
            raise ValueError(f"job {job.job} runs {job.collective.value}: the RTL switch runs allreduce only")
        for o in installed:
            if {job.mode, o.mode} & {Mode.TRANSLATED, Mode.AUGMENTED} and job.shares_slots(o):
                raise ValueError(f"job {job.job}'s slots {job.slot_base}..{job.slot_base + job.slots - 1} overlap "
                                 f"job {o.job}'s {o.slot_base}..{o.slot_base + o.slots - 1} and one of them is a "
                                 "Mode II or III job: the RTL's slot rules of those modes take a slot without its "
                                 "job, so such a job shares no slot, exception path or not")

    def job_writes(self, job: JobSpec, spec: SwitchSpec, installed: Iterable[JobSpec] = ()) -> list[tuple[int, int]]:
        """(address, value) writes that install ``job`` beside the jobs ``installed``, its workers first and its
        CTRL last.

        Raises ``ValueError``, before any write, for a job this switch
        cannot hold (:meth:`~inagg.models.job.SwitchSpec.check_job` with this
        map's job and worker counts and modes) or its gateware does not run
        (:meth:`check_gateware`).
        """
        installed = tuple(installed)
        spec.check_job(job, installed, jobs=self.jobs, workers=self.workers,
                       modes=sorted(self.modes, key=MODE_CODES.get))
        self.check_gateware(job, installed)
        out = []
        for w, ws in enumerate(job.workers):
            hi, lo = _mac_words(ws.mac)
            values = {"PORT": ws.port, "MAC_HI": hi, "MAC_LO": lo, "IP": int.from_bytes(ip_bytes(ws.ip), "big"),
                      "QPN": ws.qpn, "RKEY": ws.rkey, "VA_HI": ws.result_va >> 32,
                      "VA_LO": ws.result_va & 0xFFFFFFFF, "PSN": ws.result_psn, "CONTRIB_RKEY": job.contrib_rkey(w)}
            out += [(self.worker(job.job, w, name), WORKER_REGISTERS[name].encode(value=v))
                    for name, v in values.items()]
        values = {"SLOT_BASE": job.slot_base, "SLOTS": job.slots}
        out += [(self.job(job.job, name), JOB_REGISTERS[name].encode(value=v)) for name, v in values.items()]
        out.append((self.job(job.job, "CTRL"), self.ctrl(job)))
        return out

    @staticmethod
    def ctrl(job: JobSpec) -> int:
        """The CTRL value that enables ``job``."""
        return JOB_CTRL.encode(enable=1, workers=len(job.workers), mode=MODE_CODES[job.mode])

    def markdown(self) -> str:
        """The register map as the Markdown tables of ``docs/rtl.md``."""
        lines = ["| address | register | access | meaning |", "|---|---|---|---|"]
        for r in SWITCH_REGISTERS.values():
            lines.append(f"| 0x{r.offset:04X} | {r.name} | {r.access} | {r.meaning()} |")
        for c in Counter:
            lines.append(f"| 0x{self.counter(c):04X} | {c.name} | RO | counter `protocol.Counter.{c.name}` |")
        for name, doc in EXC_STATS.items():
            lines.append(f"| 0x{self.exc_stat(name):04X} | EXC.{name} | RO | {doc}; SLVERR without an exception path |")
        for name, doc in MGMT_STATS.items():
            lines.append(f"| 0x{self.mgmt_stat(name):04X} | MGMT.{name} | RO | {doc}; SLVERR without a management "
                         "bridge |")
        for name, doc in MAC_STATS.items():
            lines.append(f"| 0x{self.mac_stat(0, name):04X} + 0x{MAC_STRIDE:X} p | MAC.{name} | RO "
                         f"| port p's MAC: {doc}; SLVERR for a port without a MAC |")
        for r in JOB_REGISTERS.values():
            lines.append(f"| 0x{JOB_BASE + r.offset:04X} + 0x{JOB_STRIDE:X} j | JOB.{r.name} | {r.access} "
                         f"| {r.meaning()} |")
        for r in WORKER_REGISTERS.values():
            lines.append(f"| 0x{WORKER_BASE + r.offset:04X} + 0x{WORKER_STRIDE:X} (j W + w) | WORKER.{r.name} "
                         f"| {r.access} | {r.meaning()} |")
        return "\n".join(lines) + "\n"

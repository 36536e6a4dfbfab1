"""The AXI4-Lite register map of the RTL switch, described once.

The gateware decodes these addresses, the testbenches and the host
controller write and read through them, and ``docs/rtl.md`` lists them
(:func:`markdown` writes that table; a test keeps the document in step).
Every register is 32 bits wide and word-aligned.

The map depends on the switch's geometry (``jobs`` and ``workers`` per job
are build parameters), read back from ``GEOMETRY``::

    0x0000  ID          RO  "inAG" (0x696E4147)
    0x0004  GEOMETRY    RO  ports[7:0] | width/64[11:8] | log2 slots[19:16] | log2 chunk[27:24]
    0x0008  JOBS        RO  jobs[15:0] | workers per job[23:16]
    0x0010  MAC_HI      RW  switch MAC bytes 0-1 (bits 15:0, byte 0 high)
    0x0014  MAC_LO      RW  switch MAC bytes 2-5
    0x0018  IP          RW  switch IPv4 address
    0x001C  PKEY        RW  P_Key contributions must carry (resets to 0xFFFF)
    0x0020  EXCEPTION   RO  log2 table[4:0] (0: no exception path) | stash[14:8] | max_kicks[26:16]
    0x0024  TEARDOWN    RW  write a job number: tear the job down; read busy[0] | refused[1]
    0x0100  counter c   RO  protocol.Counter c at 0x100 + 4 c
    0x0200  exc stat i  RO  the exception engine's counters (EXC_STATS) at 0x200 + 4 i
    0x1000  job j       RW  8 registers at 0x1000 + 0x20 j   (JOB_FIELDS)
    0x8000  worker      WO  16 registers at 0x8000 + 0x40 (j * workers + w)   (WORKER_FIELDS)

A job's ``CTRL`` register enables it: the controller writes the other
fields of a job and of its workers first and ``CTRL`` last. Writing a job
number to ``TEARDOWN`` removes the job as ``ModelSwitch.remove_job`` does
(its ``CTRL`` enable bit clears, its slots and overflow slots are freed);
the controller polls ``TEARDOWN`` until :data:`TEARDOWN_BUSY` clears
(``docs/exception.md`` "Teardown").
"""

from __future__ import annotations

from dataclasses import dataclass

from inagg.models.job import ExceptionSpec, JobSpec, SwitchSpec
from inagg.models.protocol import MAX_JOBS, MAX_WORKERS, Counter
from inagg.models.wire import ip_bytes, mac_bytes

__all__ = ["ID_VALUE", "TEARDOWN_BUSY", "TEARDOWN_REFUSED", "SWITCH_FIELDS", "JOB_FIELDS", "WORKER_FIELDS",
           "COUNTER_BASE", "EXC_BASE", "EXC_STATS", "JOB_BASE", "JOB_STRIDE", "WORKER_BASE", "WORKER_STRIDE", "RegMap"]

ID_VALUE = 0x696E4147
TEARDOWN_BUSY = 1 << 0
"""``TEARDOWN`` read: a teardown is running; frames wait at the ports meanwhile."""
TEARDOWN_REFUSED = 1 << 1
"""``TEARDOWN`` read: the last teardown changed nothing: another job's key diverted from a slot the job holds."""

# name: (offset, access, description)
SWITCH_FIELDS = {
    "ID": (0x00, "RO", 'identifies the register map: "inAG"'),
    "GEOMETRY": (0x04, "RO", "ports [7:0], width/64 [11:8], log2 slots [19:16], log2 chunk bytes [27:24]"),
    "JOBS": (0x08, "RO", "jobs [15:0], workers per job [23:16]"),
    "MAC_HI": (0x10, "RW", "switch MAC bytes 0-1 in bits 15:0 (byte 0 in 15:8)"),
    "MAC_LO": (0x14, "RW", "switch MAC bytes 2-5 (byte 2 in 31:24)"),
    "IP": (0x18, "RW", "switch IPv4 address (first byte in 31:24)"),
    "PKEY": (0x1C, "RW", "P_Key that contributions must carry; resets to 0xFFFF"),
    "EXCEPTION": (0x20, "RO", "exception path: log2 table [4:0] (0: none), stash [14:8], max_kicks [26:16]"),
    "TEARDOWN": (0x24, "RW", "write a job number: tear that job down (SLVERR while busy, or for a job that is not "
                             "enabled); read: busy [0], last teardown refused [1]: a slot of the job hosts "
                             "overflow keys of other jobs"),
}
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
JOB_BASE, JOB_STRIDE = 0x1000, 0x20
JOB_FIELDS = {
    "CTRL": (0x00, "RW", "bit 0: job enabled; bits 14:8: worker count"),
    "RKEY": (0x04, "RW", "R_Key of the job's contributions"),
    "SLOT_BASE": (0x08, "RW", "first slot of the job's region"),
    "SLOTS": (0x0C, "RW", "slots in the region (a power of two)"),
}
WORKER_BASE, WORKER_STRIDE = 0x8000, 0x40
WORKER_FIELDS = {
    "PORT": (0x00, "WO", "switch port of the worker"),
    "MAC_HI": (0x04, "WO", "worker MAC bytes 0-1"),
    "MAC_LO": (0x08, "WO", "worker MAC bytes 2-5"),
    "IP": (0x0C, "WO", "worker IPv4 address"),
    "QPN": (0x10, "WO", "worker QPN (24 bits)"),
    "RKEY": (0x14, "WO", "R_Key of the worker's result ring"),
    "VA_HI": (0x18, "WO", "result ring address bits 63:32"),
    "VA_LO": (0x1C, "WO", "result ring address bits 31:0"),
    "PSN": (0x20, "WO", "PSN of the next result to this worker (24 bits)"),
}


def _mac_words(mac: str) -> tuple[int, int]:
    b = mac_bytes(mac)
    return int.from_bytes(b[:2], "big"), int.from_bytes(b[2:], "big")


@dataclass(frozen=True)
class RegMap:
    """Addresses of one switch geometry: ``jobs`` jobs of up to ``workers`` workers each."""

    jobs: int
    workers: int

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, int) or not 1 <= self.jobs <= MAX_JOBS:
            raise ValueError(f"jobs must be an integer in 1..{MAX_JOBS}, not {self.jobs!r}")
        if not isinstance(self.workers, int) or not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be an integer in 1..{MAX_WORKERS}, not {self.workers!r}")
        if JOB_BASE + self.jobs * JOB_STRIDE > WORKER_BASE:
            raise ValueError(f"{self.jobs} jobs do not fit the job register block")

    @property
    def addr_width(self) -> int:
        """Bits of the AXI4-Lite byte address."""
        return (WORKER_BASE + self.jobs * self.workers * WORKER_STRIDE - 1).bit_length()

    @staticmethod
    def switch(field: str) -> int:
        return SWITCH_FIELDS[field][0]

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
    def exception(exc: ExceptionSpec | None) -> int:
        """The EXCEPTION value of a switch built with exception path ``exc``."""
        if exc is None:
            return 0
        return (exc.table.bit_length() - 1) | exc.stash << 8 | exc.max_kicks << 16

    @staticmethod
    def decode_exception(value: int) -> ExceptionSpec | None:
        """The exception path an EXCEPTION value describes (:meth:`exception` inverted)."""
        if not value & 0x1F:
            return None
        return ExceptionSpec(1 << (value & 0x1F), value >> 16 & 0x7FF, value >> 8 & 0x7F)

    def job(self, job: int, field: str) -> int:
        if not 0 <= job < self.jobs:
            raise ValueError(f"job must be in 0..{self.jobs - 1}, not {job!r}")
        return JOB_BASE + JOB_STRIDE * job + JOB_FIELDS[field][0]

    def worker(self, job: int, worker: int, field: str) -> int:
        if not 0 <= job < self.jobs:
            raise ValueError(f"job must be in 0..{self.jobs - 1}, not {job!r}")
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker must be in 0..{self.workers - 1}, not {worker!r}")
        return WORKER_BASE + WORKER_STRIDE * (job * self.workers + worker) + WORKER_FIELDS[field][0]

    def geometry(self, spec: SwitchSpec, width: int) -> int:
        """The GEOMETRY value of a switch built for ``spec`` at ``width`` bits."""
        return (spec.ports | (width // 64) << 8 | (spec.slots.bit_length() - 1) << 16
                | (spec.chunk_bytes.bit_length() - 1) << 24)

    def switch_writes(self, spec: SwitchSpec) -> list[tuple[int, int]]:
        """(address, value) writes that set a switch's addresses and P_Key."""
        hi, lo = _mac_words(spec.mac)
        return [(self.switch("MAC_HI"), hi), (self.switch("MAC_LO"), lo),
                (self.switch("IP"), int.from_bytes(ip_bytes(spec.ip), "big")), (self.switch("PKEY"), spec.pkey)]

    def job_writes(self, job: JobSpec, spec: SwitchSpec) -> list[tuple[int, int]]:
        """(address, value) writes that install ``job``, its workers first and its CTRL last.

        Raises ``ValueError`` for a job this switch cannot hold, with the
        model switch's checks (region inside the slot memory, worker ports
        that exist) and the geometry's (job number, worker count).
        """
        if job.job >= self.jobs:
            raise ValueError(f"job {job.job} does not exist: the switch has {self.jobs} jobs")
        if len(job.workers) > self.workers:
            raise ValueError(f"job {job.job} has {len(job.workers)} workers, the switch at most {self.workers}")
        if job.slot_base + job.slots > spec.slots:
            raise ValueError(f"job {job.job}'s slots {job.slot_base}..{job.slot_base + job.slots - 1} "
                             f"exceed the switch's {spec.slots} slots")
        out = []
        for w, ws in enumerate(job.workers):
            if ws.port >= spec.ports:
                raise ValueError(f"worker port {ws.port} does not exist: the switch has {spec.ports} ports")
            hi, lo = _mac_words(ws.mac)
            values = {"PORT": ws.port, "MAC_HI": hi, "MAC_LO": lo, "IP": int.from_bytes(ip_bytes(ws.ip), "big"),
                      "QPN": ws.qpn, "RKEY": ws.rkey, "VA_HI": ws.result_va >> 32,
                      "VA_LO": ws.result_va & 0xFFFFFFFF, "PSN": ws.result_psn}
            out += [(self.worker(job.job, w, f), v) for f, v in values.items()]
        out += [(self.job(job.job, "RKEY"), job.rkey), (self.job(job.job, "SLOT_BASE"), job.slot_base),
                (self.job(job.job, "SLOTS"), job.slots),
                (self.job(job.job, "CTRL"), 1 | len(job.workers) << 8)]
        return out

    def markdown(self) -> str:
        """The register map as the Markdown tables of ``docs/rtl.md``."""
        lines = ["| address | register | access | meaning |", "|---|---|---|---|"]
        for name, (off, acc, doc) in SWITCH_FIELDS.items():
            lines.append(f"| 0x{off:04X} | {name} | {acc} | {doc} |")
        for c in Counter:
            lines.append(f"| 0x{self.counter(c):04X} | {c.name} | RO | counter `protocol.Counter.{c.name}` |")
        for name, doc in EXC_STATS.items():
            lines.append(f"| 0x{self.exc_stat(name):04X} | EXC.{name} | RO | {doc}; SLVERR without an exception path |")
        for name, (off, acc, doc) in JOB_FIELDS.items():
            lines.append(f"| 0x{JOB_BASE + off:04X} + 0x{JOB_STRIDE:X} j | JOB.{name} | {acc} | {doc} |")
        for name, (off, acc, doc) in WORKER_FIELDS.items():
            lines.append(f"| 0x{WORKER_BASE + off:04X} + 0x{WORKER_STRIDE:X} (j W + w) | WORKER.{name} | {acc} | {doc} |")
        return "\n".join(lines) + "\n"


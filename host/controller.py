"""The controller: plans jobs on a switch and configures them, from one description.

:func:`plan` turns "these jobs with this many workers each" into a
:class:`Plan`: the :class:`~inagg.models.job.SwitchSpec` and one
:class:`~inagg.models.job.JobSpec` per job, with every address the protocol
needs -- switch ports, MACs and IPs, worker QPNs, the job R_Keys, the result
rings (R_Key and virtual address) and disjoint slot regions. The same plan
configures every switch implementation through :class:`Controller`, which
talks to a target with the control-plane interface of
:class:`~inagg.models.switch.ModelSwitch` (``add_job`` / ``remove_job``);
the hosts derive their frames from the same plan. :class:`RegisterTarget` is
that interface on the RTL's AXI4-Lite register map
(:class:`inagg.models.regmap.RegMap`), for any bus with a synchronous
``write(address, value)``; :func:`register_writes` lists the same writes for
a bus that is driven asynchronously (a cocotb AXI4-Lite master).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inagg.models.job import JobSpec, SwitchSpec, WorkerSpec
from inagg.models.protocol import CHUNK_BYTES_DEFAULT, MAX_JOBS, MAX_WORKERS
from inagg.models.regmap import TEARDOWN, RegMap

__all__ = ["Plan", "plan", "ConfigTarget", "Controller", "RegisterTarget", "register_writes", "worker_mac",
           "worker_ip", "SWITCH_MAC", "SWITCH_IP", "MAX_SLOTS"]

SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"
# Result rings sit at this virtual address in every worker's (notional) memory.
RESULT_VA = 0x7F00_0000_0000
_JOB_RKEY = 0x4A0B_0000
_RESULT_RKEY = 0x5E5E_0000
_WORKER_QPN = 0x01_0000
# Slot memory of the largest switch a plan describes (the model allocates every slot).
MAX_SLOTS = 1 << 16


def worker_mac(port: int) -> str:
    """MAC address of the worker on switch port ``port``."""
    return f"02:00:00:00:01:{port:02x}"


def worker_ip(port: int) -> str:
    """IPv4 address of the worker on switch port ``port`` (10.0.0.1 upwards, in the switch's /24)."""
    return f"10.0.0.{port + 1}"


@dataclass(frozen=True)
class Plan:
    """A switch and the jobs configured on it."""

    switch: SwitchSpec
    jobs: tuple[JobSpec, ...]


def plan(workers: Sequence[int], *, window: int = 128, chunk_bytes: int = CHUNK_BYTES_DEFAULT,
         first_job: int = 1) -> Plan:
    """Plan ``len(workers)`` concurrent jobs, job ``j`` with ``workers[j]`` workers.

    Each worker gets its own switch port (ports numbered job by job); each job
    a region of ``2 * window`` slots (the window rule of ``docs/protocol.md``
    section 3), regions side by side so no two jobs collide. The switch gets
    the smallest power-of-two slot memory that holds them.
    """
    workers = list(workers)
    if not workers:
        raise ValueError("plan needs at least one job")
    for n in workers:
        if not isinstance(n, int) or not 1 <= n <= MAX_WORKERS:
            raise ValueError(f"a job has 1..{MAX_WORKERS} workers, not {n!r}")
    if not isinstance(window, int) or window < 1 or window & (window - 1):
        raise ValueError(f"window must be a power of two >= 1, not {window!r}")
    if not isinstance(first_job, int) or not 0 <= first_job or first_job + len(workers) > MAX_JOBS:
        raise ValueError(f"jobs {first_job}..{first_job + len(workers) - 1} do not fit the {MAX_JOBS} job numbers")
    ports = sum(workers)
    if ports > 253:
        raise ValueError(f"{ports} workers do not fit one /24 beside the switch (at most 253)")
    region = 2 * window
    slots = 1 << max(1, (region * len(workers) - 1).bit_length())
    if slots > MAX_SLOTS:
        raise ValueError(f"{len(workers)} job(s) with window {window} need {slots} slots, more than the "
                         f"{MAX_SLOTS} a plan may use")
    switch = SwitchSpec(mac=SWITCH_MAC, ip=SWITCH_IP, ports=max(ports, 1), slots=slots, chunk_bytes=chunk_bytes)
    jobs, port = [], 0
    for j, n in enumerate(workers):
        specs = []
        for _ in range(n):
            specs.append(WorkerSpec(port=port, mac=worker_mac(port), ip=worker_ip(port), qpn=_WORKER_QPN + port,
                                    rkey=_RESULT_RKEY + port, result_va=RESULT_VA))
            port += 1
        jobs.append(JobSpec(job=first_job + j, rkey=_JOB_RKEY + first_job + j, slot_base=j * region,
                            slots=region, workers=tuple(specs)))
    return Plan(switch, tuple(jobs))


class ConfigTarget(Protocol):
    """The control plane of a switch implementation (the model switch has it as is)."""

    def add_job(self, job: JobSpec) -> None: ...

    def remove_job(self, job: int) -> None: ...


class Controller:
    """Configures the jobs of a :class:`Plan` on a switch and tears them down again."""

    def __init__(self, target: ConfigTarget, plan: Plan):
        self.target, self.plan = target, plan
        self._installed: list[int] = []

    def configure(self) -> None:
        """Install every job of the plan."""
        for job in self.plan.jobs:
            self.target.add_job(job)
            self._installed.append(job.job)

    def teardown(self) -> None:
        """Remove every job this controller installed, releasing their slots."""
        while self._installed:
            self.target.remove_job(self._installed.pop())

    def __enter__(self) -> "Controller":
        self.configure()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()


def register_writes(plan: Plan, regmap: RegMap) -> list[tuple[int, int]]:
    """Every (address, value) write that configures ``plan`` on an RTL switch, in order.

    The switch's addresses and P_Key first, then each job as
    :meth:`~inagg.models.regmap.RegMap.job_writes` orders it (its CTRL last).
    """
    out = regmap.switch_writes(plan.switch)
    for job in plan.jobs:
        out += regmap.job_writes(job, plan.switch)
    return out


class RegisterTarget:
    """A :class:`ConfigTarget` that writes the RTL switch's register map through ``write(address, value)``.

    The first :meth:`add_job` also writes the switch-wide registers (MAC, IP,
    P_Key) of ``spec``; :meth:`remove_job` writes the job's number to
    ``TEARDOWN``, which removes it as ``ModelSwitch.remove_job`` does (its
    enable bit and its slots cleared). With ``read(address)`` given,
    :meth:`remove_job` also waits until the gateware is done and raises
    :class:`RuntimeError` when it refused the teardown; without it the caller
    must poll ``TEARDOWN`` before giving the job's region to another job.
    """

    def __init__(self, write: Callable[[int, int], None], regmap: RegMap, spec: SwitchSpec,
                 read: Callable[[int], int] | None = None):
        self._write, self._read, self.regmap, self.spec = write, read, regmap, spec
        self._switch_written = False

    def add_job(self, job: JobSpec) -> None:
        writes = self.regmap.job_writes(job, self.spec)  # validates before anything is written
        if not self._switch_written:
            writes = self.regmap.switch_writes(self.spec) + writes
            self._switch_written = True
        for addr, value in writes:
            self._write(addr, value)

    def remove_job(self, job: int) -> None:
        addr = self.regmap.switch("TEARDOWN")
        self._write(addr, TEARDOWN.encode(job=job))
        if self._read is None:
            return
        while TEARDOWN.decode(status := self._read(addr))["busy"]:
            pass
        if TEARDOWN.decode(status)["refused"]:
            raise RuntimeError(f"the switch refused to tear job {job} down (TEARDOWN 0x{status:08X}): another "
                               "job's key diverted from one of its slots; tear that job down first")

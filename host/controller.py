"""The controller: plans jobs on a switch and configures them, from one description.

:func:`plan` turns "these jobs with this many workers each" into a
:class:`Plan`: the :class:`~inagg.models.job.SwitchSpec` and one
:class:`~inagg.models.job.JobSpec` per job, with every address the protocol
needs -- switch ports, MACs and IPs, worker QPNs, the job R_Keys, the result
rings (R_Key and virtual address) and disjoint slot regions. The same plan
configures every switch implementation through :class:`Controller`, which
talks to a target with the control-plane interface of
:class:`~inagg.models.switch.ModelSwitch` (``add_job`` / ``remove_job``);
the hosts derive their frames from the same plan. :func:`plan_tree` does the
same for a tree of switches (:class:`~inagg.models.tree.Tree`): one job
description gives each switch its :class:`Plan`, whose job lists the
switch's children as workers and its uplink, and :class:`TreeController`
configures them all; :func:`plan_tree_jobs` puts several such jobs on the
same tree at once. :class:`RegisterTarget` is
that interface on the RTL's AXI4-Lite register map
(:class:`inagg.models.regmap.RegMap`), for any bus with a synchronous
``write(address, value)``; :func:`register_writes` lists the same writes for
a bus that is driven asynchronously (a cocotb AXI4-Lite master).
:func:`management_target` is a :class:`RegisterTarget` over management
frames (:class:`inagg.host.mgmt.MgmtBus`), for a board whose only host link
is its Ethernet, and :func:`mac_counters` reads a board port's MAC counters
over the same bus.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inagg.models.job import Collective, JobSpec, Mode, SwitchSpec, Uplink, WorkerSpec
from inagg.models.protocol import CHUNK_BYTES_DEFAULT, MAX_JOBS, MAX_WORKERS, switch_qpn
from inagg.models.regmap import MAC_STATS, MODE_CODES, TEARDOWN, RegMap
from inagg.models.tree import Tree

__all__ = ["Plan", "plan", "ConfigTarget", "Controller", "RegisterTarget", "register_writes", "worker_mac",
           "worker_ip", "management_target", "mac_counters", "SWITCH_MAC", "SWITCH_IP", "MAX_SLOTS", "TreePlan",
           "plan_tree", "plan_tree_jobs", "TreeController"]

SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"
# Result rings sit at this virtual address in every worker's (notional) memory.
RESULT_VA = 0x7F00_0000_0000
_JOB_RKEY = 0x4A0B_0000
_CONTRIB_RKEY = 0x4A0C_0000
_RESULT_RKEY = 0x5E5E_0000
_WORKER_QPN = 0x01_0000
# A switch of a tree takes its parent's results on QPN _SWITCH_QPN + its index, R_Key _SWITCH_RKEY + index.
_SWITCH_QPN = 0x02_0000
_SWITCH_RKEY = 0x5E5F_0000
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
         first_job: int = 1, collective: Collective | str = Collective.ALLREDUCE, root: int = 0,
         mode: Mode = Mode.UC, worker_rkeys: bool = False) -> Plan:
    """Plan ``len(workers)`` concurrent jobs, job ``j`` with ``workers[j]`` workers, each running ``collective``
    (with root worker ``root`` for Reduce and Broadcast) in ``mode`` (``JobSpec`` refuses a collective the
    mode does not run). With ``worker_rkeys`` every worker gets a contribution R_Key of its own
    (``WorkerSpec.contrib_rkey``: the model, fast and RTL switches take it, the P4 programs refuse it).

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
                                    rkey=_RESULT_RKEY + port, result_va=RESULT_VA,
                                    contrib_rkey=_CONTRIB_RKEY + port if worker_rkeys else None))
            port += 1
        jobs.append(JobSpec(job=first_job + j, rkey=_JOB_RKEY + first_job + j, slot_base=j * region,
                            slots=region, workers=tuple(specs), collective=Collective(collective),
                            root=root if Collective(collective).rooted else None, mode=mode))
    return Plan(switch, tuple(jobs))


@dataclass(frozen=True)
class TreePlan:
    """Jobs on a tree of switches: the tree, and per switch (in tree order) the :class:`Plan` of its jobs.

    :func:`plan_tree` gives one job, :func:`plan_tree_jobs` several, in the
    same order on every switch. Rank ``r`` is worker :meth:`rank` of every
    job on its leaf switch.
    """

    tree: Tree
    plans: tuple[Plan, ...]

    @property
    def collective(self) -> Collective:
        return self.plans[0].jobs[0].collective

    def rank(self, r: int) -> tuple[int, int]:
        """(switch index, worker index there) of rank ``r``."""
        return self.tree.leaf_of(r)


def plan_tree(tree: Tree | str, *, window: int = 128, chunk_bytes: int = CHUNK_BYTES_DEFAULT, job: int = 1,
              collective: Collective | str = Collective.ALLREDUCE, root: int = 0, mode: Mode = Mode.UC) -> TreePlan:
    """Plan job ``job`` running ``collective`` in ``mode`` on ``tree`` (a :class:`~inagg.models.tree.Tree` or
    its spec).

    Every switch gets a region of ``2 * window`` slots at slot 0 and the
    job's one R_Key and number; a child switch is a worker of its parent,
    with a result QPN and R_Key of its own, and its job's
    :class:`~inagg.models.job.Uplink` names the parent's QPN for it. ``root``
    is the root rank of Reduce and Broadcast (ignored otherwise).
    """
    if isinstance(tree, str):
        tree = Tree.parse(tree)
    collective = Collective(collective)
    if not isinstance(window, int) or window < 1 or window & (window - 1):
        raise ValueError(f"window must be a power of two >= 1, not {window!r}")
    if not isinstance(job, int) or not 0 <= job < MAX_JOBS:
        raise ValueError(f"job must be an integer in 0..{MAX_JOBS - 1}, not {job!r}")
    if collective.rooted and (not isinstance(root, int) or not 0 <= root < tree.ranks):
        raise ValueError(f"root must be a rank in 0..{tree.ranks - 1}, not {root!r}")
    region = max(2, 2 * window)
    rkey = _JOB_RKEY + job
    switches = tree.switches

    def worker(port: int, child) -> WorkerSpec:
        if child.switch:
            c = switches[child.index]
            return WorkerSpec(port=port, mac=c.mac, ip=c.ip, qpn=_SWITCH_QPN + c.index, rkey=_SWITCH_RKEY + c.index,
                              result_va=RESULT_VA)
        r = child.index
        return WorkerSpec(port=port, mac=tree.rank_mac(r), ip=tree.rank_ip(r), qpn=_WORKER_QPN + r,
                          rkey=_RESULT_RKEY + r, result_va=RESULT_VA)

    plans = []
    for s in switches:
        uplink = None
        if s.parent is not None:
            p = switches[s.parent]
            uplink = Uplink(port=s.uplink_port, mac=p.mac, ip=p.ip, qpn=switch_qpn(job, s.position), rkey=rkey,
                            result_qpn=_SWITCH_QPN + s.index, result_rkey=_SWITCH_RKEY + s.index,
                            result_va=RESULT_VA)
        spec = JobSpec(job=job, rkey=rkey, slot_base=0, slots=region,
                       workers=tuple(worker(i, c) for i, c in enumerate(s.children)), parent=uplink,
                       subswitches=frozenset(i for i, c in enumerate(s.children) if c.switch),
                       collective=collective, root=s.child_towards(root) if collective.rooted else None,
                       ranks=tree.ranks, mode=mode)
        plans.append(Plan(SwitchSpec(mac=s.mac, ip=s.ip, ports=s.ports, slots=region, chunk_bytes=chunk_bytes),
                          (spec,)))
    return TreePlan(tree, tuple(plans))


def plan_tree_jobs(tree: Tree | str, jobs: int, *, window: int = 128, chunk_bytes: int = CHUNK_BYTES_DEFAULT,
                   first_job: int = 1, collective: Collective | str = Collective.ALLREDUCE, root: int = 0,
                   mode: Mode = Mode.UC) -> TreePlan:
    """``jobs`` concurrent jobs ``first_job ..``, each running ``collective`` in ``mode`` over every rank of
    ``tree``: one :func:`plan_tree` per job, moved to a slot region of its own and to QPNs of its own on the
    ranks and on the switches' uplinks.

    Job ``j`` (counting from 0) takes slots ``j * 2W ..`` of every switch,
    whose slot memory is the smallest power of two holding every region;
    rank ``r`` is QP ``plan_tree``'s QPN ``+ j * ranks`` in it, and a child
    switch takes its results on its QPN ``+ j * switches``. Each rank then
    has one QP per job behind its one port
    (:class:`~inagg.host.memnet.RankMux` hands a frame to the job it names).
    With ``jobs == 1`` the plan is :func:`plan_tree`'s. ``ValueError`` when
    ``jobs`` is not a positive integer, a job number passes ``MAX_JOBS``, or
    two of these QPNs meet.
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
    plans = [plan_tree(tree, window=window, chunk_bytes=chunk_bytes, job=first_job + j, collective=collective,
                       root=root, mode=mode) for j in range(jobs)]
    tree, n_sw = plans[0].tree, len(plans[0].plans)
    region = plans[0].plans[0].jobs[0].slots
    slots = 1 << (jobs * region - 1).bit_length()
    if slots > MAX_SLOTS:
        raise ValueError(f"{jobs} jobs with window {window} need {slots} slots, more than the {MAX_SLOTS} a plan "
                         "may use")
    per_switch: list[list[JobSpec]] = [[] for _ in range(n_sw)]
    for j, tp in enumerate(plans):
        for s, p in enumerate(tp.plans):
            job = p.jobs[0]
            workers = tuple(dataclasses.replace(w, qpn=w.qpn + j * (n_sw if i in job.subswitches else tree.ranks))
                            for i, w in enumerate(job.workers))
            parent = None if job.parent is None else dataclasses.replace(
                job.parent, result_qpn=job.parent.result_qpn + j * n_sw)
            per_switch[s].append(dataclasses.replace(job, slot_base=j * region, workers=workers, parent=parent))
    qpns = [w.qpn for js in per_switch for job in js for w in job.workers]
    if len(set(qpns)) != len(qpns):
        raise ValueError(f"{jobs} jobs of {tree.ranks} ranks: the ranks' and switches' QPNs overlap")
    return TreePlan(tree, tuple(Plan(dataclasses.replace(p.switch, slots=slots), tuple(per_switch[s]))
                                for s, p in enumerate(plans[0].plans)))


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
    for i, job in enumerate(plan.jobs):
        out += regmap.job_writes(job, plan.switch, plan.jobs[:i])
    return out


class RegisterTarget:
    """A :class:`ConfigTarget` that writes the RTL switch's register map through ``write(address, value)``.

    The first :meth:`add_job` also writes the switch-wide registers (MAC, IP,
    P_Key) of ``spec``; :meth:`remove_job` writes the job's number to
    ``TEARDOWN``, which removes it as ``ModelSwitch.remove_job`` does (its
    enable bit and its slots cleared). A job the register map cannot hold
    (its mode among them: ``RegMap.modes``) or the gateware does not run
    beside the jobs this target installed (``RegMap.check_gateware``: a
    tree below its root, a collective other than AllReduce, a Mode II job
    sharing slots) is refused with ``ValueError`` before anything is
    written. With ``read(address)`` given, :meth:`add_job` also reads the
    job's ``CTRL`` back and raises :class:`RuntimeError` when the switch
    refused it (a mode the build lacks, named from ``MODES``, or slots
    shared with a Mode II job another controller installed), and
    :meth:`remove_job` waits until the gateware is done and raises
    :class:`RuntimeError` when it refused the teardown; without it the caller
    must poll ``TEARDOWN`` before giving the job's region to another job.
    """

    def __init__(self, write: Callable[[int, int], None], regmap: RegMap, spec: SwitchSpec,
                 read: Callable[[int], int] | None = None):
        self._write, self._read, self.regmap, self.spec = write, read, regmap, spec
        self._switch_written = False
        self._installed: dict[int, JobSpec] = {}

    def add_job(self, job: JobSpec) -> None:
        # validates before anything is written
        writes = self.regmap.job_writes(job, self.spec, self._installed.values())
        if not self._switch_written:
            writes = self.regmap.switch_writes(self.spec) + writes
            self._switch_written = True
        for addr, value in writes:
            self._write(addr, value)
        self._installed[job.job] = job
        if self._read is None:
            return
        want = self.regmap.ctrl(job)
        got = self._read(self.regmap.job(job.job, "CTRL"))
        if got != want:
            modes = RegMap.decode_modes(self._read(self.regmap.switch("MODES")))
            raise RuntimeError(f"the switch refused job {job.job}: its CTRL reads 0x{got:08X}, not 0x{want:08X}; "
                               f"the job asks for mode {job.mode.name}, the switch takes "
                               f"{', '.join(m.name for m in sorted(modes, key=MODE_CODES.get)) or 'none'} (MODES) "
                               "and enables no job that shares a slot with an enabled Mode II or III job")

    def remove_job(self, job: int) -> None:
        addr = self.regmap.switch("TEARDOWN")
        self._write(addr, TEARDOWN.encode(job=job))
        self._installed.pop(job, None)
        if self._read is None:
            return
        while TEARDOWN.decode(status := self._read(addr))["busy"]:
            pass
        if TEARDOWN.decode(status)["refused"]:
            raise RuntimeError(f"the switch refused to tear job {job} down (TEARDOWN 0x{status:08X}): another "
                               "job's key diverted from one of its slots; tear that job down first")


def management_target(bus, regmap: RegMap, spec: SwitchSpec) -> RegisterTarget:
    """A :class:`RegisterTarget` that writes and reads the register map through ``bus``, a
    :class:`inagg.host.mgmt.MgmtBus` (or anything with its ``write`` and ``read``): over the board's Ethernet."""
    return RegisterTarget(bus.write, regmap, spec, read=bus.read)


def mac_counters(bus, port: int) -> dict[str, int]:
    """The counters of the Ethernet MAC on switch port ``port`` (:data:`~inagg.models.regmap.MAC_STATS`), by name,
    read one by one through ``bus`` (anything with a ``read(address)``: a :class:`inagg.host.mgmt.MgmtBus` on a
    board). A switch without a MAC on that port refuses the reads (SLVERR: :class:`~inagg.host.mgmt.MgmtError`
    on a ``MgmtBus``).

    On the management port each read is itself a frame in and its answer a frame out, so ``rx_good`` and
    ``tx_frames`` there count this call's own requests and answers up to each read.
    """
    return {name: bus.read(RegMap.mac_stat(port, name)) for name in MAC_STATS}


class TreeController:
    """Configures a :class:`TreePlan` on its switches (``targets``, in tree order) and tears it down again."""

    def __init__(self, targets: Sequence[ConfigTarget], plan: TreePlan):
        if len(targets) != len(plan.plans):
            raise ValueError(f"the tree has {len(plan.plans)} switches, not {len(targets)}")
        self.plan = plan
        self._controllers = [Controller(t, p) for t, p in zip(targets, plan.plans)]

    def configure(self) -> None:
        """Install the jobs on every switch, root first."""
        for c in self._controllers:
            c.configure()

    def teardown(self) -> None:
        """Remove the jobs from every switch, leaves first."""
        for c in reversed(self._controllers):
            c.teardown()

    def __enter__(self) -> "TreeController":
        self.configure()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

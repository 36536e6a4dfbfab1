"""Target-neutral configuration of the inagg P4 programs.

:func:`plan` turns a switch and its jobs into the entries the programs of
``p4/`` need: one ``workers`` entry per (job, worker) keyed on the switch
QPN (with the worker's contribution R_Key: its own, else the job's), one
``results`` entry per (job, worker) for the egress rewrite, one
multicast group per job with one replica per worker (replication id = worker
index), the initial result PSN of every worker, and each job's slot region.
The renderers in :mod:`.bmv2` and :mod:`.bfrt` only spell these out; the
names they use are the ones declared in ``p4/v1model/inagg.p4`` and
``p4/tna/inagg.p4``.

Everything a plan holds for a job carries the job's number, so
:meth:`Plan.only` finds all of it: the renderers write a job from that part
and tear it down from the same part (``docs/protocol.md`` 3.2, incarnations).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from inagg.models import wire
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.p4profile import P4Target

__all__ = ["WorkerEntry", "ResultEntry", "McastGroup", "PsnEntry", "Region", "Plan", "plan", "mcast_group_id",
           "psn_index", "PER_JOB"]


def mcast_group_id(job: int) -> int:
    """Multicast group of a job's results (group 0 means "no multicast" on both targets)."""
    return job + 1


def psn_index(target: P4Target, job: int, worker: int) -> int:
    """Entry of the ``result_psn`` register that holds (job, worker)'s next result PSN."""
    return job * target.max_workers + worker


@dataclass(frozen=True)
class WorkerEntry:
    """``workers`` table: the switch QPN of (job, worker) and what the ingress needs of them."""

    qpn: int
    job: int
    worker: int
    rkey: int
    slot_base: int
    slot_mask: int
    nworkers: int
    port: int

    @property
    def wbit(self) -> int:
        return 1 << self.worker

    @property
    def full(self) -> int:
        """The bitmap of a complete slot."""
        return (1 << self.nworkers) - 1


@dataclass(frozen=True)
class ResultEntry:
    """``results`` table: how the copy of a result for (job, worker) is rewritten."""

    job: int
    worker: int
    mac: int
    ip: int
    qpn: int
    rkey: int
    result_va: int


@dataclass(frozen=True)
class McastGroup:
    """One job's multicast group: (replication id = worker index, port) per worker."""

    job: int
    group: int
    nodes: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class PsnEntry:
    """The ``result_psn`` register entry of (job, worker) and the PSN of the worker's first result."""

    job: int
    worker: int
    index: int
    psn: int


@dataclass(frozen=True)
class Region:
    """A job's slots ``base .. base + slots - 1`` in every slot register."""

    job: int
    base: int
    slots: int

    @property
    def indexes(self) -> range:
        return range(self.base, self.base + self.slots)


@dataclass(frozen=True)
class Plan:
    """Everything a target program needs for one switch and its jobs."""

    target: P4Target
    spec: SwitchSpec
    switch_mac: int
    switch_ip: int
    workers: tuple[WorkerEntry, ...]
    results: tuple[ResultEntry, ...]
    groups: tuple[McastGroup, ...]
    psns: tuple[PsnEntry, ...]
    regions: tuple[Region, ...]

    def only(self, job: int) -> Plan:
        """This plan with job ``job``'s entries alone: what configures it, and what tearing it down removes."""
        if job not in {r.job for r in self.regions}:
            raise ValueError(f"job {job} is not in the plan")
        return replace(self, **{f: tuple(e for e in getattr(self, f) if e.job == job) for f in PER_JOB})

    def without(self, job: int) -> Plan:
        """This plan with job ``job``'s entries removed: the switch once the job is torn down."""
        self.only(job)
        return replace(self, **{f: tuple(e for e in getattr(self, f) if e.job != job) for f in PER_JOB})


# The Plan fields that hold entries of jobs (each with a ``job``); the other fields are the switch's.
PER_JOB = tuple(f.name for f in fields(Plan) if f.name not in ("target", "spec", "switch_mac", "switch_ip"))


def _check_regions(jobs: list[JobSpec], spec: SwitchSpec) -> None:
    seen: dict[int, JobSpec] = {}
    for job in jobs:
        if job.job in seen:
            raise ValueError(f"job {job.job} is given twice")
        seen[job.job] = job
        spec.check_job(job, jobs, exclusive="the P4 programs have no exception path")


def plan(target: P4Target, spec: SwitchSpec, jobs: list[JobSpec] | tuple[JobSpec, ...]) -> Plan:
    """The configuration of ``target``'s program for ``spec`` and ``jobs``.

    Raises ValueError when the program cannot carry them: a chunk size or
    worker count the target does not build, an exception path, regions that
    overlap or leave the slot memory, and on Tofino a result ring that is not
    aligned to its size (the TNA egress adds the ring offset with an OR).
    """
    if not isinstance(target, P4Target):
        raise TypeError(f"target must be a P4Target, not {type(target).__name__}")
    target.validate(spec)
    jobs = list(jobs)
    for job in jobs:
        target.validate_job(job)
    _check_regions(jobs, spec)
    workers, results, groups, psns, regions = [], [], [], [], []
    ring_align = target.name == "tna"
    for job in sorted(jobs, key=lambda j: j.job):
        n = len(job.workers)
        for i, w in enumerate(job.workers):
            ring = job.slots * spec.chunk_bytes
            if ring_align and w.result_va % ring:
                raise ValueError(f"job {job.job} worker {i}: result_va 0x{w.result_va:x} must be a multiple of "
                                 f"the ring size {ring} on tna")
            workers.append(WorkerEntry(qpn=job.qpn(i), job=job.job, worker=i, rkey=job.contrib_rkey(i),
                                       slot_base=job.slot_base, slot_mask=job.slots - 1, nworkers=n, port=w.port))
            results.append(ResultEntry(job=job.job, worker=i, mac=int.from_bytes(wire.mac_bytes(w.mac), "big"),
                                       ip=int.from_bytes(wire.ip_bytes(w.ip), "big"), qpn=w.qpn, rkey=w.rkey,
                                       result_va=w.result_va))
            psns.append(PsnEntry(job.job, i, psn_index(target, job.job, i), w.result_psn))
        groups.append(McastGroup(job.job, mcast_group_id(job.job), tuple((i, w.port) for i, w in enumerate(job.workers))))
        regions.append(Region(job.job, job.slot_base, job.slots))
    return Plan(target=target, spec=spec, switch_mac=int.from_bytes(wire.mac_bytes(spec.mac), "big"),
                switch_ip=int.from_bytes(wire.ip_bytes(spec.ip), "big"), workers=tuple(workers),
                results=tuple(results), groups=tuple(groups), psns=tuple(psns), regions=tuple(regions))

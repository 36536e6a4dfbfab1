"""Jobs whose slot regions overlap, traffic that collides at a chosen rate, and the model's exception state.

*Host* jobs have regions of their own; each *guest* job's region is one
host's region again, so once the host holds its slots (its first chunks went
in first) every contribution of the guest finds its fast slot held by
another job and takes the exception path. The share of guest contributions
in the traffic is the collision rate.
"""

from __future__ import annotations

import random

import numpy as np

from ..models.job import JobSpec, SwitchSpec
from ..models.protocol import Counter
from ..models.switch import ModelSwitch
from .exception.reference import State
from .traffic import contribution, lanes, make_job

__all__ = ["collision_jobs", "claim", "mixed", "model_state"]


def collision_jobs(spec: SwitchSpec, hosts: int, guests: int, region: int, workers: int) -> list[JobSpec]:
    """``hosts`` jobs at regions ``0, region, 2 region, ..``, then ``guests`` jobs on the hosts' regions in turn."""
    if hosts * region > spec.slots:
        raise ValueError(f"{hosts} regions of {region} slots exceed the switch's {spec.slots}")
    return [make_job(spec, j, workers, region * (j % hosts), region) for j in range(hosts + guests)]


def _window(spec, job, chunks, rng, pyrng, loss, dup):
    """A job's contributions of ``chunks``, shuffled, with losses retransmitted at the end and duplicates."""
    batch = [(w, c) for c in chunks for w in range(len(job.workers))]
    pyrng.shuffle(batch)
    out, late = [], []
    for w, c in batch:
        f = (job.workers[w].port, contribution(spec, job, w, c, lanes(rng, spec)))
        roll = pyrng.random()
        if roll < loss:
            late.append(f)
            continue
        out.append(f)
        if roll > 1 - dup:
            out.append(f)
    return out + late


def claim(spec: SwitchSpec, jobs: list[JobSpec], hosts: int, rng: np.random.Generator) -> list[tuple[int, bytes]]:
    """Every host's first ``region`` chunks, in order: the hosts then hold every slot of their regions."""
    return [(j.workers[w].port, contribution(spec, j, w, c, lanes(rng, spec)))
            for j in jobs[:hosts] for c in range(j.slots) for w in range(len(j.workers))]


def mixed(spec: SwitchSpec, jobs: list[JobSpec], hosts: int, rate: float, contributions: int, seed: int, *,
          first_chunk: int, loss: float = 0.0, dup: float = 0.0) -> tuple[list[tuple[int, bytes]], int]:
    """About ``contributions`` contributions, a share ``rate`` of them from the guests, window by window.

    Each job sends chunks from ``first_chunk`` on, half a region per window,
    shuffled, with a share ``loss`` retransmitted at the end of its window and
    ``dup`` sent twice. Returns the traffic and the guest contributions in it.
    """
    rng, pyrng = np.random.default_rng(seed), random.Random(seed)
    guests = jobs[hosts:]
    workers = len(jobs[0].workers)
    per_job_host = contributions * (1 - rate) / hosts / workers if hosts else 0
    per_job_guest = contributions * rate / len(guests) / workers if guests else 0
    plan = {j.job: round(per_job_host if n < hosts else per_job_guest) for n, j in enumerate(jobs)}
    out, guest_frames = [], 0
    step = jobs[0].slots // 2
    for base in range(0, max(plan.values(), default=0), step):
        for n, job in enumerate(jobs):
            chunks = range(first_chunk + base, first_chunk + min(base + step, plan[job.job]))
            frames = _window(spec, job, chunks, rng, pyrng, loss, dup)
            out += frames
            if n >= hosts:
                guest_frames += len(frames)
    return out, guest_frames


def model_state(model: ModelSwitch) -> State:
    """The model switch's exception table as the engine's :class:`~.exception.reference.State`."""
    cuckoo = model.exception
    s = cuckoo.stats
    full = model.counters[Counter.EXC_REFUSED] - s.refused
    stats = {"inserts": s.inserts, "kicks": s.kicks, "stashed": s.stashed, "refused": s.refused, "full": full,
             "deletes": s.deletes}
    return State(tuple([e if e is None else tuple(e) for e in t] for t in cuckoo.tables),
                 [tuple(e) for e in cuckoo.stash_entries], list(model._free), stats)

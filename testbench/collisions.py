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

from inagg.models.job import ExceptionSpec, JobSpec, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.hdl.exception import STATS, entry_layout, stats_layout
from inagg.testbench.exception.reference import MODEL_STATS, State
from inagg.testbench.traffic import contribution, lanes, lossy, make_job

__all__ = ["collision_jobs", "claim", "mixed", "model_state", "engine_state"]


def collision_jobs(spec: SwitchSpec, hosts: int, guests: int, region: int, workers: int) -> list[JobSpec]:
    """``hosts`` jobs at regions ``0, region, 2 region, ..``, then ``guests`` jobs on the hosts' regions in turn."""
    if hosts * region > spec.slots:
        raise ValueError(f"{hosts} regions of {region} slots exceed the switch's {spec.slots}")
    return [make_job(spec, j, workers, region * (j % hosts), region) for j in range(hosts + guests)]


def _window(spec, job, chunks, rng, pyrng, loss, dup):
    """A job's contributions of ``chunks`` through :func:`~.traffic.lossy`: (sent, lost)."""
    frames = [(w.port, contribution(spec, job, i, c, lanes(rng, spec)))
              for c in chunks for i, w in enumerate(job.workers)]
    return lossy(frames, pyrng, loss=loss, dup=dup)


def claim(spec: SwitchSpec, jobs: list[JobSpec], hosts: int, rng: np.random.Generator) -> list[tuple[int, bytes]]:
    """Every host's first ``region`` chunks, in order: the hosts then hold every slot of their regions."""
    return [(j.workers[w].port, contribution(spec, j, w, c, lanes(rng, spec)))
            for j in jobs[:hosts] for c in range(j.slots) for w in range(len(j.workers))]


def mixed(spec: SwitchSpec, jobs: list[JobSpec], hosts: int, rate: float, contributions: int, seed: int, *,
          first_chunk: int, loss: float = 0.0, dup: float = 0.0) -> tuple[list[tuple[int, bytes]], int]:
    """About ``contributions`` contributions, a share ``rate`` of them from the guests, window by window.

    Each job sends chunks from ``first_chunk`` on, half a region per window;
    the contributions of all jobs in a window are shuffled together, ``dup``
    of them sent twice, and a share ``loss`` is lost and retransmitted at the
    window's end. Returns the traffic and the number of guest frames in it.
    """
    rng, pyrng = np.random.default_rng(seed), random.Random(seed)
    workers = len(jobs[0].workers)
    share = {True: contributions * (1 - rate) / hosts / workers if hosts else 0,
             False: contributions * rate / (len(jobs) - hosts) / workers if len(jobs) > hosts else 0}
    plan = [round(share[n < hosts]) for n in range(len(jobs))]
    out, guest_frames = [], 0
    step = jobs[0].slots // 2
    for base in range(0, max(plan, default=0), step):
        window, retransmitted = [], []
        for n, job in enumerate(jobs):
            sent, lost = _window(spec, job, range(first_chunk + base, first_chunk + min(base + step, plan[n])),
                                 rng, pyrng, loss, dup)
            window += sent
            retransmitted += lost
            if n >= hosts:
                guest_frames += len(sent) + len(lost)
        pyrng.shuffle(window)
        out += window + retransmitted
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


def engine_state(scope, exception: ExceptionSpec, key_width: int) -> tuple[State, int]:
    """The state of a Verilated exception engine (``scope``: its instance under cocotb) and its ``stalls``."""
    cap = exception.capacity
    core = scope.core  # the logic behind the queues (ExceptionEngine.elaborate's submodule "core")
    layout = entry_layout(key_width, cap, exception.table)
    tables = []
    for name in ("t0", "t1"):
        entries = [layout.from_bits(int(getattr(core, name)[i].value.to_unsigned())) for i in range(exception.table)]
        tables.append([(int(e.key), int(e.ptr)) if e.valid else None for e in entries])
    free_list = [int(core.free_list[i].value.to_unsigned()) for i in range(cap)]
    first, count = int(core.free_first.value.to_unsigned()), int(core.free_count.value.to_unsigned())
    stashed = int(core.stash_count.value.to_unsigned()) if exception.stash else 0
    stash = [(int(getattr(core, f"stash{i}_key").value.to_unsigned()),
              int(getattr(core, f"stash{i}_ptr").value.to_unsigned())) for i in range(stashed)]
    raw = stats_layout().from_bits(scope.stats.value.to_unsigned())
    stats = {name: int(getattr(raw, name)) for name in STATS}
    state = State(tuple(tables), stash, [free_list[(first + i) % cap] for i in range(count)],
                  {name: stats[name] for name in MODEL_STATS})
    return state, stats["stalls"]

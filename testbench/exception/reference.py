"""What the exception engine must answer: the model switch's own exception path, request by request.

:class:`Reference` holds a :class:`~inagg.models.switch.ModelSwitch` with an
exception path and one job per key's job field, and answers each engine
request by running the model's code: a LOCATE is ``ModelSwitch._locate``
with the key's fast slot held by another job, a LOOKUP the same with the
fast slot free, a TEARDOWN ``remove_job`` (and the job is added back, so
later keys of it still have a job). A single-key DELETE is what
``remove_job`` does per key: ``CuckooTable.delete`` and the pointer to the
end of the free list.
"""

from __future__ import annotations

from dataclasses import dataclass

from inagg.hdl.exception import STATS, Op, Status
from inagg.models.cuckoo import KEY_INDEX_BITS, KEY_JOB_SHIFT
from inagg.models.job import ExceptionSpec, JobSpec, SwitchSpec, WorkerSpec
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch

__all__ = ["MODEL_STATS", "State", "Reference"]

#: The engine's counters that the model keeps too (``stalls`` is the engine's own).
MODEL_STATS = tuple(name for name in STATS if name != "stalls")

_INDEX_MASK = (1 << KEY_INDEX_BITS) - 1


@dataclass
class State:
    """Everything the engine holds: ``tables[t][pos]`` is ``(key, ptr)`` or None, the stash in
    order, the free pointers in order, and the counters the model keeps (:data:`MODEL_STATS`)."""

    tables: tuple[list, list]
    stash: list[tuple[int, int]]
    free: list[int]
    stats: dict[str, int]

    def diff(self, other: State) -> str:
        """A description of the first differences from ``other`` ('' when equal)."""
        out = []
        for t in (0, 1):
            bad = [p for p, (a, b) in enumerate(zip(self.tables[t], other.tables[t])) if a != b]
            if bad:
                p = bad[0]
                out.append(f"table {t}: {len(bad)} positions differ, first {p}: {self.tables[t][p]} != "
                           f"{other.tables[t][p]}")
        for name in ("stash", "free", "stats"):
            if getattr(self, name) != getattr(other, name):
                out.append(f"{name}: {getattr(self, name)} != {getattr(other, name)}")
        return "; ".join(out)


class Reference:
    """The model switch's exception path behind the engine's request interface.

    Parameters
    ----------
    table, max_kicks, stash:
        As :class:`~inagg.models.job.ExceptionSpec`.
    jobs:
        Keys name jobs ``0 .. jobs - 1``.
    slots:
        Fast slots of every job (its indices are ``0 .. slots - 1``); a
        TEARDOWN of a job must name index ``slots - 1``.
    """

    def __init__(self, table: int, max_kicks: int, stash: int, jobs: int, slots: int):
        self.switch = ModelSwitch(SwitchSpec(ports=1, slots=slots, exception=ExceptionSpec(table, max_kicks, stash)))
        worker = WorkerSpec(port=0, mac="02:00:00:00:00:01", ip="10.0.0.1", qpn=1, rkey=0, result_va=0)
        self._jobs = [JobSpec(job=j, rkey=j, slot_base=0, slots=slots, workers=(worker,)) for j in range(jobs)]
        for spec in self._jobs:
            self.switch.add_job(spec)
        self._slots = slots
        self._ptr = {id(s): i for i, s in enumerate(self.switch.overflow)}
        self.full = 0  # LOCATEs refused before the table was asked (every entry in use)

    @property
    def load(self) -> float:
        """Entries in use over the two tables' entries (the stash counts too)."""
        return len(self.switch.exception) / (2 * self.switch.exception.size)

    def request(self, op: Op, key: int) -> tuple[Status, int]:
        """The response to one request: (status, pointer; 0 where the status carries none)."""
        sw, cuckoo = self.switch, self.switch.exception
        job, index = key >> KEY_JOB_SHIFT, key & _INDEX_MASK
        if op in (Op.LOOKUP, Op.LOCATE):
            if index >= self._slots:
                raise ValueError(f"key 0x{key:08x}: index {index} is beyond the job's {self._slots} slots")
            fast = sw.fast[index]
            if op == Op.LOOKUP:
                fast.clear()
            else:
                fast.start(job + 1, 0)  # held by another job: the collision that sends a key here
            inserts = sw.counters[Counter.EXC_INSERTS]
            refused = cuckoo.stats.refused
            found = sw._locate(self._jobs[job], index)
            fast.clear()
            if found is Counter.EXC_REFUSED:
                self.full += cuckoo.stats.refused == refused
                return Status.REFUSED, 0
            if found is fast:
                return Status.MISS, 0
            ptr = self._ptr[id(found)]
            return (Status.INSERTED if sw.counters[Counter.EXC_INSERTS] > inserts else Status.HIT), ptr
        if op == Op.DELETE:
            ptr = cuckoo.delete(key)
            if ptr is None:
                return Status.MISS, 0
            sw.overflow[ptr].clear()
            sw._free.append(ptr)
            return Status.DELETED, ptr
        if index != self._slots - 1:
            raise ValueError(f"a teardown names the job's last index {self._slots - 1}, not {index}")
        sw.remove_job(job)
        sw.add_job(self._jobs[job])
        return Status.DONE, 0

    def state(self) -> State:
        cuckoo = self.switch.exception
        s = cuckoo.stats
        stats = {"inserts": s.inserts, "kicks": s.kicks, "stashed": s.stashed, "refused": s.refused,
                 "full": self.full, "deletes": s.deletes}
        return State(tuple([e if e is None else tuple(e) for e in t] for t in cuckoo.tables),
                     [tuple(e) for e in cuckoo.stash_entries], list(self.switch._free), stats)

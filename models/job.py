"""The description of a switch and of the jobs on it.

One description configures every implementation: the model switch takes it
directly, the controller writes it into the RTL's register map and into the
P4 program's tables, and the hosts derive their addressing from it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from inagg.models.protocol import (
    CHUNK_BYTES_ALLOWED, CHUNK_BYTES_DEFAULT, DEFAULT_PKEY, LANE_BYTES, MAX_JOBS, MAX_WORKERS,
    switch_qpn,
)
from inagg.models.wire import ip_bytes, mac_bytes

__all__ = ["Mode", "WorkerSpec", "JobSpec", "SwitchSpec", "ExceptionSpec", "check_job", "Collective", "Uplink"]


class Mode(enum.Enum):
    """How a switch takes part in a job's transport (``docs/protocol.md`` sections 3, 6, 7).

    ``UC``: hosts send and receive over UC queue pairs and keep reliability
    with their own timers, as SwitchML does (the RTL and the P4 programs).
    The other three are EPIC's modes over RC queue pairs: ``TERMINATED``
    (Mode I: the switch is every host's RC endpoint), ``TRANSLATED``
    (Mode II: RC end to end, the switch reflects the hosts' ACKs) and
    ``AUGMENTED`` (Mode III: Mode II plus reliability on the hop).
    """

    UC = "uc"
    TERMINATED = "I"
    TRANSLATED = "II"
    AUGMENTED = "III"


def _pow2(x: object) -> bool:
    return isinstance(x, int) and x > 0 and not x & (x - 1)


def _u(name: str, x: object, bits: int) -> None:
    if not isinstance(x, int) or not 0 <= x < (1 << bits):
        raise ValueError(f"{name} must be an integer in 0..2**{bits}-1, not {x!r}")


@dataclass(frozen=True)
class WorkerSpec:
    """Where one worker of a job receives its results.

    Parameters
    ----------
    port:
        Switch port the worker is attached to.
    mac, ip:
        The worker's Ethernet and IPv4 addresses ("02:00:00:00:00:01", "10.0.0.1").
    qpn:
        The worker's own QP number; results are sent to it.
    rkey:
        R_Key of the worker's result ring.
    result_va:
        Virtual address of the worker's result ring (one chunk per slot of the job).
    result_psn:
        PSN of the first result the switch sends to this worker.
    contrib_rkey:
        R_Key this worker's contributions must carry (UC mode, check 15); None
        (the default) takes the job's ``JobSpec.rkey``. With a key per worker,
        one worker's leaked key does not let anyone contribute as another.
    """

    port: int
    mac: str
    ip: str
    qpn: int
    rkey: int
    result_va: int
    result_psn: int = 0
    contrib_rkey: int | None = None

    def __post_init__(self) -> None:
        _u("port", self.port, 8)
        mac_bytes(self.mac)
        ip_bytes(self.ip)
        _u("worker qpn", self.qpn, 24)
        _u("worker rkey", self.rkey, 32)
        _u("result_va", self.result_va, 64)
        _u("result_psn", self.result_psn, 24)
        if self.contrib_rkey is not None:
            _u("worker contrib_rkey", self.contrib_rkey, 32)


class Collective(enum.Enum):
    """The collectives a job runs (docs/protocol.md section 11). The value is the command-line name."""

    ALLREDUCE = "allreduce"
    REDUCE = "reduce"
    BROADCAST = "broadcast"
    BARRIER = "barrier"
    REDUCE_SCATTER = "reduce-scatter"
    ALLGATHER = "allgather"

    @property
    def rooted(self) -> bool:
        """True for the collectives that name a root rank (Reduce, Broadcast)."""
        return self in (Collective.REDUCE, Collective.BROADCAST)


@dataclass(frozen=True)
class Uplink:
    """Where a non-root switch of a tree sends its partials, and how its parent sends it the results.

    The switch is a worker of its parent: ``port`` is its port towards the
    parent, ``mac`` and ``ip`` the parent's addresses, ``qpn`` and ``rkey``
    the parent's switch QPN and job R_Key for it; ``result_qpn``,
    ``result_rkey`` and ``result_va`` are what the parent's
    :class:`WorkerSpec` of this switch holds, which results from the parent
    must carry.
    """

    port: int
    mac: str
    ip: str
    qpn: int
    rkey: int
    result_qpn: int
    result_rkey: int
    result_va: int

    def __post_init__(self) -> None:
        _u("uplink port", self.port, 8)
        mac_bytes(self.mac)
        ip_bytes(self.ip)
        _u("uplink qpn", self.qpn, 24)
        _u("uplink rkey", self.rkey, 32)
        _u("uplink result_qpn", self.result_qpn, 24)
        _u("uplink result_rkey", self.result_rkey, 32)
        _u("uplink result_va", self.result_va, 64)


def _check_tree_fields(job: "JobSpec") -> None:
    if job.parent is not None and not isinstance(job.parent, Uplink):
        raise TypeError(f"parent must be an Uplink or None, not {type(job.parent).__name__}")
    object.__setattr__(job, "subswitches", frozenset(job.subswitches))
    for i in sorted(job.subswitches):
        if not isinstance(i, int) or not 0 <= i < len(job.workers):
            raise ValueError(f"subswitches must be worker indices in 0..{len(job.workers) - 1}, not {i!r}")
    if job.ranks is None:
        object.__setattr__(job, "ranks", len(job.workers))
    elif not isinstance(job.ranks, int) or not len(job.workers) <= job.ranks:
        raise ValueError(f"ranks must be an integer >= the job's {len(job.workers)} workers, not {job.ranks!r}")
    if not isinstance(job.collective, Collective):
        raise TypeError(f"collective must be a Collective, not {job.collective!r}")
    if not job.collective.rooted:
        if job.root is not None:
            raise ValueError(f"{job.collective.value} has no root, but root is {job.root!r}")
    elif job.root is None:
        if job.parent is None:
            raise ValueError(f"{job.collective.value} needs the root rank below the top switch: root is None")
    elif not isinstance(job.root, int) or not 0 <= job.root < len(job.workers):
        raise ValueError(f"root must be a worker index in 0..{len(job.workers) - 1}, not {job.root!r}")


@dataclass(frozen=True)
class JobSpec:
    """One aggregation job: who takes part and which slots it uses.

    Parameters
    ----------
    job:
        Job number (names the job in the switch QPNs, see ``protocol.switch_qpn``).
    rkey:
        R_Key every contribution of this job must carry, except a worker's
        with a ``WorkerSpec.contrib_rkey`` of its own (:meth:`contrib_rkey`).
    slot_base, slots:
        The job's slot region: ``slots`` (a power of two) slots from
        ``slot_base`` (a multiple of ``slots``). Chunk ``c`` uses slot
        ``slot_base + c % slots``; a worker keeps at most ``slots // 2``
        chunks outstanding (``window``).
    workers:
        The workers, in worker-index order.
    parent:
        In a tree of switches, where this switch sends its completed
        partials (:class:`Uplink`); None on the root switch and on a switch
        alone.
    subswitches:
        Indices of the workers that are switches (children in a tree): only
        they may send a partial with promoted lanes.
    collective:
        The :class:`Collective` the job runs; it says which children send
        data up and which receive data down.
    root:
        Reduce and Broadcast: index of the worker on whose side the root
        rank is; None when the root rank is above this switch (then it has
        a parent) and for the other collectives.
    ranks:
        Ranks taking part in the whole tree (the scale agreement counts
        them); None (the default) stands for ``len(workers)``, a job on one
        switch.
    mode:
        The job's :class:`Mode` (default ``Mode.UC``); a switch refuses a
        mode it does not implement (:func:`check_job`).
    """

    job: int
    rkey: int
    slot_base: int
    slots: int
    workers: tuple[WorkerSpec, ...] = field(default=())
    # The tree and the collective: docs/protocol.md sections 10 and 11.
    parent: Uplink | None = None
    subswitches: frozenset[int] = frozenset()
    collective: Collective = Collective.ALLREDUCE
    root: int | None = None
    ranks: int | None = None
    mode: Mode = Mode.UC

    def __post_init__(self) -> None:
        if not isinstance(self.job, int) or not 0 <= self.job < MAX_JOBS:
            raise ValueError(f"job must be an integer in 0..{MAX_JOBS - 1}, not {self.job!r}")
        _u("job rkey", self.rkey, 32)
        if not _pow2(self.slots) or self.slots < 2:
            raise ValueError(f"slots must be a power of two >= 2, not {self.slots!r}")
        if not isinstance(self.slot_base, int) or self.slot_base < 0 or self.slot_base % self.slots:
            raise ValueError(f"slot_base must be a non-negative multiple of slots ({self.slots}), not {self.slot_base!r}")
        object.__setattr__(self, "workers", tuple(self.workers))
        if not 1 <= len(self.workers) <= MAX_WORKERS:
            raise ValueError(f"a job has 1..{MAX_WORKERS} workers, not {len(self.workers)}")
        for w in self.workers:
            if not isinstance(w, WorkerSpec):
                raise TypeError(f"workers must be WorkerSpec, not {type(w).__name__}")
        _check_tree_fields(self)
        if not isinstance(self.mode, Mode):
            raise TypeError(f"mode must be a Mode ({', '.join(m.name for m in Mode)}), not {self.mode!r}")

    @property
    def window(self) -> int:
        """Most chunks a worker may have outstanding: half the region (see docs/protocol.md)."""
        return self.slots // 2

    def qpn(self, worker: int) -> int:
        """The switch QPN worker ``worker`` sends its contributions to."""
        return switch_qpn(self.job, worker)

    def contrib_rkey(self, worker: int) -> int:
        """The R_Key worker ``worker``'s contributions carry: its own when it has one, else the job's."""
        own = self.workers[worker].contrib_rkey
        return self.rkey if own is None else own

    def shares_slots(self, other: "JobSpec") -> bool:
        """``other`` is another job whose slot region overlaps this one's."""
        return (other.job != self.job and self.slot_base < other.slot_base + other.slots
                and other.slot_base < self.slot_base + self.slots)


@dataclass(frozen=True)
class ExceptionSpec:
    """The exception path that takes slots whose direct-mapped slot is held by another job.

    ``table`` entries per cuckoo table (power of two), ``max_kicks`` longest
    kick-out chain, ``stash`` stash entries. It holds up to
    ``2 * table + stash`` slots.
    """

    table: int = 256
    max_kicks: int = 16
    stash: int = 4

    def __post_init__(self) -> None:
        if not _pow2(self.table) or not 2 <= self.table <= 65536:
            raise ValueError(f"exception table must be a power of two from 2 to 65536, not {self.table!r}")
        if not isinstance(self.max_kicks, int) or self.max_kicks < 0:
            raise ValueError(f"max_kicks must be a non-negative integer, not {self.max_kicks!r}")
        if not isinstance(self.stash, int) or self.stash < 0:
            raise ValueError(f"stash must be a non-negative integer, not {self.stash!r}")

    @property
    def capacity(self) -> int:
        return 2 * self.table + self.stash


@dataclass(frozen=True)
class SwitchSpec:
    """Build-time parameters and addresses of one switch.

    ``slots`` direct-mapped slots (a power of two) of ``chunk_bytes`` each;
    ``exception`` None for a fast path only (then job regions must not
    overlap).
    """

    mac: str = "02:00:00:00:00:fe"
    ip: str = "10.0.0.254"
    ports: int = 4
    slots: int = 256
    chunk_bytes: int = CHUNK_BYTES_DEFAULT
    pkey: int = DEFAULT_PKEY
    exception: ExceptionSpec | None = None

    def __post_init__(self) -> None:
        mac_bytes(self.mac)
        ip_bytes(self.ip)
        if not isinstance(self.ports, int) or not 1 <= self.ports <= 256:
            raise ValueError(f"ports must be an integer in 1..256, not {self.ports!r}")
        if not _pow2(self.slots) or self.slots < 2:
            raise ValueError(f"slots must be a power of two >= 2, not {self.slots!r}")
        if self.chunk_bytes not in CHUNK_BYTES_ALLOWED:
            raise ValueError(f"chunk_bytes must be one of {CHUNK_BYTES_ALLOWED}, not {self.chunk_bytes!r}")
        _u("pkey", self.pkey, 16)

    @property
    def lanes(self) -> int:
        """INT32 lanes per chunk."""
        return self.chunk_bytes // LANE_BYTES

    def check_job(self, job: JobSpec, installed: Iterable[JobSpec] = (), *, jobs: int | None = None,
                  workers: int | None = None, exclusive: str = "this switch has no exception path",
                  modes: Iterable[Mode] = (Mode.UC,)) -> None:
        """Raise ``ValueError`` when this switch cannot hold ``job`` (:func:`check_job`)."""
        check_job(job, ports=self.ports, slots=self.slots, exception=self.exception, installed=installed, jobs=jobs,
                  workers=workers, exclusive=exclusive, modes=modes)


def check_job(job: JobSpec, *, ports: int, slots: int, exception: ExceptionSpec | None,
              installed: Iterable[JobSpec] = (), jobs: int | None = None, workers: int | None = None,
              exclusive: str = "this switch has no exception path", modes: Iterable[Mode] = (Mode.UC,)) -> None:
    """Raise ``ValueError`` when a switch of ``ports`` ports and ``slots`` slots cannot hold ``job``.

    The one list of a job's rules. The job's region must lie inside the
    slot memory and its workers' ports must exist; without an ``exception``
    path its region must not overlap the region of any job of
    ``installed`` (``exclusive`` ends that message). A build with tables
    for ``jobs`` job numbers and ``workers`` workers per job (the RTL's
    register map) also checks the job's number and worker count. The
    job's mode must be one of ``modes``, the modes the switch implements
    (the P4 programs: ``Mode.UC`` only; the RTL's: ``RegMap.modes``).
    """
    modes = tuple(modes)
    if job.mode not in modes:
        raise ValueError(f"job {job.job} asks for mode {job.mode.name} ({job.mode.value}); this switch implements "
                         f"{', '.join(f'{m.name} ({m.value})' for m in modes)}")
    if jobs is not None and job.job >= jobs:
        raise ValueError(f"job {job.job} does not exist: the switch has {jobs} jobs")
    if workers is not None and len(job.workers) > workers:
        raise ValueError(f"job {job.job} has {len(job.workers)} workers, the switch at most {workers}")
    if job.slot_base + job.slots > slots:
        raise ValueError(f"job {job.job}'s slots {job.slot_base}..{job.slot_base + job.slots - 1} "
                         f"exceed the switch's {slots} slots")
    for w in job.workers:
        if w.port >= ports:
            raise ValueError(f"worker port {w.port} does not exist: the switch has {ports} ports")
    if job.parent is not None:
        if job.parent.port >= ports:
            raise ValueError(f"uplink port {job.parent.port} does not exist: the switch has {ports} ports")
        if any(w.port == job.parent.port for w in job.workers):
            raise ValueError(f"uplink port {job.parent.port} is a worker's port too")
    if exception is None:
        for o in installed:
            if job.shares_slots(o):
                raise ValueError(f"job {job.job}'s slot region overlaps job {o.job}'s and {exclusive}")

"""The schedule intermediate representation.

A schedule says, for every node (GPU rank or reducing switch), what it does
in every *step* over *chunks* of its buffers. It is a table, not a program:
one row per operation, stored column-wise in numpy arrays so that schedules
of thousands of ranks are built, checked, executed and costed without a
Python loop per operation.

Row kinds (``Row``):

* ``TRANSFER`` -- node ``src`` sends chunks ``src_chunks`` of its buffer
  ``src_buf``; node ``dst`` receives them into ``dst_chunks`` of ``dst_buf``
  (overwriting). In a rank's program this is a *send* on ``src`` and a *recv*
  on ``dst``.
* ``TRANSFER_REDUCE`` -- the same, but ``dst`` adds what it receives to
  ``dst_chunks`` (a *recv-reduce*).
* ``COPY`` -- local copy on ``src`` (== ``dst``) from one set of chunks to
  another (a gather-then-scatter, so permutations in place are fine).
* ``REDUCE`` -- local ``dst_chunks += src_chunks`` (MSCCL's ``re``).

A transfer is stored once, as the matched send/receive pair, so a schedule
can never have a send without its receive.

Step semantics (what "with dependencies" means): every row has a step.
Within one step, on every node,

1. all sends read the buffers as they were at the end of the previous step;
2. then receives that overwrite are applied;
3. then receive-reduces are added (several may target one chunk: that is a
   joint reduction);
4. then local copies (reading the state after 2-3), then local reduces.

A step with transfers is one communication round for the cost model; a step
with only local rows costs nothing on the network. The per-node program
view (:meth:`Schedule.program`) and the explicit dependency graph that
MSCCL needs (:func:`inagg.host.schedules.msccl.dependencies`) are derived
from these rules.

Buffers: ``INPUT`` and ``OUTPUT`` exist on GPU ranks, ``SCRATCH`` on every
node (a switch node has only scratch). In an *in-place* schedule ``INPUT`` is
never referenced and ``OUTPUT`` starts out holding the rank's input laid out
as the collective defines (see :mod:`inagg.host.schedules.executor`).

A schedule may be *abstract*: chunk counts without chunk indices. Abstract
schedules are for costing very large instances (up to 65,536-rank tori);
the executor refuses them (:func:`~inagg.host.schedules.executor.check_symbolic`
checks them), and tests check that a generator's abstract and concrete
outputs have the same traffic.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

import numpy as np

__all__ = [
    "Collective",
    "Buffer",
    "Row",
    "OpKind",
    "Op",
    "Schedule",
    "ScheduleBuilder",
    "group_steps",
]


class Collective(enum.Enum):
    """The collectives a schedule can implement (sum reduction)."""

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"
    ALLTOALLV = "alltoallv"
    BARRIER = "barrier"

    @classmethod
    def parse(cls, value: "Collective | str") -> "Collective":
        """Accept a member or its name (``"allreduce"``, ``"all-reduce"``, ``"reducescatter"``)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise TypeError(f"collective must be a Collective or a string, not {value!r}")
        key = value.strip().lower().replace("-", "_")
        aliases = {"reducescatter": "reduce_scatter", "allgather": "allgather", "all_gather": "allgather",
                   "all_reduce": "allreduce", "all_to_all": "alltoall", "all_to_allv": "alltoallv"}
        key = aliases.get(key, key)
        for member in cls:
            if member.value == key:
                return member
        raise ValueError(f"unknown collective {value!r}; known: {', '.join(m.value for m in cls)}")


class Buffer(enum.IntEnum):
    """The three buffers of a node (MSCCL's ``i``, ``o`` and ``s``)."""

    INPUT = 0
    OUTPUT = 1
    SCRATCH = 2


class Row(enum.IntEnum):
    """What one row of the schedule table is."""

    TRANSFER = 0
    TRANSFER_REDUCE = 1
    COPY = 2
    REDUCE = 3


class OpKind(enum.IntEnum):
    """An operation in one node's program (the per-rank view of the rows)."""

    SEND = 0
    RECV = 1
    RECV_REDUCE = 2
    COPY = 3
    REDUCE = 4


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of one node's program, as :meth:`Schedule.program` lists them.

    ``peer`` is the other node of a send/receive (-1 for local operations);
    ``row`` is the index of the schedule row it comes from, so a send and its
    receive share a row.
    """

    kind: OpKind
    step: int
    peer: int
    channel: int
    src_buf: Buffer
    src_chunks: np.ndarray
    dst_buf: Buffer
    dst_chunks: np.ndarray
    row: int


#: the stored dtype of every row column (a builder concatenates straight into it)
_COLUMN_DTYPES = {"kind": np.int8, "step": np.int32, "src": np.int32, "dst": np.int32, "channel": np.int32,
                  "src_buf": np.int8, "dst_buf": np.int8, "count": np.int64}


def _join(parts: list[np.ndarray], dtype) -> np.ndarray:
    """One column from a builder's batches. A column whose batches are all one value each (a step, a
    kind: broadcast views) is repeated from those values, which is much cheaper than concatenating
    millions of broadcast entries."""
    if not parts:
        return np.empty(0, dtype)
    if all(p.strides == (0,) for p in parts):
        values = np.array([p[0] for p in parts], dtype=np.int64).astype(dtype)
        lens = [len(p) for p in parts]
        if sum(lens) < 64 * len(parts):
            return np.repeat(values, lens)
        # long batches: a fill per batch (np.repeat copies element by element)
        out = np.empty(sum(lens), dtype)
        pos = 0
        for v, k in zip(values, lens):
            out[pos:pos + k] = v
            pos += k
        return out
    return np.concatenate(parts, dtype=dtype, casting="unsafe")


def group_steps(step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(order, steps, bounds)``: the rows of step ``steps[i]`` are ``order[bounds[i]:bounds[i + 1]]``,
    steps ascending, rows in their order within a step.

    Steps below 2^15 are sorted as 16-bit keys (numpy's stable sort is then a radix sort), and
    dense steps are counted, not found by a pass over the sorted steps: at 65,536 ranks a
    schedule has millions of rows and a handful of steps."""
    narrow = step.astype(np.int16) if len(step) and step.max() < 2 ** 15 else step
    order = np.argsort(narrow, kind="stable")
    if len(step) and step.max() < 2 * len(step) + 1024:
        per_step = np.bincount(narrow)
        steps = np.flatnonzero(per_step)
        sizes = per_step[steps]
    else:
        steps, sizes = np.unique(step, return_counts=True)
    bounds = np.zeros(len(steps) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return order, steps, bounds


def _as_index_array(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype == bool or not (a.dtype.kind in "iu" or a.size == 0):
        raise TypeError(f"{what} must be integers, not {a.dtype}")
    return a


class Schedule:
    """A collective schedule: metadata plus the row table (see the module docstring).

    Build one with :class:`ScheduleBuilder`; the constructor validates
    everything and raises ``ValueError``/``TypeError`` naming the first
    problem it finds.

    Parameters
    ----------
    name:
        The algorithm that produced it (``"ring"``, ``"swing-bw"``, ...).
    collective:
        What it computes.
    nranks:
        GPU ranks, numbered ``0 .. nranks-1``.
    size_chunks:
        How many chunks the user-visible size of the collective covers
        (allreduce/broadcast/reduce: the vector; reduce-scatter: the input;
        all-gather: the output; all-to-all: one rank's send buffer; for
        all-to-allv the largest send buffer). The cost model divides the
        byte size by it.
    in_chunks, out_chunks, scratch_chunks:
        Buffer sizes of a GPU rank, in chunks.
    nswitches, switch_scratch_chunks:
        Reducing switch nodes (numbered ``nranks ..``) and their scratch size.
    root:
        The root rank of broadcast/reduce.
    counts:
        For all-to-allv, ``counts[i, j]`` chunks go from rank i to rank j.
    inplace:
        Whether ``OUTPUT`` starts out with the input (``INPUT`` unused).
    placement:
        Topology node of each switch node (length ``nswitches``), when the
        schedule was built for a topology.
    columns:
        ``kind, step, src, dst, channel, src_buf, dst_buf, count`` (equal
        length 1-D integer arrays) and, for a concrete schedule, the chunk
        indices as CSR: ``src_idx``/``dst_idx`` (flat) with ``ptr`` (row
        offsets, length rows+1, shared by source and destination since both
        have ``count`` entries).
    """

    def __init__(
        self,
        *,
        name: str,
        collective: Collective,
        nranks: int,
        size_chunks: int,
        in_chunks: int,
        out_chunks: int,
        scratch_chunks: int = 0,
        nswitches: int = 0,
        switch_scratch_chunks: int = 0,
        root: int | None = None,
        counts: np.ndarray | None = None,
        inplace: bool = True,
        placement: Sequence[int] | None = None,
        kind: np.ndarray,
        step: np.ndarray,
        src: np.ndarray,
        dst: np.ndarray,
        channel: np.ndarray,
        src_buf: np.ndarray,
        dst_buf: np.ndarray,
        count: np.ndarray,
        ptr: np.ndarray | None = None,
        src_idx: np.ndarray | None = None,
        dst_idx: np.ndarray | None = None,
        meta: dict | None = None,
    ) -> None:
        self.name = str(name)
        self.collective = Collective.parse(collective)
        for label, v in (("nranks", nranks), ("size_chunks", size_chunks), ("in_chunks", in_chunks),
                         ("out_chunks", out_chunks), ("scratch_chunks", scratch_chunks),
                         ("nswitches", nswitches), ("switch_scratch_chunks", switch_scratch_chunks)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"{label} must be an integer, not {v!r}")
            if v < 0:
                raise ValueError(f"{label} must be non-negative, not {v}")
        if nranks < 1:
            raise ValueError(f"a schedule needs at least one rank, not {nranks}")
        self.nranks = int(nranks)
        self.nswitches = int(nswitches)
        self.nnodes = self.nranks + self.nswitches
        self.size_chunks = int(size_chunks)
        self.in_chunks = int(in_chunks)
        self.out_chunks = int(out_chunks)
        self.scratch_chunks = int(scratch_chunks)
        self.switch_scratch_chunks = int(switch_scratch_chunks)
        self.inplace = bool(inplace)
        self.root = None if root is None else int(root)
        self.counts = None if counts is None else np.asarray(counts, dtype=np.int64)
        self.placement = None if placement is None else np.asarray(placement, dtype=np.int64)
        self.meta = dict(meta or {})

        n = len(kind)
        cols = {}
        for label, arr in (("kind", kind), ("step", step), ("src", src), ("dst", dst), ("channel", channel),
                           ("src_buf", src_buf), ("dst_buf", dst_buf), ("count", count)):
            a = _as_index_array(arr, f"column {label}")
            if a.ndim != 1 or len(a) != n:
                raise ValueError(f"column {label} must be 1-D with {n} entries, not shape {a.shape}")
            cols[label] = a
        for label, dtype in _COLUMN_DTYPES.items():
            setattr(self, label, cols[label].astype(dtype, copy=False))
        if (ptr is None) != (src_idx is None) or (ptr is None) != (dst_idx is None):
            raise ValueError("ptr, src_idx and dst_idx must be given together (concrete) or not at all (abstract)")
        if ptr is None:
            self.ptr = self.src_idx = self.dst_idx = None
        else:
            self.ptr = _as_index_array(ptr, "ptr").astype(np.int64, copy=False)
            self.src_idx = _as_index_array(src_idx, "src_idx").astype(np.int32)
            self.dst_idx = _as_index_array(dst_idx, "dst_idx").astype(np.int32)
        self._validate()
        self._order = None

    # ------------------------------------------------------------------ checks
    def _buffer_table(self) -> np.ndarray:
        """Buffer sizes indexed by ``is_rank * 3 + buffer``."""
        return np.array([0, 0, self.switch_scratch_chunks, self.in_chunks, self.out_chunks, self.scratch_chunks],
                        dtype=np.int64)

    def _buffer_size(self, node: np.ndarray, buf: np.ndarray) -> np.ndarray:
        return self._buffer_table()[(node < self.nranks) * 3 + buf]

    def _validate(self) -> None:
        n = self.nranks
        coll = self.collective
        if coll in (Collective.BROADCAST, Collective.REDUCE):
            if self.root is None or not 0 <= self.root < n:
                raise ValueError(f"{coll.value} needs a root rank in 0..{n - 1}, not {self.root!r}")
        if coll is Collective.ALLTOALLV:
            if self.counts is None or self.counts.shape != (n, n) or (self.counts < 0).any():
                raise ValueError(f"alltoallv needs a non-negative {n}x{n} counts matrix")
            if self.inplace:
                raise ValueError("alltoallv cannot be in place")
        if coll is Collective.ALLTOALL and self.inplace:
            raise ValueError("alltoall cannot be in place")
        if self.placement is not None and len(self.placement) != self.nswitches:
            raise ValueError(f"placement must name {self.nswitches} topology nodes, not {len(self.placement)}")
        if not len(self.kind):
            return
        # min/max first: a reduction makes no temporary, and a valid column (the usual case) needs no mask
        for label, col, lo, hi, what in (("kind", self.kind, 0, Row.REDUCE, "unknown row kind {}"),
                                         ("step", self.step, 0, None, None),
                                         ("src", self.src, 0, self.nnodes - 1, "src node {} is not in 0..{hi}"),
                                         ("dst", self.dst, 0, self.nnodes - 1, "dst node {} is not in 0..{hi}"),
                                         ("src_buf", self.src_buf, 0, Buffer.SCRATCH, "unknown src_buf {}"),
                                         ("dst_buf", self.dst_buf, 0, Buffer.SCRATCH, "unknown dst_buf {}")):
            if col.min() >= lo and (hi is None or col.max() <= hi):
                continue
            i = int(np.flatnonzero((col < lo) | (col > (np.iinfo(col.dtype).max if hi is None else hi)))[0])
            if what is None:
                raise ValueError(f"row {i}: steps must be non-negative")
            raise ValueError(f"row {i}: " + what.format(int(col[i]), hi=hi))
        xfer = self.kind <= Row.TRANSFER_REDUCE
        same = self.src == self.dst
        if (xfer & same).any():
            i = int(np.flatnonzero(xfer & same)[0])
            raise ValueError(f"row {i}: a transfer needs two different nodes, not {int(self.src[i])} to itself")
        if (~xfer & ~same).any():
            i = int(np.flatnonzero(~xfer & ~same)[0])
            raise ValueError(f"row {i}: a local copy/reduce must have src == dst, not {int(self.src[i])} and {int(self.dst[i])}")
        if self.count.min() <= 0:
            i = int(np.flatnonzero(self.count <= 0)[0])
            raise ValueError(f"row {i}: a row must move at least one chunk, not {int(self.count[i])}")
        if self.inplace and ((self.src_buf == Buffer.INPUT) | (self.dst_buf == Buffer.INPUT)).any():
            i = int(np.flatnonzero((self.src_buf == Buffer.INPUT) | (self.dst_buf == Buffer.INPUT))[0])
            raise ValueError(f"row {i}: an in-place schedule must not use the input buffer")
        for label, node, buf in (("source", self.src, self.src_buf), ("destination", self.dst, self.dst_buf)):
            # which of the six (is a rank, buffer) kinds occur, then the rows of an empty one (if any)
            table = self._buffer_table()
            if self.nswitches:
                used = np.bincount((node < self.nranks) * 3 + buf, minlength=6) > 0
            else:
                # ranks only (their kinds are 3 + buffer): only an empty buffer needs a pass over the rows
                used = np.zeros(6, dtype=bool)
                for b in np.flatnonzero(table[3:] == 0):
                    used[3 + b] = (buf == b).any()
            if (table[used] > 0).all():
                continue
            size = self._buffer_size(node, buf)
            empty = size == 0
            if empty.any():
                i = int(np.flatnonzero(empty)[0])
                raise ValueError(f"row {i}: {label} buffer {Buffer(int(buf[i])).name} of node {int(node[i])} has no chunks")
        if self.ptr is None:
            return
        if len(self.ptr) != len(self.kind) + 1 or self.ptr[0] != 0 or (np.diff(self.ptr) != self.count).any():
            raise ValueError("ptr must start at 0 and advance by each row's count")
        if len(self.src_idx) != self.ptr[-1] or len(self.dst_idx) != self.ptr[-1]:
            raise ValueError(f"src_idx and dst_idx must hold {int(self.ptr[-1])} chunk indices")
        counts = self.count
        for label, node, buf, idx in (("source", self.src, self.src_buf, self.src_idx),
                                      ("destination", self.dst, self.dst_buf, self.dst_idx)):
            size = np.repeat(self._buffer_size(node, buf), counts)
            bad = (idx < 0) | (idx >= size)
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                i = int(np.searchsorted(self.ptr, j, side="right") - 1)
                raise ValueError(f"row {i}: {label} chunk {int(idx[j])} is outside buffer "
                                 f"{Buffer(int(buf[i])).name} of node {int(node[i])} ({int(size[j])} chunks)")
        self._check_write_conflicts()

    def _check_write_conflicts(self) -> None:
        """Two overwrites of one chunk in the same phase of one step would make
        the result depend on arrival order (reduces into one chunk are fine:
        that is a joint reduction)."""
        write = (self.kind == Row.TRANSFER) | (self.kind == Row.COPY)
        if not write.any():
            return
        rows = np.repeat(np.flatnonzero(write), self.count[write])
        sel = np.repeat(write, self.count)
        step = self.step[rows].astype(np.int64)
        phase = (self.kind[rows] == Row.COPY).astype(np.int64)
        node = self.dst[rows].astype(np.int64)
        buf = self.dst_buf[rows].astype(np.int64)
        chunk = self.dst_idx[sel].astype(np.int64)
        order = np.lexsort((chunk, buf, node, phase, step))
        keys = np.stack([step, phase, node, buf, chunk])[:, order]
        dup = np.flatnonzero((keys[:, 1:] == keys[:, :-1]).all(axis=0))
        if len(dup):
            j = dup[0]
            a, b = sorted((int(rows[order][j]), int(rows[order][j + 1])))
            raise ValueError(f"rows {a} and {b} both overwrite chunk {int(keys[4, j])} of buffer "
                             f"{Buffer(int(keys[3, j])).name} of node {int(keys[2, j])} in step {int(keys[0, j])}")

    # ------------------------------------------------------------- properties
    @property
    def concrete(self) -> bool:
        """Whether chunk indices are present (only concrete schedules can run)."""
        return self.ptr is not None

    @property
    def nrows(self) -> int:
        return len(self.kind)

    @property
    def is_transfer(self) -> np.ndarray:
        return self.kind <= Row.TRANSFER_REDUCE

    @property
    def only_transfers(self) -> bool:
        """Whether every row is a transfer (the large generated schedules): one reduction, no mask."""
        return not len(self.kind) or int(self.kind.max()) <= Row.TRANSFER_REDUCE

    @property
    def nchannels(self) -> int:
        return int(self.channel.max()) + 1 if len(self.channel) else 1

    @property
    def comm_steps(self) -> np.ndarray:
        """The distinct steps that contain at least one transfer, ascending."""
        steps = self.step if self.only_transfers else self.step[self.is_transfer]
        if len(steps) and steps.max() < 2 * len(steps) + 1024:  # a count per step: no sort
            return np.flatnonzero(np.bincount(steps)).astype(self.step.dtype)
        return np.unique(steps)

    @property
    def num_steps(self) -> int:
        """Communication rounds (steps with transfers)."""
        return len(self.comm_steps)

    def bytes_sent(self, nbytes: float) -> np.ndarray:
        """Bytes each node sends when the collective's size is ``nbytes``."""
        per_chunk = nbytes / self.size_chunks if self.size_chunks else 0.0
        if self.only_transfers:
            return np.bincount(self.src, weights=self.count, minlength=self.nnodes) * per_chunk
        x = self.is_transfer
        return np.bincount(self.src[x], weights=self.count[x], minlength=self.nnodes) * per_chunk

    def rows_by_step(self) -> list[tuple[int, np.ndarray]]:
        """``(step, row indices)`` for every step, ascending (row order kept)."""
        if self._order is None:
            order, steps, bounds = group_steps(self.step)
            self._order = [(s, order[a:b]) for s, a, b in zip(steps.tolist(), bounds.tolist(), bounds[1:].tolist())]
        return self._order

    def chunks(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and destination chunk indices of one row."""
        if not self.concrete:
            raise ValueError(f"schedule {self.name!r} is abstract: it has chunk counts but no chunk indices")
        a, b = self.ptr[row], self.ptr[row + 1]
        return self.src_idx[a:b], self.dst_idx[a:b]

    def program(self, node: int) -> list[Op]:
        """Node ``node``'s program in execution order (step, then the phases of the module docstring)."""
        if not 0 <= node < self.nnodes:
            raise ValueError(f"node {node} is not in 0..{self.nnodes - 1}")
        ops = []
        for step, rows in self.rows_by_step():
            sends, recvs, reduces, copies, lreduces = [], [], [], [], []
            for i in rows:
                k = self.kind[i]
                s, d = int(self.src[i]), int(self.dst[i])
                sc, dc = self.chunks(int(i)) if self.concrete else (np.empty(0, np.int32),) * 2
                common = dict(step=step, channel=int(self.channel[i]), src_buf=Buffer(int(self.src_buf[i])),
                              src_chunks=sc, dst_buf=Buffer(int(self.dst_buf[i])), dst_chunks=dc, row=int(i))
                if k <= Row.TRANSFER_REDUCE:
                    if s == node:
                        sends.append(Op(OpKind.SEND, peer=d, **common))
                    if d == node:
                        kind = OpKind.RECV if k == Row.TRANSFER else OpKind.RECV_REDUCE
                        (recvs if k == Row.TRANSFER else reduces).append(Op(kind, peer=s, **common))
                elif s == node:
                    if k == Row.COPY:
                        copies.append(Op(OpKind.COPY, peer=-1, **common))
                    else:
                        lreduces.append(Op(OpKind.REDUCE, peer=-1, **common))
            ops += sends + recvs + reduces + copies + lreduces
        return ops

    def __repr__(self) -> str:
        kind = "concrete" if self.concrete else "abstract"
        return (f"<Schedule {self.name} {self.collective.value} ranks={self.nranks} switches={self.nswitches} "
                f"steps={self.num_steps} rows={self.nrows} {kind}>")


class ScheduleBuilder:
    """Collects rows in vectorized batches and makes a :class:`Schedule`.

    Every ``add_*`` method takes arrays (one entry per row) so a generator
    emits one batch per step for all ranks at once. Chunk sets are given
    either as a 2-D array (rows x chunks per row) or as a list of 1-D arrays.
    With ``abstract=True`` chunk sets may be given as plain counts instead.
    """

    def __init__(self, name: str, collective: Collective | str, nranks: int, *, abstract: bool = False) -> None:
        if not isinstance(nranks, (int, np.integer)) or isinstance(nranks, bool):
            raise TypeError(f"nranks must be an integer, not {nranks!r}")
        if nranks < 1:
            raise ValueError(f"nranks must be at least 1, not {nranks}")
        self.name = name
        self.collective = Collective.parse(collective)
        self.nranks = int(nranks)
        self.abstract = abstract
        self._cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                                    ("kind", "step", "src", "dst", "channel", "src_buf", "dst_buf", "count")}
        self._src_idx: list[np.ndarray] = []
        self._dst_idx: list[np.ndarray] = []

    def _chunk_sets(self, chunks, nrows: int, what: str) -> tuple[np.ndarray, np.ndarray | None]:
        """-> (count per row, flat indices or None)."""
        if self.abstract and np.ndim(chunks) <= 1 and not isinstance(chunks, list):
            c = np.broadcast_to(np.asarray(chunks, dtype=np.int64), (nrows,)).copy()
            return c, None
        if isinstance(chunks, np.ndarray) and chunks.ndim == 2:
            if chunks.shape[0] != nrows:
                raise ValueError(f"{what}: {chunks.shape[0]} chunk rows for {nrows} rows")
            return np.full(nrows, chunks.shape[1], dtype=np.int64), chunks.reshape(-1)
        if isinstance(chunks, np.ndarray) and chunks.ndim == 1:
            chunks = np.broadcast_to(chunks, (nrows, len(chunks)))
            return np.full(nrows, chunks.shape[1], dtype=np.int64), chunks.reshape(-1)
        chunks = list(chunks)
        if len(chunks) != nrows:
            raise ValueError(f"{what}: {len(chunks)} chunk sets for {nrows} rows")
        counts = np.array([len(c) for c in chunks], dtype=np.int64)
        flat = np.concatenate([np.asarray(c, dtype=np.int64).reshape(-1) for c in chunks]) if nrows else np.empty(0, np.int64)
        return counts, flat

    def _add(self, kind, step, src, dst, src_buf, dst_buf, src_chunks, dst_chunks, channel) -> None:
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        nrows = len(src)
        if nrows == 0:
            return
        dst = np.broadcast_to(np.asarray(dst, dtype=np.int64), (nrows,))
        sc, sflat = self._chunk_sets(src_chunks, nrows, "source chunks")
        dc, dflat = self._chunk_sets(src_chunks if dst_chunks is None else dst_chunks, nrows, "destination chunks")
        if (sc != dc).any():
            i = int(np.flatnonzero(sc != dc)[0])
            raise ValueError(f"row {i} of the batch: {int(sc[i])} source chunks but {int(dc[i])} destination chunks")
        for label, v in (("kind", kind), ("step", step), ("channel", channel), ("src_buf", src_buf), ("dst_buf", dst_buf)):
            self._cols[label].append(np.broadcast_to(np.asarray(v, dtype=np.int64), (nrows,)))
        self._cols["src"].append(src)
        self._cols["dst"].append(dst)
        self._cols["count"].append(sc)
        if not self.abstract:
            if sflat is None or dflat is None:
                raise ValueError("a concrete schedule needs chunk indices, not counts")
            self._src_idx.append(sflat)
            self._dst_idx.append(dflat)

    def add_rows(self, kind: Row, step, src, dst, count, src_flat=None, dst_flat=None, *,
                 src_buf: Buffer = Buffer.OUTPUT, dst_buf: Buffer = Buffer.OUTPUT, channel=0) -> None:
        """Rows given in CSR form: ``count[i]`` chunks each, flat indices concatenated.

        The fastest way to add many rows of different sizes; ``src_flat`` and
        ``dst_flat`` may be omitted in an abstract builder.
        """
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        nrows = len(src)
        if nrows == 0:
            return
        count = np.broadcast_to(np.asarray(count, dtype=np.int64), (nrows,)).copy()
        for label, v in (("kind", kind), ("step", step), ("channel", channel), ("src_buf", src_buf),
                         ("dst_buf", dst_buf)):
            self._cols[label].append(np.broadcast_to(np.asarray(v, dtype=np.int64), (nrows,)))
        self._cols["src"].append(src)
        self._cols["dst"].append(np.broadcast_to(np.asarray(dst, dtype=np.int64), (nrows,)))
        self._cols["count"].append(count)
        if not self.abstract:
            if src_flat is None:
                raise ValueError("a concrete schedule needs chunk indices, not counts")
            src_flat = np.asarray(src_flat, dtype=np.int64)
            dst_flat = src_flat if dst_flat is None else np.asarray(dst_flat, dtype=np.int64)
            if len(src_flat) != count.sum() or len(dst_flat) != count.sum():
                raise ValueError(f"{int(count.sum())} chunk indices expected, got {len(src_flat)} and {len(dst_flat)}")
            self._src_idx.append(src_flat)
            self._dst_idx.append(dst_flat)

    def transfer(self, step, src, dst, src_chunks, dst_chunks=None, *, reduce: bool = False,
                 src_buf: Buffer = Buffer.OUTPUT, dst_buf: Buffer = Buffer.OUTPUT, channel=0) -> None:
        """Rows ``src[i] -> dst[i]`` (send + recv, or send + recv-reduce with ``reduce``)."""
        self._add(Row.TRANSFER_REDUCE if reduce else Row.TRANSFER, step, src, dst, src_buf, dst_buf,
                  src_chunks, dst_chunks, channel)

    def copy(self, step, node, src_chunks, dst_chunks, *, src_buf: Buffer = Buffer.OUTPUT,
             dst_buf: Buffer = Buffer.OUTPUT, channel=0) -> None:
        """Local copies on ``node[i]``."""
        self._add(Row.COPY, step, node, node, src_buf, dst_buf, src_chunks, dst_chunks, channel)

    def reduce(self, step, node, src_chunks, dst_chunks, *, src_buf: Buffer = Buffer.SCRATCH,
               dst_buf: Buffer = Buffer.OUTPUT, channel=0) -> None:
        """Local ``dst += src`` on ``node[i]``."""
        self._add(Row.REDUCE, step, node, node, src_buf, dst_buf, src_chunks, dst_chunks, channel)

    def build(self, **meta) -> Schedule:
        """Make the schedule; keyword arguments are :class:`Schedule`'s metadata."""
        cols = {}
        for k, parts in self._cols.items():
            cols[k] = _join(parts, _COLUMN_DTYPES[k])
            # keep the joined column, not the batches: memory holds one copy of the rows, not two
            self._cols[k] = [cols[k]]
        if self.abstract:
            idx = dict(ptr=None, src_idx=None, dst_idx=None)
        else:
            ptr = np.zeros(len(cols["count"]) + 1, dtype=np.int64)
            np.cumsum(cols["count"], out=ptr[1:])
            idx = dict(ptr=ptr,
                       src_idx=np.concatenate(self._src_idx) if self._src_idx else np.empty(0, np.int64),
                       dst_idx=np.concatenate(self._dst_idx) if self._dst_idx else np.empty(0, np.int64))
            self._src_idx, self._dst_idx = [idx["src_idx"]], [idx["dst_idx"]]
        return Schedule(name=self.name, collective=self.collective, nranks=self.nranks, **meta, **cols, **idx)

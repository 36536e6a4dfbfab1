"""Run a schedule on numpy buffers and check it against the collective's definition.

This is the oracle of every generator. :func:`execute` applies the rows step
by step with the semantics of :mod:`inagg.host.schedules.ir` (all sends of a
step read the state before the step; then overwrites, then receive-reduces,
then local copies and reduces), vectorized over all rows of a step.
:func:`check` makes random inputs, runs the schedule and compares every
rank's result with :func:`expected`.

Inputs are small integers stored in the requested dtype, so every sum is
exact in every dtype (float16 included, for the rank counts tested) and the
comparison is exact: a contribution added twice or lost is always caught,
whatever the reduction order. Buffers that the collective leaves undefined
start out as NaN (floats) or random garbage (integers), so a schedule that
reads memory it never wrote is caught as well.

Layouts (``C`` = ``schedule.size_chunks``, ``n`` ranks, ``k = C // n``):

==============  ===========================  =====================================
collective      input of rank r              result
==============  ===========================  =====================================
allreduce       ``C`` chunks                 every rank: the sum (``C`` chunks)
reduce_scatter  ``C`` chunks                 rank r: block r of the sum, at
                                             ``OUTPUT[r*k:(r+1)*k]`` in place,
                                             ``OUTPUT[0:k]`` out of place
allgather       ``k`` chunks (in place: at   every rank: all blocks in rank order
                ``OUTPUT[r*k:(r+1)*k]``)
broadcast       root: ``C`` chunks           every rank: the root's input
reduce          ``C`` chunks                 root: the sum
alltoall        ``C`` chunks, block j for j  rank r: block j = rank j's block r
alltoallv       ``counts[r, j]`` chunks for  rank r: from every j in rank order
                each j, in rank order
barrier         --                           every rank's last step is causally
                                             after every rank's first
==============  ===========================  =====================================
"""

from __future__ import annotations

import numpy as np

from inagg.host.schedules.ir import Buffer, Collective, Row, Schedule, group_steps

__all__ = ["ScheduleError", "execute", "expected", "make_inputs", "check", "check_symbolic", "initial_buffers"]


class ScheduleError(ValueError):
    """A schedule does not compute its collective (raised by :func:`check`)."""


_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                       np.uint64, np.float16, np.float32, np.float64))


def _dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype must be a numpy numeric dtype, not {dtype!r}") from e
    if dt not in _DTYPES:
        raise TypeError(f"dtype must be an integer or float dtype, not {dt}")
    return dt


def _check_elems(chunk_elems) -> int:
    if not isinstance(chunk_elems, (int, np.integer)) or isinstance(chunk_elems, bool):
        raise TypeError(f"chunk_elems must be an integer, not {chunk_elems!r}")
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be at least 1, not {chunk_elems}")
    return int(chunk_elems)


def _offsets(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send offsets (row-wise cumsum) and receive offsets (column-wise) of an all-to-allv."""
    send = np.zeros_like(counts)
    send[:, 1:] = np.cumsum(counts, axis=1)[:, :-1]
    recv = np.zeros_like(counts)
    recv[1:, :] = np.cumsum(counts, axis=0)[:-1, :]
    return send, recv


def make_inputs(schedule: Schedule, chunk_elems: int = 1, dtype=np.int64, seed: int = 0):
    """Random inputs for ``schedule``'s collective (see the module table).

    Returns an array ``(nranks, chunks, chunk_elems)``, or a list of arrays
    for all-to-allv, or ``None`` for a barrier.
    """
    dt = _dtype(dtype)
    e = _check_elems(chunk_elems)
    rng = np.random.default_rng(seed)
    n, c = schedule.nranks, schedule.size_chunks
    coll = schedule.collective
    lo, hi = (0, 8) if dt.kind == "u" else (-8, 8)
    if coll is Collective.BARRIER:
        return None
    if coll is Collective.ALLTOALLV:
        return [rng.integers(lo, hi, size=(int(schedule.counts[r].sum()), e)).astype(dt) for r in range(n)]
    chunks = c // n if coll is Collective.ALLGATHER else c
    return rng.integers(lo, hi, size=(n, chunks, e)).astype(dt)


def expected(schedule: Schedule, inputs) -> list[np.ndarray | None]:
    """What every rank must hold when the collective is done (``None`` where it is undefined).

    Each entry is the expected content of the rank's *result region*, as
    :func:`result_region` cuts it out of the OUTPUT buffer.
    """
    coll = schedule.collective
    n = schedule.nranks
    if coll is Collective.BARRIER:
        return [None] * n
    if coll is Collective.ALLTOALLV:
        counts = schedule.counts
        send, _ = _offsets(counts)
        return [np.concatenate([inputs[j][send[j, r]:send[j, r] + counts[j, r]] for j in range(n)])
                for r in range(n)]
    x = np.asarray(inputs)
    total = x.sum(axis=0, dtype=x.dtype)
    if coll is Collective.ALLREDUCE:
        return [total] * n
    if coll is Collective.REDUCE_SCATTER:
        k = schedule.size_chunks // n
        return [total[r * k:(r + 1) * k] for r in range(n)]
    if coll is Collective.ALLGATHER:
        return [x.reshape(-1, x.shape[-1])] * n
    if coll is Collective.BROADCAST:
        return [x[schedule.root]] * n
    if coll is Collective.REDUCE:
        return [total if r == schedule.root else None for r in range(n)]
    if coll is Collective.ALLTOALL:
        k = schedule.size_chunks // n
        return [np.concatenate([x[j, r * k:(r + 1) * k] for j in range(n)]) for r in range(n)]
    raise AssertionError(coll)  # every member is handled above


def result_region(schedule: Schedule, output: np.ndarray, rank: int) -> np.ndarray:
    """The part of rank ``rank``'s OUTPUT buffer that holds its result."""
    coll = schedule.collective
    n = schedule.nranks
    if coll is Collective.REDUCE_SCATTER:
        k = schedule.size_chunks // n
        return output[rank * k:(rank + 1) * k] if schedule.inplace else output[:k]
    if coll is Collective.ALLTOALLV:
        return output[:int(schedule.counts[:, rank].sum())]
    return output[:schedule.size_chunks]


def _garbage(shape, dt: np.dtype, rng) -> np.ndarray:
    if dt.kind == "f":
        return np.full(shape, np.nan, dtype=dt)
    info = np.iinfo(dt)
    return rng.integers(info.min // 2, info.max // 2, size=shape, endpoint=True).astype(dt)


def _validate_shape(schedule: Schedule, inputs, e: int) -> None:
    n, c = schedule.nranks, schedule.size_chunks
    coll = schedule.collective
    if coll is Collective.BARRIER:
        return
    if coll is Collective.ALLTOALLV:
        if len(inputs) != n:
            raise ValueError(f"alltoallv needs {n} input arrays, not {len(inputs)}")
        for r, a in enumerate(inputs):
            want = (int(schedule.counts[r].sum()), e)
            if np.shape(a) != want:
                raise ValueError(f"input of rank {r} must have shape {want}, not {np.shape(a)}")
        return
    chunks = c // n if coll is Collective.ALLGATHER else c
    if np.shape(inputs) != (n, chunks, e):
        raise ValueError(f"inputs must have shape {(n, chunks, e)}, not {np.shape(inputs)}")


def initial_buffers(schedule: Schedule, inputs, chunk_elems: int, seed: int = 0) -> dict[Buffer, np.ndarray]:
    """The buffers of every node before step 0 (inputs placed, the rest garbage)."""
    e = _check_elems(chunk_elems)
    _validate_shape(schedule, inputs, e)
    coll = schedule.collective
    n = schedule.nranks
    if coll is Collective.BARRIER:
        dt = np.dtype(np.int64)
    elif coll is Collective.ALLTOALLV:
        dt = np.asarray(inputs[0]).dtype
    else:
        dt = np.asarray(inputs).dtype
    rng = np.random.default_rng(seed + 1)
    scratch = max(schedule.scratch_chunks, schedule.switch_scratch_chunks)
    bufs = {
        Buffer.INPUT: _garbage((n, schedule.in_chunks, e), dt, rng),
        Buffer.OUTPUT: _garbage((n, schedule.out_chunks, e), dt, rng),
        Buffer.SCRATCH: _garbage((schedule.nnodes, scratch, e), dt, rng),
    }
    if coll is Collective.BARRIER:
        return bufs
    target = Buffer.OUTPUT if schedule.inplace else Buffer.INPUT
    buf = bufs[target]
    if coll is Collective.ALLTOALLV:
        for r in range(n):
            buf[r, :len(inputs[r])] = inputs[r]
        return bufs
    x = np.asarray(inputs)
    if coll is Collective.ALLGATHER:
        k = x.shape[1]
        if schedule.inplace:
            for r in range(n):
                buf[r, r * k:(r + 1) * k] = x[r]
        else:
            buf[:, :k] = x
    elif coll is Collective.BROADCAST:
        buf[schedule.root, :x.shape[1]] = x[schedule.root]
    else:
        buf[:, :x.shape[1]] = x
    return bufs


class _StepPlan:
    """Flattened index arrays of one step, computed once per schedule."""

    __slots__ = ("step", "groups")

    def __init__(self, schedule: Schedule, step: int, rows: np.ndarray) -> None:
        self.step = step
        self.groups = []
        kinds = schedule.kind[rows]
        for phase in ((Row.TRANSFER, Row.TRANSFER_REDUCE), (Row.COPY,), (Row.REDUCE,)):
            sel = rows[np.isin(kinds, phase)]
            if not len(sel):
                continue
            lens = schedule.count[sel]
            starts = schedule.ptr[sel]
            base = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
            flat = base + np.arange(int(lens.sum()))
            r = np.repeat(sel, lens)
            self.groups.append((phase, r, flat))


def _plans(schedule: Schedule) -> list[_StepPlan]:
    cached = getattr(schedule, "_exec_plans", None)
    if cached is None:
        cached = [_StepPlan(schedule, s, rows) for s, rows in schedule.rows_by_step()]
        schedule._exec_plans = cached
    return cached


def _gather(bufs, buf_ids, nodes, chunks, shape_tail, dtype) -> np.ndarray:
    out = np.empty((len(nodes),) + shape_tail, dtype=dtype)
    for b in (Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH):
        m = buf_ids == b
        if m.any():
            out[m] = bufs[b][nodes[m], chunks[m]]
    return out


def _scatter(bufs, buf_ids, nodes, chunks, data, add: bool) -> None:
    for b in (Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH):
        m = buf_ids == b
        if m.any():
            if add:
                np.add.at(bufs[b], (nodes[m], chunks[m]), data[m])
            else:
                bufs[b][nodes[m], chunks[m]] = data[m]


def execute(schedule: Schedule, inputs, chunk_elems: int = 1, *, seed: int = 0) -> dict[Buffer, np.ndarray]:
    """Run ``schedule`` and return every node's buffers after the last step."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"execute needs a Schedule, not {type(schedule).__name__}")
    if not schedule.concrete:
        raise ValueError(f"schedule {schedule.name!r} is abstract (chunk counts only) and cannot be executed")
    bufs = initial_buffers(schedule, inputs, chunk_elems, seed)
    tail = bufs[Buffer.OUTPUT].shape[2:]
    dt = bufs[Buffer.OUTPUT].dtype
    for plan in _plans(schedule):
        for phase, r, flat in plan.groups:
            src_chunks = schedule.src_idx[flat]
            dst_chunks = schedule.dst_idx[flat]
            data = _gather(bufs, schedule.src_buf[r], schedule.src[r], src_chunks, tail, dt)
            if phase[0] == Row.TRANSFER:
                kinds = schedule.kind[r]
                over = kinds == Row.TRANSFER
                _scatter(bufs, schedule.dst_buf[r][over], schedule.dst[r][over], dst_chunks[over], data[over], False)
                red = ~over
                _scatter(bufs, schedule.dst_buf[r][red], schedule.dst[r][red], dst_chunks[red], data[red], True)
            else:
                _scatter(bufs, schedule.dst_buf[r], schedule.dst[r], dst_chunks, data, phase[0] == Row.REDUCE)
    return bufs


def _check_barrier(schedule: Schedule) -> None:
    """Every rank must (transitively) have heard from every other rank."""
    n = schedule.nnodes
    know = np.eye(n, dtype=bool)
    for _, rows in schedule.rows_by_step():
        x = rows[schedule.is_transfer[rows]]
        if not len(x):
            continue
        before = know.copy()
        np.logical_or.at(know, schedule.dst[x], before[schedule.src[x]])
    r = schedule.nranks
    missing = ~know[:r, :r]
    if missing.any():
        a, b = np.argwhere(missing)[0]
        raise ScheduleError(f"{schedule.name}: barrier is incomplete: rank {a} can finish before rank {b} starts")


def check(schedule: Schedule, *, chunk_elems: int = 2, dtype=np.int64, seed: int = 0) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` computes its collective.

    Runs it on random inputs (see the module docstring for why the comparison
    is exact) and compares each rank's result region with :func:`expected`.
    """
    if schedule.collective is Collective.BARRIER:
        _check_barrier(schedule)
        return
    inputs = make_inputs(schedule, chunk_elems, dtype, seed)
    bufs = execute(schedule, inputs, chunk_elems, seed=seed)
    out = bufs[Buffer.OUTPUT]
    for r, want in enumerate(expected(schedule, inputs)):
        if want is None:
            continue
        got = result_region(schedule, out[r], r)
        if got.shape != want.shape:
            raise ScheduleError(f"{schedule.name}: rank {r}'s result has shape {got.shape}, expected {want.shape}")
        if not np.array_equal(got, want):
            bad = np.argwhere(~((got == want) | (np.isnan(got) & np.isnan(want)) if got.dtype.kind == "f"
                                else got == want))[0]
            raise ScheduleError(
                f"{schedule.name} ({schedule.collective.value}, {schedule.nranks} ranks): rank {r} chunk "
                f"{int(bad[0])} holds {got[tuple(bad)]!r}, expected {want[tuple(bad)]!r}")


def _needs(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """``(sources, sinks)``: every sink must hear, through the steps, from every source."""
    ranks = np.arange(schedule.nranks)
    root = np.array([schedule.root if schedule.root is not None else 0])
    if schedule.collective is Collective.BROADCAST:
        return root, ranks
    if schedule.collective is Collective.REDUCE:
        return ranks, root
    return ranks, ranks


def check_symbolic(schedule: Schedule, *, peers: int = 2, sources: int | None = None) -> None:
    """Raise :class:`ScheduleError` unless two invariants hold; cheap enough for 65,536 ranks.

    For schedules too large to execute (abstract ones included): it reads
    the rows, not data, so it cannot see which chunk a message carries --
    :func:`check` can, where it fits.

    * **Per-step permutation**: on every channel of every step, no rank sends
      more than ``peers`` messages or receives more than ``peers`` (one per
      direction of Trivance's joint step, a double-tree parent's two
      children): the step is that many partial permutations, not a rank
      swamped by a fan-in. Switch nodes, which aggregate their children, are
      exempt.
    * **Coverage**: every rank the collective's result depends on reaches
      every rank that needs it (all to all; broadcast from the root; reduce
      to the root), through the steps in order, a step's sends reading the
      state before it. One bit per source rank, 64 sources per pass;
      ``sources`` caps how many sources are followed (spread evenly; default
      all of them up to 1,024 ranks, else 64: one pass).
    """
    if peers < 1:
        raise ValueError(f"peers must be at least 1, not {peers}")
    src, dst, step, channel = schedule.src, schedule.dst, schedule.step, schedule.channel
    nch = int(channel.max(initial=0)) + 1
    if schedule.only_transfers:  # the large schedules: the grouping evaluate shares, no copy of the columns
        groups = [rows for _, rows in schedule.rows_by_step()]
    else:
        x = schedule.is_transfer
        src, dst, step, channel = src[x], dst[x], step[x], channel[x]
        order, _, bounds = group_steps(step)
        groups = [order[a:b] for a, b in zip(bounds.tolist(), bounds[1:].tolist())]
    r = schedule.nranks
    for g in groups:
        for label, node in (("sends", src[g]), ("receives", dst[g])):
            rank = node < r
            degree = np.bincount(channel[g][rank] * r + node[rank], minlength=nch * r)
            if degree.max(initial=0) > peers:
                i = int(np.argmax(degree))
                raise ScheduleError(f"{schedule.name}: rank {i % r} {label} {int(degree[i])} messages on channel "
                                    f"{i // r} in step {int(step[g[0]])}, more than {peers}")
    want_src, want_dst = _needs(schedule)
    limit = (len(want_src) if schedule.nranks <= 1024 else 64) if sources is None else sources
    if len(want_src) > limit:
        want_src = want_src[(np.arange(limit) * len(want_src)) // limit]
    for lo in range(0, len(want_src), 64):
        batch = want_src[lo:lo + 64]
        heard = np.zeros(schedule.nnodes, dtype=np.uint64)
        heard[batch] = np.left_shift(np.uint64(1), np.arange(len(batch), dtype=np.uint64))
        for g in groups:
            before = heard.copy()
            np.bitwise_or.at(heard, dst[g], before[src[g]])
        full = np.uint64((1 << len(batch)) - 1) if len(batch) < 64 else np.uint64(2 ** 64 - 1)
        short = want_dst[heard[want_dst] != full]
        if len(short):
            rank = int(short[0])
            bits = (heard[rank] >> np.arange(len(batch), dtype=np.uint64)) & np.uint64(1)
            missing = int(batch[int(np.flatnonzero(bits == 0)[0])])
            raise ScheduleError(f"{schedule.name} ({schedule.collective.value}, {schedule.nranks} ranks): "
                                f"rank {rank} never hears from rank {missing}")

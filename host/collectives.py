"""The six collectives as sans-IO operations over the UC protocol and EPIC's Modes I, II and III
(``docs/protocol.md`` sections 11 and 11.1).

The switch's job says which collective runs (``JobSpec.collective``) and so
which children send lanes up and which get lanes down; a child that sends no
data sends *payload-less contributions* (DMA length 0) to take part in a
chunk, and a child that gets no data receives a *completion*, a result
without lanes. Both move a worker's window as a result does, so the timers
and the resend rules of section 3.1 are the same for every collective.

* :class:`~inagg.host.worker.AllReduce` (in :mod:`inagg.host.worker`): the sum on every rank.
* :class:`Reduce`: the sum on the root rank; every other rank learns completion.
* :class:`Broadcast`: the root rank's array, bit for bit, on every rank.
* :class:`Barrier`: one payload-less chunk each way.
* :class:`ReduceScatter`: an all-reduce of which rank ``r`` keeps part ``r``
  (``numpy.array_split`` of the sum into ``ranks`` parts).
* :class:`AllGather`: every rank's array, concatenated in rank order, on every
  rank: an all-reduce of the float32 bits in which each rank fills only its own
  part, so every lane has one nonzero contributor and the sum is exact.

Every operation but the all-reduce (which has its agreement round) sends a
header of ``ranks`` lanes before its data: lane ``r`` carries rank ``r``'s
element count when rank ``r`` sends data. A receiver compares it with its own
and raises :class:`~inagg.host.worker.LengthMismatchError`, so ranks that
pass different lengths get an error, never a wrong array.

Reduce has no agreement round: its results reach the root only, so the other
ranks could not learn an agreed scale. Its caller passes ``amax``, the same
bound on ``|x|`` on every rank; values beyond it are refused before anything
is sent.

:func:`tree_operations` builds every rank's operation of every job of a tree
plan, over UC or, for EPIC's Modes I, II and III, over an RC queue pair
(:class:`~inagg.host.rc_worker.RcWorker`): the same operations, whose
worker sends no contribution where the collective has a rank send nothing
and takes no result where it has it get none (section 11.1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inagg.models import quant, wire
from inagg.models.frame import CONTRIBUTION
from inagg.models.job import Collective, JobSpec, SwitchSpec
from inagg.models.protocol import ICRC_LEN, Counter, qp_udp_sport

from inagg.host.fastpath import Result, ResultBatch, ResultParser, split_results
from inagg.host.rc_worker import RC_MODES, RcWorker
from inagg.host.worker import AllReduce, LengthMismatchError, ProtocolError, Timing, Worker, padded_rows

__all__ = ["Reduce", "Broadcast", "Barrier", "ReduceScatter", "AllGather", "collective_worker", "tree_operations",
           "sends_data", "receives_data", "EmptyContributions", "CompletionParser", "operation", "reference",
           "exponent"]


def sends_data(job: JobSpec, worker: int) -> bool:
    """True when ``worker`` of ``job`` sends lanes (else payload-less contributions)."""
    c = job.collective
    if c is Collective.BARRIER:
        return False
    return c is not Collective.BROADCAST or job.root == worker


def receives_data(job: JobSpec, worker: int) -> bool:
    """True when ``worker`` of ``job`` gets lanes back (else completions)."""
    c = job.collective
    if c is Collective.BARRIER:
        return False
    return c is not Collective.REDUCE or job.root == worker


class EmptyContributions:
    """Payload-less contributions (UC RDMA WRITE ONLY, DMA length 0) of one worker: the builder a
    :class:`~inagg.host.worker.Worker` uses when its collective has it send no data."""

    def __init__(self, switch: SwitchSpec, job: JobSpec, rank: int):
        me = job.workers[rank]
        self._fields = dict(eth_dst=wire.mac_bytes(switch.mac), eth_src=wire.mac_bytes(me.mac),
                            ip_src=wire.ip_bytes(me.ip), ip_dst=wire.ip_bytes(switch.ip),
                            udp_sport=qp_udp_sport(me.qpn), opcode=CONTRIBUTION.opcode, dest_qpn=job.qpn(rank),
                            rkey=job.contrib_rkey(rank), payload=b"", pkey=switch.pkey)
        self.chunk_bytes = switch.chunk_bytes
        self.frame_len = CONTRIBUTION.size + ICRC_LEN

    def build(self, chunks: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        """One frame per chunk sequence of ``chunks`` (``lanes`` is not sent), as rows of a uint8 array."""
        frames = b"".join(wire.build(psn=int(c), va=int(c) * self.chunk_bytes, **self._fields) for c in chunks)
        return np.frombuffer(frames, np.uint8).reshape(len(chunks), self.frame_len)


class CompletionParser:
    """Checks completions (results without lanes) for one worker, as :class:`~inagg.host.fastpath.ResultParser`
    checks results; a completion comes back as a :class:`~inagg.host.fastpath.Result` of zero lanes."""

    def __init__(self, switch: SwitchSpec, job: JobSpec, rank: int):
        self._results = ResultParser(switch, job, rank)
        self._pkey, self.chunk_bytes = switch.pkey, switch.chunk_bytes
        self._zero = np.zeros(switch.lanes, ">u4")

    def parse(self, frame: bytes) -> Result | Counter:
        r = wire.parse(frame, self._pkey)
        if isinstance(r, Counter):
            return r
        chunk30 = self._results.chunk(r, 0)
        if isinstance(chunk30, Counter):
            return chunk30
        return Result(chunk30, False, False, r.va, r.psn, self._zero)

    def parse_batch(self, frames: Sequence[bytes]) -> tuple[ResultBatch, list[Counter]]:
        """:meth:`parse` on each frame, returned as :meth:`~inagg.host.fastpath.ResultParser.parse_batch` does."""
        return split_results([self.parse(f) for f in frames], self._zero.size)


def collective_worker(switch: SwitchSpec, job: JobSpec, worker: int, **kw) -> Worker:
    """A :class:`~inagg.host.worker.Worker` (``kw`` its options) that sends and takes what ``job.collective``
    has ``worker`` do."""
    w = Worker(switch, job, worker, **kw)
    if not sends_data(job, worker):
        w.template = EmptyContributions(switch, job, worker)
    if not receives_data(job, worker):
        w.parser = CompletionParser(switch, job, worker)
    return w


def _float32(array: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype != np.float32:
        raise TypeError(f"{name} takes a float32 array, not {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} takes a 1-D array, not shape {a.shape}")
    return a


def _check(op, worker: Worker, rank) -> None:
    """Refuse a worker whose job runs another collective than ``op``'s, or a rank outside the job."""
    if worker.job.collective is not op.collective:
        raise ValueError(f"{type(op).__name__} needs a {op.collective.value} job, not {worker.job.collective.value}")
    if not isinstance(rank, int) or not 0 <= rank < worker.job.ranks:
        raise ValueError(f"rank must be an integer in 0..{worker.job.ranks - 1}, not {rank!r}")


class _Operation:
    """One batch of chunks through a :class:`~inagg.host.worker.Worker`: the sans-IO interface of
    :class:`~inagg.host.worker.AllReduce`; a subclass gives the lanes and reads the results."""

    def __init__(self, worker: Worker, rank: int):
        _check(self, worker, rank)
        self.worker, self.rank, self.ranks = worker, rank, worker.job.ranks
        self._result = None
        self._started = self._done = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def deadline(self) -> float | None:
        return None if self._done else self.worker.deadline

    def start(self, now: float) -> list[bytes]:
        if self._started:
            raise RuntimeError(f"this {type(self).__name__.lower()} has started already")
        self._started = True
        return self._check(self.worker.submit(now, padded_rows(self._lanes(), self.worker.switch.lanes)))

    def receive(self, now: float, frame: bytes) -> list[bytes]:
        return self._check(self.worker.receive(now, frame))

    def receive_batch(self, now: float, frames: Sequence[bytes]) -> list[bytes]:
        """Frames that arrived together (:meth:`~inagg.host.worker.Worker.receive_batch`)."""
        return self._check(self.worker.receive_batch(now, frames))

    def on_timer(self, now: float) -> list[bytes]:
        return self._check(self.worker.on_timer(now))

    def result(self):
        if not self._done:
            raise RuntimeError(f"the {type(self).__name__.lower()} is not complete")
        return self._result

    def _check(self, out: list[bytes]) -> list[bytes]:
        if self.worker.done and not self._done:
            words, fp32, _ = self.worker.results()
            self._result = self._finish(words.ravel(), fp32)
            self._done = True
        return out

    def _header(self, count: int, sends: bool) -> np.ndarray:
        """The length header: lane ``rank`` is this rank's element count when it sends data."""
        h = np.zeros(self.ranks, np.int32)
        if sends:
            if count >= 2**31:
                raise ValueError(f"{count} elements do not fit one header lane (at most 2**31 - 1)")
            h[self.rank] = count
        return h

    def _check_lengths(self, header: np.ndarray, count: int, senders: np.ndarray) -> None:
        h = header.view(np.int32)[:self.ranks]
        if (h[senders] != count).any():
            other = int(np.flatnonzero(senders & (h != count))[0])
            raise LengthMismatchError(f"job {self.worker.job.job} rank {self.rank}: rank {other} passed "
                                      f"{int(h[other])} elements, this rank {count}")


class Reduce(_Operation):
    """The sum over the ranks, on the root rank only (sans-IO; :attr:`result` is None on the others).

    ``amax`` bounds ``|x|`` on every rank (the same value everywhere; the
    module docstring says why); ``rank`` is this rank's index in the tree.
    """

    collective = Collective.REDUCE

    def __init__(self, worker: Worker, data: np.ndarray, *, amax: float, rank: int | None = None):
        super().__init__(worker, worker.rank if rank is None else rank)
        self.data = _float32(data, "reduce")
        if not isinstance(amax, (int, float)) or not np.isfinite(amax) or amax < 0:
            raise ValueError(f"amax must be a finite number >= 0, not {amax!r}")
        if self.data.size and not float(np.max(np.abs(self.data))) <= amax:
            raise ValueError(f"data exceed amax {amax} (or hold NaN or infinity); refusing to send them")
        self.exponent = quant.choose_exponent(float(amax), self.ranks) if amax > 0 else 0
        self.root = receives_data(worker.job, worker.rank)

    def _lanes(self) -> np.ndarray:
        return np.concatenate([self._header(self.data.size, True), quant.quantize(self.data, self.exponent)])

    def _finish(self, words: np.ndarray, fp32: np.ndarray):
        if not self.root:
            return None
        lanes = self.worker.switch.lanes
        if fp32.any():  # a promoted chunk carries every lane as FP32: the header too
            values = np.where(np.repeat(fp32, lanes), words.view(np.float32), words.view(np.int32))
        else:
            values = words.view(np.int32)
        self._check_lengths(values[:self.ranks].astype(np.int32), self.data.size, np.ones(self.ranks, bool))
        data = words[self.ranks:self.ranks + self.data.size]
        wide = np.repeat(fp32, lanes)[self.ranks:self.ranks + self.data.size]
        out = np.empty(self.data.size, np.float32)
        out[~wide] = quant.dequantize(data[~wide].view(np.int32), self.exponent)
        out[wide] = quant.dequantize(data[wide].view(np.float32), self.exponent)
        return out


class Broadcast(_Operation):
    """The root rank's float32 array on every rank, bit for bit (sans-IO).

    The root passes its array; every other rank an array of the same length
    (its values are not sent).
    """

    collective = Collective.BROADCAST

    def __init__(self, worker: Worker, data: np.ndarray, *, rank: int | None = None):
        super().__init__(worker, worker.rank if rank is None else rank)
        self.data = _float32(data, "broadcast")
        self.root = sends_data(worker.job, worker.rank)

    def _lanes(self) -> np.ndarray:
        if not self.root:
            return np.zeros(self.ranks + self.data.size, np.int32)
        return np.concatenate([self._header(self.data.size, True), self.data.view(np.int32)])

    def _finish(self, words: np.ndarray, fp32: np.ndarray):
        header = words[:self.ranks].view(np.int32)
        self._check_lengths(header, self.data.size, header != 0)
        if not (header != 0).any() and self.data.size:
            raise ProtocolError(f"job {self.worker.job.job} rank {self.rank}: the broadcast carried no data")
        return words[self.ranks:self.ranks + self.data.size].view(np.float32).copy()


class Barrier(_Operation):
    """Every rank waits until every rank has entered (sans-IO): one payload-less chunk."""

    collective = Collective.BARRIER

    def __init__(self, worker: Worker, *, rank: int | None = None):
        super().__init__(worker, worker.rank if rank is None else rank)

    def _lanes(self) -> np.ndarray:
        return np.zeros(1, np.int32)

    def _finish(self, words: np.ndarray, fp32: np.ndarray):
        return None


class AllGather(_Operation):
    """Every rank's float32 array (all of one length), concatenated in rank order, on every rank (sans-IO)."""

    collective = Collective.ALLGATHER

    def __init__(self, worker: Worker, data: np.ndarray, *, rank: int | None = None):
        super().__init__(worker, worker.rank if rank is None else rank)
        self.data = _float32(data, "allgather")

    def _lanes(self) -> np.ndarray:
        m = self.data.size
        out = np.zeros(self.ranks * (1 + m), np.int32)
        out[:self.ranks] = self._header(m, True)
        out[self.ranks + self.rank * m:self.ranks + (self.rank + 1) * m] = self.data.view(np.int32)
        return out

    def _finish(self, words: np.ndarray, fp32: np.ndarray):
        self._check_lengths(words[:self.ranks], self.data.size, np.ones(self.ranks, bool))
        if fp32.any():
            raise ProtocolError(f"job {self.worker.job.job} rank {self.rank}: an all-gather lane overflowed, "
                                "so two ranks wrote the same lane")
        return words[self.ranks:self.ranks * (1 + self.data.size)].view(np.float32).copy()


class ReduceScatter:
    """Part ``rank`` of the sum over the ranks (``numpy.array_split`` into ``ranks`` parts), sans-IO:
    an :class:`~inagg.host.worker.AllReduce` of which this rank keeps its part."""

    collective = Collective.REDUCE_SCATTER

    def __init__(self, worker: Worker, data: np.ndarray, *, rank: int | None = None):
        self.rank = worker.rank if rank is None else rank
        _check(self, worker, self.rank)
        self.allreduce = AllReduce(worker, _float32(data, "reduce_scatter"))
        self.worker = worker
        self.start, self.receive, self.on_timer = self.allreduce.start, self.allreduce.receive, self.allreduce.on_timer
        self.receive_batch = self.allreduce.receive_batch

    done = property(lambda self: self.allreduce.done)
    deadline = property(lambda self: self.allreduce.deadline)
    exponent = property(lambda self: self.allreduce.exponent)

    def result(self) -> np.ndarray:
        return np.array_split(self.allreduce.result(), self.worker.job.ranks)[self.rank]


def operation(worker: Worker, data: np.ndarray, *, rank: int | None = None, amax: float | None = None):
    """The sans-IO operation of ``worker.job.collective`` for this rank's ``data`` (``amax``: Reduce only)."""
    c = worker.job.collective
    if c is Collective.ALLREDUCE:
        return AllReduce(worker, data)
    if c is Collective.BARRIER:
        return Barrier(worker, rank=rank)
    if c is Collective.REDUCE:
        return Reduce(worker, data, amax=amax, rank=rank)
    return {Collective.BROADCAST: Broadcast, Collective.REDUCE_SCATTER: ReduceScatter,
            Collective.ALLGATHER: AllGather}[c](worker, data, rank=rank)


def tree_operations(tp, data, *, timing: Timing | None = None) -> dict[int, dict[int, object]]:
    """Every rank's sans-IO operation in every job of ``tp`` (a
    :class:`~inagg.host.controller.TreePlan`), as ``{rank: {qpn: operation}}``: the key is the rank's QPN in
    that job, so ``RankMux(ops[r])`` (:class:`~inagg.host.memnet.RankMux`) is rank ``r``'s endpoint.

    ``data[j][r]`` is rank ``r``'s array in the ``j``-th job of the plan. A UC
    job runs its collective (:func:`operation`; Reduce's ``amax`` is the
    largest magnitude of any rank's data in that job) over a UC worker, a
    Mode I, II or III job over an RC queue pair (:class:`~inagg.host.rc_worker.RcWorker`).
    """
    jobs = tp.plans[0].jobs
    if len(data) != len(jobs):
        raise ValueError(f"the plan has {len(jobs)} job(s), data for {len(data)}")
    amax = [max((float(np.abs(d).max()) for d in job_data if d.size), default=0.0) for job_data in data]
    ops: dict[int, dict[int, object]] = {}
    for r in range(tp.tree.ranks):
        s, w = tp.rank(r)
        p = tp.plans[s]
        ops[r] = {}
        for j, job in enumerate(p.jobs):
            worker = (RcWorker if job.mode in RC_MODES else collective_worker)(p.switch, job, w, timing=timing)
            op = operation(worker, data[j][r], rank=r, amax=amax[j])
            ops[r][job.workers[w].qpn] = op
    return ops


def exponent(op) -> int | None:
    """The scale exponent a finished operation's sums were taken at (None when it sums nothing)."""
    return getattr(op, "exponent", None)


def reference(collective: Collective | str, data: list[np.ndarray], *, root: int = 0,
              exponent: int | None = None) -> list[np.ndarray | None]:
    """What each rank must hold after ``collective`` of the ranks' ``data``, by numpy, bit for bit.

    A sum is the integer sum of the data quantized at ``2**exponent``,
    dequantized: the switch adds INT32 lanes exactly while nothing
    overflows, which the agreed scale (or Reduce's bound) ensures. None
    stands for "no data" (Reduce's other ranks, Barrier).
    """
    c, n = Collective(collective), len(data)
    if c is Collective.BARRIER:
        return [None] * n
    if c is Collective.BROADCAST:
        return [data[root]] * n
    if c is Collective.ALLGATHER:
        return [np.concatenate(data)] * n
    total = quant.dequantize(np.sum([quant.quantize(d, exponent).astype(np.int64) for d in data], axis=0)
                             .astype(np.int32), exponent)
    if c is Collective.REDUCE:
        return [total if r == root else None for r in range(n)]
    if c is Collective.REDUCE_SCATTER:
        return np.array_split(total, n)
    return [total] * n

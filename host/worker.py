"""The worker's Mode II protocol as sans-IO state machines.

Nothing here owns a socket, a clock or a thread. A driver (a transport, a
test, the model checker) feeds events in and carries frames out:

* ``submit`` / ``start`` (time ``now``): begin work; returns frames to send.
* ``receive(now, frame)``: a frame arrived; returns frames to send.
* ``on_timer(now)``: the clock reached :attr:`deadline`; returns frames to send.
* :attr:`deadline`: when ``on_timer`` must be called next (None: no timer).

:class:`Worker` is the reliable chunk stream of ``docs/protocol.md`` sections
3 and 3.1 for one worker of one job: a window of ``job.window`` chunks
outstanding, one timer per chunk with exponential backoff, duplicate and
late results ignored and counted, INT32 and FP32 results accepted.

:class:`AllReduce` is one all-reduce of a float32 vector on top of it: the
scale agreement round of section 2.1 (which also checks that every rank
passed the same number of elements), quantization, the data chunks, and
dequantization of the sum.
"""

from __future__ import annotations

import copy
import math
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inagg.models import quant
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import CHUNK_MOD, IMM_CHUNK_MASK

from inagg.host.fastpath import ContribTemplate, ResultBatch, ResultParser, split_results

__all__ = [
    "Timing", "RttEstimator", "Worker", "AllReduce", "ProtocolError", "ChunkTimeoutError", "LengthMismatchError",
    "SaturatedResultError", "QuantizedChunks", "AGREE_EXP_LANES", "AGREE_LEN_BITS", "AGREE_NONFINITE_LANE",
    "agreement_chunks", "MAX_RESCALES", "chunk_rows", "padded_rows",
]

# Frames of a batch are built this many chunks at a time, as the window reaches them.
_BLOCK = 512


class ProtocolError(Exception):
    """An all-reduce that cannot complete."""


class ChunkTimeoutError(ProtocolError, TimeoutError):
    """A chunk got no result after the configured number of tries.

    ``cause`` says why when the caller found out (the switch's drop
    counters, :attr:`~inagg.host.api.Group.diagnose`); without it the
    message names the usual suspects.
    """

    def __init__(self, job: int, rank: int, chunk: int, tries: int, cause: str | None = None):
        self.job, self.rank, self.chunk, self.tries, self.cause = job, rank, chunk, tries, cause
        super().__init__(f"job {job} worker {rank}: no result for chunk {chunk} after {tries} tries "
                         f"({cause or 'switch unreachable, or another worker of the job is missing'})")

    def __reduce__(self):
        # A worker process sends it to the demo's parent through a pipe: pickled by its arguments.
        return type(self), (self.job, self.rank, self.chunk, self.tries, self.cause)


class LengthMismatchError(ProtocolError, ValueError):
    """The ranks of an all-reduce passed arrays of different lengths."""


class SaturatedResultError(ProtocolError):
    """The switch kept saturating lanes: in the agreement round, or after :data:`MAX_RESCALES` smaller scales."""


@dataclass(frozen=True)
class Timing:
    """Retransmission parameters (seconds, or the driver's unit of time).

    A chunk's first timeout is the retransmission timeout (RTO) when it is
    sent; each resend multiplies it by ``backoff`` up to ``max_timeout``;
    after ``tries`` sends without a result the all-reduce fails with
    :class:`ChunkTimeoutError`. The RTO is ``timeout`` until the first
    round-trip sample, then, with ``estimate``, RFC 6298's
    ``SRTT + 4 * RTTVAR`` from the results of chunks sent once (Karn's
    rule), kept within ``min_timeout`` (None: ``timeout``) and
    ``max_timeout`` (:class:`RttEstimator`; ``docs/protocol.md`` section
    3.1). Without ``estimate`` every first timeout is ``timeout``. A chunk
    sent once and still without result when the result of a chunk
    ``early`` or more places after it arrives is resent at once, before its
    timer, as TCP's fast retransmit does; 0 waits for the timer always.
    """

    timeout: float = 0.005
    backoff: float = 2.0
    max_timeout: float = 0.2
    tries: int = 10
    early: int = 3
    min_timeout: float | None = None
    estimate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number, not {self.timeout!r}")
        if not isinstance(self.backoff, (int, float)) or not self.backoff >= 1:
            raise ValueError(f"backoff must be a number >= 1, not {self.backoff!r}")
        if not isinstance(self.max_timeout, (int, float)) or not self.max_timeout >= self.timeout:
            raise ValueError(f"max_timeout must be a number >= timeout ({self.timeout}), not {self.max_timeout!r}")
        if not isinstance(self.tries, int) or self.tries < 1:
            raise ValueError(f"tries must be a positive integer, not {self.tries!r}")
        if not isinstance(self.early, int) or self.early < 0:
            raise ValueError(f"early must be a non-negative integer, not {self.early!r}")
        if self.min_timeout is not None and (not isinstance(self.min_timeout, (int, float))
                                             or not 0 < self.min_timeout <= self.max_timeout):
            raise ValueError(f"min_timeout must be None or a number in (0, max_timeout], not {self.min_timeout!r}")
        if not isinstance(self.estimate, bool):
            raise TypeError(f"estimate must be a bool, not {type(self.estimate).__name__}")

    @property
    def floor(self) -> float:
        """The smallest RTO the estimator gives."""
        return self.timeout if self.min_timeout is None else self.min_timeout

    def after(self, sends: int, rto: float | None = None) -> float:
        """The timeout that follows the ``sends``-th send of a chunk whose first timeout was ``rto`` (None: ``timeout``)."""
        return min((self.timeout if rto is None else rto) * self.backoff ** (sends - 1), self.max_timeout)


class RttEstimator:
    """The retransmission timeout of RFC 6298 (sans-IO): smoothed round trip and its variation.

    :meth:`sample` takes round-trip times measured on chunks sent once
    (Karn's rule: a resent chunk's result may answer any of its sends, so
    the caller does not sample it). Before the first sample :attr:`rto` is
    ``timing.timeout``; then ``SRTT + 4 * RTTVAR`` within
    ``[timing.floor, timing.max_timeout]``. With ``timing.estimate`` off it
    stays ``timing.timeout``. The per-send doubling after a timeout is the
    caller's (:meth:`Timing.after`): it backs off each resent chunk, and the
    estimate stays that of the path.
    """

    # RFC 6298 section 2: alpha = 1/8, beta = 1/4, K = 4.
    ALPHA, BETA, K = 0.125, 0.25, 4

    def __init__(self, timing: Timing):
        self.timing = timing
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = timing.timeout

    def sample(self, rtt: float) -> None:
        """Take one round-trip time ``rtt`` (>= 0) of a chunk sent once."""
        if not self.timing.estimate:
            return
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = (1 - self.BETA) * self.rttvar + self.BETA * abs(self.srtt - rtt)
            self.srtt = (1 - self.ALPHA) * self.srtt + self.ALPHA * rtt
        self.rto = min(max(self.srtt + self.K * self.rttvar, self.timing.floor), self.timing.max_timeout)

    def state(self) -> tuple:
        """What steers future timeouts (the model checker merges states by it)."""
        return self.srtt, self.rttvar, self.rto


class Worker:
    """The Mode II chunk stream of worker ``rank`` of ``job`` (sans-IO).

    A batch of chunks (int32 lanes, one row per chunk) is numbered with the
    job's chunk sequence, which runs on from batch to batch
    (``docs/protocol.md`` section 1.5), starting at ``first_chunk``. One
    batch is in progress at a time; :meth:`results` returns it once
    :attr:`done`.

    ``stats`` counts frames sent and resent, results placed, and every
    ignored frame by reason: the :class:`~inagg.models.protocol.Counter`
    of a malformed or misaddressed frame, ``"duplicate"`` for a result
    already held, ``"unexpected"`` for a chunk outside the window.

    ``accept_zero_icrc=True`` takes results whose ICRC field is zero, as a
    Tofino switch sends them (``docs/protocol.md`` section 8, ``docs/p4.md``),
    and counts each such frame in ``stats["zero_icrc"]``; see
    :class:`~inagg.host.fastpath.ResultParser`. Leave it off for every other
    switch.
    """

    def __init__(self, switch: SwitchSpec, job: JobSpec, rank: int, *, timing: Timing | None = None,
                 first_chunk: int = 0, accept_zero_icrc: bool = False):
        if not isinstance(first_chunk, int) or not 0 <= first_chunk < CHUNK_MOD:
            raise ValueError(f"first_chunk must be an integer in 0..2**32-1, not {first_chunk!r}")
        self.switch, self.job, self.rank = switch, job, rank
        self.timing = timing or Timing()
        self.rtt = RttEstimator(self.timing)
        self.template = ContribTemplate(switch, job, rank)
        self.parser = ResultParser(switch, job, rank, accept_zero_icrc=accept_zero_icrc)
        self.window = job.window
        self.next_chunk = first_chunk
        self.stats: Tally = Tally()
        self._k = 0
        self._lanes = np.zeros((0, switch.lanes), np.int32)
        self._words = np.zeros((0, switch.lanes), np.uint32)
        self._fp32 = np.zeros(0, bool)
        self._saturated = np.zeros(0, bool)
        self._got = np.zeros(0, bool)
        # Per chunk of the batch: sends so far, time of the first send, timer deadline (inf: none armed).
        self._sends = np.zeros(0, np.int64)
        self._sent_at = np.zeros(0)
        self._due = np.zeros(0)
        self._low = self._sent = 0
        self._blocks: dict[int, np.ndarray] = {}

    # -- the batch ------------------------------------------------------

    @property
    def base(self) -> int:
        """Chunk sequence of the current batch's first chunk."""
        return (self.next_chunk - self._k) % CHUNK_MOD

    @property
    def done(self) -> bool:
        """True when every chunk of the current batch has its result."""
        return self._low == self._k

    @property
    def deadline(self) -> float | None:
        """Time of the earliest chunk timer, or None when nothing is outstanding."""
        if self._low == self._sent:
            return None
        d = float(self._due[self._low:self._sent].min())
        return None if d == math.inf else d

    def submit(self, now: float, lanes: "np.ndarray | QuantizedChunks") -> list[bytes]:
        """Start a batch: the chunks ``lanes`` (int32, shape (k, lanes)); returns the first frames.

        ``lanes`` may also be a :class:`QuantizedChunks`, whose rows are
        computed only as the window reaches them.
        """
        lanes = chunk_rows(self, lanes)
        k = lanes.shape[0]
        self._k, self._lanes = k, lanes
        self._words = np.zeros((k, self.switch.lanes), np.uint32)
        self._fp32 = np.zeros(k, bool)
        self._saturated = np.zeros(k, bool)
        self._got = np.zeros(k, bool)
        self._sends = np.zeros(k, np.int64)
        self._sent_at = np.zeros(k)
        self._due = np.full(k, math.inf)
        self._low = self._sent = 0
        self._blocks.clear()
        self.next_chunk = (self.next_chunk + k) % CHUNK_MOD
        return self._fill(now)

    def results(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(words uint32 (k, lanes), fp32 flag per chunk, saturated flag per chunk) of the finished batch."""
        if not self.done:
            raise RuntimeError(f"worker {self.rank}: the batch is not complete")
        return self._words, self._fp32, self._saturated

    # -- events ---------------------------------------------------------

    def receive(self, now: float, frame: bytes) -> list[bytes]:
        """Handle one received frame; returns the frames the freed window lets out.

        One frame takes the parser's scalar checks, cheaper than its array ones for a batch of one.
        """
        return self._take(now, *split_results([self.parser.parse(frame)], self.switch.lanes))

    def receive_batch(self, now: float, frames: Sequence[bytes]) -> list[bytes]:
        """Handle frames that arrived together; returns the frames the freed window lets out, then the early resends.

        The results are parsed and placed as arrays. The outcome is :meth:`receive`'s one frame after the
        other, except that the early resends are decided once, after every result is placed: a chunk
        whose result is in the batch is not resent because a later one came first.
        """
        return self._take(now, *self.parser.parse_batch(frames))

    def on_timer(self, now: float) -> list[bytes]:
        """Resend every chunk whose timer expired at ``now``; raises :class:`ChunkTimeoutError` after the last try."""
        lo = self._low
        due = lo + np.flatnonzero(self._due[lo:self._sent] <= now)
        if not due.size:
            return []
        spent = due[self._sends[due] >= self.timing.tries]
        if spent.size:
            i = int(spent[0])
            raise ChunkTimeoutError(self.job.job, self.rank, (self.base + i) % CHUNK_MOD, int(self._sends[i]))
        self.stats["resent"] += due.size
        return self._send(now, due)

    # -- internals ------------------------------------------------------

    def _take(self, now: float, got: ResultBatch, drops: list) -> list[bytes]:
        """Count the refused frames ``drops``, place the results ``got``."""
        self.stats.update(drops)
        self._count("zero_icrc", np.count_nonzero(got.zero_icrc))
        if not got.chunk30.size:
            return []
        return self._place(now, got.chunk30, got.words, got.fp32, got.saturated)

    def _place(self, now: float, chunk30: np.ndarray, words: np.ndarray, fp32: np.ndarray,
               saturated: np.ndarray) -> list[bytes]:
        """Place results (chunk numbers' low 30 bits, lanes, flags: one entry per frame, in arrival order)."""
        i = (chunk30 - self.base) & IMM_CHUNK_MASK
        ok = i < self._sent
        self._count("unexpected", ok.size - np.count_nonzero(ok))
        # The first result of each chunk not held yet is placed; the others are duplicates.
        chunks, first = np.unique(i[ok], return_index=True)
        new = ~self._got[chunks]
        pick = np.flatnonzero(ok)[first[new]]
        i = chunks[new]
        self._count("duplicate", np.count_nonzero(ok) - i.size)
        if not i.size:
            return []
        self._words[i] = words[pick]
        self._fp32[i] = fp32[pick]
        self._saturated[i] = saturated[pick]
        self._got[i] = True
        self._due[i] = math.inf
        self.stats["results"] += i.size
        self._count("fp32_results", np.count_nonzero(fp32[pick]))
        once = self._sends[i] == 1  # Karn's rule: a resent chunk's result may answer any of its sends
        if once.any():
            self._sample(float(now - self._sent_at[i[once]].min()))
        out = []
        if self._got[self._low]:
            # Chunks from _sent on have no result: the search stays within the window.
            rest = np.flatnonzero(~self._got[self._low:self._sent])
            self._low = low = self._low + int(rest[0]) if rest.size else self._sent
            for b in [b for b in self._blocks if (b + 1) * _BLOCK <= low]:
                del self._blocks[b]
            out = self._fill(now)
        return out + self._resend_overtaken(now, int(i[-1]))

    def _sample(self, rtt: float) -> None:
        """Take a round-trip sample; every chunk sent once then times out the new RTO after its send.

        As TCP restarts its one timer with the current RTO on each new ACK (RFC 6298 (5.3)): the
        chunks sent before the first sample, at the first timeout, need not wait it out."""
        self.rtt.sample(rtt)
        lo, hi = self._low, self._sent
        once = lo + np.flatnonzero(~self._got[lo:hi] & (self._sends[lo:hi] == 1))
        self._due[once] = self._sent_at[once] + self.rtt.rto

    def _resend_overtaken(self, now: float, i: int) -> list[bytes]:
        """Resend, once and before its timer, each chunk sent once that chunk ``i``'s result overtook by
        ``timing.early`` places or more: its contribution or result is likely lost (the timer stays the backstop)."""
        last = i - self.timing.early
        if not self.timing.early or last < self._low:
            return []
        lo = self._low
        missing = lo + np.flatnonzero(~self._got[lo:last + 1] & (self._sends[lo:last + 1] == 1))
        self._count("resent", missing.size)
        self._count("resent_early", missing.size)
        return self._send(now, missing)

    def _count(self, what: str, n) -> None:
        """Add ``n`` to ``stats[what]``; a count that stays zero is not listed."""
        if n:
            self.stats[what] += int(n)

    def _fill(self, now: float) -> list[bytes]:
        """Send new chunks up to the window rule: at most ``window`` chunks past the oldest without result."""
        stop = min(self._k, self._low + self.window)
        if stop <= self._sent:
            return []
        start, self._sent = self._sent, stop
        return self._send(now, np.arange(start, stop))

    def _send(self, now: float, i: np.ndarray) -> list[bytes]:
        """Send chunks ``i`` (indices in the batch, ascending) and arm their timers."""
        if not i.size:
            return []
        sends = self._sends[i] = self._sends[i] + 1
        first = sends == 1
        self._sent_at[i[first]] = now
        t = self.timing
        self._due[i] = now + np.minimum(self.rtt.rto * t.backoff ** (sends - 1.0), t.max_timeout)
        self.stats["sent"] += i.size
        return [self._frame(j) for j in i.tolist()]

    def _frame(self, i: int) -> bytes:
        b = i // _BLOCK
        block = self._blocks.get(b)
        if block is None:
            lo, hi = b * _BLOCK, min(self._k, (b + 1) * _BLOCK)
            chunks = (self.base + np.arange(lo, hi, dtype=np.int64)) % CHUNK_MOD
            block = self._blocks[b] = self.template.build(chunks, self._lanes[lo:hi])
        return block[i - b * _BLOCK].tobytes()

    def fork(self) -> "Worker":
        """An independent copy of the protocol state; the frame templates and the batch's lanes are shared.

        The model checker branches with it: far cheaper than ``copy.deepcopy``.
        """
        w = copy.copy(self)
        w.stats = Tally(self.stats)
        w.rtt = copy.copy(self.rtt)
        w._words, w._fp32, w._saturated, w._got = (self._words.copy(), self._fp32.copy(),
                                                   self._saturated.copy(), self._got.copy())
        w._sends, w._sent_at, w._due = self._sends.copy(), self._sent_at.copy(), self._due.copy()
        w._blocks = dict(self._blocks)
        return w

    def fingerprint(self, now: float) -> tuple:
        """A hashable summary of the protocol state, timers relative to ``now``.

        Two workers of the same job and rank with equal fingerprints react the
        same to every future event; the model checker merges such states.
        """
        lo, hi = self._low, self._sent
        return (self.next_chunk, self._k, lo, hi, self._words.tobytes(), self._fp32.tobytes(),
                self._got.tobytes(), self._sends[lo:hi].tobytes(), (self._due[lo:hi] - now).tobytes(),
                # A send time steers only a future round-trip sample: of a chunk sent once, still without result.
                np.where(self._got[lo:hi] | (self._sends[lo:hi] != 1), 0.0, self._sent_at[lo:hi] - now).tobytes(),
                self.rtt.state())


def padded_rows(flat: np.ndarray, lanes: int) -> np.ndarray:
    """int32 values as rows of ``lanes`` (one chunk each), the last row padded with zeros."""
    out = np.zeros(-(-flat.size // lanes) * lanes, np.int32)
    out[:flat.size] = flat
    return out.reshape(-1, lanes)


def chunk_rows(worker, lanes: "np.ndarray | QuantizedChunks") -> "np.ndarray | QuantizedChunks":
    """``lanes`` checked as the next batch of ``worker`` (a :class:`Worker` or an RC worker): int32 rows of the
    switch's lanes, the previous batch complete."""
    if not worker.done:
        raise RuntimeError(f"worker {worker.rank}: the previous batch is not complete")
    if not isinstance(lanes, QuantizedChunks):
        lanes = np.asarray(lanes)
    if lanes.dtype != np.int32 or lanes.ndim != 2 or lanes.shape[1] != worker.switch.lanes:
        raise ValueError(f"lanes must be int32 of shape (k, {worker.switch.lanes}), not {lanes.dtype} {lanes.shape}")
    return lanes


class QuantizedChunks:
    """float32 data quantized at scale ``2**e`` as int32 chunk rows, each block when it is first sliced.

    The first window goes out after quantizing its own rows, not the whole
    tensor, so workers that agree on the scale at different moments start
    sending together instead of one waiting for the slowest to quantize.
    """

    dtype = np.dtype(np.int32)
    ndim = 2

    def __init__(self, data: np.ndarray, exponent: int, lanes: int):
        self._data, self._e, self._lanes = data, exponent, lanes
        self.shape = (-(-data.size // lanes), lanes)

    def __getitem__(self, rows: slice) -> np.ndarray:
        lo, hi, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("QuantizedChunks takes contiguous row slices")
        flat = np.zeros((hi - lo) * self._lanes, np.float32)
        part = self._data[lo * self._lanes:hi * self._lanes]
        flat[:part.size] = part  # the last chunk is padded with zeros
        return quant.quantize(flat, self._e).reshape(hi - lo, self._lanes)


# The agreed scale keeps an honest job strictly inside INT32 (docs/protocol.md
# 2.1), so a SATURATED result (section 8) means a contribution broke the bound
# the ranks agreed on. Each resend of the operation halves the scale; a chunk
# still saturated at 2**-MAX_RESCALES of it is a rank or a switch that
# disagrees with the agreement, which an error names better than more resends.
# (An agreed scale is at least 2**-104 for float32 data and 64 workers, so the
# halvings stay far above quant.EXP_MIN.)
MAX_RESCALES = 8

# Agreement round (docs/protocol.md section 2.1): lanes 0..255 are the
# exponent histogram, lanes 256 + 2*b + bit for the 64 bits of the element
# count check that every rank passed the same length.
AGREE_EXP_LANES = 256
AGREE_LEN_BITS = 64
# Lane i counts the ranks whose largest finite magnitude has biased exponent i; no finite float32 has
# 255, IEEE's exponent of infinity and NaN, so its lane counts the ranks holding a non-finite value.
AGREE_NONFINITE_LANE = AGREE_EXP_LANES - 1
# The non-finite round's lane per element: NaN, +inf and -inf counted in bytes 0, 1, 2 (MAX_WORKERS < 256).
NONFINITE_NAN, NONFINITE_POSINF, NONFINITE_NEGINF = 1, 1 << 8, 1 << 16


def _nonfinite_codes(data: np.ndarray) -> np.ndarray | None:
    """Each element's lane of the non-finite round, or None when every element is finite."""
    if np.isfinite(data).all():
        return None
    return np.select([np.isnan(data), data == np.inf, data == -np.inf],
                     [NONFINITE_NAN, NONFINITE_POSINF, NONFINITE_NEGINF], 0).astype(np.int32)


def _with_nonfinite(total: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``total`` with the IEEE sum of the ranks' non-finite values where the summed ``codes`` name any.

    NaN anywhere, or +inf and -inf together, give NaN; otherwise the infinity wins over every finite term.
    """
    nan = (codes & 0xFF) > 0
    pos, neg = ((codes >> 8) & 0xFF) > 0, (codes >> 16) > 0
    return np.select([nan | (pos & neg), pos, neg], [np.float32(np.nan), np.float32(np.inf), np.float32(-np.inf)],
                     total).astype(np.float32)


def agreement_chunks(lanes: int) -> int:
    """Chunks the agreement round takes for chunks of ``lanes`` lanes."""
    return -(-(AGREE_EXP_LANES + 2 * AGREE_LEN_BITS) // lanes)


class AllReduce:
    """One all-reduce (sum) of a float32 vector through the switch (sans-IO).

    Drives a :class:`Worker` through two batches: the agreement round, then
    the quantized data. :attr:`done` is True when :meth:`result` holds the
    float32 sum of every rank's vector.

    A data batch with a SATURATED result (a P4 switch, which cannot promote
    an overflowed lane to FP32: ``docs/protocol.md`` section 8) is sent again
    whole, on the next chunk sequences, at half the scale: every rank sees the
    same results, so every rank takes the same decision without another
    round. :attr:`rescales` counts these resends, ``worker.stats["rescaled"]``
    too, and :attr:`exponent` is the scale of the sum finally returned.

    Data holding NaN or infinity is refused (``ValueError``) unless
    ``propagate_nonfinite``: then the agreement round says that a rank holds
    such values, the data batch carries zeros in their places, and a third
    batch counts NaN, +inf and -inf per element over the ranks, so every rank
    gets the IEEE sum there, as a float32 sum in any order would give
    (``docs/protocol.md`` section 2.1). :attr:`nonfinite` tells whether the
    round ran.
    """

    dtype = np.dtype(np.float32)

    def __init__(self, worker: Worker, data: np.ndarray, *, propagate_nonfinite: bool = False):
        data = np.asarray(data)
        if data.dtype != self.dtype:
            raise TypeError(f"allreduce takes a {self.dtype} array, not {data.dtype}")
        if data.ndim != 1:
            raise ValueError(f"allreduce takes a 1-D array, not shape {data.shape}")
        self._codes = _nonfinite_codes(data) if data.dtype.kind == "f" else None
        if self._codes is not None:
            if not propagate_nonfinite:
                bad = int(np.flatnonzero(self._codes)[0])
                raise ValueError(f"data holds NaN or infinity (first at index {bad}); refusing to send it")
            data = np.where(self._codes != 0, np.float32(0), data)
        self.worker = worker
        self.data = data
        self.nonfinite = False
        self.exponent: int | None = None
        self.rescales = 0
        self._phase = "idle"
        self._result: np.ndarray | None = None

    @property
    def done(self) -> bool:
        return self._phase == "done"

    @property
    def deadline(self) -> float | None:
        return None if self.done else self.worker.deadline

    def start(self, now: float) -> list[bytes]:
        """Send the agreement round."""
        if self._phase != "idle":
            raise RuntimeError("this all-reduce has started already")
        self._phase = "agree"
        return self.worker.submit(now, self._agreement_lanes())

    def receive(self, now: float, frame: bytes) -> list[bytes]:
        return self._advance(now, self.worker.receive(now, frame))

    def receive_batch(self, now: float, frames: Sequence[bytes]) -> list[bytes]:
        """Frames that arrived together (:meth:`Worker.receive_batch`)."""
        return self._advance(now, self.worker.receive_batch(now, frames))

    def on_timer(self, now: float) -> list[bytes]:
        return self._advance(now, self.worker.on_timer(now))

    def result(self) -> np.ndarray:
        """The float32 sum over the ranks."""
        if self._result is None:
            raise RuntimeError("the all-reduce is not complete")
        return self._result

    def error_bound(self) -> float:
        """Bound on the error of the sum against the exact sum, before its rounding to float32 (quant.error_bound)."""
        if self.exponent is None:
            raise RuntimeError("the scale is not agreed yet")
        return quant.error_bound(self.exponent, self.worker.job.ranks)

    def _agreement_lanes(self) -> np.ndarray:
        lanes = self.worker.switch.lanes
        flat = np.zeros(agreement_chunks(lanes) * lanes, np.int32)
        amax = float(np.max(np.abs(self.data))) if self.data.size else 0.0
        if amax > 0:
            # frexp gives amax = m * 2**x with 0.5 <= m < 1 exactly, so floor(log2(amax)) = x - 1.
            flat[min(max(math.frexp(amax)[1] - 1 + 127, 0), AGREE_NONFINITE_LANE - 1)] = 1
        if self._codes is not None:
            flat[AGREE_NONFINITE_LANE] = 1
        n = self.data.size
        bits = ((np.uint64(n) >> np.arange(AGREE_LEN_BITS, dtype=np.uint64)) & np.uint64(1)).astype(np.int64)
        flat[AGREE_EXP_LANES + 2 * np.arange(AGREE_LEN_BITS) + bits] = 1
        return flat.reshape(-1, lanes)

    def _advance(self, now: float, out: list[bytes]) -> list[bytes]:
        w = self.worker
        if not w.done or self._phase in ("idle", "done"):
            return out
        words, fp32, saturated = w.results()
        if saturated.any():
            chunk = (w.base + int(np.flatnonzero(saturated)[0])) % CHUNK_MOD
            if self._phase in ("agree", "nonfinite"):
                what = "agreement" if self._phase == "agree" else "non-finite"
                raise SaturatedResultError(f"job {w.job.job} worker {w.rank}: the switch saturated chunk {chunk} "
                                           f"of the {what} round, whose lanes count workers")
            if self.rescales == MAX_RESCALES:
                raise SaturatedResultError(f"job {w.job.job} worker {w.rank}: the switch saturated chunk {chunk} "
                                           f"at scale 2**{self.exponent}, after {self.rescales} resends at smaller "
                                           "scales: ranks or switch disagree with the agreed scale")
            self.rescales += 1
            w.stats["rescaled"] += 1
            self.exponent -= 1
            return out + w.submit(now, self._data_lanes())
        if self._phase == "agree":
            return out + self._agreed(now, words, fp32)
        if self._phase == "nonfinite":
            self._result = _with_nonfinite(self._result, words.view(np.int32).ravel()[:self.data.size])
            self._phase = "done"
            return out
        self._result = self._dequantize(words, fp32)
        if self.nonfinite:
            self._phase = "nonfinite"
            codes = np.zeros(words.size, np.int32)
            if self._codes is not None:
                codes[:self.data.size] = self._codes
            return out + w.submit(now, codes.reshape(words.shape))
        self._phase = "done"
        return out

    def _agreed(self, now: float, words: np.ndarray, fp32: np.ndarray) -> list[bytes]:
        w = self.worker
        n_workers = w.job.ranks
        counts = np.where(fp32[:, None], words.view(np.float32), words.view(np.int32)).astype(np.int64).ravel()
        pairs = counts[AGREE_EXP_LANES:AGREE_EXP_LANES + 2 * AGREE_LEN_BITS].reshape(AGREE_LEN_BITS, 2)
        if (pairs.sum(axis=1) != n_workers).any():
            raise ProtocolError(f"job {w.job.job} worker {w.rank}: the agreement round does not add up to "
                                f"{n_workers} workers: {pairs.sum(axis=1).tolist()}")
        if (pairs > 0).all(axis=1).any():
            bit = int(np.flatnonzero((pairs > 0).all(axis=1))[0])
            raise LengthMismatchError(f"job {w.job.job} worker {w.rank}: the ranks passed arrays of different "
                                      f"lengths (this rank {self.data.size} elements; they differ in bit {bit})")
        hist = np.flatnonzero(counts[:AGREE_NONFINITE_LANE])
        self.nonfinite = bool(counts[AGREE_NONFINITE_LANE])
        # The highest exponent lane i bounds every rank's data: amax < 2**(i - 126).
        self.exponent = quant.choose_exponent(2.0 ** (int(hist[-1]) - 126), n_workers) if hist.size else 0
        self._phase = "data"
        out = w.submit(now, self._data_lanes())
        if w.done:  # an empty vector has no data chunks
            self._result = np.zeros(0, np.float32)
            self._phase = "done"
        return out

    def _data_lanes(self) -> "QuantizedChunks | np.ndarray":
        """The data batch at the current exponent."""
        return QuantizedChunks(self.data, self.exponent, self.worker.switch.lanes)

    def _dequantize(self, words: np.ndarray, fp32: np.ndarray) -> np.ndarray:
        e = self.exponent
        if not fp32.any():  # the usual batch, all INT32: one pass, no masked copies of the sums
            return quant.dequantize(words.view(np.int32), e).ravel()[:self.data.size]
        out = np.empty(words.shape, np.float32)
        out[~fp32] = quant.dequantize(words[~fp32].view(np.int32), e)
        out[fp32] = quant.dequantize(words[fp32].view(np.float32), e)
        return out.ravel()[:self.data.size]

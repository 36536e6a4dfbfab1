"""Endpoint all-reduce family: ring, recursive doubling, Rabenseifner, Swing, Trivance (and their
reduce-scatter / all-gather halves).

Every generator returns a :class:`~inagg.host.schedules.ir.Schedule`; none of
them executes anything. The patterns (who talks to whom in step s) are
computed for all ranks at once with numpy; the bandwidth-optimal block
routing comes from :func:`~inagg.host.schedules.common.pattern_trees`
(concrete) or :func:`~inagg.host.schedules.common.tree_traffic` (abstract:
counts from one tree per residue class of the pattern's symmetry).

Chunk layout of the bandwidth-optimal schedules: block r (rank r's shard)
is ``channels * chunks_per_block`` consecutive chunks, and channel c owns
``chunks_per_block`` of them, so a reduce-scatter leaves rank r's result
contiguous whatever the number of channels.
"""

from __future__ import annotations

import math

import numpy as np

from inagg.host.schedules import common
from inagg.host.schedules.common import Blocks, FoldPlan, Pattern, check_ranks
from inagg.host.schedules.ir import Buffer, Collective, Row, Schedule, ScheduleBuilder

__all__ = [
    "ring",
    "ring_round",
    "recursive_doubling",
    "rabenseifner",
    "swing_latency",
    "swing_bandwidth",
    "trivance_latency",
    "trivance_bandwidth",
    "swing_rho",
    "swing_peer",
]

_HALVES = (Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER)


def _collective(collective, allowed, algo: str) -> Collective:
    coll = Collective.parse(collective)
    if coll not in allowed:
        raise ValueError(f"{algo} does not implement {coll.value}; it implements "
                         f"{', '.join(c.value for c in allowed)}")
    return coll


def _positive(value, label: str, algo: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{algo}: {label} must be an integer, not {value!r}")
    if value < 1:
        raise ValueError(f"{algo}: {label} must be at least 1, not {value}")
    return int(value)


def _dims(nranks: int, dims, algo: str) -> tuple[int, ...]:
    if dims is None:
        return (nranks,)
    dims = tuple(int(d) for d in dims)
    if not dims or any(d < 1 for d in dims):
        raise ValueError(f"{algo}: torus dimensions must be positive, not {dims}")
    if math.prod(dims) != nranks:
        raise ValueError(f"{algo}: a {'x'.join(map(str, dims))} torus has {math.prod(dims)} ranks, not {nranks}")
    return dims


# ----------------------------------------------------------------------- ring
def _ring_setup(nranks, collective, channels, chunks_per_block, algo="ring"):
    n = check_ranks(nranks, algo)
    coll = _collective(collective, _HALVES, algo)
    ch = _positive(channels, "channels", algo)
    if ch > 2:
        raise ValueError(f"{algo}: channels must be 1 or 2 (one per ring direction), not {ch}")
    return n, coll, ch, _positive(chunks_per_block, "chunks_per_block", algo)


def _ring_next(r: np.ndarray, n: int, c: int) -> np.ndarray:
    """Where channel c sends: clockwise for channel 0, counter-clockwise for channel 1."""
    return (r + (1 if c == 0 else -1)) % n


def ring(nranks: int, *, collective=Collective.ALLREDUCE, channels: int = 2, chunks_per_block: int = 1,
         abstract: bool = False) -> Schedule:
    """The ring algorithm: reduce-scatter then all-gather, each ``n-1`` steps.

    With ``channels=2`` (the default) half of every block goes clockwise and
    half counter-clockwise, so both directions of a bidirectional ring carry
    data, as NCCL does with its rings.
    """
    n, coll, ch, k = _ring_setup(nranks, collective, channels, chunks_per_block)
    K = ch * k
    b = ScheduleBuilder("ring", coll, n, abstract=abstract)
    r = np.arange(n)
    lane = np.arange(k)

    def chunks(blocks: np.ndarray, c: int) -> np.ndarray:
        return (blocks[:, None] * K + c * k + lane[None, :]).astype(np.int64)

    if n > 1:
        for c in range(ch):
            sign = 1 if c == 0 else -1
            nxt = _ring_next(r, n, c)
            step = 0
            if coll in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER):
                for s in range(n - 1):
                    blk = (r - sign * (s + 1)) % n
                    b.transfer(step, r, nxt, k if abstract else chunks(blk, c), reduce=True, channel=c)
                    step += 1
            if coll in (Collective.ALLREDUCE, Collective.ALLGATHER):
                for s in range(n - 1):
                    blk = (r - sign * s) % n
                    b.transfer(step, r, nxt, k if abstract else chunks(blk, c), channel=c)
                    step += 1
    size = n * K
    return b.build(size_chunks=size, in_chunks=0, out_chunks=size)


def ring_round(nranks: int, *, collective=Collective.ALLREDUCE, channels: int = 2,
               chunks_per_block: int = 1) -> tuple[Schedule, int]:
    """The ring in closed form: ``(one round, how many rounds)``.

    Every step of :func:`ring` moves ``chunks_per_block`` chunks from each
    rank to its neighbour on every channel; only which block it is changes,
    and an abstract schedule does not say. So the ring is this one-step
    abstract schedule run ``rounds`` times in a row (2(n-1) for an
    all-reduce), which :func:`~inagg.host.schedules.cost.evaluate` costs
    with ``repeat=rounds`` without building its ``2 n (n-1)`` rows.
    """
    n, coll, ch, k = _ring_setup(nranks, collective, channels, chunks_per_block)
    b = ScheduleBuilder("ring", coll, n, abstract=True)
    r = np.arange(n)
    if n > 1:
        for c in range(ch):
            b.add_rows(Row.TRANSFER, 0, r, _ring_next(r, n, c), k, channel=c)
    rounds = (n - 1) * (2 if coll is Collective.ALLREDUCE else 1)
    return b.build(size_chunks=n * ch * k, in_chunks=0, out_chunks=n * ch * k), rounds


# ------------------------------------------------------------------- patterns
def swing_rho(s: int) -> int:
    """rho(s) = sum_{i=0..s} (-2)^i, the signed distance of Swing's step s."""
    return (1 - (-2) ** (s + 1)) // 3


def swing_peer(r: np.ndarray | int, s: int, p: int) -> np.ndarray | int:
    """Swing's peer pi(r, s): r + rho(s) for even r, r - rho(s) for odd r (mod p)."""
    r = np.asarray(r)
    out = np.where(r % 2 == 0, r + swing_rho(s), r - swing_rho(s)) % p
    return int(out) if out.ndim == 0 else out


def _torus_pattern(dims: tuple[int, ...], steps_per_dim: list[int], start: int, move, period=None,
                   shape=None) -> Pattern:
    """A pattern that works on one torus dimension per step; ``move(coord, k) -> new coords``.

    ``period`` (and ``shape``, default ``dims``) declare its translation symmetry (:class:`Pattern`).
    """
    coords = common.torus_coords(dims)
    send_to, used = [], []
    for d, k in common.dimension_sequence(dims, steps_per_dim, start):
        new = coords.copy()
        moved = move(coords[:, d], k, dims[d])
        peers = []
        for m in (moved if isinstance(moved, tuple) else (moved,)):
            new[:, d] = m
            idx = common.torus_index(new, dims)
            idx[m < 0] = -1
            peers.append(idx)
        arr = np.stack(peers, axis=1)
        # a peer equal to the node itself, or the same peer twice, carries nothing
        self_ = arr == np.arange(len(coords))[:, None]
        arr[self_] = -1
        if arr.shape[1] == 2:
            arr[arr[:, 1] == arr[:, 0], 1] = -1
        send_to.append(arr)
        used.append(d)
    return Pattern(len(coords), send_to, used, shape=shape or dims, period=period)


def _swing_move(mirrored: bool):
    def move(c, k, size):
        sign = np.where(c % 2 == 0, 1, -1) * (-1 if mirrored else 1)
        return (c + sign * swing_rho(k)) % size
    return move


def _xor_move(c, k, size):
    return c ^ (1 << k)


def _trivance_move(c, k, size):
    return (c + 3 ** k) % size, (c - 3 ** k) % size


# --------------------------------------------------------------- latency-opt
def _latency(algo: str, n: int, pattern_for, base: int, *, chunks: int, abstract: bool,
             dims: tuple[int, ...]) -> Schedule:
    """Whole-vector exchanges on a pattern over a power-of-``base`` set of ranks; other sizes fold."""
    b = ScheduleBuilder(algo, Collective.ALLREDUCE, n, abstract=abstract)
    vec = np.arange(chunks, dtype=np.int64)
    if len(dims) > 1:
        bad = [d for d in dims if not common.is_power(d, base)]
        if bad:
            raise ValueError(f"{algo}: on a torus every dimension must be a power of {base}, not {'x'.join(map(str, dims))}")
        plan = FoldPlan(np.arange(n), np.empty(0, np.int64), np.empty(0, np.int64))
        pat = pattern_for(dims)
    else:
        m = base ** common.ilog(n, base)
        plan = common.fold_plan(n, m)
        pat = pattern_for((m,))
    step = 0
    if not plan.trivial:
        common.emit_fold_in(b, plan, vec, step)
        step += 1
    step = common.emit_full_exchange(b, pat, vec, plan.active, step)
    if not plan.trivial:
        common.emit_fold_out(b, plan, vec, step)
    return b.build(size_chunks=chunks, in_chunks=0, out_chunks=chunks, meta={"dims": dims, "folded": len(plan.extras)})


def recursive_doubling(nranks: int, *, chunks: int = 1, abstract: bool = False, dims=None) -> Schedule:
    """Recursive doubling all-reduce: log2(n) steps exchanging the whole vector with r XOR 2^s.

    Non-powers of two fold the extra ranks into neighbours (two more steps).
    """
    algo = "rd"
    n = check_ranks(nranks, algo)
    dims = _dims(n, dims, algo)
    c = _positive(chunks, "chunks", algo)

    def pattern(ds):
        return _torus_pattern(ds, [common.ilog(d, 2) for d in ds], 0, _xor_move)

    return _latency(algo, n, pattern, 2, chunks=c, abstract=abstract, dims=dims)


def swing_latency(nranks: int, *, chunks: int = 1, abstract: bool = False, dims=None) -> Schedule:
    """Latency-optimal Swing: log2(n) whole-vector steps with peer pi(r, s) (on a torus: step s on
    dimension s mod D). Non-powers of two fold into neighbours (two more steps)."""
    algo = "swing-lat"
    n = check_ranks(nranks, algo)
    dims = _dims(n, dims, algo)
    c = _positive(chunks, "chunks", algo)

    def pattern(ds):
        return _torus_pattern(ds, [common.ilog(d, 2) for d in ds], 0, _swing_move(False))

    return _latency(algo, n, pattern, 2, chunks=c, abstract=abstract, dims=dims)


# ------------------------------------------------------------ bandwidth-opt
def _bandwidth(algo: str, coll: Collective, n: int, patterns: list[Pattern], plan: FoldPlan, k: int,
               abstract: bool, meta: dict) -> Schedule:
    """Tree reduce-scatter and/or all-gather on every channel's pattern, with optional folding."""
    ch = len(patterns)
    K = ch * k
    size = n * K
    b = ScheduleBuilder(algo, coll, n, abstract=abstract)
    # virtual node v owns the blocks of its active rank and of the extras folded into it
    owners = [[int(a)] for a in plan.active]
    where = {int(a): v for v, a in enumerate(plan.active)}
    for e, a in zip(plan.extras, plan.partner):
        owners[where[int(a)]].append(int(e))
    lane = np.arange(k)

    def block_chunks(ranks, c):
        return np.concatenate([r * K + c * k + lane for r in ranks])

    if abstract:
        # counts only: one tree per residue class of the pattern's symmetry instead of one per node
        sizes = k * np.array([len(o) for o in owners], dtype=np.int64)
        traffic = [common.tree_traffic(pat, sizes) for pat in patterns]
    else:
        trees = []
        for c, pat in enumerate(patterns):
            parent, stp, covered = common.pattern_trees(pat)
            if not covered:
                raise ValueError(f"{algo}: the pattern does not reach every rank in {pat.nsteps} steps "
                                 f"for {pat.m} ranks")
            trees.append((parent, stp, Blocks.from_lists([block_chunks(o, c) for o in owners])))
    whole = np.arange(size, dtype=np.int64)
    ranks = plan.active
    step = 0
    if not plan.trivial:
        if coll is Collective.ALLGATHER:
            own = np.stack([e * K + np.arange(K) for e in plan.extras])
            common.emit_fold_in(b, plan, own, step, reduce=False)
        else:
            common.emit_fold_in(b, plan, whole, step)
        step += 1
    nsteps = max(p.nsteps for p in patterns)
    if coll in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER):
        for c, pat in enumerate(patterns):
            if abstract:
                for s, per_slot in enumerate(traffic[c]):
                    for ys, xs, counts in per_slot:
                        b.add_rows(Row.TRANSFER_REDUCE, step + s, ranks[ys], ranks[xs], counts, channel=c)
            else:
                common.emit_tree_reduce_scatter(b, pat, *trees[c], ranks, step, c)
        step += nsteps
    if coll in (Collective.ALLREDUCE, Collective.ALLGATHER):
        for c, pat in enumerate(patterns):
            if abstract:
                last = pat.nsteps - 1
                for s, per_slot in reversed(list(enumerate(traffic[c]))):
                    for ys, xs, counts in per_slot:
                        b.add_rows(Row.TRANSFER, step + last - s, ranks[xs], ranks[ys], counts, channel=c)
            else:
                common.emit_tree_allgather(b, pat, *trees[c], ranks, step, c)
        step += nsteps
    if not plan.trivial:
        if coll is Collective.REDUCE_SCATTER:
            own = np.stack([e * K + np.arange(K) for e in plan.extras])
            common.emit_fold_out(b, plan, own, step)
        else:
            common.emit_fold_out(b, plan, whole, step)
    meta = dict(meta, folded=len(plan.extras), channels=ch)
    return b.build(size_chunks=size, in_chunks=0, out_chunks=size, meta=meta)


def rabenseifner(nranks: int, *, collective=Collective.ALLREDUCE, dims=None, chunks_per_block: int = 1,
                 abstract: bool = False) -> Schedule:
    """Rabenseifner's all-reduce: recursive-halving reduce-scatter then recursive-doubling all-gather.

    The reduce-scatter sends half the vector to r XOR 1 first, a quarter to
    r XOR 2, ... (the order that keeps the big messages on the short hops).
    On a torus (``dims``) it is the torus-tuned variant: step s works on
    dimension s mod D at distance 2^floor(s/D), with D channels that start on
    different dimensions so every dimension is busy in every step. Needs
    power-of-two dimensions; a 1-D ring of any other size folds the extra
    ranks into neighbours (two more steps).
    """
    algo = "rabenseifner"
    n = check_ranks(nranks, algo)
    coll = _collective(collective, _HALVES, algo)
    dims = _dims(n, dims, algo)
    k = _positive(chunks_per_block, "chunks_per_block", algo)
    if len(dims) > 1:
        if not all(common.is_power(d, 2) for d in dims):
            raise ValueError(f"{algo}: the torus variant needs power-of-two dimensions, not {'x'.join(map(str, dims))}")
        plan = FoldPlan(np.arange(n), np.empty(0, np.int64), np.empty(0, np.int64))
        vd = dims
    else:
        m = 2 ** common.ilog(n, 2)
        plan = common.fold_plan(n, m)
        vd = (m,)
    steps = [common.ilog(d, 2) for d in vd]
    # XOR with a fixed mask commutes with the pattern: the group is one Z_2 per bit of the index
    bits = (2,) * sum(steps)
    patterns = [_torus_pattern(vd, steps, c, _xor_move, (1,) * len(bits), bits) if bits else
                _torus_pattern(vd, steps, c, _xor_move) for c in range(len(vd))]
    return _bandwidth(algo, coll, n, patterns, plan, k, abstract, {"dims": dims})


def swing_bandwidth(nranks: int, *, collective=Collective.ALLREDUCE, dims=None, chunks_per_block: int = 1,
                    abstract: bool = False) -> Schedule:
    """Bandwidth-optimal Swing (reduce-scatter + all-gather along Swing's peers).

    Runs 2D collectives on 1/(2D) of the data each: D plain ones starting on
    dimensions 0..D-1 and D mirrored ones (even ranks go the other way), so
    all 2D ports of a torus node are busy in every step. Any even ring size
    (and any torus with even dimensions) works directly; an odd ring folds
    one rank into its neighbour.
    """
    algo = "swing-bw"
    n = check_ranks(nranks, algo)
    coll = _collective(collective, _HALVES, algo)
    dims = _dims(n, dims, algo)
    k = _positive(chunks_per_block, "chunks_per_block", algo)
    if len(dims) > 1:
        odd = [d for d in dims if d % 2 and d > 1]
        if odd:
            raise ValueError(f"{algo}: torus dimensions must be even, not {'x'.join(map(str, dims))}")
        plan = FoldPlan(np.arange(n), np.empty(0, np.int64), np.empty(0, np.int64))
        vd = dims
    else:
        m = n if n % 2 == 0 or n == 1 else n - 1
        plan = common.fold_plan(n, m)
        vd = (m,)
    steps = [common.clog(d, 2) for d in vd]
    # even ranks go one way and odd ranks the other, so moving by 2 along a dimension commutes with it
    period = tuple(2 if d % 2 == 0 else 1 for d in vd)
    patterns = [_torus_pattern(vd, steps, c, _swing_move(mir), period) for mir in (False, True)
                for c in range(len(vd))]
    return _bandwidth(algo, coll, n, patterns, plan, k, abstract, {"dims": dims})


def trivance_bandwidth(nranks: int, *, collective=Collective.ALLREDUCE, dims=None, chunks_per_block: int = 1,
                       abstract: bool = False) -> Schedule:
    """Bandwidth-optimal Trivance: in step k every rank exchanges with r + 3^k and r - 3^k at once and
    reduces both incoming messages jointly; 2 ceil(log3 n) steps for any n (no folding needed: the
    trees drop the routes that would reach a rank twice). On a torus step s works on one dimension."""
    algo = "trivance-bw"
    n = check_ranks(nranks, algo)
    coll = _collective(collective, _HALVES, algo)
    dims = _dims(n, dims, algo)
    k = _positive(chunks_per_block, "chunks_per_block", algo)
    plan = FoldPlan(np.arange(n), np.empty(0, np.int64), np.empty(0, np.int64))
    steps = [common.clog(d, 3) for d in dims]
    patterns = [_torus_pattern(dims, steps, c, _trivance_move, (1,) * len(dims)) for c in range(len(dims))]
    return _bandwidth(algo, coll, n, patterns, plan, k, abstract, {"dims": dims})


# -------------------------------------------------------- Trivance latency
def _trivance_interval_plan(n: int) -> list[tuple[tuple[int, int], tuple[int, int]]] | None:
    """Runs of pieces that grow every rank's interval to exactly n ranks in ceil(log3 n) steps.

    A rank's partial sum covers a contiguous interval of ranks, kept as
    *pieces* (its own value and every aggregate it received, left to right).
    In a step it receives from each side one message: the sum of a run of
    the sender's pieces that starts right next to its interval. The first
    ceil(log3 n) - 2 steps are the plain tripling steps (peers +/-3^k, the
    sender's whole interval); the last two pick runs so that the total is
    exactly n. Returns per step ``((left run), (right run))`` as
    ``(first piece, last piece)`` in the sender's piece list (``None`` for
    no message), or ``None`` if no such pair of steps exists.
    """
    K = common.clog(n, 3)

    def runs(seq):
        out = {}
        for i in range(len(seq)):
            t = 0
            for j in range(i, len(seq)):
                t += seq[j]
                out.setdefault(t, (i, j))
        return out

    seq = [1]
    plan = []
    for _ in range(max(K - 2, 0)):
        plan.append(((0, len(seq) - 1), (0, len(seq) - 1)))
        w = sum(seq)
        seq = [w] + seq + [w]
    if K <= 1:
        # n <= 3: one step, from each side at most one rank
        need = n - 1
        if need == 0:
            return []
        return [((0, 0) if need == 2 else None, (0, 0))]
    first = runs(seq)
    first[0] = None
    w = sum(seq)
    for a in sorted(first):
        for c in sorted(first):
            if a > c or w + a + c > n:
                continue
            seq2 = ([a] if a else []) + seq + ([c] if c else [])
            second = runs(seq2)
            second[0] = None
            need = n - w - a - c
            for x in sorted(second):
                if need - x in second:
                    return plan + [(first[a], first[c]), (second[x], second[need - x])]
    return None


def trivance_latency(nranks: int, *, chunks: int = 1, abstract: bool = False, dims=None) -> Schedule:
    """Latency-optimal Trivance: every step each rank sends its partial sum to r + 3^k and r - 3^k and
    adds both incoming messages (joint reduction): log3(n) steps for powers of three.

    Other n: where :func:`_trivance_interval_plan` finds one, ceil(log3 n)
    steps in which the last two exchange sums of runs of received pieces
    (kept in scratch); otherwise (e.g. n = 25, 26) the extra ranks fold into
    neighbours (ceil(log3 n) + 1 steps), as the Trivance paper notes for
    non-power-of-three sizes. On a torus every dimension must be a power of 3.
    """
    algo = "trivance-lat"
    n = check_ranks(nranks, algo)
    dims = _dims(n, dims, algo)
    c = _positive(chunks, "chunks", algo)

    def pattern(ds):
        return _torus_pattern(ds, [common.ilog(d, 3) for d in ds], 0, _trivance_move)

    if len(dims) > 1 or common.is_power(n, 3):
        return _latency(algo, n, pattern, 3, chunks=c, abstract=abstract, dims=dims)
    plan = _trivance_interval_plan(n)
    if plan is None:
        return _latency(algo, n, pattern, 3, chunks=c, abstract=abstract, dims=dims)
    return _trivance_pieces(n, plan, c, abstract)


def _trivance_pieces(n: int, plan, chunks: int, abstract: bool) -> Schedule:
    """Build the piece-run schedule of :func:`_trivance_interval_plan` (circulant: every rank the same).

    Scratch slot j (``chunks`` chunks) holds piece j of a rank's piece list;
    the list grows by one piece at each end per step. Before sending a run
    of several pieces the sender adds them up in a send slot; at the end the
    rank adds all its pieces into OUTPUT.
    """
    algo = "trivance-lat"
    b = ScheduleBuilder(algo, Collective.ALLREDUCE, n, abstract=abstract)
    r = np.arange(n)
    vec = np.arange(chunks, dtype=np.int64)
    nsteps = len(plan)
    npieces = 1 + 2 * nsteps
    slot_left, slot_right = npieces, npieces + 1  # scratch used to sum a run before sending it

    def slot(j):
        return j * chunks + vec

    # pieces: list of (slot id, width, offset of first rank relative to the owner)
    pieces = [(0, 1, 0)]
    b.copy(0, r, np.tile(vec, (n, 1)), np.tile(slot(0), (n, 1)), src_buf=Buffer.OUTPUT, dst_buf=Buffer.SCRATCH)
    step = 1
    next_slot = 1
    for left_run, right_run in plan:
        lo = pieces[0][2]                       # receiver's interval is [r+lo, r+hi]
        hi = pieces[-1][2] + pieces[-1][1] - 1
        new_left = new_right = None
        for side, run in (("L", left_run), ("R", right_run)):
            if run is None:
                continue
            i, j = run
            width = sum(p[1] for p in pieces[i:j + 1])
            start = pieces[i][2]                 # run covers [sender+start, sender+start+width-1]
            # the right message must start at r+hi+1, the left one end at r+lo-1
            dist = (hi + 1 - start) if side == "R" else (lo - width - start)
            sender = (r + dist) % n
            tmp = slot_right if side == "R" else slot_left
            if i == j:
                src = slot(pieces[i][0])
            else:
                # sum the run into the send slot (copy, then local reduces) one step earlier
                b.copy(step - 1, r, np.tile(slot(pieces[i][0]), (n, 1)), np.tile(slot(tmp), (n, 1)),
                       src_buf=Buffer.SCRATCH, dst_buf=Buffer.SCRATCH)
                for q in range(i + 1, j + 1):
                    b.reduce(step - 1, r, np.tile(slot(pieces[q][0]), (n, 1)), np.tile(slot(tmp), (n, 1)),
                             src_buf=Buffer.SCRATCH, dst_buf=Buffer.SCRATCH)
                src = slot(tmp)
            dst_slot = next_slot
            next_slot += 1
            b.transfer(step, sender, r, np.tile(src, (n, 1)), np.tile(slot(dst_slot), (n, 1)),
                       src_buf=Buffer.SCRATCH, dst_buf=Buffer.SCRATCH)
            if side == "R":
                new_right = (dst_slot, width, hi + 1)
            else:
                new_left = (dst_slot, width, lo - width)
        pieces = ([new_left] if new_left else []) + pieces + ([new_right] if new_right else [])
        step += 1
    # OUTPUT already holds piece 0 (the rank's own input); add the others
    for sl, _, _ in pieces:
        if sl == 0:
            continue
        b.reduce(step, r, np.tile(slot(sl), (n, 1)), np.tile(vec, (n, 1)), src_buf=Buffer.SCRATCH,
                 dst_buf=Buffer.OUTPUT)
    return b.build(size_chunks=chunks, in_chunks=0, out_chunks=chunks, scratch_chunks=(npieces + 2) * chunks,
                   meta={"dims": (n,), "folded": 0, "pieces": True})

"""Building blocks shared by the generators.

Most all-reduce algorithms of the literature are one *peer pattern* (who
talks to whom in step s) turned into a schedule in one of two ways:

* **latency-optimal**: in every step each node sends its whole current
  vector to its peers and adds what it receives. Correct when the sets of
  ranks that reach a node through different steps are disjoint, i.e. for the
  power-of-two (recursive doubling, Swing) or power-of-three (Trivance) sizes.
* **bandwidth-optimal**: a reduce-scatter in which block d travels, for every
  d, along a spanning tree of the pattern rooted at rank d, followed by the
  mirror-image all-gather. :func:`pattern_trees` finds those trees by a
  reverse breadth-first search (last step first), so a node forwards block d
  only after it has received all of its subtree's contributions; where two
  routes would reach the same rank (non-power sizes) only the first is kept,
  which is what makes the construction correct for any size the pattern
  covers. Every rank sends each foreign block exactly once: ``(p-1)/p`` of the
  vector per phase, the bandwidth lower bound.

Sizes a pattern does not cover are handled by :func:`fold_plan`: the extra
ranks first hand their data to an active neighbour and get the result back at
the end (two more steps), as MPICH does for non-power-of-two recursive
halving.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from inagg.host.schedules.ir import Buffer, Row, ScheduleBuilder

__all__ = [
    "Pattern",
    "ilog",
    "is_power",
    "check_ranks",
    "check_int",
    "pattern_trees",
    "tree_traffic",
    "Blocks",
    "emit_tree_reduce_scatter",
    "emit_tree_allgather",
    "emit_full_exchange",
    "FoldPlan",
    "fold_plan",
]


def check_ranks(nranks, algo: str, minimum: int = 1) -> int:
    """Validate a rank count (an int >= ``minimum``) and return it."""
    if not isinstance(nranks, (int, np.integer)) or isinstance(nranks, bool):
        raise TypeError(f"{algo}: the number of ranks must be an integer, not {nranks!r}")
    if nranks < minimum:
        raise ValueError(f"{algo}: needs at least {minimum} rank{'s' if minimum > 1 else ''}, not {nranks}")
    return int(nranks)


def check_int(value, what: str) -> int:
    """Validate an integer parameter (a float or a bool is refused, not truncated) and return it."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not {value!r}")
    return int(value)


def ilog(n: int, base: int) -> int:
    """floor(log_base(n)) for n >= 1, exactly."""
    k, x = 0, 1
    while x * base <= n:
        x *= base
        k += 1
    return k


def clog(n: int, base: int) -> int:
    """ceil(log_base(n)) for n >= 1, exactly."""
    k, x = 0, 1
    while x < n:
        x *= base
        k += 1
    return k


def is_power(n: int, base: int) -> bool:
    return n >= 1 and base ** ilog(n, base) == n


@dataclasses.dataclass
class Pattern:
    """Who sends to whom: ``send_to[s]`` is an ``(m, k)`` array, ``-1`` for no peer.

    ``m`` virtual nodes, ``len(send_to)`` steps, up to ``k`` peers per node
    and step (Trivance has two). ``dims_used[s]`` records which torus
    dimension step s uses (for documentation and plots).

    ``shape`` and ``period`` declare the pattern's translation symmetry: node
    y is the C-order index of a point of the group ``Z_shape[0] x ...``, and
    moving every node by a multiple of ``period[i]`` along axis i maps each
    step's peers onto the moved peers (Swing: period 2 per torus dimension,
    Trivance: 1, recursive halving: 1 on the bits of the index). The default,
    ``period == shape``, claims none. :func:`tree_traffic` checks the claim
    and then needs one tree per residue class instead of one per node.
    """

    m: int
    send_to: list[np.ndarray]
    dims_used: list[int] | None = None
    shape: tuple[int, ...] | None = None
    period: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self.shape = (self.m,) if self.shape is None else tuple(int(x) for x in self.shape)
        self.period = self.shape if self.period is None else tuple(int(x) for x in self.period)
        if math.prod(self.shape) != self.m or len(self.period) != len(self.shape) or any(
                x < 1 or n % x for x, n in zip(self.period, self.shape)):
            raise ValueError(f"pattern of {self.m} nodes: shape {self.shape} with period {self.period} "
                             f"is not a group of {self.m} points with periods dividing its axes")

    @property
    def nsteps(self) -> int:
        return len(self.send_to)

    def recv_from(self, s: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(receiver, sender)`` pairs of step s, one array pair per peer slot."""
        out = []
        for j in range(self.send_to[s].shape[1]):
            dst = self.send_to[s][:, j]
            ok = dst >= 0
            out.append((dst[ok], np.flatnonzero(ok)))
        return out

    def translate(self, nodes: np.ndarray, axis: int) -> np.ndarray:
        """``nodes`` moved by one period along ``axis`` (-1 stays -1)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        stride = math.prod(self.shape[axis + 1:])
        coord = (nodes // stride) % self.shape[axis]
        moved = nodes + (((coord + self.period[axis]) % self.shape[axis]) - coord) * stride
        return np.where(nodes < 0, -1, moved)

    def symmetric(self) -> bool:
        """Whether every step commutes with the declared translations (see the class docstring)."""
        y = np.arange(self.m, dtype=np.int64)
        for axis in range(len(self.shape)):
            if self.period[axis] == self.shape[axis]:
                continue
            moved = self.translate(y, axis)
            for to in self.send_to:
                if not (to[moved] == self.translate(to, axis)).all():
                    return False
        return True

    def classes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(class of every node, one representative per class)``: nodes in one class are translates."""
        coords = np.stack(np.unravel_index(np.arange(self.m), self.shape), axis=1)
        period = np.array(self.period)
        cls = np.ravel_multi_index(tuple((coords % period).T), self.period)
        reps = np.flatnonzero((coords < period).all(axis=1))  # C order, so cls[reps] == 0, 1, 2, ...
        return cls, reps


def pattern_trees(pat: Pattern, roots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """Spanning trees of the pattern, one rooted at every node of ``roots`` (default: all nodes).

    Returns ``(parent, step, covered)``, node-major: ``parent[y, i]`` is the
    node y sends block ``roots[i]`` to, in step ``step[y, i]`` (both -1 for
    y == roots[i] or when y is not reached); ``covered`` tells whether every
    tree spans all nodes. The trees are independent of each other, so a
    subset of roots costs ``m`` per root, not ``m * m``.
    """
    m = pat.m
    roots = np.arange(m) if roots is None else np.asarray(roots, dtype=np.int64)
    # node-major (node, root) layout: a step gathers whole rows, which is
    # contiguous memory, instead of strided columns
    reached = np.arange(m)[:, None] == roots[None, :]
    parent = np.full(reached.shape, -1, dtype=np.int32)
    step = np.full(reached.shape, -1, dtype=np.int16 if pat.nsteps < 32000 else np.int32)
    for s in range(pat.nsteps - 1, -1, -1):
        snap = reached.copy()  # a node reached in this step cannot forward in it
        for receiver, sender in pat.recv_from(s):
            # senders are distinct within one peer slot, so each row is written once
            new = snap[receiver] & ~reached[sender]
            reached[sender] |= new
            parent[sender] = np.where(new, receiver[:, None], parent[sender])
            step[sender] = np.where(new, s, step[sender])
    return parent, step, bool(reached.all())


def tree_traffic(pat: Pattern, sizes: np.ndarray) -> list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Chunk counts of the tree reduce-scatter without naming the blocks: for every step, one
    ``(senders, receivers, chunks)`` triple per peer slot (the all-gather is its mirror image).

    ``sizes[d]`` is the chunk count of block d. Block d moves along the tree
    rooted at d; with the pattern's translation symmetry (checked here) the
    tree of d is a translate of its class representative's, so sender y's
    count in step s is a sum over translates: a count per residue class for
    equal sizes, a cyclic convolution over the group (``numpy.fft``) when
    folding makes some blocks bigger. Work and memory are ``m`` per class
    and step instead of ``m * m``; a pattern that does not commute with its
    declared translations raises ``ValueError``.
    """
    if not pat.symmetric():
        raise ValueError(f"the pattern of {pat.m} nodes does not commute with translations by {pat.period}")
    sizes = np.asarray(sizes, dtype=np.int64)
    cls, reps = pat.classes()
    parent, step, covered = pattern_trees(pat, reps)
    if not covered:
        raise ValueError(f"the pattern does not reach every node in {pat.nsteps} steps for {pat.m} nodes")
    uniform = bool((sizes == sizes[0]).all()) if pat.m else True
    if not uniform:
        # block v of class c sits at lattice offset t_v = v - reps[c]; its size is the kernel B_c[t_v]
        coords = np.stack(np.unravel_index(np.arange(pat.m), pat.shape), axis=1)
        offset = np.ravel_multi_index(tuple((coords - coords % np.array(pat.period)).T), pat.shape)
        axes = list(range(len(pat.shape)))
        kernels = []
        for c in range(len(reps)):
            kern = np.zeros(pat.m)
            kern[offset[cls == c]] = sizes[cls == c]
            kernels.append(np.fft.rfftn(kern.reshape(pat.shape), axes=axes))
    if uniform:
        # one pass over every (node, root) entry: how many nodes of each class send in step s on slot j
        k = max((to.shape[1] for to in pat.send_to), default=1)
        y, r = np.nonzero(step >= 0)
        s_yr = step[y, r].astype(np.int64)
        slot = np.zeros(len(y), dtype=np.int64)
        for j in range(1, k):
            peers = np.stack([to[:, j] if to.shape[1] > j else np.full(pat.m, -1) for to in pat.send_to])
            slot[parent[y, r] == peers[s_yr, y]] = j
        per_class = np.bincount((s_yr * k + slot) * len(reps) + cls[y],
                                minlength=pat.nsteps * k * len(reps)).reshape(pat.nsteps, k, len(reps))
    out = []
    for s in range(pat.nsteps):
        per_slot = []
        for j in range(pat.send_to[s].shape[1]):
            x = pat.send_to[s][:, j]
            if uniform:
                count = per_class[s, j][cls] * (int(sizes[0]) if pat.m else 0)
            else:
                mask = (step == s) & (parent == x[:, None])
                acc = np.zeros(pat.shape)
                for c in range(len(reps)):
                    a = np.fft.rfftn(mask[:, c].reshape(pat.shape).astype(float), axes=axes)
                    acc += np.fft.irfftn(a * kernels[c], s=pat.shape, axes=axes)
                count = np.rint(acc).astype(np.int64).reshape(-1)
            ys = np.flatnonzero(count > 0)
            per_slot.append((ys, x[ys], count[ys]))
        out.append(per_slot)
    return out


@dataclasses.dataclass
class Blocks:
    """Which chunks make up block d (CSR): ``idx[ptr[d]:ptr[d+1]]``."""

    ptr: np.ndarray
    idx: np.ndarray

    @classmethod
    def uniform(cls, m: int, per_block: int, offset: int = 0) -> "Blocks":
        idx = np.arange(m * per_block, dtype=np.int64) + offset
        return cls(np.arange(m + 1, dtype=np.int64) * per_block, idx)

    @classmethod
    def from_lists(cls, lists) -> "Blocks":
        lens = np.array([len(x) for x in lists], dtype=np.int64)
        ptr = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        idx = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]) if lists else np.empty(0, np.int64)
        return cls(ptr, idx)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.ptr)

    def gather(self, ds: np.ndarray) -> np.ndarray:
        """Concatenated chunks of blocks ``ds`` (vectorized)."""
        lens = self.sizes[ds]
        starts = self.ptr[ds]
        base = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
        return self.idx[base + np.arange(int(lens.sum()))]


def _tree_edges(pat: Pattern, parent: np.ndarray, step: np.ndarray, s: int, blocks: "Blocks", abstract: bool):
    """Step s of the trees as rows: ``[(senders, receivers, chunk counts, flat chunks or None)]``, one
    entry per peer slot. A sender sends all its blocks for one receiver in one message."""
    out = []
    at_s = step == s
    for j in range(pat.send_to[s].shape[1]):
        x = pat.send_to[s][:, j]
        mask = at_s & (parent == x[:, None])
        ys, ds = np.nonzero(mask)  # sorted by sender, then block: the message's chunk order
        if not len(ys):
            continue
        senders, first = np.unique(ys, return_index=True)
        counts = np.add.reduceat(blocks.sizes[ds], first)
        flat = None if abstract else blocks.gather(ds)
        out.append((senders, x[senders], counts, flat))
    return out


def emit_tree_reduce_scatter(b: ScheduleBuilder, pat: Pattern, parent, step, blocks: Blocks, ranks: np.ndarray,
                             step0: int, channel: int = 0, buf: Buffer = Buffer.OUTPUT) -> int:
    """Reduce-scatter along the trees; block d ends reduced on virtual node d. Returns the next free step."""
    for s in range(pat.nsteps):
        for ys, xs, counts, flat in _tree_edges(pat, parent, step, s, blocks, b.abstract):
            b.add_rows(Row.TRANSFER_REDUCE, step0 + s, ranks[ys], ranks[xs], counts, flat,
                       src_buf=buf, dst_buf=buf, channel=channel)
    return step0 + pat.nsteps


def emit_tree_allgather(b: ScheduleBuilder, pat: Pattern, parent, step, blocks: Blocks, ranks: np.ndarray,
                        step0: int, channel: int = 0, buf: Buffer = Buffer.OUTPUT) -> int:
    """The mirror image: block d spreads from virtual node d down its tree. Returns the next free step."""
    n = pat.nsteps
    for s in range(n - 1, -1, -1):
        for ys, xs, counts, flat in _tree_edges(pat, parent, step, s, blocks, b.abstract):
            b.add_rows(Row.TRANSFER, step0 + (n - 1 - s), ranks[xs], ranks[ys], counts, flat,
                       src_buf=buf, dst_buf=buf, channel=channel)
    return step0 + n


def emit_full_exchange(b: ScheduleBuilder, pat: Pattern, chunks: np.ndarray, ranks: np.ndarray, step0: int,
                       channel: int = 0) -> int:
    """Latency-optimal all-reduce: every step, send all of ``chunks`` to each peer and add what arrives."""
    for s in range(pat.nsteps):
        for receiver, sender in pat.recv_from(s):
            if not len(sender):
                continue
            if b.abstract:
                b.add_rows(Row.TRANSFER_REDUCE, step0 + s, ranks[sender], ranks[receiver], len(chunks),
                           channel=channel)
            else:
                b.add_rows(Row.TRANSFER_REDUCE, step0 + s, ranks[sender], ranks[receiver], len(chunks),
                           np.tile(chunks, len(sender)), channel=channel)
    return step0 + pat.nsteps


@dataclasses.dataclass
class FoldPlan:
    """Active ranks (evenly spread over the ring) and the extras folded into them."""

    active: np.ndarray   # physical rank of virtual rank v
    extras: np.ndarray   # physical ranks not active
    partner: np.ndarray  # active physical rank each extra folds into

    @property
    def trivial(self) -> bool:
        return len(self.extras) == 0


def fold_plan(p: int, m: int) -> FoldPlan:
    """Keep ``m <= p`` ranks spread evenly; fold every other rank into the active rank before it."""
    if not 1 <= m <= p:
        raise ValueError(f"cannot keep {m} of {p} ranks")
    active = (np.arange(m, dtype=np.int64) * p) // m
    mask = np.ones(p, dtype=bool)
    mask[active] = False
    extras = np.flatnonzero(mask)
    partner = active[np.searchsorted(active, extras, side="right") - 1]
    return FoldPlan(active, extras, partner)


def emit_fold_in(b: ScheduleBuilder, plan: FoldPlan, chunks: np.ndarray, step: int, reduce: bool = True) -> None:
    """Extras hand ``chunks`` (one array, or one per extra) to their partners."""
    if plan.trivial:
        return
    if chunks.ndim == 1:
        chunks = np.broadcast_to(chunks, (len(plan.extras), len(chunks)))
    if b.abstract:
        b.add_rows(Row.TRANSFER_REDUCE if reduce else Row.TRANSFER, step, plan.extras, plan.partner, chunks.shape[1])
    else:
        b.transfer(step, plan.extras, plan.partner, np.ascontiguousarray(chunks), reduce=reduce)


def emit_fold_out(b: ScheduleBuilder, plan: FoldPlan, chunks: np.ndarray, step: int) -> None:
    """Partners hand the results (``chunks``: one array, or one per extra) back to the extras."""
    if plan.trivial:
        return
    if chunks.ndim == 1:
        chunks = np.broadcast_to(chunks, (len(plan.extras), len(chunks)))
    if b.abstract:
        b.add_rows(Row.TRANSFER, step, plan.partner, plan.extras, chunks.shape[1])
    else:
        b.transfer(step, plan.partner, plan.extras, np.ascontiguousarray(chunks))


def torus_coords(dims: tuple[int, ...]) -> np.ndarray:
    """``(p, D)`` coordinates of every rank, last dimension fastest (C order)."""
    p = math.prod(dims)
    return np.stack(np.unravel_index(np.arange(p), dims), axis=1).astype(np.int64)


def torus_index(coords: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    return np.ravel_multi_index(tuple(coords.T), dims).astype(np.int64)


def dimension_sequence(dims: tuple[int, ...], steps_per_dim: list[int], start: int) -> list[tuple[int, int]]:
    """``(dimension, step within that dimension)`` for every step: dimensions in
    turn starting at ``start``, skipping the ones that have used up their steps."""
    used = [0] * len(dims)
    out = []
    d = start % len(dims)
    total = sum(steps_per_dim)
    while len(out) < total:
        if used[d] < steps_per_dim[d]:
            out.append((d, used[d]))
            used[d] += 1
        d = (d + 1) % len(dims)
    return out

"""All-to-all(v): the direct baseline and FAST's Birkhoff-staged plan for skewed traffic.

FAST (NSDI 2026) in three moves, for ``servers x gpus`` ranks whose GPUs
each own one NIC:

1. **balance inside the server**: what server s sends to server t is spread
   evenly over s's G NICs (scale-up links move each byte to the GPU whose NIC
   carries it), so a server behaves like one node with G times the NIC rate;
2. **Birkhoff-von Neumann stages**: the server-to-server byte matrix is padded
   until every row and column sums to the largest line sum L, then peeled into
   weighted permutation matrices; in a stage every server sends to exactly
   one other server (no incast), and the stage lasts ``weight / (G * NIC rate)``;
3. **deliver inside the destination server** over scale-up.

The stage weights add up to exactly L, so the scale-out time equals the lower
bound ``L / (G * NIC rate)`` that the busiest server's row or column imposes.
The arithmetic is on integers (bytes or chunks), so that equality is exact.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from .common import check_ranks
from .ir import Buffer, Collective, Row, Schedule, ScheduleBuilder

__all__ = ["zipf_matrix", "server_matrix", "birkhoff", "FastPlan", "fast_plan", "direct", "fast"]


def _matrix(m, what: str) -> np.ndarray:
    a = np.asarray(m)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{what} must be a square matrix, not shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers (bytes or chunks), not {a.dtype}")
    if a.size and a.min() < 0:
        raise ValueError(f"{what} must be non-negative")
    return a.astype(np.int64, copy=False)


def zipf_matrix(gpus: int, skew: float = 0.8, *, mean_bytes: int = 1 << 20, seed: int = 0) -> np.ndarray:
    """A skewed all-to-all byte matrix: each source ranks its destinations at random and sends
    the k-th of them an amount proportional to 1/k^skew (MoE-style token routing)."""
    n = check_ranks(gpus, "zipf_matrix", 2)
    if skew < 0:
        raise ValueError(f"zipf skew must be non-negative, not {skew}")
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n) ** skew
    w = w / w.sum() * mean_bytes * (n - 1)
    m = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        dst = rng.permutation(np.delete(np.arange(n), i))
        m[i, dst] = np.round(w).astype(np.int64)
    return m


def server_matrix(m: np.ndarray, gpus_per_server: int) -> np.ndarray:
    """Bytes from server s to server t (t != s; the diagonal stays inside servers)."""
    m = _matrix(m, "traffic matrix")
    g = int(gpus_per_server)
    if g < 1 or m.shape[0] % g:
        raise ValueError(f"{m.shape[0]} GPUs are not a whole number of servers of {gpus_per_server}")
    s = m.shape[0] // g
    # rows of a server first (contiguous memory), then its columns: several times faster than
    # one reduction over both axes of a (s, g, s, g) view
    b = m.reshape(s, g, s * g).sum(axis=1).reshape(s, s, g).sum(axis=2)
    b.flat[::s + 1] = 0
    return b


def _pad(b: list[list[int]]) -> tuple[list[list[int]], int]:
    """Add non-negative padding so every row and column sums to the largest line sum L."""
    rows = [sum(r) for r in b]
    cols = [sum(c) for c in zip(*b)]
    L = max(rows + cols, default=0)
    a = [r[:] for r in b]
    rdef = [L - x for x in rows]
    cdef = [L - x for x in cols]
    i = j = 0
    n = len(a)
    while i < n and j < n:  # north-west corner rule: total row and column deficits are equal
        x = min(rdef[i], cdef[j])
        a[i][j] += x
        rdef[i] -= x
        cdef[j] -= x
        if rdef[i] == 0:
            i += 1
        if cdef[j] == 0:
            j += 1
    return a, L


#: From this many servers on, each stage is a maximum-weight matching. Below it, on the Zipf
#: matrices of bench/schedules.py, every stage empties one entry whichever matching it takes
#: (both ways reach the S^2 - 2S + 2 bound: 7, 24 and 49 stages at 4, 6 and 8 servers), so a
#: stage only repairs the matching it had; at 12, 16 and 40 servers the maximum-weight
#: stages number 106, 155 and 429 against 119, 222 and 1508 repaired ones.
MAX_WEIGHT_SERVERS = 12


def _repaired_stages(a: list[list[int]], L: int) -> tuple[list[list[int]], list[int]]:
    """Stages from one perfect matching, repaired after each stage by augmenting paths (Kuhn).

    Pure Python on purpose: the matrix has a few servers per side, and a
    numpy call costs more than a whole row of this work.
    """
    n = len(a)
    match = [-1] * n  # column of every row
    owner = [-1] * n  # row of every column

    def augment(r: int, seen: list[bool]) -> bool:
        for c, x in enumerate(a[r]):
            if x and not seen[c]:
                seen[c] = True
                if owner[c] < 0 or augment(owner[c], seen):
                    match[r] = c
                    owner[c] = r
                    return True
        return False

    perms, weights = [], []
    lost = range(n)
    left = L
    while left:
        for r in lost:
            if not augment(r, [False] * n):  # a balanced matrix has one on its support (Koenig)
                raise AssertionError("no perfect matching in the support of a balanced matrix")
        w = min([row[c] for row, c in zip(a, match)])
        perms.append(match[:])
        weights.append(w)
        left -= w
        lost = []
        for r, c in enumerate(match):
            row = a[r]
            row[c] -= w
            if not row[c]:
                lost.append(r)
                owner[c] = -1
    return perms, weights


def _max_weight_stages(a: list[list[int]], L: int) -> tuple[list[np.ndarray], list[float]]:
    """Stages that are each the permutation of largest total weight on the support.

    Costs are the negated entries with empty ones priced out (``big`` is more
    than any matching on the support weighs), as exact integers in float64.
    """
    n = len(a)
    big = float(L) * n + 1.0
    if big >= 2.0 ** 53:
        raise ValueError(f"server matrix too large for exact planning: line sum {L} x {n} servers >= 2^53")
    cost = np.array(a, dtype=np.float64)
    cost = np.where(cost > 0, -cost, big)
    rows = np.arange(n)
    perms, weights = [], []
    left = float(L)
    while left:
        match = linear_sum_assignment(cost)[1]
        v = cost[rows, match]
        w = -v.max()
        v += w
        cost[rows, match] = np.where(v < 0, v, big)
        perms.append(match)
        weights.append(w)
        left -= w
    return perms, weights


def birkhoff(b, method: str = "auto") -> tuple[np.ndarray, np.ndarray, int]:
    """Birkhoff-von Neumann decomposition of an integer matrix after padding.

    Returns ``(perms, weights, L)``: stage k sends from server s to
    ``perms[k, s]`` (``perms[k, s] == s`` means idle) for ``weights[k]``
    bytes, and the weights sum to L, the largest line sum. ``method`` is
    ``"repair"`` (one matching, repaired after each stage), ``"max-weight"``
    (a maximum-weight matching per stage: fewer stages on large matrices) or
    ``"auto"`` (max-weight from :data:`MAX_WEIGHT_SERVERS` servers on).
    """
    return _decompose(_matrix(b, "server matrix"), method)


def _decompose(b: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`birkhoff` on a validated matrix."""
    if method not in ("auto", "repair", "max-weight"):
        raise ValueError(f"method must be 'auto', 'repair' or 'max-weight', not {method!r}")
    a, L = _pad(b.tolist())
    n = len(a)
    if method == "max-weight" or (method == "auto" and n >= MAX_WEIGHT_SERVERS):
        perms, weights = _max_weight_stages(a, L)
    else:
        perms, weights = _repaired_stages(a, L)
    return (np.array(perms, dtype=np.int64).reshape(len(perms), n), np.array(weights, dtype=np.int64), L)


@dataclasses.dataclass
class FastPlan:
    """A FAST plan: stages (``perms[k]``, ``weights[k]``), their scale-out time, and the bound they meet."""

    servers: int
    gpus_per_server: int
    perms: np.ndarray
    weights: np.ndarray
    lower_bound_bytes: int
    compute_s: float
    server_bytes: np.ndarray

    @property
    def stages(self) -> list[tuple[np.ndarray, int]]:
        """``(perm, weight)`` of every stage."""
        return list(zip(self.perms, self.weights.tolist()))

    def makespan(self, nic_bandwidth: float) -> float:
        """Scale-out time: every stage at G NICs' rate."""
        return int(self.weights.sum()) / (self.gpus_per_server * nic_bandwidth)

    def lower_bound(self, nic_bandwidth: float) -> float:
        return self.lower_bound_bytes / (self.gpus_per_server * nic_bandwidth)


def fast_plan(m: np.ndarray, gpus_per_server: int, method: str = "auto") -> FastPlan:
    """Plan a skewed all-to-all with FAST (see the module docstring); ``method`` as in :func:`birkhoff`."""
    t0 = time.perf_counter()
    b = server_matrix(m, gpus_per_server)
    perms, weights, L = _decompose(b, method)
    dt = time.perf_counter() - t0
    return FastPlan(len(b), int(gpus_per_server), perms, weights, L, dt, b)


def direct(counts: np.ndarray) -> Schedule:
    """Direct all-to-allv: every rank sends every other rank its share in one step."""
    counts = _matrix(counts, "counts")
    n = check_ranks(len(counts), "direct")
    send = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], axis=1)
    recv = np.concatenate([np.zeros((1, n), np.int64), np.cumsum(counts, axis=0)[:-1, :]], axis=0)
    b = ScheduleBuilder("direct", Collective.ALLTOALLV, n)
    i, j = np.nonzero(counts)
    for local in (True, False):
        sel = (i == j) if local else (i != j)
        ii, jj = i[sel], j[sel]
        if not len(ii):
            continue
        c = counts[ii, jj]
        src = np.concatenate([send[a, bb] + np.arange(k) for a, bb, k in zip(ii, jj, c)])
        dst = np.concatenate([recv[a, bb] + np.arange(k) for a, bb, k in zip(ii, jj, c)])
        kind = Row.COPY if local else Row.TRANSFER
        b.add_rows(kind, 0, ii, jj, c, src, dst, src_buf=Buffer.INPUT, dst_buf=Buffer.OUTPUT)
    return _build_v(b, counts)


def _build_v(b: ScheduleBuilder, counts: np.ndarray, scratch: int = 0) -> Schedule:
    return b.build(size_chunks=max(int(counts.sum(axis=1).max()), 1), in_chunks=max(int(counts.sum(axis=1).max()), 1),
                   out_chunks=max(int(counts.sum(axis=0).max()), 1), scratch_chunks=scratch, counts=counts,
                   inplace=False)


def fast(counts: np.ndarray, gpus_per_server: int) -> Schedule:
    """FAST as an executable all-to-allv schedule over chunks.

    Step 0: intra-server traffic goes straight to its destination, and every
    chunk bound for another server moves to the scratch of the GPU whose NIC
    carries it (its rail). Step 1+k: stage k's server pairs exchange over the
    rails (GPU g to GPU g). Last step: each chunk moves from the rail GPU's
    scratch to its destination's output. Chunks a rail GPU itself sends or
    receives skip the relay.
    """
    counts = _matrix(counts, "counts")
    n = check_ranks(len(counts), "fast")
    plan = fast_plan(counts, gpus_per_server)
    G, S = plan.gpus_per_server, plan.servers
    send = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], axis=1)
    recv = np.concatenate([np.zeros((1, n), np.int64), np.cumsum(counts, axis=0)[:-1, :]], axis=0)
    # every chunk as (src rank, src offset, dst rank, dst offset), grouped by server pair
    pending: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    local = []
    for i in range(n):
        for j in range(n):
            for q in range(int(counts[i, j])):
                item = (i, int(send[i, j]) + q, j, int(recv[i, j]) + q)
                if i // G == j // G:
                    local.append(item)
                else:
                    pending.setdefault((i // G, j // G), []).append(item)
    slots = np.zeros(n, dtype=np.int64)  # next free scratch chunk per rank
    rows = {k: [] for k in ("step", "kind", "src", "dst", "sbuf", "dbuf", "sidx", "didx")}

    def emit(step, kind, a, c, sbuf, dbuf, si, di):
        for k, v in zip(rows, (step, kind, a, c, sbuf, dbuf, si, di)):
            rows[k].append(v)

    def slot(r):
        slots[r] += 1
        return int(slots[r] - 1)

    for i, si, j, dj in local:
        emit(0, Row.COPY if i == j else Row.TRANSFER, i, j, Buffer.INPUT, Buffer.OUTPUT, si, dj)
    nst = len(plan.stages)
    for k, (perm, w) in enumerate(plan.stages):
        for s in range(S):
            t = int(perm[s])
            if t == s:
                continue
            items = pending.get((s, t), [])
            take, pending[(s, t)] = items[:w], items[w:]
            for q, (i, si, j, dj) in enumerate(take):
                g = q % G
                a, c = s * G + g, t * G + g
                # to the rail GPU of the source server
                if a != i:
                    sa = slot(a)
                    emit(0, Row.TRANSFER, i, a, Buffer.INPUT, Buffer.SCRATCH, si, sa)
                    src_buf, src_idx = Buffer.SCRATCH, sa
                else:
                    src_buf, src_idx = Buffer.INPUT, si
                # across the rail in stage k, into the destination or the rail GPU's scratch
                if c == j:
                    emit(1 + k, Row.TRANSFER, a, c, src_buf, Buffer.OUTPUT, src_idx, dj)
                else:
                    sc = slot(c)
                    emit(1 + k, Row.TRANSFER, a, c, src_buf, Buffer.SCRATCH, src_idx, sc)
                    emit(1 + nst, Row.TRANSFER, c, j, Buffer.SCRATCH, Buffer.OUTPUT, sc, dj)
    left = sum(len(v) for v in pending.values())
    if left:
        raise AssertionError(f"{left} chunks were not scheduled")  # the stages cover every byte
    b = ScheduleBuilder("fast", Collective.ALLTOALLV, n)
    if rows["step"]:
        r = {k: np.array(v, dtype=np.int64) for k, v in rows.items()}
        # group rows with equal attributes into one batch per kind for the builder
        for kind in (Row.TRANSFER, Row.COPY):
            sel = r["kind"] == kind
            if sel.any():
                b.add_rows(kind, r["step"][sel], r["src"][sel], r["dst"][sel], 1, r["sidx"][sel], r["didx"][sel],
                           src_buf=r["sbuf"][sel], dst_buf=r["dbuf"][sel])
    sched = _build_v(b, counts, scratch=max(int(slots.max()), 1))
    sched.meta.update(stages=nst, lower_bound_chunks=plan.lower_bound_bytes, stage_chunks=int(plan.weights.sum()))
    return sched

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
    if (a < 0).any():
        raise ValueError(f"{what} must be non-negative")
    return a.astype(np.int64)


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
    b = m.reshape(s, g, s, g).sum(axis=(1, 3))
    np.fill_diagonal(b, 0)
    return b


def _pad(b: np.ndarray) -> tuple[np.ndarray, int]:
    """Add non-negative padding so every row and column sums to the largest line sum L."""
    L = int(max(b.sum(axis=1).max(), b.sum(axis=0).max())) if b.size else 0
    a = b.copy()
    rdef = L - a.sum(axis=1)
    cdef = L - a.sum(axis=0)
    i = j = 0
    n = len(a)
    while i < n and j < n:  # north-west corner rule: total row and column deficits are equal
        x = min(rdef[i], cdef[j])
        a[i, j] += x
        rdef[i] -= x
        cdef[j] -= x
        if rdef[i] == 0:
            i += 1
        if cdef[j] == 0:
            j += 1
    return a, L


def birkhoff(b: np.ndarray) -> tuple[list[tuple[np.ndarray, int]], int]:
    """Birkhoff-von Neumann decomposition of an integer matrix after padding.

    Returns ``(stages, L)``: ``stages`` is a list of ``(perm, weight)`` with
    ``perm[s]`` the server s sends to (``perm[s] == s`` means idle) and the
    weights summing to L.
    """
    a, L = _pad(_matrix(b, "server matrix"))
    n = len(a)
    rows = np.arange(n)
    stages = []
    # Each stage is the permutation of largest total weight on the support
    # (zeros priced out), which peels off far more per stage than an arbitrary
    # perfect matching: ~S^2/4 stages instead of the S^2 - 2S + 2 worst case.
    big = float(L) * n + 1.0
    while a.any():
        _, match = linear_sum_assignment(np.where(a > 0, -a.astype(np.float64), big))
        w = int(a[rows, match].min())
        if w <= 0:  # cannot happen: a balanced matrix has a perfect matching on its support (Koenig)
            raise AssertionError("no perfect matching in the support of a balanced matrix")
        a[rows, match] -= w
        stages.append((match.astype(np.int64), w))
    return stages, L


@dataclasses.dataclass
class FastPlan:
    """A FAST plan: stages, their scale-out time, and the bound they meet."""

    servers: int
    gpus_per_server: int
    stages: list[tuple[np.ndarray, int]]
    lower_bound_bytes: int
    compute_s: float
    server_bytes: np.ndarray

    def makespan(self, nic_bandwidth: float) -> float:
        """Scale-out time: every stage at G NICs' rate."""
        return sum(w for _, w in self.stages) / (self.gpus_per_server * nic_bandwidth)

    def lower_bound(self, nic_bandwidth: float) -> float:
        return self.lower_bound_bytes / (self.gpus_per_server * nic_bandwidth)


def fast_plan(m: np.ndarray, gpus_per_server: int) -> FastPlan:
    """Plan a skewed all-to-all with FAST (see the module docstring)."""
    t0 = time.perf_counter()
    b = server_matrix(m, gpus_per_server)
    stages, L = birkhoff(b)
    dt = time.perf_counter() - t0
    return FastPlan(len(b), int(gpus_per_server), stages, L, dt, b)


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
    sched.meta.update(stages=nst, lower_bound_chunks=plan.lower_bound_bytes,
                      stage_chunks=sum(w for _, w in plan.stages))
    return sched

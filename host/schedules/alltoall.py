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

import functools
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from inagg.host.schedules.common import check_int, check_ranks
from inagg.host.schedules.ir import Buffer, Collective, Row, Schedule, ScheduleBuilder

__all__ = ["zipf_matrix", "server_matrix", "birkhoff", "FastPlan", "fast_plan", "direct", "fast"]


def _matrix(m, what: str) -> np.ndarray:
    a = np.asarray(m)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{what} must be a square matrix, not shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers (bytes or chunks), not {a.dtype}")
    if a.size and a.min() < 0:
        raise ValueError(f"{what} must be non-negative")
    return np.ascontiguousarray(a, dtype=np.int64)  # the compiled kernels' one type


def _too_large(what: str) -> ValueError:
    return ValueError(f"{what} too large: its entries add up past 2^63 - 1")


@functools.cache
def _bvn():
    """The compiled kernels (:mod:`.bvn`), imported on the first plan: numba's import and loading the
    kernels from its cache (or compiling them, seconds the first time on a machine) stay out of
    every plan's time and out of ``import inagg.host.schedules``. A plan of each kind runs here on
    a 2 x 2 matrix: a numba function's first call costs about 230 us more than the next ones and
    numpy's first reduction 70 us, which made the first plan of a process (the one ``inagg
    alltoall`` shows) 254 us instead of 20."""
    from inagg.host.schedules import bvn

    for repairs in (True, False):
        _plan(bvn, *_servers(np.ones((2, 2), np.int64), 1), repairs)
    return bvn


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


def _servers(m, gpus_per_server) -> tuple[np.ndarray, int, int]:
    """The validated traffic matrix, the GPUs per server and the server count."""
    m = _matrix(m, "traffic matrix")
    g = check_int(gpus_per_server, "gpus_per_server")
    if g < 1 or m.shape[0] % g:
        raise ValueError(f"{m.shape[0]} GPUs are not a whole number of servers of {gpus_per_server}")
    return m, g, m.shape[0] // g


def server_matrix(m: np.ndarray, gpus_per_server: int) -> np.ndarray:
    """Bytes from server s to server t (t != s; the diagonal stays inside servers)."""
    m, g, servers = _servers(m, gpus_per_server)
    b = np.empty((servers, servers), np.int64)
    if not _bvn().server_sums(m, g, b):
        raise _too_large("traffic matrix")
    return b


#: From this many servers on, each stage is a maximum-weight matching. Below it, on the Zipf
#: matrices of bench/schedules.py, every stage empties one entry whichever matching it takes
#: (both ways take the same median count, (S - 1)(S - 2): 6 or 7, 20 and 42 stages at 4, 6 and
#: 8 servers), so a stage only repairs the matching it had; at 12, 16 and 40 servers the
#: maximum-weight stages number 102, 150 and 422 against 110, 210 and 1482 repaired ones.
MAX_WEIGHT_SERVERS = 12


def _repairs(method: str, servers: int) -> bool:
    """Whether ``method`` (see :func:`birkhoff`) takes the repaired stages at this size."""
    if method not in ("auto", "repair", "max-weight"):
        raise ValueError(f"method must be 'auto', 'repair' or 'max-weight', not {method!r}")
    return method == "repair" or (method == "auto" and servers < MAX_WEIGHT_SERVERS)


def _stage_arrays(servers: int) -> tuple[np.ndarray, np.ndarray]:
    """Room for the repaired stages: each empties an entry of the padded matrix for good."""
    most = max(servers * servers, 1)
    return np.empty((most, servers), np.int64), np.empty(most, np.int64)


def _max_weight_stages(a: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Stages that are each the permutation of largest total weight on the support of the padded
    matrix ``a``.

    Costs are the negated entries with empty ones priced out (``big`` is more
    than any matching on the support weighs), as exact integers in float64.
    """
    n = len(a)
    big = float(L) * n + 1.0
    if big >= 2.0 ** 53:
        raise ValueError(f"server matrix too large for exact planning: line sum {L} x {n} servers >= 2^53")
    cost = np.where(a > 0, -a.astype(np.float64), big)
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
    return np.array(perms, dtype=np.int64).reshape(len(weights), n), np.array(weights, dtype=np.int64)


def birkhoff(b, method: str = "auto") -> tuple[np.ndarray, np.ndarray, int]:
    """Birkhoff-von Neumann decomposition of an integer matrix after padding.

    Returns ``(perms, weights, L)``: stage k sends from server s to
    ``perms[k, s]`` (``perms[k, s] == s`` means idle) for ``weights[k]``
    bytes, and the weights sum to L, the largest line sum. ``method`` is
    ``"repair"`` (one matching, repaired after each stage), ``"max-weight"``
    (a maximum-weight matching per stage: fewer stages on large matrices) or
    ``"auto"`` (max-weight from :data:`MAX_WEIGHT_SERVERS` servers on).
    """
    b = _matrix(b, "server matrix")
    n = len(b)
    repairs = _repairs(method, n)
    bvn = _bvn()
    a = np.empty((n, n + 1), np.int64)
    L = int(bvn.pad(b, a))
    if L < 0:
        raise _too_large("server matrix")
    if not repairs:
        return (*_max_weight_stages(a[:, :n], L), L)
    perms, weights = _stage_arrays(n)
    k = bvn.repair(a, L, perms, weights)
    return perms[:k], weights[:k], L


class FastPlan:
    """A FAST plan: stages (``perms[k]``, ``weights[k]``), their scale-out time, and the bound they meet.

    ``compute_s`` is the planning time: from the traffic matrix to the stage
    arrays.
    """

    def __init__(self, gpus_per_server: int, perms: np.ndarray, weights: np.ndarray, lower_bound_bytes: int,
                 compute_s: float, server_bytes: np.ndarray):
        self.servers = len(server_bytes)
        self.gpus_per_server = gpus_per_server
        #: ``perms[k, s]``: the server s sends to in stage k (itself: idle).
        self.perms = perms
        #: Bytes every busy server sends in each stage.
        self.weights = weights
        self.lower_bound_bytes = lower_bound_bytes
        self.compute_s = compute_s
        #: The server-to-server byte matrix the plan covers (:func:`server_matrix`).
        self.server_bytes = server_bytes

    def __repr__(self) -> str:
        return (f"FastPlan(servers={self.servers}, gpus_per_server={self.gpus_per_server}, "
                f"stages={len(self.weights)}, lower_bound_bytes={self.lower_bound_bytes}, "
                f"compute_s={self.compute_s:.3g})")

    @property
    def stages(self) -> list[tuple[np.ndarray, int]]:
        """``(perm, weight)`` of every stage."""
        return list(zip(self.perms, self.weights.tolist()))

    def makespan(self, nic_bandwidth: float) -> float:
        """Scale-out time: every stage at G NICs' rate."""
        return int(self.weights.sum()) / (self.gpus_per_server * nic_bandwidth)

    def lower_bound(self, nic_bandwidth: float) -> float:
        """The busiest server's bytes at G NICs' rate: no plan is faster."""
        return self.lower_bound_bytes / (self.gpus_per_server * nic_bandwidth)


def fast_plan(m: np.ndarray, gpus_per_server: int, method: str = "auto") -> FastPlan:
    """Plan a skewed all-to-all with FAST (see the module docstring); ``method`` as in :func:`birkhoff`."""
    bvn = _bvn()
    t0 = time.perf_counter()
    m, g, servers = _servers(m, gpus_per_server)
    perms, weights, L, b = _plan(bvn, m, g, servers, _repairs(method, servers))
    dt = time.perf_counter() - t0
    return FastPlan(g, perms, weights, L, dt, b)


def _plan(bvn, m: np.ndarray, g: int, servers: int, repairs: bool) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """:func:`fast_plan` on validated input: ``(perms, weights, L, server matrix)``."""
    b = np.empty((servers, servers), np.int64)
    a = np.empty((servers, servers + 1), np.int64)
    if repairs:
        perms, weights = _stage_arrays(servers)
        k, L = bvn.plan(m, g, b, a, perms, weights)  # all of it in one compiled call
        if k < 0:
            raise _too_large("traffic matrix")
        return perms[:k], weights[:k], L, b
    if not bvn.server_sums(m, g, b):
        raise _too_large("traffic matrix")
    L = int(bvn.pad(b, a))
    return (*_max_weight_stages(a[:, :servers], L), L, b)


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

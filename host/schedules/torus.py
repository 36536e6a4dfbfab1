"""The torus cost of one step (:meth:`.topology.Topology.step_cost`), compiled with numba.

Routes are dimension-order: a transfer runs along dimension 0 to its
destination's coordinate, then dimension 1, and so on, each time the
shorter way round the ring (a tie goes the + way). A run is a stretch of
one ring line, so per dimension and direction the link loads come from a
difference array along the lines, each run's busiest link from a sparse
table over the lines (two lookups) and its alpha sum from prefix sums: one
pass over the transfers and a few over the links, whatever the path lengths.
In numpy that was about 60 array passes per step, each allocating a
transfer-sized temporary (39 ms of CPU per step of a 65,536-rank Swing
schedule); here it is one call.

Compiled for exactly its argument types when this module is imported (or
loaded from numba's on-disk cache, ``cache=True``). :mod:`.topology`
imports it on the first step of a torus of at least
:data:`~.topology.COMPILED_TORUS_HOSTS` hosts, where it pays for loading
numba; smaller tori keep the numpy version of the same algorithm.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["step_cost"]


@njit("Tuple((float64[::1], float64[::1], float64, float64))"
      "(int64[::1], int64[::1], float64[::1], int64[::1], float64[::1], float64[::1])", cache=True, nogil=True)
def step_cost(src, dst, nbytes, dims, link_alpha, link_beta):
    """``(alpha_path, wait, byte_term, ideal_term)`` of the transfers ``src[i] -> dst[i]`` carrying
    ``nbytes[i]`` on the torus ``dims`` (nodes numbered in C order, link of node x along dimension
    d in direction neg (0: +, 1: -) numbered ``(x * D + d) * 2 + neg``), as
    :class:`~inagg.host.schedules.topology.StepCost` defines them."""
    T = len(src)
    D = len(dims)
    p = 1
    for d in range(D):
        p *= dims[d]
    if len(dst) != T or len(nbytes) != T:
        raise ValueError("src, dst and nbytes must have one entry per transfer")
    for i in range(T):
        if not (0 <= src[i] < p and 0 <= dst[i] < p):
            raise ValueError("a transfer's node is not on the torus")
        if src[i] == dst[i]:
            raise ValueError("a route needs two different nodes")
    strides = np.empty(D, np.int64)
    s = 1
    for d in range(D - 1, -1, -1):
        strides[d] = s
        s *= dims[d]
    alpha_path = np.zeros(T)
    wait = np.zeros(T)
    first = np.full(T, -1, np.int64)
    cur = src.copy()  # the node where the run along the current dimension starts
    hops = np.empty(T, np.int64)
    start = np.empty(T, np.int64)  # the run's first link's coordinate on its line
    base = np.empty(T, np.int64)  # the line's node at coordinate 0
    load = np.empty(p)
    prefix = np.empty(p)  # per line, the sum of the values before each coordinate
    total = np.empty(p)  # per line (at its node of coordinate 0), the sum over the line
    coords = np.empty((D, p), np.int64)  # a lookup instead of a division per transfer and dimension
    for d in range(D):
        for x in range(p):
            coords[d, x] = (x // strides[d]) % dims[d]
    longest = max(dims.max() // 2, 1)
    log2 = np.zeros(longest + 1, np.int64)  # floor(log2(h)) of every run length h
    for h in range(2, longest + 1):
        log2[h] = log2[h // 2] + 1
    levels = log2[longest] + 1
    table = np.empty((levels, p))  # level j: the busiest of 2^j consecutive links from each one
    byte_term = 0.0
    for d in range(D):
        size = dims[d]
        inner = strides[d]
        outer = p // (size * inner)
        hmax = np.zeros(2, np.int64)
        cd = coords[d]
        for i in range(T):
            cs = cd[src[i]]
            delta = cd[dst[i]] - cs
            node = cur[i]
            cur[i] = node + delta * inner
            if delta < 0:
                delta += size
            neg = 0 if delta <= size // 2 else 1
            h = size - delta if neg else delta
            hops[i] = -h if neg else h  # the sign carries the direction
            if h:
                a = cs - h + 1 if neg else cs
                start[i] = a + size if a < 0 else a
                base[i] = node - cs * inner
                if first[i] < 0:
                    first[i] = (node * D + d) * 2 + neg
                if h > hmax[neg]:
                    hmax[neg] = h
        for neg in range(2):
            if not hmax[neg]:
                continue
            # loads: a difference array along every line (a run that wraps adds at 0 again), summed up
            load[:] = 0.0
            for i in range(T):
                h = -hops[i] if neg else hops[i]
                if h <= 0:
                    continue
                a, b, w = start[i], base[i], nbytes[i]
                load[b + a * inner] += w
                end = a + h
                if end < size:
                    load[b + end * inner] -= w
                else:
                    load[b] += w
                    load[b + (end - size) * inner] -= w
            for o in range(outer):
                for j in range(inner):
                    b = o * size * inner + j
                    run = 0.0
                    asum = 0.0
                    for k in range(size):
                        x = b + k * inner
                        link = (x * D + d) * 2 + neg
                        run += load[x]
                        prefix[x] = asum
                        asum += link_alpha[link]
                        v = run * link_beta[link]
                        load[x] = v
                        table[0, x] = v
                        if v > byte_term:
                            byte_term = v
                    total[b] = asum
            # the sparse table up to the longest run
            lev = 1
            while (1 << lev) <= hmax[neg]:
                half = 1 << (lev - 1)
                for o in range(outer):
                    for j in range(inner):
                        b = o * size * inner + j
                        for k in range(size):
                            x = b + k * inner
                            y = x + half * inner if k + half < size else x + (half - size) * inner
                            table[lev, x] = max(table[lev - 1, x], table[lev - 1, y])
                lev += 1
            for i in range(T):
                h = -hops[i] if neg else hops[i]
                if h <= 0:
                    continue
                a, b = start[i], base[i]
                j = log2[h]
                last = a + h - (1 << j)  # where the second window of 2^j links starts
                if last >= size:
                    last -= size
                busiest = max(table[j, b + a * inner], table[j, b + last * inner])
                if busiest > wait[i]:
                    wait[i] = busiest
                # alphas of links a .. a + h - 1: the prefix sums' difference, plus a turn if it wraps
                end = a + h
                if end < size:
                    alpha_path[i] += prefix[b + end * inner] - prefix[b + a * inner]
                else:
                    alpha_path[i] += total[b] - prefix[b + a * inner] + prefix[b + (end - size) * inner]
    ideal = np.zeros(len(link_beta))
    for i in range(T):
        ideal[first[i]] += nbytes[i]  # every transfer moves: first[i] >= 0
    ideal_term = 0.0
    for link in range(len(link_beta)):
        v = ideal[link] * link_beta[link]
        if v > ideal_term:
            ideal_term = v
    return alpha_path, wait, byte_term, ideal_term

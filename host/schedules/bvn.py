"""FAST's plan below the max-weight threshold, compiled: server sums, padding, repaired stages.

:mod:`.alltoall` documents the algorithm; this module is its inner loops in
numba. Why compiled: at 4 servers the plan is a few hundred list operations
(two reductions to the server matrix, the north-west corner walk, six or
seven stage repairs), and in CPython each costs tens of nanoseconds plus a
numpy call's microsecond at every array boundary: about 18 us on a quiet
core and twice that when other processes share it, against FAST's 25 us.
Here the same steps are one call.

The kernels take and fill preallocated C-contiguous int64 arrays and are
compiled for exactly those types when this module is imported (or loaded
from numba's on-disk cache, ``cache=True``, under this package's
``__pycache__``), so :mod:`.alltoall` imports it on its first plan and no
plan pays for a compilation. Every kernel checks that its sums stay below
2^63 and reports an overflow as a return value for the caller to raise.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["server_sums", "pad", "repair", "plan"]

_JIT = {"cache": True, "nogil": True}


@njit("boolean(int64[:, ::1], int64, int64[:, ::1])", **_JIT)
def server_sums(m, g, b):
    """``b[s, t]``: bytes from server s's g GPUs to server t's, 0 on the diagonal (traffic inside a
    server). False, with ``b`` undefined, if the bytes add up past 2^63 - 1 (``m`` is non-negative)."""
    n = m.shape[0]
    servers = n // g
    b[:, :] = 0
    total = 0
    for i in range(n):
        s = i // g
        j = 0
        for t in range(servers):
            acc = 0
            for _ in range(g):
                x = m[i, j]
                acc += x
                total += x
                if x < 0 or total < 0:  # x < 0: an unsigned entry of 2^63 or more, wrapped
                    return False
                j += 1
            b[s, t] += acc
    for s in range(servers):
        b[s, s] = 0
    return True


@njit("int64(int64[:, ::1], int64[:, ::1])", **_JIT)
def pad(b, a):
    """Copy the n x n matrix ``b`` into the first n columns of ``a`` (n x (n + 1), last column 0) and
    add padding so every row and column sums to the largest line sum L; return L, or -1 if the
    entries add up past 2^63 - 1.

    North-west corner rule: fill cell (i, j) with what row i or column j still lacks, whichever is
    less, and move past that line. Every cell it fills that was empty costs about one more stage.
    The walk stays near its own diagonal, and a server matrix's diagonal is empty (traffic inside a
    server), so the columns go rotated by half: n // 2, ..., n - 1, 0, ..., n // 2 - 1. On Zipf
    matrices that takes 6.5 stages instead of 8.5 at 4 servers, 42 instead of 48 at 8.
    """
    n = b.shape[0]
    rows = np.zeros(n, np.int64)
    cols = np.zeros(n, np.int64)
    total = 0
    for i in range(n):
        for j in range(n):
            x = b[i, j]
            a[i, j] = x
            rows[i] += x
            cols[j] += x
            total += x
            if x < 0 or total < 0:  # x < 0: an unsigned entry of 2^63 or more, wrapped
                return -1
        a[i, n] = 0
    if n == 0:
        return 0
    L = max(rows.max(), cols.max())
    half = n // 2
    i = j = 0
    c = half
    ri, cj = L - rows[0], L - cols[c]
    while True:
        if ri < cj:
            a[i, c] += ri
            cj -= ri
            i += 1
            if i == n:
                return L
            ri = L - rows[i]
        else:
            a[i, c] += cj
            ri -= cj
            j += 1
            if j == n:
                return L
            c = (j + half) % n
            cj = L - cols[c]


@njit(**_JIT)
def _augment(a, r0, done, match, owner, ends, seen, path_rows, path_cols, nxt):
    """Kuhn's augmenting path from the unmatched row r0 (a depth-first search on an explicit stack),
    trying a free column first at every row: the shortest path. Moves every row on the path and
    writes back the remainder of the entry each one leaves. False if there is none."""
    n = a.shape[0]
    seen[:] = False
    d = 0
    path_rows[0] = r0
    nxt[0] = -1  # -1: this row's free columns not looked at yet
    while d >= 0:
        r = path_rows[d]
        if nxt[d] < 0:
            nxt[d] = 0
            for c in range(n):
                if a[r, c] > 0 and owner[c] < 0:
                    path_cols[d] = c
                    for e in range(d, -1, -1):  # each row takes the column its successor left
                        q = path_rows[e]
                        c2 = path_cols[e]
                        a[q, match[q]] = ends[q] - done
                        ends[q] = done + a[q, c2]
                        match[q] = c2
                        owner[c2] = q
                    return True
        c = nxt[d]
        while c < n and (a[r, c] == 0 or seen[c]):
            c += 1
        if c == n:
            d -= 1
            continue
        seen[c] = True
        path_cols[d] = c
        nxt[d] = c + 1
        d += 1
        path_rows[d] = owner[c]
        nxt[d] = -1
    return False


@njit("int64(int64[:, ::1], int64, int64[:, ::1], int64[::1])", **_JIT)
def repair(a, L, perms, weights):
    """Stages of the padded matrix ``a`` (from :func:`pad`, line sums L) from one perfect matching,
    repaired after each stage; ``perms[k]`` and ``weights[k]`` of stage k, the count returned.

    No stage subtracts its weight from the matched entries: row r's matched entry runs out when the
    stage weights reach ``ends[r]``, and its remainder is written back into ``a`` only when a repair
    moves the row to another column, so ``a`` holds every unmatched entry exactly. Every stage
    empties at least one entry for good, so there are at most n^2 stages (the size ``perms`` needs).
    """
    n = a.shape[0]
    if L == 0:
        return 0
    match = np.full(n, n, np.int64)  # column of every row (n: none, a[:, n] is 0)
    owner = np.full(n, -1, np.int64)  # row of every column
    ends = np.zeros(n, np.int64)
    seen = np.zeros(n, np.bool_)
    path_rows = np.empty(n, np.int64)
    path_cols = np.empty(n, np.int64)
    nxt = np.empty(n, np.int64)
    lost = np.empty(n, np.int64)
    nlost = 0
    for r in range(n):  # greedy first, augmenting paths for the rows it leaves out
        for c in range(n):
            x = a[r, c]
            if x > 0 and owner[c] < 0:
                ends[r] = x
                match[r] = c
                owner[c] = r
                break
        if match[r] == n:
            lost[nlost] = r
            nlost += 1
    done = 0  # weight of the stages so far
    k = 0
    while True:
        for i in range(nlost):
            if not _augment(a, lost[i], done, match, owner, ends, seen, path_rows, path_cols, nxt):
                raise AssertionError("no perfect matching in the support of a balanced matrix")
        if k == perms.shape[0]:
            raise AssertionError("more stages than entries in the padded matrix")
        end = ends.min()
        perms[k, :] = match
        weights[k] = end - done
        k += 1
        done = end
        if done == L:
            return k
        r = -1
        nlost = 0
        for q in range(n):
            if ends[q] == end:
                if r < 0:
                    r = q
                lost[nlost] = q
                nlost += 1
        if nlost == 1:
            # The usual case: one entry ran out and its column c0 is the only free one. A path
            # r -> c -> owner of c -> c0 nearly always repairs it; search that first.
            nlost = 0
            c0 = match[r]
            a[r, c0] = 0
            for c in range(n):
                x = a[r, c]
                if x > 0:
                    o = owner[c]
                    y = a[o, c0]
                    if y > 0:
                        a[o, c] = ends[o] - done
                        ends[o] = done + y
                        match[o] = c0
                        owner[c0] = o
                        ends[r] = done + x
                        match[r] = c
                        owner[c] = r
                        break
            if match[r] == c0:
                owner[c0] = -1
                lost[0] = r
                nlost = 1
        else:
            for i in range(nlost):
                q = lost[i]
                a[q, match[q]] = 0
                owner[match[q]] = -1


@njit("UniTuple(int64, 2)(int64[:, ::1], int64, int64[:, ::1], int64[:, ::1], int64[:, ::1], int64[::1])", **_JIT)
def plan(m, g, b, a, perms, weights):
    """:func:`server_sums` into ``b``, :func:`pad` into ``a`` and :func:`repair` into ``perms`` and
    ``weights`` in one call; returns the stage count and L, the line sum, or (-1, -1) if the bytes
    add up past 2^63 - 1."""
    if not server_sums(m, g, b):
        return -1, -1
    L = pad(b, a)
    return repair(a, L, perms, weights), L

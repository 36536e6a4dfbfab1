"""NCCL's double binary tree all-reduce.

Tree 1 is the in-order binary tree over ranks 1..n-1 keyed by the lowest set
bit (a rank whose lowest set bit is b has children r - b/2 and r + b/2, the
latter shrunk while it is out of range), with rank 0 as a root above it.
Half the ranks are leaves of tree 1; tree 2 makes (most of) them interior
nodes: for even n it is tree 1 mirrored (rank r plays n-1-r), for odd n
tree 1 shifted by one (rank r plays r-1). Each tree carries half the data,
pipelined in ``pipeline`` chunks: reduce up to the root, broadcast down.
"""

from __future__ import annotations

import numpy as np

from inagg.host.schedules.common import check_ranks
from inagg.host.schedules.ir import Collective, Row, Schedule, ScheduleBuilder

__all__ = ["binary_tree", "double_binary_tree", "dbtree"]


def binary_tree(n: int) -> np.ndarray:
    """Parent of every rank in tree 1 (-1 for the root, rank 0)."""
    parent = np.full(n, -1, dtype=np.int64)
    if n == 1:
        return parent
    top = 1 << (int(n - 1).bit_length() - 1)  # highest power of two below n
    parent[top] = 0
    r = np.arange(1, n, dtype=np.int64)
    half = (r & -r) >> 1
    inner = half > 0
    parent[(r - half)[inner]] = r[inner]
    # the right child r + b/2 shrinks (b/4, b/8, ...) while it is out of range
    right_half = half.copy()
    while True:
        shrink = (r + right_half >= n) & (right_half > 1)
        if not shrink.any():
            break
        right_half[shrink] >>= 1
    right = r + right_half
    ok = inner & (right < n) & (right != r)
    parent[right[ok]] = r[ok]
    return parent


def double_binary_tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents in tree 1 and tree 2 (mirrored for even n, shifted for odd n)."""
    t1 = binary_tree(n)
    r = np.arange(n)
    if n % 2 == 0:
        role = n - 1 - r                     # rank r plays rank n-1-r of tree 1
        p = t1[role]
        t2 = np.where(p < 0, -1, n - 1 - p)
    else:
        role = (r - 1) % n                   # rank r plays rank r-1 of tree 1
        p = t1[role]
        t2 = np.where(p < 0, -1, (p + 1) % n)
    return t1, t2


def _heights(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Height (leaves 0) and depth (root 0) of every node."""
    n = len(parent)
    depth = np.zeros(n, dtype=np.int64)
    up = parent.copy()
    while (up >= 0).any():  # every node climbs one level per pass
        depth += up >= 0
        up = np.where(up >= 0, parent[up], -1)
        if depth.max(initial=0) > n:
            raise ValueError("parent array has a cycle")
    height = np.zeros(n, dtype=np.int64)
    for d in range(int(depth.max(initial=0)), 0, -1):  # deepest level first
        r = np.flatnonzero(depth == d)
        np.maximum.at(height, parent[r], height[r] + 1)
    return height, depth


def dbtree(nranks: int, *, pipeline: int = 1, abstract: bool = False) -> Schedule:
    """Double-binary-tree all-reduce (see the module docstring).

    Chunk c of tree t is reduced up in step ``c + height(node)`` (a node
    sends once all its children have) and broadcast down from the root in
    step ``c + H + depth(sender)``, H the tree's height; both trees run at
    the same time on their own half of the vector.
    """
    algo = "dbtree"
    n = check_ranks(nranks, algo)
    if not isinstance(pipeline, (int, np.integer)) or isinstance(pipeline, bool) or pipeline < 1:
        raise ValueError(f"{algo}: pipeline must be a positive integer, not {pipeline!r}")
    K = int(pipeline)
    b = ScheduleBuilder(algo, Collective.ALLREDUCE, n, abstract=abstract)
    for t, parent in enumerate(double_binary_tree(n)):
        height, depth = _heights(parent)
        H = int(height.max())
        kids = np.flatnonzero(parent >= 0)
        for c in range(K):
            chunk = t * K + c
            col = np.full((len(kids), 1), chunk, dtype=np.int64)
            if abstract:
                b.add_rows(Row.TRANSFER_REDUCE, c + height[kids], kids, parent[kids], 1, channel=t)
                b.add_rows(Row.TRANSFER, c + H + depth[parent[kids]], parent[kids], kids, 1, channel=t)
            else:
                b.add_rows(Row.TRANSFER_REDUCE, c + height[kids], kids, parent[kids], 1, col.ravel(), channel=t)
                b.add_rows(Row.TRANSFER, c + H + depth[parent[kids]], parent[kids], kids, 1, col.ravel(), channel=t)
    size = 2 * K
    return b.build(size_chunks=size, in_chunks=0, out_chunks=size)

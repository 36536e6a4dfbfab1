"""Hierarchical in-network aggregation (EPIC's IncTree view).

Ranks are ``servers x gpus_per_server``; GPU g of every server owns *shard g*
of the vector and sits on *rail g*. The vector is cut into one block per
rank and shard g is the blocks of rail g's ranks, so a reduce-scatter leaves
every rank its own block.

All-reduce: (1) reduce-scatter inside each server over the scale-up links
(GPU j sends shard i to GPU i); (2) every GPU sends its shard up its rail's
switch tree, where each switch is a node of the schedule that adds its
children's contributions (first child overwrites, the rest reduce, in one
step); (3) the root switch sends the sum back down; (4) all-gather inside
each server. A rail's tree is one switch, or, with ``hosts_per_leaf``,
leaf switches under one spine (a two-tier Clos).

The other collectives are derived the way EPIC derives them: Reduce sends
the result down only towards the root's server and gathers it on the root;
Broadcast goes from the root's server up to each rail's top switch and down
to everyone; ReduceScatter sends every block down only to its owner;
AllGather is one Broadcast per rank on the same trees (switches collect
blocks instead of adding them); Barrier all-reduces a one-chunk token through
GPU 0 of every server.
"""

from __future__ import annotations

import numpy as np

from inagg.host.schedules.common import check_int, check_ranks
from inagg.host.schedules.ir import Buffer, Collective, Row, Schedule, ScheduleBuilder

__all__ = ["ina", "rail_trees"]

_COLLECTIVES = (Collective.ALLREDUCE, Collective.REDUCE, Collective.BROADCAST, Collective.REDUCE_SCATTER,
                Collective.ALLGATHER, Collective.BARRIER)


def rail_trees(servers: int, gpus: int, hosts_per_leaf: int | None):
    """Switch trees of every rail.

    Returns ``(parent, roles)``: ``parent`` maps every tree member (the rank
    ids ``0..n-1`` and switch ids ``n..``) to its parent (-1 for a root, and
    for ranks not in any tree); ``roles`` names each switch:
    ``("rail", g)``, ``("leaf", g, l)`` or ``("spine", g)``.
    """
    n = servers * gpus
    roles: list[tuple] = []
    parent: dict[int, int] = {}
    for g in range(gpus):
        members = [s * gpus + g for s in range(servers)]
        if hosts_per_leaf is None or servers <= hosts_per_leaf:
            sw = n + len(roles)
            roles.append(("rail", g))
            parent[sw] = -1
            for m in members:
                parent[m] = sw
            continue
        spine = n + len(roles)
        roles.append(("spine", g))
        parent[spine] = -1
        for l in range(0, servers, hosts_per_leaf):
            leaf = n + len(roles)
            roles.append(("leaf", g, l // hosts_per_leaf))
            parent[leaf] = spine
            for m in members[l:l + hosts_per_leaf]:
                parent[m] = leaf
    out = np.full(n + len(roles), -1, dtype=np.int64)
    for k, v in parent.items():
        out[k] = v
    return out, roles


def ina(nranks: int, *, gpus_per_server: int = 1, hosts_per_leaf: int | None = None,
        collective=Collective.ALLREDUCE, root: int = 0, chunks_per_block: int = 1,
        placement=None, abstract: bool = False) -> Schedule:
    """Hierarchical in-network collective (see the module docstring).

    Every step is emitted for all ranks (or all children of a switch) at
    once; an ``abstract`` schedule has the counts without the chunk indices.
    """
    algo = "ina"
    n = check_ranks(nranks, algo)
    coll = Collective.parse(collective)
    if coll not in _COLLECTIVES:
        raise ValueError(f"ina implements {', '.join(c.value for c in _COLLECTIVES)}, not {coll.value}")
    G = check_int(gpus_per_server, "ina: gpus_per_server")
    if G < 1 or n % G:
        raise ValueError(f"ina: {n} ranks are not a whole number of servers of {gpus_per_server} GPUs")
    if hosts_per_leaf is not None and check_int(hosts_per_leaf, "ina: hosts_per_leaf") < 1:
        raise ValueError(f"ina: hosts_per_leaf must be positive, not {hosts_per_leaf}")
    if not 0 <= check_int(root, "ina: root") < n:
        raise ValueError(f"ina: root must be a rank in 0..{n - 1}, not {root}")
    root = int(root)
    S = n // G
    k = check_int(chunks_per_block, "ina: chunks_per_block")
    if k < 1:
        raise ValueError(f"ina: chunks_per_block must be positive, not {chunks_per_block}")
    parent, roles = rail_trees(S, G, hosts_per_leaf)
    W = len(roles)
    b = ScheduleBuilder(algo, coll, n, abstract=abstract)
    ranks = np.arange(n)
    server, gpu = ranks // G, ranks % G
    lane = np.arange(k)

    def blocks_of(rs) -> np.ndarray:
        rs = np.atleast_1d(rs)
        return (rs[:, None] * k + lane).reshape(-1)

    # shard g: the chunks of rail g's ranks
    shard = ((np.arange(S)[None, :] * G + np.arange(G)[:, None])[:, :, None] * k + lane).reshape(G, S * k)
    size = n * k

    if coll is Collective.BARRIER:
        return _barrier(b, n, G, S, parent, roles, placement)

    depth = _depths(parent)
    H = int(depth[:n].max())  # hops from a rank to its rail's top switch
    switches = np.arange(n, n + W)
    rail = np.concatenate([gpu, [r[1] for r in roles]]).astype(np.int64)
    below = _ranks_below(parent, n)
    rs = int(server[root]) * G  # first rank of the root's server
    # tree nodes above (or at) GPU g of the root's server: where a reduce or a broadcast passes
    root_path = np.zeros(n + W, dtype=bool)
    for g in range(G):
        x = rs + g
        while x >= 0:
            root_path[x] = True
            x = parent[x]

    def buf(x):
        return np.where(x < n, Buffer.OUTPUT, Buffer.SCRATCH)

    def rows(kind, step, src, dst, count, chunks, **bufs) -> None:
        """Rows with ``count`` chunks each; ``chunks()`` lists them (only a concrete schedule asks)."""
        if len(src):
            b.add_rows(kind, step, src, dst, count, None if abstract else chunks(), **bufs)

    def intra(step: int, a, c, owner, reduce: bool) -> None:
        """One scale-up step: a[i] sends shard owner[i] to c[i]."""
        rows(Row.TRANSFER_REDUCE if reduce else Row.TRANSFER, step, a, c, S * k, lambda: shard[owner].reshape(-1))

    # every (rank, other GPU of its server) pair
    pr = np.repeat(ranks, G)
    pi = np.tile(np.arange(G), n)
    keep = pi != gpu[pr]
    pr, pi = pr[keep], pi[keep]
    peer = server[pr] * G + pi
    step = 0
    if coll in (Collective.ALLREDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER) and G > 1:
        # (1) intra-server reduce-scatter: GPU j sends shard i to GPU i
        intra(step, pr, peer, pi, True)
        step += 1
    if coll is Collective.BROADCAST and G > 1:
        # the root hands shard g to GPU g of its server, which takes it up rail g
        g = np.flatnonzero(rs + np.arange(G) != root)
        intra(step, np.full(len(g), root), rs + g, g, False)
        step += 1

    # (2) up the trees
    for lvl in range(H, 0, -1):
        for sw in switches:
            kids = np.flatnonzero((parent == sw) & (depth == lvl))
            g = int(rail[sw])
            if coll is Collective.BROADCAST:
                kids = kids[root_path[kids]]
            if coll is Collective.ALLGATHER:   # switches collect distinct blocks
                kind, count = Row.TRANSFER, below[kids] * k
                chunks = lambda kids=kids: blocks_of(np.concatenate([_below(parent, x, n) for x in kids]))
            else:
                # broadcast forwards; otherwise the first child overwrites and the others add
                kind = np.full(len(kids), Row.TRANSFER if coll is Collective.BROADCAST else Row.TRANSFER_REDUCE)
                kind[:1] = Row.TRANSFER
                count = S * k
                chunks = lambda kids=kids, g=g: np.tile(shard[g], len(kids))
            rows(kind, step + H - lvl, kids, sw, count, chunks, src_buf=buf(kids), dst_buf=Buffer.SCRATCH)
    step += H

    # (3) down the trees
    for sw in switches:
        g = int(rail[sw])
        kids = np.flatnonzero(parent == sw)
        if coll is Collective.REDUCE:
            kids = kids[root_path[kids]]
        elif coll is Collective.BROADCAST:
            kids = kids[~root_path[kids]]
        if coll is Collective.REDUCE_SCATTER:
            count = below[kids] * k
            chunks = lambda kids=kids: blocks_of(np.concatenate([_below(parent, x, n) for x in kids]))
        elif coll is Collective.ALLGATHER:
            count = S * k - below[kids] * k
            kids, count = kids[count > 0], count[count > 0]
            chunks = lambda kids=kids, g=g: np.concatenate(
                [np.setdiff1d(shard[g], blocks_of(_below(parent, x, n))) for x in kids])
        else:
            count = S * k
            chunks = lambda kids=kids, g=g: np.tile(shard[g], len(kids))
        rows(Row.TRANSFER, step + int(depth[sw]), np.full(len(kids), sw), kids, count, chunks,
             src_buf=Buffer.SCRATCH, dst_buf=buf(kids))
    step += H

    # (4) inside the servers
    if G > 1:
        if coll in (Collective.ALLREDUCE, Collective.ALLGATHER):
            intra(step, pr, peer, gpu[pr], False)
        elif coll is Collective.BROADCAST:
            ok = peer != root
            intra(step, pr[ok], peer[ok], gpu[pr[ok]], False)
        elif coll is Collective.REDUCE:
            g = np.flatnonzero(rs + np.arange(G) != root)
            intra(step, rs + g, np.full(len(g), root), g, False)
    meta = dict(roles=roles, servers=S, gpus_per_server=G)
    return b.build(size_chunks=size, in_chunks=0, out_chunks=size, nswitches=W, switch_scratch_chunks=size,
                   root=root if coll in (Collective.REDUCE, Collective.BROADCAST) else None, meta=meta,
                   placement=placement)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Hops from every tree node to its root (every node climbs one level per pass)."""
    depth = np.zeros(len(parent), dtype=np.int64)
    up = parent.copy()
    while (up >= 0).any():
        depth += up >= 0
        up = np.where(up >= 0, parent[up], -1)
    return depth


def _ranks_below(parent: np.ndarray, n: int) -> np.ndarray:
    """How many ranks every tree node has in its subtree (a rank: itself)."""
    below = np.zeros(len(parent), dtype=np.int64)
    x = np.arange(n)
    while len(x):
        np.add.at(below, x, 1)
        x = parent[x]
        x = x[x >= 0]
    return below


def _below(parent: np.ndarray, x: int, n: int) -> np.ndarray:
    """Ranks in the subtree of tree node x."""
    if x < n:
        return np.array([x])
    kids = np.flatnonzero(parent == x)
    if not len(kids):
        return np.empty(0, dtype=np.int64)
    return np.concatenate([_below(parent, int(c), n) for c in kids])


def _buf(x: int, n: int) -> Buffer:
    return Buffer.OUTPUT if x < n else Buffer.SCRATCH


def _barrier(b: ScheduleBuilder, n: int, G: int, S: int, parent, roles, placement) -> Schedule:
    """A token: reduced into GPU 0 of each server, up and down rail 0's tree, and back out."""
    ranks = np.arange(n)
    lead = (ranks // G) * G
    step = 0
    others = ranks[ranks != lead]
    if len(others):
        b.transfer(step, others, lead[others], np.zeros((len(others), 1), np.int64), reduce=True)
        step += 1
    depth = _depths(parent)
    W = len(roles)
    members = [x for x in range(n + W) if (x < n and x % G == 0) or (x >= n and roles[x - n][1] == 0)]
    H = int(max(depth[x] for x in members if x < n))
    token = np.zeros((1, 1), np.int64)
    for lvl in range(H, 0, -1):
        for sw in {int(parent[x]) for x in members if depth[x] == lvl}:
            kids = [x for x in members if parent[x] == sw]
            for i, x in enumerate(kids):
                b.transfer(step + H - lvl, [x], [sw], token, reduce=i > 0, src_buf=_buf(x, n),
                           dst_buf=Buffer.SCRATCH)
    step += H
    for x in members:
        if parent[x] >= 0:
            b.transfer(step + int(depth[parent[x]]), [parent[x]], [x], token, src_buf=Buffer.SCRATCH,
                       dst_buf=_buf(x, n))
    step += H
    if len(others):
        b.transfer(step, lead[others], others, np.zeros((len(others), 1), np.int64))
    return b.build(size_chunks=1, in_chunks=0, out_chunks=1, nswitches=W, switch_scratch_chunks=1,
                   meta=dict(roles=roles, servers=S, gpus_per_server=G), placement=placement)

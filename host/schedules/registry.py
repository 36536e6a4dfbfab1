"""Algorithm names (the CLI's ``--algo``) and how a topology fills in their parameters."""

from __future__ import annotations

import numpy as np

from inagg.host.schedules import allreduce, alltoall, bruck, dbtree, ina
from inagg.host.schedules.ir import Collective, Schedule
from inagg.host.schedules.topology import Topology

__all__ = ["ALGORITHMS", "CONCRETE_ONLY", "generate", "applicable"]

#: name -> (collectives it implements, one-line description)
ALGORITHMS: dict[str, tuple[tuple[Collective, ...], str]] = {
    "ring": ((Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER),
             "ring reduce-scatter + all-gather, one ring per direction"),
    "dbtree": ((Collective.ALLREDUCE,), "NCCL double binary tree (tree 2 mirrored / shifted)"),
    "rd": ((Collective.ALLREDUCE,), "recursive doubling, whole vector per step"),
    "rabenseifner": ((Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER),
                     "recursive halving + doubling; torus-tuned on a torus"),
    "bruck": ((Collective.ALLGATHER, Collective.ALLTOALL), "Bruck, ceil(log2 n) steps"),
    "swing-lat": ((Collective.ALLREDUCE,), "Swing, latency-optimal"),
    "swing-bw": ((Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER),
                 "Swing, bandwidth-optimal, 2D plain + mirrored collectives"),
    "trivance-lat": ((Collective.ALLREDUCE,), "Trivance, latency-optimal (joint reduction of +/-3^k)"),
    "trivance-bw": ((Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER),
                    "Trivance, bandwidth-optimal"),
    "ina": ((Collective.ALLREDUCE, Collective.REDUCE, Collective.BROADCAST, Collective.REDUCE_SCATTER,
             Collective.ALLGATHER, Collective.BARRIER), "hierarchical in-network aggregation on switch trees"),
    "direct": ((Collective.ALLTOALL, Collective.ALLTOALLV), "direct all-to-all: everyone to everyone at once"),
    "fast": ((Collective.ALLTOALL, Collective.ALLTOALLV), "FAST: intra-server balancing + Birkhoff stages"),
}


#: the algorithms that have no abstract form (an all-to-all plan is its chunk matrix)
CONCRETE_ONLY = frozenset({"direct", "fast"})

#: the generators with GPU ranks only: name -> (function, whether it takes a multi-dimensional
#: torus's ``dims``); those that implement several collectives take ``collective``
_ENDPOINT = {
    "ring": (allreduce.ring, False),
    "dbtree": (dbtree.dbtree, False),
    "rd": (allreduce.recursive_doubling, True),
    "rabenseifner": (allreduce.rabenseifner, True),
    "bruck": (bruck.bruck, False),
    "swing-lat": (allreduce.swing_latency, True),
    "swing-bw": (allreduce.swing_bandwidth, True),
    "trivance-lat": (allreduce.trivance_latency, True),
    "trivance-bw": (allreduce.trivance_bandwidth, True),
}


def _ranks(ranks, topo: Topology | None, algo: str) -> int:
    if topo is not None:
        if ranks is not None and int(ranks) != topo.nhosts:
            raise ValueError(f"{algo}: --ranks {ranks} does not match {topo.spec}, which has {topo.nhosts} ranks")
        return topo.nhosts
    if ranks is None:
        raise ValueError(f"{algo}: give a number of ranks or a topology")
    return ranks


def generate(algo: str, ranks: int | None = None, *, topo: Topology | None = None,
             collective: Collective | str = Collective.ALLREDUCE, abstract: bool = False,
             counts: np.ndarray | None = None, root: int = 0, **options) -> Schedule:
    """Make the schedule of algorithm ``algo`` (a key of :data:`ALGORITHMS`).

    The topology, when given, fixes the rank count and fills in what the
    algorithm needs from it: torus dimensions (Rabenseifner, Swing, Trivance),
    servers and rails and switch placement (``ina``, ``fast``). ``counts`` is
    the chunk matrix of an all-to-allv (default: one chunk per pair).
    ``options`` go to the generator (``chunks_per_block``, ``pipeline``, ...).
    """
    if not isinstance(algo, str):
        raise TypeError(f"algorithm name must be a string, not {algo!r}")
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; known: {', '.join(ALGORITHMS)}")
    coll = Collective.parse(collective)
    allowed, _ = ALGORITHMS[algo]
    if coll not in allowed:
        raise ValueError(f"{algo} does not implement {coll.value}; it implements "
                         f"{', '.join(c.value for c in allowed)}")
    n = _ranks(ranks, topo, algo)
    if algo in _ENDPOINT:
        make, tori = _ENDPOINT[algo]
        if len(allowed) > 1:
            options["collective"] = coll
        if tori and topo is not None and topo.kind == "torus" and len(topo.dims) > 1:
            options["dims"] = topo.dims
        return make(n, abstract=abstract, **options)
    if algo == "ina":
        if topo is None:
            g = options.pop("gpus_per_server", 1)
            return ina.ina(n, gpus_per_server=g, collective=coll, root=root, abstract=abstract, **options)
        if topo.kind == "multirail":
            S, G = topo.shape
            s = ina.ina(n, gpus_per_server=G, collective=coll, root=root, abstract=abstract, **options)
        elif topo.kind == "clos":
            L, H, _ = topo.shape
            s = ina.ina(n, gpus_per_server=1, hosts_per_leaf=H if L > 1 else None, collective=coll, root=root,
                        abstract=abstract, **options)
        else:
            raise ValueError(f"ina needs switches to aggregate in: a clos or multirail topology, not {topo.spec}")
        s.placement = np.array([topo.switch_node(r) for r in s.meta["roles"]], dtype=np.int64)
        return s
    # all-to-all
    if counts is None:
        counts = np.ones((n, n), dtype=np.int64)
    counts = np.asarray(counts)
    if counts.shape != (n, n):
        raise ValueError(f"{algo}: counts must be {n}x{n}, not {counts.shape}")
    if algo == "direct":
        return alltoall.direct(counts)
    g = topo.shape[1] if topo is not None and topo.kind == "multirail" else options.pop("gpus_per_server", 1)
    return alltoall.fast(counts, g)


def applicable(topo: Topology, collective: Collective | str = Collective.ALLREDUCE) -> list[str]:
    """Algorithms that implement ``collective`` and accept ``topo`` (tried, not guessed)."""
    coll = Collective.parse(collective)
    out = []
    for name, (colls, _) in ALGORITHMS.items():
        if coll not in colls:
            continue
        try:
            generate(name, topo=topo, collective=coll, abstract=name not in CONCRETE_ONLY)
        except ValueError:
            continue
        out.append(name)
    return out

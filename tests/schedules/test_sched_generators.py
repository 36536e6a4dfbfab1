"""Every generator, run by the executor over rank counts, sizes and dtypes, computes its collective."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from inagg.host.schedules import Collective, ScheduleError, check, generate
from inagg.host.schedules import allreduce as A
from inagg.host.schedules.common import Pattern, tree_traffic
from inagg.host.schedules.dbtree import binary_tree, double_binary_tree

# powers of 2 and 3, odd counts, the primes 5, 7, 13, and a few composites
RANKS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 16, 25, 26, 27, 32]
DTYPES = [np.int32, np.int64, np.uint16, np.float16, np.float32, np.float64]
HALVES = [Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER]


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("algo", ["ring", "rabenseifner", "swing-bw", "trivance-bw"])
@pytest.mark.parametrize("coll", HALVES, ids=lambda c: c.value)
def test_bandwidth_family(algo, coll, n):
    check(generate(algo, n, collective=coll), dtype=np.float32, chunk_elems=2)


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("algo", ["rd", "swing-lat", "trivance-lat", "dbtree"])
def test_latency_family(algo, n):
    check(generate(algo, n), dtype=np.int64, chunk_elems=3)


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.ALLTOALL], ids=lambda c: c.value)
def test_bruck(coll, n):
    check(generate("bruck", n, collective=coll), dtype=np.int32)


@settings(max_examples=40)
@given(algo=st.sampled_from(["ring", "rabenseifner", "swing-bw", "trivance-bw", "rd", "swing-lat",
                             "trivance-lat", "dbtree", "bruck"]),
       n=st.integers(1, 40), elems=st.integers(1, 5), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 3),
       per_block=st.integers(1, 3))
def test_any_size_dtype(algo, n, elems, dtype, seed, per_block):
    opts = {}
    if algo in ("ring", "rabenseifner", "swing-bw", "trivance-bw", "bruck"):
        opts["chunks_per_block"] = per_block
    elif algo == "dbtree":
        opts["pipeline"] = per_block
    else:
        opts["chunks"] = per_block
    coll = Collective.ALLGATHER if algo == "bruck" else Collective.ALLREDUCE
    check(generate(algo, n, collective=coll, **opts), dtype=dtype, chunk_elems=elems, seed=seed)


TORI = [(2, 2), (4, 4), (2, 8), (8, 4), (4, 4, 2), (2, 2, 2, 2)]


@pytest.mark.parametrize("dims", TORI, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("algo", [A.rabenseifner, A.swing_bandwidth, A.swing_latency, A.recursive_doubling])
def test_torus_power_of_two(algo, dims):
    check(algo(int(np.prod(dims)), dims=dims), dtype=np.float64)


@pytest.mark.parametrize("dims", [(6, 4), (6, 6), (10, 2)], ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("coll", HALVES, ids=lambda c: c.value)
def test_swing_torus_even_non_power(dims, coll):
    check(A.swing_bandwidth(int(np.prod(dims)), dims=dims, collective=coll))


@pytest.mark.parametrize("dims", [(3, 3), (9, 3), (3, 3, 3)], ids=lambda d: "x".join(map(str, d)))
def test_trivance_torus(dims):
    p = int(np.prod(dims))
    check(A.trivance_latency(p, dims=dims))
    check(A.trivance_bandwidth(p, dims=dims))


def test_step_counts():
    # the counts the papers give: ring 2(n-1); rd and swing-lat log2 n; swing-bw 2 log2 n;
    # trivance log3 n and 2 log3 n
    assert A.ring(16).num_steps == 30
    assert A.recursive_doubling(16).num_steps == 4
    assert A.swing_latency(16).num_steps == 4
    assert A.swing_bandwidth(16).num_steps == 8
    assert A.trivance_latency(27).num_steps == 3
    assert A.trivance_bandwidth(27).num_steps == 6
    # non-powers: folding costs two steps; Trivance-bw never folds
    assert A.recursive_doubling(12).num_steps == 3 + 2
    assert A.trivance_bandwidth(10).num_steps == 2 * 3
    # Trivance-lat keeps ceil(log3 n) where the piece plan exists, else one more step
    assert A.trivance_latency(10).num_steps == 3
    assert A.trivance_latency(25).num_steps == 4


def test_bandwidth_optimal_volume():
    # every rank sends (n-1)/n of the vector per phase: the lower bound
    for algo in ("swing-bw", "trivance-bw", "rabenseifner", "ring"):
        for n in (8, 9, 12):
            s = generate(algo, n)
            if s.meta.get("folded"):
                continue
            sent = s.bytes_sent(1.0)[:n]
            assert np.allclose(sent, 2 * (n - 1) / n), (algo, n, sent)


def test_swing_peer_formula():
    p = 16
    r = np.arange(p)
    assert [A.swing_rho(s) for s in range(5)] == [1, -1, 3, -5, 11]
    for s in range(4):
        q = A.swing_peer(r, s, p)
        assert (A.swing_peer(q, s, p) == r).all()          # pairs are mutual
        assert (np.where(r % 2 == 0, (r + A.swing_rho(s)) % p, (r - A.swing_rho(s)) % p) == q).all()


@pytest.mark.parametrize("n", list(range(1, 40)))
def test_binary_trees_are_trees(n):
    for parent in double_binary_tree(n):
        assert (parent < 0).sum() == 1
        for r in range(n):  # every rank reaches the root
            x, hops = r, 0
            while parent[x] >= 0:
                x, hops = parent[x], hops + 1
                assert hops <= n
        kids = np.bincount(parent[parent >= 0], minlength=n)
        assert kids.max() <= 2


def test_double_tree_shape():
    t1 = binary_tree(8)
    assert t1[0] == -1 and t1[4] == 0 and t1[2] == 4 and t1[6] == 4
    m1, m2 = double_binary_tree(8)
    assert (m2 == np.where(m1[7 - np.arange(8)] < 0, -1, 7 - m1[7 - np.arange(8)])).all()  # mirrored
    s1, s2 = double_binary_tree(7)
    assert s2[(0 + 1) % 7] == -1  # shifted: rank 1 is tree 2's root


def test_abstract_matches_concrete():
    for algo in ("ring", "rabenseifner", "swing-bw", "trivance-bw", "rd", "swing-lat", "dbtree", "bruck"):
        for n in (6, 8, 9):
            coll = Collective.ALLGATHER if algo == "bruck" else Collective.ALLREDUCE
            c = generate(algo, n, collective=coll)
            a = generate(algo, n, collective=coll, abstract=True)
            x, y = c.is_transfer, a.is_transfer
            key = lambda s, m: sorted(zip(s.step[m], s.src[m], s.dst[m], s.count[m]))
            assert key(c, x) == key(a, y), (algo, n)


@pytest.mark.parametrize("algo,n,dims", [("swing-bw", 11, None), ("swing-bw", 24, (4, 6)), ("swing-bw", 16, (2, 4, 2)),
                                         ("swing-bw", 6, (1, 6)), ("rabenseifner", 13, None),
                                         ("rabenseifner", 32, (4, 8)), ("trivance-bw", 15, (3, 5)),
                                         ("trivance-bw", 16, (4, 4))])
def test_abstract_trees_match_concrete(algo, n, dims):
    # the abstract schedules count blocks per residue class of the pattern's symmetry (and convolve
    # when folding makes some blocks bigger); the concrete ones route every block
    opts = {} if dims is None else {"dims": dims}
    for coll in ("allreduce", "reduce_scatter", "allgather"):
        c = generate(algo, n, collective=coll, **opts)
        a = generate(algo, n, collective=coll, abstract=True, **opts)
        key = lambda s: sorted(zip(s.step, s.src, s.dst, s.count, s.channel, s.kind))
        assert key(c) == key(a), (algo, n, dims, coll)


def test_tree_traffic_checks_the_claimed_symmetry():
    # a 6-node pattern where only node 0 talks: it does not commute with moving every node by 2
    to = np.full((6, 1), -1)
    to[0, 0] = 1
    pat = Pattern(6, [to], period=(2,))
    assert not pat.symmetric()
    with pytest.raises(ValueError, match="does not commute"):
        tree_traffic(pat, np.ones(6, dtype=np.int64))
    with pytest.raises(ValueError, match="periods dividing"):
        Pattern(6, [to], period=(4,))


def test_executor_catches_a_broken_schedule():
    s = A.ring(5)
    s.count = s.count.copy()
    # drop the last all-gather step: some rank misses a block
    keep = s.step != s.step.max()
    from inagg.host.schedules.ir import Schedule
    cols = {k: getattr(s, k)[keep] for k in ("kind", "step", "src", "dst", "channel", "src_buf", "dst_buf", "count")}
    ptr = np.zeros(keep.sum() + 1, dtype=np.int64)
    np.cumsum(cols["count"], out=ptr[1:])
    flat = np.concatenate([np.arange(s.ptr[i], s.ptr[i + 1]) for i in np.flatnonzero(keep)])
    broken = Schedule(name="broken", collective=s.collective, nranks=5, size_chunks=s.size_chunks, in_chunks=0,
                      out_chunks=s.out_chunks, ptr=ptr, src_idx=s.src_idx[flat], dst_idx=s.dst_idx[flat], **cols)
    with pytest.raises(ScheduleError, match="rank"):
        check(broken)

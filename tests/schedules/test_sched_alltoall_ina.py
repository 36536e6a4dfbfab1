"""FAST, the direct all-to-all and hierarchical in-network aggregation."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from inagg.host.schedules import Collective, check, evaluate, generate
from inagg.host.schedules import alltoall as F
from inagg.host.schedules import ina
from inagg.host.schedules import topology as T


@settings(max_examples=25)
@given(servers=st.integers(1, 5), gpus=st.integers(1, 4), hi=st.integers(1, 4), seed=st.integers(0, 100))
def test_fast_and_direct_compute_alltoallv(servers, gpus, hi, seed):
    n = servers * gpus
    counts = np.random.default_rng(seed).integers(0, hi + 1, size=(n, n))
    if not counts.any():
        counts[0, -1] = 1
    check(F.direct(counts))
    s = F.fast(counts, gpus)
    check(s)
    assert s.meta["stage_chunks"] == s.meta["lower_bound_chunks"]


@pytest.mark.parametrize("servers,gpus", [(4, 8), (8, 8), (12, 2), (40, 8)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_makespan_is_the_lower_bound(servers, gpus, seed):
    m = F.zipf_matrix(servers * gpus, 0.8, seed=seed)
    plan = F.fast_plan(m, gpus)
    assert int(plan.weights.sum()) == plan.lower_bound_bytes
    assert plan.makespan(50e9) == plan.lower_bound(50e9)
    b = plan.server_bytes
    assert plan.lower_bound_bytes == max(b.sum(axis=0).max(), b.sum(axis=1).max())
    assert (np.sort(plan.perms, axis=1) == np.arange(servers)).all() and (plan.weights > 0).all()  # no incast
    covered = np.zeros_like(b)
    np.add.at(covered, (np.arange(servers)[None, :], plan.perms), plan.weights[:, None])
    assert (covered >= b).all()  # every byte has a stage


@pytest.mark.parametrize("method", ["repair", "max-weight"])
def test_birkhoff_reconstructs_the_padded_matrix(method):
    b = np.array([[0, 5, 1], [2, 0, 2], [3, 1, 0]])
    perms, weights, L = F.birkhoff(b, method)
    assert L == 6 and weights.sum() == L
    acc = np.zeros_like(b)
    for perm, w in zip(perms, weights):
        acc[np.arange(3), perm] += w
    assert (acc >= b).all() and (acc.sum(axis=0) == L).all() and (acc.sum(axis=1) == L).all()


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_birkhoff_on_random_matrices(data):
    # small entries: many ties (several matched entries run out in one stage) and zero rows
    n = data.draw(st.integers(1, 7))
    b = np.array(data.draw(st.lists(st.lists(st.integers(0, 3), min_size=n, max_size=n), min_size=n, max_size=n)))
    L = max(b.sum(axis=0).max(), b.sum(axis=1).max())
    for method in ("repair", "max-weight"):
        perms, weights, lb = F.birkhoff(b, method)
        assert lb == L and weights.sum() == L and (weights > 0).all()
        assert perms.shape == (len(weights), n) and (np.sort(perms, axis=1) == np.arange(n)).all()
        acc = np.zeros_like(b)
        np.add.at(acc, (np.arange(n)[None, :], perms), weights[:, None])
        assert (acc >= b).all() and (acc.sum(axis=0) == L).all() and (acc.sum(axis=1) == L).all()


def test_max_weight_takes_fewer_stages_on_large_matrices():
    b = F.server_matrix(F.zipf_matrix(16 * 2, 0.8, seed=0), 2)
    repaired, _, _ = F.birkhoff(b, "repair")
    weighted, _, _ = F.birkhoff(b, "max-weight")
    assert len(weighted) < 0.8 * len(repaired)
    assert len(F.fast_plan(F.zipf_matrix(32, 0.8), 2).perms) == len(weighted)  # auto picks it at 16 servers


def test_fast_input_errors():
    with pytest.raises(ValueError, match="square"):
        F.fast_plan(np.ones((2, 3), dtype=int), 1)
    with pytest.raises(TypeError, match="integers"):
        F.fast_plan(np.ones((2, 2)), 1)
    with pytest.raises(ValueError, match="whole number of servers"):
        F.fast_plan(np.ones((6, 6), dtype=int), 4)
    with pytest.raises(TypeError, match=r"^gpus_per_server must be an integer, not 2\.0$"):
        F.fast_plan(np.ones((6, 6), dtype=int), 2.0)  # not silently truncated
    with pytest.raises(ValueError, match="must be non-negative"):
        F.fast_plan(-np.ones((2, 2), dtype=int), 1)
    with pytest.raises(ValueError, match="method must be 'auto', 'repair' or 'max-weight', not 'lp'"):
        F.birkhoff(np.ones((2, 2), dtype=int), "lp")
    with pytest.raises(ValueError, match="too large for exact planning"):
        F.birkhoff(np.array([[0, 2 ** 52], [2 ** 52, 0]]), "max-weight")
    assert F.birkhoff(np.array([[0, 2 ** 52], [2 ** 52, 0]]), "repair")[2] == 2 ** 52
    # int64 sums in the compiled kernels: one byte past 2^63 - 1 is refused, not wrapped
    edge = np.array([[0, 2 ** 62], [2 ** 62 - 1, 0]])
    assert F.fast_plan(edge, 1).lower_bound_bytes == 2 ** 62
    for method in ("repair", "max-weight"):
        with pytest.raises(ValueError, match=r"^traffic matrix too large: its entries add up past 2\^63 - 1$"):
            F.fast_plan(edge + np.eye(2, dtype=np.int64)[::-1], 1, method)
    with pytest.raises(ValueError, match=r"^traffic matrix too large"):
        F.server_matrix(np.full((4, 4), 2 ** 59), 2)
    with pytest.raises(ValueError, match=r"^traffic matrix too large"):  # not wrapped to a negative int64
        F.fast_plan(np.array([[0, 2 ** 63], [0, 0]], dtype=np.uint64), 1)
    with pytest.raises(ValueError, match=r"^server matrix too large: its entries add up past 2\^63 - 1$"):
        F.birkhoff(np.array([[0, 2 ** 62, 2 ** 62], [0, 0, 0], [0, 0, 0]]), "repair")


COLLS = [Collective.ALLREDUCE, Collective.REDUCE, Collective.BROADCAST, Collective.REDUCE_SCATTER,
         Collective.ALLGATHER, Collective.BARRIER]


@pytest.mark.parametrize("servers,gpus,leaf", [(1, 1, None), (2, 1, None), (3, 2, None), (4, 4, None),
                                               (5, 2, 2), (7, 1, 3), (13, 1, 4)])
@pytest.mark.parametrize("coll", COLLS, ids=lambda c: c.value)
def test_ina_collectives(servers, gpus, leaf, coll):
    n = servers * gpus
    for root in {0, n - 1, n // 2}:
        check(ina.ina(n, gpus_per_server=gpus, hosts_per_leaf=leaf, collective=coll, root=root),
              dtype=np.float32)


def test_ina_parameter_errors():
    with pytest.raises(TypeError, match=r"^ina: gpus_per_server must be an integer, not 2\.0$"):
        ina.ina(4, gpus_per_server=2.0)
    with pytest.raises(TypeError, match=r"^ina: hosts_per_leaf must be an integer, not 1\.5$"):
        ina.ina(4, hosts_per_leaf=1.5)
    with pytest.raises(TypeError, match=r"^ina: root must be an integer, not True$"):
        ina.ina(4, collective=Collective.REDUCE, root=True)
    with pytest.raises(TypeError, match=r"^ina: chunks_per_block must be an integer, not '2'$"):
        ina.ina(4, chunks_per_block="2")


def test_ina_barrier_check_fails_without_the_way_back():
    s = ina.ina(4, gpus_per_server=2, collective=Collective.BARRIER)
    # keep only the upward half: nobody hears back
    keep = s.step <= 1
    from inagg.host.schedules.ir import Schedule
    cols = {k: getattr(s, k)[keep] for k in ("kind", "step", "src", "dst", "channel", "src_buf", "dst_buf", "count")}
    ptr = np.zeros(keep.sum() + 1, dtype=np.int64)
    np.cumsum(cols["count"], out=ptr[1:])
    half = Schedule(name="half", collective=Collective.BARRIER, nranks=4, size_chunks=1, in_chunks=0, out_chunks=1,
                    nswitches=s.nswitches, switch_scratch_chunks=1, ptr=ptr, src_idx=np.zeros(ptr[-1], int),
                    dst_idx=np.zeros(ptr[-1], int), **cols)
    from inagg.host.schedules import ScheduleError
    with pytest.raises(ScheduleError, match="barrier is incomplete"):
        check(half)


def test_ina_on_topologies():
    for spec in ("multirail:4x8", "clos:4x4:1", "clos:1x8:2"):
        topo = T.parse(spec)
        s = generate("ina", topo=topo)
        check(s)
        c = evaluate(s, topo, 1 << 20)
        assert c.xi == pytest.approx(1.0)
    # the GPU sends S/G up its rail: per rank on the NIC that is S/G, the in-network bound per NIC
    topo = T.parse("multirail:4x8")
    s = generate("ina", topo=topo)
    assert s.placement is not None and len(s.placement) == 8


@pytest.mark.parametrize("coll", ["allreduce", "reduce", "broadcast", "reduce_scatter", "allgather", "barrier"])
def test_ina_abstract_matches_concrete(coll):
    # the abstract schedule (counts only, what 65,536-rank costing uses) moves what the concrete one moves
    for n, gpus, leaf, root in [(8, 2, None, 3), (24, 4, 2, 13), (9, 1, 4, 8)]:
        kw = dict(gpus_per_server=gpus, hosts_per_leaf=leaf, collective=coll, root=root)
        c, a = ina.ina(n, **kw), ina.ina(n, abstract=True, **kw)
        key = lambda s: sorted(zip(s.step, s.kind, s.src, s.dst, s.count))
        assert not a.concrete and key(a) == key(c), (coll, n)

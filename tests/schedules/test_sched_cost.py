"""The cost model: congestion, Xi against Swing's analysis, step counts at n = 4096."""

import numpy as np
import pytest

from inagg.host.schedules import allreduce_lower_bound, evaluate, generate, ina_lower_bound
from inagg.host.schedules import allreduce as A
from inagg.host.schedules import topology as T


def _xi_series(D, K, delta):
    """Swing's closed form: sum over steps of congestion(step) / 2^(s+1), normalised."""
    num = sum(delta(s // D) / 2 ** (s + 1) for s in range(D * K))
    return num / sum(1 / 2 ** (s + 1) for s in range(D * K))


@pytest.mark.parametrize("dims", [(8, 8), (16, 16), (4, 4, 4), (8, 8, 8), (4, 4, 4, 4)],
                         ids=lambda d: "x".join(map(str, d)))
def test_xi_matches_the_analysis(dims):
    # on a finite torus the model must give exactly the series Swing's Table 2 sums
    p = int(np.prod(dims))
    D, K = len(dims), int(np.log2(dims[0]))
    topo = T.torus(*dims)
    sw = evaluate(A.swing_bandwidth(p, dims=dims, abstract=True), topo, 1 << 20).xi
    rb = evaluate(A.rabenseifner(p, dims=dims, abstract=True), topo, 1 << 20).xi
    assert sw == pytest.approx(_xi_series(D, K, lambda k: abs(A.swing_rho(k))), rel=1e-9)
    assert rb == pytest.approx(_xi_series(D, K, lambda k: 2 ** k), rel=1e-9)
    assert sw < rb


def test_ring_on_a_ring_is_congestion_free():
    c = evaluate(A.ring(16), T.parse("ring:16"), 1 << 20)
    assert c.xi == pytest.approx(1.0)
    assert c.steps == 30
    # byte term: 2 (n-1) steps of S/(2n) per direction at 50 GB/s
    assert c.byte_term_s == pytest.approx(30 * (1 << 20) / 32 / 50e9)


def test_congestion_is_counted():
    # recursive doubling's last step on a 16-ring: distance 8, 8 messages per link
    topo = T.parse("ring:16")
    c = evaluate(A.recursive_doubling(16), topo, 1600)
    per_step = [1, 2, 4, 8]
    assert c.byte_term_s == pytest.approx(sum(per_step) * 1600 / 50e9)


def test_clos_pins_spines_by_destination():
    topo = T.parse("clos:2x4:2")  # 2 spines
    ptr, links = topo.route(np.array([0, 1]), np.array([4, 6]))
    # host 0 -> host 4 (index 0 under leaf 1) uses spine 0; host 1 -> host 6 (index 2) spine 0 too
    assert list(np.diff(ptr)) == [4, 4]
    N, U = 8, 2  # hosts, spines (2 leaves)
    assert links[1] == 2 * N + 0 * U + 0 and links[5] == 2 * N + 0 * U + 0


def test_step_counts_on_a_ring():
    # the counts of the n = 4096 table; the bandwidth-optimal ones are checked at 1024
    # here (the same formula, 2 ceil(log)) and at 4096 by bench/schedules.py
    topo = T.parse("ring:4096")
    assert generate("rd", topo=topo, abstract=True).num_steps == 12
    assert generate("trivance-lat", topo=topo, abstract=True).num_steps == 8
    assert A.swing_bandwidth(1024, abstract=True).num_steps == 20
    assert A.trivance_bandwidth(1024, abstract=True).num_steps == 2 * 7
    # the ring at 4096 has 33 M rows; its count is checked where it is small and is 2(n-1)
    assert A.ring(512, abstract=True).num_steps == 2 * 511


def test_lower_bounds():
    assert allreduce_lower_bound(8, 1024) == 2 * 7 / 8 * 1024
    assert ina_lower_bound(8, 1024) == 1024
    topo = T.parse("multirail:4x4")
    c = evaluate(generate("ina", topo=topo), topo, 1 << 20)
    assert c.xi == pytest.approx(1.0)


def test_evaluate_input_errors():
    with pytest.raises(TypeError, match="needs a Schedule"):
        evaluate("ring", T.parse("ring:4"), 1)
    with pytest.raises(ValueError, match="non-negative"):
        evaluate(A.ring(4), T.parse("ring:4"), -1)
    s = generate("ina", 4)
    with pytest.raises(ValueError, match="no placement"):
        evaluate(s, T.parse("ring:4"), 1)


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "compiled"])
@pytest.mark.parametrize("spec", ["ring:7", "ring:8", "torus:4x6", "torus:3x4x2", "torus:1x5", "torus:16x2"])
def test_torus_step_cost_matches_the_routes(spec, compiled, monkeypatch):
    # the run-based loads (difference arrays, sparse-table maxima) against the link-by-link routes,
    # with a different alpha and beta on every link; numpy below COMPILED_TORUS_HOSTS, numba from it
    monkeypatch.setattr(T, "COMPILED_TORUS_HOSTS", 0 if compiled else 1 << 62)
    rng = np.random.default_rng(1)
    topo = T.parse(spec)
    topo.link_alpha = rng.uniform(1, 2, topo.nlinks)
    topo.link_beta = rng.uniform(1, 3, topo.nlinks)
    for _ in range(10):
        src, dst = rng.integers(0, topo.nhosts, (2, 40))
        src, dst = src[src != dst], dst[src != dst]
        w = rng.uniform(1, 10, len(src))
        fast = topo.step_cost(src, dst, w)
        ptr, links = topo.route(src, dst)
        who = np.repeat(np.arange(len(src)), np.diff(ptr))
        load = np.bincount(links, weights=w[who], minlength=topo.nlinks) * topo.link_beta
        wait = np.zeros(len(src))
        np.maximum.at(wait, who, load[links])
        first = np.bincount(links[ptr[:-1]], weights=w, minlength=topo.nlinks) * topo.link_beta
        assert fast.wait == pytest.approx(wait)
        assert fast.alpha_path == pytest.approx(np.bincount(who, weights=topo.link_alpha[links], minlength=len(src)))
        assert fast.byte_term == pytest.approx(load.max())
        assert fast.ideal_term == pytest.approx(first.max())


def test_compiled_torus_step_cost_refuses_bad_transfers(monkeypatch):
    # the kernel reads arrays unchecked, so it checks its input itself
    monkeypatch.setattr(T, "COMPILED_TORUS_HOSTS", 0)
    topo = T.parse("torus:4x4")
    with pytest.raises(ValueError, match="^a transfer's node is not on the torus$"):
        topo.step_cost([0, 3], [1, 16], [1.0, 1.0])
    with pytest.raises(ValueError, match="^a route needs two different nodes$"):
        topo.step_cost([0, 5], [1, 5], [1.0, 1.0])
    with pytest.raises(ValueError, match="^src, dst and nbytes must have one entry per transfer$"):
        topo.step_cost([0, 1], [1, 2], [1.0])


@pytest.mark.parametrize("n,spec", [(16, "ring:16"), (17, "ring:17"), (24, "torus:4x6")])
@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_ring_closed_form(n, spec, coll):
    # one round repeated 2(n-1) (or n-1) times costs what the whole ring costs
    topo = T.parse(spec)
    whole = evaluate(A.ring(n, collective=coll, abstract=True), topo, 1 << 20)
    one, rounds = A.ring_round(n, collective=coll)
    closed = evaluate(one, topo, 1 << 20, repeat=rounds)
    assert closed.steps == whole.steps
    for field in ("time_s", "xi", "byte_term_s", "latency_term_s", "bytes_per_rank"):
        assert getattr(closed, field) == pytest.approx(getattr(whole, field)), field
    with pytest.raises(ValueError, match="repeat must be a positive integer"):
        evaluate(one, topo, 1, repeat=0)


@pytest.mark.parametrize("servers,gpus", [(1, 4), (3, 1), (4, 8), (5, 3)])
def test_multirail_routes_match_the_path_rules(servers, gpus):
    # the vectorized routes against the rule for one path, on every pair of nodes that has a route
    topo = T.multirail(servers, gpus)
    pairs = []
    for a in range(topo.nnodes):
        for b in range(topo.nnodes):
            try:
                pairs.append((a, b, T._multirail_path(a, b, servers, gpus)))
            except ValueError:
                continue
    pairs = [p for p in pairs if p[0] != p[1]]
    ptr, links = topo.route(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    assert [list(links[ptr[i]:ptr[i + 1]]) for i in range(len(pairs))] == [p[2] for p in pairs]

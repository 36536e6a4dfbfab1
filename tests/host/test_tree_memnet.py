"""Trees of model switches over the memory network: every collective exactly as numpy's under faults on every
hop, or a clear error; EPIC's Modes II and III on trees."""

import os

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from inagg.host.controller import TreeController, plan_tree
from inagg.host.link import Faults
from inagg.host.memnet import TreeNetwork
from inagg.host.collectives import exponent, reference, tree_operations
from inagg.host.rc_worker import RcRetryError
from inagg.host.worker import ChunkTimeoutError, agreement_chunks, Timing
from inagg.models.job import Collective, Mode
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.models.tree import Tree, TreeCounter

_EXAMPLES = 400 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 30


def run_tree(spec, elements, *, collective="allreduce", root=0, window=2, faults=None, seed=0, tries=30):
    """Every rank's result of ``collective`` over ``elements`` floats per rank through tree ``spec``, what
    numpy says each must be, the switches and the network."""
    tp = plan_tree(spec, window=window, chunk_bytes=256, collective=collective, root=root)
    switches = [ModelSwitch(q.switch) for q in tp.plans]
    TreeController(switches, tp).configure()
    data = [np.random.default_rng([seed, r]).standard_normal(elements, np.float32) for r in range(tp.tree.ranks)]
    ops = one_job(tree_operations(tp, [data], timing=Timing(timeout=50e-6, max_timeout=2e-3, tries=tries)))
    net = TreeNetwork(tp.tree, switches, faults=faults, seed=seed)
    net.run(ops)
    want = reference(collective, data, root=root, exponent=exponent(ops[0]))
    return {r: op.result() for r, op in ops.items()}, want, switches, net


def one_job(ops):
    """``{rank: operation}`` of a plan with one job, from :func:`tree_operations`' ``{rank: {qpn: operation}}``."""
    return {r: op for r, by_qpn in ops.items() for op in by_qpn.values()}


def same(got, want):
    """Bit for bit, or both None."""
    return (got is None and want is None) or got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_2x2x2_clean_is_exact():
    got, want, switches, _ = run_tree("2x2x2", 5 * 64)
    assert all(same(got[r], want[r]) for r in got)
    assert [s.counters[Counter.COMPLETED] for s in switches] == [agreement_chunks(64) + 5, 0, 0, 0, 0, 0, 0]


def test_faults_on_every_hop_keep_the_sum_exact():
    got, want, _, net = run_tree("3x2", 12 * 64, faults=Faults(loss=0.1, dup=0.1, reorder=0.1, corrupt=0.05),
                                 seed=3)
    assert all(same(got[r], want[r]) for r in got)
    assert all(link.stats["lost"] for link in net.links.values())  # every hop lost frames


def test_a_dead_hop_is_a_clear_error():
    with pytest.raises(ChunkTimeoutError, match="no result for chunk 0 after 3 tries"):
        run_tree("2x2", 64, faults={(0, 1): Faults(loss=0.999)}, tries=3)


def test_faults_must_name_hops_of_the_tree():
    with pytest.raises(ValueError, match=r"faults name hops the tree does not have: \[\(0, 5\)\]"):
        TreeNetwork(Tree.parse("2x2"), [ModelSwitch()] * 3, faults={(0, 5): Faults()})


_rate = st.sampled_from([0.0, 0.0, 0.02, 0.05, 0.15])


@settings(max_examples=_EXAMPLES)
@given(fanouts=st.lists(st.integers(1, 8), min_size=1, max_size=3), elements=st.integers(0, 6 * 64),
       collective=st.sampled_from([c.value for c in Collective]), window=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16), data=st.data())
def test_random_trees_collectives_and_faults_give_exact_results_or_a_clear_error(fanouts, elements, collective,
                                                                                 window, seed, data):
    tree = Tree.of(tuple(fanouts))
    assume(tree.ranks <= 48)
    root = data.draw(st.integers(0, tree.ranks - 1))
    hops = [(s.index, p) for s in tree.switches for p in range(len(s.children))]
    faults = {hop: Faults(loss=data.draw(_rate), dup=data.draw(_rate), reorder=data.draw(_rate),
                          corrupt=data.draw(_rate)) for hop in hops}
    try:
        got, want, _, _ = run_tree(tree.spec, elements, collective=collective, root=root, window=window,
                                   faults=faults, seed=seed, tries=12)
    except ChunkTimeoutError:
        return  # a clear error, naming the chunk and the worker
    assert all(same(got[r], want[r]) for r in got)


def run_rc_tree(spec, mode, elements, *, window=2, faults=None, seed=0, tries=30):
    """Every rank's AllReduce result in ``mode`` through tree ``spec`` (RC queue pairs), numpy's, the switches."""
    tp = plan_tree(spec, window=window, chunk_bytes=256, mode=mode)
    switches = [ModelSwitch(q.switch, hop_timeout=20e-6) for q in tp.plans]
    TreeController(switches, tp).configure()
    data = [np.random.default_rng([seed, r]).standard_normal(elements, np.float32) for r in range(tp.tree.ranks)]
    ops = one_job(tree_operations(tp, [data], timing=Timing(timeout=50e-6, tries=tries)))
    stats = TreeNetwork(tp.tree, switches, faults=faults, seed=seed).run(ops)
    want = reference("allreduce", data, exponent=ops[0].exponent)
    return {r: op.result() for r, op in ops.items()}, want, switches, stats


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED])
@pytest.mark.parametrize("spec", ["2x4", "2x2x2"])
def test_rc_modes_on_a_tree_are_exact_under_faults_on_every_hop(mode, spec):
    got, want, switches, stats = run_rc_tree(spec, mode, 40 * 64, faults=Faults(loss=0.05, dup=0.05, reorder=0.05),
                                             seed=5)
    assert all(same(got[r], want[r]) for r in got) and stats.link["lost"] > 0
    root, *below = switches
    assert root.counters[Counter.COMPLETED] == agreement_chunks(64) + 40
    assert all(s.counters[Counter.COMPLETED] == 0 and s.tree_counters[TreeCounter.UP_PARTIALS] > 0 for s in below)
    if mode is Mode.TRANSLATED:   # repaired end to end: ranks resend, partials and results go again
        assert sum(s.tree_counters[TreeCounter.UP_RESENDS] for s in below) > 0
        assert sum(s.counters[Counter.ACK_REFLECTED] for s in switches) > 0
    else:                         # repaired on the hop: NAKs and the switches' own resends
        assert sum(s.counters[Counter.HOP_RESENDS] for s in switches) > 0
        assert all(s.counters[Counter.ACK_REFLECTED] == 0 for s in switches)


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED])
def test_rc_modes_on_a_tree_with_a_dead_hop_fail_with_a_clear_error(mode):
    with pytest.raises(RcRetryError, match=r"job 1 worker \d: RC retry count exceeded: PSN \d+ "
                       r"unacknowledged after 2 retries"):
        run_rc_tree("2x2", mode, 64, faults={(0, 1): Faults(loss=0.999)}, tries=3)


@settings(max_examples=_EXAMPLES // 2)
@given(fanouts=st.lists(st.integers(1, 6), min_size=1, max_size=3), elements=st.integers(1, 6 * 64),
       mode=st.sampled_from([Mode.TRANSLATED, Mode.AUGMENTED]), window=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16), data=st.data())
def test_random_trees_in_the_rc_modes_give_exact_sums_or_a_clear_error(fanouts, elements, mode, window, seed, data):
    tree = Tree.of(tuple(fanouts))
    assume(tree.ranks <= 24)
    faults = {(s.index, p): Faults(loss=data.draw(_rate), dup=data.draw(_rate), reorder=data.draw(_rate),
                                   corrupt=data.draw(_rate))
              for s in tree.switches for p in range(len(s.children))}
    try:
        got, want, _, _ = run_rc_tree(tree.spec, mode, elements, window=window, faults=faults, seed=seed, tries=12)
    except RcRetryError:
        return  # a clear error, naming the worker and the PSN
    assert all(same(got[r], want[r]) for r in got)

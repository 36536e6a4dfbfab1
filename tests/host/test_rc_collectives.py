"""Every collective in EPIC's Modes I, II and III (docs/protocol.md sections 10.1, 10.2 and 11.1), over the RC
endpoint of the hosts and the model switches: exact as numpy's on one switch and on trees, under loss and duplication on every
hop, or a clear error."""

import os

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from inagg.host.checker import Violation
from inagg.host.collectives import exponent, reference, tree_operations
from inagg.host.controller import TreeController, plan_tree
from inagg.host.link import Faults
from inagg.host.memnet import TreeNetwork
from inagg.host.rc_worker import RcRetryError, RcWorker
from inagg.host.tree_checker import TreeScope, check_tree
from inagg.host.worker import Timing
from inagg.models import rc
from inagg.models.job import Collective, Mode
from inagg.models.modes import AugmentedJob, TranslatedJob
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.models.terminated import TerminatedJob
from inagg.models.tree import Tree, TreeCounter

_EXAMPLES = 200 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 20
_RC = [Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED]


class Stuck(Exception):
    """The network went idle with a rank not done (memnet's RuntimeError), with the switches to look at."""

    def __init__(self, switches):
        super().__init__("the network is idle but not every endpoint is done")
        self.switches = switches


def run(spec, mode, collective, elements, *, root=0, window=2, faults=None, seed=0, tries=30):
    """Every rank's result of ``collective`` in ``mode`` on tree ``spec``, numpy's, the switches, the net stats;
    :class:`Stuck` when the network goes idle first."""
    tp = plan_tree(spec, window=window, chunk_bytes=256, collective=collective, root=root, mode=mode)
    switches = [ModelSwitch(q.switch, hop_timeout=20e-6) for q in tp.plans]
    TreeController(switches, tp).configure()
    data = [np.random.default_rng([seed, r]).standard_normal(elements, np.float32) for r in range(tp.tree.ranks)]
    ops = {r: op for r, by_qpn in tree_operations(tp, [data], timing=Timing(timeout=50e-6, tries=tries)).items()
           for op in by_qpn.values()}
    assert all(isinstance(op.worker, RcWorker) for op in ops.values())  # the same endpoint for every collective
    try:
        stats = TreeNetwork(tp.tree, switches, faults=faults, seed=seed).run(ops)
    except RuntimeError as e:
        if "idle" not in str(e):
            raise
        raise Stuck(switches) from e
    want = reference(collective, data, root=root, exponent=exponent(ops[0]))
    return {r: op.result() for r, op in ops.items()}, want, switches, stats


def same(got, want):
    """Bit for bit, or both None."""
    return (got is None and want is None) or (got is not None and want is not None
                                              and got.view(np.uint32).tolist() == want.view(np.uint32).tolist())


@pytest.mark.parametrize("mode", _RC)
@pytest.mark.parametrize("collective", [c for c in Collective if c is not Collective.ALLREDUCE])
@pytest.mark.parametrize("spec,root", [("4", 2), ("2x2", 3)])
def test_every_collective_is_exact_under_loss_and_duplication(spec, root, collective, mode):
    lossy = Faults(loss=0.05, dup=0.05, reorder=0.05)
    got, want, switches, stats = run(spec, mode, collective, 20 * 64, root=root, faults=lossy, seed=3)
    assert all(same(got[r], want[r]) for r in got)
    assert collective is Collective.BARRIER or stats.link["lost"] > 0  # a barrier is one chunk: a few frames
    tree = [s.tree_counters for s in switches]
    if mode is Mode.TRANSLATED and collective in (Collective.REDUCE, Collective.BROADCAST):
        # The root rank's ACK (Reduce) or the children's gathered ACK points (Broadcast) travel end to end.
        assert sum(t[TreeCounter.ACK_DOWN] for t in tree) > 0
        assert (sum(t[TreeCounter.ACK_UP] for t in tree) > 0) == (len(switches) > 1)
    if mode in (Mode.AUGMENTED, Mode.TERMINATED):
        assert all(t[TreeCounter.ACK_UP] == t[TreeCounter.ACK_DOWN] == 0 for t in tree)  # every hop ACKs alone
    assert all(t[TreeCounter.DROP_NO_DATA] == 0 for t in tree)


@pytest.mark.parametrize("mode", _RC)
def test_a_reduce_sends_the_result_only_towards_the_root_rank(mode):
    got, want, switches, _ = run("2x2", mode, Collective.REDUCE, 3 * 64, root=1)
    assert all(same(got[r], want[r]) for r in got) and got[0] is None and got[1] is not None
    top, left, right = switches
    # The top switch sends each result to its child on the root rank's side only; the other side gets none.
    assert top.counters[Counter.TX_RESULTS] == top.counters[Counter.COMPLETED] > 0
    assert left.tree_counters[TreeCounter.RX_PARENT] == top.counters[Counter.COMPLETED]
    assert right.tree_counters[TreeCounter.RX_PARENT] == right.counters[Counter.TX_RESULTS] == 0


@pytest.mark.parametrize("mode", _RC)
def test_a_broadcast_takes_lanes_from_the_root_rank_only(mode):
    got, want, switches, _ = run("2x2", mode, Collective.BROADCAST, 3 * 64, root=2)
    assert all(same(got[r], want[r]) for r in got)
    top, left, right = switches
    assert left.counters[Counter.RX_CONTRIB] == left.tree_counters[TreeCounter.UP_PARTIALS] == 0
    assert right.counters[Counter.RX_CONTRIB] == right.tree_counters[TreeCounter.UP_PARTIALS] > 0
    assert top.counters[Counter.RX_CONTRIB] == top.counters[Counter.COMPLETED]


@pytest.mark.parametrize("collective", [Collective.REDUCE, Collective.BROADCAST])
def test_a_dead_hop_in_mode_ii_is_a_clear_error(collective):
    # Repaired end to end: the ranks' RC timers run out.
    with pytest.raises(RcRetryError, match=r"job 1 worker \d: RC retry count exceeded"):
        run("2x2", Mode.TRANSLATED, collective, 64, faults={(0, 1): Faults(loss=0.999)}, tries=3)


@pytest.mark.parametrize("collective", [Collective.REDUCE, Collective.BROADCAST])
def test_a_bad_hop_in_mode_iii_is_repaired_on_that_hop(collective):
    # The ranks' own chunks are ACKed by their switch at once; the switch's timer repeats the hop until it passes.
    got, want, switches, _ = run("2x2", Mode.AUGMENTED, collective, 64, faults={(0, 1): Faults(loss=0.9)}, tries=3)
    assert all(same(got[r], want[r]) for r in got)
    assert switches[0].counters[Counter.HOP_RESENDS] + switches[2].counters[Counter.HOP_RESENDS] > 0


def test_mode_i_reduce_sends_no_result_frame_to_the_other_ranks():
    # Every switch ACKs the contributions it takes; results go only down the root rank's side, lost or not.
    got, want, switches, stats = run("2x2", Mode.TERMINATED, Collective.REDUCE, 6 * 64, root=1,
                                     faults=Faults(loss=0.1, dup=0.05, reorder=0.05), seed=2)
    assert all(same(got[r], want[r]) for r in got) and stats.link["lost"] > 0
    top, left, right = (s.modes[1] for s in switches)
    sent = lambda job: [q.stats["sent"] for q in job.requesters]  # result packets, resends included
    assert sent(top)[0] > 0 and sent(top)[1] == 0                 # to s1 (rank 1's side), none to s2
    assert sent(left)[1] > 0 and sent(left)[0] == sent(right)[0] == sent(right)[1] == 0
    assert switches[2].counters[Counter.TX_RESULTS] == 0 and switches[2].tree_counters[TreeCounter.UP_PARTIALS] > 0
    assert switches[1].counters[Counter.HOP_RESENDS] > 0 and switches[1].resent[0, Counter.HOP_RESENDS] == 0


def test_mode_i_broadcast_retransmits_to_the_lossy_receiver_only():
    # Rank 0's hop loses frames: its switch sends it results again, and no other hop sees a resend (the 7 chunks
    # fit the 8 slots, so no slot is busy when the next chunk comes).
    got, want, switches, stats = run("2x2", Mode.TERMINATED, Collective.BROADCAST, 6 * 64, root=2, window=4,
                                     faults={(1, 0): Faults(loss=0.3)}, seed=1)
    assert all(same(got[r], want[r]) for r in got) and stats.link["lost"] > 0
    resent = {(i, port, c): n for i, s in enumerate(switches) for (port, c), n in s.resent.items() if n}
    assert list(resent) == [(1, 0, Counter.HOP_RESENDS)]
    assert switches[1].modes[1].requesters[1].stats["resent"] == 0


_rate = st.sampled_from([0.0, 0.0, 0.02, 0.05, 0.15])


@settings(max_examples=_EXAMPLES, deadline=None)
@given(fanouts=st.lists(st.integers(1, 4), min_size=1, max_size=3), elements=st.integers(1, 4 * 64),
       mode=st.sampled_from(_RC), collective=st.sampled_from(list(Collective)), window=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16), data=st.data())
def test_random_trees_collectives_modes_and_faults_give_exact_results_or_a_clear_error(fanouts, elements, mode,
                                                                                       collective, window, seed,
                                                                                       data):
    tree = Tree.of(tuple(fanouts))
    assume(tree.ranks <= 16)
    root = data.draw(st.integers(0, tree.ranks - 1))
    faults = {(s.index, p): Faults(loss=data.draw(_rate), dup=data.draw(_rate), reorder=data.draw(_rate),
                                   corrupt=data.draw(_rate))
              for s in tree.switches for p in range(len(s.children))}
    try:
        got, want, _, _ = run(tree.spec, mode, collective, elements, root=root, window=window, faults=faults,
                              seed=seed, tries=12)
    except RcRetryError:
        return  # a clear error, naming the worker and the PSN
    assert all(same(got[r], want[r]) for r in got)


# -- the model checker on EPIC's scope -----------------------------------------------------------------------

@pytest.mark.parametrize("mode", _RC)
@pytest.mark.parametrize("collective", [Collective.REDUCE, Collective.BROADCAST])
def test_the_tree_checker_explores_reduce_and_broadcast(collective, mode):
    r = check_tree(TreeScope("2x2", chunks=1, window=1, faults=0, mode=mode, reorder=False, quiet=True,
                             collective=collective, root=1))
    assert r.final_states == 1 and r.states > 50


def test_the_tree_checker_finds_a_mode_iii_broadcast_result_freed_at_the_first_ack(monkeypatch):
    monkeypatch.setattr(AugmentedJob, "free_on_first_ack", True)
    with pytest.raises(Violation, match=r"switch \d no longer holds result PSN 0, which its child \d lacks"):
        check_tree(TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False,
                             collective=Collective.BROADCAST))


def test_the_tree_checker_finds_a_mode_i_broadcast_result_freed_at_the_first_ack(monkeypatch):
    # The slot is the result's only copy (section 6.4): a receiver whose copy is lost after another ACKed it
    # never gets it. Without the mutation the same scope ends with every rank holding the root's chunk; with
    # it the held-result invariant fires in the state the slot is freed, before any rank is found missing it.
    scope = TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.TERMINATED, reorder=False, quiet=True,
                      collective=Collective.BROADCAST, root=1)
    assert check_tree(scope).final_states > 1
    monkeypatch.setattr(TerminatedJob, "free_on_first_ack", True)
    with pytest.raises(Violation, match=r"switch 0 no longer holds result PSN 0, which its child \d lacks"):
        check_tree(scope)


@pytest.mark.parametrize("reduce", [False, True])  # the partial-order reduction must still find it
def test_the_tree_checker_finds_a_mode_ii_reduce_that_reflects_the_root_ack_to_the_root_alone(monkeypatch, reduce):
    # The AllReduce rule (reflect each host's ACK to that host) in a Reduce: the other ranks are never released.
    monkeypatch.setattr(TranslatedJob, "_ack_down", lambda self, ack, children: [
        (self.spec.workers[v].port, rc.encode(ack, self.to[v])) for v in children if v == self.spec.root])
    with pytest.raises(Violation, match=r"RC retry count exceeded|missing results"):
        check_tree(TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.TRANSLATED, reorder=False, quiet=True,
                             collective=Collective.REDUCE), reduce=reduce)


@pytest.mark.parametrize("kw,message", [
    (dict(collective=Collective.REDUCE), r"reduce is checked in Modes I, II and III, not in mode uc"),
    (dict(collective=Collective.BARRIER, mode=Mode.TRANSLATED), r"collective must be ALLREDUCE, REDUCE or BROADCAST"),
    (dict(collective=Collective.REDUCE, mode=Mode.TRANSLATED, root=4), r"root must be a rank in 0\.\.3, not 4"),
])
def test_tree_scopes_refuse_what_the_checker_does_not_run(kw, message):
    with pytest.raises(ValueError, match=message):
        TreeScope("2x2", **kw)

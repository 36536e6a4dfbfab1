"""The six collectives on one switch and on trees, exact against numpy, with faults on every hop."""

import numpy as np
import pytest

from inagg.host.collectives import CompletionParser, Reduce, collective_worker, exponent, operation, reference
from inagg.host.controller import TreeController, plan, plan_tree
from inagg.host.link import Faults
from inagg.host.memnet import TreeNetwork
from inagg.host.worker import LengthMismatchError, Timing
from inagg.models import wire
from inagg.models.frame import CONTRIBUTION, RESULT
from inagg.models.job import Collective
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.models.tree import Tree, TreeCounter

_FAULTS = Faults(loss=0.05, dup=0.05, reorder=0.05, corrupt=0.02)


def run(spec, collective, data, *, root=0, faults=None, seed=0, amax=None):
    """Run ``collective`` on tree ``spec`` ("4" is one switch); every rank's finished operation, and the switches."""
    tp = plan_tree(spec, window=4, chunk_bytes=256, collective=collective, root=root)
    switches = [ModelSwitch(q.switch) for q in tp.plans]
    TreeController(switches, tp).configure()
    timing = Timing(timeout=50e-6, max_timeout=2e-3, tries=30)
    ops = {}
    for r in range(tp.tree.ranks):
        s, w = tp.rank(r)
        q = tp.plans[s]
        ops[r] = operation(collective_worker(q.switch, q.jobs[0], w, timing=timing), data[r], rank=r, amax=amax)
    TreeNetwork(tp.tree, switches, faults=faults, seed=seed).run(ops)
    return ops, switches


def _data(ranks, n, seed=0):
    return [np.random.default_rng([seed, r]).standard_normal(n, np.float32) for r in range(ranks)]


TREES = ["4", "2x3", "2x2x2"]


@pytest.mark.parametrize("spec", TREES)
@pytest.mark.parametrize("faults", [None, _FAULTS], ids=["clean", "faults"])
@pytest.mark.parametrize("collective", ["reduce", "broadcast", "reduce-scatter", "allgather"])
def test_every_rank_gets_exactly_what_numpy_gives_it(spec, faults, collective):
    ranks = Tree.parse(spec).ranks
    data = _data(ranks, 301, seed=3)
    amax = float(max(np.abs(d).max() for d in data))
    ops, switches = run(spec, collective, data, root=ranks - 1, faults=faults, amax=amax)
    want = reference(collective, data, root=ranks - 1, exponent=exponent(ops[0]))
    for r, op in ops.items():
        got = op.result()
        assert (got is None and want[r] is None) or got.view(np.uint32).tolist() == want[r].view(np.uint32).tolist()
    if collective == "reduce":
        assert want[0] is None and sum(s.tree_counters[TreeCounter.TX_COMPLETIONS] for s in switches) > 0


@pytest.mark.parametrize("spec", TREES)
def test_barrier_completes_everywhere_under_faults(spec):
    ranks = Tree.parse(spec).ranks
    ops, switches = run(spec, "barrier", [None] * ranks, faults=_FAULTS, seed=2)
    assert all(op.done and op.result() is None for op in ops.values())
    assert switches[0].tree_counters[TreeCounter.TX_COMPLETIONS] >= len(switches[0].jobs[1].spec.workers)


@pytest.mark.parametrize("collective", ["broadcast", "allgather"])
def test_ranks_that_pass_different_lengths_get_an_error(collective):
    data = _data(4, 50)
    data[2] = data[2][:49]  # one lane fewer: the same number of chunks
    with pytest.raises(LengthMismatchError, match="rank 2 passed 49 elements, this rank 50|passed 50 elements, "
                                                   "this rank 49|rank 1 passed 50 elements, this rank 49"):
        run("2x2", collective, data, root=1)


def test_reduce_refuses_a_length_mismatch_at_the_root():
    data = _data(4, 50)
    data[0] = data[0][:48]
    with pytest.raises(LengthMismatchError, match="rank 0 passed 48 elements, this rank 50"):
        run("2x2", "reduce", data, root=3, amax=8.0)


def test_reduce_refuses_data_beyond_amax():
    tp = plan_tree("2", window=4, chunk_bytes=256, collective="reduce")
    w = collective_worker(tp.plans[0].switch, tp.plans[0].jobs[0], 0)
    with pytest.raises(ValueError, match="data exceed amax 1.0"):
        Reduce(w, np.array([2.0], np.float32), amax=1.0)
    with pytest.raises(ValueError, match="amax must be a finite number >= 0, not nan"):
        Reduce(w, np.array([2.0], np.float32), amax=float("nan"))


def test_an_operation_needs_a_job_of_its_collective():
    tp = plan_tree("2", window=4, chunk_bytes=256, collective="broadcast")
    w = collective_worker(tp.plans[0].switch, tp.plans[0].jobs[0], 0)
    with pytest.raises(ValueError, match="Reduce needs a reduce job, not broadcast"):
        Reduce(w, np.zeros(1, np.float32), amax=1.0)


def test_a_data_sender_may_not_send_an_empty_contribution():
    from inagg.host.collectives import EmptyContributions
    from inagg.models.protocol import Counter

    tp = plan_tree("2", window=4, chunk_bytes=256, collective="broadcast", root=0)
    sw = ModelSwitch(tp.plans[0].switch)
    TreeController([sw], tp).configure()
    empty = EmptyContributions(tp.plans[0].switch, tp.plans[0].jobs[0], 0).build(np.array([0]), None)[0]
    assert sw.receive(0, empty.tobytes()) == [] and sw.counters[Counter.DROP_BAD_LENGTH] == 1


def test_the_host_api_runs_every_collective_on_a_memory_fabric():
    import threading

    from inagg.host import api
    from inagg.host.controller import plan

    results = {}
    for collective in Collective:
        p = plan([3], window=4, chunk_bytes=256, collective=collective, root=2)
        sw = ModelSwitch(p.switch)
        data = _data(3, 100, seed=5)
        with api.MemoryFabric(sw) as fabric:
            sw.add_job(p.jobs[0])
            out = {}

            def work(r):
                g = api.Group(p.switch, p.jobs[0], r, fabric.port(r), timing=Timing(timeout=0.05, max_timeout=0.5))
                call = {"allreduce": lambda: api.allreduce(data[r], g),
                        "reduce": lambda: api.reduce(data[r], g, amax=8.0),
                        "broadcast": lambda: api.broadcast(data[r], g),
                        "barrier": lambda: api.barrier(g),
                        "reduce-scatter": lambda: api.reduce_scatter(data[r], g),
                        "allgather": lambda: api.allgather(data[r], g)}[collective.value]
                out[r] = call()

            threads = [threading.Thread(target=work, args=(r,)) for r in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        results[collective] = out
    assert results[Collective.REDUCE][0] is None and results[Collective.REDUCE][2] is not None
    assert all(np.array_equal(results[Collective.BROADCAST][r], data[2]) for r in range(3))
    assert all(results[Collective.BARRIER][r] is None for r in range(3))
    assert np.array_equal(np.concatenate([results[Collective.REDUCE_SCATTER][r] for r in range(3)]),
                          results[Collective.ALLREDUCE][0])
    assert all(np.array_equal(results[Collective.ALLGATHER][r], np.concatenate(data)) for r in range(3))


def _completion(switch, me, chunk, **change):
    fields = dict(eth_dst=wire.mac_bytes(me.mac), eth_src=wire.mac_bytes(switch.mac), ip_src=wire.ip_bytes(switch.ip),
                  ip_dst=wire.ip_bytes(me.ip), udp_sport=0, opcode=RESULT.opcode, dest_qpn=me.qpn, psn=chunk,
                  va=me.result_va + chunk * switch.chunk_bytes, rkey=me.rkey, payload=b"", imm=chunk,
                  pkey=switch.pkey)
    return wire.build(**(fields | change))


@pytest.mark.parametrize("change, counter", [
    ({}, None),
    ({"dest_qpn": 0x77}, Counter.DROP_UNKNOWN_QPN),
    ({"rkey": 0x1234}, Counter.DROP_BAD_RKEY),
    ({"va": 8}, Counter.DROP_BAD_ADDRESS),
    ({"payload": bytes(8)}, Counter.DROP_BAD_LENGTH),
    ({"opcode": CONTRIBUTION.opcode, "imm": None}, Counter.DROP_BAD_OPCODE),
    ({"pkey": 0x7FFF}, Counter.DROP_BAD_HEADER),
])
def test_a_completion_is_checked_as_a_result_is(change, counter):
    """A Reduce sender takes lane-less results (completions) through the receiver checks of any result."""
    p = plan([4], window=4, chunk_bytes=256, collective="reduce", root=0)
    job, switch = p.jobs[0], p.switch
    worker = collective_worker(switch, job, 2)
    assert isinstance(worker.parser, CompletionParser)
    got = worker.parser.parse(_completion(switch, job.workers[2], 5, **change))
    if counter is None:
        assert (got.chunk30, got.words.tolist()) == (5, [0] * switch.lanes)
    else:
        assert got is counter
    batch, drops = worker.parser.parse_batch([_completion(switch, job.workers[2], 3, **change)])
    assert (batch.chunk30.tolist(), drops) == (([3], []) if counter is None else ([], [counter]))

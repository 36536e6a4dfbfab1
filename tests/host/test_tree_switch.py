"""The model switch's tree rules (docs/protocol.md section 10), frame by frame on small trees."""

from collections import defaultdict

import numpy as np
import pytest

from inagg.host.controller import TreeController, plan_tree
from inagg.host.fastpath import ContribTemplate, ResultParser
from inagg.models import arith, wire
from inagg.models.frame import RESULT
from inagg.models.protocol import Counter, Opcode, encode_imm
from inagg.models.switch import ModelSwitch, SlotState
from inagg.models.tree import TreeCounter


class Tree:
    """Model switches of a planned tree and a synchronous router between them."""

    def __init__(self, spec, **kw):
        self.plan = plan_tree(spec, window=2, chunk_bytes=256, **kw)
        self.tree = self.plan.tree
        self.sw = [ModelSwitch(p.switch) for p in self.plan.plans]
        TreeController(self.sw, self.plan).configure()
        self.lanes = self.plan.plans[0].switch.lanes

    def contribution(self, rank, chunk, lanes):
        s, w = self.plan.rank(rank)
        p = self.plan.plans[s]
        return s, w, ContribTemplate(p.switch, p.jobs[0], w).build(np.array([chunk]), lanes[None])[0].tobytes()

    def send(self, *items):
        """Deliver (switch, port, frame) items and everything they cause; frames that reach ranks, by rank."""
        pending, to_ranks = list(items), defaultdict(list)
        while pending:
            s, port, f = pending.pop(0)
            for p, g in self.sw[s].receive(port, f):
                node, far = self.tree.peer(s, p)
                if node.switch:
                    pending.append((node.index, far, g))
                else:
                    to_ranks[node.index].append(g)
        return to_ranks

    def parse(self, rank, frame):
        s, w = self.plan.rank(rank)
        p = self.plan.plans[s]
        return ResultParser(p.switch, p.jobs[0], w).parse(frame)

    def up_frames(self, leaf, *contribs):
        """What ``leaf`` sends up for these (rank, chunk, lanes) contributions."""
        out = []
        for rank, chunk, lanes in contribs:
            s, w, f = self.contribution(rank, chunk, lanes)
            assert s == leaf
            out += self.sw[s].receive(w, f)
        return out


def _lanes(n, lanes, seed=0):
    return np.random.default_rng(seed).integers(-2**20, 2**20, (n, lanes), dtype=np.int32)


def test_2x2_allreduce_is_the_sum_of_the_partials():
    t = Tree("2x2")
    x = _lanes(4, t.lanes)
    got = t.send(*(t.contribution(r, 7, x[r]) for r in range(4)))
    expect = arith.emit(_merged(arith.aggregate(x[:2]), arith.aggregate(x[2:])))
    for r in range(4):
        (f,) = got[r]
        res = t.parse(r, f)
        assert res.chunk30 == 7 and not res.fp32 and np.array_equal(res.words.view(">i4"), expect)
    leaf = t.sw[1]
    assert leaf.tree_counters[TreeCounter.UP_PARTIALS] == 1 and leaf.tree_counters[TreeCounter.RX_PARENT] == 1
    assert leaf.counters[Counter.COMPLETED] == 0 and t.sw[0].counters[Counter.COMPLETED] == 1
    assert leaf.counters[Counter.TX_RESULTS] == 2 and t.sw[0].counters[Counter.TX_RESULTS] == 2


def _merged(*partials):
    s = arith.LaneState(partials[0].size)
    for i, p in enumerate(partials):
        arith.merge(s, p.view(np.uint32), np.zeros(p.size, bool), first=i == 0)
    return s


def test_an_unpromoted_partial_is_an_ordinary_contribution():
    t = Tree("2x2")
    x = _lanes(2, t.lanes)
    (port, f), = t.up_frames(1, (0, 3, x[0]), (1, 3, x[1]))
    r = wire.parse(f)
    up = t.plan.plans[1].jobs[0].parent
    assert port == up.port and r.opcode == Opcode.UC_RDMA_WRITE_ONLY and r.dest_qpn == up.qpn
    assert (r.va, r.rkey, r.psn) == (3 * 256, up.rkey, 3)
    assert np.array_equal(np.frombuffer(r.payload, ">i4"), x[0] + x[1])


def test_promoted_lanes_travel_up_bit_exactly():
    t = Tree("2x2")
    x = np.zeros((4, t.lanes), np.int32)
    x[0, 0] = x[1, 0] = 2**31 - 1      # leaf 1's lane 0 promotes
    x[0, 1] = 2**24 + 1                 # lane 1 stays an exact INT32 above FP32's integers
    x[2, 1] = 1
    (port, f), = t.up_frames(1, (0, 0, x[0]), (1, 0, x[1]))
    r = wire.parse(f)
    assert r.opcode == Opcode.UC_RDMA_WRITE_ONLY_IMM and r.imm == encode_imm(0, True)
    assert r.dma_len == 256 + 256 // 32
    bits = np.unpackbits(np.frombuffer(r.payload[256:], np.uint8)).astype(bool)
    assert bits[0] and not bits[1:].any() and np.frombuffer(r.payload, ">i4", 2)[1] == 2**24 + 1
    got = t.send((0, 0, f), *(t.contribution(r, 0, x[r]) for r in (2, 3)))
    res = t.parse(3, got[3][0])
    assert res.fp32
    lanes = res.words.view(">f4")
    # the root adds 2**24 + 1 and 1 in INT32, then converts once: 2**24 + 2 exactly
    assert lanes[1] == np.float32(2**24 + 2) and lanes[0] == np.float32(2.0**32 - 2)
    assert t.sw[1].tree_counters[TreeCounter.UP_PROMOTED] == 1


def test_a_duplicate_at_a_switch_waiting_for_its_parent_resends_the_partial():
    t = Tree("2x2")
    x = _lanes(2, t.lanes)
    first = t.up_frames(1, (0, 5, x[0]), (1, 5, x[1]))
    _, _, again = t.contribution(1, 5, x[1])
    assert t.sw[1].receive(1, again) == first
    assert t.sw[1].tree_counters[TreeCounter.UP_RESENDS] == 1 and t.sw[1].counters[Counter.DUP_CONTRIB] == 1


def test_a_duplicate_after_the_result_resends_the_result_to_that_child_only():
    t = Tree("2x2")
    x = _lanes(4, t.lanes)
    got = t.send(*(t.contribution(r, 1, x[r]) for r in range(4)))
    s, w, f = t.contribution(2, 1, x[2])
    (again,) = t.send((s, w, f))[2]
    assert _unpsn(again) == _unpsn(got[2][0])
    assert t.sw[2].counters[Counter.TX_RESENDS] == 1 and t.sw[0].counters[Counter.TX_RESENDS] == 0


def test_the_root_resends_its_result_to_a_child_switch_that_resends_its_partial():
    t = Tree("2x2")
    x = _lanes(4, t.lanes)
    (_, up1), = t.up_frames(1, (0, 2, x[0]), (1, 2, x[1]))
    (_, up2), = t.up_frames(2, (2, 2, x[2]), (3, 2, x[3]))
    t.sw[0].receive(0, up1)
    down = t.sw[0].receive(1, up2)       # the results down are lost
    assert [p for p, _ in down] == [0, 1]
    (port, again), = t.sw[0].receive(0, up1)
    assert port == 0 and _unpsn(again) == _unpsn(down[0][1])
    assert t.sw[0].counters[Counter.TX_RESENDS] == 1


def _unpsn(frame):
    """A result without its PSN (which counts resends) and ICRC."""
    r = wire.parse(frame)
    return r.payload, r.imm, r.va, r.dest_qpn


def test_results_from_the_parent_that_do_not_fit_are_counted():
    t = Tree("2x2")
    x = _lanes(4, t.lanes)
    got = t.send(*(t.contribution(r, 4, x[r]) for r in range(4)))
    res = t.parse(0, got[0][0])
    up = t.plan.plans[1].jobs[0].parent
    leaf = t.sw[1]

    def down(chunk, rkey=up.result_rkey, payload=res.words.astype(">u4").tobytes()):
        return wire.build(eth_dst=wire.mac_bytes(t.plan.plans[1].switch.mac), eth_src=wire.mac_bytes(up.mac),
                          ip_src=wire.ip_bytes(up.ip), ip_dst=wire.ip_bytes(t.plan.plans[1].switch.ip),
                          udp_sport=1, opcode=RESULT.opcode, dest_qpn=up.result_qpn, psn=0,
                          va=up.result_va + (chunk % 4) * 256, rkey=rkey, payload=payload, imm=encode_imm(chunk, False))

    assert leaf.receive(2, down(4)) == [] and leaf.tree_counters[TreeCounter.DUP_PARENT] == 1
    assert leaf.receive(2, down(9)) == [] and leaf.tree_counters[TreeCounter.DROP_PARENT_STALE] == 1
    assert leaf.receive(2, down(4, rkey=1)) == [] and leaf.counters[Counter.DROP_BAD_RKEY] == 1
    assert leaf.receive(2, down(4, payload=bytes(128))) == [] and leaf.counters[Counter.DROP_BAD_LENGTH] == 1
    assert leaf.fast[0].state == SlotState.DONE


def test_bad_partials_are_counted_drops():
    t = Tree("2x2")
    x = np.zeros((2, t.lanes), np.int32)
    x[:, 0] = 2**31 - 1
    (_, f), = t.up_frames(1, (0, 0, x[0]), (1, 0, x[1]))
    r = wire.parse(f)
    root = t.sw[0]

    def again(**kw):
        fields = dict(eth_dst=r.eth_dst, eth_src=r.eth_src, ip_src=r.ip_src, ip_dst=r.ip_dst,
                      udp_sport=r.udp_sport, opcode=r.opcode, dest_qpn=r.dest_qpn, psn=r.psn, va=r.va,
                      rkey=r.rkey, payload=r.payload, imm=r.imm)
        return wire.build(**(fields | kw))

    assert root.receive(0, again(payload=r.payload[:256])) == []
    assert root.counters[Counter.DROP_BAD_LENGTH] == 1
    assert root.receive(0, again(imm=encode_imm(1, True))) == []
    assert root.counters[Counter.DROP_BAD_ADDRESS] == 1
    # a rank may not send a promoted partial
    leaf_rank = t.plan.plans[1].jobs[0]
    assert t.sw[1].receive(0, again(dest_qpn=leaf_rank.qpn(0), rkey=leaf_rank.rkey)) == []
    assert t.sw[1].counters[Counter.DROP_BAD_OPCODE] == 1
    assert root.counters[Counter.RX_CONTRIB] == 0


def test_a_second_job_may_not_take_an_uplink_result_qpn():
    import dataclasses

    t = Tree("2x2")
    job = t.plan.plans[1].jobs[0]
    sw = ModelSwitch(dataclasses.replace(t.plan.plans[1].switch, slots=8))
    sw.add_job(job)
    with pytest.raises(ValueError, match=r"job 2's uplink result QPN 0x020001 is job 1's already"):
        sw.add_job(dataclasses.replace(job, job=2, slot_base=4))
    sw.remove_job(1)
    sw.add_job(dataclasses.replace(job, job=2, slot_base=4))
    assert list(sw.jobs) == [2]

"""Job modes (models/job.Mode) and EPIC's modes in the model switch (models/modes.py: II and III, on one switch
and on a tree; models/terminated.py: I), frame by frame."""

import dataclasses

import numpy as np
import pytest

from inagg.models import arith, rc, wire
from inagg.host.p4ctl.layout import plan as p4_plan
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import Collective, JobSpec, Mode, SwitchSpec, Uplink, WorkerSpec
from inagg.models.p4profile import V1MODEL
from inagg.models.frame import SegmentOpcode
from inagg.models.protocol import Counter, Opcode, decode_imm, encode_imm, qp_udp_sport
from inagg.models.rc import PSN_MOD, Ack, Packet, Requester, Responder, Syndrome
from inagg.models.regmap import RegMap
from inagg.models.switch import ModelSwitch
from inagg.models.tree import TreeCounter

CHUNK = 256
LANES = CHUNK // 4


def make_job(mode, n=2, slots=4):
    workers = tuple(WorkerSpec(port=i, mac=f"02:00:00:00:00:{i + 1:02x}", ip=f"10.0.0.{i + 1}", qpn=0x100 + i,
                               rkey=0x500 + i, result_va=0x10000 * (i + 1)) for i in range(n))
    return JobSpec(job=3, rkey=0xC0DE, slot_base=0, slots=slots, workers=workers, mode=mode)


def switch(mode, **kw):
    sw = ModelSwitch(SwitchSpec(ports=4, slots=8, chunk_bytes=CHUNK), hop_timeout=1.0)
    job = make_job(mode, **kw)
    sw.add_job(job)
    return sw, job


def to_switch(sw, job, w):
    ws = job.workers[w]
    return rc.Address(eth_dst=wire.mac_bytes(sw.spec.mac), eth_src=wire.mac_bytes(ws.mac), ip_src=wire.ip_bytes(ws.ip),
                      ip_dst=wire.ip_bytes(sw.spec.ip), udp_sport=qp_udp_sport(ws.qpn), dest_qpn=job.qpn(w),
                      rkey=job.rkey)


def lanes(w, psn):
    return np.full(LANES, 10 * w + psn + 1, np.int32)


def send(sw, job, w, psn, chunk=None, **kw):
    chunk = psn if chunk is None else chunk
    pkt = Packet(Opcode.RC_RDMA_WRITE_ONLY, psn, lanes(w, psn).astype(">i4").tobytes(), True, chunk * CHUNK, CHUNK)
    pkt = dataclasses.replace(pkt, **kw)
    return decoded(sw.receive(job.workers[w].port, rc.encode(pkt, to_switch(sw, job, w))))


def ack(sw, job, w, item):
    return decoded(sw.receive(job.workers[w].port, rc.encode(item, to_switch(sw, job, w))))


def decoded(out):
    """(port, destination QPN, packet or ACK) of what the switch sent."""
    return [(port, *rc.decode(f)) for port, f in out]


# -- Mode, JobSpec, check_job --------------------------------------------------------

def test_jobs_are_uc_by_default_and_the_mode_is_checked():
    assert make_job(Mode.UC).mode is Mode.UC and JobSpec(1, 0, 0, 2, make_job(Mode.UC).workers).mode is Mode.UC
    assert [m.value for m in Mode] == ["uc", "I", "II", "III"]
    with pytest.raises(TypeError, match=r"mode must be a Mode \(UC, TERMINATED, TRANSLATED, AUGMENTED\), not 'II'"):
        dataclasses.replace(make_job(Mode.UC), mode="II")


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED, Mode.TERMINATED])
def test_the_rtl_takes_uc_and_mode_ii_and_p4_uc_alone(mode):
    job = make_job(mode)
    spec = SwitchSpec(ports=4, slots=8, chunk_bytes=CHUNK)
    geometry = SwitchGeometry(ports=4, width=64, slots=8, chunk_bytes=CHUNK)
    rtl = rf"^job 3 asks for mode {mode.name} \({mode.value}\); this switch implements UC \(uc\), TRANSLATED \(II\)$"
    if mode is Mode.TRANSLATED:
        assert RegMap(4, 8).job_writes(job, spec)[-1] == (RegMap(4, 8).job(3, "CTRL"), RegMap(4, 8).ctrl(job))
        geometry.check_job(job)
    else:
        with pytest.raises(ValueError, match=rtl):
            RegMap(4, 8).job_writes(job, spec)
        with pytest.raises(ValueError, match=rtl):
            geometry.check_job(job)
    message = rf"^job 3 asks for mode {mode.name} \({mode.value}\); this switch implements UC \(uc\)$"
    with pytest.raises(ValueError, match=message):
        p4_plan(V1MODEL, spec, [job])


def test_the_model_switch_takes_every_mode():
    for mode in Mode:
        sw, job = switch(mode)
        assert (job.job in sw.modes) == (mode is not Mode.UC)


def test_mode_i_below_a_root_is_its_parents_rc_peer():
    uplink = Uplink(port=3, mac="02:00:00:00:01:00", ip="10.0.1.0", qpn=0x400000, rkey=1, result_qpn=0x200,
                    result_rkey=2, result_va=0)
    sw = ModelSwitch(SwitchSpec())
    sw.add_job(dataclasses.replace(make_job(Mode.UC), mode=Mode.TERMINATED, parent=uplink))
    job = next(iter(sw.modes.values()))
    # One QP to the parent: the requester of the partials (its own PSN space) and the responder of the results.
    assert job.up_requester.next_psn == 0 and job.up_responder.expected == 0 and job.deadline is None
    root = dataclasses.replace(make_job(Mode.UC), mode=Mode.TERMINATED, subswitches=frozenset({1}))
    assert root.subswitches == {1} and root.parent is None


@pytest.mark.parametrize("mode", [Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED])
def test_the_rc_modes_take_a_tree_and_every_collective(mode):
    job = make_job(Mode.UC)
    uplink = Uplink(port=3, mac="02:00:00:00:01:00", ip="10.0.1.0", qpn=0x400000, rkey=1, result_qpn=0x200,
                    result_rkey=2, result_va=0)
    assert dataclasses.replace(job, parent=uplink, subswitches={1}, mode=mode).mode is mode
    for other in Collective:
        root = 0 if other.rooted else None
        sw = ModelSwitch(SwitchSpec(slots=16))
        sw.add_job(dataclasses.replace(job, collective=other, root=root, mode=mode))
        assert sw.modes[job.job].spec.collective is other


# -- Mode II ---------------------------------------------------------------------------

def test_mode_ii_aggregates_in_order_and_sends_rc_results_with_the_contribution_psn():
    sw, job = switch(Mode.TRANSLATED)
    assert send(sw, job, 0, 0) == []
    out = send(sw, job, 1, 0)
    assert [(p, q) for p, q, _ in out] == [(0, 0x100), (1, 0x101)]
    for w, (_, _, pkt) in enumerate(out):
        assert pkt.opcode == Opcode.RC_RDMA_WRITE_ONLY_IMM and pkt.psn == 0 and pkt.ackreq
        assert pkt.va == job.workers[w].result_va and decode_imm(pkt.imm) == (0, False, False)
        assert (np.frombuffer(pkt.payload, ">i4") == lanes(0, 0) + lanes(1, 0)).all()
    assert sw.counters[Counter.COMPLETED] == 1 and sw.counters[Counter.RX_CONTRIB] == 2


def test_mode_ii_reflects_each_hosts_ack_and_nak_back_to_it():
    sw, job = switch(Mode.TRANSLATED)
    for item in (Ack(5, Syndrome.ACK, 6), Ack(7, Syndrome.NAK_SEQ, 7)):
        assert ack(sw, job, 1, item) == [(1, 0x101, item)]
    assert sw.counters[Counter.ACK_REFLECTED] == 2


def test_mode_ii_drops_a_psn_ahead_and_resends_the_result_for_a_psn_behind():
    sw, job = switch(Mode.TRANSLATED)
    assert send(sw, job, 0, 1) == [] and sw.counters[Counter.DROP_PSN_AHEAD] == 1
    send(sw, job, 0, 0)
    assert send(sw, job, 0, 0) == [] and sw.counters[Counter.DUP_CONTRIB] == 1   # result not made yet
    send(sw, job, 1, 0)
    (resent,) = send(sw, job, 1, 0)
    assert resent[:2] == (1, 0x101) and resent[2].psn == 0 and sw.counters[Counter.TX_RESENDS] == 1


def test_mode_ii_wipes_the_shadow_half_as_the_window_advances():
    sw, job = switch(Mode.TRANSLATED, slots=4)                # W = 2: PSN p wipes slot (p + 2) mod 4
    m = sw.modes[job.job]
    for p in range(2):
        send(sw, job, 0, p)
        send(sw, job, 1, p)
    assert [e.bitmap for e in m.entries] == [3, 3, 0, 0]
    send(sw, job, 0, 2)
    assert [e.bitmap for e in m.entries] == [2, 3, 1, 0]       # slot 0 keeps its result for worker 1
    assert send(sw, job, 1, 0)[0][2].psn == 0                  # which may still ask for it
    send(sw, job, 1, 2)
    assert m.entries[0].bitmap == 0 and m.entries[2].count == 2


def test_mode_ii_counts_bad_contributions():
    sw, job = switch(Mode.TRANSLATED)
    uc = wire.build(eth_dst=bytes(6), eth_src=bytes(6), ip_src=bytes(4), ip_dst=bytes(4), udp_sport=1,
                    opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=job.qpn(0), psn=0, va=0, rkey=job.rkey,
                    payload=bytes(CHUNK))
    assert sw.receive(0, uc) == [] and sw.counters[Counter.DROP_BAD_OPCODE] == 1
    bad_rkey = dataclasses.replace(to_switch(sw, job, 0), rkey=1)
    pkt = Packet(Opcode.RC_RDMA_WRITE_ONLY, 0, bytes(CHUNK), True, 0, CHUNK)
    assert sw.receive(0, rc.encode(pkt, bad_rkey)) == [] and sw.counters[Counter.DROP_BAD_RKEY] == 1
    send(sw, job, 0, 0)
    assert send(sw, job, 1, 0, chunk=4) == [] and sw.counters[Counter.DROP_BAD_ADDRESS] == 1
    assert sw.modes[job.job].expected == [1, 0]


# -- Mode III ----------------------------------------------------------------------------

def test_mode_iii_acks_in_order_re_acks_behind_and_naks_once_per_gap():
    sw, job = switch(Mode.AUGMENTED)
    assert send(sw, job, 0, 0) == [(0, 0x100, Ack(0, Syndrome.ACK, 1))]
    assert send(sw, job, 0, 0) == [(0, 0x100, Ack(0, Syndrome.ACK, 1))]            # re-ACK
    assert send(sw, job, 0, 2) == [(0, 0x100, Ack(1, Syndrome.NAK_SEQ, 1))]        # the gap
    assert send(sw, job, 0, 3) == []                                              # the same gap
    assert send(sw, job, 0, 1) == [(0, 0x100, Ack(1, Syndrome.ACK, 2))]
    c = sw.counters
    assert (c[Counter.ACK_SENT], c[Counter.NAK_SENT], c[Counter.DUP_CONTRIB], c[Counter.DROP_PSN_AHEAD]) == (3, 1, 1, 2)


def _complete(sw, job, psn):
    send(sw, job, 0, psn)
    return send(sw, job, 1, psn)


def test_mode_iii_frees_a_result_only_when_the_slowest_worker_acked_it():
    sw, job = switch(Mode.AUGMENTED, slots=2)                  # W = 1: PSN 2 needs the slot of PSN 0
    out = _complete(sw, job, 0)
    assert [x[2] for x in out[:1]] == [Ack(0, Syndrome.ACK, 1)] and len(out) == 3
    _complete(sw, job, 1)
    ack(sw, job, 0, Ack(1))                                    # worker 0 has results 0 and 1, worker 1 none
    assert send(sw, job, 0, 2) == [] and sw.counters[Counter.DROP_BUFFER_BUSY] == 1
    ack(sw, job, 1, Ack(0))
    assert send(sw, job, 0, 2) == [(0, 0x100, Ack(2, Syndrome.ACK, 3))]


def test_mode_iii_sends_results_again_on_a_nak_and_on_its_timer():
    sw, job = switch(Mode.AUGMENTED, slots=4)
    _complete(sw, job, 0)
    _complete(sw, job, 1)
    m = sw.modes[job.job]
    assert sw.deadline == 1.0 and m.timers == [1.0, 1.0]
    assert sw.on_timer(0.5) == []
    again = ack(sw, job, 1, Ack(0, Syndrome.NAK_SEQ, 0))       # worker 1 lost result 0 and saw 1
    assert [(p, x.psn) for p, _, x in again] == [(1, 0), (1, 1)] and m.timers == [1.0, 1.5]
    late = decoded(sw.on_timer(1.0))                           # worker 0's ACKs were lost
    assert [(p, x.psn) for p, _, x in late] == [(0, 0), (0, 1)]
    assert sw.counters[Counter.HOP_RESENDS] == 4
    ack(sw, job, 0, Ack(1))
    ack(sw, job, 1, Ack(1))
    assert sw.deadline is None and [e.bitmap for e in m.entries] == [0, 0, 0, 0]


@pytest.mark.parametrize("mode", [Mode.AUGMENTED, Mode.TERMINATED])
def test_the_mutation_frees_a_result_at_the_first_ack(mode):
    sw, job = switch(mode, slots=2)
    m = sw.modes[job.job]
    m.free_on_first_ack = True
    _complete(sw, job, 0)
    ack(sw, job, 0, Ack(0))
    # Worker 1 has not ACKed result 0, and its slot is free: the bug.
    if mode is Mode.AUGMENTED:
        assert m.entries[0].bitmap == 0
    else:
        assert m.slots[0].free and m.holding(m.requesters[1].unacked[0]) is None


def test_mode_jobs_leave_with_their_state():
    sw, job = switch(Mode.AUGMENTED)
    _complete(sw, job, 0)
    sw.remove_job(job.job)
    assert sw.modes == {} and sw.deadline is None


# -- Modes II and III on a tree (docs/protocol.md section 10.1) ------------------------

UP = Uplink(port=3, mac="02:00:00:00:02:00", ip="10.0.2.1", qpn=0x10000, rkey=0x4A0B0001, result_qpn=0x20002,
            result_rkey=0x5E5F0002, result_va=0x7F0000000000)


def below(mode, slots=4, **kw):
    """A switch with a job of two children below a parent (UP); ``kw`` replaces fields of the job."""
    sw = ModelSwitch(SwitchSpec(ports=4, slots=8, chunk_bytes=CHUNK), hop_timeout=1.0)
    job = dataclasses.replace(make_job(mode, slots=slots), parent=UP, **kw)
    sw.add_job(job)
    return sw, job


def from_parent(sw, item, rkey=UP.result_rkey):
    """Deliver ``item`` (a result Packet or an Ack) from the parent to the uplink's result QPN."""
    to = rc.Address(eth_dst=wire.mac_bytes(sw.spec.mac), eth_src=wire.mac_bytes(UP.mac), ip_src=wire.ip_bytes(UP.ip),
                    ip_dst=wire.ip_bytes(sw.spec.ip), udp_sport=qp_udp_sport(UP.result_qpn),
                    dest_qpn=UP.result_qpn, rkey=rkey)
    return decoded(sw.receive(UP.port, rc.encode(item, to)))


def result(psn, payload=None, chunk=None, fp32=False, **kw):
    chunk = psn if chunk is None else chunk
    payload = (lanes(0, psn) + lanes(1, psn)).astype(">i4").tobytes() if payload is None else payload
    pkt = Packet(Opcode.RC_RDMA_WRITE_ONLY_IMM, psn, payload, True, UP.result_va + (chunk % 4) * CHUNK, CHUNK,
                 encode_imm(chunk, fp32))
    return dataclasses.replace(pkt, **kw)


def complete(sw, job, psn):
    send(sw, job, 0, psn)
    return send(sw, job, 1, psn)


# -- Mode II ---------------------------------------------------------------------------

def test_mode_ii_below_the_root_sends_its_partial_up_with_the_same_psn():
    sw, job = below(Mode.TRANSLATED)
    send(sw, job, 0, 0)
    ((port, qpn, pkt),) = send(sw, job, 1, 0)
    assert (port, qpn) == (UP.port, UP.qpn)
    assert pkt.opcode == Opcode.RC_RDMA_WRITE_ONLY and pkt.psn == 0 and pkt.va == 0 and pkt.length == CHUNK
    assert (np.frombuffer(pkt.payload, ">i4") == lanes(0, 0) + lanes(1, 0)).all()
    assert sw.tree_counters[TreeCounter.UP_PARTIALS] == 1 and sw.counters[Counter.COMPLETED] == 0


def test_mode_ii_below_the_root_resends_its_partial_for_a_psn_behind():
    sw, job = below(Mode.TRANSLATED)
    send(sw, job, 0, 0)
    assert send(sw, job, 0, 0) == []                                 # not complete yet: nothing
    complete(sw, job, 0)
    ((port, _, pkt),) = send(sw, job, 0, 0)
    assert port == UP.port and pkt.psn == 0 and sw.tree_counters[TreeCounter.UP_RESENDS] == 1


def test_mode_ii_below_the_root_sends_the_parents_result_to_every_child_unchanged():
    sw, job = below(Mode.TRANSLATED)
    complete(sw, job, 0)
    for _ in range(2):                                               # a resent result goes down again
        out = from_parent(sw, result(0))
        assert [(p, q) for p, q, _ in out] == [(0, 0x100), (1, 0x101)]
        for w, (_, _, pkt) in enumerate(out):
            assert pkt.psn == 0 and pkt.va == job.workers[w].result_va and decode_imm(pkt.imm) == (0, False, False)
            assert pkt.payload == result(0).payload
    assert sw.tree_counters[TreeCounter.RX_PARENT] == 2
    assert from_parent(sw, result(1)) == [] and sw.tree_counters[TreeCounter.DROP_PARENT_STALE] == 1
    assert from_parent(sw, result(0), rkey=1) == [] and sw.counters[Counter.DROP_BAD_RKEY] == 1
    assert from_parent(sw, result(0, va=UP.result_va + CHUNK)) == [] and sw.counters[Counter.DROP_BAD_ADDRESS] == 1
    assert from_parent(sw, Ack(0)) == [] and sw.counters[Counter.DROP_BAD_OPCODE] == 1   # Mode II: no partial ACKs


def test_mode_ii_host_acks_are_reflected_at_their_own_switch():
    sw, job = below(Mode.TRANSLATED)
    assert ack(sw, job, 1, Ack(0)) == [(1, 0x101, Ack(0))] and sw.counters[Counter.ACK_REFLECTED] == 1


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED])
def test_a_promoted_partial_goes_up_with_its_promotion_bits_and_the_parent_merges_it(mode):
    sw, job = below(mode)
    big = Packet(Opcode.RC_RDMA_WRITE_ONLY, 0, np.full(LANES, 2**31 - 1, ">i4").tobytes(), True, 0, CHUNK)
    send(sw, job, 0, 0, payload=big.payload)
    (partial,) = [x for x in send(sw, job, 1, 0, payload=big.payload) if x[0] == UP.port]
    pkt = partial[2]
    assert pkt.opcode == Opcode.RC_RDMA_WRITE_ONLY_IMM and pkt.length == CHUNK + CHUNK // 32
    assert decode_imm(pkt.imm) == (0, True, False) and sw.tree_counters[TreeCounter.UP_PROMOTED] == 1

    root, rjob = switch(mode)                                        # the parent: worker 1 is a switch
    rjob = dataclasses.replace(rjob, subswitches={1})
    root.remove_job(rjob.job)
    root.add_job(rjob)
    send(root, rjob, 0, 0)
    out = send(root, rjob, 1, 0, opcode=Opcode.RC_RDMA_WRITE_ONLY_IMM, payload=pkt.payload, length=pkt.length,
               imm=pkt.imm)
    results = [x for _, _, x in out if isinstance(x, Packet)]
    state = arith.LaneState(LANES)
    arith.accumulate(state, lanes(0, 0), first=True)
    arith.merge(state, np.frombuffer(pkt.payload, ">u4", LANES), np.ones(LANES, bool))
    assert len(results) == 2 and results[0].payload == arith.emit(state).astype(">f4").tobytes()
    bad = send(root, rjob, 1, 1, opcode=Opcode.RC_RDMA_WRITE_ONLY_IMM, payload=pkt.payload, length=pkt.length,
               imm=pkt.imm)                                          # ImmDt names chunk 0, the VA chunk 1
    assert bad == [] and root.counters[Counter.DROP_BAD_ADDRESS] == 1
    assert send(root, rjob, 0, 1, opcode=Opcode.RC_RDMA_WRITE_ONLY_IMM, payload=pkt.payload, length=pkt.length,
                imm=encode_imm(1, True)) == []                       # a host may not send one
    assert root.counters[Counter.DROP_BAD_OPCODE] == 1


# -- Mode III ----------------------------------------------------------------------------

def test_mode_iii_below_the_root_keeps_partials_until_the_parent_acks_them():
    sw, job = below(Mode.AUGMENTED)
    m = sw.modes[job.job]
    complete(sw, job, 0)
    complete(sw, job, 1)
    assert (m.up_start, m.up_next, m.up_timer) == (0, 2, 1.0)
    assert from_parent(sw, Ack(0)) == [] and (m.up_start, m.up_timer) == (1, 1.0)
    again = from_parent(sw, Ack(1, Syndrome.NAK_SEQ))               # the parent lost partial 1
    assert [(p, x.psn) for p, _, x in again] == [(UP.port, 1)] and m.up_start == 1
    late = decoded(sw.on_timer(1.0))                                  # and the ACK of its resend
    assert [(p, x.psn) for p, _, x in late] == [(UP.port, 1)] and m.up_timer == 2.0
    assert sw.tree_counters[TreeCounter.UP_RESENDS] == 2 and sw.counters[Counter.HOP_RESENDS] == 2
    from_parent(sw, Ack(1))
    assert m.up_timer is None and sw.deadline is None


def test_mode_iii_below_the_root_takes_results_in_order_acks_them_and_sends_them_down():
    sw, job = below(Mode.AUGMENTED)
    m = sw.modes[job.job]
    complete(sw, job, 0)
    complete(sw, job, 1)
    assert from_parent(sw, result(1)) == [(UP.port, UP.qpn, Ack(0, Syndrome.NAK_SEQ, 0))]   # result 0 was lost
    assert from_parent(sw, result(1)) == []                          # one NAK per gap
    out = from_parent(sw, result(0))
    assert out[0] == (UP.port, UP.qpn, Ack(0, Syndrome.ACK, 1))
    assert [(p, x.psn) for p, _, x in out[1:]] == [(0, 0), (1, 0)] and out[1][2].payload == result(0).payload
    assert m.up_start == 1 and m.timers == [1.0, 1.0]               # the result released partial 0
    assert from_parent(sw, result(0)) == [(UP.port, UP.qpn, Ack(0, Syndrome.ACK, 1))]       # behind: re-ACK
    c, t = sw.counters, sw.tree_counters
    assert (c[Counter.NAK_SENT], c[Counter.DROP_PSN_AHEAD], t[TreeCounter.DUP_PARENT], t[TreeCounter.RX_PARENT]) \
        == (1, 2, 1, 1)


def test_mode_iii_below_the_root_frees_a_slot_when_its_result_came_and_the_slowest_child_acked():
    sw, job = below(Mode.AUGMENTED, slots=2)                         # W = 1: PSN 2 needs the slot of PSN 0
    complete(sw, job, 0)
    complete(sw, job, 1)
    ack(sw, job, 0, Ack(0))
    ack(sw, job, 1, Ack(0))                                          # no result yet: ACKs of nothing
    assert send(sw, job, 0, 2) == [] and sw.counters[Counter.DROP_BUFFER_BUSY] == 1
    from_parent(sw, result(0))
    ack(sw, job, 0, Ack(0))
    assert send(sw, job, 0, 2) == [] and sw.counters[Counter.DROP_BUFFER_BUSY] == 2
    ack(sw, job, 1, Ack(0))
    assert send(sw, job, 0, 2) == [(0, 0x100, Ack(2, Syndrome.ACK, 3))]


def test_mode_iii_below_the_root_sends_results_again_to_a_child_that_naks():
    sw, job = below(Mode.AUGMENTED)
    complete(sw, job, 0)
    from_parent(sw, result(0))
    again = ack(sw, job, 1, Ack(0, Syndrome.NAK_SEQ))
    assert [(p, x.psn) for p, _, x in again] == [(1, 0)] and again[0][2].payload == result(0).payload
# -- Mode I: the switch is every host's RC endpoint (docs/protocol.md section 6.4) -----------------

def results(out):
    """(port, result PSN, chunk, lanes) of the result packets among the switch's frames."""
    return [(p, x.psn, decode_imm(x.imm)[0], np.frombuffer(x.payload, ">i4").tolist())
            for p, _, x in out if isinstance(x, Packet)]


def acks(out):
    return [(p, x) for p, _, x in out if isinstance(x, Ack)]


def summed(*pairs):
    """The lanes of the sum of the contributions (worker, PSN) as a list."""
    return sum(lanes(w, p).astype(np.int64) for w, p in pairs).tolist()


def test_mode_i_in_order_is_acked_and_a_complete_slot_sends_results_from_the_switchs_own_psns():
    sw, job = switch(Mode.TERMINATED)
    assert send(sw, job, 0, 0) == [(0, 0x100, Ack(0, Syndrome.ACK, 1))]
    out = send(sw, job, 1, 0)
    assert acks(out) == [(1, Ack(0, Syndrome.ACK, 1))]
    assert results(out) == [(0, 0, 0, summed((0, 0), (1, 0))), (1, 0, 0, summed((0, 0), (1, 0)))]
    for w, (_, q, pkt) in enumerate(out[1:]):
        assert q == job.workers[w].qpn and pkt.opcode == Opcode.RC_RDMA_WRITE_ONLY_IMM and pkt.ackreq
        assert pkt.va == job.workers[w].result_va and pkt.length == CHUNK
    c = sw.counters
    assert (c[Counter.RX_CONTRIB], c[Counter.COMPLETED], c[Counter.ACK_SENT], c[Counter.TX_RESULTS]) == (2, 1, 2, 2)


def test_mode_i_rule_table_upward():
    """The responder's rules: duplicate -> re-ACK, not added; ahead -> one NAK per gap; a bad sequence -> NAK."""
    sw, job = switch(Mode.TERMINATED)
    send(sw, job, 0, 0)
    assert send(sw, job, 0, 0) == [(0, 0x100, Ack(0, Syndrome.ACK, 1))]            # duplicate: re-ACK
    assert send(sw, job, 0, 2) == [(0, 0x100, Ack(1, Syndrome.NAK_SEQ, 1))]        # ahead: NAK of the gap
    assert send(sw, job, 0, 3) == []                                              # the same gap: no second NAK
    assert send(sw, job, 0, 1) == [(0, 0x100, Ack(1, Syndrome.ACK, 2))]
    middle = dict(opcode=SegmentOpcode.RC_RDMA_WRITE_MIDDLE, va=None, length=None)
    assert send(sw, job, 0, 2, **middle) == [(0, 0x100, Ack(2, Syndrome.NAK_INVALID, 2))]
    out = send(sw, job, 1, 0)
    assert results(out)[0][3] == summed((0, 0), (1, 0))                            # the duplicate was not added
    c = sw.counters
    assert (c[Counter.DUP_CONTRIB], c[Counter.DROP_PSN_AHEAD], c[Counter.NAK_SENT], c[Counter.ACK_SENT],
            c[Counter.DROP_BAD_OPCODE]) == (1, 2, 1, 4, 1)


def test_mode_i_multi_packet_message_with_a_lost_middle_packet():
    sw, job = switch(Mode.TERMINATED)
    first = dict(opcode=SegmentOpcode.RC_RDMA_WRITE_FIRST, length=3 * CHUNK, ackreq=False)
    middle = dict(opcode=SegmentOpcode.RC_RDMA_WRITE_MIDDLE, va=None, length=None, ackreq=False)
    last = dict(opcode=SegmentOpcode.RC_RDMA_WRITE_LAST, va=None, length=None)
    assert send(sw, job, 0, 0, **first) == [(0, 0x100, Ack(0, Syndrome.ACK, 0))]  # ack_every 1; MSN 0: no message yet
    assert send(sw, job, 0, 2, **last) == [(0, 0x100, Ack(1, Syndrome.NAK_SEQ, 0))]  # MIDDLE PSN 1 was lost
    assert send(sw, job, 0, 1, **middle) == [(0, 0x100, Ack(1, Syndrome.ACK, 0))]  # the Go-Back-N
    assert send(sw, job, 0, 2, **last) == [(0, 0x100, Ack(2, Syndrome.ACK, 1))]
    out = [x for p in range(3) for x in results(send(sw, job, 1, p))]             # worker 1: three ONLY messages
    assert [(port, psn, chunk) for port, psn, chunk, _ in out] == [(0, 0, 0), (1, 0, 0), (0, 1, 1), (1, 1, 1),
                                                                    (0, 2, 2), (1, 2, 2)]
    # Packet p of worker 0's message is chunk p: its lanes are those send() made for PSN p.
    assert [x[3] for x in out[::2]] == [summed((0, p), (1, p)) for p in range(3)]


def test_mode_i_frees_a_slot_only_when_every_host_acked_its_result():
    sw, job = switch(Mode.TERMINATED, slots=2)
    m = sw.modes[job.job]
    for p in range(2):
        _complete(sw, job, p)
    ack(sw, job, 0, Ack(1))                                    # worker 0 has results 0 and 1, worker 1 none
    # Chunk 2 needs slot 0: not taken, an RNR NAK of PSN 2 (timer 1, 0.01 ms) for every copy of it.
    for n in (1, 2):
        assert send(sw, job, 0, 2) == [(0, 0x100, Ack(2, Syndrome.RNR_NAK | 1, 2))]
        assert sw.counters[Counter.DROP_BUFFER_BUSY] == sw.counters[Counter.RNR_NAK_SENT] == n
    assert m.responders[0].expected == 2 and sw.counters[Counter.NAK_SENT] == 0
    ack(sw, job, 1, Ack(0))
    assert send(sw, job, 0, 2) == [(0, 0x100, Ack(2, Syndrome.ACK, 3))]
    assert [s.done for s in m.slots] == [False, True] and list(m.order) == [1]


def test_mode_i_lost_ack_and_result_timeout_go_back_n():
    sw, job = switch(Mode.TERMINATED)
    for p in range(2):
        _complete(sw, job, p)
    assert sw.deadline == 1.0 and sw.on_timer(0.5) == []
    ack(sw, job, 0, Ack(1))                                    # worker 0's ACK of result 0 was lost: 1 covers it
    late = decoded(sw.on_timer(1.0))                           # worker 1 ACKed nothing: Go-Back-N from 0
    assert [(p, x.psn) for p, _, x in late] == [(1, 0), (1, 1)] and sw.counters[Counter.HOP_RESENDS] == 2
    again = ack(sw, job, 1, Ack(1, Syndrome.NAK_SEQ, 1))       # result 1 lost again: NAK of PSN 1
    assert [(p, x.psn) for p, _, x in again] == [(1, 1)] and sw.counters[Counter.HOP_RESENDS] == 3
    assert ack(sw, job, 1, Ack(1, Syndrome.NAK_SEQ, 1)) == []  # one Go-Back-N per NAK
    ack(sw, job, 1, Ack(1))
    assert sw.deadline is None and list(sw.modes[job.job].order) == []


def test_mode_i_retries_exhausted_put_the_qp_in_error():
    sw, job = switch(Mode.TERMINATED)
    _complete(sw, job, 0)
    ack(sw, job, 0, Ack(0))
    m = sw.modes[job.job]
    t = 1.0
    for _ in range(7):                                         # RESULT_RETRIES resends without progress
        assert [x.psn for _, _, x in decoded(sw.on_timer(t))] == [0]
        t += 1.0
    assert sw.on_timer(t) == [] and m.requesters[1] is None and sw.counters[Counter.QP_ERRORS] == 1
    assert list(m.order) == [] and m.slots[0].free  # worker 1 no longer counts: worker 0's ACK frees the slot
    assert send(sw, job, 1, 1) == [] and ack(sw, job, 1, Ack(0)) == []
    assert sw.counters[Counter.DROP_QP_ERROR] == 2 and sw.deadline is None


def test_mode_i_remote_nak_puts_the_qp_in_error():
    sw, job = switch(Mode.TERMINATED)
    _complete(sw, job, 0)
    assert ack(sw, job, 1, Ack(0, Syndrome.NAK_INVALID, 0)) == [] and sw.counters[Counter.QP_ERRORS] == 1


def test_mode_i_psns_wrap_at_2_24():
    sw, job = switch(Mode.TERMINATED)
    m = sw.modes[job.job]
    top = PSN_MOD - 1
    m.responders = [Responder(first_psn=top) for _ in range(2)]
    m.requesters = [Requester(first_psn=top, window=job.slots, mtu=CHUNK, timeout=1.0) for _ in range(2)]
    for p in (top, 0):
        send(sw, job, 0, p, chunk=p % 4)
        out = send(sw, job, 1, p, chunk=p % 4)
        assert acks(out) == [(1, Ack(p, Syndrome.ACK, 1 if p == top else 2))]
        assert [(port, psn) for port, psn, _, _ in results(out)] == [(0, p), (1, p)]
    for w in range(2):
        ack(sw, job, w, Ack(0))                                # ACKs both results, across the wrap
    assert list(m.order) == [] and sw.deadline is None


def test_mode_i_counts_bad_contributions():
    sw, job = switch(Mode.TERMINATED)
    bad = [(dict(opcode=Opcode.RC_RDMA_WRITE_ONLY_IMM, imm=0), Counter.DROP_BAD_OPCODE),
           (dict(payload=bytes(CHUNK - 4), length=CHUNK - 4), Counter.DROP_BAD_LENGTH),
           (dict(opcode=SegmentOpcode.RC_RDMA_WRITE_FIRST, length=CHUNK + 4), Counter.DROP_BAD_LENGTH),
           (dict(opcode=SegmentOpcode.RC_RDMA_WRITE_FIRST, length=CHUNK), Counter.DROP_BAD_LENGTH),
           (dict(va=CHUNK + 4), Counter.DROP_BAD_ADDRESS)]
    for kw, counter in bad:
        before = sw.counters[counter]
        assert send(sw, job, 0, 0, **kw) == [] and sw.counters[counter] == before + 1, kw
    pkt = Packet(Opcode.RC_RDMA_WRITE_ONLY, 0, bytes(CHUNK), True, 0, CHUNK)
    assert sw.receive(0, rc.encode(pkt, dataclasses.replace(to_switch(sw, job, 0), rkey=1))) == []
    assert sw.counters[Counter.DROP_BAD_RKEY] == 1
    assert ack(sw, job, 0, Ack(0)) == []                      # an ACK of a result never sent is ignored
    assert sw.modes[job.job].responders[0].expected == 0 and sw.counters[Counter.RX_CONTRIB] == 0


# -- Reduce and Broadcast in Modes II and III (section 11.1) ------------------------------------------------------

def rooted(mode, collective, root=1, n=3):
    sw = ModelSwitch(SwitchSpec(ports=4, slots=8, chunk_bytes=CHUNK), hop_timeout=1.0)
    job = dataclasses.replace(make_job(mode, n=n), collective=collective, root=root)
    sw.add_job(job)
    return sw, job


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED])
def test_a_reduce_sends_the_result_to_the_root_child_only(mode):
    sw, job = rooted(mode, Collective.REDUCE)
    for w in (0, 2):
        send(sw, job, w, 0)
    out = [o for o in send(sw, job, 1, 0) if isinstance(o[2], Packet)]
    assert [(p, q) for p, q, _ in out] == [(1, 0x101)]
    assert (np.frombuffer(out[0][2].payload, ">i4") == lanes(0, 0) + lanes(1, 0) + lanes(2, 0)).all()
    assert sw.counters[Counter.TX_RESULTS] == 1


def test_mode_ii_reduce_sends_the_root_ranks_ack_to_every_child_and_drops_any_other():
    sw, job = rooted(Mode.TRANSLATED, Collective.REDUCE)
    for w in range(3):
        send(sw, job, w, 0)
    out = ack(sw, job, 1, Ack(0, Syndrome.ACK, 1))
    assert [(p, q, a) for p, q, a in out] == [(w, 0x100 + w, Ack(0, Syndrome.ACK, 1)) for w in range(3)]
    assert sw.tree_counters[TreeCounter.ACK_DOWN] == 3 and sw.counters[Counter.ACK_REFLECTED] == 0
    assert ack(sw, job, 0, Ack(0, Syndrome.ACK, 1)) == []  # rank 0 gets no result: it has nothing to ACK
    assert sw.tree_counters[TreeCounter.DROP_NO_DATA] == 1


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED])
def test_a_broadcast_completes_with_the_root_child_and_drops_anyone_elses_lanes(mode):
    sw, job = rooted(mode, Collective.BROADCAST)
    assert send(sw, job, 0, 0) == [] and sw.tree_counters[TreeCounter.DROP_NO_DATA] == 1
    out = [o for o in send(sw, job, 1, 0) if isinstance(o[2], Packet)]
    assert [(p, q) for p, q, _ in out] == [(w, 0x100 + w) for w in range(3)]
    assert all((np.frombuffer(pkt.payload, ">i4") == lanes(1, 0)).all() for _, _, pkt in out)
    assert sw.counters[Counter.COMPLETED] == 1 and sw.counters[Counter.RX_CONTRIB] == 1


def test_mode_ii_broadcast_sends_the_lowest_ack_point_to_the_root_child():
    sw, job = rooted(Mode.TRANSLATED, Collective.BROADCAST)
    send(sw, job, 1, 0)
    send(sw, job, 1, 1)
    assert ack(sw, job, 0, Ack(1, Syndrome.ACK, 2)) == []         # rank 2 has ACKed nothing: the lowest point is 0
    assert ack(sw, job, 2, Ack(0, Syndrome.ACK, 1)) == []
    assert ack(sw, job, 1, Ack(1, Syndrome.ACK, 2)) == [(1, 0x101, Ack(0, Syndrome.ACK, 1))]
    assert ack(sw, job, 2, Ack(0, Syndrome.ACK, 1)) == [(1, 0x101, Ack(0, Syndrome.ACK, 1))]  # a re-ACK: again
    assert ack(sw, job, 2, Ack(1, Syndrome.NAK_SEQ, 1)) == [(1, 0x101, Ack(1, Syndrome.NAK_SEQ, 1))]
    assert ack(sw, job, 2, Ack(1, Syndrome.ACK, 2)) == [(1, 0x101, Ack(1, Syndrome.ACK, 2))]
    assert sw.tree_counters[TreeCounter.ACK_DOWN] == 4


def test_mode_iii_reduce_times_out_and_frees_for_the_root_child_only():
    sw, job = rooted(Mode.AUGMENTED, Collective.REDUCE)
    for w in range(3):
        send(sw, job, w, 0)
    m = sw.modes[job.job]
    assert m.timers[1] is not None and m.timers[0] is None and m.timers[2] is None
    assert [q for _, q, _ in decoded(sw.on_timer(1.0))] == [0x101]
    ack(sw, job, 1, Ack(0, Syndrome.ACK, 1))
    assert m.entries[0].bitmap == 0 and m.timers[1] is None  # the only receiver ACKed: the slot is free


# -- Reduce and Broadcast in Mode I (section 11.1): the switch ACKs what it takes, and sends results to receivers -----

def test_mode_i_reduce_acks_every_contribution_and_sends_the_result_to_the_root_child_only():
    sw, job = rooted(Mode.TERMINATED, Collective.REDUCE)
    m = sw.modes[job.job]
    for w in (0, 2):
        assert send(sw, job, w, 0) == [(w, 0x100 + w, Ack(0, Syndrome.ACK, 1))]   # taken: ACKed at once
    out = send(sw, job, 1, 0)
    assert acks(out) == [(1, Ack(0, Syndrome.ACK, 1))]
    assert results(out) == [(1, 0, 0, summed((0, 0), (1, 0), (2, 0)))]           # the root child's QP, PSN 0
    assert sw.deadline == 1.0 and [q for _, q, _ in decoded(sw.on_timer(1.0))] == [0x101]   # its timer alone
    assert ack(sw, job, 0, Ack(0)) == [] and sw.tree_counters[TreeCounter.DROP_NO_DATA] == 1  # rank 0 got none
    assert m.slots[0].done
    ack(sw, job, 1, Ack(0))                                      # the single receiver ACKed: the slot is free
    assert m.slots[0].free and sw.deadline is None and list(m.order) == []
    assert [q.stats["sent"] for q in m.requesters] == [0, 1, 0] and sw.counters[Counter.TX_RESULTS] == 2


def test_mode_i_broadcast_takes_the_root_childs_lanes_and_frees_when_every_receiver_acked():
    sw, job = rooted(Mode.TERMINATED, Collective.BROADCAST)
    m = sw.modes[job.job]
    assert send(sw, job, 0, 0) == [] and sw.tree_counters[TreeCounter.DROP_NO_DATA] == 1   # not ACKed either
    assert m.responders[0].expected == 0
    out = send(sw, job, 1, 0)
    assert acks(out) == [(1, Ack(0, Syndrome.ACK, 1))]
    assert results(out) == [(w, 0, 0, lanes(1, 0).tolist()) for w in range(3)]    # the root child's too
    ack(sw, job, 0, Ack(0))
    ack(sw, job, 1, Ack(0))
    assert m.slots[0].done                                       # rank 2 lacks it
    assert [(p, x.psn) for p, _, x in decoded(sw.on_timer(1.0))] == [(2, 0)]      # sent again to rank 2 alone
    ack(sw, job, 2, Ack(0))
    assert m.slots[0].free and sw.deadline is None
    assert (sw.counters[Counter.COMPLETED], sw.counters[Counter.RX_CONTRIB], sw.counters[Counter.HOP_RESENDS]) \
        == (1, 1, 1)


def test_mode_i_reduce_off_the_root_ranks_side_frees_a_slot_when_the_parent_acked_its_partial():
    sw, job = below(Mode.TERMINATED, slots=2, collective=Collective.REDUCE)
    m = sw.modes[job.job]
    for p in range(2):
        out = complete(sw, job, p)
        assert [(port, x.psn, x.va) for port, _, x in out if isinstance(x, Packet)] == [(UP.port, p, p * CHUNK)]
    # Slot 0 holds partial 0: an RNR NAK, so the host waits instead of spending its retries.
    assert send(sw, job, 0, 2) == [(0, 0x100, Ack(2, Syndrome.RNR_NAK | 1, 2))]
    assert sw.counters[Counter.DROP_BUFFER_BUSY] == sw.counters[Counter.RNR_NAK_SENT] == 1
    assert from_parent(sw, Ack(0)) == [] and list(m.order) == [1]   # the parent holds partial 0 now
    assert send(sw, job, 0, 2) == [(0, 0x100, Ack(2, Syndrome.ACK, 3))]
    assert from_parent(sw, result(0)) == [] and sw.tree_counters[TreeCounter.DROP_NO_DATA] == 1
    assert sw.counters[Counter.TX_RESULTS] == 0 and m.up_responder.expected == 0


def test_mode_i_broadcast_off_the_root_ranks_side_takes_the_parents_results_into_free_slots():
    sw, job = below(Mode.TERMINATED, collective=Collective.BROADCAST)
    assert send(sw, job, 0, 0) == [] and sw.tree_counters[TreeCounter.DROP_NO_DATA] == 1   # no child sends
    for p in range(4):
        out = from_parent(sw, result(p))
        assert out[0] == (UP.port, UP.qpn, Ack(p, Syndrome.ACK, p + 1))
        assert [(port, x.psn, x.payload) for port, _, x in out[1:]] == [(w, p, result(p).payload) for w in range(2)]
    rnr = (UP.port, UP.qpn, Ack(4, Syndrome.RNR_NAK | 1, 4))  # the parent waits and sends result 4 again
    assert from_parent(sw, result(4)) == [rnr] and sw.counters[Counter.DROP_BUFFER_BUSY] == 1   # slot 0 holds result 0
    ack(sw, job, 0, Ack(0))
    assert from_parent(sw, result(4)) == [rnr] and sw.counters[Counter.DROP_BUFFER_BUSY] == 2   # child 1 lacks it
    assert sw.counters[Counter.RNR_NAK_SENT] == 2
    ack(sw, job, 1, Ack(0))
    out = from_parent(sw, result(4))
    assert out[0] == (UP.port, UP.qpn, Ack(4, Syndrome.ACK, 5)) and [x.psn for _, _, x in out[1:]] == [4, 4]
    assert sw.tree_counters[TreeCounter.RX_PARENT] == 5 and sw.modes[job.job].up_requester.stats["sent"] == 0

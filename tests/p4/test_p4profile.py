"""The P4 profile model: sticky saturating lanes, the SATURATED flag, per-target frame checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from inagg.models import arith, icrc, wire
from inagg.models.job import ExceptionSpec, JobSpec, SwitchSpec, WorkerSpec
from inagg.models.p4profile import TNA, V1MODEL, P4ProfileSwitch, pinned, saturating_accumulate
from inagg.models.protocol import Counter, Opcode, decode_imm
from inagg.models.switch import ModelSwitch

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def reference(rows: list[list[int]]) -> list[int]:
    """Sticky saturating sum, one Python integer at a time."""
    acc = list(rows[0])
    for row in rows[1:]:
        acc = [a if a in (I32_MIN, I32_MAX) else min(I32_MAX, max(I32_MIN, a + x)) for a, x in zip(acc, row)]
    return acc


lane = st.one_of(st.integers(I32_MIN, I32_MAX), st.sampled_from([I32_MIN, I32_MAX, I32_MAX - 1, I32_MIN + 1, 0]))


@given(st.integers(1, 6).flatmap(lambda k: st.lists(st.lists(lane, min_size=5, max_size=5), min_size=k, max_size=k)))
def test_saturating_accumulate_matches_integer_reference(rows):
    state = arith.LaneState(5)
    for i, row in enumerate(rows):
        saturating_accumulate(state, np.array(row, np.int32), first=(i == 0))
    assert state.words.view(np.int32).tolist() == reference(rows)


def test_overflow_that_comes_back_stays_flagged():
    state = arith.LaneState(1)
    saturating_accumulate(state, np.array([I32_MAX - 1], np.int32), first=True)
    saturating_accumulate(state, np.array([5], np.int32))
    saturating_accumulate(state, np.array([-100], np.int32))
    assert state.words.view(np.int32).tolist() == [I32_MAX] and pinned(state.words).all()


def test_first_contribution_ignores_old_words():
    state = arith.LaneState(2)
    state.words[:] = np.array([I32_MAX, 7], np.int32).view(np.uint32)
    saturating_accumulate(state, np.array([3, 4], np.int32), first=True)
    assert state.words.view(np.int32).tolist() == [3, 4]


def test_lane_count_mismatch_is_refused():
    with pytest.raises(ValueError, match="contribution has 3 lanes, the slot 2"):
        saturating_accumulate(arith.LaneState(2), np.zeros(3, np.int32))


def make_job(n=3, slots=4, base=0, job=1):
    return JobSpec(job=job, rkey=0xC0DE, slot_base=base, slots=slots, workers=tuple(
        WorkerSpec(port=i % 2, mac=f"02:00:00:00:01:{i:02x}", ip=f"10.1.0.{i + 1}", qpn=0x200 + i,
                   rkey=0x900 + i, result_va=(i + 1) << 20, result_psn=i) for i in range(n)))


def contrib(spec, job, w, chunk, x, **kw):
    ws = job.workers[w]
    args = dict(eth_dst=wire.mac_bytes(spec.mac), eth_src=wire.mac_bytes(ws.mac), ip_src=wire.ip_bytes(ws.ip),
                ip_dst=wire.ip_bytes(spec.ip), udp_sport=0xD000, opcode=Opcode.UC_RDMA_WRITE_ONLY,
                dest_qpn=job.qpn(w), psn=0, va=chunk * spec.chunk_bytes, rkey=job.rkey,
                payload=np.asarray(x, np.int32).astype(">i4").tobytes())
    args.update(kw)
    return wire.build(**args)


def pair(target):
    spec = SwitchSpec(ports=2, slots=8, chunk_bytes=256)
    job = make_job()
    p4, ref = P4ProfileSwitch(target, spec), ModelSwitch(spec)
    p4.add_job(job)
    ref.add_job(job)
    return spec, job, p4, ref


def test_without_overflow_v1model_emits_what_the_model_switch_emits():
    spec, job, p4, ref = pair(V1MODEL)
    rng = np.random.default_rng(1)
    for chunk in range(6):
        for w in (2, 0, 1):
            f = contrib(spec, job, w, chunk, rng.integers(-1000, 1000, 64, dtype=np.int32))
            assert p4.receive(job.workers[w].port, f) == ref.receive(job.workers[w].port, f)
    assert p4.counters == ref.counters


def test_overflow_saturates_and_sets_imm_bit_30():
    spec, job, p4, ref = pair(V1MODEL)
    x = np.zeros(64, np.int32)
    x[3] = I32_MAX
    out = []
    for w in range(3):
        out += p4.receive(job.workers[w].port, contrib(spec, job, w, 0, x))
    assert len(out) == 3
    r = wire.parse(out[0][1])
    chunk, fp32, saturated = decode_imm(r.imm)
    assert (chunk, fp32, saturated) == (0, False, True)
    lanes = np.frombuffer(r.payload, ">i4")
    assert lanes[3] == I32_MAX and not lanes[np.arange(64) != 3].any()
    assert p4.counters[Counter.PROMOTED] == 1 and p4.counters[Counter.COMPLETED] == 1


def test_tna_skips_the_icrc_check_and_sends_a_zero_icrc():
    spec, job, p4, _ = pair(TNA)
    x = np.ones(64, np.int32)
    out = []
    for w in range(3):
        f = contrib(spec, job, w, 0, x)
        out += p4.receive(job.workers[w].port, f[:-4] + b"\xde\xad\xbe\xef")
    assert p4.counters[Counter.DROP_BAD_ICRC] == 0 and len(out) == 3
    for _, frame in out:
        assert frame[-4:] == bytes(4)
        assert not icrc.check(frame)  # a receiver that checks drops it; nothing stale passes as valid


def test_v1model_drops_a_bad_icrc():
    spec, job, p4, _ = pair(V1MODEL)
    f = contrib(spec, job, 0, 0, np.ones(64, np.int32))
    assert p4.receive(0, f[:-1] + bytes([f[-1] ^ 1])) == []
    assert p4.counters[Counter.DROP_BAD_ICRC] == 1


def test_other_layout_is_a_bad_length_before_the_icrc():
    spec, job, p4, ref = pair(V1MODEL)
    f = contrib(spec, job, 0, 0, np.ones(32, np.int32))  # a 128-byte chunk, bad ICRC as well
    f = f[:-1] + bytes([f[-1] ^ 1])
    p4.receive(0, f)
    ref.receive(0, f)
    assert p4.counters[Counter.DROP_BAD_LENGTH] == 1 and ref.counters[Counter.DROP_BAD_ICRC] == 1


def test_non_roce_udp_stays_non_roce():
    spec, job, p4, _ = pair(TNA)
    f = bytearray(contrib(spec, job, 0, 0, np.ones(32, np.int32)))
    f[36:38] = (53).to_bytes(2, "big")
    p4.receive(0, bytes(f))
    assert p4.counters[Counter.DROP_NON_ROCE] == 1


def test_target_limits_are_checked_with_exact_messages():
    with pytest.raises(ValueError, match=r"the tna program is built for chunk_bytes in \(256,\), not 1024"):
        P4ProfileSwitch(TNA, SwitchSpec(chunk_bytes=1024))
    with pytest.raises(ValueError, match="the v1model program has no exception path: give a SwitchSpec with exception=None"):
        P4ProfileSwitch(V1MODEL, SwitchSpec(chunk_bytes=256, exception=ExceptionSpec()))
    with pytest.raises(TypeError, match="target must be a P4Target, not str"):
        P4ProfileSwitch("tna")
    sw = P4ProfileSwitch(TNA, SwitchSpec(chunk_bytes=256, slots=64))
    with pytest.raises(ValueError, match="the tna program takes at most 32 workers per job, not 33"):
        sw.add_job(make_job(n=33, slots=2))
    with pytest.raises(ValueError, match="port 9 does not exist: the switch has 4 ports"):
        sw.receive(9, b"")


@pytest.mark.parametrize("target", [V1MODEL, TNA], ids=lambda t: t.name)
def test_a_contribution_on_another_port_names_no_worker(target):
    """Issue 21, check 14: both programs compare the ingress port with the port of the QPN's ``workers`` entry."""
    spec, job, p4, ref = pair(target)
    x = np.ones(64, np.int32)
    for w in range(3):
        own = job.workers[w].port
        f = contrib(spec, job, w, 0, x)
        assert p4.receive(1 - own, f) == ref.receive(1 - own, f) == []
        p4.receive(own, f)
    assert p4.counters[Counter.DROP_UNKNOWN_QPN] == 3 and p4.counters[Counter.COMPLETED] == 1


@pytest.mark.parametrize("target", [V1MODEL, TNA], ids=lambda t: t.name)
@pytest.mark.parametrize("stray", [2**31 + 1, (1 << 30) + 1, 1 + 4 * 3])
def test_a_stray_chunk_does_not_wedge_a_free_slot(target, stray):
    """Issue 21, liveness: a stray takes FREE slot 1; the job's chunk 1 restarts it, since it never completed,
    and completes with the sum of its own contributions; the stray is then dropped."""
    spec, job, p4, ref = pair(target)
    rng = np.random.default_rng(3)
    p4.receive(0, contrib(spec, job, 0, stray, np.full(64, 1000, np.int32)))
    rows = [rng.integers(-100, 100, 64, dtype=np.int32) for _ in range(3)]
    out = []
    for w in range(3):
        out += p4.receive(job.workers[w].port, contrib(spec, job, w, 1, rows[w]))
    assert len(out) == 3 and p4.counters[Counter.DROP_STALE] + p4.counters[Counter.DROP_WINDOW] == 0
    assert (np.frombuffer(wire.parse(out[0][1][:-4] + icrc.icrc(out[0][1][:-4])).payload, ">i4")
            == np.sum(rows, axis=0)).all()
    assert p4.receive(0, contrib(spec, job, 0, stray, np.ones(64, np.int32))) == []
    assert p4.counters[Counter.DROP_STALE] + p4.counters[Counter.DROP_WINDOW] == 1

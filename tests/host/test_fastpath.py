"""The fast path builds what the reference codec builds, and parses results as the reference does."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inagg.host.controller import plan
from inagg.host.fastpath import ContribTemplate, ResultParser
from inagg.models import wire
from inagg.models.protocol import Counter, Opcode, decode_imm, encode_imm, qp_udp_sport
from inagg.models.switch import ModelSwitch

PLAN = plan([3], window=4)
SW, JOB = PLAN.switch, PLAN.jobs[0]


def reference_contribution(rank, chunk, lanes):
    me = JOB.workers[rank]
    return wire.build(eth_dst=wire.mac_bytes(SW.mac), eth_src=wire.mac_bytes(me.mac), ip_src=wire.ip_bytes(me.ip),
                      ip_dst=wire.ip_bytes(SW.ip), udp_sport=0xC000 | (me.qpn & 0x3FFF),
                      opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=JOB.qpn(rank), psn=chunk & 0xFFFFFF,
                      va=chunk * SW.chunk_bytes, rkey=JOB.rkey, payload=lanes.astype(">i4").tobytes())


def reference_result(rank, chunk, payload, *, fp32=False, psn=0, **override):
    me = JOB.workers[rank]
    fields = dict(eth_dst=wire.mac_bytes(me.mac), eth_src=wire.mac_bytes(SW.mac), ip_src=wire.ip_bytes(SW.ip),
                  ip_dst=wire.ip_bytes(me.ip), udp_sport=qp_udp_sport(me.qpn),
                  opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, dest_qpn=me.qpn, psn=psn,
                  va=me.result_va + (chunk % JOB.slots) * SW.chunk_bytes, rkey=me.rkey, payload=payload,
                  imm=encode_imm(chunk, fp32))
    fields.update(override)
    return wire.build(**fields)


lanes_st = st.lists(st.integers(-2**31, 2**31 - 1), min_size=SW.lanes, max_size=SW.lanes).map(
    lambda v: np.array(v, np.int32))


@given(rank=st.integers(0, 2), chunks=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4),
       lanes=lanes_st)
def test_template_matches_reference_build(rank, chunks, lanes):
    rows = np.stack([np.roll(lanes, i) for i in range(len(chunks))])
    frames = ContribTemplate(SW, JOB, rank).build(np.array(chunks, np.int64), rows)
    for chunk, row, frame in zip(chunks, rows, frames):
        assert frame.tobytes() == reference_contribution(rank, chunk, row)


def test_template_frames_are_accepted_by_the_model_switch():
    sw = ModelSwitch(SW)
    sw.add_job(JOB)
    lanes = np.arange(3 * SW.lanes, dtype=np.int32).reshape(3, SW.lanes)
    out = []
    for rank in range(3):
        out += sw.receive(rank, ContribTemplate(SW, JOB, rank).build(np.array([5]), lanes[rank:rank + 1])[0].tobytes())
    assert len(out) == 3 and sw.counters[Counter.COMPLETED] == 1
    r = ResultParser(SW, JOB, 0).parse(out[0][1])
    assert r.chunk30 == 5 and not r.fp32
    assert np.array_equal(r.words.view(">i4"), lanes.sum(axis=0))


@pytest.mark.parametrize("bad, match", [
    (dict(lanes=np.zeros((1, 10), np.int32)), "lanes must be int32 of shape"),
    (dict(lanes=np.zeros((1, 256), np.int64)), "lanes must be int32 of shape"),
    (dict(chunks=np.array([1, 2])), "one chunk sequence per row"),
    (dict(chunks=np.array([2**32])), r"chunk sequences must be in 0..2\*\*32-1"),
])
def test_template_rejects_bad_input(bad, match):
    args = dict(chunks=np.array([0]), lanes=np.zeros((1, 256), np.int32)) | bad
    with pytest.raises(ValueError, match=match):
        ContribTemplate(SW, JOB, 0).build(**args)


def test_rank_is_validated():
    with pytest.raises(ValueError, match=r"rank must be an integer in 0..2, not 3"):
        ContribTemplate(SW, JOB, 3)
    with pytest.raises(ValueError, match=r"rank must be an integer in 0..2, not -1"):
        ResultParser(SW, JOB, -1)


def reference_verdict(frame, rank):
    """What a receiver built on the reference codec decides."""
    r = wire.parse(frame, SW.pkey)
    if isinstance(r, Counter):
        return r
    me = JOB.workers[rank]
    if not wire.has_reth(r.opcode) or r.opcode != Opcode.UC_RDMA_WRITE_ONLY_IMM:
        return Counter.DROP_BAD_OPCODE
    if r.dma_len != SW.chunk_bytes or r.pad:
        return Counter.DROP_BAD_LENGTH
    if r.dest_qpn != me.qpn:
        return Counter.DROP_UNKNOWN_QPN
    if r.rkey != me.rkey:
        return Counter.DROP_BAD_RKEY
    chunk, fp32, sat = decode_imm(r.imm)
    if r.va != me.result_va + (chunk % JOB.slots) * SW.chunk_bytes:
        return Counter.DROP_BAD_ADDRESS
    return (chunk, fp32, sat, r.payload)


def fast_verdict(frame, rank):
    r = ResultParser(SW, JOB, rank).parse(frame)
    if isinstance(r, Counter):
        return r
    return (r.chunk30, r.fp32, r.saturated, r.words.astype(">u4").tobytes())


GOOD = reference_result(1, 6, np.arange(SW.lanes, dtype=">i4").tobytes(), fp32=True, psn=3)


@given(st.lists(st.tuples(st.integers(0, len(GOOD) + 8), st.integers(0, 255)), max_size=3),
       st.integers(0, len(GOOD) + 8), st.integers(0, 2))
def test_parser_agrees_with_reference_on_mutated_frames(edits, cut, rank):
    f = bytearray(GOOD + bytes(8))
    for pos, val in edits:
        f[pos % len(f)] = val
    frame = bytes(f[:cut])
    assert fast_verdict(frame, rank) == reference_verdict(frame, rank)


@pytest.mark.parametrize("override, counter", [
    (dict(opcode=Opcode.RC_RDMA_WRITE_ONLY_IMM), Counter.DROP_BAD_OPCODE),
    (dict(opcode=Opcode.UC_RDMA_WRITE_ONLY, imm=None), Counter.DROP_BAD_OPCODE),
    (dict(dest_qpn=0x123), Counter.DROP_UNKNOWN_QPN),
    (dict(rkey=1), Counter.DROP_BAD_RKEY),
    (dict(va=0), Counter.DROP_BAD_ADDRESS),
    (dict(pkey=0x7FFF), Counter.DROP_BAD_HEADER),
    (dict(payload=bytes(8)), Counter.DROP_BAD_LENGTH),
])
def test_parser_drops_misaddressed_results(override, counter):
    override = dict(override)
    frame = reference_result(1, 6, override.pop("payload", bytes(SW.chunk_bytes)), **override)
    assert ResultParser(SW, JOB, 1).parse(frame) == counter == reference_verdict(frame, 1)


def test_parser_reads_good_results_and_ignores_router_fields():
    f = bytearray(GOOD)
    f[15] = 0x2E                     # TOS (DSCP) rewritten on the way
    f[22] = 17                       # TTL
    f[24:26] = wire.ipv4_checksum(bytes(f[14:24]) + b"\0\0" + bytes(f[26:34])).to_bytes(2, "big")
    r = ResultParser(SW, JOB, 1).parse(bytes(f))
    assert (r.chunk30, r.fp32, r.psn) == (6, True, 3)
    assert np.array_equal(r.words, np.arange(SW.lanes, dtype=np.uint32))


@given(rank=st.integers(0, 2), to=st.integers(0, 2), chunk=st.integers(0, 2**30 - 1), psn=st.integers(0, 2**24 - 1),
       fp32=st.booleans(), saturated=st.booleans(), tos=st.integers(0, 255), ttl=st.integers(0, 255),
       ip_id=st.integers(0, 0xFFFF), slot_shift=st.integers(-1, 1))
def test_whole_result_reader_agrees_with_the_check_chain(rank, to, chunk, psn, fp32, saturated, tos, ttl, ip_id,
                                                         slot_shift):
    # Well-formed results with every per-result field and router-rewritten field varied, some
    # for another worker or another ring slot: the fast path decides as the reference does.
    me = JOB.workers[to]
    frame = reference_result(to, chunk, np.arange(SW.lanes, dtype=">i4").tobytes(), psn=psn, tos=tos, ttl=ttl,
                             ip_id=ip_id, imm=encode_imm(chunk, fp32, saturated),
                             va=me.result_va + ((chunk + slot_shift) % JOB.slots) * SW.chunk_bytes)
    r = ResultParser(SW, JOB, rank).parse(frame)
    assert fast_verdict(frame, rank) == reference_verdict(frame, rank)
    if rank == to and not slot_shift:
        va = me.result_va + (chunk % JOB.slots) * SW.chunk_bytes
        assert (r.saturated, r.va, r.psn, r.zero_icrc) == (saturated, va, psn, False)


def test_good_results_take_the_whole_result_reader(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a good result went through the check chain")

    parser = ResultParser(SW, JOB, 1)
    monkeypatch.setattr(wire, "parse", refuse)
    r = parser.parse(bytearray(GOOD) + bytes(6))  # Ethernet padding after the datagram
    assert (r.chunk30, r.fp32, r.psn) == (6, True, 3)
    with pytest.raises(AssertionError, match="check chain"):
        parser.parse(GOOD[:-1] + bytes([GOOD[-1] ^ 1]))


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, len(GOOD) + 8), st.integers(0, 255),
                          st.integers(len(GOOD) - 2, len(GOOD) + 8)), max_size=6), st.integers(0, 2))
def test_a_batch_parses_as_each_frame_would(mutations, rank):
    # Good frames (with Ethernet padding too), corrupted ones and short ones, mixed in one batch.
    frames = []
    for kind, pos, val, cut in mutations:
        f = bytearray(GOOD + bytes(8))
        if kind == 1:
            f[pos % len(f)] = val
        frames.append(bytes(f[:cut] if kind == 2 else f[:len(GOOD) + pos % 9]))
    parser = ResultParser(SW, JOB, rank)
    got, drops = parser.parse_batch(frames)
    each = [parser.parse(f) for f in frames]
    assert drops == [r for r in each if isinstance(r, Counter)]
    # The same results as frame by frame (those the reference chain takes come last).
    taken = [r for r in each if not isinstance(r, Counter)]
    assert sorted(zip(got.chunk30.tolist(), got.fp32.tolist(), got.saturated.tolist(), got.zero_icrc.tolist(),
                      map(bytes, got.words.astype(">u4")))) == \
        sorted((r.chunk30, r.fp32, r.saturated, r.zero_icrc, r.words.astype(">u4").tobytes()) for r in taken)
    assert got.words.shape == (len(taken), SW.lanes)


def test_a_batch_of_good_results_takes_the_array_checks(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a good result went through the check chain")

    parser = ResultParser(SW, JOB, 1)
    monkeypatch.setattr(wire, "parse", refuse)
    other = reference_result(1, 2**30 - 1, bytes(SW.chunk_bytes), psn=2**24 - 1)
    got, drops = parser.parse_batch([GOOD, bytearray(GOOD) + bytes(6), other])
    assert drops == [] and got.chunk30.tolist() == [6, 6, 2**30 - 1] and got.fp32.tolist() == [True, True, False]
    with pytest.raises(AssertionError, match="check chain"):
        parser.parse_batch([GOOD[:-1] + bytes([GOOD[-1] ^ 1])])

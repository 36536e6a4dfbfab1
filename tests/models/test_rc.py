"""The RC endpoint (models/rc.py): a table of the RC rules, the frame codec, and a lossy-channel property."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.models import rc
from inagg.models.frame import Opcode, SegmentOpcode
from inagg.models.protocol import Counter
from inagg.models.rc import Ack, Packet, Requester, Responder, Syndrome

T = 1.0  # ACK timeout of every requester here


def _pair(first_psn=0, window=8, mtu=4, retries=3, ack_every=1):
    return (Requester(first_psn=first_psn, window=window, mtu=mtu, timeout=T, retries=retries),
            Responder(first_psn=first_psn, ack_every=ack_every))


def _deliver(resp, pkts):
    msgs, acks = [], []
    for p in pkts:
        m, a = resp.receive(p)
        msgs += m
        acks += a
    return msgs, acks


def _feed(req, acks, now=0.0):
    out = []
    for a in acks:
        out += req.receive(now, a)
    return out


def test_in_order_messages_are_delivered_and_acked():
    req, resp = _pair()
    pkts = [p for i in range(3) for p in req.post(0.0, bytes([i]) * 4, va=64 * i)]
    assert [p.opcode for p in pkts] == [Opcode.RC_RDMA_WRITE_ONLY] * 3 and [p.psn for p in pkts] == [0, 1, 2]
    msgs, acks = _deliver(resp, pkts)
    assert [(m.va, m.payload) for m in msgs] == [(64 * i, bytes([i]) * 4) for i in range(3)]
    assert [(a.psn, a.syndrome, a.msn) for a in acks] == [(0, Syndrome.ACK, 1), (1, Syndrome.ACK, 2),
                                                         (2, Syndrome.ACK, 3)]
    assert _feed(req, acks) == [] and req.completed == 3 and req.idle and req.deadline is None


def test_duplicate_is_re_acked_not_delivered_again():
    req, resp = _pair()
    (p,) = req.post(0.0, b"abcd", va=0)
    assert len(resp.receive(p)[0]) == 1
    msgs, acks = resp.receive(p)
    assert msgs == [] and acks == [Ack(0, Syndrome.ACK, 1)] and resp.stats["duplicate"] == 1


def test_psn_ahead_gets_one_nak_per_gap():
    req, resp = _pair()
    pkts = [p for i in range(6) for p in req.post(0.0, bytes(4), va=0)]
    _, acks = _deliver(resp, pkts[1:3])                  # PSN 0 lost: 1 and 2 are ahead
    assert acks == [Ack(0, Syndrome.NAK_SEQ, 0)]
    msgs, acks = _deliver(resp, pkts[0:2])               # the gap closes
    assert len(msgs) == 2 and [a.psn for a in acks] == [0, 1]
    _, acks = _deliver(resp, pkts[3:6])                  # PSN 2 lost: a new gap, a new NAK
    assert acks == [Ack(2, Syndrome.NAK_SEQ, 2)]


def test_requester_goes_back_n_on_a_nak_once():
    req, resp = _pair()
    pkts = [p for i in range(3) for p in req.post(0.0, bytes(4), va=0)]
    assert [p.psn for p in pkts] == [0, 1, 2]
    again = req.receive(0.5, Ack(1, Syndrome.NAK_SEQ, 1))   # PSN 0 arrived, 1 is missing
    assert [p.psn for p in again] == [1, 2] and req.una == 1 and req.completed == 1
    assert req.receive(0.5, Ack(1, Syndrome.NAK_SEQ, 1)) == []  # a second NAK of the same gap
    assert req.deadline == 0.5 + T


def test_lost_ack_is_covered_by_the_next():
    req, resp = _pair()
    pkts = [p for i in range(2) for p in req.post(0.0, bytes(4), va=0)]
    _, acks = _deliver(resp, pkts)
    assert _feed(req, acks[1:]) == [] and req.completed == 2 and req.idle


def test_ack_timeout_resends_everything_unacked():
    req, resp = _pair()
    pkts = [p for i in range(3) for p in req.post(0.0, bytes(4), va=0)]
    _deliver(resp, pkts)                                 # every ACK lost
    assert req.deadline == T and req.on_timer(T / 2) == []
    again = req.on_timer(T)
    assert again == pkts and req.stats["retries"] == 1 and req.deadline == 2 * T
    msgs, acks = _deliver(resp, again)
    assert msgs == [] and [a.psn for a in acks] == [2, 2, 2]  # duplicates: re-ACK of the newest PSN
    _feed(req, acks, 2 * T)
    assert req.completed == 3 and req.idle


def test_retries_exhausted_raise_the_typed_error():
    req, _ = _pair(retries=2)
    req.post(0.0, bytes(4), va=0)
    req.on_timer(T)
    req.on_timer(2 * T)
    with pytest.raises(rc.RetryExceededError, match="PSN 0 unacknowledged after 2 retries"):
        req.on_timer(3 * T)


def test_progress_restores_the_retry_count():
    req, resp = _pair(retries=1)
    pkts = [p for i in range(2) for p in req.post(0.0, bytes(4), va=0)]
    assert req.on_timer(T) == pkts
    req.receive(T, Ack(0, Syndrome.ACK, 1))
    assert [p.psn for p in req.on_timer(2 * T)] == [1]


def test_nak_other_than_sequence_error_is_a_remote_error():
    req, resp = _pair()
    req.post(0.0, bytes(4), va=0)
    with pytest.raises(rc.RemoteError, match="syndrome 0x61"):
        req.receive(0.0, Ack(0, Syndrome.NAK_INVALID, 0))


def test_psn_wraps_at_2_24():
    first = rc.PSN_MOD - 2
    req, resp = _pair(first_psn=first)
    pkts = [p for i in range(4) for p in req.post(0.0, bytes([i]) * 4, va=0)]
    assert [p.psn for p in pkts] == [first, first + 1, 0, 1]
    msgs, acks = _deliver(resp, pkts)
    assert len(msgs) == 4 and resp.expected == 2
    _feed(req, acks[:2])
    assert req.completed == 2 and req.una == 0
    _feed(req, acks[2:] + [Ack(first, Syndrome.ACK, 1)])     # an old ACK from before the wrap is ignored
    assert req.completed == 4 and req.idle and req.stats["ignored_ack"] == 1
    assert rc.psn_diff(0, first) == 2 and rc.psn_diff(first, 0) == -2 and rc.psn_add(first, 3) == 1


def test_multi_packet_message_with_a_lost_middle_packet():
    req, resp = _pair(mtu=4)
    pkts = req.post(0.0, b"aaaabbbbcccc", va=0x1000)
    assert [p.opcode for p in pkts] == [SegmentOpcode.RC_RDMA_WRITE_FIRST, SegmentOpcode.RC_RDMA_WRITE_MIDDLE,
                                        SegmentOpcode.RC_RDMA_WRITE_LAST]
    assert [p.ackreq for p in pkts] == [False, False, True] and pkts[0].length == 12
    msgs, acks = _deliver(resp, [pkts[0], pkts[2]])
    assert msgs == [] and acks == [Ack(0, Syndrome.ACK, 0), Ack(1, Syndrome.NAK_SEQ, 0)]
    again = _feed(req, acks)
    assert [p.psn for p in again] == [1, 2]
    msgs, acks = _deliver(resp, again)
    assert msgs == [rc.Message(0x1000, b"aaaabbbbcccc")] and acks[-1] == Ack(2, Syndrome.ACK, 1)
    _feed(req, acks)
    assert req.completed == 1


def test_take_places_each_packet_at_its_address_without_buffering_the_message():
    req, resp = _pair(mtu=4)
    pkts = req.post(0.0, b"aaaabbbbcccc", va=0x1000)
    assert resp.address(pkts[1]) is None and resp.address(pkts[0]) == 0x1000   # MIDDLE first: out of sequence
    seg, acks = resp.take(pkts[0])
    assert seg == rc.Segment(0x1000, b"aaaa", True, False) and acks == [Ack(0, Syndrome.ACK, 0)]
    assert resp.address(pkts[2]) is None and resp.address(pkts[1]) == 0x1004   # ahead, then the next packet
    assert resp.take(pkts[1])[0] == rc.Segment(0x1004, b"bbbb", False, False)
    assert resp.take(pkts[1]) == (None, [Ack(1, Syndrome.ACK, 0)])             # a duplicate: re-ACKed
    seg, acks = resp.take(pkts[2])
    assert seg == rc.Segment(0x1008, b"cccc", False, True) and acks == [Ack(2, Syndrome.ACK, 1)]
    assert resp.state()[4:] == (None, 0)                                       # no message open, nothing kept


def test_responder_coalesces_acks_but_always_answers_ackreq():
    req, resp = _pair(mtu=4, ack_every=2)
    pkts = req.post(0.0, bytes(20), va=0)                 # FIRST, 3 x MIDDLE, LAST (AckReq)
    _, acks = _deliver(resp, pkts)
    assert [a.psn for a in acks] == [1, 3, 4]


def test_out_of_sequence_opcode_is_refused():
    _, resp = _pair()
    _, acks = resp.receive(Packet(SegmentOpcode.RC_RDMA_WRITE_MIDDLE, 0, bytes(4)))
    assert acks == [Ack(0, Syndrome.NAK_INVALID, 0)] and resp.expected == 0


def test_window_limits_packets_outstanding():
    req, _ = _pair(window=2)
    pkts = [p for i in range(3) for p in req.post(0.0, bytes(4), va=0)]
    assert [p.psn for p in pkts] == [0, 1]
    assert [p.psn for p in req.receive(0.1, Ack(0))] == [2]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="window must be"):
        Requester(window=0)
    with pytest.raises(ValueError, match="first_psn must be"):
        Responder(first_psn=rc.PSN_MOD)
    with pytest.raises(ValueError, match="mtu must be"):
        Requester(mtu=6)


# -- frames -------------------------------------------------------------------

_TO = rc.Address(eth_dst=bytes(6), eth_src=b"\x02" * 6, ip_src=bytes([10, 0, 0, 1]), ip_dst=bytes([10, 0, 0, 2]),
                 udp_sport=0xC001, dest_qpn=0xA50041, rkey=0x1234)


@pytest.mark.parametrize("item", [
    Packet(Opcode.RC_RDMA_WRITE_ONLY, 5, bytes(range(8)), True, 0x40, 8),
    Packet(Opcode.RC_RDMA_WRITE_ONLY_IMM, rc.PSN_MOD - 1, bytes(4), True, 0x80, 4, 0x8000_0007),
    Packet(SegmentOpcode.RC_RDMA_WRITE_FIRST, 1, bytes(4), False, 0, 12),
    Packet(SegmentOpcode.RC_RDMA_WRITE_MIDDLE, 2, bytes(4)),
    Packet(SegmentOpcode.RC_RDMA_WRITE_LAST, 3, bytes(4), True),
    Ack(7, Syndrome.NAK_SEQ, 3),
])
def test_frames_round_trip(item):
    assert rc.decode(rc.encode(item, _TO)) == (_TO.dest_qpn, item)


def test_bad_frames_are_counted_drops():
    good = rc.encode(Ack(1), _TO)
    assert rc.decode(good[:-1] + bytes([good[-1] ^ 1])) == Counter.DROP_BAD_ICRC
    assert rc.decode(good, pkey=0x7FFF) == Counter.DROP_BAD_HEADER
    uc = bytearray(rc.encode(Packet(Opcode.RC_RDMA_WRITE_ONLY, 0, bytes(4), va=0, length=4), _TO))
    uc[42] = Opcode.UC_RDMA_WRITE_ONLY
    assert rc.decode(bytes(uc[:-4]) + rc._icrc.icrc(bytes(uc[:-4]))) == Counter.DROP_BAD_OPCODE
    assert rc.decode(good[:20]) == Counter.DROP_BAD_LENGTH


# -- the property: exactly once, in order, over a bad channel -------------------

_FAULT = st.sampled_from(["deliver", "deliver", "deliver", "lose", "duplicate", "timer"])


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=6), window=st.integers(1, 4),
       steps=st.lists(st.tuples(_FAULT, st.integers(0, 15)), max_size=80), first=st.sampled_from([0, rc.PSN_MOD - 3]))
def test_lossy_channel_delivers_each_message_once_in_order_or_raises(sizes, window, steps, first):
    req, resp = _pair(first_psn=first, window=window, mtu=4, retries=4, ack_every=2)
    now = 0.0
    msgs = [bytes([i]) * (4 * n) for i, n in enumerate(sizes)]
    flight = []  # (to responder?, item); any element may go next: reordering
    for i, m in enumerate(msgs):
        flight += [(True, p) for p in req.post(now, m, va=i)]
    got = []

    def step(kind, k):
        nonlocal now
        if kind == "timer" or not flight:
            if req.deadline is not None:
                now = req.deadline
                flight.extend((True, p) for p in req.on_timer(now))
            return
        item = flight[k % len(flight)]
        if kind == "lose":
            flight.remove(item)
        elif kind == "duplicate":
            flight.append(item)
        else:
            flight.remove(item)
            if item[0]:
                m, a = resp.receive(item[1])
                got.extend(m)
                flight.extend((False, x) for x in a)
            else:
                flight.extend((True, p) for p in req.receive(now, item[1]))

    try:
        for kind, k in steps:
            step(kind, k)
        for _ in range(10_000):                      # then a good channel: FIFO, no faults
            if req.idle:
                break
            step("deliver", 0)
        assert req.idle and req.completed == len(msgs)
    except rc.RetryExceededError:
        pass
    assert [m.payload for m in got] == msgs[:len(got)] and [m.va for m in got] == list(range(len(got)))


# -- RNR NAK: a responder that cannot take the next packet yet ------------------------------------------------

def test_responder_sends_an_rnr_nak_for_every_copy_of_a_busy_psn_and_changes_nothing():
    req, resp = _pair()
    pkts = [p for _ in range(2) for p in req.post(0.0, bytes(4), va=0)]
    before = resp.state()
    rnr = Ack(0, Syndrome.RNR_NAK | 1, 0)
    assert resp.refuse(pkts[0]) == resp.refuse(pkts[0]) == [rnr] and resp.state() == before
    assert resp.stats["rnr_nak"] == 2
    with pytest.raises(ValueError, match="PSN 1 is not the next packet"):
        resp.refuse(pkts[1])
    assert resp.take(pkts[1])[1] == [Ack(0, Syndrome.NAK_SEQ, 0)]   # the packet behind it is ahead, as before


def test_requester_waits_the_rnr_delay_and_resends_from_that_psn_without_spending_retries():
    req, resp = _pair(retries=0)
    pkts = [p for i in range(3) for p in req.post(0.0, bytes(4), va=4 * i)]
    resp.receive(pkts[0])
    # PSN 0 was taken; PSN 1 is refused (timer 5: 0.06 ms); PSN 2 behind it got the gap's sequence NAK.
    assert _feed(req, [Ack(1, Syndrome.RNR_NAK | 5, 1), Ack(1, Syndrome.NAK_SEQ, 1)]) == []
    assert req.una == 1 and req.completed == 1 and req.deadline == pytest.approx(0.06e-3)
    assert req.post(0.0, bytes(4), va=12) == []                   # nothing new goes out while it waits
    assert req.receive(0.0, Ack(1, Syndrome.RNR_NAK | 5, 1)) == []  # a duplicate restarts nothing
    assert req.on_timer(0.05e-3) == []
    assert [p.psn for p in req.on_timer(0.06e-3)] == [1, 2, 3] and req.deadline == pytest.approx(0.06e-3 + T)
    assert req.stats["retries"] == 0 and req.stats["rnr_nak"] == 1


@pytest.mark.parametrize("rnr_retries,refusals,fails", [(0, 1, True), (2, 2, False), (2, 3, True),
                                                        (rc.RNR_FOREVER, 1000, False)])
def test_rnr_retries_run_out_unless_seven(rnr_retries, refusals, fails):
    req = Requester(timeout=T, retries=0, rnr_retries=rnr_retries)
    req.post(0.0, bytes(4), va=0)
    now = 0.0

    def refuse_all():
        nonlocal now
        for _ in range(refusals):
            req.receive(now, Ack(0, Syndrome.RNR_NAK | 1, 0))
            now = req.deadline
            assert [p.psn for p in req.on_timer(now)] == [0]

    if fails:
        with pytest.raises(rc.RnrRetryExceededError, match=f"PSN 0 refused as not ready after {rnr_retries}"):
            refuse_all()
    else:
        refuse_all()
        assert req.receive(now, Ack(0, Syndrome.ACK, 1)) == [] and req.idle


def test_progress_restores_the_rnr_retry_count():
    req = Requester(timeout=T, rnr_retries=1)
    for i in range(2):
        req.post(0.0, bytes(4), va=4 * i)
    req.receive(0.0, Ack(0, Syndrome.RNR_NAK | 1, 0))
    req.on_timer(req.deadline)
    req.receive(0.0, Ack(1, Syndrome.RNR_NAK | 1, 1))   # PSN 0 arrived: progress, one RNR retry again
    assert [p.psn for p in req.on_timer(req.deadline)] == [1]

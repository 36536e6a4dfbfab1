"""The management frames' model: SipHash-2-4, the frame, and MgmtBridge's checks and counters."""

import re
from pathlib import Path

import pytest

from inagg.models.frame import ETHERNET, MGMT, MGMT_ETHER_TYPE, MGMT_FRAME
from inagg.models.mgmt import (RESPONSE, MgmtBridge, Op, RegOp, Status, parse_key, parse_response, request_frame,
                               siphash24)
from inagg.models.regmap import MGMT_STATS, RegMap

KEY = bytes(range(16))
BOARD, HOST = "02:00:00:00:00:fe", "02:00:00:00:01:00"

# The reference implementation's vectors (key 00..0f, message 00 .. len-1), output bytes as printed there.
VECTORS = {0: "310e0edd47db6f72", 1: "fd67dc93c539f874", 2: "5a4fa9d909806c0d", 7: "37d1018bf50002ab",
           8: "6224939a79f5f593", 15: "e545be4961ca29a1", 63: "724506eb4c328a95"}


@pytest.mark.parametrize("length", sorted(VECTORS))
def test_siphash_reference_vectors(length):
    assert siphash24(KEY, bytes(range(length))).to_bytes(8, "little").hex() == VECTORS[length]


def test_siphash_key_length():
    with pytest.raises(ValueError, match="management key must be 16 bytes"):
        siphash24(bytes(15), b"")


def test_key_text():
    assert parse_key(f"  {KEY.hex().upper()}\n") == KEY
    for bad in (KEY.hex()[:-2], KEY.hex() + "00", KEY.hex()[:-1] + "g", KEY.hex()[:16] + " " + KEY.hex()[16:], ""):
        with pytest.raises(ValueError, match=f"^a management key is 32 hex digits, not {re.escape(repr(bad))}$"):
            parse_key(bad)


class Registers:
    """A register map with the switch's MAC and IP (RW) and one read-only register; all else SLVERR."""

    def __init__(self):
        self.values = {RegMap.switch("MAC_HI"): 0x02_00, RegMap.switch("MAC_LO"): 0x0000_00FE,
                       RegMap.switch("IP"): 0, RegMap.switch("ID"): 0x1234}

    def read(self, addr):
        return self.values.get(addr)

    def write(self, addr, value):
        if addr not in self.values or addr == RegMap.switch("ID"):
            return False
        self.values[addr] = value
        return True


def bridge(key=KEY):
    regs = Registers()
    return MgmtBridge(key, regs.read, regs.write, addr_width=16), regs


def ask(b, op, seq, addr, data=0, key=KEY):
    frame, ops = b.receive(request_frame(key, dst=BOARD, src=HOST, op=op, seq=seq, addr=addr, data=data))
    return (None if frame is None else parse_response(KEY, frame)), ops, frame


def test_write_then_read_round_trip():
    b, regs = bridge()
    ip = RegMap.switch("IP")
    r, ops, frame = ask(b, Op.WRITE, 1, ip, 0x0A00_00FE)
    assert ops == [RegOp(True, ip, 0x0A00_00FE, True)] and regs.values[ip] == 0x0A00_00FE
    assert (r.op, r.status, r.seq, r.floor) == (Op.WRITE, Status.OK, 1, 1)
    eth = ETHERNET.unpack(frame)
    assert (eth["dst"], eth["src"]) == (0x02_00_00_00_01_00, 0x02_00_00_00_00_FE) and len(frame) == MGMT_FRAME
    r, ops, _ = ask(b, Op.READ, 5, ip)
    assert (r.status, r.data, r.floor) == (Status.OK, 0x0A00_00FE, 5) and ops == [RegOp(False, ip, 0x0A00_00FE, True)]
    assert b.counters["accepted"] == 2


def test_register_refusals_answer_slverr():
    b, _ = bridge()
    assert ask(b, Op.WRITE, 1, RegMap.switch("ID"), 1)[0].status == Status.SLVERR
    assert ask(b, Op.READ, 2, 0x0C)[0].status == Status.SLVERR  # unmapped
    r, ops, _ = ask(b, Op.READ, 3, 1 << 16)  # beyond the address bits: never reaches the map
    assert r.status == Status.SLVERR and ops == [RegOp(False, 1 << 16, 0, False)]
    assert b.counters["accepted"] == 3


def test_wrong_key_refused_silently_and_counted():
    b, regs = bridge()
    r, ops, frame = ask(b, Op.WRITE, 1, RegMap.switch("IP"), 7, key=bytes(16))
    assert frame is None and ops == [] and regs.values[RegMap.switch("IP")] == 0
    assert b.counters == {**dict.fromkeys(MGMT_STATS, 0), "bad_tag": 1} and b.floor == 0


def test_altered_request_refused():
    b, _ = bridge()
    f = bytearray(request_frame(KEY, dst=BOARD, src=HOST, op=Op.WRITE, seq=1, addr=RegMap.switch("IP"), data=7))
    f[MGMT.slice("data", ETHERNET.size).stop - 1] ^= 1
    assert b.receive(bytes(f)) == (None, []) and b.counters["bad_tag"] == 1


def test_replay_answered_with_floor_and_counted():
    b, regs = bridge()
    ip = RegMap.switch("IP")
    first = request_frame(KEY, dst=BOARD, src=HOST, op=Op.WRITE, seq=10, addr=ip, data=1)
    assert b.receive(first)[1]
    ask(b, Op.WRITE, 11, ip, 2)
    frame, ops = b.receive(first)
    r = parse_response(KEY, frame)
    assert ops == [] and regs.values[ip] == 2
    assert (r.status, r.seq, r.floor) == (Status.REPLAYED, 10, 11)
    assert ask(b, Op.READ, 11, ip)[0].status == Status.REPLAYED  # equal is not above
    assert b.counters["replayed"] == 2 and b.counters["accepted"] == 2


def test_reset_lowers_the_floor():
    b, _ = bridge()
    ask(b, Op.READ, 9, RegMap.switch("IP"))
    b.reset()
    assert b.floor == 0 and ask(b, Op.READ, 1, RegMap.switch("IP"))[0].status == Status.OK


@pytest.mark.parametrize("length", [ETHERNET.size, MGMT_FRAME - 1])
def test_truncated_frame_counted_malformed(length):
    b, _ = bridge()
    f = request_frame(KEY, dst=BOARD, src=HOST, op=Op.READ, seq=1, addr=0)[:length]
    assert b.receive(f) == (None, []) and b.counters["malformed"] == 1


def test_padding_is_ignored():
    b, _ = bridge()
    f = request_frame(KEY, dst=BOARD, src=HOST, op=Op.READ, seq=1, addr=RegMap.switch("IP")) + bytes(10)
    assert parse_response(KEY, b.receive(f)[0]).status == Status.OK


@pytest.mark.parametrize("op", [0, 3, Op.READ | RESPONSE])
def test_unknown_op_counted(op):
    b, _ = bridge()
    f = bytearray(request_frame(KEY, dst=BOARD, src=HOST, op=Op.READ, seq=1, addr=0))
    f[ETHERNET.size] = op
    assert b.receive(bytes(f)) == (None, []) and b.counters["bad_op"] == 1


def test_a_response_sent_back_is_not_a_request():
    b, _ = bridge()
    frame, _ = b.receive(request_frame(KEY, dst=BOARD, src=HOST, op=Op.WRITE, seq=1, addr=RegMap.switch("IP")))
    assert b.receive(frame) == (None, []) and b.counters["bad_op"] == 1


def test_other_frames_are_not_the_bridges():
    b, _ = bridge()
    assert b.receive(bytes(60)) == (None, []) and b.receive(bytes(5)) == (None, [])
    assert b.counters == dict.fromkeys(MGMT_STATS, 0)


def test_counters_readable_through_the_bridge():
    b, _ = bridge()
    ask(b, Op.READ, 1, 0, key=bytes(16))
    assert ask(b, Op.READ, 2, RegMap.mgmt_stat("bad_tag"))[0].data == 1
    assert ask(b, Op.READ, 3, RegMap.mgmt_stat("accepted"))[0].data == 2  # counted before it is read


def test_parse_response_refuses_wrong_key_and_requests():
    b, _ = bridge()
    frame, _ = b.receive(request_frame(KEY, dst=BOARD, src=HOST, op=Op.READ, seq=1, addr=0))
    assert parse_response(bytes(16), frame) is None
    assert parse_response(KEY, request_frame(KEY, dst=BOARD, src=HOST, op=Op.READ, seq=1, addr=0)) is None
    assert parse_response(KEY, frame[:-1]) is None


def test_request_checks_sequence_number():
    with pytest.raises(ValueError, match="sequence number"):
        request_frame(KEY, dst=BOARD, src=HOST, op=Op.READ, seq=0, addr=0)


def test_protocol_md_section_12_agrees_with_the_header():
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    section = text[text.index("## 12. Management frames"):]
    rows = re.findall(r"^\| (\d+)(?:-(\d+))? \| (\w+) \|", section, re.M)
    doc = [(int(a), int(b or a), "rsvd" if name == "reserved" else name) for a, b, name in rows]
    want, at = [], 0
    for f in MGMT.fields:
        want.append((at, at + f.bits // 8 - 1, f.name))
        at += f.bits // 8
    assert doc == want
    assert f"EtherType 0x{MGMT_ETHER_TYPE:04X}" in section and f"{MGMT_FRAME} bytes" in section


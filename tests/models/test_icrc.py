"""ICRC: against a real NIC's capture, against scapy, and its masking rules."""

import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from inagg.models import icrc, wire

# A CNP captured on a ConnectX-4 Lx, as published in scapy's RoCE test suite
# (test/contrib/roce.uts); its last 4 bytes are the ICRC the NIC computed.
CX4_CNP = bytes.fromhex(
    "e41d2dab2bc27cfe90643b32080045c2"
    "003c718c400040119161 0a0011010a00"
    "1201000012b7002800008100ffff4000"
    "01180000000000000000000000000000"
    "000000000000 82fd002a".replace(" ", "")
)


def test_matches_connectx4_capture():
    assert len(CX4_CNP) == 74
    assert icrc.icrc(CX4_CNP[:-4]) == bytes.fromhex("82fd002a")
    assert icrc.check(CX4_CNP)


def _scapy_frame(tos, ttl, opcode, pkey, dqpn, psn, fecn, payload):
    pkt = (Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02")
           / IP(src="10.0.0.1", dst="10.0.0.2", tos=tos, ttl=ttl, flags="DF")
           / UDP(sport=0xC123, dport=4791, chksum=0)
           / BTH(opcode=opcode, pkey=pkey, dqpn=dqpn, psn=psn, fecn=fecn, migreq=1)
           / Raw(payload))
    return bytes(pkt)


@given(
    tos=st.integers(0, 255), ttl=st.integers(1, 255), opcode=st.sampled_from([0x0A, 0x0B, 0x2A, 0x2B, 0x04, 0x11]),
    pkey=st.integers(0, 0xFFFF), dqpn=st.integers(0, 0xFFFFFF), psn=st.integers(0, 0xFFFFFF),
    fecn=st.integers(0, 1), words=st.integers(0, 300), seed=st.binary(min_size=4, max_size=4),
)
def test_equals_scapy(tos, ttl, opcode, pkey, dqpn, psn, fecn, words, seed):
    payload = (seed * (words + 1))[: 4 * words]
    frame = _scapy_frame(tos, ttl, opcode, pkey, dqpn, psn, fecn, payload)
    assert icrc.icrc(frame[:-4]) == frame[-4:]
    assert icrc.check(frame)


def _frame():
    return _scapy_frame(0x02, 64, 0x2A, 0xFFFF, 0xA50041, 7, 0, bytes(range(256)) * 4)


# Offsets in the frame of the fields the ICRC does not cover.
MASKED = {14 + 1, 14 + 8, 14 + 10, 14 + 11, 34 + 6, 34 + 7, 42 + 4}


def test_every_covered_bit_flip_is_detected():
    frame = bytearray(_frame())
    covered = [i for i in range(14, len(frame) - 4) if i not in MASKED]
    for i in covered:
        for bit in (0, 7):
            frame[i] ^= 1 << bit
            assert not icrc.check(frame), f"flip of bit {bit} at byte {i} went unnoticed"
            frame[i] ^= 1 << bit
    assert icrc.check(frame)


@pytest.mark.parametrize("offset", sorted(MASKED))
def test_masked_fields_do_not_change_the_icrc(offset):
    frame = bytearray(_frame())
    frame[offset] ^= 0xA5
    assert icrc.check(frame)


def test_ethernet_header_and_padding_are_not_covered():
    frame = bytearray(_frame())
    frame[0] ^= 0xFF
    assert icrc.check(bytes(frame) + b"\x00" * 7)


def test_flip_in_the_icrc_itself_is_detected():
    frame = bytearray(_frame())
    frame[-1] ^= 0x80
    assert not icrc.check(frame)


@pytest.mark.parametrize("cut", [1, 4, 100])
def test_truncated_frame_does_not_check(cut):
    assert not icrc.check(_frame()[:-cut])


def test_malformed_inputs():
    assert not icrc.check(b"")
    assert not icrc.check(b"\x00" * 80)
    with pytest.raises(ValueError, match="at least 54 bytes"):
        icrc.icrc(b"\x00" * 20)
    bad_type = bytearray(_frame())
    bad_type[12:14] = b"\x86\xdd"
    with pytest.raises(ValueError, match="IPv4"):
        icrc.icrc(bad_type)
    bad_ihl = bytearray(_frame())
    bad_ihl[14] = 0x46
    with pytest.raises(ValueError, match="IHL 5"):
        icrc.icrc(bad_ihl)


def test_wire_order_is_lsb_first():
    frame = _frame()
    assert struct.unpack("<I", icrc.icrc(frame[:-4]))[0] == icrc.icrc_value(frame[:-4])


def test_values_of_a_batch_are_each_frames_icrc():
    rng = np.random.default_rng(7)
    frames = [wire.build(eth_dst=bytes(6), eth_src=bytes(6), ip_src=bytes(4), ip_dst=bytes(4), udp_sport=int(s),
                         opcode=0x2B, dest_qpn=int(q), psn=int(q), va=0, rkey=1, payload=rng.bytes(64), imm=int(q),
                         tos=int(s) & 0xFF, ttl=int(q) & 0xFF)
              for s, q in rng.integers(0, 1 << 16, (5, 2))]
    rows = np.frombuffer(b"".join(frames), np.uint8).reshape(len(frames), -1)
    end = rows.shape[1] - 4
    assert icrc.values(rows, end).tolist() == [icrc.icrc_value(f[:end]) for f in frames]
    assert icrc.values(rows[:0], end).shape == (0,)

"""The reference frame codec: layouts against scapy, and the drop order of parse()."""

import struct

import pytest
from hypothesis import example, given, strategies as st
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from inagg.models import icrc, wire
from inagg.models.protocol import ETH_LEN, ICRC_LEN, IPV4_LEN, UDP_LEN, Counter, Opcode

MAC_A, MAC_B = wire.mac_bytes("02:00:00:00:00:01"), wire.mac_bytes("02:00:00:00:00:fe")
IP_A, IP_B = wire.ip_bytes("10.0.0.1"), wire.ip_bytes("10.0.0.254")


def contribution(payload=bytes(range(256)) * 4, **kw):
    args = dict(eth_dst=MAC_B, eth_src=MAC_A, ip_src=IP_A, ip_dst=IP_B, udp_sport=0xC001,
                opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=0xA50041, psn=5, va=3 * 1024, rkey=0x1234,
                payload=payload)
    args.update(kw)
    return wire.build(**args)


def test_layout_decodes_in_scapy():
    f = contribution()
    p = Ether(f)
    assert p[IP].len == len(f) - 14 and p[IP].flags == "DF" and p[IP].ttl == 64
    assert p[UDP].dport == 4791 and p[UDP].chksum == 0 and p[UDP].len == len(f) - 34
    assert p[BTH].opcode == 0x2A and p[BTH].dqpn == 0xA50041 and p[BTH].psn == 5 and p[BTH].migreq == 1
    # scapy has no RETH layer: read it at its offset.
    assert struct.unpack_from("!QII", f, 54) == (3 * 1024, 0x1234, 1024)
    assert IP(bytes(p[IP])).chksum == p[IP].chksum  # scapy agrees with our IPv4 checksum
    assert icrc.check(f)


@given(opcode=st.sampled_from(sorted(o for o in Opcode if wire.has_reth(o))), psn=st.integers(0, 0xFFFFFF), va=st.integers(0, 2**64 - 1),
       rkey=st.integers(0, 2**32 - 1), qpn=st.integers(0, 0xFFFFFF), words=st.integers(0, 64),
       imm=st.integers(0, 2**32 - 1), ackreq=st.booleans())
def test_build_parse_round_trip(opcode, psn, va, rkey, qpn, words, imm, ackreq):
    payload = bytes(range(words * 4 % 256)) + bytes(words * 4 - words * 4 % 256)
    kw = dict(opcode=opcode, psn=psn, va=va, rkey=rkey, dest_qpn=qpn, payload=payload, ackreq=ackreq,
              imm=imm if wire.has_imm(opcode) else None)
    r = wire.parse(contribution(**kw))
    assert not isinstance(r, Counter)
    assert (r.opcode, r.psn, r.va, r.rkey, r.dest_qpn, r.payload, r.ackreq) == (opcode, psn, va, rkey, qpn, payload, ackreq)
    assert r.imm == kw["imm"] and r.dma_len == len(payload)
    assert r.eth_src == MAC_A and r.ip_dst == IP_B and r.udp_sport == 0xC001

    # build() hands its BTH onward to encapsulate(), which takes a transport as it is: the frame's own
    # transport, wrapped again, gives the frame back.
    hdr = ETH_LEN + IPV4_LEN + UDP_LEN
    frame = contribution(**kw)
    assert wire.encapsulate(frame[hdr:-ICRC_LEN], eth_dst=MAC_B, eth_src=MAC_A, ip_src=IP_A, ip_dst=IP_B,
                            udp_sport=0xC001) == frame


def test_build_rejects_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 4"):
        contribution(payload=b"abc")
    with pytest.raises(ValueError, match="needs ImmDt"):
        contribution(opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM)
    with pytest.raises(ValueError, match="has no ImmDt"):
        contribution(imm=1)
    with pytest.raises(ValueError, match="6 bytes"):
        wire.mac_bytes(b"\x00")
    with pytest.raises(ValueError, match="not a MAC"):
        wire.mac_bytes("02:00")


def _set(frame, offset, fmt, value, fix_icrc=True, fix_ipsum=True):
    f = bytearray(frame)
    struct.pack_into(fmt, f, offset, value)
    if fix_ipsum:
        struct.pack_into("!H", f, 24, 0)
        struct.pack_into("!H", f, 24, wire.ipv4_checksum(bytes(f[14:34])))
    if fix_icrc:
        total = struct.unpack_from("!H", f, 16)[0]
        end = 14 + total
        f[end - 4:end] = icrc.icrc(bytes(f[:end - 4]))
    return bytes(f)


GOOD = contribution()


@pytest.mark.parametrize("frame,reason", [
    (b"", Counter.DROP_BAD_LENGTH),
    (GOOD[:13], Counter.DROP_BAD_LENGTH),
    (bytes(Ether() / ARP()), Counter.DROP_NON_ROCE),
    (GOOD[:12] + b"\x86\xdd" + GOOD[14:], Counter.DROP_NON_ROCE),
    (GOOD[:30], Counter.DROP_BAD_LENGTH),
    (_set(GOOD, 14, "!B", 0x46, fix_icrc=False), Counter.DROP_BAD_HEADER),
    (_set(GOOD, 20, "!H", 0x2000), Counter.DROP_BAD_HEADER),  # MF
    (_set(GOOD, 20, "!H", 0xC000), Counter.DROP_BAD_HEADER),  # the reserved flag bit, beside DF (issue 21, row 9)
    (_set(GOOD, 20, "!H", 0x0001), Counter.DROP_BAD_HEADER),  # fragment offset
    (_set(GOOD, 24, "!H", 0x1234, fix_ipsum=False), Counter.DROP_BAD_HEADER),
    (_set(GOOD, 23, "!B", 6), Counter.DROP_NON_ROCE),  # TCP
    (_set(GOOD, 16, "!H", len(GOOD) - 14 + 1), Counter.DROP_BAD_LENGTH),  # IP longer than frame
    (GOOD[:-1], Counter.DROP_BAD_LENGTH),  # truncated
    (_set(GOOD, 36, "!H", 4792), Counter.DROP_NON_ROCE),
    (_set(GOOD, 38, "!H", len(GOOD) - 34 - 4), Counter.DROP_BAD_LENGTH),  # UDP length
    (GOOD[:-1] + bytes([GOOD[-1] ^ 1]), Counter.DROP_BAD_ICRC),
    (GOOD[:-5] + bytes([GOOD[-5] ^ 1]) + GOOD[-4:], Counter.DROP_BAD_ICRC),
    (_set(GOOD, 43, "!B", 0x41), Counter.DROP_BAD_HEADER),  # TVer 1
    (_set(GOOD, 44, "!H", 0x7FFF), Counter.DROP_BAD_HEADER),  # P_Key
    (_set(GOOD, 66, "!I", 1020), Counter.DROP_BAD_LENGTH),  # DMA length
])
def test_parse_drop_reason(frame, reason):
    assert wire.parse(frame) is reason


def test_parse_ignores_ethernet_padding_and_masked_fields():
    f = _set(GOOD, 15, "!B", 0xB8, fix_icrc=False) + b"\x00" * 6
    r = wire.parse(f)
    assert not isinstance(r, Counter) and r.payload == bytes(range(256)) * 4


def test_ipv4_checksum_verifies_to_zero():
    hdr = GOOD[14:34]
    assert wire.ipv4_checksum(hdr) == 0


@given(st.binary(min_size=20, max_size=20))
@example(bytes(20))
@example(b"\xff\xff" + bytes(18))
@example(b"\x45\x00\xba\xff" + bytes(16))
def test_ipv4_checksum_is_the_ones_complement_of_the_word_sum(hdr):
    # RFC 1071: fold the 16-bit word sum's carries back in, then complement.
    s = sum(struct.unpack("!10H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    assert wire.ipv4_checksum(hdr) == ~s & 0xFFFF

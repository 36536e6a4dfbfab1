"""The frame description: its own rules, and the copies of it that are not generated from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inagg.models import frame, icrc, wire
from inagg.models.frame import BTH, IPV4, RETH, Field, Header, Opcode
from inagg.models.protocol import IMM_OPCODES, RETH_OPCODES

PROTOCOL_MD = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def test_field_rejects_bad_widths_and_values():
    with pytest.raises(ValueError, match="field width must be a positive integer, not 0"):
        Field("x", 0)
    with pytest.raises(ValueError, match="value 16 of field x does not fit in 4 bits"):
        Field("x", 4, 16)


def test_header_rejects_partial_bytes_and_repeated_names():
    with pytest.raises(ValueError, match="header h has 12 bits, not a whole number of bytes"):
        Header("h", (Field("a", 8), Field("b", 4)))
    with pytest.raises(ValueError, match="header h names a field twice"):
        Header("h", (Field("a", 8), Field("a", 8)))


def test_pack_takes_fixed_values_and_checks_the_rest():
    assert IPV4.pack(total_len=0x55, checksum=0, src=1, dst=2)[:10] == bytes.fromhex("45000055000040004011")
    with pytest.raises(ValueError, match="field ipv4.total_len has no fixed value: give it"):
        IPV4.pack(checksum=0, src=1, dst=2)
    with pytest.raises(TypeError, match="dlen"):
        RETH.pack(va=0, rkey=0, dlen=0)
    with pytest.raises(ValueError, match=r"bth.pad = 4 does not fit in 2 bits"):
        BTH.pack(opcode=0, pkey=0, dqpn=0, psn=0, pad=4)


def test_unpack_inverts_pack_field_by_field():
    for h in frame.HEADERS.values():
        values = {f.name: (0x5A5A5A5A5A5A5A5A >> (k % 3)) & ((1 << f.bits) - 1) for k, f in enumerate(h.fields)}
        raw = h.pack(**values)
        assert len(raw) == h.size
        assert h.unpack(b"\0\0" + raw, 2) == values


def test_sub_byte_fields_lie_where_the_bth_puts_them():
    assert frame.CONTRIBUTION.bit_span("bth.pad") == (8 * 42 + 10, 2)
    assert frame.CONTRIBUTION.span("bth.psn") == (42 + 9, 3)
    assert frame.RESULT.span("immdt.imm") == (70, 4)
    with pytest.raises(ValueError, match="field bth.pad does not fill whole bytes"):
        BTH.span("pad")
    with pytest.raises(KeyError, match="has no 'immdt' header"):
        frame.CONTRIBUTION.offset("immdt")


def test_opcode_sets_come_from_the_extension_headers():
    assert RETH_OPCODES == {Opcode.RC_RDMA_WRITE_ONLY, Opcode.RC_RDMA_WRITE_ONLY_IMM,
                            Opcode.UC_RDMA_WRITE_ONLY, Opcode.UC_RDMA_WRITE_ONLY_IMM}
    assert IMM_OPCODES == {Opcode.RC_RDMA_WRITE_ONLY_IMM, Opcode.UC_RDMA_WRITE_ONLY_IMM}
    assert frame.layout(Opcode.RC_ACK).headers[-1] is frame.AETH
    assert set(frame.OPCODE_HEADERS) == set(Opcode)


def test_icrc_masks_the_bytes_protocol_md_names():
    # docs/protocol.md 1.8: TOS (IPv4 byte 1), TTL (8), header checksum (10-11), UDP checksum, BTH byte 4.
    assert icrc.MASKED_OFFSETS == (1, 8, 10, 11, 20 + 6, 20 + 7, 20 + 8 + 4)


def _doc_sections() -> dict[str, tuple[int, str]]:
    """``### 1.k Name (n bytes...)`` sections of protocol.md: name -> (bytes, body)."""
    out = {}
    for m in re.finditer(r"^### 1\.\d+ (.+?) \((\d+) bytes[^\n]*\n(.*?)(?=^##)", PROTOCOL_MD, re.S | re.M):
        out[m.group(1)] = (int(m.group(2)), m.group(3))
    return out


_DOC_NAMES = {"ethernet": "Ethernet", "ipv4": "IPv4", "udp": "UDP", "bth": "BTH, base transport header",
              "reth": "RETH, RDMA extended transport header", "immdt": "ImmDt"}


@pytest.mark.parametrize("name", sorted(_DOC_NAMES))
def test_protocol_md_tables_agree_with_the_description(name):
    """Section 1's tables: each header's size, and every field boundary its byte (and bit) column draws."""
    header = frame.HEADERS[name]
    size, body = _doc_sections()[_DOC_NAMES[name]]
    assert size == header.size
    if name == "immdt":
        return  # its table splits the immediate's bits, not the header
    doc = set()
    for cells in re.findall(r"^\| (\d+(?:-\d+)?) \|(?: ([\d-]*) \|)?", body, re.M):
        first, _, last = cells[0].partition("-")
        lo, hi = 8 * int(first), 8 * int(last or first) + 8
        if cells[1]:
            top, _, bottom = cells[1].partition("-")
            lo, hi = 8 * int(first) + 7 - int(top), 8 * int(first) + 8 - int(bottom or top)
        doc |= {lo, hi}
    ours = {header.bit_offset(f.name) for f in header.fields} | {8 * header.size}
    # A table with a bit column draws every boundary; one without draws the byte-aligned ones.
    assert doc == (ours if name == "bth" else {b for b in ours if b % 8 == 0})


def test_wire_build_sends_every_fixed_value():
    f = wire.build(eth_dst=bytes(6), eth_src=bytes(6), ip_src=bytes(4), ip_dst=bytes(4), udp_sport=1,
                   opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=2, psn=3, va=0, rkey=4, payload=bytes(8))
    lay = frame.CONTRIBUTION
    for h in lay.headers:
        got = h.unpack(f, lay.offset(h.name))
        for fld in h.fields:
            if fld.value is not None:
                assert got[fld.name] == fld.value, f"{h.name}.{fld.name}"


def test_reader_reads_what_unpack_reads():
    f = wire.build(eth_dst=bytes(6), eth_src=bytes(6), ip_src=bytes(4), ip_dst=bytes(4), udp_sport=0xC001,
                   opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, dest_qpn=0xA50042, psn=0x123456, va=1 << 40, rkey=7,
                   payload=bytes(8), imm=0x8000_0003, ackreq=True)
    lay = frame.RESULT
    paths = ["bth.psn", "ipv4.ihl", "immdt.imm", "bth.ackreq", "ethernet.src", "reth.va"]
    expected = tuple(frame.HEADERS[p.split(".")[0]].unpack(f, lay.offset(p.split(".")[0]))[p.split(".")[1]]
                     for p in paths)
    assert lay.reader(*paths)(f) == expected == (0x123456, 5, 0x8000_0003, 1, 0, 1 << 40)
    with pytest.raises(KeyError, match="a frame of opcode UC_RDMA_WRITE_ONLY has no field 'immdt.imm'"):
        frame.CONTRIBUTION.reader("immdt.imm")

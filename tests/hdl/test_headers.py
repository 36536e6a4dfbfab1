"""hdl.headers: fields read at the description's offsets, headers built as the reference codec builds them."""

import pytest
from amaranth import Const, Module
from amaranth.sim import Simulator

from inagg.hdl.headers import field, header_bytes
from inagg.models import frame, wire
from inagg.models.protocol import Opcode

FIELDS = dict(eth_dst=bytes.fromhex("020000000001"), eth_src=bytes.fromhex("02000000aa02"),
              ip_src=bytes([10, 0, 0, 1]), ip_dst=bytes([10, 0, 0, 2]), udp_sport=0xC123, dest_qpn=0xA50042,
              psn=0x123456, va=0x7F00_0000_1400, rkey=0xC0DE0001, payload=bytes(range(16)), pkey=0xFFFF)


def _evaluate(exprs):
    """The values of combinational expressions of constants."""
    out = []

    async def bench(ctx):
        out.extend(ctx.get(e) for e in exprs)

    sim = Simulator(Module())
    sim.add_testbench(bench)
    sim.run()
    return out


@pytest.mark.parametrize("kind", [frame.CONTRIBUTION, frame.RESULT])
def test_field_reads_every_field_where_the_codec_puts_it(kind):
    f = wire.build(opcode=kind.opcode, imm=0x80000007 if kind is frame.RESULT else None, ackreq=True, **FIELDS)
    vec = Const(int.from_bytes(f[:kind.size], "little"), 8 * kind.size)
    paths = [(h, fl.name) for h in kind.headers for fl in h.fields]
    got = _evaluate([field(vec, kind, f"{h.name}.{name}") for h, name in paths])
    for (h, name), v in zip(paths, got):
        assert v == h.unpack(f, kind.offset(h.name))[name], f"{h.name}.{name}"


def test_header_bytes_builds_the_codec_header():
    f = wire.build(opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, imm=0x4000_0009, **FIELDS)
    lay = frame.RESULT
    values = {}
    for h in lay.headers:
        got = h.unpack(f, lay.offset(h.name))
        values.update({f"{h.name}.{fl.name}": got[fl.name] for fl in h.fields if fl.value is None})
    (hdr,) = _evaluate([header_bytes(lay, values)])
    assert hdr.to_bytes(lay.size, "little") == f[:lay.size]


def test_header_bytes_names_what_is_missing():
    with pytest.raises(ValueError, match="a frame of opcode UC_RDMA_WRITE_ONLY has no 'immdt' header"):
        header_bytes(frame.CONTRIBUTION, {"immdt.imm": 0})
    with pytest.raises(ValueError, match="field ethernet.dst has no fixed value: give it"):
        header_bytes(frame.CONTRIBUTION, {})
    with pytest.raises(ValueError, match="header udp has no field 'port'"):
        header_bytes(frame.CONTRIBUTION, {"udp.port": 0})

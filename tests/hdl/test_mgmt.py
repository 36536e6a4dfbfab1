"""The management bridge on the Amaranth simulator, against inagg.models.mgmt.MgmtBridge, at W = 64 and 512.

The bridge drives the real register block (:class:`~inagg.hdl.control.Control`) through the arbiter, beside an
external AXI4-Lite manager; the model's register map is the part of Control these requests touch
(:class:`inagg.testbench.mgmt.Registers`).
"""

import gc
import itertools
import warnings

import pytest
from amaranth import Module
from amaranth.hdl import UnusedElaboratable
from amaranth.lib import stream, wiring
from amaranth.sim import Simulator

from inagg.hdl.axis import beat_layout, beat_signature
from inagg.hdl.control import AXILiteSignature, Control
from inagg.hdl.mgmt import AXILiteArbiter, MgmtBridge, SipHashRounds
from inagg.models import regmap as rm
from inagg.models.frame import ETHERNET, MGMT, MGMT_FRAME, MGMT_TAGGED
from inagg.models.geometry import SwitchGeometry
from inagg.models.mgmt import MgmtBridge as ModelBridge
from inagg.models.mgmt import Op, Status, parse_response, request_frame, siphash24
from inagg.testbench.axil_sim import axil_read, axil_write
from inagg.testbench.mgmt import Registers
from inagg.testbench.streams import get_frame, put_frame

KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
BOARD, HOST = "02:00:00:00:00:fe", "02:00:00:00:01:07"
GEOMETRY = SwitchGeometry(ports=2, width=64, slots=16, chunk_bytes=256, jobs=2, workers=4)
REGMAP = rm.RegMap(2, 4)
IP, MAC_HI, MAC_LO = REGMAP.switch("IP"), REGMAP.switch("MAC_HI"), REGMAP.switch("MAC_LO")
# Cycles a response may take to come whole: about 40 (two hashes of 12 rounds, the access, the beats), twice that
# with the egress paused every other cycle; a bridge that never answers fails the test here instead of hanging it.
ANSWER = 400


class Harness(wiring.Component):
    """Control with the bridge and an external manager on the arbiter."""

    def __init__(self, width):
        self.control = Control(GEOMETRY, job_readers=1, event_sources=1, mgmt=True)
        self.bridge = MgmtBridge(width=width, key=KEY, addr_width=REGMAP.addr_width)
        self.arbiter = AXILiteArbiter(REGMAP.addr_width)
        super().__init__({"i": wiring.In(stream.Signature(beat_layout(width), always_ready=True)),
                          "o": wiring.Out(beat_signature(width)), "axil": wiring.In(AXILiteSignature(REGMAP.addr_width))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.control, m.submodules.bridge, m.submodules.arbiter = self.control, self.bridge, self.arbiter
        wiring.connect(m, wiring.flipped(self.axil), self.arbiter.a)
        wiring.connect(m, self.bridge.bus, self.arbiter.b)
        wiring.connect(m, self.arbiter.o, self.control.axil)
        wiring.connect(m, wiring.flipped(self.i), self.bridge.i)
        wiring.connect(m, self.bridge.o, wiring.flipped(self.o))
        m.d.comb += [self.bridge.mac.eq(self.control.switch.mac), self.control.mgmt_stats.eq(self.bridge.stats)]
        return m


def req(op, seq, addr, data=0, key=KEY):
    return request_frame(key, dst=BOARD, src=HOST, op=op, seq=seq, addr=addr, data=data)


def corrupt(frame, offset):
    f = bytearray(frame)
    f[offset] ^= 0x40
    return bytes(f)


SCENARIO = [
    req(Op.WRITE, 1, MAC_HI, 0x0200),
    req(Op.WRITE, 2, MAC_LO, 0x0000_00FE),
    req(Op.WRITE, 3, IP, 0x0A00_00FE),
    req(Op.READ, 4, IP),
    req(Op.READ, 7, REGMAP.switch("ID")) + bytes(20),           # padded: read as its first MGMT_FRAME bytes
    req(Op.WRITE, 8, REGMAP.switch("ID"), 5),                   # read-only: SLVERR
    req(Op.READ, 9, 1 << REGMAP.addr_width),                     # beyond the map: SLVERR without an access
    req(Op.READ, 10, 0x0F00),                                    # unmapped: SLVERR from Control
    req(Op.WRITE, 11, IP, 0xBAD, key=bytes(16)),                 # wrong key
    corrupt(req(Op.WRITE, 11, IP, 0xBAD), ETHERNET.size + 20),   # altered data
    corrupt(req(Op.WRITE, 11, IP, 0xBAD), MGMT_FRAME - 1),       # altered tag
    req(Op.WRITE, 3, IP, 0xBAD),                                 # replayed (below the floor)
    req(Op.WRITE, 10, IP, 0xBAD),                                # replayed (equal)
    req(Op.READ, 12, IP)[:MGMT_FRAME - 1],                       # truncated
    req(Op.READ, 12, IP)[:ETHERNET.size],                        # the header alone
    corrupt(req(Op.READ, 12, IP), ETHERNET.size),                # unknown op
    bytes(64),                                                   # not a management frame: ignored
    req(Op.READ, 12, IP),
] + [req(Op.READ, 13 + i, REGMAP.mgmt_stat(name)) for i, name in enumerate(rm.MGMT_STATS)]


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width", [64, 512])
def test_requests_against_the_model(width):
    dut = Harness(width)
    regs = Registers(REGMAP)
    model = ModelBridge(KEY, regs.read, regs.write, REGMAP.addr_width)
    got, want = [], []

    async def bench(ctx):
        for frame in SCENARIO:
            response, _ = model.receive(frame)
            want.append(response)
            await put_frame(ctx, dut.i, frame, width)
            if response is None:
                for _ in range(40):  # no answer comes: the bridge is idle again before the next frame
                    assert not ctx.get(dut.o.valid)
                    await ctx.tick()
                got.append(None)
            else:
                got.append(await get_frame(ctx, dut.o, width, pause=itertools.cycle([0, 1]), limit=ANSWER))
        assert ctx.get(dut.bridge.floor) == model.floor
        for name in rm.MGMT_STATS:
            assert await axil_read(ctx, dut.axil, REGMAP.mgmt_stat(name)) == (model.counters[name], 0), name

    run(dut, bench)
    assert got == want
    statuses = [None if f is None else parse_response(KEY, f).status for f in got]
    assert statuses[:8] == [Status.OK] * 5 + [Status.SLVERR] * 3
    assert statuses[11:13] == [Status.REPLAYED] * 2 and statuses[8:11] == [None] * 3
    assert model.counters == {"accepted": 9 + len(rm.MGMT_STATS), "malformed": 2, "bad_op": 1, "bad_tag": 3,
                              "replayed": 2, "busy": 0}
    assert parse_response(KEY, got[3]).data == 0x0A00_00FE


@pytest.mark.parametrize("width", [64, 512])
def test_frame_during_a_request_is_busy(width):
    """Back to back: the second request ends while the first is served, and is dropped as busy."""
    dut = Harness(width)

    async def bench(ctx):
        await put_frame(ctx, dut.i, req(Op.WRITE, 1, IP, 0x1234), width)
        await put_frame(ctx, dut.i, req(Op.WRITE, 2, IP, 0x5678), width)
        response = parse_response(KEY, await get_frame(ctx, dut.o, width, limit=ANSWER))
        assert (response.seq, response.status) == (1, Status.OK)
        for _ in range(40):
            assert not ctx.get(dut.o.valid)
            await ctx.tick()
        assert await axil_read(ctx, dut.axil, IP) == (0x1234, 0)
        assert await axil_read(ctx, dut.axil, REGMAP.mgmt_stat("busy")) == (1, 0)
        # The next frame right after a data frame is captured.
        await put_frame(ctx, dut.i, bytes(60), width)
        await put_frame(ctx, dut.i, req(Op.READ, 3, IP), width)
        assert parse_response(KEY, await get_frame(ctx, dut.o, width, limit=ANSWER)).data == 0x1234

    run(dut, bench)


def test_external_manager_beside_the_bridge():
    """The external manager's accesses and the bridge's interleave through the arbiter."""
    width = 64
    dut = Harness(width)

    async def bench(ctx):
        await put_frame(ctx, dut.i, req(Op.WRITE, 1, IP, 0x0A0B_0C0D), width)
        for value in range(3):  # while the bridge works on its request
            assert await axil_write(ctx, dut.axil, REGMAP.switch("PKEY"), value) == 0
            assert await axil_read(ctx, dut.axil, REGMAP.switch("PKEY")) == (value, 0)
        assert parse_response(KEY, await get_frame(ctx, dut.o, width, limit=ANSWER)).status == Status.OK
        assert await axil_read(ctx, dut.axil, IP) == (0x0A0B_0C0D, 0)

    run(dut, bench)


def test_no_answer_fails_within_the_bound():
    """A request that gets no answer (a wrong key) fails the wait for its response after ANSWER cycles."""
    width = 64
    dut = Harness(width)

    async def bench(ctx):
        await put_frame(ctx, dut.i, req(Op.READ, 1, IP, key=bytes(16)), width)
        with pytest.raises(AssertionError, match=f"no whole frame within {ANSWER} cycles"):
            await get_frame(ctx, dut.o, width, limit=ANSWER)

    run(dut, bench)


def test_siphash_rounds_match_the_model():
    headers = [bytes(MGMT_TAGGED), bytes(range(MGMT_TAGGED)), bytes([0xFF] * MGMT_TAGGED)]
    dut = SipHashRounds(KEY)
    seen = []

    async def bench(ctx):
        for h in headers:
            ctx.set(dut.header, int.from_bytes(h, "little"))
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycles = 1
            while not ctx.get(dut.done):
                await ctx.tick()
                cycles += 1
            seen.append((ctx.get(dut.tag), cycles))

    run(dut, bench)
    assert seen == [(siphash24(KEY, h), 13) for h in headers]


@pytest.mark.parametrize("kwargs, message", [
    ({"width": 64, "key": bytes(15), "addr_width": 16}, "Management key must be 16 bytes"),
    ({"width": 64, "key": "k" * 16, "addr_width": 16}, "Management key must be 16 bytes"),
    ({"width": 96, "key": KEY, "addr_width": 16}, "width"),
    ({"width": 64, "key": KEY, "addr_width": 33}, "Address width must be an integer in 2..32, not 33"),
])
def test_parameter_checks(kwargs, message):
    with warnings.catch_warnings():
        # The refused bridge was never meant to be elaborated.
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=message) as refused:
            MgmtBridge(**kwargs)
        del refused
        gc.collect()


def test_tagged_bytes_are_the_header_before_the_tag():
    assert MGMT_TAGGED == MGMT.span("tag")[0] and MGMT_FRAME == ETHERNET.size + MGMT.size

"""The Ethernet MAC's blocks in the Amaranth simulator: GMII framing, FCS, frame buffers, widths, counters."""

import gc
import random
import re
import warnings
import zlib

import pytest
from amaranth import ClockDomain, Module, Signal
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.mac import (BYTE_LAYOUT, IFG, MAC, MAX_FRAME, FrameBuffer, Downsizer, GMIIReceiver, GMIITransmitter,
                           Upsizer, _gray_counter)
from inagg.testbench.streams import get_frame, put_frame

PERIOD = 8e-9  # 125 MHz


def fcs(frame: bytes) -> bytes:
    """The Ethernet FCS of ``frame``, as it goes on the wire."""
    return zlib.crc32(frame).to_bytes(4, "little")


def on_wire(frame: bytes, *, good: bool = True, preamble: int = 7) -> bytes:
    """Preamble, SFD, ``frame`` and its FCS (corrupted unless ``good``)."""
    check = fcs(frame) if good else bytes(b ^ 0xFF for b in fcs(frame))
    return b"\x55" * preamble + b"\xd5" + frame + check


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 10_000 + n).randbytes(n)


async def drive_gmii(ctx, gmii, wire: bytes, *, domain="sync", er_at=None, gap=IFG):
    """Send ``wire`` on a GMII input, one byte per cycle, RX_ER at byte ``er_at``, then ``gap`` idle cycles."""
    for i, b in enumerate(wire):
        ctx.set(gmii.en, 1)
        ctx.set(gmii.data, b)
        ctx.set(gmii.er, int(i == er_at))
        await ctx.tick(domain)
    ctx.set(gmii.en, 0)
    ctx.set(gmii.er, 0)
    await ctx.tick(domain).repeat(gap)


async def put_bytes(ctx, stream, frame: bytes, stall=None):
    """Send ``frame`` on a byte stream; ``stall()`` true: an idle cycle first (again until it is false)."""
    for i, b in enumerate(frame):
        while stall is not None and stall():
            ctx.set(stream.valid, 0)
            await ctx.tick()
        ctx.set(stream.valid, 1)
        ctx.set(stream.payload.data, b)
        ctx.set(stream.payload.last, i == len(frame) - 1)
        await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


def refused(make, message):
    """``make()`` raises ValueError matching ``message``; the half-made component is never elaborated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=message) as caught:
            make()
        del caught
        gc.collect()


def run(dut, testbenches, *, clocks=("sync",), deadline=None):
    sim = Simulator(dut)
    for domain in clocks:
        sim.add_clock(PERIOD * (1.3 if domain == "sync" and len(clocks) > 1 else 1), domain=domain)
    for tb in testbenches:
        sim.add_testbench(tb, background=tb is not testbenches[0])
    sim.run_until(deadline) if deadline else sim.run()


# -- receiver ---------------------------------------------------------------------------------------------------

CASES = [  # (frame length without FCS, good FCS, RX_ER at, expected fate)
    (60, True, None, "good"), (1518, True, None, "good"), (100, True, None, "good"),
    (100, False, None, "fcs_error"), (100, True, 50, "fcs_error"), (59, True, None, "runt"),
    (2, True, None, "runt"), (0, True, None, "runt"), (1519, True, None, "long"), (2000, True, None, "long"),
]


def test_receiver_frames_and_fates():
    dut = GMIIReceiver()
    seen, fates = [], []

    async def send(ctx):
        for i, (n, good, er, _) in enumerate(CASES):
            await drive_gmii(ctx, dut.gmii, on_wire(payload(n, i), good=good, preamble=7 - i % 3), er_at=er,
                             gap=1 + i % 2)
        await ctx.tick().repeat(4)

    async def watch(ctx):
        frame, dropped = bytearray(), False
        async for _, _, valid, data, last, drop, *strobes in ctx.tick().sample(
                dut.o.valid, dut.o.payload.data, dut.o.payload.last, dut.drop,
                dut.good, dut.fcs_error, dut.runt, dut.long):
            if valid:
                frame.append(data)
                dropped |= drop
                if last:
                    seen.append((bytes(frame), dropped))
                    frame, dropped = bytearray(), False
            for name, s in zip(("good", "fcs_error", "runt", "long"), strobes):
                if s:
                    fates.append(name)

    run(dut, [send, watch])
    assert fates == [fate for *_, fate in CASES]
    emitted = [(payload(n, i), fate != "good") for i, (n, _, _, fate) in enumerate(CASES) if n + 4 >= 5]
    assert [f for f, _ in seen] == [f for f, _ in emitted]
    assert [d for _, d in seen] == [d for _, d in emitted]


def test_receiver_ignores_a_frame_without_sfd():
    dut = GMIIReceiver()
    fates = []

    async def send(ctx):
        await drive_gmii(ctx, dut.gmii, b"\x55" * 7 + b"\x12" + payload(60) + fcs(payload(60)))
        await drive_gmii(ctx, dut.gmii, on_wire(payload(64)))

    async def watch(ctx):
        async for _, _, good, bad, runt in ctx.tick().sample(dut.good, dut.fcs_error, dut.runt):
            fates.extend(["good"] * good + ["bad"] * bad + ["runt"] * runt)

    run(dut, [send, watch])
    assert fates == ["good"]


@pytest.mark.parametrize("max_frame", [63, 1 << 14, 1522.0])
def test_receiver_checks_its_parameter(max_frame):
    refused(lambda: GMIIReceiver(max_frame), r"^Maximum frame must be an integer from 64 to 16383, not ")


# -- transmitter ------------------------------------------------------------------------------------------------

def test_transmitter_pads_appends_fcs_and_keeps_the_gap():
    dut = GMIITransmitter()
    frames = [payload(n, 1) for n in (1, 59, 60, 61, 300, 1518, 60)]
    wire, sent = [], []

    async def feed(ctx):
        for frame in frames:
            await put_bytes(ctx, dut.i, frame)

    async def watch(ctx):
        async for _, _, en, data, er, done in ctx.tick().sample(dut.gmii.en, dut.gmii.data, dut.gmii.er, dut.sent):
            wire.append(data if en else None)
            assert not er
            sent.append(done)
            if sum(sent) == len(frames):
                return

    run(dut, [watch, feed])
    text = "".join("x" if b is not None else "." for b in wire)
    bursts = [bytes(wire[m.start():m.end()]) for m in re.finditer("x+", text)]
    gaps = [len(g) for g in re.findall(r"(?<=x)\.+(?=x)", text)]
    assert all(g >= IFG for g in gaps) and min(gaps) == IFG  # back to back at line rate
    assert text.index("x") >= IFG  # the gap after reset too
    assert bursts == [on_wire(f + bytes(max(0, 60 - len(f)))) for f in frames]


# -- frame buffer, widths ---------------------------------------------------------------------------------------

def test_frame_buffer_drops_bad_and_overflowing_frames():
    dut = FrameBuffer(BYTE_LAYOUT, 64, always_ready=True)
    frames = [(payload(20, 1), False), (payload(30, 2), True), (payload(40, 3), False), (payload(50, 4), False),
              (payload(70, 5), False), (payload(10, 6), True)]
    out, overflows = [], []

    async def feed(ctx):
        for frame, bad in frames:
            for i, b in enumerate(frame):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.data, b)
                ctx.set(dut.i.payload.last, i == len(frame) - 1)
                ctx.set(dut.drop, bad and i == len(frame) // 2)
                _, _, overflow = await ctx.tick().sample(dut.overflow)
                overflows.append(overflow)
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.drop, 0)
        await ctx.tick().repeat(300)

    async def drain(ctx):
        await ctx.tick().repeat(250)  # the reader waits until all are in: the 50-byte frame finds 3 places
        ctx.set(dut.o.ready, 1)
        frame = bytearray()
        async for _, _, valid, data, last in ctx.tick().sample(dut.o.valid, dut.o.payload.data, dut.o.payload.last):
            if valid:
                frame.append(data)
                if last:
                    out.append(bytes(frame))
                    frame = bytearray()

    run(dut, [feed, drain])
    assert out == [frames[0][0], frames[2][0]]
    # The 70-byte frame can never fit in 63 places: lost too. The bad ones are not overflows.
    assert sum(overflows) == 2


@pytest.mark.parametrize("depth", [2, 6, 1 << 17, "8"])
def test_frame_buffer_checks_its_depth(depth):
    refused(lambda: FrameBuffer(BYTE_LAYOUT, depth), r"^Frame buffer depth must be a power of two from 4 to 65536, not ")


@pytest.mark.parametrize("width", [64, 256])
def test_upsizer_then_downsizer_round_trip(width):
    from amaranth import Module
    from amaranth.lib import wiring

    up, down = Upsizer(width), Downsizer(width)
    m = Module()
    m.submodules.up, m.submodules.down = up, down
    wiring.connect(m, up.o, down.i)
    frames = [payload(n, width) for n in (1, 7, 8, 9, 31, 32, 33, 64, 65, 300)]
    got = []
    stall = random.Random(width)

    async def feed(ctx):
        for frame in frames:
            await put_bytes(ctx, up.i, frame, stall=lambda: stall.random() < 0.2)

    async def drain(ctx):
        frame = bytearray()
        while len(got) < len(frames):
            ctx.set(down.o.ready, stall.random() >= 0.3)
            _, _, valid, ready, data, last = await ctx.tick().sample(down.o.valid, down.o.ready, down.o.payload.data,
                                                                     down.o.payload.last)
            if valid and ready:
                frame.append(data)
                if last:
                    got.append(bytes(frame))
                    frame = bytearray()

    run(m, [drain, feed])
    assert got == frames


@pytest.mark.parametrize("width", [64, 256])
def test_upsizer_packs_keep(width):
    dut = Upsizer(width)
    frame = payload(width // 8 + 3, 9)
    beats = []

    async def feed(ctx):
        await put_bytes(ctx, dut.i, frame)

    async def drain(ctx):
        ctx.set(dut.o.ready, 1)
        while len(beats) < 2:
            _, _, valid, data, keep, last = await ctx.tick().sample(dut.o.valid, dut.o.payload.data,
                                                                    dut.o.payload.keep, dut.o.payload.last)
            if valid:
                beats.append((data, keep, last))

    run(dut, [drain, feed])
    nb = width // 8
    assert beats == [(int.from_bytes(frame[:nb], "little"), (1 << nb) - 1, 0),
                     (int.from_bytes(frame[nb:], "little"), 0b111, 1)]


# -- the MAC ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [64, 256])
def test_mac_receives_sends_and_counts(width):
    dut = MAC(width, counter_width=16)
    rx_cases = [(64, True, "good"), (1518, True, "good"), (200, False, "bad"), (40, True, "runt"),
                (1600, True, "long"), (60, True, "good")]
    tx_frames = [payload(n, 7) for n in (30, 60, 1518, 1519, 100)]
    received, wire = [], []
    done = {}

    async def phy(ctx):
        for i, (n, good, _) in enumerate(rx_cases):
            await drive_gmii(ctx, dut.gmii_rx, on_wire(payload(n, i), good=good), domain="rx")
        done["rx"] = True

    async def switch_in(ctx):
        for frame in tx_frames:
            await put_frame(ctx, dut.s, frame, width)

    async def switch_out(ctx):
        while True:
            received.append(await get_frame(ctx, dut.m, width))

    async def phy_out(ctx):
        burst = bytearray()
        async for _, _, en, data in ctx.tick("tx").sample(dut.gmii_tx.en, dut.gmii_tx.data):
            if en:
                burst.append(data)
            elif burst:
                wire.append(bytes(burst))
                burst = bytearray()

    async def main(ctx):
        while "rx" not in done or len(wire) < 4 or len(received) < 3:
            await ctx.tick()
        await ctx.tick().repeat(20)  # the counters cross into sync
        counts = {name: ctx.get(getattr(dut, name)) for name in
                  ("rx_good", "rx_fcs_errors", "rx_runts", "rx_long", "rx_overflow", "tx_frames", "tx_long")}
        assert counts == dict(rx_good=3, rx_fcs_errors=1, rx_runts=1, rx_long=1, rx_overflow=0, tx_frames=4,
                              tx_long=1)

    run(dut, [main, phy, switch_in, switch_out, phy_out], clocks=("sync", "rx", "tx"))
    assert received == [payload(n, i) for i, (n, _, fate) in enumerate(rx_cases) if fate == "good"]
    sent = [f for f in tx_frames if len(f) <= MAX_FRAME - 4]
    assert wire == [on_wire(f + bytes(max(0, 60 - len(f)))) for f in sent]


@pytest.mark.parametrize("kwargs, message", [
    (dict(width=32), r"^Data width must be one of \(64, 256, 512\), not 32$"),
    (dict(rx_bytes=1024), r"^Receive buffer must be a power of two above 1522 up to 65536 bytes, not 1024$"),
    (dict(rx_bytes=3000), r"^Receive buffer must be a power of two above 1522 up to 65536 bytes, not 3000$"),
    (dict(cdc_depth=2), r"^Clock-crossing FIFO depth must be a power of two from 4 to 1024, not 2$"),
    (dict(counter_width=0), r"^Counter width must be an integer from 1 to 64, not 0$"),
    (dict(max_frame=20), r"^Maximum frame must be an integer from 64 to 16383, not 20$"),
])
def test_mac_checks_its_parameters(kwargs, message):
    refused(lambda: MAC(**kwargs), message)


def test_a_counter_crosses_every_event_into_a_slow_switch_clock():
    """A counter's few crossing bits wrap many times over, at the fastest events any counter has (every other
    cycle of 125 MHz) into a switch clock just above the slowest it allows (4.6 MHz), and the count in ``sync``
    (6 bits: it wraps too) misses none."""
    m = Module()
    m.domains += [ClockDomain("rx"), ClockDomain("sync")]
    strobe = Signal()
    value = _gray_counter(m, strobe, "rx", 6, "events")
    rng = random.Random(23)
    gaps = [1] * 100 + [rng.choice([1, 1, 2, 5]) for _ in range(100)]
    seen = []

    async def bench(ctx):
        for gap in gaps:
            ctx.set(strobe, 1)
            await ctx.tick("rx")
            ctx.set(strobe, 0)
            await ctx.tick("rx").repeat(gap)
        await ctx.tick("sync").repeat(6)
        seen.append(ctx.get(value))

    sim = Simulator(m)
    sim.add_clock(PERIOD, domain="rx")
    sim.add_clock(PERIOD * 27, domain="sync")
    sim.add_testbench(bench)
    sim.run()
    assert seen == [len(gaps) % 64]

"""cocotb tests of the whole board top on its RGMII pins (run by test_board_top.py).

The host side is the host library's, as on a cable to the board: the
controller through ``management_target`` over a ``MgmtBus`` and
``MgmtSession`` (blocking code in a ``cocotb.task.bridge`` thread) on port
0, the management port; the workers' contributions are
:mod:`inagg.testbench.traffic`'s, one worker behind each port. Each test
ends in :meth:`BoardTB.check <inagg.testbench.board.BoardTB.check>`: every
frame that left the pins equals the model switch's or the model bridge's,
FCS included.
"""

from __future__ import annotations

import random
import struct
import zlib

import cocotb
import numpy as np
import pytest
from cocotb.task import bridge
from cocotb.triggers import gather
from cocotbext.eth import GmiiFrame

from inagg.hdl.board import board
from inagg.host.controller import Controller, Plan, mac_counters, management_target
from inagg.host.mgmt import MgmtSession, MgmtTimeout
from inagg.models.job import SwitchSpec
from inagg.models.mgmt import Status, parse_response
from inagg.models.protocol import Counter
from inagg.models.regmap import MAC_STATS, RegMap
from inagg.testbench.board import BoardTB
from inagg.testbench.sim import parameters, stimulus
from inagg.testbench.traffic import contribution, lanes, make_job, windowed

PARAMS, STIMULUS = parameters(), stimulus()
BOARD = board(PARAMS["board"])
KEY = bytes.fromhex(PARAMS["mgmt_key"])
HOST = "02:00:00:00:0a:01"
TIMEOUT = 40e-6  # simulated seconds before a session sends again: ten times a response's round trip here
SPEC = SwitchSpec(ports=2, slots=BOARD.switch["slots"], chunk_bytes=BOARD.switch["chunk_bytes"])
SYNC_PS = 10**12 // BOARD.sync_hz  # the board's switch clock: 50 MHz, against the MACs' 125 MHz


async def start(dut) -> tuple[BoardTB, MgmtSession]:
    tb = await BoardTB.start(dut, SPEC, port=PARAMS["mgmt_port"], key=KEY, sync_ps=SYNC_PS)
    session = MgmtSession(KEY, board=SPEC.mac, host=HOST, timeout=TIMEOUT)
    bus = tb.bus(session)
    tb.regmap = RegMap.from_jobs(await bridge(bus.read)(RegMap.switch("JOBS")))
    return tb, session


async def read_macs(tb: BoardTB, bus, port: int) -> tuple[dict[str, int], dict[str, int]]:
    """Port ``port``'s MAC counters read by management frames once the board settled, and what they must read
    when no frame was dropped: every good frame sent into the port and every frame that left it. On the
    management port the reads are frames too: the k-th counter is read by the k-th request, which counts itself
    and those before it, and the answers to those before it."""
    sent, wire = len(tb.sent[port]), len(tb.wire[port])
    got = await bridge(lambda: mac_counters(bus, port))()
    k = list(MAC_STATS).index
    own = port == tb.mgmt_port
    want = {**dict.fromkeys(MAC_STATS, 0), "rx_good": sent + own * (k("rx_good") + 1),
            "tx_frames": wire + own * k("tx_frames")}
    return got, want


def bad_fcs(frame: bytes) -> GmiiFrame:
    return GmiiFrame.from_raw_payload(frame + struct.pack("<L", zlib.crc32(frame) ^ 0x8000_0000))


@cocotb.test()
async def allreduce_through_both_ports(dut):
    """A job configured by management frames; two workers' contributions, one on each port's RGMII, with losses
    and duplicates: every result on each port's pins is the model switch's, FCS included, and so are the counters;
    the MACs' counters, read by frames too, count every frame in and out."""
    tb, session = await start(dut)
    bus = tb.bus(session)
    job = make_job(SPEC, 0, 2, 0, 16)  # worker 0 behind port 0, worker 1 behind port 1

    @bridge
    def configure():
        Controller(management_target(bus, tb.regmap, SPEC), Plan(SPEC, (job,))).configure()  # reads CTRL back

    await configure()
    tb.model.add_job(job)
    chunks = STIMULUS["chunks"]
    pyrng, rng = random.Random(23), np.random.default_rng(23)
    traffic = windowed(SPEC, job, range(chunks), lambda c: np.stack([lanes(rng, SPEC) for _ in job.workers]), pyrng,
                       loss=0.1, dup=0.1)

    async def one_port(p):
        for q, frame in traffic:
            if q == p:
                await tb.send(p, frame)

    await gather(*[one_port(p) for p in range(tb.ports)])
    await tb.check()
    # Counters through frames once the traffic settled; the requests' own two counters move with each read.
    counted = [c for c in Counter if c not in (Counter.RX_FRAMES, Counter.DROP_NON_ROCE)]
    rtl = await bridge(lambda: {c: bus.read(RegMap.counter(c)) for c in counted})()
    assert rtl == {c: tb.model.counters[c] for c in counted}
    assert rtl[Counter.COMPLETED] == chunks
    for p in range(tb.ports):  # every frame into a port passed, every result left (port 1: results alone)
        got, want = await read_macs(tb, bus, p)
        assert got == want, f"port {p}'s MAC counters (read, expected): {got}, {want}"


@cocotb.test()
async def bad_fcs_and_runts_dropped_and_counted(dut):
    """A contribution with a bad FCS and a runt on each port are dropped by the MACs and counted there, in the
    register map; the switch never sees them (its RX_FRAMES counts the management requests alone), and frames
    after them pass."""
    tb, session = await start(dut)
    bus = tb.bus(session)
    job = make_job(SPEC, 0, 2, 0, 16)
    frame = contribution(SPEC, job, 0, 0, lanes(np.random.default_rng(1), SPEC))
    for p in range(tb.ports):
        await tb.send_raw(p, bad_fcs(frame))
        await tb.send_raw(p, GmiiFrame.from_payload(frame[:40], min_len=0))  # 44 bytes with its FCS
    # Read last, so the model bridge's reading of the model's count at the end is the count when it was read.
    received = await bridge(bus.read)(RegMap.counter(Counter.RX_FRAMES))
    await tb.check()
    assert received == len(tb.requests())
    for p in range(tb.ports):  # each port's MAC counted its own bad frames, once each
        got, want = await read_macs(tb, bus, p)
        assert got == {**want, "rx_fcs_errors": 1, "rx_runts": 1}, f"port {p}'s MAC counters: {got}"


@cocotb.test()
async def register_write_read_round_trip(dut):
    """Management writes of a switch and a job register read back what was written, and answer as the model."""
    tb, session = await start(dut)
    bus = tb.bus(session)
    pkey, slots = RegMap.switch("PKEY"), tb.regmap.job(0, "SLOTS")

    @bridge
    def round_trip():
        got = []
        for value in (0x8001, 0x7FFE):
            bus.write(pkey, value)
            bus.write(slots, value & 0x3F)
            got.append((bus.read(pkey), bus.read(slots)))
        return got

    assert await round_trip() == [(0x8001, 0x01), (0x7FFE, 0x3E)]
    await tb.check()


@cocotb.test()
async def wrong_key_and_replay_refused(dut):
    """A replayed request is answered REPLAYED and does nothing; a wrongly keyed one gets no answer; both counted."""
    tb, session = await start(dut)
    bus = tb.bus(session)
    pkey = RegMap.switch("PKEY")
    await bridge(bus.write)(pkey, 0x1234)
    write = tb.requests()[-1]
    await bridge(bus.write)(pkey, 0x4321)
    replayed = parse_response(KEY, await tb.exchange(write))  # the first write again: PKEY must stay 0x4321
    assert (replayed.status, replayed.floor) == (Status.REPLAYED, session.seq - 1)
    wrong = tb.bus(MgmtSession(bytes(16), board=SPEC.mac, host=HOST, timeout=TIMEOUT / 4, tries=2))
    with pytest.raises(MgmtTimeout):
        await bridge(wrong.write)(pkey, 0x5555)

    @bridge
    def final():
        return [bus.read(a) for a in (pkey, RegMap.mgmt_stat("bad_tag"), RegMap.mgmt_stat("replayed"))]

    assert await final() == [0x4321, 2, 1]
    await tb.check()
    assert tb.bridge.counters["bad_tag"] == 2 and tb.bridge.counters["replayed"] == 1

"""ICRC checker and generator against inagg.models.icrc, at every width, partial last beats included."""

import gc
import warnings
import zlib

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.icrc import ALGORITHM, RESIDUES, ICRCChecker, ICRCGenerator, step_matrix, unzero_matrix
from inagg.models import icrc as model_icrc
from inagg.models.job import SwitchSpec
from inagg.testbench.streams import frame_beats
from inagg.testbench.traffic import contribution, lanes, make_job

WIDTHS = (64, 256, 512)


def _frames(chunk_bytes=256):
    """Good RoCE frames of several lengths (end of the datagram at every byte of a beat), and padded ones."""
    spec = SwitchSpec(ports=1, slots=4, chunk_bytes=chunk_bytes)
    job = make_job(spec, 0, 1, 0, 2)
    rng = np.random.default_rng(5)
    out = []
    for extra in range(0, 68, 4):  # payload lengths step the datagram's end through a 64-byte beat
        out.append(contribution(spec, job, 0, 0, lanes(rng, spec)[: 4 + extra // 4]))
    out += [_longer(f, 2) for f in out]  # and through the other half of the byte offsets, beat ends included
    out.append(out[3] + bytes(9))  # Ethernet padding after the ICRC
    return out


def _longer(frame, n):
    """``frame`` with ``n`` more payload bytes, its IPv4 total length and ICRC to match."""
    body = bytearray(frame[:-4] + bytes(range(n)))
    body[16:18] = (int.from_bytes(frame[16:18], "big") + n).to_bytes(2, "big")
    return bytes(body) + model_icrc.icrc(body)


def test_algorithm_is_the_model_icrc():
    frame = _frames()[2]
    masked = bytes(14) + model_icrc.masked_header(frame[14:]) + frame[54:-4]
    assert ALGORITHM(8).compute(masked) == model_icrc.icrc_value(frame[:-4])


@pytest.mark.parametrize("width", WIDTHS)
def test_step_matrix_is_zlib(width):
    rng = np.random.default_rng(width)
    for _ in range(8):
        raw = int(rng.integers(0, 1 << 32))
        word = bytes(rng.integers(0, 256, width // 8, dtype=np.uint8))
        x = raw | int.from_bytes(word, "little") << 32
        nxt = 0
        for i, col in enumerate(step_matrix(width)):
            if x >> i & 1:
                nxt ^= col
        assert nxt ^ 0xFFFFFFFF == zlib.crc32(word, raw ^ 0xFFFFFFFF)


@pytest.mark.parametrize("k", [1, 3, 10, 63])
def test_unzero_matrix_undoes_zero_bytes(k):
    value = zlib.crc32(b"inagg")
    after = zlib.crc32(bytes(k), value)
    rows = unzero_matrix(k)
    raw = after ^ 0xFFFFFFFF
    assert sum((bin(raw & row).count("1") & 1) << j for j, row in enumerate(rows)) ^ 0xFFFFFFFF == value
    assert RESIDUES[0] == 0x2144DF1C


def _run_checker(width, frames):
    # Back to back, with an idle cycle after every third frame: a verdict is read two cycles
    # after its frame's last beat, while the next frame's beats go in.
    dut = ICRCChecker(width)
    results = []

    async def bench(ctx):
        last_beats, oks = [], []
        for k, frame in enumerate(frames):
            end = 14 + int.from_bytes(frame[16:18], "big")
            for n, (data, _, _) in enumerate(frame_beats(frame, width)):
                ctx.set(dut.valid, 1)
                ctx.set(dut.beat, n)
                ctx.set(dut.data, data)
                ctx.set(dut.end, end)
                oks.append(ctx.get(dut.ok))
                await ctx.tick()
            last_beats.append(len(oks) - 1)
            if k % 3 == 2:
                ctx.set(dut.valid, 0)
                oks.append(ctx.get(dut.ok))
                await ctx.tick()
        ctx.set(dut.valid, 0)
        for _ in range(2):
            oks.append(ctx.get(dut.ok))
            await ctx.tick()
        results.extend(oks[t + 2] for t in last_beats)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


@pytest.mark.parametrize("width", WIDTHS)
def test_checker(width):
    good = _frames()
    bad = []
    for f in good:
        end = 14 + int.from_bytes(f[16:18], "big")
        for pos in (end - 1, end - 4, 60, 15):  # ICRC bytes, payload; TOS is masked, so byte 15 stays good
            b = bytearray(f)
            b[pos] ^= 0x10
            bad.append(bytes(b))
    got = _run_checker(width, good + bad)
    assert got[:len(good)] == [1] * len(good)
    expect_bad = [0, 0, 0, 1] * len(good)
    assert got[len(good):] == expect_bad
    assert [model_icrc.check(f) for f in bad] == [bool(x) for x in expect_bad]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_generator(width, masked):
    """``masked=True``: the caller's beats are as the ICRC sees them (masked fields as ones, the Ethernet header
    as zeros), and the value is the same."""
    frame = _frames()[5]
    end = len(frame) - 4
    dut = ICRCGenerator(width, end, masked=masked)
    fed = bytearray(frame[:end] + bytes(4))
    if masked:
        fed[:14] = bytes(14)
        fed[14:14 + model_icrc.MASKED_LEN] = model_icrc.masked_header(frame[14:14 + model_icrc.MASKED_LEN])
    values = []

    async def bench(ctx):
        for _ in range(2):  # twice: the second frame starts from a used register
            for n, (data, _, _) in enumerate(frame_beats(bytes(fed), width)):
                ctx.set(dut.valid, 1)
                ctx.set(dut.beat, n)
                ctx.set(dut.data, data)
                await ctx.tick()
            ctx.set(dut.valid, 0)
            values.append(ctx.get(dut.value))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert values == [model_icrc.icrc_value(frame[:end])] * 2


def test_generator_rejects_a_short_frame():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # refused, never to be elaborated
        with pytest.raises(ValueError, match=r"^ICRC offset must be an integer above 42, not 40$") as refused:
            ICRCGenerator(64, 40)
        del refused
        gc.collect()


@pytest.mark.parametrize("width", [32, 128, "64"])
def test_width_is_checked(width):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # refused, never to be elaborated
        with pytest.raises(ValueError, match=r"^Data width must be one of \(64, 256, 512\), not ") as refused:
            ICRCChecker(width)
        del refused
        gc.collect()

"""The ingress arbiter: whole frames, round robin, and no idle cycle when it changes ports."""

import pytest
from amaranth.sim import Simulator

from inagg.hdl.arbiter import FrameArbiter

BEATS = 4


def _run(ports, frames_per_port, ready=lambda n: True):
    dut = FrameArbiter(64, 4, ports)
    taken = []  # (cycle, port, beat data)

    def source(p):
        async def run(ctx):
            for f in range(frames_per_port):
                for b in range(BEATS):
                    ctx.set(dut.i[p].valid, 1)
                    ctx.set(dut.i[p].p.data, p << 16 | f << 8 | b)
                    ctx.set(dut.i[p].p.last, b == BEATS - 1)
                    await ctx.tick().until(dut.i[p].ready)
            ctx.set(dut.i[p].valid, 0)
        return run

    async def sink(ctx):
        n = 0
        while n < 400:
            ctx.set(dut.o.ready, ready(n))
            _, _, valid, rdy, data, grant = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.p.data,
                                                                     dut.grant)
            if valid and rdy:
                taken.append((n, grant, data))
            n += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for p in range(ports):
        sim.add_testbench(source(p))
    sim.add_testbench(sink)
    sim.run()
    return taken


def test_round_robin_without_bubbles():
    taken = _run(3, 3)
    assert len(taken) == 3 * 3 * BEATS
    cycles = [n for n, _, _ in taken]
    assert cycles == list(range(cycles[0], cycles[0] + len(cycles)))  # a beat every cycle, ports switching
    frames = [taken[i:i + BEATS] for i in range(0, len(taken), BEATS)]
    for fr in frames:  # whole frames: one port, beats in order
        assert len({g for _, g, _ in fr}) == 1 and [d & 0xFF for _, _, d in fr] == list(range(BEATS))
        assert all(d >> 16 == g for _, g, d in fr)
    assert [fr[0][1] for fr in frames] == [0, 1, 2] * 3


def test_choice_holds_while_the_sink_waits():
    taken = _run(2, 2, ready=lambda n: n % 3 == 2)
    frames = [taken[i:i + BEATS] for i in range(0, len(taken), BEATS)]
    assert [fr[0][1] for fr in frames] == [0, 1, 0, 1]
    assert all(d >> 16 == g for _, g, d in taken)


@pytest.mark.parametrize("ports", [0, 257, "2"])
def test_port_count_is_checked(ports):
    import gc
    import warnings

    from amaranth.hdl import UnusedElaboratable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # refused, never to be elaborated
        with pytest.raises(ValueError, match=rf"^Port count must be an integer in 1\.\.256, not {ports!r}$") as e:
            FrameArbiter(64, 4, ports)
        del e
        gc.collect()

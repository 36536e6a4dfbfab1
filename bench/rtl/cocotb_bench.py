"""cocotb side of the RTL benchmarks (run by ``python -m bench.rtl``); figures go to ``$INAGG_BENCH_OUT``."""

from __future__ import annotations

import json
import os
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, gather

from inagg.models.job import SwitchSpec
from inagg.testbench.sim import parameters, stimulus
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import contribution, lanes, make_job

P = {**parameters(), **stimulus()}
OUT = os.environ["INAGG_BENCH_OUT"]


def _spec() -> SwitchSpec:
    return SwitchSpec(ports=P["ports"], slots=P["slots"], chunk_bytes=P["chunk_bytes"])


def _record(key: str, value) -> None:
    data = json.loads(open(OUT).read()) if os.path.exists(OUT) else {}
    data[key] = value
    with open(OUT, "w") as f:
        json.dump(data, f, indent=1)


class _Cycles:
    """Counts clock cycles and remembers when the engine took each contribution."""

    def __init__(self, dut):
        self.dut, self.now, self.orders = dut, 0, []
        cocotb.start_soon(self._run())

    async def _run(self):
        while True:
            await RisingEdge(self.dut.clk)
            self.now += 1
            if self.dut.order_valid.value:
                self.orders.append(self.now)


@cocotb.test()
async def clock_only(dut):
    """Cycles per second of the Verilated model alone: a clock, no bus model, no traffic."""
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    t0 = time.perf_counter()
    await ClockCycles(dut.clk, 2000)
    _record("clock_only", {"cycles_per_s": 2000 / (time.perf_counter() - t0)})


@cocotb.test()
async def throughput(dut):
    """Every port sends its worker's contributions back to back; how busy is the slot pipeline?"""
    spec = _spec()
    tb = SwitchTB(dut, spec)
    await tb.reset()
    job = make_job(spec, 0, P["ports"], 0, spec.slots)
    await tb.configure([job])
    clock = _Cycles(dut)
    rng = np.random.default_rng(0)
    chunks = P["chunks"]
    frames = {w: [contribution(spec, job, w, c, lanes(rng, spec)) for c in range(chunks)] for w in range(P["ports"])}
    t0 = time.perf_counter()

    async def port(w):
        for f in frames[w]:
            await tb.send(job.workers[w].port, f)
    await gather(*[port(w) for w in range(P["ports"])])
    await tb.check()
    wall = time.perf_counter() - t0
    beats = spec.chunk_bytes * 8 // P["width"]
    taken = len(clock.orders)
    span = clock.orders[-1] - clock.orders[0] + beats
    _record("throughput", {"contributions": taken, "beats_per_contribution": beats, "cycles": span,
                           "occupancy": taken * beats / span, "wall_s": wall,
                           "frames_per_s": (taken + len(sum(tb.received.values(), []))) / wall,
                           "sim_cycles_per_s": clock.now / wall})


@cocotb.test()
async def latency(dut):
    """Cycles from the last beat of a chunk's last contribution in to the first beat of its first result out."""
    spec = _spec()
    tb = SwitchTB(dut, spec)
    await tb.reset()
    job = make_job(spec, 0, P["ports"], 0, spec.slots)
    await tb.configure([job])
    rng = np.random.default_rng(1)
    last = P["ports"] - 1
    for w in range(last):
        await tb.send(job.workers[w].port, contribution(spec, job, w, 0, lanes(rng, spec)))
    await tb.settle(quiet=50)
    port = job.workers[last].port
    s_last = getattr(dut, f"s{port}_axis_tlast")
    s_valid, s_ready = getattr(dut, f"s{port}_axis_tvalid"), getattr(dut, f"s{port}_axis_tready")
    m_valid = [getattr(dut, f"m{p}_axis_tvalid") for p in range(P["ports"])]
    marks = {}

    async def watch():
        n = 0
        while "out" not in marks:
            await RisingEdge(dut.clk)
            n += 1
            if "in" not in marks and s_valid.value and s_ready.value and s_last.value:
                marks["in"] = n
            elif "in" in marks and any(v.value for v in m_valid):
                marks["out"] = n
    watcher = cocotb.start_soon(watch())
    await tb.send(port, contribution(spec, job, last, 0, lanes(rng, spec)))
    await watcher
    await tb.check()
    _record("latency", {"cycles": marks["out"] - marks["in"]})

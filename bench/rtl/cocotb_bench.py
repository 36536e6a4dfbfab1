"""cocotb side of the RTL benchmarks (run by ``python -m bench.rtl``); figures go to ``$INAGG_BENCH_OUT``."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, gather

from inagg.models import rc
from inagg.models.job import JobSpec, Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.testbench.sim import parameters, stimulus
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import contribution, lanes, make_job, rc_ack, rc_contribution

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


def _job(spec: SwitchSpec, mode: Mode) -> JobSpec:
    """Job 0: a worker on every port, the whole slot memory (a Mode II job's 2W slots)."""
    return dataclasses.replace(make_job(spec, 0, P["ports"], 0, spec.slots), mode=mode)


def _contribution(spec: SwitchSpec, job: JobSpec, w: int, chunk: int, rng) -> bytes:
    """Worker ``w``'s contribution to ``chunk``: a UC WRITE, or a Mode II one at PSN ``chunk``."""
    if job.mode is Mode.TRANSLATED:
        return rc_contribution(spec, job, w, chunk, chunk, lanes(rng, spec))
    return contribution(spec, job, w, chunk, lanes(rng, spec))


async def _throughput(dut, mode: Mode) -> None:
    spec = _spec()
    tb = SwitchTB(dut, spec)
    await tb.reset()
    job = _job(spec, mode)
    await tb.configure([job])
    clock = _Cycles(dut)
    rng = np.random.default_rng(0)
    chunks = P["chunks"]
    frames = {w: [] for w in range(P["ports"])}
    for w in range(P["ports"]):
        for c in range(chunks):
            frames[w].append(_contribution(spec, job, w, c, rng))
            if mode is Mode.TRANSLATED and c:  # the host's ACK of the result before, as its RC NIC sends it
                frames[w].append(rc_ack(spec, job, w, rc.Ack(c - 1, rc.Syndrome.ACK, c)))
    t0 = time.perf_counter()

    async def port(w):
        for f in frames[w]:
            await tb.send(job.workers[w].port, f)
    await gather(*[port(w) for w in range(P["ports"])])
    await tb.check()
    wall = time.perf_counter() - t0
    beats = spec.chunk_bytes * 8 // P["width"]
    taken = len(clock.orders)
    assert taken == P["ports"] * chunks
    span = clock.orders[-1] - clock.orders[0] + beats
    acks = (await tb.counters())[Counter.ACK_REFLECTED]
    assert acks == (P["ports"] * (chunks - 1) if mode is Mode.TRANSLATED else 0)
    _record(f"throughput_{mode.name}", {"contributions": taken, "beats_per_contribution": beats, "cycles": span,
                                        "occupancy": taken * beats / span, "acks_reflected": acks,
                                        "frame_bytes": len(frames[0][0]), "wall_s": wall,
                                        "frames_per_s": (taken + len(sum(tb.received.values(), []))) / wall,
                                        "sim_cycles_per_s": clock.now / wall})


@cocotb.test()
async def throughput(dut):
    """Every port sends its worker's UC contributions back to back; how busy is the slot pipeline?"""
    await _throughput(dut, Mode.UC)


@cocotb.test()
async def throughput_mode_ii(dut):
    """The same with Mode II contributions, each after the first followed by the host's ACK of the result before."""
    await _throughput(dut, Mode.TRANSLATED)


async def _latency(dut, mode: Mode) -> None:
    spec = _spec()
    tb = SwitchTB(dut, spec)
    await tb.reset()
    job = _job(spec, mode)
    await tb.configure([job])
    rng = np.random.default_rng(1)
    last = P["ports"] - 1
    for w in range(last):
        await tb.send(job.workers[w].port, _contribution(spec, job, w, 0, rng))
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
            if "last" not in marks and s_valid.value and s_ready.value:
                marks.setdefault("first", n)
                if s_last.value:
                    marks["last"] = n
            elif "last" in marks and any(v.value for v in m_valid):
                marks["out"] = n
    watcher = cocotb.start_soon(watch())
    await tb.send(port, _contribution(spec, job, last, 0, rng))
    await watcher
    await tb.check()
    _record(f"latency_{mode.name}", {"from_first": marks["out"] - marks["first"],
                                     "from_last": marks["out"] - marks["last"]})


@cocotb.test()
async def latency(dut):
    """Cycles from the first and from the last beat of a chunk's last UC contribution in to the first beat of its
    first result out."""
    await _latency(dut, Mode.UC)


@cocotb.test()
async def latency_mode_ii(dut):
    """The same for a Mode II chunk."""
    await _latency(dut, Mode.TRANSLATED)

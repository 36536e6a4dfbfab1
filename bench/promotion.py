"""What FP32 promotion costs the switch: slot pipeline throughput and result latency, in simulated cycles.

    .venv/bin/python bench/promotion.py          (or: python -m bench promotion)

Throughput: the slot engine alone (``hdl.engine.SlotEngine``, Amaranth
simulator) takes contributions back to back, every one ready, with no lane
promoted or with every lane promoted (each addition after the first in
FP32); the figure is beats taken per cycle from the first beat to the
last. Two orders: every frame to one slot (a job's workers sending one
chunk after another, the worst case for the read-after-write wait) and
frames spread over four slots; chunks of 4 and 16 beats at W = 512; the
default FP32 latencies and the deepest.

Latency: the whole switch (``hdl.switch.Switch``, Amaranth simulator, 2
ports, one job of 2 workers), cycles from the last beat of a chunk's last
contribution into the switch to the first beat of its first result out,
for an INT32 result and an FP32 result.

Writes docs/results/promotion.md. Cycle figures are deterministic.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np
from amaranth.sim import Simulator

from _report import head_commit
from inagg.hdl.engine import SlotEngine
from inagg.hdl.switch import Switch
from inagg.models import regmap as rm
from inagg.models.job import SwitchSpec
from inagg.testbench.axil_sim import axil_write
from inagg.testbench.promotion import adversarial
from inagg.testbench.streams import frame_beats
from inagg.testbench.traffic import contribution, make_job

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "promotion.md"
COMMAND = ".venv/bin/python bench/promotion.py"
WIDTH = 512
FRAMES = 64
LATENCIES = {"default (1 + 2)": {}, "deepest (4 + 6)": dict(convert_latency=4, add_latency=6)}


def _values(promoted: bool, n: int, lanes: int, rng) -> np.ndarray:
    """Contributions of ``n`` workers: every lane promoted from the second on, or none."""
    return adversarial(rng, n, lanes, ("first",) if promoted else ("small",))


def engine_throughput(chunk_bytes: int, latencies: dict, promoted: bool, spread: bool) -> tuple[float, int]:
    """Beats per cycle of the slot engine with ``FRAMES`` contributions back to back; and the result count.

    Eight workers per chunk, so every eighth frame completes a chunk and
    sends its result; ``spread`` interleaves four chunks (four slots), else
    the chunks go one after another to one slot (a region of one slot).
    """
    dut = SlotEngine(WIDTH, chunk_bytes, 4, 8, **latencies)
    rng = np.random.default_rng(0)
    lanes = chunk_bytes // 4
    n, region = 8, 4 if spread else 1
    values = _values(promoted, n, lanes, rng)
    if spread:
        order = [(c, w) for base in range(0, FRAMES // n, region) for w in range(n) for c in range(base, base + region)]
    else:
        order = [(c, w) for c in range(FRAMES // n) for w in range(n)]
    beats_of = {}
    raw = {w: np.asarray(values[w], ">i4").tobytes() for w in range(n)}
    for w in range(n):
        nb = WIDTH // 8
        beats_of[w] = [int.from_bytes(raw[w][o:o + nb], "little") for o in range(0, len(raw[w]), nb)]
    frames = [({"slot": c % region, "chunk": c, "worker": w, "workers": n, "slots": region}, beats_of[w])
              for c, w in order]
    return engine_rate(dut, frames)


def engine_rate(dut: SlotEngine, frames: list, processes=()) -> tuple[float, int]:
    """Beats per cycle of ``dut`` taking ``frames`` (descriptor fields, beats) back to back, every one ready,
    from the first beat taken to the last; and the results it sent. ``processes`` run beside (the simulator's
    processes: the traffic a mode adds around the frames)."""
    taken, results = [], []

    async def feed(ctx):
        ctx.set(dut.can_start, 1)
        for desc, beats in frames:
            ctx.set(dut.i.p.desc, desc)
            for k, beat in enumerate(beats):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p.data, beat)
                ctx.set(dut.i.p.last, k == len(beats) - 1)
                await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(dut.lag + 4)

    async def watch(ctx):
        cycle = 0
        async for _, _, valid, ready, o_valid, o_first in ctx.tick().sample(dut.i.valid, dut.i.ready, dut.o.valid,
                                                                            dut.o.p.first):
            if valid and ready:
                taken.append(cycle)
            if o_valid and o_first:
                results.append(cycle)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(feed)
    sim.add_process(watch)
    for process in processes:
        sim.add_process(process)
    sim.run()
    assert len(taken) == sum(len(beats) for _, beats in frames), len(taken)
    return len(taken) / (taken[-1] - taken[0] + 1), len(results)


def switch_latency(width: int, chunk_bytes: int, promoted: bool) -> dict:
    """Cycles from the last beat of the completing contribution in to the first result beat out, and its parts.

    ``out`` is the whole; ``take`` the cycles until the slot engine takes that beat (the port's store and
    forward, its checks and the arbiter), ``engine`` from there until the beat leaves stage W for the
    emitters (``3 + lag``), ``emitter`` the rest.
    """
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=chunk_bytes)
    dut = Switch(ports=2, width=width, slots=16, chunk_bytes=chunk_bytes, jobs=1, workers=2)
    job = make_job(spec, 0, 2, 0, 4)
    regmap = rm.RegMap(1, 2)
    values = _values(promoted, 2, spec.lanes, np.random.default_rng(1))
    frames = [contribution(spec, job, w, 0, values[w]) for w in range(2)]
    marks = {}

    async def run(ctx):
        for addr, value in regmap.switch_writes(spec) + regmap.job_writes(job, spec):
            assert await axil_write(ctx, dut.axil, addr, value) == 0
        for m in dut.m:
            ctx.set(m.ready, 1)
        for w, frame in enumerate(frames):
            s = dut.s[job.workers[w].port]
            for data, keep, last in frame_beats(frame, width):
                ctx.set(s.valid, 1)
                ctx.set(s.p.data, data)
                ctx.set(s.p.keep, keep)
                ctx.set(s.p.last, last)
                await ctx.tick().until(s.ready)
            ctx.set(s.valid, 0)
            if w == 0:
                await ctx.tick().repeat(300)  # the first contribution is in the slot
        eng, cycles = dut.engine, 0
        while not any(ctx.get(m.valid) for m in dut.m):
            if "take" not in marks and ctx.get(eng.i.valid) and ctx.get(eng.i.ready) and ctx.get(eng.i.p.last):
                marks["take"] = cycles
            if "w" not in marks and ctx.get(eng.o.valid) and ctx.get(eng.o.p.last):
                marks["w"] = cycles
            await ctx.tick()
            cycles += 1
        marks["out"] = cycles

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(run)
    sim.run()
    return {"out": marks["out"], "take": marks["take"], "engine": marks["w"] - marks["take"],
            "emitter": marks["out"] - marks["w"]}


def main() -> int:
    rows = []
    for chunk in (256, 1024):
        for name, lat in LATENCIES.items():
            for spread in (False, True):
                figs = [engine_throughput(chunk, lat, promoted, spread) for promoted in (False, True)]
                (plain, r0), (prom, r1) = figs
                assert r0 == r1 == FRAMES // 8
                rows.append(f"| {chunk * 8 // WIDTH} | {name} | {'4 slots' if spread else 'one slot'} | "
                            f"{plain:.3f} | {prom:.3f} |")
    lat_rows = []
    for width, chunk in ((64, 256), (512, 256), (512, 1024)):
        int_, fp = (switch_latency(width, chunk, p) for p in (False, True))
        lat_rows.append(f"| {width} | {chunk} | {chunk * 8 // width} | {int_['out']} | {fp['out']} | {int_['take']} | "
                        f"{int_['engine']} | {int_['emitter']} |")
    text = f"""# FP32 promotion: throughput and result latency

Command: `{COMMAND}` at {head_commit()}; Amaranth simulator, {platform.python_implementation()} {platform.python_version()}.
Cycle figures are deterministic.

## Slot pipeline throughput

`SlotEngine(width={WIDTH}, slots=4, workers=8)` alone, {FRAMES} contributions offered back to back (8 workers
per chunk: every eighth completes a chunk and sends its result); beats taken per cycle from the first to the
last. "one slot": the chunks follow one another through one slot; "4 slots": four chunks interleaved.
Promoted: every lane overflows on the first addition, and every later addition is in FP32.

| beats per frame | FP32 latencies | slots | beats/cycle, no lane promoted | beats/cycle, every lane promoted |
|---:|---|---|---:|---:|
{chr(10).join(rows)}

Promotion costs no throughput: the two columns are equal in every row, since every beat takes the same
pipeline. What is lost at 4 beats comes from the pipeline's length, not from promotion: a frame to the slot
of the frame before it waits for its writes (one cycle at the default lag of 4, eight at the deepest, lag
11), and a frame after one that sends a result waits until that result reached the emitters (`docs/rtl.md`,
"Read-after-write").

## Result latency

`Switch(ports=2, slots=16, jobs=1, workers=2)`, the second contribution of a chunk sent with nothing
else in flight: cycles from its last beat into port 0 or 1 to the first beat of the first result out, and
for the INT32 result the parts of it: until the slot engine takes that beat (the port's store and forward,
its checks, the arbiter), from there until the beat leaves the engine's stage W for the emitters (`3 + lag`,
`docs/rtl.md` "Slot engine"), and from there to the first result beat out (the emitter).

| W | C | beats | INT32 result | FP32 result | to the engine | engine | emitter |
|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(lat_rows)}

INT32 and FP32 results take the same time: an emitter starts a result once its last beat is in,
whether it turns out FP32 or not.
"""
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Modes II and III in the RTL: the slot engine's beats per cycle against UC frames, and the switch's latency
per mode, in simulated cycles.

    .venv/bin/python bench/translated_rtl.py          (or: python -m bench translated_rtl)

``hdl.engine.SlotEngine`` alone (Amaranth simulator) at W = 512 takes
contributions back to back, every one ready: 4 workers, chunk ``k`` of
every worker in turn (a Mode II or III frame has PSN ``k``, slot ``k mod
2W`` of a region of 2W = 8 slots; a UC frame chunk ``k``, slot ``k mod
8``). Built with Mode II (``psn_jobs=1``), with Modes II and III
(``augmented=True``) and without (UC frames only). Mode III frames run with
their ACK traffic: every child ACKs every second result as it leaves the
engine (``result_ack``), so slots come free for the PSNs ``2W`` later, and
the engine's answers are taken as they come (``reply``). The figure is
beats taken per cycle from the first beat to the last. Latency
(:func:`mode_latency`): the whole switch, per mode, cycles from a frame in
to what it causes out. Writes docs/results/translated_rtl.md. Cycle figures
are deterministic.
"""

from __future__ import annotations

import dataclasses
import platform
import sys
from pathlib import Path

import numpy as np
from amaranth.sim import Simulator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._report import head_commit, publish  # noqa: E402
from bench.promotion import engine_rate  # noqa: E402

from inagg.hdl.engine import SlotEngine  # noqa: E402
from inagg.hdl.switch import Switch  # noqa: E402
from inagg.models import rc  # noqa: E402
from inagg.models.frame import RESULT, Opcode  # noqa: E402
from inagg.models.geometry import SwitchGeometry  # noqa: E402
from inagg.models.job import Mode, SwitchSpec  # noqa: E402
from inagg.models.switch import ModelSwitch  # noqa: E402
from inagg.testbench.axil_sim import axil_write  # noqa: E402
from inagg.testbench.streams import beats_frame, put_frame  # noqa: E402
from inagg.testbench.traffic import contribution, make_job, rc_ack, rc_contribution  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "translated_rtl.md"
COMMAND = ".venv/bin/python bench/translated_rtl.py"
WIDTH, WORKERS, REGION, CHUNKS = 512, 4, 8, 32
_BTH = RESULT.offset("bth")  # its first byte is the opcode


def _frames(chunk_bytes: int, translated: bool, augmented: bool = False) -> list:
    nb = WIDTH // 8
    raw = np.arange(chunk_bytes // 4, dtype=">i4").tobytes()
    beats = [int.from_bytes(raw[o:o + nb], "little") for o in range(0, chunk_bytes, nb)]
    return [({"job": 0, "worker": w, "chunk": c, "slot": c % REGION, "workers": WORKERS, "slots": REGION,
              "translated": translated, "augmented": augmented, "psn": c}, beats)
            for c in range(CHUNKS) for w in range(WORKERS)]


def occupancy(chunk_bytes: int, psn_jobs: int, translated: bool, augmented: bool = False) -> tuple[float, int]:
    """Beats per cycle of the engine over ``CHUNKS`` chunks of every worker in turn; and the results sent."""
    dut = SlotEngine(WIDTH, chunk_bytes, REGION, WORKERS, psn_jobs=psn_jobs, augmented=augmented)
    return engine_rate(dut, _frames(chunk_bytes, translated))


def mode_iii_occupancy(chunk_bytes: int) -> tuple[float, int, int]:
    """As :func:`occupancy` for Mode III frames, with the children's ACKs flowing; and the ACKs and NAKs the
    engine sent (one per frame when none is refused as busy)."""
    dut = SlotEngine(WIDTH, chunk_bytes, REGION, WORKERS, psn_jobs=1, augmented=True)
    acks, replies = [], []

    async def children(ctx):
        # Every child ACKs every second result (coalesced, as a NIC does) once it has left the engine; the
        # engine's answers are taken as they come.
        ctx.set(dut.reply.ready, 1)
        offered = False
        async for _, _, ready, o_valid, o_first, psn, r_valid in ctx.tick().sample(
                dut.result_ack.ready, dut.o.valid, dut.o.p.first, dut.o.p.desc.psn, dut.reply.valid):
            if offered and ready:
                acks.pop(0)
            if o_valid and o_first and psn % 2 == 1:
                acks.extend({"job": 0, "worker": w, "psn": psn, "syndrome": 0x1F} for w in range(WORKERS))
            replies.append(r_valid)
            offered = bool(acks)
            ctx.set(dut.result_ack.valid, offered)
            if offered:
                ctx.set(dut.result_ack.p, acks[0])

    rate, results = engine_rate(dut, _frames(chunk_bytes, True, True), processes=[children])
    return rate, results, sum(replies)


def mode_latency(width: int, chunk_bytes: int, mode: Mode) -> dict[str, int]:
    """Cycles from the last beat of a frame into the whole switch to the first beat of each frame it causes.

    One job of 2 workers in ``mode`` on ``Switch`` (2 ports; built with Mode III for a Mode III job), each
    frame sent once the switch is quiet: worker 0's contribution (``ack``: Mode III's ACK of it), worker 1's
    (``result``: the first result out; Mode III ``ack`` again), then, in Mode II, worker 0's ACK of its
    result (``reflected``: the ACK the switch reflects to it). Every frame the switch sends is checked
    against the model switch's.
    """
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=chunk_bytes)
    job = dataclasses.replace(make_job(spec, 0, 2, 0, 4), mode=mode)
    geometry = SwitchGeometry.for_spec(spec, width=width, jobs=1, workers=2, augmented=mode is Mode.AUGMENTED)
    dut = Switch(geometry)
    model = ModelSwitch(spec)
    model.add_job(job)
    values = [np.arange(spec.lanes, dtype=np.int64) * (w + 1) for w in range(2)]
    if mode is Mode.UC:
        frames = [contribution(spec, job, w, 0, values[w]) for w in range(2)]
    else:
        frames = [rc_contribution(spec, job, w, model.modes[job.job].expected[w], 0, values[w]) for w in range(2)]
    steps = [(job.workers[w].port, f, model.receive(job.workers[w].port, f)) for w, f in enumerate(frames)]
    if mode is Mode.TRANSLATED:
        result = next(f for p, f in steps[1][2] if p == job.workers[0].port)
        _, packet = rc.decode(result)
        ack = rc_ack(spec, job, 0, rc.Ack(packet.psn))
        steps.append((job.workers[0].port, ack, model.receive(job.workers[0].port, ack)))
    marks: dict[str, int] = {}

    async def run(ctx):
        regmap = geometry.regmap
        writes = regmap.switch_writes(spec) + regmap.job_writes(job, spec)
        if mode is Mode.AUGMENTED:
            writes.append((regmap.switch("HOP_TIMEOUT"), 0))  # no timer sends a result again meanwhile
        for addr, value in writes:
            assert await axil_write(ctx, dut.axil, addr, value) == 0, hex(addr)
        for m in dut.m:
            ctx.set(m.ready, 1)
        for step, (port, frame, expected) in enumerate(steps):
            await put_frame(ctx, dut.s[port], frame, width)
            out, start, beats, cycles, idle = [], {}, {p: [] for p in range(spec.ports)}, 0, 0
            while idle < 100:
                sampled = await ctx.tick().sample(*(x for m in dut.m for x in (m.valid, m.p.data, m.p.keep, m.p.last)))
                cycles, idle = cycles + 1, idle + 1
                for p in range(spec.ports):
                    valid, data, keep, last = sampled[2 + 4 * p:6 + 4 * p]  # after the clock and reset
                    if not valid:
                        continue
                    idle = 0
                    start.setdefault(p, cycles)
                    beats[p].append((data, keep))
                    if last:
                        out.append((start.pop(p), p, beats_frame(beats[p], width)))
                        beats[p] = []
            assert sorted((p, f) for _, p, f in out) == sorted(expected), f"step {step}: not the model's frames"
            for at, _, f in sorted(out):
                if f[_BTH] != Opcode.RC_ACK:
                    marks.setdefault("result", at)
                else:
                    marks.setdefault(("ack", "ack (completes)", "reflected")[step], at)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(run)
    sim.run()
    return marks


def main() -> int:
    rows = []
    for chunk in (256, 1024):
        for build, psn_jobs, translated, augmented in (
                ("UC only", 0, False, False), ("with Mode II", 1, False, False), ("with Mode II", 1, True, False),
                ("with Modes II and III", 1, False, True), ("with Modes II and III", 1, True, True)):
            rate, sent = occupancy(chunk, psn_jobs, translated, augmented)
            assert sent == CHUNKS
            rows.append(f"| {chunk * 8 // WIDTH} | {build} | {'Mode II' if translated else 'UC'} | {rate:.3f} |")
        rate, sent, answered = mode_iii_occupancy(chunk)
        assert sent == CHUNKS and answered == CHUNKS * WORKERS, (sent, answered)
        rows.append(f"| {chunk * 8 // WIDTH} | with Modes II and III | Mode III, ACKs flowing | {rate:.3f} |")
    lat_rows = []
    for width, chunk in ((64, 256), (512, 256), (512, 1024)):
        for mode, name in ((Mode.UC, "UC"), (Mode.TRANSLATED, "II"), (Mode.AUGMENTED, "III")):
            got = mode_latency(width, chunk, mode)
            cells = [got.get(k) for k in ("result", "ack", "ack (completes)", "reflected")]
            lat_rows.append(f"| {width} | {chunk} | {chunk * 8 // width} | {name} | "
                            + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    publish(OUT, [
        "# Modes II and III in the RTL: beats per cycle and latency",
        "",
        f"Command: `{COMMAND}` at commit {head_commit()}; Amaranth simulator, "
        f"{platform.python_implementation()} {platform.python_version()}. Cycle figures are deterministic.",
        "",
        f"`SlotEngine(width={WIDTH}, slots={REGION}, workers={WORKERS})` alone, {CHUNKS} chunks of each of "
        f"{WORKERS} workers offered back to back, every one ready (every fourth frame completes a chunk and sends "
        "its result); beats taken per cycle from the first to the last. Mode II frames carry PSN k for chunk k in "
        f"a region of 2W = {REGION} slots; the build with Mode II has `psn_jobs=1`, the one with Modes II and III "
        "`augmented=True` too. Mode III frames run with their ACK traffic: every child ACKs every second result as "
        "it leaves the engine, and the engine's answers (one ACK per frame) are taken as they come.",
        "",
        "| beats per frame | build | frames | beats/cycle |",
        "|---:|---|---|---:|",
        *rows,
        "",
        "Mode III adds no cycle either: its \"NAK sent\" bit rides in the PSN table's word, the word of "
        "`ResultAcks` is read in A beside the metadata, and the children's ACKs are walked in a block of their "
        "own, so 32 results' ACKs (128 at 4 per result, coalesced to 64) never hold a frame back; the slots of "
        "the 2W-region come free before the PSNs 2W later need them. "
        "Mode II adds no cycle: its PSN table is read with the metadata in A and written in B, and the shadow "
        "slot's read and write use the ports of a frame's second beat. The loss at 4 beats per frame is the UC "
        "engine's, the same in every row: four frames in a row to one slot wait for each other's lane writes, and "
        "a frame after one that sends a result waits until it reached the emitters (docs/rtl.md, "
        "\"Read-after-write\").",
        "",
        "## Latency per mode",
        "",
        "The whole `Switch` (2 ports, one job of 2 workers in the mode; built with Mode III for Mode III, its hop "
        "timer off), each frame sent once the switch is quiet: cycles from the last beat of a frame in to the "
        "first beat of what it causes out. Worker 0's contribution (Mode III: its ACK), worker 1's, which "
        "completes the chunk (the first result out; Mode III: its ACK), and in Mode II worker 0's ACK of its "
        "result (the ACK the switch reflects to it as the ACK of its contribution). Every frame out is the model "
        "switch's. \"-\": the mode sends no such frame.",
        "",
        "| W | C | beats | mode | result | ACK of a contribution (Mode III) | ACK of the completing one | "
        "reflected ACK (Mode II) |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
        *lat_rows,
        "",
        "A mode costs a result no cycle: Mode II's PSN checks and Mode III's ACK state are read beside the "
        "slot's metadata, so the result leaves when the UC one does. Mode III's ACK comes from the engine's "
        "answer stream, which the port's egress multiplexer takes between frames; a reflected ACK crosses the "
        "ingress checks and the ACK router only, never the slot engine. (This result latency counts one cycle "
        "more than `docs/results/promotion.md`'s: it counts from the cycle the last beat was taken.)",
        "",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())

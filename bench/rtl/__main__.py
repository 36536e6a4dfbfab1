"""RTL benchmarks in simulated cycles on Verilator, UC and Mode II side by side; writes docs/results/rtl.md.

    python -m bench rtl          (or: python -m bench.rtl)

Throughput: every port sends its worker's 1 KB contributions back to back
(8 ports, 8 workers, W = 512), UC WRITEs or Mode II RC WRITEs at PSN k for
chunk k, and in Mode II each contribution after the first followed by the
host's ACK of the result before, which the switch reflects; the figure is
the share of cycles in which the slot pipeline takes a beat, from its first
to its last contribution. Latency: cycles from the first and from the last
beat of a chunk's last contribution into the switch to the first beat of
the first result out of it, with nothing else in flight. Simulation speed:
frames in and out per wall-clock second of the UC throughput run (cocotb +
Verilator, one core), and cycles per second of the model with a clock
alone.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path

from bench._report import head_commit
from inagg.hdl.engine import SlotEngine
from inagg.testbench.sim import ROOT, build_switch

PARAMS = dict(ports=8, width=512, slots=32, chunk_bytes=1024, jobs=1, workers=8)
CHUNKS = 32
COMMAND = "python -m bench rtl"
P_BYTES = PARAMS["width"] // 8
LAG = SlotEngine(PARAMS["width"], PARAMS["chunk_bytes"], PARAMS["slots"], PARAMS["workers"]).lag


def main() -> int:
    verilated = build_switch(**PARAMS)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        verilated.run("cocotb_bench", module_dir=Path(__file__).parent, stimulus={"chunks": CHUNKS},
                      env={"INAGG_BENCH_OUT": str(out)})
        fig = json.loads(out.read_text())
    t = {m: fig[f"throughput_{m}"] for m in ("UC", "TRANSLATED")}
    lat = {m: fig[f"latency_{m}"] for m in ("UC", "TRANSLATED")}
    bare = fig["clock_only"]
    load = os.getloadavg()[0]
    beats = PARAMS["chunk_bytes"] * 8 // PARAMS["width"]

    def both(f) -> str:
        return f"{f('UC')} | {f('TRANSLATED')}"
    text = f"""# RTL switch: throughput, latency, simulation speed

Command: `{COMMAND}` (bench/rtl) at {head_commit()}. Build: `Switch({", ".join(f"{k}={v}" for k, v in PARAMS.items())})`,
Verilator + cocotb 2.1 on {platform.machine()} ({platform.python_implementation()} {platform.python_version()}).
Figures in simulated clock cycles are deterministic; wall-clock figures depend on the machine and its load
({os.cpu_count()} cores, load average {load:.1f} at the end of the run).

One job of a worker on each of the 8 ports, every slot its region, in the UC mode and in Mode II
(`docs/rtl.md`, "Mode II"). Mode II's throughput run has ACK traffic flowing: after each contribution
but the first, the host sends its ACK of the result before, and the switch reflects it out of the
same port between its results.

| figure | UC | Mode II | goal |
|---|---|---|---|
| slot pipeline occupancy, 8 ports x {CHUNKS} contributions of 1 KB back to back | {both(lambda m: f'{100 * t[m]["occupancy"]:.2f} % ({t[m]["contributions"]} x {beats} beats in {t[m]["cycles"]} cycles)')} | >= 99 % of one beat per cycle |
| ACKs reflected in that run | {both(lambda m: t[m]["acks_reflected"])} | -- |
| latency, first beat of the last contribution in -> first beat of the first result out | {both(lambda m: f'{lat[m]["from_first"]} cycles')} | -- |
| latency, last beat of the last contribution in -> first beat of the first result out | {both(lambda m: f'{lat[m]["from_last"]} cycles ({lat[m]["from_last"] * 4} ns at 250 MHz)')} | <= 24 cycles |
| simulation speed (throughput run) | {both(lambda m: f'{t[m]["frames_per_s"]:.0f} frames/s, {t[m]["sim_cycles_per_s"]:.0f} cycles/s')} | -- |
| simulation speed, the Verilated model alone (a clock, no bus models) | {bare["cycles_per_s"]:.0f} cycles/s | (the same build) | -- |

One beat per cycle of W = 512 bits is 128 Gb/s of contributions at 250 MHz.
Mode II takes its contributions at the UC mode's rate with the ACKs flowing: an ACK
never reaches the slot engine (its port hands it to the `AckRouter` in one cycle,
`docs/rtl.md`), so the engine sees the same contributions, and the reflected ACKs share
each port's egress with the results through its `FrameMux`. The first-beat latency is the
last-beat one plus the {lat["UC"]["from_first"] - lat["UC"]["from_last"]} cycles (UC; Mode II
{lat["TRANSLATED"]["from_first"] - lat["TRANSLATED"]["from_last"]}) in which the port takes in the rest of
the frame, {-(-t["UC"]["frame_bytes"] // P_BYTES)} beats of {P_BYTES} bytes in all: a port holds a frame until its ICRC, after the
last beat, has passed (`docs/rtl.md`, "Late faults").
The latency goal of 24 cycles is {"met" if lat["UC"]["from_last"] <= 24 else "missed"} since FP32 promotion
(it was 9 cycles before): whether a result goes out as INT32 or as binary32
depends on every lane of the chunk, which is known once its last beat has
left the slot engine, so each emitter holds a result until its last beat is
in. That adds
one chunk's beats, {beats} here, plus the slot engine's lag of {LAG}; the
engine's stages M and B (issue 19) add two more (`docs/rtl.md`, "Slot engine"
and "Figures"). The wait is inherent to promotion by chunk (a
chunk goes out in one format, and its last beat can change it), so it grows
with the chunk: with 256-byte chunks (4 beats at W = 512) the latency of a
2-port switch is 18 cycles, within the goal (`docs/results/promotion.md`).
The wall-clock speed of this 8-port, 512-bit build has two parts: the
Verilated model alone (last row; the build makes only the top's ports
public to VPI, `--no-public-flat-rw` with a control file, see
`testbench/sim.py`), and cocotb with the 16 cocotbext-axi bus models,
Python once per cycle and port, which make up the rest of the row above.
The cycle figures do not depend on any of it.
"""
    (ROOT / "docs" / "results" / "rtl.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

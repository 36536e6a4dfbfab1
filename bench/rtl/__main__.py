"""RTL benchmarks in simulated cycles on Verilator; writes docs/results/rtl.md.

    python -m bench rtl          (or: python -m bench.rtl)

Throughput: every port sends its worker's 1 KB contributions back to back
(8 ports, 8 workers, W = 512); the figure is the share of cycles in which
the slot pipeline takes a beat, from its first to its last contribution.
Latency: cycles from the last beat of a chunk's last contribution into
the switch to the first beat of the first result out of it, with nothing
else in flight. Simulation speed: frames in and out per wall-clock second
of the throughput run (cocotb + Verilator, one core), and cycles per second
of the model with a clock alone.
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
LAG = SlotEngine(PARAMS["width"], PARAMS["chunk_bytes"], PARAMS["slots"], PARAMS["workers"]).lag


def main() -> int:
    verilated = build_switch(**PARAMS)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        verilated.run("cocotb_bench", module_dir=Path(__file__).parent, stimulus={"chunks": CHUNKS},
                      env={"INAGG_BENCH_OUT": str(out)})
        fig = json.loads(out.read_text())
    t, lat, bare = fig["throughput"], fig["latency"], fig["clock_only"]
    load = os.getloadavg()[0]
    text = f"""# RTL switch: throughput, latency, simulation speed

Command: `{COMMAND}` (bench/rtl) at {head_commit()}. Build: `Switch({", ".join(f"{k}={v}" for k, v in PARAMS.items())})`,
Verilator + cocotb 2.1 on {platform.machine()} ({platform.python_implementation()} {platform.python_version()}).
Figures in simulated clock cycles are deterministic; wall-clock figures depend on the machine and its load
({os.cpu_count()} cores, load average {load:.1f} at the end of the run).

| figure | value | goal |
|---|---|---|
| slot pipeline occupancy, 8 ports x {CHUNKS} contributions of 1 KB back to back | {100 * t["occupancy"]:.2f} % ({t["contributions"]} x {t["beats_per_contribution"]} beats in {t["cycles"]} cycles) | >= 99 % of one beat per cycle |
| latency, last beat of the last contribution in -> first beat of the first result out | {lat["cycles"]} cycles ({lat["cycles"] * 4} ns at 250 MHz) | <= 24 cycles |
| simulation speed (throughput run) | {t["frames_per_s"]:.0f} frames/s, {t["sim_cycles_per_s"]:.0f} cycles/s | -- |
| simulation speed, the Verilated model alone (a clock, no bus models) | {bare["cycles_per_s"]:.0f} cycles/s | -- |

One beat per cycle of W = 512 bits is 128 Gb/s of contributions at 250 MHz.
The latency goal of 24 cycles is {"met" if lat["cycles"] <= 24 else "missed"} since FP32 promotion
(it was 9 cycles before): whether a result goes out as INT32 or as binary32
depends on every lane of the chunk, which is known once its last beat has
left the slot engine, so each emitter holds a result until its last beat is
in. That adds
one chunk's beats, {PARAMS["chunk_bytes"] * 8 // PARAMS["width"]} here, plus the slot engine's lag of {LAG}; the
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

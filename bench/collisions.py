"""Goodput of the switch's slot pipeline against the collision rate, on Verilator; writes docs/results/exception.md.

    .venv/bin/python bench/collisions.py

Four host jobs hold the 64 fast slots (16 each), four guest jobs share their
regions, so every guest contribution collides and takes the exception path.
After the hosts have claimed their slots, all four ports send their
workers' contributions back to back, guests making up a share ``rate`` of
them (a preliminary run with two ports found the slot pipeline at 0.615
beats per cycle without collisions: two ports do not saturate it, and an
unsaturated pipeline hides the cost measured here). Goodput is the useful contribution beats per cycle at the slot
pipeline -- beats of frames that aggregate, on a fast or an overflow slot,
not the first pass of a frame that diverts -- from the first to the last
contribution the engine takes. Every run is also checked frame by frame and
counter by counter against the model switch. The figures go into a section
of ``docs/results/exception.md`` between markers, with a PNG plot beside it.

This file is also the cocotb test module the benchmark runs.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge, gather

# Four ports: two do not saturate the slot pipeline (each port's ingress checks a whole frame before it
# offers it), and an unsaturated pipeline absorbs the second passes of diverted frames in its idle cycles.
PARAMS = dict(ports=4, width=512, slots=64, chunk_bytes=1024, jobs=8, workers=4, exc_table=32, exc_max_kicks=16,
              exc_stash=4)
RATES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
CONTRIBUTIONS = 1200
COMMAND = ".venv/bin/python bench/collisions.py"
BEGIN, END = "<!-- bench/collisions.py: begin -->", "<!-- bench/collisions.py: end -->"


# -- the cocotb side (imported by the simulator) ------------------------------------------------------------

@cocotb.test()
@cocotb.parametrize(rate=list(RATES))
async def goodput(dut, rate):
    """Saturated slot pipeline, a share ``rate`` of guest (colliding) contributions."""
    from inagg.models.job import ExceptionSpec, SwitchSpec
    from inagg.models.protocol import Counter
    from inagg.testbench.collisions import claim, collision_jobs, mixed
    from inagg.testbench.replay import DIVERTED
    from inagg.testbench.switch_tb import SwitchTB

    from inagg.testbench.sim import parameters, stimulus

    p = {**parameters(), **stimulus()}
    spec = SwitchSpec(ports=p["ports"], slots=p["slots"], chunk_bytes=p["chunk_bytes"],
                      exception=ExceptionSpec(p["exc_table"], p["exc_max_kicks"], p["exc_stash"]))
    tb = SwitchTB(dut, spec)
    await tb.reset()
    hosts = 4
    jobs = collision_jobs(spec, hosts, 4, spec.slots // hosts, p["workers"])
    await tb.configure(jobs)

    async def send(traffic):
        async def port(q):
            for r, frame in traffic:
                if r == q:
                    await tb.send(q, frame)
        await gather(*[port(q) for q in range(tb.ports)])

    await send(claim(spec, jobs, hosts, np.random.default_rng(0)))
    await tb.settle(quiet=50)
    traffic, guest = mixed(spec, jobs, hosts, rate, p["contributions"], 1 + int(rate * 1000),
                           first_chunk=spec.slots // hosts)
    marks = []  # (cycle, order entry) of the measured phase
    log = []    # the same with refusals, as the testbench's order log has them
    start = len(tb.order)

    async def clock():
        n = 0
        while True:
            await RisingEdge(dut.clk)
            n += 1
            if dut.order_valid.value:
                marks.append((n, int(dut.order_port.value) | (DIVERTED if dut.order_diverted.value else 0)))
                log.append(marks[-1][1])
            if dut.order_refused.value:
                log.append(tb.ports)
    counting = cocotb.start_soon(clock())
    await send(traffic)
    await tb.check()
    counting.cancel()
    beats = p["chunk_bytes"] * 8 // p["width"]
    assert log == tb.order[start:start + len(log)]
    diverted = sum(e & DIVERTED != 0 for _, e in marks)
    useful = len(marks) - diverted
    cycles = marks[-1][0] - marks[0][0] + beats
    counters = await tb.counters()
    out = os.environ["INAGG_BENCH_OUT"]
    figures = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
    figures[str(rate)] = {"contributions": len(traffic), "guest": guest, "diverted": diverted, "useful": useful,
                          "beats": beats, "cycles": cycles, "goodput": useful * beats / cycles,
                          "inserts": counters[Counter.EXC_INSERTS], "refused": counters[Counter.EXC_REFUSED]}
    Path(out).write_text(json.dumps(figures, indent=1))


# -- the benchmark ------------------------------------------------------------------------------------------

def _plot(fig: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = fig["0.0"]["goodput"]
    rates = [100 * f["diverted"] / (f["useful"]) for f in fig.values()]
    rel = [100 * f["goodput"] / base for f in fig.values()]
    bound = [100 / (1 + r / 100) for r in rates]
    plt.figure(figsize=(6, 3.6))
    plt.plot(rates, rel, "o-", label="measured (RTL on Verilator)")
    plt.plot(rates, bound, "--", label="bound: one extra pass per diverted frame")
    plt.axhline(95, color="grey", lw=0.8, ls=":")
    plt.axvline(5, color="grey", lw=0.8, ls=":")
    plt.xlabel("collision rate (% of contributions)")
    plt.ylabel("goodput (% of no collisions)")
    plt.title(f"Slot pipeline goodput, W = {PARAMS['width']}, {PARAMS['chunk_bytes']} B chunks")
    plt.legend(loc="lower left")
    plt.grid(alpha=0.3)
    plt.tight_layout()
    plt.savefig(path, dpi=120)


def _saturation(base: float, beats: int) -> str:
    """What the no-collision goodput says about the bound (a pipeline that idles hides the second passes)."""
    if base >= 0.95:
        return "Without collisions the pipeline is saturated, so the bound above is what the figures test."
    why = (f"{beats}-beat frames wait for the writes of the frame before them on a slot and for results on their "
           "way to the emitters (`docs/results/promotion.md`)" if beats <= 4 else
           "the ports leave it idle at times")
    return (f"Without collisions this pipeline takes {base:.3f} beats a cycle, not 1 ({why}), so second passes of "
            "diverted frames partly fill cycles that would idle, and goodput can exceed the saturated bound.")


def main() -> int:
    from inagg.testbench.sim import ROOT, build_switch

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        build_switch(**PARAMS).run("collisions", module_dir=Path(__file__).parent,
                                   stimulus={"contributions": CONTRIBUTIONS}, env={"INAGG_BENCH_OUT": str(out)})
        fig = json.loads(out.read_text())
    fig = dict(sorted(fig.items(), key=lambda kv: float(kv[0])))
    results = ROOT / "docs" / "results"
    _plot(fig, results / "exception_goodput.png")
    base = fig["0.0"]["goodput"]
    rows = []
    for rate, f in fig.items():
        r = f["diverted"] / f["useful"]
        rows.append(f"| {100 * float(rate):.0f} % | {f['useful']} | {f['diverted']} ({100 * r:.2f} %) | {f['cycles']} "
                    f"| {f['goodput']:.4f} | {100 * f['goodput'] / base:.2f} % | {100 / (1 + r):.2f} % "
                    f"| {f['inserts']} |")
    five = min(fig, key=lambda k: abs(float(k) - 0.05))
    beats = PARAMS["chunk_bytes"] * 8 // PARAMS["width"]
    section = f"""{BEGIN}
## The exception path in the switch: goodput against the collision rate

Command: `{COMMAND}`. Build: `Switch({", ".join(f"{k}={v}" for k, v in PARAMS.items())})` on Verilator
(cocotb 2.1, {platform.machine()}). Four host jobs hold the 64 fast slots, four guest jobs share their
regions, so every guest contribution collides; after the hosts' first chunks, all ports send back to back
about {CONTRIBUTIONS} contributions, a share of them the guests'. Goodput is
the beats of contributions that aggregate (on a fast or an overflow slot) per cycle of the slot pipeline,
from the first to the last contribution it takes; the first pass of a diverted frame is not useful. Every
run matched the model switch frame by frame and counter by counter. Figures in cycles are deterministic.

| guest share | useful contributions | diverted (of useful) | cycles | goodput (beats/cycle) | of no collisions | bound 1/(1+rate) | EXC_INSERTS |
|---|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

![goodput against collision rate](exception_goodput.png)

A diverted frame passes the slot pipeline twice: once where it collides (its beats are copied into the
divert queue as they go by) and once on its way back to its overflow slot. So a saturated pipeline can
do no better than `1 / (1 + r)` of its no-collision goodput at a collision rate `r` (95.24 % at 5 %).
Goal: >= 95 % at 5 %; measured here: {100 * fig[five]["goodput"] / base:.2f} %.
{_saturation(base, beats)}
{END}
"""
    doc = results / "exception.md"
    text = doc.read_text()
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The register block: AXI4-Lite decode, SLVERR, job-table reads, and counters fed by many sources at once."""

import dataclasses

import pytest
from amaranth.sim import Simulator

from inagg.hdl.control import Control, register_layout
from inagg.host.controller import RegisterTarget
from inagg.models import regmap as rm
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.testbench.axil_sim import axil_read, axil_write
from inagg.testbench.traffic import make_job

_SLVERR = 0b10


def _control():
    return Control(SwitchGeometry(ports=2, width=64, slots=16, chunk_bytes=256, jobs=2, workers=4), job_readers=1,
                   event_sources=3)


def test_registers_and_errors():
    dut = _control()
    regmap = rm.RegMap(2, 4)
    seen = {}

    async def bench(ctx):
        assert await axil_read(ctx, dut.axil, regmap.switch("ID")) == (rm.ID_VALUE, 0)
        assert await axil_read(ctx, dut.axil, regmap.switch("JOBS")) == (2 | 4 << 16, 0)
        assert await axil_read(ctx, dut.axil, regmap.switch("PKEY")) == (0xFFFF, 0)
        assert await axil_write(ctx, dut.axil, regmap.job(1, "SLOT_BASE"), 8) == 0
        assert await axil_write(ctx, dut.axil, regmap.job(1, "CTRL"), 1 | 3 << 8) == 0
        assert await axil_read(ctx, dut.axil, regmap.job(1, "SLOT_BASE")) == (8, 0)
        assert await axil_write(ctx, dut.axil, regmap.job(1, "CTRL") + 0x04, 0) == 0b10  # no job R_Key any more
        assert await axil_write(ctx, dut.axil, regmap.worker(1, 3, "CONTRIB_RKEY"), 0x1234_5678) == 0
        assert await axil_write(ctx, dut.axil, regmap.worker(1, 2, "CONTRIB_RKEY"), 0x0BAD_0BAD) == 0
        assert (await axil_read(ctx, dut.axil, regmap.worker(1, 3, "CONTRIB_RKEY")))[1] == 0b10  # write-only
        assert await axil_write(ctx, dut.axil, regmap.switch("ID"), 0) == 0b10          # read-only
        assert await axil_write(ctx, dut.axil, 0x0F00, 0) == 0b10                        # unmapped
        assert (await axil_read(ctx, dut.axil, 0x0F00))[1] == 0b10
        assert await axil_write(ctx, dut.axil, regmap.job(0, "CTRL") + 0x10, 0) == 0b10  # hole in a job
        assert await axil_write(ctx, dut.axil, regmap.worker(1, 3, "CONTRIB_RKEY") + 4, 0) == 0b10
        assert await axil_write(ctx, dut.axil, regmap.worker(1, 3, "PORT"), 1) == 0
        ctx.set(dut.job_rd[0].index, 1)
        seen["entry"] = (ctx.get(dut.job_rd[0].entry.valid), ctx.get(dut.job_rd[0].entry.workers),
                         ctx.get(dut.job_rd[0].entry.slot_base))
        for p in range(2):  # every port's checks read worker (1, 3): its contribution R_Key and its port
            ctx.set(dut.contrib_rd[p].job, 1)
            ctx.set(dut.contrib_rd[p].worker, 3 - p)
        seen["contrib"] = [(ctx.get(rd.entry.rkey), ctx.get(rd.entry.port)) for rd in dut.contrib_rd]
        ctx.set(dut.job_rd[0].index, 2)  # beyond the table: not a job
        seen["beyond"] = ctx.get(dut.job_rd[0].entry.valid)
        seen["port"] = ctx.get(dut.ports) >> (7 * dut.port_bits) & 1
        for src in range(3):  # all three sources count RX_FRAMES in one cycle, two count a drop
            ctx.set(dut.events[src], 1 << Counter.RX_FRAMES | (src > 0) << Counter.DROP_BAD_ICRC)
        await ctx.tick()
        for src in range(3):
            ctx.set(dut.events[src], 0)
        await ctx.tick()  # the strobes are registered before the counters' adders
        assert await axil_read(ctx, dut.axil, regmap.counter(Counter.RX_FRAMES)) == (3, 0)
        assert await axil_read(ctx, dut.axil, regmap.counter(Counter.DROP_BAD_ICRC)) == (2, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == {"entry": (1, 3, 8), "beyond": 0, "port": 1, "contrib": [(0x1234_5678, 1), (0x0BAD_0BAD, 0)]}




def test_a_mode_the_build_lacks_is_refused_and_read_back():
    """Issue 18, mode per job: a CTRL write of a mode the build lacks is SLVERR and changes nothing; the
    controller, told by a register map that claims the mode, reads CTRL back and names MODES (UC and Mode II)."""
    dut = _control()
    claims = rm.RegMap(2, 4, modes=frozenset(Mode))
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    uc = make_job(spec, 1, 3, 0, 4)
    rc = dataclasses.replace(uc, mode=Mode.TERMINATED)
    ctrl = claims.job(1, "CTRL")
    seen, regs = {}, {}

    async def bench(ctx):
        seen["rc"] = [await axil_write(ctx, dut.axil, a, v) for a, v in claims.job_writes(rc, spec)]
        regs[ctrl], _ = await axil_read(ctx, dut.axil, ctrl)
        regs[claims.switch("MODES")], _ = await axil_read(ctx, dut.axil, claims.switch("MODES"))
        ctx.set(dut.job_rd[0].index, 1)
        seen["rc enabled"] = ctx.get(dut.job_rd[0].entry.valid)
        seen["ii"] = await axil_write(ctx, dut.axil, ctrl, claims.ctrl(dataclasses.replace(uc, mode=Mode.TRANSLATED)))
        seen["ii entry"] = ctx.get(dut.job_rd[0].entry.valid), ctx.get(dut.job_rd[0].entry.mode)
        seen["uc"] = await axil_write(ctx, dut.axil, ctrl, claims.ctrl(uc))
        seen["uc enabled"] = ctx.get(dut.job_rd[0].entry.valid)
        seen["again"] = await axil_write(ctx, dut.axil, ctrl, claims.ctrl(dataclasses.replace(uc, mode=Mode.AUGMENTED)))
        seen["kept"] = (await axil_read(ctx, dut.axil, ctrl))[0], ctx.get(dut.job_rd[0].entry.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen["rc"][:-1] == [0] * (len(seen["rc"]) - 1) and seen["rc"][-1] == _SLVERR
    assert regs == {ctrl: 0, claims.switch("MODES"): 0x5} and seen["rc enabled"] == 0
    assert (seen["ii"], seen["ii entry"]) == (0, (1, rm.MODE_CODES[Mode.TRANSLATED]))
    assert (seen["uc"], seen["uc enabled"]) == (0, 1)
    assert seen["again"] == _SLVERR and seen["kept"] == (claims.ctrl(uc), 1)
    target = RegisterTarget(lambda a, v: None, claims, spec, read=regs.__getitem__)
    with pytest.raises(RuntimeError, match=r"^the switch refused job 1: its CTRL reads 0x00000000, not 0x00010301; "
                                           r"the job asks for mode TERMINATED, the switch takes UC, TRANSLATED "
                                           r"\(MODES\) and enables no job that shares a slot with an enabled "
                                           r"Mode II or III job$"):
        target.add_job(rc)


def test_result_psns_per_reader():
    # Each reader counts in its own copy; a PSN write sets every copy and waits out increments.
    dut = _control()
    regmap = rm.RegMap(2, 4)
    seen = {}

    def psns(ctx, index):
        for rd in dut.worker_rd:
            ctx.set(rd.index, index)
        return [ctx.get(rd.entry.psn) for rd in dut.worker_rd]

    async def bench(ctx):
        assert await axil_write(ctx, dut.axil, regmap.worker(1, 2, "PSN"), 0xFFFFFE) == 0
        assert await axil_write(ctx, dut.axil, regmap.worker(0, 1, "PSN"), 7) == 0
        seen["written"] = psns(ctx, 1), psns(ctx, 1 * 4 + 2)
        ctx.set(dut.worker_rd[0].psn_inc, 1)
        await ctx.tick().repeat(2)  # reader 0 sends two results to worker (1, 2); it wraps at 24 bits
        ctx.set(dut.worker_rd[0].psn_inc, 0)
        seen["counted"] = psns(ctx, 1), psns(ctx, 1 * 4 + 2)
        ctx.set(dut.worker_rd[1].index, 1)
        ctx.set(dut.worker_rd[1].psn_inc, 1)
        ctx.set(dut.axil.awaddr, regmap.worker(0, 1, "PSN"))
        ctx.set(dut.axil.wdata, 50)
        ctx.set(dut.axil.awvalid, 1)
        ctx.set(dut.axil.wvalid, 1)
        waited = []
        for _ in range(3):
            waited.append(ctx.get(dut.axil.awready))
            await ctx.tick()
        ctx.set(dut.worker_rd[1].psn_inc, 0)
        waited.append(ctx.get(dut.axil.awready))
        await ctx.tick()
        ctx.set(dut.axil.awvalid, 0)
        ctx.set(dut.axil.wvalid, 0)
        ctx.set(dut.axil.bready, 1)
        await ctx.tick()
        seen["waited"] = waited
        seen["rewritten"] = psns(ctx, 1)
        # A write elsewhere in the worker table does not wait for increments.
        ctx.set(dut.worker_rd[1].psn_inc, 1)
        ctx.set(dut.axil.awaddr, regmap.worker(0, 1, "RKEY"))
        ctx.set(dut.axil.awvalid, 1)
        ctx.set(dut.axil.wvalid, 1)
        seen["other"] = ctx.get(dut.axil.awready)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == {"written": ([7, 7], [0xFFFFFE] * 2), "counted": ([7, 7], [0, 0xFFFFFE]),
                    "waited": [0, 0, 0, 1], "rewritten": [50, 50], "other": 1}


def test_register_layouts_follow_the_declarations():
    ctrl = register_layout(rm.JOB_CTRL)
    assert ctrl.size == 18 and ctrl["workers"].offset == 8 and ctrl["workers"].shape.width == 7
    assert ctrl["mode"].offset == 16 and ctrl["mode"].shape.width == 2
    assert {name for name, _ in register_layout(rm.TEARDOWN, "RO")} == {"busy", "refused"}
    assert {name for name, _ in register_layout(rm.TEARDOWN, "WO")} == {"job"}


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED])
def test_a_job_sharing_slots_with_a_mode_ii_job_is_refused(mode):
    """Issue 18: a CTRL write that enables a job on an enabled job's slots, either of them Mode II (or III, in
    a build with it), is SLVERR and changes nothing; UC jobs may share slots (the exception path's), a disabled
    job may sit anywhere."""
    geometry = SwitchGeometry(ports=2, width=64, slots=16, chunk_bytes=256, jobs=2, workers=4,
                              augmented=mode is Mode.AUGMENTED)
    dut = Control(geometry, job_readers=1, event_sources=3)
    regmap = geometry.regmap
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    ii = dataclasses.replace(make_job(spec, 0, 2, 4, 4), mode=mode)
    seen = {}

    async def write_job(ctx, job):
        return [await axil_write(ctx, dut.axil, a, v) for a, v in regmap.job_writes(job, spec)][-1]

    async def bench(ctx):
        seen["ii"] = await write_job(ctx, ii)
        for base, slots in ((4, 4), (6, 2), (0, 8), (0, 16)):
            seen[base, slots] = await write_job(ctx, make_job(spec, 1, 2, base, slots))
            seen[base, slots, "ctrl"] = (await axil_read(ctx, dut.axil, regmap.job(1, "CTRL")))[0]
        seen["beside"] = await write_job(ctx, make_job(spec, 1, 2, 8, 8))
        seen["off"] = await axil_write(ctx, dut.axil, regmap.job(0, "CTRL"), 0)
        seen["ii over uc"] = await write_job(ctx, dataclasses.replace(ii, slot_base=8, slots=4))
        seen["uc over uc"] = await write_job(ctx, make_job(spec, 0, 2, 8, 4))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen.pop("ii") == 0
    for base, slots in ((4, 4), (6, 2), (0, 8), (0, 16)):
        assert (seen[base, slots], seen[base, slots, "ctrl"]) == (_SLVERR, 0), (base, slots)
    assert (seen["beside"], seen["off"], seen["ii over uc"], seen["uc over uc"]) == (0, 0, _SLVERR, 0)

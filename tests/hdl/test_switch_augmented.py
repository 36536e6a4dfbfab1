"""Mode III (docs/protocol.md section 7) through the whole switch in the Amaranth simulator, against the model.

The frames go in one at a time, each once the switch is quiet, so the order
in which the switch takes them is the sending order and the model takes
them in that order too (the replay of concurrent traffic, whose merge the
switch decides, is the cocotb suites' business).
"""

import dataclasses

import pytest
from amaranth.sim import Simulator

from inagg.hdl.switch import Switch
from inagg.models import regmap as rm
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.testbench.amaranth_switch import cycle, simulate
from inagg.testbench.axil_sim import axil_read, axil_write
from inagg.testbench.replay import GONE, SKIPPED, AckTaken, RemoveJob, assert_frames_match
from inagg.testbench.streams import get_frame, put_frame
from inagg.testbench.traffic import make_job, mode_iii_hosts


def _run(width, frames_of, job, spec, quiet=60):
    geometry = SwitchGeometry.for_spec(spec, width=width, jobs=2, workers=4, augmented=True)
    dut = Switch(geometry)
    model = ModelSwitch(spec)
    model.add_job(job)
    expected = {p: [] for p in range(spec.ports)}
    for port, frame in frames_of:
        for p, f in model.receive(port, frame):
            expected[p].append(f)
    received = {p: [] for p in range(spec.ports)}
    counters = {}

    async def control(ctx):
        regmap = geometry.regmap
        writes = regmap.switch_writes(spec) + regmap.job_writes(job, spec) + [(regmap.switch("HOP_TIMEOUT"), 0)]
        for addr, value in writes:
            assert await axil_write(ctx, dut.axil, addr, value) == 0, f"write to 0x{addr:x} refused"
        for port, frame in frames_of:
            await put_frame(ctx, dut.s[port], frame, width)
            idle = 0
            while idle < quiet:
                await ctx.tick()
                idle = 0 if any(ctx.get(m.valid) for m in dut.m) else idle + 1
        for c in Counter:
            counters[c], resp = await axil_read(ctx, dut.axil, regmap.counter(c))
            assert resp == 0

    def receiver(p):
        async def run(ctx):
            while True:
                received[p].append(await get_frame(ctx, dut.m[p], width))
        return run

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(control)
    for p in range(spec.ports):
        sim.add_testbench(receiver(p), background=True)
    sim.run()
    return received, expected, counters, model.counters


@pytest.mark.parametrize("width, seed", [(64, 1), (512, 2)])
def test_mode_iii_through_the_switch_is_the_models(width, seed):
    """Contributions, the switch's ACKs and NAKs, results, the children's ACKs and NAKs and the results sent
    again: every frame on every port and every counter the model's."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    job = dataclasses.replace(make_job(spec, 1, 3, 4, 4), mode=Mode.AUGMENTED)
    frames = mode_iii_hosts(spec, job, seed, 150)
    received, expected, counters, model_counters = _run(width, frames, job, spec)
    assert_frames_match(received, expected)
    diff = {c.name: (counters[c], model_counters[c]) for c in Counter if counters[c] != model_counters[c]}
    assert not diff, f"counters differ (rtl, model): {diff}"
    for c in (Counter.ACK_SENT, Counter.NAK_SENT, Counter.HOP_RESENDS, Counter.DROP_BUFFER_BUSY, Counter.COMPLETED):
        assert model_counters[c] > 0, c.name
    assert model_counters[Counter.COMPLETED] > job.slots  # slots taken again once every child ACKed


@pytest.mark.parametrize("width, seed", [(64, 3), (512, 4)])
def test_mode_iii_concurrent_traffic_and_timers_are_the_models(width, seed):
    """The hosts' frames on both ports at once, egress paused now and then, the children's ACK timers at 200
    cycles: replayed in the order the switch reports (its contributions, the ACKs and timers that took
    effect, the results it sent again), every frame and counter is the model's."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    job = dataclasses.replace(make_job(spec, 1, 3, 4, 4), mode=Mode.AUGMENTED)
    frames = mode_iii_hosts(spec, job, seed, 150)
    run = simulate(spec, [job], frames, width=width, n_jobs=2, augmented=True, hop_timeout=200,
                   pause=lambda p: cycle([0, 1, 0, 0]), gaps=lambda p: cycle([0, 0, 1]), cycles=1200)
    run.assert_matches()
    kinds = {type(e).__name__ for e in run.order if not isinstance(e, int)}
    assert {"AckTaken", "TimerRanOut", "object"} <= kinds, kinds
    for c in (Counter.ACK_SENT, Counter.NAK_SENT, Counter.HOP_RESENDS, Counter.DROP_BUFFER_BUSY):
        assert run.counters[c] > 0, c.name


# Teardown cycles where, in these runs, frames past their checks, ACKs on their way and results asked for
# again all meet the teardown (each kind in at least one run).
@pytest.mark.parametrize("width, seed, at, kinds", [(64, 5, 700, {"frame", "ack", "resend"}),
                                                     (64, 6, 1000, {"frame", "resend"}),
                                                     (512, 7, 400, {"frame", "ack"})])
def test_a_mode_iii_job_torn_down_under_traffic_is_the_models(width, seed, at, kinds):
    """A teardown while the hosts send, ACK and NAK, timers run out and results go out again: every frame
    and counter is still the model's, its ``remove_job`` where the switch's took effect. Frames past their
    ports' checks and ACKs on their way to the engine are dropped as the model drops a frame of a job that
    is gone (``DROP_BAD_OPCODE``, an RC opcode with no job to take it); the results a NAK or a timer asked
    for before are sent (before the teardown) or not at all (after it)."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    job = dataclasses.replace(make_job(spec, 1, 3, 4, 4), mode=Mode.AUGMENTED)
    frames = mode_iii_hosts(spec, job, seed, 150)
    run = simulate(spec, [job], frames, width=width, n_jobs=2, augmented=True, hop_timeout=150,
                   pause=lambda p: cycle([0, 1, 0, 0]), gaps=lambda p: cycle([0, 0, 1]), cycles=1200,
                   teardown=(1, at))
    run.assert_matches()
    torn = next(k for k, e in enumerate(run.order) if isinstance(e, RemoveJob))
    after = run.order[torn + 1:]
    met = {"frame": any(isinstance(e, int) and e & GONE for e in after),
           "ack": any(isinstance(e, AckTaken) and e.gone for e in after),
           "resend": any(e is SKIPPED for e in after)}
    assert {k for k, v in met.items() if v} >= kinds, met
    assert run.counters[Counter.DROP_BAD_OPCODE] > 0  # the hosts' frames after it too

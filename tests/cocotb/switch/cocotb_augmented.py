"""cocotb tests of Mode III (docs/protocol.md section 7) on the switch top against the model switch (run by
test_switch.py on its W = 64 and W = 512 builds, which take Mode III jobs).

The test ends in :meth:`SwitchTB.check`: the traffic replayed into the model in the order the RTL reports
(its contributions, and on ``hop`` the ACKs and timers that took effect and the results sent again), every
result and every ACK and NAK the RTL sent equals the model's byte for byte, per port and each in the
model's order, every counter equals the model's, and nothing is left in flight.
"""

from __future__ import annotations

import dataclasses
import random

import cocotb
from cocotb.triggers import ClockCycles

from inagg.models import regmap as rm
from inagg.models.job import Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.testbench.sim import parameters
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import make_job, mode_iii_hosts

PARAMS = parameters()


@cocotb.test()
async def mode_iii_with_loss_duplication_and_timers(dut):
    """Three hosts of a Mode III job on every port; 10 % of the frames lost and 5 % duplicated on the way in,
    random backpressure everywhere, the children's ACK timers at 400 cycles while the traffic lasts and 3,000
    cycles after."""
    spec = SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"], chunk_bytes=PARAMS["chunk_bytes"])
    tb = await SwitchTB.start(dut, spec)
    job = dataclasses.replace(make_job(spec, 1, 3, 4, 4), mode=Mode.AUGMENTED)
    await tb.configure([job])
    await tb.write(rm.RegMap.switch("HOP_TIMEOUT"), 400)
    rng = random.Random(PARAMS["width"])
    traffic = mode_iii_hosts(spec, job, PARAMS["width"], 300, loss=0.1, dup=0.05)
    for p in range(tb.ports):
        tb.src[p].set_pause_generator(iter(lambda: int(rng.random() < 0.2), 2))
        tb.snk[p].set_pause_generator(iter(lambda: int(rng.random() < 0.4), 2))
    # In bursts of 30 frames, the ports' at once: within a burst the switch merges the ports as its timing
    # decides; between bursts it settles, so the hosts' ACKs mostly come after the results they acknowledge,
    # as the stimulus made them.
    for k in range(0, len(traffic), 30):
        await tb.send_all(traffic[k:k + 30])
        await tb.settle(quiet=150)
    # The timers of the children still waiting for results run out a few times; then none, so that the
    # switch goes quiet (a child that never ACKs would get its results again for good).
    await ClockCycles(dut.clk, 3000)
    await tb.write(rm.RegMap.switch("HOP_TIMEOUT"), 0)
    await tb.check()
    counters = await tb.counters()
    for c in (Counter.ACK_SENT, Counter.NAK_SENT, Counter.HOP_RESENDS, Counter.DROP_BUFFER_BUSY,
              Counter.DUP_CONTRIB, Counter.DROP_PSN_AHEAD):
        assert counters[c] > 0, c.name
    assert counters[Counter.COMPLETED] > job.slots and counters[Counter.ACK_REFLECTED] == 0
    assert any(type(e).__name__ == "TimerRanOut" for e in tb.order), "no timer ran out"

"""cocotb tests of Mode II (docs/protocol.md section 6.2) on the switch top against the model switch (run by
test_switch.py on its W = 64 and W = 512 builds).

The test ends in :meth:`SwitchTB.check`: every result and every reflected ACK the RTL sent equals the
model's byte for byte, per port and each in the model's order, every counter equals the model's, and
nothing is left in flight.
"""

from __future__ import annotations

import random

import cocotb

from inagg.models import regmap as rm
from inagg.models.job import Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.testbench.sim import parameters
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import mode_ii_allreduce

PARAMS = parameters()


@cocotb.test()
async def mode_ii_allreduce_with_backpressure(dut):
    """A UC job and a Mode II AllReduce (behind and ahead PSNs, ACKs and NAKs, losses), random backpressure."""
    spec = SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"], chunk_bytes=PARAMS["chunk_bytes"])
    tb = await SwitchTB.start(dut, spec)
    modes = await tb.read(rm.RegMap.switch("MODES"))
    assert rm.RegMap.decode_modes(modes) == {Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED} and modes == 0xD
    jobs, traffic, acks = mode_ii_allreduce(spec, PARAMS["width"])
    await tb.configure(jobs)
    rng = random.Random(PARAMS["width"])
    for p in range(tb.ports):
        tb.src[p].set_pause_generator(iter(lambda: int(rng.random() < 0.2), 2))
        tb.snk[p].set_pause_generator(iter(lambda: int(rng.random() < 0.4), 2))
    await tb.send_all(traffic)
    await tb.check()
    counters = await tb.counters()
    assert counters[Counter.ACK_REFLECTED] == acks
    for c in (Counter.TX_RESENDS, Counter.DUP_CONTRIB, Counter.DROP_PSN_AHEAD, Counter.DROP_BAD_ADDRESS):
        assert counters[c] > 0, c.name
    assert counters[Counter.RX_FRAMES] == len(traffic)

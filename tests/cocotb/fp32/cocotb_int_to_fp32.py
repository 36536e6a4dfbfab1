"""cocotb testbench of the Verilated :class:`~inagg.hdl.fp32.IntToFP32` against numpy.

Run by ``test_fp32_units.py`` beside it, on a build of :func:`inagg.testbench.sim.build`.
"""

import cocotb
import numpy as np

from inagg.hdl.fp32 import IntToFP32
from inagg.testbench.fp32 import cases
from inagg.testbench.fp32.pipe import run, settings, start


@cocotb.test()
async def edge_cases_then_random_integers(dut):
    """The edge cases and the stimulus's random integers, 10,000 back to back, then with idle gaps."""
    unit, n, rng = settings(IntToFP32)
    latency, width = unit.latency, unit.width
    x = np.concatenate([cases.int_edge_cases(width), cases.int_random(rng, n, width)])
    valid = cases.valid_pattern(rng, len(x), head=10_000)
    await start(dut)
    o, o_valid = await run(dut, {"i": x}, valid, rng, extra=latency)
    want_valid, _ = cases.expected_valid(valid, latency, len(o))
    assert (o_valid == want_valid).all(), f"o_valid differs first at sample {np.argmax(o_valid != want_valid)}"
    report = cases.int_report(x, o[o_valid])
    assert not report, report
    dut._log.info("%d conversions equal numpy's over %d cycles", len(x), len(o))

"""cocotb testbench of the Verilated :class:`~inagg.hdl.fp32.FP32Adder` against numpy.

Run by ``test_fp32_units.py`` beside it, on a build of :func:`inagg.testbench.sim.build`.
"""

import cocotb
import numpy as np

from inagg.hdl.fp32 import FP32Adder
from inagg.testbench.fp32 import cases
from inagg.testbench.fp32.pipe import run, settings, start


@cocotb.test()
async def edge_cases_then_random_pairs(dut):
    """The edge cases and the stimulus's random pairs, 10,000 back to back, then with idle gaps."""
    unit, n, rng = settings(FP32Adder)
    latency = unit.latency
    edge_a, edge_b = cases.adder_edge_cases()
    rand_a, rand_b = cases.adder_random(rng, n)
    a, b = np.concatenate([edge_a, rand_a]), np.concatenate([edge_b, rand_b])
    valid = cases.valid_pattern(rng, len(a), head=10_000)
    await start(dut)
    o, o_valid = await run(dut, {"a": a, "b": b}, valid, rng, extra=latency)
    want_valid, _ = cases.expected_valid(valid, latency, len(o))
    assert (o_valid == want_valid).all(), f"o_valid differs first at sample {np.argmax(o_valid != want_valid)}"
    report = cases.adder_report(a, b, o[o_valid])
    assert not report, report
    dut._log.info("%d sums equal numpy's over %d cycles", len(a), len(o))


@cocotb.test()
async def reset_drops_the_sums_in_flight(dut):
    """A reset empties the pipeline; the pairs after it come out right."""
    unit, _, rng = settings(FP32Adder)
    latency = unit.latency
    a, b = cases.adder_random(rng, 400)
    valid = np.ones(len(a), bool)
    reset = np.zeros(len(a), bool)
    reset[[100, 200, 201, 300 + latency]] = True
    await start(dut)
    o, o_valid = await run(dut, {"a": a, "b": b}, valid, rng, reset=reset, extra=latency)
    want_valid, which = cases.expected_valid(valid, latency, len(o), reset)
    assert (o_valid == want_valid).all(), f"o_valid differs first at sample {np.argmax(o_valid != want_valid)}"
    report = cases.adder_report(a[which], b[which], o[o_valid])
    assert not report, report

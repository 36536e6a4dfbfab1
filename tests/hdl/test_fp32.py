# amaranth: UnusedElaboratable=no
"""FP32 units in the Amaranth simulator against numpy: edge cases at every latency, seeded random mixes.

The bulk of the random operands (10**5 per unit) runs on Verilator in
``tests/cocotb/test_fp32_units.py``; here every latency of both units sees
the edge-case lists, and the default pipelines see a few thousand random
operands with idle gaps.
"""

import re

import numpy as np
import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings, strategies as st

from inagg.hdl.fp32 import FP32Adder, IntToFP32
from inagg.testbench.fp32 import cases


def _simulate(dut, operands, valid, rng):
    """Feed ``operands`` (port name -> values) on the cycles where ``valid`` is set; return the outputs.

    Idle cycles carry random garbage on the operand ports. Checks that
    ``o_valid`` is ``valid`` delayed by exactly ``dut.latency`` cycles,
    so one result leaves per cycle for every operand that entered.
    """
    cycles = len(valid) + dut.latency
    drive = {port: cases.port_values(rng, values, len(getattr(dut, port)), valid, cycles).tolist()
             for port, values in operands.items()}
    o = np.zeros(cycles, np.uint32)
    o_valid = np.zeros(cycles, bool)

    async def bench(ctx):
        for t in range(cycles):
            for port, lanes in drive.items():
                ctx.set(getattr(dut, port), lanes[t])
            ctx.set(dut.i_valid, int(t < len(valid) and valid[t]))
            await ctx.tick()
            o[t], o_valid[t] = ctx.get(dut.o), ctx.get(dut.o_valid)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    np.testing.assert_array_equal(o_valid, cases.expected_valid(valid, dut.latency, cycles)[0])
    return o[o_valid]


def _check_adder(dut, a, b, rng):
    got = _simulate(dut, {"a": a, "b": b}, cases.valid_pattern(rng, len(a)), rng)
    report = cases.adder_report(a, b, got)
    assert not report, report


def _check_int(dut, x, rng):
    got = _simulate(dut, {"i": x}, cases.valid_pattern(rng, len(x)), rng)
    report = cases.int_report(x, got)
    assert not report, report


@pytest.mark.parametrize("latency", range(1, 7))
def test_adder_edge_cases(latency):
    a, b = cases.adder_edge_cases()
    _check_adder(FP32Adder(latency), a, b, np.random.default_rng(latency))


@pytest.mark.parametrize("latency", [6, 3])
def test_adder_random(latency):
    rng = np.random.default_rng(100 + latency)
    a, b = cases.adder_random(rng, 4000 if latency == 6 else 1000)
    _check_adder(FP32Adder(latency), a, b, rng)


@settings(max_examples=20)  # each example compiles a simulation
@given(st.lists(st.tuples(st.floats(width=32), st.floats(width=32)), min_size=1, max_size=64))
def test_adder_hypothesis(pairs):
    ab = np.array(pairs, np.float32).view(np.uint32)
    _check_adder(FP32Adder(), ab[:, 0].copy(), ab[:, 1].copy(), np.random.default_rng(0))


@settings(max_examples=20)  # each example compiles a simulation
@given(st.lists(st.integers(-(1 << 32), (1 << 32) - 1), min_size=1, max_size=64))
def test_int_hypothesis(xs):
    _check_int(IntToFP32(33), np.array(xs, np.int64), np.random.default_rng(0))


def test_adder_sums_of_many_integer_contributions():
    # Promoted lanes of 64 workers: every addition of the folds, in arrival order, in one run.
    rng = np.random.default_rng(7)
    workers, lanes = 64, 48
    x = rng.integers(-(1 << 31), 1 << 31, (workers, lanes), dtype=np.int64)
    acc = [cases.int_expected(x[0] + x[1])]
    rows = [cases.int_expected(row) for row in x[2:]]
    for b in rows[:-1]:
        acc.append(cases.adder_expected(acc[-1], b))
    _check_adder(FP32Adder(), np.concatenate(acc), np.concatenate(rows), rng)


@pytest.mark.parametrize("width", [33, 47, 64])
@pytest.mark.parametrize("latency", range(1, 5))
def test_int_edge_cases(width, latency):
    _check_int(IntToFP32(width, latency), cases.int_edge_cases(width), np.random.default_rng(width))


@pytest.mark.parametrize("width", [33, 64])
def test_int_random(width):
    rng = np.random.default_rng(200 + width)
    _check_int(IntToFP32(width), cases.int_random(rng, 2000, width), rng)


def test_latency_attribute_and_ports():
    add, cvt = FP32Adder(2), IntToFP32(40, 3)
    assert (add.latency, FP32Adder().latency, cvt.latency, IntToFP32().latency) == (2, 6, 3, 4)
    assert [len(add.a), len(add.b), len(add.o)] == [32, 32, 32]
    assert [len(cvt.i), len(cvt.o), cvt.width] == [40, 32, 40]


@pytest.mark.parametrize("latency", [0, 7, 2.0, True, "6"])
def test_adder_rejects_latency(latency):
    with pytest.raises(ValueError, match=rf"^Latency must be an integer from 1 to 6, not {re.escape(repr(latency))}$"):
        FP32Adder(latency)


@pytest.mark.parametrize("latency", [0, 5, None])
def test_int_rejects_latency(latency):
    with pytest.raises(ValueError, match=rf"^Latency must be an integer from 1 to 4, not {re.escape(repr(latency))}$"):
        IntToFP32(33, latency)


@pytest.mark.parametrize("width", [32, 65, 33.0, False, "33"])
def test_int_rejects_width(width):
    with pytest.raises(ValueError, match=rf"^Integer width must be an integer from 33 to 64, not {re.escape(repr(width))}$"):
        IntToFP32(width)

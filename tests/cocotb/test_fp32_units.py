"""The FP32 units as Verilated Verilog under cocotb: the edge cases and 10**5 random operands each.

One Verilator build per unit (the converter at the 33 bits of the switch's
exact sums; every other width runs in ``tests/hdl/test_fp32.py``).
"""

import pytest

from inagg.hdl.fp32 import FP32Adder, IntToFP32
from inagg.testbench.fp32.sim import Build

pytestmark = pytest.mark.cocotb

RANDOM = 100_000


@pytest.fixture(autouse=True)
def one_build_job(monkeypatch):
    # The runner compiles with one make job per core; the machines these run on are shared.
    monkeypatch.setattr("cocotb_tools.runner.MAX_PARALLEL_BUILD_JOBS", 1)


def test_fp32_adder(tmp_path):
    Build(FP32Adder(), "fp32_adder", tmp_path).test("inagg.testbench.fp32.adder_tb", RANDOM, seed=4)


def test_int_to_fp32(tmp_path):
    Build(IntToFP32(33), "int_to_fp32", tmp_path).test("inagg.testbench.fp32.int_tb", RANDOM, seed=33)

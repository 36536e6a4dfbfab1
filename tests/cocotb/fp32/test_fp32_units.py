"""The FP32 units as Verilated Verilog under cocotb: the edge cases and 10**5 random operands each.

One Verilator build per unit at its default latency (the converter at the
33 bits of the switch's exact sums; every other width runs in
``tests/hdl/test_fp32.py``); the testbenches are ``cocotb_adder.py`` and
``cocotb_int_to_fp32.py`` beside this file.
"""

from pathlib import Path

import pytest

from inagg.hdl.fp32 import FP32Adder, IntToFP32
from inagg.testbench import sim

pytestmark = pytest.mark.cocotb

RANDOM = 100_000


def test_fp32_adder():
    sim.build("fp32_adder", {}, FP32Adder, toplevel="fp32_adder").run(
        "cocotb_adder", module_dir=Path(__file__).parent, stimulus=dict(random=RANDOM, seed=4))


def test_int_to_fp32():
    sim.build("int_to_fp32", dict(width=33), IntToFP32, toplevel="int_to_fp32").run(
        "cocotb_int_to_fp32", module_dir=Path(__file__).parent, stimulus=dict(random=RANDOM, seed=33))

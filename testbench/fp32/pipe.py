"""cocotb driver for a free-running pipeline with ``i_valid``/``o_valid``: one operand per cycle in.

Inputs are written on the falling edge before the rising edge that takes
them, outputs sampled on the falling edge after it, so neither races the
clock. Sample ``t`` is the state after rising edge ``t``: with latency
``L``, an operand taken at edge ``t`` comes out at sample ``t + L - 1``.
"""

from __future__ import annotations

import numpy as np
from amaranth.lib import wiring
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge

from inagg.testbench.fp32.cases import port_values
from inagg.testbench.sim import parameters, stimulus

__all__ = ["settings", "start", "run"]


def settings(unit: type[wiring.Component]) -> tuple[wiring.Component, int, np.random.Generator]:
    """The ``unit`` the build was made of, the number of random operands and a generator seeded as the runner says."""
    s = stimulus()
    return unit(**parameters()), s["random"], np.random.default_rng(s["seed"])


async def start(dut) -> None:
    """Start a 4 ns clock and hold reset for two cycles with nothing valid."""
    Clock(dut.clk, 4, unit="ns").start()
    dut.i_valid.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await FallingEdge(dut.clk)
    dut.rst.value = 0


async def run(dut, operands: dict[str, np.ndarray], valid: np.ndarray, rng: np.random.Generator,
              reset: np.ndarray | None = None, extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Drive ``operands`` (port -> values, in order) on the cycles where ``valid`` is set.

    Idle cycles carry random garbage on the operand ports. ``reset`` (one
    flag per cycle) asserts ``rst`` on those cycles. Runs ``len(valid) +
    extra`` cycles and returns ``o`` and ``o_valid`` of every sample.
    """
    cycles = len(valid) + extra
    handles = [(getattr(dut, port), port_values(rng, values, len(getattr(dut, port)), valid, cycles).tolist())
               for port, values in operands.items()]
    in_valid = [int(v) for v in valid] + [0] * extra
    in_reset = [0] * cycles if reset is None else [int(r) for r in reset] + [0] * (cycles - len(reset))
    o, o_valid = np.zeros(cycles, np.uint32), np.zeros(cycles, bool)
    clk, i_valid, rst, out, out_valid = dut.clk, dut.i_valid, dut.rst, dut.o, dut.o_valid
    for t in range(cycles + 1):
        await FallingEdge(clk)
        if t:
            o[t - 1], o_valid[t - 1] = out.value.to_unsigned(), bool(out_valid.value)
        if t < cycles:
            for handle, values in handles:
                handle.value = values[t]
            i_valid.value = in_valid[t]
            rst.value = in_reset[t]
    return o, o_valid

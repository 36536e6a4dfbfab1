"""Build an FP32 unit as Verilog, Verilate it once, and run its cocotb testbench.

The testbench modules (:mod:`.adder_tb`, :mod:`.int_tb`) read what they must
know about the build from the environment: ``FP32_LATENCY``, ``FP32_WIDTH``
(the converter's input width), ``FP32_RANDOM`` (how many random operands)
and ``FP32_SEED``.
"""

from __future__ import annotations

from pathlib import Path

from amaranth.back import verilog
from amaranth.lib import wiring

from inagg.testbench import toolchain

__all__ = ["Build"]


class Build:
    """One Verilated FP32 unit in ``build_dir``, ready to run testbenches against.

    Parameters
    ----------
    unit : wiring.Component
        :class:`~inagg.hdl.fp32.FP32Adder` or :class:`~inagg.hdl.fp32.IntToFP32`.
    name : str
        The Verilog top module's name.
    build_dir : Path
        Where the Verilog, the Verilated model and the test results go.
    """

    def __init__(self, unit: wiring.Component, name: str, build_dir: Path):
        from cocotb_tools.runner import get_runner

        toolchain.activate()
        self.unit, self.name, self.build_dir = unit, name, Path(build_dir)
        self.build_dir.mkdir(parents=True, exist_ok=True)
        source = self.build_dir / f"{name}.v"
        source.write_text(verilog.convert(unit, name=name, emit_src=False))
        self._runner = get_runner("verilator")
        # Amaranth's Verilog widens and truncates operands implicitly, which is defined
        # Verilog; Verilator's width lints would stop the build on it.
        self._runner.build(sources=[source], hdl_toplevel=name, build_dir=self.build_dir,
                           build_args=["-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC"])

    def test(self, module: str, random: int, seed: int) -> None:
        """Run the cocotb tests of ``module`` with ``random`` seeded random operands; raise if any fails."""
        env = {"FP32_LATENCY": str(self.unit.latency), "FP32_RANDOM": str(random), "FP32_SEED": str(seed)}
        if hasattr(self.unit, "width"):
            env["FP32_WIDTH"] = str(self.unit.width)
        self._runner.test(test_module=module, hdl_toplevel=self.name, build_dir=self.build_dir, extra_env=env)

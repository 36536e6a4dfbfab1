"""The bridge between the Verilated RTL switch and the host library's workers (``docs/emulation.md``).

:mod:`.harness` is testbench gateware that puts frame rings around the
switch, :mod:`.bridge` moves whole frames through them from cocotb,
:mod:`.memory` serves sans-IO workers in simulated time, :mod:`.taps`
serves worker processes in namespaces through TAP devices, :mod:`.compare`
runs the model switch beside the RTL, :mod:`.session` is the cocotb test
that does all of it inside the simulator and :mod:`.run` starts it from a
normal process.
"""

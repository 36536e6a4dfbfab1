"""cocotb testbenches, bus drivers and the RTL bridge for inagg's gateware.

- :mod:`inagg.testbench.toolchain` -- where Verilator comes from
- :mod:`inagg.testbench.sim` -- one Verilated build per parameter set, cocotb runs on it
- :mod:`inagg.testbench.switch_tb` -- the cocotb testbench of the switch top
- :mod:`inagg.testbench.replay` -- the RTL's engine order replayed into the model switch
- :mod:`inagg.testbench.traffic` -- jobs, contributions and malformed frames
- :mod:`inagg.testbench.amaranth_switch` -- the switch in the Amaranth simulator against the model
- :mod:`inagg.testbench.streams`, :mod:`inagg.testbench.axil_sim` -- Amaranth-simulator stream and AXI4-Lite helpers
- :mod:`inagg.testbench.fp32` -- testbenches of the FP32 units
- :mod:`inagg.testbench.exception` -- testbenches of the cuckoo exception engine
- :mod:`inagg.testbench.bridge` -- the RTL-to-host bridge
"""

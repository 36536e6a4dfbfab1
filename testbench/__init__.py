"""Library code for testing inagg's gateware: the Verilator build helper, bus drivers, stimulus, the RTL bridge.

What lives here is imported by more than one test, benchmark or tool. A
design's cocotb tests and their pytest runner live together in its folder
under ``tests/cocotb/`` (``docs/architecture.md``).

- :mod:`inagg.testbench.toolchain` -- where Verilator comes from
- :mod:`inagg.testbench.sim` -- the one Verilator build helper: a cached build per design and parameter set,
  cocotb runs on it
- :mod:`inagg.testbench.switch_tb` -- the testbench class of the switch top (its tests, the benchmarks)
- :mod:`inagg.testbench.replay` -- the RTL's engine order replayed into the model switch
- :mod:`inagg.testbench.traffic` -- jobs, contributions and malformed frames
- :mod:`inagg.testbench.amaranth_switch` -- the switch in the Amaranth simulator against the model
- :mod:`inagg.testbench.streams`, :mod:`inagg.testbench.axil_sim` -- Amaranth-simulator stream and AXI4-Lite helpers
- :mod:`inagg.testbench.fp32` -- testbenches of the FP32 units
- :mod:`inagg.testbench.exception` -- testbenches of the cuckoo exception engine
- :mod:`inagg.testbench.bridge` -- the RTL-to-host bridge
"""

"""Amaranth 0.5 gateware of the inagg switch (``docs/rtl.md`` describes it).

- :mod:`inagg.hdl.switch` -- the Mode II switch and its Verilog top
- :mod:`inagg.hdl.ingress` -- per-port frame checks and store-and-forward buffer
- :mod:`inagg.hdl.icrc` -- ICRC checker and generator at W bits per cycle
- :mod:`inagg.hdl.arbiter` -- the ingress arbiter in front of the slot engine
- :mod:`inagg.hdl.engine` -- direct-mapped slots and their read-modify-write pipeline
- :mod:`inagg.hdl.emitter` -- result frames per egress port
- :mod:`inagg.hdl.control` -- AXI4-Lite registers, job and worker tables, counters
- :mod:`inagg.hdl.axis` -- beat streams, byte-order helpers, parameter checks
- :mod:`inagg.hdl.cli` -- ``inagg verilog``
- :mod:`inagg.hdl.fp32` -- FP32 units of the promotion path
- :mod:`inagg.hdl.synth` -- FPGA synthesis flows
"""

"""cocotb testbenches, bus drivers and the RTL bridge for inagg's gateware."""

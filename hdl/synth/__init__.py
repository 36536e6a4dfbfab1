"""FPGA synthesis of inagg's gateware: a board-free wrapper, an ECP5 flow on YoWASP, vendor templates."""
